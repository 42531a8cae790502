"""llama.cpp: the argv llama-server gets, what a profile may say, and probing the binary."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.request

import pytest

from llmgw.engines import adapter_for
from llmgw.engines import llamacpp as llamacpp_module
from llmgw.engines.base import HealthProbe
from llmgw.records import EngineInfo
from tests.support.net import free_port
from tests.support.wait import wait_for

from .helpers import shard

LLAMA = adapter_for("llama.cpp")


def plan(spec, binary="/opt/llama/bin/llama-server", host="10.0.0.5", port=8101, model_path="/cache/ab12.gguf"):
    return LLAMA.plan(spec, binary=binary, host=host, port=port, model_path=model_path)


# -- plans --------------------------------------------------------------------


def test_a_cpu_profile_gets_no_gpus_at_all():
    p = plan(shard("llama.cpp", model="gemma-3-270m", args=["-c", "4096", "-t", "4"]))
    assert p.argv == [
        "/opt/llama/bin/llama-server",
        "-m", "/cache/ab12.gguf",
        "--host", "10.0.0.5",
        "--port", "8101",
        "--alias", "gemma-3-270m",
        "-c", "4096", "-t", "4",
    ]  # fmt: skip
    # Empty, not absent: a CUDA build would otherwise take every card on the node.
    assert p.env == {"CUDA_VISIBLE_DEVICES": ""}
    assert p.health == HealthProbe("/health")


def test_a_gpu_shard_sees_only_its_own_cards():
    p = plan(shard("llama.cpp", gpus=[2, 3], args=["-ngl", "99", "--parallel", "4"]))
    assert p.env == {"CUDA_VISIBLE_DEVICES": "2,3"}
    assert p.argv[-4:] == ["-ngl", "99", "--parallel", "4"]


def test_without_a_binary_there_is_no_plan_rather_than_whatever_is_on_path():
    with pytest.raises(ValueError, match="qwen/0/0: no llama-server to run: the node names no installed build"):
        plan(shard("llama.cpp"), binary=None)


def test_a_plan_needs_the_local_model_file():
    with pytest.raises(ValueError, match="qwen/0/0: llama.cpp needs the model file's local path"):
        plan(shard("llama.cpp"), model_path=None)


def test_a_plan_is_never_built_from_a_refused_profile():
    with pytest.raises(ValueError) as e:
        plan(shard("llama.cpp", args=["--port", "9000"]))
    assert str(e.value) == "qwen/0/0: llama.cpp profiles may not set --port: llmgw sets it for each shard"


# -- validation ---------------------------------------------------------------


@pytest.mark.parametrize(
    "args, ranks, source, problems",
    [
        (["-c", "0", "-ngl", "-1", "-t", "-1", "-np", "-1"], 1, "/m", []),
        (["--ctx-size", "8192", "--n-gpu-layers", "auto", "--gpu-layers", "all"], 1, "/m", []),
        (["--ctx-size=8192", "--threads=8"], 1, "/m", []),
        ([], 1, None, ["llama.cpp models need a source: the GGUF file's path on the nodes or a URL"]),
        ([], 3, "/m", [
            "llama.cpp runs on one node, ranks: 3 cannot be; set ranks: 1, or use vllm or sglang to span nodes",
        ]),
        (["-c", "4k"], 1, "/m", ["llama.cpp -c must be a whole number of tokens (0: the model's own), not '4k'"]),
        (["--ctx-size", "-5"], 1, "/m", [
            "llama.cpp --ctx-size must be a whole number of tokens (0: the model's own), not -5",
        ]),
        (["-t"], 1, "/m", ["llama.cpp -t needs a value: a whole number of threads (-1: as many as cores)"]),
        (["--threads", "many"], 1, "/m", [
            "llama.cpp --threads must be a whole number of threads (-1: as many as cores), not 'many'",
        ]),
        (["--parallel", "0.5"], 1, "/m", [
            "llama.cpp --parallel must be a whole number of slots (-1: chosen by llama-server), not '0.5'",
        ]),
        (["-ngl", "most"], 1, "/m", ["llama.cpp -ngl must be a whole number of layers, auto or all, not 'most'"]),
        (["--n-gpu-layers", "-2"], 1, "/m", [
            "llama.cpp --n-gpu-layers must be a whole number of layers, auto or all, not -2",
        ]),
        (["-hf", "ggml-org/gemma-3-270m-GGUF"], 1, "/m", [
            "llama.cpp profiles may not set -hf: llmgw sets it for each shard",
        ]),
    ],
)
def test_validation(args, ranks, source, problems):
    assert LLAMA.validate(args, gpus=0, ranks=ranks, source=source) == problems


# -- probing ------------------------------------------------------------------


def test_probe_reads_the_build_from_a_current_llama_server(script):
    # Current builds print this on stderr, after lines about loaded backends.
    path = script("llama-server", """
