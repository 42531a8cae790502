"""The node installs llama.cpp by itself: from a mirror on 127.0.0.1, checked, proven to run, marked last.

Archives are built at test time from stand-in binaries compiled with ``cc``
(and from a real llama-server where one is installed), served over real
HTTP; every refusal is checked to leave nothing marked installed.  Time that
matters (progress ticks, stalls, rechecks) follows a ``Clock`` the test
advances.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.task import Clock

from llmgw.agent.engines import assets, layout, ospackages
from llmgw.agent.engines.install import MARKER, Installer
from llmgw.agent.weights import cache_name
from llmgw.records import EngineBuild, EngineInfo, EnginePlan
from llmgw.states import EngineState
from tests.support import engine_archives
from tests.support.engine_archives import Mirror, release_archive, sha256_of, stand_in
from tests.support.engines import llama_server
from tests.support.wait import until

TAG = "b6000"
PLATFORM = assets.Platform(system="linux", machine="x86_64")
ASSET = assets.llama_cpp_asset(TAG, PLATFORM).name
GONE = "libllmgw-gone.so.1"


@pytest.fixture
def mirror(tmp_path):
    served = Mirror(tmp_path / "mirror").start()
    yield served
    served.stop()


@pytest.fixture
def root(tmp_path):
    return tmp_path / "state" / "engines"


@pytest.fixture
def installers():
    made: list[Installer] = []
    yield made
    for one in made:
        one.stop()


@pytest.fixture
def make(root, installers):
    """An Installer under *root*, started, with what it reported kept on it."""

    def make(clock=None, **kw) -> Installer:
        kw.setdefault("os_packages_manager", "apt-get")
        progress, changes = [], []
        made = Installer(reactor, root, platform=PLATFORM, progress=progress.append,
                         changed=lambda: changes.append(made.entries()), clock=clock, **kw)
        made.reports, made.changes = progress, changes
        installers.append(made)
        made.start()
        return made

    return make


def publish(tmp_path, mirror, tag=TAG, inside="build/bin", filler=0, **binary) -> tuple[str, str]:
    """A stand-in llama-server released as *tag*'s asset on the mirror: (its URL, its sha256)."""
    folder = tmp_path / f"release-{tag}-{len(mirror.requests)}-{os.urandom(3).hex()}"
    stand_in(folder, **binary)
    if filler:
        (folder / "filler.bin").write_bytes(os.urandom(filler))
    archive = release_archive(folder, tmp_path / "out" / folder.name / assets.llama_cpp_asset(tag, PLATFORM).name,
                              inside=inside)
    return mirror.publish(archive, tag), sha256_of(archive)


def plan(mirror, sha256: str | None, tag=TAG, **kw) -> EnginePlan:
    table = {assets.llama_cpp_asset(tag, PLATFORM).name: sha256} if sha256 else {}
    return EnginePlan([EngineBuild("llama.cpp", tag, base_url=mirror.url(), sha256=table)], **kw)


async def released(tmp_path, mirror, make, **binary) -> Installer:
    """A new Installer converged on a stand-in release of TAG made with *binary*'s options."""
    _, sha = publish(tmp_path, mirror, **binary)
    installer = make()
    await installer.converge(plan(mirror, sha), set)
    return installer


def markers(root) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob(MARKER))


def left_in(root, name="llama.cpp") -> list[str]:
    folder = root / name
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def only(installer: Installer) -> EngineInfo:
    (entry,) = installer.entries()
    return entry


def assert_refused(installer: Installer, root, reason: str) -> EngineInfo:
    """Broken with *reason* in its words, and nothing under root marked, unpacked or runnable."""
    entry = only(installer)
    assert entry.state is EngineState.BROKEN and entry.origin == "server.yaml", entry
    assert reason in entry.reason, entry.reason
    assert markers(root) == [] and left_in(root) == []
    assert installer.binary("llama.cpp", TAG) is None and installer.binary("llama.cpp", None) is None
    return entry


