"""GPU numbers: tokens per second of plain vs speculative greedy decoding on the native backend.

The Qwen pair (qwen2.5-coder-0.5b drafts for qwen2.5-coder-1.5b) in bf16 on the native backend,
run eagerly (no torch.compile, no CUDA graphs: the native runner has no static-shape mode).
Installs and downloads nothing.

Weights: the catalogue's when they are already in the spekula cache (spekula.models.resolve, which
never fetches); otherwise random weights of the same shapes (RANDOM_SHAPES, from the converted
Qwen2.5 configs), reported as "weights": "random". Random weights cannot draft for each other, so
the target then drafts for itself (self-speculation, α ≈ 1): verification, rollback and
the pass costs are measured all the same, but the speedup is not the pair's (the draft costs as
much as the target). Prompts are the chat-templated PROMPTS where a tokenizer is at hand, else
fixed token ids.

Every request is greedy with ignore_eos, so plain and speculative runs emit the same number of
tokens; tokens per second = output tokens / engine wall time (prefill included) for both alike.
Plain and speculative runs alternate prompt by prompt after one warm-up request on each path.
Prints a card on stderr, then ONE JSON line on stdout.

    scripts/gpu_bench.sh                                       # CUDA, bf16
    scripts/gpu_bench.sh --device cpu --dtype float32 --tiny   # smoke test: tiny random model
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from spekula.backends.native import TORCH_DTYPES, ModelArgs, NativeBackend, Transformer
from spekula.bench.audit import compare_tokens
from spekula.bench.metrics import merge_stats
from spekula.config import BackendConfig, SamplingParams, SpecConfig, StopConfig
from spekula.engine import Engine, Generation
from spekula.errors import SpekulaError
from spekula.pipeline import DEFAULT_DRAFT, DEFAULT_TARGET
from spekula.proposers import build_proposer

SELF = "self"  # --draft self: the target drafts for itself

# The converted catalogue models' config.json, as native_loader.args_from_hf_config reads them.
RANDOM_SHAPES = {
    "qwen2.5-coder-1.5b": ModelArgs(
        vocab_size=151936,
        dim=1536,
        n_layers=28,
        n_heads=12,
        n_kv_heads=2,
        head_dim=128,
        hidden_dim=8960,
        norm_eps=1e-6,
        max_seq_len=32768,
        rope_theta=1e6,
        qkv_bias=True,
    ),
    "qwen2.5-coder-0.5b": ModelArgs(
        vocab_size=151936,
        dim=896,
        n_layers=24,
        n_heads=14,
        n_kv_heads=2,
        head_dim=64,
        hidden_dim=4864,
        norm_eps=1e-6,
        max_seq_len=32768,
        rope_theta=1e6,
        qkv_bias=True,
    ),
}
TINY = ModelArgs(
    vocab_size=256,
    dim=64,
    n_layers=2,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    hidden_dim=128,
    norm_eps=1e-6,
    max_seq_len=1024,
    rope_theta=1e6,
    qkv_bias=True,
)

PROMPTS = [
    "Write a Python function `fibonacci(n)` that returns the n-th Fibonacci number iteratively, "
    "with type hints and a docstring.",
    "Write a Python function that reads a CSV file with the csv module and returns a list of dicts, "
    "skipping empty lines.",
    "Add type hints to this function and return only the code:\n\n"
    "def merge(a, b):\n    out = []\n    i = j = 0\n    while i < len(a) and j < len(b):\n"
    "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
    "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n",
    "Write a binary search over a sorted Python list that returns the index of the target or -1, "
    "with tests using assert.",
    "Explain in a short paragraph what a Python generator is, with a small example.",
    "Write a Python class `LRUCache` with get and put in O(1), using collections.OrderedDict.",
    "Write a SQL query that returns the ten customers with the highest total order value in 2023.",
    "Write a bash one-liner that counts the lines of every .py file under the current directory, sorted.",
]


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16", choices=list(TORCH_DTYPES))
    ap.add_argument("--target", default=DEFAULT_TARGET, choices=list(RANDOM_SHAPES))
    ap.add_argument("--draft", default=DEFAULT_DRAFT, help=f"a catalogue name, or {SELF!r}")
    ap.add_argument("--k", type=int, default=4, help="tokens drafted per step")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2, help="timed passes over the prompts")
    ap.add_argument("--random", action="store_true", help="random weights even where real ones are cached")
    ap.add_argument("--tiny", action="store_true", help="a tiny random model (the CPU smoke test)")
    args = ap.parse_args(argv)
    if args.k < 1:
        ap.error("--k must be >= 1")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        log("CUDA is not available here; run with --device cpu --dtype float32 --tiny for the smoke test")
        return 2
    dtype = TORCH_DTYPES[args.dtype]
    config = BackendConfig(dtype=args.dtype, runtime="native")

    start = time.perf_counter()
    names = [args.target] + ([] if args.draft == SELF else [args.draft])
    dirs = None if args.random or args.tiny else cached_dirs(names)
    weights = "random" if dirs is None else "real"
    prompts, prompt_source = None, "token ids"
    if dirs is not None:
        prompts = text_prompts(dirs[0], args.prompts)
        prompt_source = "text (chat template)" if prompts else prompt_source
    shapes = TINY if args.tiny else RANDOM_SHAPES[args.target]
    prompts = prompts or id_prompts(shapes.vocab_size, args.prompts)
    cache_len = -(-(max(map(len, prompts)) + args.new_tokens + 2 * (args.k + 1)) // 64) * 64

    target_name = "tiny" if args.tiny else args.target
    if dirs is None:
        model = Transformer.from_state_dict(shapes, random_weights(shapes, dtype, device)).to(device)
        target = NativeBackend(model, target_name, config, max_cache_len=cache_len)
    else:
        target = NativeBackend.load(dirs[0], args.target, config, device=str(device), max_cache_len=cache_len)
    if dirs is None or args.draft == SELF:
        # Same weights, its own caches. layout "rows": the weights are the target's, already laid out.
        draft = NativeBackend(target.model, SELF, config, layout="rows", max_cache_len=cache_len)
        draft_label = SELF + (" (random weights)" if dirs is None else "")
    else:
        draft = NativeBackend.load(dirs[1], args.draft, config, device=str(device), max_cache_len=cache_len)
        draft_label = args.draft
    spec_config = SpecConfig(k=args.k)
    plain_engine = Engine(target)
    proposer = build_proposer(draft.name, spec_config, target=target, load_draft=lambda _: draft)
    spec_engine = Engine(target, proposer, spec_config)
    load_s = time.perf_counter() - start
    log(f"{target_name} <- {draft_label}, {weights} weights, {args.dtype} on {device}; loaded in {load_s:.1f} s")

    stop = StopConfig(max_tokens=args.new_tokens, ignore_eos=True)

    def run(engine: Engine, ids: list[int]) -> Generation:
        return engine.generate(ids, SamplingParams(), stop).run()

    start = time.perf_counter()
    for engine in (plain_engine, spec_engine):
        run(engine, prompts[0])
    warmup_s = time.perf_counter() - start
    log(f"warm-up: {warmup_s:.1f} s")

    plain_runs, spec_runs = [], []
    for repeat in range(args.repeats):
        for i, ids in enumerate(prompts):
            if (repeat + i) % 2 == 0:  # alternate which path goes first
                plain, spec = run(plain_engine, ids), run(spec_engine, ids)
            else:
                spec, plain = run(spec_engine, ids), run(plain_engine, ids)
            plain_runs.append(plain)
            spec_runs.append(spec)
            log(
                f"prompt {i} repeat {repeat}: plain {plain.stats.tokens_per_s:7.1f} tok/s, "
                f"spec {spec.stats.tokens_per_s:7.1f} tok/s, alpha {_round(spec.stats.alpha, 2)}, "
                f"identical {spec.token_ids == plain.token_ids}"
            )

    # Greedy equality, and where it fails the target's top-2 logit gap there (near 0: bf16 numerics, not a bug).
    cases = [
        compare_tokens("spec", f"prompt {n % len(prompts)}", p.token_ids, s.token_ids, target, p.prompt_ids)
        for n, (p, s) in enumerate(zip(plain_runs, spec_runs, strict=True))
    ]
    plain_stats, spec_stats = merge_stats(g.stats for g in plain_runs), merge_stats(g.stats for g in spec_runs)
    result = {
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "device": str(device),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "dtype": args.dtype,
        "target": target_name,
        "draft": draft_label,
        "weights": weights,
        "k": args.k,
        "prompts": len(prompts),
        "prompt_tokens": [len(p) for p in prompts],
        "prompt_source": prompt_source,
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "plain_tok_s": _round(plain_stats.tokens_per_s),
        "spec_tok_s": _round(spec_stats.tokens_per_s),
        "speedup": _round(spec_stats.tokens_per_s / plain_stats.tokens_per_s),
        "alpha": _round(spec_stats.alpha),
        "tau": _round(spec_stats.tau),
        "greedy_equal": all(c.identical for c in cases),
        "identical": f"{sum(c.identical for c in cases)}/{len(cases)}",
        "divergences": [asdict(c) for c in cases if not c.identical],
        "max_cache_len": cache_len,
        # Engine stage times per pass (host overhead of each stage included).
        "plain_pass_ms": _ms(plain_stats.score_s, plain_stats.target_passes),
        "verify_pass_ms": _ms(spec_stats.score_s, spec_stats.target_passes),
        "draft_token_ms": _ms(spec_stats.draft_s, spec_stats.drafted),
        "load_s": round(load_s, 2),
        "warmup_s": round(warmup_s, 2),
    }
    log(
        f"plain {result['plain_tok_s']} tok/s, speculative {result['spec_tok_s']} tok/s: {result['speedup']}x; "
        f"alpha {result['alpha']}, tau {result['tau']}; greedy equal {result['identical']}"
    )
    print(json.dumps(result), flush=True)
    return 0


def cached_dirs(names: list[str]) -> list[Path] | None:
    """The models' Hugging Face directories if every one is already in the cache; None otherwise."""
    from spekula.models import resolve

    try:
        return [resolve(name).hf_dir for name in names]  # never fetches
    except (SpekulaError, ImportError) as e:
        log(f"real weights not at hand ({str(e).splitlines()[0]}): random weights")
        return None


