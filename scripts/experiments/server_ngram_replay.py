"""llama-server's n-gram draft rules against spekula's suffix lookup, replayed offline on recorded greedy outputs.

llama-server's `ngram-simple` and `ngram-mod` (the llama.cpp that llama-cpp-python 0.3.36 vendors) are ported here
line for line as spekula proposers, and every output of a `spekula bench` run is replayed through spekula's own
engine (scripts/experiments/ngram_replay.py: a target that emits the recorded output, each pass costing its width's
seconds from --costs) under each contender, prompts in the run's order through one engine each, so memory across
requests builds up as it would in one server slot:

  suffix        spekula's default: suffix lookup, `--k auto` (the engine's controller, k <= 16); with
                --long-suffix N also the same allowed drafts of up to N tokens;
  ngram-simple  common_ngram_simple_draft (common/ngram-map.cpp:49-112) with --simple N,M (llama-server's defaults
                12,48): the last N tokens' most recent earlier occurrence, the M tokens after it, nothing if fewer
                than N follow it; drafted at every step it finds one, as llama-server does (no cost model);
  ngram-mod     common_speculative_impl_ngram_mod (common/speculative.cpp:1849-2022) with --mod N,MAX,MIN (24,64,48):
                one hashed pool of 4M entries for all requests (common/ngram-mod.cpp), N-gram -> next token, drafts
                chained token by token, nothing shorter than MIN; the pool resets at 25% occupancy and after 5
                drafts in a row with under 25% accepted.
Only the drafting rules differ: verification is greedy in both loops, and each loop's own cost per pass beyond the
compute is measured apart (scripts/experiments/step_overhead_vs_server.py). Prints, per category and over all
prompts, the median per-prompt decode speedup over plain decoding, the median τ and the category's α; the last line
is JSON.

    .venv/bin/python scripts/experiments/server_ngram_replay.py docs/benchmarks/llamacpp/results.json.gz \\
        --costs 1:S1,2:S2,...,65:S65 [--simple 12,48] [--mod 24,64,48] [--long-suffix 48]

with Sn the seconds of a target pass of n tokens (scripts/pass_costs.py prints them in ms); give widths up to the
widest draft + 1. `--live ID,ID,...` checks the ports instead: llama-server (.venv/bin/llama-server, or
$LLAMA_SERVER; loopback --port) answers those prompts with each rule, and its drafted and accepted tokens are
compared with the port's on the same outputs. Figures and machine: docs/decisions/0007-llama-server-ngram.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from spekula.config import K_MAX, SamplingParams, SpecConfig  # noqa: E402
from spekula.control import FixedK  # noqa: E402
from spekula.cost import CostModel  # noqa: E402
from spekula.draft_class import NO_DRAFT, DraftClass  # noqa: E402
from spekula.engine import Engine  # noqa: E402
from spekula.noise import PositionalNoise  # noqa: E402
from spekula.proposers.base import EMPTY_DRAFT, Draft, Proposer, ProposerFactory  # noqa: E402
from spekula.proposers.suffix import SuffixConfig, SuffixFactory  # noqa: E402
from spekula.verify import Verdict  # noqa: E402

import ngram_replay  # noqa: E402  (a sibling experiment: the replay target, requests, engine runs)

MOD_SIZE = 4 * 1024 * 1024  # entries of ngram-mod's pool (common/speculative.cpp:1876)
MOD_MULTIPLIER = 6364136223846793005  # its hash (common/ngram-mod.cpp:53-63), on 64-bit size_t
MOD_OCCUPANCY_RESET = 0.25  # begin() resets the pool above this occupancy (speculative.cpp:1914-1919)
MOD_CHUNK = 32  # new n-grams join the pool once this many have piled up (speculative.cpp:1940)
MOD_LOW_ACCEPTANCE, MOD_LOW_STREAK = 0.25, 5  # accept(): this many drafts in a row below this fraction reset it
SERVER_CLASS = DraftClass("server-rule")  # the draft class of a server rule's draft (FixedK ignores it; NO_DRAFT: none)


def ngram_simple_draft(tokens: list[int], sampled: int, n: int, m: int) -> list[int]:
    """common_ngram_simple_draft (ngram-map.cpp:49-112): `tokens` is the slot's history, `sampled` the token
    just sampled. The pattern is the last n - 1 tokens and `sampled`; its most recent occurrence at index >= 1,
    searched backwards from len - n - 1; the up to m tokens after it, or nothing if fewer than n follow."""
    cur_len = len(tokens)
    if cur_len <= n + m + 1:
        return []
    pattern = tokens[cur_len - n + 1 :] + [sampled]
    first = pattern[0]
    for j in range(cur_len - n - 1, 0, -1):
        if tokens[j] == first and tokens[j : j + n] == pattern:
            copy_max = min(m, cur_len - (j + n))
            return [] if copy_max < n else tokens[j + n : j + n + copy_max]
    return []


def mod_index(tokens: list[int], start: int, n: int, size: int = MOD_SIZE) -> int:
    """common_ngram_mod::idx: the n tokens from `start`, hashed with 64-bit wraparound, modulo the pool's size."""
    res = 0
    for t in tokens[start : start + n]:
        res = (res * MOD_MULTIPLIER + t) & 0xFFFFFFFFFFFFFFFF
    return res % size


