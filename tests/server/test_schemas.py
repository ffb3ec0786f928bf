"""Request validation as a pure function: every bad value is refused by name, every good one kept."""

from __future__ import annotations

import json

import pytest

from spekula.config import SamplingParams
from spekula.server.errors import APIError
from spekula.server.schemas import Speculation, parse_json, parse_request
from spekula.server.settings import ServerSettings

SETTINGS = ServerSettings(max_tokens_limit=100, default_max_tokens=16)
BASE = {"model": "m", "prompt": "hi"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_a_body_that_names_no_model_asks_for_the_served_one():
    """vLLM and llama-server serve a request without `model` with the model they run; a named one is checked later."""
    assert parse_request({"prompt": "hi"}, "completion", SETTINGS).model is None
    assert parse_request({**CHAT, "model": None}, "chat", SETTINGS).model is None
    assert parse_request(BASE, "completion", SETTINGS).model == "m"


def test_defaults_and_values():
    r = parse_request(BASE, "completion", SETTINGS)
    assert (r.prompt, r.stop.max_tokens, r.sampling.temperature, r.stream, r.include_usage) == (
        "hi",
        16,
        0.0,
        False,
        False,
    )
    r = parse_request(
        {
            **BASE,
            "max_tokens": 7,
            "temperature": 0.5,
            "top_p": 0.9,
            "top_k": 5,
            "min_p": 0.1,
            "seed": 3,
            "stop": "\n",
            "stream": True,
            "stream_options": {"include_usage": True},
            "n": 1,
        },
        "completion",
        SETTINGS,
    )
    assert r.stop.max_tokens == 7 and r.stop.stop == ("\n",) and r.include_usage
    assert (r.sampling.temperature, r.sampling.top_p, r.sampling.top_k, r.sampling.min_p, r.sampling.seed) == (
        0.5,
        0.9,
        5,
        0.1,
        3,
    )


def test_openai_client_shapes():
    assert parse_request({**BASE, "prompt": ["one"]}, "completion", SETTINGS).prompt == "one"
    assert parse_request({**BASE, "prompt": [1, 2, 3]}, "completion", SETTINGS).prompt == [1, 2, 3]
    chat = {
        "model": "m",
        "messages": [{"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "max_completion_tokens": 9,
        "logprobs": False,
        "presence_penalty": 0,
        "user": "u1",
        "top_logprobs": None,
    }
    r = parse_request(chat, "chat", SETTINGS)
    assert r.messages == [{"role": "system", "content": "ab"}] and r.stop.max_tokens == 9
    assert (
        parse_request({**BASE, "temperature": None}, "completion", SETTINGS).sampling.temperature == 0.0
    )  # null = default
    assert parse_request({**BASE, "top_k": -1}, "completion", SETTINGS).sampling.top_k == 0  # vLLM's "off" = our 0
    assert parse_request({**BASE, "top_k": 0}, "completion", SETTINGS).sampling.top_k == 0
    tiny = parse_request({**BASE, "temperature": 1e-38}, "completion", SETTINGS)
    assert tiny.sampling.temperature == 1e-38 and not tiny.sampling.greedy  # served as asked, not switched to greedy


BAD = [
    ([1, 2], "completion", None, "must be a JSON object"),
    ({"model": 3, "prompt": "x"}, "completion", "model", "non-empty string"),
    ({"model": "", "prompt": "x"}, "completion", "model", "got an empty string"),
    ({"model": "m"}, "completion", "prompt", "'prompt' is required"),
    ({**BASE, "prompt": 5}, "completion", "prompt", "string or a non-empty list of token ids"),
    ({**BASE, "prompt": []}, "completion", "prompt", "non-empty list"),
    ({**BASE, "prompt": ["a", "b"]}, "completion", "prompt", "one prompt per request"),
    ({**BASE, "max_tokens": "10"}, "completion", "max_tokens", "must be an integer, got string"),
    ({**BASE, "max_tokens": True}, "completion", "max_tokens", "must be an integer, got boolean"),
    ({**BASE, "max_tokens": 0}, "completion", "max_tokens", "between 1 and 100"),
    ({**BASE, "max_tokens": 101}, "completion", "max_tokens", "--max-tokens-limit"),
    ({**BASE, "temperature": -0.1}, "completion", "temperature", "[0, 2]"),
    ({**BASE, "temperature": "hot"}, "completion", "temperature", "must be a number"),
    ({**BASE, "top_p": 0}, "completion", "top_p", "(0, 1]"),
    ({**BASE, "top_k": -2}, "completion", "top_k", "must be >= -1 (0 or -1 = off)"),
    ({**BASE, "temperature": float("nan")}, "completion", "temperature", "must be a finite number, got nan"),
    ({**BASE, "top_p": float("inf")}, "completion", "top_p", "must be a finite number, got inf"),
    ({**BASE, "min_p": float("-inf")}, "completion", "min_p", "must be a finite number"),
    ({**BASE, "temperature": "NaN"}, "completion", "temperature", "must be a number, got string 'NaN'"),
    ({**BASE, "top_p": "Infinity"}, "completion", "top_p", "must be a number, got string 'Infinity'"),
    ({**BASE, "top_k": float("inf")}, "completion", "top_k", "must be an integer, got number inf"),
    ({**BASE, "seed": float("nan")}, "completion", "seed", "must be an integer, got number nan"),
    ({**BASE, "temperature": 10**400}, "completion", "temperature", "[0, 2]"),
    ({**BASE, "top_k": 2.5}, "completion", "top_k", "must be an integer"),
    ({**BASE, "min_p": 1}, "completion", "min_p", "[0, 1)"),
    ({**BASE, "seed": "7"}, "completion", "seed", "must be an integer"),
    ({**BASE, "seed": -2}, "completion", "seed", "between -1 and"),
    ({**BASE, "stop": [""]}, "completion", "stop[0]", "'stop[0]' is an empty string"),
    ({**BASE, "stop": ""}, "completion", "stop", "'stop' is an empty string, which would match before any text"),
    ({**BASE, "stop": ["a", 5]}, "completion", "stop[1]", "'stop[1]' must be a string, got number 5"),
    ({**BASE, "stop": 5}, "completion", "stop", "got number 5"),
    ({**BASE, "stop": "a\ud800"}, "completion", "stop", "lone UTF-16 surrogate"),
    ({**BASE, "prompt": "ab\udc00c"}, "completion", "prompt", "'prompt' holds a lone UTF-16 surrogate ('\\udc00' at"),
    ({**BASE, "prompt": ["\ud800"]}, "completion", "prompt", "lone UTF-16 surrogate"),
    (
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
        "chat",
        "messages[0].content",
        "lone UTF-16 surrogate",
    ),
    ({**CHAT, "max_completion_tokens": 5, "max_tokens": 0}, "chat", "max_tokens", "between 1 and 100"),
    ({**CHAT, "max_completion_tokens": 5, "max_tokens": "x"}, "chat", "max_tokens", "must be an integer"),
    ({**CHAT, "max_completion_tokens": 0, "max_tokens": 5}, "chat", "max_completion_tokens", "between 1 and 100"),
    ({**BASE, "stop": ["x"] * 17}, "completion", "stop", "at most 16"),
    ({**BASE, "n": 2}, "completion", "n", "'n' must be 1"),
    ({**BASE, "stream": "yes"}, "completion", "stream", "true or false"),
    ({**BASE, "stream_options": {"include_usage": True}}, "completion", "stream_options", "only allowed with"),
    ({**BASE, "logprobs": 3}, "completion", "logprobs", "not supported"),
    ({**BASE, "frequency_penalty": 0.5}, "completion", "frequency_penalty", "not supported"),
    ({**BASE, "foo": 1}, "completion", "foo", "unknown parameter 'foo'"),
    ({**BASE, "messages": []}, "completion", "messages", "belongs to /v1/chat/completions"),
    ({**CHAT, "prompt": "x"}, "chat", "prompt", "belongs to /v1/completions"),
    ({"model": "m"}, "chat", "messages", "'messages' is required"),
    ({"model": "m", "messages": "hi"}, "chat", "messages", "non-empty list"),
    ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "chat", "messages[0].role", "must be one of"),
    ({"model": "m", "messages": [{"role": "user", "content": 5}]}, "chat", "messages[0].content", "must be a string"),
    (
        {"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
        "chat",
        "messages[0].content",
        "text only",
    ),
    (
        {"model": "m", "messages": [{"role": "user", "content": "x", "tool_calls": []}]},
        "chat",
        "messages[0]",
        "unsupported field",
    ),
]


@pytest.mark.parametrize("body,kind,param,message", BAD, ids=[f"{i}-{b[2]}" for i, b in enumerate(BAD)])
def test_bad_values_are_refused_by_name(body, kind, param, message):
    with pytest.raises(APIError) as e:
        parse_request(body, kind, SETTINGS)
    assert e.value.status == 400
    assert e.value.param == param
    assert message in e.value.message


BAD_JSON = [
    # (body, the param named, words the message must contain): each is a 400 that says what to change
    (
        b'{"temperature": NaN}',
        "temperature",
        "'temperature' is the number NaN, which is not finite; JSON numbers must be finite: send a finite value",
    ),
    (b'{"a": [1, {"b": Infinity}]}', "a[1].b", "'a[1].b' is the number Infinity, which is not finite"),
    (b'{"top_p": -Infinity}', "top_p", "'top_p' is the number -Infinity, which is not finite"),
    (b'{"temperature": 1e999}', "temperature", "the number 1e999, which is not finite"),
    (b'{"temperature": -2E+400}', "temperature", "the number -2E+400, which is not finite"),
    (b"NaN", None, "the request body is the number NaN, which is not finite"),
    (b'{"t": NaN, "t": 1}', None, "the request body contains the number NaN, which is not finite"),  # replaced
    (b'{"m": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", None, "nested too deeply"),
    (b'{"m": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"}", None, "nested too deeply"),
    (b'{"seed": 1' + b"0" * 5000 + b"}", None, "a number that cannot be read"),
    (b"{not json", None, "not valid JSON"),
    (b"\xff\xfe", None, "not UTF-8"),
]


@pytest.mark.parametrize("body,param,words", BAD_JSON, ids=[f"json-{i}" for i in range(len(BAD_JSON))])
def test_bodies_that_are_not_strict_json_are_refused_with_400(body, param, words):
    with pytest.raises(APIError) as e:
        parse_json(body)
    assert e.value.status == 400 and words in e.value.message
    assert e.value.param == param
    assert set(e.value.body()["error"]) == {"message", "type", "param", "code"}


def test_strict_json_keeps_what_json_allows():
    fine = {"t": 0.5, "p": 1e-300, "k": -1, "l": [1, 2], "s": "NaN"}
    assert parse_json(json.dumps(fine).encode()) == fine
    nested = parse_json(b'{"m": ' + b"[" * 100 + b"]" * 100 + b"}")["m"]  # a depth any request could need, and more
    depth = 0
    while nested:
        nested, depth = nested[0], depth + 1
    assert nested == [] and depth == 99


def test_seed_minus_one_is_random_and_both_max_token_names_are_read():
    """seed -1 is llama-server's "random": unseeded sampling, also over a server default seed."""
    seeded = ServerSettings(max_tokens_limit=100, default_max_tokens=16, sampling=SamplingParams(seed=5))
    assert parse_request({**BASE, "temperature": 0.8, "seed": -1}, "completion", seeded).sampling.seed is None
    assert parse_request({**BASE, "temperature": 0.8}, "completion", seeded).sampling.seed == 5
    both = parse_request({**CHAT, "max_completion_tokens": 9, "max_tokens": 30}, "chat", SETTINGS)
    assert both.stop.max_tokens == 9  # chat's newer name wins; the other was checked all the same


# -- spec: a request's own speculation ------------------------------------------------------------

AUTO_SERVER = Speculation("suffix", "auto", 8)
FIXED_SERVER = Speculation("qwen-0.5b", 4, 16)
PLAIN_SERVER = Speculation()


@pytest.mark.parametrize(
    "spec,offer,ran",
    [
        (None, AUTO_SERVER, AUTO_SERVER),  # no spec: the server's own
        ({}, AUTO_SERVER, AUTO_SERVER),
        ({"draft": "none"}, AUTO_SERVER, Speculation("none", 0, 8)),
        ({"k": 0}, AUTO_SERVER, Speculation("none", 0, 8)),  # k 0 is plain decoding: no proposer either
        ({"draft": "suffix"}, AUTO_SERVER, AUTO_SERVER),
        ({"draft": "suffix", "k": 3}, AUTO_SERVER, Speculation("suffix", 3, 8)),
        ({"k": 8.0}, AUTO_SERVER, Speculation("suffix", 8, 8)),
        ({"k": "auto"}, AUTO_SERVER, AUTO_SERVER),
        ({"draft": None, "k": None}, AUTO_SERVER, AUTO_SERVER),
        ({"k": 16}, FIXED_SERVER, Speculation("qwen-0.5b", 16, 16)),
        ({"draft": "none", "k": 0}, PLAIN_SERVER, PLAIN_SERVER),
    ],
)
def test_spec_chooses_within_what_the_server_offers(spec, offer, ran):
    body = BASE if spec is None else {**BASE, "spec": spec}
    assert parse_request(body, "completion", SETTINGS, offer).spec == ran
    assert parse_request({**CHAT, "spec": spec}, "chat", SETTINGS, offer).spec == ran


BAD_SPEC = [
    # (spec, offer, param, words)
    ("none", AUTO_SERVER, "spec", "'spec' must be an object such as"),
    ({"draft": "ngram"}, AUTO_SERVER, "spec.draft", "'spec.draft' must be 'none' or 'suffix' on this server"),
    ({"draft": "ngram"}, AUTO_SERVER, "spec.draft", "needs a server started with --draft NAME"),
    ({"draft": "suffix"}, PLAIN_SERVER, "spec.draft", "must be 'none' on this server (it runs no proposer)"),
    ({"draft": 3}, AUTO_SERVER, "spec.draft", "got number 3"),
    ({"draft": ["suffix"]}, AUTO_SERVER, "spec.draft", "got an array"),
    ({"k": 9}, AUTO_SERVER, "spec.k", "'spec.k' must be between 0 and 8 (this server's k_max"),
    ({"k": -1}, AUTO_SERVER, "spec.k", "between 0 and 8"),
    ({"k": 17}, FIXED_SERVER, "spec.k", "between 0 and 16"),
    ({"k": 2.5}, AUTO_SERVER, "spec.k", 'must be an integer or "auto", got number 2.5'),
    ({"k": True}, AUTO_SERVER, "spec.k", "must be an integer"),
    ({"k": "fast"}, AUTO_SERVER, "spec.k", "got string 'fast'"),
    ({"k": "auto"}, FIXED_SERVER, "spec.k", "needs a server started with --k auto; this one drafts a fixed k=4"),
    ({"k": 2}, PLAIN_SERVER, "spec.k", "this server runs no proposer"),
    ({"draft": "none", "k": 3}, AUTO_SERVER, "spec.k", "'spec.k' must be 0 or left out: 'spec.draft' is 'none'"),
    ({"draft": "none", "k": "auto"}, AUTO_SERVER, "spec.k", "must be 0 or left out"),
    ({"draft": "suffix", "speed": 2}, AUTO_SERVER, "spec.speed", "unknown field 'spec.speed'"),
]


@pytest.mark.parametrize("spec,offer,param,words", BAD_SPEC, ids=[f"spec-{i}" for i in range(len(BAD_SPEC))])
def test_bad_spec_values_are_refused_by_name(spec, offer, param, words):
    with pytest.raises(APIError) as e:
        parse_request({**BASE, "spec": spec}, "completion", SETTINGS, offer)
    assert (e.value.status, e.value.param) == (400, param)
    assert words in e.value.message
