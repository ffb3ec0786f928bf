"""Measuring OpenAI-compatible endpoints (spekula serve, vLLM, llama.cpp server, ...) with the openai client.

Each request streams, so time to first token and time per output token are measured on the client.
Output tokens are the server's own count (`usage.completion_tokens`, asked for with
stream_options.include_usage) when it reports one, otherwise the number of non-empty stream chunks
(marked per request as token_count_source = "chunks"). A server that streams no usage (llama_cpp.server)
borrows the count of the other side's identical text for the same prompt (`borrow_token_counts`), so an
identical answer counts the same number of tokens on both sides; where both report usage and differ on the same
text (llama-server counts the end token it sampled, spekula does not), both take the fewer.

Servers differ in their defaults for parameters outside OpenAI's API: llama_cpp.server applies a repeat
penalty of 1.1 and top-k 40 unless told otherwise, so its "greedy" is not plain greedy decoding. An
endpoint's `extra_body` (`--extra-body` / `--baseline-extra-body`) sends such parameters, e.g.
{"repeat_penalty": 1.0} for llama_cpp.server; it may not set what the shared options set (model,
max_tokens, temperature, ...), so both sides are asked the same question.
Two endpoints are measured in phases, one endpoint at a time (both at once would share the machine):
with repeats, the order alternates (baseline first, then the other first, ...), so a machine whose
speed drifts during the run favours neither (spekula.bench.commands.bench_endpoints).
Requests are bounded: at most `requests` of them (in each phase), no new one after `time_limit` seconds, each one
cut after `request_timeout` seconds.

A request counts only when its answer is whole: the stream must end with a finish_reason and then
[DONE], carry no error event, and hold some text (every request asks for at least one token). A
server that cuts streams short (llama_cpp.server interrupts a running stream when another request
arrives, by default) otherwise looks like a fast server of empty answers. Anything less is an
error: counted and shown, and left out of every ratio (spekula.bench.metrics).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

from spekula.bench.metrics import RequestResult
from spekula.bench.runner import request_sampling
from spekula.bench.workloads import WorkItem
from spekula.config import SamplingParams
from spekula.errors import ConfigError
from spekula.extras import needs_extra
from spekula.trace import RequestStats


@dataclass(frozen=True)
class Endpoint:
    name: str  # label in reports: "endpoint" or "baseline"
    url: str  # base URL, e.g. http://127.0.0.1:8000/v1
    model: str | None = None  # None: the first model the server lists
    api_key: str | None = None
    extra_body: dict[str, Any] | None = None  # server-specific request fields, e.g. {"repeat_penalty": 1.0}

    def __post_init__(self) -> None:
        if self.extra_body is None:
            return
        if not isinstance(self.extra_body, dict):
            raise ConfigError(f"{self.name}: the extra body must be a JSON object, got {self.extra_body!r}")
        shared = sorted(set(self.extra_body) & SHARED_FIELDS)
        if shared:
            raise ConfigError(
                f"{self.name}: the extra body may not set {', '.join(shared)}: the shared options set those for "
                "both endpoints alike"
            )


# Request fields bench sets from its own options, the same for every endpoint; an extra body may not override them.
SHARED_FIELDS = frozenset(
    {"model", "prompt", "messages", "max_tokens", "temperature", "top_p", "seed", "stream", "stream_options"}
)


@dataclass(frozen=True)
class Load:
    concurrency: int = 1
    requests: int | None = None  # None: one per workload item
    time_limit_s: float | None = None  # no new request after this many seconds
    request_timeout_s: float = 300.0
    # True: requests go in waves of `concurrency`, each wave once the last one's answers are all in, and within a
    # wave each request once the server has answered the one before's headers (queued it), so every endpoint serves
    # the same batches in the same order (closed-loop arrival lets batches drift apart with each server's speed)
    waves: bool = False

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.requests is not None and self.requests < 1:
            raise ConfigError(f"--requests must be >= 1, got {self.requests}")
        if self.time_limit_s is not None and self.time_limit_s <= 0:
            raise ConfigError(f"--time-limit must be > 0 seconds, got {self.time_limit_s}")
        if self.request_timeout_s <= 0:
            raise ConfigError(f"--request-timeout must be > 0 seconds, got {self.request_timeout_s}")


def normalise_url(url: str) -> str:
    """Accept http://host:port as well as http://host:port/v1 (the openai client wants the /v1)."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"endpoint {url!r} must start with http:// or https://")
    return url if url.endswith("/v1") else url + "/v1"


