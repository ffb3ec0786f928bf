"""Replay greedy outputs through a model-free proposer (n-gram or suffix lookup) offline: how many tokens
per target pass (τ) it would give, and what decode speedup that means at given pass costs, for the
engine's `--k auto`, fixed k, and two oracles.

Greedy output does not depend on the proposer, so the plain-decoding outputs of a `spekula bench` run
(its results.json, or .json.gz) are the outputs of every proposer and every k too. Each prompt's output
is replayed through spekula's own Engine (the loop, the proposer from the registry and the controller,
exactly as a request runs them) over a target whose logits are the recorded output (ReplayBackend):
the draft is accepted up to its first token that differs from the output, and each target pass costs
its width's seconds from --costs (e.g. measured by scripts/pass_costs.py). The pass costs are frozen;
acceptance is learnt as in a run, one engine per proposer and policy, prompts in the run's order (the
suffix proposer's cache of earlier outputs too). The run's warm-up request is not replayed. Prefill is
left out: the speedup printed is decode time only, an upper bound on what the request as a whole gains.
A results.json does not hold the calibrated pass costs (only each request's one-token pass), so --costs
is required.

Policies (--k):
  auto     the engine's controller (`--k auto`: Engine.new_controller, whatever control.py does today);
  N        a fixed k (FixedK);
  oracle   drafts the proposer's whole matched continuation at every step where it has one, capped at
           --k-max (FixedK(k_max): what a proposer drafts when asked for k_max tokens is its matched
           continuation), verified greedily. This is issue #14's "oracle that always drafts the matched
           continuation";
  perfect  knows in advance how much of the proposer's continuation at every position would be
           accepted, and drafts, at every step, the width that makes the whole output cheapest at these
           pass costs (a shortest path over output positions; a wider draft than what is accepted is
           chosen where that width's pass is cheaper). No controller driving this proposer can beat it.
The ratio columns (auto/oracle, auto/perfect) are the share of an oracle's speedup that k=auto reaches;
per category, the ratio of the median per-prompt speedups.

--by-class prints instead how often the (first) --draft proposer's drafts are accepted by draft class (the
matched length; for suffix lookup also "resync-N", the copy cursor's drafts after an edit) and draft
position, over every position of the outputs: what `--k auto` learns. An experiment, not a
maintained tool (scripts/experiments/README.md).

    .venv/bin/python scripts/experiments/ngram_replay.py RESULTS.json --costs 1:S1,2:S2,5:S5,9:S9 \\
        --draft ngram,suffix --k auto,oracle,perfect --categories code-editing [--max-tokens 96]

where Sn is the seconds a target pass of n tokens takes (scripts/pass_costs.py prints them in ms).
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spekula.backends.base import Backend
from spekula.backends.base import Sequence as KVSequence
from spekula.config import K_MAX, SamplingParams, SpecConfig, StopConfig
from spekula.control import Controller, FixedK
from spekula.cost import POSITIONS, CostModel
from spekula.draft_class import NO_DRAFT, DraftClass
from spekula.engine import Engine
from spekula.proposers import build_proposer
from spekula.proposers.base import Proposer
from spekula.proposers.ngram import NgramProposer

NAMESPACE = "replay"  # one namespace for the whole replay: later prompts draft from earlier outputs, as in a run
ORACLE, PERFECT, AUTO = "oracle", "perfect", "auto"


class ReplayBackend(Backend):
    """A target whose greedy choice is a recorded output: expect(prompt, tokens) before each request.

    Each pass's logits are one-hot at the recorded next token (a row past the end: at token 0, which
    the engine never asks for within the request's budget). The width of every score pass (its rows
    with logits: the prompt's rest the first step carries is the prefill's) is appended to `widths`."""

    name = "replay"

    def __init__(self, vocab_size: int, eos: int, context_length: int = 1 << 20) -> None:
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.eos_token_ids = frozenset({eos})
        self.widths: list[int] = []
        self._prompt_len = 0
        self._sequence: list[int] = []

    def expect(self, prompt: Sequence[int], tokens: Sequence[int]) -> None:
        """The next request: `prompt`, then the target emits `tokens` (its stop token last, if any)."""
        self._prompt_len = len(prompt)
        self._sequence = [*prompt, *tokens]
        self.widths = []

    def new_sequence(self) -> ReplaySequence:
        return ReplaySequence(self)


class ReplaySequence(KVSequence):
    def __init__(self, backend: ReplayBackend) -> None:
        super().__init__(backend.context_length)
        self.backend = backend

    def _forward(self, token_ids: list[int], num_logits: int) -> torch.Tensor:
        b, start = self.backend, self.length
        if start + len(token_ids) >= b._prompt_len:  # it scores the pending token: a step (else a prompt chunk)
            b.widths.append(num_logits)  # the first step's pass carries the prompt's rest too: not decode time
        logits = torch.zeros(num_logits, b.vocab_size)  # [num_logits, V]
        for row, i in enumerate(range(len(token_ids) - num_logits, len(token_ids))):
            nxt = start + i + 1  # the position this row predicts
            logits[row, b._sequence[nxt] if nxt < len(b._sequence) else 0] = 1.0
        return logits

    def _truncate(self, length: int) -> None:
        pass


@dataclass(frozen=True)
class Request:
    """One recorded request: its prompt ids, its greedy output, whether a stop token ended it, and the
    request's max_tokens."""

    prompt_id: str
    category: str
    prompt: list[int]
    output: list[int]
    stopped: bool = False
    max_tokens: int | None = None  # None: len(output)

    @property
    def budget(self) -> int:
        """The max_tokens to replay with: the output's length unless a stop token ended it before max_tokens."""
        return self.max_tokens if self.stopped and self.max_tokens else len(self.output)

    @property
    def emitted(self) -> int:
        """Tokens the target emits, the stop token included: what plain decoding spends a pass on each."""
        return len(self.output) + self.stopped


