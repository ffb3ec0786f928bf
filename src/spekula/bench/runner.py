"""The in-process runner: plain decoding and speculative configurations over a workload, one loaded target.

Every configuration is a spekula.pipeline.Pipeline over the SAME target backend and text codec, so
tokenizing, detokenizing, stop handling and the engine loop are the code `spekula generate` runs;
plain decoding is the pipeline's `plain=True` path (k = 0 through the same loop). One contender may
run another program's loop instead: `loop=llama-cpp-python` (spekula.bench.reference), llama-cpp-python's
own plain decoding of the target's GGUF, as the bar spekula's llama.cpp runtime is measured against
(`--baseline llama-cpp-python` puts every ratio over it). Each prompt runs
under every configuration before the next prompt starts, in an order that changes from prompt to prompt
(balanced_order): drift of the machine (thermal, other processes) hits all of them alike, and so does
whatever one request leaves behind for the next (no contender always runs right after the same one).
Proposer memory (the suffix proposer's of earlier outputs) is cold by default: every repeat starts empty. A
warm run (`--warm`, workloads.server_sequence) is one long sequence with one memory per contender, as on a
server that has been running: its prefix runs unreported first (prime), then the reported requests.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar, cast

from spekula.backends.base import Backend
from spekula.bench.metrics import RequestResult, attach_comparisons
from spekula.bench.reference import LLAMA_CPP_PYTHON, LOOPS, SPEKULA_LOOP, ReferenceContender
from spekula.bench.workloads import COLD, WorkItem, check_repeats
from spekula.config import BackendConfig, SamplingParams, SpecConfig, StopConfig
from spekula.engine import Engine
from spekula.errors import ConfigError, SpekulaError
from spekula.extras import needs_extra
from spekula.knobs import knob_of
from spekula.options import parse_k
from spekula.pipeline import Pipeline
from spekula.proposers import NGRAM, NONE, build_proposer, needs_model
from spekula.text import IncrementalDetokenizer
from spekula.trace import ListTrace

T = TypeVar("T")
PLAIN = "plain"
WARMUP = "warmup"  # the proposer's memory of the warm-up requests, dropped before any measured one
RENDER = "render"  # ... of render_tokens' run: a fresh memory, so the render never drafts the run's own outputs
SERVER = "server"  # a warm run's one memory: every request drafts from all before it, as on a server
PREFIX_REPEAT = 1  # a warm run's prefix takes its seeds as a second repeat would (a warm run has one repeat)
SPEC = SpecConfig()  # the declared defaults (spekula.config) of what a configuration sets, where no command sets it
# The SpecConfig knobs one configuration sets: SpecChoice's field (and --spec key) -> SpecConfig's. Their
# defaults, kinds and checks are the declarations'; prompt_cache is the run's, not a configuration's.
CHOICE_KNOBS = {"k_max": "k_max", "ngram_max": "ngram_max", "ngram_min": "ngram_min", "confidence": "draft_confidence"}
SPEC_KEYS = ("draft", "k", *CHOICE_KNOBS, "shadow", "backend", "exact", "loop", "name")
ON_OFF = {"on": True, "off": False}  # shadow= (SpecConfig.shadow_drafts) and exact= (BackendConfig.exact)


@dataclass(frozen=True)
class SpecChoice:
    """One configuration as a user writes it: a proposer ('ngram', a draft model, 'none') and k, the
    runtime the target runs on (None: the run's own, shared with the plain baseline), and whose loop
    decodes: spekula's engine, or llama-cpp-python's own (plain decoding of the target's GGUF only)."""

    draft: str
    k: int | None  # None = auto: the cost-model controller chooses k step by step
    ngram_max: int = SPEC.ngram_max
    ngram_min: int = SPEC.ngram_min
    label: str | None = None
    confidence: float | None = SPEC.draft_confidence  # a draft model's draft_confidence (SpecConfig)
    k_max: int = SPEC.k_max  # k=auto's longest draft (SpecConfig)
    backend: str | None = None  # a runtime name (spekula.backends.BACKENDS)
    loop: str = SPEKULA_LOOP  # whose generation loop decodes (spekula.bench.reference.LOOPS)
    # SpecConfig.shadow_drafts: on, to measure what shadow drafts are worth in one run
    shadow: bool = SPEC.shadow_drafts
    exact: bool | None = None  # BackendConfig.exact of this choice's target (None: the run's --exact)

    def __post_init__(self) -> None:
        from spekula.backends import BACKENDS, LLAMACPP

        if self.backend is not None and self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r} in --spec; choose one of {', '.join(BACKENDS)}")
        if self.loop not in LOOPS:
            raise ConfigError(f"unknown loop {self.loop!r} in --spec; choose one of {', '.join(LOOPS)}")
        if self.loop != SPEKULA_LOOP:
            if not self.plain:
                raise ConfigError(
                    f"loop={self.loop} is {self.loop}'s own plain decoding: it takes draft=none (or k=0), not "
                    f"draft={self.draft},k={self.k_text}"
                )
            if self.backend not in (None, LLAMACPP):
                raise ConfigError(
                    f"loop={self.loop} runs the target's GGUF on llama.cpp itself; backend={self.backend} does not "
                    "apply (drop it)"
                )
            if self.exact is not None:
                raise ConfigError(
                    f"loop={self.loop} decodes with llama-cpp-python's own settings; exact= shapes spekula's "
                    "llama.cpp runtime (drop it)"
                )
        SpecConfig(k=self.k, **self.knob_values())  # validates
        if self.confidence is not None and not needs_model(self.draft):
            raise ConfigError(
                f"confidence= stops a draft model's draft; {self.draft!r} is not a draft model. Drop it from this "
                "--spec"
            )

    @property
    def plain(self) -> bool:
        return self.draft == NONE or self.k == 0

    @property
    def k_text(self) -> str:
        return "auto" if self.k is None else str(self.k)

    @property
    def name(self) -> str:
        if self.label:
            return self.label
        if self.loop != SPEKULA_LOOP:
            return self.loop
        on = "" if self.backend is None else f" backend={self.backend}"
        if self.exact is not None:
            on += f" exact={'on' if self.exact else 'off'}"
        if self.plain:
            return PLAIN + on
        short = self.draft.rstrip("/").rsplit("/", 1)[-1]
        extra = (
            f" n={self.ngram_min}-{self.ngram_max}"
            if self.draft == NGRAM and (self.ngram_min, self.ngram_max) != (SPEC.ngram_min, SPEC.ngram_max)
            else ""
        )
        if self.k is None and self.k_max != SPEC.k_max:
            extra += f" k_max={self.k_max}"
        if self.confidence is not None:
            extra += f" conf={self.confidence:g}"
        if self.shadow:
            extra += " shadow=on"
        return f"{short} k={self.k_text}{extra}{on}"

    def knob_values(self) -> dict[str, Any]:
        """The SpecConfig knobs this configuration sets, by SpecConfig's names (CHOICE_KNOBS)."""
        return {name: getattr(self, field) for field, name in CHOICE_KNOBS.items()}

    def spec_config(self, prompt_cache: bool = True, any_rows: bool = False) -> SpecConfig:
        """prompt_cache, any_rows: the run's --prompt-cache and --prompt-cache-any-rows."""
        values = self.knob_values()
        if self.plain:
            values["draft_confidence"] = None
        return SpecConfig(
            prompt_cache=prompt_cache,
            prompt_cache_any_rows=any_rows,
            k=0 if self.plain else self.k,
            shadow_drafts=self.shadow,
            **values,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "draft": NONE if self.plain else self.draft,
            "k": 0 if self.plain else ("auto" if self.k is None else self.k),
            **self.knob_values(),
            "backend": self.backend,
            "loop": self.loop,
            "shadow": self.shadow,
            "exact": self.exact,
        }


PLAIN_CHOICE = SpecChoice(NONE, 0)


def choice_with_defaults(
    draft: str,
    k: int | None,
    ngram_max: int = SPEC.ngram_max,
    ngram_min: int = SPEC.ngram_min,
    confidence: float | None = SPEC.draft_confidence,
    label: str | None = None,
    k_max: int = SPEC.k_max,
    backend: str | None = None,
) -> SpecChoice:
    """A SpecChoice from a command's defaults: --draft-confidence applies to draft models only, so it
    is dropped for n-gram lookup or plain decoding rather than refused."""
    conf = confidence if needs_model(draft) else None
    return SpecChoice(draft, k, ngram_max, ngram_min, label, conf, k_max, backend)


def parse_spec(
    text: str,
    default_draft: str,
    default_k: int | None,
    ngram_max: int = SPEC.ngram_max,
    ngram_min: int = SPEC.ngram_min,
    confidence: float | None = SPEC.draft_confidence,
    k_max: int = SPEC.k_max,
) -> list[SpecChoice]:
    """'draft=ngram,k=4/8,ngram_max=3,name=lookup' -> one SpecChoice per k (k=a/b/c sweeps k; k=auto
    lets the cost model choose). backend=RUNTIME runs this configuration's target on that runtime (one
    more load of the target), so runtimes are measured interleaved in one run; exact=on|off likewise loads
    it with or without --exact's block-invariant passes. loop=llama-cpp-python is
    llama-cpp-python's own plain decoding of the target's GGUF (draft=none implied; any key that shapes
    a draft is refused).

    Keys not given take the command's --draft / --k / --k-max / --ngram-max / --ngram-min, and
    --draft-confidence for a draft model; without backend= the target runs on the run's runtime."""
    fields = _spec_fields(text)
    loop = _spec_loop(text, fields)
    draft = fields.get("draft", default_draft)
    ks = fields.get("k", "auto" if default_k is None else str(default_k))
    k_values = [parse_k(v) for v in ks.split("/")]
    given = {key: _knob_value(text, key, fields[key]) for key in CHOICE_KNOBS if key in fields}
    nmax = given.get("ngram_max", ngram_max)
    nmin = given.get("ngram_min", ngram_min)
    k_max = given.get("k_max", k_max)
    conf = given.get("confidence")
    if "k_max" in fields and any(k is not None for k in k_values):
        raise ConfigError(
            f"bad --spec {text!r}: k_max= caps the drafts of k=auto; a fixed k drafts exactly k. Drop one of them"
        )
    for key in ("shadow", "exact"):
        if fields.get(key, "off") not in ON_OFF:
            raise ConfigError(f"bad --spec {text!r}: {key} takes on or off, got {fields[key]!r}")
    shadow = ON_OFF[fields.get("shadow", "off")]
    exact = ON_OFF[fields["exact"]] if "exact" in fields else None
    label = fields.get("name")
    backend = fields.get("backend")
    choices = []
    for k in k_values:
        name = label if label is None or len(k_values) == 1 else f"{label} k={'auto' if k is None else k}"
        if conf is None:
            choice = choice_with_defaults(draft, k, nmax, nmin, confidence, name, k_max, backend)
        else:
            choice = SpecChoice(draft, k, nmax, nmin, name, conf, k_max, backend)
        choice = replace(choice, shadow=shadow, exact=exact)
        choices.append(replace(choice, loop=loop) if loop != SPEKULA_LOOP else choice)
    return choices


def _spec_fields(text: str) -> dict[str, str]:
    """A --spec's KEY=VALUE pairs (keys spelt with - or _), each key known and given once."""
    fields: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = part.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or key not in SPEC_KEYS or not value.strip():
            raise ConfigError(
                f"bad --spec {text!r}: {part!r} is not KEY=VALUE with KEY one of {', '.join(SPEC_KEYS)} (e.g. "
                "draft=ngram,k=4/8)"
            )
        if key in fields:
            raise ConfigError(f"bad --spec {text!r}: {key} given twice")
        fields[key] = value.strip()
    return fields


def _spec_loop(text: str, fields: dict[str, str]) -> str:
    """The spec's decoding loop. Another program's loop decodes plainly: no key that shapes a draft or the runtime,
    and draft=none, k=0 filled into `fields` where not given."""
    loop = fields.get("loop", SPEKULA_LOOP)
    if loop != SPEKULA_LOOP:
        shaping = (*CHOICE_KNOBS, "shadow", "exact")
        drafting = [key for key in shaping if key in fields]
        if drafting:
            raise ConfigError(
                f"bad --spec {text!r}: loop={loop} decodes plainly with llama-cpp-python's settings; "
                f"{', '.join(drafting)} shape(s) spekula's drafts or runtime. Drop them"
            )
        if fields.setdefault("draft", NONE) != NONE:
            raise ConfigError(f"bad --spec {text!r}: loop={loop} is {loop}'s own plain decoding: it takes draft=none")
        fields.setdefault("k", "0")
    return loop


def _knob_value(text: str, key: str, value: str) -> Any:
    """A --spec value of a SpecConfig knob, parsed as its declaration's kind and checked against its bounds,
    a refusal naming the key as the spec wrote it."""
    meta = replace(knob_of(SpecConfig, CHOICE_KNOBS[key]), flag=f"bad --spec {text!r}: {key}")
    try:
        parsed = meta.kind(value)
    except ValueError:
        noun = meta.noun or {int: "an integer", float: "a number"}[meta.kind]
        raise ConfigError(f"bad --spec {text!r}: {key} takes {noun}, got {value!r}") from None
    meta.check(parsed)
    return parsed


@dataclass
class Contender:
    """One configuration ready to run: a pipeline over the shared target, plain or speculative."""

    choice: SpecChoice
    pipeline: Pipeline

    @property
    def name(self) -> str:
        return self.choice.name

    @property
    def plain(self) -> bool:
        return self.choice.plain

    @property
    def engine(self) -> Engine:
        """The token-level engine this configuration runs (audit works below the text layer)."""
        return self.pipeline.plain_engine if self.plain else self.pipeline.engine

    def start(self, prompt_ids: list[int], sampling: SamplingParams, stop: StopConfig, recorder=None, namespace=""):
        """namespace: whose earlier outputs the proposer may draft from (run_inprocess: one per repeat)."""
        return self.pipeline.start(prompt_ids, sampling, stop, recorder=recorder, plain=self.plain, namespace=namespace)

    def forget(self, namespace: str) -> None:
        """Drop the proposer's memory of `namespace`'s requests (the suffix proposer's cache) and the kept
        prompt (the prompt cache): the runner calls it after the warm-up and after each repeat, so no
        request reuses what an earlier repeat of its own prompt computed or drafted."""
        if not self.plain and self.pipeline.engine.proposer is not None:
            self.pipeline.engine.proposer.forget(namespace)
        self.engine.prompt_cache.clear()


# (runtime name, exact mode; None: the run's) -> (the target so loaded, a draft loader for a target loaded so)
RuntimeLoader = Callable[[str | None, bool | None], tuple[Backend, Callable[[str], Backend]]]


def build_contenders(
    target: Backend,
    codec: Any,
    choices: list[SpecChoice],
    load_draft: Callable[[str], Backend] | None,
    load_runtime: RuntimeLoader | None = None,
    prompt_cache: bool = True,
    any_rows: bool = False,
) -> list[Contender | ReferenceContender]:
    """Plain decoding first, then every speculative choice (duplicates by name refused).

    Plain decoding on the run's runtime is always measured, as the baseline. A plain choice given its
    own name (`--spec draft=none,name=plain-again`) runs as one more configuration: an A/A control, whose
    per-prompt "speedup" (ideally 1.00x) shows how far this machine's noise alone moves a ratio. A choice
    with backend= runs over load_runtime's target for that runtime (e.g. `draft=none,backend=native`:
    plain decoding on another runtime, measured against the same baseline). A choice with
    loop=llama-cpp-python decodes the GGUF of the target on llama.cpp (the run's own target, or
    load_runtime's) through llama-cpp-python's loop, with that backend's settings. prompt_cache False
    (`--no-prompt-cache`): every contender prefills every prompt whole, llama-cpp-python's loop too. any_rows
    (`--prompt-cache-any-rows`): spekula's engines reuse every kept row (llama-cpp-python's loop always does)."""
    build = _ContenderBuilder(target, codec, load_draft, load_runtime, prompt_cache, any_rows)
    out: list[Contender | ReferenceContender] = [build.plain(PLAIN_CHOICE)]
    for choice in choices:
        if choice.plain and choice.name == PLAIN:
            continue  # the baseline, already there
        if any(c.name == choice.name for c in out):
            raise ConfigError(
                f"configuration {choice.name!r} is given twice; give each --spec a different draft, k or name="
            )
        if choice.loop == LLAMA_CPP_PYTHON:
            out.append(build.reference(choice))
        elif choice.plain:
            out.append(build.plain(choice))
        else:
            out.append(build.speculative(choice))
    return out


@dataclass
class _ContenderBuilder:
    """build_contenders' three kinds of contender, over the run's target or a runtime load_runtime loads."""

    target: Backend
    codec: Any
    load_draft: Callable[[str], Backend] | None
    load_runtime: RuntimeLoader | None
    prompt_cache: bool
    any_rows: bool = False  # --prompt-cache-any-rows (SpecConfig.prompt_cache_any_rows)

    def runtime_of(self, choice: SpecChoice) -> tuple[Backend, Callable[[str], Backend] | None]:
        """The target the choice runs on, and the draft loader for a target loaded so."""
        if choice.backend is None and choice.exact is None:
            return self.target, self.load_draft
        if self.load_runtime is None:
            keys = [f"backend={choice.backend}"] * (choice.backend is not None)
            keys += [f"exact={'on' if choice.exact else 'off'}"] * (choice.exact is not None)
            raise ConfigError(f"--spec {','.join(keys)} needs a runner that can load the target again")
        return self.load_runtime(choice.backend, choice.exact)

    def plain(self, choice: SpecChoice) -> Contender:
        on = self.runtime_of(choice)[0]
        spec = choice.spec_config(self.prompt_cache, self.any_rows)
        return Contender(choice, Pipeline(on, self.codec, None, spec, draft_name=NONE))

    def reference(self, choice: SpecChoice) -> ReferenceContender:
        from spekula.backends import LLAMACPP
        from spekula.backends.llamacpp import LlamaCppBackend
        from spekula.bench.reference import LlamaCppPythonLoop, LlamaSettings

        target = self.target
        gguf = target if isinstance(target, LlamaCppBackend) else self.runtime_of(replace(choice, backend=LLAMACPP))[0]
        gguf = cast(LlamaCppBackend, gguf)  # what backend=llamacpp loads
        # llama-cpp-python's loop makes its own context with its own settings (exact mode does not reach it) over
        # the weights that backend loaded (reference.shared_weights: one copy, the same placement for every loop)
        loop = LlamaCppPythonLoop(LlamaSettings.of(gguf), self.codec, self.prompt_cache, model=gguf.model)
        return ReferenceContender(choice, loop)

    def speculative(self, choice: SpecChoice) -> Contender:
        spec = choice.spec_config(self.prompt_cache, self.any_rows)
        on, drafts = self.runtime_of(choice)
        proposer = build_proposer(choice.draft, spec, target=on, load_draft=drafts)
        pipe = Pipeline(on, self.codec, proposer, spec, draft_name=choice.draft)
        if spec.k is None:
            pipe.engine.calibrate()  # as Pipeline.load does: no measured request pays for it
        return Contender(choice, pipe)


class DraftLoader:
    """Loads each (model, runtime) once and refuses a draft of a different vocabulary, as Pipeline.load
    does. draft_config(name, target_config): how that draft runs beside a target that runs so (default:
    like the target, which then counts as loaded). Calling it loads a draft for the run's own target;
    runtime(name) loads the target on another runtime, for a --spec backend=."""

    def __init__(
        self,
        target_name: str,
        target: Backend,
        codec: Any,
        config: BackendConfig,
        log: Callable[[str], None] = lambda m: None,
        draft_config: Callable[[str, BackendConfig], BackendConfig] | None = None,
    ) -> None:
        self.codec = codec
        self.config = config
        self.draft_config = draft_config or (lambda name, target_config: target_config)
        self.log = log
        self.target_name = target_name
        self.loaded: dict[tuple[str, BackendConfig], Backend] = {(target_name, config): target}

    def __call__(self, name: str) -> Backend:
        return self.draft(name, self.config)

    def runtime(self, runtime: str | None, exact: bool | None = None) -> tuple[Backend, Callable[[str], Backend]]:
        """The target on `runtime` (None: the run's own), in exact mode or not (None: as the run), and its
        draft loader; the run's own target when that is what it asks for. llama.cpp computes in the GGUF's
        own types, so it gets dtype float32 (a placeholder)."""
        from spekula.backends import LLAMACPP

        runtime = runtime or self.config.runtime
        dtype = "float32" if runtime == LLAMACPP else self.config.dtype
        exact = self.config.exact if exact is None else exact
        config = replace(self.config, runtime=runtime, dtype=dtype, exact=exact)
        key = (self.target_name, config)
        if key not in self.loaded:
            from spekula.pipeline import load_model

            self.log(f"loading target {self.target_name} ({config.runtime}, {config.dtype}) ...")
            self.loaded[key] = load_model(self.target_name, config)[0]
        return self.loaded[key], lambda name: self.draft(name, config)

    def draft(self, name: str, target_config: BackendConfig) -> Backend:
        config = self.draft_config(name, target_config)
        if (name, config) not in self.loaded:
            from spekula.pipeline import load_model

            self.log(f"loading draft {name} ({config.runtime}, {config.dtype}) ...")
            backend, codec = load_model(name, config)
            if codec.vocabulary_fingerprint() != self.codec.vocabulary_fingerprint():
                raise ConfigError(
                    f"draft {name!r} and target {self.target_name!r} have different vocabularies (their tokenizers "
                    "map text "
                    "to different ids); choose a draft of the same family, or draft=ngram"
                )
            self.loaded[(name, config)] = backend
        return self.loaded[(name, config)]


class PeakRss:
    """Peak resident memory of this process between reset() and peak().

    On Linux the kernel keeps the peak itself (VmHWM in /proc/self/status; writing 5 to
    /proc/self/clear_refs resets it, Linux >= 4.0): exact, and nothing runs while a request is measured.
    Elsewhere a background thread samples the resident size (psutil) every `interval` seconds. That
    thread is not free where the target's threads fill every core: it slows llama.cpp's passes, for every
    contender alike (scripts/experiments/rss_sampler.py measures by how much)."""

    STATUS = Path("/proc/self/status")
    CLEAR_REFS = Path("/proc/self/clear_refs")

    def __init__(self, interval: float = 0.01, kernel: bool | None = None) -> None:
        self.interval = interval
        self.kernel = self._kernel_peak_works() if kernel is None else kernel
        self._peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if not self.kernel:
            with needs_extra("bench", "measuring peak memory"):
                import psutil

            self.process = psutil.Process()
            self._thread = threading.Thread(target=self._loop, name="spekula-rss", daemon=True)

    @classmethod
    def _kernel_peak_works(cls) -> bool:
        """Whether this kernel resets and reports the peak (it resets it: call before measuring)."""
        try:
            cls.CLEAR_REFS.write_text("5")
            return cls._status_kib("VmHWM") > 0
        except (OSError, ValueError):
            return False

    @classmethod
    def _status_kib(cls, key: str) -> int:
        for line in cls.STATUS.read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise ValueError(f"no {key} in {cls.STATUS}")

    def __enter__(self) -> PeakRss:
        if self._thread is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._peak = max(self._peak, self.current())

    def current(self) -> int:
        if self.kernel:
            return self._status_kib("VmRSS") * 1024
        return int(self.process.memory_info().rss)

    def reset(self) -> None:
        if self.kernel:
            self.CLEAR_REFS.write_text("5")
        else:
            self._peak = self.current()

    def peak(self) -> int:
        if self.kernel:
            return self._status_kib("VmHWM") * 1024
        return max(self._peak, self.current())


def repeat_namespace(repeat: int) -> str:
    """The proposer's memory of one repeat's requests (the suffix proposer drafts from earlier requests'
    outputs): within a repeat, later prompts draft from earlier prompts' outputs, as on a server; a
    repeat never drafts an earlier repeat's output of the same prompt, which would inflate its speedup."""
    return f"repeat-{repeat}"


def cold_memory(prompts: int, repeats: int) -> dict[str, Any]:
    """What the bench records about the proposer's memory of a cold run (results and manifest)."""
    return {
        "state": COLD,
        "rule": "every repeat starts from an empty memory (a server just started): a request drafts only from the "
        "requests before it in its repeat, under its own configuration; `spekula bench --warm` measures a server "
        "that has been running",
        "requests_before": [0, max(prompts - 1, 0)],
        "repeats": repeats,
    }


def request_sampling(sampling: SamplingParams, index: int, repeat: int) -> SamplingParams:
    """Seed of one prompt's request: base seed (0 when none given) + prompt index + 10007 * repeat.
    Every configuration gets the same seed for the same prompt."""
    base = sampling.seed if sampling.seed is not None else 0
    return replace(sampling, seed=base + index + 10007 * repeat)


def encode_items(items: list[WorkItem], codec: Any, chat: bool) -> dict[str, list[int]]:
    out = {}
    for item in items:
        try:
            out[item.id] = item.encode(codec, chat=chat)
        except SpekulaError as e:
            raise ConfigError(f"prompt {item.id!r}: {e}") from None
    return out


def check_baseline(baseline: str, names: list[str]) -> None:
    if baseline not in names:
        raise ConfigError(
            f"--baseline {baseline!r} is not a configuration of this run; choose one of {', '.join(names)}"
        )


def run_inprocess(
    contenders: Sequence[Contender | ReferenceContender],
    codec: Any,
    items: list[WorkItem],
    sampling: SamplingParams = SamplingParams(),
    *,
    max_tokens: int | None = None,
    ignore_eos: bool = False,
    chat: bool = False,
    repeats: int = 1,
    warmup: bool = True,
    progress: bool = True,
    on_result: Callable[[RequestResult], None] | None = None,
    baseline: str | None = None,
    warm_prefix: list[WorkItem] | None = None,
) -> list[RequestResult]:
    """Every prompt under every contender, interleaved; speedup (and, for plain contenders, identity)
    attached against `baseline`: a contender's name, which must be one of them; None: spekula's plain
    decoding where it is among them (a run without it, e.g. of one proposer in a test, gets no ratios).

    Proposer memory: cold by default (every repeat starts from an empty memory: repeat_namespace). With
    `warm_prefix` (workloads.ServerSequence.prefix) it is warm, as on a server that has been running: one
    memory for the whole run (SERVER), filled first by running the prefix, untimed, under every speculative
    contender (prime); each reported request then drafts from its own contender's memory of everything before
    it. One repeat only: a second would send the reported prompts again."""
    with needs_extra("bench", "spekula bench"):
        from tqdm import tqdm

    baseline = check_run(contenders, sampling, repeats, baseline, warm_prefix)
    prefix = list(warm_prefix or [])
    ids = encode_items(items + prefix, codec, chat)
    if warmup:
        warm_up(contenders, ids[items[0].id])
    results: list[RequestResult] = []
    learning = [c for c in contenders if isinstance(c, Contender) and not c.plain]  # a ReferenceContender is plain
    total = len(items) * len(contenders) * repeats + len(prefix) * len(learning)
    bar = tqdm(total=total, file=sys.stderr, disable=not progress, unit="req", dynamic_ncols=True)
    with PeakRss() as rss, bar:
        if warm_prefix is not None:
            prime(learning, prefix, ids, sampling, max_tokens, ignore_eos, tick=lambda: bar.update(1))
        for repeat in range(repeats):
            namespace = SERVER if warm_prefix is not None else repeat_namespace(repeat)
            for index, item in enumerate(items):
                for c in balanced_order(contenders, index + repeat):
                    bar.set_postfix_str(f"{item.id} / {c.name}", refresh=False)
                    sampling_i = request_sampling(sampling, index, repeat)
                    stop = stop_for(item, max_tokens, ignore_eos)
                    r = measure(c, item, ids[item.id], sampling_i, stop, rss, namespace=namespace)
                    r.repeat, r.order, r.requests_before = repeat, len(results), len(prefix) + index
                    results.append(r)
                    if on_result is not None:
                        on_result(r)
                    bar.update(1)
            for c in contenders:
                c.forget(namespace)
    attach_comparisons(results, baseline, sampling.greedy)
    if sampling.greedy:
        identity_on_own_runtime(results, contenders)
    return results


def check_run(
    contenders: Sequence[Contender | ReferenceContender],
    sampling: SamplingParams,
    repeats: int,
    baseline: str | None,
    warm_prefix: list[WorkItem] | None,
) -> str:
    """Refuse what cannot run before any model time is spent; returns the baseline's name."""
    check_repeats(repeats)
    if warm_prefix is not None:
        check_warm_repeats(repeats)
    if baseline is None:
        baseline = PLAIN
    else:
        check_baseline(baseline, [c.name for c in contenders])
    if any(isinstance(c, ReferenceContender) for c in contenders):
        from spekula.bench.reference import check_sampling

        check_sampling(sampling)
    return baseline


def check_warm_repeats(repeats: int) -> None:
    """An in-process warm run is one sequence: a second repeat would draft the reported prompts' own answers."""
    if repeats != 1:
        raise ConfigError(
            "--warm runs one sequence with one memory: --repeats would send its reported prompts again, to draft "
            "their own earlier answers. Drop --repeats (a longer sequence: --requests N)"
        )


def warm_up(contenders: Sequence[Contender | ReferenceContender], prompt_ids: list[int]) -> None:
    """One-off costs (allocator, thread pool, lazy imports, caches) must hit no measurement: a short request
    under every contender, from the end of the first prompt (a long prefill would warm nothing more)."""
    first = prompt_ids[-16:]
    for c in contenders:
        c.start(first, SamplingParams(seed=0), StopConfig(max_tokens=4, ignore_eos=True), namespace=WARMUP).result()
    # Forgotten only once every contender has run: each holds its target cache (its prompt cache keeps the
    # sequence) while the next warms up, so a runtime makes a cache per contender here (making a llama.cpp
    # context is not free) and the measured requests find them made.
    for c in contenders:
        c.forget(WARMUP)  # its output is the first prompt's own continuation: no measured request drafts it


def prime(
    learning: list[Contender],
    prefix: list[WorkItem],
    ids: dict[str, list[int]],
    sampling: SamplingParams,
    max_tokens: int | None,
    ignore_eos: bool,
    tick: Callable[[], None] = lambda: None,
) -> None:
    """A warm run's prefix, untimed and unreported, under every contender that learns across requests (the
    speculative ones: plain decoding keeps no memory), each request under each in the balanced order, in the
    SERVER namespace. Request i's seed: request_sampling(sampling, i, PREFIX_REPEAT). Then their prompt caches
    are emptied (not their proposers' memory), so the first reported request prefills alike for every contender."""
    if not learning:
        return
    for index, item in enumerate(prefix):
        stop = stop_for(item, max_tokens, ignore_eos)
        for c in balanced_order(learning, index):
            c.start(ids[item.id], request_sampling(sampling, index, PREFIX_REPEAT), stop, namespace=SERVER).result()
            tick()
    for c in learning:
        c.engine.prompt_cache.clear()


def stop_for(item: WorkItem, max_tokens: int | None, ignore_eos: bool) -> StopConfig:
    return StopConfig(max_tokens=item.max_tokens_under(max_tokens), ignore_eos=ignore_eos)


def balanced_order(contenders: Sequence[T], round_: int) -> list[T]:
    """The order contenders run in for one prompt: row `round_` (cyclically) of a Williams design.

    Over any run of consecutive rounds as long as the design (len(contenders) rows, twice that for an odd
    count), every contender runs in every position equally often AND, within a round, right after every
    other contender equally often. Rotating one fixed order covers the positions but not the neighbours:
    each contender would always follow the same one, so whatever a request might leave behind for the
    next would fall on one contender only (scripts/experiments/carryover.py looked for such a carry-over in
    the docs runs and found none beyond this host's noise; the design rules it out instead of hoping).
    Williams (1949): first row 0, 1, n-1, 2, n-2, ..., each next row adds 1 modulo n; for odd n the
    mirrored rows follow."""
    n = len(contenders)
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(j + i) % n for j in first] for i in range(n)]
    if n % 2:
        rows += [row[::-1] for row in rows]
    return [contenders[j] for j in rows[round_ % len(rows)]]


