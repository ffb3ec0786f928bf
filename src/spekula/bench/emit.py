"""`spekula tune --emit ENGINE`: what tune found, written as another engine's own speculative configuration.

Past one machine users move to vLLM or SGLang (GPU servers) or llama.cpp's llama-server. Each has its
own names for the same few choices (who drafts, how many tokens, n-gram window, a draft model), and
none has all of spekula's: where an engine has no equivalent, the emission says so in a note and
writes no key for it; it never guesses a name. Every name used here is in the engine's documentation
or source, cited next to the mapping (and checked against an independent table in
tests/bench/test_emit.py).

Two choices have no fixed counterpart anywhere:
- k = auto: spekula's controller picks k per step. vLLM, SGLang and llama-server draft a fixed number
  of tokens per step, so the emission uses the k the controller chose most often on the tuning run
  (the `steps_by_k` of tune.json), or, without that record, the ceiling k_max (and says so). Suffix
  decoding is the exception: there the engines' own count is a ceiling and the draft length adapts,
  as spekula's does, so k_max is the faithful value.
- draft_confidence (a draft model stops at a token it gives < P): llama-server's --spec-draft-p-min
  is the same rule; vLLM and SGLang have none (noted).
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from spekula.config import SpecConfig, SuffixOptions
from spekula.errors import ConfigError
from spekula.knobs import is_int
from spekula.options import read_json_object

VLLM = "vllm"
SGLANG = "sglang"
LLAMA_SERVER = "llama-server"
ENGINES = (VLLM, SGLANG, LLAMA_SERVER)
SPEC, SUFFIX_OPTIONS = SpecConfig(), SuffixOptions()  # declared defaults: for a key a config lacks; tune's suffix

# Where each engine documents the names used below (read for this module; the test repeats them).
SOURCES = {
    VLLM: (
        "vllm-project/vllm: vllm/config/speculative.py (class SpeculativeConfig: method, model, "
        "num_speculative_tokens, prompt_lookup_min/max, suffix_decoding_*), "
        "docs/features/speculative_decoding/{n_gram,suffix,draft_model}.md (`vllm serve ... --speculative-config`)"
    ),
    SGLANG: (
        "sgl-project/sglang: docs/advanced_features/speculative_decoding.md (Full Parameter Reference: "
        "--speculative-algorithm NGRAM|STANDALONE, --speculative-num-draft-tokens, --speculative-num-steps, "
        "--speculative-eagle-topk, --speculative-draft-model-path, --speculative-ngram-*-match-window-size), "
        "docs/advanced_features/suffix_decoding.md (--speculative-algorithm SUFFIX, --speculative-suffix-*)"
    ),
    LLAMA_SERVER: (
        "ggml-org/llama.cpp: docs/speculative.md (--spec-type ngram-simple / ngram-mod / draft types) and "
        "`llama-server --help` of current builds (common/arg.cpp): -md/--model-draft, --spec-type, "
        "--spec-draft-n-max, --spec-draft-p-min, --spec-ngram-simple-size-n/-size-m; the older --draft-max / "
        "--draft-min / --spec-ngram-size-n are refused there ('the argument has been removed')"
    ),
}


@dataclass(frozen=True)
class Emission:
    """One engine's speculative configuration.

    options: vLLM: the `speculative_config` object; SGLang and llama-server: flag -> value, in order.
    Empty when the engine should run without speculation (plain decoding won, or it has no equivalent:
    see notes)."""

    engine: str
    options: dict[str, Any]
    notes: tuple[str, ...]
    model: str  # the target as spekula knew it (a GGUF path for catalogue models)
    draft_model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # what the emission was made from (k used, k source)

    def command(self) -> str:
        """A command line that starts the engine with this configuration."""
        if self.engine == VLLM:
            spec = ["--speculative-config", json.dumps(self.options)] if self.options else []
            return shlex.join(["vllm", "serve", self.model, *spec])
        argv = [self.model_flag(), self.model]
        for flag, value in self.options.items():
            argv += [flag] if value is None else [flag, str(value)]
        head = ["python", "-m", "sglang.launch_server"] if self.engine == SGLANG else ["llama-server"]
        return shlex.join(head + argv)

    def model_flag(self) -> str:
        return "--model-path" if self.engine == SGLANG else "-m"

    def text(self) -> str:
        """Notes as shell comments, then the command: a file one can read and run."""
        lines = [f"# {self.engine}: speculative configuration from `spekula tune` (names: {SOURCES[self.engine]})"]
        lines += [f"# note: {n}" for n in self.notes]
        lines.append(self.command())
        return "\n".join(lines) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "options": self.options,
            "notes": list(self.notes),
            "command": self.command(),
            **self.extra,
        }


def parse_engines(text: str) -> list[str]:
    """'vllm,sglang' -> ['vllm', 'sglang']; 'all' -> every engine."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return list(ENGINES)
    unknown = [n for n in names if n not in ENGINES]
    if unknown or not names:
        raise ConfigError(f"--emit takes {', '.join(ENGINES)} (comma-separated) or all; got {text!r}")
    return list(dict.fromkeys(names))