@dataclass(frozen=True)
class Replayed:
    seconds: float  # decode time: the target passes at their widths' costs
    passes: int


def truncated(request: Request, cap: int) -> Request:
    """The request as a run with max_tokens = cap would have emitted it: the first cap tokens of its output, ended by
    its stop token only where that came before the cap."""
    stopped = request.stopped and len(request.output) < cap
    return Request(request.prompt_id, request.category, request.prompt, request.output[:cap], stopped, cap)


def replay_engine(draft: str, spec: SpecConfig, costs: CostModel, backend: ReplayBackend) -> Engine:
    """An engine over `backend` with the registry's proposer `draft` ('ngram', 'suffix'), whose pass
    costs are `costs` (frozen: the replay's table, never re-measured)."""
    engine = Engine(backend, build_proposer(draft, spec, target=backend), spec)
    engine.costs = costs
    return engine


def replay(engine: Engine, request: Request, controller: Controller | None = None) -> Replayed:
    """Run `request` through the engine (controller None: the engine's own, as a request gets it) over
    its ReplayBackend; the decode seconds and target passes it spent."""
    backend: ReplayBackend = engine.target
    eos = next(iter(backend.eos_token_ids))
    backend.expect(request.prompt, [*request.output, eos])  # eos is only reached when the request stopped
    stop = StopConfig(max_tokens=request.budget)
    run = engine.generate(request.prompt, SamplingParams(), stop, controller=controller, namespace=NAMESPACE).run()
    if run.token_ids != request.output:  # the loop emits what the target chose, whatever was drafted
        raise RuntimeError(f"{request.prompt_id}: the replay emitted another output than the recorded one")
    return Replayed(sum(engine.costs.target_cost(w) for w in backend.widths), len(backend.widths))


