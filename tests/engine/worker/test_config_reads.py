"""An engine's start reads each small config file of its model once: config.json (the
max_model_len check before the load, then the load), generation_config.json (the
sampling defaults, then the eos ids) and tokenizer_config.json (the tokenizer's load,
then each chat's chat-template question). Counted by an audit hook in a fresh
interpreter (the hook stays for the interpreter's life)."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

from engine.tokenizer import DEFAULT_MODEL_DIR

COUNT_OPENS = """
import collections, json, os, sys
root = os.path.realpath(sys.argv[1])
opened = collections.Counter()

def hook(event, args):
    if event == "open" and isinstance(args[0], str) and args[0].endswith(".json") \\
            and os.path.realpath(args[0]).startswith(root + os.sep):
        opened[os.path.basename(args[0])] += 1
sys.addaudithook(hook)
from engine import LLM
llm = LLM(model=sys.argv[1], device="cpu", num_blocks=64)
if sys.argv[2:] == ["chat"]:            # the chat template's question reads no file again
    for _ in range(2):
        llm.chat([{"role": "user", "content": "Speak."}])
print(json.dumps(opened))
llm.close()
"""


def opens_at_start(model: str, *more: str) -> dict:
    out = subprocess.run([sys.executable, "-c", COUNT_OPENS, model, *more],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_bundled_models_configs_are_read_once():
    """Two chats after the start read no tokenizer_config.json again (each asked the
    file whether the tokenizer has a chat template)."""
    opened = opens_at_start(str(DEFAULT_MODEL_DIR), "chat")
    assert opened == {"config.json": 1, "generation_config.json": 1,
                      "tokenizer_config.json": 1}, opened


def test_a_checkpoints_configs_are_read_once(ckpt, tmp_path):
    path = tmp_path / "ckpt"
    shutil.copytree(ckpt, path)
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": 2,
                                                            "max_new_tokens": 64}))
    opened = opens_at_start(str(path))
    assert opened.get("config.json") == 1 and opened.get("generation_config.json") == 1, \
        opened
