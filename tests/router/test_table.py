"""A router follows the control plane's endpoint table: records in process, their wire form over the hub."""

from __future__ import annotations

from autobahn.wamp.types import ComponentConfig
from twisted.internet.task import Clock

from llmgw.config.routing import RouterSettings
from llmgw.config.routing import StaticEndpoint
from llmgw.link import uris
from llmgw.router import errors
from llmgw.router.dispatch import RequestInfo
from llmgw.router.tablesession import TableSession
from llmgw.router.service import NEW_IN_CATALOG, NO_TABLE_YET, Router
from llmgw.views import EndpointEntry, EndpointTable
from llmgw.wire import to_wire

TABLE = EndpointTable([EndpointEntry("echo/0", "echo", "http://10.0.0.1:4001", "node01")],
                      {"echo": "never shown: echo has an endpoint", "qwen": "node01: downloading qwen.gguf"})


def router(follows_table: bool = False, **config) -> Router:
    return Router(Clock(), RouterSettings(**config), "tcp:0:interface=127.0.0.1", follows_table=follows_table)


def refusal(r: Router, model: str) -> errors.RouterError:
    failure = r.dispatcher.admit(model, RequestInfo())
    box = []
    failure.addErrback(lambda f: box.append(f.value))
    (error,) = box
    return error


def reason(r: Router, model: str) -> str:
    """Why *model* is 503 here; fails the test on any other answer."""
    error = refusal(r, model)
    assert isinstance(error, errors.NoReadyEndpoint), error
    return error.message.split(": ", 1)[1]


def test_the_table_becomes_the_dispatchers_endpoints_beside_the_static_ones():
    r = router(endpoints=(StaticEndpoint(model="llama", url="http://10.0.0.9:8080"),))
    r.apply_table(TABLE)
    assert [(e.id, e.model, e.node_id) for e in r.dispatcher.endpoints()] == [
        ("echo/0", "echo", "node01"), ("static:llama:http://10.0.0.9:8080", "llama", None)]


def test_a_table_from_the_hub_is_decoded_and_one_that_does_not_fit_keeps_the_last():
    r = router()
    session = TableSession(ComponentConfig(realm=uris.REALM), r)
    assert session.follow(to_wire(TABLE)) == TABLE
    assert [e.id for e in r.dispatcher.endpoints()] == ["echo/0"]
    assert session.follow({"endpoints": [{"id": "echo/1", "model": "echo", "url": 5}]}) is None
    assert [e.id for e in r.dispatcher.endpoints()] == ["echo/0"]


def test_a_router_following_the_hub_is_503_for_every_model_until_its_first_table():
    r = router(follows_table=True)
    assert reason(r, "echo") == reason(r, "anything") == NO_TABLE_YET
    r.apply_table(TABLE)
    assert reason(r, "qwen") == "node01: downloading qwen.gguf"
    assert isinstance(refusal(r, "anything"), errors.UnknownModel)


def test_a_router_that_knows_the_catalog_is_503_for_its_models_and_404_for_the_rest():
    r = router(follows_table=True)
    r.expect_models(["echo", "qwen"])
    assert reason(r, "echo") == reason(r, "qwen") == NO_TABLE_YET
    assert isinstance(refusal(r, "anything"), errors.UnknownModel)
    r.apply_table(TABLE)
    # A reload adds gemma and removes qwen; the table has not caught up yet.
    r.expect_models(["echo", "gemma"])
    assert reason(r, "gemma") == NEW_IN_CATALOG
    assert isinstance(refusal(r, "qwen"), errors.UnknownModel)
    assert [e.id for e in r.dispatcher.endpoints()] == ["echo/0"]


def test_a_router_with_only_static_endpoints_says_404_for_any_other_model_from_the_start():
    r = router(endpoints=(StaticEndpoint(model="llama", url="http://10.0.0.9:8080"),))
    assert isinstance(refusal(r, "echo"), errors.UnknownModel)


class _Calls:
    """A session's ``call`` that answers when the test says."""

    def __init__(self):
        from twisted.internet import defer

        self.defer = defer
        self.made: list[tuple[str, dict]] = []
        self.pending: list = []

    def __call__(self, uri, payload):
        self.made.append((uri, payload))
        d = self.defer.Deferred()
        self.pending.append(d)
        return d


def test_a_worker_reports_its_load_over_the_hub_one_call_at_a_time_the_newest_waiting():
    from llmgw.traffic import ModelLoad, RouterLoad

    r = router(follows_table=True)
    session = TableSession(ComponentConfig(realm=uris.REALM), r)
    session.call = calls = _Calls()
    session.send_load(RouterLoad("node01:7"))
    session.send_load(RouterLoad("node01:7", urgent=True))  # one is in flight: this waits
    session.send_load(RouterLoad("node01:7", [ModelLoad("qwen", held=2)]))  # replaces it, urgent mark and all
    assert [(uri, p["urgent"]) for uri, p in calls.made] == [(uris.ROUTER_LOAD, False)]
    calls.pending.pop(0).callback(None)
    assert [(p["urgent"], len(p["models"])) for _, p in calls.made] == [(False, 0), (True, 1)]
    calls.pending.pop(0).callback(None)
    assert len(calls.made) == 2


def test_a_worker_whose_reports_fail_logs_it_once_and_keeps_sending():
    from twisted.logger import globalLogPublisher

    from llmgw.traffic import RouterLoad

    r = router(follows_table=True)
    session = TableSession(ComponentConfig(realm=uris.REALM), r)
    session.call = calls = _Calls()
    logged = []
    globalLogPublisher.addObserver(logged.append)
    try:
        for _ in range(3):
            session.send_load(RouterLoad("node01:7"))
            calls.pending.pop(0).errback(RuntimeError("no such procedure"))
    finally:
        globalLogPublisher.removeObserver(logged.append)
    assert len(calls.made) == 3
    assert len([e for e in logged if "load report" in e.get("log_format", "")]) == 1
