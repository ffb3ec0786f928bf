"""How long a batching server's rounds took, by what was in them, from `spekula serve --log-level debug` logs.

    python scripts/experiments/round_times.py SERVE.log [SERVE.log ...] [--top 8]

The scheduler logs one debug line per round (spekula.server.scheduler.Scheduler._round: its steps, their rows, the
prompt tokens riding beside them, the requests still prefilling, the seconds) and one per prefill pass of its own
(Scheduler._run_chunks). This prints, per log, the round classes seen most (steps, rows, a prompt chunk rode in
the pass or not, requests prefilling) with their count, median and total seconds, the rounds with more rows than
steps (drafts, or a prompt's last chunk folded into its first step), then the prefill passes' count, prompt
tokens and seconds, and how long those of the commonest width (the chunk size) took. Two servers given the same
load (spekula serve and spekula serve --draft none, say) then show whether one's passes cost more than the other's
(a class's median) or whether they only ran other rounds (the counts): docs/BENCHMARKS.md, "At concurrency 4".

What it found at concurrency 4 (spekula serve against --draft none, Zen 4 EPYC, 2026-12-06):
docs/benchmarks/llama-server-c4/zen4-rounds-45a3a20/ (its commands and this script's output) and docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import re
import statistics
from collections import Counter, defaultdict

ROUND = re.compile(
    r"round \d+: (\d+) steps \((\d+) rows\), (\d+) prompt tokens beside them, (\d+) prefilling, ([\d.]+) s"
)
PREFILL = re.compile(r"prefill: (\d+) chunks, (\d+) prompt tokens, ([\d.]+) s")


def summarize(path: str, top: int) -> list[str]:
    """The report's lines for one log."""
    rounds: dict[tuple[int, int, bool, int], list[float]] = defaultdict(list)
    prefills: list[tuple[int, float]] = []
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            if found := ROUND.search(line):
                steps, rows, riders, prefilling, seconds = found.groups()
                rounds[(int(steps), int(rows), int(riders) > 0, int(prefilling))].append(float(seconds))
            elif found := PREFILL.search(line):
                prefills.append((int(found[2]), float(found[3])))
    lines = [f"{path}: {sum(map(len, rounds.values()))} rounds"]
    if not rounds:
        lines.append("  no round lines: was the server started with --log-level debug?")
    for key in sorted(rounds, key=lambda k: -len(rounds[k]))[:top]:
        steps, rows, riders, prefilling = key
        times = rounds[key]
        lines.append(
            f"  {steps} steps ({rows} rows){', a chunk beside them' if riders else ''}, {prefilling} prefilling: "
            f"{len(times)} rounds, median {statistics.median(times):.4f} s, total {sum(times):.1f} s"
        )
    wide = [(rows - steps, t) for (steps, rows, _, _), times in rounds.items() if rows > steps for t in times]
    lines.append(
        f"  rounds with more rows than steps (drafts, or a prompt's last chunk folded into its first step): "
        f"{len(wide)}, {sum(r for r, _ in wide)} rows beyond one a step, {sum(t for _, t in wide):.1f} s"
    )
    tokens, seconds = sum(t for t, _ in prefills), sum(s for _, s in prefills)
    lines.append(f"  prefill passes of their own: {len(prefills)}, {tokens} prompt tokens, {seconds:.1f} s")
    if prefills:  # the chunk size (--prefill-chunk) is the commonest width: how long such a pass took
        width = Counter(t for t, _ in prefills).most_common(1)[0][0]
        times = [s for t, s in prefills if t == width]
        lines.append(f"  of them {len(times)} of {width} prompt tokens, {min(times):.2f} s to {max(times):.2f} s each")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", help="spekula serve logs written with --log-level debug")
    parser.add_argument("--top", type=int, default=8, help="round classes shown per log (default 8)")
    args = parser.parse_args(argv)
    for path in args.logs:
        print("\n".join(summarize(path, args.top)))


if __name__ == "__main__":
    main()
