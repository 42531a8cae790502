"""`llmgw ctl top`: the latest bucket of the fleet's figures, per model, per key and per node.

It reads ``llmgw.cp.figures`` for the newest closed bucket (10 s by
default, ``history.series_bucket_s``): requests, tokens in and out, time to
first token p50/p99, errors and queue per model; requests and tokens per API
key; memory, GPU utilisation and GPU memory per node.  A figure nobody
reported is ``-``.  ``-f`` asks again each bucket.  Names are escaped
(``render.said``): they are what routers and nodes sent.
"""

from __future__ import annotations

import json
import sys
import time

from llmgw.history import PAGE_MOST, Figures, Scope
from llmgw.link import uris
from llmgw.render import DASH, said
from llmgw.text import printable

#: Each table's columns: (header, series name, digits after the point).
MODEL_COLUMNS = (
    ("REQ/S", "requests_per_s", 1), ("TOK/S IN", "tokens_in_per_s", 0), ("TOK/S OUT", "tokens_out_per_s", 0),
    ("TTFT P50", "ttft_p50_ms", 0), ("TTFT P99", "ttft_p99_ms", 0), ("ERR/S", "errors_per_s", 2),
    ("QUEUE", "queue", 0),
)
KEY_COLUMNS = (("REQ/S", "requests_per_s", 1), ("TOK/S", "tokens_per_s", 0))
NODE_COLUMNS = (("MEM %", "memory_used_pct", 0), ("GPU %", "gpu_util_pct", 0), ("GPU MEM %", "gpu_memory_used_pct", 0))
_TABLES = ((Scope.MODEL, "MODEL", MODEL_COLUMNS), (Scope.KEY, "KEY", KEY_COLUMNS), (Scope.NODE, "NODE", NODE_COLUMNS))
#: What a terminal is sent before each refresh of ``-f``: home and clear.
CLEAR = "\x1b[H\x1b[2J"


def add_parser(sub, run) -> None:
    top = sub.add_parser("top", help="the latest figures per model, key and node (10 s buckets)")
    top.add_argument("--json", action="store_true",
                     help="print a JSON object: per scope, per name, each figure (null: not reported)")
    top.add_argument("-f", "--watch", action="store_true", help="print them again each bucket (Ctrl-C stops)")
    top.set_defaults(func=run(cmd_top))


def latest(figures: Figures) -> dict[Scope, dict[str, dict[str, float | None]]]:
    """Each subject's figures in *figures*' newest bucket, by scope and name."""
    out: dict[Scope, dict[str, dict[str, float | None]]] = {scope: {} for scope in Scope}
    for series in figures.series:
        out[series.scope].setdefault(series.subject, {})[series.name] = series.points[-1] if series.points else None
    return out


def _figure(value: float | None, digits: int) -> str:
    return DASH if value is None else f"{value:,.{digits}f}"


def top_text(figures: Figures, now: float | None = None) -> str:
    """The tables ``ctl top`` prints: a line saying which bucket, then models, keys (if any) and nodes."""
    from llmgw.ctl.tables import table

    now = time.time() if now is None else now
    ago = max(0.0, now - figures.end)
    lines = [f"the {figures.bucket_s:g} s to {time.strftime('%H:%M:%S', time.localtime(figures.end))} "
             f"({ago:.0f} s ago); - is not reported"]
    if len(figures.series) >= PAGE_MOST:
        lines.append(f"(the first {PAGE_MOST} series only, models first: the most one answer holds)")
    figures_by = latest(figures)
    for scope, title, columns in _TABLES:
        subjects = figures_by[scope]
        if not subjects:
            if scope is not Scope.KEY:
                lines += ["", f"no {scope.value} has figures in this bucket"]
            continue
        rows = [(said(name), *(_figure(values.get(series), digits) for _, series, digits in columns))
                for name, values in sorted(subjects.items())]
        lines += ["", table((title, *(header for header, _, _ in columns)), rows)]
    return "\n".join(lines)


def top_json(figures: Figures) -> dict:
    """``--json``: {"bucket_s", "end", "model": {name: {series: value}}, "key": ..., "node": ...}.

    Each figure to the six digits the server keeps (a float32: 4.9, not 4.900000095367432).
    """
    by = latest(figures)
    rounded = {scope.value: {name: {series: None if v is None else float(f"{v:.6g}") for series, v in values.items()}
                             for name, values in by[scope].items()} for scope in Scope}
    return {"bucket_s": figures.bucket_s, "end": figures.end, **rounded}


async def cmd_top(session, args) -> int:
    from twisted.internet import reactor, task

    from llmgw.ctl.main import decode

    while True:
        figures = decode(Figures, await session.call(uris.CP_FIGURES, buckets=1), uris.CP_FIGURES)
        if args.json:
            # One object; with -f, one a line.
            json.dump(top_json(figures), sys.stdout, indent=None if args.watch else 2)
            print(flush=True)
        else:
            clear = CLEAR if args.watch and sys.stdout.isatty() else ""
            print(clear + printable(top_text(figures), keep="\n") + ("\n" if args.watch and not clear else ""),
                  flush=True)
        if not args.watch:
            return 0
        # Just after the next bucket closes, which the server does within a second of its end.
        wait = figures.end + figures.bucket_s - reactor.seconds() + 1.0
        await task.deferLater(reactor, min(max(wait, 1.0), figures.bucket_s + 1.0), lambda: None)
