"""Where a greedy speculative output departs from plain decoding of the same target, and why.

A runtime that scores a block of tokens with other kernels than a single token (llama.cpp without
--exact; bf16 / fp16 PyTorch) rounds a token's logits differently in a verify pass than in a plain
step. Where the target's best tokens nearly tie, that rounding can flip the argmax and the two
outputs part ways with no bug in the verifier. Where they are far apart, rounding explains nothing:
that is a bug.

Evidence comes from the runs themselves: the engine's trace records, for every token a step decides,
the target's TOP_K best tokens and how far each trails the best in raw logits (StepRecord.target_top):
in the plain run from the one-token pass that chose the token, in the speculative run from the verify
pass's row. `TopLog` collects them by output position; `find_divergence` reads both at the first
differing position. Say plain chose A and the speculative run chose B there: in the plain run B
trailed A by m_plain, in the speculative run A trailed B by m_spec, so between the two passes the
difference of the two logits moved by m_plain + m_spec. The verdict:

- "near-tie" (kernel rounding): each run chose its own best token, the other run's token is among its
  TOP_K, and the move m_plain + m_spec (the known terms, if one run kept no record) is below
  NEAR_TIE_GAP;
- "divergence" (a bug?): anything else with a record;
- "unknown": no logits (an HTTP endpoint returns none).

The report also gives each run's top-2 logit gap there (best minus runner-up), the usual measure of
how close a call was. NEAR_TIE_GAP is in raw logits and sits above how far a block pass and a
one-token pass of llama.cpp's kernels move the difference of two logits
(tests/integration/test_divergence_real.py measures that on smollm2 and checks it stays below).

`guarantee` says beforehand which of two promises a run on a given target has, read from the runtime:
BIT_IDENTICAL where a block's logits equal one-token passes bit for bit (llama.cpp in exact mode, which
scores a block in pieces no wider than the width it checked at load), else NEAR_TIES: identical except
where the target's top two logits nearly tie and a pass over several tokens rounds them otherwise than
a one-token pass (llama.cpp's block kernels; the PyTorch runtimes' matrix kernels, which add the same
products in another order). `spekula generate --compare`, the server's `spec` object and the README
state it; `near_ties` lists a run's positions where that could happen.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from spekula.trace import Recorder, StepRecord

NEAR_TIE_GAP = 1.0  # raw logits: a flip whose two logits moved less than this counts as rounding (see above)
TOP_K = 8  # tokens recorded per position
NEAR_TIE, DIVERGENCE, UNKNOWN = "near-tie", "divergence", "unknown"
BIT_IDENTICAL, NEAR_TIES = "bit-identical", "identical-except-near-ties"  # Guarantee.kind
LABELS = {NEAR_TIE: "near-tie (kernel rounding)", DIVERGENCE: "DIVERGENCE (bug?)", UNKNOWN: "not classified"}

Ranked = list[tuple[int, float]]  # one position: (token id, how far its logit trails the best's), best first


def ranked(logits: torch.Tensor, k: int = TOP_K) -> list[Ranked]:
    """logits [R, V] -> per row, the best min(k, V) tokens and how far each trails the best."""
    top = torch.topk(logits.float(), min(k, logits.shape[-1]), dim=-1)  # values, indices: [R, k]
    leads = top.values[:, :1] - top.values  # [R, k], 0 for the best
    return [list(zip(ids.tolist(), lead.tolist(), strict=True)) for ids, lead in zip(top.indices, leads, strict=True)]


def top2_gap(row: Ranked) -> float | None:
    return row[1][1] if len(row) > 1 else None


def trail(row: Ranked, token: int | None) -> float | None:
    """How far `token`'s logit trails the best's at this position (None: not among the recorded)."""
    return next((lead for t, lead in row if t == token), None)


class TopLog:
    """A recorder that keeps StepRecord.target_top by output position, passing every record on to
    `inner` (e.g. the --trace file). Position len(output) holds the token that ended the run, where a
    stop token did (it is decided but not emitted)."""

    def __init__(self, inner: Recorder | None = None) -> None:
        self.inner = inner
        self.rows: list[Ranked] = []
        self._stop_row: Ranked | None = None

    def step(self, record: StepRecord) -> None:
        rows = record.target_top or []
        emitted = len(record.emitted)
        self.rows.extend(rows[:emitted])
        self._stop_row = rows[emitted] if len(rows) > emitted else None
        if self.inner is not None:
            self.inner.step(record)

    def request(self, summary: dict[str, Any]) -> None:
        if self.inner is not None:
            self.inner.request(summary)

    def at(self, position: int) -> Ranked | None:
        if position < len(self.rows):
            return self.rows[position]
        return self._stop_row if position == len(self.rows) else None


@dataclass
class Divergence:
    """The first output position where a speculative run departs from plain decoding."""

    position: int  # index of the first differing output token (character, for texts)
    plain_token: int | None  # the token plain decoding chose there (None: unknown)
    spec_token: int | None
    plain_text: str  # the token as text ("<end>": that output ended there)
    spec_text: str
    before: str  # the shared output text just before the position (its last characters)
    plain_gap: float | None = None  # target's top-2 logit gap there in the plain run (its one-token pass)
    spec_gap: float | None = None  # ... in the speculative run (the verify pass's row)
    plain_trail: float | None = None  # how far spec_token trailed plain's choice in the plain run (None: not in top)
    spec_trail: float | None = None  # how far plain_token trailed the speculative choice in that run
    plain_top: Ranked | None = None  # the plain run's TOP_K there
    spec_top: Ranked | None = None
    verdict: str = UNKNOWN  # NEAR_TIE, DIVERGENCE or UNKNOWN
    threshold: float = NEAR_TIE_GAP
    unit: str = "token"  # what position counts: output tokens, or characters (texts from an HTTP endpoint)

    @property
    def label(self) -> str:
        return LABELS[self.verdict]

    @property
    def moved(self) -> float | None:
        """How far the difference of the two tokens' logits moved between the runs (known terms)."""
        known = [m for m in (self.plain_trail, self.spec_trail) if m is not None]
        return sum(known) if known else None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "moved": self.moved, "label": self.label, "description": self.describe()}

    def describe(self) -> str:
        """One line: where, both tokens, both top-2 gaps, how far the pair moved, the verdict."""
        gaps = [
            f"{run} {g:.4g}" for run, g in (("plain", self.plain_gap), ("speculative", self.spec_gap)) if g is not None
        ]
        if not gaps:
            evidence = "no logits (an HTTP endpoint returns none)"
        else:
            evidence = f"target's top-2 logit gap: {', '.join(gaps)}"
            missing = [
                run
                for run, top, m in (
                    ("plain", self.plain_top, self.plain_trail),
                    ("speculative", self.spec_top, self.spec_trail),
                )
                if top is not None and m is None
            ]
            if missing:
                evidence += f"; the other run's token is not in the {' or '.join(missing)} run's top {TOP_K}"
            elif self.moved is not None:
                moved = f"{self.moved:.4g} between the runs (near-tie below {self.threshold})"
                evidence += f"; the two tokens' logits moved {moved}"
        return (
            f"first difference at output {self.unit} {self.position} (after {self.before!r}): "
            f"plain {self.plain_text!r}{_id(self.plain_token)}, speculative {self.spec_text!r}{_id(self.spec_token)}; "
            f"{evidence} -> {self.label}"
        )


