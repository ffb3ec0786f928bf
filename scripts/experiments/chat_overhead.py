"""Where a fresh engine's time goes on chat: the library's default (suffix drafting, k auto, exact llama.cpp) against
plain decoding, per output token, from the engine's own stage timings (RequestStats: draft, score, accept, advance, the
rest) and its drafting counts. In-process, one Pipeline, each of the first N open-chat prompts of the built-in
suite decoded plainly then speculatively, 96 tokens, greedy.

    .venv/bin/python scripts/experiments/chat_overhead.py [N]   # about 2 minutes for N = 8

Found (this Intel Xeon, 2026-12-04, N = 8): at commit bd0b816 the library's default was a fixed k = 4 (the CLI's
and the server's was auto): it drafted at 332 of 595 passes, 88 of 431 drafted tokens accepted, 71.2 and 74.3 ms a
token against plain's 58.9 and 62.3 (0.83x). With k auto, the library's default since: 39 drafts in 651 passes, 31
of 102 drafted tokens accepted, 61.63 ms a token against plain's 61.53 (1.00x). The Python around a pass (draft,
accept, advance, the rest) is 0.3-0.4 ms a token either way.
"""

import json
import sys
from pathlib import Path

from spekula.config import SamplingParams, StopConfig
from spekula.pipeline import Pipeline

SUITE = Path(__file__).resolve().parents[2] / "src" / "spekula" / "bench" / "suite" / "open-chat.jsonl"
STAGES = ("draft_s", "score_s", "accept_s", "advance_s")
COUNTS = ("output_tokens", "target_passes", "drafts", "drafted", "accepted")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    pipe = Pipeline.load("qwen2.5-coder-1.5b")
    items = [json.loads(line) for line in SUITE.read_text().splitlines() if line.strip()][:n]
    totals: dict[bool, dict[str, float]] = {True: {}, False: {}}
    for item in items:
        ids = pipe.codec.encode(messages=item["messages"])
        for plain in (True, False):
            generation = pipe.start(ids, SamplingParams(), StopConfig(max_tokens=96), plain=plain)
            generation.result()
            stats, total = generation.generation.stats, totals[plain]
            for key in STAGES + COUNTS + ("prefill_s", "total_s"):
                total[key] = total.get(key, 0) + getattr(stats, key)
    for plain, total in totals.items():
        tokens = total["output_tokens"]
        decode = total["total_s"] - total["prefill_s"]
        rest = decode - sum(total[key] for key in STAGES)
        stages = " ".join(f"{key[:-2]} {1000 * total[key] / tokens:.2f}" for key in STAGES)
        counts = " ".join(f"{key} {int(total[key])}" for key in COUNTS)
        print(
            f"{'plain' if plain else 'default'}: {counts}; ms a token: {stages} rest {1000 * rest / tokens:.2f}, "
            f"decode {1000 * decode / tokens:.2f}; prefill {total['prefill_s']:.2f} s",
            flush=True,
        )


if __name__ == "__main__":
    main()
