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
from llmgw.weightnames import cache_name

SOURCE = "https://models.example/tiny.gguf"


@pytest.fixture
def default_weights(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    default = tmp_path / "default-weights"
    default.mkdir()
    monkeypatch.setattr(agentconfig, "DEFAULT_WEIGHTS_DIRS", (str(default),))
    return default


@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("written", ["weights_dirs: []", "weights_dirs:"])
async def test_an_empty_weights_list_fetches_scans_and_reports_the_same_default_directory(
    tmp_path: Path, pki: Path, default_weights: Path, written: str
) -> None:
    (tmp_path / "agent.yaml").write_text(
        f'hub: "wss://127.0.0.1:7443/"\n'
        f"tls: {{ca: {pki}/ca.crt, cert: {pki}/node01.crt, key: {pki}/node01.key}}\n"
        f"state_dir: {tmp_path / 'state'}\n{written}\n"
    )
    config = agentconfig.load_agent_config(tmp_path / "agent.yaml")
    agent = Agent(reactor, config, "node01", parse_hub_url(config.hub))
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
