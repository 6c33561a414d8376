"""What the `roseplay` command checks before anything slow starts: the model name, the
recording path, the engine's knobs against the scenario's longest request, the bench's
own engine and --compare. Each returns why it cannot run (one line), or None."""
from __future__ import annotations

import os

from roseplay.cli_flags import engine_addresses, engine_kwargs, parse_ab
from roseplay.tui.defaults import app_engine_kwargs


def check_model(name: str | None) -> str | None:
    """Why `name` cannot be a model (None if it may be one), without loading anything:
    the engine's own rules (engine/worker/models/loader.py), checked before the slow start."""
    from engine.worker.models.presets import PRESETS
    if name is None or name == "default":
        return None
    if name.startswith("dummy:"):
        preset = name.removeprefix("dummy:")
        return None if preset in PRESETS else (
            f"unknown dummy preset {preset!r}; presets: {', '.join(sorted(PRESETS))}")
    if os.path.isdir(name):
        return None if os.path.exists(os.path.join(name, "config.json")) else (
            f"{name} has no config.json: not an HF checkpoint directory")
    if os.path.exists(name):
        return f"model path {name!r} is not a directory"
    if name.count("/") != 1 or name.startswith(("/", ".")):
        return (f"unknown model {name!r}: not a directory, a hub id (org/name), 'default' or "
                f"dummy:<preset>")
    return None


def check_output_path(flag: str, path: str | None) -> str | None:
    """Why `flag`'s file could not be written at `path` (None if it can): told before
    the run, not after it, when its results would be lost."""
    if path is None:
        return None
    if not path.strip():         # it was taken as no path: the run wrote nothing
        return f"{flag}: the path is empty"
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return f"{flag} {path}: is a directory"
    if not os.path.isdir(folder):
        return f"{flag} {path}: folder {folder} does not exist"
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        return f"{flag} {path}: not writable"
    return None


def check_engine_access(addresses: list[str] | None, key: str | None) -> str | None:
    """Why these engine addresses (--connect, --engine-address) or --engine-key cannot be
    used (None if they can): a malformed address or an unreadable key file, told before
    the app opens or an engine starts."""
    from engine.ipc.auth import given_key
    from engine.ipc.protocol import endpoints
    try:
        for address in addresses or ():
            endpoints(address)
        if addresses or key:
            given_key(key)
    except ValueError as exc:          # InvalidRequestError is one
        return str(exc)
    return None


def attached_kwargs(args) -> dict:
    """The engine flags given to a front over running engines, less --seed: the seed of
    the workload it drives (its engines' own seed is set where they start)."""
    return {k: v for k, v in engine_kwargs(args).items() if k != "seed"}


def check_session(args) -> str | None:
    """Flags the app's kind of session would drop (None if none): a replay runs no engine
    and records nothing, an attached app (--connect) starts no engine of its own."""
    given = sorted(engine_kwargs(args))
    if args.replay:
        dropped = [flag for flag, on in (("--record", args.record), ("--connect", args.connect),
                                         ("--in-process", args.in_process)) if on]
        dropped += ["--" + name.replace("_", "-") for name in given]
        if dropped:
            return (f"{', '.join(dropped)}: --replay plays a recording back (no engine runs, "
                    "nothing is recorded); drop them")
        return None
    if args.connect:
        from engine.front.dp_attach import front_config
        if args.in_process:
            return "--in-process starts the app's own engine: not with --connect"
        try:
            front_config(args.connect, attached_kwargs(args))
        except ValueError as exc:          # InvalidRequestError is one
            return str(exc)
    return None


