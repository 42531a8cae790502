"""A stand-in chat engine that calls the tools it is given and answers in the JSON schema it is asked for.

The simulator echoes its prompt and knows nothing of tools or response
formats; a model that does is what a function-tool round trip and a
``text.format`` JSON schema need to be proven end to end through the router.
This one is scripted, as a small model served by llama.cpp behaves at best:

- offered ``tools`` and no tool result yet: it calls the first tool, its
  arguments filled from the tool's parameter schema (``fill``);
- given a tool result (the last message's role is ``tool``): it says
  ``the tool said: <content>``;
- asked for ``response_format`` ``json_schema``: the schema filled; for
  ``json_object``: ``{"answer": "yes"}``;
- otherwise it echoes the last user message.

It answers ``POST /v1/chat/completions`` (streaming too, tool-call deltas and
``stream_options.include_usage`` included) with an ``Access-Control-Allow-Origin``
field of its own, as llama.cpp's server answers every request (the request's
``Origin``, empty when there is none), and keeps every body it was sent
and every request's ``X-Request-Id`` for ``GET /recorded``.  It is a process
of its own (``ToolEngineProcess``), on twisted.web: a test's engine, where a
request a second does not matter.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from twisted.web import resource, server

ROOT = Path(__file__).resolve().parents[2]

MODEL = "tool-model"
#: What ``fill`` writes for each JSON-schema type.
SAMPLES = {"string": "Paris", "integer": 3, "number": 2.5, "boolean": True, "null": None}


def fill(schema: dict):
    """A value that fits *schema*: every property, its first enum member, one item of an array."""
    if "enum" in schema:
        return schema["enum"][0]
    kind = schema.get("type", "object")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        return {name: fill(sub) for name, sub in (schema.get("properties") or {}).items()}
    if kind == "array":
        return [fill(schema.get("items") or {"type": "string"})]
    return SAMPLES[kind]


def _text(content) -> str:
    if isinstance(content, list):  # content parts
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def answer(body: dict, call_number: int) -> tuple[str, list[dict]]:
    """(text, tool_calls) the scripted model answers *body* with."""
    messages = body.get("messages") or [{"role": "user", "content": ""}]
    last = messages[-1]
    if last.get("role") == "tool":
        return f"the tool said: {_text(last.get('content'))}", []
    tools = [t for t in body.get("tools") or [] if t.get("type") == "function"]
    if tools and body.get("tool_choice") != "none":
        function = tools[0]["function"]
        arguments = json.dumps(fill(function.get("parameters") or {}))
        return "", [{"id": f"call_{call_number}", "type": "function",
                     "function": {"name": function["name"], "arguments": arguments}}]
    form = body.get("response_format") or {}
    if form.get("type") == "json_schema":
        return json.dumps(fill(form["json_schema"].get("schema") or {})), []
    if form.get("type") == "json_object":
        return json.dumps({"answer": "yes"}), []
    user = [m for m in messages if m.get("role") == "user"]
    return _text(user[-1].get("content")) if user else "", []


def _usage(body: dict, text: str, calls: list[dict]) -> dict:
    prompt = sum(len(_text(m.get("content")).split()) for m in body.get("messages") or [])
    completion = len(text.split()) + sum(len(c["function"]["arguments"].split()) for c in calls)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class _Completions(resource.Resource):
    isLeaf = True

    def __init__(self, engine: _Recording):
        super().__init__()
        self.engine = engine

    def render_POST(self, request):
        body = json.loads(request.content.read())
        engine = self.engine
        engine.bodies.append(body)
        engine.request_ids.append((request.getHeader("x-request-id") or ""))
        # llama-server's manners: its own CORS field on every answer, whatever the router does.
        request.setHeader(b"access-control-allow-origin", request.getHeader(b"origin") or b"")
        text, calls = answer(body, len(engine.bodies))
        finish = "tool_calls" if calls else "stop"
        usage = _usage(body, text, calls)
        base = {"id": f"chatcmpl-{len(engine.bodies)}", "created": 1_800_000_000, "model": body.get("model", MODEL)}
        if not body.get("stream"):
            message = {"role": "assistant", "content": text or None}
            if calls:
                message["tool_calls"] = calls
            request.setHeader(b"content-type", b"application/json")
            return json.dumps({**base, "object": "chat.completion", "usage": usage, "choices": [
                {"index": 0, "message": message, "finish_reason": finish}]}).encode()
        request.setHeader(b"content-type", b"text/event-stream")
        chunks = [{"role": "assistant", "content": ""}]
        words = text.split(" ")
        chunks += [{"content": w if i == 0 else " " + w} for i, w in enumerate(words) if text]
        for i, call in enumerate(calls):
            arguments = call["function"]["arguments"]
            half = len(arguments) // 2
            chunks.append({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                           "function": {"name": call["function"]["name"], "arguments": ""}}]})
            chunks += [{"tool_calls": [{"index": i, "function": {"arguments": piece}}]}
                       for piece in (arguments[:half], arguments[half:])]
        events = [{**base, "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": delta, "finish_reason": None}]} for delta in chunks]
        events.append({**base, "object": "chat.completion.chunk", "choices": [
            {"index": 0, "delta": {}, "finish_reason": finish}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**base, "object": "chat.completion.chunk", "choices": [], "usage": usage})
        return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


class _Recorded(resource.Resource):
    isLeaf = True

    def __init__(self, engine: _Recording):
        super().__init__()
        self.engine = engine

    def render_GET(self, request):
        request.setHeader(b"content-type", b"application/json")
        return json.dumps({"bodies": self.engine.bodies, "request_ids": self.engine.request_ids}).encode()


class _Recording:
    def __init__(self):
        self.bodies: list[dict] = []
        self.request_ids: list[str] = []


def site() -> server.Site:
    """``POST /v1/chat/completions``, and ``GET /recorded``: what it was sent."""
    recording = _Recording()
    root = resource.Resource()
    v1 = resource.Resource()
    root.putChild(b"v1", v1)
    root.putChild(b"recorded", _Recorded(recording))
    chat = resource.Resource()
    v1.putChild(b"chat", chat)
    chat.putChild(b"completions", _Completions(recording))
    made = server.Site(root)
    made.noisy = False
    return made


class ToolEngineProcess:
    """``python -m tests.support.toolengine`` on 127.0.0.1, its port read from its first line."""

    def __init__(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "src")]))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.support.toolengine"], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, text=True,
                                     start_new_session=True)
        line = self.proc.stdout.readline()  # the first line, or "" once it has exited
        found = re.fullmatch(r"toolengine: serving on http://127\.0\.0\.1:(\d+)\n", line)
        if found is None:
            self.proc.kill()
            raise AssertionError(f"the tool engine did not start: {line}{self.proc.stdout.read()}")
        self.port = int(found.group(1))
        self.base_url = f"http://127.0.0.1:{self.port}"

    def recorded(self) -> tuple[list[dict], list[str]]:
        """(every body it was sent, every request's X-Request-Id), in order."""
        with urllib.request.urlopen(self.base_url + "/recorded", timeout=10) as answer:
            got = json.load(answer)
        return got["bodies"], got["request_ids"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc.stdout.close()


def main() -> None:
    from twisted.internet import reactor

    port = reactor.listenTCP(0, site(), interface="127.0.0.1")
    print(f"toolengine: serving on http://127.0.0.1:{port.getHost().port}", flush=True)
    reactor.run()


if __name__ == "__main__":
    main()
