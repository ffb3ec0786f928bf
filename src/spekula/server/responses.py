"""OpenAI's response and stream-chunk shapes, plus the `spec` object this server adds.

Every number in `spec` and `usage` comes from spekula.trace.RequestStats, so it means what it
means in the CLI, traces and reports.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from spekula.server.schemas import Kind, Speculation
from spekula.trace import RequestStats


@dataclass
class ResponseShape:
    """One response's identity: every chunk of a stream carries the same id, created and model."""

    kind: Kind
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))
    guarantee: dict[str, Any] | None = None  # the server's promise against plain decoding (ServerState.guarantee)

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.kind == "chat" else "cmpl-") + uuid.uuid4().hex

    @property
    def object(self) -> str:
        return "chat.completion" if self.kind == "chat" else "text_completion"

    def _head(self, object_: str) -> dict[str, Any]:
        return {"id": self.id, "object": object_, "created": self.created, "model": self.model}

    def response(self, text: str, finish_reason: str, stats: RequestStats, ran: Speculation) -> dict[str, Any]:
        if self.kind == "chat":
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        return {
            **self._head(self.object),
            "choices": [choice],
            "usage": usage(stats),
            "spec": spec(stats, ran, self.guarantee),
        }

    def chunk(
        self, delta: str | None = None, finish_reason: str | None = None, *, role: bool = False
    ) -> dict[str, Any]:
        if self.kind == "chat":
            body: dict[str, Any] = {} if delta is None and not role else {"content": delta or ""}
            if role:
                body["role"] = "assistant"
            choice = {"index": 0, "delta": body, "logprobs": None, "finish_reason": finish_reason}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self._head("text_completion"), "choices": [choice]}

    def final_chunk(self, finish_reason: str, stats: RequestStats | None, ran: Speculation) -> dict[str, Any]:
        """The chunk that carries finish_reason; usage and spec ride along (harmless extra fields), unless
        stats is None: then they come once, on the usage chunk (stream_options.include_usage), as OpenAI's do."""
        chunk = self.chunk(finish_reason=finish_reason)
        return chunk if stats is None else {**chunk, "usage": usage(stats), "spec": spec(stats, ran, self.guarantee)}

    def usage_chunk(self, stats: RequestStats, ran: Speculation) -> dict[str, Any]:
        """stream_options.include_usage: OpenAI's last chunk, with no choices."""
        object_ = "chat.completion.chunk" if self.kind == "chat" else "text_completion"
        return {**self._head(object_), "choices": [], "usage": usage(stats), "spec": spec(stats, ran, self.guarantee)}


def usage(stats: RequestStats) -> dict[str, Any]:
    """OpenAI's usage object; prompt_tokens_details.cached_tokens: the prompt tokens the prompt cache held."""
    return {
        "prompt_tokens": stats.prompt_tokens,
        "completion_tokens": stats.output_tokens,
        "total_tokens": stats.prompt_tokens + stats.output_tokens,
        "prompt_tokens_details": {"cached_tokens": stats.cached_tokens},
    }


def spec(stats: RequestStats, ran: Speculation, guarantee: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the request ran (its proposer, "none" for plain decoding, and k: fixed or "auto"), how it went,
    and `guarantee`: what a greedy answer promises against plain decoding of the target alone
    (spekula.divergence.Guarantee: kind "bit-identical" or "identical-except-near-ties", and why)."""
    return {
        "proposer": ran.proposer,
        "k": ran.k,
        "drafts": stats.drafts,  # target passes that verified a draft
        "drafted": stats.drafted,
        "accepted": stats.accepted,
        "alpha": stats.alpha,
        "tau": stats.tau,
        "target_passes": stats.target_passes,
        "k_chosen": {str(k): n for k, n in sorted(stats.k_chosen.items())},  # k -> steps that drafted k
        "acceptance_by_position": stats.acceptance_by_position,
        "ttft_s": stats.ttft_s,
        "tokens_per_s": stats.tokens_per_s,
        "timings": timings(stats),
        **({"guarantee": guarantee} if guarantee is not None else {}),
    }


def timings(stats: RequestStats) -> dict[str, float]:
    """Seconds the engine spent on the request by stage (RequestStats): the prefill, then over the decode steps
    drafting, scoring (target passes), accepting and advancing; `total_s` from the start of its prefill to its end
    (time queued before it is not in it), so what the stages leave of it is the loop and the scheduler around them,
    other requests' steps included where several run at once."""
    return {key: getattr(stats, key) for key in ("prefill_s", "draft_s", "score_s", "accept_s", "advance_s", "total_s")}


def sse(payload: dict[str, Any] | str) -> bytes:
    """One server-sent event."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


DONE = sse("[DONE]")
