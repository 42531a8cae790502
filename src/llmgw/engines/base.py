"""What every engine adapter provides: validation, a launch plan, a health probe.

An adapter is pure apart from ``probe``: it turns a shard's spec into argv
and environment, and checks a profile before anything is launched — an engine
that refuses a profile does so after minutes of loading, which is minutes of
a replica looking as if it were starting.
"""

from __future__ import annotations

import os
import re
from typing import Sequence

import attrs
from twisted.logger import Logger

# The adapters' probes run bounded (llmgw.engines.probes); imported from here as before.
from llmgw.engines.probes import ProbeFailed, last_line, missing_libraries, run_probe  # noqa: F401
from llmgw.records import EngineInfo, ShardSpec

log = Logger()


@attrs.frozen
class HealthProbe:
    """GET ``path`` on the engine answers 200 once it serves."""

    path: str = "/health"


@attrs.frozen
class CompletionProbe:
    """Rank 0 of a multi-node replica has every rank once it serves a one-token completion.

    The engine's health answers as soon as rank 0's own server is up; a
    completion runs through every pipeline stage, so it is served only when
    every rank joined.
    """

    model: str
    path: str = "/v1/completions"


@attrs.frozen
class RayNodes:
    """Ask the Ray head how many nodes are alive, with the environment's own Python.

    ``argv`` prints one JSON line ``{"alive": N, "ports": [node manager port, ...]}``.
    Rank 0 has every rank when ``alive >= count``; a worker rank joined when
    an alive node has its own ``node_manager_port``.
    """

    argv: list[str]
    head: str  # HOST:PORT of the head's GCS, for what the status says
    count: int
    node_manager_port: int | None = None


@attrs.frozen
class Connected:
    """A worker rank joined once a process of its group holds a TCP connection to rank 0's rendezvous."""

    host: str
    port: int


Joined = CompletionProbe | RayNodes | Connected


@attrs.frozen
class LaunchPlan:
    argv: list[str]
    env: dict[str, str] = attrs.Factory(dict)
    # None: this rank serves no HTTP (a worker rank of a multi-node replica).
    health: HealthProbe | None = HealthProbe()
    # Rank 0 of a multi-node replica: the port the other ranks join at; the
    # node reports HOST:PORT (ShardStatus.rendezvous) once it accepts TCP.
    rendezvous_port: int | None = None
    # How this rank tells that every rank (rank 0) or itself (a worker) joined;
    # None: a single-node shard, ready on health alone.
    joined: Joined | None = None


@attrs.frozen
class Spelling:
    """How an engine's own parser reads an option's name, so llmgw reads a profile as the engine will.

    A profile's arguments come after llmgw's and the last one wins, so a
    reserved option spelled any way the engine accepts would undo llmgw's.
    """

    # argparse's allow_abbrev (vLLM, SGLang, the simulator): a long option
    # is also spelled by any prefix of it that names no other option.
    prefixes: bool = False
    # ``--a_b`` is ``--a-b`` (llama.cpp, vLLM).
    underscores: bool = False
    # vLLM: ``--key.part VALUE`` sets part of ``--key``.
    dotted: bool = False

    def name(self, arg: str) -> str:
        """*arg*'s option name as the engine looks it up: ``--hf_repo=x`` is ``--hf-repo``."""
        flag = arg.partition("=")[0]
        if flag.startswith("--"):
            if self.dotted:
                flag = flag.partition(".")[0]
            if self.underscores:
                flag = flag.replace("_", "-")
        return flag

    def options(self, arg: str, names: Sequence[str]) -> list[str]:
        """Which of *names* the engine may take *arg* for: the one it is, or every one it abbreviates."""
        flag = self.name(arg)
        if flag in names:
            return [flag]
        if self.prefixes and flag.startswith("--") and len(flag) > 2:
            return [n for n in names if n.startswith(flag)]
        return []


