"""The real `roseplay serve` command: a subprocess on 127.0.0.1 that serves, then exits
cleanly on Ctrl-C (--port 0: on the port its banner names); flag errors and the not-yet
--tui say so."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx
import pytest

from roseplay.cli import main
from roseplay.serve import cli as serve_cli
from tests.roseplay.serve.serve_proc import free_port


def test_serve_subprocess_serves_then_exits_on_ctrl_c():
    port = free_port()
    env = {**os.environ, "ROSEPLAY_API_KEY": "sk-env"}
    proc = subprocess.Popen([sys.executable, "-m", "roseplay", "serve", "--model", "dummy:tiny",
                             "--device", "cpu", "--num-blocks", "64", "--port", str(port),
                             "--log-level", "warning"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                if httpx.get(url + "/health").status_code == 200:
                    break
            except httpx.ConnectError:
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.2)
        assert httpx.get(url + "/v1/models").status_code == 401      # key from the environment
        r = httpx.post(url + "/v1/completions", headers={"Authorization": "Bearer sk-env"},
                       json={"model": "dummy:tiny", "prompt": [1, 2, 3], "max_tokens": 3,
                             "return_token_ids": True})
        assert r.status_code == 200 and len(r.json()["choices"][0]["token_ids"]) == 3
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "dummy:tiny on cpu" in out and f"127.0.0.1:{port}" in out
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()           # reaps it and closes the pipe


def test_serve_help_and_flag_errors(capsys, monkeypatch):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--max-waiting" in out and "--max-num-batched-tokens" in out and "127.0.0.1" in out
    assert main(["serve", "--tui", "--in-process", "--model", "dummy:tiny", "--device", "cpu"]) == 2
    assert "--tui needs the engine in its own process" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["serve", "--max-waiting", "-1"])
    assert "max_waiting must be >= 0" in capsys.readouterr().err
    # a model name that cannot load is refused before an engine process starts for it
    monkeypatch.setattr(serve_cli, "_engine", lambda args: pytest.fail("an engine started"))
    assert main(["serve", "--model", "dummy:nope", "--device", "cpu"]) == 2
    assert "unknown dummy preset" in capsys.readouterr().err
    # so is a max_model_len above the model's (it was lowered without a word), headless too
    from roseplay.serve import headless
    monkeypatch.setattr(headless, "run_headless", lambda args: pytest.fail("an engine started"))
    for headless in ([], ["--headless", "--engine-address", "tcp://127.0.0.1:9"]):
        assert main(["serve", *headless, "--model", "dummy:tiny", "--device", "cpu",
                     "--max-model-len", "4096"]) == 2
        err = capsys.readouterr().err
        assert err == ("roseplay serve: max_model_len (4096) is greater than the model's "
                       "maximum (max_position_embeddings=2048 in its config): give at most "
                       "2048, or leave it unset for 2048\n"), err


BAD_SPECULATIVE = ['{"method": ["x"]}', '{"method": "oracle"}',
                   '{"num_speculative_tokens": "3"}', "not json", '["ngram"]']


@pytest.mark.parametrize("value", BAD_SPECULATIVE)
def test_bad_speculative_config_is_exit_2_in_every_command(value, capsys):
    """A JSON value of the wrong type crashed with a TypeError traceback and exit 1; every
    command now refuses it as its flag parser does any bad flag (exit 2, one line)."""
    for argv in (["serve", "--device", "cpu", "--port", "0"],
                 ["bench", "--device", "cpu", "--num-prompts", "1"],
                 ["--device", "cpu"]):
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--speculative-config", value])
        assert exc.value.code == 2, argv
        err = capsys.readouterr().err
        assert "argument --speculative-config: " in err and "Traceback" not in err, err


@pytest.mark.parametrize("argv", [["--bogus"], ["--max-num-seqs", "0"],
                                  ["--default-chat-template-kwargs", "{x"]])
def test_a_bad_serve_flag_is_one_line(argv, capsys):
    """roseplay serve's bad flags read as the other commands' do: one line ending with
    where to look (it printed argparse's whole usage block, ~50 lines)."""
    with pytest.raises(SystemExit) as exc:
        main(["serve", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1, err
    assert err.startswith("roseplay serve: error: ") and \
        err.endswith("(see roseplay serve --help)\n"), err


@pytest.mark.parametrize("value", ['{"backend": "outlines"}', '{"compile_timeout": "5"}',
                                   '{"grammar_cache_size": -1}', '{"nope": 1}', "not json"])
def test_bad_structured_outputs_config_is_exit_2(value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--device", "cpu", "--port", "0", "--structured-outputs-config", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --structured-outputs-config: " in err and "Traceback" not in err, err


def test_bench_refuses_a_bad_engine_config_before_it_starts(capsys):
    """What only the whole config can tell (draft_model needs a draft for a model other
    than the bundled one) is exit 2 too, as in serve and the TUI, not a failed run (1)."""
    spec = '{"method": "draft_model"}'
    assert main(["bench", "--model", "dummy:tiny", "--device", "cpu", "--num-prompts", "1",
                 "--speculative-config", spec]) == 2
    assert 'draft_model needs a "model"' in capsys.readouterr().err
    assert main(["serve", "--model", "dummy:tiny", "--device", "cpu",
                 "--speculative-config", spec]) == 2
    assert 'draft_model needs a "model"' in capsys.readouterr().err


def test_port_0_serves_on_the_port_the_banner_names(tmp_path):
    """--port 0 picks a free port; the banner said `http://127.0.0.1:0/v1`, so nobody
    could find the server. It is bound before the banner, which names its port."""
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "roseplay", "serve", "--model",
                                 "dummy:tiny", "--device", "cpu", "--num-blocks", "64",
                                 "--port", "0", "--log-level", "warning"],
                                stdout=out, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while (match := re.search(r"at http://127\.0\.0\.1:(\d+)/v1", log.read_text())) is None:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no banner"
            time.sleep(0.2)
        port = int(match.group(1))
        assert port != 0
        while True:
            try:
                assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200
                break
            except httpx.ConnectError:
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_with_the_tui_serves_while_the_tui_runs(monkeypatch, capsys):
    """`roseplay serve --tui`: the server on a thread, the TUI in front attached to its
    engine. It failed at once ("threads can only be started once": the server thread
    was started twice). The TUI here is a stand-in that asks the server for a completion
    while it "runs", as a user's client would."""
    import roseplay.tui.app as tui_app
    port, seen = free_port(), {}

    class StandIn:
        load_error = None

        def __init__(self, source_factory, loading_message):
            seen["attach"] = loading_message

        def run(self):
            r = httpx.post(f"http://127.0.0.1:{port}/v1/completions", timeout=30,
                           json={"model": "dummy:tiny", "prompt": [1, 2, 3], "max_tokens": 2})
            seen["status"] = r.status_code

    monkeypatch.setattr(tui_app, "RoseplayApp", StandIn)
    assert main(["serve", "--tui", "--model", "dummy:tiny", "--device", "cpu",
                 "--num-blocks", "64", "--port", str(port)]) == 0, capsys.readouterr().err
    assert seen["status"] == 200 and seen["attach"].startswith("attaching to ")
