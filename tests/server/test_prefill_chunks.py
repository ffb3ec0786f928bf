"""Chunked prefill: a long prompt is prefilled a bounded number of tokens per scheduler round, so
running requests keep decoding between its chunks and a client that leaves mid-prefill is dropped
before the next chunk; the output is token for token that of a prompt prefilled whole.

Nothing here waits on time: events are tagged with the scheduler's round counter, and a hook on
Generation.prefill_chunk (called by the worker when it plans a chunk) submits or cancels requests at
a known round.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from spekula.backends.native import NativeBackend
from spekula.config import BackendConfig, SamplingParams, StopConfig
from spekula.engine import Engine, Generation, PrefillChunk
from spekula.errors import ConfigError
from spekula.server.metrics import ServerMetrics
from spekula.server.scheduler import Delta, Failed, Finished, Job, Scheduler
from spekula.server.settings import ServerSettings

from serverkit import fake_pipeline, native_pipeline

WAIT = 20.0  # seconds close() may take before the test fails
CHUNK = 16
LONG = bytes(32 + (7 * i) % 95 for i in range(400)).decode()  # 400 printable bytes: 400 tokens, 25 chunks of 16

PIPELINES = {
    "one-after-another": lambda: fake_pipeline(draft="other", k=3),  # a backend that does not batch
    "batched": lambda: native_pipeline(k=3, draft="other"),  # the native runner, fp32
}


class Log:
    """What the worker did, in order: (round, job id, event) and (round, job id, chunk tokens)."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self.events: list[tuple[int, str, object]] = []
        self.chunks: list[tuple[int, str, int]] = []
        self.on_chunk = lambda job_id, count: None  # called after a job's count-th chunk is planned
        self.jobs: list[Job] = []
        self._ended: set[str] = set()
        self._all_ended = threading.Event()

    def job(self, job_id: str, ids: list[int], max_tokens: int) -> Job:
        stop = StopConfig(max_tokens=max_tokens, ignore_eos=True)
        job = Job(job_id, ids, SamplingParams(), stop, lambda e: self._sink(job, e), WAIT)
        self.jobs.append(job)
        return job

    def _sink(self, job: Job, event) -> None:
        self.events.append((self.scheduler.rounds, job.id, event))
        if isinstance(event, (Finished, Failed)):
            self._ended.add(job.id)
            if self._ended == {j.id for j in self.jobs}:
                self._all_ended.set()

    def run(self) -> None:
        """Start the worker; return once every job made so far (or by the hooks) has ended and the worker stopped."""
        self.scheduler.start()
        assert self._all_ended.wait(WAIT)
        assert self.scheduler.close(WAIT)

    def of(self, job_id: str) -> list[tuple[int, object]]:
        return [(r, e) for r, j, e in self.events if j == job_id]

    def chunks_of(self, job_id: str) -> list[tuple[int, int]]:
        return [(r, n) for r, j, n in self.chunks if j == job_id]

    def text(self, job_id: str) -> str:
        return "".join(e.text for _, e in self.of(job_id) if isinstance(e, Delta))


@pytest.fixture
def recorded(monkeypatch):
    """A scheduler factory whose Log sees every chunk the worker plans, by job id."""
    logs: list[Log] = []
    planned = Generation.prefill_chunk

    def prefill_chunk(self, budget=None):
        chunk = planned(self, budget)
        log = logs[-1] if logs else None
        job = next((j for j in log.jobs if j.run is not None and j.run.generation is self), None) if log else None
        if job is None:  # a request outside the scheduler (the plain reference)
            return chunk
        log.chunks.append((log.scheduler.rounds, job.id, len(chunk.tokens)))
        log.on_chunk(job.id, len(log.chunks_of(job.id)))
        return chunk

    monkeypatch.setattr(Generation, "prefill_chunk", prefill_chunk)

    def make(pipe, **options) -> Log:
        logs.append(Log(Scheduler(pipe, ServerMetrics(), max_queue=16, **options)))
        return logs[-1]

    return make


def plain_text(pipe, ids: list[int], max_tokens: int) -> str:
    stop = StopConfig(max_tokens=max_tokens, ignore_eos=True)
    return pipe.generate(ids, SamplingParams(), stop, plain=True).text


