"""Request bodies -> validated requests. Bad input becomes an APIError naming the parameter.

Validation is written out by hand rather than left to pydantic so that every message names the
parameter, says what to change, and carries the status the server documents (spekula.server.errors).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Literal

from starlette.requests import Request

from spekula.config import SamplingParams, StopConfig
from spekula.errors import ConfigError
from spekula.server.errors import APIError
from spekula.server.settings import ServerSettings

Kind = Literal["completion", "chat"]

COMMON = {
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "seed",
    "stream",
    "stream_options",
    "n",
    "user",
}
ONLY = {"completion": {"prompt"}, "chat": {"messages", "max_completion_tokens"}}
# OpenAI parameters this server does not implement. Sent with their neutral value they ask for
# nothing, so they are accepted; anything else is refused by name rather than silently ignored.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "echo": (False,),
    "best_of": (1,),
    "suffix": ("",),
    "presence_penalty": (0,),
    "frequency_penalty": (0,),
    "repetition_penalty": (1,),
    "logit_bias": ({},),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "response_format": ({"type": "text"},),
    "parallel_tool_calls": (False, True),
    "store": (False,),
    "metadata": ({},),
    "service_level": ("auto",),
    "service_tier": ("auto",),
    "modalities": (["text"],),
}
ROLES = ("system", "developer", "user", "assistant")
MAX_STOP = 16
MAX_SEED = 2**63 - 1


@dataclass(frozen=True)
class GenerationRequest:
    kind: Kind
    model: str
    prompt: str | list[int] | None  # completions: text, or token ids
    messages: list[dict[str, str]] | None  # chat: [{role, content}] with content flattened to text
    sampling: SamplingParams
    stop: StopConfig
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with usage and no choices


async def read_json(request: Request, limit: int) -> Any:
    """The body as JSON, refusing it as soon as it is known to exceed `limit` bytes."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise _too_large(int(length), limit)
    chunks, size = [], 0
    async for chunk in request.stream():  # chunked bodies have no content-length: count as they come
        size += len(chunk)
        if size > limit:
            raise _too_large(None, limit)  # the rest is never read, so the body's real size is unknown
        chunks.append(chunk)
    body = b"".join(chunks)
    if not body.strip():
        raise APIError(400, 'the request body is empty; send a JSON object such as {"model": ..., "prompt": ...}')
    return parse_json(body)


class _NonFinite(ValueError):
    """Raised by the parser's hooks on NaN, Infinity, -Infinity or a number that overflows a float."""


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(text)
    return value


def _refuse_constant(name: str) -> float:
    raise _NonFinite(name)


def parse_json(body: bytes) -> Any:
    """Bytes -> JSON value, strictly: Python's json accepts NaN and Infinity and overflows 1e999 to inf,
    none of which is JSON or a usable parameter; nesting deeper than the parser's recursion limit
    (far beyond any request this API takes) is refused rather than raised as a RecursionError."""
    try:
        text = body.decode("utf-8")  # decoded here: json.loads would guess UTF-16 from a BOM
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except UnicodeDecodeError:
        raise APIError(400, "the request body is not UTF-8 text; send JSON encoded as UTF-8") from None
    except _NonFinite as e:
        raise APIError(
            400,
            f"the request body contains the number {str(e)[:40]}, which is not finite; "
            "JSON numbers must be finite: send a finite value such as 0.7",
        ) from None
    except json.JSONDecodeError as e:
        raise APIError(
            400, f"the request body is not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); fix the JSON"
        ) from None
    except RecursionError:
        raise APIError(
            400,
            "the request body is nested too deeply; a request needs a few levels of objects "
            "and arrays, send a flat JSON object",
        ) from None
    except ValueError as e:  # e.g. an integer with more digits than Python converts
        why = str(e).split(":")[0]  # Python's own advice after the colon (sys.set_int_max_str_digits) is the operator's
        message = f"the request body holds a number that cannot be read ({why}); send shorter numbers"
        raise APIError(400, message) from None


