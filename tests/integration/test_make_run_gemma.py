"""`make run MODEL=gemma`: the newcomer's first real model, on the llama-server `make engines` built.

Runs ``python -m llmgw.devrun`` as the Makefile does, on free ports, reads
the curl line it prints, asks the model through the router with the
official client, and stops it as Ctrl-C would.  Needs what `make engines`
installs; skips saying so where absent, fails under CI=true.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import openai
import pytest

from llmgw.config.server import load_server_config
from tests.support.cluster import environment
from tests.support.net import free_port
from tests.support.wait import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.llama_server, pytest.mark.slow]


def test_make_run_model_gemma_serves_gemma_through_the_router(tmp_path, llama_server, gemma):
    # The fixtures only prove `make engines` ran (they skip otherwise); devrun
    # finds llama-server and the model in the installed packages itself.
    ports = {name: free_port() for name in ("LLMGW_LINK_PORT", "LLMGW_API_PORT", "LLMGW_ADMIN_PORT")}
    run = tmp_path / "run-gemma"
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw.devrun"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env=environment(LLMGW_RUN_MODEL="gemma", LLMGW_RUN_DIR=str(run), **{k: str(v) for k, v in ports.items()}),
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    try:
        curl = wait_for(lambda: next((line for line in lines if "curl -s" in line), None)
                        or (proc.poll() is not None and pytest.fail("make run ended:\n" + "".join(lines))),
                        300, "make run MODEL=gemma to print its curl line", interval=0.5)
        api = f"http://127.0.0.1:{ports['LLMGW_API_PORT']}"
        assert f"{api}/v1/completions" in curl
        assert re.search(r'"model": "gemma-3-270m"', curl)
        assert "engines:\n  llama.cpp: {path: " in (run / "agent.yaml").read_text()

        # make run prints the curl line once the router routes the model: the
        # line itself, run as printed, is answered at once, in seconds, in words.
        # (A chat request without max_tokens once ran three minutes and answered
        # 2,023 tokens of <|im_end|>: the base model has no chat template.)
        started = time.monotonic()
        done = subprocess.run(shlex.split(curl.strip()), capture_output=True, text=True, timeout=60)
        took = time.monotonic() - started
        assert done.returncode == 0, done.stderr
        answer = json.loads(done.stdout)
        words = answer["choices"][0]["text"]
        assert took < 20, f"the printed request took {took:.1f} s"
        assert answer["usage"]["completion_tokens"] <= 24 and answer["choices"][0]["finish_reason"] == "stop"
        assert len(re.findall(r"[A-Za-z]{3,}", words)) >= 3 and "<|" not in words, words
        wait_for(lambda: any("base model" in line for line in lines), 10, "the note on what the model is")

        # The official client through the same router, as an application would ask it.
        client = openai.OpenAI(base_url=f"{api}/v1", api_key="unused", max_retries=0, timeout=120)
        reply = client.completions.create(model="gemma-3-270m", prompt="Once upon a time", max_tokens=8)
        assert reply.choices[0].text.strip()
        # One that names no max_tokens stops at the profile's -n, not at the end of the context.
        assert load_server_config(run / "server.yaml").profiles["gemma-cpu"].args[-2:] == ("-n", "128")
        chat = client.chat.completions.create(model="gemma-3-270m", messages=[{"role": "user", "content": "hello"}])
        assert chat.usage.completion_tokens <= 128
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        reader.join(timeout=10)
    from llmgw.agent.procs import marked_processes

    assert marked_processes(run / "state") == [], "make run left its engine running"


def test_make_run_model_unknown_says_which_it_knows(tmp_path):
    out = subprocess.run([sys.executable, "-m", "llmgw.devrun"], capture_output=True, text=True, timeout=60,
                         env=environment(LLMGW_RUN_MODEL="llama-70b", LLMGW_RUN_DIR=str(tmp_path / "run")))
    assert out.returncode == 2
    assert out.stderr.strip() == "MODEL=llama-70b: make run knows echo, gemma"