@pytest_twisted.ensureDeferred
async def test_a_release_is_downloaded_checked_unpacked_proven_and_marked_last(tmp_path, mirror, make, root):
    url, sha = publish(tmp_path, mirror)
    installer = make()
    await installer.converge(plan(mirror, sha), set)
    path = root / "llama.cpp" / TAG / "build" / "bin" / "llama-server"
    assert installer.entries() == [EngineInfo("llama.cpp", TAG, str(path), EngineState.INSTALLED, None, "server.yaml")]
    marker = json.loads((root / "llama.cpp" / TAG / MARKER).read_text())
    assert marker["version"] == TAG and marker["path"] == str(path) and marker["sha256"] == sha
    assert isinstance(marker["installed_at"], float)
    assert installer.binary("llama.cpp", TAG) == installer.binary("llama.cpp", None) == str(path)
    assert installer.binary("llama.cpp", "b5000") is None and installer.binary("vllm", None) is None
    # Weights' progress record: keyed by the asset's URL, named by the asset.
    final = installer.reports[-1]
    assert final.final and final.error is None and (final.source, final.file_name) == (url, ASSET)
    assert final.bytes_done == final.bytes_total == os.path.getsize(mirror.directory / TAG / ASSET)
    # Nothing left beside it: no unpacking folder, no archive kept.
    assert left_in(root) == [TAG] and list((root / ".downloads").iterdir()) == []
    # Every changed() saw something new, and the last one what is there now.
    assert all(a != b for a, b in zip(installer.changes, installer.changes[1:]))
    assert installer.changes[-1] == installer.entries()
    assert [e.state for e in installer.changes[0]] == [EngineState.INSTALLING]


