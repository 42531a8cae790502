"""Errors a user reads.  Each one's message says what is wrong and what to do."""

from __future__ import annotations


class LlmgwError(Exception):
    """Base of the errors the command line prints without a traceback."""

    exit_code = 1


class ConfigError(LlmgwError):
    """A configuration file is wrong; the message names the file, key path and line."""

    exit_code = 2


class PKIError(LlmgwError):
    """A certificate or key could not be created or read."""


class HubUnreachable(LlmgwError):
    """The hub could not be reached or refused this client."""

    exit_code = 3


class Refused(LlmgwError):
    """The control plane or hub refused a request; the message is theirs."""

    exit_code = 4
