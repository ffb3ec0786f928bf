"""What a served prompt's prefill costs, server against server: milliseconds per prompt token to a one-token answer.

Sends fresh long prompts (a slice of this repository's scheduler source, tagged with the server's name, the round and
the time, so no prompt cache holds more than the chat template's start) one at a time to each server in turn, the order
reversed every round, each as a greedy chat request with max_tokens 1, and prints per request the prompt tokens (the
server's `usage`) and the wall time over them; then per server the median over the rounds. With one token to answer, the
time is the prompt's prefill and the server's fixed costs. Used to check whether exact mode's prefill is what keeps
spekula serve behind llama-server at concurrency 4 on a CPU without AVX-512 (docs/BENCHMARKS.md, "At concurrency 4"). An
experiment, not a maintained tool (scripts/experiments/README.md).

    .venv/bin/python -m spekula serve --target qwen2.5-coder-1.5b --threads 2 --draft none --port 8501 &
    .venv/bin/llama-server -m GGUF -t 2 -tb 2 -np 4 -c 16384 --port 8503 &
    .venv/bin/python scripts/experiments/served_prefill.py exact=http://127.0.0.1:8501 ls=http://127.0.0.1:8503
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
import urllib.request
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "src" / "spekula" / "server" / "scheduler.py"


def served_model(url: str) -> str:
    """The id of the model a server runs, from its /v1/models (spekula serve refuses a request for another)."""
    with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=60) as response:
        return json.load(response)["data"][0]["id"]


def one_prefill(url: str, model: str, text: str) -> tuple[int, float]:
    """(prompt tokens, seconds) of one greedy chat request for one token."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Summarise:\n" + text}],
        "max_tokens": 1,
        "temperature": 0,
    }
    request = urllib.request.Request(
        url.rstrip("/") + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        answer = json.load(response)
    return answer["usage"]["prompt_tokens"], time.perf_counter() - started


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("servers", nargs="+", help="NAME=URL, e.g. exact=http://127.0.0.1:8501")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--words", type=int, default=500, help="words of source text a prompt carries")
    args = ap.parse_args()
    servers = dict(s.split("=", 1) for s in args.servers)
    models = {name: served_model(url) for name, url in servers.items()}
    words = SOURCE.read_text().split()
    costs: dict[str, list[float]] = {name: [] for name in servers}
    for r in range(args.rounds):
        for name in list(servers) if r % 2 == 0 else list(servers)[::-1]:
            start = random.Random(f"{name}/{r}").randrange(len(words) - args.words)
            text = f"[{name} {r} {time.time()}] " + " ".join(words[start : start + args.words])
            tokens, seconds = one_prefill(servers[name], models[name], text)
            costs[name].append(1000 * seconds / tokens)
            print(f"{name} round {r}: {tokens} prompt tokens in {seconds:.2f} s, {costs[name][-1]:.2f} ms a token")
    for name, values in costs.items():
        each = ", ".join(f"{v:.1f}" for v in values)
        print(f"{name}: median {statistics.median(values):.2f} ms a prompt token ({each})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
