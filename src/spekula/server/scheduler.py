"""One worker thread owns the model and steps every running request.

    HTTP handlers (event loop) --submit--> waiting queue --admit--> running --step, step, ...--> done
                               <--events-- (Delta per step with text, then Finished or Failed)

- Requests join between rounds. Each round gives every running request ONE engine step (up to
  k + 1 tokens), the same way for one request as for many: every request drafts (Generation.plan),
  the target scores the blocks (score), then each accepts and advances (Generation.complete). With
  a backend that batches (`capabilities.batching`: the native runner, and llama.cpp with
  BackendConfig.parallel > 1, exact mode included) the score is ONE forward over every block: continuous
  batching; otherwise (transformers) the blocks are scored one after another. A lone request is a batch
  of one.
- Prompts are prefilled in chunks: each round spends at most `prefill_chunk` prompt tokens (shared by
  every request still prefilling, earliest virtual finish first: see Scheduler._prefill), so running
  requests keep decoding while a long prompt prefills, and a request whose client left mid-prefill is
  dropped before its next chunk. A prompt's last chunk (up to PREFILL_BATCH_TOKENS tokens) is not a
  pass of its own: it goes into the request's first step, in the round's score pass
  (Generation.fold), as llama.cpp's server puts prompt and decode rows in one batch. Batched, the
  round's other chunks ride in that pass too (up to PREFILL_BATCH_TOKENS prompt tokens): beside a
  chunk's rows a decode row costs little, so the requests decoding take a step during every chunk
  instead of waiting for it (unbatched, past that size, or where the runtime prefills alone to stay
  exact, Capabilities.prefill_alone, the chunks run first, in passes of their own). While requests
  decode, chunks that leave a prompt unfinished get at most prefill_share of the worker's time (a third
  by default; the requests decoding are nearer their end: Scheduler._prefill).
  prefill_chunk = 0: every prompt whole, in the round it was admitted (where a prompt's history holds the
  assistant's messages, on llama.cpp in exact mode, a segment of it a round: spekula.prefill_plan).
- A request that finishes in a round (stop token, max_tokens, stop string, full context) is finished
  in that round: its last text and its end go out, its caches and slot are freed, before the next
  round starts.
- Speculation under load (`--k auto`): one at a time, a step costs the same whether 1 or 16
  requests run, so each request's own controller is right for the server too, and it chooses k
  for a batch of one. Batched, it is not: a pass verifies every request's k + 1 rows, plain
  decoding gets cheaper per token as the batch grows, and the scheduler chooses every request's k
  for the round together from the cost model (CostModel.best_ks over what each request's controller
  expects of its next draft, with pass costs measured up to the widest batch at start-up and refined
  with every round): a request whose drafts are being accepted drafts as long as its rows pay, one
  whose drafts fail decodes plainly beside it. k = 0 for all is one of the choices: speculation
  switches off when the batch makes it unprofitable and comes back when the batch shrinks. A fixed
  --k is left as given. When the one-token pass has drifted far from its measured time
  (CostModel.stale), the pass costs are measured again while nothing runs or waits, never inside a
  round: a request that arrives stops the measurement (Engine.remeasure_if_stale).
- A request's own `spec` (schemas.Speculation) overrides the server's for it alone: plain decoding
  runs no proposer at all (Engine.generate's plain), and a k it fixed is left out of the round's choice.
- The queue is bounded: past max_queue, submit() raises 429 with a Retry-After estimate.
- A cancelled request (client gone) is closed before its next step or prefill chunk: within one
  round its KV caches are freed and its slot goes to the next waiting request. The same holds for a
  deadline.
- close(): refuses new requests at once, lets admitted ones finish (up to a timeout), then stops.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from spekula.config import SamplingParams, StopConfig
from spekula.control import Controller, FixedK
from spekula.engine import Generation, PlannedStep, PrefillChunk
from spekula.errors import SpekulaError
from spekula.pipeline import Pipeline, TextGeneration
from spekula.prompt_cache import shared_prefix
from spekula.server.errors import APIError
from spekula.server.metrics import ServerMetrics, StepMeter
from spekula.server.schemas import AUTO, Speculation
from spekula.server.settings import ServerSettings, check_option, check_prefill
from spekula.threads import on_passing_thread
from spekula.trace import RequestStats

log = logging.getLogger("spekula.server")
PREFILL_BATCH_TOKENS = 2048  # prompt tokens prefilled together in one batched forward, at most
PREFIX_WAIT_TOKENS = 64  # a prompt waits a round for another to prefill their common start if it is this long
ENGINE_ERROR = APIError(500, "the engine failed on this request; the server log has the details", code="engine_error")


@dataclass
class Delta:
    text: str


@dataclass
class Finished:
    text: str
    finish_reason: str  # stop | length
    stats: RequestStats


@dataclass
class Failed:
    error: APIError
    stats: RequestStats | None = None


Event = Delta | Finished | Failed


@dataclass
class Guarded:
    """How a block run under Scheduler._guard ended: failed once it raised (its requests are then finished)."""

    failed: bool = False


@dataclass(eq=False)
class Job:
    """One request as the scheduler sees it. `sink` receives its events, from the worker thread."""

    id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    stop: StopConfig
    sink: Callable[[Event], None]
    timeout_s: float
    log_text: str | None = None  # the prompt, only when --log-prompts
    namespace: str = ""  # whose earlier outputs it may draft from (ServerState.namespace): a hash of its API key
    spec: Speculation | None = None  # what its `spec` chose (plain, or a fixed k); None: the server's own
    arrived: float = field(default_factory=time.monotonic)
    cancelled: threading.Event = field(default_factory=threading.Event)
    run: TextGeneration | None = None
    meter: StepMeter | None = None
    started: float | None = None
    prefill_stamp: int = 0  # the scheduler's prefill clock (prompt tokens prefilled) when it was admitted

    @property
    def deadline(self) -> float:
        return self.arrived + self.timeout_s

    @property
    def generation(self) -> Generation:
        """Its engine generation: every job the scheduler steps has one (Scheduler._admit made its run)."""
        assert self.run is not None, f"request {self.id} has not started"
        return self.run.generation


class Scheduler:
    def __init__(
        self,
        pipeline: Pipeline,
        metrics: ServerMetrics,
        *,
        max_running: int,
        max_queue: int,
        prefill_chunk: int = ServerSettings.prefill_chunk,
        prefill_share: float = ServerSettings.prefill_share,
        spec_disable_by_batch_size: int | None = ServerSettings.spec_disable_by_batch_size,
        spec_max_slowdown: float = ServerSettings.spec_max_slowdown,
    ) -> None:
        """prefill_chunk: prompt tokens prefilled per round, shared by the requests prefilling (0: whole prompts).
        prefill_share: the most of the worker's time that chunks leaving a prompt unfinished take while
        requests decode (Scheduler._prefill). spec_*: see Scheduler._choose_batch_ks."""
        check_prefill(prefill_chunk, prefill_share)
        check_option("spec_disable_by_batch_size", spec_disable_by_batch_size)
        check_option("spec_max_slowdown", spec_max_slowdown)
        self.spec_disable_by_batch_size, self.spec_max_slowdown = spec_disable_by_batch_size, spec_max_slowdown
        self.pipeline = pipeline
        self.metrics = metrics
        self.max_running = max_running
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self._decode_per_chunk = (1 - prefill_share) / prefill_share  # decode seconds owed per second of chunk
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: list[Job] = []
        self._accepting = True
        self._stop = False
        self._service_s = 1.0  # running mean of admission-to-finish time, for Retry-After
        self.rounds = 0  # rounds run so far (tests and tools read it from the sinks)
        self._owed_s = 0.0  # decode time owed to the requests decoding before the next unfinishing chunk
        self._chunk_s = 0.0  # what the last unfinishing chunk took
        self._rearmed = False  # new requests were owed a chunk since the last unfinishing one ran
        self._prefilled = 0  # prompt tokens prefilled so far: the clock prefill order is kept by (_prefill)
        self._thread = threading.Thread(target=self._work, name="spekula-scheduler", daemon=True)
        self.batching = pipeline.target.capabilities.batching and max_running > 1
        # prefill chunks batched too (with each other and riding in the steps' pass), unless the runtime must
        # prefill alone to stay exact (llama.cpp's exact mode: Capabilities.prefill_alone)
        self._batch_prefill = self.batching and not pipeline.target.capabilities.prefill_alone
        engine = pipeline.engine
        # a prompt may wait for a request ahead of it to prefill their common start, then borrow it (_awaits)
        self._borrows = self.batching and pipeline.target.capabilities.shares_prefix and engine.prompt_cache.enabled
        if self._borrows or pipeline.target.capabilities.parks:
            # keep as many finished requests' caches as requests may run (PromptCache; parked in host memory
            # where the runtime can): a conversation's next turn, or a prompt that shares an earlier one's
            # instructions, starts from it even when other requests finished in between
            engine.prompt_cache.max_kept = max(engine.prompt_cache.max_kept, max_running)
        caps = pipeline.target.capabilities
        chooses = self.batching and engine.proposer is not None and engine.spec.k is None
        # a round's ks chosen together: priced by the pass's rows, or, where a pass takes as many rows of each
        # sequence (Capabilities.equal_rows_per_pass), as the plain rows' pass plus one of each draft's rows
        self._batch_k = chooses and not caps.equal_rows_per_pass
        self._ragged_k = chooses and caps.equal_rows_per_pass
        if self._batch_k:  # pass costs up to the widest batch, before any request
            rows = max_running * (engine.spec.k_max + 1)
            log.info("measuring target passes of up to %d rows (batches of %d) for --k auto", rows, max_running)
            on_passing_thread(engine.calibrate, max_batch=max_running)  # the worker thread computes alone
        metrics.track_queue(lambda: len(self._waiting), lambda: len(self._running))

    # -- called from the event loop -------------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        with self._cv:
            if not self._accepting:
                raise APIError(
                    503,
                    "the server is shutting down and takes no new requests; retry on another instance or later",
                    code="shutting_down",
                )
            if len(self._waiting) >= self.max_queue and len(self._running) + len(self._waiting) >= self.max_running:
                retry = self.retry_after()
                raise APIError(
                    429,
                    f"the server is busy ({len(self._running)} running, {len(self._waiting)} waiting, "
                    f"queue limit {self.max_queue}); retry after {retry} s",
                    code="queue_full",
                    headers={"Retry-After": str(retry)},
                )
            self._waiting.append(job)
            self._cv.notify_all()

    def cancel(self, job: Job) -> None:
        """The client is gone. A waiting job leaves the queue now; a running one before its next step."""
        job.cancelled.set()
        with self._cv:
            if job in self._waiting:
                self._waiting.remove(job)
                self.metrics.finished("abort", None, time.monotonic() - job.arrived)
                self._cv.notify_all()

    def retry_after(self) -> int:
        """Seconds until a slot is likely free: queued requests ahead, served max_running at a time."""
        return max(1, math.ceil(self._service_s * (len(self._waiting) + 1) / self.max_running))

    def close(self, timeout: float) -> bool:
        """Refuse new requests, let admitted ones finish for up to `timeout` s, then stop the worker.

        Returns True when everything finished in time; otherwise the rest were aborted.
        """
        with self._cv:
            self._accepting = False
            drained = self._cv.wait_for(lambda: not self._waiting and not self._running, timeout)
            self._stop = True  # the worker aborts whatever is left, then exits
            self._cv.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=max(timeout, 5.0))
        return drained

    def wait_for(self, predicate: Callable[[Scheduler], bool], timeout: float) -> bool:
        """Block until predicate(self) holds (checked at every admission and finish). For tests and tools."""
        with self._cv:
            return self._cv.wait_for(lambda: predicate(self), timeout)

    @property
    def accepting(self) -> bool:
        return self._accepting

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self._running)

    # -- the worker thread ----------------------------------------------------------------------

    def _work(self) -> None:
        while True:
            with self._cv:
                idle = not (self._waiting or self._running or self._stop)
            if idle:
                # a stale pass-cost table is measured again here, on the thread that computes, while no request
                # runs or waits; one that arrives stops it (Engine.remeasure_if_stale)
                try:
                    self.pipeline.engine.remeasure_if_stale(interrupted=self._wanted)
                except Exception:  # the table stays as it was; the worker keeps serving
                    log.exception("measuring the pass costs again failed")
            with self._cv:
                self._cv.wait_for(lambda: self._waiting or self._running or self._stop)
                if self._stop:
                    leftover = list(self._waiting) + list(self._running)
                    self._waiting.clear()
                    break
                admitted = []
                while self._waiting and len(self._running) < self.max_running:
                    # running from here on, before _admit opens it: close() waits for it, not only for
                    # the queue (a job between the two would look drained and be aborted)
                    admitted.append(self._waiting.popleft())
                    self._running.append(admitted[-1])
            for job in admitted:
                self._admit(job)
            self._round()
        for job in leftover:
            error = APIError(503, "the server shut down before this request finished; retry it", code="shutting_down")
            self._finish(job, "abort", error)

    def _wanted(self) -> bool:
        """Whether a request waits or the server is stopping (asked between an idle re-measurement's passes)."""
        return bool(self._waiting) or self._stop

    def _admit(self, job: Job) -> None:
        now = time.monotonic()
        if job.cancelled.is_set():
            return self._finish(job, "abort")
        if now > job.deadline:
            return self._finish(job, "timeout", self._timeout_error(job))
        with self._guard([job], "request %s could not start", job.id) as starting:
            try:
                generation = self.pipeline.engine.generate(
                    job.prompt_ids,
                    job.sampling,
                    job.stop,
                    controller=_controller(job.spec),
                    namespace=job.namespace,
                    plain=job.spec is not None and job.spec.plain,  # no proposer: nothing drafted, nothing paid
                )
            except SpekulaError as e:  # the handler validated the prompt; this is a backstop
                return self._finish(job, "error", APIError(400, str(e)))
        if starting.failed:
            return
        job.run = TextGeneration(generation, self.pipeline.codec, job.stop)
        job.meter = StepMeter(self.metrics, generation.stats)
        job.started = now
        job.prefill_stamp = self._prefilled
        self.metrics.prompt_tokens.inc(len(job.prompt_ids))
        self.metrics.queue_time.observe(now - job.arrived)
        with self._cv:
            self._cv.notify_all()  # wait_for() callers see it running, now with its generation

    def _round(self) -> None:
        """This round's prefill chunks, then one engine step for every request whose prompt is in:
        plan (draft), score, complete (accept, resample, advance); whoever finished is finished before
        the round ends. Batched, the round's chunks ride in the steps' pass (up to PREFILL_BATCH_TOKENS
        prompt tokens): a decode row costs little beside a chunk's rows, so the requests decoding gain
        a step during every chunk instead of waiting for it."""
        self.rounds += 1
        chunks, waited = self._prefill([job for job in self._running if not job.generation.ready])
        riders: list[tuple[Job, PrefillChunk]] = []
        if chunks and self._batch_prefill and sum(len(c.tokens) for _, c in chunks) <= PREFILL_BATCH_TOKENS:
            riders = chunks
        else:
            self._run_chunks(chunks, waited)
        started = time.perf_counter()
        planned = self._plan(*self._choose_batch_ks())
        for job, step, logits, score_s in self._score(planned, riders):
            run, meter = job.run, job.meter
            assert run is not None and meter is not None  # _admit set both
            with self._guard([job], "request %s failed in the engine", job.id) as completing:
                delta = run.feed(run.generation.complete(step, logits, score_s=score_s))
                if run.generation.done and not run.stopped:
                    delta += run.flush()  # the held-back text: nothing follows it
                meter.update()
            if completing.failed:
                continue
            self._emit(job, delta)
            if (reason := run.generation.finish_reason) is not None:  # run.generation.done
                self._finish(job, reason)
        elapsed = time.perf_counter() - started
        if riders and waited is not None:  # this round was a chunk's, with steps beside it
            self._chunk_done(elapsed, waited or bool(planned))
        elif planned:
            self._owed_s -= elapsed
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "round %d: %d steps (%d rows), %d prompt tokens beside them, %d prefilling, %.3f s",
                self.rounds,
                len(planned),
                sum(len(step.tokens) for _, step in planned),
                sum(len(chunk.tokens) for _, chunk in riders),
                sum(not job.run.generation.ready for job in self._running if job.run is not None),
                elapsed,
            )

    def _plan(self, ks: dict[Job, int] | None, why: str | None = None) -> list[tuple[Job, PlannedStep]]:
        """Stage 1 for every live request whose prompt is prefilled: what the score pass must run.
        ks: each request's k for the round (None: each request's controller chooses); why: the reason for them
        (None: the cost model's choice, Generation.plan)."""
        planned: list[tuple[Job, PlannedStep]] = []
        for job in list(self._running):
            if not job.generation.ready or not self._live(job):
                continue
            with self._guard([job], "request %s failed before its target pass", job.id) as planning:
                # a request not in ks: its own controller's k
                step = job.generation.plan(None if ks is None else ks.get(job), why)
            if planning.failed:
                continue
            if step is None:  # nothing left to run: emit the held-back text, then the end
                assert job.run is not None  # job.generation says so
                self._emit(job, job.run.flush())
                self._finish(job, job.generation.finish_reason or "stop")
            else:
                planned.append((job, step))
        return planned

    def _score(
        self, planned: list[tuple[Job, PlannedStep]], riders: Sequence[tuple[Job, PrefillChunk]] = ()
    ) -> list[tuple[Job, PlannedStep, torch.Tensor, float]]:
        """Stage 2: the target's pass over every planned block, batched where the backend can, else
        one block after another. riders: prefill chunks that go into the same batched pass (their
        logits unused). Returns each scored step with its logits and the seconds its pass took; a
        request whose pass failed is finished with an error instead."""
        if not planned and not riders:
            return []
        if not self.batching:
            scored = []
            for job, step in planned:
                start = time.perf_counter()
                with self._guard([job], "request %s failed in the engine", job.id) as scoring:
                    logits = step.score()
                if scoring.failed:
                    continue
                scored.append((job, step, logits, time.perf_counter() - start))
            return scored
        if planned:
            self.metrics.batch_size.observe(len(planned))
        blocks = [(s.sequence, s.tokens, s.num_logits) for _, s in planned]
        blocks += [(c.sequence, c.tokens, 1) for _, c in riders if c.tokens]
        start = time.perf_counter()
        # the batch's caches are in an unknown state if it fails: every request of it is ended
        batch = [job for job, _ in [*planned, *riders]]
        with self._guard(batch, "a batched forward of %d requests failed", len(blocks)) as scoring:
            # self.batching: the target batches, so it has forward_batch (which Backend does not declare)
            logits = self.pipeline.target.forward_batch(*map(list, zip(*blocks, strict=True))) if blocks else []  # type: ignore[attr-defined]
        if scoring.failed:
            return []
        pass_s = time.perf_counter() - start
        for job, _ in riders:
            job.generation.prefilled()
        if len(blocks) > 1:  # a pass over one sequence is that request's own to observe (PlannedStep.alone)
            for _, step in planned:
                step.alone = False
            prefilled = riders or any(s.prompt for _, s in planned)  # a pass that prefilled is no step's cost
            if self._batch_k and not prefilled:
                self.pipeline.engine.costs.observe_target(sum(len(s.tokens) for _, s in planned), pass_s)
        return [(job, step, job_logits, pass_s) for (job, step), job_logits in zip(planned, logits, strict=False)]

    def _prefill(self, prefilling: list[Job]) -> tuple[list[tuple[Job, PrefillChunk]], bool | None]:
        """Choose the round's prefill chunks, within its budget (prefill_chunk tokens; 0: unbounded), for
        the requests still prefilling. Every one of them is checked for a departed client or a passed
        deadline first, whether or not it gets a chunk this round. Returns the chunks to run (a
        prompt's last chunk is folded into its first step instead) and, if one of them leaves its
        prompt unfinished, whether other requests wait on it (requests decoding, or other prompts'
        chunks): then they are owed its time (_chunk_done); None: no such chunk.

        Order: earliest virtual finish first, on a clock that counts the prompt tokens the server has
        prefilled: a request's key is the clock when it was admitted plus the tokens it has left. A short
        prompt goes before a long one that arrived about as early (shortest first, so it is not held
        behind it), but a request that arrives once the server has prefilled as many tokens as a waiting
        prompt has left goes after it, so a long prompt is never starved by a stream of short ones
        (shortest-first alone held one for a minute behind four clients' short prompts). Ties: in
        admission order.

        A prompt that fits in what is left of the budget is prefilled at once. A chunk that leaves its
        prompt unfinished takes at most prefill_share of the worker's time while requests decode (a third
        by default): after one, the requests decoding step for (1 - share) / share times as long as it
        took before the next (_owed_s). That is shortest remaining work first, bounded: a request
        decoding has at most its own tokens left, a prompt that needs chunks has those chunks and then
        its tokens, so the requests decoding get most of the time and finish. An even split (share 1/2)
        had a burst of 16 requests finish nearly all together at the end, and their median latency
        behind llama_cpp.server's first come, first served (scripts/server_compare.sh, concurrency 16).
        Requests that start decoding are owed the chunk's time once (they may have waited on that
        chunk). New requests re-arm that debt at most once between two chunks: owing every arrival
        starved a long prompt whenever requests kept arriving, so a long prompt gets at least
        share / (1 + share) of the worker's time (a quarter by default)."""
        decoding = any(job.generation.prefill_done for job in self._running)
        if not decoding:
            self._owed_s = 0.0  # nobody is waiting on the prefill
        live = sorted(
            (job for job in prefilling if self._live(job)),
            key=lambda job: job.prefill_stamp + job.generation.prefill_left,
        )
        budget = self.prefill_chunk or None
        chunks: list[tuple[Job, PrefillChunk]] = []
        unfinishing = False
        for job in live:
            left = job.generation.prefill_left
            if self._borrows and any(self._awaits(job, ahead) for ahead, _ in chunks):
                continue  # next round it borrows what the one ahead prefills now
            if budget is not None and left > budget:  # this chunk leaves the prompt unfinished
                if chunks and not self._rearmed:  # requests that start decoding now: owed the chunk they may
                    self._owed_s = max(self._owed_s, self._chunk_s)  # have waited on, once between two chunks
                    self._rearmed = True
                if budget == 0 or ((decoding or chunks) and self._owed_s > 0):
                    continue  # waits for a later round; a prompt behind it that fits the budget need not
                unfinishing = True
            chunk = self._chunk(job, budget)
            if chunk is None:
                continue
            if budget is not None:
                budget = max(budget - len(chunk.tokens), 0)  # a chunk may take more (Capabilities.prefill_min_rows)
            chunks.append((job, chunk))
        to_run = [(job, chunk) for job, chunk in chunks if not job.generation.ready]
        return to_run, (decoding or len(chunks) > 1) if unfinishing else None

    def _chunk(self, job: Job, budget: int | None) -> PrefillChunk | None:
        """job's next prefill chunk, at most `budget` tokens (None: all that are left), counted on the prefill
        clock; a prompt's last chunk small enough to ride in a step's pass is folded into its first step. None
        when asking for it failed (the request is finished)."""
        generation = job.generation
        with self._guard([job], "request %s could not start its prefill", job.id) as chunking:
            chunk = generation.prefill_chunk(budget or None)  # budget 0 here: nothing left to prefill
        if chunking.failed:
            return None
        self._prefilled += len(chunk.tokens)
        if len(chunk.tokens) == generation.prefill_left and len(chunk.tokens) <= PREFILL_BATCH_TOKENS:
            generation.fold(chunk)  # the prompt's last chunk: the first step's pass runs it
        return chunk

    @staticmethod
    def _awaits(job: Job, ahead: Job) -> bool:
        """Whether `ahead`, prefilling in this round, is computing at least PREFIX_WAIT_TOKENS of the
        start of job's prompt that no sequence holds yet. Then job waits a round and borrows those
        KV cells (PromptCache.borrow, before its next chunk) instead of computing them a second time:
        requests that arrive together with one long system prompt, or an edit session's turns sent at
        once, prefill their common part once. (A request that gets no chunk this round is not waited
        for: whichever computes the common part first, the other borrows it.)"""
        mine, theirs = (len(j.prompt_ids) - 1 for j in (job, ahead))  # the prompt tokens prefilled in full
        common = min(shared_prefix(job.prompt_ids, ahead.prompt_ids), mine, theirs)
        held = mine - job.generation.prefill_left
        held_ahead = theirs - ahead.generation.prefill_left
        return common - max(held, min(common, held_ahead)) >= PREFIX_WAIT_TOKENS

    def _run_chunks(self, chunks: list[tuple[Job, PrefillChunk]], waited: bool | None) -> None:
        """Run the round's chunks in passes of their own (batched: _prefill_together)."""
        if not chunks:
            return
        started = time.perf_counter()
        if self._batch_prefill:
            self._prefill_together(chunks)
        else:
            for job, chunk in chunks:
                with self._guard([job], "request %s failed in its prefill", job.id) as prefilling:
                    chunk.run()
                if not prefilling.failed:
                    job.generation.prefilled()
        elapsed = time.perf_counter() - started
        tokens = sum(len(chunk.tokens) for _, chunk in chunks)
        log.debug("prefill: %d chunks, %d prompt tokens, %.3f s", len(chunks), tokens, elapsed)
        if waited is not None:
            self._chunk_done(elapsed, waited)

    def _chunk_done(self, chunk_s: float, others_waited: bool) -> None:
        """A chunk that left its prompt unfinished took chunk_s: the requests that waited on it (others
        decoding, or prompts behind it) are owed (1 - prefill_share) / prefill_share times as much decode time
        before the next one."""
        self._chunk_s = chunk_s
        self._owed_s = chunk_s * self._decode_per_chunk if others_waited else 0.0
        self._rearmed = False

    def _prefill_together(self, chunks: list[tuple[Job, PrefillChunk]]) -> None:
        """Run the round's chunks in batched forwards of up to PREFILL_BATCH_TOKENS tokens (one at a
        time, 16 short prompts cost 16 passes that every running request waits for)."""
        groups: list[list[tuple[Job, PrefillChunk]]] = [[]]
        for job, chunk in chunks:
            if sum(len(c.tokens) for _, c in groups[-1]) + len(chunk.tokens) > PREFILL_BATCH_TOKENS and groups[-1]:
                groups.append([])
            groups[-1].append((job, chunk))
        for group in groups:
            jobs, todo = [job for job, _ in group], [chunk for _, chunk in group if chunk.tokens]
            with self._guard(jobs, "a batched prefill of %d requests failed", len(todo)) as prefilling:
                if todo:
                    # self.batching: the target has forward_batch
                    self.pipeline.target.forward_batch(  # type: ignore[attr-defined]
                        [c.sequence for c in todo], [c.tokens for c in todo], [1] * len(todo)
                    )
            if prefilling.failed:
                continue
            for job in jobs:
                job.generation.prefilled()

    def _choose_batch_ks(self) -> tuple[dict[Job, int] | None, str | None]:
        """Each decoding request's k for the round, chosen together by the cost model for a batch of
        two or more (None: each request's own controller, as for a batch of one, a backend that does
        not batch, or a fixed --k), and why, for the step records where the cost model did not choose them
        (None: it did; or it chose none where throughput alone would draft: the bound's). A request whose `spec`
        fixed its k keeps it: it is left out.

        The cost model chooses the ks that emit the most tokens a second over the round (throughput) among those
        that slow no request by more than spec_max_slowdown, expected (CostModel.best_ks): a round's draft rows
        lengthen it for every request in it, and a request whose drafts fail (chat) emits one token a round
        however long it is. With more requests decoding than spec_disable_by_batch_size (those whose `spec`
        fixed k counted), the others draft nothing (k = 0 each): plain decoding's pace."""
        ready = [job for job in self._running if job.generation.ready]
        decoding = [job for job in ready if not _fixed_k(job)]
        limit = self.spec_disable_by_batch_size
        if limit is not None and len(ready) > limit:
            for job in decoding:
                job.generation.controller.predicted_speedup = 1.0
            why = f"with {len(ready)} requests decoding (--spec-disable-by-batch-size {limit})"
            return dict.fromkeys(decoding, 0), why
        if not (self._batch_k or self._ragged_k) or len(decoding) < 2:
            return None, None
        outlooks = [self._outlook(job) for job in decoding]
        costs = self.pipeline.engine.costs
        choose = costs.best_ks if self._batch_k else costs.best_ks_ragged
        ks, speedup = choose(outlooks, self.spec_max_slowdown)
        for job in decoding:
            job.generation.controller.predicted_speedup = speedup  # what the stats and traces report for this step
        reason = None
        if not any(ks) and self.spec_max_slowdown < 1 and any(choose(outlooks, 1.0)[0]):  # held by the bound alone
            reason = f"a draft would slow another request by more than --spec-max-slowdown {self.spec_max_slowdown:g}"
        return dict(zip(decoding, ks, strict=True)), reason

    @staticmethod
    def _outlook(job: Job) -> tuple[list[float], int] | None:
        """Generation.outlook, or None (k = 0 this round) if asking failed: its plan() reports the failure."""
        try:
            return job.generation.outlook()
        except Exception:
            log.exception("request %s: its draft outlook failed", job.id)
            return None

    @contextmanager
    def _guard(self, jobs: Sequence[Job], message: str, *args: object) -> Iterator[Guarded]:
        """Run the block for these requests. If it raises, one request's failure (or one batched pass's) must
        not take the worker and every other request down: the exception is logged (message % args, with its
        traceback; the client is told only ENGINE_ERROR), every request of `jobs` is finished with
        ENGINE_ERROR, and the block's Guarded says it failed, so the caller skips what followed it."""
        guarded = Guarded()
        try:
            yield guarded
        except Exception:
            log.exception(message, *args)
            guarded.failed = True
            for job in jobs:
                self._finish(job, "error", ENGINE_ERROR)

    def _live(self, job: Job) -> bool:
        """False (and the job finished) when its client is gone or its time is up."""
        if job.cancelled.is_set():
            self._finish(job, "abort")
            return False
        if time.monotonic() > job.deadline:
            self._finish(job, "timeout", self._timeout_error(job))
            return False
        return True

    @staticmethod
    def _emit(job: Job, delta: str) -> None:
        if delta:
            job.sink(Delta(delta))

    def _finish(self, job: Job, reason: str, error: APIError | None = None) -> None:
        stats = None
        if job.run is not None:
            try:
                job.run.close()  # frees both KV caches now if the request was cut short
                assert job.meter is not None  # set with its run
                job.meter.update()
            except Exception:
                log.exception("request %s: cleaning up failed", job.id)
            stats = job.run.generation.stats
        now = time.monotonic()
        with self._cv:
            if job in self._running:
                self._running.remove(job)
            if job.started is not None:
                self._service_s = 0.8 * self._service_s + 0.2 * (now - job.started)
            self._cv.notify_all()
        self.metrics.finished(reason, stats, now - job.arrived)
        if error is not None:
            job.sink(Failed(error, stats))
        elif reason in ("stop", "length"):
            assert job.run is not None and stats is not None  # a request ends so only after it ran
            job.sink(Finished(job.run.text, reason, stats))
        else:  # abort: the client is gone
            job.sink(Failed(APIError(499, "the client closed the connection"), stats))
        self._log(job, reason, stats)

    def _timeout_error(self, job: Job) -> APIError:
        return APIError(
            504,
            f"the request ran past the server's time limit of {job.timeout_s:g} s; lower max_tokens "
            "(the operator can raise --request-timeout)",
            code="timeout",
        )

    def _log(self, job: Job, reason: str, stats: RequestStats | None) -> None:
        if stats is None:
            log.info("request %s: %s before it started", job.id, reason)
            return
        log.info(
            "request %s: %s, %d prompt (%d cached) + %d output tokens, alpha %s, tau %s, %.2f s",
            job.id,
            reason,
            stats.prompt_tokens,
            stats.cached_tokens,
            stats.output_tokens,
            _fmt(stats.alpha),
            _fmt(stats.tau),
            stats.total_s,
        )
        if job.log_text is not None:
            assert job.run is not None  # it has stats: it ran
            log.info("request %s prompt: %r output: %r", job.id, job.log_text, job.run.text)


def _controller(spec: Speculation | None) -> Controller | None:
    """The controller a request's `spec` asks for: its fixed k (FixedK; plain: Engine.generate's), or None for
    the engine's own (the server's setting, and "auto", which schemas accept only where that is the controller)."""
    if spec is None or spec.plain or spec.k == AUTO:
        return None
    return FixedK(spec.k)


def _fixed_k(job: Job) -> bool:
    return job.spec is not None and not job.spec.plain and job.spec.k != AUTO


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.2f}"
