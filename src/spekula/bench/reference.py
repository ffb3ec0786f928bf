"""llama-cpp-python's own plain decoding as a bench contender (`--spec loop=llama-cpp-python`).

spekula's contenders all run spekula's engine loop; this one runs llama-cpp-python's: `Llama.generate`
evaluates the prompt, samples greedily with llama.cpp's own sampler, and evaluates each sampled
token, in its own Python loop. It is the decoding a llama-cpp-python user gets from the same GGUF,
measured interleaved with spekula's contenders on the same prompt token ids (the chat template is
applied once, by spekula's codec) so the report can put spekula's numbers over it.

What is held equal, and why:
- the GGUF, context length, threads and batch size are those of spekula's llama.cpp backend, and
  llama-cpp-python's own model defaults otherwise (weight repacking on, flash attention off), as a
  user loading the file gets them; `--exact` changes spekula's backend, not this reference;
- the weights themselves: the Llama reads the model spekula's backend loaded from the file (loaded with
  the settings the Llama would use), so every contender's passes read the same memory (shared_weights);
- greedy only: llama.cpp's sampler chain and RNG are not spekula's, so sampled runs would not
  compare like for like;
- the stop tokens are spekula's (the target backend's EOS, plus the request's stop ids), and a stop
  token is not counted as output, as in spekula's engine;
- prompt caching on both sides, each its own: `Llama.generate` keeps the KV cells of the longest
  prefix a prompt shares with the previous call (all but its last token), as spekula's engine keeps
  its last request's (spekula.prompt_cache), and the runner's forget() drops both at the same points
  (after the warm-up, between repeats), so neither gets a prefill the other paid for;
- the text is detokenized incrementally with spekula's codec inside the timed loop, as spekula's
  text layer does inside its own; token ids are recorded, so greedy identity is compared on tokens.

Timing follows spekula's engine: the clock starts before the prompt pass, TTFT is the time to the
first sampled token, and the total ends when the last token is detokenized. The prompt pass
itself yields the first token (spekula's engine prefills all but the last prompt token and gets
the first output token from a one-token pass), so no decode-only rate is recorded for this contender
(`prefill_s` stays 0): decode speed compares through TPOT, time per output token after the first,
which counts the same one-token passes on both sides.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spekula.config import SamplingParams, StopConfig
from spekula.errors import ConfigError
from spekula.extras import needs_extra
from spekula.limits import check_prompt
from spekula.pipeline import Completion
from spekula.prompt_cache import shared_prefix
from spekula.text import IncrementalDetokenizer, StopMatcher
from spekula.trace import RequestStats

SPEKULA_LOOP = "spekula"
LLAMA_CPP_PYTHON = "llama-cpp-python"
LOOPS = (SPEKULA_LOOP, LLAMA_CPP_PYTHON)


@dataclass(frozen=True)
class LlamaSettings:
    """How the reference loads the GGUF: the settings of spekula's llama.cpp backend for the same file."""

    gguf_path: Path
    context_length: int
    threads: int
    batch: int
    eos_token_ids: frozenset[int]

    @classmethod
    def of(cls, backend: Any) -> LlamaSettings:
        """From a spekula.backends.llamacpp.LlamaCppBackend (the target on llama.cpp)."""
        from spekula.backends.llamacpp import N_BATCH, LlamaCppBackend

        if not isinstance(backend, LlamaCppBackend):
            raise ConfigError(
                f"--spec loop={LLAMA_CPP_PYTHON} runs the target's GGUF; the target here runs on "
                f"{type(backend).__name__}. Run with --backend llamacpp or give a GGUF target"
            )
        return cls(backend.gguf_path, backend.context_length, backend.threads, N_BATCH, backend.eos_token_ids)


