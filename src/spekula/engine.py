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
The last committed token is *pending*: it is fed at the start of the next score pass. The first
step's pass also carries what is left of the prompt, in front of the pending token.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, replace

import torch

from spekula.backends.base import Backend, Sequence
from spekula.config import SamplingParams, SpecConfig, StopConfig
from spekula.control import NO_DRAFT_REASON, AdaptiveK, Controller, FixedK
from spekula.cost import CostModel
from spekula.divergence import ranked
from spekula.draft_class import NO_DRAFT, DraftClass
from spekula.limits import check_prompt
from spekula.noise import request_noise
from spekula.prefill_plan import PrefillPlan, TurnMarkers
from spekula.prompt_cache import PromptCache
from spekula.proposers.base import EMPTY_DRAFT, Draft, Proposer, ProposerFactory
from spekula.sampling import probabilities
from spekula.shadow import SHADOW_MIN_MATCH, ShadowDraft
from spekula.trace import DraftedToken, Recorder, RequestStats, StepRecord
from spekula.verify import Verdict, verify_greedy, verify_positional

log = logging.getLogger(__name__)


class Engine:
    def __init__(
        self,
        target: Backend,
        proposer: ProposerFactory | None = None,
        spec: SpecConfig = SpecConfig(),
        markers: TurnMarkers | None = None,
    ) -> None:
        """markers: where the chat template puts the assistant's messages in a prompt (PromptCache.plan)."""
        self.target = target
        self.proposer = proposer
        width = target.single_pass_width()
        if spec.k is None and width is not None and width - 1 < spec.k_max:
            # k=auto drafts at most what one pass verifies: a wider block would be scored in several passes
            # one after another, all of them paid even when its first token is rejected, while shorter
            # steps stop there and draft again from what was accepted.
            spec = replace(spec, k_max=max(1, width - 1))
        self.spec = spec
        self.costs = CostModel()  # measured costs, shared by this engine's requests (used by --k auto)
        # this engine's requests only
        self.prompt_cache = PromptCache(
            target, enabled=spec.prompt_cache, any_rows=spec.prompt_cache_any_rows, markers=markers
        )
        self._max_batch = 1  # the widest batch the last calibrate measured for

    def calibrate(self, max_batch: int = 1) -> None:
        """Measure target passes of up to k_max + 1 tokens (CostModel.calibrate says which widths) and a
        draft step on this machine (and, for a batching server, passes up to max_batch x (k_max + 1) rows)."""
        self._max_batch = max_batch
        self._measure(max_batch)

    def _measure(self, max_batch: int, interrupted: Callable[[], bool] | None = None) -> bool:
        draft = self.proposer.draft_backend if self.proposer is not None else None
        rows = max_batch * (self.spec.k_max + 1) if max_batch > 1 else 0
        return self.costs.calibrate(self.target, draft, k_max=self.spec.k_max, max_rows=rows, interrupted=interrupted)

    def remeasure_if_stale(self, interrupted: Callable[[], bool] | None = None) -> bool:
        """Measure the pass costs again where the table is stale (CostModel.stale: the one-token pass drifted
        from its calibrated time). Only between requests, never inside one: it takes seconds
        (scripts/experiments/recalibration_cost.py measures it on llama.cpp), a request that waited for it would
        pay them, and a batching server's running requests would all stall. A server calls it when idle, and
        interrupted (asked before each pass) lets a request that arrives stop it, the table unchanged;
        until then every width follows the one-token pass's drift (CostModel). The widths one request
        drafts are measured: a batching server's wide widths keep their start-up times, scaled by the
        drift (measuring them again would take many times as long). Returns whether it measured."""
        if self.proposer is None or self.spec.k is not None or not self.costs.stale():
            return False
        drifted, started = self.costs.drift, time.perf_counter()
        measured = self._measure(1, interrupted)
        # logged: the passes ran while the server was idle, so a benchmark that alternates servers on one machine can
        # see which other server's request they shared the cores with
        log.info(
            "the one-token pass ran at %.2fx its measured time: pass costs measured again while idle, %s after %.2f s",
            drifted,
            "done" if measured else "stopped by a request",
            time.perf_counter() - started,
        )
        return measured

    def new_controller(self) -> Controller:
        if self.proposer is None:
            return FixedK(0)
        if self.spec.k is None:
            if not self.costs.target_s:
                self._measure(self._max_batch)
            return AdaptiveK(self.costs, k_max=self.spec.k_max)
        return FixedK(self.spec.k)

    def generate(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = SamplingParams(),
        stop: StopConfig = StopConfig(),
        recorder: Recorder | None = None,
        controller: Controller | None = None,
        namespace: str = "",
        plain: bool = False,
    ) -> Generation:
        """Start a request. Iterate the result to run it step by step (each item: the new token ids).

        controller: chooses k before each step; default: the engine's (from SpecConfig).
        namespace: whose earlier requests the proposer may draft from (ProposerFactory.create).
        plain: decode plainly, with no proposer at all (a server request's `spec`), whatever the engine drafts with.
        """
        started = time.perf_counter()
        check_prompt(prompt_ids, self.target.vocab_size, self.target.context_length)
        controller = FixedK(0) if plain else controller or self.new_controller()  # an uncalibrated engine measures here
        setup_s = time.perf_counter() - started
        return Generation(self, list(prompt_ids), sampling, stop, recorder, controller, namespace, setup_s, plain)


