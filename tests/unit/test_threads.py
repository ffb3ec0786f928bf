"""spekula.threads.on_passing_thread: fn's result or exception, on a thread that ends and takes the OpenMP
team its compute made with it (so the thread that serves afterwards is the only one computing)."""

from __future__ import annotations

import os
import threading
import time

import pytest

from spekula.config import BackendConfig
from spekula.pipeline import load_model
from spekula.threads import on_passing_thread


def os_threads() -> set[str]:
    return set(os.listdir("/proc/self/task"))


def gone(tids: set[str], within_s: float) -> bool:
    """Whether every OS thread in tids has exited within within_s (an exiting thread leaves /proc a moment
    after Python's join returns, and its team's helpers after it)."""
    deadline = time.monotonic() + within_s
    while tids & os_threads():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_returns_the_result_from_another_thread():
    caller = threading.get_ident()
    assert on_passing_thread(lambda a, b=0: (a + b, threading.get_ident()), 2, b=3)[0] == 5
    assert on_passing_thread(threading.get_ident) != caller


def test_raises_what_fn_raised():
    def fail():
        raise KeyError("missing")

    with pytest.raises(KeyError, match="missing"):
        on_passing_thread(fail)


@pytest.mark.model
def test_the_threads_a_llamacpp_pass_made_end_with_it():
    before = os_threads()

    def load_and_pass() -> set[str]:
        backend, _ = load_model("smollm2-135m", BackendConfig(runtime="llamacpp", threads=2, parallel=2, exact=False))
        seq = backend.new_sequence()
        seq.forward([5] * 16)
        return os_threads() - before

    made = on_passing_thread(load_and_pass)
    # the passing thread and at least one helper of the OpenMP team its pass ran on ...
    assert len(made) >= 2
    # ... and none of them outlives it
    assert gone(made, within_s=10.0), f"still running: {made & os_threads()}"
