"""Which directories the agent fetches into, scans, and reports the disk of: always the same ones.

With ``weights_dirs: []`` the agent used to fetch into the default directory
but scan and report none, so what it fetched was never listed and the disk
it filled never shown.  The real default is under /var/lib; the test moves
it to a temporary directory.
"""

from __future__ import annotations

from pathlib import Path

import attrs
import pytest
import pytest_twisted
from twisted.internet import reactor

from llmgw.agent.service import Agent
from llmgw.config import agent as agentconfig
from llmgw.control.weights import free_for_weights, holds
from llmgw.huburl import parse_hub_url
from llmgw.weightnames import cache_name, partial_name

SOURCE = "https://models.example/tiny.gguf"


@pytest.fixture
def default_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    default = tmp_path / "default-weights"
    default.mkdir()
    monkeypatch.setattr(agentconfig, "DEFAULT_WEIGHTS_DIRS", (str(default),))
    return default


def agent_from(tmp_path: Path, pki: Path, weights_line: str) -> Agent:
    """A real agent of an agent.yaml whose weights_dirs line is *weights_line*."""
    (tmp_path / "agent.yaml").write_text(
        f'hub: "wss://127.0.0.1:7443/"\n'
        f"tls: {{ca: {pki}/ca.crt, cert: {pki}/node01.crt, key: {pki}/node01.key}}\n"
        f"state_dir: {tmp_path / 'state'}\n{weights_line}\n"
    )
    config = agentconfig.load_agent_config(tmp_path / "agent.yaml")
    return Agent(reactor, config, "node01", parse_hub_url(config.hub[0]))


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("written", ["weights_dirs: []", "weights_dirs:"])
async def test_an_empty_weights_list_fetches_scans_and_reports_the_same_default_directory(
    tmp_path: Path, pki: Path, default_weights: Path, written: str
) -> None:
    agent = agent_from(tmp_path, pki, written)
    assert agent.cache_dir == default_weights

    # What a finished fetch leaves behind.
    fetched = default_weights / cache_name(SOURCE)
    fetched.write_bytes(b"GGUF" + bytes(60))
    report = await agent.weights_report(force=True)
    inventory = attrs.evolve(await agent.discover(), weights=report)

    assert [f.path for f in report.files] == [str(fetched)]
    assert report.cache_dir == str(default_weights)
    assert [fs.weights_dirs for fs in inventory.filesystems] == [[str(default_weights)]]
    # What the control plane reads from it: room where the node fetches, and that it holds the model.
    assert free_for_weights(inventory) is not None
    assert holds(inventory, SOURCE)
    heartbeat = await agent.sample()
    assert [fs.weights_dirs for fs in heartbeat.filesystems] == [[str(default_weights)]]


@pytest_twisted.ensureDeferred
async def test_the_agent_reports_a_fetched_repository_and_an_operators_model_directory_as_held(
    tmp_path: Path, pki: Path, default_weights: Path
) -> None:
    filer = tmp_path / "filer"
    agent = agent_from(tmp_path, pki, f"weights_dirs: [{default_weights}, {filer}]")
    repo, half = default_weights / cache_name("hf://acme/tiny"), default_weights / partial_name("hf://acme/other")
    for directory in (repo, half, filer / "llama"):
        directory.mkdir(parents=True)
        (directory / "config.json").write_text("{}")
        (directory / "model.safetensors").write_bytes(b"w" * 98)

    report = await agent.weights_report(force=True)
    assert [(d.path, d.size_bytes) for d in report.directories] == [
        (str(repo), 100), (str(filer / "llama"), 100)]
    inventory = attrs.evolve(await agent.discover(), weights=report)
    assert holds(inventory, "hf://acme/tiny") and holds(inventory, str(filer / "llama"))
    assert not holds(inventory, "hf://acme/other")  # still being fetched