def text_prompts(hf_dir: Path, n: int) -> list[list[int]] | None:
    try:
        from spekula.text import TextCodec

        codec = TextCodec.load(hf_dir)
    except ImportError:
        return None
    return [codec.encode(PROMPTS[i % len(PROMPTS)], chat=True) for i in range(n)]


def id_prompts(vocab_size: int, n: int) -> list[list[int]]:
    """Fixed token ids, 24 to 24 + 8 (n - 1) of them."""
    return [
        torch.randint(0, min(vocab_size, 32000), (24 + 8 * i,), generator=torch.Generator().manual_seed(i)).tolist()
        for i in range(n)
    ]


def random_weights(args: ModelArgs, dtype: torch.dtype, device: torch.device, seed: int = 0) -> dict[str, torch.Tensor]:
    """A native state dict of the model's shapes: N(0, 0.02) weights and biases (the configs'
    initializer_range), unit norms; made on the device."""
    with torch.device("meta"):
        shapes = {name: t.shape for name, t in Transformer(args).state_dict().items()}
    generator = torch.Generator(device).manual_seed(seed)
    weights = {}
    for name, shape in shapes.items():
        if name.endswith("norm.weight"):
            w = torch.ones(shape, device=device)
        else:
            w = torch.randn(shape, generator=generator, device=device).mul_(0.02)
        weights[name] = w.to(dtype)
    return weights


def _round(x: float | None, digits: int = 3) -> float | None:
    return None if x is None else round(x, digits)


def _ms(seconds: float, count: int) -> float | None:
    return round(1000 * seconds / count, 3) if count else None


if __name__ == "__main__":
    sys.exit(main())
