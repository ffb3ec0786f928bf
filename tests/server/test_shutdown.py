"""Shutdown that keeps its word, on a real process sent a real signal (spekula.server.shutdown).

On SIGTERM/SIGINT: new requests get 503 shutting_down (the port stays open) and /health 503; running
requests finish for up to --shutdown-timeout; past it, a non-streamed request gets 503 shutting_down
as OpenAI's JSON error and a stream gets the error as an event, then [DONE]; the log holds no
traceback; the process exits 0.

The first tests run the fake model of tests/pipelinekit.py behind `spekula.server.shutdown.serve`
(what `spekula serve` runs once its models are loaded) in a subprocess; the last runs `spekula serve`
itself on SmolLM2-135M; one, in-process, covers what uvicorn cancels after the drain. Nothing sleeps
to synchronise: the tests poll /health, the log or a stream's first event, each with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from spekula.server.app import Gate
from spekula.server.metrics import ServerMetrics
from spekula.server.shutdown import Drain

from serverkit import MODEL

WAIT = 30.0  # seconds any single wait may take before the test fails
TESTS = Path(__file__).resolve().parents[1]
FAKE_SERVER = """
import logging, sys
import torch
from pipelinekit import fake_pipeline
from spekula.server.app import create_app
from spekula.server.listen import bind
from spekula.server.settings import ServerSettings
from spekula.server.shutdown import serve

