"""A model's scaling policy: ``replicas: {min: M, max: X}`` and its ``scale:`` block (docs/configuration.rst).

``Scale`` is what the control plane decides by; ``Model.scale`` holds it
resolved: the model's own ``scale:`` keys over its profile's, over the
defaults here, with ``min``/``max`` from the model's ``replicas``.  An integer
``replicas: N`` is ``min = max = N``: such a model never sleeps and never
grows, so of the ``scale:`` keys only ``priority`` applies to it (its
replicas are never stopped to make room: they are at their min), and a
model's own block that sets another is refused.  A profile's block is
defaults for models of every kind, so it is never refused for that.
"""

from __future__ import annotations

import attrs
from yaml.nodes import MappingNode, ScalarNode

from llmgw.config.schema import Int, Loader, Section, Type, section
from llmgw.config.yamlpos import KeyPath
from llmgw.setting import setting

# What the routers are handed of a model that wakes on demand (llmgw.views.ColdStart) holds these bounds.
MAX_COLD_START_TIMEOUT_S = 86_400.0
MAX_HELD = 1_000_000


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


#: The keys of a ``scale:`` block: every field of Scale but min and max, which ``replicas:`` gives.
SCALE_KEYS = tuple(f.name for f in attrs.fields(Scale) if f.name not in ("min", "max"))
#: The keys that apply to a model whose count is fixed (min = max).
FIXED_KEYS = ("priority",)


@attrs.frozen
class Replicas:
    """``replicas: {min: M, max: X}`` as written: the model keeps at least M replicas and grows to X."""

    min: int = setting(least=0)
    max: int = setting(least=0)


_RANGE = section(Replicas)


@attrs.frozen
class ReplicasType(Type):
    """``replicas:``: an integer N (min = max = N), or a ``Replicas`` range with min no more than max."""

    @property
    def what(self) -> str:  # type: ignore[override]
        return "an integer >= 0 or a mapping {min: M, max: X}"

    def convert(self, loader: Loader, node, path: KeyPath):
        if isinstance(node, ScalarNode):
            return Int(min=0).convert(loader, node, path)
        if not isinstance(node, MappingNode):
            raise self.expected(loader, node, path)
        count = _RANGE.build(loader, node, path)
        if count.min > count.max:
            here = path + ("min",)
            raise loader.fail(
                loader.line(here), here,
                f"{count.min} is more than max ({count.max}); min is how many replicas the model always keeps, "
                "max the most it grows to (min 0 lets it sleep; replicas: N is min = max = N)",
            )
        return count


def number(value: float) -> str:
    """A key's value as the file would write it: 90000, 2.5, 1000001."""
    return f"{value:.15g}"


# The keys a router's share of the policy bounds (llmgw.views.ColdStart), and why.
_CEILINGS = (
    ("cold_start_timeout_s", MAX_COLD_START_TIMEOUT_S, "a router holds a request a day at most"),
    ("max_held", MAX_HELD, "a router holds a million requests of a model at most"),
)


@attrs.frozen
class ScaleSection(Section):
    """A ``scale:`` block: Scale's keys but min and max, which it points to ``replicas:`` for."""

    def build(self, loader: Loader, node, path: KeyPath, /, **extra):
        if isinstance(node, MappingNode):
            for key, key_node, _ in loader.document.items(node, path):
                if key in ("min", "max"):
                    raise loader.fail(
                        key_node, path + (key,),
                        f"{key} is given in replicas: {{min: M, max: X}}, beside scale:, not in it",
                    )
        block = super().build(loader, node, path, **extra)
        for key, most, why in _CEILINGS:
            if getattr(block, key) > most:
                here = path + (key,)
                raise loader.fail(loader.line(here), here,
                                  f"must be at most {number(most)}, got {number(getattr(block, key))}; {why}")
        return block


REPLICAS = ReplicasType()
SCALE_SECTION = ScaleSection(Scale, {k: v for k, v in section(Scale).keys.items() if k in SCALE_KEYS})


def written(loader: Loader, path: KeyPath) -> tuple[str, ...]:
    """The keys of the ``scale:`` block at *path* that the file sets (the rest are defaults)."""
    return tuple(key for key in SCALE_KEYS if path + (key,) in loader.lines)


def over(own: Scale, own_keys: tuple[str, ...], defaults: Scale, default_keys: tuple[str, ...]) -> Scale:
    """*own* with the keys it does not set taken from *defaults* where those set them."""
    return attrs.evolve(own, **{key: getattr(defaults, key) for key in default_keys if key not in own_keys})


def check_fixed(loader: Loader, path: KeyPath, count: int, own_keys: tuple[str, ...]) -> None:
    """Refuse the keys of a model's own ``scale:`` (at *path*) that cannot apply to a count fixed at *count*."""
    for key in own_keys:
        if key not in FIXED_KEYS:
            here = path + (key,)
            raise loader.fail(
                loader.line(here), here,
                f"applies only to a model whose count can move, and this one keeps {count} replicas always "
                f"(min = max = {count}); give replicas: {{min: M, max: X}} with M below X, or remove {key} "
                f"(of scale:, only {', '.join(FIXED_KEYS)} applies to a fixed count)",
            )