def continuations(engine: Engine, request: Request, k_max: int) -> list[list[int]]:
    """What the engine's proposer would draft, asked for k_max tokens, at every position of the request's
    output (with what earlier requests left in its memory); the request then joins that memory, as a
    finished request does."""
    proposer = engine.proposer.create(NAMESPACE)
    full = request.prompt + request.output
    out = []
    for pos in range(request.emitted):
        context = full[: len(request.prompt) + pos]
        has_draft = proposer.draft_class(context) != NO_DRAFT
        out.append(proposer.propose(context, k_max, SamplingParams(), None).tokens if has_draft else [])
    proposer.draft_class(full)  # the whole output indexed, as the engine's last observe leaves it
    proposer.close()
    return out


def perfect_seconds(request: Request, drafts: list[list[int]], costs: CostModel, k_max: int, eos: int) -> Replayed:
    """The cheapest decode time of the output drafting from `drafts` (drafts[pos]: the proposer's
    continuation at output position pos) when the accepted length of every draft is known in advance:
    at each step any width d <= k_max of the continuation (d = 0: a plain step), a pass of d + 1 tokens
    that emits min(accepted, d) + 1. Shortest path over positions, from the end."""
    tokens = [*request.output, eos] if request.stopped else list(request.output)
    n, budget = len(tokens), request.budget
    best: list[tuple[float, int]] = [(0.0, 0)] * (n + 1)  # (seconds, passes) from position i to the end
    for pos in range(n - 1, -1, -1):
        draft = drafts[pos]
        accepted = 0
        while accepted < len(draft) and pos + accepted < n and draft[accepted] == tokens[pos + accepted]:
            accepted += 1
        options = []
        for d in range(min(len(draft), k_max, budget - pos - 1) + 1):
            nxt = min(pos + min(accepted, d) + 1, n)
            seconds, passes = best[nxt]
            options.append((costs.target_cost(d + 1) + seconds, passes + 1))
        best[pos] = min(options)
    return Replayed(*best[0])


def run_policy(draft: str, policy: str, requests: list[Request], table: dict[int, float], spec: SpecConfig, vocab):
    """Replay every request (in order, one engine) under one policy: {prompt_id: Replayed}."""
    vocab_size, eos = vocab
    costs = CostModel(target_s=dict(table), frozen=True)
    engine = replay_engine(draft, spec, costs, ReplayBackend(vocab_size, eos))
    out = {}
    for request in requests:
        if policy == PERFECT:
            drafts = continuations(engine, request, spec.k_max)
            out[request.prompt_id] = perfect_seconds(request, drafts, costs, spec.k_max, eos)
        else:
            controller = None if policy == AUTO else FixedK(spec.k_max if policy == ORACLE else int(policy))
            out[request.prompt_id] = replay(engine, request, controller)
    return out


def compare(
    requests: list[Request],
    drafts: list[str],
    policies: list[str],
    table: dict[int, float],
    spec: SpecConfig,
    vocab: tuple[int, int],
) -> dict[str, dict[str, dict[str, Replayed]]]:
    """{draft: {policy: {prompt_id: Replayed}}}."""
    return {d: {p: run_policy(d, p, requests, table, spec, vocab) for p in policies} for d in drafts}


def speedup(request: Request, replayed: Replayed, table: dict[int, float]) -> float:
    """Decode-time speedup over plain decoding (one one-token pass per emitted token)."""
    return request.emitted * table[1] / replayed.seconds


def label(policy: str) -> str:
    return policy if policy in (ORACLE, PERFECT) else f"k={policy}"


def ratio_columns(policies: list[str]) -> list[str]:
    """The oracles k=auto is compared with, where both were replayed."""
    return [p for p in (ORACLE, PERFECT) if AUTO in policies and p in policies]


def medians(
    by_policy: dict[str, dict[str, Replayed]], requests: list[Request], table: dict[int, float]
) -> dict[str, dict[str, float]]:
    """{group: {policy: median per-prompt decode speedup}}, the groups: each category, then "all"."""
    groups: dict[str, list[Request]] = {}
    for r in requests:
        groups.setdefault(r.category, []).append(r)
    groups["all"] = list(requests)
    return {
        group: {p: statistics.median(speedup(r, runs[r.prompt_id], table) for r in rs) for p, runs in by_policy.items()}
        for group, rs in groups.items()
    }