@pytest.mark.parametrize("kind", PIPELINES)
def test_a_short_request_finishes_while_a_long_prompt_prefills(kind, recorded):
    """The short request arrives during the long prompt's third chunk. It is prefilled in the next
    round (first: it finishes far earlier, inside the same budget), steps every round after, and finishes
    before the long prompt's prefill ends; no round prefills more than the budget."""
    pipe = PIPELINES[kind]()
    log = recorded(pipe, max_running=4, prefill_chunk=CHUNK)
    long_ids, short_ids = pipe.codec.encode(LONG), pipe.codec.encode("hi there")

    def arrive(job_id: str, count: int) -> None:
        if job_id == "long" and count == 3:
            log.scheduler.submit(log.job("short", short_ids, 5))

    log.on_chunk = arrive
    log.scheduler.submit(log.job("long", long_ids, 8))
    log.run()

    per_round: dict[int, int] = {}
    for r, _, n in log.chunks:
        per_round[r] = per_round.get(r, 0) + n
    assert max(per_round.values()) == CHUNK and sum(n for _, n in log.chunks_of("long")) == len(long_ids) - 1
    long_prefilled = log.chunks_of("long")[-1][0]  # the round of its last chunk
    assert long_prefilled >= (len(long_ids) - 1) // CHUNK  # 25 rounds at least

    assert log.chunks_of("short") == [(4, len(short_ids) - 1)]  # submitted in round 3, admitted and prefilled in 4
    assert 4 not in [r for r, _ in log.chunks_of("long")]  # the short one had waited on a chunk: no chunk beside it
    (short_end, short_finished) = log.of("short")[-1]
    assert isinstance(short_finished, Finished) and short_finished.stats.output_tokens == 5
    assert short_end == 4 + short_finished.stats.target_passes - 1  # one step in every round from round 4 on
    assert short_end < long_prefilled
    assert all(r >= long_prefilled for r, _ in log.of("long"))  # the long one's first step: after its last chunk
    long_finished = log.of("long")[-1][1]
    assert isinstance(long_finished, Finished) and long_finished.stats.prefill_s > 0

    assert log.text("short") == plain_text(pipe, short_ids, 5)  # token for token what a whole prefill gives
    assert log.text("long") == plain_text(pipe, long_ids, 8)


@pytest.mark.parametrize("kind", PIPELINES)
def test_a_stream_of_short_prompts_does_not_starve_a_long_one(kind, recorded):
    """A new short request (a prompt of its own) arrives in every round while a long prompt prefills.
    With every arrival owed the chunk it may have waited on, and shortest first, the long prompt got
    no chunk while the arrivals lasted. Now arrivals hold its next chunk back at most once between two
    chunks, and once the server has prefilled as many tokens since its admission as it has left, it
    goes first (earliest virtual finish): a full chunk in every round until it is in."""
    pipe = PIPELINES[kind]()
    log = recorded(pipe, max_running=4, prefill_chunk=CHUNK)
    long_ids = pipe.codec.encode(LONG)
    shorts = [pipe.codec.encode(f"{chr(65 + i % 26)}{chr(97 + i // 26)} short") for i in range(80)]
    submitted: list[str] = []

    def arrive(job_id: str, count: int) -> None:
        if len(submitted) < len(shorts) and (job_id == "long" and count == 1 or job_id.startswith("short")):
            submitted.append(f"short{len(submitted)}")
            log.scheduler.submit(log.job(submitted[-1], shorts[len(submitted) - 1], 1))

    log.on_chunk = arrive
    log.scheduler.submit(log.job("long", long_ids, 2))
    log.run()

    long_chunks = log.chunks_of("long")
    assert sum(n for _, n in long_chunks) == len(long_ids) - 1
    rounds = [r for r, _ in long_chunks]
    assert rounds[-1] < log.chunks_of(submitted[-1])[0][0]  # in before the stream of short prompts ends
    assert all(b - a <= 2 for a, b in zip(rounds, rounds[1:], strict=False))  # never held back two rounds running
    tail = long_chunks[-8:]  # first by then: a full chunk in every round (its last may be shorter)
    assert [r for r, _ in tail] == list(range(tail[0][0], tail[0][0] + 8))
    assert all(n == CHUNK for _, n in tail[:-1])
    assert all(isinstance(log.of(job_id)[-1][1], Finished) for job_id in ["long", *submitted])
    assert log.text("long") == plain_text(pipe, long_ids, 2)