class Generation:
    """One request in flight. Iterating runs it; afterwards `token_ids`, `finish_reason`, `stats` hold
    the result. Closing the iterator early (stop string, client gone) frees the caches at once."""

    def __init__(
        self,
        engine: Engine,
        prompt_ids: list[int],
        sampling: SamplingParams,
        stop: StopConfig,
        recorder: Recorder | None,
        controller: Controller,
        namespace: str = "",
        setup_s: float = 0.0,
        plain: bool = False,
    ):
        """setup_s: what starting the request cost before this (Engine.generate: its checks and controller),
        counted into its time (stats.ttft_s, total_s) as its caller waited for it."""
        self.engine = engine
        self.namespace = namespace
        self.prompt_ids = prompt_ids
        self.sampling = sampling
        self.stop = stop
        self.recorder = recorder
        self.controller = controller
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self.stats = RequestStats(prompt_tokens=len(prompt_ids))
        # One uniform number per output position, from the seed (or a random one): a seeded request's text does not
        # depend on k, batching or the proposer (spekula.noise, spekula.verify).
        self.noise = request_noise(sampling.seed)
        self.stop_ids = set(stop.stop_token_ids) | (set() if stop.ignore_eos else set(engine.target.eos_token_ids))
        # opened by the first prefill chunk (the first plan() prefills in one)
        self.target_sequence: Sequence | None = None
        self.proposer: Proposer | None = None
        self.plain = plain  # no proposer for this request (Engine.generate's plain)
        self._committed = list(prompt_ids)  # prompt + output; the target's cache holds all but the last
        self._prefill = Prefill(setup_s)  # where the prompt's prefill stands, and the request's clock
        self._plan: PrefillPlan | None = None  # how its prefill computes the prompt's rows (PromptCache.plan)
        self._step = 0
        # (committed length, its draft class, the most tokens its draft can hold): _draft_class_and_length
        self._class_at: tuple[int, DraftClass | None, int | None] | None = None
        self._shadow: ShadowDraft | None = None  # a free draft not verified, until emitted tokens settle it
        self._finished = False
        self._steps = self._run()

    def __iter__(self) -> Iterator[list[int]]:
        return self._steps

    def __next__(self) -> list[int]:
        return next(self._steps)

    def close(self) -> None:
        self._steps.close()
        self._finish()  # also when the steps were driven through plan() / complete()

    @property
    def done(self) -> bool:
        """Nothing is left to run: a stop token, max_tokens, a full context, a stop string (the text
        layer sets finish_reason) or close(). Known right after the complete() that got there."""
        return self.finish_reason is not None

    def run(self) -> Generation:
        """Run to the end (no streaming)."""
        for _ in self._steps:
            pass
        return self

    def _run(self) -> Generator[list[int], None, None]:
        try:
            while (step := self.plan()) is not None:
                emitted = self.complete(step, step.score())
                if emitted:
                    yield emitted
        finally:
            self._finish()

    # -- one step in two halves, so a scheduler can batch the score pass of many requests -------

    def outlook(self) -> tuple[list[float], int] | None:
        """What a batching scheduler weighs to choose this request's k (CostModel.best_ks): its
        controller's expected acceptance of the next draft by position, and the longest draft it may
        make (the controller's cap, the tokens left); None when it has nothing to draft."""
        if self.finish_reason is not None or self.proposer is None or not self.ready:
            return None
        outlook = self.controller.outlook(*self._draft_class_and_length())
        if outlook is None:
            return None
        acceptance, k_cap = outlook
        return acceptance, min(k_cap, self._budget() - 1)

    def _draft_class_and_length(self) -> tuple[DraftClass | None, int | None]:
        """The proposer's draft class for the committed tokens and the most tokens its draft can hold
        (Proposer.draft_length), asked once per step (outlook() and plan() both need them in a batching
        server's round)."""
        if self.proposer is None:
            return None, None
        length = len(self._committed)
        if self._class_at is None or self._class_at[0] != length:
            committed = self._committed
            self._class_at = (length, self.proposer.draft_class(committed), self.proposer.draft_length(committed))
        return self._class_at[1], self._class_at[2]

    def _budget(self) -> int:
        """Tokens this request may still emit: max_tokens, and room in the target's context."""
        assert self.target_sequence is not None  # opened by the first prefill chunk, before any step
        return min(
            self.stop.max_tokens - len(self.token_ids), self.target_sequence.context_length - len(self._committed)
        )

    def plan(self, k: int | None = None, why: str | None = None) -> PlannedStep | None:
        """Stages 1-2 up to the target pass: choose k (or take the caller's), draft, and say what the
        score pass must run. None when the request is finished. What prefill() has not prefilled of
        the prompt goes into the first step's pass, in front of the pending token and the draft (one
        pass, as llama.cpp's own loop gets its first token from the prompt's pass).

        k: a batching scheduler's choice for this request (None: this request's controller); why: the
        scheduler's reason for it, for the step record (None: chosen with the round's other requests).
        """
        if self.finish_reason is not None:
            return None
        prompt: list[int] = []
        if not self.prefill_done:  # what is left of the prompt: this step's pass prefills it
            folded = self._prefill.take_folded()
            if folded is None:
                chunk = self.prefill_chunk()
                while chunk.tokens and len(chunk.tokens) < self.prefill_left:  # a segment before the last one
                    chunk.run()  # (an assistant message in the prompt's history: PrefillPlan) in passes of its own
                    chunk = self.prefill_chunk()
                folded = chunk.tokens
            prompt = folded
            if not prompt:
                self.prefilled()
        committed = self._committed
        budget = self._budget()
        if budget <= 0:
            self.finish_reason = "length"
            return None
        proposer = self.proposer
        catch_up = proposer.catch_up(committed) if proposer is not None else 0
        draft_class, longest = self._draft_class_and_length()
        if k is None:
            apart = bool(prompt) and self.engine.target.capabilities.prompt_pass_apart  # see Capabilities
            k = self.controller.choose_k(budget, catch_up, draft_class, longest, draft_pass_apart=apart)
            reason = self.controller.reason
        elif draft_class == NO_DRAFT:
            k, reason = 0, NO_DRAFT_REASON  # a batch's k, but this request has nothing to draft
        else:
            reason = f"batch: k={k} " + (why or "chosen with the round's other requests")
        if k > budget - 1:
            k, reason = budget - 1, f"{reason}; k={budget - 1}: {budget} tokens left"
        t0 = time.perf_counter()
        draft = self._draft(proposer, committed, k)
        if k == 0:
            self._open_shadow(proposer, committed, draft_class)
        assert self.target_sequence is not None  # _budget() checked
        return PlannedStep(
            self.target_sequence,
            [*prompt, committed[-1], *draft.tokens],
            k,
            draft,
            len(committed),
            t0,
            time.perf_counter(),
            catch_up,
            draft_class,
            reason=reason,
            prompt=len(prompt),
        )

    def complete(self, step: PlannedStep, logits: torch.Tensor, score_s: float | None = None) -> list[int]:
        """Stages 3-5 from the target's logits [k' + 1, V]: accept, resample, advance. Returns the
        token ids to emit. score_s: what the pass cost (default: from plan to now, i.e. a lone pass)."""
        stats, controller, draft, k = self.stats, self.controller, step.draft, step.k
        t2 = time.perf_counter()
        draft_s = step.drafted_at - step.started_at
        score_s = t2 - step.drafted_at if score_s is None else score_s
        verdict, p = self._accept(draft, logits, step.position)
        t3 = time.perf_counter()
        emitted = self._advance(self.target_sequence, self.proposer, self._committed, draft, verdict)
        t4 = time.perf_counter()
        shadow = self._settle_shadow(step.position)

        controller.observe(
            k,
            len(draft),
            verdict.num_accepted,
            draft_s,
            score_s if step.alone and not step.prompt else None,  # a pass that prefilled is no step's cost
            step.catch_up,
            step.draft_class,
        )
        stats.record_step(k, len(draft), verdict.num_accepted, len(emitted), controller.predicted_speedup)
        if step.prompt:  # this pass finished the prefill: its time and its tokens count as the prefill's
            self.prefilled()
            stats.prefill_output_tokens = len(emitted)
        else:
            stats.draft_s += draft_s
            stats.score_s += score_s
            stats.accept_s += t3 - t2
            stats.advance_s += t4 - t3
        if stats.ttft_s is None:
            stats.ttft_s = self._prefill.since_start(t4)
        if self.recorder is not None:
            timings = {"draft": draft_s, "score": score_s, "accept": t3 - t2, "advance": t4 - t3}
            self.recorder.step(
                _step_record(
                    self._step,
                    step,
                    logits,
                    p,
                    verdict,
                    emitted,
                    self.sampling,
                    timings,
                    controller.predicted_speedup,
                    shadow,
                )
            )
        self._step += 1
        return emitted

    # -- the prefill: the whole prompt in one pass (the first plan()), or in chunks a scheduler interleaves
    # with other requests' steps ------------------------------------------------------------------

    @property
    def prefill_done(self) -> bool:
        """The target's cache holds the prompt (all but the pending last token): the next plan() decodes
        (a plan() before then carries what is left of the prompt in its step's pass)."""
        return self._prefill.done

    @property
    def ready(self) -> bool:
        """The next plan() can run: the prompt is prefilled, or its last chunk was folded into it."""
        return self._prefill.ready

    def fold(self, chunk: PrefillChunk) -> None:
        """Leave the prompt's last chunk (from prefill_chunk(), not run) to the first step's pass: one
        pass prefills it and scores the pending token and the draft, as a batching server's round does
        with a request whose prompt finishes in it."""
        if chunk.sequence is not self.target_sequence or self._prefill.done:
            raise RuntimeError("fold() takes this request's last prefill chunk, before its first step")
        if len(chunk.tokens) != self.prefill_left:
            raise ValueError(
                f"fold() takes the prompt's last chunk: {self.prefill_left} tokens, not {len(chunk.tokens)}"
            )
        self._prefill.folded = list(chunk.tokens)

    @property
    def prefill_left(self) -> int:
        """Prompt tokens the target has still to prefill (0 once prefill_done, and for a one-token prompt)."""
        if self._prefill.done:
            return 0
        held = self.target_sequence.length if self.target_sequence is not None else 0
        return max(len(self.prompt_ids) - 1 - held, 0)

    def prefill(self, budget: int | None = None) -> int:
        """Prefill up to `budget` more prompt tokens in one chunk (None: all that are left, a chunk at a time).
        Returns the tokens still left; at 0 the next plan() decodes."""
        self.prefill_chunk(budget).run()
        while budget is None and self.prefill_left:
            self.prefill_chunk().run()
        return self.prefilled()

    def prefill_chunk(self, budget: int | None = None) -> PrefillChunk:
        """The next piece of the prompt for the target, at most `budget` tokens (None: all that are
        left of its segment, PrefillPlan: the prompt's rest, but for an assistant's message in its history,
        computed in chunks of its own as a step's rows), as a pass to run: alone (chunk.run()) or with other
        requests' chunks in one batched forward; then call prefilled(). The first call opens the caches and
        starts the request's clock. A chunk may be empty (a one-token prompt: nothing to prefill). On a runtime
        whose prompt rows hold the same bits only in passes of Capabilities.prefill_min_rows or more, a wide
        segment's chunk has at least that many rows and leaves none or at least that many of it (more than
        `budget`, where the budget is smaller)."""
        if budget is not None and budget < 1:
            raise ValueError(f"a prefill budget is at least 1 token (None: the whole prompt), got {budget}")
        if self._prefill.done:
            raise RuntimeError("the prompt is prefilled already")
        if self.target_sequence is None:
            self._open()
        assert self.target_sequence is not None  # _open opened it
        # what a request running beside this one has prefilled of the same prompt (a server's batch)
        self.stats.cached_tokens += self.engine.prompt_cache.borrow(self.target_sequence, self._committed[:-1])
        start, last = self.target_sequence.length, len(self.prompt_ids) - 1
        if start >= last:
            return PrefillChunk(self.target_sequence, [])
        if self._plan is None:
            self._plan = self.engine.prompt_cache.plan(self._committed[:-1])
        # no pass narrower than prefill_min_rows, this one or the rest's (the docstring), and the assistant's
        # messages in the prompt's history as a step's rows (PromptCache.plan): a chunk stays in one segment
        end, narrow = self._plan.chunk(start, budget)
        return PrefillChunk(self.target_sequence, self._committed[start:end], narrow)

    def prefilled(self) -> int:
        """After a chunk's pass: the prompt tokens still to prefill. At 0 the prefill is over, and
        stats.prefill_s records its wall time from the first chunk to now (with a scheduler, the other
        requests' steps between the chunks included; when the first step's pass prefilled the rest,
        that pass too)."""
        left = self.prefill_left
        if left == 0 and not self._prefill.done:
            self.stats.prefill_s = self._prefill.finish()
        return left

    def _open(self) -> None:
        """Open this request's caches (target and proposer) and start its clock."""
        engine = self.engine
        self._prefill.start()
        # Kept on self so tests and tools can inspect the caches between steps.
        self.target_sequence = engine.prompt_cache.open(self._committed[:-1])
        self.stats.cached_tokens = self.target_sequence.length
        self.proposer = engine.proposer.create(self.namespace) if engine.proposer and not self.plain else None

    def _finish(self) -> None:
        """Runs once, however the request ends (finished, stopped early, failed): frees the caches."""
        if self._finished:
            return
        self._finished = True
        stats = self.stats
        stats.total_s = self._prefill.since_start() if self._prefill.started else 0.0
        stats.plain_pass_s = self.engine.costs.target_s.get(1)
        stats.finish_reason = self.finish_reason = self.finish_reason or "abort"
        if self.target_sequence is not None:  # kept for a next request that starts the same way, unless it failed
            self.engine.prompt_cache.close(self.target_sequence, reusable=self.finish_reason in ("stop", "length"))
        if self.proposer is not None:
            self.proposer.close()
        if self.recorder is not None:
            self.recorder.request(
                {"prompt_tokens": len(self.prompt_ids), "token_ids": self.token_ids, **stats.to_dict()}
            )

    # -- the stages -----------------------------------------------------------------------------

    def _draft(self, proposer: Proposer | None, committed: list[int], k: int) -> Draft:
        if proposer is None or k <= 0:
            return EMPTY_DRAFT
        # the noise seen from the first drafted position: a draft model couples its draws to the target's through it
        draft = proposer.propose(committed, k, self.sampling, self.noise.at(len(committed) - len(self.prompt_ids)))
        if len(draft) > k:  # a proposer that over-delivers would break the budget checks above
            draft = Draft(draft.tokens[:k], None if draft.probs is None else draft.probs[:k])
        return draft

    def _open_shadow(self, proposer: Proposer | None, committed: list[int], draft_class: DraftClass | None) -> None:
        """At a plain step, keep aside the draft a free proposer would have made (spekula.shadow). The cheap
        checks first: with shadow drafts off (the default) a plain step pays one attribute read."""
        if not self.engine.spec.shadow_drafts or self._shadow is not None or proposer is None:
            return
        if not proposer.free_to_draft or not self.controller.wants_shadows:
            return
        if draft_class is None or (draft_class.length or 0) < SHADOW_MIN_MATCH:
            return
        k_max = self.engine.spec.k_max  # the longest draft the controller could have verified here
        draft = proposer.propose(committed, k_max, self.sampling, None)
        if len(draft):
            self._shadow = ShadowDraft(list(draft.tokens[:k_max]), draft_class, len(committed))

    def _settle_shadow(self, position: int) -> ShadowDraft | None:
        """Score the open shadow draft against the tokens this step committed (from `position` on); once
        they settle it, the controller learns it and it is returned (for the step record)."""
        shadow = self._shadow
        if shadow is None or not shadow.feed(self._committed[position:]):
            return None
        self._shadow = None
        self.controller.observe_shadow(len(shadow.tokens), shadow.accepted, shadow.draft_class)
        return shadow

    def _accept(self, draft: Draft, logits: torch.Tensor, position: int) -> tuple[Verdict, torch.Tensor | None]:
        """Accept + resample: returns the verdict and p (None when greedy and nobody needs it). position: of the
        first token the step emits in committed (prompt + output)."""
        if self.sampling.greedy:  # no tensor made: see verify_greedy
            p = probabilities(logits, self.sampling) if self.recorder is not None else None
            return verify_greedy(draft.tokens, logits), p
        p = probabilities(logits, self.sampling)  # [k' + 1, V]
        return verify_positional(draft.tokens, p, self.noise.at(position - len(self.prompt_ids))), p

    def _advance(
        self, target, proposer: Proposer | None, committed: list[int], draft: Draft, verdict: Verdict
    ) -> list[int]:
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
        if len(committed) >= target.context_length and self.finish_reason is None:
            self.finish_reason = "length"  # the context is full: no room for another step
        emitted = emitted[:room]
        self.token_ids.extend(emitted)
        return emitted