def report(results, requests: list[Request], table: dict[int, float]) -> list[str]:
    """Markdown lines per proposer: per prompt, then per category and over all prompts (medians)."""
    lines = []
    for draft, by_policy in results.items():
        policies = list(by_policy)
        ratios = ratio_columns(policies)
        head = [f"{label(p)}: τ, speedup" for p in policies] + [f"auto/{x}" for x in ratios]
        lines += [
            f"\nproposer: {draft}\n",
            "prompt | tokens | " + " | ".join(head),
            "|".join(["---"] * (len(head) + 2)),
        ]
        for r in requests:
            runs = {p: by_policy[p][r.prompt_id] for p in policies}
            s = {p: speedup(r, runs[p], table) for p in policies}
            cells = [f"{r.emitted / runs[p].passes:.2f}, {s[p]:.2f}x" for p in policies]
            cells += [f"{100 * s[AUTO] / s[x]:.0f}%" for x in ratios]
            lines.append(f"{r.prompt_id} | {r.emitted} | " + " | ".join(cells))
        head = [label(p) for p in policies] + [f"auto/{x}" for x in ratios]
        lines += ["", "category (median) | " + " | ".join(head), "|".join(["---"] * (len(head) + 1))]
        for group, med in medians(by_policy, requests, table).items():
            cells = [f"{med[p]:.3f}x" for p in policies] + [f"{100 * med[AUTO] / med[x]:.0f}%" for x in ratios]
            lines.append(f"{group} | " + " | ".join(cells))
    return lines


def acceptance_by_class(
    prompt: list[int],
    output: list[int],
    k: int,
    ngram_max: int,
    ngram_min: int,
    counts: dict,
    proposer: Proposer | None = None,
) -> None:
    """At every position of `output`, draft k tokens and count, per draft class (the matched length)
    and draft position i, how often position i was reached (every earlier token accepted) and accepted:
    counts[class][i] = [accepted, reached]. proposer: a request's proposer, fed every position in order
    (default: n-gram lookup with these match lengths)."""
    proposer = proposer or NgramProposer(ngram_max, ngram_min)
    for pos in range(len(output)):
        context = prompt + output[:pos]
        draft_class = proposer.draft_class(context)
        if draft_class == NO_DRAFT:
            continue
        rows = counts.setdefault(draft_class, [[0, 0] for _ in range(POSITIONS)])
        draft = proposer.propose(context, min(k, len(output) - pos), SamplingParams(), None).tokens
        for i, token in enumerate(draft):
            row = rows[min(i, POSITIONS - 1)]
            row[1] += 1
            if token != output[pos + i]:
                break
            row[0] += 1


