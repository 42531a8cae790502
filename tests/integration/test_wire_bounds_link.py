"""A node that reports impossible figures over real TLS is told which field, and /metrics keeps answering.

On main, one heartbeat with a memory of 10**400 was taken, and every later
scrape of /metrics answered 500 for the whole cluster.
"""

from __future__ import annotations

import math
import urllib.request

import pytest
import pytest_twisted
from autobahn.wamp.exception import ApplicationError
from twisted.internet import reactor, threads

from llmgw.huburl import parse_hub_url
from llmgw.link import uris
from llmgw.link.client import connect_once
from llmgw.tlsfiles import TLSFiles

pytestmark = pytest.mark.integration


def scrape(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as answer:
        return answer.status, answer.read().decode()


@pytest_twisted.ensureDeferred
async def test_impossible_figures_are_refused_naming_the_field_and_metrics_still_answers(cluster):
    cluster.start_server()
    pki = cluster.pki
    node = await connect_once(reactor, parse_hub_url(cluster.hub),
                              TLSFiles(str(pki / "ca.crt"), str(pki / "node01.crt"), str(pki / "node01.key")), timeout=10)
    try:
        await node.call(uris.AGENT_REGISTER, {"node_id": "node01", "memory_total_bytes": 8 * 2**30})
        refused = {}
        for uri, payload in [
            (uris.AGENT_HEARTBEAT, {"memory_total_bytes": 10**400}),
            (uris.AGENT_HEARTBEAT, {"gpus": [{"index": 0, "utilization_pct": 1000}]}),
            (uris.AGENT_HEARTBEAT, {"memory_available_bytes": -1}),
            (uris.AGENT_PROGRESS, {"source": "https://x/m.gguf", "file_name": "m.gguf", "bytes_done": 1,
                                   "rate_bps": math.nan}),
        ]:
            with pytest.raises(ApplicationError) as e:
                await node.call(uri, payload)
            assert e.value.error == uris.ERROR_INVALID_ARGUMENT
            refused[uri, str(sorted(payload))] = e.value.args[0]
        assert list(refused.values()) == [
            "Heartbeat.memory_total_bytes: 10**400 is above 2**60, the most it may be",
            "Heartbeat.gpus[0].utilization_pct: 1000 is above 100, the most it may be",
            "Heartbeat.memory_available_bytes: -1 is below 0, the least it may be",
            "Progress.rate_bps: nan is not a finite number",
        ]
        status, text = await threads.deferToThread(scrape, cluster.admin)
        assert status == 200
        # The node's last good figures stand.
        assert 'llmgw_node_memory_total_bytes{node="node01"} 8.589934592e+09' in text
    finally:
        node.leave()
