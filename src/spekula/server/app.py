"""The FastAPI app: create_app(pipeline or factory, settings), its lifespan, the gate, error handlers.

The gate (a plain ASGI middleware) counts every response by endpoint and status and checks the API
key before anything else runs; /health stays open so a load balancer needs no key. It also keeps the
shutdown's books (spekula.server.shutdown): generation requests in flight are counted, new ones are
refused with 503 once the drain began. Every error leaves as an OpenAI-style error object
(spekula.server.errors), including FastAPI's own 404/405.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from spekula.pipeline import Pipeline
from spekula.server.errors import APIError, error_body
from spekula.server.metrics import ENDPOINTS, ServerMetrics
from spekula.server.responses import DONE, sse
from spekula.server.routes import router
from spekula.server.scheduler import Scheduler
from spekula.server.settings import ServerSettings
from spekula.server.shutdown import Drain, shutting_down
from spekula.server.state import ServerState
from spekula.threads import on_passing_thread

log = logging.getLogger("spekula.server")
GENERATION = ("/v1/completions", "/v1/chat/completions")


def create_app(pipeline: Pipeline | Callable[[], Pipeline], settings: ServerSettings = ServerSettings()) -> FastAPI:
    """An app serving `pipeline` (or the one `pipeline()` loads at startup, off the event loop)."""
    state = ServerState(settings, ServerMetrics())
    drain = Drain(settings.shutdown_timeout_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        drain.reset()
        if isinstance(pipeline, Pipeline):
            state.pipeline = pipeline
        else:  # on a thread that ends, so that the scheduler's thread computes alone (spekula.threads)
            state.pipeline = await asyncio.to_thread(on_passing_thread, pipeline)
        state.scheduler = Scheduler(
            state.pipeline,
            state.metrics,
            max_running=settings.max_running,
            max_queue=settings.max_queue,
            prefill_chunk=settings.prefill_chunk,
            prefill_share=settings.prefill_share,
            spec_disable_by_batch_size=settings.spec_disable_by_batch_size,
            spec_max_slowdown=settings.spec_max_slowdown,
        )
        state.scheduler.start()
        log.info("serving %s (proposer %s) on the scheduler thread", state.model_name, state.pipeline.draft_name)
        yield
        await drain.run()  # at once when uvicorn ran it already (shutdown.Server)
        drained = await asyncio.to_thread(state.scheduler.close, max(drain.remaining_s(), 1.0))
        log.info("scheduler stopped%s", "" if drained else " (requests still running were aborted)")

    app = FastAPI(title="spekula", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    app.state.drain = drain
    app.include_router(router)
    app.add_middleware(Gate, api_key=settings.api_key, metrics=state.metrics, drain=drain)

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        message = {
            404: f"no such path {request.url.path}; the API lives under /v1 (completions, chat/completions, models)",
            405: f"{request.method} is not allowed on {request.url.path}",
        }.get(e.status_code, str(e.detail))
        return JSONResponse(
            error_body(e.status_code, message), status_code=e.status_code, headers=getattr(e, "headers", None)
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, e: RequestValidationError) -> JSONResponse:
        return JSONResponse(error_body(400, f"invalid request: {e.errors()[:1]}"), status_code=400)

    @app.exception_handler(Exception)
    async def internal_error(request: Request, e: Exception) -> JSONResponse:
        log.exception("unhandled error on %s", request.url.path)
        return JSONResponse(error_body(500, "internal server error; the server log has the details"), status_code=500)

    return app


class Gate:
    """Counts responses by endpoint and status; refuses requests without the right API key, and
    generation requests once the server is shutting down."""

    def __init__(self, app: ASGIApp, api_key: str | None, metrics: ServerMetrics, drain: Drain) -> None:
        self.app = app
        self.key = api_key.encode() if api_key else None
        self.metrics = metrics
        self.drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"]
        endpoint = path if path in ENDPOINTS else "/v1/models/{model}" if path.startswith("/v1/models/") else "other"

        started: list[Message] = []

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.metrics.http_requests.labels(endpoint, str(message["status"])).inc()
                started.append(message)
            await send(message)

        if self.key is not None and path != "/health":
            refusal = self._refusal(scope)
            if refusal is not None:
                response = JSONResponse(
                    error_body(401, refusal, code="invalid_api_key"),
                    status_code=401,
                    headers={"WWW-Authenticate": "Bearer"},
                )
                return await response(scope, receive, counted)
        if path not in GENERATION:
            return await self.app(scope, receive, counted)
        if self.drain.refusing:
            return await JSONResponse(shutting_down().body(), status_code=503)(scope, receive, counted)
        self.drain.enter()
        try:
            await self.app(scope, receive, counted)
        except asyncio.CancelledError:
            if not self.drain.refusing:
                raise
            # uvicorn cancels what outlived the drain and its grace (a client that stopped reading, a
            # body still arriving): end it with the 503 it would have got, not a traceback and a 500
            log.warning("%s: cut off at shutdown, still unanswered after the drain", path)
            await self._cut_off(scope, receive, counted, started)
        finally:
            self.drain.leave()

    @staticmethod
    async def _cut_off(scope: Scope, receive: Receive, send: Send, started: list[Message]) -> None:
        error = shutting_down().body()
        try:
            if not started:
                await asyncio.wait_for(JSONResponse(error, status_code=503)(scope, receive, send), 1.0)
            elif dict(started[0].get("headers", [])).get(b"content-type", b"").startswith(b"text/event-stream"):
                body = sse(error) + DONE
                await asyncio.wait_for(send({"type": "http.response.body", "body": body, "more_body": False}), 1.0)
        except (TimeoutError, OSError):
            pass  # the client does not read: uvicorn closes the connection

    def _refusal(self, scope: Scope) -> str | None:
        header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
        if header is None:
            return "this server needs an API key: send the header 'Authorization: Bearer <key>'"
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not token.strip():
            return "malformed Authorization header: send 'Authorization: Bearer <key>'"
        if not hmac.compare_digest(token.strip(), self.key):  # constant time: no timing hint at the key
            return "wrong API key: check the key you send in 'Authorization: Bearer <key>'"
        return None
