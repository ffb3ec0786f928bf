"""The endpoints. A generation request: read and validate the body, tokenize, submit a Job to the
scheduler, then relay its events: as one JSON response, or as server-sent events ending in [DONE].

Leaving early (client gone, handler cancelled) always cancels the job, so its slot and KV caches
are freed within one engine step. Every job is known to the shutdown's Drain while it runs, so one
the drain gives up on is answered 503 shutting_down like any other error (spekula.server.shutdown).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from spekula.server.errors import APIError
from spekula.server.metrics import CONTENT_TYPE
from spekula.server.responses import DONE, ResponseShape, sse
from spekula.server.scheduler import Delta, Event, Failed, Finished, Job
from spekula.server.schemas import GenerationRequest, Kind, parse_request, read_json

if TYPE_CHECKING:
    from spekula.server.state import ServerState

router = APIRouter()
HUNG_WORKER_GRACE_S = 30.0  # past the deadline, the handler stops waiting even if the worker never answers
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _state(request: Request) -> ServerState:
    return request.app.state.server


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    scheduler = _state(request).scheduler
    if request.app.state.drain.refusing:  # a load balancer should send its traffic elsewhere now
        return JSONResponse({"status": "shutting_down"}, status_code=503)
    if scheduler is None or not scheduler.accepting:
        return JSONResponse({"status": "unavailable"}, status_code=503)
    return JSONResponse({"status": "ok", "running": scheduler.num_running, "waiting": scheduler.num_waiting})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(_state(request).metrics.render(), media_type=CONTENT_TYPE)


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [_model_card(_state(request))]})


@router.get("/v1/models/{model:path}")
async def get_model(model: str, request: Request) -> JSONResponse:
    state = _state(request)
    _check_model(state, model)
    return JSONResponse(_model_card(state))


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _generate(request, "completion")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _generate(request, "chat")


# -- generation -----------------------------------------------------------------------------------


class AsyncSink:
    """Carries the worker thread's events into the event loop, in order. deltas False (a response sent whole):
    a step's text is not carried, as Finished brings all of it; so the event loop is not woken at every step of
    the request, taking a core from the pass that is computing (two compute threads on two cores)."""

    def __init__(self, deltas: bool = True) -> None:
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[Event] = asyncio.Queue()
        self.deltas = deltas

    def __call__(self, event: Event) -> None:
        if not self.deltas and isinstance(event, Delta):
            return
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)
        except RuntimeError:  # the loop has closed: nobody is listening any more
            pass


async def _generate(request: Request, kind: Kind) -> Response:
    state = _state(request)
    scheduler = state.scheduler
    assert scheduler is not None  # started at startup, before the app takes a request
    settings = state.settings
    offer = state.speculation
    req = parse_request(await read_json(request, settings.max_body_bytes), kind, settings, offer)
    _check_model(state, req.model)
    prompt_ids = await run_in_threadpool(state.encode, req)
    shape = ResponseShape(kind, state.model_name, guarantee=state.guarantee)
    sink = AsyncSink(deltas=req.stream)
    log_text = (
        (req.prompt if isinstance(req.prompt, str) else str(req.prompt or req.messages))
        if settings.log_prompts
        else None
    )
    namespace = state.namespace(request.headers.get("authorization"))
    job = Job(
        shape.id,
        prompt_ids,
        req.sampling,
        req.stop,
        sink,
        settings.request_timeout_s,
        log_text=log_text,
        namespace=namespace,
        spec=None if req.spec == offer else req.spec,  # None: the server's own, exactly as without `spec`
    )
    drain = request.app.state.drain
    drain.track(job, sink, lambda: scheduler.cancel(job))  # 503 once the drain has given up
    try:
        scheduler.submit(job)  # 429 when the queue is full, 503 when shutting down
    except APIError:
        drain.untrack(job)
        raise
    if req.stream:

        def close() -> None:
            scheduler.cancel(job)
            drain.untrack(job)

        return JobStream(_stream(state, job, sink, shape, req), on_close=close)
    try:
        return await _complete(request, state, job, sink, shape, req)
    finally:
        drain.untrack(job)


class JobStream(StreamingResponse):
    """An SSE response that cancels its job however the response ends: finished (a no-op then),
    client gone, or cancelled before the body generator ever ran (when its own finally cannot)."""

    def __init__(self, content: AsyncIterator[bytes], on_close) -> None:
        super().__init__(content, media_type="text/event-stream", headers=SSE_HEADERS)
        self.on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.on_close()


async def _complete(
    request: Request, state: ServerState, job: Job, sink: AsyncSink, shape: ResponseShape, req: GenerationRequest
) -> Response:
    scheduler = state.scheduler
    assert scheduler is not None  # started at startup, before the app takes a request
    watcher = asyncio.create_task(_on_disconnect(request, lambda: scheduler.cancel(job)))
    finished = False
    try:
        while True:
            event = await _next_event(state, job, sink)
            if isinstance(event, Finished):
                finished = True
                return JSONResponse(shape.response(event.text, event.finish_reason, event.stats, req.spec))
            if isinstance(event, Failed):
                finished = True
                raise event.error
    finally:
        watcher.cancel()
        if not finished:  # the handler itself was cancelled
            scheduler.cancel(job)


async def _stream(
    state: ServerState, job: Job, sink: AsyncSink, shape: ResponseShape, req: GenerationRequest
) -> AsyncIterator[bytes]:
    """Server-sent events. Starlette cancels this generator when the client disconnects."""
    finished = False
    try:
        if shape.kind == "chat":
            yield sse(shape.chunk(role=True))  # OpenAI opens a chat stream with the role
        while True:
            event = await _next_event(state, job, sink)
            if isinstance(event, Delta):
                yield sse(shape.chunk(event.text))
                continue
            finished = True
            if isinstance(event, Finished):
                # include_usage: usage (and spec) ride once, on OpenAI's last chunk with no choices
                yield sse(shape.final_chunk(event.finish_reason, None if req.include_usage else event.stats, req.spec))
                if req.include_usage:
                    yield sse(shape.usage_chunk(event.stats, req.spec))
            else:  # the status line has gone out already: the error travels as an event (the openai client raises it)
                yield sse(event.error.body())
            yield DONE
            return
    finally:
        if not finished:
            assert state.scheduler is not None  # the job was submitted to it
            state.scheduler.cancel(job)


async def _next_event(state: ServerState, job: Job, sink: AsyncSink) -> Event:
    # The worker enforces the deadline between steps; this only guards against a worker that hangs.
    remaining = job.deadline - time.monotonic()
    try:
        async with asyncio.timeout(max(remaining, 0.0) + HUNG_WORKER_GRACE_S):  # no task per event, as wait_for makes
            return await sink.queue.get()
    except TimeoutError:
        assert state.scheduler is not None  # the job was submitted to it
        state.scheduler.cancel(job)
        return Failed(
            APIError(504, f"no answer from the engine within {job.timeout_s:g} s; lower max_tokens", code="timeout")
        )


async def _on_disconnect(request: Request, callback) -> None:
    """Waits until the client goes away (the body has been read, so the next message is the disconnect)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            callback()
            return


def _check_model(state: ServerState, model: str | None) -> None:
    if model is not None and model != state.model_name:
        raise APIError(
            404,
            f"model {model!r} is not served here; this server runs {state.model_name!r} (see GET /v1/models)",
            param="model",
            code="model_not_found",
        )


def _model_card(state: ServerState) -> dict:
    spec = state.speculation
    assert state.pipeline is not None  # loaded at startup, before the app takes a request
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "spekula",
        "max_model_len": state.pipeline.target.context_length,
        "speculation": {"proposer": spec.proposer, "k": spec.k, "k_max": spec.k_max},  # a request's `spec` within it
    }
