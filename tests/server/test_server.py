"""The server over loopback HTTP, with an in-memory model of known logits (fast, deterministic).

No sleeps synchronise anything: tests wait on the scheduler's condition (Scheduler.wait_for), on
uvicorn's startup and shutdown events, or on the responses themselves, each with a bounded timeout.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from spekula.config import SamplingParams, StopConfig
from spekula.cost import CostModel
from spekula.server.app import create_app
from spekula.server.settings import ServerSettings

from serverkit import MODEL, break_target, fake_pipeline, native_pipeline, serving

WAIT = 20.0  # seconds any single wait may take before the test fails


def client(url: str, key: str = "none") -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=WAIT)


def plain_reference(pipe, prompt_ids, max_tokens, sampling=SamplingParams(), plain=True):
    return pipe.generate(prompt_ids, sampling, StopConfig(max_tokens=max_tokens), plain=plain)


@pytest.fixture(scope="module")
def fast():
    """One server for the tests that need nothing special."""
    pipe = fake_pipeline(draft="other", k=4)
    with serving(create_app(pipe, ServerSettings(max_body_bytes=4096, max_tokens_limit=1000))) as running:
        running.pipe = pipe
        yield running


# -- the OpenAI API, through the official client --------------------------------------------------


def test_a_repeated_prompt_is_served_from_the_prompt_cache_with_the_same_text():
    pipe = fake_pipeline(draft="other", k=4)
    with serving(create_app(pipe, ServerSettings())) as running:
        c = client(running.url)
        first, again = (c.completions.create(model=MODEL, prompt="Once upon", max_tokens=12) for _ in range(2))
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert again.usage.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens - 1  # all but the last
    assert again.choices[0].text == first.choices[0].text


def test_completion_and_chat_through_the_openai_client(fast):
    c = client(fast.url)
    done = c.completions.create(model=MODEL, prompt="Once upon", max_tokens=24)
    ref = plain_reference(fast.pipe, fast.pipe.codec.encode("Once upon"), 24)
    assert done.choices[0].text == ref.text and done.choices[0].finish_reason == "length"
    assert (done.usage.prompt_tokens, done.usage.completion_tokens, done.usage.total_tokens) == (9, 24, 33)
    spec = done.model_extra["spec"]
    assert spec["drafted"] > 0 and 0 <= spec["alpha"] <= 1 and spec["tau"] >= 1
    assert sum(spec["k_chosen"].values()) == spec["target_passes"] and max(map(int, spec["k_chosen"])) == 4

    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    chat = c.chat.completions.create(model=MODEL, messages=messages, max_tokens=24)
    ref = plain_reference(fast.pipe, fast.pipe.codec.encode(messages=messages, chat=True), 24)
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content == ref.text
    assert chat.object == "chat.completion" and chat.id.startswith("chatcmpl-") and chat.model == MODEL


def test_streams_through_the_openai_client(fast):
    c = client(fast.url)
    chunks = list(c.completions.create(model=MODEL, prompt="Once upon", max_tokens=24, stream=True))
    assert (
        "".join(ch.choices[0].text for ch in chunks)
        == plain_reference(fast.pipe, fast.pipe.codec.encode("Once upon"), 24).text
    )
    assert [ch.choices[0].finish_reason for ch in chunks][-1] == "length" and len({ch.id for ch in chunks}) == 1
    assert chunks[-1].usage.completion_tokens == 24 and chunks[-1].model_extra["spec"]["drafted"] > 0

    messages = [{"role": "user", "content": "hello"}]
    chunks = list(
        c.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=24, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == plain_reference(fast.pipe, fast.pipe.codec.encode(messages=messages, chat=True), 24).text
    assert (
        chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 24
    )  # include_usage: a last chunk, no choices


def test_raw_sse_ends_with_done(fast):
    with httpx.stream(
        "POST",
        fast.url + "/v1/completions",
        json={"model": MODEL, "prompt": "ab", "max_tokens": 5, "stream": True},
        timeout=WAIT,
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events) and events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_stop_strings_and_models_and_health(fast):
    c = client(fast.url)
    full = c.completions.create(model=MODEL, prompt="Once upon", max_tokens=40).choices[0].text
    stop = full[10:12]
    cut = c.completions.create(model=MODEL, prompt="Once upon", max_tokens=40, stop=[stop])
    assert cut.choices[0].text == full[: full.index(stop)] and cut.choices[0].finish_reason == "stop"
    assert [m.id for m in c.models.list().data] == [MODEL] and c.models.retrieve(MODEL).id == MODEL
    unnamed = httpx.post(fast.url + "/v1/completions", json={"prompt": "Once upon", "max_tokens": 40}, timeout=WAIT)
    assert unnamed.status_code == 200 and unnamed.json()["model"] == MODEL  # no `model`: the served one, as vLLM
    assert unnamed.json()["choices"][0]["text"] == full
    assert httpx.get(fast.url + "/health").json()["status"] == "ok"


# -- correctness under concurrency ----------------------------------------------------------------


def test_sixteen_concurrent_clients_each_get_their_sequential_answer():
    """Greedy requests must equal plain decoding; seeded sampled ones must equal their own run alone
    (per-request random streams: interleaving must not leak randomness between requests)."""
    pipe = fake_pipeline(draft="other", k=3, delay_s=0.0005)  # a little compute so requests really overlap
    prompts = [f"request {i}: " + "xyz" * i for i in range(16)]
    sampling = [
        SamplingParams() if i % 2 == 0 else SamplingParams(temperature=0.9, top_p=0.95, seed=i) for i in range(16)
    ]
    expected = [
        plain_reference(pipe, pipe.codec.encode(p), 40, s, plain=s.greedy).text
        for p, s in zip(prompts, sampling, strict=True)
    ]
    with serving(create_app(pipe, ServerSettings(max_running=8, max_queue=16))) as running:
        c = client(running.url)

        def ask(i: int) -> str:
            s = sampling[i]
            extra = {} if s.greedy else {"temperature": s.temperature, "top_p": s.top_p, "seed": s.seed}
            if i % 4 < 2:
                return c.completions.create(model=MODEL, prompt=prompts[i], max_tokens=40, **extra).choices[0].text
            stream = c.completions.create(model=MODEL, prompt=prompts[i], max_tokens=40, stream=True, **extra)
            return "".join(ch.choices[0].text for ch in stream)

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(ask, range(16)))
        assert answers == expected
        assert (
            running.metric("spekula_request_finished_total", finish_reason="length")
            + running.metric("spekula_request_finished_total", finish_reason="stop")
            == 16
        )
        assert running.scheduler.num_running == running.scheduler.num_waiting == 0


@pytest.mark.parametrize("k", [3, None])
def test_continuous_batching_gives_every_client_its_sequential_answer(k):
    """The native runner batches: each round scores every running request in ONE forward. Greedy
    answers must still equal plain decoding, and seeded sampled ones (fixed k) their own run alone."""
    pipe = native_pipeline(k=k, draft="self")
    prompts = [f"batch {i}: " + "ab" * i for i in range(12)]
    sampling = [SamplingParams() if i % 3 or k is None else SamplingParams(temperature=0.8, seed=i) for i in range(12)]
    expected = [
        plain_reference(pipe, pipe.codec.encode(p), 24, s, plain=s.greedy).text
        for p, s in zip(prompts, sampling, strict=True)
    ]
    with serving(create_app(pipe, ServerSettings(max_running=8, max_queue=16))) as running:
        assert running.scheduler.batching
        c = client(running.url)

        def ask(i: int) -> str:
            s = sampling[i]
            extra = {} if s.greedy else {"temperature": s.temperature, "seed": s.seed}
            return c.completions.create(model=MODEL, prompt=prompts[i], max_tokens=24, **extra).choices[0].text

        with ThreadPoolExecutor(12) as pool:
            answers = list(pool.map(ask, range(12)))
        assert answers == expected
        assert running.metric("spekula_batch_size_count") > 0  # rounds really were batched
        assert running.metric("spekula_batch_size_sum") > running.metric("spekula_batch_size_count")
        if k is not None:  # auto: a draft as big as its target never pays, so k = 0 is right there
            assert running.metric("spekula_spec_decode_num_accepted_tokens_total") > 0
        assert running.scheduler.num_running == running.scheduler.num_waiting == 0


# -- leaving early, limits, shutdown --------------------------------------------------------------


def test_a_client_that_disconnects_frees_its_slot():
    # ~0.1 s per step: a whole answer (the fake's context holds ~500 tokens) takes seconds, far past the
    # non-streaming client's 0.3 s read timeout below
    pipe = fake_pipeline(draft="same", k=4, delay_s=0.02)
    with serving(create_app(pipe, ServerSettings(max_tokens_limit=2000))) as running:
        body = {"model": MODEL, "prompt": "go", "max_tokens": 2000}
        with httpx.Client(timeout=WAIT) as h:
            with h.stream("POST", running.url + "/v1/completions", json={**body, "stream": True}) as r:
                lines = r.iter_lines()
                got = [next(lines) for _ in range(4)]  # a few events, then walk away mid-stream
            assert got[0].startswith("data: ")
        assert running.scheduler.wait_for(lambda s: s.num_running == 0, WAIT)
        assert running.metric("spekula_request_finished_total", finish_reason="abort") == 1
        assert running.metric("spekula_num_requests_running") == 0
        assert running.metric("spekula_generation_tokens_total") < 2000

        # a non-streaming client that gives up (its read timeout) is noticed too
        try:
            r = httpx.post(running.url + "/v1/completions", json=body, timeout=httpx.Timeout(WAIT, read=0.3))
        except httpx.ReadTimeout:
            pass
        else:
            pytest.fail(f"the server answered {r.status_code} {r.text[:300]!r} before the client gave up")
        assert running.scheduler.wait_for(lambda s: s.num_running == 0, WAIT)
        assert running.metric("spekula_request_finished_total", finish_reason="abort") == 2

        metrics = httpx.get(running.url + "/metrics").text
        assert 'spekula_request_finished_total{finish_reason="abort"} 2.0' in metrics
        assert "spekula_num_requests_running 0.0" in metrics
        ok = client(running.url).completions.create(model=MODEL, prompt="still there?", max_tokens=8)
        assert ok.choices[0].finish_reason == "length" and ok.usage.completion_tokens == 8


def test_full_queue_answers_429_with_retry_after():
    valve = threading.Event()  # closed: every forward pass waits, so requests pile up deterministically
    pipe = fake_pipeline(draft="none", valve=valve)
    with (
        serving(create_app(pipe, ServerSettings(max_running=1, max_queue=1))) as running,
        ThreadPoolExecutor(2) as pool,
    ):
        try:
            body = {"model": MODEL, "prompt": "hi", "max_tokens": 4}
            first = pool.submit(httpx.post, running.url + "/v1/completions", json=body, timeout=WAIT)
            assert running.scheduler.wait_for(lambda s: s.num_running == 1, WAIT)
            second = pool.submit(httpx.post, running.url + "/v1/completions", json=body, timeout=WAIT)
            assert running.scheduler.wait_for(lambda s: s.num_waiting == 1, WAIT)
            third = httpx.post(running.url + "/v1/completions", json=body, timeout=WAIT)
            assert third.status_code == 429 and int(third.headers["retry-after"]) >= 1
            assert third.json()["error"]["code"] == "queue_full" and "retry after" in third.json()["error"]["message"]
            assert running.metric("spekula_num_requests_waiting") == 1
        finally:
            valve.set()
        assert first.result().status_code == second.result().status_code == 200
        assert running.metric("spekula_http_requests_total", endpoint="/v1/completions", status="429") == 1


def test_request_timeout_gives_504():
    pipe = fake_pipeline(draft="none", delay_s=0.01)
    with serving(create_app(pipe, ServerSettings(request_timeout_s=0.3, max_tokens_limit=5000))) as running:
        r = httpx.post(
            running.url + "/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 5000}, timeout=WAIT
        )
        assert r.status_code == 504 and "--request-timeout" in r.json()["error"]["message"]
        with pytest.raises(openai.APIError, match="time limit"):  # in a stream, the error arrives as an event
            for _ in client(running.url).completions.create(model=MODEL, prompt="hi", max_tokens=5000, stream=True):
                pass
        assert running.metric("spekula_request_finished_total", finish_reason="timeout") == 2
        assert running.scheduler.num_running == 0


def test_shutdown_finishes_requests_in_flight_and_refuses_new_ones():
    pipe = fake_pipeline(draft="same", k=4, delay_s=0.002)
    app = create_app(pipe, ServerSettings())
    with serving(app) as running, ThreadPoolExecutor(1) as pool:
        c = client(running.url)
        stream = pool.submit(lambda: list(c.completions.create(model=MODEL, prompt="go", max_tokens=200, stream=True)))
        assert running.scheduler.wait_for(lambda s: s.num_running == 1, WAIT)
        running.server.should_exit = True
        assert running.server.closing.wait(WAIT)
        with pytest.raises(httpx.ConnectError):
            httpx.post(running.url + "/v1/completions", json={"model": MODEL, "prompt": "late"}, timeout=WAIT)
        chunks = stream.result(timeout=WAIT)
        assert chunks[-1].choices[0].finish_reason == "length" and chunks[-1].usage.completion_tokens == 200
    assert not running.scheduler.accepting  # the lifespan closed the scheduler after the stream ended


# -- bad input ------------------------------------------------------------------------------------

LONG = "x" * 600  # more tokens than the fake model's context of 512
BARE = b'{"model": "%s", "prompt": "hi", %%s}' % MODEL.encode()  # raw JSON, for what json.dumps would not write
BARE_CHAT = b'{"model": "%s", "messages": [{"role": "user", "content": "hi"}], %%s}' % MODEL.encode()

BAD_HTTP = [
    # (method, path, body: bytes | dict | None, status, words the message must contain)
    ("POST", "/v1/completions", b"{not json", 400, "not valid JSON"),
    ("POST", "/v1/completions", b"", 400, "body is empty"),
    ("POST", "/v1/completions", b"\xff\xfe", 400, "not UTF-8"),
    ("POST", "/v1/completions", b"[1, 2]", 400, "must be a JSON object"),
    ("POST", "/v1/completions", {"model": "gpt-4o", "prompt": "hi"}, 404, "not served here"),
    (
        "POST",
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "max_tokens": "ten"},
        400,
        "'max_tokens' must be an integer",
    ),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 10**6}, 400, "--max-tokens-limit"),
    (
        "POST",
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "temperature": 7},
        400,
        "'temperature' must be in [0, 2]",
    ),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "n": 3}, 400, "'n' must be 1"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "hi", "best_of": 2}, 400, "'best_of' is not supported"),
    (
        "POST",
        "/v1/completions",
        {"model": MODEL, "prompt": "hi", "tempurature": 1},
        400,
        "unknown parameter 'tempurature'",
    ),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": [300, 1]}, 400, "outside the vocabulary"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": ""}, 400, "empty after tokenization"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": LONG}, 422, "context holds 512"),
    ("POST", "/v1/completions", {"model": MODEL, "prompt": "x" * 5000}, 413, "--max-body-bytes"),
    (
        "POST",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]},
        400,
        "'messages[0].role'",
    ),
    (
        "POST",
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": LONG}]},
        422,
        "shorten the prompt",
    ),
    ("GET", "/v1/completions", None, 405, "GET is not allowed"),
    ("GET", "/v2/models", None, 404, "no such path"),
    ("GET", "/v1/models/gpt-4o", None, 404, "not served here"),
    # numbers that are not finite, as bare tokens (Python's json reads them) or as strings; with stream: true the
    # refusal must come before the 200 of a stream, so the table checks a JSON error status for those too
    ("POST", "/v1/completions", BARE % b'"temperature": NaN', 400, "NaN, which is not finite"),
    ("POST", "/v1/completions", BARE % b'"temperature": NaN, "stream": true', 400, "send a finite value"),
    ("POST", "/v1/completions", BARE % b'"top_p": Infinity', 400, "Infinity, which is not finite"),
    ("POST", "/v1/completions", BARE % b'"presence_penalty": -Infinity', 400, "-Infinity, which is not finite"),
    ("POST", "/v1/completions", BARE % b'"min_p": 1e999', 400, "1e999, which is not finite"),
    ("POST", "/v1/chat/completions", BARE_CHAT % b'"temperature": -Infinity, "stream": true', 400, "not finite"),
    ("POST", "/v1/completions", BARE % b'"temperature": "NaN"', 400, "'temperature' must be a number, got string"),
    ("POST", "/v1/completions", BARE % b'"max_tokens": "Infinity"', 400, "'max_tokens' must be an integer, got string"),
    ("POST", "/v1/completions", BARE % b'"top_k": -2', 400, "'top_k' must be >= -1 (0 or -1 = off)"),
    # nested deeper than the parser recurses (within the fixture's 4096-byte body limit; test_schemas goes to 50,000)
    ("POST", "/v1/completions", BARE % (b'"metadata": ' + b"[" * 1900 + b"]" * 1900), 400, "nested too deeply"),
    ("POST", "/v1/completions", BARE % (b'"stream": true, "metadata": ' + b"[" * 1900 + b"]" * 1900), 400, "nested"),
]


@pytest.mark.parametrize("method,path,body,status,words", BAD_HTTP, ids=[f"{b[3]}-{i}" for i, b in enumerate(BAD_HTTP)])
def test_bad_input_gets_an_openai_error_and_the_server_keeps_serving(fast, method, path, body, status, words):
    content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    r = httpx.request(
        method, fast.url + path, content=content, headers={"content-type": "application/json"}, timeout=WAIT
    )
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"] and set(error) == {"message", "type", "param", "code"}
    good = httpx.post(
        fast.url + "/v1/completions", json={"model": MODEL, "prompt": "ok", "max_tokens": 3}, timeout=WAIT
    )
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 3


NAMED = [
    # (path, raw body, param): the 400 names the field at fault (each was a 200, a 422 or an unnamed 400 before)
    ("/v1/completions", BARE % b'"prompt": "a\\ud800b"', "prompt"),  # a lone surrogate: not the chat template's
    ("/v1/chat/completions", BARE_CHAT % b'"temperature": NaN', "temperature"),
    ("/v1/completions", BARE % b'"temperature": 0.5, "top_p": -Infinity', "top_p"),
    ("/v1/chat/completions", BARE_CHAT % b'"max_completion_tokens": 8, "max_tokens": -3', "max_tokens"),
    ("/v1/completions", BARE % b'"stop": ""', "stop"),
]


@pytest.mark.parametrize("path,body,param", NAMED, ids=[p for _, _, p in NAMED])
def test_a_bad_value_is_a_400_that_names_its_field(fast, path, body, param):
    r = httpx.post(fast.url + path, content=body, headers={"content-type": "application/json"}, timeout=WAIT)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param and f"'{param}'" in r.json()["error"]["message"]


def test_seed_minus_one_samples_unseeded(fast):
    """seed -1 is llama-server's "random seed": accepted, and sampled without a seed."""
    body = {"model": MODEL, "prompt": "dice", "max_tokens": 6, "temperature": 1.0, "seed": -1}
    r = httpx.post(fast.url + "/v1/completions", json=body, timeout=WAIT)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_include_usage_sends_usage_once_on_the_last_chunk(fast, path):
    """OpenAI's stream_options.include_usage: usage (and spekula's spec) on the final chunk with no
    choices only; without it they ride on the chunk that carries finish_reason."""
    base = {"model": MODEL, "max_tokens": 7, "stream": True}
    base |= {"prompt": "usage"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "u"}]}
    for include in (True, False):
        body = {**base, "stream_options": {"include_usage": include}}
        r = httpx.post(fast.url + path, json=body, timeout=WAIT)
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        carriers = [e for e in events if e.get("usage") is not None]
        assert len(carriers) == 1 and carriers[0]["usage"]["completion_tokens"] == 7
        assert [e for e in events if "spec" in e] == carriers
        finish = [e for e in events if e["choices"] and e["choices"][0]["finish_reason"]]
        assert len(finish) == 1
        if include:
            assert carriers[0] is events[-1] and events[-1]["choices"] == [] and "usage" not in finish[0]
        else:
            assert carriers == finish


