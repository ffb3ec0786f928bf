"""bench, tune and audit as library functions over loaded configurations.

spekula.bench.cli parses options and loads models, then calls these; tests call them with
in-memory models. Each returns what the CLI prints and writes.
"""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from spekula.bench import tune as tuning
from spekula.bench.audit import (
    DIST_K,
    MIN_DRAFTED,
    AuditReport,
    audit_distribution,
    audit_greedy,
    compare_texts,
)
from spekula.bench.endpoint import Endpoint, Load, borrow_token_counts, run_endpoint
from spekula.bench.manifest import manifest, portable_path
from spekula.bench.metrics import RequestResult, attach_comparisons
from spekula.bench.reference import ReferenceContender
from spekula.bench.results import result_dict, write_outputs
from spekula.bench.runner import (
    PLAIN,
    PREFIX_REPEAT,
    Contender,
    SpecChoice,
    cold_memory,
    encode_items,
    render_tokens,
    request_sampling,
    run_inprocess,
)
from spekula.bench.workloads import ServerSequence, WorkItem, check_repeats, split_sequence
from spekula.config import SamplingParams, StopConfig
from spekula.errors import ConfigError
from spekula.extras import needs_extra


def bench_inprocess(
    contenders: Sequence[Contender | ReferenceContender],
    codec: Any,
    items: list[WorkItem],
    *,
    target_name: str,
    models: list[dict[str, Any]],
    workload_name: str,
    out_dir: Path,
    sampling: SamplingParams = SamplingParams(),
    max_tokens: int | None = None,
    ignore_eos: bool = False,
    chat: bool = False,
    repeats: int = 1,
    warmup: bool = True,
    progress: bool = True,
    render_id: str | None = None,
    markdown_into: Path | None = None,
    config: dict[str, Any] | None = None,
    extra: dict[str, Any] | None = None,
    baseline: str = PLAIN,
    warm: ServerSequence | None = None,
) -> tuple[dict[str, Any], str, dict[str, str]]:
    """Run, summarise, write results.json / report.html / summary.md / plots. Returns (result, summary, paths).
    baseline: the configuration every ratio is over (default spekula's plain decoding). warm: a warm server's
    sequence (workloads.server_sequence; `items` is its reported part); None: a cold run."""
    # long: its signature is the run's options, one a line; the body is four steps (check, run, record, write)
    _check_reported(items, warm)
    results = run_inprocess(
        contenders,
        codec,
        items,
        sampling,
        max_tokens=max_tokens,
        ignore_eos=ignore_eos,
        chat=chat,
        repeats=repeats,
        warmup=warmup,
        progress=progress,
        baseline=baseline,
        warm_prefix=None if warm is None else list(warm.prefix),
    )
    result = _inprocess_result(
        contenders,
        items,
        results,
        target_name=target_name,
        models=models,
        workload_name=workload_name,
        sampling=sampling,
        max_tokens=max_tokens,
        repeats=repeats,
        config=config,
        extra=extra,
        baseline=baseline,
        warm=warm,
    )
    result["render"] = _render(
        result, contenders, codec, items, sampling, max_tokens, ignore_eos, chat, render_id, warm
    )
    summary, paths = write_outputs(result, out_dir, markdown_into)
    return result, summary, paths


def _inprocess_result(
    contenders: Sequence[Contender | ReferenceContender],
    items: list[WorkItem],
    results: list[RequestResult],
    *,
    target_name: str,
    models: list[dict[str, Any]],
    workload_name: str,
    sampling: SamplingParams,
    max_tokens: int | None,
    repeats: int,
    config: dict[str, Any] | None,
    extra: dict[str, Any] | None,
    baseline: str,
    warm: ServerSequence | None,
) -> dict[str, Any]:
    """An in-process run's result dict (results.result_dict), its manifest and proposer memory included."""
    memory = cold_memory(len(items), repeats) if warm is None else warm.describe()
    return result_dict(
        mode="in-process",
        target=target_name,
        configs=[c.choice.to_dict() for c in contenders],
        baseline=baseline,
        workload_name=workload_name,
        items=items,
        sampling=sampling,
        max_tokens=max_tokens,
        repeats=repeats,
        results=results,
        manifest=manifest(
            models=models, config=config or {}, seeds=_seeds(sampling, items, repeats, warm), memory=memory
        ),
        extra=extra,
        memory=memory,
        category_order=None if warm is None else warm.categories(),
    )


