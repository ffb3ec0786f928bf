"""The proposer's cross-request memory on the server: a request's namespace is a hash of the API key it
presented (never the key itself), or "" on a server without a key; the suffix proposer drafts only from
its own namespace's earlier outputs."""

from __future__ import annotations

import hashlib

import httpx

from spekula.config import SpecConfig
from spekula.pipeline import Pipeline
from spekula.proposers import SUFFIX, SuffixConfig, SuffixFactory
from spekula.server.app import create_app
from spekula.server.metrics import ServerMetrics
from spekula.server.settings import ServerSettings
from spekula.server.state import ServerState
from spekula.text import TextCodec

from serverkit import EOS, MODEL, VOCAB, ByteTokenizer, SlowBackend, printable_table, serving

WAIT = 20.0
KEY = "s3cret-key"


def suffix_pipeline() -> tuple[Pipeline, list[str]]:
    """A pipeline drafting with the suffix proposer, and the namespaces its engine was asked for."""
    target = SlowBackend(printable_table(0), VOCAB, eos=EOS, context_length=512, name=MODEL)
    factory = SuffixFactory(SuffixConfig(spec_factor=4.0), vocab_size=VOCAB)
    pipe = Pipeline(target, TextCodec(ByteTokenizer()), factory, SpecConfig(k=8), draft_name=SUFFIX)
    seen: list[str] = []
    generate = pipe.engine.generate

    def spy(*args, namespace: str = "", **kw):
        seen.append(namespace)
        return generate(*args, namespace=namespace, **kw)

    pipe.engine.generate = spy
    return pipe, seen


def complete(url: str, key: str | None) -> dict:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 40, "temperature": 0}
    r = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=WAIT)
    assert r.status_code == 200, r.text
    return r.json()


def test_the_namespace_is_a_hash_of_the_api_key_never_the_key():
    pipe, seen = suffix_pipeline()
    with serving(create_app(pipe, ServerSettings(api_key=KEY))) as running:
        first = complete(running.url, KEY)
        again = complete(running.url, KEY)
    expected = hashlib.sha256(KEY.encode()).hexdigest()[:32]
    assert seen == [expected, expected]
    assert all(KEY not in n for n in seen)
    assert pipe.engine.proposer.cache.namespaces() == [expected]  # the first request's output, filed under the hash
    # the second request drafted the first one's output back: its own namespace's memory works
    assert again["choices"][0]["text"] == first["choices"][0]["text"]
    assert again["spec"]["accepted"] > first["spec"]["accepted"] + 20


def test_a_server_without_a_key_has_one_namespace():
    pipe, seen = suffix_pipeline()
    with serving(create_app(pipe, ServerSettings())) as running:
        complete(running.url, None)
        complete(running.url, "anything")  # unchecked without --api-key: it separates nothing
    assert seen == ["", ""]


def test_different_keys_get_different_namespaces():
    """The server takes one key today; should it take several, each would draft only from its own text."""
    state = ServerState(ServerSettings(api_key=KEY), ServerMetrics())
    a, b = state.namespace(f"Bearer {KEY}"), state.namespace("Bearer another-key")
    assert a != b and len(a) == len(b) == 32 and int(a, 16) >= 0
    assert state.namespace(f"bearer   {KEY} ") == a  # parsed as the Gate parses it
    assert KEY not in a and "another-key" not in b
    assert ServerState(ServerSettings(), ServerMetrics()).namespace(f"Bearer {KEY}") == ""
