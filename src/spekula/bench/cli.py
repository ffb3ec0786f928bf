"""`spekula bench | tune | audit`: parse options, load the models, call spekula.bench.commands, print.

Every command prints a human-readable summary and, as the last line of stdout, one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from spekula.extras import require_extra
from spekula.options import (
    add_model_options,
    add_sampling_options,
    backend_from_args,
    parse_k,
    sampling_from_args,
)

SPEC_HELP = (
    "a configuration to measure against plain decoding, as KEY=VALUE pairs: draft=MODEL|ngram|suffix, "
    "k=N (k=2/4/8 measures several), k_max=N (k=auto's longest draft), ngram_max=, ngram_min=, "
    "confidence=P (a draft model stops its draft at a token it gives < P), shadow=on|off (the controller learns "
    "from shadow drafts at a new request's plain steps, default off), backend=native|transformers|llamacpp "
    "(this configuration's target runs on that runtime, loaded once more), exact=on|off (its target loaded "
    "with or without --exact), loop=llama-cpp-python "
    "(llama-cpp-python's own plain decoding of the target's GGUF, not spekula's engine; draft=none implied), "
    "name=LABEL; keys not given take "
    "--draft / --k / --k-max / --ngram-max / --ngram-min / --draft-confidence, and the run's --backend and "
    "--exact. "
    "Repeatable. Default: one configuration from --draft and --k. draft=none,name=LABEL measures plain decoding "
    "again under LABEL: an A/A control that shows this machine's noise"
)


def register(sub: Any) -> dict[str, argparse.ArgumentParser]:
    return {"bench": register_bench(sub), "tune": register_tune(sub), "audit": register_audit(sub)}


# -- options ----------------------------------------------------------------------------------------


def add_workload_options(p: argparse.ArgumentParser, per_category: int | None, max_tokens: int | None) -> None:
    p.add_argument(
        "--workload",
        default="builtin",
        help="JSON Lines file (prompt or messages, optional category, max_tokens), or 'builtin' (default)",
    )
    p.add_argument("--categories", default=None, help="comma-separated categories to keep")
    p.add_argument(
        "--per-category",
        type=int,
        default=per_category,
        help=f"first N prompts of each category (default {per_category or 'all'})",
    )
    p.add_argument("--limit", type=int, default=None, help="at most N prompts in all")
    default = max_tokens if max_tokens is not None else "each prompt's own, else 128"
    p.add_argument(
        "--max-tokens", type=int, default=max_tokens, help=f"cap on each prompt's max_tokens (default {default})"
    )
    p.add_argument(
        "--chat",
        action="store_true",
        help="wrap plain `prompt` lines in the chat template (`messages` lines always are)",
    )


def add_spec_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", action="append", default=[], metavar="SPEC", help=SPEC_HELP)


def add_endpoint_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("endpoints (OpenAI-compatible; instead of loading models)")
    g.add_argument(
        "--endpoint", default=None, metavar="URL", help="measure this endpoint, e.g. http://127.0.0.1:8000/v1"
    )
    g.add_argument(
        "--baseline-endpoint",
        default=None,
        metavar="URL",
        help="and compare it with this one (e.g. the same stack without speculation)",
    )
    g.add_argument("--model", default=None, help="model name to request from --endpoint (default: the first it lists)")
    g.add_argument(
        "--baseline-model",
        default=None,
        help="model name for --baseline-endpoint (default: --model, else the first it lists)",
    )
    g.add_argument("--api-key", default=None, help="bearer token for both endpoints")
    for flag, which in (("--extra-body", "--endpoint"), ("--baseline-extra-body", "--baseline-endpoint")):
        g.add_argument(
            flag,
            type=json_object,
            default=None,
            metavar="JSON",
            help=f"server-specific fields sent with every request to {which}, e.g. '{{\"repeat_penalty\": 1.0}}' "
            "for llama_cpp.server (whose defaults are not plain greedy; docs/BENCH.md)",
        )
    g.add_argument("--concurrency", type=int, default=1, help="requests in flight at once (default 1)")
    g.add_argument(
        "--waves",
        action="store_true",
        help="send requests in waves of --concurrency, each wave once the last one's answers are all in, each "
        "request once the server has answered the headers of the one before (queued it), so that every endpoint "
        "serves the same batches in the same order (default: a new request as soon as one ends, which lets batches "
        "drift apart with each server's speed)",
    )
    g.add_argument(
        "--requests",
        type=int,
        default=None,
        help="requests per endpoint (default: one per prompt; more cycles the prompts); with bench --warm, the "
        "reported requests of the sequence, in-process too (default: until every prompt it holds out is sent)",
    )
    g.add_argument(
        "--time-limit", type=float, default=None, metavar="S", help="start no request after S seconds per endpoint"
    )
    g.add_argument(
        "--request-timeout",
        type=float,
        default=300.0,
        metavar="S",
        help="give up on one request after S seconds (default 300)",
    )


def add_warm_options(p: argparse.ArgumentParser) -> None:
    from spekula.bench.workloads import RESEND, WARM_PREFIX

    g = p.add_argument_group("a warm server (default: cold, every repeat from an empty proposer memory)")
    g.add_argument(
        "--warm",
        type=int,
        nargs="?",
        const=WARM_PREFIX,
        default=None,
        metavar="M",
        help="measure a server that has been running: the workload becomes one long mixed sequence (seeded order, "
        "a session's turns in order, some prompts sent again later) with one proposer memory per configuration; "
        f"its first M requests (default {WARM_PREFIX}) run but are not reported, and the reported prompts are "
        "ones they never sent, except those in the 'resent' category. --requests N: N reported requests. "
        "With --endpoint the prefix goes to each server first, and --repeats cuts the reported part into phases",
    )
    g.add_argument(
        "--resend",
        type=float,
        default=RESEND,
        metavar="P",
        help=f"with --warm: the share of requests that send an earlier prompt again, a line in front "
        f"(default {RESEND})",
    )
    g.add_argument(
        "--shuffle-seed", type=int, default=0, metavar="N", help="with --warm: the seed of the sequence (default 0)"
    )


def add_output_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", default=None, metavar="DIR", help="where results go (default bench-results/<command>-<time>/)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


def register_bench(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "bench",
        help="measure speculative decoding against plain decoding on a workload",
        description="Runs plain decoding and each speculative configuration on every prompt (interleaved), prints a "
        "Markdown summary, writes results.json, report.html and plots to --out, and prints one JSON object "
        "as the last line.",
    )
    add_workload_options(p, per_category=None, max_tokens=None)
    add_spec_options(p)
    add_model_options(p)
    add_sampling_options(p)
    p.add_argument("--ignore-eos", action="store_true", help="generate max_tokens tokens even past end-of-sequence")
    p.add_argument("--repeats", type=int, default=1, help="run the whole workload N times (default 1)")
    p.add_argument("--no-warmup", action="store_true", help="skip the short warm-up request of each configuration")
    p.add_argument(
        "--baseline",
        default="plain",
        metavar="CONFIG",
        help="the configuration every speedup is over, by name (default plain: spekula's plain decoding; e.g. "
        "llama-cpp-python with --spec loop=llama-cpp-python)",
    )
    p.add_argument(
        "--render",
        default=None,
        metavar="PROMPT_ID",
        help="prompt to render token by token in the report (default: a typical one)",
    )
    p.add_argument(
        "--markdown-into",
        default=None,
        metavar="FILE",
        help="also write the summary between the spekula bench markers of FILE (docs/BENCHMARKS.md)",
    )
    add_output_options(p)
    add_endpoint_options(p)
    add_warm_options(p)
    p.add_argument(
        "--salt",
        action="store_true",
        help="with --endpoint: begin every prompt with a line naming this run and phase, so that no server answers "
        "from what it cached of an earlier run or phase (both endpoints get the same prompts in a phase)",
    )
    p.set_defaults(func=cmd_bench)
    return p


def register_tune(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "tune",
        help="find the fastest proposer and k for a workload (or plain decoding)",
        description="Measures every proposer x k on a sample of the workload, prints a table, recommends the "
        "configuration with the best throughput (plain decoding when none beats it by --min-speedup) "
        "and writes it as a config file for `spekula generate --config`.",
    )
    add_workload_options(p, per_category=None, max_tokens=64)
    _add_sweep_options(p)
    add_spec_options(p)
    add_model_options(p)
    add_sampling_options(p)
    p.add_argument(
        "--min-speedup",
        type=float,
        default=1.05,
        help="recommend speculation only at this throughput ratio or above (default 1.05)",
    )
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument(
        "--write-config",
        default=None,
        metavar="FILE",
        help="where to write the chosen configuration (default <out>/tuned-config.json)",
    )
    p.add_argument(
        "--backends",
        default=None,
        metavar="RUNTIMES",
        help="comma-separated runtimes to sweep, e.g. llamacpp,native: plain decoding and every configuration on "
        "each, against plain decoding on the run's runtime (--backend). Default: the run's runtime only (on a CPU "
        "the native fp32 runtime is several times slower per pass than llama.cpp: docs/BENCHMARKS.md, Packed fp32)",
    )
    _add_emit_options(p)
    add_output_options(p)
    p.set_defaults(func=cmd_tune)
    return p


def _add_sweep_options(p: argparse.ArgumentParser) -> None:
    """tune's sample of the workload and the proposers x k it sweeps."""
    p.add_argument(
        "--sample", type=int, default=8, help="prompts drawn (seeded) from the workload (default 8; 0 = all)"
    )
    p.add_argument("--sample-seed", type=int, default=0)
    p.add_argument(
        "--drafts",
        default=None,
        help="comma-separated proposers to sweep: draft models and/or ngram (default: --draft and ngram)",
    )
    p.add_argument(
        "--ks", default="2,4,8", help="comma-separated k values to sweep, 'auto' included if you like (default 2,4,8)"
    )


