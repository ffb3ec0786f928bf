"""Ratios between the configurations of one `spekula bench` run, over any of them: per category, the median
per-prompt ratio of whole-request tok/s, of decode-only tok/s and of TPOT, and the tokens per target pass.

A bench report puts every ratio over the run's one --baseline; this re-reads the same results to put them
over another configuration too (e.g. a run whose baseline is llama-cpp-python's own loop, read over
spekula's plain decoding for decode-only ratios, which that loop does not record). Nothing is measured again.

    .venv/bin/python scripts/ratios.py RESULTS.json[.gz] --over plain [--configs "suffix k=auto,plain-again"]

Prints a Markdown table: one row per category and one for all prompts (its header names the proposer memory the
figures are for, cold or warm, where the results say: `spekula bench --warm`); a cell is "whole, decode only" (median
of the per-prompt ratios; "n/a" where either side has no decode-only rate), then TPOT's ratio (below 1: faster
per token) and τ of the configuration (output tokens over target passes, all its prompts of the category).

--interval adds, after the whole-request median, a 95% bootstrap interval of it: the category's prompts drawn
with replacement (each with all its repeats, since repeats of one prompt are not independent of each other),
the median taken again, 2000 times with a fixed seed. How far one run's median can move on its own host is
what a bar such as "never below 0.97x" must be read against (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ALL = "all"
BOOTSTRAP_DRAWS = 2000


def read(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)


def load(path: Path) -> list[dict[str, Any]]:
    return read(path)["requests"]


def memory_state(result: dict[str, Any]) -> str | None:
    """The proposer memory a run's figures are for ("cold", "warm", "server"); None where the file does not say."""
    return (result.get("proposer_memory") or {}).get("state")


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def median_interval(
    ratios: dict[str, list[float]], draws: int = BOOTSTRAP_DRAWS, seed: int = 0
) -> tuple[float, float] | None:
    """95% bootstrap interval of the median of every ratio, the prompts (keys; each with its repeats' ratios)
    drawn with replacement; None without ratios."""
    clusters = [v for v in ratios.values() if v]
    if not clusters:
        return None
    rng = random.Random(seed)
    medians = sorted(
        statistics.median([x for cluster in rng.choices(clusters, k=len(clusters)) for x in cluster])
        for _ in range(draws)
    )
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def table(
    requests: list[dict[str, Any]], over: str, configs: Sequence[str], interval: bool = False
) -> list[dict[str, Any]]:
    """One row per category (in the run's order) and one for all prompts: for each config, the medians of its
    per-prompt ratios over `over` (requests that errored on either side are left out), and with `interval` the
    whole-request median's bootstrap interval (median_interval; else None)."""
    by = {(r["config"], r["prompt_id"], r.get("repeat", 0)): r for r in requests if not r.get("error")}
    if not any(key[0] == over for key in by):
        raise SystemExit(f"no configuration {over!r} in these results")
    categories = list(dict.fromkeys(r["category"] for r in requests))
    rows = []
    for category in [*categories, ALL]:
        row: dict[str, Any] = {"category": category}
        for config in configs:
            pairs = [
                (r, by[(over, pid, rep)])
                for (c, pid, rep), r in by.items()
                if c == config and (over, pid, rep) in by and category in (ALL, r["category"])
            ]
            stats = [r["stats"] for r, _ in pairs]
            whole: dict[str, list[float]] = {}  # prompt -> its repeats' whole-request ratios
            for r, b in pairs:
                if (x := ratio(r["tokens_per_s"], b["tokens_per_s"])) is not None:
                    whole.setdefault(r["prompt_id"], []).append(x)
            passes = sum(s["target_passes"] for s in stats)
            row[config] = {
                "whole": median([x for xs in whole.values() for x in xs]),
                "decode": median(
                    [ratio(r["stats"]["decode_tokens_per_s"], b["stats"]["decode_tokens_per_s"]) for r, b in pairs]
                ),
                "tpot": median([ratio(r["tpot_s"], b["tpot_s"]) for r, b in pairs]),
                "tau": sum(s["output_tokens"] for s in stats) / passes if passes else None,
                "prompts": len(pairs),
                "interval": median_interval(whole) if interval else None,
            }
        rows.append(row)
    return rows


def markdown(
    rows: list[dict[str, Any]], over: str, configs: Sequence[str], interval: bool = False, memory: str | None = None
) -> str:
    """The table as Markdown; `interval`: the header names the intervals the rows carry (table(interval=True));
    `memory`: the proposer memory the run's figures are for, named in the header where known."""

    def f(x: float | None, spec: str, unit: str = "") -> str:
        return "n/a" if x is None else format(x, spec) + unit

    def whole(v: dict[str, Any]) -> str:
        if v["interval"] is None:
            return f(v["whole"], ".3f", "x")
        low, high = v["interval"]
        return f"{f(v['whole'], '.3f', 'x')} [{low:.3f}, {high:.3f}]"

    head = " | ".join(f"{c}: whole{' [95% interval]' if interval else ''}, decode only; TPOT; τ" for c in configs)
    state = f"; proposer memory {memory}" if memory else ""
    lines = [f"| category (over {over}{state}) | {head} |", "|---|" + "---|" * len(configs)]
    for row in rows:
        cells = [
            f"{whole(v)}, {f(v['decode'], '.3f', 'x')}; {f(v['tpot'], '.3f')}; {f(v['tau'], '.2f')}"
            for v in (row[c] for c in configs)
        ]
        lines.append(f"| {row['category']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", type=Path, help="a bench run's results.json or results.json.gz")
    ap.add_argument("--over", required=True, help="the configuration every ratio is over")
    ap.add_argument("--configs", default=None, help="comma-separated configurations (default: all the others)")
    ap.add_argument(
        "--interval",
        action="store_true",
        help="a 95%% bootstrap interval of each whole-request median (prompts resampled)",
    )
    args = ap.parse_args(argv)
    result = read(args.results)
    requests = result["requests"]
    names = list(dict.fromkeys(r["config"] for r in requests))
    configs = [c.strip() for c in args.configs.split(",")] if args.configs else [c for c in names if c != args.over]
    unknown = [c for c in configs if c not in names]
    if unknown:
        ap.error(f"no configuration {', '.join(map(repr, unknown))} in these results; they have {', '.join(names)}")
    rows = table(requests, args.over, configs, args.interval)
    print(markdown(rows, args.over, configs, args.interval, memory_state(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
