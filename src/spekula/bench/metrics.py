"""Per-request results and their summaries.

Every per-request number comes from spekula.trace.RequestStats (in-process runs fill it from the
engine, endpoint runs from the stream's timestamps and the server's token counts), and every
aggregate is a RequestStats merged from them: α, τ, acceptance by position and tokens per second
are therefore the properties trace.py defines, never re-derived here. What this module adds:

- tpot_s: time per output token after the first, (total_s - ttft_s) / (output_tokens - 1);
- speedup: per prompt, tokens_per_s of the configuration / tokens_per_s of plain decoding on the
  same prompt in the same repeat (the ratio `spekula generate --compare` prints), then summarised
  by median and spread across prompts;
- decode_speedup: the same ratio of decode_tokens_per_s (prefill left out), for in-process runs;
- latency percentiles, wasted drafted tokens (drafted - accepted), CPU-seconds per 1,000 output
  tokens, peak resident memory, and how many greedy outputs equal plain decoding's.

Every column of a configuration's summary is computed over the same requests: its whole ones
(`ok`) on the prompts (and repeats) where no configuration failed. A failed request is counted as an
error; the other configurations' runs of that prompt are counted as excluded, so a prompt one side
could not answer weighs on neither side's numbers. Throughput over wall time needs every request
of the phase whole (the wall time includes the failed ones), so it is None when any failed or was
excluded.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from spekula.knobs import is_int
from spekula.trace import RequestStats

PERCENTILES = (50, 90, 99)


@dataclass
class RequestResult:
    """One request of one configuration."""

    prompt_id: str
    category: str
    config: str
    stats: RequestStats
    text: str
    token_ids: list[int] | None  # None for endpoints (they return text)
    repeat: int = 0
    order: int = 0  # position in the run, for checking the interleaving
    cpu_s: float | None = None  # process CPU time (all threads) during the request
    peak_rss_bytes: int | None = None
    error: str | None = None
    token_count_source: str = "engine"  # engine | usage (server-reported) | chunks (stream chunks counted)
    speedup: float | None = None  # tokens_per_s / plain's on the same prompt and repeat
    decode_speedup: float | None = None  # decode_tokens_per_s / plain's (None when prefill is not timed apart)
    identical: bool | None = None  # greedy only: output equals plain decoding's
    # Requests of this run before this one in its proposer memory's sequence (cold: of its repeat; warm: the prefix
    # and the reported ones before it; an endpoint: those this run sent it, on top of whatever it learnt before).
    requests_before: int | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def tokens_per_s(self) -> float | None:
        return self.stats.tokens_per_s

    @property
    def tpot_s(self) -> float | None:
        return tpot(self.stats)

    def to_dict(self) -> dict[str, Any]:
        return {
            "prompt_id": self.prompt_id,
            "category": self.category,
            "config": self.config,
            "repeat": self.repeat,
            "order": self.order,
            "error": self.error,
            "text": self.text,
            "token_ids": self.token_ids,
            "token_count_source": self.token_count_source,
            "tokens_per_s": self.tokens_per_s,
            "ttft_s": self.stats.ttft_s,
            "tpot_s": self.tpot_s,
            "latency_s": self.stats.total_s,
            "cpu_s": self.cpu_s,
            "peak_rss_bytes": self.peak_rss_bytes,
            "speedup": self.speedup,
            "decode_speedup": self.decode_speedup,
            "identical": self.identical,
            "requests_before": self.requests_before,
            "stats": self.stats.to_dict(),
        }


def tpot(stats: RequestStats) -> float | None:
    """Time per output token after the first: the decode speed a streaming user sees."""
    if stats.ttft_s is None or stats.output_tokens < 2:
        return None
    return (stats.total_s - stats.ttft_s) / (stats.output_tokens - 1)


def merge_stats(stats: Iterable[RequestStats]) -> RequestStats:
    """The RequestStats of a group of requests run one after another: its alpha / tau /
    acceptance_by_position / tokens_per_s are the group's.

    Additive fields are those whose default is zero (counters and stage times: summed), lists
    (per-position counts: summed element by element) and dicts (k -> steps: summed per key);
    fields that default to None (ttft_s, finish_reason, plain_pass_s) describe one request and
    stay None."""
    total = RequestStats()
    for s in stats:
        for f in fields(RequestStats):
            mine, theirs = getattr(total, f.name), getattr(s, f.name)
            if isinstance(mine, list):
                mine.extend([0] * (len(theirs) - len(mine)))
                for i, n in enumerate(theirs):
                    mine[i] += n
            elif isinstance(mine, dict):
                for k, n in theirs.items():
                    mine[k] = mine.get(k, 0) + n
            elif f.default == 0 and (is_int(mine) or isinstance(mine, float)):
                setattr(total, f.name, mine + theirs)
    return total


def percentiles(values: Sequence[float | None]) -> dict[str, float | None]:
    xs = [v for v in values if v is not None]
    out: dict[str, float | None]
    if not xs:
        out = {f"p{q}": None for q in PERCENTILES}
        return out | {"mean": None}
    arr = np.asarray(xs, dtype=np.float64)
    out = {f"p{q}": float(np.percentile(arr, q)) for q in PERCENTILES}
    return out | {"mean": float(arr.mean())}


def spread(values: Sequence[float | None]) -> dict[str, Any]:
    """Median and spread of per-prompt ratios (speedups)."""
    xs = [v for v in values if v is not None and v > 0]
    if not xs:
        return {"n": 0, "median": None, "p10": None, "p90": None, "min": None, "max": None, "geomean": None}
    arr = np.asarray(xs, dtype=np.float64)
    return {
        "n": len(xs),
        "median": float(np.median(arr)),
        "p10": float(np.percentile(arr, 10)),
        "p90": float(np.percentile(arr, 90)),
        "min": float(arr.min()),
        "max": float(arr.max()),
        "geomean": float(math.exp(np.log(arr).mean())),
    }


def span(values: Sequence[int | None]) -> list[int] | None:
    """[fewest, most] of the known values (requests before a group's requests), None when none is known."""
    known = [v for v in values if v is not None]
    return [min(known), max(known)] if known else None


def attach_comparisons(results: list[RequestResult], baseline: str, greedy: bool) -> None:
    """Fill `speedup`, `decode_speedup` (and, when greedy, `identical`) of every result against the
    baseline's run of the same prompt in the same repeat."""
    base = {(r.prompt_id, r.repeat): r for r in results if r.config == baseline and r.ok}
    for r in results:
        b = base.get((r.prompt_id, r.repeat))
        if b is None or not r.ok:
            continue
        r.speedup = ratio(r.tokens_per_s, b.tokens_per_s)
        r.decode_speedup = ratio(r.stats.decode_tokens_per_s, b.stats.decode_tokens_per_s)
        if greedy and r.token_ids is not None and b.token_ids is not None:
            r.identical = r.token_ids == b.token_ids
        elif greedy and (r.text or b.text):  # two empty texts show nothing: identity is not claimed
            r.identical = r.text == b.text


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def failed_keys(results: Iterable[RequestResult]) -> set[tuple[str, int]]:
    """(prompt_id, repeat) of every request that failed, in any configuration."""
    return {(r.prompt_id, r.repeat) for r in results if not r.ok}


def summarise(
    results: list[RequestResult],
    wall_s: float | None = None,
    failed: set[tuple[str, int]] | None = None,
) -> dict[str, Any]:
    """One group's numbers over its whole requests on prompts outside `failed` (default: the group's own failures).
    wall_s: the wall time the group took when its requests overlapped (endpoints under concurrency); throughput is
    then output tokens / wall_s, and None unless every request of the group is counted."""
    failed = failed_keys(results) if failed is None else failed
    whole = [r for r in results if r.ok]
    ok = [r for r in whole if (r.prompt_id, r.repeat) not in failed]
    merged = merge_stats(r.stats for r in ok)
    identical = [r.identical for r in ok if r.identical is not None]
    cpu = [r.cpu_s for r in ok if r.cpu_s is not None]
    rss = [r.peak_rss_bytes for r in ok if r.peak_rss_bytes is not None]
    tau = [r.stats.tau for r in ok]
    if wall_s:
        throughput = merged.output_tokens / wall_s if len(ok) == len(results) else None
    else:
        throughput = merged.tokens_per_s
    return {
        "requests": len(ok),
        "errors": len(results) - len(whole),
        "excluded": len(whole) - len(ok),  # whole, but another configuration failed on the same prompt and repeat
        "output_tokens": merged.output_tokens,
        "prompt_tokens": merged.prompt_tokens,
        "tokens_per_s": merged.tokens_per_s,  # output tokens / summed request time
        "throughput_tokens_per_s": throughput,  # output tokens / wall time (differs only under concurrency)
        "tokens_per_s_per_request": percentiles([r.tokens_per_s for r in ok]),
        "speedup": spread([r.speedup for r in ok]),
        "decode_speedup": spread([r.decode_speedup for r in ok]),
        "ttft_s": percentiles([r.stats.ttft_s for r in ok]),
        "tpot_s": percentiles([r.tpot_s for r in ok]),
        "latency_s": percentiles([r.stats.total_s for r in ok]),
        "alpha": merged.alpha,
        "tau": merged.tau,
        "tau_per_request": [t for t in tau if t is not None],
        "acceptance_by_position": merged.acceptance_by_position,
        "target_passes": merged.target_passes,
        "drafted": merged.drafted,
        "accepted": merged.accepted,
        "wasted_drafted": merged.drafted - merged.accepted,
        "wasted_fraction": (merged.drafted - merged.accepted) / merged.drafted if merged.drafted else None,
        "identical_to_plain": sum(identical) if identical else None,
        "compared_to_plain": len(identical) if identical else None,
        "cpu_s_per_1k_tokens": 1000.0 * sum(cpu) / merged.output_tokens if cpu and merged.output_tokens else None,
        "peak_rss_bytes": max(rss) if rss else None,
        "steps_by_k": dict(sorted(merged.k_chosen.items())),
        "requests_before": span([r.requests_before for r in ok]),
        "stage_s": {
            "prefill": merged.prefill_s,
            "draft": merged.draft_s,
            "score": merged.score_s,
            "accept": merged.accept_s,
            "advance": merged.advance_s,
        },
    }


def summarise_by_config(
    results: list[RequestResult], configs: list[str], walls: dict[str, float] | None = None
) -> dict[str, Any]:
    """{config: {"overall": {...}, "categories": {category: {...}}}}, categories in first-seen order."""
    out: dict[str, Any] = {}
    cats = list(dict.fromkeys(r.category for r in results))
    failed = failed_keys(r for r in results if r.config in configs)
    for name in configs:
        mine = [r for r in results if r.config == name]
        out[name] = {
            "overall": summarise(mine, (walls or {}).get(name), failed),
            "categories": {
                c: summarise([r for r in mine if r.category == c], failed=failed)
                for c in cats
                if any(r.category == c for r in mine)
            },
        }
    return out
