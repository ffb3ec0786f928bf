"""Load test: N concurrent streaming clients for a bounded time against a local spekula server.

Two ways to run it:

    # in-process: load the models once, serve them on loopback twice (speculation on, then off,
    # same weights), and compare
    .venv/bin/python scripts/load_test.py --target smollm2-135m --draft smollm2-135m --clients 16 --duration 60

    # against a server that is already running (one configuration; run it twice to compare)
    .venv/bin/python scripts/load_test.py --url http://127.0.0.1:8000 --clients 16 --duration 60

Each client sends greedy streaming completions back to back (prompts taken round-robin from a
built-in list) until --duration has passed; requests still running then are allowed to finish.
Tokens are the server's own count (usage.completion_tokens in the last chunk) for every
configuration alike. Throughput = output tokens of completed requests / wall time from the first
request to the last answer. Latency: arrival to last chunk; TTFT: arrival to the first chunk that
carries text, both measured on the client (queue time included). In the comparison, every prompt
answered by both configurations must have the same text (greedy decoding is lossless).

Prints a human-readable card, then one JSON line (the last line of stdout).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

PROMPTS = [
    "def quicksort(arr):",
    "Write a haiku about the sea.\n",
    "def parse_csv_line(line: str) -> list[str]:",
    "The three laws of thermodynamics are",
    "class Stack:\n    def __init__(self):",
    "Q: What is the capital of France?\nA:",
    "import json\n\ndef load_config(path):",
    "Once upon a time, in a small village,",
    "def fibonacci(n: int) -> int:\n    \"\"\"Return the n-th Fibonacci number.\"\"\"",
    "SELECT name, email FROM users WHERE",
    "The difference between a list and a tuple in Python is",
    "def is_prime(n):",
    "To make a cup of tea, first",
    "for i in range(10):\n    print(",
    "Photosynthesis is the process by which",
    "def binary_search(items, target):",
]


@dataclass
class Outcome:
    prompt: int
    ok: bool
    latency_s: float = 0.0
    ttft_s: float | None = None
    tokens: int = 0
    text: str = ""
    error: str = ""


@dataclass
class RunResult:
    label: str
    outcomes: list[Outcome] = field(default_factory=list)
    wall_s: float = 0.0
    server: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        ok = [o for o in self.outcomes if o.ok]
        tokens = sum(o.tokens for o in ok)
        lat = [o.latency_s for o in ok]
        ttft = [o.ttft_s for o in ok if o.ttft_s is not None]
        drafted, accepted = self.server.get("drafted", 0.0), self.server.get("accepted", 0.0)
        passes = self.server.get("target_passes", 0.0)
        return {
            "label": self.label,
            "requests_ok": len(ok),
            "requests_failed": len(self.outcomes) - len(ok),
            "errors": sorted({o.error for o in self.outcomes if not o.ok})[:5],
            "output_tokens": tokens,
            "wall_s": self.wall_s,
            "throughput_tok_s": tokens / self.wall_s if self.wall_s > 0 else None,
            "requests_per_s": len(ok) / self.wall_s if self.wall_s > 0 else None,
            "latency_p50_s": _pct(lat, 50), "latency_p99_s": _pct(lat, 99),
            "ttft_p50_s": _pct(ttft, 50), "ttft_p99_s": _pct(ttft, 99),
            # server-side, from /metrics (RequestStats definitions): alpha = accepted / drafted, tau = 1 + accepted / passes
            "alpha": accepted / drafted if drafted else None,
            "tau": 1 + accepted / passes if passes else None,
            "steps_by_k": {k: v for k, v in self.server.items() if k.startswith("k=")},
        }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[min(98, max(0, int(q) - 1))]


async def one_request(http: httpx.AsyncClient, url: str, model: str, prompt_index: int, max_tokens: int, timeout: float) -> Outcome:
    body = {"model": model, "prompt": PROMPTS[prompt_index], "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    out = Outcome(prompt_index, ok=False)
    text: list[str] = []
    try:
        async with http.stream("POST", url + "/v1/completions", json=body, timeout=timeout) as r:
            if r.status_code != 200:
                out.error = f"HTTP {r.status_code}"
                await r.aread()
                return out
            async for line in r.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    out.error = chunk["error"].get("code") or "error event"
                    return out
                for choice in chunk.get("choices", []):
                    if choice.get("text"):
                        if out.ttft_s is None:
                            out.ttft_s = time.perf_counter() - start
                        text.append(choice["text"])
                if chunk.get("usage"):
                    out.tokens = chunk["usage"]["completion_tokens"]
        out.ok = True
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        out.error = type(e).__name__
    finally:
        out.latency_s = time.perf_counter() - start
        out.text = "".join(text)
    return out


async def drive(url: str, label: str, clients: int, duration: float, max_tokens: int, timeout: float, api_key: str | None) -> RunResult:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=clients + 2)
    async with httpx.AsyncClient(headers=headers, limits=limits) as http:
        model = (await http.get(url + "/v1/models")).json()["data"][0]["id"]
        before = await server_counters(http, url)
        result = RunResult(label)
        start = time.perf_counter()
        deadline = start + duration

        async def client(c: int) -> None:
            i = c
            while time.perf_counter() < deadline:
                result.outcomes.append(await one_request(http, url, model, i % len(PROMPTS), max_tokens, timeout))
                i += clients

        await asyncio.gather(*(client(c) for c in range(clients)))
        result.wall_s = time.perf_counter() - start
        after = await server_counters(http, url)
        result.server = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
        return result


async def server_counters(http: httpx.AsyncClient, url: str) -> dict[str, float]:
    names = {
        "spekula_spec_decode_num_draft_tokens_total": "drafted",
        "spekula_spec_decode_num_accepted_tokens_total": "accepted",
        "spekula_spec_decode_num_target_passes_total": "target_passes",
    }
    out: dict[str, float] = {}
    for line in (await http.get(url + "/metrics")).text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name in names:
            out[names[name]] = float(value)
        elif name.startswith('spekula_spec_decode_steps_total{k="'):
            out["k=" + name.split('"')[1]] = float(value)
    return out


def card(results: list[dict[str, Any]], mismatches: int | None) -> str:
    def f(x, digits=2):
        return "n/a" if x is None else f"{x:.{digits}f}"

    lines = [f"{'config':<14}{'ok':>5}{'fail':>5}{'tok/s':>9}{'req/s':>7}{'p50 lat':>9}{'p99 lat':>9}{'p50 ttft':>10}{'p99 ttft':>10}{'alpha':>7}{'tau':>6}"]
    for r in results:
        lines.append(
            f"{r['label']:<14}{r['requests_ok']:>5}{r['requests_failed']:>5}{f(r['throughput_tok_s'], 1):>9}{f(r['requests_per_s']):>7}"
            f"{f(r['latency_p50_s']):>9}{f(r['latency_p99_s']):>9}{f(r['ttft_p50_s']):>10}{f(r['ttft_p99_s']):>10}{f(r['alpha']):>7}{f(r['tau']):>6}"
        )
        if r["steps_by_k"]:
            lines.append(f"{'':<14}steps by k: " + ", ".join(f"{k} {int(v)}" for k, v in sorted(r["steps_by_k"].items()) if v))
    if mismatches is not None:
        lines.append(f"greedy outputs compared across configurations: {mismatches} mismatch(es)")
    return "\n".join(lines)


def compare_texts(a: RunResult, b: RunResult) -> int:
    first = {o.prompt: o.text for o in a.outcomes if o.ok}
    return sum(1 for o in b.outcomes if o.ok and o.prompt in first and first[o.prompt] != o.text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="a running server (e.g. http://127.0.0.1:8000); default: start one in-process")
    p.add_argument("--target", default="smollm2-135m")
    p.add_argument("--draft", default="smollm2-135m", help="the 'speculation on' proposer; 'off' is the same target with no draft")
    p.add_argument("--k", default="auto", help="draft length or 'auto' (default)")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--backend", default=None, help="how the target runs (default: as `spekula serve`, native)")
    p.add_argument("--draft-backend", default=None, help="how the draft runs (default: as `spekula serve`)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--duration", type=float, default=30.0, help="seconds during which clients start new requests")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--api-key", default=None)
    p.add_argument("--only", choices=("on", "off"), default=None, help="in-process: run one configuration only")
    args = p.parse_args(argv)

    def run(url: str, label: str) -> RunResult:
        print(f"{label}: {args.clients} clients for {args.duration:g} s against {url} ...", file=sys.stderr, flush=True)
        return asyncio.run(drive(url, label, args.clients, args.duration, args.max_tokens, args.request_timeout, args.api_key))

    runs: list[RunResult] = []
    if args.url:
        runs.append(run(args.url.rstrip("/").removesuffix("/v1"), "endpoint"))
    else:
        from spekula.config import BackendConfig, SpecConfig
        from spekula.pipeline import DEFAULT_RUNTIME, Pipeline, draft_backend_config
        from spekula.server.app import create_app
        from spekula.server.background import serving
        from spekula.server.settings import ServerSettings

        k = None if args.k == "auto" else int(args.k)
        print(f"loading {args.target} with draft {args.draft} ...", file=sys.stderr, flush=True)
        target = BackendConfig(dtype=args.dtype, threads=args.threads, runtime=args.backend or DEFAULT_RUNTIME)
        on = Pipeline.load(args.target, args.draft, SpecConfig(k=k), target, draft_backend_config(args.draft, target, args.draft_backend))
        on.warmup()
        off = Pipeline(on.target, on.codec, None, on.spec, draft_name="none")  # same weights, no proposer
        settings = ServerSettings(max_running=args.clients, max_queue=args.clients, request_timeout_s=args.request_timeout)
        for label, pipe in (("spec-on", on), ("spec-off", off)):
            if args.only and label != f"spec-{args.only}":
                continue
            with serving(create_app(pipe, settings)) as running:
                runs.append(run(running.url, label))

    summaries = [r.summary() for r in runs]
    mismatches = compare_texts(runs[0], runs[1]) if len(runs) == 2 else None
    print(card(summaries, mismatches))
    out: dict[str, Any] = {"clients": args.clients, "duration_s": args.duration, "max_tokens": args.max_tokens, "results": summaries}
    if len(summaries) == 2 and summaries[1]["throughput_tok_s"]:
        out["throughput_ratio_on_off"] = summaries[0]["throughput_tok_s"] / summaries[1]["throughput_tok_s"]
        out["greedy_mismatches"] = mismatches
    print(json.dumps(out))
    return 0 if all(s["requests_failed"] == 0 for s in summaries) and not mismatches else 1


if __name__ == "__main__":
    sys.exit(main())