def run_endpoint(
    endpoint: Endpoint,
    items: list[WorkItem],
    sampling: SamplingParams,
    load: Load,
    *,
    max_tokens: int | None = None,
    chat: bool = False,
    progress: bool = True,
    first_repeat: int = 0,
) -> tuple[list[RequestResult], float, str]:
    """Returns (results, wall seconds of the whole phase, the model name used). first_repeat: the
    repeat number of the phase's first pass over the items (a later phase of the same run)."""
    return asyncio.run(_run(endpoint, items, sampling, load, max_tokens, chat, progress, first_repeat))


async def _run(
    endpoint: Endpoint,
    items: list[WorkItem],
    sampling: SamplingParams,
    load: Load,
    max_tokens: int | None,
    chat: bool,
    progress: bool,
    first_repeat: int,
) -> tuple[list[RequestResult], float, str]:
    client = _client(endpoint, load)
    try:
        model = endpoint.model or await discover_model(client, endpoint.url)
        total = load.requests or len(items)
        semaphore = asyncio.Semaphore(load.concurrency)
        results: list[RequestResult | None] = [None] * total
        start = time.perf_counter()
        deadline = start + load.time_limit_s if load.time_limit_s else None
        bar = _progress_bar(endpoint.name, total, progress)

        # queued[i]: the server has answered request i's headers (it has queued it) or the request is over; in
        # waves each request waits for the one before it, so every server queues a wave in the same order
        queued = [asyncio.Event() for _ in range(total)]

        async def send(i: int) -> None:
            if deadline is not None and time.perf_counter() > deadline:
                return  # over the time limit: not started, not counted
            item = items[i % len(items)]
            repeat = first_repeat + i // len(items)
            fields = (request_sampling(sampling, i % len(items), repeat), item.max_tokens_under(max_tokens))
            try:
                r = await asyncio.wait_for(
                    _request(client, model, item, *fields, chat, endpoint.extra_body, queued=queued[i]),
                    timeout=load.request_timeout_s,
                )
            except Exception as e:  # one failed request is a result, not the end of the run
                r = _failed(item, endpoint.name, e)
            r.config, r.repeat, r.order = endpoint.name, repeat, first_repeat * len(items) + i
            results[i] = r
            bar.update(1)

        async def one(i: int) -> None:
            async with semaphore:
                try:
                    if load.waves and i % load.concurrency:
                        await queued[i - 1].wait()
                    await send(i)
                finally:
                    queued[i].set()

        with bar:
            step = load.concurrency if load.waves else total
            for first in range(0, total, step):
                await asyncio.gather(*(one(i) for i in range(first, min(first + step, total))))
        wall = time.perf_counter() - start
    finally:
        await client.close()
    return [r for r in results if r is not None], wall, model


def _progress_bar(name: str, total: int, progress: bool) -> Any:
    with needs_extra("bench", "measuring an endpoint"):
        from tqdm import tqdm

    return tqdm(total=total, file=sys.stderr, disable=not progress, unit="req", desc=name, dynamic_ncols=True)


def _client(endpoint: Endpoint, load: Load) -> Any:
    """An OpenAI client for the endpoint that never retries: a failed request is a result."""
    with needs_extra("bench", "measuring an endpoint"):
        from openai import AsyncOpenAI

    return AsyncOpenAI(
        base_url=normalise_url(endpoint.url),
        api_key=endpoint.api_key or "none",
        timeout=load.request_timeout_s,
        max_retries=0,
    )


def _failed(item: WorkItem, config: str, e: Exception) -> RequestResult:
    """A request that raised, as a result: an error, counted as one."""
    error = f"{type(e).__name__}: {e}"[:300]
    return RequestResult(item.id, item.category, config, RequestStats(finish_reason="error"), "", None, error=error)


async def discover_model(client: Any, url: str) -> str:
    try:
        models = await client.models.list()
        first = models.data[0].id if models.data else None
    except Exception as e:
        raise ConfigError(f"could not list the models of {url} ({type(e).__name__}: {e}); pass --model NAME") from None
    if first is None:
        raise ConfigError(f"{url} lists no models; pass --model NAME")
    return first


class IncompleteResponse(Exception):
    """The server answered 200 but the answer is not whole (see the module docstring)."""


