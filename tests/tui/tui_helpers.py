"""Reading what the dashboard shows, and waiting for it with a deadline."""

from __future__ import annotations

import io
from typing import Any, Callable

from rich.console import Console

from llmgw.states import EngineState, ReplicaState
from llmgw.tui.fake import FakeBackend, llama_cpp, node_view, replica_view
from tests.support.wait import until_async

GB = 1_000_000_000
NOW = 1000.0


def screen_text(app) -> str:
    """The current screen as plain text, as `export_screenshot` would draw it."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True,
                      color_system="truecolor", record=True, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens, simplify=True))
    return console.export_text()


async def until(pilot, predicate: Callable[[], Any], what: str, timeout: float = 5.0):
    """Pump the app until *predicate* is true; fail naming *what*, with the screen, at the deadline."""
    return await until_async(predicate, what, timeout, pause=pilot.pause,
                             detail=lambda: f"the screen:\n{screen_text(pilot.app)}")


def rows(app, pane: str) -> dict[str, list[str]]:
    """The rows a table pane shows, by key, as plain text, in display order."""
    table = app.screen.query_one(f"#{pane}").table
    out = {}
    for index in range(table.row_count):
        key = table.coordinate_to_cell_key((index, 0)).row_key.value
        out[key] = [str(cell) for cell in table.get_row_at(index)]
    return out


def column(app, pane: str, key: str, name: str) -> str | None:
    from llmgw.tui import columns

    names = [k for k, _ in (columns.NODE_COLUMNS if pane == "nodes" else columns.REPLICA_COLUMNS)]
    row = rows(app, pane).get(key)
    return None if row is None else row[names.index(name)]


def small_fleet() -> FakeBackend:
    """Three nodes (one old agent, one without AVX2 whose llama.cpp is broken) and four replicas, one fetching its weights."""
    nodes = [
        node_view("node01"),
        node_view("node02", cpu={"model": "Intel Atom C3758", "logical_cores": 8, "avx2": False},
                  warnings=["CPU has no AVX2: llama.cpp runs several times slower here"], gpus=[], address="10.0.0.2",
                  engines=[llama_cpp("b6000", EngineState.BROKEN,
                                     "needs libgomp.so.1, which this node does not have: apt-get install libgomp1")]),
        # An agent too old to report most things: every figure is None.
        node_view("node03", address=None, cpu=None, memory_total_bytes=None, memory_available_bytes=None,
                  gpus=None, filesystems=None, engines=None, agent_version=None, protocol=None,
                  state="unreachable", reason="no heartbeat for 20 s", seen_ago_s=20.0),
    ]
    replicas = [
        replica_view("echo/0", "node01", endpoint="http://10.0.0.1:8100"),
        replica_view("echo/1", None, reason="no node fits: node01 has 80 GB of GPU memory free, needs 140"),
        replica_view("llama/0", "node01", state=ReplicaState.FAILED,
                     reason="node01: engine exited with status 1 (next try in 30 s)"),
        replica_view("qwen/0", "node01", state=ReplicaState.FETCHING,
                     reason="node01: downloading model-00002.safetensors 6000/16000 MB, 250 MB/s",
                     progress={"source": "https://models.example/qwen/model-00002.safetensors", "bytes_done": 6 * GB,
                               "bytes_total": 16 * GB, "rate_bps": 250e6, "file_name": "model-00002.safetensors"}),
    ]
    logs = {
        ("node01", None): [f"agent line {i}" for i in range(1, 6)],
        ("node01", "echo/0/0"): ["engine says hello"],
    }
    return FakeBackend(nodes, replicas, logs)


def fixed_clock() -> float:
    return NOW