class LlamaCppPythonLoop:
    """One llama_cpp.Llama over the GGUF, decoding one request at a time with `Llama.generate`."""

    def __init__(self, settings: LlamaSettings, codec: Any, prompt_cache: bool = True, model: Any = None) -> None:
        """prompt_cache False: reset() before every request, so generate() reuses no prefix.
        model: the weights spekula's backend loaded from the same GGUF (a llama_cpp._internals.LlamaModel),
        which the Llama then reads instead of loading its own copy (see shared_weights); None: its own."""
        with needs_extra("llamacpp", f"--spec loop={LLAMA_CPP_PYTHON}"):
            from llama_cpp import Llama
        self.settings = settings
        self.codec = codec
        self.prompt_cache = prompt_cache
        with shared_weights(model):
            self.llama = Llama(
                model_path=str(settings.gguf_path),
                n_ctx=settings.context_length,
                n_batch=settings.batch,
                n_ubatch=settings.batch,
                n_threads=settings.threads,
                n_threads_batch=settings.threads,
                use_mmap=False,  # as spekula's backend loads repacked weights: the mapped file would stay resident
                verbose=False,
            )

    def decode(self, prompt_ids: list[int], stop: StopConfig) -> Completion:
        """Greedy decoding of one request through llama-cpp-python's generation loop, timed."""
        settings = self.settings
        check_prompt(prompt_ids, self.llama.n_vocab(), settings.context_length)
        stop_ids: Collection[int] = set(stop.stop_token_ids) | (set() if stop.ignore_eos else settings.eos_token_ids)
        budget = min(stop.max_tokens, settings.context_length - len(prompt_ids))
        stats = RequestStats(prompt_tokens=len(prompt_ids))
        detok = IncrementalDetokenizer(self.codec, prompt_ids)
        matcher = StopMatcher(tuple(stop.stop))
        token_ids: list[int] = []
        text = ""
        finish = "length"
        if not self.prompt_cache:
            self.llama.reset()
        kept = self.llama.input_ids[: self.llama.n_tokens].tolist()
        stats.cached_tokens = shared_prefix(kept, prompt_ids[:-1])  # what generate() will not evaluate again
        start = time.perf_counter()
        tokens = self.llama.generate(prompt_ids, temp=0.0, repeat_penalty=1.0, reset=True)
        try:
            for token in tokens:
                if stats.ttft_s is None:
                    stats.ttft_s = time.perf_counter() - start
                # one pass, one sampled token, k = 0 (as spekula's plain steps; the first pass is the prompt's)
                stats.record_step(0, 0, 0, 0 if token in stop_ids else 1)
                if token in stop_ids:
                    finish = "stop"
                    break
                token_ids.append(token)
                text += matcher.feed(detok.feed([token]))
                if matcher.stopped:
                    finish = "stop"
                    break
                if len(token_ids) >= budget:
                    break
        finally:
            tokens.close()
        if not matcher.stopped:
            text += matcher.feed(detok.flush()) + matcher.flush()
        stats.total_s = time.perf_counter() - start
        stats.finish_reason = finish
        return Completion(text, token_ids, finish, len(prompt_ids), stats)


@contextmanager
def shared_weights(model: Any) -> Iterator[None]:
    """While open, a llama_cpp.Llama made for the GGUF gets `model` (already loaded, with the settings it would
    have used: repacked weights, not mapped) instead of loading the file again; None: nothing changes.

    Both loops then read the same weights. Where a model's weights land in memory can move its passes' speed
    from one process to the next, so with two copies one contender could be luckier than the other for a whole
    run (scripts/experiments/context_cost.py measures it; docs/BENCH.md). With one copy that luck is the same
    for every contender (a context can still land unluckily: the script's record has one such process). The
    Llama's own context, batch, sampler and loop are unchanged, and the model stays the backend's: closing the
    Llama leaves it loaded."""
    if model is None:
        yield
        return
    from llama_cpp import _internals

    made = _internals.LlamaModel
    # what Llama.__init__ calls to load the file, replaced for the while
    _internals.LlamaModel = lambda **_: _Lent(model)  # type: ignore[misc, assignment]
    try:
        yield
    finally:
        _internals.LlamaModel = made  # type: ignore[misc]  # the class back


class _Lent:
    """A loaded llama_cpp._internals.LlamaModel lent to a Llama: every attribute is the model's, and close()
    (the Llama's, when it is freed) leaves the model loaded for its owner."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def close(self) -> None:
        pass


@dataclass
class Finished:
    """A request the reference has already run (start() runs it: llama-cpp-python's loop is not
    spekula's generator of steps); result() hands it over, as TextGeneration.result() does."""

    completion: Completion

    def result(self) -> Completion:
        return self.completion


class ReferenceContender:
    """A bench contender decoding through llama-cpp-python's own loop; the runner treats it like a
    plain Contender (start(...).result(), forget)."""

    plain = True

    def __init__(self, choice: Any, loop: LlamaCppPythonLoop) -> None:
        self.choice = choice  # spekula.bench.runner.SpecChoice with loop=llama-cpp-python
        self.loop = loop

    @property
    def name(self) -> str:
        return self.choice.name

    @property
    def engine(self) -> Any:
        raise ConfigError(
            f"{self.name!r} decodes through llama-cpp-python's loop, not spekula's engine: it is a bench contender "
            "only (spekula audit checks spekula's engine)"
        )

    def start(
        self, prompt_ids: list[int], sampling: SamplingParams, stop: StopConfig, recorder=None, namespace: str = ""
    ) -> Finished:
        check_sampling(sampling)
        return Finished(self.loop.decode(list(prompt_ids), stop))

    def forget(self, namespace: str) -> None:
        """No proposer to forget; the prompt cache goes, as a spekula contender's does (Contender.forget)."""
        self.loop.llama.reset()


def check_sampling(sampling: SamplingParams) -> None:
    if not sampling.greedy:
        raise ConfigError(
            f"--spec loop={LLAMA_CPP_PYTHON} is measured greedy only (llama.cpp's sampler chain and random numbers "
            "are not spekula's, so sampled outputs would not compare); drop --temperature or this --spec"
        )
