"""A reload is all or nothing: the catalog and the server's router both take the new server.yaml, or neither does.

The first tests drive the reload itself with a real catalog and a real
router (not listening: its settings are what is checked); the last ones
build the whole server process in this reactor, as `twistd llmgw-server`
does, and reload it as SIGHUP and `ctl reload` do.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from twisted.internet import defer, endpoints, protocol, reactor, task
from twisted.logger import globalLogPublisher

from llmgw.config.server import load_server_config
from llmgw.control.catalog import Catalog
from llmgw.control.reload import Listener, reload_all
from llmgw.errors import ConfigError
from llmgw.link import uris
from llmgw.process import server as server_process
from llmgw.router.service import Router
from tests.support.wait import until

PUBLIC_API = "tcp:0:interface=0.0.0.0"  # never listened on: the router here is not started

OLD_KEY = f"""
router:
  scoring: least-outstanding
  keys:
    - {{name: alice, sha256: "{hashlib.sha256(b"old").hexdigest()}"}}
"""
NEW_KEY = f"""
router:
  scoring: prefix-affinity
  keys:
    - {{name: bob, sha256: "{hashlib.sha256(b"new").hexdigest()}"}}
"""
NO_KEYS = """
router:
  scoring: prefix-affinity
"""
MODELS = """
profiles:
  sim-fast: {engine: sim, args: ["--ttft-ms", "0"]}
models:
  echo: {profile: sim-fast, replicas: 1}
"""
MORE_MODELS = MODELS + "  echo2: {profile: sim-fast, replicas: 1}\n"


@pytest.fixture
def write(tmp_path: Path):
    for name in ("ca.crt", "server.crt", "server.key"):
        (tmp_path / name).write_text("")
    path = tmp_path / "server.yaml"

    def write(text: str) -> Path:
        path.write_text(f'listen: {{link: "ssl:7443", api: "{PUBLIC_API}"}}\n'
                        "tls: {ca: ca.crt, cert: server.crt, key: server.key}\n" + text)
        return path

    return write


@pytest.fixture
def running(write):
    """A catalog and a router on OLD_KEY + MODELS, and the router's reload listener."""
    config = load_server_config(write(OLD_KEY + MODELS))
    catalog = Catalog(config)
    router = Router(task.Clock(), config.router, PUBLIC_API)
    return catalog, router, server_process.router_listener(router, PUBLIC_API)


def refusing(why: str) -> Listener:
    def prepare(config):
        raise ConfigError(why)

    return Listener("the test listener", prepare)


def assert_old(catalog, router, config):
    assert catalog.config is config
    assert sorted(catalog.entries) == ["echo"]
    assert router.config is config.router
    assert router.dispatcher.config is config.router
    assert [k.name for k in router.config.keys] == ["alice"]


def test_a_router_section_the_router_refuses_changes_neither_the_catalog_nor_the_router(running, write):
    catalog, router, listener = running
    config = catalog.config
    write(NO_KEYS + MORE_MODELS)
    outcome = reload_all(catalog, [listener])
    assert outcome.changes == ()
    assert outcome.refused.startswith("reload refused, the old catalog stays: the router refused it: ")
    assert "router.keys is empty" in outcome.refused
    assert_old(catalog, router, config)


def test_a_later_listener_refusing_keeps_the_router_that_had_accepted_on_its_old_settings(running, write):
    catalog, router, listener = running
    config = catalog.config
    write(NEW_KEY + MORE_MODELS)
    outcome = reload_all(catalog, [listener, refusing("the test says no")])
    assert outcome.refused == "reload refused, the old catalog stays: the test listener refused it: the test says no"
    assert_old(catalog, router, config)


def test_a_listener_that_fails_by_accident_changes_nothing_and_says_so(running, write):
    catalog, router, listener = running
    config = catalog.config

    def broken(config):
        raise KeyError("oops")

    write(NEW_KEY + MORE_MODELS)
    outcome = reload_all(catalog, [listener, Listener("the broken listener", broken)])
    assert "the broken listener failed on it (KeyError: 'oops')" in outcome.refused
    assert_old(catalog, router, config)


def test_a_file_that_does_not_load_is_refused_before_any_listener_sees_it(running, write):
    catalog, router, listener = running
    config = catalog.config
    seen = []
    write(NEW_KEY + MODELS.replace("profile: sim-fast", "profile: sim-fats"))
    outcome = reload_all(catalog, [listener, Listener("the watcher", lambda c: seen.append(c))])
    assert "no profile named 'sim-fats'" in outcome.refused
    assert seen == []
    assert_old(catalog, router, config)


