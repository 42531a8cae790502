"""An agent that can be killed: a real Supervisor in a process of its own.

    standin_agent.py STATE_DIR SHARD_ID [ENGINE ARGS...]

Starts one stand-in engine and prints every report as a JSON line on stdout.
The test kills this process with SIGKILL to find out what its engine does
when its agent dies without a word.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from twisted.internet import reactor

from llmgw.agent.supervisor import Supervisor
from llmgw.engines.base import LaunchPlan
from llmgw.records import ShardSpec

ENGINE = Path(__file__).with_name("standin_engine.py")


def main() -> None:
    state_dir, shard_id, *engine_args = sys.argv[1:]

    def plan(spec, port):
        return LaunchPlan(argv=[sys.executable, str(ENGINE), "--port", str(port), *engine_args])

    def report(status):
        print(json.dumps({"state": status.state, "pid": status.pid, "endpoint": status.endpoint}), flush=True)

    sup = Supervisor(reactor, Path(state_dir), plan, report, poll_interval=0.05, health_interval=0.05)
    spec = ShardSpec(shard_id=shard_id, replica_id=shard_id.rsplit("/", 1)[0], model=shard_id.split("/")[0],
                     engine="standin")
    reactor.callWhenRunning(sup.start, spec)
    reactor.run()


if __name__ == "__main__":
    main()
