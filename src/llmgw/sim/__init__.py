"""llmgw's OpenAI-compatible engine simulator, for tests, demos and router benchmarks.

``python -m llmgw.sim --model NAME``.  An asyncio HTTP/1.1 server with no
dependency beyond the standard library (and attrs for its options), fast
enough that a router benchmarked in front of it measures the router.  The
modules, from the wire up: ``llmgw.http11`` (request parser, response bytes,
shared with the router), ``connection`` (keep-alive, pipelining, streaming,
aborts), ``api`` (OpenAI fields in, JSON bytes out), ``engine`` (``SimEngine``:
admission, pacing, failure injection), ``metrics``, ``options`` and
``server``.  See docs/sim.rst.
"""

from llmgw.sim.options import SimOptions

__all__ = ["SimOptions"]
