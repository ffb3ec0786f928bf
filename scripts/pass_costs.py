"""What one target pass costs by its width: milliseconds per forward pass of S tokens (S = 1, 2, 5, 9 unless
--widths) after a cache of --context tokens, per model. Each figure is the median of --repeats timed
passes; one untimed pass warms the model up first, and the cache is truncated back to the context
after every pass, so every timed pass sees the same cache.

A verify pass scores 1 + k tokens, so these are the costs `--k auto` weighs against the tokens a
draft of k is expected to add (the cost model times the same passes at start-up); they are also what
scripts/experiments/ngram_replay.py takes as --costs. Prints one line per model and width, as measured,
with the best speedup that width allows (every drafted token accepted, drafting free) once S=1 is timed:

    MODEL RUNTIME DTYPE context=N S=W: MS ms (at most X.XXx at alpha = 1)

Usage (catalogue names or paths; loads the weights, downloads nothing):

    .venv/bin/python scripts/pass_costs.py [--runtime transformers|native|llamacpp] [--dtype float32]
        [--context 60] [--repeats 3] [--widths 1,9,17,33] [--no-exact] [--q6-K-zmm-runs 7,0] [MODEL ...]

--q6-K-zmm-runs (llama.cpp, patch 0009): time each width with each of these settings of the switch that gives runs of
rows the 512-bit or the 256-bit form of the repacked Q6_K kernels (bits: 1 runs of 1-3 rows, 2 of 4-7, 4 of 8; both
forms compute the same bits), alternated pass by pass in one process, one line per setting; the load's own choice
(backends/llamacpp_forms.py) is put back after.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator, Sequence

from spekula.backends.base import Backend
from spekula.config import BackendConfig
from spekula.pipeline import load_model

DEFAULT_MODELS = ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]
PROMPT = "def fibonacci(n):\n    "  # repeated until it fills the context
TOKEN = 5  # fed at every timed position: what is fed does not change the cost of a pass


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--runtime", default="transformers", help="transformers, native or llamacpp")
    ap.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="llama.cpp: exact mode's kernels and widths (the default), or llama.cpp's own (--no-exact), as "
        "`spekula generate --exact` (a width past the exact one is then timed as the pieces exact mode scores it in)",
    )
    ap.add_argument("--context", type=int, default=60, help="tokens in the cache before the timed pass")
    ap.add_argument("--repeats", type=int, default=1, help="timed passes per width; the median is printed")
    ap.add_argument("--widths", type=widths, default=widths("1,2,5,9"), help="comma-separated block widths S to time")
    ap.add_argument(
        "--q6-K-zmm-runs",
        type=zmm_runs,
        default=None,
        help="llama.cpp: comma-separated settings (0-7) of patch 0009's Q6_K kernel-form switch, alternated",
    )
    ap.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    args = ap.parse_args(argv)
    if args.q6_K_zmm_runs is not None and (args.runtime != "llamacpp" or max(args.q6_K_zmm_runs) > 7):
        ap.error("--q6-K-zmm-runs: settings 0-7, with --runtime llamacpp")
    if args.context < 1 or args.repeats < 1:
        ap.error("--context and --repeats must be >= 1")
    return args


def integers(text: str, what: str, least: int) -> list[int]:
    """'1,2,5,9' -> [1, 2, 5, 9]: comma-separated integers, each at least `least` (`what` names them in an error)."""
    try:
        values = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not values or min(values) < least:
        raise argparse.ArgumentTypeError(f"{what} must be integers >= {least}, got {text!r}")
    return values


def widths(text: str) -> list[int]:
    """'1,2,5,9' -> [1, 2, 5, 9]; every width a positive integer."""
    return integers(text, "widths", 1)


def zmm_runs(text: str) -> list[int]:
    """'7,0' -> [7, 0]: settings of the Q6_K kernel-form switch."""
    return integers(text, "settings", 0)


def time_passes(
    backend: Backend,
    context: list[int],
    widths: list[int],
    repeats: int,
    settings: Sequence[Callable[[], object]] = (lambda: None,),
) -> Iterator[tuple[int, list[float]]]:
    """(S, median seconds of a forward pass of S tokens after `context`, one per setting) for each S in `widths`, in
    order. Each setting is a call made before its passes; with several, they alternate pass by pass."""
    seq = backend.new_sequence()
    seq.forward(context, num_logits=1)
    seq.forward([TOKEN])  # warm-up
    seq.truncate(len(context))
    for n in widths:
        times: list[list[float]] = [[] for _ in settings]
        for _ in range(repeats):
            for i, setting in enumerate(settings):
                setting()
                start = time.perf_counter()
                seq.forward([TOKEN] * n)
                times[i].append(time.perf_counter() - start)
                seq.truncate(len(context))
        yield n, [statistics.median(t) for t in times]


def bound_at_full_acceptance(width: int, seconds: float, single: float) -> float:
    """The best speedup a verify pass of this width allows: every one of its width - 1 drafted tokens accepted
    (alpha = 1), so it emits `width` tokens where plain decoding emits one per one-token pass, drafts free."""
    return width * single / seconds


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    for name in args.models:
        config = BackendConfig(dtype=args.dtype, threads=args.threads, runtime=args.runtime, exact=args.exact)
        backend, codec = load_model(name, config)
        ids = codec.encode(PROMPT * (args.context // 4 + 1))[: args.context]
        labels, settings, restore = q6_K_settings(args.q6_K_zmm_runs)
        singles: list[float | None] = [None] * len(settings)
        try:
            for n, medians in time_passes(backend, ids, args.widths, args.repeats, settings):
                for i, (label, seconds) in enumerate(zip(labels, medians, strict=True)):
                    singles[i] = seconds if n == 1 else singles[i]
                    single = singles[i]
                    bound = (
                        ""
                        if single is None
                        else f" (at most {bound_at_full_acceptance(n, seconds, single):.2f}x at alpha = 1)"
                    )
                    print(
                        f"{name} {args.runtime} {args.dtype}{label} context={len(ids)} S={n}: {1000 * seconds:.0f} ms"
                        f"{bound}",
                        flush=True,
                    )
        finally:
            restore()
    return 0


def q6_K_settings(runs: list[int] | None) -> tuple[list[str], list[Callable[[], object]], Callable[[], object]]:
    """The labels and calls of --q6-K-zmm-runs' settings (one unlabelled no-op without it), and a call that puts the
    load's own choice back."""
    if runs is None:
        return [""], [lambda: None], lambda: None
    from spekula.backends import llamacpp_forms

    switch = llamacpp_forms.switch()
    if switch is None:
        raise SystemExit("--q6-K-zmm-runs: this llama.cpp build has no Q6_K kernel forms to switch (patch 0009)")
    chosen = switch(-1)
    return (
        [f" q6_K_zmm_runs={r}" for r in runs],
        [lambda r=r: switch(r) for r in runs],
        lambda: switch(chosen),
    )


if __name__ == "__main__":
    raise SystemExit(main())