def model_ref(name: str | None) -> str | None:
    """A catalogue name as the GGUF file it is assembled into (what another engine can open); a path as given."""
    from spekula.models import CATALOGUE
    from spekula.models.cache import gguf_dir

    if name is not None and name in CATALOGUE:
        return str(gguf_dir() / CATALOGUE[name].gguf_file)
    return name


def emit(engine: str, config: Mapping[str, Any], steps_by_k: Mapping[Any, int] | None = None) -> Emission:
    """`config`: a tuned configuration (spekula.bench.tune.tuned_config, or the file it was written to);
    steps_by_k: how many steps the recommended configuration's controller drafted each k on the tuning
    run (tune.json), used for k = auto."""
    from spekula.proposers import NGRAM, NONE, SUFFIX

    if engine not in ENGINES:
        raise ConfigError(f"unknown engine {engine!r}; choose one of {', '.join(ENGINES)}")
    draft = config.get("draft") or NONE
    k = config.get("k")
    model = model_ref(config.get("target")) or "MODEL"
    notes: list[str] = []
    if engine in (VLLM, SGLANG) and model.lower().endswith(".gguf"):
        notes.append(
            f"{engine} serves Hugging Face checkpoints best (GGUF support is partial there): point it at the same "
            "model's checkpoint, and a draft at one that keeps the target's vocabulary"
        )
    if config.get("temperature", 0) or config.get("top_p", 1.0) != 1.0 or config.get("top_k", 0):
        notes.append("sampling (temperature, top_p, top_k, min_p) is sent with each request, not set on the server")
    if draft == NONE or k == 0:
        notes.append(
            "tune recommended plain decoding: no speculative configuration beat it on this workload, so run the "
            "engine without one (and tune again on the deployment's hardware: the costs there differ)"
        )
        return Emission(engine, {}, tuple(notes), model)
    k_max = int(config.get("k_max") or SPEC.k_max)
    if draft == SUFFIX:
        return _suffix(engine, model, k, k_max, notes)
    n, how = _fixed_k(k, k_max, steps_by_k)
    if how != "fixed":
        notes.append(how)
    extra = {"num_tokens": n}
    if draft == NGRAM:
        return Emission(engine, _ngram(engine, n, config, notes), tuple(notes), model, extra=extra)
    draft_model = model_ref(draft)
    options = _draft_model(engine, n, draft_model, config.get("draft_confidence"), notes)
    return Emission(engine, options, tuple(notes), model, draft_model, extra)