def _check_reported(items: list[WorkItem], warm: ServerSequence | None) -> None:
    if warm is not None and list(items) != list(warm.reported):
        raise ConfigError("a warm run reports its sequence's reported part: pass items=list(warm.reported)")


def _seeds(
    sampling: SamplingParams, items: list[WorkItem], repeats: int, warm: ServerSequence | None = None
) -> dict[str, Any]:
    base = sampling.seed if sampling.seed is not None else 0
    seeds = {
        "base": base,
        "rule": "request seed = base + prompt index + 10007 * repeat (same for every configuration)",
        "used": sampling.temperature > 0,
        "prompts": len(items),
        "repeats": repeats,
    }
    if warm is not None:
        seeds["prefix_rule"] = f"the warm prefix's request i: base + i + 10007 * {PREFIX_REPEAT}"
        seeds["sequence"] = {"seed": warm.seed, "rule": "spekula.bench.workloads.server_sequence"}
    return seeds


def _render(
    result, contenders, codec, items, sampling, max_tokens, ignore_eos, chat, render_id, warm=None
) -> dict[str, Any] | None:
    """One output token by token: the given prompt, or the prompt with the median speedup under the
    configuration with the best median speedup (a typical output, not the best case). warm: the run's
    warm sequence (its proposers had a memory the rendering does not have), or None."""
    spec = [c for c in contenders if not c.plain]
    if not spec:
        return None
    by_name = {c.name: c for c in spec}
    overall = {n: result["summary"][n]["overall"]["speedup"]["median"] or 0.0 for n in by_name}
    best = max(overall, key=overall.__getitem__)
    if render_id is not None:
        if render_id not in {i.id for i in items}:
            raise ConfigError(f"--render {render_id!r} is not a prompt id of this run")
        item_id, why = (
            render_id,
            f"{render_id} as asked (--render), under {best}, the configuration with the best median speedup",
        )
    else:
        mine = sorted(
            (r for r in result["requests"] if r["config"] == best and r["speedup"] is not None and r["repeat"] == 0),
            key=lambda r: r["speedup"],
        )
        if not mine:
            return None
        item_id = mine[len(mine) // 2]["prompt_id"]
        why = f"the prompt with the median speedup under {best}, the configuration with the best median speedup"
    index = next(n for n, i in enumerate(items) if i.id == item_id)
    item = items[index]
    ids = item.encode(codec, chat=chat)
    stop = StopConfig(max_tokens=item.max_tokens_under(max_tokens), ignore_eos=ignore_eos)
    tokens = render_tokens(by_name[best], codec, ids, request_sampling(sampling, index, 0), stop)
    prompt = (
        item.prompt
        if item.prompt is not None
        else "\n\n".join(f"[{m['role']}] {m['content']}" for m in item.chat_messages())
    )
    if warm is not None:
        why += " (rendered again with an empty proposer memory, not the run's warm one)"
    return {"config": best, "prompt_id": item_id, "why": why, "prompt": prompt, "tokens": tokens}


def bench_endpoints(
    endpoint: Endpoint,
    baseline: Endpoint | None,
    items: list[WorkItem],
    load: Load,
    *,
    workload_name: str,
    out_dir: Path,
    sampling: SamplingParams = SamplingParams(),
    max_tokens: int | None = None,
    chat: bool = False,
    progress: bool = True,
    markdown_into: Path | None = None,
    config: dict[str, Any] | None = None,
    repeats: int = 1,
    salt: bool = False,
    warm: ServerSequence | None = None,
) -> tuple[dict[str, Any], str, dict[str, str]]:
    """Same prompts, same load, one endpoint at a time: the baseline deployment first (when given),
    then the measured one; with repeats, phase after phase in alternating order (baseline, endpoint,
    endpoint, baseline, ...: a drift in the machine's speed during the run cancels out to first
    order). A request is compared with the other endpoint's request of the same prompt in the same
    phase; throughput is each endpoint's output tokens over the wall time of its phases. salt: every
    phase's prompts begin with a line naming the run and the phase, so a server with a prompt cache
    does not answer a repeated prompt from an earlier phase (or an earlier run of the same workload).

    warm: a warm server's sequence (workloads.server_sequence; `items` must be its reported part). Each
    endpoint is sent the prefix first, unreported, so it answers the reported requests after having learnt from
    those (on top of whatever it learnt before this run: the server's memory is its own); `repeats` then cuts
    the reported part into that many consecutive phases, in the alternating order, so each prompt is sent to
    each endpoint once."""
    check_repeats(repeats)
    _check_reported(items, warm)
    order = ([baseline] if baseline else []) + [endpoint]
    run_id = secrets.token_hex(4)
    prefix_errors = _send_prefix(order, warm, sampling, load, max_tokens, chat, progress, salt, run_id)
    phases, cycles, load = _phases(items, load, repeats, warm)
    results, walls, configs = _endpoint_phases(
        order, phases, cycles, sampling, load, max_tokens, chat, progress, salt, run_id
    )
    base_name = baseline.name if baseline else endpoint.name
    _compare_endpoints(results, items, warm, base_name, sampling.greedy)
    load_d = _load_record(load, repeats, f"[run {run_id}, phase N]" if salt else None)
    seeds = _seeds(sampling, items, repeats * cycles, warm)
    result = result_dict(
        mode="endpoint",
        target=configs[-1]["model"],
        configs=configs,
        baseline=base_name,
        workload_name=workload_name,
        items=items,
        sampling=sampling,
        max_tokens=max_tokens,
        repeats=repeats,
        results=results,
        walls=walls,
        **_endpoint_record(configs, load_d, config, seeds, warm, prefix_errors),
    )
    summary, paths = write_outputs(result, out_dir, markdown_into)
    return result, summary, paths


def _compare_endpoints(
    results: list[RequestResult], items: list[WorkItem], warm: ServerSequence | None, base_name: str, greedy: bool
) -> None:
    """Every request counted and compared with the baseline's request of the same prompt, repeat and phase (and, in
    a warm run, numbered by the requests each server had answered before it)."""
    if warm is not None:  # each endpoint was sent the prefix, then the reported requests in order
        position = {item.id: len(warm.prefix) + n for n, item in enumerate(items)}
        for r in results:
            r.requests_before = position[r.prompt_id]
    borrow_token_counts(results)  # a server that streams no usage counts an identical text as the other side does
    attach_comparisons(results, base_name, greedy)


def _phases(
    items: list[WorkItem], load: Load, repeats: int, warm: ServerSequence | None
) -> tuple[list[list[WorkItem]], int, Load]:
    """An endpoint run's phases, the passes over its items each phase makes (load.requests cycles through
    them), and the load each phase runs under: a warm run's sequence is cut into `repeats` phases, and
    nothing cycles."""
    if warm is not None:
        load = replace(load, requests=None)  # the sequence is the run: nothing cycles
        return split_sequence(list(items), repeats), 1, load
    cycles = -(-(load.requests or len(items)) // len(items)) if items else 1  # passes over the items per phase
    return [items] * repeats, cycles, load


def _endpoint_record(
    configs: list[dict[str, Any]],
    load_d: dict[str, Any],
    config: dict[str, Any] | None,
    seeds: dict[str, Any],
    warm: ServerSequence | None,
    prefix_errors: dict[str, int],
) -> dict[str, Any]:
    """An endpoint run's manifest, load and server memory, as result_dict takes them."""
    models = [{"role": c["name"], "name": c["model"], "url": c["url"], "sha256": None} for c in configs]
    memory = server_memory(warm, prefix_errors)
    return {
        "manifest": manifest(models=models, config={**(config or {}), "load": load_d}, seeds=seeds, memory=memory),
        "extra": {"load": load_d},
        "memory": memory,
        "category_order": None if warm is None else warm.categories(),
    }


def _load_record(load: Load, phases: int, salt: str | None) -> dict[str, Any]:
    return {
        "concurrency": load.concurrency,
        "arrival": "waves" if load.waves else "closed loop",
        "requests": load.requests,
        "time_limit_s": load.time_limit_s,
        "request_timeout_s": load.request_timeout_s,
        "phases": phases,
        "salt": salt,
    }


def server_memory(warm: ServerSequence | None, prefix_errors: dict[str, int]) -> dict[str, Any]:
    """What an endpoint run records about the servers' memory: theirs, never emptied by the bench."""
    rule = (
        "the server's own: whatever it learnt before this run (the bench cannot empty it), plus every request "
        "this run sent it before"
    )
    if warm is None:
        return {"state": "server", "rule": rule + "; restart the server for a cold one, --warm M for a warm one"}
    return {**warm.describe(), "rule": rule + ": the prefix first, unreported", "prefix_errors": prefix_errors}


def _send_prefix(
    order: list[Endpoint],
    warm: ServerSequence | None,
    sampling: SamplingParams,
    load: Load,
    max_tokens: int | None,
    chat: bool,
    progress: bool,
    salt: bool,
    run_id: str,
) -> dict[str, int]:
    """A warm run's prefix to every endpoint, one after the other, unreported; returns the failures per endpoint
    (a failed prefix request taught that server less: recorded, not fatal)."""
    if warm is None or not warm.prefix:
        return {}
    prefix = list(warm.prefix)
    if salt:
        prefix = [item.salted(f"[run {run_id}, prefix]") for item in prefix]
    errors = {}
    for ep in order:
        rs, _, _ = run_endpoint(
            ep,
            prefix,
            sampling,
            replace(load, requests=None, time_limit_s=None),
            max_tokens=max_tokens,
            chat=chat,
            progress=progress,
            first_repeat=PREFIX_REPEAT,
        )
        errors[ep.name] = sum(not r.ok for r in rs)
    return errors


def _endpoint_phases(
    order: list[Endpoint],
    phases: list[list[WorkItem]],
    cycles: int,
    sampling: SamplingParams,
    load: Load,
    max_tokens: int | None,
    chat: bool,
    progress: bool,
    salt: bool,
    run_id: str,
) -> tuple[list[RequestResult], dict[str, float], list[dict[str, Any]]]:
    """Every phase's items to every endpoint, one endpoint at a time, in alternating order. Returns (results, wall
    seconds per endpoint, each endpoint's config in the first phase's order)."""
    results: list[RequestResult] = []
    walls: dict[str, float] = {}
    seen: dict[str, dict[str, Any]] = {}
    for phase, items in enumerate(phases):
        phase_items = [item.salted(f"[run {run_id}, phase {phase + 1}]") for item in items] if salt else items
        for ep in order if phase % 2 == 0 else order[::-1]:
            first = phase * cycles
            rs, wall, model = run_endpoint(
                ep, phase_items, sampling, load, max_tokens=max_tokens, chat=chat, progress=progress, first_repeat=first
            )
            results += rs
            walls[ep.name] = walls.get(ep.name, 0.0) + wall
            seen.setdefault(ep.name, {"name": ep.name, "url": ep.url, "model": model, "draft": None, "k": None})
    return results, walls, list(seen.values())


def tune(
    contenders: list[Contender],
    choices: list[SpecChoice],
    codec: Any,
    items: list[WorkItem],
    *,
    target_name: str,
    dtype: str,
    models: list[dict[str, Any]],
    workload_name: str,
    out_dir: Path,
    config_path: Path,
    sampling: SamplingParams = SamplingParams(),
    max_tokens: int | None = None,
    min_speedup: float = 1.05,
    repeats: int = 1,
    progress: bool = True,
    config: dict[str, Any] | None = None,
    runtime: str | None = None,
    exact: bool = False,
    emit: list[str] | tuple[str, ...] = (),
) -> tuple[dict[str, Any], str, dict[str, str]]:
    """Sweep, recommend, write the config file (and, for each engine in `emit`, that engine's own
    speculative configuration: spekula.bench.emit). runtime: the run's own (recorded in the config file).
    Returns (tune result, printed text, paths)."""
    if min_speedup <= 0:
        raise ConfigError(f"--min-speedup must be > 0, got {min_speedup}")
    result, _, paths = bench_inprocess(
        contenders,
        codec,
        items,
        target_name=target_name,
        models=models,
        workload_name=workload_name,
        out_dir=out_dir,
        sampling=sampling,
        max_tokens=max_tokens,
        repeats=repeats,
        progress=progress,
        config=config,
    )
    rows = tuning.table(result["summary"], choices)
    choice, reason = tuning.recommend(rows, choices, min_speedup)
    tuned = tuning.tuned_config(choice, target_name, dtype, sampling, runtime=runtime, exact=exact)
    tuning.write_config(tuned, config_path)
    steps_by_k = next((r["steps_by_k"] for r in rows if r["name"] == choice.name), None)
    emitted = emit_configs(list(emit), tuned, steps_by_k, out_dir)
    outcome = _tune_outcome(choice.name, reason, min_speedup, tuned, config_path, rows, result, paths, emitted)
    (out_dir / "tune.json").write_text(json.dumps(outcome, indent=1) + "\n")
    text = _tune_text(target_name, len(items), sampling, rows, choice.name, reason, tuned, config_path, emitted)
    emit_paths = {f"emit_{e.engine}": str(path) for e, path in emitted}
    return outcome, text, {**paths, "tune": str(out_dir / "tune.json"), "config_file": str(config_path), **emit_paths}


def _tune_outcome(
    chosen: str,
    reason: str,
    min_speedup: float,
    tuned: dict[str, Any],
    config_path: Path,
    rows: list[dict[str, Any]],
    result: dict[str, Any],
    paths: dict[str, str],
    emitted: list,
) -> dict[str, Any]:
    """tune.json: the recommendation, the config written, the table it came from, and each engine's emission."""
    return {
        "kind": "spekula-tune",
        "recommended": chosen,
        "runtime": tuned["backend"],
        "reason": reason,
        "min_speedup": min_speedup,
        "config": tuned,
        "config_path": portable_path(str(config_path)),
        "table": rows,
        "bench_results": portable_path(paths["results"]),
        "manifest": result["manifest"],
        "emit": {e.engine: e.to_dict() for e, _ in emitted},
    }


def _tune_text(
    target_name: str,
    prompts: int,
    sampling: SamplingParams,
    rows: list[dict[str, Any]],
    chosen: str,
    reason: str,
    tuned: dict[str, Any],
    config_path: Path,
    emitted: list,
) -> str:
    """What `spekula tune` prints: the table, the recommendation, and where it was written."""
    return "\n".join(
        [
            f"## spekula tune: {target_name}, {prompts} prompts, "
            f"{'greedy' if sampling.greedy else f'temperature {sampling.temperature}'}",
            "",
            tuning.format_table(rows, chosen),
            "",
            f"recommended: {reason}",
            f"runtime: {tuned['backend'] or 'the default runtime'}",
            f"wrote {config_path}: use it with `spekula generate --config {config_path}` (or `spekula serve --config`)",
            *[f"\n{e.text()}wrote {path}" for e, path in emitted],
        ]
    )


def emit_configs(engines: list[str], tuned: dict[str, Any], steps_by_k: dict[Any, int] | None, out_dir: Path):
    """Each engine's speculative configuration for a tuned config, written to <out_dir>/emit-<engine>.sh.
    Returns [(Emission, path)]."""
    from spekula.bench.emit import emit_all

    out = []
    for e in emit_all(engines, tuned, steps_by_k):
        path = out_dir / f"emit-{e.engine}.sh"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(e.text())
        out.append((e, path))
    return out


def audit(
    contenders: list[Contender],
    codec: Any,
    items: list[WorkItem],
    *,
    sampling: SamplingParams,
    max_tokens: int | None,
    chat: bool = False,
    samples: int = 200,
    positions: int = 3,
    dist_prompts: int = 2,
    level: float = 0.01,
    seed: int = 0,
    progress: bool = True,
    dist_k: int = DIST_K,
    min_drafted: float = MIN_DRAFTED,
    default_config: str | None = None,
) -> AuditReport:
    """Greedy equality over `items`, then the distribution test on the `dist_prompts` shortest prompts
    (k=auto configurations drafting dist_k; vacuous below min_drafted: spekula.bench.audit).
    default_config: the name of the configuration a user gets without options, if among the contenders."""
    with needs_extra("bench", "spekula audit"):
        from tqdm import tqdm

    _check_audit(len(contenders), sampling, samples, positions, dist_prompts, level, dist_k, min_drafted)
    ids = encode_items(items, codec, chat)
    shortest = sorted(items, key=lambda i: len(ids[i.id]))[:dist_prompts]
    spec = len(contenders) - 1
    bar = tqdm(
        total=len(items) * spec + len(shortest) * spec * samples,
        file=sys.stderr,
        disable=not progress,
        unit="run",
        dynamic_ncols=True,
    )
    with bar:

        def tick() -> None:
            bar.update(1)

        report = AuditReport(level, min_drafted=min_drafted, default_config=default_config)
        report.greedy = audit_greedy(contenders, items, ids, max_tokens, progress=tick, decode=codec.decode)
        if shortest:
            report.distribution = audit_distribution(
                contenders,
                shortest,
                ids,
                sampling,
                samples=samples,
                positions=positions,
                seed=seed,
                dist_k=dist_k,
                progress=tick,
            )
    return report


def _check_audit(
    configs: int,
    sampling: SamplingParams,
    samples: int,
    positions: int,
    dist_prompts: int,
    level: float,
    dist_k: int,
    min_drafted: float,
) -> None:
    """audit's options, refused with the flag that sets each before anything runs."""
    if not 0 < level < 1:
        raise ConfigError(f"--level must be in (0, 1), got {level}")
    if dist_k < 1 or not 0 <= min_drafted <= 1:
        raise ConfigError(f"--dist-k must be >= 1 and --min-drafted in [0, 1], got {dist_k} and {min_drafted}")
    if samples < 1 or positions < 1 or dist_prompts < 0:
        raise ConfigError("--samples and --positions must be >= 1, --dist-prompts >= 0")
    if configs < 2:
        raise ConfigError("nothing to audit: give at least one speculative configuration (--draft / --spec)")
    if sampling.greedy and dist_prompts:
        raise ConfigError(
            "the distribution test needs sampling: pass --temperature > 0 (or --dist-prompts 0 for the greedy check "
            "only)"
        )


def audit_endpoints(
    endpoint: Endpoint,
    baseline: Endpoint,
    items: list[WorkItem],
    load: Load,
    *,
    max_tokens: int | None,
    chat: bool = False,
    progress: bool = True,
    level: float = 0.01,
) -> AuditReport:
    """Greedy equality of two deployments, prompt by prompt (text: an HTTP API returns no token ids)."""
    greedy = SamplingParams()
    base, _, _ = run_endpoint(baseline, items, greedy, load, max_tokens=max_tokens, chat=chat, progress=progress)
    mine, _, _ = run_endpoint(endpoint, items, greedy, load, max_tokens=max_tokens, chat=chat, progress=progress)
    report = AuditReport(level)
    # A failed request (including an answer that is not whole) is an error, and its prompt is compared on neither side.
    report.endpoint_errors = [
        {"config": r.config, "prompt_id": r.prompt_id, "repeat": r.repeat, "error": r.error}
        for r in base + mine
        if not r.ok
    ]
    ref = {(r.prompt_id, r.repeat): r.text for r in base if r.ok}
    report.endpoint_greedy = [
        compare_texts(endpoint.name, r.prompt_id, ref[(r.prompt_id, r.repeat)], r.text)
        for r in mine
        if r.ok and (r.prompt_id, r.repeat) in ref
    ]
    return report


def distribution_sampling(sampling: SamplingParams) -> SamplingParams:
    """The audit's distribution test samples; with greedy options it uses temperature 1."""
    return replace(sampling, temperature=1.0) if sampling.greedy else sampling
