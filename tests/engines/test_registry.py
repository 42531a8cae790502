"""One adapter per engine server.yaml can name, and the checks every engine shares."""

from __future__ import annotations

import pytest

from llmgw.config.common import KNOWN_ENGINES
from llmgw.engines import ADAPTERS, adapter_for, validate_profile
from llmgw.engines.base import EngineAdapter


def test_every_engine_the_configuration_accepts_has_an_adapter():
    # Otherwise server.yaml loads a profile no agent can run.
    assert tuple(ADAPTERS) == KNOWN_ENGINES
    for name, adapter in ADAPTERS.items():
        assert isinstance(adapter, EngineAdapter)
        assert adapter.name == name
        assert adapter_for(name) is adapter


def test_an_unknown_engine_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError) as e:
        adapter_for("llamacpp")
    assert str(e.value) == "no engine named 'llamacpp'; llmgw knows llama.cpp, vllm, sglang, sim"
    assert validate_profile("tgi", [], 0, 1, "/m") == [
        "no engine named 'tgi'; llmgw knows llama.cpp, vllm, sglang, sim"
    ]


@pytest.mark.parametrize(
    "engine, args, gpus, source",
    [
        ("llama.cpp", ["-c", "4096", "-ngl", "99", "-t", "8", "--parallel", "4"], 1, "/m.gguf"),
        ("llama.cpp", [], 0, "https://example.org/m.gguf"),
        ("vllm", ["--max-model-len", "8192", "--gpu-memory-utilization", "0.85"], 2, "/m"),
        ("sglang", ["--mem-fraction-static", "0.8", "--context-length", "8192"], 4, "/m"),
        ("sim", ["--ttft-ms", "0"], 0, None),
    ],
)
def test_ordinary_profiles_pass(engine, args, gpus, source):
    assert validate_profile(engine, args, gpus, 1, source) == []


@pytest.mark.parametrize(
    "engine, flag",
    [
        *(("llama.cpp", f) for f in ("-m", "--model", "--host", "--port", "-a", "--alias", "-hf", "--hf-repo", "-mu")),
        *(("vllm", f) for f in ("--model", "--host", "--port", "--served-model-name")),
        *(("sglang", f) for f in ("--model-path", "--model", "--host", "--port", "--served-model-name",
                                   "--nnodes", "--node-rank", "--dist-init-addr")),
        *(("sim", f) for f in ("--host", "--port", "--model")),
    ],
)
def test_options_llmgw_sets_are_refused(engine, flag):
    message = f"{engine} profiles may not set {flag}: llmgw sets it for each shard"
    source = None if engine == "sim" else "/m"
    assert validate_profile(engine, [flag, "x"], 0, 1, source) == [message]
    # The --flag=value spelling is the same option.
    assert validate_profile(engine, [f"{flag}=x"], 0, 1, source) == [message]


def test_every_problem_is_reported_at_once():
    # An operator fixing a profile should not discover its problems one reload at a time.
    assert validate_profile("llama.cpp", ["--port", "9000", "-c", "big"], 0, 2, None) == [
        "llama.cpp profiles may not set --port: llmgw sets it for each shard",
        "llama.cpp models need a source: the GGUF file's path on the nodes or a URL",
        "llama.cpp runs on one node, ranks: 2 cannot be; set ranks: 1, or use vllm or sglang to span nodes",
        "llama.cpp -c must be a whole number of tokens (0: the model's own), not 'big'",
    ]