def _fixed_k(k: Any, k_max: int, steps_by_k: Mapping[Any, int] | None) -> tuple[int, str]:
    """The fixed number of drafted tokens an engine gets for spekula's k, and how it was chosen."""
    if is_int(k):
        return k, "fixed"
    counts = {int(kk): n for kk, n in (steps_by_k or {}).items() if int(kk) > 0 and n > 0}
    if counts:
        best = max(counts, key=lambda kk: (counts[kk], kk))
        seen = ", ".join(f"k={kk}: {counts[kk]}" for kk in sorted(counts))
        return best, (
            f"spekula's k=auto chose k step by step (steps that drafted: {seen}); this engine drafts a fixed "
            f"number of tokens, so it gets the k chosen most often, {best}"
        )
    return k_max, (
        f"spekula's k=auto chose k step by step and this record does not say which k it chose (emit from tune.json "
        f"for that, or tune with fixed --ks): the ceiling k_max={k_max} is used"
    )


def _ngram(engine: str, n: int, config: Mapping[str, Any], notes: list[str]) -> dict[str, Any]:
    lo, hi = int(config.get("ngram_min") or SPEC.ngram_min), int(config.get("ngram_max") or SPEC.ngram_max)
    if engine == VLLM:
        # vllm/config/speculative.py: method "ngram", num_speculative_tokens, prompt_lookup_max / _min (the
        # same rule as spekula's: the longest suffix of the context, between min and max tokens, found earlier)
        return {"method": "ngram", "num_speculative_tokens": n, "prompt_lookup_max": hi, "prompt_lookup_min": lo}
    if engine == SGLANG:
        # speculative_decoding.md, Ngram-specific parameters. SGLang's --speculative-num-draft-tokens counts the
        # draft tree's root, the last verified token (NGRAMWorker verifies draft_token_num rows per request), so
        # k drafted tokens are k + 1.
        notes.append(
            "SGLang's NGRAM drafts from a cache of earlier tokens as a tree of up to "
            "--speculative-ngram-max-bfs-breadth branches (default 10); spekula measured one chain. Add "
            "--speculative-ngram-max-bfs-breadth 1 to run what was measured. NGRAM is CUDA-only"
        )
        return {
            "--speculative-algorithm": "NGRAM",
            "--speculative-num-draft-tokens": n + 1,
            "--speculative-ngram-min-match-window-size": lo,
            "--speculative-ngram-max-match-window-size": hi,
        }
    # llama-server --spec-type ngram-simple (docs/speculative.md: the last n-gram of size N found earlier in the
    # history, the M tokens that followed it drafted). It matches one size only, so N is spekula's longest.
    if lo != hi:
        notes.append(
            f"llama-server's ngram-simple matches one n-gram size; spekula matched {lo} to {hi} tokens, longest "
            f"first: --spec-ngram-simple-size-n is set to {hi}"
        )
    return {"--spec-type": "ngram-simple", "--spec-ngram-simple-size-n": hi, "--spec-ngram-simple-size-m": n}


