"""The link records of the weights machinery, which live in ``llmgw.records`` with the others.

Re-exported here so the modules of this package name them in one place; there
is one class per record, so a ``WeightsFile`` from a scan is the very type a
``Heartbeat`` carries.
"""

from __future__ import annotations

from llmgw.records import CollectResult, Progress, WeightsFile, WeightsReport

__all__ = ["CollectResult", "Progress", "WeightsFile", "WeightsReport"]