def test_a_prompt_s_last_chunk_runs_in_its_first_step_s_pass(recorded, monkeypatch):
    """No pass of its own for the last chunk: it goes into the request's first step, in the round's
    batched score pass, in front of the pending token and the draft (Generation.fold)."""
    pipe = PIPELINES["batched"]()
    passes: list[tuple[list[int], list[int]]] = []  # the target's: tokens and logits wanted per sequence
    forward_batch = NativeBackend.forward_batch

    def counted(self, sequences, token_lists, num_logits=None, block_masks=None):
        if self is pipe.target:
            passes.append(([len(t) for t in token_lists], list(num_logits)))
        return forward_batch(self, sequences, token_lists, num_logits, block_masks)

    monkeypatch.setattr(NativeBackend, "forward_batch", counted)
    log = recorded(pipe, max_running=4, prefill_chunk=CHUNK)
    ids = pipe.codec.encode(LONG[:100])  # 99 tokens to prefill: 6 chunks of 16, then 3
    log.scheduler.submit(log.job("one", ids, 6))
    log.run()

    assert [n for _, n in log.chunks_of("one")] == [CHUNK] * 6 + [3]
    assert passes[:6] == [([CHUNK], [1])] * 6  # the unfinishing chunks: passes of their own
    (rows,), (wanted,) = passes[6]
    assert rows == 3 + wanted and 1 <= wanted <= 4  # the last chunk, the pending token, the draft
    finished = log.of("one")[-1][1]
    assert isinstance(finished, Finished) and len(passes) == 6 + finished.stats.target_passes
    assert finished.stats.prefill_output_tokens >= 1 and finished.stats.prefill_s > 0
    assert log.text("one") == plain_text(pipe, ids, 6)


def test_a_chunk_rides_in_the_pass_of_the_requests_decoding(recorded, monkeypatch):
    """Batched, a chunk that leaves its prompt unfinished is not a pass of its own when requests are
    decoding: its rows go into the round's score pass beside their steps (one forward, the chunk
    wanting no logits), and both outputs are still those of plain decoding."""
    pipe = PIPELINES["batched"]()
    passes: list[list[tuple[int, int]]] = []  # the target's: (rows, logits wanted) per sequence
    forward_batch = NativeBackend.forward_batch

    def counted(self, sequences, token_lists, num_logits=None, block_masks=None):
        if self is pipe.target:
            passes.append([(len(t), n) for t, n in zip(token_lists, num_logits, strict=True)])
        return forward_batch(self, sequences, token_lists, num_logits, block_masks)

    monkeypatch.setattr(NativeBackend, "forward_batch", counted)
    log = recorded(pipe, max_running=4, prefill_chunk=CHUNK)
    short_ids, long_ids = pipe.codec.encode("hi there"), pipe.codec.encode(LONG[:120])
    log.scheduler.submit(log.job("short", short_ids, 24))
    log.scheduler.submit(log.job("long", long_ids, 4))
    log.run()

    long_chunks = [n for _, n in log.chunks_of("long")]
    assert sum(long_chunks) == len(long_ids) - 1 and len(long_chunks) > 2
    shared = [p for p in passes if len(p) == 2 and (CHUNK, 1) in p]  # a full chunk beside a step
    assert shared, passes
    for pass_ in shared:
        ((step_rows, wanted),) = [block for block in pass_ if block != (CHUNK, 1)]
        assert step_rows == wanted and 1 <= wanted <= 4  # the short request's step: its pending token and draft
    assert not any(p == [(CHUNK, 1)] for p in passes[:3])  # nothing waited alone while the short one decoded
    assert log.text("short") == plain_text(pipe, short_ids, 24)
    assert log.text("long") == plain_text(pipe, long_ids, 4)


def test_fold_takes_only_the_prompt_s_last_chunk():
    pipe = PIPELINES["batched"]()
    ids = pipe.codec.encode(LONG[:40])
    stop = StopConfig(max_tokens=5, ignore_eos=True)
    gen = Engine(pipe.target).generate(ids, SamplingParams(), stop)
    with pytest.raises(ValueError, match=f"last chunk: {len(ids) - 1} tokens, not 8"):
        gen.fold(gen.prefill_chunk(8))  # not run: the prompt is where it was
    gen.fold(gen.prefill_chunk())
    assert gen.ready and not gen.prefill_done and gen.target_sequence.length == 0
    assert gen.run().token_ids == Engine(pipe.target).generate(ids, SamplingParams(), stop).run().token_ids
    with pytest.raises(RuntimeError, match="before its first step"):
        gen.fold(PrefillChunk(gen.target_sequence, []))  # the prompt is in already