@dataclass
class ModPool:
    """common_ngram_mod: entries[idx(n-gram)] = the token after it, last writer wins, the key itself not kept (a
    collision answers with another n-gram's token); a dict stands for the array (an absent index: EMPTY)."""

    n: int
    size: int = MOD_SIZE
    entries: dict[int, int] = field(default_factory=dict)

    def add(self, tokens: list[int], start: int) -> None:
        self.entries[mod_index(tokens, start, self.n, self.size)] = tokens[start + self.n]

    def get(self, tokens: list[int], start: int) -> int | None:
        return self.entries.get(mod_index(tokens, start, self.n, self.size))

    def reset(self) -> None:
        self.entries.clear()


@dataclass
class ModSlot:
    """ngram-mod's per-sequence state (speculative.cpp:1858-1867): one llama-server slot (-np 1) serves every
    request, so n_low carries over from request to request; begin() resets the other two."""

    i_last: int = 0
    n_draft_last: int = 0
    n_low: int = 0


def mod_begin(pool: ModPool, slot: ModSlot, prompt: list[int]) -> None:
    """begin() (speculative.cpp:1894-1920): the prompt's n-grams join the pool; reset if it is too full."""
    slot.i_last = slot.n_draft_last = 0
    if len(prompt) < pool.n:
        return
    for i in range(len(prompt) - pool.n):
        pool.add(prompt, i)
    slot.i_last = len(prompt) - pool.n
    if len(pool.entries) / pool.size > MOD_OCCUPANCY_RESET:
        pool.reset()


def mod_draft(pool: ModPool, slot: ModSlot, tokens: list[int], sampled: int, n_max: int, n_min: int) -> list[int]:
    """draft_one() (speculative.cpp:1922-1976): new n-grams join in chunks, then the next token of the last n is
    looked up, appended, and looked up again, up to n_max; nothing if the chain breaks before n_min."""
    n = pool.n
    slot.n_draft_last = 0
    cur_len = len(tokens)
    if cur_len < n:
        return []
    if slot.i_last + MOD_CHUNK < cur_len:
        for i in range(slot.i_last, cur_len - n):
            pool.add(tokens, i)
        slot.i_last = cur_len - n
    chain = tokens[cur_len - n + 1 :] + [sampled]
    for i in range(n_max):
        token = pool.get(chain, i)
        if token is None:
            if i < n_min:
                return []
            break
        chain.append(token)
    slot.n_draft_last = len(chain) - n
    return chain[n:]


