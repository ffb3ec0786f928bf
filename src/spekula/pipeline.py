"""The library's front door: load a target (and a draft), then generate text.

Ties the text layer (spekula.text) to the token-level engine. The CLI and the server use this and
nothing below it, so they report the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from spekula.backends import LLAMACPP, NATIVE, load_backend
from spekula.backends.base import Backend
from spekula.config import BackendConfig, SamplingParams, SpecConfig, StopConfig
from spekula.engine import Engine, Generation
from spekula.errors import ConfigError
from spekula.proposers import build_proposer, needs_model
from spekula.proposers.base import ProposerFactory
from spekula.text import IncrementalDetokenizer, StopMatcher, TextCodec
from spekula.trace import Recorder, RequestStats

DEFAULT_TARGET = "qwen2.5-coder-1.5b"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b"  # the draft model, where a draft model is the default proposer (default_draft)
DEFAULT = "default"  # --draft's default: the proposer default_draft picks for the target's runtime


@dataclass
class Completion:
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    stats: RequestStats

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "stats": self.stats.to_dict(),
        }


@dataclass
class TextGeneration:
    """A request in flight at the text level: iterate for text deltas, then call result()."""

    generation: Generation
    codec: TextCodec
    stop: StopConfig
    text: str = ""
    _detok: IncrementalDetokenizer = field(init=False)
    _matcher: StopMatcher = field(init=False)

    def __post_init__(self) -> None:
        self._detok = IncrementalDetokenizer(self.codec, self.generation.prompt_ids)
        self._matcher = StopMatcher(tuple(self.stop.stop))

    def __iter__(self) -> Iterator[str]:
        return (delta for delta in self.steps() if delta)

    def steps(self) -> Iterator[str]:
        """One item per engine step: the text it completed, possibly "" (held back: an incomplete
        character or a possible stop string). A scheduler interleaves requests with this and can
        stop one between any two steps; close() the iterator to free the KV caches at once."""
        try:
            for new_ids in self.generation:
                yield self.feed(new_ids)
                if self.stopped:
                    return
            tail = self.flush()
            if tail:
                yield tail
        finally:
            self.generation.close()

    def feed(self, new_ids: list[int]) -> str:
        """Text completed by one step's tokens (for a scheduler that drives the engine's steps itself)."""
        delta = self._matcher.feed(self._detok.feed(new_ids))
        self.text += delta
        if self._matcher.stopped:
            self.generation.finish_reason = "stop"
        return delta

    @property
    def stopped(self) -> bool:
        """A stop string matched: nothing more may be emitted."""
        return self._matcher.stopped

    def flush(self) -> str:
        """The held-back text once the engine has finished."""
        tail = self._matcher.feed(self._detok.flush()) + self._matcher.flush()
        self.text += tail
        return tail

    def close(self) -> None:
        self.generation.close()

    def result(self) -> Completion:
        for _ in self:  # finish if the caller did not iterate
            pass
        g = self.generation
        return Completion(self.text, list(g.token_ids), g.finish_reason or "abort", len(g.prompt_ids), g.stats)


class Pipeline:
    def __init__(
        self,
        target: Backend,
        codec: TextCodec,
        proposer: ProposerFactory | None,
        spec: SpecConfig,
        draft_name: str = "none",
    ) -> None:
        self.target = target
        self.codec = codec
        self.spec = spec
        self.draft_name = draft_name
        # both engines prefill a prompt alike (PromptCache.plan); a stand-in codec (tests) has no chat template
        markers = codec.turn_markers() if isinstance(codec, TextCodec) else None
        self.engine = Engine(target, proposer, spec, markers)
        self.plain_engine = Engine(target, None, spec, markers)

    @classmethod
    def load(
        cls,
        target: str = DEFAULT_TARGET,
        draft: str | None = DEFAULT,
        spec: SpecConfig = SpecConfig(),
        backend: BackendConfig | None = None,
        draft_backend: BackendConfig | None = None,
    ) -> Pipeline:
        """backend: how the target runs (default: default_runtime's choice). draft_backend: how the draft
        runs (default: like the target). Mixed pairs are fine: the guarantee rests on the target's
        probabilities only, so a quantised llama.cpp draft may serve a bf16 PyTorch target as long as
        the vocabulary is the same. draft DEFAULT: default_draft's choice for the target's runtime."""
        backend = backend or BackendConfig(runtime=default_runtime(target))
        draft = default_draft(backend.runtime) if draft == DEFAULT else draft
        draft_backend = draft_backend or backend
        target_backend, codec = load_model(target, backend)
        loaded = {(target, backend): (target_backend, codec)}

        def load_draft(name: str) -> Backend:
            if (name, draft_backend) not in loaded:
                loaded[(name, draft_backend)] = load_model(name, draft_backend)
            draft, draft_codec = loaded[(name, draft_backend)]
            if draft_codec.vocabulary_fingerprint() != codec.vocabulary_fingerprint():
                raise ConfigError(
                    f"draft {name!r} and target {target!r} have different vocabularies (their tokenizers map text to "
                    "different ids); choose a draft of the same family, or --draft ngram"
                )
            return draft

        proposer = build_proposer(draft, spec, target=target_backend, load_draft=load_draft)
        pipe = cls(target_backend, codec, proposer, spec, draft_name=draft or "none")
        if spec.k is None and proposer is not None:
            pipe.engine.calibrate()  # before any request, so no request's TTFT pays for it
        return pipe

    def start(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams = SamplingParams(),
        stop: StopConfig = StopConfig(),
        recorder: Recorder | None = None,
        plain: bool = False,
        namespace: str = "",
    ) -> TextGeneration:
        """namespace: whose earlier requests the proposer may draft from (the suffix proposer's cache):
        requests of one namespace never draft another's text."""
        engine = self.plain_engine if plain else self.engine
        generation = engine.generate(prompt_ids, sampling, stop, recorder, namespace=namespace)
        return TextGeneration(generation, self.codec, stop)

    def generate(
        self, prompt_ids: list[int], sampling: SamplingParams = SamplingParams(), stop: StopConfig = StopConfig(), **kw
    ) -> Completion:
        return self.start(prompt_ids, sampling, stop, **kw).result()

    def warmup(self) -> None:
        """One short request on each path, so one-off costs (allocator, thread pool) hit neither measurement."""
        ids = self.codec.encode("def f():")
        for plain in (False, True):
            stop = StopConfig(max_tokens=4, ignore_eos=True)
            self.generate(ids, SamplingParams(), stop, plain=plain, namespace="warmup")  # no request drafts from it


def is_gguf(name_or_path: str | None) -> bool:
    """A model that runs from a GGUF file: every catalogue entry, or a path ending in .gguf."""
    from spekula.models import CATALOGUE

    return name_or_path is not None and (name_or_path in CATALOGUE or str(name_or_path).lower().endswith(".gguf"))


def has_llama_cpp() -> bool:
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def default_runtime(target: str, device: str | None = None, dtype: str = "float32") -> str:
    """How the target runs when nobody says (an explicit --backend always wins): llama.cpp for a GGUF
    target on a CPU when llama-cpp-python is installed, since it decodes a Q4 GGUF several times faster
    than any fp32 PyTorch runtime on a CPU (docs/BENCHMARKS.md, "Packed fp32"; `scripts/pass_costs.py`);
    native on a GPU, for a Hugging Face directory, or without llama-cpp-python (packed fp32 weights verify
    a block of tokens for little more than the cost of one; transformers' fp32 pays for every row).

    device: "cpu" or "cuda" (default: "cuda" when torch sees a GPU); dtype: a --dtype other than float32
    asks for PyTorch weights in that precision, so it runs native. The one place this decision lives."""
    if dtype != "float32" or not is_gguf(target) or not has_llama_cpp():
        return NATIVE
    if device is None:  # asked last: it imports torch
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    return LLAMACPP if device == "cpu" else NATIVE


def default_draft(runtime: str) -> str:
    """The proposer when nobody says (an explicit --draft always wins): suffix lookup on a llama.cpp target,
    the draft model DEFAULT_DRAFT on the others. On a CPU with few cores every verified row costs (llama.cpp's
    pass costs: docs/BENCHMARKS.md, "Pass costs by width"), so only drafting that is free can pay there, and
    then only where text is being copied; the controller keeps suffix lookup off elsewhere. PyTorch runtimes
    verify a block for little more than one token (packed fp32 weights, a GPU), so a draft model's longer accepted
    runs pay there. The output does not depend on it: every proposer is lossless."""
    return "suffix" if runtime == LLAMACPP else DEFAULT_DRAFT


def default_draft_runtime(draft: str | None, target_runtime: str) -> str:
    """How a draft model runs when nobody says: llama.cpp for a draft that has a GGUF, when the target
    runs in PyTorch and llama-cpp-python is installed (a Q4 draft step costs a fraction of the same
    model's step in fp32 PyTorch on a CPU: `scripts/pass_costs.py` measures both); otherwise like the target (so a
    llama.cpp target, the default on a CPU, gets a llama.cpp draft). The output does not depend on it:
    losslessness needs only the target's probabilities."""
    if target_runtime != LLAMACPP and needs_model(draft) and is_gguf(draft) and has_llama_cpp():
        return LLAMACPP
    return target_runtime


def draft_backend_config(draft: str | None, target: BackendConfig, runtime: str | None = None) -> BackendConfig:
    """How the draft runs: `runtime` if given, else default_draft_runtime; llama.cpp runs its GGUF's
    own quantisation, so it gets dtype float32 (a placeholder), the others the target's dtype."""
    runtime = runtime or default_draft_runtime(draft, target.runtime)
    return BackendConfig(
        dtype="float32" if runtime == LLAMACPP else target.dtype,
        threads=target.threads,
        runtime=runtime,
        context_length=target.context_length,
        exact=False,  # only the target's logits decide the output; an exact draft would only load slower
    )


def load_model(name_or_path: str, config: BackendConfig) -> tuple[Backend, TextCodec]:
    """A catalogue name, a Hugging Face directory or a .gguf path -> (backend, tokenizer)."""
    from spekula.models import resolve

    resolved = resolve(name_or_path)
    backend = load_backend(
        config.runtime, resolved.hf_dir, name=resolved.name, config=config, gguf_path=resolved.gguf_path
    )
    return backend, TextCodec.load(resolved.hf_dir)


__all__ = [
    "Pipeline",
    "Completion",
    "TextGeneration",
    "load_model",
    "default_runtime",
    "default_draft",
    "default_draft_runtime",
    "draft_backend_config",
    "DEFAULT_TARGET",
    "DEFAULT_DRAFT",
    "DEFAULT",
    "needs_model",
]
