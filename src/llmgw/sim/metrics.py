"""The simulator's /metrics: vLLM's load gauges and llmgw_sim_* counters, Prometheus text format.

The gauges carry vLLM's names and its ``model_name`` label so that whatever
reads an engine's load from vLLM reads it from the simulator unchanged.
Written out by hand: prometheus_client's registry would be the only reason to
import it here, and this is the whole format.
"""

from __future__ import annotations

CONTENT_TYPE = b"text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


class SimMetrics:
    """Counters since the process started; the gauges are read from the simulator at scrape time."""

    def __init__(self, model: str):
        self._model_label = '{model_name="%s"}' % _label(model)
        # HTTP status -> responses, /health and /metrics not counted.
        self.requests: dict[int, int] = {}
        self.aborted = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0

    def count(self, status: int) -> None:
        self.requests[status] = self.requests.get(status, 0) + 1

    def render(self, *, running: int, waiting: int, cache_usage: float) -> bytes:
        m = self._model_label
        lines = [
            "# HELP vllm:num_requests_running Requests being generated.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{m} {running}",
            "# HELP vllm:num_requests_waiting Requests waiting for a slot (--max-concurrency).",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{m} {waiting}",
            "# HELP vllm:gpu_cache_usage_perc KV-cache usage, 0 to 1: tokens of running requests over --kv-cache-tokens.",
            "# TYPE vllm:gpu_cache_usage_perc gauge",
            f"vllm:gpu_cache_usage_perc{m} {_number(cache_usage)}",
            "# HELP vllm:prompt_tokens_total Prompt tokens of requests admitted.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{m} {self.prompt_tokens}",
            "# HELP vllm:generation_tokens_total Tokens generated, including those of aborted requests.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{m} {self.generation_tokens}",
            "# HELP llmgw_sim_requests_total Responses started, by HTTP status (not counting /health and /metrics).",
            "# TYPE llmgw_sim_requests_total counter",
        ]
        for status in sorted(self.requests):
            lines.append(f'llmgw_sim_requests_total{{status="{status}"}} {self.requests[status]}')
        lines += [
            "# HELP llmgw_sim_aborted_total Requests whose client went away before the response finished.",
            "# TYPE llmgw_sim_aborted_total counter",
            f"llmgw_sim_aborted_total {self.aborted}",
        ]
        return ("\n".join(lines) + "\n").encode()