def _add_emit_options(p: argparse.ArgumentParser) -> None:
    """tune's --emit: the recommendation as another engine's configuration, from this sweep or an earlier one."""
    p.add_argument(
        "--emit",
        default=None,
        metavar="ENGINES",
        help="also write the recommendation as another engine's own speculative configuration: vllm "
        "(--speculative-config JSON), sglang (--speculative-* flags), llama-server (--spec-* flags); "
        "comma-separated, or all. Written to <out>/emit-<engine>.sh and printed, with a note wherever the engine "
        "has no equivalent",
    )
    p.add_argument(
        "--from-config",
        default=None,
        metavar="FILE",
        help="with --emit: emit from an earlier tune's tuned-config.json or tune.json instead of sweeping "
        "(tune.json also records the k that k=auto chose)",
    )


def register_audit(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "audit",
        help="check that speculative decoding is lossless on your models and prompts",
        description="Greedy equality of every speculative configuration with plain decoding over the workload (each "
        "difference with the target's top-2 logit gap there), and chi-square tests of the sampled distribution "
        "against the target's exact probabilities. Each test counts the samples whose token went through a "
        "verified draft (accepted, or rejected and recovered): a configuration whose samples did so less than "
        "--min-drafted of the time fails as VACUOUS, since it did not test the verifier; a k=auto configuration "
        "is sampled at --dist-k. Exit status 0 = pass, 1 = fail.",
    )
    add_workload_options(p, per_category=2, max_tokens=32)
    add_spec_options(p)
    add_model_options(p)
    add_sampling_options(p)
    p.add_argument(
        "--samples", type=int, default=200, help="samples per prompt for the distribution test (default 200)"
    )
    p.add_argument("--positions", type=int, default=3, help="output positions tested per prompt (default 3)")
    p.add_argument(
        "--dist-prompts",
        type=int,
        default=2,
        help="prompts (the shortest) for the distribution test; 0 skips it (default 2)",
    )
    p.add_argument(
        "--level", type=float, default=0.01, help="false-failure rate of the whole distribution test (default 0.01)"
    )
    p.add_argument(
        "--dist-k",
        type=int,
        default=None,
        help="the fixed k a k=auto configuration drafts in the distribution test (capped at its k_max): k=auto "
        "follows measured timings and may not draft at all, which would test nothing (default 4: "
        "spekula.bench.audit.DIST_K)",
    )
    p.add_argument(
        "--min-drafted",
        type=float,
        default=None,
        metavar="SHARE",
        help="the distribution test of a configuration fails as VACUOUS when less than this share of its tested "
        "samples went through a verified draft (accepted or rejected): a verifier's bug would then move its "
        "counts too little to be seen (default 0.25: spekula.bench.audit.MIN_DRAFTED)",
    )
    add_output_options(p)
    add_endpoint_options(p)
    p.set_defaults(func=cmd_audit)
    return p


