"""The agent's first log line says where it keeps its state and weights, and which are defaults.

Run as root with no state_dir, the agent made /var/lib/llmgw without a word.
"""

from __future__ import annotations

from pathlib import Path

from llmgw.config import load_agent_config
from llmgw.process.agent import where_it_keeps


def config(tmp_path: Path, pki: Path, extra: str = ""):
    (tmp_path / "agent.yaml").write_text(
        'hub: "wss://127.0.0.1:7443/"\n'
        f"tls: {{ca: {pki}/ca.crt, cert: {pki}/node01.crt, key: {pki}/node01.key}}\n{extra}"
    )
    return load_agent_config(tmp_path / "agent.yaml")


def test_defaults_are_named_as_defaults_with_the_key_that_moves_them(tmp_path: Path, pki: Path) -> None:
    assert where_it_keeps(config(tmp_path, pki)) == (
        "state in /var/lib/llmgw (the default; state_dir in agent.yaml moves it), "
        "weights in /var/lib/llmgw-weights (the default; weights_dirs in agent.yaml moves it), "
        "engines the catalog names installed in /var/lib/llmgw/engines"
    )


def test_what_agent_yaml_sets_is_shown_plainly(tmp_path: Path, pki: Path) -> None:
    written = config(tmp_path, pki, f"state_dir: {tmp_path}/state\nweights_dirs: [{tmp_path}/w, /mnt/shared]\n")
    assert where_it_keeps(written) == (
        f"state in {tmp_path}/state, weights in {tmp_path}/w, /mnt/shared, "
        f"engines the catalog names installed in {tmp_path}/state/engines"
    )
