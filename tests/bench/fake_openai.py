"""A tiny OpenAI-compatible server over an in-memory configuration, on loopback, for endpoint tests.

Streams /v1/completions and /v1/chat/completions as server-sent events (one chunk per engine step,
then a usage chunk when stream_options.include_usage asks for it), lists one model.
"""

from __future__ import annotations

import json
import threading
import time

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from spekula.config import SamplingParams, StopConfig


def make_app(contender, codec, model: str = "fake-model") -> FastAPI:
    app = FastAPI()
    lock = threading.Lock()  # one request at a time through the in-memory engine

    @app.get("/v1/models")
    def models():
        return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "tests"}]}

    def handle(body: dict, chat: bool):
        ids = codec.encode(messages=body["messages"]) if chat else codec.encode(body["prompt"])
        sampling = SamplingParams(temperature=body.get("temperature", 1.0), top_p=body.get("top_p", 1.0), seed=body.get("seed"))
        stop = StopConfig(max_tokens=body.get("max_tokens") or 16)
        kind = "chat.completion.chunk" if chat else "text_completion"

        def chunk(piece, finish=None):
            choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece, "logprobs": None}
            return {"id": "x", "object": kind, "created": 0, "model": model, "choices": [dict(choice, finish_reason=finish)]}

        def events():
            with lock:
                run = contender.start(ids, sampling, stop)
                for piece in run:
                    yield f"data: {json.dumps(chunk(piece))}\n\n"
                done = run.result()
            yield f"data: {json.dumps(chunk('', done.finish_reason))}\n\n"
            if (body.get("stream_options") or {}).get("include_usage"):
                usage = {"prompt_tokens": len(ids), "completion_tokens": len(done.token_ids), "total_tokens": len(ids) + len(done.token_ids)}
                yield f"data: {json.dumps({'id': 'x', 'object': kind, 'created': 0, 'model': model, 'choices': [], 'usage': usage})}\n\n"
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

    def __enter__(self) -> "Served":
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
