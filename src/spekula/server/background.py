"""Run an app on loopback in a background thread: for tests, the load script and notebooks.

`spekula serve` runs uvicorn in the foreground instead; this is the same server (shutdown.Server:
it drains before it stops listening), started and stopped from Python, with Events (not flags to
poll) for "listening" and "no longer listening".
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from spekula.extras import needs_extra
from spekula.server.listen import bind

with needs_extra("server", "spekula.server.background"):
    import uvicorn

    from spekula.server.shutdown import ANSWER_GRACE_S, Server


class ReadyServer(Server):
    """Server, plus .ready; .closing (set once it stopped listening, after the drain) comes with Server."""

    def __init__(self, config: uvicorn.Config, drain=None) -> None:
        super().__init__(config, drain)
        self.ready = threading.Event()  # set once listening (or once startup failed: check .started)

    async def startup(self, sockets=None) -> None:
        try:
            await super().startup(sockets)
        finally:
            self.ready.set()


@dataclass
class Running:
    url: str  # http://127.0.0.1:PORT (the API is under /v1)
    server: ReadyServer
    app: Any  # the ASGI app served (create_app's)

    @property
    def scheduler(self):
        return self.app.state.server.scheduler

    def metric(self, name: str, **labels: str) -> float:
        """A sample's value from the app's own registry (what GET /metrics renders); 0 if absent."""
        value = self.app.state.server.metrics.registry.get_sample_value(name, labels or None)
        return 0.0 if value is None else value


@contextmanager
def serving(
    app, host: str = "127.0.0.1", startup_timeout: float = 300.0, shutdown_timeout: int = 10
) -> Iterator[Running]:
    """Serves `app` on a free port of `host` until the block ends (in-flight requests finish first,
    up to the app's --shutdown-timeout; shutdown_timeout bounds uvicorn's own wait after that)."""
    sock = bind(host, 0)
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=shutdown_timeout)
    server = ReadyServer(config, getattr(getattr(app, "state", None), "drain", None))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="spekula-uvicorn", daemon=True)
    thread.start()
    try:
        if not server.ready.wait(startup_timeout):
            raise RuntimeError(f"the server did not start within {startup_timeout:g} s")
        if not server.started:
            raise RuntimeError("the server failed to start (see the log above)")
        yield Running(f"http://{host}:{port}", server, app)
    finally:
        server.should_exit = True
        drain_s = server.drain.timeout_s + ANSWER_GRACE_S if server.drain is not None else 0.0
        thread.join(timeout=drain_s + shutdown_timeout + 20)
        sock.close()
        if thread.is_alive():
            raise RuntimeError("the server did not stop")
