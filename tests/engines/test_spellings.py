"""Options llmgw sets are refused however the engine's own parser would let a profile spell them.

vLLM and SGLang parse with argparse, which takes any prefix of a long option
that names one option (``--hos`` is ``--host``) and reads ``--opt=value``;
vLLM also reads ``--a_b`` as ``--a-b`` and ``--key.sub V`` as part of
``--key``; llama.cpp reads ``--a_b`` as ``--a-b`` and takes no prefixes, nor
does the simulator (``allow_abbrev=False``).  A profile that spells a
reserved option any of those ways would otherwise set it after llmgw has:
the last one wins.
"""

from __future__ import annotations

import argparse

import pytest

from llmgw.engines import ADAPTERS, validate_profile
from llmgw.sim.options import parser as sim_parser


def refused(engine: str, args: list[str]) -> list[str]:
    source = None if engine == "sim" else "/m"
    return [p for p in validate_profile(engine, args, 0, 1, source) if "may not set" in p]


def sets(engine: str, spelled: str, option: str) -> str:
    return f"{engine} profiles may not set {spelled}: {engine} reads it as {option}, which llmgw sets for each shard"


@pytest.mark.parametrize(
    "engine, args, problems",
    [
        # argparse's abbreviations, with a value after or after "=".
        ("vllm", ["--hos", "0.0.0.0", "--por", "8001"], [sets("vllm", "--hos", "--host"), sets("vllm", "--por", "--port")]),
        ("vllm", ["--ho=0.0.0.0"], [sets("vllm", "--ho", "--host")]),
        ("vllm", ["--mod", "/other"], [sets("vllm", "--mod", "--model")]),
        ("vllm", ["--served-model", "gpt-4"], [sets("vllm", "--served-model", "--served-model-name")]),
        # vLLM's own spellings: underscores for dashes, and a dotted part of an option.
        ("vllm", ["--served_model_name", "gpt-4"], [sets("vllm", "--served_model_name", "--served-model-name")]),
        ("vllm", ["--ho_st=0.0.0.0"], []),
        ("vllm", ["--host.x", "0.0.0.0"], [sets("vllm", "--host.x", "--host")]),
        ("vllm", ["--port", "1"], ["vllm profiles may not set --port: llmgw sets it for each shard"]),
        # Options that begin like a reserved one but are not a prefix of it are the profile's.
        ("vllm", ["--model-impl", "transformers", "--max-model-len", "8192"], []),
        ("sglang", ["--hos", "0.0.0.0"], [sets("sglang", "--hos", "--host")]),
        ("sglang", ["--model-p", "/other"], [sets("sglang", "--model-p", "--model-path")]),
        ("sglang", ["--model", "/other"], ["sglang profiles may not set --model: llmgw sets it for each shard"]),
        ("sglang", ["--node=1"], [sets("sglang", "--node", "--node-rank")]),
        ("sglang", ["--nnode", "2"], [sets("sglang", "--nnode", "--nnodes")]),
        ("sglang", ["--dist-init", "h:1"], [sets("sglang", "--dist-init", "--dist-init-addr")]),
        ("sglang", ["--served_model_name", "x"], [sets("sglang", "--served_model_name", "--served-model-name")]),
        ("sglang", ["--n", "2"], ["sglang profiles may not set --n: sglang may read it as --nnodes or --node-rank, "
                                   "which llmgw sets for each shard"]),
        ("sglang", ["--tp", "1"], []),
        # The simulator reads no prefix: "--hos" is no option of its (refused as unknown: tests/engines/test_overrides.py).
        ("sim", ["--hos", "0.0.0.0", "--p", "1"], []),
        ("sim", ["--mo=x"], []),
        ("sim", ["--port=1"], ["sim profiles may not set --port: llmgw sets it for each shard"]),
        # llama.cpp reads --a_b as --a-b, takes no prefixes (it refuses --hos itself), and has aliases.
        ("llama.cpp", ["--hf_repo", "org/other"], [sets("llama.cpp", "--hf_repo", "--hf-repo")]),
        ("llama.cpp", ["--model_url", "https://x/m.gguf"], [sets("llama.cpp", "--model_url", "--model-url")]),
        ("llama.cpp", ["--hos", "0.0.0.0"], []),
        ("llama.cpp", ["--host=0.0.0.0"], ["llama.cpp profiles may not set --host: llmgw sets it for each shard"]),
        ("llama.cpp", ["-hfr", "org/other"], ["llama.cpp profiles may not set -hfr: llmgw sets it for each shard"]),
        ("llama.cpp", ["-dr", "ai/other"], ["llama.cpp profiles may not set -dr: llmgw sets it for each shard"]),
        ("llama.cpp", ["--docker-repo", "ai/other"],
         ["llama.cpp profiles may not set --docker-repo: llmgw sets it for each shard"]),
        ("llama.cpp", ["--models-dir", "/srv"], ["llama.cpp profiles may not set --models-dir: llmgw sets it for each shard"]),
    ],
)
def test_each_spelling_the_engine_accepts_is_refused(engine, args, problems):
    assert refused(engine, args) == problems


