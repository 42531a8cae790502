"""A Ray-based stand-in for vLLM on rank 0: it answers only once a task ran on every node of the cluster.

Run by the Ray environment's Python as vLLM would be on rank 0 of a Ray
replica (``vllm serve MODEL --host H --port P --served-model-name NAME
--pipeline-parallel-size N ...``, with $RAY_ADDRESS naming the head).  Every
completion places one task on each alive node with node affinity and waits
for all N; a cluster with fewer nodes answers 503, so a reply proves the
cluster formed.  ``--version`` prints a version, as the agent's probe asks.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import sys
import time

TASK_TIMEOUT_S = 60


def main() -> None:
    if "--version" in sys.argv:
        print("0.0.1")
        return
    p = argparse.ArgumentParser()
    p.add_argument("command")
    p.add_argument("model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--served-model-name", required=True)
    p.add_argument("--pipeline-parallel-size", type=int, default=1)
    args, _ = p.parse_known_args()

    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)

    @ray.remote(num_cpus=0)
    def where() -> str:
        return ray.get_runtime_context().get_node_id()

    def nodes_answering() -> int:
        alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
        refs = [where.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n, soft=False)).remote()
                for n in alive]
        return len(set(ray.get(refs, timeout=TASK_TIMEOUT_S)))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                return self.answer(200, {})
            if self.path == "/v1/models":
                return self.answer(200, {"object": "list", "data": [
                    {"id": args.served_model_name, "object": "model", "created": 0, "owned_by": "raystandin"}]})
            self.answer(404, {"error": {"message": "no such path"}})

        def do_POST(self):
            self.rfile.read(min(int(self.headers.get("Content-Length", 0)), 1 << 20))
            try:
                count = nodes_answering()
            except Exception as e:  # a node that went away, a task that timed out
                return self.answer(503, {"error": {"message": f"the cluster did not answer: {e}"}})
            if count < args.pipeline_parallel_size:
                return self.answer(503, {"error": {"message": f"{count} of {args.pipeline_parallel_size} nodes"}})
            text = f"{count} nodes answered"
            usage = {"prompt_tokens": 1, "completion_tokens": 3, "total_tokens": 4}
            if self.path == "/v1/completions":
                body = {"id": "cmpl-ray", "object": "text_completion", "created": int(time.time()),
                        "model": args.served_model_name, "usage": usage,
                        "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}]}
            else:
                body = {"id": "chatcmpl-ray", "object": "chat.completion", "created": int(time.time()),
                        "model": args.served_model_name, "usage": usage,
                        "choices": [{"index": 0, "finish_reason": "stop",
                                     "message": {"role": "assistant", "content": text}}]}
            self.answer(200, body)

        def answer(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *a):
            pass

    print(f"raystandin: serving {args.served_model_name} on {args.host}:{args.port}", flush=True)
    http.server.ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()


if __name__ == "__main__":
    main()