def identity_on_own_runtime(results: list[RequestResult], contenders: Sequence[Contender | ReferenceContender]) -> None:
    """A speculative contender is lossless against spekula's plain decoding on ITS runtime (runtimes
    round differently): `identical` compares it with plain decoding on the run's runtime, or, with
    backend=, with the run's plain contender on that runtime where there is one, whatever the baseline
    (llama-cpp-python's loop is not a speculative contender's reference for losslessness). Plain
    contenders compare with the baseline; speed always compares with the baseline."""

    def runtime(c: Contender | ReferenceContender) -> tuple[str | None, bool | None]:
        return c.choice.backend, c.choice.exact

    plain_on: dict[tuple[str | None, bool | None], str] = {(None, None): PLAIN}
    for c in contenders:
        if c.plain and runtime(c) != (None, None) and c.choice.loop == SPEKULA_LOOP:
            plain_on.setdefault(runtime(c), c.name)
    base_of = {c.name: plain_on.get(runtime(c)) for c in contenders if not c.plain}
    by_key: dict[tuple[str | None, str, int], RequestResult] = {
        (r.config, r.prompt_id, r.repeat): r for r in results if r.ok
    }
    for r in results:
        b = by_key.get((base_of.get(r.config), r.prompt_id, r.repeat))
        if b is not None and r.ok and r.token_ids is not None and b.token_ids is not None:
            r.identical = r.token_ids == b.token_ids


