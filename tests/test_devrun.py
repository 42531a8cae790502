"""What `make run` tells a newcomer to type works when typed.

The banner said ``llmgw ctl …``, but `make run` installs llmgw into .venv,
which is not on PATH: the first command a newcomer tried was "command not
found".
"""

from __future__ import annotations

import json
import shlex
import subprocess

import pytest

from llmgw import __version__, devrun


def test_the_ctl_command_in_the_banner_runs_as_printed() -> None:
    out = subprocess.run([*shlex.split(devrun.llmgw_command()), "--version"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"llmgw {__version__}"


def test_the_activate_hint_names_a_script_that_exists() -> None:
    hint = devrun.activate_hint()
    if hint:  # a Python outside a venv has none to give
        script = hint.split("`. ", 1)[1].split("`", 1)[0]
        out = subprocess.run(["bash", "-c", f". {shlex.quote(script)} && command -v llmgw"],
                             capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip().endswith("/llmgw"), out.stderr


def printed_request(curl: str) -> tuple[str, dict]:
    """The URL and JSON body of a curl line as a shell would split it."""
    words = shlex.split(curl)
    assert words[:2] == ["curl", "-s"] and "-d" in words, curl
    return words[2], json.loads(words[words.index("-d") + 1])


@pytest.mark.parametrize("model", devrun.MODELS)
def test_the_printed_request_asks_the_endpoint_that_suits_the_model_with_a_small_max_tokens(model: str) -> None:
    """A chat request with no max_tokens to the base Gemma ran three minutes and returned <|im_end|> 2,023 times."""
    url, body = printed_request(devrun.FIRST_REQUESTS[model].curl(8123))
    served = devrun.GEMMA if model == "gemma" else "echo"
    assert body["model"] == served
    assert isinstance(body.get("max_tokens"), int) and 0 < body["max_tokens"] <= 64
    if model == "gemma":
        # A base model without a chat template continues text: /v1/completions, with a prompt to continue.
        assert url == "http://127.0.0.1:8123/v1/completions" and body["prompt"].strip() and "messages" not in body
        assert "base model" in devrun.FIRST_REQUESTS[model].note
    else:
        assert url == "http://127.0.0.1:8123/v1/chat/completions" and body["messages"]


def test_a_request_with_a_quote_in_it_survives_the_shell() -> None:
    """The line is pasted into a shell: the body is quoted as a whole, whatever it holds."""
    request = devrun.FirstRequest("/v1/completions", devrun._body(model="m", prompt="It's \"quoted\" $HOME `x`", max_tokens=4))
    url, body = printed_request(request.curl(1))
    assert body["prompt"] == "It's \"quoted\" $HOME `x`"


@pytest.mark.integration
def test_make_run_prints_a_request_that_is_answered_when_run_as_printed(tmp_path) -> None:
    """The simulator's `make run`, end to end: the curl line it prints, run by a shell, gets an answer."""
    import os
    import signal
    import sys
    import threading

    from llmgw.agent.procs import marked_processes
    from tests.support.cluster import environment
    from tests.support.net import free_port
    from tests.support.wait import wait_for

    ports = {name: free_port() for name in ("LLMGW_LINK_PORT", "LLMGW_API_PORT", "LLMGW_ADMIN_PORT")}
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw.devrun"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env=environment(LLMGW_RUN_DIR=str(run), **{k: str(v) for k, v in ports.items()}),
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        curl = wait_for(lambda: next((line for line in lines if "curl -s" in line), None)
                        or (proc.poll() is not None and pytest.fail("make run ended:\n" + "".join(lines))),
                        90, "make run to print its curl line", interval=0.3)
        done = subprocess.run(["bash", "-c", curl.strip()], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        assert answer["model"] == "echo" and answer["choices"][0]["message"]["content"]
        assert answer["usage"]["completion_tokens"] <= 32
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        reader.join(timeout=10)
    assert marked_processes(run / "state") == [], "make run left its engine running"


def test_each_make_run_starts_its_logs_afresh_and_keeps_the_last_runs_beside_them(tmp_path) -> None:
    # twistd appends to its --logfile: a second `make run` showed the first one's
    # "dialling" line above its own.
    logs = tmp_path / "logs"
    logs.mkdir()
    for name in ("server.log", "agent.log"):
        (logs / name).write_text(f"first run's {name}\n")
    devrun.fresh_logs(logs)
    assert sorted(p.name for p in logs.iterdir()) == ["agent.log.previous", "server.log.previous"]
    assert (logs / "agent.log.previous").read_text() == "first run's agent.log\n"
    devrun.fresh_logs(logs)  # a run that wrote nothing yet keeps the last one that did
    assert (logs / "agent.log.previous").read_text() == "first run's agent.log\n"
