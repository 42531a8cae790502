"""schemathesis over the Responses operations of OpenAI's published OpenAPI document: the router answers no 5xx.

tests/fixtures/openapi/responses.yaml is the pinned cut of that document (its
README says from where); nothing is fetched at run time.  schemathesis runs as
a user runs it, its command line against a real llmgw-router in front of the
simulator, each body sent for the simulator's model (tests/support/openapi_hooks.py)
so that it is translated, not refused for its model.  Bounded (examples per
operation, a seed, one worker: schemathesis's workers are threads, and two of
them parsing hypothesis's lambdas at once broke CPython 3.11's ast module
here) to stay under a minute; the same seed gives the same requests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.routerproc import RouterProcess
from tests.support.sim import MODEL, SimProcess

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "tests" / "fixtures" / "openapi" / "responses.yaml"
# Examples per operation: about 20 s for the seven operations on a 2-core machine.  The coverage phase
# (thousands of boundary cases, 90 s and more) is left out.
MAX_EXAMPLES = 25
SEED = 30
TIMEOUT_S = 120


@pytest.fixture
def router(tmp_path):
    sim = SimProcess()
    try:
        with RouterProcess(tmp_path, {MODEL: sim.base_url}) as router:
            yield router, sim
    finally:
        sim.stop()


def translated(sim: SimProcess) -> int:
    """The chat completions the simulator answered 200: requests the router translated and sent on."""
    return int(sim.metrics().get('llmgw_sim_requests_total{status="200"}', 0))


def schemathesis(router: RouterProcess, report: Path, *only: str, servable: bool = False) -> str:
    """Run schemathesis's command line over the pinned operations; its output, once it passed."""
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.support.openapi_hooks", "LLMGW_SCHEMATHESIS_MODEL": MODEL,
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "src")]), "NO_COLOR": "1"}
    if servable:
        env["LLMGW_SCHEMATHESIS_SERVABLE"] = "1"
    argv = [sys.executable, "-m", "schemathesis.cli", "run", str(SPEC), "--url", router.base_url + "/v1",
            "--checks", "not_a_server_error", "--max-examples", str(MAX_EXAMPLES), "--seed", str(SEED),
            "--request-timeout", "10", "--workers", "1", "--no-shrink", "--phases", "examples,fuzzing",
            "-H", "Authorization: Bearer sk-test", "--report", "junit", "--report-dir", str(report), *only]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=report.parent, env=env,
                          stdin=subprocess.DEVNULL)
    said = f"{done.stdout[-6000:]}\n{done.stderr[-3000:]}\nthe router's log:\n{router.output()[-3000:]}"
    assert done.returncode == 0, said
    return said


@pytest.mark.slow
def test_no_responses_operation_gets_a_server_error(router, tmp_path):
    router, _ = router
    schemathesis(router, tmp_path / "report")


@pytest.mark.slow
def test_generated_bodies_llmgw_serves_are_translated_without_a_server_error(router, tmp_path):
    router, sim = router
    said = schemathesis(router, tmp_path / "report", "--include-method", "POST", "--include-path", "/responses",
                        servable=True)
    # The run proves something only if generated bodies went through the translation to the engine.
    assert translated(sim) > 0, f"no generated request reached the simulator:\n{said}"
