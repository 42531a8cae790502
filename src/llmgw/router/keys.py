"""API keys: who may call the router, which models they may use, and how fast.

server.yaml stores only the sha256 of each bearer token, so a leaked config
file leaks no key.  To make one::

    python -c "from llmgw.router.keys import new_token; print(new_token())"

gives ``(token, sha256)``: the token goes to the user, the sha256 into
``router.keys[].sha256``.

Authentication hashes the presented token and compares the digest with every
configured key's in constant time (``hmac.compare_digest``), all of them every
time, so how long a refusal takes says nothing about which key came close.
A refusal never repeats the token.

Rate limits are token buckets per key, refilled continuously: a key with
``requests_per_minute: 60`` may burst 60 requests and then one a second.
``tokens_per_minute`` is charged after the response, when the usage is known
(``Lease.usage``); a key that has spent more than its bucket holds is refused
until the bucket is back above empty, so a long answer is paid for by the
requests after it rather than cut short.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from typing import Sequence

from twisted.internet.interfaces import IReactorTime

from llmgw.config.routing import APIKey
from llmgw.router import errors

TOKEN_PREFIX = "sk-llmgw-"


def hash_token(token: str) -> str:
    """The sha256 of *token* as 64 lowercase hex digits: what server.yaml stores."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def new_token() -> tuple[str, str]:
    """A fresh bearer token and its sha256: give the first away, put the second in server.yaml."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    return token, hash_token(token)


class Bucket:
    """``capacity`` units, refilled at ``capacity`` per minute; the level may go below zero (debt)."""

    __slots__ = ("capacity", "rate", "level", "at")

    def __init__(self, capacity: int, now: float):
        self.capacity = capacity
        self.rate = capacity / 60.0
        self.level = float(capacity)
        self.at = now

    def refill(self, now: float) -> float:
        if now > self.at:
            self.level = min(float(self.capacity), self.level + (now - self.at) * self.rate)
            self.at = now
        return self.level

    def seconds_until(self, level: float, now: float) -> float:
        """How long until the bucket holds at least *level*."""
        return max(0.0, (level - self.refill(now)) / self.rate)


def retry_after(seconds: float) -> int:
    """Whole seconds for ``Retry-After``: rounded up, at least 1."""
    return max(1, math.ceil(seconds - 1e-9))


class KeyRing:
    """The configured keys, with a request bucket and a token bucket for each key that has limits."""

    def __init__(self, keys: Sequence[APIKey], clock: IReactorTime):
        self.keys = tuple(keys)
        self._clock = clock
        self._digests = [(k, k.sha256.lower().encode("ascii")) for k in self.keys]
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}
        now = clock.seconds()
        for key in self.keys:
            if key.requests_per_minute is not None:
                self._requests[key.name] = Bucket(key.requests_per_minute, now)
            if key.tokens_per_minute is not None:
                self._tokens[key.name] = Bucket(key.tokens_per_minute, now)

    def __bool__(self) -> bool:
        return bool(self.keys)

    def carry_over(self, old: KeyRing) -> None:
        """Keep *old*'s buckets for keys whose token and limits a reload did not change."""
        before = {(k.name, k.sha256): k for k in old.keys}
        for key in self.keys:
            prior = before.get((key.name, key.sha256))
            if prior is None:
                continue
            if prior.requests_per_minute == key.requests_per_minute and key.name in old._requests:
                self._requests[key.name] = old._requests[key.name]
            if prior.tokens_per_minute == key.tokens_per_minute and key.name in old._tokens:
                self._tokens[key.name] = old._tokens[key.name]

    def authenticate(self, token: str | None) -> APIKey:
        """The key whose token this is, or ``Unauthorized``; every key is compared, in constant time."""
        if not token:
            raise errors.Unauthorized(
                "no API key: send one as 'Authorization: Bearer <key>'; ask the operator of this llmgw for a key"
            )
        digest = hash_token(token).encode("ascii")
        found = None
        for key, expected in self._digests:
            # No early exit: the time taken must not depend on which key matched.
            if hmac.compare_digest(digest, expected):
                found = key
        if found is None:
            raise errors.Unauthorized(
                "invalid API key: it matches none this llmgw accepts; check that it was copied whole, "
                "or ask the operator for a new one"
            )
        return found

    def check_model(self, key: APIKey, model: str) -> None:
        """``Forbidden`` unless *key* may use *model*."""
        if key.models is None or model in key.models:
            return
        allowed = ", ".join(key.models) or "none"
        raise errors.Forbidden(
            f"API key {key.name!r} may not use model {model!r}; it may use: {allowed}"
        )

    def charge_request(self, key: APIKey) -> None:
        """Count one request against *key*'s limits, or ``RateLimited`` (charging nothing)."""
        now = self._clock.seconds()
        requests = self._requests.get(key.name)
        tokens = self._tokens.get(key.name)
        waits = []
        if requests is not None and requests.refill(now) < 1.0:
            waits.append(
                (requests.seconds_until(1.0, now), f"{key.requests_per_minute} requests per minute")
            )
        if tokens is not None and tokens.refill(now) <= 0.0:
            # Just above empty: a key in debt waits until it has paid it off.
            waits.append((tokens.seconds_until(1.0, now), f"{key.tokens_per_minute} tokens per minute"))
        if waits:
            seconds, limit = max(waits)
            after = retry_after(seconds)
            raise errors.RateLimited(
                f"API key {key.name!r} is over its limit of {limit}; retry in {after} s",
                retry_after_s=after,
            )
        if requests is not None:
            requests.level -= 1.0

    def charge_tokens(self, key: APIKey | None, tokens: int) -> None:
        """Count *tokens* (prompt and completion) against *key*'s tokens per minute."""
        if key is None or tokens <= 0:
            return
        bucket = self._tokens.get(key.name)
        if bucket is not None:
            bucket.refill(self._clock.seconds())
            bucket.level -= tokens