def check_engine(args) -> str | None:
    """Why the engine could not serve this workload, before the app opens (None if it
    can): the knobs as the engine checks them, a KV pool too small for the scenario's
    longest request (the engine would refuse it, forever), and --device cuda without
    CUDA."""
    from engine.config import InvalidRequestError, make_config
    from roseplay.workload.fit import pool_problem
    try:
        config = make_config(**app_engine_kwargs(args))
        if args.in_process:
            config.check_in_process()
    except InvalidRequestError as exc:
        return str(exc)
    # token-id prompts: exact for a model without a tokenizer, an estimate for text; a
    # pool too small is measured again with the model's tokenizer where it is on disk
    # (the number recommended then serves), and the loaded engine checks the text
    # prompts exactly (roseplay/workload/source.py start_live)
    sizes = dict(input_len=args.input_len, output_len=args.output_len)
    problem = pool_problem(args.scenario, config.num_blocks, config.block_size, **sizes)
    if problem:
        tokenizer = local_tokenizer(args.model)
        if tokenizer is not None:
            problem = pool_problem(args.scenario, config.num_blocks, config.block_size,
                                   tokenizer=tokenizer, **sizes)
    return problem or (None if args.compare else config_problem(config))   # (each side's:
    #                                                                   check_compare)


def config_problem(config) -> str | None:
    """What a valid config still cannot start with (None if nothing): a speculative draft
    model that is no model, a max_model_len above the model's (read from a model here,
    not fetched), --device cuda without a visible CUDA device."""
    from engine.config import InvalidRequestError, resolve_max_model_len
    from engine.worker.models.config_check import local_context_length
    draft = getattr(config.speculative_config, "model", None)
    if draft is not None and (problem := check_model(draft)):
        return f"--speculative-config model: {problem}"
    if (model_len := local_context_length(config.model)) is not None:
        try:
            resolve_max_model_len(config.max_model_len, model_len)
        except InvalidRequestError as exc:
            return str(exc)
    if config.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            return "--device cuda: no CUDA device is visible here; use --device cpu (or auto)"
    return None


def check_serve_engine(args) -> str | None:
    """Why the engine `roseplay serve` starts could not start with these flags (None if
    it can, or when it attaches to running engines), before its process starts."""
    from engine.config import make_config
    try:
        if engine_addresses(args)[1]:
            return None
        return config_problem(make_config(**engine_kwargs(args)))
    except ValueError as exc:          # InvalidRequestError is one
        return str(exc)


def check_bench_config(args) -> str | None:
    """Why the bench's own engine could not start with these flags (None if it can, or
    when the bench drives a server, --base-url): a bad flag is exit status 2, as in
    `roseplay` and `roseplay serve`, not a failed run."""
    from engine.config import InvalidRequestError
    if getattr(args, "base_url", None) or not hasattr(args, "device"):
        return None
    try:
        attached = engine_addresses(args)[1]
        if attached:      # running engines: only the front's own knobs may be given
            from engine.front.dp_attach import front_config
            front_config(attached, attached_kwargs(args))
            return None
        config = _bench_engine(args, {})
        problem = config_problem(config) or every_request_refused(args, config)
    except ValueError as exc:          # InvalidRequestError is one
        return str(exc)
    if problem:
        return problem
    knob, values = parse_ab(getattr(args, "ab", None)) or (None, [])   # parsed: its type
    for value in values:         # else the last value's engine fails after the others ran
        try:
            config = _bench_engine(args, {knob: value})
            problem = config_problem(config) or every_request_refused(args, config)
        except InvalidRequestError as exc:
            problem = str(exc)
        if problem:
            return f"--ab {knob}={value}: {problem}"
    return None


def shortest_random_request(args) -> tuple[int, int, str] | None:
    """(prompt tokens, max_tokens, the flags that set them) of the random scenario's
    shortest request: token ids, exact (None for the other scenarios)."""
    if args.scenario != "random":
        return None
    r = args.range_ratio
    prompt = max(1, int(args.input_len * (1 - r)))       # WorkloadSpec.sample_len's low end
    out = max(1, int(args.output_len * (1 - r)))
    return prompt, out, f"--input-len {args.input_len}" + (f" --range-ratio {r:g}" if r else "")