def _too_large(size: int | None, limit: int) -> APIError:
    has = f"has {size} bytes, more than" if size is not None else "is larger than"
    return APIError(
        413,
        f"the request body {has} the server's limit of {limit} bytes; "
        "send a shorter prompt (the operator can raise --max-body-bytes)",
        code="body_too_large",
    )


def parse_request(body: Any, kind: Kind, settings: ServerSettings) -> GenerationRequest:
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {_json_type(body)}")
    allowed = COMMON | ONLY[kind]
    for name in body:
        if name in allowed or body[name] is None and name in NEUTRAL:
            continue
        if name in NEUTRAL:
            if body[name] in NEUTRAL[name]:
                continue
            raise APIError(
                400,
                f"parameter {name!r} is not supported by this server; remove it",
                param=name,
                code="unsupported_parameter",
            )
        hint = _hint(name, kind)
        raise APIError(
            400,
            f"unknown parameter {name!r}{hint}; supported: {', '.join(sorted(allowed))}",
            param=name,
            code="unknown_parameter",
        )
    body = {k: v for k, v in body.items() if v is not None}  # null means "use the default", as in OpenAI's API

    model = body.get("model")
    if model is None:
        raise APIError(
            400, "parameter 'model' is required; GET /v1/models lists the model this server runs", param="model"
        )
    if not isinstance(model, str) or not model:
        raise APIError(400, f"'model' must be a non-empty string, got {_json_type(model)}", param="model")

    prompt = messages = None
    if kind == "completion":
        if "prompt" not in body:
            raise APIError(400, "parameter 'prompt' is required: a string (or a list of token ids)", param="prompt")
        prompt = _prompt(body["prompt"])
    else:
        if "messages" not in body:
            raise APIError(
                400, 'parameter \'messages\' is required: a list of {"role", "content"} objects', param="messages"
            )
        messages = _messages(body["messages"])

    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise APIError(
            400, f"'n' must be 1 (one choice per request), got {n!r}; send several requests instead", param="n"
        )
    if "user" in body and not isinstance(body["user"], str):
        raise APIError(400, f"'user' must be a string, got {_json_type(body['user'])}", param="user")

    max_name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = _integer(
        body,
        max_name,
        1,
        settings.max_tokens_limit,
        settings.default_max_tokens,
        hint=" (the server's --max-tokens-limit)",
    )
    defaults = settings.sampling
    # Any temperature in (0, 2] is served, however small: spekula.sampling computes the softmax so that
    # a tiny one (1e-38) behaves as its limit, all mass on the argmax, for the draft and the target alike.
    temperature = _number(body, "temperature", 0.0, 2.0, defaults.temperature)
    top_p = _number(body, "top_p", 0.0, 1.0, defaults.top_p, low_open=True)
    min_p = _number(body, "min_p", 0.0, 1.0, defaults.min_p, high_open=True)
    top_k = _integer(body, "top_k", -1, None, defaults.top_k, hint=" (0 or -1 = off)")
    top_k = 0 if top_k == -1 else top_k  # -1 is vLLM's "off"; spekula's own is 0
    seed = _integer(body, "seed", 0, MAX_SEED, defaults.seed)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise APIError(400, f"'stream' must be true or false, got {_json_type(stream)}", param="stream")
    include_usage = _stream_options(body.get("stream_options"), stream)
    stop = _stop(body.get("stop", ()))
    try:
        sampling = SamplingParams(
            temperature=float(temperature), top_k=top_k, top_p=float(top_p), min_p=float(min_p), seed=seed
        )
        stop_config = StopConfig(max_tokens=max_tokens, stop=stop)
    except ConfigError as e:  # already checked above; kept so a new rule in config.py still gives a 400
        raise APIError(400, str(e)) from None
    return GenerationRequest(kind, model, prompt, messages, sampling, stop_config, stream, include_usage)


# -- fields ---------------------------------------------------------------------------------------