def mod_accept(pool: ModPool, slot: ModSlot, n_accepted: int) -> None:
    """accept() (speculative.cpp:1996-2020): a streak of drafts mostly rejected resets the whole pool."""
    if slot.n_draft_last > 0:
        if n_accepted / slot.n_draft_last < MOD_LOW_ACCEPTANCE:
            slot.n_low += 1
            if slot.n_low >= MOD_LOW_STREAK:
                pool.reset()
                slot.n_low = slot.i_last = 0
        else:
            slot.n_low = 0


class ServerRuleProposer(Proposer):
    """A llama-server rule as a spekula proposer for one request: the rule runs once per context length (its
    side effects on a shared pool included); the slot's history is the context less its last token, which is
    the token just sampled. The first context is the prompt: llama-server begin()s with it and samples the first
    token from the prompt's pass, undrafted (server-context.cpp:3818-3828)."""

    free_to_draft = True

    def __init__(self, factory: ServerRuleFactory) -> None:
        self.factory = factory
        self._last: tuple[int, list[int]] | None = None

    def _rule(self, context: list[int]) -> list[int]:
        if self._last is None:
            self.factory.begin(context)
            self._last = (len(context), [])
        elif self._last[0] != len(context):
            self._last = (len(context), self.factory.draft(context[:-1], context[-1]))
        return self._last[1]

    def draft_class(self, context: list[int]) -> DraftClass:
        return SERVER_CLASS if self._rule(context) else NO_DRAFT

    def propose(self, context: list[int], k: int, sampling: SamplingParams, noise: PositionalNoise | None) -> Draft:
        tokens = self._rule(context)[:k]
        return Draft(tokens) if tokens else EMPTY_DRAFT

    def observe(self, context: list[int], verdict: Verdict) -> None:
        if verdict.num_drafted:  # llama-server calls accept() only after a verified draft
            self.factory.accept(verdict.num_accepted)


@dataclass
class ServerRuleFactory(ProposerFactory):
    """One rule's state for a whole replay: ngram-simple has none; ngram-mod one pool and one slot."""

    name: str
    n: int
    m: int  # the longest draft (ngram-simple's M, ngram-mod's n_max)
    n_min: int = 0  # ngram-mod's shortest draft
    pool: ModPool | None = None
    slot: ModSlot = field(default_factory=ModSlot)

    def create(self, namespace: str = "") -> ServerRuleProposer:
        return ServerRuleProposer(self)

    def begin(self, prompt: list[int]) -> None:
        if self.pool is not None:
            mod_begin(self.pool, self.slot, prompt)

    def draft(self, tokens: list[int], sampled: int) -> list[int]:
        if self.pool is None:
            return ngram_simple_draft(tokens, sampled, self.n, self.m)
        return mod_draft(self.pool, self.slot, tokens, sampled, self.m, self.n_min)

    def accept(self, n_accepted: int) -> None:
        if self.pool is not None:
            mod_accept(self.pool, self.slot, n_accepted)


@dataclass(frozen=True)
class Counted:
    """A replayed request's decode time and passes (ngram_replay.Replayed), and its drafted and accepted tokens."""

    seconds: float
    passes: int
    drafted: int
    accepted: int


def replay_counted(engine: Engine, request, controller=None) -> Counted:
    """ngram_replay.replay, with what was drafted and accepted read off the widths of its passes: a pass of w rows
    verified w - 1 drafted tokens, and every pass emits one token plus those it accepted."""
    replayed = ngram_replay.replay(engine, request, controller)
    widths = engine.target.widths
    return Counted(replayed.seconds, replayed.passes, sum(w - 1 for w in widths), request.emitted - len(widths))


