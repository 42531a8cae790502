"""What goes wrong fetching weights, in words a node operator can act on."""

from __future__ import annotations

from llmgw.errors import LlmgwError


class FetchError(LlmgwError):
    """Weights could not be fetched; the message names the source and what to do."""


class ChecksumMismatch(FetchError):
    """The downloaded file's sha256 is not the catalog's; nothing was kept."""


class SizeMismatch(FetchError):
    """The file is not the size the server or the catalog said it would be."""