def server_refuses_every_request(args, max_model_len: int | None) -> str | None:
    """Why a server of `max_model_len` (its /v1/models card) would refuse every request
    of the bench's workload (None if some may run): an OpenAI-compatible server (vLLM's,
    roseplay's) refuses prompt + max_tokens past it. Token-id prompts on /v1/completions
    only: chat text is tokenized again there, with the template's tokens."""
    shortest = shortest_random_request(args)
    if shortest is None or max_model_len is None or args.endpoint != "completions":
        return None
    prompt, out, given = shortest
    if prompt + out <= max_model_len:
        return None
    return (f"{given} --output-len {args.output_len}: every request asks for {prompt + out} "
            f"tokens or more (prompt + max_tokens) and the server's max_model_len is "
            f"{max_model_len}, so it would refuse every request; ask for {max_model_len} "
            f"or fewer")


def every_request_refused(args, config) -> str | None:
    """Why the engine would refuse every request of the bench's workload (None if some
    may run): the random scenario's shortest prompt (--input-len less --range-ratio, exact
    token ids) at or past max_model_len, or with its shortest max_tokens past a
    --num-blocks pool. vLLM's bench sends such a run and reports each request failed
    (0.00 everywhere); told before the engine starts, the flag to change is named. The
    other scenarios' lengths are their own (the report explains each refusal)."""
    from engine.config import InvalidRequestError, resolve_max_model_len
    from engine.worker.models.config_check import local_context_length
    if (shortest := shortest_random_request(args)) is None:
        return None
    prompt, out, given = shortest
    model_len = local_context_length(config.model)
    try:
        max_len = (resolve_max_model_len(config.max_model_len, model_len) if model_len
                   else config.max_model_len)
    except InvalidRequestError:
        return None                     # config_problem names it
    if max_len is not None and prompt >= max_len:
        return (f"{given}: every prompt has {prompt} tokens or more and max_model_len is "
                f"{max_len} (a prompt leaves room for 1 token), so the engine would refuse "
                f"every request; use --input-len {max_len - 1} or less")
    if config.num_blocks is not None:
        need = min(prompt + out, max_len or prompt + out)
        capacity = config.num_blocks * config.block_size
        if need > capacity:
            return (f"{given} --output-len {args.output_len}: every request needs {need} "
                    f"tokens or more and --num-blocks {config.num_blocks} holds {capacity}, "
                    f"so the engine would refuse every request; use --num-blocks "
                    f"{-(-need // config.block_size)} or more")
    return None


def _bench_engine(args, overrides: dict):
    """The bench's engine config as make_config checks it, and, when it runs in this
    process (--in-process, --compare hf: HF beside it), as an in-process engine."""
    from engine.config import InvalidRequestError, make_config
    config = make_config(**engine_kwargs(args, **overrides))
    if getattr(args, "in_process", False) or getattr(args, "compare", None):
        try:
            config.check_in_process()
        except InvalidRequestError as exc:
            if args.in_process:
                raise
            raise InvalidRequestError("--compare hf runs the engine in this process (beside "
                                      "HF): data_parallel_size > 1 and kv_events_config need "
                                      "it in its own process") from exc
    return config


def local_tokenizer(name: str | None):
    """The tokenizer of the bundled model or a checkpoint directory (None otherwise: a
    hub id is not fetched for a check)."""
    from engine.tokenizer import load_tokenizer
    if name in (None, "default") or (os.path.isdir(name) and not name.startswith("dummy:")):
        return load_tokenizer(name or "default")
    return None


def check_compare(args) -> str | None:
    """Parse --compare in place (KNOB, [A, B]); why it cannot run, or None."""
    from engine.config import InvalidRequestError, make_config
    from roseplay.tui.compare import parse_compare
    if args.connect or args.replay:
        return "--compare starts its own two engines: not with --connect or --replay"
    try:
        args.compare = knob, values = parse_compare(args.compare)
    except ValueError as exc:
        return str(exc)
    for value in values:         # each side's engine, as it starts
        try:
            problem = config_problem(make_config(**dict(app_engine_kwargs(args), **{knob: value})))
        except InvalidRequestError as exc:
            problem = str(exc)
        if problem:
            return f"--compare {knob}={value}: {problem}"
    return None
