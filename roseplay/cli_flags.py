"""argparse flags generated from engine.config (every knob is defined once, there).

`add_engine_flags(parser)` adds one flag per documented field of EngineConfig and
SchedulerConfig (`--max-num-batched-tokens`, `--enable-prefix-caching/--no-...`), with
help, choices and minimum taken from the field metadata. Flags default to None (not
given), so `engine_kwargs(args)` returns only what the user set and make_config fills
in the engine's own defaults. A field with `metadata["check"]` (speculative_config's
JSON) is parsed by it as the flag is read: a bad value is argparse's error, exit 2. `parse_knob_value` converts text ("true", "224") to a
field's type, `parse_ab` a whole `bench --ab KNOB=V1,V2` (read by the bench and its checks).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys

from engine.config import EngineConfig, InvalidRequestError, SchedulerConfig, knob_fields

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def engine_fields() -> list[dataclasses.Field]:
    """Documented fields of EngineConfig then SchedulerConfig (the flags, in order)."""
    return knob_fields(EngineConfig) + knob_fields(SchedulerConfig)


def field_by_name(name: str) -> dataclasses.Field:
    name = name.replace("-", "_")
    for f in engine_fields():
        if f.name == name:
            return f
    raise ValueError(f"unknown knob {name!r}; knobs: {', '.join(f.name for f in engine_fields())}")


def flag_name(f: dataclasses.Field) -> str:
    return "--" + f.name.replace("_", "-")


def _base_type(f: dataclasses.Field) -> type:
    text = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    for name, typ in (("bool", bool), ("int", int), ("float", float), ("str", str)):
        if name in text.replace(" ", "").split("|"):
            return typ
    raise TypeError(f"config field {f.name} has an unsupported type {text!r}")


def _optional(f: dataclasses.Field) -> bool:
    return isinstance(f.type, str) and "None" in f.type


def parse_bool(text: str) -> bool:
    low = str(text).strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (true/false/on/off/1/0), got {text!r}")


def _converter(f: dataclasses.Field):
    """A text -> value function enforcing the field's type, choices and minimum."""
    typ = _base_type(f)
    minimum = f.metadata.get("minimum")
    choices = f.metadata.get("choices")
    check = f.metadata.get("check")      # e.g. speculative_config's JSON: parsed here too
    parse = f.metadata.get("parse", typ)  # e.g. max_model_len's 32k

    def convert(text: str):
        if _optional(f) and str(text).strip().lower() in ("none", "auto", ""):
            return None
        if typ is bool:
            return parse_bool(text)
        try:
            value = parse(text)
        except ValueError as exc:
            why = f" ({exc})" if parse is not typ else ""     # a parser's own reason
            raise argparse.ArgumentTypeError(
                f"{f.name} expects {typ.__name__}, got {text!r}{why}") from None
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"{f.name} must be >= {minimum}, got {value}")
        if choices and value not in choices:
            raise argparse.ArgumentTypeError(
                f"{f.name} must be one of {', '.join(choices)}, got {value!r}")
        if check is not None:
            try:
                check(value)          # the text itself goes on: the engine parses it again
            except InvalidRequestError as exc:
                raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    convert.__name__ = typ.__name__     # argparse names the type in its errors
    return convert


def parse_knob_value(name: str, text: str):
    """`parse_knob_value("enable_prefix_caching", "off") -> False` (ValueError if bad)."""
    try:
        return _converter(field_by_name(name))(text)
    except argparse.ArgumentTypeError as exc:
        raise ValueError(str(exc)) from None


def parse_ab(text: str | None) -> tuple[str, list] | None:
    """"max_num_batched_tokens=8192,224" -> ("max_num_batched_tokens", [8192, 224])."""
    if not text:
        return None
    name, sep, values = text.partition("=")
    if not sep or not values:
        raise ValueError(f"expected KNOB=V1,V2,..., got {text!r}")
    name = field_by_name(name.strip()).name
    parsed = [parse_knob_value(name, v.strip()) for v in values.split(",")]
    if len(parsed) < 2:
        raise ValueError(f"needs at least two values, got {text!r}")
    return name, parsed


def _help(f: dataclasses.Field) -> str:
    default = f.default if f.default is not dataclasses.MISSING else None
    extra = " Live knob." if f.metadata.get("live") else ""
    text = f.metadata["help"] + extra
    if "default" not in text:
        text += f" (default: {default})"
    return text.replace("%", "%%")


