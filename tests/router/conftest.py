"""Sim engines as real processes (tests/support/sim.py), and a router in the test's reactor in front of them."""

from __future__ import annotations

import pytest_twisted

from tests.support.sim import sim, start_sim  # noqa: F401 - fixtures

from .routerharness import Router


@pytest_twisted.async_yield_fixture
async def make_router():
    """make_router(dispatcher, **RouterFactory options) -> a Router listening on 127.0.0.1, stopped after the test."""
    routers: list[Router] = []

    def make(dispatcher, **kw) -> Router:
        router = Router(dispatcher, **kw)
        routers.append(router)
        return router

    yield make
    for router in routers:
        await router.stop()
