"""One computing thread at a time: work that prepares a model for another thread runs on a thread that ends.

llama.cpp's CPU kernels (as llama-cpp-python's wheels build them) and PyTorch's run their helper threads as
OpenMP teams, and libgomp keeps each thread's team for as long as that thread lives. Once the process holds
more team threads than it has cores, libgomp throttles every team: a thread waiting at a barrier spins about
100 times instead of about 300,000 before it sleeps (libgomp's GOMP_SPINCOUNT), and llama.cpp meets a
barrier after every op of a pass, hundreds of times a pass, so each one becomes a sleep and a wake-up. The
server loaded and calibrated its pipeline on one thread and ran every pass on its scheduler thread: two
teams on 2 cores, and its one-token passes were far slower than with one team (`scripts/thread_cost.py`
measures a pass either way, each in fresh processes). Loading on a thread that ends (`on_passing_thread`)
takes its team with it, so the thread that serves is the only one computing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def on_passing_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) on a new thread that ends when fn returns; its result, or its exception re-raised
    here. Blocks the caller meanwhile (interruptible: the thread is a daemon, so Ctrl-C does not wait)."""
    result: dict[str, T] = {}
    failure: list[BaseException] = []

    def run() -> None:
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as e:  # handed to the caller, whatever it is
            failure.append(e)

    thread = threading.Thread(target=run, name=f"spekula-{getattr(fn, '__name__', 'work')}", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result["value"]