def add_engine_flags(parser: argparse.ArgumentParser, *, exclude: tuple[str, ...] = (),
                     title: str = "engine") -> argparse._ArgumentGroup:
    """Add one flag per engine knob (minus `exclude`) to `parser`, in a group."""
    group = parser.add_argument_group(title, "Engine knobs (engine/config.py).")
    for f in engine_fields():
        if f.name in exclude:
            continue
        kwargs = dict(dest=f.name, default=None, help=_help(f))
        if _base_type(f) is bool:
            group.add_argument(flag_name(f), action=argparse.BooleanOptionalAction, **kwargs)
            continue
        choices = f.metadata.get("choices")
        metavar = "{" + ",".join(choices) + "}" if choices else f.name.upper()
        group.add_argument(flag_name(f), type=_converter(f), metavar=metavar, **kwargs)
    return group


def engine_kwargs(args: argparse.Namespace, **overrides) -> dict:
    """The knobs the user set on the command line (plus `overrides`), for make_config."""
    out = {f.name: getattr(args, f.name) for f in engine_fields()
           if getattr(args, f.name, None) is not None}
    out.update({k: v for k, v in overrides.items() if v is not None})
    return out


def _slo(text: str) -> tuple[str, float]:
    from engine.metrics import parse_slos
    try:
        return next(iter(parse_slos([text]).items()))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


class _SLOs(argparse.Action):
    """--goodput's SLOs, each metric once: `ttft:200 ttft:50` kept the last one silently."""

    def __call__(self, parser, namespace, values, option_string=None):
        names = [name for name, _ in values]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise argparse.ArgumentError(self, f"{', '.join(twice)} given more than once "
                                               "(one value per metric)")
        setattr(namespace, self.dest, values)


def add_goodput_flag(group) -> None:
    """`--goodput ttft:MS tpot:MS e2el:MS` (vLLM's spelling), for the bench and the app."""
    group.add_argument("--goodput", nargs="+", type=_slo, metavar="KEY:MS", default=None,
                       action=_SLOs,
                       help="Service-level objectives in ms (keys ttft, tpot, e2el; any "
                            "subset): goodput counts the requests that meet every one of "
                            "them, per second (vLLM's --goodput, from DistServe).")


def goodput_slos(args: argparse.Namespace) -> dict[str, float]:
    """The SLOs given with --goodput as {metric: ms} ({} when none)."""
    return dict(getattr(args, "goodput", None) or ())


ENGINE_KEY_HELP = ("The engine key: attaching to the engine address needs it (docs/SERVE.md, "
                   "Security). KEY, or @PATH to read it from a file (a flag is visible in "
                   "ps). Default: $ROSEPLAY_ENGINE_KEY, else the key file the engine's "
                   "owner wrote (mode 0600) for the address.")


def add_engine_key_flag(group) -> None:
    group.add_argument("--engine-key", metavar="KEY|@PATH", default=None, help=ENGINE_KEY_HELP)


def add_engine_address_flag(group) -> None:
    """`--engine-address ADDR`: once, where the engine this command starts binds; two or
    more times, running engines to attach to, one data-parallel replica each."""
    group.add_argument(
        "--engine-address", metavar="ADDR", action="append", default=None,
        help="Once: bind the engine process at ADDR (tcp://127.0.0.1:PORT uses PORT..PORT+4, "
             "or ipc:///PATH) so that `roseplay --connect ADDR` can watch it (default: a "
             "private ipc socket). Two or more times: attach to the engines running at "
             "those addresses (`roseplay serve --headless`, KV events on), one "
             "data-parallel replica each, in order, all with the one --engine-key "
             "(docs/ROUTING.md \"Replicas on other hosts\").")


def engine_addresses(args: argparse.Namespace) -> tuple[str | None, list[str] | None]:
    """(where a started engine binds, running engines to attach to): --engine-address
    once is the first, two or more times the second (ValueError: a --data-parallel-size
    that is not their number)."""
    given = list(getattr(args, "engine_address", None) or ())
    if len(given) < 2:
        return (given[0] if given else None), None
    size = getattr(args, "data_parallel_size", None)
    if size is not None and size != len(given):
        raise ValueError(f"--data-parallel-size {size} conflicts with the {len(given)} "
                         "--engine-address given (one replica each; drop "
                         "--data-parallel-size)")
    return None, given


def usage_error(prog: str, message: str) -> str:
    """A bad flag's one line, as every command prints it: argparse's own errors and the
    checks after parsing read alike (`prog: error: ... (see prog --help)`)."""
    first = message.strip().splitlines()[0] if message.strip() else "error"
    return f"{prog}: error: {first} (see {prog} --help)"


class OneLineParser(argparse.ArgumentParser):
    """Bad flags: one line on stderr (not argparse's usage block) and exit status 2."""

    def error(self, message: str):
        self.exit(2, usage_error(self.prog, message) + "\n")


def say_on_stderr(prog: str):
    """A progress callback for attaching to running engines: `prog: text` on stderr."""
    return lambda text: print(f"{prog}: {text}", file=sys.stderr, flush=True)