# -- shared -----------------------------------------------------------------------------------------


def items_from_args(args: argparse.Namespace, sample: int | None = None, sample_seed: int = 0):
    from spekula.bench.workloads import load_workload, select

    items = load_workload(args.workload)
    cats = [c.strip() for c in args.categories.split(",") if c.strip()] if args.categories else None
    return select(
        items, categories_wanted=cats, per_category=args.per_category, limit=args.limit, sample=sample, seed=sample_seed
    )


def warm_from_args(args: argparse.Namespace, items: list):
    """The warm server's sequence (bench --warm), or None for a cold run; refuses options that shape nothing."""
    from spekula.bench.runner import check_warm_repeats
    from spekula.bench.workloads import RESEND, server_sequence
    from spekula.errors import ConfigError

    if args.warm is None:
        if args.requests is not None and not args.endpoint:
            raise ConfigError(
                "--requests sets how many requests an --endpoint run or a --warm sequence sends; an in-process run "
                "sends every prompt once per repeat. Add --warm, or drop --requests"
            )
        if args.resend != RESEND or args.shuffle_seed:
            raise ConfigError("--resend and --shuffle-seed shape a --warm sequence: add --warm, or drop them")
        return None
    if not args.endpoint:
        check_warm_repeats(args.repeats)
    return server_sequence(items, args.warm, args.requests, seed=args.shuffle_seed, resend=args.resend)


