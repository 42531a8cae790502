"""The simulator's command line: ``python -m llmgw.sim --model NAME [knobs]``."""

from __future__ import annotations

import argparse
from typing import Sequence

import attrs

from llmgw.verbose import VERBOSE_ENV, verbose_logs
from llmgw.http11 import MAX_BODY_BYTES


@attrs.frozen
class SimOptions:
    model: str
    host: str = "127.0.0.1"
    port: int = 8000
    ttft_ms: float = 0.0
    tokens_per_s: float = 0.0
    output_tokens: int = 16
    fail_rate: float = 0.0
    fail_after: int | None = None
    startup_delay_ms: float = 0.0
    max_concurrency: int | None = None
    kv_cache_tokens: int = 65536
    embedding_dims: int = 16
    max_body_bytes: int = MAX_BODY_BYTES
    seed: int = 0
    log_requests: bool = True
    #: Whether /health and /metrics (the agent's and router's polls, every second) get a line too.
    log_polls: bool = False


def _number(convert, check, what: str):
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        if not check(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
        return value

    return parse


_count = _number(int, lambda v: v >= 0, "a whole number, 0 or more")
_positive = _number(int, lambda v: v >= 1, "a whole number, 1 or more")
# "not v < 0" would let NaN through; "v >= 0" refuses it.
_duration = _number(float, lambda v: 0 <= v < float("inf"), "a duration in milliseconds, 0 or more")
_rate = _number(float, lambda v: 0 <= v < float("inf"), "a rate, 0 or more (0: as fast as possible)")
_fraction = _number(float, lambda v: 0 <= v <= 1, "a fraction from 0 to 1")


def _name(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("the model name is empty")
    return text


def parser() -> argparse.ArgumentParser:
    """The simulator's parser; every option by its whole name, as llama.cpp's parser reads them.

    argparse's abbreviations (``--hos`` for ``--host``) would let a profile's
    args, which come after llmgw's, move the address llmgw listens the shard
    on: no option is read by a prefix (``allow_abbrev=False``).
    """
    p = argparse.ArgumentParser(
        prog="python -m llmgw.sim",
        description="llmgw's OpenAI-compatible engine simulator, for tests, demos and router benchmarks.",
        allow_abbrev=False,
    )
    p.add_argument("--model", type=_name, required=True, help="the one model name served; other names get 404 model_not_found")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=_count, default=8000, help="port (default 8000; 0 picks a free one, printed)")
    p.add_argument("--ttft-ms", type=_duration, default=0.0, help="time to first token, ms (default 0)")
    p.add_argument("--tokens-per-s", type=_rate, default=0.0, help="tokens per second after the first (default 0: as fast as possible)")
    p.add_argument("--output-tokens", type=_count, default=16, help="tokens generated per request (default 16); max_tokens caps it")
    p.add_argument("--fail-rate", type=_fraction, default=0.0, help="fraction of inference requests answered 500 (default 0)")
    p.add_argument("--fail-after", type=_positive, default=None, metavar="N", help="exit with code 1 after answering N inference requests")
    p.add_argument("--startup-delay-ms", type=_duration, default=0.0, help="time before /health turns 200 (default 0)")
    p.add_argument("--max-concurrency", type=_positive, default=None, metavar="N", help="requests generated at once; more wait (default: no limit)")
    p.add_argument("--kv-cache-tokens", type=_positive, default=65536, help="KV-cache capacity behind vllm:gpu_cache_usage_perc (default 65536)")
    p.add_argument("--embedding-dims", type=_positive, default=16, help="length of /v1/embeddings vectors (default 16)")
    p.add_argument("--max-body-bytes", type=_positive, default=MAX_BODY_BYTES, help=f"larger request bodies get 413 (default {MAX_BODY_BYTES})")
    p.add_argument("--seed", type=int, default=0, help="seed for --fail-rate's draws (default 0)")
    logging = p.add_mutually_exclusive_group()
    logging.add_argument("--log-requests", dest="log_requests", action="store_true", default=True, help="one line per request on stdout (the default)")
    logging.add_argument("--quiet", dest="log_requests", action="store_false", help="no line per request")
    p.add_argument("--log-polls", action="store_true", default=verbose_logs(),
                   help=f"a line for /health and /metrics requests too (default: only when {VERBOSE_ENV}=1)")
    return p


def parse(argv: Sequence[str] | None = None) -> SimOptions:
    args = parser().parse_args(argv)
    return SimOptions(
        model=args.model,
        host=args.host,
        port=args.port,
        ttft_ms=args.ttft_ms,
        tokens_per_s=args.tokens_per_s,
        output_tokens=args.output_tokens,
        fail_rate=args.fail_rate,
        fail_after=args.fail_after,
        startup_delay_ms=args.startup_delay_ms,
        max_concurrency=args.max_concurrency,
        kv_cache_tokens=args.kv_cache_tokens,
        embedding_dims=args.embedding_dims,
        max_body_bytes=args.max_body_bytes,
        seed=args.seed,
        log_requests=args.log_requests,
        log_polls=args.log_polls,
    )