def rule_engine(factory: ServerRuleFactory, table: dict[int, float], vocab) -> Engine:
    """An engine that drafts what the rule gives, as long as it is (FixedK at the rule's longest draft, passed to
    replay_counted; the engine cuts a draft to the tokens the request has left, as llama-server does)."""
    engine = Engine(ngram_replay.ReplayBackend(*vocab), factory, SpecConfig(k=factory.m, k_max=min(factory.m, 64)))
    engine.costs = CostModel(target_s=dict(table), frozen=True)
    return engine


def run_rule(factory: ServerRuleFactory, requests, table: dict[int, float], vocab) -> dict:
    """Every request through one engine, in order."""
    engine = rule_engine(factory, table, vocab)
    return {r.prompt_id: replay_counted(engine, r, FixedK(factory.m)) for r in requests}


def run_suffix(k_max: int, requests, table: dict[int, float], vocab) -> dict:
    """spekula's suffix lookup and `--k auto`, every request through one engine in order (its cache of earlier
    outputs filling as a server's does): from the registry at k_max = K_MAX, its default; above, the proposer's
    max_draft raised too (SpecConfig's k_max alone does not raise it past K_MAX)."""
    spec, costs = SpecConfig(k=None, k_max=k_max), CostModel(target_s=dict(table), frozen=True)
    backend = ngram_replay.ReplayBackend(*vocab)
    if k_max == K_MAX:
        engine = ngram_replay.replay_engine("suffix", spec, costs, backend)
    else:
        engine = Engine(backend, SuffixFactory(SuffixConfig(max_draft=k_max), vocab_size=vocab[0]), spec)
        engine.costs = costs
    return {r.prompt_id: replay_counted(engine, r) for r in requests}


def summary(results: dict[str, dict], requests, table: dict[int, float]) -> dict[str, dict[str, dict[str, float]]]:
    """{group: {contender: {"speedup": median decode speedup, "tau": median τ, "alpha": accepted / drafted}}},
    per category, then "all"."""
    groups: dict[str, list] = {}
    for r in requests:
        groups.setdefault(r.category, []).append(r)
    groups["all"] = list(requests)
    out = {}
    for group, rs in groups.items():
        out[group] = {}
        for name, runs in results.items():
            counted = [runs[r.prompt_id] for r in rs]
            drafted = sum(c.drafted for c in counted)
            out[group][name] = {
                "speedup": statistics.median(ngram_replay.speedup(r, runs[r.prompt_id], table) for r in rs),
                "tau": statistics.median(r.emitted / runs[r.prompt_id].passes for r in rs),
                "alpha": sum(c.accepted for c in counted) / drafted if drafted else None,
            }
    return out


def live_check(factories: dict, requests, vocab, args) -> list[dict]:
    """The port against llama-server itself: each rule's server (-np 1, greedy, the bench's prompt ids, exactly
    the recorded output's length) answers `requests` in order; its output is then replayed through the port, one
    fresh factory per rule, and both count the tokens drafted and accepted (llama-server's `timings`)."""
    from step_overhead_vs_server import SERVER_ARGS, LlamaServer

    from spekula.models import resolve

    binary = os.environ.get("LLAMA_SERVER", str(ROOT / ".venv" / "bin" / "llama-server"))
    gguf = str(resolve("qwen2.5-coder-1.5b").gguf_path)
    rows = []
    for name, (make, options) in factories.items():
        argv = [binary, "-m", gguf, "-t", "2", "-tb", "2", "-np", "1", "-c", "4096", "--metrics"]
        argv += ["--host", "127.0.0.1", "--port", str(args.port), *SERVER_ARGS.split(), "--spec-type", name, *options]
        engine = rule_engine(make(), {1: 1.0}, vocab)
        log = Path(tempfile.mkdtemp(prefix="server_ngram_replay-")) / f"{name}.log"
        with LlamaServer(argv, args.port, log, dict(os.environ)) as server:
            server.wait_ready(120.0)
            for r in requests:
                steps, emitted, _, _ = server.complete(r.prompt, len(r.output))
                mine = replay_counted(
                    engine, replace(r, output=emitted, stopped=False, max_tokens=None), FixedK(engine.spec.k)
                )
                theirs = {"drafted": steps.rows - steps.passes, "accepted": steps.tokens - steps.passes}
                rows.append(
                    {
                        "rule": name,
                        "prompt": r.prompt_id,
                        "llama-server": theirs,
                        "port": {"drafted": mine.drafted, "accepted": mine.accepted},
                    }
                )
                print(
                    f"live {name} {r.prompt_id}: llama-server drafted {theirs['drafted']}, accepted "
                    f"{theirs['accepted']}; port drafted {mine.drafted}, accepted {mine.accepted}",
                    flush=True,
                )
    return rows


