"""A tiny OpenAI-compatible server over an in-memory configuration, on loopback, for endpoint tests.

Streams /v1/completions and /v1/chat/completions as server-sent events (one chunk per engine step,
then a usage chunk when stream_options.include_usage asks for it), lists one model.

`fault(body)` may name a way to break a request's stream, as real servers do (FAULTS): the bench
must count each as an error, never as a short or empty success.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from spekula.config import SamplingParams, StopConfig

FAULTS = {
    "truncate": "one text chunk, then the stream ends: no finish_reason, no usage, no [DONE] (llama_cpp.server's cut)",
    "no_finish": "every chunk, usage and [DONE], but finish_reason stays null",
    "no_done": "every chunk, finish_reason and usage, then the stream ends without [DONE]",
    "error_event": "one text chunk, then an OpenAI error object as an event and [DONE] (an engine failure mid-stream)",
    "empty": "a whole stream with no text: finish_reason 'stop', usage with 0 completion tokens, [DONE]",
}


def make_app(
    contender,
    codec,
    model: str = "fake-model",
    fault: Callable[[dict], str | None] = lambda body: None,
) -> FastAPI:
    app = FastAPI()
    lock = threading.Lock()  # one request at a time through the in-memory engine

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "tests"}]}

    def handle(body: dict, chat: bool):
        ids = codec.encode(messages=body["messages"]) if chat else codec.encode(body["prompt"])
        sampling = SamplingParams(
            temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0), seed=body.get("seed")
        )
        stop = StopConfig(max_tokens=body.get("max_tokens") or 16)
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(piece, finish=None):
            choice = (
                {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece, "logprobs": None}
            )
            return {
                "id": "x",
                "object": kind,
                "created": 0,
                "model": model,
                "choices": [dict(choice, finish_reason=finish)],
            }

        broken = fault(body)
        assert broken is None or broken in FAULTS, broken

        def events():
            # Generate the whole answer first, then stream it: a client may close the stream after the
            # last event it needs, and a generator suspended at that yield would never release the lock.
            with lock:
                run = contender.start(ids, sampling, stop)
                pieces = list(run)
                done = run.result()
            for n, piece in enumerate(pieces):
                if broken == "empty":
                    continue
                if n == 1 and broken in ("truncate", "error_event"):
                    if broken == "error_event":
                        error = {"message": "the engine failed", "type": "server_error", "param": None, "code": None}
                        yield f"data: {json.dumps({'error': error})}\n\n"
                        yield "data: [DONE]\n\n"
                    return
                yield f"data: {json.dumps(chunk(piece))}\n\n"
            finish = {"no_finish": None, "empty": "stop"}.get(broken, done.finish_reason)
            yield f"data: {json.dumps(chunk('', finish))}\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                n = 0 if broken == "empty" else len(done.token_ids)
                usage = {"prompt_tokens": len(ids), "completion_tokens": n, "total_tokens": len(ids) + n}
                last = {"id": "x", "object": kind, "created": 0, "model": model, "choices": [], "usage": usage}
                yield f"data: {json.dumps(last)}\n\n"
            if broken != "no_done":
                yield "data: [DONE]\n\n"

        if not body.get("stream"):
            return JSONResponse({"error": "this test server only streams"}, status_code=400)
        return StreamingResponse(events(), media_type="text/event-stream")

    @app.post("/v1/completions")
    async def completions(request: Request):
        return handle(await request.json(), chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return handle(await request.json(), chat=True)

    return app


class Served:
    """Runs an app with uvicorn on 127.0.0.1 (a free port) in a thread; `url` ends in /v1."""

    def __init__(self, app: FastAPI) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
