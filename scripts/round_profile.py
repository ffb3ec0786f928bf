"""Where a lone request's scheduler round goes: the server's pipeline (as `spekula serve` loads it), one
request at a time through a Scheduler, every round under cProfile and every target pass timed. Runs the
built-in suite's first --prompts prompts (chat template, --max-tokens each) once per --kept mode in
turn, with the prompt cache cleared between modes: `one` keeps one finished request's cache, `many`
keeps up to --max-running (the server's default on a llama.cpp target). Prints, per mode, the median
milliseconds of a one-row target pass and of a round; then the functions taking most of the rounds'
own time; then one JSON line.

Usage (loads the weights, downloads nothing):

    .venv/bin/python scripts/round_profile.py [--prompts 6] [--max-tokens 48] [--kept one,many,one,many]
        [--top 8] [-- SERVE_OPTIONS ...]   (default serve options: --target qwen2.5-coder-1.5b --threads 2
        --draft suffix --suffix-cache-entries 0 --no-exact; the passes it times are the shared context's batched
        ones, which exact mode does not use)
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import time

from spekula.bench.workloads import load_workload, select
from spekula.cli import build_parser
from spekula.config import SamplingParams, StopConfig
from spekula.pipeline import Pipeline
from spekula.server import cli as serve_cli
from spekula.server.metrics import ServerMetrics
from spekula.server.scheduler import Job, Scheduler
from spekula.threads import on_passing_thread

SERVE = [
    "--target",
    "qwen2.5-coder-1.5b",
    "--threads",
    "2",
    "--draft",
    "suffix",
    "--suffix-cache-entries",
    "0",
    "--no-exact",
]
WAIT = 600.0


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--kept", default="one,many,one,many", help="comma-separated modes: one | many")
    p.add_argument("--top", type=int, default=8, help="functions listed by their own time")
    p.add_argument("serve", nargs="*", help="spekula serve options (after --)")
    args = p.parse_args(argv)
    args.kept = [m.strip() for m in args.kept.split(",") if m.strip()]
    if not args.kept or any(m not in ("one", "many") for m in args.kept):
        p.error(f"--kept takes one and many, comma-separated; got {args.kept}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    serve_args = build_parser().parse_args(["serve", *(args.serve or SERVE)])
    settings = serve_cli.settings_from_args(serve_args)
    pipe = on_passing_thread(  # as spekula serve loads it: the scheduler thread then computes alone
        Pipeline.load,
        serve_args.target,
        serve_args.draft,
        serve_cli.spec_from_args(serve_args),
        serve_cli.target_backend(serve_args, settings),
        serve_cli.draft_backend_from_args(serve_args),
    )
    scheduler = Scheduler(
        pipe, ServerMetrics(), max_running=settings.max_running, max_queue=4, prefill_chunk=settings.prefill_chunk
    )
    cache = pipe.engine.prompt_cache
    many = cache.max_kept  # what the scheduler chose for this target
    profile = cProfile.Profile()
    # (mode, seconds) and (mode, seconds, rows), each under the mode its round started in: the round that
    # finishes a mode's last request may still be running when the next mode begins
    rounds: list[tuple[int, float]] = []
    passes: list[tuple[int, float, int]] = []
    now = {"mode": 0, "round": 0}  # the mode requests are submitted under; the running round's
    run_round, forward_batch = scheduler._round, pipe.target.forward_batch

    def timed_round() -> None:
        now["round"] = now["mode"]
        start = time.perf_counter()
        profile.enable()
        try:
            run_round()
        finally:
            profile.disable()
            rounds.append((now["round"], time.perf_counter() - start))

    def timed_pass(sequences, token_lists, *rest, **options):
        start = time.perf_counter()
        try:
            return forward_batch(sequences, token_lists, *rest, **options)
        finally:
            passes.append((now["round"], time.perf_counter() - start, sum(len(t) for t in token_lists)))

    scheduler._round, pipe.target.forward_batch = timed_round, timed_pass
    items = select(load_workload("builtin"), per_category=1)[: args.prompts]
    stop = StopConfig(max_tokens=args.max_tokens, ignore_eos=True)
    scheduler.start()
    modes = []
    for i, mode in enumerate(args.kept):
        now["mode"] = i
        cache.max_kept = 1 if mode == "one" else many
        cache.clear()
        for item in items:
            job = Job(
                f"{item.id}-{i}", item.encode(pipe.codec, chat=True), SamplingParams(), stop, lambda e: None, WAIT
            )
            scheduler.submit(job)
            scheduler.wait_for(lambda s: s.num_running == 0 and s.num_waiting == 0, WAIT)
    scheduler.close(WAIT)  # every round has ended: each mode's figures are complete
    for i, mode in enumerate(args.kept):
        mine = [s for m, s in rounds if m == i]
        one_row = [s for m, s, rows in passes if m == i and rows == 1]
        modes.append(
            {
                "kept": mode,
                "one_row_pass_ms": round(1000 * statistics.median(one_row), 1) if one_row else None,
                "one_row_passes": len(one_row),
                "round_ms": round(1000 * statistics.median(mine), 1),
                "rounds": len(mine),
                "pass_share": round(sum(s for m, s, _ in passes if m == i) / sum(mine), 3),
            }
        )
        print(f"{mode}: one-row pass {modes[-1]['one_row_pass_ms']} ms, round {modes[-1]['round_ms']} ms", flush=True)
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(args.top)
    print(text.getvalue())
    print(json.dumps({"kind": "spekula-round-profile", "modes": modes}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
