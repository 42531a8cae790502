"""CORS from router.cors.allow_origins: preflights allowed or refused, allow fields on answers, off by default."""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from twisted.internet import threads

from llmgw.config.routing import CorsSettings, RouterSettings, check_origin
from llmgw.hostnames import HostNames
from llmgw.router.cors import Cors, cors_fields
from llmgw.router.door import Door
from llmgw.http11 import ParsedRequest
from tests.support.net import connect, post, read_response
from tests.support.sim import MODEL

from .routerharness import StaticDispatcher, chat, endpoint_of, exchange

APP = "https://app.example.com"


def request(method: str = "POST", **headers: str) -> ParsedRequest:
    return ParsedRequest(method, "/v1/chat/completions", (1, 1), {k.replace("_", "-"): v for k, v in headers.items()}, b"")


def preflight(origin: str, method: str = "POST", wanted: str = "authorization, content-type") -> bytes:
    return (f"OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: {origin}\r\n"
            f"Access-Control-Request-Method: {method}\r\nAccess-Control-Request-Headers: {wanted}\r\n"
            "Connection: close\r\n\r\n").encode()


def send(port: int, raw: bytes):
    """One exchange on a connection the router closes after it (a 204 has no length to read by)."""
    with connect(port) as s:
        s.sendall(raw)
        return read_response(s.makefile("rb"))


@pytest.mark.parametrize("given, origin", [
    ("https://App.Example.com", "https://app.example.com"),
    ("https://app.example.com:443", "https://app.example.com"),
    ("http://localhost:5173", "http://localhost:5173"),
    ("http://[::1]:8080", "http://[::1]:8080"),
    ("*", "*"),
])
def test_an_origin_is_written_as_a_browser_sends_it(given, origin):
    assert check_origin(given) == origin


@pytest.mark.parametrize("given", ["app.example.com", "https://app.example.com/", "https://a.com/x", "ftp://a.com",
                                   "https://user@a.com"])
def test_what_is_not_an_origin_is_refused_with_how_to_write_one(given):
    with pytest.raises(ValueError, match="write it as a browser sends it"):
        check_origin(given)


def test_off_by_default_no_answer_carries_a_cors_field():
    cors = Cors()
    assert not cors.enabled
    assert cors_fields(request(origin=APP), cors) == b""
    assert cors.preflight(request("OPTIONS", origin=APP, access_control_request_method="POST")) is None


def test_a_listed_origin_is_echoed_with_vary_and_another_gets_nothing():
    cors = Cors.for_config(CorsSettings(allow_origins=(APP,)))
    assert cors_fields(request(origin=APP), cors) == (
        b"Access-Control-Allow-Origin: https://app.example.com\r\nVary: Origin\r\n"
        b"Access-Control-Expose-Headers: X-Request-Id, Retry-After\r\n")
    assert cors_fields(request(origin="https://evil.example"), cors) == b""
    assert cors_fields(request(), cors) == b""


def test_any_origin_is_the_wildcard_and_never_with_credentials():
    cors = Cors.for_config(CorsSettings(allow_origins=("*",)))
    fields = cors_fields(request(origin="https://anyone.example"), cors)
    assert fields.startswith(b"Access-Control-Allow-Origin: *\r\n")
    allowed = cors.preflight(request("OPTIONS", origin="https://anyone.example", access_control_request_method="POST",
                                     access_control_request_headers="Authorization"))
    assert b"Access-Control-Allow-Origin: *\r\n" in allowed
    # Authorization is named, not left to a "*" (which would not cover it); no credentials are allowed.
    assert b"Access-Control-Allow-Headers: Authorization\r\n" in allowed
    assert b"Credentials" not in fields + allowed


@pytest.mark.parametrize("method, wanted", [("DELETE", ""), ("POST", "x-ok, bad header"), ("POST", "a," * 2000)])
def test_a_preflight_for_a_method_or_fields_the_api_has_no_use_for_is_refused(method, wanted):
    cors = Cors.for_config(CorsSettings(allow_origins=(APP,)))
    headers = {"origin": APP, "access_control_request_method": method}
    if wanted:
        headers["access_control_request_headers"] = wanted
    assert cors.preflight(request("OPTIONS", **headers)) is None