def choices_from_args(args: argparse.Namespace) -> list:
    from spekula.bench.runner import choice_with_defaults, parse_spec

    if args.spec:
        return [
            c
            for text in args.spec
            for c in parse_spec(
                text, args.draft, args.k, args.ngram_max, args.ngram_min, args.draft_confidence, args.k_max
            )
        ]
    return [
        choice_with_defaults(
            args.draft, args.k, args.ngram_max, args.ngram_min, args.draft_confidence, k_max=args.k_max
        )
    ]


def default_config_name(args: argparse.Namespace, choices: list) -> str | None:
    """The name of the configuration in `choices` that `spekula generate` runs without options on this target:
    its runtime's default proposer, k=auto and its defaults, on the default runtime with BackendConfig's default
    exact; None when no choice is it."""
    from dataclasses import replace

    from spekula.bench.runner import SpecChoice
    from spekula.config import BackendConfig
    from spekula.pipeline import default_draft, default_runtime

    run = backend_from_args(args)
    runtime = default_runtime(args.target)
    default = SpecChoice(default_draft(runtime), None)
    for c in choices:
        on_default_runtime = (c.backend or run.runtime) == runtime and run.dtype == BackendConfig().dtype
        exact = run.exact if c.exact is None else c.exact
        same_choice = replace(c, label=None, backend=None, exact=None) == default
        if on_default_runtime and exact == BackendConfig().exact and same_choice:
            return c.name
    return None


def load_contenders(args: argparse.Namespace, choices: list):
    """Load the target once, each draft model once; returns (contenders, codec, model identities)."""
    from spekula.bench.manifest import model_identity
    from spekula.bench.runner import DraftLoader, build_contenders
    from spekula.pipeline import draft_backend_config, load_model
    from spekula.proposers import needs_model

    backend = backend_from_args(args)
    _log(f"loading target {args.target} ({backend.runtime}, {backend.dtype}) ...")
    target, codec = load_model(args.target, backend)
    loader = DraftLoader(
        args.target,
        target,
        codec,
        backend,
        log=_log,
        draft_config=lambda name, on: draft_backend_config(name, on, args.draft_backend),
    )
    cache = {"prompt_cache": args.prompt_cache, "any_rows": args.prompt_cache_any_rows}
    contenders = build_contenders(target, codec, choices, loader, loader.runtime, **cache)
    drafts = list(dict.fromkeys(c.draft for c in choices if not c.plain and needs_model(c.draft)))
    models = [model_identity(args.target, "target")] + [model_identity(d, "draft") for d in drafts]
    return contenders, codec, models