def test_an_accepted_reload_reaches_the_catalog_and_the_router(running, write):
    catalog, router, listener = running
    write(NEW_KEY + MORE_MODELS)
    outcome = reload_all(catalog, [listener])
    assert outcome.refused is None
    assert outcome.changes == ("router.scoring, router.keys changed", "model echo2 added")
    assert sorted(catalog.entries) == ["echo", "echo2"]
    assert router.config is catalog.config.router
    assert router.dispatcher.config is catalog.config.router
    assert [k.name for k in router.config.keys] == ["bob"]
    assert router.config.scoring == "prefix-affinity"


# -- the whole server process, in this reactor --


@pytest_twisted.async_yield_fixture
async def server(tmp_path, pki):
    path = tmp_path / "server.yaml"

    def write(text: str) -> None:
        path.write_text(f"""listen:
  link: "ssl:0:interface=127.0.0.1"
  api: "tcp:0:interface=127.0.0.1"
  admin: "tcp:0:interface=127.0.0.1"
tls: {{ca: {pki}/ca.crt, cert: {pki}/llmgw-server.crt, key: {pki}/llmgw-server.key}}
{text}""")

    write(OLD_KEY + MODELS)
    top = server_process.build(reactor, load_server_config(path))
    top.write = write
    top.startService()
    # The hub's in-process link delivers on the next turn: the session has not joined yet.
    ready = defer.Deferred()
    top.control.session.on("ready", lambda *_: ready.called or ready.callback(None))
    await ready.addTimeout(10, reactor)
    yield top
    await top.stopService()


def server_old(top, config):
    assert top.control.catalog.config is config
    assert sorted(top.control.catalog.entries) == ["echo"]
    assert top.router.config is config.router
    assert [k.name for k in top.router.dispatcher.config.keys] == ["alice"]


def test_sighup_and_ctl_reload_refuse_as_one_and_keep_both_halves_old(server):
    config = server.control.catalog.config
    server.control.session.reload_listeners.append(refusing("the test says no"))
    server.write(NEW_KEY + MORE_MODELS)
    logged = []
    globalLogPublisher.addObserver(logged.append)
    try:
        outcome = server.control.reload()  # what SIGHUP runs
    finally:
        globalLogPublisher.removeObserver(logged.append)
    sentence = "reload refused, the old catalog stays: the test listener refused it: the test says no"
    assert outcome.refused == sentence
    assert sentence in [e.get("sentence") for e in logged]
    server_old(server, config)

    with pytest.raises(ApplicationError) as refused:
        server.control.session.reload()  # what `ctl reload` calls
    assert refused.value.error == uris.ERROR_CONFIG
    assert refused.value.args[0] == sentence
    server_old(server, config)


def test_a_reload_of_the_server_process_reaches_its_catalog_and_its_router(server):
    server.write(NEW_KEY + MORE_MODELS)
    outcome = server.control.reload()
    assert outcome.refused is None
    assert outcome.changes == ("router.scoring, router.keys changed", "model echo2 added")
    assert sorted(server.control.catalog.entries) == ["echo", "echo2"]
    assert server.router.config is server.control.catalog.config.router
    assert [k.name for k in server.router.dispatcher.config.keys] == ["bob"]


@pytest_twisted.ensureDeferred
async def test_the_fleet_counts_the_link_connections_still_in_their_handshakes(server):
    """What the settling after a restart reads: a connection that has not finished its TLS is one arriving."""
    fleet = server.control.session.fleet
    assert fleet.handshaking() == 0
    where = endpoints.TCP4ClientEndpoint(reactor, "127.0.0.1", server.link_budget.port.getHost().port)
    silent = await where.connect(protocol.Factory.forProtocol(protocol.Protocol))  # never starts its TLS
    try:
        await until(lambda: fleet.handshaking() == 1, "the hub to accept the silent connection")
    finally:
        silent.transport.loseConnection()
    await until(lambda: fleet.handshaking() == 0, "the hub to see it close")


def test_fleet_timings_say_they_wait_for_a_restart(running, write):
    catalog, router, listener = running
    write(OLD_KEY + MODELS + "fleet: {settle_s: 9}\n")
    assert reload_all(catalog, [listener]).changes == ("fleet.settle_s changed: it takes effect when the server restarts",)
