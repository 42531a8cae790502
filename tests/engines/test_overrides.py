"""No profile arg can undo an option llmgw writes into an engine's command line, however it is spelled.

A profile's args come after llmgw's own and the engine keeps the last one it
reads, so every option in llmgw's part of a plan's argv must be refused when a
profile names it: as written, with the engine's ``--a_b`` spelling, and (for
an argparse engine) by any prefix.  The simulator is llmgw's own and takes no
prefix at all: ``--hos`` makes it exit at start, naming it, as llama.cpp does.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from llmgw.engines import ADAPTERS, validate_profile
from llmgw.sim.options import parse, parser
from tests.engines.helpers import shard
from tests.support.cluster import ROOT
from tests.support.sim import MODEL

SHAPES = [("llama.cpp", 1, None), ("vllm", 1, None), ("vllm", 2, "native"), ("sglang", 1, None),
          ("sglang", 2, "native"), ("sim", 1, None)]


def llmgw_flags(engine: str, ranks: int, launcher: str) -> list[str]:
    """The options llmgw writes for a shard of this shape, before the profile's args."""
    spec = shard(engine, ranks=ranks, gpus=[0], leader="10.0.0.1:29500" if ranks > 1 else None, launcher=launcher)
    argv = ADAPTERS[engine].plan(spec, binary=None if engine == "sim" else "/opt/engine/bin/engine", host="127.0.0.1",
                                 port=9, model_path="/m", **({"rendezvous_port": 29500} if ranks > 1 else {})).argv
    # "-m MODULE" of a Python-run engine is Python's own option, not the engine's.
    return [a for i, a in enumerate(argv) if a.startswith("-") and not (a == "-m" and argv[i + 1].count("."))]


def spellings(engine: str, flag: str) -> list[str]:
    spelling = ADAPTERS[engine].spelling
    out = [flag]
    if spelling.underscores and flag.startswith("--") and "-" in flag[2:]:
        out.append("--" + flag[2:].replace("-", "_"))
    if spelling.prefixes and flag.startswith("--") and len(flag) > 4:
        out.append(flag[:-1])
    return out


@pytest.mark.parametrize("engine, ranks, launcher", SHAPES, ids=[f"{e}-{r}" for e, r, _ in SHAPES])
def test_every_option_llmgw_writes_is_refused_in_a_profile_however_spelled(engine, ranks, launcher):
    flags = llmgw_flags(engine, ranks, launcher)
    assert "--port" in flags
    source = None if engine == "sim" else "/m"
    for flag in flags:
        for spelled in spellings(engine, flag):
            for args in ([spelled, "7"], [f"{spelled}=7"]):
                assert validate_profile(engine, args, 1, ranks, source, launcher), \
                    f"{engine} (ranks {ranks}) takes {args} from a profile over llmgw's {flag}"


def test_vllm_refuses_a_unix_socket_which_would_replace_the_address_llmgw_gives_it():
    (problem,) = validate_profile("vllm", ["--uds", "/tmp/x.sock"], 1, 1, "/m")
    assert problem == "vllm profiles may not set --uds: llmgw sets it for each shard"


def test_the_simulator_reads_no_option_by_a_prefix():
    base = ["--model", "m", "--host", "127.0.0.1", "--port", "0"]
    for action in parser()._actions:
        for option in (o for o in action.option_strings if o.startswith("--")):
            for end in range(3, len(option)):
                with pytest.raises(SystemExit):
                    parse([*base, option[:end], "1"])


def test_a_sim_profile_is_passed_on_as_written_and_an_abbreviation_names_nothing_llmgw_sets():
    # --hos is no option of the simulator's: the shard would fail at start saying so, as llama.cpp does.
    assert validate_profile("sim", ["--hos", "0.0.0.0", "--por", "1"], 0, 1, None) == []
    assert validate_profile("sim", ["--host=0.0.0.0"], 0, 1, None) == [
        "sim profiles may not set --host: llmgw sets it for each shard"]


def test_a_simulator_given_an_abbreviated_port_after_its_own_exits_and_serves_nothing():
    done = subprocess.run([sys.executable, "-m", "llmgw.sim", "--model", MODEL, "--host", "127.0.0.1", "--port", "0",
                           "--por", "1"], capture_output=True, text=True, timeout=30,
                          env=dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    assert done.returncode == 2 and "unrecognized arguments: --por 1" in done.stderr
    assert "serving" not in done.stdout


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("args", [["--config", "/etc/x.yaml"], ["--config=/etc/x.yaml"], ["--conf", "/etc/x.yaml"]],
                         ids=["apart", "joined", "prefix"])
def test_a_config_file_which_could_set_what_llmgw_sets_is_refused(engine, args):
    # Both put the file's options under the command line's, so llmgw's own still win; but the file
    # may set anything llmgw does not write (--uds, --api-key, ...), past every check of the args.
    (problem,) = validate_profile(engine, args, 1, 1, "/m")
    spelled = args[0].partition("=")[0]
    assert problem.startswith(f"{engine} profiles may not set {spelled}: ")
    assert "reads options from that file" in problem and "put the options in the profile's args instead" in problem
    if spelled == "--conf":
        assert f"{engine} may read it as --config" in problem


def test_llama_cpp_has_no_config_file_and_its_presets_are_refused():
    assert validate_profile("llama.cpp", ["--config", "/etc/x.ini"], 0, 1, "/m.gguf") == []  # it exits naming it
    (problem,) = validate_profile("llama.cpp", ["--models-preset", "/etc/x.ini"], 0, 1, "/m.gguf")
    assert "may not set --models-preset" in problem


def test_an_option_that_only_begins_like_config_is_the_profiles_own():
    # --config-format says how to read the model's config.json; it reads no options from a file.
    assert validate_profile("vllm", ["--config-format", "hf"], 1, 1, "/m") == []