torch.set_num_threads(1)
logging.basicConfig(level="INFO", format="%(levelname)s %(name)s: %(message)s")
delay_s, shutdown_timeout_s = float(sys.argv[1]), float(sys.argv[2])
sock = bind("127.0.0.1", 0)
app = create_app(fake_pipeline(draft="none", delay_s=delay_s), ServerSettings(shutdown_timeout_s=shutdown_timeout_s))
print(f"serving on http://127.0.0.1:{sock.getsockname()[1]}/v1", file=sys.stderr, flush=True)
sys.exit(serve(app, sock, "info"))
"""
TRACEBACK = re.compile(r"Traceback|CancelledError|Exception in ASGI|ASGI callable returned")


class Process:
    """A server process; its log goes to a file (a pipe nobody reads could fill and stall it)."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.log_path = log
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env=env)
        self.url = ""

    def ready(self) -> Process:
        """Waits until it serves (it starts in the background: two can load at once)."""
        port = self._until(lambda: re.search(r"on http://127\.0\.0\.1:(\d+)/v1", self.log), timeout=120.0)[1]
        self.url = f"http://127.0.0.1:{port}"
        self._until(lambda: self.health()[0] == 200)
        return self

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> tuple[int, dict]:
        try:
            r = httpx.get(self.url + "/health", timeout=WAIT)
        except httpx.TransportError:
            return 0, {}
        return r.status_code, r.json()

    def _until(self, predicate, timeout: float = WAIT):
        """Polls `predicate` until it is truthy (its value); fails when the process died or time is up."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = predicate()
            if value:
                return value
            if self.proc.poll() is not None:
                pytest.fail(f"the server exited with {self.proc.returncode}:\n{self.log[-3000:]}")
            time.sleep(0.02)  # a polling interval, not a synchronisation
        pytest.fail(f"timed out waiting for the server:\n{self.log[-3000:]}")

    def until(self, predicate, timeout: float = WAIT):
        return self._until(predicate, timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def fakes(tmp_path_factory):
    """Two fake servers, started together (each takes seconds to import torch): one whose drain (4 s)
    is shorter than its long requests, one whose drain (60 s) is longer than any test here waits."""
    logs = tmp_path_factory.mktemp("shutdown")
    argv = [sys.executable, "-c", FAKE_SERVER, "0.02"]  # 0.02 s per target pass, one token each (no draft)
    servers = {"short": Process([*argv, "4"], logs / "short.log"), "long": Process([*argv, "60"], logs / "long.log")}
    yield servers
    for server in servers.values():
        server.stop()


class Stream:
    """A raw SSE request read in a thread: `first` is set at its first event, `events` holds every data line."""

    def __init__(self, pool: ThreadPoolExecutor, url: str, body: dict) -> None:
        self.first = threading.Event()
        self.events: list[str] = []
        self.status = 0
        self.done = pool.submit(self._read, url, body)

    def _read(self, url: str, body: dict) -> list[str]:
        with httpx.stream("POST", url, json={**body, "stream": True}, timeout=WAIT) as r:
            self.status = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line.removeprefix("data: "))
                    self.first.set()
        return self.events


def assert_shutting_down(r: httpx.Response) -> None:
    assert r.status_code == 503 and r.headers["content-type"] == "application/json", (r.status_code, r.text)
    error = r.json()["error"]
    assert (error["code"], error["type"]) == ("shutting_down", "service_unavailable") and error["message"]


def assert_stream_ends_with_shutting_down(events: list[str]) -> None:
    assert events[-1] == "[DONE]", events[-3:]
    error = json.loads(events[-2])["error"]
    assert (error["code"], error["type"]) == ("shutting_down", "service_unavailable"), events[-2]
    assert all("finish_reason" not in e or '"finish_reason":null' in e for e in events[:-2])  # never a clean end


def test_sigterm_drains_what_fits_answers_the_rest_503_and_exits_0(fakes):
    # round-robin over three requests: the short stream needs well under a second, the long ones half a
    # minute, the drain gets 4 s
    server = fakes["short"].ready()
    completions = server.url + "/v1/completions"
    long = {"model": MODEL, "prompt": "go", "max_tokens": 480}
    with ThreadPoolExecutor(3) as pool:
        unstreamed = pool.submit(httpx.post, completions, json=long, timeout=WAIT)
        streamed = Stream(pool, completions, long)
        server.until(lambda: server.health()[1].get("running") == 2)
        short = Stream(pool, completions, {**long, "max_tokens": 12})
        assert streamed.first.wait(WAIT) and short.first.wait(WAIT)

        server.proc.send_signal(signal.SIGTERM)
        server.until(lambda: server.health() == (503, {"status": "shutting_down"}))
        assert_shutting_down(httpx.post(completions, json={**long, "max_tokens": 4}, timeout=WAIT))
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}
        assert_shutting_down(httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=WAIT))
        assert httpx.get(server.url + "/v1/models", timeout=WAIT).status_code == 200  # the rest still answers

        assert short.done.result(WAIT)[-1] == "[DONE]" and short.status == 200  # finished within the drain
        assert json.loads(short.events[-2])["choices"][0]["finish_reason"] == "length"
        assert_shutting_down(unstreamed.result(WAIT))
        assert streamed.status == 200
        assert_stream_ends_with_shutting_down(streamed.done.result(WAIT))

    assert server.proc.wait(WAIT) == 0
    log = server.log
    assert not TRACEBACK.search(log), log[-3000:]
    assert "2 request(s) still running after" in log and "answered 503 shutting_down" in log


def test_sigint_with_a_request_in_flight_drains_it_and_exits_0_at_once(fakes):
    server = fakes["long"].ready()
    with ThreadPoolExecutor(1) as pool:
        streamed = Stream(pool, server.url + "/v1/completions", {"model": MODEL, "prompt": "go", "max_tokens": 100})
        assert streamed.first.wait(WAIT)
        began = time.monotonic()
        server.proc.send_signal(signal.SIGINT)
        events = streamed.done.result(WAIT)
    assert events[-1] == "[DONE]" and json.loads(events[-2])["choices"][0]["finish_reason"] == "length"
    assert server.proc.wait(WAIT) == 0  # uvicorn alone re-raises the signal: exit 130 (143 for SIGTERM)
    assert time.monotonic() - began < 30.0  # a clean drain ends when the last request does, not after 60 s
    assert not TRACEBACK.search(server.log) and "KeyboardInterrupt" not in server.log
    assert "1 request(s) in flight get up to 60 s" in server.log and "still running after" not in server.log


def test_what_uvicorn_cancels_after_the_drain_still_gets_its_503():
    """A request the drain could not answer (a body still arriving, a client that stopped reading) is
    cancelled by uvicorn once its grace is over: the Gate ends it with the 503 instead of a traceback."""

    async def scenario() -> dict[str, list[dict]]:
        drain = Drain(1.0)
        entered = asyncio.Event()

        async def stuck(scope, receive, send) -> None:
            if scope["path"] == "/v1/chat/completions":  # a stream: its 200 has gone out
                await send(
                    {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
                )
            entered.set()
            await asyncio.Event().wait()  # never answers

        gate = Gate(stuck, api_key=None, metrics=ServerMetrics(), drain=drain)
        sent: dict[str, list[dict]] = {}
        for path, refusing in [("/v1/completions", False), ("/v1/completions", True), ("/v1/chat/completions", True)]:
            drain.reset()
            sent[path] = messages = []
            entered.clear()

            async def send(message: dict, messages=messages) -> None:
                messages.append(message)

            async def receive() -> dict:
                return {"type": "http.request", "body": b"", "more_body": False}

            scope = {"type": "http", "path": path, "method": "POST", "headers": []}
            task = asyncio.create_task(gate(scope, receive, send))
            await entered.wait()
            drain.refusing = refusing  # the drain began after the request arrived (False: an ordinary cancel)
            task.cancel()
            if refusing:
                await task  # ends normally: nothing for uvicorn to log
            else:
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert messages == []
        return sent

    sent = asyncio.run(scenario())
    plain, stream = sent["/v1/completions"], sent["/v1/chat/completions"]
    assert plain[0]["status"] == 503 and json.loads(plain[1]["body"])["error"]["code"] == "shutting_down"
    assert stream[0]["status"] == 200 and stream[-1]["more_body"] is False
    events = [e.removeprefix("data: ") for e in stream[-1]["body"].decode().split("\n\n") if e]
    assert_stream_ends_with_shutting_down(events)


@pytest.mark.model
def test_spekula_serve_on_a_real_model_keeps_its_word_at_sigterm(tmp_path):
    # a drain longer than the test: the second SIGTERM ends it (what a past --shutdown-timeout does is
    # the fake server's test above; this one needs no guess at the real model's speed)
    argv = [sys.executable, "-m", "spekula", "serve", "--target", "smollm2-135m", "--draft", "none"]
    argv += ["--backend", "transformers", "--dtype", "float32", "--threads", "1", "--port", "0"]
    argv += ["--shutdown-timeout", "600", "--max-tokens-limit", "2000"]
    server = Process(argv, tmp_path / "serve.log")
    body = {"model": "smollm2-135m", "prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 2000}  # counts on and on
    try:
        completions = server.ready().url + "/v1/completions"
        with ThreadPoolExecutor(2) as pool:
            unstreamed = pool.submit(httpx.post, completions, json=body, timeout=WAIT)
            streamed = Stream(pool, completions, body)
            assert streamed.first.wait(WAIT)
            server.until(lambda: server.health()[1].get("running") == 2)
            server.proc.send_signal(signal.SIGTERM)
            server.until(lambda: server.health() == (503, {"status": "shutting_down"}))
            assert_shutting_down(httpx.post(completions, json=body, timeout=WAIT))
            assert not unstreamed.done() and not streamed.done.done()  # the drain waits for them...
            server.proc.send_signal(signal.SIGTERM)  # ...until a second signal
            assert_shutting_down(unstreamed.result(WAIT))
            assert_stream_ends_with_shutting_down(streamed.done.result(WAIT))
        assert server.proc.wait(WAIT) == 0
        assert not TRACEBACK.search(server.log), server.log[-3000:]
        assert "2 request(s) still running after" in server.log
    finally:
        server.stop()
