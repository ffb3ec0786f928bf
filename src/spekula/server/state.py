"""What the routes share, reached as request.app.state.server: settings, metrics, the pipeline and its
scheduler, and turning a request's prompt or messages into checked token ids."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field

from spekula.divergence import guarantee
from spekula.errors import ConfigError
from spekula.limits import ContextExceeded, EmptyPrompt, OutOfVocabulary, check_prompt
from spekula.pipeline import Pipeline
from spekula.server.errors import APIError
from spekula.server.metrics import ServerMetrics
from spekula.server.scheduler import Scheduler
from spekula.server.schemas import AUTO, GenerationRequest, Speculation
from spekula.server.settings import ServerSettings


@dataclass
class ServerState:
    """What the routes share: reached as request.app.state.server."""

    settings: ServerSettings
    metrics: ServerMetrics
    pipeline: Pipeline | None = None
    scheduler: Scheduler | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    # Fast tokenizers must not be used for two encodes at once; decoding (in the worker) only reads.
    encode_lock: threading.Lock = field(default_factory=threading.Lock)
    _guarantee: dict | None = field(default=None, repr=False)

    @property
    def model_name(self) -> str:
        assert self.pipeline is not None  # loaded at startup, before the app takes a request
        return self.settings.model_name or self.pipeline.target.name

    @property
    def speculation(self) -> Speculation:
        """How this server speculates: what a request runs unless its `spec` asks otherwise (schemas._spec).
        A request may fix k up to k_max (the controller's bound; a fixed --k above it raises it)."""
        assert self.pipeline is not None  # loaded at startup, before the app takes a request
        engine = self.pipeline.engine
        if engine.proposer is None:
            return Speculation()
        k = engine.spec.k
        return Speculation(self.pipeline.draft_name, AUTO if k is None else k, max(engine.spec.k_max, k or 0))

    @property
    def guarantee(self) -> dict:
        """What a greedy answer of this server promises against plain decoding of its target, alone
        (spekula.divergence.guarantee; shared: batching and the prompt cache also change a token's pass)."""
        if self._guarantee is None:
            assert self.pipeline is not None  # loaded at startup, before the app takes a request
            cache = self.pipeline.engine.prompt_cache
            any_rows = cache.enabled and cache.any_rows
            self._guarantee = guarantee(self.pipeline.target, shared=True, any_rows=any_rows).to_dict()
        return self._guarantee

    def namespace(self, authorization: str | None) -> str:
        """A request's namespace in the proposer's cross-request memory (the suffix proposer drafts
        from earlier requests of its own namespace only): a hash of the API key it presented, never
        the key itself, so requests under different keys never draft each other's text; "" when the
        server takes no key (the Gate has refused requests without the right key before this)."""
        if self.settings.api_key is None or authorization is None:
            return ""
        token = authorization.encode("latin-1").partition(b" ")[2].strip()  # "Bearer <key>", parsed as the Gate does
        return hashlib.sha256(token).hexdigest()[:32]

    def encode(self, req: GenerationRequest) -> list[int]:
        """Prompt or chat messages -> token ids, checked against the model's vocabulary and context."""
        assert self.pipeline is not None  # loaded at startup, before the app takes a request
        target, codec = self.pipeline.target, self.pipeline.codec
        if isinstance(req.prompt, list):
            ids = list(req.prompt)
        else:
            with self.encode_lock:
                if req.kind == "completion":  # text the schema checked (no lone surrogate): a failure is the server's
                    ids = codec.encode(prompt=req.prompt)
                else:
                    ids = self._encode_chat(req)
        param = "prompt" if req.kind == "completion" else "messages"
        try:
            check_prompt(ids, target.vocab_size, target.context_length)
        except EmptyPrompt:  # the engine's message knows no text; this one says what the text did
            message = f"'{param}' is empty after tokenization; give at least one token of text"
            raise APIError(400, message, param=param) from None
        except OutOfVocabulary as e:
            raise APIError(400, str(e), param=param) from None
        except ContextExceeded as e:
            raise APIError(422, str(e), param=param, code="context_length_exceeded") from None
        return ids

    def _encode_chat(self, req: GenerationRequest) -> list[int]:
        assert self.pipeline is not None  # loaded at startup, before the app takes a request
        try:
            return self.pipeline.codec.encode(messages=req.messages, chat=True)
        except ConfigError as e:  # no chat template
            raise APIError(422, f"{e}; use /v1/completions", param="messages") from None
        except Exception as e:  # a template that refuses the conversation (e.g. roles must alternate)
            message = f"the model's chat template refused these messages: {e}"
            raise APIError(422, message, param="messages") from None