class EngineAdapter:
    name: str = ""
    # Options llmgw sets itself; a profile that sets them is refused.
    reserved_args: tuple[str, ...] = ()
    # Options that read more options from a file (vLLM's and SGLang's --config):
    # the file could set what llmgw sets, past every check of a profile's args.
    option_files: tuple[str, ...] = ()
    spelling: Spelling = Spelling()

    # The ways this engine's ranks meet across nodes; the first is the default.
    launchers: tuple[str, ...] = ()

    def validate(self, args: Sequence[str], *, gpus: int, ranks: int, source: str | None,
                 launcher: str | None = None) -> list[str]:
        """Every problem with a profile, each a sentence; empty when it can be launched."""
        problems = []
        if launcher is not None and launcher not in self.launchers:
            has = (f"its ranks meet only with launcher: {' or '.join(self.launchers)}" if self.launchers
                   else "it runs on one node")
            problems.append(f"{self.name} has no launcher {launcher!r}: {has}")
        for arg in args:
            options = self.spelling.options(arg, self.reserved_args)
            spelled = arg.partition("=")[0]
            if options == [spelled]:
                problems.append(f"{self.name} profiles may not set {spelled}: llmgw sets it for each shard")
            elif options:
                reads = "reads it as" if len(options) == 1 else "may read it as"
                problems.append(
                    f"{self.name} profiles may not set {spelled}: {self.name} {reads} {' or '.join(options)}, "
                    "which llmgw sets for each shard"
                )
            for name in self.spelling.options(arg, self.option_files):
                spelled = arg.partition("=")[0]
                reads = "" if spelled == name else f" {self.name} may read it as {name}, and"
                problems.append(
                    f"{self.name} profiles may not set {spelled}:{reads} {self.name} reads options from that "
                    "file, where llmgw cannot check them and they could set what llmgw sets for each shard "
                    "(the model, host, port); put the options in the profile's args instead"
                )
        return problems

    def plan(self, spec: ShardSpec, *, binary: str | None, host: str, port: int, model_path: str | None,
             rendezvous_port: int | None = None) -> LaunchPlan:
        """How to run *spec*; *rendezvous_port* is where rank 0 of a multi-node replica is met."""
        raise NotImplementedError

    def default_rendezvous(self, spec: ShardSpec) -> int | None:
        """The port the engine's own launcher meets at when nobody names one; None for one-node engines."""
        return None

    def probe(self, path: str | None) -> EngineInfo | None:
        """Whether the engine at *path* runs (blocking: call from a thread)."""
        return self.probe_detail(path).info

    def probe_detail(self, path: str | None) -> ProbeResult:
        """The engine at *path*, or why it cannot run, in the node's own words (blocking).

        *path* is what the node installed or agent.yaml names; nothing is
        looked for on PATH or in the agent's own Python, so an engine nobody
        put there on purpose is never run by accident.
        """
        raise NotImplementedError


def visible_devices(gpus: Sequence[int]) -> dict[str, str]:
    """CUDA_VISIBLE_DEVICES for a shard: its own cards, or none at all."""
    return {"CUDA_VISIBLE_DEVICES": ",".join(str(g) for g in gpus)}


# ---------------------------------------------------------------------------
# Shared by the adapters' validation, plans and probes.


def option_values(
    args: Sequence[str], names: Sequence[str], spelling: Spelling = Spelling()
) -> list[tuple[str, str | None]]:
    """Every ``(flag, value)`` in *args* whose flag is one of *names*, spelled as *spelling* reads it.

    Both ``--flag value`` and ``--flag=value`` are found; the value is None when
    the flag is the last argument.  The next argument is taken as the value even
    when it starts with ``-``, since ``-t -1`` and ``-ngl -1`` are real values.
    The flag is given as the profile spelled it.
    """
    found = []
    i = 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        if spelling.options(args[i], names):
            if eq:
                found.append((flag, value))
            elif i + 1 < len(args):
                found.append((flag, args[i + 1]))
                i += 1
            else:
                found.append((flag, None))
        i += 1
    return found


