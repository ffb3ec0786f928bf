"""The speculative loop. Every step is five stages:

1. draft    - the proposer offers up to k tokens (and q, where it has one);
2. score    - the target runs ONE forward over the pending token plus the draft -> p at k + 1 positions;
3. accept   - the verifier keeps the longest prefix that passes;
4. resample - a recovered token at the first rejection, or a bonus token after a full accept;
5. advance  - commit, roll both KV caches back to exactly the committed tokens, tell the proposer
              and the controller, record the step.

Plain decoding is k = 0 through the same code, so baselines are measured fairly. The engine sees
token ids only: tokenizing, chat templates, detokenizing and stop strings live in spekula.text.

State between steps: `committed` holds prompt + output; the target's cache holds committed[:-1].
The last committed token is *pending*: it is fed at the start of the next score pass.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch

from spekula.backends.base import Backend
from spekula.config import SamplingParams, SpecConfig, StopConfig
from spekula.control import AdaptiveK, Controller, CostModel, FixedK
from spekula.errors import ConfigError
from spekula.proposers.base import EMPTY_DRAFT, Draft, Proposer, ProposerFactory
from spekula.sampling import probabilities
from spekula.trace import DraftedToken, Recorder, RequestStats, StepRecord
from spekula.verify import Verdict, verify_greedy, verify_sampled


class Engine:
    def __init__(self, target: Backend, proposer: ProposerFactory | None = None, spec: SpecConfig = SpecConfig()) -> None:
        self.target = target
        self.proposer = proposer
        self.spec = spec
        self.costs = CostModel()  # measured costs, shared by this engine's requests (used by --k auto)

    def calibrate(self) -> None:
        """Measure target passes of 1 .. k_max + 1 tokens and a draft step on this machine."""
        draft = self.proposer.draft_backend if self.proposer is not None else None
        self.costs.calibrate(self.target, draft, k_max=self.spec.k_max)

    def new_controller(self) -> Controller:
        if self.proposer is None:
            return FixedK(0)
        if self.spec.k is None:
            if not self.costs.target_s:
                self.calibrate()
            return AdaptiveK(self.costs, k_max=self.spec.k_max)
        return FixedK(self.spec.k)

    def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = SamplingParams(),
        stop: StopConfig = StopConfig(),
        recorder: Recorder | None = None,
        controller: Controller | None = None,
    ) -> "Generation":
        """Start a request. Iterate the result to run it step by step (each item: the new token ids).

        controller: chooses k before each step; default: the engine's (from SpecConfig).
        """
        if not prompt_ids:
            raise ConfigError("the prompt is empty: give at least one token")
        if len(prompt_ids) >= self.target.context_length:
            raise ConfigError(
                f"the prompt has {len(prompt_ids)} tokens but the model's context holds {self.target.context_length}; "
                "shorten the prompt"
            )
        bad = [t for t in prompt_ids if not 0 <= t < self.target.vocab_size]
        if bad:
            raise ConfigError(f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.target.vocab_size})")
        return Generation(self, list(prompt_ids), sampling, stop, recorder, controller or self.new_controller())


class Generation:
    """One request in flight. Iterating runs it; afterwards `token_ids`, `finish_reason`, `stats` hold
    the result. Closing the iterator early (stop string, client gone) frees the caches at once."""

    def __init__(
        self, engine: Engine, prompt_ids: list[int], sampling: SamplingParams, stop: StopConfig,
        recorder: Recorder | None, controller: Controller,
    ):
        self.engine = engine
        self.prompt_ids = prompt_ids
        self.sampling = sampling
        self.stop = stop
        self.recorder = recorder
        self.controller = controller
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stats = RequestStats(prompt_tokens=len(prompt_ids))
        self.generator = torch.Generator()
        if sampling.seed is None:
            self.generator.seed()  # nondeterministic, without touching torch's global RNG
        else:
            self.generator.manual_seed(sampling.seed)
        self.stop_ids = set(stop.stop_token_ids) | (set() if stop.ignore_eos else set(engine.target.eos_token_ids))
        self._steps = self._run()

    def __iter__(self) -> Iterator[list[int]]:
        return self._steps

    def __next__(self) -> list[int]:
        return next(self._steps)

    def close(self) -> None:
        self._steps.close()

    def run(self) -> "Generation":
        """Run to the end (no streaming)."""
        for _ in self._steps:
            pass
        return self

    def _run(self) -> Iterator[list[int]]:
        engine, stats = self.engine, self.stats
        # Kept on self so tests and tools can inspect the caches between steps.
        target = self.target_sequence = engine.target.new_sequence()
        proposer = self.proposer = engine.proposer.create() if engine.proposer else None
        controller = self.controller
        committed = list(self.prompt_ids)
        start = time.perf_counter()
        try:
            if len(committed) > 1:
                target.forward(committed[:-1], num_logits=1)
            stats.prefill_s = time.perf_counter() - start
            step = 0
            while self.finish_reason is None:
                budget = min(self.stop.max_tokens - len(self.token_ids), target.context_length - len(committed))
                if budget <= 0:
                    self.finish_reason = "length"
                    break
                k = min(controller.choose_k(), budget - 1)
                position = len(committed)

                t0 = time.perf_counter()
                draft = self._draft(proposer, committed, k)
                t1 = time.perf_counter()
                logits = self._score(target, committed[-1], draft)  # [k' + 1, V]
                t2 = time.perf_counter()
                verdict, p = self._accept(draft, logits)
                t3 = time.perf_counter()
                emitted = self._advance(target, proposer, committed, draft, verdict)
                t4 = time.perf_counter()

                controller.observe(k, len(draft), verdict.num_accepted, t1 - t0, t2 - t1)
                stats.record_step(k, len(draft), verdict.num_accepted, len(emitted), controller.predicted_speedup)
                stats.draft_s += t1 - t0
                stats.score_s += t2 - t1
                stats.accept_s += t3 - t2
                stats.advance_s += t4 - t3
                if stats.ttft_s is None:
                    stats.ttft_s = t4 - start
                if self.recorder is not None:
                    timings = {"draft": t1 - t0, "score": t2 - t1, "accept": t3 - t2, "advance": t4 - t3}
                    self.recorder.step(_step_record(step, position, k, draft, logits, p, verdict, emitted, self.sampling, timings, controller.predicted_speedup))
                step += 1
                if emitted:
                    yield emitted
        finally:
            stats.total_s = time.perf_counter() - start
            stats.plain_pass_s = engine.costs.target_s.get(1)
            stats.finish_reason = self.finish_reason = self.finish_reason or "abort"
            target.release()
            if proposer is not None:
                proposer.close()
            if self.recorder is not None:
                self.recorder.request({"prompt_tokens": len(self.prompt_ids), "token_ids": self.token_ids, **stats.to_dict()})

    # -- the stages -----------------------------------------------------------------------------

    def _draft(self, proposer: Proposer | None, committed: list[int], k: int) -> Draft:
        if proposer is None or k <= 0:
            return EMPTY_DRAFT
        draft = proposer.propose(committed, k, self.sampling, self.generator)
        if len(draft) > k:  # a proposer that over-delivers would break the budget checks above
            draft = Draft(draft.tokens[:k], None if draft.probs is None else draft.probs[:k])
        return draft

    def _score(self, target, pending: int, draft: Draft) -> torch.Tensor:
        """ONE target pass over the pending token and the whole draft."""
        return target.forward([pending, *draft.tokens], num_logits=len(draft) + 1)

    def _accept(self, draft: Draft, logits: torch.Tensor) -> tuple[Verdict, torch.Tensor | None]:
        """Accept + resample: returns the verdict and p (None when greedy and nobody needs it)."""
        tokens = torch.tensor(draft.tokens, dtype=torch.long)
        if self.sampling.greedy:
            p = probabilities(logits, self.sampling) if self.recorder is not None else None
            return verify_greedy(tokens, logits), p
        p = probabilities(logits, self.sampling)  # [k' + 1, V]
        return verify_sampled(tokens, draft.probs, p, self.generator), p

    def _advance(self, target, proposer: Proposer | None, committed: list[int], draft: Draft, verdict: Verdict) -> list[int]:
        """Commit, roll back to the committed state, apply stop conditions; returns what to emit."""
        emitted = verdict.emitted(draft.tokens)
        target.truncate(len(committed) + verdict.num_accepted)  # pending + accepted; the new token is pending
        committed.extend(emitted)
        if proposer is not None:
            proposer.observe(committed, verdict)
        for i, token in enumerate(emitted):
            if token in self.stop_ids:
                emitted = emitted[:i]
                self.finish_reason = "stop"
                break
        room = self.stop.max_tokens - len(self.token_ids)
        if len(emitted) >= room and self.finish_reason is None:
            self.finish_reason = "length"
        emitted = emitted[:room]
        self.token_ids.extend(emitted)
        return emitted


def _step_record(step, position, k, draft: Draft, logits, p, verdict: Verdict, emitted, sampling: SamplingParams, timings, predicted) -> StepRecord:
    """Everything a reader needs to see why the step went as it did."""
    drafted = [
        DraftedToken(t, None if draft.probs is None else float(draft.probs[i, t]), float(p[i, t]))
        for i, t in enumerate(draft.tokens)
    ]
    rejection = None
    n = verdict.num_accepted
    if n < len(draft):
        token = draft.tokens[n]
        top_p, top_ids = torch.topk(p[n], 5)
        if sampling.greedy:
            why = f"target argmax is {int(torch.argmax(logits[n]))}, not {token}"
        else:
            q = drafted[n].q if drafted[n].q is not None else 1.0
            ratio = min(1.0, drafted[n].p / q) if q > 0 else 1.0
            why = f"rejected by the coin: accept probability min(1, p/q) = {ratio:.4f}"
        rejection = {
            "position": n,
            "token": token,
            "why": why,
            "target_top5": [[int(i), float(v)] for v, i in zip(top_p, top_ids)],
        }
    kind = "plain" if not len(draft) else ("bonus" if verdict.bonus else "recovered")
    return StepRecord(
        step=step, position=position, k=k, drafted=drafted, accepted=n, next_token=verdict.next_token,
        next_kind=kind, next_p=float(p[n, verdict.next_token]), rejection=rejection, emitted=list(emitted), timings=timings, predicted_speedup=predicted,
    )