def _prompt(value: Any) -> str | list[int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return value
    if isinstance(value, list) and len(value) > 1 and all(isinstance(p, (str, list)) for p in value):
        raise APIError(
            400, f"'prompt' holds {len(value)} prompts; this server takes one prompt per request", param="prompt"
        )
    raise APIError(
        400, f"'prompt' must be a string or a non-empty list of token ids, got {_json_type(value)}", param="prompt"
    )


def _messages(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise APIError(
            400,
            f'\'messages\' must be a non-empty list of {{"role", "content"}} objects, got {_json_type(value)}',
            param="messages",
        )
    out = []
    for i, m in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise APIError(
                400, f"'{where}' must be an object with 'role' and 'content', got {_json_type(m)}", param=where
            )
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise APIError(
                400,
                f"'{where}' has unsupported field(s) {', '.join(sorted(extra))}; send only role and content",
                param=where,
            )
        role = m.get("role")
        if role not in ROLES:
            raise APIError(
                400, f"'{where}.role' must be one of {', '.join(ROLES)}, got {role!r}", param=f"{where}.role"
            )
        out.append(
            {
                "role": "system" if role == "developer" else role,
                "content": _content(m.get("content"), f"{where}.content"),
            }
        )
    return out


def _content(value: Any, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"type": "text", "text": ...}, ...]
        parts = []
        for part in value:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise APIError(
                    400,
                    f'\'{where}\' parts must be {{"type": "text", "text": ...}}; this server reads text only',
                    param=where,
                )
            parts.append(part["text"])
        return "".join(parts)
    raise APIError(400, f"'{where}' must be a string (or a list of text parts), got {_json_type(value)}", param=where)


def _integer(body: dict, name: str, low: int, high: int | None, default: Any, hint: str = "") -> Any:
    value = body.get(name, default)
    if value is default:
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise APIError(400, f"'{name}' must be an integer, got {_json_type(value)}", param=name)
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise APIError(400, f"'{name}' must be {bounds}{hint}, got {value}", param=name)
    return value


def _number(
    body: dict, name: str, low: float, high: float, default: float, low_open: bool = False, high_open: bool = False
) -> float:
    value = body.get(name, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise APIError(400, f"'{name}' must be a number, got {_json_type(value)}", param=name)
    if isinstance(value, float) and not math.isfinite(value):  # NaN passes every comparison below
        raise APIError(400, f"'{name}' must be a finite number, got {value}", param=name)
    if value < low or value > high or (low_open and value == low) or (high_open and value == high):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise APIError(400, f"'{name}' must be in {interval}, got {value}", param=name)
    return value


def _stop(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(s, str) and s for s in value):
        raise APIError(
            400, f"'stop' must be a non-empty string or a list of them, got {_json_type(value)}", param="stop"
        )
    if len(value) > MAX_STOP:
        raise APIError(400, f"'stop' has {len(value)} strings; give at most {MAX_STOP}", param="stop")
    return tuple(value)


def _stream_options(value: Any, stream: bool) -> bool:
    if value is None:
        return False
    if not stream:
        raise APIError(400, "'stream_options' is only allowed with \"stream\": true", param="stream_options")
    if (
        not isinstance(value, dict)
        or set(value) - {"include_usage"}
        or not isinstance(value.get("include_usage", False), bool)
    ):
        raise APIError(400, "'stream_options' must be {\"include_usage\": true|false}", param="stream_options")
    return value.get("include_usage", False)


def _hint(name: str, kind: Kind) -> str:
    other = "chat" if kind == "completion" else "completion"
    if name in ONLY[other]:
        endpoint = "/v1/chat/completions" if other == "chat" else "/v1/completions"
        return f" here (it belongs to {endpoint})"
    return ""


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {json.dumps(value)}"
    if isinstance(value, (int, float)):
        return f"number {value!r}"
    if isinstance(value, str):
        return f"string {value[:40]!r}" + ("..." if len(value) > 40 else "")
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
