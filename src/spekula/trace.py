"""What happened: one record per step, one summary per request.

Derived numbers live here and only here, so the CLI, traces, the server and reports agree:
- alpha (α): accepted / drafted, the fraction of drafted tokens the target kept;
- tau (τ): 1 + accepted / target_passes, tokens emitted per target decode pass (recovered and
  bonus tokens included; a pass with no draft counts, so plain decoding has τ = 1);
- tokens_per_s: output tokens / wall time from the request's start (prefill included), the same
  definition for plain and speculative runs;
- decode_tokens_per_s: output tokens / (wall time - prefill time), the speed of decoding alone.
  Prefill is the same work in every configuration without a draft model, and where it is slow
  (llama.cpp, bf16 on a CPU) its jitter moves tokens_per_s by more than speculation does;
- ttft_s: time from the request's start to its first output token;
- predicted_speedup: the controller's mean prediction over the request's steps (--k auto);
- measured_speedup: output tokens per second of decoding (draft + score + accept + advance)
  times plain_pass_s, the measured cost of a one-token target pass: speedup over plain decoding as
  this request's own timings imply it. `spekula generate --compare` measures the real ratio.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import IO, Any, Protocol

from spekula.draft_class import DraftClass


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the prompt cache already held (not prefilled again)
    output_tokens: int = 0
    target_passes: int = 0  # decode passes of the target (the prefill is not counted)
    drafts: int = 0  # passes that verified at least one drafted token
    drafted: int = 0
    accepted: int = 0
    drafted_per_position: list[int] = field(default_factory=list)  # [i]: drafts that reached position i
    accepted_per_position: list[int] = field(default_factory=list)  # [i]: ... and had it accepted
    k_chosen: dict[int, int] = field(default_factory=dict)  # k -> number of steps
    prefill_s: float = 0.0
    prefill_output_tokens: int = 0  # output tokens of the pass that finished the prefill (its first step)
    draft_s: float = 0.0
    score_s: float = 0.0
    accept_s: float = 0.0
    advance_s: float = 0.0
    ttft_s: float | None = None
    total_s: float = 0.0
    finish_reason: str | None = None
    plain_pass_s: float | None = None  # measured seconds of a one-token target pass (cost model)
    predicted_speedup_sum: float = 0.0
    predicted_steps: int = 0

    def record_step(
        self, k: int, num_drafted: int, num_accepted: int, num_emitted: int, predicted_speedup: float | None = None
    ) -> None:
        self.target_passes += 1
        if predicted_speedup is not None:
            self.predicted_speedup_sum += predicted_speedup
            self.predicted_steps += 1
        self.k_chosen[k] = self.k_chosen.get(k, 0) + 1
        self.output_tokens += num_emitted
        if num_drafted:
            self.drafts += 1
            self.drafted += num_drafted
            self.accepted += num_accepted
            for counts in (self.drafted_per_position, self.accepted_per_position):
                counts.extend([0] * (num_drafted - len(counts)))
            for i in range(num_drafted):
                self.drafted_per_position[i] += 1
            for i in range(num_accepted):
                self.accepted_per_position[i] += 1

    @property
    def alpha(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def tau(self) -> float | None:
        return 1.0 + self.accepted / self.target_passes if self.target_passes else None

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position, strict=True)]

    @property
    def tokens_per_s(self) -> float | None:
        return self.output_tokens / self.total_s if self.total_s > 0 else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """None where the prefill was not timed apart (a request measured through an endpoint)."""
        return decode_tokens_per_s(self.output_tokens - self.prefill_output_tokens, self.total_s, self.prefill_s)

    @property
    def predicted_speedup(self) -> float | None:
        return self.predicted_speedup_sum / self.predicted_steps if self.predicted_steps else None

    @property
    def measured_speedup(self) -> float | None:
        decode_s = self.draft_s + self.score_s + self.accept_s + self.advance_s
        if not self.plain_pass_s or decode_s <= 0:
            return None
        return (self.output_tokens - self.prefill_output_tokens) / decode_s * self.plain_pass_s

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["k_chosen"] = {str(k): v for k, v in sorted(self.k_chosen.items())}
        d.update(
            alpha=self.alpha,
            tau=self.tau,
            tokens_per_s=self.tokens_per_s,
            decode_tokens_per_s=self.decode_tokens_per_s,
            acceptance_by_position=self.acceptance_by_position,
            predicted_speedup=self.predicted_speedup,
            measured_speedup=self.measured_speedup,
        )
        del d["predicted_speedup_sum"], d["predicted_steps"]
        return d


def decode_tokens_per_s(output_tokens: int, total_s: float, prefill_s: float) -> float | None:
    """Output tokens per second after the prefill (RequestStats.decode_tokens_per_s, and the same
    number from a results.json's stats)."""
    decode_s = total_s - prefill_s
    return output_tokens / decode_s if prefill_s > 0 and decode_s > 0 else None


@dataclass
class DraftedToken:
    token: int
    q: float | None  # draft probability of the token (None: deterministic proposer)
    p: float  # target probability of the token at that position


@dataclass
class StepRecord:
    """One speculative step, as --trace writes it."""

    step: int
    position: int  # committed tokens before the step
    k: int  # draft length asked for
    draft_class: DraftClass | None  # what the proposer knew of its draft beforehand (e.g. 4-gram; None: nothing)
    drafted: list[DraftedToken]
    accepted: int
    next_token: int
    next_kind: str  # "recovered" (after a rejection), "bonus" (all accepted) or "plain" (nothing drafted)
    next_p: float  # target probability of the recovered / bonus token
    rejection: dict[str, Any] | None  # position, token, why, the target's top-5 alternatives
    emitted: list[int]
    timings: dict[str, float]  # seconds: draft, score, accept, advance
    predicted_speedup: float | None = None  # the controller's prediction for the chosen k
    reason: str | None = None  # why k was chosen: "speculate: k=7 predicted 1.80x", "probe: ...", "no draft: no match"
    # per token the step decided (the accepted ones, then the recovered / bonus one): the target's best
    # tokens there, best first, as (id, how far its raw logit trails the best's); spekula.divergence reads it
    target_top: list[list[tuple[int, float]]] | None = None
    # a shadow draft settled by this step's tokens (spekula.shadow): position, draft_class, tokens, drafted, accepted
    shadow: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        """As --trace writes it: the draft class by its name ("4-gram")."""
        record = asdict(self)
        record["draft_class"] = None if self.draft_class is None else self.draft_class.name
        return {"type": "step", **record}


class Recorder(Protocol):
    def step(self, record: StepRecord) -> None: ...

    def request(self, summary: dict[str, Any]) -> None: ...


class JsonlTrace:
    """Writes one JSON object per line: every step, then the request summary."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream

    def step(self, record: StepRecord) -> None:
        self.stream.write(json.dumps(record.to_dict()) + "\n")

    def request(self, summary: dict[str, Any]) -> None:
        self.stream.write(json.dumps({"type": "request", **summary}) + "\n")
        self.stream.flush()


class ListTrace:
    """Keeps records in memory (tests, bench)."""

    def __init__(self) -> None:
        self.steps: list[StepRecord] = []
        self.requests: list[dict[str, Any]] = []

    def step(self, record: StepRecord) -> None:
        self.steps.append(record)

    def request(self, summary: dict[str, Any]) -> None:
        self.requests.append(summary)