def out_dir(args: argparse.Namespace, kind: str) -> Path:
    from spekula.bench.results import default_out_dir

    return Path(args.out) if args.out else default_out_dir(kind)


def config_of(args: argparse.Namespace) -> dict[str, Any]:
    """The command's options, for the manifest; --backend as it ran when nobody chose it."""
    out = {k: v for k, v in vars(args).items() if k != "func" and not callable(v)}
    if out.get("backend", "") is None and "target" in out:
        out["backend"] = backend_from_args(args).runtime
    return out


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"must be a JSON object, got {text!r}")
    return value


def _endpoints(args: argparse.Namespace):
    from spekula.bench.endpoint import Endpoint, Load

    endpoint = Endpoint("endpoint", args.endpoint, args.model, args.api_key, args.extra_body)
    baseline = None
    if args.baseline_endpoint:
        baseline = Endpoint(
            "baseline",
            args.baseline_endpoint,
            args.baseline_model or args.model,
            args.api_key,
            args.baseline_extra_body,
        )
    load = Load(args.concurrency, args.requests, args.time_limit, args.request_timeout, args.waves)
    return endpoint, baseline, load


# -- handlers ---------------------------------------------------------------------------------------


def cmd_bench(args: argparse.Namespace) -> int:
    require_extra("bench", "spekula bench")  # before minutes of model loading
    from spekula.bench.report import last_line

    items = items_from_args(args)
    warm = warm_from_args(args, items)
    if warm is not None:
        items = list(warm.reported)
    sampling = sampling_from_args(args)
    markdown_into = Path(args.markdown_into) if args.markdown_into else None
    out = out_dir(args, "bench")
    bench = _bench_endpoints if args.endpoint else _bench_inprocess
    result, summary, paths = bench(args, items, warm, sampling=sampling, out=out, markdown_into=markdown_into)
    print(summary)
    print(f"results: {paths['results']}\nreport:  {paths['report']}")
    print(last_line(result, paths))
    return 0


def _bench_endpoints(
    args: argparse.Namespace, items, warm, *, sampling, out: Path, markdown_into: Path | None
) -> tuple[dict[str, Any], str, dict[str, str]]:
    """`spekula bench --endpoint URL`: returns commands.bench_endpoints' (result, summary, paths)."""
    from spekula.bench import commands
    from spekula.errors import ConfigError

    if args.baseline != "plain":
        raise ConfigError("--baseline names an in-process configuration; with --endpoint use --baseline-endpoint")
    endpoint, baseline, load = _endpoints(args)
    return commands.bench_endpoints(
        endpoint,
        baseline,
        items,
        load,
        workload_name=args.workload,
        out_dir=out,
        sampling=sampling,
        max_tokens=args.max_tokens,
        chat=args.chat,
        progress=not args.no_progress,
        markdown_into=markdown_into,
        config=config_of(args),
        repeats=args.repeats,
        salt=args.salt,
        warm=warm,
    )


def _bench_inprocess(
    args: argparse.Namespace, items, warm, *, sampling, out: Path, markdown_into: Path | None
) -> tuple[dict[str, Any], str, dict[str, str]]:
    """`spekula bench` on models it loads: returns commands.bench_inprocess' (result, summary, paths)."""
    from spekula.bench import commands
    from spekula.errors import ConfigError

    if args.baseline_endpoint:
        raise ConfigError("--baseline-endpoint needs --endpoint (the deployment to compare with it)")
    if args.salt:
        raise ConfigError("--salt is for --endpoint runs (in-process contenders keep their caches apart)")
    if args.waves:
        raise ConfigError("--waves is for --endpoint runs (in-process contenders serve one request at a time)")
    choices = choices_from_args(args)
    from spekula.bench.runner import PLAIN, check_baseline

    check_baseline(args.baseline, list(dict.fromkeys([PLAIN] + [c.name for c in choices])))  # before loading
    contenders, codec, models = load_contenders(args, choices)
    names = ", ".join(c.name for c in contenders)
    before = "" if warm is None else f"a warm server: {len(warm.prefix)} requests unreported, then "
    _log(f"measuring {before}{len(items)} prompts x {len(contenders)} configurations ({names}) ...")
    return commands.bench_inprocess(
        contenders,
        codec,
        items,
        target_name=args.target,
        models=models,
        workload_name=args.workload,
        out_dir=out,
        sampling=sampling,
        max_tokens=args.max_tokens,
        ignore_eos=args.ignore_eos,
        chat=args.chat,
        repeats=args.repeats,
        warmup=not args.no_warmup,
        progress=not args.no_progress,
        render_id=args.render,
        markdown_into=markdown_into,
        config=config_of(args),
        baseline=args.baseline,
        warm=warm,
    )


