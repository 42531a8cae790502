"""``LLMGW_VERBOSE``: whether the processes log Twisted's chatter ("Starting factory", every poll).

Every process reads it, the transport included, so it lives here rather
than in ``llmgw.config``: the link must not depend on the configuration
files' reader.
"""

from __future__ import annotations

import os

#: Set to 1 (in the environment of twistd, of ``make run``, of an engine) for
#: the lines llmgw leaves out by default: Twisted's "Starting factory" lines
#: and an engine's answers to the router's /metrics and the agent's /health
#: polls.  Engines inherit it from the agent that starts them.
VERBOSE_ENV = "LLMGW_VERBOSE"


def verbose_logs(environ=os.environ) -> bool:
    return environ.get(VERBOSE_ENV, "").strip().lower() not in ("", "0", "no", "false")
