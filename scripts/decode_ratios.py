"""Per category: speedup over whole requests and over decoding only, from a `spekula bench` results.json.

Whole-request speedup is what `spekula bench` reports (output tokens per second, prefill included).
Decode-only speedup leaves the prefill out: output tokens / (total_s - prefill_s), against plain
decoding's on the same prompt. Prefill is the same work in every configuration without a draft
model, and on slow prefills (llama.cpp, bf16 on this CPU) its jitter moves whole-request ratios
by more than speculation does. (`spekula bench` reports decode-only speedups itself since it
recorded `decode_speedup`; this script computes them from the stats, for result files of any age.)
Also printed: the steps by k over all requests of a configuration, each category's pooled decode
speed per configuration (tokens / decode seconds over its requests), and each prompt's prefill
seconds per configuration with the largest spread.

    .venv/bin/python scripts/decode_ratios.py docs/benchmarks/llamacpp-classes/results.json
"""

import argparse
import json
import statistics
from collections import Counter

from spekula import trace


def decode_tokens_per_s(stats: dict) -> float:
    return trace.decode_tokens_per_s(stats["output_tokens"], stats["total_s"], stats["prefill_s"])


def ratios(result: dict) -> dict[str, dict[str, dict[str, list[float]]]]:
    """config -> category -> {"whole": [...], "decode": [...]}: per-prompt ratios against the baseline."""
    baseline = result["baseline"]
    plain = {(r["prompt_id"], r["repeat"]): r for r in result["requests"] if r["config"] == baseline and not r["error"]}
    out: dict = {}
    for r in result["requests"]:
        base = plain.get((r["prompt_id"], r["repeat"]))
        if r["config"] == baseline or r["error"] or base is None:
            continue
        cell = out.setdefault(r["config"], {}).setdefault(r["category"], {"whole": [], "decode": []})
        cell["whole"].append(r["speedup"])
        cell["decode"].append(decode_tokens_per_s(r["stats"]) / decode_tokens_per_s(base["stats"]))
    return out


def pooled_decode(result: dict) -> dict[str, dict[str, float]]:
    """category -> config -> output tokens / decode seconds summed over the category's requests
    (the baseline included): a per-category speed that long requests weigh more in."""
    sums: dict = {}
    for r in result["requests"]:
        if not r["error"]:
            cell = sums.setdefault(r["category"], {}).setdefault(r["config"], [0, 0.0])
            cell[0] += r["stats"]["output_tokens"]
            cell[1] += r["stats"]["total_s"] - r["stats"]["prefill_s"]
    return {cat: {config: n / s for config, (n, s) in configs.items()} for cat, configs in sums.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a spekula bench results.json")
    args = ap.parse_args()
    result = json.load(open(args.results))
    for config, categories in ratios(result).items():
        print(f"{config}\ncategory | prompts | whole request: median, worst | decode only: median, worst")
        for category, cell in categories.items():
            w, d = cell["whole"], cell["decode"]
            print(f"{category} | {len(w)} | {statistics.median(w):.3f}x, {min(w):.3f}x | {statistics.median(d):.3f}x, {min(d):.3f}x")
        every = [v for cell in categories.values() for v in cell["whole"]], [v for cell in categories.values() for v in cell["decode"]]
        steps = Counter()
        for r in result["requests"]:
            if r["config"] == config and not r["error"]:
                steps.update({int(k): n for k, n in r["stats"]["k_chosen"].items()})
        print(f"all | {len(every[0])} | {statistics.median(every[0]):.3f}x | {statistics.median(every[1]):.3f}x; steps by k {dict(sorted(steps.items()))}\n")
    for category, configs in pooled_decode(result).items():
        print(f"pooled decode tok/s, {category}: " + ", ".join(f"{c} {v:.3f}" for c, v in configs.items()))
    prefill: dict[str, list[float]] = {}
    for r in result["requests"]:
        if not r["error"]:
            prefill.setdefault(r["prompt_id"], []).append(r["stats"]["prefill_s"])
    spread = max(prefill.items(), key=lambda item: max(item[1]) - min(item[1]))
    print(f"prefill: {min(min(v) for v in prefill.values()):.2f}-{max(max(v) for v in prefill.values()):.2f} s per request; "
          f"largest spread on one prompt: {spread[0]}, {min(spread[1]):.2f}-{max(spread[1]):.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
