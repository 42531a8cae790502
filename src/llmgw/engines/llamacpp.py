"""llama.cpp's ``llama-server``: one process on one node, CPU or GPU.

llmgw sets the model file, where it listens and the name ``/v1/models``
reports; everything else (context size, GPU layers, threads, parallel slots)
is the profile's, passed through verbatim.
"""

from __future__ import annotations

import re
from typing import Sequence

from twisted.logger import Logger

from llmgw.engines.base import (
    EngineAdapter,
    HealthProbe,
    LaunchPlan,
    ProbeFailed,
    ProbeResult,
    Spelling,
    check_executable,
    integer_option,
    missing_libraries,
    option_values,
    refuse_invalid,
    require_binary,
    run_probe,
    visible_devices,
)
from llmgw.records import EngineInfo, ShardSpec

log = Logger()

BINARY = "llama-server"
VERSION_TIMEOUT_S = 10.0

# Printed on stderr, sometimes after lines about the backends it loaded.
# Builds until late 2025: "version: 6000 (abc1234)"; later ones:
# "version: 0.6.0 (build 7000, commit abc1234)", build 0 when built outside git.
_VERSION_OLD = re.compile(r"^version:\s*(\d+)\s*\(([^)]*)\)", re.MULTILINE)
_VERSION_NEW = re.compile(r"^version:\s*(\S+)\s*\(build\s*(\d+),\s*commit\s*([^)]*)\)", re.MULTILINE)

# The options profiles most often set, checked here because llama-server only
# complains about a bad value after it has started loading the model:
# (spellings, what the value must be, its least value, words it also takes).
_INTEGER_OPTIONS = (
    (("-c", "--ctx-size"), "a whole number of tokens (0: the model's own)", 0, ()),
    (("-t", "--threads"), "a whole number of threads (-1: as many as cores)", -1, ()),
    (("-np", "--parallel"), "a whole number of slots (-1: chosen by llama-server)", -1, ()),
    (("-ngl", "--gpu-layers", "--n-gpu-layers"), "a whole number of layers, auto or all", -1, ("auto", "all")),
)


class LlamaCpp(EngineAdapter):
    name = "llama.cpp"
    reserved_args = (
        "-m", "--model",
        # Weights come from the model's source:, fetched and checked by the agent.
        "-mu", "--model-url", "-hf", "-hfr", "--hf-repo", "-hff", "--hf-file", "-dr", "--docker-repo",
        # A directory or preset of models would serve others than the catalog's.
        "--models-dir", "--models-preset",
        "--host", "--port",
        "-a", "--alias",
    )  # fmt: skip
    # llama.cpp's own parser: exact names only, "--a_b" read as "--a-b".
    spelling = Spelling(underscores=True)

    def validate(self, args: Sequence[str], *, gpus: int, ranks: int, source: str | None,
                 launcher: str | None = None) -> list[str]:
        problems = super().validate(args, gpus=gpus, ranks=ranks, source=source, launcher=launcher)
        if source is None:
            problems.append("llama.cpp models need a source: the GGUF file's path on the nodes or a URL")
        if ranks != 1:
            problems.append(
                f"llama.cpp runs on one node, ranks: {ranks} cannot be; "
                "set ranks: 1, or use vllm or sglang to span nodes"
            )
        for names, what, least, words in _INTEGER_OPTIONS:
            for flag, value in option_values(args, names, self.spelling):
                problem = None if value in words else integer_option(self.name, flag, value, what, least)[1]
                if problem:
                    problems.append(problem)
        return problems

    def plan(self, spec: ShardSpec, *, binary: str | None, host: str, port: int, model_path: str | None) -> LaunchPlan:
        refuse_invalid(self, spec)
        if model_path is None:
            raise ValueError(f"{spec.shard_id}: llama.cpp needs the model file's local path")
        argv = [
            require_binary(spec, binary, BINARY),
            "-m", model_path,
            "--host", host,
            "--port", str(port),
            # Without it /v1/models names the file, not the catalog's model.
            "--alias", spec.model,
            *spec.args,
        ]  # fmt: skip
        # visible_devices gives "" for a CPU profile, so a CUDA build on a GPU
        # node does not help itself to cards that belong to other shards.
        return LaunchPlan(argv=argv, env=visible_devices(spec.gpus), health=HealthProbe("/health"))

    def probe_detail(self, path: str | None) -> ProbeResult:
        try:
            check_executable(path, BINARY)
        except ProbeFailed as e:
            return ProbeResult(None, str(e))
        try:
            output = run_probe([path, "--version"], VERSION_TIMEOUT_S)
        except ProbeFailed as e:
            missing = missing_libraries(path, e.output)
            if missing:
                one = len(missing) == 1
                reason = (
                    f"{path} cannot run: missing shared {'library' if one else 'libraries'} "
                    f"{', '.join(missing)}; install the package that provides {'it' if one else 'them'}"
                )
            else:
                reason = str(e)
            log.warn("llama.cpp unavailable: {reason}", reason=reason)
            return ProbeResult(None, reason)
        return ProbeResult(*_parse_version(path, output))


def _parse_version(path: str, output: str) -> tuple[EngineInfo, str | None]:
    """The build as release tags name it (``b6000``), as server.yaml's ``engines:`` does.

    A build from outside a git checkout has no build number, only its library
    version ("0.6.0-dev").
    """
    if match := _VERSION_NEW.search(output):
        library, build, commit = match.groups()
        version = f"b{build}" if build != "0" else library
    elif match := _VERSION_OLD.search(output):
        build, commit = match.groups()
        version = f"b{build}"
    else:
        # It ran and exited 0, so the node has a working llama-server; which
        # build is unknown, which is no reason to pretend it is absent.
        return EngineInfo("llama.cpp", None, path), f"{path} --version printed no version line"
    log.debug("llama.cpp {version} (commit {commit}) at {path}", version=version, commit=commit, path=path)
    return EngineInfo("llama.cpp", version, path), None