@dataclass(frozen=True)
class Guarantee:
    """What greedy output on a target promises against plain decoding of the same target on the same runtime."""

    kind: str  # BIT_IDENTICAL or NEAR_TIES
    text: str  # the promise and why, in a sentence
    width: int | None = None  # BIT_IDENTICAL: the widest block scored in one pass (Backend.single_pass_width)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def guarantee(target: Any, shared: bool = False, any_rows: bool = False) -> Guarantee:
    """The promise a run on `target` has (see the module's docstring), from its capabilities alone.
    shared: its passes may also carry other requests (a batching server) or start from a kept prompt cache,
    which change how a token's row is computed just as a verified block does. any_rows: that cache reuses rows
    whatever pass computed them (--prompt-cache-any-rows; spekula.prompt_cache)."""
    width = target.single_pass_width()
    if target.capabilities.block_invariant and width is not None:
        cache = ""
        if shared and target.capabilities.pass_kind_widths:
            cache = (
                "; with --prompt-cache-any-rows a request may reuse prompt rows that a pass of another width "
                "computed, so its answer can depend on the requests served before it, as with llama.cpp's "
                "cache_prompt (plain decoding's with it too)"
                if any_rows
                else "; the prompt cache reuses only rows that a fresh prefill of the prompt computes alike, so an "
                "answer does not depend on the requests served before it"
            )
        return Guarantee(
            BIT_IDENTICAL,
            "bit-identical to plain decoding on this runtime: exact mode scores a block in passes of at most "
            f"{width} tokens, whose logits equal one-token passes bit for bit (the width checked at load), and keeps "
            f"each request's cache in a KV stream of its own, so batched requests get the bits they get alone{cache}",
            width,
        )
    passes = "a verified block, a batch of requests or a kept prompt's cache" if shared else "a verified block"
    if not target.capabilities.block_invariant:
        why = f"a pass over several tokens ({passes}) runs other kernels than a one-token pass"
        remedy = "; exact mode (--exact, llama.cpp's default) makes them bit-identical"
    else:
        why = f"a pass over several tokens ({passes}) adds the same products as a one-token pass in another order"
        remedy = ""
    return Guarantee(
        NEAR_TIES,
        f"identical to plain decoding except where the target's top two logits nearly tie: {why}, so its logits "
        f"differ in the last bits and there the two runs can choose differently{remedy}",
    )