def measure(
    c: Contender | ReferenceContender,
    item: WorkItem,
    prompt_ids: list[int],
    sampling: SamplingParams,
    stop: StopConfig,
    rss: PeakRss | None = None,
    namespace: str = "",
) -> RequestResult:
    if rss is not None:
        rss.reset()
    cpu0 = time.process_time()
    done = c.start(prompt_ids, sampling, stop, namespace=namespace).result()
    cpu = time.process_time() - cpu0
    return RequestResult(
        prompt_id=item.id,
        category=item.category,
        config=c.name,
        stats=done.stats,
        text=done.text,
        token_ids=list(done.token_ids),
        cpu_s=cpu,
        peak_rss_bytes=rss.peak() if rss is not None else None,
    )


def render_tokens(
    c: Contender, codec: Any, prompt_ids: list[int], sampling: SamplingParams, stop: StopConfig, namespace: str = RENDER
) -> list[dict[str, Any]]:
    """Run once more with a step trace (untimed) and return the output token by token, each with its
    kind: 'accepted' (drafted and kept), or 'recovered' / 'bonus' / 'plain' (made by the target)."""
    trace = ListTrace()
    done = c.start(prompt_ids, sampling, stop, recorder=trace, namespace=namespace).result()
    c.forget(namespace)
    detok = IncrementalDetokenizer(codec, prompt_ids)
    tokens: list[dict[str, Any]] = []
    for step in trace.steps:
        kinds = ["accepted"] * step.accepted + [step.next_kind]
        probs = [(d.p, d.q) for d in step.drafted[: step.accepted]] + [(step.next_p, None)]
        for token, kind, (p, q) in zip(step.emitted, kinds, probs, strict=False):
            tokens.append(
                {"token": token, "text": detok.feed([token]), "kind": kind, "step": step.step, "p": p, "q": q}
            )
    if tokens:
        tokens[-1]["text"] += detok.flush()
    if [t["token"] for t in tokens] != done.token_ids:  # a stop string cut the text: keep what was emitted
        tokens = tokens[: len(done.token_ids)]
    return tokens
