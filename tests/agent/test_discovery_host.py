"""Who and where the node is, read on this machine."""

from __future__ import annotations

import errno
import platform
import socket

import pytest

from llmgw.agent.discovery import host


def test_node_id_is_the_hostname_unless_written():
    assert host.node_id() == socket.gethostname()
    assert host.node_id("gpu-17") == "gpu-17"


def test_address_on_the_route_to_a_local_hub():
    assert host.route_address("127.0.0.1", 7443) == "127.0.0.1"


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
            s.connect(("::1", 7443))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_address_on_the_route_to_an_ipv6_hub():
    assert host.route_address("::1", 7443) == "::1"


def test_address_by_name():
    assert host.route_address("localhost", 7443) in ("127.0.0.1", "::1")


def test_unresolvable_hub_is_no_address_not_an_error(monkeypatch):
    # Stubbed rather than looked up: a CI machine's resolver may take its full
    # timeout to say no.
    def fail(*args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", fail)
    assert host.route_address("cp.example.org", 7443) is None


class NoRoute(socket.socket):
    def connect(self, address):
        raise OSError(errno.ENETUNREACH, "Network is unreachable")


def test_unroutable_hub_is_no_address(monkeypatch):
    # An IPv6-only hub seen from an IPv4-only node: the kernel has no route.
    monkeypatch.setattr(socket, "socket", NoRoute)
    assert host.route_address("127.0.0.1", 7443) is None


def test_nothing_is_sent_to_the_hub():
    # A UDP listener standing in for the hub must receive nothing.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as hub:
        hub.bind(("127.0.0.1", 0))
        hub.setblocking(False)
        host.route_address("127.0.0.1", hub.getsockname()[1])
        with pytest.raises(BlockingIOError):
            hub.recv(1)


def test_os_pretty_name(tmp_path):
    release = tmp_path / "os-release"
    release.write_text('NAME="Ubuntu"\nVERSION="24.04.1 LTS (Noble Numbat)"\n'
                       'PRETTY_NAME="Ubuntu 24.04.1 LTS"\nID=ubuntu\n')
    assert host.os_name((str(tmp_path / "missing"), str(release))) == "Ubuntu 24.04.1 LTS"


def test_os_without_pretty_name(tmp_path):
    release = tmp_path / "os-release"
    release.write_text("NAME='Alpine Linux'\nVERSION=3.20\n")
    assert host.os_name((str(release),)) == "Alpine Linux 3.20"


def test_os_without_os_release(tmp_path):
    assert host.os_name((str(tmp_path / "missing"),)) == f"{platform.system()} {platform.release()}"


def test_kernel_and_arch():
    assert host.kernel() == platform.release()
    assert host.arch() == platform.machine()