def test_a_value_that_looks_like_a_prefix_is_still_an_option_to_argparse():
    # argparse never takes "--hos" as the value of the option before it: it is an option.
    assert refused("vllm", ["--chat-template", "--hos", "0.0.0.0"]) == [sets("vllm", "--hos", "--host")]


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--")]


def spellings(parser: argparse.ArgumentParser) -> set[str]:
    """Every prefix of every long option of *parser*, each also with ``=``."""
    found = set()
    for option in option_strings(parser):
        for end in range(3, len(option) + 1):
            found |= {option[:end], option[:end] + "=7"}
    return found


def reserved_set(parser: argparse.ArgumentParser, base: list[str], spelled: str, reserved: set[str]) -> bool | None:
    """Whether argparse, reading *spelled* after llmgw's *base*, changes a reserved option; None when it errors."""
    parser.exit_on_error = False
    before = vars(parser.parse_args(base))
    try:
        after, _ = parser.parse_known_args(base + ([spelled] if "=" in spelled else [spelled, "7"]))
    except (argparse.ArgumentError, SystemExit):
        return None
    dests = {a.dest for a in parser._actions if set(a.option_strings) & reserved}
    return any(vars(after)[d] != before[d] for d in dests)


def test_the_simulator_refuses_exactly_what_its_own_parser_would_take_for_a_reserved_option(capsys):
    parser = sim_parser()
    reserved = set(ADAPTERS["sim"].reserved_args)
    base = ["--model", "m", "--host", "h", "--port", "1"]
    for spelled in sorted(spellings(parser)):
        takes = reserved_set(parser, base, spelled, reserved)
        refuses = bool(refused("sim", [spelled] if "=" in spelled else [spelled, "7"]))
        if takes:
            assert refuses, f"{spelled} sets a reserved option and passed"
        elif takes is False:
            assert not refuses, f"{spelled} sets no reserved option and was refused"


# What an argparse engine with allow_abbrev (vLLM's and SGLang's parsers) does
# with every prefix of its reserved options and of options beside them.
NEIGHBOURS = {
    "vllm": ["--model-impl", "--max-model-len", "--tensor-parallel-size", "--pipeline-parallel-size",
             "--port-offset", "--hf-config-path", "--served-model-names"],
    "sglang": ["--model-loader-extra-config", "--tp-size", "--pp-size", "--nccl-port", "--dist-timeout",
               "--host-ip", "--served-model-alias", "--node-count"],
}


@pytest.mark.parametrize("engine", sorted(NEIGHBOURS))
def test_an_argparse_engine_refuses_every_prefix_argparse_would_take_for_a_reserved_option(engine):
    reserved = set(ADAPTERS[engine].reserved_args)
    parser = argparse.ArgumentParser(allow_abbrev=True, exit_on_error=False)
    for option in sorted(reserved | set(NEIGHBOURS[engine])):
        parser.add_argument(option)
    for spelled in sorted(spellings(parser)):
        takes = reserved_set(parser, [], spelled, reserved)
        refuses = bool(refused(engine, [spelled] if "=" in spelled else [spelled, "7"]))
        if takes:
            assert refuses, f"{engine}: {spelled} sets a reserved option and passed"
        if refuses:
            # Refusing what argparse would refuse anyway (ambiguous) costs nothing; refusing
            # another option the engine has would.
            assert takes is not False, f"{engine}: {spelled} names another option and was refused"
