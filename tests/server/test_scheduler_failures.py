"""A request that fails in the engine is finished with engine_error, whichever stage failed, and the worker
keeps serving: the other requests of its round finish, and so do the requests admitted after it. A batched
forward that fails ends every request of its batch (their caches are in an unknown state)."""

from __future__ import annotations

import logging

import pytest
from test_scheduler import Outcome, Request, run

from spekula.engine import Generation
from spekula.server import scheduler as scheduler_module
from spekula.server.metrics import ServerMetrics
from spekula.server.scheduler import ENGINE_ERROR, Failed, Scheduler

from serverkit import break_target, fake_pipeline, native_pipeline

BROKEN = "~ a request the engine fails on"
FINE = [Request("fine, beside it", 12), Request("fine, admitted after it", 12)]


def failed(outcome: Outcome) -> bool:
    """The request ended with engine_error, and nothing after it."""
    last = outcome.events[-1][1]
    return isinstance(last, Failed) and last.error is ENGINE_ERROR


def break_method(monkeypatch, pipe, owner, name: str) -> None:
    """owner.name raises for the broken request only."""
    broken = pipe.codec.encode(BROKEN)
    healthy = getattr(owner, name)

    def method(*args, **kwargs):
        generation = args[0] if owner is Generation else None
        prompt = generation.prompt_ids if generation is not None else args[0]
        if list(prompt) == broken:
            raise RuntimeError(f"simulated failure in {name}")
        return healthy(*args, **kwargs)

    monkeypatch.setattr(owner, name, method)


# stage -> (how to break it, the scheduler's options, what the log says after "request job-0 ")
STAGES = {
    "start": (lambda mp, pipe: break_method(mp, pipe, pipe.engine, "generate"), {}, "could not start"),
    "prefill start": (
        lambda mp, pipe: break_method(mp, pipe, Generation, "prefill_chunk"),
        {},
        "could not start its prefill",
    ),
    "prefill": (lambda mp, pipe: break_target(pipe), {"prefill_chunk": 4}, "failed in its prefill"),
    "plan": (lambda mp, pipe: break_method(mp, pipe, Generation, "plan"), {}, "failed before its target pass"),
    "score": (lambda mp, pipe: break_target(pipe), {}, "failed in the engine"),
    "complete": (lambda mp, pipe: break_method(mp, pipe, Generation, "complete"), {}, "failed in the engine"),
}


@pytest.mark.parametrize("stage", STAGES)
def test_a_request_that_fails_is_finished_with_engine_error_and_the_worker_serves_on(stage, monkeypatch, caplog):
    pipe = fake_pipeline(draft="ngram")  # a backend that does not batch: each request's failure is its own
    breaks, options, said = STAGES[stage]
    breaks(monkeypatch, pipe)
    scheduler = Scheduler(pipe, ServerMetrics(), max_running=2, max_queue=16, **options)
    with caplog.at_level(logging.ERROR, logger="spekula.server"):
        broken, beside, after = run(pipe, [Request(BROKEN, 12), *FINE], scheduler)
    assert failed(broken)
    assert beside.finished.stats.output_tokens == after.finished.stats.output_tokens == 12
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == [f"request job-0 {said}"]
    assert errors[0].exc_info is not None  # the traceback goes to the log, not to the client


def break_first_batch(monkeypatch, pipe, calls: list[int]) -> None:
    """The target's first batched forward raises; calls gets the number of sequences of each."""
    healthy = pipe.target.forward_batch

    def forward_batch(sequences, *args, **kwargs):
        calls.append(len(sequences))
        if len(calls) == 1:
            raise RuntimeError("simulated failure of a batched forward")
        return healthy(sequences, *args, **kwargs)

    monkeypatch.setattr(pipe.target, "forward_batch", forward_batch)


def test_a_failed_batched_forward_ends_every_request_of_its_batch_and_the_worker_serves_on(monkeypatch, caplog):
    pipe = native_pipeline(k=4)  # a backend that batches: the round's steps are one forward
    calls: list[int] = []
    break_first_batch(monkeypatch, pipe, calls)
    scheduler = Scheduler(pipe, ServerMetrics(), max_running=2, max_queue=16)
    assert scheduler.batching
    with caplog.at_level(logging.ERROR, logger="spekula.server"):
        first, second, after = run(pipe, [Request("one of a batch", 12), Request("the other", 12), FINE[1]], scheduler)
    assert calls[0] == 2 and failed(first) and failed(second)
    assert after.finished.stats.output_tokens == 12
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        "a batched forward of 2 requests failed"
    ]


def test_a_failed_batched_prefill_ends_the_requests_of_its_pass_only(monkeypatch, caplog):
    monkeypatch.setattr(scheduler_module, "PREFILL_BATCH_TOKENS", 4)  # prompts longer than this: a pass of their own
    pipe = native_pipeline(k=4)
    calls: list[int] = []
    break_first_batch(monkeypatch, pipe, calls)
    scheduler = Scheduler(pipe, ServerMetrics(), max_running=2, max_queue=16)
    with caplog.at_level(logging.ERROR, logger="spekula.server"):
        first, second, after = run(pipe, [Request("shortest", 12), *FINE], scheduler)
    assert calls[:2] == [1, 1]  # each prompt prefilled in a batched pass of its own, the shortest first
    assert failed(first)
    assert second.finished.stats.output_tokens == after.finished.stats.output_tokens == 12
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [
        "a batched prefill of 1 requests failed"
    ]