def test_a_chunked_body_over_the_limit_is_cut_off(fast):
    def chunks():
        for _ in range(100):
            yield b"x" * 1000  # no content-length: the server has to count

    r = httpx.post(fast.url + "/v1/completions", content=chunks(), timeout=WAIT)
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"
    # the rest of the body is never read, so no byte count is claimed: only the limit
    assert r.json()["error"]["message"].startswith("the request body is larger than the server's limit of 4096 bytes;")


@pytest.mark.parametrize("stream", [False, True])
def test_a_tiny_temperature_samples_the_limit_and_top_k_minus_one_is_off(fast, stream):
    """temperature 1e-38 would overflow logits / T; spekula.sampling computes it as its limit, the argmax
    (the fake model has no ties), so the text is greedy decoding's. top_k -1 is vLLM's "off"."""
    url = fast.url + "/v1/completions"
    r = httpx.post(url, json={"model": MODEL, "prompt": "abc", "max_tokens": 12}, timeout=WAIT)
    greedy = r.json()["choices"][0]["text"]
    for extra in ({"temperature": 1e-38}, {"temperature": 5e-324, "top_k": -1, "top_p": 1e-300}):
        body = {"model": MODEL, "prompt": "abc", "max_tokens": 12, "seed": 1, "stream": stream, **extra}
        r = httpx.post(url, json=body, timeout=WAIT)
        assert r.status_code == 200, r.text
        if stream:
            events = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]" and not any('"error"' in e for e in events)
            text = "".join(c["text"] for e in events[:-1] for c in json.loads(e)["choices"])
        else:
            text = r.json()["choices"][0]["text"]
        assert text == greedy and text
    # top_k -1 samples as no top_k at all: the same seed gives the same text (an unseeded draw may end early,
    # at the stop token, so its length proves nothing)
    body = {"model": MODEL, "prompt": "abc", "max_tokens": 5, "temperature": 0.7, "seed": 3}
    off, unset = (httpx.post(url, json={**body, **top_k}, timeout=WAIT) for top_k in ({"top_k": -1}, {}))
    assert off.status_code == 200 and unset.status_code == 200, (off.text, unset.text)
    assert off.json()["choices"][0]["text"] == unset.json()["choices"][0]["text"]
    assert off.json()["usage"]["completion_tokens"] >= 1


