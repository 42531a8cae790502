"""contrib/'s systemd units, its agent.yaml and docs/operations.rst describe one layout.

The units once ran /usr/local/bin/twistd as a user nothing created, in a
directory nothing made, while the docs installed into /opt/llmgw.  These
tests read the units and the install commands in docs/operations.rst and
check that every path and user a unit needs is one the commands create.
And every twistd command in the docs names its pidfile: two without one in
the same directory collide on twistd.pid.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from llmgw.config.agent import DEFAULT_STATE_DIR, DEFAULT_WEIGHTS_DIRS
from tests.config.test_config_examples import load_agent_example

ROOT = Path(__file__).resolve().parents[1]
UNITS = sorted((ROOT / "contrib").glob("*.service"))


def service_section(path: Path) -> dict[str, str]:
    """The [Service] keys of a unit (each key once here, so a dict will do)."""
    keys, section = {}, None
    for line in path.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "Service" and "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            keys[key] = value
    return keys


def install_commands() -> list[str]:
    """The shell commands in docs/operations.rst's Install section, one per line."""
    text = (ROOT / "docs" / "operations.rst").read_text()
    section = text.split("\nInstall\n=======\n", 1)[1].split("\nTrying it on one machine\n", 1)[0]
    return [line.strip().split("  #")[0].strip() for line in section.splitlines() if line.startswith("    ")]


def created(owner: str) -> set[str]:
    """Directories the install commands make with *owner* as user or group."""
    made = set()
    for command in install_commands():
        words = command.split()
        if words[:2] == ["install", "-d"] and (f"-o {owner}" in command or f"-g {owner}" in command):
            made.update(w for w in words[2:] if w.startswith("/"))
    return made


def test_there_are_units_to_check() -> None:
    assert {u.name for u in UNITS} == {"llmgw-agent.service", "llmgw-router.service", "llmgw-server.service"}


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_a_unit_runs_what_the_install_section_creates(unit: Path) -> None:
    keys = service_section(unit)
    commands = install_commands()
    user = keys["User"]
    assert keys["Group"] == user
    assert any(c.startswith("useradd --system") and c.split()[-1] == user for c in commands), commands
    argv = keys["ExecStart"].split()
    venv = Path(argv[0]).parent.parent
    assert argv[0] == f"{venv}/bin/twistd" and f"python3 -m venv {venv}" in commands
    assert f"{venv}/bin/pip install" in " ".join(commands)
    assert keys["WorkingDirectory"] in created(user)
    config = Path(argv[argv.index("--config") + 1])
    assert str(config.parent) in created(user)
    assert "--pidfile=" in argv


def test_the_agent_example_keeps_its_state_and_weights_where_the_install_section_makes_them(tmp_path: Path) -> None:
    config = load_agent_example(tmp_path)
    agent_unit = service_section(ROOT / "contrib" / "llmgw-agent.service")
    made = created(agent_unit["User"])
    assert config.state_dir == agent_unit["WorkingDirectory"] == DEFAULT_STATE_DIR
    assert config.weights_dirs[0] == DEFAULT_WEIGHTS_DIRS[0]
    assert {config.state_dir, *DEFAULT_WEIGHTS_DIRS} <= made


# twistd, its own options, then the plugin and its --config: a command, not a mention.
TWISTD_COMMAND = re.compile(r"twistd((?:\s+-[^\s`]+)*)\s+llmgw-(?:server|agent|router)\s+(?:--config|-c)\b")


def test_every_twistd_command_in_the_docs_names_its_pidfile() -> None:
    documents = [ROOT / "README.rst", *sorted((ROOT / "docs").glob("*.rst")), *sorted(p for p in (ROOT / "contrib").rglob("*") if p.is_file())]
    commands = [(path.name, m.group(0)) for path in documents for m in TWISTD_COMMAND.finditer(path.read_text())]
    assert len(commands) >= 8, commands
    assert [c for c in commands if "--pidfile" not in c[1]] == []


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_a_unit_gives_its_process_room_for_connections(unit: Path) -> None:
    """systemd's default soft limit (1024) is what let API clients lock agents out of the hub."""
    limit = service_section(unit).get("LimitNOFILE")
    assert limit is not None and int(limit) >= 65536, f"{unit.name}: LimitNOFILE={limit}"


