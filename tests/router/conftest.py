"""Sim engines as real processes, and a router in the test's reactor in front of them."""

from __future__ import annotations

import pytest
import pytest_twisted
from routerharness import Router, SimProcess


@pytest.fixture(scope="module")
def sim():
    """A simulator with the defaults (answers at once), shared by a test module."""
    process = SimProcess()
    yield process
    process.stop()


@pytest.fixture
def start_sim():
    """start_sim(*flags) -> a SimProcess stopped at the end of the test."""
    started: list[SimProcess] = []

    def start(*args: str, **kw) -> SimProcess:
        process = SimProcess(*args, **kw)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()


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
