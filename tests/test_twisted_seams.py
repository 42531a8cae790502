"""The private parts of Twisted llmgw leans on, checked, so an upgrade that moves one fails here.

Each is a place where a rename would not raise but silently bring back what
llmgw fixed: a busy port logged while the server runs on (listen), Twisted's
"Scheduling retry … <_WrapperEndpoint …>" lines (reconnect), "Starting
factory" on every health probe (the quiet HTTP pool).
"""

from __future__ import annotations

from twisted.application.internet import ClientService, StreamServerEndpointService
from twisted.internet import endpoints, reactor
from twisted.web import client as webclient

from llmgw.webclient import connection_pool


def test_the_listener_service_still_has_a_switch_to_raise_a_failed_listen():
    service = StreamServerEndpointService(endpoints.TCP4ServerEndpoint(reactor, 0), None)
    assert service._raiseSynchronously is False


def test_client_service_still_logs_through_a_class_attribute_a_subclass_can_replace():
    assert isinstance(ClientService.__dict__.get("_log"), type(ClientService._log))
    assert "_log" in ClientService.__dict__


def test_the_http_pool_still_builds_connections_from_its_factory_attribute():
    assert issubclass(webclient._HTTP11ClientFactory, object)
    pool = webclient.HTTPConnectionPool(reactor)
    assert pool._factory is webclient._HTTP11ClientFactory
    assert connection_pool(reactor, persistent=False)._factory is not webclient._HTTP11ClientFactory
