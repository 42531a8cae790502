"""The dispatcher offers everything the HTTP path asks of it (``contract.Admitter``, ``EngineLease``, ``EngineAddress``).

The HTTP path is typed against those protocols only; nothing else would
notice a method renamed on one side until a request took that path.
"""

from __future__ import annotations

import inspect

import attrs
import pytest

from llmgw.router.dispatch import Dispatcher, Lease
from llmgw.router.contract import Admitter, EngineAddress, EngineLease
from llmgw.router.scoring import Endpoint


def asked(protocol) -> tuple[dict[str, list[str]], set[str]]:
    """The protocol's methods with their parameter names, and its attributes."""
    methods = {
        name: list(inspect.signature(fn).parameters)
        for name, fn in vars(protocol).items()
        if inspect.isfunction(fn) and not name.startswith("_")
    }
    return methods, set(vars(protocol).get("__annotations__", {}))


def attributes(cls) -> set[str]:
    if attrs.has(cls):
        return {a.name for a in attrs.fields(cls)}
    return set(getattr(cls, "__slots__", ())) | set(vars(cls))


@pytest.mark.parametrize(("protocol", "cls"), [(Admitter, Dispatcher), (EngineLease, Lease), (EngineAddress, Endpoint)])
def test_the_dispatcher_side_has_every_method_and_attribute_the_http_path_uses(protocol, cls):
    methods, fields = asked(protocol)
    assert methods or fields
    for name, parameters in methods.items():
        assert callable(getattr(cls, name, None)), f"{cls.__name__} has no {name}(), which {protocol.__name__} asks for"
        assert list(inspect.signature(getattr(cls, name)).parameters) == parameters, (
            f"{cls.__name__}.{name} takes other arguments than {protocol.__name__}.{name}"
        )
    assert fields <= attributes(cls), f"{cls.__name__} lacks {sorted(fields - attributes(cls))}"