@pytest.mark.llama_server
@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_a_real_llama_server_release_installs_runnable_with_its_libraries(tmp_path, mirror, make, root):
    built = tmp_path / "built"
    binary = Path(llama_server(built))
    if binary.parent != built:  # one on PATH: its libraries are the system's
        built.mkdir()
        shutil.copy2(binary, built / "llama-server")
    archive = release_archive(built, tmp_path / "out" / ASSET, inside=f"llama-{TAG}")
    mirror.publish(archive, TAG)
    installer = make()
    await installer.converge(plan(mirror, sha256_of(archive)), set)
    entry = only(installer)
    # It says 0.6.0-dev, no build number: the tag its pinned sha256 stands for is what is reported.
    assert (entry.state, entry.version) == (EngineState.INSTALLED, TAG), entry.reason
    assert entry.path == str(root / "llama.cpp" / TAG / f"llama-{TAG}" / "llama-server")
    done = subprocess.run([entry.path, "--version"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "version:" in done.stderr


@pytest_twisted.ensureDeferred
async def test_while_it_downloads_the_node_says_how_far_and_nothing_is_installed(tmp_path, mirror, make, root):
    url, sha = publish(tmp_path, mirror, filler=2_000_000)
    size = os.path.getsize(mirror.directory / TAG / ASSET)
    gate = mirror.hold(f"{TAG}/{ASSET}", at=1_000_000)
    clock = Clock()
    installer = make(clock, stall_timeout_s=1e9)
    converged = installer.converge(plan(mirror, sha), set)
    await until(lambda: gate.reached, "the download to reach the gate")
    # One rounding rule for sizes (llmgw.sizes): 1.0 MB is "1", 2.04 MB "2".
    whole = round(size / 1e6)
    total = f"{whole}" if abs(size / 1e6 - whole) < 0.25 else f"{size / 1e6:.1f}"
    want = f"downloading {ASSET} 1/{total} MB"

    def said():
        clock.advance(1)
        return only(installer).reason == want

    await until(said, f"the node to say {want!r}", detail=lambda: repr(installer.entries()))
    assert only(installer).state is EngineState.INSTALLING
    assert markers(root) == [] and installer.binary("llama.cpp", None) is None
    interim = [r for r in installer.reports if not r.final]
    # A tick before the mirror's answer has arrived reports the size as not known
    # (None: absent is not zero), never as another figure; once it is known, it is said.
    assert interim and all((r.source, r.file_name) == (url, ASSET) and r.bytes_total in (None, size) for r in interim)
    assert interim[-1].bytes_total == size
    gate.release()
    await converged
    assert only(installer).state is EngineState.INSTALLED


@pytest_twisted.ensureDeferred
async def test_a_marker_that_cannot_be_written_leaves_nothing_reported_installed_nor_on_disk(tmp_path, mirror, make,
                                                                                             root, monkeypatch):
    _, sha = publish(tmp_path, mirror)

    def disk_full(path, data, **kw):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(layout, "write_file", disk_full)
    installer = make()
    await installer.converge(plan(mirror, sha), set)
    assert_refused(installer, root, f"{root / 'llama.cpp' / TAG / MARKER}: No space left on device; "
                                    f"check the space and permissions of {root}")
    assert not any(e.state is EngineState.INSTALLED for entries in installer.changes for e in entries)


@pytest_twisted.ensureDeferred
async def test_a_second_converge_while_installing_starts_no_second_download(tmp_path, mirror, make):
    url, sha = publish(tmp_path, mirror, filler=500_000)
    gate = mirror.hold(f"{TAG}/{ASSET}", at=100_000)
    installer = make()
    first = installer.converge(plan(mirror, sha), set)
    await until(lambda: gate.reached, "the download to reach the gate")
    second = installer.converge(plan(mirror, sha), set)
    gate.release()
    await first
    await second
    assert only(installer).state is EngineState.INSTALLED
    assert mirror.count(f"{TAG}/{ASSET}") == 1


@pytest_twisted.ensureDeferred
async def test_a_checksum_mismatch_is_refused_with_both_digests_before_anything_is_unpacked(tmp_path, mirror, make,
                                                                                          root):
    # The archive is unsafe too: had it been unpacked first, that would be the reason.
    archive = tmp_path / ASSET
    with tarfile.open(archive, "w:gz") as t:
        member = tarfile.TarInfo("../outside")
        t.addfile(member)
    mirror.publish(archive, TAG)
    actual, wrong = sha256_of(archive), "0" * 64
    installer = make()
    await installer.converge(plan(mirror, wrong), set)
    entry = assert_refused(installer, root, f"has sha256 {actual}, but the sha256 pinned for it is {wrong}")
    assert "the download was deleted" in entry.reason
    assert list((root / ".downloads").iterdir()) == []


@pytest_twisted.ensureDeferred
async def test_an_asset_without_a_sha256_is_never_downloaded(tmp_path, mirror, make, root):
    publish(tmp_path, mirror)
    installer = make()
    await installer.converge(plan(mirror, None), set)
    assert_refused(installer, root, f"no sha256 for {ASSET} in engines.llama.cpp.sha256 of server.yaml: "
                                    "add it from the release page")
    assert mirror.requests == []


@pytest_twisted.ensureDeferred
async def test_an_unsafe_archive_is_refused_in_the_unpackers_words_and_writes_nothing_outside(tmp_path, mirror, make,
                                                                                             root):
    archive = tmp_path / "unsafe" / ASSET
    archive.parent.mkdir()
    stand_in(tmp_path / "unsafe-bin")
    with tarfile.open(archive, "w:gz") as t:
        t.add(tmp_path / "unsafe-bin" / "llama-server", arcname="build/bin/llama-server")
        t.add(tmp_path / "unsafe-bin" / "llama-server", arcname="../../escaped")
    mirror.publish(archive, TAG)
    installer = make()
    await installer.converge(plan(mirror, sha256_of(archive)), set)
    entry = assert_refused(installer, root, "")
    assert "../../escaped" in entry.reason, entry.reason
    assert not (root / "escaped").exists() and not (root.parent / "escaped").exists()


@pytest_twisted.ensureDeferred
async def test_a_binary_whose_library_is_missing_names_it_and_the_package_to_install(tmp_path, mirror, make, root):
    installer = await released(tmp_path, mirror, make, missing_library=GONE)
    assert_refused(installer, root, ospackages.advice([GONE], "apt-get"))


@pytest_twisted.ensureDeferred
async def test_a_binary_whose_version_fails_is_refused_with_what_it_said(tmp_path, mirror, make, root):
    installer = await released(tmp_path, mirror, make, version="error: no backend could be loaded\n", status=3)
    entry = assert_refused(installer, root, "--version failed")
    assert "exited with status 3: error: no backend could be loaded" in entry.reason


@pytest_twisted.ensureDeferred
async def test_an_archive_holding_another_build_is_refused(tmp_path, mirror, make, root):
    installer = await released(tmp_path, mirror, make, version="version: 5999 (abc1234)\nbuilt with cc\n")
    assert_refused(installer, root, f"the archive for {TAG} holds llama-server b5999")


@pytest_twisted.ensureDeferred
async def test_a_new_style_version_line_naming_the_tag_is_installed(tmp_path, mirror, make):
    installer = await released(tmp_path, mirror, make, version="version: 0.6.0 (build 6000, commit abc1234)\n", inside="")
    entry = only(installer)
    assert (entry.state, entry.version) == (EngineState.INSTALLED, TAG), entry.reason
    assert entry.path.endswith(f"llama.cpp/{TAG}/llama-server")


@pytest_twisted.ensureDeferred
async def test_an_archive_without_llama_server_is_refused(tmp_path, mirror, make, root):
    installer = await released(tmp_path, mirror, make, name="llama-cli")
    assert_refused(installer, root, f"{ASSET} holds no llama-server")


@pytest_twisted.ensureDeferred
async def test_a_stalled_download_is_refused_after_the_stall_timeout(tmp_path, mirror, make, root):
    _, sha = publish(tmp_path, mirror, filler=300_000)
    gate = mirror.hold(f"{TAG}/{ASSET}", at=100_000)
    clock = Clock()
    installer = make(clock, stall_timeout_s=5)
    converged = installer.converge(plan(mirror, sha), set)
    await until(lambda: gate.reached, "the download to reach the gate")
    await until(lambda: clock.advance(1) or converged.called, "the stall to end the install")
    assert_refused(installer, root, "nothing received for 5 s")


@pytest_twisted.ensureDeferred
async def test_a_mirror_answering_404_is_refused_naming_the_url_and_what_to_check(mirror, make, root):
    installer = make()
    await installer.converge(plan(mirror, "1" * 64), set)
    entry = assert_refused(installer, root, f"{mirror.url(f'{TAG}/{ASSET}')}: HTTP 404")
    assert "check engines.llama.cpp.base_url and version in server.yaml" in entry.reason


@pytest_twisted.ensureDeferred
async def test_an_archive_over_the_size_limit_is_refused(tmp_path, mirror, make, root):
    _, sha = publish(tmp_path, mirror, filler=200_000)
    installer = make(max_download_bytes=100_000)
    await installer.converge(plan(mirror, sha), set)
    assert_refused(installer, root, "over the limit of 100000")


@pytest_twisted.ensureDeferred
async def test_a_platform_without_an_asset_is_refused_in_the_assets_words(mirror, root, installers):
    riscv = assets.Platform(system="linux", machine="riscv64")
    try:
        assets.llama_cpp_asset(TAG, riscv)
    except assets.NoAsset as e:
        expected = str(e)
    else:
        pytest.skip(f"llama.cpp {TAG} has an asset for linux riscv64 here")
    installer = Installer(reactor, root, platform=riscv, progress=lambda p: None, changed=lambda: None,
                          os_packages_manager=None)
    installers.append(installer)
    await installer.converge(plan(mirror, "1" * 64), set)
    assert only(installer).reason == expected and mirror.requests == []


@pytest.mark.parametrize("one_folder", [False, True], ids=["files-at-top", "files-in-a-folder"])
@pytest_twisted.ensureDeferred
async def test_a_cuda_build_brings_its_runtime_from_the_companion_archive(tmp_path, mirror, root, installers,
                                                                         one_folder):
    tag, gpu = "b11081", assets.Platform(system="linux", machine="x86_64", cuda="12.8")
    asset = assets.llama_cpp_asset(tag, gpu)
    (cudart,) = asset.extras
    # llama-server needs libcudart.so.12, which only the runtime archive holds; it is found beside the binary.
    stand_in(tmp_path / "main", version="version: 11081 (abc1234)\n", missing_library="libcudart.so.12",
             origin=True)
    main = release_archive(tmp_path / "main", tmp_path / "out" / asset.name, inside=f"llama-{tag}")
    engine_archives.library(tmp_path / "cudart", "libcudart.so.12")
    runtime = release_archive(tmp_path / "cudart", tmp_path / "out" / cudart, inside="cudart" if one_folder else "")
    for archive in (main, runtime):
        mirror.publish(archive, tag)
    build = EngineBuild("llama.cpp", tag, base_url=mirror.url(),
                        sha256={asset.name: sha256_of(main), cudart: sha256_of(runtime)})
    installer = Installer(reactor, root, platform=gpu, progress=lambda p: None, changed=lambda: None,
                          os_packages_manager=None)
    installers.append(installer)
    await installer.converge(EnginePlan([build]), set)
    entry = only(installer)
    assert (entry.state, entry.version) == (EngineState.INSTALLED, tag), entry.reason
    assert sorted(p.name for p in (root / "llama.cpp" / tag / f"llama-{tag}").iterdir()) == [
        "libcudart.so.12", "llama-server"]
    assert [mirror.count(f"{tag}/{name}") for name in (asset.name, cudart)] == [1, 1]


@pytest_twisted.ensureDeferred
async def test_a_restarted_agent_reports_its_installs_at_once_and_downloads_nothing(tmp_path, mirror, make, root):
    _, sha = publish(tmp_path, mirror)
    first = make()
    await first.converge(plan(mirror, sha), set)
    first.stop()
    again = make()
    assert again.entries() == first.entries() and only(again).state is EngineState.INSTALLED
    assert again.binary("llama.cpp", TAG) == first.binary("llama.cpp", TAG)
    await again.converge(plan(mirror, sha), set)
    assert only(again).state is EngineState.INSTALLED and mirror.count(f"{TAG}/{ASSET}") == 1


def test_what_a_crashed_install_left_is_removed_at_start_and_marked_installs_stay(root, make):
    unpacking = root / "llama.cpp" / ".tmp-b6000-1a2b3c4d"
    unmarked = root / "llama.cpp" / "b5999"
    venv = root / "vllm" / "0123456789abcdef"
    marked = root / "llama.cpp" / "b5000"
    for folder in (unpacking / "build" / "bin", unmarked, venv / "bin", marked):
        folder.mkdir(parents=True)
        (folder / "llama-server").write_text("half")
    (marked / MARKER).write_text(json.dumps({"version": "b5000", "path": str(marked / "llama-server")}))
    installer = make()
    assert left_in(root) == ["b5000"] and left_in(root, "vllm") == []
    assert installer.entries() == [
        EngineInfo("llama.cpp", "b5000", str(marked / "llama-server"), EngineState.INSTALLED, None, "server.yaml")]


@pytest_twisted.ensureDeferred
async def test_a_version_the_plan_drops_stays_while_a_shard_runs_it_and_goes_after(tmp_path, mirror, make, root):
    _, old_sha = publish(tmp_path, mirror, tag="b6000")
    _, new_sha = publish(tmp_path, mirror, tag="b6001", version="version: 6001 (def5678)\n")
    installer = make()
    await installer.converge(plan(mirror, old_sha, tag="b6000"), set)
    running = {("llama.cpp", "b6000")}
    await installer.converge(plan(mirror, new_sha, tag="b6001"), lambda: running)
    assert [(e.version, e.state) for e in installer.entries()] == [
        ("b6001", EngineState.INSTALLED), ("b6000", EngineState.INSTALLED)]
    assert left_in(root) == ["b6000", "b6001"]
    assert installer.binary("llama.cpp", None).endswith("b6001/build/bin/llama-server")
    assert installer.binary("llama.cpp", "b6000").endswith("b6000/build/bin/llama-server")
    running.clear()  # the replica moved: the next recheck removes the old build
    await installer.recheck()
    assert [e.version for e in installer.entries()] == ["b6001"]
    await until(lambda: left_in(root) == ["b6001"], "b6000's folder to be removed", detail=lambda: repr(left_in(root)))
    assert installer.binary("llama.cpp", "b6000") is None


@pytest_twisted.ensureDeferred
async def test_an_engine_no_longer_in_the_plan_is_removed_at_the_next_converge(tmp_path, mirror, make, root):
    _, sha = publish(tmp_path, mirror)
    installer = make()
    await installer.converge(plan(mirror, sha), set)
    await installer.converge(EnginePlan(), set)
    assert installer.entries() == []
    await until(lambda: left_in(root) == [], "the folder to be removed")


@pytest_twisted.ensureDeferred
async def test_rechecks_report_a_library_gone_missing_and_a_mended_one_installed_again(tmp_path, mirror, make, root):
    libraries = tmp_path / "system-libs"
    _, sha = publish(tmp_path, mirror, missing_library="libllmgw-flaky.so.1", library_dir=libraries)
    clock = Clock()
    installer = make(clock, recheck_s=600)
    await installer.converge(plan(mirror, sha), set)
    assert only(installer).state is EngineState.INSTALLED
    path = installer.binary("llama.cpp", TAG)
    (libraries / "libllmgw-flaky.so.1").unlink()  # an unrelated upgrade removed it
    clock.advance(600)
    await until(lambda: only(installer).state is EngineState.BROKEN, "the recheck to find it broken")
    assert only(installer).reason == ospackages.advice(["libllmgw-flaky.so.1"], "apt-get")
    assert installer.binary("llama.cpp", TAG) is None and markers(root) == [f"llama.cpp/{TAG}/{MARKER}"]
    engine_archives.library(libraries, "libllmgw-flaky.so.1")
    clock.advance(600)
    await until(lambda: only(installer).state is EngineState.INSTALLED, "the recheck to find it mended")
    assert installer.binary("llama.cpp", TAG) == path and mirror.count(f"{TAG}/{ASSET}") == 1


@pytest.mark.parametrize("allowed", [True, False], ids=["install_os_packages", "advice-only"])
@pytest_twisted.ensureDeferred
async def test_os_packages_are_installed_only_when_the_plan_allows_and_what_ran_is_said(tmp_path, mirror, make,
                                                                                        monkeypatch, allowed):
    libraries = tmp_path / "system-libs"
    _, sha = publish(tmp_path, mirror, missing_library="libllmgw-pkg.so.1", library_dir=libraries)
    (libraries / "libllmgw-pkg.so.1").unlink()
    ran = []

    def fake_install(packages, manager, *, timeout_s):
        # What apt-get would do, without root: put the library where the loader looks.
        ran.append((list(packages), manager))
        engine_archives.library(libraries, "libllmgw-pkg.so.1")
        return "DEBIAN_FRONTEND=noninteractive apt-get install -y libllmgw-pkg1"

    monkeypatch.setattr(ospackages, "packages_for", lambda sonames, manager: {s: "libllmgw-pkg1" for s in sonames})
    monkeypatch.setattr(ospackages, "install", fake_install)
    installer = make()
    await installer.converge(plan(mirror, sha, install_os_packages=allowed), set)
    entry = only(installer)
    if allowed:
        assert ran == [(["libllmgw-pkg1"], "apt-get")]
        assert entry.state is EngineState.INSTALLED
        assert entry.reason == "ran DEBIAN_FRONTEND=noninteractive apt-get install -y libllmgw-pkg1"
    else:
        assert ran == [] and entry.state is EngineState.BROKEN
        assert entry.reason == ospackages.advice(["libllmgw-pkg.so.1"], "apt-get")


@pytest_twisted.ensureDeferred
async def test_a_broken_install_is_tried_again_at_the_recheck_once_the_mirror_is_mended(tmp_path, mirror, make, root):
    clock = Clock()
    installer = make(clock, recheck_s=600)
    url, sha = publish(tmp_path, mirror)
    archive = mirror.directory / TAG / ASSET
    kept = archive.read_bytes()
    archive.unlink()
    await installer.converge(plan(mirror, sha), set)
    assert "HTTP 404" in only(installer).reason
    archive.write_bytes(kept)
    clock.advance(600)
    await until(lambda: only(installer).state is EngineState.INSTALLED, "the retry to install it",
                detail=lambda: repr(installer.entries()))
    assert not (root / ".downloads" / cache_name(url)).exists()
