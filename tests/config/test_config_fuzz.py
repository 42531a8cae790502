"""Whatever is in the file, the loaders either load it or raise ConfigError.

A traceback instead of ``FILE:LINE: key: ...`` is a bug: the operator cannot
tell what to fix, and a reload that crashes instead of refusing would not
keep the old catalog.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.config import load_agent_config, load_ctl_config, load_server_config
from llmgw.config.agent import SCHEMA as AGENT_SCHEMA
from llmgw.config.schema import all_keys
from llmgw.config.server import SCHEMA as SERVER_SCHEMA
from llmgw.errors import ConfigError

LOADERS = (load_server_config, load_agent_config, load_ctl_config)
# "FILE:LINE: path: message" on one line (the file always exists here).
MESSAGE = re.compile(r"conf\.yaml:(\d+): \S.*: \S.*")

# Tests use the same directory for every example: the loaders only read.
FUZZ = settings(
    max_examples=int(os.environ.get("LLMGW_FUZZ_EXAMPLES", "300")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


KEYS = sorted(set(all_keys(SERVER_SCHEMA) + all_keys(AGENT_SCHEMA)))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(
        [
            "ssl:7443",
            "tcp:8080:interface=127.0.0.1",
            "wss://cp:7443/",
            "ca.crt",
            "server.crt",
            "server.key",
            "sim",
            "llama.cpp",
            "prefix-affinity",
            "/var/lib/x",
            "a" * 64,
        ]
    ),
)
NAMES = st.one_of(st.sampled_from(KEYS), st.text(max_size=10), st.integers(), st.booleans())
DOCUMENTS = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(NAMES, inner, max_size=6)
    ),
    max_leaves=25,
)


def check(path: Path) -> None:
    for load in LOADERS:
        try:
            load("conf.yaml")
        except ConfigError as e:
            match = MESSAGE.fullmatch(str(e))
            assert match, str(e)
            # The line is one the file has (or the line after its last line break;
            # YAML counts a lone \r as one too).
            lines = path.read_bytes().decode("utf-8", "replace").splitlines()
            assert 1 <= int(match.group(1)) <= len(lines) + 1, str(e)


@FUZZ
@given(st.binary(max_size=300))
def test_any_bytes(confdir: Path, data: bytes) -> None:
    path = confdir / "conf.yaml"
    path.write_bytes(data)
    check(path)


@FUZZ
@given(st.text(alphabet=st.sampled_from(list("{}[]:-,'\"!&*#|>?%@`<= \n\t\\ax1.")), max_size=120))
def test_text_made_of_yaml_punctuation(confdir: Path, text: str) -> None:
    path = confdir / "conf.yaml"
    path.write_text(text)
    check(path)


@FUZZ
@given(DOCUMENTS)
def test_documents_shaped_like_configuration(confdir: Path, document: object) -> None:
    path = confdir / "conf.yaml"
    path.write_text(dump(document))
    check(path)


GOOD = {
    load_server_config: {
        "listen": {"link": "ssl:7443"},
        "tls": {"ca": "ca.crt", "cert": "server.crt", "key": "server.key"},
    },
    load_agent_config: {
        "hub": "wss://cp:7443/",
        "tls": {"ca": "ca.crt", "cert": "server.crt", "key": "server.key"},
    },
}


# One test for both files rather than parametrize: pytest-twisted's wrapper
# cannot run a parametrized Hypothesis test twice in one session.
@FUZZ
@given(body=st.dictionaries(NAMES, DOCUMENTS, max_size=8))
def test_good_headers_with_arbitrary_bodies(confdir: Path, body: dict) -> None:
    """Start from a file that loads, so the search reaches the deeper sections."""
    path = confdir / "conf.yaml"
    for load, good in GOOD.items():
        path.write_text(dump({**good, **body}))
        try:
            load("conf.yaml")
        except ConfigError as e:
            assert MESSAGE.fullmatch(str(e)), str(e)


def test_the_good_headers_do_load(confdir: Path) -> None:
    """Otherwise the test above would only ever see errors."""
    for load, document in GOOD.items():
        (confdir / "conf.yaml").write_text(dump(document))
        load("conf.yaml")


def dump(document: object) -> str:
    # sort_keys would compare the int and str keys generated above.
    return yaml.safe_dump(document, default_flow_style=False, sort_keys=False)