# -- contrib/prometheus and contrib/grafana ------------------------------------------

PROMETHEUS = ROOT / "contrib" / "prometheus"
DASHBOARD = ROOT / "contrib" / "grafana" / "llmgw.json"
# A family or recorded series a query names: llmgw_… or level:llmgw_…:operation.
SERIES = re.compile(r"\b(?:[a-z_]+:)?llmgw_[a-z0-9_]+(?::[a-z0-9_]+)?\b")


def documented_families() -> set[str]:
    """Every family docs/metrics.rst's tables list (a counter as its ``_total`` sample)."""
    text = (ROOT / "docs" / "metrics.rst").read_text()
    return set(re.findall(r"^   \* - ``(llmgw_[a-z0-9_]+)``$", text, re.MULTILINE))


def rules(name: str) -> list[dict]:
    import yaml

    return [rule for group in yaml.safe_load((PROMETHEUS / name).read_text())["groups"] for rule in group["rules"]]


def dashboard_queries() -> list[tuple[str, str]]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [(panel["title"], target["expr"]) for panel in panels for target in panel["targets"]]


def check(promtool: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([promtool, "check", *args], capture_output=True, text=True, timeout=60)


@pytest.mark.prometheus
def test_promtool_accepts_the_scrape_config_and_finds_its_rule_files(promtool: str) -> None:
    done = check(promtool, "config", str(PROMETHEUS / "prometheus.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 rule files found" in done.stdout


@pytest.mark.prometheus
def test_promtool_accepts_the_alert_and_recording_rules(promtool: str) -> None:
    done = check(promtool, "rules", str(PROMETHEUS / "alerts.yml"), str(PROMETHEUS / "recording.yml"))
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_alerts_cover_what_an_operator_is_paged_for() -> None:
    assert {rule["alert"] for rule in rules("alerts.yml")} == {
        "LlmgwNodeLost", "LlmgwNoHealthyEndpoint", "LlmgwReplicaFailingRepeatedly", "LlmgwQueueRejecting",
        "LlmgwDiskNearlyFull", "LlmgwGpuMemoryNearlyFull", "LlmgwCertificateExpiringSoon"}
    expiry = next(r for r in rules("alerts.yml") if r["alert"] == "LlmgwCertificateExpiringSoon")["expr"]
    assert expiry.count("14 * 86400") == 2


@pytest.mark.prometheus
def test_every_dashboard_query_parses(promtool: str, tmp_path: Path) -> None:
    """Each panel's query, as a recording rule, through Prometheus' own parser (promtool)."""
    import yaml

    queries = dashboard_queries()
    assert len(queries) >= 20
    as_rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": expr} for i, (_, expr) in enumerate(queries)]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(as_rules))
    done = check(promtool, "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr
    # And a query that does not parse is caught: the check can fail.
    path.write_text(yaml.safe_dump({"groups": [{"name": "bad", "rules": [{"record": "x:y", "expr": "sum by (model"}]}]}))
    assert check(promtool, "rules", str(path)).returncode != 0


def test_every_series_contrib_reads_is_a_documented_family_or_a_recorded_rule() -> None:
    """A rule or panel reading a family nobody emits would be an alert that never fires, a graph that stays empty."""
    families = documented_families()
    assert len(families) >= 50
    recorded = {rule["record"] for rule in rules("recording.yml")}
    samples = families | {f + suffix for f in families for suffix in ("_bucket", "_sum", "_count")}
    exprs = [r["expr"] for r in rules("alerts.yml") + rules("recording.yml")] + [e for _, e in dashboard_queries()]
    unknown = {name for expr in exprs for name in SERIES.findall(expr)} - samples - recorded
    assert unknown == set()
    # Every recorded rule is used by the dashboard.
    assert recorded - {name for _, e in dashboard_queries() for name in SERIES.findall(e)} == set()


# Series a scrape would have, and the alerts contrib's rules must raise from them (and must not).
ALERT_CASES = """
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      - {series: 'llmgw_node_state{node="n1",state="lost"}', values: '1x20'}
      - {series: 'llmgw_node_state{node="n2",state="lost"}', values: '0x20'}
      - {series: 'llmgw_replicas{model="slow",state="failed"}', values: '1x20'}
      - {series: 'llmgw_replicas{model="echo",state="ready"}', values: '2x20'}
      - {series: 'llmgw_router_endpoint_healthy{endpoint="echo/0",model="echo"}', values: '1x20'}
      - {series: 'llmgw_router_endpoint_healthy{endpoint="echo/1",model="echo"}', values: '0x20'}
      - {series: 'llmgw_shards{model="slow",state="failed"}', values: '0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1 0 1'}
      - {series: 'llmgw_shards{model="echo",state="failed"}', values: '0 1 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0'}
      - {series: 'llmgw_router_admission_rejections_total{model="echo",reason="queue_full"}', values: '0+10x20'}
      - {series: 'llmgw_router_admission_rejections_total{model="slow",reason="unauthorized"}', values: '0+10x20'}
      - {series: 'llmgw_filesystem_free_bytes{node="n1",mountpoint="/srv",fstype="ext4",shared="false"}', values: '5x20'}
      - {series: 'llmgw_filesystem_size_bytes{node="n1",mountpoint="/srv",fstype="ext4",shared="false"}', values: '100x20'}
      - {series: 'llmgw_gpu_memory_used_bytes{node="n1",gpu="0",uuid="GPU-a",name="RTX 4090"}', values: '97x20'}
      - {series: 'llmgw_gpu_memory_total_bytes{node="n1",gpu="0",uuid="GPU-a",name="RTX 4090"}', values: '100x20'}
      - {series: 'llmgw_certificate_expiry_timestamp_seconds{certificate="server"}', values: '864000x20'}
      - {series: 'llmgw_certificate_expiry_timestamp_seconds{certificate="ca"}', values: '315360000x20'}
      - {series: 'llmgw_node_certificate_expiry_timestamp_seconds{node="n1"}', values: '1209000x20'}
      - {series: 'llmgw_node_certificate_expiry_timestamp_seconds{node="n2"}', values: '9999999x20'}
    alert_rule_test:
      - {eval_time: 16m, alertname: LlmgwNodeLost, exp_alerts: [{exp_labels: {severity: critical, node: n1, state: lost}}]}
      - {eval_time: 16m, alertname: LlmgwNoHealthyEndpoint, exp_alerts: [{exp_labels: {severity: critical, model: slow}}]}
      - {eval_time: 19m, alertname: LlmgwReplicaFailingRepeatedly,
         exp_alerts: [{exp_labels: {severity: warning, model: slow}}]}
      - {eval_time: 16m, alertname: LlmgwQueueRejecting, exp_alerts: [{exp_labels: {severity: warning, model: echo}}]}
      - {eval_time: 16m, alertname: LlmgwDiskNearlyFull,
         exp_alerts: [{exp_labels: {severity: warning, node: n1, mountpoint: /srv, fstype: ext4, shared: "false"}}]}
      - {eval_time: 16m, alertname: LlmgwGpuMemoryNearlyFull,
         exp_alerts: [{exp_labels: {severity: warning, node: n1, gpu: "0", uuid: GPU-a, name: RTX 4090}}]}
      - {eval_time: 16m, alertname: LlmgwCertificateExpiringSoon,
         exp_alerts: [{exp_labels: {severity: warning, certificate: server}}, {exp_labels: {severity: warning, node: n1}}]}
"""


@pytest.mark.prometheus
def test_each_alert_fires_on_the_series_it_is_for_and_not_on_their_neighbours(promtool: str, tmp_path: Path) -> None:
    """promtool's rule unit tests, against alerts.yml's expressions and `for:` (annotations left out)."""
    import yaml

    alerts = yaml.safe_load((PROMETHEUS / "alerts.yml").read_text())
    for group in alerts["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations")
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(alerts))
    cases = yaml.safe_load(ALERT_CASES)
    cases["rule_files"] = [str(tmp_path / "alerts.yml")]
    (tmp_path / "cases.yml").write_text(yaml.safe_dump(cases))
    done = subprocess.run([promtool, "test", "rules", str(tmp_path / "cases.yml")], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