def parse_ints(text: str, count: int, what: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{what} must be {count} comma-separated integers, got {text!r}") from None
    if len(values) != count or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"{what} must be {count} comma-separated integers >= 1, got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a spekula bench results.json[.gz] (its plain-decoding outputs are replayed)")
    ap.add_argument("--costs", help="seconds per target pass by width, as n:s,n:s,... (n = 1 among them)")
    ap.add_argument("--simple", default="12,48", type=lambda t: parse_ints(t, 2, "--simple N,M"))
    ap.add_argument("--mod", default="24,64,48", type=lambda t: parse_ints(t, 3, "--mod N,MAX,MIN"))
    ap.add_argument("--long-suffix", type=int, default=0, help=f"also suffix lookup with drafts up to this (> {K_MAX})")
    ap.add_argument("--live", help="instead: comma-separated prompt ids to check the port against llama-server on")
    ap.add_argument("--port", type=int, default=18181)
    args = ap.parse_args(argv)
    if not args.live and not args.costs:
        ap.error("give --costs (or --live)")
    args.table = {int(n): float(s) for n, s in (p.split(":") for p in args.costs.split(","))} if args.costs else {}
    if args.costs and 1 not in args.table:
        ap.error("--costs needs the one-token pass (1:seconds)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    requests, vocab = ngram_replay.load_requests(args.results)
    (sn, sm), (mn, mmax, mmin) = args.simple, args.mod
    factories = {
        "ngram-simple": (
            lambda: ServerRuleFactory("ngram-simple", sn, sm),
            ["--spec-ngram-simple-size-n", str(sn), "--spec-ngram-simple-size-m", str(sm)],
        ),
        "ngram-mod": (
            lambda: ServerRuleFactory("ngram-mod", mn, mmax, mmin, ModPool(mn)),
            [
                "--spec-ngram-mod-n-match",
                str(mn),
                "--spec-ngram-mod-n-max",
                str(mmax),
                "--spec-ngram-mod-n-min",
                str(mmin),
            ],
        ),
    }
    if args.live:
        wanted = args.live.split(",")
        rows = live_check(factories, [r for r in requests if r.prompt_id in wanted], vocab, args)
        print(json.dumps({"live": rows}))
        return 0
    table = args.table
    results = {"suffix": run_suffix(K_MAX, requests, table, vocab)}
    results.update({name: run_rule(make(), requests, table, vocab) for name, (make, _) in factories.items()})
    if args.long_suffix > K_MAX:
        results[f"suffix k<={args.long_suffix}"] = run_suffix(args.long_suffix, requests, table, vocab)
    out = summary(results, requests, table)
    names = list(results)
    print("category (median) | " + " | ".join(f"{n}: speedup, τ, α" for n in names))
    print("|".join(["---"] * (len(names) + 1)))
    for group, by_name in out.items():
        cells = [by_name[n] for n in names]
        alpha = [f"{c['alpha']:.2f}" if c["alpha"] is not None else "-" for c in cells]
        print(
            f"{group} | "
            + " | ".join(f"{c['speedup']:.3f}x, {c['tau']:.2f}, {a}" for c, a in zip(cells, alpha, strict=True))
        )
    print(json.dumps({"prompts": len(requests), "simple": args.simple, "mod": args.mod, "summary": out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