def cmd_tune(args: argparse.Namespace) -> int:
    from spekula.bench.emit import parse_engines
    from spekula.errors import ConfigError

    engines = parse_engines(args.emit) if args.emit else []
    if args.from_config:
        if not engines:
            raise ConfigError("--from-config emits an earlier tune's result: give --emit vllm|sglang|llama-server")
        return emit_from_config(args.from_config, engines, out_dir(args, "tune") if args.out else None)
    require_extra("bench", "spekula tune")  # before minutes of model loading
    from spekula.bench import commands

    items = items_from_args(args, sample=args.sample or None, sample_seed=args.sample_seed)
    runtime = backend_from_args(args).runtime
    backends = [b.strip() for b in args.backends.split(",") if b.strip()] if args.backends else []
    choices = _tune_choices(args, runtime, backends)
    if not choices:
        raise ConfigError("nothing to sweep: give --drafts and --ks (or --spec)")
    contenders, codec, models = load_contenders(args, choices)
    out = out_dir(args, "tune")
    config_path = Path(args.write_config) if args.write_config else out / "tuned-config.json"
    swept = ", ".join(dict.fromkeys([runtime, *backends]))
    _log(f"sweeping {len(contenders) - 1} configurations + plain decoding on {len(items)} prompts ({swept}) ...")
    outcome, text, paths = commands.tune(
        contenders,
        choices,
        codec,
        items,
        target_name=args.target,
        dtype=args.dtype,
        models=models,
        workload_name=args.workload,
        out_dir=out,
        config_path=config_path,
        sampling=sampling_from_args(args),
        max_tokens=args.max_tokens,
        min_speedup=args.min_speedup,
        repeats=args.repeats,
        progress=not args.no_progress,
        config=config_of(args),
        runtime=runtime,
        exact=args.exact,
        emit=engines,
    )
    print(text)
    print(
        json.dumps(
            {
                "kind": "spekula-tune",
                "recommended": outcome["recommended"],
                "runtime": outcome["runtime"],
                "config": outcome["config"],
                **paths,
            }
        )
    )
    return 0


def _tune_choices(args: argparse.Namespace, runtime: str, backends: list[str]) -> list:
    """What tune sweeps: the --spec configurations (each again on every other runtime of --backends), else
    every proposer of --drafts x every k of --ks (bench.tune.sweep_choices)."""
    from dataclasses import replace

    from spekula.bench.runner import SpecChoice
    from spekula.bench.tune import sweep_choices

    if args.spec:
        choices = choices_from_args(args)
        for other in dict.fromkeys(b for b in backends if b != runtime):
            choices += [SpecChoice("none", 0, backend=other)] + [
                replace(c, backend=other) for c in choices_from_args(args) if c.backend is None and not c.plain
            ]
        return choices
    if args.drafts:
        drafts = [d.strip() for d in args.drafts.split(",") if d.strip()]
    else:
        drafts = list(dict.fromkeys([args.draft, "ngram"]))
    ks = [parse_k(k) for k in args.ks.split(",") if k.strip()]
    return sweep_choices(
        drafts,
        ks,
        backends=backends,
        runtime=runtime,
        ngram_max=args.ngram_max,
        ngram_min=args.ngram_min,
        confidence=args.draft_confidence,
        k_max=args.k_max,
    )


