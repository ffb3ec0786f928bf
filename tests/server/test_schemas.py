"""Request validation as a pure function: every bad value is refused by name, every good one kept."""

from __future__ import annotations

import json

import pytest

from spekula.server.errors import APIError
from spekula.server.schemas import parse_json, parse_request
from spekula.server.settings import ServerSettings

SETTINGS = ServerSettings(max_tokens_limit=100, default_max_tokens=16)
BASE = {"model": "m", "prompt": "hi"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


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
    ({"prompt": "x"}, "completion", "model", "'model' is required"),
    ({"model": 3, "prompt": "x"}, "completion", "model", "non-empty string"),
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
    ({**BASE, "seed": -1}, "completion", "seed", "between 0 and"),
    ({**BASE, "stop": [""]}, "completion", "stop", "non-empty string"),
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
    # (body, words the message must contain): each is a 400 that says what to change
    (b'{"temperature": NaN}', "the number NaN, which is not finite; JSON numbers must be finite: send a finite value"),
    (b'{"a": [1, {"b": Infinity}]}', "contains the number Infinity, which is not finite"),
    (b'{"top_p": -Infinity}', "contains the number -Infinity, which is not finite"),
    (b'{"temperature": 1e999}', "contains the number 1e999, which is not finite"),
    (b'{"temperature": -2E+400}', "contains the number -2E+400, which is not finite"),
    (b'{"m": ' + b"[" * 50_000 + b"]" * 50_000 + b"}", "nested too deeply"),
    (b'{"m": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_000 + b"}", "nested too deeply"),
    (b'{"seed": 1' + b"0" * 5000 + b"}", "a number that cannot be read"),
    (b"{not json", "not valid JSON"),
    (b"\xff\xfe", "not UTF-8"),
]


@pytest.mark.parametrize("body,words", BAD_JSON, ids=[f"json-{i}" for i in range(len(BAD_JSON))])
def test_bodies_that_are_not_strict_json_are_refused_with_400(body, words):
    with pytest.raises(APIError) as e:
        parse_json(body)
    assert e.value.status == 400 and words in e.value.message
    assert set(e.value.body()["error"]) == {"message", "type", "param", "code"}


def test_strict_json_keeps_what_json_allows():
    fine = {"t": 0.5, "p": 1e-300, "k": -1, "l": [1, 2], "s": "NaN"}
    assert parse_json(json.dumps(fine).encode()) == fine
    nested = parse_json(b'{"m": ' + b"[" * 100 + b"]" * 100 + b"}")["m"]  # a depth any request could need, and more
    depth = 0
    while nested:
        nested, depth = nested[0], depth + 1
    assert nested == [] and depth == 99
