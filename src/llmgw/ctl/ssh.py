"""`ssh [USER@]HOST` for onboarding: nodeside's steps run on a node, their answers held to what nodeside says.

The system's OpenSSH client does the connecting (``BatchMode=yes``: an
unknown host key is a refusal, never a question).  Each run pipes
:mod:`llmgw.ctl.nodeside` to the node's Python with one request; what comes
back is bounded, checked against :data:`ANSWERS`, and its text escaped.

ssh hands its command to the node's login shell, a POSIX shell, as text.
That text is fixed, llmgw's own; every value of the operator's in it (the
Python to run) is one word of :func:`shell_words`, shell-quoted, and the
fixed text reads it only as ``"$@"``, never as more shell.  A target is
refused unless it is one plain ``[USER@]HOST`` (:func:`ssh_target`): ssh
would take one beginning with ``-`` as an option, and its ``%h`` and
``%r`` put the name as it is into a ``ProxyCommand``'s shell.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

import attrs

from llmgw.errors import LlmgwError
from llmgw.text import printable

SSH_CONNECT_TIMEOUT_S = 10
# One ssh command: the install step's pip is the longest.
SSH_STEP_TIMEOUT_S = 1200
# A node's answer is one JSON line of a few KB; its stderr is shown by its end.
MAX_ANSWER_BYTES = 1 << 20
MAX_STDERR_BYTES = 64 << 10
NODESIDE = Path(__file__).with_name("nodeside.py")
# nodeside's install half (the standard library only too), sent with it as the module llmgw_nodeinstall,
# and what it asks of the machine (its init, the agent still running), as llmgw_nodehost.
NODEINSTALL = Path(__file__).with_name("nodeinstall.py")
NODEHOST = Path(__file__).with_name("nodehost.py")
REFUSED = 3  # nodeside's exit status for a refusal
# Read by the node's Python from stdin: nodeside's length, nodeside, then the request.
_BOOT = ('import sys; n = int(sys.stdin.buffer.readline()); '
         'exec(compile(sys.stdin.buffer.read(n), "llmgw-nodeside", "exec"))')
PYTHONS = ("python3", "python3.13", "python3.12", "python3.11")
# The node's shell runs this with the candidate Pythons as its arguments ("$@"): the first 3.11 or
# newer runs nodeside, else it says what it found.  No value is ever part of this text.
_FIND_PYTHON = (
    'found=""; for p in "$@"; do if command -v "$p" >/dev/null 2>&1; then '
    "if \"$p\" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then "
    f'exec "$p" -c {shlex.quote(_BOOT)}; fi; found="$found $p is $("$p" --version 2>&1);"; fi; done; '
    'echo "there is no Python 3.11 or newer on $(hostname) (PATH $PATH):${found:- no $* at all} '
    f'install one with its venv module, or name it with --python" >&2; exit {REFUSED}'
)
# [USER@]HOST as onboarding takes it: letters, digits, '.', '_', '-' (and ':' for an IPv6 address),
# neither beginning with '-', so that ssh, its config's %h and %r, and a ProxyCommand's shell each
# read it as one plain name.
_TARGET = re.compile(r"(?:[A-Za-z0-9_][A-Za-z0-9._-]{0,63}@)?[A-Za-z0-9_:][A-Za-z0-9._:-]{0,252}")
# What each of nodeside's answers holds; anything else is refused, not trusted.
_MAYBE_STR = (str, type(None))
ANSWERS = {
    "check": {"hostname": str, "python": str, "installed": _MAYBE_STR, "certificate": _MAYBE_STR, "has_key": bool,
              "python_version": str, "implementation": str, "soabi": str, "platform": str, "libc": str,
              "installed_set": _MAYBE_STR},
    "install": {"changed": list}, "csr": {"request": str, "changed": list}, "write": {"changed": list},
    "start": {"changed": list}, "remove": {"changed": list, "stopped": str},
}


class Refusal(LlmgwError):
    """One sentence: what is missing or wrong, and what to do; the node is as it was before the step."""


def _shown(value):
    """A node's answer's value with its text escaped for a terminal (a PEM's lines kept)."""
    if isinstance(value, str):
        return printable(value, keep="\n")
    if isinstance(value, list):
        return [printable(v) for v in value]
    return value


def ssh_target(text: str) -> str:
    """*text*, when it is one plain ``[USER@]HOST``; a Refusal saying what onboarding takes otherwise."""
    if _TARGET.fullmatch(text):
        return text
    raise Refusal(f"{printable(repr(text[:300]))} is not a target onboarding gives to ssh: it takes [USER@]HOST, "
                  "each of letters, digits, '.', '_' and '-' (and ':' in an IPv6 address), not beginning with "
                  "'-'; for any other name, give the machine an alias in ~/.ssh/config (Host ALIAS, HostName, "
                  "User) and onboard ALIAS")


@attrs.frozen
class StepFailed(LlmgwError):
    """A command on the node failed: the command, its exit status and its stderr."""

    command: str
    status: int
    stderr: str
    # What went to the command's stdin, in words (nodeside and its request, not their bytes).
    stdin: str = ""

    def __str__(self) -> str:
        fed = f" (stdin: {self.stdin})" if self.stdin else ""
        return (f"`{self.command}`{fed} exited with status {self.status}: "
                f"{self.stderr.strip()[-2000:] or '(no stderr)'}")


@attrs.frozen
class Ssh:
    """`ssh [USER@]HOST` as the operator would type it, with onboarding's few options."""

    target: str = attrs.field(converter=ssh_target)
    config: str | None = None
    python: str | None = None

    def argv(self, remote: str) -> list[str]:
        argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={SSH_CONNECT_TIMEOUT_S}"]
        if self.config is not None:
            argv += ["-F", self.config]
        return [*argv, "--", self.target, remote]

    def run(self, op: str, request: dict, python: str | None = None, payload: list[Path] = ()) -> dict:
        """Run nodeside's *op* on the node (under *python*, else the first suitable one) and return its answer."""
        remote = _with_python(python) if python else _find_python(self.python)
        argv = self.argv(remote)
        fed = f"llmgw's nodeside.py and its {op} request" + (f", then {len(payload)} wheels" if payload else "")

        def failed(status: int, stderr: str) -> StepFailed:
            return StepFailed(shlex.join(argv), status, stderr, fed)

        data = node_program()
        stdin = b"%d\n" % len(data) + data + json.dumps({**request, "op": op}).encode() + b"\n"
        stdin += b"".join(path.read_bytes() for path in payload)
        try:
            status, stdout, stderr_bytes = _bounded_run(argv, stdin, SSH_STEP_TIMEOUT_S)
        except FileNotFoundError:
            raise Refusal("there is no ssh on this machine's PATH; install the OpenSSH client") from None
        except subprocess.TimeoutExpired:
            raise failed(-1, f"no answer in {SSH_STEP_TIMEOUT_S} s") from None
        stderr = printable(stderr_bytes.decode(errors="replace"), keep="\n\t")
        if stdout is None:
            raise failed(status, f"it wrote more than {MAX_ANSWER_BYTES} bytes, which is no answer of "
                             f"llmgw's; stopped. {stderr}")
        if status == 255:
            raise Refusal(_ssh_trouble(self.target, stderr))
        if status == REFUSED:
            raise Refusal(stderr.strip())
        if status != 0:
            raise failed(status, stderr)
        try:
            answer = json.loads(stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            answer = None
        if not isinstance(answer, dict):
            said = printable(stdout[-500:].decode(errors="replace"), keep="\n\t")
            raise failed(0, f"answered no JSON object: {said!r} {stderr}")
        for key, kind in ANSWERS[op].items():
            value = answer.get(key)
            if not isinstance(value, kind) or (kind is list and not all(isinstance(v, str) for v in value)):
                raise failed(0, f"answered {key}={printable(repr(value))[:200]}, which is not "
                                 f"what llmgw's nodeside answers; is something else answering on the node?")
        # Only what was checked goes on, its text escaped: onboarding prints it ("check: Python …", "wrote …").
        return {key: _shown(answer.get(key)) for key in ANSWERS[op]}


def node_program() -> bytes:
    """What the node's Python runs: nodeinstall and nodehost made modules (``llmgw_…``), then nodeside as ``__main__``."""
    made = "".join(f"_m = sys.modules['llmgw_{name}'] = types.ModuleType('llmgw_{name}')\n"
                   f"exec(compile({path.read_text()!r}, 'llmgw-{name}', 'exec'), _m.__dict__)\n"
                   for name, path in (("nodeinstall", NODEINSTALL), ("nodehost", NODEHOST)))
    return ("import sys, types\n" + made +
            f"exec(compile({NODESIDE.read_text()!r}, 'llmgw-nodeside', 'exec'), {{'__name__': '__main__'}})\n").encode()


def _bounded_run(argv: list[str], stdin: bytes, timeout: float) -> tuple[int, bytes | None, bytes]:
    """Run *argv* with *stdin*; its status, its stdout (None past MAX_ANSWER_BYTES: it is killed) and its stderr's end."""
    import threading

    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err, over = bytearray(), bytearray(), []

    def feed():
        try:
            proc.stdin.write(stdin)
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def pump(stream, buf: bytearray, cap: int, tail: bool):
        for chunk in iter(lambda: stream.read(65536), b""):
            buf += chunk
            if len(buf) > cap:
                if tail:
                    del buf[:len(buf) - cap]
                else:
                    over.append(True)
                    proc.kill()
                    del buf[cap:]

    threads = [threading.Thread(target=feed, daemon=True),
               threading.Thread(target=pump, args=(proc.stdout, out, MAX_ANSWER_BYTES, False), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, err, MAX_STDERR_BYTES, True), daemon=True)]
    for thread in threads:
        thread.start()
    try:
        status = proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    finally:
        for thread in threads:
            thread.join(timeout=10)
    return status, (None if over else bytes(out)), bytes(err)


def shell_words(*words: str) -> str:
    """*words* as the node's shell reads them back: each one word, whatever it holds (``$(…)``, quotes, spaces)."""
    return shlex.join(words)


def _with_python(python: str) -> str:
    return shell_words(python, "-c", _BOOT)


def _find_python(python: str | None) -> str:
    """A shell line that runs nodeside under the first Python >= 3.11 on the node's PATH, or says what it found."""
    return f"{shell_words('set', '--', *([python] if python else PYTHONS))}; {_FIND_PYTHON}"


def _ssh_trouble(target: str, stderr: str) -> str:
    text = stderr.strip()
    if "Host key verification failed" in text or "No host key is known" in text or "REMOTE HOST IDENTIFICATION HAS CHANGED" in text:
        return (f"{target}'s host key is not one known_hosts holds for it, so ssh would not connect; check the "
                f"key's fingerprint with the machine's owner and add it (ssh {target} once, answering yes), "
                "then run onboarding again; onboarding never turns host-key checking off")
    last = text.splitlines()[-1] if text else "ssh exited with status 255"
    return f"cannot reach {target} over ssh: {last}; check that `ssh {target}` works from here"