echo "load_backend: loaded CPU backend from /opt/llama/libggml-cpu.so" >&2
echo "version: 0.6.0 (build 6000, commit abc1234)" >&2
echo "built with GNU 12.2.0 for Linux x86_64" >&2
""")
    assert LLAMA.probe_detail(path).info == EngineInfo("llama.cpp", "b6000", path)
    assert LLAMA.probe(path) == EngineInfo("llama.cpp", "b6000", path)


def test_probe_reads_the_build_from_an_older_llama_server(script):
    path = script("llama-server", 'echo "version: 4719 (2e7d6a8e)" >&2\necho "built with cc for x86_64" >&2\n')
    assert LLAMA.probe(path) == EngineInfo("llama.cpp", "b4719", path)


def test_a_build_from_outside_git_reports_its_library_version(script):
    path = script("llama-server", 'echo "version: 0.6.0-dev (build 0, commit unknown)" >&2\n')
    assert LLAMA.probe(path) == EngineInfo("llama.cpp", "0.6.0-dev", path)


def test_a_binary_that_runs_but_names_no_version_is_available_with_version_unknown(script):
    path = script("llama-server", "echo hello\n")
    result = LLAMA.probe_detail(path)
    assert result.info == EngineInfo("llama.cpp", None, path)
    assert result.reason == f"{path} --version printed no version line"


def test_a_missing_shared_library_is_named(script):
    # What the dynamic loader prints when libgomp1 is not installed.
    path = script("llama-server", """
echo "$0: error while loading shared libraries: libgomp.so.1: cannot open shared object file:"\
  "No such file or directory" >&2
exit 127
""")
    result = LLAMA.probe_detail(path)
    assert result.info is None
    assert result.reason == (
        f"{path} cannot run: missing shared library libgomp.so.1; install the package that provides it"
    )


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler to build a real binary")
def test_ldd_names_every_missing_library_of_a_real_binary(tmp_path):
    # A real ELF whose two libraries are gone: ldd names both, the loader only the first.
    for lib in ("one", "two"):
        (tmp_path / f"{lib}.c").write_text(f"int {lib}(void) {{ return 1; }}\n")
        subprocess.run(["cc", "-shared", "-fPIC", f"-Wl,-soname,libllmgw{lib}.so.1",
                        "-o", tmp_path / f"libllmgw{lib}.so.1", tmp_path / f"{lib}.c"], check=True)
    (tmp_path / "main.c").write_text("int one(void); int two(void);\nint main(void) { return one() + two() - 2; }\n")
    binary = tmp_path / "llama-server"
    libraries = [tmp_path / "libllmgwone.so.1", tmp_path / "libllmgwtwo.so.1"]
    subprocess.run(["cc", "-o", binary, tmp_path / "main.c", *libraries], check=True)
    for lib in ("one", "two"):
        (tmp_path / f"libllmgw{lib}.so.1").unlink()
    result = LLAMA.probe_detail(os.fspath(binary))
    assert result.info is None
    assert result.reason == (
        f"{binary} cannot run: missing shared libraries libllmgwone.so.1, libllmgwtwo.so.1; "
        "install the package that provides them"
    )


def test_a_binary_that_fails_for_another_reason_says_how(script):
    path = script("llama-server", 'echo "illegal instruction" >&2\nexit 132\n')
    assert LLAMA.probe_detail(path).reason == f"{path} --version exited with status 132: illegal instruction"


def test_a_binary_that_hangs_is_given_up_on(script, monkeypatch):
    monkeypatch.setattr(llamacpp_module, "VERSION_TIMEOUT_S", 0.5)
    path = script("llama-server", "exec sleep 30\n")
    started = time.monotonic()
    result = LLAMA.probe_detail(path)
    assert time.monotonic() - started < 10
    assert result.info is None
    assert result.reason == f"{path} --version did not finish within 0.5 s"


def test_a_configured_path_that_is_not_there_is_said_so(tmp_path):
    missing = os.fspath(tmp_path / "nope" / "llama-server")
    assert LLAMA.probe_detail(missing).reason == f"{missing} does not exist"
    (tmp_path / "plain").write_text("not a program")
    assert LLAMA.probe_detail(os.fspath(tmp_path / "plain")).reason == f"{tmp_path / 'plain'} is not an executable file"


def test_path_is_never_searched(script, tmp_path, monkeypatch):
    # A llama-server on PATH that would answer: without a path there is nothing to probe.
    script("llama-server", 'echo "version: 6000 (abc1234)" >&2\n')
    monkeypatch.setenv("PATH", os.fspath(tmp_path))
    assert LLAMA.probe_detail(None) == llamacpp_module.ProbeResult(None, "no llama-server path given to probe")


# -- the real llama-server, where there is one ---------------------------------


@pytest.mark.llama_server
@pytest.mark.slow
def test_probe_of_the_real_llama_server(llama_server):
    result = LLAMA.probe_detail(llama_server)
    assert result.info is not None, result.reason
    assert result.info.path == llama_server
    assert result.info.version, result.reason


@pytest.mark.llama_server
@pytest.mark.slow
def test_the_real_llama_server_accepts_the_plan_and_serves_under_the_catalog_name(llama_server, gemma):
    port = free_port()
    spec = shard("llama.cpp", model="gemma-3-270m", args=["-c", "512", "-t", "2", "--parallel", "1"])
    p = LLAMA.plan(spec, binary=llama_server, host="127.0.0.1", port=port, model_path=gemma)
    with subprocess.Popen(p.argv, env={**os.environ, **p.env}, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, start_new_session=True) as engine:
        try:
            base = f"http://127.0.0.1:{port}"

            def healthy() -> bool:
                assert engine.poll() is None, engine.stderr.read().decode(errors="replace")[-2000:]
                try:
                    with urllib.request.urlopen(base + p.health.path, timeout=2) as r:
                        return r.status == 200
                except OSError:
                    return False

            wait_for(healthy, 120, "llama-server to answer its health check", interval=0.5)
            with urllib.request.urlopen(base + "/v1/models", timeout=5) as r:
                import json

                models = json.load(r)
            assert [m["id"] for m in models["data"]] == ["gemma-3-270m"]
        finally:
            engine.terminate()
            try:
                engine.wait(timeout=15)
            except subprocess.TimeoutExpired:
                engine.kill()
