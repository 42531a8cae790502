"""schemathesis's hooks for tests/router/test_schemathesis.py (``SCHEMATHESIS_HOOKS=tests.support.openapi_hooks``).

A generated Responses request names a random model, which the router would
refuse before translating anything: every body whose ``model`` is a string is
sent for ``$LLMGW_SCHEMATHESIS_MODEL`` instead (a ``model`` of the wrong type
is left for the router to refuse).

Most generated bodies also carry something llmgw refuses by design (a stored
conversation, a hosted tool: docs/router.rst), and the 400 comes before any
translation.  With ``$LLMGW_SCHEMATHESIS_SERVABLE`` set, those parts are taken
out (``servable``) and the rest of the body, valid or not, goes through the
translation to chat completions and on to the simulator.
"""

from __future__ import annotations

import os

import schemathesis

#: What llmgw refuses because it keeps nothing between requests (docs/router.rst).
STATEFUL = ("previous_response_id", "conversation", "prompt", "context_management", "background")
#: The input items the translation serves: messages, and a function tool's call and output.
ITEMS = ("message", "function_call", "function_call_output")


def servable(body: dict) -> None:
    """Take out of *body*, in place, what llmgw refuses by design; leave the rest as it was generated."""
    for field in STATEFUL:
        body.pop(field, None)
    if isinstance(body.get("tools"), list):
        body["tools"] = [t for t in body["tools"] if isinstance(t, dict) and t.get("type") == "function"]
    if isinstance(body.get("input"), list):
        body["input"] = [i for i in body["input"] if isinstance(i, dict) and i.get("type", "message") in ITEMS]
    if body.get("input") in (None, []):
        # Nothing left to say: a user's question, so the rest of the body is what is tried.
        body["input"] = [{"role": "user", "content": "a generated request"}]
    choice = body.get("tool_choice")
    if isinstance(choice, dict) and choice.get("type") != "function":
        body.pop("tool_choice")


@schemathesis.hook
def before_call(context, case, **kwargs):
    if isinstance(case.body, dict) and isinstance(case.body.get("model"), str):
        case.body["model"] = os.environ["LLMGW_SCHEMATHESIS_MODEL"]
        if os.environ.get("LLMGW_SCHEMATHESIS_SERVABLE"):
            servable(case.body)