@pytest.mark.parametrize("kind", PIPELINES)
def test_a_client_that_leaves_mid_prefill_frees_the_slot_before_the_next_chunk(kind, recorded):
    """One slot; the long request's client leaves during its third chunk. The next round drops it
    before any chunk runs (its KV cache released), and the waiting request takes the slot."""
    pipe = PIPELINES[kind]()
    log = recorded(pipe, max_running=1, prefill_chunk=CHUNK)
    long_job = log.job("long", pipe.codec.encode(LONG), 8)
    short_ids = pipe.codec.encode("next in line")

    def leave(job_id: str, count: int) -> None:
        if job_id == "long" and count == 3:
            log.scheduler.cancel(long_job)

    log.on_chunk = leave
    log.scheduler.submit(long_job)
    log.scheduler.submit(log.job("short", short_ids, 4))
    log.run()

    assert log.chunks_of("long") == [(1, CHUNK), (2, CHUNK), (3, CHUNK)]  # no chunk after the client left
    ((left_round, failed),) = log.of("long")
    assert isinstance(failed, Failed) and failed.error.status == 499 and left_round == 4
    assert long_job.run.generation.target_sequence.tokens == []  # the cache is released
    assert log.chunks_of("short")[0][0] == 5  # admitted at the first admission after the slot was freed
    assert isinstance(log.of("short")[-1][1], Finished) and log.text("short") == plain_text(pipe, short_ids, 4)


@pytest.mark.parametrize("chunk", [0, 1, 7, 100, 512])
def test_the_server_s_output_does_not_depend_on_the_chunk(chunk, recorded):
    """Greedy through the batching scheduler (fp32 native), several prompts prefilling at once: the
    same text for every budget, and the same as plain decoding of a whole prompt."""
    pipe = PIPELINES["batched"]()
    log = recorded(pipe, max_running=4, prefill_chunk=chunk)
    prompts = {"long": LONG, "mid": LONG[:150], "short": "ab", "one": "z"}
    for job_id, prompt in prompts.items():
        log.scheduler.submit(log.job(job_id, pipe.codec.encode(prompt), 12))
    log.run()
    for job_id, prompt in prompts.items():
        assert isinstance(log.of(job_id)[-1][1], Finished), job_id
        assert log.text(job_id) == plain_text(pipe, pipe.codec.encode(prompt), 12), job_id
    if chunk:
        rounds = {r for r, _, _ in log.chunks}
        assert all(sum(n for r2, _, n in log.chunks if r2 == r) <= chunk for r in rounds)


@pytest.mark.parametrize("kind", PIPELINES)
def test_generation_prefill_in_chunks(kind):
    """The engine's API: prefill(budget) runs at most budget tokens and returns what is left; the
    prefill time is recorded when the last chunk has run; the cache then holds all but the pending
    token, and decoding gives the tokens of a whole prefill (speculative, greedy, fp32)."""
    pipe = PIPELINES[kind]()
    ids = pipe.codec.encode(LONG[:100])
    stop = StopConfig(max_tokens=16, ignore_eos=True)

    def engine() -> Engine:  # a fresh one each time: nothing kept from an earlier request (Engine.prompt_cache)
        return Engine(pipe.target, pipe.engine.proposer, pipe.spec)

    whole = engine().generate(ids, SamplingParams(), stop).run()
    gen = engine().generate(ids, SamplingParams(), stop)
    assert gen.prefill_left == 99 and not gen.prefill_done
    lefts = []
    while not gen.prefill_done:
        lefts.append(gen.prefill(40))
        assert gen.stats.prefill_s == 0.0 or gen.prefill_done
    assert lefts == [59, 19, 0] and gen.target_sequence.tokens == ids[:-1] and gen.stats.prefill_s > 0
    with pytest.raises(RuntimeError):
        gen.prefill(40)
    assert gen.run().token_ids == whole.token_ids and gen.stats.target_passes == whole.stats.target_passes

    one = engine().generate(ids[:1], SamplingParams(), stop)  # a one-token prompt: nothing to prefill
    assert one.prefill_left == 0 and one.prefill(5) == 0 and one.prefill_done
    with pytest.raises(ValueError):
        engine().generate(ids, SamplingParams(), stop).prefill_chunk(0)


