"""API keys: who gets in, to which models, how fast; through the dispatcher as a client meets them."""

from __future__ import annotations

import hashlib

import pytest
from twisted.internet.task import Clock
from twisted.python.failure import Failure

from llmgw.config.routing import Admission, APIKey, RouterSettings
from llmgw.router import errors, keys
from llmgw.router.dispatch import Dispatcher, RequestInfo
from llmgw.router.keys import KeyRing, hash_token, new_token
from llmgw.views import EndpointEntry

ALICE = "sk-llmgw-alice-token"
BOB = "sk-llmgw-bob-token"


def key(name, token, **kw):
    return APIKey(name=name, sha256=hash_token(token), **kw)


def dispatcher(clock, *api_keys, models=("echo", "gemma")):
    d = Dispatcher(clock, RouterSettings(admission=Admission(100, 10, 30.0), keys=tuple(api_keys)))
    d.set_endpoints(
        [EndpointEntry(f"{m}/0", m, f"http://127.0.0.1:{8001 + i}") for i, m in enumerate(models)]
    )
    return d


def outcome(d, model="echo", token=None):
    box = []
    d.admit(model, RequestInfo(api_key=token)).addBoth(box.append)
    value = box[0]
    return value.value if isinstance(value, Failure) else value


def test_hash_token_is_the_sha256_hex_that_server_yaml_stores():
    assert hash_token("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"


def test_new_token_gives_a_fresh_token_and_its_hash():
    token, digest = new_token()
    other, _ = new_token()
    assert token != other
    assert token.startswith("sk-llmgw-") and len(token) > 40
    assert digest == hashlib.sha256(token.encode()).hexdigest()


def test_an_api_without_keys_is_open_and_ignores_any_token():
    d = dispatcher(Clock())
    assert d.open_api
    assert outcome(d, token=None).endpoint.id == "echo/0"
    assert outcome(d, token="anything").endpoint.id == "echo/0"


def test_no_key_is_401_saying_how_to_send_one():
    d = dispatcher(Clock(), key("alice", ALICE))
    assert not d.open_api
    refused = outcome(d, token=None)
    assert isinstance(refused, errors.Unauthorized) and refused.status == 401
    assert "Authorization: Bearer" in refused.message


def test_a_wrong_key_is_401_and_the_refusal_does_not_repeat_it():
    d = dispatcher(Clock(), key("alice", ALICE))
    wrong = "sk-llmgw-not-a-real-one"
    refused = outcome(d, token=wrong)
    assert isinstance(refused, errors.Unauthorized)
    assert wrong not in refused.message and "invalid API key" in refused.message


def test_the_right_key_gets_in_and_the_lease_knows_it():
    d = dispatcher(Clock(), key("alice", ALICE), key("bob", BOB))
    assert outcome(d, token=BOB).key.name == "bob"


def test_every_key_is_compared_in_constant_time_even_after_a_match(monkeypatch):
    calls = []
    real = keys.hmac.compare_digest

    def counting(a, b):
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(keys.hmac, "compare_digest", counting)
    ring = KeyRing([key(f"k{i}", f"token-{i}") for i in range(5)], Clock())
    assert ring.authenticate("token-0").name == "k0"
    assert len(calls) == 5
    calls.clear()
    with pytest.raises(errors.Unauthorized):
        ring.authenticate("nobody")
    assert len(calls) == 5
    # What is compared is the digest, never the token itself.
    assert all(a == hash_token("nobody").encode() for a, _ in calls)


def test_a_stored_hash_in_capitals_still_matches():
    ring = KeyRing([APIKey("alice", hash_token(ALICE).upper())], Clock())
    assert ring.authenticate(ALICE).name == "alice"


def test_a_key_limited_to_some_models_is_403_for_the_others_and_told_which_it_may_use():
    d = dispatcher(Clock(), key("alice", ALICE, models=("gemma",)))
    refused = outcome(d, "echo", ALICE)
    assert isinstance(refused, errors.Forbidden) and refused.status == 403
    assert "'alice'" in refused.message and "'echo'" in refused.message and "gemma" in refused.message
    assert outcome(d, "gemma", ALICE).endpoint.id == "gemma/0"


def test_keys_are_checked_before_the_model():
    d = dispatcher(Clock(), key("alice", ALICE, models=("gemma",)))
    assert isinstance(outcome(d, "no-such-model", None), errors.Unauthorized)
    assert isinstance(outcome(d, "no-such-model", ALICE), errors.Forbidden)
    open_key = dispatcher(Clock(), key("bob", BOB))
    assert isinstance(outcome(open_key, "no-such-model", BOB), errors.UnknownModel)


def test_requests_per_minute_is_429_with_retry_after_until_the_bucket_refills():
    clock = Clock()
    d = dispatcher(clock, key("alice", ALICE, requests_per_minute=2), key("bob", BOB))
    for _ in range(2):
        outcome(d, token=ALICE).release("ok")
    refused = outcome(d, token=ALICE)
    assert isinstance(refused, errors.RateLimited) and refused.status == 429
    # Two a minute refill one every 30 s.
    assert refused.retry_after_s == 30
    assert dict(refused.headers)["Retry-After"] == "30"
    assert "2 requests per minute" in refused.message and "'alice'" in refused.message
    # Another key is not held back by alice's limit.
    assert outcome(d, token=BOB).key.name == "bob"
    clock.advance(29)
    refused = outcome(d, token=ALICE)
    assert isinstance(refused, errors.RateLimited) and refused.retry_after_s == 1
    clock.advance(1)
    assert outcome(d, token=ALICE).key.name == "alice"


def test_a_refused_request_is_not_counted_against_the_limit():
    clock = Clock()
    d = dispatcher(clock, key("alice", ALICE, requests_per_minute=1))
    outcome(d, token=ALICE).release("ok")
    for _ in range(5):
        assert isinstance(outcome(d, token=ALICE), errors.RateLimited)
    clock.advance(60)
    assert outcome(d, token=ALICE).key.name == "alice"


def test_tokens_per_minute_is_charged_after_the_response_and_refuses_until_paid_off():
    clock = Clock()
    d = dispatcher(clock, key("alice", ALICE, tokens_per_minute=600))
    lease = outcome(d, token=ALICE)
    # Admitted while the response is being written: the usage is not known yet.
    assert outcome(d, token=ALICE).key.name == "alice"
    lease.usage(500, 160)
    lease.release("ok")
    refused = outcome(d, token=ALICE)
    assert isinstance(refused, errors.RateLimited)
    assert "600 tokens per minute" in refused.message
    # 60 tokens of debt, plus one to have some, at 10 a second.
    assert refused.retry_after_s == 7
    clock.advance(7)
    assert outcome(d, token=ALICE).key.name == "alice"


def test_usage_that_the_engine_did_not_report_is_not_charged():
    clock = Clock()
    d = dispatcher(clock, key("alice", ALICE, tokens_per_minute=10))
    lease = outcome(d, token=ALICE)
    lease.usage(None, None)
    lease.release("ok")
    assert outcome(d, token=ALICE).key.name == "alice"


def test_the_longer_wait_wins_when_both_limits_are_exceeded():
    clock = Clock()
    d = dispatcher(clock, key("alice", ALICE, requests_per_minute=1, tokens_per_minute=60))
    lease = outcome(d, token=ALICE)
    lease.usage(200, 0)
    refused = outcome(d, token=ALICE)
    # Requests: 60 s; tokens: 141 at one a second.
    assert refused.retry_after_s == 141


def test_a_reload_keeps_the_buckets_of_unchanged_keys():
    clock = Clock()
    alice = key("alice", ALICE, requests_per_minute=1)
    d = dispatcher(clock, alice, key("bob", BOB, requests_per_minute=1))
    outcome(d, token=ALICE).release("ok")
    outcome(d, token=BOB).release("ok")
    # bob's limit changes, alice's does not.
    bob = key("bob", BOB, requests_per_minute=5)
    d.reconfigure(RouterSettings(admission=Admission(100, 10, 30.0), keys=(alice, bob)))
    assert isinstance(outcome(d, token=ALICE), errors.RateLimited)
    assert outcome(d, token=BOB).key.name == "bob"


def test_removing_every_key_opens_the_api():
    d = dispatcher(Clock(), key("alice", ALICE))
    d.reconfigure(RouterSettings())
    assert d.open_api
    assert outcome(d, token=None).endpoint.id == "echo/0"