def near_ties(log: TopLog, end: int | None = None, gap: float = NEAR_TIE_GAP) -> list[tuple[int, float]]:
    """(output position, top-2 logit gap) wherever a run's target had its top two within `gap` (raw logits)
    before position `end` (None: every recorded position): where a NEAR_TIES run could part from plain decoding."""
    rows = log.rows if end is None else log.rows[:end]
    gaps = ((i, top2_gap(row)) for i, row in enumerate(rows))
    return [(i, g) for i, g in gaps if g is not None and g < gap]


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """Index of the first element where a and b differ (one ending counts), None if equal."""
    if list(a) == list(b):
        return None
    return next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def find_divergence(
    plain_ids: Sequence[int],
    spec_ids: Sequence[int],
    plain_log: TopLog | None = None,
    spec_log: TopLog | None = None,
    decode: Callable[[list[int]], str] | None = None,
    plain_row: Ranked | None = None,
) -> Divergence | None:
    """The first difference of two greedy outputs, or None if they are equal.

    plain_log / spec_log: what each run's target thought per position (None: not recorded).
    decode: token ids -> text (default: the ids as text). plain_row: the plain run's row at the
    position when no log was kept (e.g. from replay_plain)."""
    i = first_difference(plain_ids, spec_ids)
    if i is None:
        return None
    decode = decode or (lambda ids: " ".join(map(str, ids)))
    plain_row = plain_row or (plain_log.at(i) if plain_log is not None else None)
    spec_row = spec_log.at(i) if spec_log is not None else None
    plain_token = plain_ids[i] if i < len(plain_ids) else (plain_row[0][0] if plain_row else None)
    spec_token = spec_ids[i] if i < len(spec_ids) else (spec_row[0][0] if spec_row else None)
    return Divergence(
        position=i,
        plain_token=plain_token,
        spec_token=spec_token,
        plain_text=_token_text(plain_ids, i, decode),
        spec_text=_token_text(spec_ids, i, decode),
        before=decode(list(plain_ids[:i]))[-40:],
        plain_gap=top2_gap(plain_row) if plain_row else None,
        spec_gap=top2_gap(spec_row) if spec_row else None,
        plain_trail=trail(plain_row, spec_token) if plain_row else None,
        spec_trail=trail(spec_row, plain_token) if spec_row else None,
        plain_top=plain_row,
        spec_top=spec_row,
        verdict=classify(plain_token, spec_token, plain_row, spec_row),
    )


def classify(plain_token: int | None, spec_token: int | None, plain_row: Ranked | None, spec_row: Ranked | None) -> str:
    """NEAR_TIE, DIVERGENCE or UNKNOWN (no row): see the module's docstring."""
    sides = [
        (row, mine, other)
        for row, mine, other in ((plain_row, plain_token, spec_token), (spec_row, spec_token, plain_token))
        if row is not None
    ]
    if not sides:
        return UNKNOWN
    moved = 0.0
    for row, mine, other in sides:
        lead = trail(row, other)
        if trail(row, mine) != 0.0 or lead is None:  # a run that did not take its best, or a far-off token
            return DIVERGENCE
        moved += lead
    return NEAR_TIE if moved < NEAR_TIE_GAP else DIVERGENCE


def replay_plain(target: Any, prompt_ids: Sequence[int], output_prefix: Sequence[int]) -> Ranked:
    """The target's row after prompt + output_prefix, computed as plain decoding computes it: the
    prompt but its last token in one prefill, then one token per pass (a prefill over the whole
    prefix would use block kernels, which a runtime that is not block-invariant rounds differently).
    Costs one pass per output token: for callers that kept no TopLog."""
    committed = list(prompt_ids) + list(output_prefix)
    seq = target.new_sequence()
    try:
        prefill = committed[: len(prompt_ids) - 1]
        if prefill:
            seq.forward(prefill, num_logits=1)
        for token in committed[len(prefill) :]:
            logits = seq.forward([token], num_logits=1)
        return ranked(logits)[-1]
    finally:
        seq.release()


def _token_text(ids: Sequence[int], i: int, decode: Callable[[list[int]], str]) -> str:
    if i >= len(ids):
        return "<end>"
    # The token's text in context: a token may be part of a multi-byte character or carry a leading space.
    return decode(list(ids[: i + 1]))[len(decode(list(ids[:i]))) :] or decode([ids[i]])


def _id(token: int | None) -> str:
    return "" if token is None else f" (id {token})"
