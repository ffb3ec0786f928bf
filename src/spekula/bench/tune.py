"""`spekula tune`: measure proposers x k (x runtimes) on a sample of the workload, recommend the fastest,
or plain decoding.

The sweep is a bench run (same runner, same numbers); the recommendation is the configuration with
the highest measured throughput (output tokens / time over the sample), kept only if it beats plain
decoding on the run's runtime by at least `min_speedup` (default 1.05): a tie is not worth a draft
model's memory, and a few percent is within the noise of a short sample.

Runtimes: by default only the run's own runtime is swept (`--backend`, else pipeline.default_runtime:
llama.cpp for a GGUF target on a CPU). `--backends llamacpp,native` adds plain decoding and every
configuration on each other runtime, measured interleaved against the same baseline. Not the default:
on a CPU the native fp32 runtime's one-token pass costs several times llama.cpp's (docs/BENCHMARKS.md,
"Packed fp32"), so no configuration on it can win there, and measuring it would multiply tune's time.
The recommendation names its runtime and the config file records it (`backend`), so `generate` and
`serve --config` run what was measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spekula.bench.runner import CHOICE_KNOBS, PLAIN, PLAIN_CHOICE, SPEC, SpecChoice, choice_with_defaults
from spekula.config import SamplingParams

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p")
# The keys `spekula generate --config FILE` reads: generate's option names with underscores. The SpecConfig
# knobs a configuration sets are their fields' names, which are their flags' dests (spekula.knobs).
CONFIG_KEYS = ("target", "draft", "k", *CHOICE_KNOBS.values(), "dtype", *SAMPLING_KEYS, "backend", "exact")


def sweep_choices(
    drafts: list[str],
    ks: list[int | None],
    *,
    backends: list[str] | None = None,
    runtime: str | None = None,
    ngram_max: int = SPEC.ngram_max,
    ngram_min: int = SPEC.ngram_min,
    confidence: float | None = SPEC.draft_confidence,
    k_max: int = SPEC.k_max,
) -> list[SpecChoice]:
    """Every proposer x k (plain decoding and k = 0 left out: the baseline is always measured), on the
    run's runtime and, for each other runtime in `backends`, plain decoding plus the same grid there."""
    grid = [(d, k) for d in dict.fromkeys(drafts) if d != "none" for k in dict.fromkeys(ks) if k != 0]
    out = [choice_with_defaults(d, k, ngram_max, ngram_min, confidence, k_max=k_max) for d, k in grid]
    for other in dict.fromkeys(backends or []):
        if other == runtime:
            continue
        out.append(SpecChoice("none", 0, backend=other))
        out += [
            choice_with_defaults(d, k, ngram_max, ngram_min, confidence, k_max=k_max, backend=other) for d, k in grid
        ]
    return out


def table(summary: dict[str, Any], choices: list[SpecChoice]) -> list[dict[str, Any]]:
    """One row per configuration, plain first, then by throughput (fastest first). Plain decoding on
    another runtime (backend=) is a row of its own, like any configuration."""
    plain_tps = summary[PLAIN]["overall"]["throughput_tokens_per_s"]
    rows = []
    for c in [PLAIN_CHOICE] + [c for c in choices if c.name != PLAIN]:
        o = summary[c.name]["overall"]
        tps = o["throughput_tokens_per_s"]
        rows.append(
            {
                **c.to_dict(),
                "tokens_per_s": tps,
                "throughput_ratio": tps / plain_tps if tps and plain_tps else None,
                "speedup_median": o["speedup"]["median"],
                "speedup_p10": o["speedup"]["p10"],
                "speedup_p90": o["speedup"]["p90"],
                "alpha": o["alpha"],
                "tau": o["tau"],
                "identical": o["identical_to_plain"],
                "compared": o["compared_to_plain"],
                "steps_by_k": o.get("steps_by_k") or {},  # k=auto: what the controller chose (spekula.bench.emit)
            }
        )
    rows[1:] = sorted(rows[1:], key=lambda r: -(r["tokens_per_s"] or 0.0))
    return rows


def recommend(rows: list[dict[str, Any]], choices: list[SpecChoice], min_speedup: float) -> tuple[SpecChoice, str]:
    plain = rows[0]
    spec = [r for r in rows[1:] if r["tokens_per_s"]]
    if not spec:
        return PLAIN_CHOICE, "no other configuration produced a measurement; plain decoding"
    best = spec[0]
    ratio = best["throughput_ratio"] or 0.0
    if ratio < min_speedup:
        return PLAIN_CHOICE, (
            f"plain decoding: the fastest other configuration, {best['name']}, reached {ratio:.2f}x plain "
            "decoding's "
            f"throughput ({best['tokens_per_s']:.2f} vs {plain['tokens_per_s']:.2f} tok/s), below the required "
            f"{min_speedup:.2f}x"
        )
    choice = next(c for c in choices if c.name == best["name"])
    if choice.plain:
        return choice, (
            f"{best['name']}: {ratio:.2f}x plain decoding's throughput on the run's runtime "
            f"({best['tokens_per_s']:.2f} vs {plain['tokens_per_s']:.2f} tok/s), no speculation"
        )
    return choice, (
        f"{best['name']}: {ratio:.2f}x plain decoding's throughput ({best['tokens_per_s']:.2f} vs "
        f"{plain['tokens_per_s']:.2f} tok/s), "
        f"median per-prompt speedup {best['speedup_median']:.2f}x, α {_f(best['alpha'])}, τ {_f(best['tau'])}"
    )


def tuned_config(
    choice: SpecChoice,
    target: str,
    dtype: str,
    sampling: SamplingParams,
    runtime: str | None = None,
    exact: bool = False,
) -> dict[str, Any]:
    """The JSON object `spekula generate --config FILE` (and `serve --config`) accepts. runtime: the run's
    own; a choice measured with backend= records that one instead. llama.cpp computes in the GGUF's own
    types, so its dtype is float32 (a placeholder), as bench's runtime loader sets it."""
    from spekula.backends import LLAMACPP

    d = choice.to_dict()
    backend = d["backend"] or runtime
    return {
        "target": target,
        "draft": d["draft"],
        "k": d["k"],
        **choice.knob_values(),  # what the recommended configuration was measured with (draft_confidence too)
        "dtype": "float32" if backend == LLAMACPP else dtype,
        **{key: getattr(sampling, key) for key in SAMPLING_KEYS},
        "backend": backend,  # None: the runtime generate picks by default (what tune ran on, given the same machine)
        "exact": exact,
    }


def write_config(config: dict[str, Any], path: Path) -> None:
    assert tuple(config) == CONFIG_KEYS
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n")


def format_table(rows: list[dict[str, Any]], recommended: str) -> str:
    head = "| configuration | tok/s | vs plain | speedup median [p10, p90] | α | τ | identical |"
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        mark = " (recommended)" if r["name"] == recommended else ""
        ident = "n/a" if r["compared"] is None else f"{r['identical']}/{r['compared']}"
        lines.append(
            f"| {r['name']}{mark} | {_f(r['tokens_per_s'])} | {_f(r['throughput_ratio'])}x | "
            f"{_f(r['speedup_median'])}x [{_f(r['speedup_p10'])}, {_f(r['speedup_p90'])}] | {_f(r['alpha'])} | "
            f"{_f(r['tau'])} | {ident} |"
        )
    return "\n".join(lines)


def _f(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"
