"""Aggregate decode speed of a server under a few concurrent greedy chat requests with short prompts.

Sends the same N short chat prompts at once to an OpenAI-compatible server (max_tokens each, temperature 0),
`--rounds` times with fresh prompts each round (a round's prompts carry its number, so no server answers from a
cache of an earlier round), and prints per round the completion tokens of all N over the wall time from the first
request to the last answer. Short prompts and long answers make it a measure of decoding under load, which
continuous batching changes, rather than of prefill. docs/decisions/0011-exact-batching.md cites it. An
experiment, not a maintained tool (scripts/experiments/README.md).

    .venv/bin/python -m spekula serve --target qwen2.5-coder-1.5b --threads 2 --port 18411 [--draft none] &
    .venv/bin/python scripts/experiments/concurrent_decode.py --url http://127.0.0.1:18411
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request

PROMPTS = (
    "Write a short poem about the sea.",
    "Tell me a story about a dragon who learns to cook.",
    "Explain why the sky is blue to a child.",
    "Describe a walk through an autumn forest.",
    "Write a letter to a friend about a trip to the mountains.",
    "Describe the life of a lighthouse keeper.",
    "Tell me about a robot that wants to paint.",
    "Write a short fable about a fox and a crow.",
)


def ask(url: str, model: str, prompt: str, max_tokens: int) -> int:
    """One greedy chat request; its completion tokens."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        json.dumps({**body, "temperature": 0}).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=900) as response:
        return int(json.loads(response.read())["usage"]["completion_tokens"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:18411 (the API under /v1)")
    ap.add_argument("--clients", type=int, default=4, help=f"concurrent requests (at most {len(PROMPTS)})")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with urllib.request.urlopen(f"{args.url}/v1/models", timeout=60) as response:
        model = json.loads(response.read())["data"][0]["id"]
    for r in range(args.rounds):
        prompts = [f"({r + 1}) {p}" for p in PROMPTS[: args.clients]]
        tokens, errors = [0] * len(prompts), []

        def one(i: int, prompts: list[str] = prompts, tokens: list[int] = tokens, errors: list = errors) -> None:
            try:
                tokens[i] = ask(args.url, model, prompts[i], args.max_tokens)
            except Exception as exc:  # reported after the round: a failed request is no figure
                errors.append(f"{prompts[i]!r}: {exc}")

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(prompts))]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - started
        if errors:
            raise SystemExit("requests failed: " + "; ".join(errors))
        print(
            f"round {r + 1}: {sum(tokens)} tokens from {len(prompts)} requests in {wall:.2f} s: "
            f"{sum(tokens) / wall:.2f} tok/s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