def test_chunks_are_never_narrower_than_the_runtime_s_prefill_min_rows(monkeypatch):
    """Where a prompt's rows hold the same bits only in passes of prefill_min_rows or more (llama.cpp's exact mode),
    a chunk takes at least that many and leaves none or at least that many, more than its budget where it must; the
    tokens decoded after it are a whole prefill's."""
    pipe = native_pipeline(k=3, draft="other")
    caps = replace(pipe.target.capabilities, prefill_min_rows=30)
    monkeypatch.setattr(pipe.target, "capabilities", caps, raising=False)
    ids = pipe.codec.encode(LONG[:100])
    stop = StopConfig(max_tokens=8, ignore_eos=True)
    whole = Engine(pipe.target, pipe.engine.proposer, pipe.spec).generate(ids, SamplingParams(), stop).run()
    for budget, expected in [(40, [59, 0]), (10, [69, 39, 0]), (70, [0]), (99, [0])]:
        gen = Engine(pipe.target, pipe.engine.proposer, pipe.spec).generate(ids, SamplingParams(), stop)
        lefts = []
        while not gen.prefill_done:
            lefts.append(gen.prefill(budget))
        assert lefts == expected, budget
        assert gen.run().token_ids == whole.token_ids


def test_a_long_chunk_s_passes_leave_no_narrow_last_one():
    """llama.cpp's exact mode splits a chunk longer than one llama_decode so that no pass is narrower than
    prefill_min_rows unless the chunk is: the last two passes share what would have left a short last one."""
    from spekula.backends.llamacpp import _prefill_pieces

    for n, sizes in [(30, [30]), (512, [512]), (600, [512, 88]), (530, [466, 64]), (1030, [512, 454, 64])]:
        pieces = _prefill_pieces(list(range(n)), 512, 64)
        assert [len(piece) for piece in pieces] == sizes and sum(pieces, []) == list(range(n)), n


def test_the_options():
    """--prefill-chunk and --prefill-share (serve), and --context-length (every model command: a long prompt on
    llama.cpp needs it), which the draft's backend inherits."""
    from spekula.cli import build_parser
    from spekula.options import backend_from_args
    from spekula.pipeline import draft_backend_config
    from spekula.server.cli import settings_from_args

    assert ServerSettings().prefill_chunk == 256 and ServerSettings(prefill_chunk=0).prefill_chunk == 0
    with pytest.raises(ConfigError, match="--prefill-chunk"):
        ServerSettings(prefill_chunk=-1)
    for share in (0, -0.5, 1.5, float("nan"), True):
        with pytest.raises(ConfigError, match="--prefill-share must be a fraction > 0 and <= 1"):
            ServerSettings(prefill_share=share)
    with pytest.raises(ValueError, match="prefill_share"):
        Scheduler(fake_pipeline(), ServerMetrics(), max_running=1, max_queue=1, prefill_share=0)
    args = build_parser().parse_args(
        ["serve", "--prefill-chunk", "64", "--prefill-share", "0.5", "--context-length", "8192"]
    )
    assert settings_from_args(args).prefill_chunk == 64 and settings_from_args(args).prefill_share == 0.5
    assert ServerSettings().prefill_share == pytest.approx(1 / 3)
    target = backend_from_args(args)
    assert target.context_length == 8192 and draft_backend_config("ngram", target).context_length == 8192
    assert backend_from_args(build_parser().parse_args(["serve"])).context_length is None
    with pytest.raises(ConfigError, match="context_length"):
        BackendConfig(context_length=1)


