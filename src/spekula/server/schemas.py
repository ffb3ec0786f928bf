"""Request bodies -> validated requests. Bad input becomes an APIError naming the parameter.

Validation is written out by hand rather than left to pydantic so that every message names the
parameter, says what to change, and carries the status the server documents (spekula.server.errors).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Final, Literal

from starlette.requests import Request

from spekula.config import SamplingParams, StopConfig
from spekula.errors import ConfigError
from spekula.knobs import is_int, is_number
from spekula.proposers import MODEL_FREE, NONE
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
    "spec",
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
RANDOM_SEED = -1  # llama-server's and llama.cpp's "random seed": unseeded sampling, as if no seed was given
AUTO: Final = "auto"


@dataclass(frozen=True)
class Speculation:
    """How a request speculates: what the server offers (ServerState.speculation), or what one request
    asked for in its `spec` object. proposer: the server's proposer by name, or NONE (plain decoding:
    no proposer at all, nothing drafted); k: a fixed draft length, or AUTO (the controller chooses
    each step); k_max: the longest k a request may fix here."""

    proposer: str = NONE
    k: int | Literal["auto"] = 0
    k_max: int = 0

    @property
    def plain(self) -> bool:
        return self.proposer == NONE


@dataclass(frozen=True)
class GenerationRequest:
    kind: Kind
    model: str | None  # None: the body named none, so the served model (as vLLM and llama-server take it)
    prompt: str | list[int] | None  # completions: text, or token ids
    messages: list[dict[str, str]] | None  # chat: [{role, content}] with content flattened to text
    sampling: SamplingParams
    stop: StopConfig
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with usage and no choices
    spec: Speculation = Speculation()  # what this request runs: the server's offer unless its `spec` chose


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


class _NonFinite:
    """A number the parser met that is not finite (NaN, Infinity, -Infinity, a float that overflows):
    held in its place until the body is read, so the error can name where it was."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text


def parse_json(body: bytes) -> Any:
    """Bytes -> JSON value, strictly: Python's json accepts NaN and Infinity and overflows 1e999 to inf,
    none of which is JSON or a usable parameter (refused naming the field that held it); nesting deeper
    than the parser's recursion limit (far beyond any request this API takes) is refused rather than
    raised as a RecursionError."""
    found: list[_NonFinite] = []

    def non_finite(text: str) -> _NonFinite:
        found.append(_NonFinite(text))
        return found[-1]

    def number(text: str) -> float | _NonFinite:
        value = float(text)
        return value if math.isfinite(value) else non_finite(text)

    try:
        text = body.decode("utf-8")  # decoded here: json.loads would guess UTF-16 from a BOM
        value = json.loads(text, parse_constant=non_finite, parse_float=number)
    except UnicodeDecodeError:
        raise APIError(400, "the request body is not UTF-8 text; send JSON encoded as UTF-8") from None
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
    if found:
        raise _non_finite_error(value, found[0])
    return value


def _non_finite_error(body: Any, number: _NonFinite) -> APIError:
    where = _path_to(body, number)
    if where is None:  # its key came again later in the same object, which replaced it
        what = "the request body contains"
    else:
        what = f"'{where}' is" if where else "the request body is"
    message = (
        f"{what} the number {number.text[:40]}, which is not finite; "
        "JSON numbers must be finite: send a finite value such as 0.7"
    )
    return APIError(400, message, param=where or None)


def _path_to(body: Any, target: object) -> str | None:
    """Where `target` sits in the parsed body, as the error's param spells it ("messages[0].content");
    "" for the body itself, None when it is not there. Iterative: the body may be nested to the parser's limit."""
    stack = [(body, "")]
    while stack:
        node, path = stack.pop()
        if node is target:
            return path[:200]
        if isinstance(node, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k)) for k, v in node.items())
        elif isinstance(node, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(node))
    return None


def _too_large(size: int | None, limit: int) -> APIError:
    has = f"has {size} bytes, more than" if size is not None else "is larger than"
    return APIError(
        413,
        f"the request body {has} the server's limit of {limit} bytes; "
        "send a shorter prompt (the operator can raise --max-body-bytes)",
        code="body_too_large",
    )