def _suffix(engine: str, model: str, k: Any, k_max: int, notes: list[str]) -> Emission:
    """Suffix decoding with tune's suffix options (the declared defaults: tune measures suffix with them)."""
    s = SUFFIX_OPTIONS
    n = k if is_int(k) else k_max
    if not is_int(k):
        notes.append(
            f"spekula's k=auto adapts the draft length per step up to k_max={k_max}; this engine's count is the same "
            "kind of ceiling for suffix decoding"
        )
    if engine == LLAMA_SERVER:
        notes.append(
            "llama-server has no suffix decoding (its --spec-type offers draft models and n-gram lookups only): "
            "nothing is emitted. Its ngram-mod (a hash pool shared by all slots) is the nearest kind; tune "
            "--drafts ngram measures spekula's n-gram lookup, which maps to ngram-simple"
        )
        return Emission(engine, {}, tuple(notes), model, extra={"num_tokens": None})
    notes.append(
        f"the cross-request cache is bounded by requests ({s.cache_entries}) in {engine}, not also by bytes as in "
        f"spekula, and is shared by all clients (spekula keeps one per API key)"
    )
    notes.append(
        f"spekula starts a draft only where every occurrence of the match agrees on its first token; {engine}'s "
        f"min_token_prob ({s.min_token_prob}) is its only bar, from the first token on, so it drafts split matches too"
    )
    if engine == VLLM:
        # vllm/config/speculative.py, "Suffix decoding configuration"; suffix.md: num_speculative_tokens is the
        # maximum for suffix decoding
        return Emission(
            engine,
            {
                "method": "suffix",
                "num_speculative_tokens": n,
                "suffix_decoding_max_tree_depth": s.max_depth,
                "suffix_decoding_max_cached_requests": s.cache_entries,
                "suffix_decoding_max_spec_factor": s.spec_factor,
                "suffix_decoding_min_token_prob": s.min_token_prob,
            },
            tuple(notes),
            model,
            extra={"num_tokens": n},
        )
    # suffix_decoding.md (--speculative-num-draft-tokens: the maximum number of speculative tokens; its suffix
    # worker reuses NGRAMWorker's tree verification, whose row count includes the root: k + 1)
    notes.append("SGLang's SUFFIX needs arctic-inference and CUDA")
    return Emission(
        engine,
        {
            "--speculative-algorithm": "SUFFIX",
            "--speculative-num-draft-tokens": n + 1,
            "--speculative-suffix-max-tree-depth": s.max_depth,
            "--speculative-suffix-max-cached-requests": s.cache_entries,
            "--speculative-suffix-max-spec-factor": s.spec_factor,
            "--speculative-suffix-min-token-prob": s.min_token_prob,
        },
        tuple(notes),
        model,
        extra={"num_tokens": n},
    )


def _draft_model(engine: str, n: int, draft: str | None, confidence: Any, notes: list[str]) -> dict[str, Any]:
    if engine == VLLM:
        # draft_model.md: {"model": ..., "num_speculative_tokens": ..., "method": "draft_model"}
        if confidence is not None:
            notes.append(
                f"vLLM's draft_model has no confidence stop (spekula measured draft_confidence={confidence}): "
                "it drafts num_speculative_tokens every step"
            )
        return {"method": "draft_model", "model": draft, "num_speculative_tokens": n}
    if engine == SGLANG:
        # speculative_decoding.md, Standalone: a small draft LLM, one chain (topk 1), num_steps deep; with topk 1
        # the draft tokens are num_steps + 1 (the root counted)
        if confidence is not None:
            notes.append(f"SGLang's STANDALONE has no confidence stop (spekula measured draft_confidence={confidence})")
        return {
            "--speculative-algorithm": "STANDALONE",
            "--speculative-draft-model-path": draft,
            "--speculative-num-steps": n,
            "--speculative-eagle-topk": 1,
            "--speculative-num-draft-tokens": n + 1,
        }
    # llama-server: current builds gate every method behind --spec-type; draft-simple is a draft model drafting
    # greedily, stopping at a token below --spec-draft-p-min (spekula's draft_confidence rule; 0 = never stop,
    # as spekula drafts without one)
    return {
        "--spec-type": "draft-simple",
        "--model-draft": draft,
        "--spec-draft-n-max": n,
        "--spec-draft-p-min": confidence if confidence is not None else 0.0,
    }


def emit_all(engines: list[str], config: Mapping[str, Any], steps_by_k: Mapping[Any, int] | None = None):
    return [emit(e, config, steps_by_k) for e in engines]


def read_tuned(path: str) -> tuple[dict[str, Any], dict[Any, int] | None]:
    """A tuned config file (tuned-config.json) or tune.json (which also records the k the controller chose)."""
    data = read_json_object(
        path, "--from-config", f"--from-config {path}: expected a JSON object (tuned-config.json or tune.json)"
    )
    if data.get("kind") == "spekula-tune":
        config = data.get("config") or {}
        row: dict[str, Any] = next((r for r in data.get("table", []) if r.get("name") == data.get("recommended")), {})
        return config, row.get("steps_by_k")
    if "draft" not in data:
        raise ConfigError(f"--from-config {path}: not a tuned configuration (no 'draft'); give tuned-config.json")
    return data, None