@dataclass
class Prefill:
    """Where a request's prompt prefill stands, and the request's clock, which its first prefill chunk
    starts (Generation._open): stats.prefill_s, ttft_s and total_s are all measured from it."""

    setup_s: float = 0.0  # what starting the request cost before its first chunk (Engine.generate): in its times
    started_at: float | None = None  # perf_counter() at the first chunk, less setup_s (None: not started)
    folded: list[int] | None = None  # the prompt's last chunk, left to the first step's pass (Generation.fold)
    done: bool = False  # the target's cache holds the prompt (all but the pending last token)

    @property
    def started(self) -> bool:
        return self.started_at is not None

    @property
    def ready(self) -> bool:
        """The next step can run: the prompt is prefilled, or its last chunk was folded into that step."""
        return self.done or self.folded is not None

    def start(self) -> None:
        """Start the request's clock, setup_s back."""
        self.started_at = time.perf_counter() - self.setup_s

    def since_start(self, now: float | None = None) -> float:
        """Seconds from the request's start to `now` (default: the present)."""
        assert self.started_at is not None  # started by the first prefill chunk
        return (time.perf_counter() if now is None else now) - self.started_at

    def take_folded(self) -> list[int] | None:
        """The folded last chunk, handed to the step that runs it (None: none was folded)."""
        folded, self.folded = self.folded, None
        return folded

    def finish(self) -> float:
        """The prompt is in: mark it done; returns the prefill's wall time (from the request's start)."""
        self.done = True
        return self.since_start()


