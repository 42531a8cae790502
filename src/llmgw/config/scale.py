"""A model's scaling policy: ``replicas: {min: M, max: X}`` and its ``scale:`` block (docs/scaling.rst).

``Scale`` is what the control plane decides by; ``Model.scale`` holds it
resolved (the profile's ``scale:`` under the model's own, the model's
``replicas`` as ``min``/``max``).  An integer ``replicas: N`` is ``min = max
= N``: such a model never sleeps and never grows, and ``priority`` alone
matters (its replicas are never stopped to make room: they are at their min).
"""

from __future__ import annotations

import attrs

from llmgw.setting import setting


@attrs.frozen
class Scale:
    """When a model's replica count moves between ``min`` and ``max``, and who gives memory back first."""

    min: int = setting(1, least=0)
    max: int = setting(1, least=0)
    # After this long without a request, replicas above min are drained and stopped (min 0: the model sleeps).
    idle_s: float = setting(600.0, above=0)
    # Requests in flight, queued, held or waiting in the engine, per ready replica, above which one is added.
    target_inflight: float = setting(4.0, above=0)
    # Above the target this long adds a replica; below it (with one fewer) this long removes one.
    up_after_s: float = setting(10.0, least=0)
    down_after_s: float = setting(120.0, least=0)
    # Who gives memory back first: a model's idle replicas make room only for one of equal or higher priority.
    priority: int = setting(0)
    # How long a router holds a request for a model with no ready replica while one starts.
    cold_start_timeout_s: float = setting(120.0, above=0)
    # How many requests one router holds for the model at once; the next gets 503 at once.
    max_held: int = setting(64, least=1)
    # How long a replica being scaled down waits for its requests in flight before it is stopped anyway.
    drain_timeout_s: float = setting(300.0, least=0)

    @property
    def elastic(self) -> bool:
        """Whether the count moves at all."""
        return self.min < self.max