def parse_request(
    body: Any, kind: Kind, settings: ServerSettings, offer: Speculation = Speculation()
) -> GenerationRequest:
    """offer: how this server speculates (ServerState.speculation); a request's `spec` may choose within it."""
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, got {_json_type(body)}")
    _check_names(body, kind)
    body = {k: v for k, v in body.items() if v is not None}  # null means "use the default", as in OpenAI's API
    model = _model(body)
    prompt, messages = _input(body, kind)
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise APIError(
            400, f"'n' must be 1 (one choice per request), got {n!r}; send several requests instead", param="n"
        )
    if "user" in body and not isinstance(body["user"], str):
        raise APIError(400, f"'user' must be a string, got {_json_type(body['user'])}", param="user")

    limit, hint = settings.max_tokens_limit, " (the server's --max-tokens-limit)"
    max_tokens = _integer(body, "max_tokens", 1, limit, settings.default_max_tokens, hint=hint)
    if "max_completion_tokens" in body:  # chat's newer name wins; both are checked, neither is ignored
        max_tokens = _integer(body, "max_completion_tokens", 1, limit, settings.default_max_tokens, hint=hint)
    defaults = settings.sampling
    # Any temperature in (0, 2] is served, however small: spekula.sampling computes the softmax so that
    # a tiny one (1e-38) behaves as its limit, all mass on the argmax, for the draft and the target alike.
    temperature = _number(body, "temperature", 0.0, 2.0, defaults.temperature)
    top_p = _number(body, "top_p", 0.0, 1.0, defaults.top_p, low_open=True)
    min_p = _number(body, "min_p", 0.0, 1.0, defaults.min_p, high_open=True)
    top_k = _integer(body, "top_k", -1, None, defaults.top_k, hint=" (0 or -1 = off)")
    top_k = 0 if top_k == -1 else top_k  # -1 is vLLM's "off"; spekula's own is 0
    seed = _integer(body, "seed", RANDOM_SEED, MAX_SEED, defaults.seed, hint=f" ({RANDOM_SEED} = random)")
    seed = None if seed == RANDOM_SEED else seed
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
    spec = offer if "spec" not in body else _spec(body["spec"], offer)
    return GenerationRequest(kind, model, prompt, messages, sampling, stop_config, stream, include_usage, spec)


# -- fields ---------------------------------------------------------------------------------------


def _model(body: dict) -> str | None:
    """The model the body names; None where it names none (absent or null): the server's own model, as vLLM and
    llama-server take it (OpenAI answers 400; a server of one model needs no name to know which)."""
    model = body.get("model")
    if model is None:
        return None
    if not isinstance(model, str) or not model:
        raise APIError(
            400,
            f"'model' must be a non-empty string (or left out for the model this server runs), got {_json_type(model)}",
            param="model",
        )
    return model


def _input(body: dict, kind: Kind) -> tuple[str | list[int] | None, list[dict[str, str]] | None]:
    """(prompt, messages): a completion's prompt, or a chat's messages (the other None)."""
    if kind == "completion":
        if "prompt" not in body:
            raise APIError(400, "parameter 'prompt' is required: a string (or a list of token ids)", param="prompt")
        return _prompt(body["prompt"]), None
    if "messages" not in body:
        raise APIError(
            400, 'parameter \'messages\' is required: a list of {"role", "content"} objects', param="messages"
        )
    return None, _messages(body["messages"])


def _check_names(body: dict, kind: Kind) -> None:
    """Every parameter is one this endpoint serves, or an unimplemented one at its neutral value."""
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


def _prompt(value: Any) -> str | list[int]:
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], (str, list)):
        value = value[0]  # a batch of one
    if isinstance(value, str):
        return _text(value, "prompt")
    if isinstance(value, list) and value and all(is_int(t) for t in value):
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
        return _text(value, where)
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
        return _text("".join(parts), where)
    raise APIError(400, f"'{where}' must be a string (or a list of text parts), got {_json_type(value)}", param=where)


def _integer(body: dict, name: str, low: int, high: int | None, default: Any, hint: str = "") -> Any:
    value = body.get(name, default)
    if value is default:
        return value
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not is_int(value):
        raise APIError(400, f"'{name}' must be an integer, got {_json_type(value)}", param=name)
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"between {low} and {high}"
        raise APIError(400, f"'{name}' must be {bounds}{hint}, got {value}", param=name)
    return value


def _number(
    body: dict, name: str, low: float, high: float, default: float, low_open: bool = False, high_open: bool = False
) -> float:
    value = body.get(name, default)
    if isinstance(value, float) and not math.isfinite(value):  # NaN passes every comparison below
        raise APIError(400, f"'{name}' must be a finite number, got {value}", param=name)
    if not is_number(value):
        raise APIError(400, f"'{name}' must be a number, got {_json_type(value)}", param=name)
    if value < low or value > high or (low_open and value == low) or (high_open and value == high):
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
        raise APIError(400, f"'{name}' must be in {interval}, got {value}", param=name)
    return value