@dataclass
class PrefillChunk:
    """A piece of a request's prompt for the target to prefill: the pass is `sequence.prefill(tokens)` (no
    logits are read: the first decode step feeds the pending last token)."""

    sequence: Sequence
    tokens: list[int]
    narrow: bool = False  # an assistant message of the prompt's history, computed as a step's rows (PrefillPlan)

    def run(self) -> None:
        self.sequence.prefill(self.tokens, narrow=self.narrow)


@dataclass
class PlannedStep:
    """A step between its draft and its target pass: the pass to run is `sequence.forward(tokens)`."""

    sequence: Sequence
    tokens: list[int]  # the prompt's last unprefilled tokens (the first step only), the pending token, the draft
    k: int
    draft: Draft
    position: int  # of the first token this step emits
    started_at: float
    drafted_at: float
    catch_up: int = 0  # context tokens the proposer processed before drafting (a cold draft's prefill)
    draft_class: DraftClass | None = None  # what the proposer knew of the draft beforehand (Proposer.draft_class)
    reason: str | None = None  # why k was chosen (Controller.reason, or the batch's k)
    alone: bool = True  # the pass runs for this sequence alone (False: inside a batch)
    prompt: int = 0  # tokens at the front of `tokens` that finish the prompt's prefill (no logits wanted)

    @property
    def num_logits(self) -> int:
        """Logits the pass returns: one for the pending token and one per drafted token."""
        return len(self.tokens) - self.prompt

    def score(self) -> torch.Tensor:
        return self.sequence.forward(self.tokens, num_logits=self.num_logits)


