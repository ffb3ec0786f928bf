"""Shutdown that keeps its word: on SIGTERM or SIGINT the server drains before it stops listening.

    signal --> refuse:  new generation requests get 503 shutting_down and /health 503; the port stays
                        open, so a client or load balancer gets an answer, not a refused connection
           --> drain:   requests in flight run on, for up to --shutdown-timeout
           --> abandon: past it, every request still waiting for the engine is answered 503
                        shutting_down (JSON; a stream gets the error as an event, then [DONE]) and its
                        job is cancelled, so its slot is freed within one engine step
           --> stop listening, close idle connections, stop the scheduler, exit 0

A second signal cuts the drain short: the abandon step comes at once. The process exits 0 after a
drain whether every request finished or some were answered 503 (the log says how many): it did
what it promised. uvicorn on its own re-raises the signal once it has shut down, so the process dies
of it (a shell sees 143 for SIGTERM, 130 for SIGINT) however well it drained; Server does not.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Callable

from spekula.extras import needs_extra
from spekula.server.errors import APIError
from spekula.server.scheduler import Event, Failed, Job

with needs_extra("server", "spekula.server.shutdown"):
    import uvicorn

log = logging.getLogger("spekula.server")
ANSWER_GRACE_S = 5.0  # once the drain has given up: how long the 503s get to go out before connections close
REFUSED = "the server is shutting down and takes no new requests; retry on another instance or later"
ABANDONED = "the server shut down before this request finished; retry it"


def shutting_down(message: str = REFUSED) -> APIError:
    return APIError(503, message, code="shutting_down")


class Drain:
    """The shutdown's state, on the event loop: whether new requests are refused, the generation
    requests in flight (counted by the Gate from arrival to the last byte of their response), and the
    jobs to answer 503 if the drain gives up on them (tracked by the routes)."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.reset()

    def reset(self) -> None:
        """A fresh drain, for an app (re)starting: called from its lifespan, on the event loop."""
        self.refusing = False
        self.abandoned = False
        self.began: float | None = None
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._hurry = asyncio.Event()
        self._jobs: dict[Job, tuple[Callable[[Event], None], Callable[[], None]]] = {}
        self._task: asyncio.Future[bool] | None = None
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None

    # -- the Gate and the routes --------------------------------------------------------------------

    def enter(self) -> None:
        self._in_flight += 1
        self._idle.clear()

    def leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0:
            self._idle.set()

    def track(self, job: Job, sink: Callable[[Event], None], cancel: Callable[[], None]) -> None:
        """Remember a job about to be submitted, to answer it if the drain gives up (503 if it has already)."""
        if self.abandoned:
            raise shutting_down()
        self._jobs[job] = (sink, cancel)

    def untrack(self, job: Job) -> None:
        self._jobs.pop(job, None)

    def remaining_s(self) -> float:
        """Seconds left of --shutdown-timeout (all of it before the drain began)."""
        if self.began is None:
            return self.timeout_s
        return max(0.0, self.began + self.timeout_s - time.monotonic())

    # -- the shutdown -------------------------------------------------------------------------------

    def hurry(self) -> None:
        """Stop waiting for the requests in flight. Safe from a signal handler or another thread."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._hurry.set)

    async def run(self) -> bool:
        """Refuse, drain, abandon what is left. True when every request finished on its own.
        Runs once: a later call (the lifespan's, after uvicorn's) waits for the first."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._run())
        return await asyncio.shield(self._task)

    async def _run(self) -> bool:
        self.refusing = True
        self.began = time.monotonic()
        if self._in_flight:
            log.info("shutting down: %d request(s) in flight get up to %g s to finish", self._in_flight, self.timeout_s)
        if await self._wait_idle(self.timeout_s, hurry=True):
            return True
        self.abandoned = True
        jobs, self._jobs = list(self._jobs.items()), {}
        log.warning(
            "shutting down: %d request(s) still running after %.1f s answered 503 shutting_down",
            len(jobs),
            time.monotonic() - self.began,
        )
        for _, (sink, cancel) in jobs:
            sink(Failed(shutting_down(ABANDONED)))  # first: queued ahead of whatever the worker says to the cancel
            cancel()  # the worker frees its slot and caches before its next step
        await self._wait_idle(ANSWER_GRACE_S)
        return False

    async def _wait_idle(self, timeout: float, hurry: bool = False) -> bool:
        waits = [asyncio.ensure_future(self._idle.wait())]
        if hurry:
            waits.append(asyncio.ensure_future(self._hurry.wait()))
        try:
            await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()
        return self._idle.is_set()


class Server(uvicorn.Server):
    """uvicorn, draining the app (Drain) before it stops listening, and exiting normally after a signal."""

    def __init__(self, config: uvicorn.Config, drain: Drain | None = None) -> None:
        super().__init__(config)
        self.drain = drain
        self.closing = threading.Event()  # set once it stopped listening: new connections are refused

    def handle_exit(self, sig: int, frame) -> None:
        # Unlike uvicorn's own handler, this one does not record the signal for re-raising after the
        # shutdown (which made the exit code 128 + signal however the drain went).
        if self.should_exit and self.drain is not None:
            self.drain.hurry()  # a second signal: stop waiting for the requests in flight
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.drain is not None:
            await self.drain.run()
        for server in self.servers:  # what super().shutdown does first; done here so it can be signalled
            server.close()
        for sock in sockets or []:
            sock.close()
        self.closing.set()
        await super().shutdown(sockets)


def serve(app, sock: socket.socket, log_level: str = "info") -> int:
    """Serve a create_app() app on a bound socket in the foreground until SIGTERM or SIGINT, then
    shut down as above. Returns the process's exit code."""
    config = uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=int(ANSWER_GRACE_S))
    Server(config, getattr(app.state, "drain", None)).run(sockets=[sock])
    return 0