def test_bad_input_through_the_openai_client_raises_its_exceptions(fast):
    c = client(fast.url)
    with pytest.raises(openai.NotFoundError, match="not served here"):
        c.completions.create(model="nope", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="top_p"):
        c.completions.create(model=MODEL, prompt="hi", top_p=2)
    with pytest.raises(openai.UnprocessableEntityError, match="context"):
        c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": LONG}])


# -- API key --------------------------------------------------------------------------------------


def test_api_key():
    with serving(create_app(fake_pipeline(draft="ngram"), ServerSettings(api_key="s3cret-key"))) as running:
        assert httpx.get(running.url + "/health").status_code == 200  # open, for load balancers
        for headers in (
            {},
            {"Authorization": "Bearer wrong"},
            {"Authorization": "Basic s3cret-key"},
            {"Authorization": "s3cret-key"},
        ):
            for path in ("/v1/models", "/metrics"):
                r = httpx.get(running.url + path, headers=headers)
                assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", (headers, path)
                assert r.headers["www-authenticate"] == "Bearer" and "s3cret" not in r.text
        r = httpx.post(
            running.url + "/v1/completions", json={"model": MODEL, "prompt": "x"}
        )  # refused before the body is read
        assert r.status_code == 401 and "Authorization: Bearer" in r.json()["error"]["message"]
        with pytest.raises(openai.AuthenticationError, match="wrong API key"):
            client(running.url, key="wrong").completions.create(model=MODEL, prompt="hi", max_tokens=2)
        ok = client(running.url, key="s3cret-key").completions.create(model=MODEL, prompt="hi", max_tokens=2)
        assert ok.usage.completion_tokens == 2
        assert httpx.get(running.url + "/metrics", headers={"Authorization": "Bearer s3cret-key"}).status_code == 200
        assert running.metric("spekula_http_requests_total", endpoint="/v1/models", status="401") == 4