def load_requests(path: str) -> tuple[list[Request], tuple[int, int]]:
    """The plain-decoding requests of a results.json (first repeat, run order) with their prompts encoded
    as the run encoded them, and (vocabulary size, stop token) of the run's target."""
    from spekula.bench.workloads import parse_lines
    from spekula.models import resolve
    from spekula.text import TextCodec

    with gzip.open(path, "rt") if path.endswith(".gz") else open(path) as f:
        result = json.load(f)
    items = parse_lines([json.dumps(item) for item in result["workload"]["items"]], "results.json", "default")
    by_id = {item.id: item for item in items}
    codec = TextCodec.load(resolve(result["target"]).hf_dir)
    chat = bool(result["manifest"]["config"].get("chat"))
    plain = sorted(
        (r for r in result["requests"] if r["config"] == result["baseline"] and r["repeat"] == 0 and r["token_ids"]),
        key=lambda r: r["order"],
    )
    requests = []
    for r in plain:
        item = by_id[r["prompt_id"]]
        prompt = item.encode(codec, chat=chat)
        if len(prompt) != r["stats"]["prompt_tokens"]:
            raise SystemExit(
                f"{r['prompt_id']}: the prompt encodes to {len(prompt)} tokens, the run had "
                f"{r['stats']['prompt_tokens']}: another tokenizer or template"
            )
        stopped = r["stats"]["finish_reason"] == "stop"
        requests.append(
            Request(
                r["prompt_id"],
                r["category"],
                prompt,
                r["token_ids"],
                stopped,
                item.max_tokens_under(result["max_tokens"]),
            )
        )
    eos = codec.tokenizer.eos_token_id
    top = max(max(r.prompt + r.output) for r in requests)
    vocab = (max(len(codec.tokenizer), top + 1, eos + 1), eos)
    return requests, vocab


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", help="a spekula bench results.json[.gz] (its plain-decoding outputs are replayed)")
    ap.add_argument("--costs", help="seconds per target pass by width, as n:s,n:s,... (at least n = 1)")
    ap.add_argument(
        "--by-class",
        action="store_true",
        help="instead: acceptance by draft class and position of the first --draft proposer, drafting 8 tokens "
        "everywhere",
    )
    ap.add_argument("--draft", default="ngram", help="comma-separated proposers: ngram and/or suffix")
    ap.add_argument(
        "--k", default="auto,oracle,perfect", help="comma-separated policies: auto, oracle, perfect and/or fixed k"
    )
    ap.add_argument(
        "--categories",
        help="comma-separated: report only these categories (every prompt is still replayed, in the run's order: "
        "the controller and the suffix cache learn from every request)",
    )
    ap.add_argument("--ngram-max", type=int, default=4)
    ap.add_argument("--ngram-min", type=int, default=1)
    ap.add_argument("--k-max", type=int, default=K_MAX, help=f"k=auto's and the oracles' longest draft ({K_MAX})")
    ap.add_argument("--max-tokens", type=int, help="replay only each output's first N tokens (a run with max_tokens N)")
    args = ap.parse_args()

    if not args.by_class and not args.costs:
        ap.error("give --costs (or --by-class)")
    wanted = set(args.categories.split(",")) if args.categories else None
    requests, vocab = load_requests(args.results)
    if args.max_tokens is not None:
        requests = [truncated(r, args.max_tokens) for r in requests]
    if args.by_class:
        counts: dict[DraftClass, list[list[int]]] = {}
        spec = SpecConfig(k=None, ngram_max=args.ngram_max, ngram_min=args.ngram_min)
        factory = build_proposer(args.draft.split(",")[0].strip(), spec, target=ReplayBackend(*vocab))  # one per run
        for r in requests:
            proposer = factory.create(NAMESPACE)
            acceptance_by_class(r.prompt, r.output, 8, args.ngram_max, args.ngram_min, counts, proposer)
            proposer.draft_class(r.prompt + r.output)  # the whole output indexed, then into the cache
            proposer.close()
        positions = [f"position {i + 1}" + ("+" if i == POSITIONS - 1 else "") for i in range(POSITIONS)]
        print("draft class | " + " | ".join(positions))
        for draft_class in sorted(counts, key=str, reverse=True):  # by name, as the table always listed them
            cells = [f"{a / n:.2f} of {n}" if n else "-" for a, n in counts[draft_class]]
            print(f"{draft_class} | " + " | ".join(cells))
        return 0
    table = {int(n): float(s) for n, s in (pair.split(":") for pair in args.costs.split(","))}
    if 1 not in table:
        ap.error("--costs needs the one-token pass (1:seconds)")
    policies = [p.strip() for p in args.k.split(",") if p.strip()]
    drafts = [d.strip() for d in args.draft.split(",") if d.strip()]
    spec = SpecConfig(k=None, k_max=args.k_max, ngram_max=args.ngram_max, ngram_min=args.ngram_min)
    results = compare(requests, drafts, policies, table, spec, vocab)
    shown = [r for r in requests if wanted is None or r.category in wanted]
    print("\n".join(report(results, shown, table)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