def emit_from_config(path: str, engines: list[str], out: Path | None) -> int:
    """`spekula tune --from-config FILE --emit ENGINES`: no models loaded, nothing measured."""
    from spekula.bench.commands import emit_configs
    from spekula.bench.emit import emit_all, read_tuned

    config, steps_by_k = read_tuned(path)
    if out is not None:
        emitted = emit_configs(engines, config, steps_by_k, out)
    else:
        emitted = [(e, None) for e in emit_all(engines, config, steps_by_k)]
    for e, written in emitted:
        print(e.text() + (f"wrote {written}\n" if written else ""))
    record = {"kind": "spekula-tune-emit", "from": path, "emit": {e.engine: e.to_dict() for e, _ in emitted}}
    print(json.dumps(record))
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    require_extra("bench", "spekula audit")  # before minutes of model loading
    from spekula.bench import commands
    from spekula.bench.manifest import manifest

    items = items_from_args(args)
    out = out_dir(args, "audit")
    sampling = commands.distribution_sampling(sampling_from_args(args))
    if args.endpoint or args.baseline_endpoint:
        report, models, text = _audit_endpoints(args, items)
    else:
        report, models, text = _audit_inprocess(args, items, sampling)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "audit.json"
    seeds = {"distribution": {"base": args.seed or 0, "rule": "sample s uses seed base + s"}}
    record = {
        "kind": "spekula-audit",
        **report.to_dict(),
        "manifest": manifest(models=models, config=config_of(args), seeds=seeds),
    }
    path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    print(text)
    print(f"results: {path}")
    print(
        json.dumps(
            {
                "kind": "spekula-audit",
                "passed": report.passed,
                "greedy_passed": report.greedy_passed,
                "distribution_passed": report.distribution_passed if report.distribution else None,
                "min_pvalue": report.to_dict()["min_pvalue"],
                "threshold": report.threshold,
                "vacuous": report.vacuous,
                "default_config": report.default_config,
                "default_identical": report.to_dict()["default_identical"],
                "results": str(path),
            }
        )
    )
    return 0 if report.passed else 1


def _audit_endpoints(args: argparse.Namespace, items) -> tuple[Any, list[dict[str, Any]], str]:
    """`spekula audit --endpoint URL --baseline-endpoint URL`: (the report, the models for the manifest, its text)."""
    from spekula.bench import commands
    from spekula.bench.audit import format_report
    from spekula.errors import ConfigError

    if not (args.endpoint and args.baseline_endpoint):
        raise ConfigError("auditing endpoints needs both --endpoint (speculative) and --baseline-endpoint (plain)")
    endpoint, baseline, load = _endpoints(args)
    report = commands.audit_endpoints(
        endpoint,
        baseline,
        items,
        load,
        max_tokens=args.max_tokens,
        chat=args.chat,
        progress=not args.no_progress,
        level=args.level,
    )
    models = [
        {"role": "endpoint", "url": args.endpoint, "name": args.model},
        {"role": "baseline", "url": args.baseline_endpoint, "name": args.baseline_model or args.model},
    ]
    text = format_report(report) + (
        "\n(the distribution test needs the target's exact probabilities: run audit in-process for it)"
    )
    return report, models, text


def _audit_inprocess(args: argparse.Namespace, items, sampling) -> tuple[Any, list[dict[str, Any]], str]:
    """`spekula audit` on models it loads: (the report, the models for the manifest, its text)."""
    from spekula.bench import commands
    from spekula.bench.audit import format_report
    from spekula.errors import ConfigError

    if args.dtype != "float32":
        _log(
            f"note: --dtype {args.dtype}: a verify pass and a one-token pass may round differently, so greedy "
            "near-ties can differ without a bug; float32 makes the greedy check exact"
        )
    choices = choices_from_args(args)
    from spekula.bench.reference import SPEKULA_LOOP

    if any(c.loop != SPEKULA_LOOP for c in choices):
        raise ConfigError("audit checks spekula's engine; loop= is a `spekula bench` contender only (drop it)")
    contenders, codec, models = load_contenders(args, choices)
    report = commands.audit(
        contenders,
        codec,
        items,
        sampling=sampling,
        max_tokens=args.max_tokens,
        chat=args.chat,
        samples=args.samples,
        positions=args.positions,
        dist_prompts=args.dist_prompts,
        level=args.level,
        seed=args.seed or 0,
        progress=not args.no_progress,
        **{k: v for k, v in (("dist_k", args.dist_k), ("min_drafted", args.min_drafted)) if v is not None},
        default_config=default_config_name(args, choices),
    )
    return report, models, format_report(report, sampling)
