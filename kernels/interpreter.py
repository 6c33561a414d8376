"""Triton's CPU interpreter (TRITON_INTERPRET=1) as these kernels need it.

numpy >= 2.4 refuses int() of a one-element array, which Triton 3.6's interpreter does
for scalar loop bounds (triton-lang/triton#9171, fixed upstream by #9172), so every kernel
with a runtime loop bound failed there. `patch` gives the interpreter's scalars an
__index__ that reads their one element; kernels/__init__.py applies it when the
interpreter is on, for the tests, `bench_decode_ops.py --dry` and anyone running a kernel
on CPU tensors.
"""
from __future__ import annotations


def patch() -> None:
    import triton.runtime.interpreter as interp
    if getattr(interp._patch_lang_tensor, "_roseplay_index", False):
        return
    original = interp._patch_lang_tensor

    def patch_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patch_tensor._roseplay_index = True
    interp._patch_lang_tensor = patch_tensor
