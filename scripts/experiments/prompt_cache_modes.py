"""What the history-exact prompt cache costs, in process: the llama-server comparison's own sequence of the built-in
suite (its sets A, W and B, scripts/llama_server_compare.py's split_suite, seed 0; 96 tokens each, default drafting)
through one pipeline per mode, a fresh one each, one mode after another:

- exact: the default (PromptCache._reusable: only rows a fresh prefill of the prompt computes alike; the assistant's
  messages in a prompt's history prefilled as a step's rows, decision 0019);
- unmarked: the same without the chat template's markers (decision 0018's rule before 0019: a next turn prefills its
  last answer again);
- narrow: every prompt prefilled in passes of the exact width (17 rows on the project's build), so that every row is
  one kind and every kept row can be reused: the prompt cache then takes every shared row (a way not taken, decision
  0018; patched in here, not an option of the engine);
- any: `--prompt-cache-any-rows` (every shared row, as llama-server's cache_prompt).

Prints per phase (set A = cold, set B = warm; the warm-up set W not reported) and category the seconds of its requests
summed, their first tokens' seconds summed, and how many texts equal the exact mode's:

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python scripts/experiments/prompt_cache_modes.py [MODES...]

docs/decisions/0018-history-exact-prompt-cache.md, "Not taken", and 0019 have what it gave.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import spekula.backends.llamacpp as llamacpp
from spekula.bench.workloads import BUILTIN, load_workload
from spekula.cli import build_parser
from spekula.config import SamplingParams, StopConfig
from spekula.options import backend_from_args, draft_backend_from_args, spec_from_args
from spekula.pipeline import Pipeline

MODES = ("exact", "unmarked", "narrow", "any")
COMPARE = Path(__file__).resolve().parents[1] / "llama_server_compare.py"


def split_suite():
    spec = importlib.util.spec_from_file_location("llama_server_compare", COMPARE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.split_suite(load_workload(BUILTIN), 0)


def run(mode: str, sets: dict) -> dict[tuple[str, str], tuple[str, float, float, list[int]]]:
    """(phase, id) -> (category, seconds, seconds to the first token, tokens) for one mode."""
    pieces = llamacpp._prefill_pieces
    if mode == "narrow":
        llamacpp._prefill_pieces = lambda rows, width, least: llamacpp._pieces(rows, llamacpp.EXACT_WIDTHS[0])
    try:
        flags = ["--prompt-cache-any-rows"] if mode == "any" else []
        args = build_parser().parse_args(["generate", "--target", "qwen2.5-coder-1.5b", *flags])
        pipe = Pipeline.load(
            args.target, args.draft, spec_from_args(args), backend_from_args(args), draft_backend_from_args(args)
        )
        if mode == "unmarked":
            for engine in (pipe.engine, pipe.plain_engine):
                engine.prompt_cache.markers = None
        if mode == "narrow":  # every row one kind: any shared row is a fresh prefill's, and any chunk will do
            target = pipe.target
            assert target.exact_width == llamacpp.EXACT_WIDTHS[0], "the narrow mode needs the widest exact block"
            target.capabilities = replace(target.capabilities, pass_kind_widths=(), prefill_min_rows=1)
        out = {}
        for phase, name in (("cold", "A"), ("warmup", "W"), ("warm", "B")):
            for item in sets[name]:
                ids = item.encode(pipe.codec, chat=True)
                began = time.perf_counter()
                result = pipe.generate(ids, SamplingParams(), StopConfig(max_tokens=96))
                seconds = time.perf_counter() - began
                out[phase, item.id] = (item.category, seconds, result.stats.ttft_s or 0.0, result.token_ids)
        return out
    finally:
        llamacpp._prefill_pieces = pieces


def main() -> None:
    modes = sys.argv[1:] or list(MODES)
    if "exact" not in modes or set(modes) - set(MODES):
        raise SystemExit(f"modes: some of {', '.join(MODES)}, exact among them (texts are compared with it)")
    sets = split_suite()
    runs = {mode: run(mode, sets) for mode in modes}
    exact = runs["exact"]
    groups = defaultdict(list)
    for phase, item_id in exact:
        if phase != "warmup":
            groups[phase, exact[phase, item_id][0]].append((phase, item_id))
            groups[phase, "all"].append((phase, item_id))
    print("phase, category, requests | seconds | first-token seconds | texts as exact's, per mode: " + ", ".join(modes))
    for (phase, category), keys in sorted(groups.items()):
        seconds = " ".join(f"{sum(runs[m][k][1] for k in keys):6.1f}" for m in modes)
        ttft = " ".join(f"{sum(runs[m][k][2] for k in keys):5.2f}" for m in modes)
        same = " ".join(f"{sum(runs[m][k][3] == exact[k][3] for k in keys)}/{len(keys)}" for m in modes)
        print(f"{phase} {category} {len(keys)} | {seconds} | {ttft} | {same}")


if __name__ == "__main__":
    main()
