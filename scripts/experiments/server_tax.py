"""What `spekula serve` adds to a token: plain greedy decoding of one chat prompt, in this process (Pipeline) and
through `spekula serve --draft none` (a whole response, and streamed), interleaved request by request.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python scripts/experiments/server_tax.py [--rounds 8] \
        [--llama-server] [--serve-env KEY=VALUE ...] [--serve-args '--max-running 1' ...]

Prints the median milliseconds per output token of each way (a request's wall time over its completion tokens; the
prompt is cached after the first request, so what remains is decoding; the request asks for fewer tokens than the
answer has, so every server counts the same tokens): cited by docs/BENCHMARKS.md, "Against
llama-server, cold and warm".
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

MODEL = "qwen2.5-coder-1.5b"
MESSAGES = [
    {
        "role": "user",
        "content": "Write a Python function that parses an ISO 8601 date string without using datetime, "
        "with comments explaining each step.",
    }
]


def ask(port: int, stream: bool, max_tokens: int) -> float:
    """One request; milliseconds per completion token."""
    body: dict = {"model": MODEL, "messages": MESSAGES, "max_tokens": max_tokens, "temperature": 0.0, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as r:
        data = r.read().decode()
    seconds = time.perf_counter() - start
    if not stream:
        return seconds / json.loads(data)["usage"]["completion_tokens"] * 1000
    chunks = [json.loads(line[5:]) for line in data.splitlines() if line.startswith("data:") and "[DONE]" not in line]
    tokens = [c["usage"]["completion_tokens"] for c in chunks if c.get("usage")]
    return seconds / tokens[-1] * 1000


def wait_ready(port: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1.0)  # polling a child process's port: no event to wait on
    raise SystemExit(f"spekula serve did not answer on port {port}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--port", type=int, default=18399)
    ap.add_argument(
        "--llama-server", action="store_true", help="also llama.cpp's own server, plain ($LLAMA_SERVER or .venv/bin)"
    )
    ap.add_argument(
        "--serve-env",
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="also a `spekula serve --draft none` started with these environment variables (repeatable)",
    )
    ap.add_argument(
        "--serve-args",
        action="append",
        default=[],
        metavar="'ARGS'",
        help="also a `spekula serve --draft none` with these extra arguments, e.g. '--max-running 1' (repeatable)",
    )
    args = ap.parse_args()

    from spekula.config import BackendConfig, StopConfig
    from spekula.models import resolve
    from spekula.pipeline import Pipeline

    argv = [sys.executable, "-m", "spekula", "serve", "--target", MODEL, "--threads", "2", "--draft", "none"]
    servers = {"serve": (argv, {})}
    for pairs in args.serve_env:
        servers[f"serve {pairs}"] = (argv, dict(pair.split("=", 1) for pair in pairs.split(",")))
    for extra in args.serve_args:
        servers[f"serve {extra}"] = ([*argv, *shlex.split(extra)], {})
    if args.llama_server:
        binary = os.environ.get("LLAMA_SERVER", ".venv/bin/llama-server")
        gguf = str(resolve(MODEL).gguf_path)
        servers["llama-server"] = ([binary, "-m", gguf, "-t", "2", "-tb", "2", "-np", "1", "--host", "127.0.0.1"], {})
    ports, procs = {}, []
    try:
        for i, (name, (cmd, env)) in enumerate(servers.items()):
            ports[name] = args.port + i
            procs.append(
                subprocess.Popen(
                    [*cmd, "--port", str(ports[name])],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env={**os.environ, **env},
                )
            )
        pipeline = Pipeline.load(MODEL, draft=None, backend=BackendConfig(runtime="llamacpp", threads=2))
        ids = pipeline.codec.encode(messages=MESSAGES, chat=True)

        def in_process() -> float:
            start = time.perf_counter()
            done = pipeline.generate(ids, stop=StopConfig(max_tokens=args.max_tokens))
            return (time.perf_counter() - start) / len(done.token_ids) * 1000

        ways = {"in-process": in_process}
        for name, port in ports.items():
            wait_ready(port)
            ways[f"{name}, whole response"] = lambda port=port: ask(port, False, args.max_tokens)
            if name == "serve":
                ways["serve, streamed"] = lambda port=port: ask(port, True, args.max_tokens)
        for way in ways.values():
            way()  # untimed: one-off costs, and the prompt in each cache
        ms: dict[str, list[float]] = {name: [] for name in ways}
        for r in range(args.rounds):
            for name in list(ways)[:: 1 if r % 2 else -1]:
                ms[name].append(ways[name]())
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)
    for name, values in ms.items():
        print(f"{name}: {statistics.median(values):.2f} ms a token (median of {len(values)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
