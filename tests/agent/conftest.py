from __future__ import annotations

import pytest

from llmgw.agent.discovery import fakenvml, gpus


@pytest.fixture(autouse=True)
def _isolated_discovery(monkeypatch):
    # A developer's shell may have a fake NVML set for a demo; tests choose their own.
    monkeypatch.delenv(fakenvml.ENV, raising=False)
    # "No NVIDIA cards" is said once per process; each test starts unsaid.
    monkeypatch.setattr(gpus, "_absent_reason", None)
