"""First numbers (issue 2): spekula vs Hugging Face transformers on the same prompts, dtype and target.

For each dtype, one process loads the target and the draft once per runtime and runs, prompt by
prompt and in interleaved order, every configuration below with greedy decoding and the same
max_new_tokens. spekula's target runs in --backend (default native) and its draft in
--draft-backend (default as `spekula generate`: llama.cpp for a built-in draft); the hf rows run
transformers' own generate() on transformers models of the same target and draft:

  spekula plain (k = 0)       - the baseline every speedup is a ratio against
  spekula draft k=K           - the draft model proposes K tokens per step
  spekula draft k=auto        - the cost-model controller chooses k
  spekula ngram k=K           - prompt lookup
  hf plain                    - model.generate(do_sample=False)
  hf assisted                 - model.generate(assistant_model=draft)
  hf prompt-lookup            - model.generate(prompt_lookup_num_tokens=K)

Tokens per second counts generated tokens over the wall time of the whole call (prefill included)
for every configuration alike. Prints a Markdown table (speedups against spekula plain, hf plain
and hf assisted), then one JSON line.

    .venv/bin/python scripts/first_numbers.py --dtype float32 --max-tokens 64
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

from spekula.config import BackendConfig, SamplingParams, SpecConfig, StopConfig
from spekula.engine import Engine
from spekula.pipeline import DEFAULT_DRAFT, DEFAULT_RUNTIME, DEFAULT_TARGET, draft_backend_config, load_model
from spekula.proposers import DraftModelFactory, NgramFactory

PROMPTS = {
    "code/fibonacci": "Write a Python function `fibonacci(n)` that returns the n-th Fibonacci number iteratively, with type hints and a docstring.",
    "code/edit": "Add type hints to this function and return only the code:\n\ndef merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n",
    "prose/explain": "Explain in a short paragraph why the sky is blue.",
    "code/csv": "Write a Python function that reads a CSV file with the csv module and returns a list of dicts, skipping empty lines.",
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default=DEFAULT_TARGET)
    ap.add_argument("--draft", default=DEFAULT_DRAFT)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--backend", default=DEFAULT_RUNTIME, help="spekula's target runtime (default native)")
    ap.add_argument("--draft-backend", default=None, help="spekula's draft runtime (default as `spekula generate`)")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS), help="use the first N prompts")
    args = ap.parse_args()

    prompts = dict(list(PROMPTS.items())[: args.prompts])
    hf_cfg = BackendConfig(dtype=args.dtype, threads=args.threads, runtime="transformers")
    cfg = BackendConfig(dtype=args.dtype, threads=args.threads, runtime=args.backend)
    draft_cfg = draft_backend_config(args.draft, cfg, args.draft_backend)
    hf_target_backend, codec = load_model(args.target, hf_cfg)
    hf_draft_backend, _ = load_model(args.draft, hf_cfg)
    target = hf_target_backend if cfg == hf_cfg else load_model(args.target, cfg)[0]
    draft = hf_draft_backend if draft_cfg == hf_cfg else load_model(args.draft, draft_cfg)[0]
    engines = {
        "spekula plain": Engine(target),
        f"spekula draft k={args.k}": Engine(target, DraftModelFactory(draft), SpecConfig(k=args.k)),
        "spekula draft k=auto": Engine(target, DraftModelFactory(draft), SpecConfig(k=None)),
        f"spekula ngram k={args.k}": Engine(target, NgramFactory(), SpecConfig(k=args.k)),
    }
    hf_target, hf_draft = hf_target_backend.model, hf_draft_backend.model
    hf_target.generation_config.pad_token_id = hf_target.generation_config.eos_token_id
    n = args.max_tokens

    def run_engine(engine, ids):
        g = engine.generate(ids, SamplingParams(), StopConfig(max_tokens=n, ignore_eos=True)).run()
        return g.token_ids, g.stats

    def run_hf(ids, **kw):
        x = torch.tensor([ids])
        out = hf_target.generate(x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=n, min_new_tokens=n, **kw)
        return out[0, len(ids):].tolist(), None

    runners = {name: (lambda ids, e=e: run_engine(e, ids)) for name, e in engines.items()}
    runners["hf plain"] = lambda ids: run_hf(ids)
    runners["hf assisted"] = lambda ids: run_hf(ids, assistant_model=hf_draft)
    runners[f"hf prompt-lookup k={args.k}"] = lambda ids: run_hf(ids, prompt_lookup_num_tokens=args.k)

    warm = codec.encode("def f():")
    for name, run in runners.items():  # warm every path once
        run(warm)
    engines["spekula draft k=auto"].calibrate()

    rows: dict[str, list[dict]] = {name: [] for name in runners}
    for label, prompt in prompts.items():
        ids = codec.encode(prompt, chat=True)
        plain_ids = None
        for name, run in runners.items():
            start = time.perf_counter()
            token_ids, stats = run(ids)
            seconds = time.perf_counter() - start
            if name == "spekula plain":
                plain_ids = token_ids
            rows[name].append({
                "prompt": label, "tokens": len(token_ids), "seconds": seconds, "tokens_per_s": len(token_ids) / seconds,
                "identical_to_plain": token_ids == plain_ids,
                "alpha": stats.alpha if stats else None, "tau": stats.tau if stats else None,
                "k_chosen": stats.k_chosen if stats else None,
            })
            print(f"{label:16s} {name:26s} {len(token_ids) / seconds:6.2f} tok/s", file=sys.stderr, flush=True)

    def per_prompt(name):
        return {r["prompt"]: r["tokens_per_s"] for r in rows[name]}

    baselines = {"spekula plain": per_prompt("spekula plain"), "hf plain": per_prompt("hf plain"), "hf assisted": per_prompt("hf assisted")}
    print(f"\n### {args.target} <- {args.draft}, {args.dtype}, {n} new tokens, greedy; spekula: target {cfg.runtime}, draft {draft_cfg.runtime}\n")
    print("| configuration | " + " | ".join(prompts) + " | mean tok/s | median speedup vs spekula plain | vs hf plain | vs hf assisted | α | τ | identical |")
    print("|---|" + "---|" * (len(prompts) + 7))
    summary = {}
    for name, rs in rows.items():
        ratios = {b: statistics.median(r["tokens_per_s"] / tps[r["prompt"]] for r in rs) for b, tps in baselines.items()}
        speedups = [r["tokens_per_s"] / baselines["spekula plain"][r["prompt"]] for r in rs]
        alphas = [r["alpha"] for r in rs if r["alpha"] is not None]
        taus = [r["tau"] for r in rs if r["tau"] is not None]
        mean_tps = statistics.mean(r["tokens_per_s"] for r in rs)
        summary[name] = {"mean_tokens_per_s": mean_tps, "median_speedup": statistics.median(speedups), "median_ratio_vs": ratios, "rows": rs}
        cells = " | ".join(f"{r['tokens_per_s']:.2f}" for r in rs)
        a = f"{statistics.mean(alphas):.2f}" if alphas else "–"
        t = f"{statistics.mean(taus):.2f}" if taus else "–"
        ident = f"{sum(r['identical_to_plain'] for r in rs)}/{len(rs)}"
        vs = " | ".join(f"{ratios[b]:.2f}x" for b in baselines)
        print(f"| {name} | {cells} | {mean_tps:.2f} | {vs} | {a} | {t} | {ident} |")
    print(json.dumps({"target": args.target, "draft": args.draft, "runtime": cfg.runtime, "draft_runtime": draft_cfg.runtime, "dtype": args.dtype, "max_tokens": n, "threads": torch.get_num_threads(), "results": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
