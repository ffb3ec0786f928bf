"""Pipeline runs as TextGeneration.steps(): one item per engine step, the same text as iterating (the
server scheduler's contract), on the in-memory pipeline of tests/pipelinekit.py."""

from __future__ import annotations

from spekula.config import SamplingParams, StopConfig

from pipelinekit import fake_pipeline


def test_steps_are_engine_steps_and_join_to_the_iterated_text():
    pipe = fake_pipeline(draft="other", k=3)
    ids = pipe.codec.encode("steps")
    run = pipe.start(ids, SamplingParams(), StopConfig(max_tokens=30))
    items = list(run.steps())
    assert len(items) == run.generation.stats.target_passes  # nothing runs two steps behind the scheduler's back
    assert "".join(items) == run.text == pipe.start(ids, SamplingParams(), StopConfig(max_tokens=30)).result().text


def test_a_stop_string_ends_the_steps_without_emitting_it():
    pipe = fake_pipeline(draft="same", k=4)
    ids = pipe.codec.encode("steps")
    full = pipe.generate(ids, SamplingParams(), StopConfig(max_tokens=40)).text
    stop = full[12:14]
    run = pipe.start(ids, SamplingParams(), StopConfig(max_tokens=40, stop=(stop,)))
    text = "".join(run.steps())
    assert text == full[: full.index(stop)] == run.text and run.generation.finish_reason == "stop"
    iterated = list(pipe.start(ids, SamplingParams(), StopConfig(max_tokens=40, stop=(stop,))))
    assert "".join(iterated) == text and all(iterated)  # iterating skips the empty steps
