"""Is a llama.cpp build as fast as another? One-token and 16-token passes of a GGUF, the builds interleaved.

Each build is a folder that holds a `llama_cpp` package (site-packages of a venv, or a copy of one). Every
round runs scripts/pass_costs.py once per build, in a child process whose PYTHONPATH puts that build
first, the builds' order alternating from round to round; a child times --repeats passes per width and
prints their median. The result is each build's median over rounds by width, and each build's ratio to the
first build (above 1: slower). Used for docs/decisions/0001-llamacpp-build.md:

    cp -a .venv/lib/python3.11/site-packages/llama_cpp /tmp/native/   # while the -march=native build is installed
    .venv/bin/python scripts/experiments/build_pass_costs.py --build native=/tmp/native \\
        --build keyed=.venv/lib/python3.11/site-packages --rounds 6 --repeats 5

The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

PASS_COSTS = Path(__file__).resolve().parents[1] / "pass_costs.py"
LINE = re.compile(r" S=(\d+): (\d+) ms")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", action="append", required=True, metavar="NAME=DIR", help="a folder holding llama_cpp")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--widths", default="1,16")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    args.builds = dict(b.split("=", 1) for b in args.build)
    return args


def one_child(folder: str, args: argparse.Namespace) -> dict[int, float]:
    """{width: median ms} from one run of pass_costs.py on the build in `folder`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")])))
    command = [sys.executable, str(PASS_COSTS), "--runtime", "llamacpp", "--widths", args.widths]
    command += ["--repeats", str(args.repeats), args.model]
    out = subprocess.run(command, capture_output=True, text=True, check=True, env=env).stdout
    return {int(m[1]): float(m[2]) for m in LINE.finditer(out)}


def summarise(runs: dict[str, list[dict[int, float]]]) -> dict[str, dict[str, float]]:
    """Each build's median over rounds by width, and its ratio to the first build's."""
    medians = {name: {w: statistics.median(r[w] for r in rounds) for w in rounds[0]} for name, rounds in runs.items()}
    first = next(iter(medians.values()))
    return {
        name: {**{f"S={w}_ms": ms for w, ms in m.items()}, **{f"S={w}_ratio": ms / first[w] for w, ms in m.items()}}
        for name, m in medians.items()
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = list(args.builds)
    runs: dict[str, list[dict[int, float]]] = {name: [] for name in names}
    for round_ in range(args.rounds):
        for name in names if round_ % 2 == 0 else names[::-1]:
            runs[name].append(one_child(args.builds[name], args))
            print(f"round {round_} {name}: {runs[name][-1]}", flush=True)
    summary = summarise(runs)
    for name, figures in summary.items():
        print(name, " ".join(f"{k}={v:.3f}" for k, v in figures.items()))
    print(json.dumps({"model": args.model, "rounds": args.rounds, "repeats": args.repeats, "builds": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
