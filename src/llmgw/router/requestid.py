"""A request's id: the client's ``X-Request-Id`` when it is a sane token, else one the router makes.

It goes back in the ``X-Request-Id`` field of every answer, in the body of
every error the router writes (``error.request_id``, beside OpenAI's four
fields: the openai clients keep the error object whole and ignore what they
do not know), to the engine with the request, and into the router's log
lines about the request, so one string finds a request everywhere.
"""

from __future__ import annotations

import json
import os
import re

from llmgw.router.errors import RouterError

MAX_CHARS = 128
# An HTTP token: safe in a header field, in JSON and in a log line as it is.
_SANE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,128}")


def request_id(given: str | None) -> str:
    """The client's id when it is at most 128 token characters, else 32 new hex digits."""
    if given is not None and _SANE.fullmatch(given) is not None:
        return given
    return os.urandom(16).hex()


def id_field(rid: str) -> bytes:
    return b"X-Request-Id: " + rid.encode() + b"\r\n"


def error_json(error: RouterError, rid: str) -> bytes:
    """OpenAI's error object for ``error``, with the request's id in it."""
    return json.dumps({"error": {"message": error.message, "type": error.type, "param": error.param,
                                 "code": error.code, "request_id": rid}}).encode()