def _stop(value: Any) -> tuple[str, ...]:
    single = isinstance(value, str)
    strings = [value] if single else value
    if not isinstance(strings, (list, tuple)):
        raise APIError(
            400, f"'stop' must be a non-empty string or a list of them, got {_json_type(value)}", param="stop"
        )
    if len(strings) > MAX_STOP:
        raise APIError(400, f"'stop' has {len(strings)} strings; give at most {MAX_STOP}", param="stop")
    for i, s in enumerate(strings):
        where = "stop" if single else f"stop[{i}]"
        if not isinstance(s, str):
            raise APIError(400, f"'{where}' must be a string, got {_json_type(s)}", param=where)
        if not s:
            raise APIError(
                400,
                f"'{where}' is an empty string, which would match before any text; give a non-empty string, "
                "or leave 'stop' out",
                param=where,
            )
        _text(s, where)
    return tuple(strings)


def _text(value: str, where: str) -> str:
    """value, if it is text: JSON's \\ud800 escapes can carry a lone UTF-16 surrogate, which no tokenizer encodes."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(
            400,
            f"'{where}' holds a lone UTF-16 surrogate ({value[e.start]!r} at character {e.start}), which is not "
            "text; send valid Unicode (a surrogate only in a high-low pair)",
            param=where,
        ) from None
    return value


def _spec(value: Any, offer: Speculation) -> Speculation:
    """The request's `spec` object -> what it runs. {"draft": "none" | the server's proposer, "k": 0..k_max
    | "auto"}; plain decoding (draft "none", or k 0) runs no proposer at all."""
    example = '{"draft": "none"} or {"k": 4}'
    if not isinstance(value, dict):
        raise APIError(400, f"'spec' must be an object such as {example}, got {_json_type(value)}", param="spec")
    for name in value:
        if name not in ("draft", "k"):
            where = f"spec.{name[:40]}"
            raise APIError(400, f"unknown field '{where}'; 'spec' takes draft and k", param=where)
    draft = value.get("draft")
    if draft is not None and (not isinstance(draft, str) or draft not in (NONE, offer.proposer)):
        raise APIError(400, _draft_refusal(draft, offer), param="spec.draft")
    k = _spec_k(value.get("k"), draft, offer)
    if draft == NONE or k == 0:
        return Speculation(NONE, 0, offer.k_max)
    return Speculation(offer.proposer, offer.k if k is None else k, offer.k_max)


def _draft_refusal(draft: Any, offer: Speculation) -> str:
    accepted = " or ".join(repr(name) for name in dict.fromkeys((NONE, offer.proposer)))
    runs = "runs no proposer" if offer.plain else f"drafts with {offer.proposer!r}"
    got = repr(draft[:40]) if isinstance(draft, str) else _json_type(draft)
    kinds = ", ".join(repr(name) for name in MODEL_FREE)
    return (
        f"'spec.draft' must be {accepted} on this server (it {runs}), got {got}; another proposer ({kinds} "
        "or a draft model) needs a server started with --draft NAME"
    )


def _spec_k(k: Any, draft: Any, offer: Speculation) -> int | Literal["auto"] | None:
    """spec.k, checked against what the server offers; None when the request leaves it out."""
    if k is None:
        return None
    if isinstance(k, float) and k.is_integer():
        k = int(k)
    if k == 0 and is_int(k):
        return 0
    if draft == NONE or offer.plain:
        why = "'spec.draft' is 'none'" if draft == NONE else "this server runs no proposer (--draft none)"
        message = f"'spec.k' must be 0 or left out: {why}, so nothing is drafted; got {_json_type(k)}"
        raise APIError(400, message, param="spec.k")
    auto = ' or "auto"' if offer.k == AUTO else ""
    if k == AUTO:
        if not auto:
            message = f"'spec.k' \"auto\" needs a server started with --k auto; this one drafts a fixed k={offer.k}"
            raise APIError(400, message + ": send an integer", param="spec.k")
        return AUTO
    if not is_int(k):
        raise APIError(400, f"'spec.k' must be an integer{auto}, got {_json_type(k)}", param="spec.k")
    if not 0 <= k <= offer.k_max:
        message = f"'spec.k' must be between 0 and {offer.k_max} (this server's k_max; 0 = plain decoding){auto}"
        raise APIError(400, f"{message}, got {k}", param="spec.k")
    return k


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
        if not value:
            return "an empty string"
        return f"string {value[:40]!r}" + ("..." if len(value) > 40 else "")
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__