@pytest_twisted.ensureDeferred
async def test_a_preflight_from_a_listed_origin_is_204_with_the_allow_fields(make_router):
    router = make_router(StaticDispatcher([]))
    router.factory.door = Door(cors=Cors.for_config(CorsSettings(allow_origins=(APP,), max_age_s=77)))
    status, headers, body = await threads.deferToThread(send, router.address, preflight(APP))
    assert (status, body) == (204, b"") and "content-length" not in headers
    assert headers["access-control-allow-origin"] == APP
    assert headers["access-control-allow-methods"] == "GET, POST, OPTIONS"
    assert headers["access-control-allow-headers"] == "authorization, content-type"
    assert headers["access-control-max-age"] == "77"
    assert "Origin" in headers["vary"] and headers["x-request-id"]


@pytest_twisted.ensureDeferred
async def test_a_preflight_from_another_origin_is_refused_without_the_allow_fields(make_router):
    router = make_router(StaticDispatcher([]))
    router.factory.door = Door(cors=Cors.for_config(CorsSettings(allow_origins=(APP,))))
    status, headers, body = await threads.deferToThread(send, router.address, preflight("https://evil.example"))
    assert status == 403 and not any(name.startswith("access-control-") for name in headers)
    error = json.loads(body)["error"]
    assert error["code"] == "cors_origin_not_allowed" and "router.cors.allow_origins (now https://app.example.com)" in error["message"]
    # With CORS off (the default), every preflight is refused.
    router.factory.door = Door()
    status, headers, _ = await threads.deferToThread(send, router.address, preflight(APP))
    assert status == 403 and "access-control-allow-origin" not in headers


@pytest_twisted.ensureDeferred
async def test_a_keyless_api_answers_a_listed_origins_page_and_still_refuses_others(sim, make_router):
    names = HostNames.from_setting(None, key="router.hosts", file="server.yaml", listener="test", then="reload")
    router = make_router(StaticDispatcher([endpoint_of(sim)]))

    def page(origin: str) -> bytes:
        return post("/v1/chat/completions", chat(), {"Host": "127.0.0.1", "Origin": origin, "Sec-Fetch-Site": "cross-site"})

    router.factory.door = Door(names, None, Cors.for_config(CorsSettings(allow_origins=(APP,))))
    status, headers, body = await threads.deferToThread(exchange, router.address, page(APP))
    assert status == 200 and headers["access-control-allow-origin"] == APP
    assert "X-Request-Id" in headers["access-control-expose-headers"]
    assert json.loads(body)["model"] == MODEL
    status, headers, _ = await threads.deferToThread(exchange, router.address, page("https://evil.example"))
    assert status == 403 and "access-control-allow-origin" not in headers
    # The router's own answers carry the fields too.
    models = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nOrigin: %s\r\n\r\n" % APP.encode()
    status, headers, _ = await threads.deferToThread(exchange, router.address, models)
    assert status == 200 and headers["access-control-allow-origin"] == APP


def test_a_reloaded_router_section_brings_its_cors_with_the_door():
    before = Door.for_config(RouterSettings(), clock=None)
    after = Door.for_config(RouterSettings(cors=CorsSettings(allow_origins=(APP,))), clock=None)
    assert not before.cors.allows(APP) and after.cors.allows(APP)


@pytest.mark.parametrize("method, wanted, said", [
    ("DELETE", None, "GET or POST, not DELETE"),
    ("POST", "x-ok, bad header", "Access-Control-Request-Headers must list"),
    ("POST", "a," * 2000, "at most 2048 characters"),
])
def test_a_preflight_from_a_listed_origin_is_refused_for_what_it_asked_not_for_its_origin(method, wanted, said):
    cors = Cors.for_config(CorsSettings(allow_origins=(APP,)))
    headers = {"origin": APP, "access_control_request_method": method}
    if wanted is not None:
        headers["access_control_request_headers"] = wanted
    refused = cors.answer_preflight(request("OPTIONS", **headers))
    assert said in refused.message and "lets no page" not in refused.message


def test_an_origin_not_listed_is_named_in_the_refusal_at_most_100_characters_of_it():
    cors = Cors.for_config(CorsSettings(allow_origins=(APP,)))
    refused = cors.answer_preflight(request("OPTIONS", origin="https://e.example/" + "x" * 60000 + "\xff",
                                            access_control_request_method="POST"))
    assert len(refused.message) < 400 and "xxx'..." in refused.message