async def _request(
    client: Any,
    model: str,
    item: WorkItem,
    sampling: SamplingParams,
    max_tokens: int,
    chat: bool,
    extra_body: dict[str, Any] | None = None,
    queued: asyncio.Event | None = None,
) -> RequestResult:
    """One streamed request; `queued` is set once the server has answered its headers."""
    kwargs = _request_fields(model, sampling, max_tokens, extra_body)
    use_chat = item.messages is not None or chat
    t0 = time.perf_counter()
    # The raw event stream rather than the client's parsed one: only the raw stream shows whether [DONE] came.
    if use_chat:
        opened = client.chat.completions.with_streaming_response.create(messages=item.chat_messages(), **kwargs)
    else:
        opened = client.completions.with_streaming_response.create(prompt=item.prompt, **kwargs)
    pieces: list[str] = []
    ttft = None
    usage = None
    finish = None
    done = False
    async with opened as response:
        if queued is not None:
            queued.set()
        async for event, data in _sse_events(response.iter_lines()):
            if data.strip() == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            if not isinstance(chunk, dict):
                raise IncompleteResponse(f"the stream sent {data[:80]!r}, not a JSON object")
            if chunk.get("error") or event == "error":  # the status line had gone out already: an error event
                error = chunk.get("error") or chunk
                message = error.get("message", error) if isinstance(error, dict) else error
                raise IncompleteResponse(f"the stream carried an error event: {str(message)[:200]}")
            if chunk.get("usage"):
                usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                piece = ((choice.get("delta") or {}).get("content") if use_chat else choice.get("text")) or ""
                if piece:
                    if ttft is None:
                        ttft = time.perf_counter() - t0
                    pieces.append(piece)
                finish = choice.get("finish_reason") or finish
    total = time.perf_counter() - t0
    text = "".join(pieces)
    _check_whole(text, len(pieces), finish, done, max_tokens)
    counted = usage.get("completion_tokens") if isinstance(usage, dict) else None
    stats = RequestStats(
        prompt_tokens=int(usage.get("prompt_tokens") or 0) if isinstance(usage, dict) else 0,
        output_tokens=int(counted) if counted is not None else len(pieces),
        ttft_s=ttft,
        total_s=total,
        finish_reason=finish,
    )
    source = "usage" if counted is not None else "chunks"
    return RequestResult(item.id, item.category, "", stats, text, None, token_count_source=source)


def _request_fields(
    model: str, sampling: SamplingParams, max_tokens: int, extra_body: dict[str, Any] | None
) -> dict[str, Any]:
    """The streamed request's fields (the prompt or messages aside), usage asked for in the stream."""
    kwargs: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if not sampling.greedy:
        kwargs["seed"] = sampling.seed
    # The endpoint's own fields first: top-k and min-p given on the command line win over them.
    extra = {**(extra_body or {}), **{k: v for k, v in (("top_k", sampling.top_k), ("min_p", sampling.min_p)) if v}}
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


def _check_whole(text: str, chunks: int, finish: str | None, done: bool, max_tokens: int) -> None:
    """Refuse an answer that is not whole: a stream cut short (no finish_reason or no [DONE]), or an empty text."""
    if finish is None or not done:
        missing = " and ".join(x for x, ok in (("a finish_reason", finish is not None), ("[DONE]", done)) if not ok)
        raise IncompleteResponse(
            f"the stream ended without {missing} after {chunks} text chunk(s): the server cut it short "
            "(llama_cpp.server does so when another request arrives, unless it runs with --interrupt_requests False)"
        )
    if not text:
        raise IncompleteResponse(
            f"an empty completion (finish_reason {finish!r}) where up to {max_tokens} tokens were asked for: "
            "nothing to time or compare"
        )


def borrow_token_counts(results: list[RequestResult]) -> int:
    """Identical texts for the same prompt and repeat count the same tokens (the same text from the same tokenizer
    is the same tokens): the fewest any server reported for it. A result counted in stream chunks takes that count
    (one chunk usually carries one token, but not always: a character split over tokens, a held-back stop string),
    and so does a server's count above it: llama-server's usage also counts the end token it sampled, spekula's
    does not, and the same text in the same time must show the same rate. Returns how many results changed."""
    counted: dict[tuple, int] = {}
    for r in results:
        if r.ok and r.token_count_source == "usage" and r.text:
            key = (r.prompt_id, r.repeat, r.text)
            counted[key] = min(counted.get(key, r.stats.output_tokens), r.stats.output_tokens)
    borrowed = 0
    for r in results:
        n = (
            counted.get((r.prompt_id, r.repeat, r.text))
            if r.ok and r.token_count_source in ("chunks", "usage")
            else None
        )
        if n is not None and (r.token_count_source == "chunks" or n < r.stats.output_tokens):
            r.stats = replace(r.stats, output_tokens=n)
            r.token_count_source = "usage (identical text)"
            borrowed += 1
    return borrowed


async def _sse_events(lines: AsyncIterator[str]) -> AsyncIterator[tuple[str | None, str]]:
    """(event name or None, data) of each server-sent event, multi-line data joined by newlines; comments and ids
    are skipped. An event the stream ends in without its closing blank line still counts."""
    event: str | None = None
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield event, "\n".join(data)
            event, data = None, []
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value
    if data:
        yield event, "\n".join(data)
