"""The OpenAI surface as a client meets it: a real llmgw-router in front of the simulator and the tool engine.

``surface`` (a fixture shared by a test module) is a ``Surface``: one
``llmgw-router`` process (tests/support/routerproc.py) serving ``SIM``, the
simulator that echoes its prompt, and ``TOOLS``, the stand-in engine that
calls tools and writes JSON schemas (tests/support/toolengine.py).  A module
imports it: ``from tests.support.surface import surface  # noqa: F401``.
"""

from __future__ import annotations

import attrs
import pytest

from tests.support.routerproc import RouterProcess
from tests.support.sim import MODEL as SIM
from tests.support.sim import SimProcess
from tests.support.toolengine import MODEL as TOOLS
from tests.support.toolengine import ToolEngineProcess

__all__ = ["SIM", "TOOLS", "Surface", "surface"]


@attrs.frozen
class Surface:
    router: RouterProcess
    sim: SimProcess
    tools: ToolEngineProcess

    @property
    def base_url(self) -> str:
        """The API's base URL as the clients take it, ``/v1`` included."""
        return self.router.base_url + "/v1"


@pytest.fixture(scope="module")
def surface(tmp_path_factory):
    sim = SimProcess()
    tools = ToolEngineProcess()
    router = None
    try:
        router = RouterProcess(tmp_path_factory.mktemp("surface"), {SIM: sim.base_url, TOOLS: tools.base_url}).start()
        yield Surface(router, sim, tools)
    finally:
        for part in (router, tools, sim):
            if part is not None:
                part.stop()