def test_metrics_exposition(fast):
    client(fast.url).completions.create(model=MODEL, prompt="count me", max_tokens=10)
    text = httpx.get(fast.url + "/metrics").text
    for name in (
        "spekula_spec_decode_num_drafts_total",
        "spekula_spec_decode_num_draft_tokens_total",
        "spekula_spec_decode_num_accepted_tokens_total",
        'spekula_spec_decode_num_accepted_tokens_per_pos_total{position="0"}',
        "spekula_prompt_tokens_total",
        "spekula_generation_tokens_total",
        "spekula_time_to_first_token_seconds_bucket",
        "spekula_time_per_output_token_seconds_bucket",
        "spekula_num_requests_waiting",
        "spekula_num_requests_running",
        'spekula_spec_decode_steps_total{k="4"}',
        'spekula_http_requests_total{endpoint="/v1/completions",status="200"}',
    ):
        assert name in text, name
    assert "_created" not in text
    drafted = fast.metric("spekula_spec_decode_num_draft_tokens_total")
    accepted = fast.metric("spekula_spec_decode_num_accepted_tokens_total")
    assert 0 < accepted <= drafted


@pytest.mark.parametrize("draft,speculates", [("same", True), ("other", False)])
def test_auto_k_speculates_only_when_it_pays_and_stays_lossless(draft, speculates):
    """--k auto: the engine's cost model picks k per step. A draft that is always right is worth
    drafting with; one that is always wrong is not (the controller falls back to k = 0 and only probes)."""
    pipe = fake_pipeline(
        draft=draft, k=None, delay_s=0.002, draft_delay_s=0.0005
    )  # a draft pass costs 1/4 of a target pass
    # The costs those delays give, frozen: measured ones would make the test depend on the machine's load.
    pipe.engine.costs = CostModel(target_s={n: 0.002 for n in range(1, 10)}, draft_s_per_token=0.0005, frozen=True)
    ids = pipe.codec.encode("auto")
    want = plain_reference(pipe, ids, 60).text
    with serving(create_app(pipe, ServerSettings())) as running:
        done = client(running.url).completions.create(model=MODEL, prompt="auto", max_tokens=60)
    assert done.choices[0].text == want
    k_chosen = {int(k): n for k, n in done.model_extra["spec"]["k_chosen"].items()}
    plain_steps = k_chosen.get(0, 0)
    if speculates:
        assert plain_steps < sum(k_chosen.values()) / 2 and done.model_extra["spec"]["tau"] > 2
    else:
        assert plain_steps > sum(k_chosen.values()) / 2