def leader_address(leader: str | None, default_port: int, *, engine: str) -> tuple[str, int]:
    """``(host, port)`` of a multi-node replica's rendezvous on rank 0.

    ``leader`` is rank 0's address, ``HOST`` or ``HOST:PORT`` (``[V6]:PORT``);
    the port, when given, is the rendezvous port (Ray's GCS, torch.distributed),
    so two replicas led from one node can be told apart.
    """
    if not leader:
        raise ValueError(f"a multi-node {engine} replica needs rank 0's address (ShardSpec.leader)")
    if leader.startswith("["):
        host, _, rest = leader[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif leader.count(":") == 1:
        host, _, port = leader.partition(":")
    else:  # a bare name, IPv4 address or unbracketed IPv6 address
        host, port = leader, ""
    if port and not port.isdigit():
        raise ValueError(f"{engine}: leader {leader!r} has a port that is not a number")
    return host, int(port) if port else default_port


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@attrs.frozen
class ProbeResult:
    """What probing an engine found: the engine, or why the node cannot run it.

    ``reason`` is in the node's own words, for the agent's log and for
    placement's refusal ("/opt/llama/llama-server cannot run: missing shared
    library libgomp.so.1; install the package that provides it").
    When ``info`` is set, ``reason`` may still carry a note.
    """

    info: EngineInfo | None
    reason: str | None = None


def check_executable(path: str | None, engine: str) -> str:
    """*path*, when it is an executable file; else ``ProbeFailed`` saying what it is instead."""
    if not path:
        raise ProbeFailed(f"no {engine} path given to probe")
    if not os.path.exists(path):
        raise ProbeFailed(f"{path} does not exist")
    if not os.access(path, os.X_OK) or os.path.isdir(path):
        raise ProbeFailed(f"{path} is not an executable file")
    return path


def require_binary(spec: ShardSpec, binary: str | None, engine: str) -> str:
    """The binary a plan runs; there is no default to fall back to."""
    if not binary:
        raise ValueError(f"{spec.shard_id}: no {engine} to run: the node names no installed build")
    return binary


_PYTHON = re.compile(r"python[0-9.]*")


def is_python(path: str) -> bool:
    """Whether *path* names a Python interpreter (``…/bin/python3.12``) rather than an engine's own command."""
    return bool(_PYTHON.fullmatch(os.path.basename(path)))


def probe_python_package(python: str | None, engine: str, module: str, timeout_s: float) -> ProbeResult:
    """*module*'s ``__version__`` as *python* imports it: how a Python engine is seen to run."""
    try:
        check_executable(python, engine)
        output = run_probe([python, "-c", f"import {module}; print({module}.__version__)"], timeout_s)
    except ProbeFailed as e:
        reason = str(e)
        if f"No module named '{module}'" in e.output:
            reason = f"{python} cannot import {module}; name the Python of {engine}'s environment"
        log.warn("{engine} unavailable: {reason}", engine=engine, reason=reason)
        return ProbeResult(None, reason)
    return version_result(engine, python, last_line(output), f"{python}: {module} printed no version")


_PACKAGE_VERSION = re.compile(r"^v?\d+\.\d+\S*$")


def version_result(engine: str, path: str, version: str, unknown: str) -> ProbeResult:
    """A Python engine that ran, with the version it printed, or unknown with *unknown* as the note."""
    if not _PACKAGE_VERSION.match(version):
        return ProbeResult(EngineInfo(engine, None, path), unknown)
    return ProbeResult(EngineInfo(engine, version.lstrip("v"), path))


def refuse_invalid(adapter: EngineAdapter, spec: ShardSpec) -> None:
    """Raise ``ValueError`` when validate refuses *spec*'s profile.

    A plan is never built from a profile validate refuses, whoever forgot to
    ask: a second --port in argv would start an engine nobody can reach.
    """
    problems = adapter.validate(spec.args, gpus=len(spec.gpus), ranks=spec.ranks, source=spec.source,
                                launcher=spec.launcher)
    if problems:
        raise ValueError(f"{spec.shard_id}: " + "; ".join(problems))


def launcher_of(adapter: EngineAdapter, spec: ShardSpec) -> str:
    """The launcher *spec*'s ranks meet with: its own, or the engine's default."""
    return spec.launcher or (adapter.launchers[0] if adapter.launchers else "native")


def integer_option(engine: str, flag: str, value: str | None, what: str, least: int) -> tuple[int | None, str | None]:
    """``(number, None)``, or ``(None, problem)`` saying what *flag* must be."""
    if value is None:
        return None, f"{engine} {flag} needs a value: {what}"
    try:
        number = int(value)
    except ValueError:
        return None, f"{engine} {flag} must be {what}, not {value!r}"
    if number < least:
        return None, f"{engine} {flag} must be {what}, not {value}"
    return number, None


def fraction_option(engine: str, flag: str, value: str | None, what: str, *, one: bool) -> str | None:
    """A problem unless *value* is a fraction above 0 and below 1 (or 1 itself when *one*)."""
    if value is None:
        return f"{engine} {flag} needs a value: {what}"
    try:
        fraction = float(value)
    except ValueError:
        return f"{engine} {flag} must be {what}, not {value!r}"
    if not (0 < fraction <= 1 if one else 0 < fraction < 1):  # also refuses nan
        return f"{engine} {flag} must be {what}, not {value}"
    return None
