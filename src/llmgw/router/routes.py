"""The API's routes, and what the router reads of a request to route it: its model, its stream flag, its prompt.

Every route but ``/v1/models`` goes to an engine serving the model the body
names.  A JSON body names it in ``"model"``; an audio upload
(``multipart/form-data``) in its ``model`` form field, read without copying
the file (``llmgw.router.multipart``).  The body goes to the engine as it came
(decompressed first when it came with ``Content-Encoding: gzip`` or
``deflate``, within ``router.max_body_bytes``).  An engine that lacks a route
answers its own 404, which is relayed.  ``/tokenize``, ``/detokenize``,
``/score`` and ``/rerank`` are served at the root by vLLM and llama.cpp; the
router takes both spellings and sends the path as it came.
"""

from __future__ import annotations

import json

from llmgw.http11 import BadRequest, ParsedRequest, decoded_body
from llmgw.router import errors
from llmgw.router.bodies import prompt_prefix
from llmgw.router.dispatch import RequestInfo
from llmgw.router.door import bearer
from llmgw.router.multipart import MalformedMultipart, form_fields, is_multipart

RESPONSES = "/v1/responses"
JSON_ROUTES = frozenset((
    "/v1/chat/completions", "/v1/completions", "/v1/embeddings", RESPONSES,
    "/v1/rerank", "/rerank", "/v2/rerank", "/v1/score", "/score",
    "/v1/tokenize", "/tokenize", "/v1/detokenize", "/detokenize",
))
FORM_ROUTES = frozenset(("/v1/audio/transcriptions", "/v1/audio/translations"))
PROXIED = JSON_ROUTES | FORM_ROUTES
MODELS = "/v1/models"
# Every route, for the metrics' path label.
PATHS = PROXIED | {MODELS}
_FORM_FIELDS = frozenset(("model", "stream"))


class UnsupportedEncoding(errors.RouterError):
    """The request body's Content-Encoding is not one the router decodes: send gzip, deflate or none."""

    status = 415
    type = "invalid_request_error"
    code = "unsupported_content_encoding"


class NotStored(errors.NotFound):
    """llmgw stores no responses: each is answered once and kept nowhere (docs/router.rst, "The Responses API")."""

    code = "response_not_stored"


def not_found(method: str, path: str) -> errors.RouterError:
    """What a request for no route is answered."""
    if path.startswith(RESPONSES + "/"):
        return NotStored("llmgw stores no responses (%s %s): each is answered once and kept nowhere, so there is "
                         "none to get, cancel or delete; send the conversation again in \"input\" instead of "
                         "previous_response_id (docs/router.rst, \"The Responses API\")" % (method, path))
    return errors.NotFound(
        "Invalid URL (%s %s): the router serves POST /v1/chat/completions, /v1/completions, /v1/embeddings, "
        "/v1/responses, /v1/rerank, /v1/score, /v1/tokenize, /v1/detokenize, /v1/audio/transcriptions and "
        "/v1/audio/translations (and /rerank, /v2/rerank, /score, /tokenize, /detokenize), and GET /v1/models"
        % (method, path))


class Unroutable(Exception):
    """``read_info``'s answer instead of a RequestInfo: ``error``, counted under ``model`` ("" when unread)."""

    def __init__(self, error: errors.RouterError, model: str = ""):
        super().__init__(error.message)
        self.error = error
        self.model = model


def _model(name: str, created: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "llmgw"}


def model_object(name: str, created: int) -> bytes:
    """GET /v1/models/NAME's answer."""
    return json.dumps(_model(name, created)).encode()


def model_list(names: list[str], created: int) -> bytes:
    """GET /v1/models's answer."""
    return json.dumps({"object": "list", "data": [_model(m, created) for m in names]}).encode()


def _no_constant(name: str):
    raise ValueError("%s is not JSON (RFC 8259 has no NaN or Infinity): send a number or null" % name)


def read_info(request: ParsedRequest, path: str, max_body_bytes: int, rid: str, client: str = "") -> RequestInfo:
    """What the dispatcher needs to know of ``request``; raises Unroutable with the error to answer instead.

    A compressed body is replaced in ``request`` by what it decompresses to:
    that is what the engine is sent.
    """
    coding = request.headers.get("content-encoding")
    if coding is not None:
        decoded = decoded_body(coding, request.body, max_body_bytes)
        if decoded.__class__ is BadRequest:
            status, message = decoded.status, decoded.message
            raise Unroutable(errors.BodyTooLarge(message) if status == 413 else UnsupportedEncoding(message)
                          if status == 415 else errors.InvalidRequest(message))
        request.body = decoded
        del request.headers["content-encoding"]
    if path in FORM_ROUTES:
        return _read_form(request, path, rid, client)
    try:
        body = json.loads(request.body, parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:
        raise Unroutable(errors.InvalidRequest("the request body is not valid JSON: %s" % e)) from None
    if body.__class__ is not dict:
        raise Unroutable(errors.InvalidRequest("the request body must be a JSON object"))
    model = body.get("model")
    if model.__class__ is not str or not model:
        raise Unroutable(errors.InvalidRequest('the request names no model: add "model": "NAME" (GET /v1/models lists '
                                            'them)', param="model"))
    stream = body.get("stream")
    if stream is None:
        stream = False
    elif stream.__class__ is not bool:
        raise Unroutable(errors.InvalidRequest('"stream" must be true or false', param="stream"), model)
    return RequestInfo(path, model, stream, body, bearer(request), prompt_prefix(path, body), rid, client)


def _read_form(request: ParsedRequest, path: str, rid: str, client: str) -> RequestInfo:
    content_type = request.headers.get("content-type")
    if not is_multipart(content_type):
        raise Unroutable(errors.InvalidRequest("%s takes a multipart/form-data body (the file and its fields, model "
                                            "among them), not %s" % (path, content_type or "a body without a Content-Type")))
    try:
        fields = form_fields(request.body, content_type, _FORM_FIELDS)
    except MalformedMultipart as e:
        raise Unroutable(errors.InvalidRequest("the multipart/form-data body cannot be read: %s" % e)) from None
    model = fields.get("model", "")
    if not model:
        raise Unroutable(errors.InvalidRequest("the form names no model: add a field model=NAME (GET /v1/models lists "
                                            "them)", param="model"))
    stream = fields.get("stream", "false").strip().lower()
    if stream not in ("true", "false"):
        raise Unroutable(errors.InvalidRequest('the form field "stream" must be true or false', param="stream"), model)
    return RequestInfo(path, model, stream == "true", {"model": model, "stream": stream == "true"}, bearer(request), "",
                       rid, client)