@pytest.mark.model
@pytest.mark.parametrize("model", ["smollm2-135m", "qwen2.5-coder-0.5b"])
def test_chunked_prefill_on_llamacpp_is_bitwise_a_whole_one(model):
    """llama.cpp in exact mode (the default): a prompt longer than one llama_decode (512 tokens) prefilled in
    chunks of 256, 100 or (as the engine widens them) 64 gives the next-token logits of a whole prefill bit for bit,
    and the same greedy tokens after it. With K in F16 a pass under 64 rows takes flash attention's one-row kernel
    where a wider one takes the tiled kernel: chunks of 37, or a last one of 60, held other bits. On the Q4_K_M GGUF
    a chunk's last row computed alone (vec_dot, as a step's rows are) instead of in its chunk's pass (ggml's tiled
    matmul from 32 rows) differed (LlamaCppSequence.prefill)."""
    import torch

    from spekula import llamacpp_check
    from spekula.backends.llamacpp import (
        FLASH_MIN_ROWS_PATCH,
        MATMUL_ATTENTION_PATCH,
        SPLIT_KV_PATCH,
        TILED_ATTENTION_ROWS,
    )
    from spekula.pipeline import load_model

    backend, codec = load_model(model, BackendConfig(runtime="llamacpp", threads=2, context_length=1024))
    ids = codec.encode(PASSAGE)
    assert len(ids) > 512 and backend.context_length == 1024  # --context-length reaches llama.cpp
    # on the project's build K stays F16, and a prompt's rows then take flash attention's tiled kernel from 64 rows
    patches = llamacpp_check.installed_patches()
    if SPLIT_KV_PATCH in patches or {MATMUL_ATTENTION_PATCH, FLASH_MIN_ROWS_PATCH} <= patches:
        assert backend.exact_f16_k and backend.capabilities.prefill_min_rows == TILED_ATTENTION_ROWS

    def run(chunk: int | None) -> tuple[torch.Tensor, list[int]]:  # a fresh engine: nothing kept (prompt_cache)
        gen = Engine(backend).generate(ids, SamplingParams(), StopConfig(max_tokens=6, ignore_eos=True))
        while gen.prefill(chunk):
            pass
        logits = gen.target_sequence.forward([ids[-1]])
        gen.target_sequence.truncate(len(ids) - 1)
        return logits, gen.run().token_ids

    whole_logits, whole_tokens = run(None)
    for chunk in (256, 100, 37, 1):  # the last two: chunks of prefill_min_rows, and a wider last one
        logits, tokens = run(chunk)
        assert torch.equal(logits, whole_logits) and tokens == whole_tokens, chunk


PASSAGE = (
    "The scheduler owns the model on one worker thread. Each round it admits waiting requests, prefills "
    "a bounded number of prompt tokens, and gives every running request one speculative step. "
) * 24


@pytest.mark.parametrize("share", [0.5, 1 / 3, 0.2])
def test_a_long_prefill_takes_at_most_its_share_of_the_time_while_others_decode(share, recorded, monkeypatch):
    """On a clock that advances one unit per token a forward pass runs (so the test does not depend on
    the machine): while a request decodes, the long prompt's chunks take about prefill_share of the
    time, never more (plus one chunk); the request decoding has the rest."""
    import types

    import spekula.server.scheduler as scheduler_module
    from spekula.backends.base import Sequence

    clock = [0.0]
    calls: list[tuple[int, bool, int]] = []  # (round, a chunk of the long prompt?, tokens)
    forward = Sequence.forward

    def timed(self, token_ids, num_logits=None):
        clock[0] += len(token_ids)
        long = next((j for j in log.jobs if j.id == "long"), None)
        of_long = long is not None and long.run is not None and self is long.run.generation.target_sequence
        calls.append((log.scheduler.rounds, of_long, len(token_ids)))
        return forward(self, token_ids, num_logits)

    monkeypatch.setattr(Sequence, "forward", timed)
    monkeypatch.setattr(
        scheduler_module, "time", types.SimpleNamespace(perf_counter=lambda: clock[0], monotonic=time.monotonic)
    )
    pipe = fake_pipeline(draft="other", k=3)
    log = recorded(pipe, max_running=4, prefill_chunk=CHUNK, prefill_share=share)
    log.scheduler.submit(log.job("decoder", pipe.codec.encode("go"), 120))
    log.scheduler.submit(log.job("long", pipe.codec.encode(LONG), 4))
    log.run()

    assert isinstance(log.of("decoder")[-1][1], Finished)
    # the rounds in which the long prompt prefilled while the other request decoded (not the last of either)
    end = min(log.of("decoder")[-1][0], log.chunks_of("long")[-1][0])
    beside = [n for r, n in log.chunks_of("long") if r < end]
    window = [(of_long, n) for r, of_long, n in calls if r < end]
    chunk_time = sum(n for of_long, n in window if of_long)
    total = sum(n for _, n in window)
    assert len(beside) >= 3 and chunk_time == sum(beside)  # its passes in the window were its chunks
    assert chunk_time <= share * total + CHUNK  # never more than its share (the last chunk may end the window)
    assert chunk_time >= 0.75 * share * total  # and not much less: the decoding rounds stop once owed
    assert log.text("long") == plain_text(pipe, pipe.codec.encode(LONG), 4)
