"""How much a long prompt's prefill delays a short request on a running server, and how soon a client
that leaves mid-prefill frees its slot (chunked prefill, docs/SERVER.md "Scheduling").

    spekula serve --target smollm2-135m --draft none --context-length 8192 --prefill-chunk 256 --port 8011 &
    python scripts/prefill_stall.py --url http://127.0.0.1:8011 --chunk 256

Phases (greedy, non-streamed short requests; the long prompt is --long-tokens token ids, streamed, max_tokens 1):
1. solo:   --repeats short requests, one at a time, nothing else running.
2. alone:  the long prompt alone; its time to first token is its prefill. One chunk's time is estimated as
           that / ceil(long tokens / --chunk).
3. loaded: --long-repeats times: the long prompt starts; once the server reports it running, short requests
           run back to back; those that finish before the long prompt's first token count.
4. leave:  the long prompt again; its client closes the connection --leave-after s after the server reports
           it running; the time from the close until the server reports nothing running.
The server's running count is read from /metrics (spekula_num_requests_running). Prints a card, then the JSON
summary as the last line. Measured runs: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import threading
import time

import httpx

SHORT_PROMPT = "def add(a, b):"
POLL_S = 0.01


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8011")
    ap.add_argument("--api-key", default=None)
    ap.add_argument("--long-tokens", type=int, default=8000, help="the long prompt's length in tokens")
    ap.add_argument(
        "--ids", default="1000:8000", help="FIRST:SPAN: the long prompt cycles through token ids FIRST .. FIRST+SPAN-1"
    )
    ap.add_argument("--short-max-tokens", type=int, default=16)
    ap.add_argument("--chunk", type=int, default=256, help="the server's --prefill-chunk (for the per-chunk time)")
    ap.add_argument("--repeats", type=int, default=5, help="solo short requests")
    ap.add_argument("--long-repeats", type=int, default=2, help="long prompts with short requests beside them")
    ap.add_argument("--leave-after", type=float, default=1.0, help="seconds the leaving client stays")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds any one request may take")
    args = ap.parse_args(argv)

    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    client = httpx.Client(base_url=args.url, timeout=args.timeout, headers=headers)
    model = client.get("/v1/models").json()["data"][0]["id"]
    first, span = (int(x) for x in args.ids.split(":"))
    prompts = iter(range(1, 1 << 30))

    def long_ids() -> list[int]:
        """A new long prompt each time, from its first token on: a server's prompt cache (the last request's KV
        cache, kept for one that starts the same way) must not skip its prefill. The default ids are in every
        catalogue vocabulary."""
        salt = next(prompts)
        return [first + (37 * i + 101 * salt) % span for i in range(args.long_tokens)]

    def short() -> float:
        start = time.perf_counter()
        body = {"model": model, "prompt": SHORT_PROMPT, "max_tokens": args.short_max_tokens, "temperature": 0}
        response = client.post("/v1/completions", json=body)
        response.raise_for_status()
        return time.perf_counter() - start

    def running() -> float:
        for line in client.get("/metrics").text.splitlines():
            if line.startswith("spekula_num_requests_running "):
                return float(line.split()[1])
        raise RuntimeError("no spekula_num_requests_running in /metrics: is this a spekula server?")

    def wait_until(predicate, what: str) -> None:
        deadline = time.monotonic() + args.timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}")
            time.sleep(POLL_S)  # polling the server's gauge: this is the measurement, not a test's synchronisation

    solo = [short() for _ in range(args.repeats)]
    _progress(f"solo: {_card(_describe(solo))}")
    ttft_alone = LongStream(args, model, long_ids(), headers).run_to_first_token()
    _progress(f"the long prompt alone: first token after {ttft_alone:.3f} s")
    chunks = math.ceil(args.long_tokens / args.chunk) if args.chunk else 1
    chunk_s = ttft_alone / chunks

    loaded: list[float] = []
    ttft_loaded: list[float] = []
    for _ in range(args.long_repeats):
        stream = LongStream(args, model, long_ids(), headers).start()
        # wait_until calls it before the loop moves on, so it sees this iteration's stream
        wait_until(lambda: stream.first_token.is_set() or running() >= 1, "the long prompt to start")  # noqa: B023
        while not stream.first_token.is_set():
            latency = short()
            if not stream.first_token.is_set():
                loaded.append(latency)
        stream.join()
        ttft_loaded.append(stream.ttft)
        _progress(f"beside it: {_card(_describe(loaded))}")
        wait_until(lambda: running() == 0, "the long prompt to finish")

    leaving = LongStream(args, model, long_ids(), headers, leave=True).start()
    wait_until(lambda: leaving.closed.is_set() or running() >= 1, "the leaving prompt to start")
    time.sleep(args.leave_after)  # how long the client stays: part of the scenario
    leaving.leave.set()
    leaving.closed.wait(args.timeout)
    closed_at = time.perf_counter()
    wait_until(lambda: running() == 0, "the leaving prompt's slot to be freed")
    freed_s = time.perf_counter() - closed_at

    summary = {
        "long_tokens": args.long_tokens,
        "chunk": args.chunk,
        "solo_s": _describe(solo),
        "loaded_s": _describe(loaded),
        "long_ttft_alone_s": round(ttft_alone, 4),
        "long_ttft_loaded_s": [round(t, 4) for t in ttft_loaded],
        "chunk_s": round(chunk_s, 4),
        "target_s": round(2 * statistics.median(solo) + chunk_s, 4),  # 2x solo latency plus one chunk
        "leave_after_s": args.leave_after,
        "freed_s": round(freed_s, 4),
    }
    print(f"short request alone:          {_card(summary['solo_s'])}")
    print(f"beside a {args.long_tokens}-token prefill: {_card(summary['loaded_s'])}")
    print(f"long prompt's prefill:        {ttft_alone:.3f} s alone (~{chunk_s:.3f} s per chunk of {args.chunk})")
    print(f"target (2x solo + a chunk):   {summary['target_s']:.3f} s")
    print(f"slot freed after a client left {args.leave_after:g} s into its prefill: {freed_s:.3f} s later")
    print(json.dumps(summary))
    return 0


class LongStream:
    """The long prompt as a streamed completion on its own connection, in a thread."""

    def __init__(self, args, model: str, ids: list[int], headers: dict, leave: bool = False) -> None:
        self.body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "stream": True}
        self.url, self.timeout, self.headers = args.url, args.timeout, headers
        self.first_token = threading.Event()
        self.leave = threading.Event() if leave else None
        self.closed = threading.Event()
        self.ttft = math.nan
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LongStream:
        self._thread.start()
        return self

    def join(self) -> None:
        self._thread.join(self.timeout)

    def run_to_first_token(self) -> float:
        self.start().join()
        return self.ttft

    def _run(self) -> None:
        start = time.perf_counter()
        try:
            with httpx.Client(base_url=self.url, timeout=self.timeout, headers=self.headers) as client:
                with client.stream("POST", "/v1/completions", json=self.body) as response:
                    response.raise_for_status()
                    if self.leave is not None:
                        self.leave.wait(self.timeout)
                        return  # leaving the block closes the connection mid-response
                    for line in response.iter_lines():
                        if line.startswith("data: {") and not self.first_token.is_set():
                            self.ttft = time.perf_counter() - start
                            self.first_token.set()
        finally:
            self.closed.set()
            self.first_token.set()  # also when it failed (ttft stays nan): nobody waits for it forever


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _describe(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "min": round(min(values), 4),
        "median": round(statistics.median(values), 4),
        "max": round(max(values), 4),
    }


def _card(d: dict) -> str:
    if not d["n"]:
        return "none finished"
    return f"min {d['min']:.3f} s, median {d['median']:.3f} s, max {d['max']:.3f} s ({d['n']} requests)"


if __name__ == "__main__":
    sys.exit(main())