def _step_record(
    index: int,
    step: PlannedStep,
    logits,
    p,
    verdict: Verdict,
    emitted,
    sampling: SamplingParams,
    timings,
    predicted,
    shadow: ShadowDraft | None = None,
) -> StepRecord:
    """Everything a reader needs to see why the step went as it did."""
    draft = step.draft
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
            why = (
                f"the target's draw at this position (its seeded uniform through p's CDF) is {verdict.next_token}, "
                f"not {token}: p({token}) = {drafted[n].p:.4f}"
            )
        rejection = {
            "position": n,
            "token": token,
            "why": why,
            "target_top5": [[int(i), float(v)] for v, i in zip(top_p, top_ids, strict=True)],
        }
    kind = "plain" if not len(draft) else ("bonus" if verdict.bonus else "recovered")
    return StepRecord(
        step=index,
        position=step.position,
        k=step.k,
        draft_class=step.draft_class,
        drafted=drafted,
        accepted=n,
        next_token=verdict.next_token,
        next_kind=kind,
        next_p=float(p[n, verdict.next_token]),
        rejection=rejection,
        emitted=list(emitted),
        timings=timings,
        predicted_speedup=predicted,
        reason=step.reason,
        target_top=ranked(logits[: n + 1]),
        shadow=None if shadow is None else shadow.to_dict(),
    )