def test_an_engine_failure_fails_that_request_only():
    pipe = fake_pipeline(draft="ngram")
    break_target(pipe)
    with serving(create_app(pipe, ServerSettings())) as running:
        bad = httpx.post(
            running.url + "/v1/completions", json={"model": MODEL, "prompt": "~", "max_tokens": 4}, timeout=WAIT
        )
        assert bad.status_code == 500 and bad.json()["error"]["code"] == "engine_error"
        assert "simulated" not in bad.text  # details go to the log, not to the client
        ok = client(running.url).completions.create(model=MODEL, prompt="fine", max_tokens=4)
        assert ok.usage.completion_tokens == 4
        assert running.metric("spekula_request_finished_total", finish_reason="error") == 1


@pytest.mark.parametrize("log_prompts", [False, True])
def test_prompts_stay_out_of_the_log_unless_asked(caplog, log_prompts):
    secret = "my-secret-prompt"
    with caplog.at_level("INFO", logger="spekula.server"):
        with serving(create_app(fake_pipeline(draft="ngram"), ServerSettings(log_prompts=log_prompts))) as running:
            done = client(running.url).completions.create(model=MODEL, prompt=secret, max_tokens=6)
            assert running.scheduler.wait_for(lambda s: s.num_running == 0, WAIT)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert done.id in logged  # every request is logged: id, finish reason, token counts, alpha, tau
    assert (secret in logged) == log_prompts and (done.choices[0].text in logged) == log_prompts
