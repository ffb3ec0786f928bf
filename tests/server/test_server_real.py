"""The server with a real model (SmolLM2-135M, fp32) drafting for itself, through the openai client.

Greedy output through the server must equal in-process plain decoding of the same target, token
for token, streamed or not, alone or among 16 concurrent clients. Token counts are kept small: on
a busy 2-core machine one pass of this model can take a tenth of a second.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from spekula.config import BackendConfig, SamplingParams, SpecConfig, StopConfig
from spekula.pipeline import Pipeline
from spekula.server.app import create_app
from spekula.server.settings import ServerSettings

from serverkit import serving

pytestmark = pytest.mark.model
TARGET = "smollm2-135m"
WAIT = 120.0


@pytest.fixture(scope="module")
def real():
    # the same model drafts: alpha ~ 1, counters must move; in PyTorch fp32, where greedy output equals plain decoding's
    pipe = Pipeline.load(TARGET, TARGET, SpecConfig(k=4), BackendConfig(runtime="transformers"))
    with serving(create_app(pipe, ServerSettings())) as running:
        running.pipe = pipe
        yield running


def plain(pipe, ids, max_tokens):
    return pipe.generate(ids, SamplingParams(), StopConfig(max_tokens=max_tokens), plain=True).text


def test_openai_client_gets_plain_decoding_of_the_target(real):
    pipe = real.pipe
    prompt = "def add(a, b):"
    messages = [{"role": "user", "content": "Name a colour."}]
    want_completion = plain(pipe, pipe.codec.encode(prompt), 8)  # computed while the server is idle
    want_chat = plain(pipe, pipe.codec.encode(messages=messages, chat=True), 6)

    c = openai.OpenAI(base_url=real.url + "/v1", api_key="none", max_retries=0, timeout=WAIT)
    done = c.completions.create(model=TARGET, prompt=prompt, max_tokens=8)
    streamed = "".join(
        ch.choices[0].text for ch in c.completions.create(model=TARGET, prompt=prompt, max_tokens=8, stream=True)
    )
    chat = c.chat.completions.create(model=TARGET, messages=messages, max_tokens=6)
    chat_chunks = list(c.chat.completions.create(model=TARGET, messages=messages, max_tokens=6, stream=True))
    chat_streamed = "".join(ch.choices[0].delta.content or "" for ch in chat_chunks)

    assert done.choices[0].text == streamed == want_completion
    assert chat.choices[0].message.content == chat_streamed == want_chat
    spec = done.model_extra["spec"]
    assert spec["drafted"] > 0 and spec["accepted"] > 0 and spec["tau"] > 1
    assert done.usage.completion_tokens == 8 and chat_chunks[-1].usage.completion_tokens == chat.usage.completion_tokens

    metrics = httpx.get(real.url + "/metrics").text
    drafted = real.metric("spekula_spec_decode_num_draft_tokens_total")
    assert drafted >= spec["drafted"] and real.metric("spekula_spec_decode_num_accepted_tokens_total") > 0
    assert 'spekula_spec_decode_num_accepted_tokens_per_pos_total{position="3"}' in metrics


def test_sixteen_concurrent_clients_match_their_sequential_runs(real):
    """8 prompts, each asked by two clients at once (one streaming, one not): 16 in flight."""
    pipe = real.pipe
    prompts = [f"{i} + {i} =" if i % 2 else f"# Step {i}: print the number" for i in range(8)]
    want = [plain(pipe, pipe.codec.encode(p), 4) for p in prompts]
    c = openai.OpenAI(base_url=real.url + "/v1", api_key="none", max_retries=0, timeout=WAIT)

    def ask(i: int) -> str:
        prompt = prompts[i % 8]
        if i < 8:
            return "".join(
                ch.choices[0].text
                for ch in c.completions.create(model=TARGET, prompt=prompt, max_tokens=4, stream=True)
            )
        return c.completions.create(model=TARGET, prompt=prompt, max_tokens=4).choices[0].text

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(ask, range(16)))
    assert got == want + want
    assert real.scheduler.num_running == real.scheduler.num_waiting == 0
