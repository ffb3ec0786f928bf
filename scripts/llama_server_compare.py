"""spekula serve against llama.cpp's own llama-server, plain and speculating, on a fresh and on a warm server.

Starts every contender on loopback, one after another (each ready before the next starts), on the same GGUF with the
same threads, and sends each request to all of them, one request in flight at a time, the contenders' order rotating
from request to request (so none always runs first). OpenAI chat requests, greedy (temperature 0), as a client sees
them: tokens/s per request is the answer's tokens over the request's wall time, its tokens counted by one rule for every
contender: the target's tokenizer over the answer's text (`recount`). The servers' own `usage.completion_tokens`
(kept as usage_tokens) do not count alike: llama-server counts the end-of-generation token it sampled, spekula
does not, so on an answer that ends there llama-server would claim one token more for the same text and time.

The prompts (`--workload`: the built-in suite, src/spekula/bench/suite, which the controller was tuned on, or a JSON
Lines file of held-out prompts in `spekula bench --workload`'s format) are split three ways, each category's prompts
dealt in turn (an edit session's two turns stay together, in order): set A, set B and the warm-up set W.

1. cold: set A on the freshly started servers;
2. warm-up: set W, not reported (it fills each server's memory: spekula's suffix cache of earlier answers,
   llama-server's n-gram pool and prompt cache);
3. warm: set B, prompts no server has seen, on servers that have now answered A and W.

So cold and warm are measured on different prompts, each against llama-server's plain decoding on the same
prompts in the same phase. `--warmup-rounds N` sends W N times (with a salt line per round, so it is new
text to every cache) to warm the servers longer. `--warmup-workload builtin` takes W from another workload, whole,
and deals --workload's prompts to A and B only: held-out prompts on servers that other traffic has warmed.

Contenders (`--contenders`, comma-separated; default: all of these but the last):
  llama-server          llama-server -m GGUF -t T -tb T -np P --port ... (its defaults otherwise)
  ngram-simple          ... --spec-type ngram-simple
  ngram-mod             ... --spec-type ngram-mod
  spekula               spekula serve --target MODEL --threads T --port ... (its defaults: suffix, k auto)
  spekula-plain         ... --draft none
  spekula-any-rows      ... --prompt-cache-any-rows (not by default: what reusing every kept row, as llama-server's
                        cache_prompt does, would gain over the default's history-exact prompt cache)

The binary is $LLAMA_SERVER, default .venv/bin/llama-server (`make llama-server` builds it from the same
llama.cpp source as the installed llama-cpp-python). Writes OUT/results.jsonl (one line per request and
contender), OUT/table.md, OUT/commands.txt and each server's log (an OUT that holds a run's results is refused: a new
run would write over them); the last line printed is one JSON object.

    .venv/bin/python scripts/llama_server_compare.py OUT [--max-tokens 96] [--warmup-rounds 1]
    .venv/bin/python scripts/llama_server_compare.py OUT --max-tokens 0 --categories code-editing,repeat-editing,...
    .venv/bin/python scripts/llama_server_compare.py OUT --workload HELD-OUT.jsonl [--warmup-workload builtin]
    .venv/bin/python scripts/llama_server_compare.py OUT --retable   # OUT/table.md again from OUT/results.jsonl
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import shlex
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

from spekula.bench.manifest import portable
from spekula.bench.workloads import BUILTIN, TURN, WorkItem, WorkloadError, conversation_order, load_workload

ROOT = Path(__file__).resolve().parents[1]
PLAIN = "llama-server"
SPEC_TYPES = {"llama-server": None, "ngram-simple": "ngram-simple", "ngram-mod": "ngram-mod"}
SPEKULA = {"spekula": [], "spekula-plain": ["--draft", "none"], "spekula-any-rows": ["--prompt-cache-any-rows"]}
CONTENDERS = [*SPEC_TYPES, *SPEKULA]
DEFAULT_CONTENDERS = [c for c in CONTENDERS if c != "spekula-any-rows"]


@dataclass(frozen=True)
class Server:
    name: str
    argv: list[str]
    port: int
    model: str = ""  # what it lists at /v1/models, once it answers

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument(
        "--model",
        default="qwen2.5-coder-1.5b",
        help="a built-in model name: its GGUF, and its tokenizer to count tokens",
    )
    ap.add_argument("--contenders", default=",".join(DEFAULT_CONTENDERS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=1, help="llama-server's -np (slots)")
    ap.add_argument(
        "--max-tokens", type=int, default=96, help="at most this many tokens an answer; 0: each prompt's own"
    )
    ap.add_argument(
        "--workload",
        default=BUILTIN,
        help="the prompts: 'builtin' (the shipped suite, which the controller was tuned on; the default) or a JSON "
        "Lines file in `spekula bench --workload`'s format, e.g. held-out prompts kept outside the repository",
    )
    ap.add_argument(
        "--categories", help="comma-separated: only the workload's prompts of these categories (default: every one)"
    )
    ap.add_argument("--warmup-rounds", type=int, default=1)
    ap.add_argument(
        "--warmup-workload",
        help="the warm-up set W from this workload ('builtin' or a JSON Lines file), every prompt of it, and "
        "--workload's prompts dealt to A and B only: held-out prompts measured on servers warmed by other traffic "
        "(default: W is a third of --workload's prompts)",
    )
    ap.add_argument("--seed", type=int, default=0, help="the order of each set")
    ap.add_argument("--port", type=int, default=18300, help="the first contender's port; the next ones follow")
    ap.add_argument("--start-timeout", type=float, default=600.0)
    ap.add_argument(
        "--retable",
        action="store_true",
        help="start nothing: OUT/table.md again from OUT/results.jsonl(.gz), tokens recounted",
    )
    args = ap.parse_args(argv)
    args.contenders = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = [c for c in args.contenders if c not in CONTENDERS]
    if unknown or PLAIN not in args.contenders:
        ap.error(f"--contenders: choose from {', '.join(CONTENDERS)}, {PLAIN} included (the baseline)")
    if args.max_tokens < 0:
        ap.error(f"--max-tokens must be 0 (each prompt's own) or more, got {args.max_tokens}")
    if args.retable:
        return args
    try:
        args.items = load_workload(args.workload)
    except WorkloadError as e:
        ap.error(f"--workload: {e}")
    try:
        args.warmup_items = None if args.warmup_workload is None else load_workload(args.warmup_workload)
    except WorkloadError as e:
        ap.error(f"--warmup-workload: {e}")
    if args.categories is not None:
        known = sorted({item.category for item in args.items})
        args.categories = [c.strip() for c in args.categories.split(",") if c.strip()]
        if not args.categories or set(args.categories) - set(known):
            ap.error(f"--categories: choose from {', '.join(known)}, got {args.categories}")
    return args


def workload(args: argparse.Namespace) -> list[WorkItem]:
    """The workload's prompts of --categories (every one by default)."""
    return [item for item in args.items if args.categories is None or item.category in args.categories]


def split_suite(items: list[WorkItem], seed: int, names: str = "ABW") -> dict[str, list[WorkItem]]:
    """Deal each category's prompts (an edit session's turns together) to sets A, B and W in turn (`names`: "AB"
    deals to A and B only, W left empty), then put each set in a seeded order with every session's turns one
    after the other."""
    units: dict[str, list[list[WorkItem]]] = {}
    sessions: dict[str, list[WorkItem]] = {}
    for item in items:
        found = TURN.fullmatch(item.id)
        if found:
            if found["session"] not in sessions:
                sessions[found["session"]] = []
                units.setdefault("sessions", []).append(sessions[found["session"]])
            sessions[found["session"]].append(item)
        else:
            units.setdefault(item.category, []).append([item])
    sets: dict[str, list[WorkItem]] = {"A": [], "B": [], "W": []}
    for group in units.values():
        for i, unit in enumerate(group):
            sets[names[i % len(names)]].extend(unit)
    rng = random.Random(seed)
    for items_ in sets.values():
        rng.shuffle(items_)
    return {name: conversation_order(items_) for name, items_ in sets.items()}


def phase_sets(args: argparse.Namespace) -> dict[str, list[WorkItem]]:
    """Sets A (cold), W (warm-up) and B (warm): from --workload alone, or W from --warmup-workload."""
    if args.warmup_items is None:
        return split_suite(workload(args), args.seed)
    sets = split_suite(workload(args), args.seed, names="AB")
    sets["W"] = split_suite(args.warmup_items, args.seed, names="W")["W"]
    return sets


def servers(args: argparse.Namespace, gguf: str) -> list[Server]:
    binary = os.environ.get("LLAMA_SERVER", str(ROOT / ".venv" / "bin" / "llama-server"))
    if not Path(binary).is_file():
        raise SystemExit(f"no llama-server at {binary}: run `make llama-server` (or set LLAMA_SERVER)")
    out = []
    for i, name in enumerate(args.contenders):
        port = args.port + i
        if name in SPEC_TYPES:
            argv = [binary, "-m", gguf, "-t", str(args.threads), "-tb", str(args.threads), "-np", str(args.parallel)]
            argv += ["--host", "127.0.0.1", "--port", str(port)]
            argv += ["--spec-type", SPEC_TYPES[name]] if SPEC_TYPES[name] else []
        else:
            argv = [sys.executable, "-m", "spekula", "serve", "--target", args.model, "--threads", str(args.threads)]
            argv += ["--port", str(port), *SPEKULA[name]]
        out.append(Server(name, argv, port))
    return out


def wait_ready(server: Server, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(1.0)  # polling a child process's HTTP port: no event to wait on
    raise SystemExit(f"{server.name} did not answer /health within {timeout:.0f} s")


def model_id(server: Server) -> str:
    """The model name the server lists first (spekula serve refuses another)."""
    with urllib.request.urlopen(server.url + "/v1/models", timeout=30) as r:
        return json.loads(r.read())["data"][0]["id"]


def ask(server: Server, item: WorkItem, max_tokens: int, salt: str = "") -> dict:
    """One greedy chat request, streamed: wall seconds, seconds to the first token, completion tokens, text."""
    messages = item.salted(salt).chat_messages() if salt else item.chat_messages()
    body = {
        "model": server.model,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    request = urllib.request.Request(
        server.url + "/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    first, tokens, parts, spec = None, None, [], None
    with urllib.request.urlopen(request, timeout=900) as r:
        for line in r:
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    first = time.perf_counter() if first is None else first
                    parts.append(text)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            spec = chunk.get("spec") or spec
    seconds = time.perf_counter() - start
    if tokens is None:
        raise SystemExit(f"{server.name} streamed no usage (stream_options.include_usage)")
    ttft = (first or time.perf_counter()) - start
    decode = seconds - ttft
    return {
        "seconds": seconds,
        "ttft_s": ttft,
        "tokens": tokens,
        "tokens_per_s": tokens / seconds,
        "decode_tokens_per_s": (tokens - 1) / decode if tokens > 1 and decode > 0 else None,
        "text": "".join(parts),
        **({"drafting": drafting(spec)} if spec else {}),
    }


def drafting(spec: dict) -> dict:
    """What spekula serve's `spec` object says the request drafted (llama-server sends none): target passes,
    drafts verified, tokens drafted and accepted, and steps by k, so a category's loss can be traced to its drafts."""
    return {key: spec.get(key) for key in ("target_passes", "drafts", "drafted", "accepted", "k_chosen", "timings")}


def recount(row: dict, count) -> dict:
    """The row with its tokens counted by `count` (text -> tokens, the same for every contender) and its rates
    from that count; the server's own count kept as usage_tokens."""
    tokens = count(row["text"])
    decode = row["seconds"] - row["ttft_s"] if row.get("ttft_s") is not None else 0.0  # run unstreamed: no ttft
    return {
        **row,
        "usage_tokens": row.get("usage_tokens", row["tokens"]),
        "tokens": tokens,
        "tokens_per_s": tokens / row["seconds"],
        "decode_tokens_per_s": (tokens - 1) / decode if tokens > 1 and decode > 0 else None,
    }


def token_counter(model: str):
    """text -> its tokens under the target's tokenizer (no special tokens)."""
    from spekula.models import resolve
    from spekula.text import TextCodec

    if model.endswith(".gguf"):
        raise SystemExit("give --model as a built-in name: its tokenizer counts every contender's tokens alike")
    tokenizer = TextCodec.load(resolve(model).hf_dir).tokenizer
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def run_phase(
    phase: str, items: list[WorkItem], live: list[Server], args, log, turn: int, count, salt: str = ""
) -> int:
    for item in items:
        for j in range(len(live)):
            server = live[(turn + j) % len(live)]
            row = {"phase": phase, "id": item.id, "category": item.category, "server": server.name}
            max_tokens = item.max_tokens_under(args.max_tokens or None)
            row = recount({**row, **ask(server, item, max_tokens, salt)}, count)
            log.write(json.dumps(row) + "\n")
            log.flush()
        turn += 1
        print(f"{phase} {item.id}", flush=True)
    return turn


def table(rows: list[dict], contenders: list[str]) -> tuple[str, dict]:
    """Per phase and category: each contender's median per-request tokens/s ratio over llama-server plain."""
    by = {(r["phase"], r["id"], r["server"]): r for r in rows}
    summary: dict = {}
    lines = []
    for phase in ("cold", "warm"):
        ids = sorted({(r["category"], r["id"]) for r in rows if r["phase"] == phase})
        if not ids:  # a run stopped before this phase (--retable on what it kept)
            continue
        categories = sorted({c for c, _ in ids})
        head = "| contender | all | " + " | ".join(categories) + f" | text as {PLAIN}'s |"
        lines += [
            f"\n{phase} (tokens/s over {PLAIN}, median per request)\n",
            head,
            "|---" * (len(categories) + 3) + "|",
        ]
        for name in contenders:
            ratios = {
                (c, i): by[(phase, i, name)]["tokens_per_s"] / by[(phase, i, PLAIN)]["tokens_per_s"] for c, i in ids
            }
            cells = {c: statistics.median(v for (cc, _), v in ratios.items() if cc == c) for c in categories}
            whole = statistics.median(ratios.values())
            same = _same_text(by, phase, ids, PLAIN, name)
            summary.setdefault(phase, {})[name] = {"all": whole, **cells, "same_text_as_plain": same}
            row = f"| {name} | {whole:.3f} | " + " | ".join(f"{cells[c]:.3f}" for c in categories)
            lines.append(row + f" | {same}/{len(ids)} |")
        for label, over in _derived(contenders):  # spekula per request over another contender, not llama-server
            ratios = {
                (c, i): by[(phase, i, "spekula")]["tokens_per_s"] / max(by[(phase, i, o)]["tokens_per_s"] for o in over)
                for c, i in ids
            }
            cells = {c: statistics.median(v for (cc, _), v in ratios.items() if cc == c) for c in categories}
            whole = statistics.median(ratios.values())
            summary[phase][label] = {"all": whole, **cells}
            same = "" if len(over) > 1 else f"{_same_text(by, phase, ids, over[0])}/{len(ids)} as {over[0]}'s"
            row = f"| {label} | {whole:.3f} | " + " | ".join(f"{cells[c]:.3f}" for c in categories)
            lines.append(row + (f" | {same} |" if same else " | |"))
        lines += drafting_lines(phase, [r for r in rows if r["phase"] == phase], categories)
        lines += pass_cost_lines(phase, [r for r in rows if r["phase"] == phase], categories)
        if not any(r.get("ttft_s") is not None for r in rows if r["phase"] == phase):
            continue  # requests not streamed: no time to the first token, no decode rate
        lines += [
            "",
            f"{phase}: decode only (tokens after the first over the time after it) and time to the first token",
            "",
        ]
        lines += [f"| contender | decode tokens/s over {PLAIN}'s | time to first token, median, s |", "|---|---|---|"]
        for name in contenders:
            pairs = [(by[(phase, i, name)], by[(phase, i, PLAIN)]) for _, i in ids]
            decode = [a["decode_tokens_per_s"] / b["decode_tokens_per_s"] for a, b in pairs if _decoded(a, b)]
            ttft = [a["ttft_s"] for a, _ in pairs if a.get("ttft_s") is not None]
            cell = f"{statistics.median(decode):.3f}" if decode else "-"
            lines.append(f"| {name} | {cell} | {statistics.median(ttft):.3f} |" if ttft else f"| {name} | {cell} | - |")
            summary[phase][name]["decode"] = statistics.median(decode) if decode else None
    return "\n".join(lines) + "\n", summary


def _same_text(by: dict, phase: str, ids: list[tuple[str, str]], other: str, name: str = "spekula") -> int:
    """How many of the phase's prompts `name` answered with `other`'s very text."""
    return sum(by[(phase, i, name)]["text"] == by[(phase, i, other)]["text"] for _, i in ids)


def drafting_lines(phase: str, rows: list[dict], categories: list[str]) -> list[str]:
    """Per spekula contender that drafted and category: the share of its target passes that verified a draft,
    and the share of drafted tokens accepted (from each answer's `spec`; absent in runs before it was kept)."""
    names = sorted({r["server"] for r in rows if (r.get("drafting") or {}).get("drafts")})
    if not names:
        return []
    lines = [
        "",
        f"{phase}: spekula's drafting, per category: passes that verified a draft, drafted tokens accepted",
        "",
    ]
    lines += ["| contender | " + " | ".join(categories) + " |", "|---" * (len(categories) + 1) + "|"]
    for name in names:
        cells = []
        for category in categories:
            mine = [
                r["drafting"] for r in rows if r["server"] == name and r["category"] == category and r.get("drafting")
            ]
            passes, drafts = sum(d["target_passes"] for d in mine), sum(d["drafts"] for d in mine)
            drafted, accepted = sum(d["drafted"] for d in mine), sum(d["accepted"] for d in mine)
            cells.append(f"{drafts}/{passes}, {accepted / drafted:.2f}" if drafted else f"0/{passes}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def pass_cost_lines(phase: str, rows: list[dict], categories: list[str]) -> list[str]:
    """Per category, from each answer's `spec` timings (absent in runs before they were kept): each spekula
    contender's milliseconds a target pass (its scoring time over its target passes, median per request), and
    spekula's scoring time over `--draft none`'s on the same prompt (median per request). The two tell a loss
    from drafting (more target time than plain decoding; below 1 where the drafts saved it) from a loss in the
    build's own passes (`--draft none` slower than llama-server with its scoring time no higher). The ratio compares
    two server processes: a difference in their own speed is in it too."""
    timed = [r for r in rows if ((r.get("drafting") or {}).get("timings") or {}).get("score_s") is not None]
    names = sorted({r["server"] for r in timed})
    if not names:
        return []
    score = {(r["id"], r["server"]): r["drafting"]["timings"]["score_s"] for r in timed}
    passes = {(r["id"], r["server"]): r["drafting"]["target_passes"] for r in timed}
    kinds = {r["id"]: r["category"] for r in timed}

    def cells(values: dict[str, float], form: str) -> str:  # id -> value, a median per category
        by = [[v for i, v in values.items() if kinds[i] == c] for c in categories]
        return " | ".join(form.format(statistics.median(v)) if v else "-" for v in by)

    lines = ["", f"{phase}: spekula's target passes: ms a pass; its scoring time over `--draft none`'s", ""]
    lines += ["| contender | " + " | ".join(categories) + " |", "|---" * (len(categories) + 1) + "|"]
    for name in names:
        ms = {i: 1000 * s / passes[(i, n)] for (i, n), s in score.items() if n == name and passes[(i, n)]}
        lines.append(f"| {name}, ms a pass | {cells(ms, '{:.1f}')} |")
    if {"spekula", "spekula-plain"} <= set(names):
        over = {
            i: s / score[(i, "spekula-plain")]
            for (i, n), s in score.items()
            if n == "spekula" and score.get((i, "spekula-plain"))
        }
        lines.append(f"| spekula's scoring time over spekula-plain's | {cells(over, '{:.3f}')} |")
    return lines


def _derived(contenders: list[str]) -> list[tuple[str, list[str]]]:
    """(row label, contenders whose faster one, per request, spekula's rate is divided by)."""
    if "spekula" not in contenders:
        return []
    modes = [m for m in SPEC_TYPES if SPEC_TYPES[m] and m in contenders]
    rows = [("spekula over the better n-gram mode", modes)] if modes else []
    rows += [(f"spekula over {name}", [name]) for name in ("spekula-plain", "spekula-any-rows") if name in contenders]
    return rows


def _decoded(a: dict, b: dict) -> bool:
    return bool(a.get("decode_tokens_per_s") and b.get("decode_tokens_per_s"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.retable and any((args.out / name).exists() for name in ("results.jsonl", "results.jsonl.gz")):
        # a run writes its results and the servers' logs over what the folder held
        raise SystemExit(
            f"{args.out} already holds a run's results: give a new folder (or --retable to rewrite its table)"
        )
    from spekula.models import resolve

    count = token_counter(args.model)
    if args.retable:
        saved = args.out / "results.jsonl"
        lines = saved.read_text() if saved.exists() else gzip.decompress((args.out / "results.jsonl.gz").read_bytes())
        rows = [recount(json.loads(line), count) for line in lines.splitlines()]
        return write_table(args, rows, {})
    gguf = str(resolve(args.model).gguf_path)
    sets = phase_sets(args)
    args.out.mkdir(parents=True, exist_ok=True)
    live = servers(args, gguf)
    # the servers' commands, naming no machine (paths from the checkout or $SPEKULA_CACHE: manifest.portable)
    (args.out / "commands.txt").write_text("\n".join(shlex.join(portable(s.argv)) for s in live) + "\n")
    procs = []
    try:
        # one after another: a server's load-time measurements (exact mode times its attention ways, the cost model
        # its passes) must not run beside another's start (docs/decisions/0014-attention-way-by-measurement.md)
        for s in live:
            log = open(args.out / f"{s.name}.log", "w")
            env = dict(os.environ, HF_HUB_OFFLINE="1")
            procs.append(subprocess.Popen(s.argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT))
            wait_ready(s, args.start_timeout)
        live = [replace(s, model=model_id(s)) for s in live]
        with open(args.out / "results.jsonl", "w") as log:
            turn = run_phase("cold", sets["A"], live, args, log, 0, count)
            for r in range(args.warmup_rounds):
                salt = f"(warm-up round {r})" if r else ""
                turn = run_phase("warmup", sets["W"], live, args, log, turn, count, salt=salt)
            run_phase("warm", sets["B"], live, args, log, turn, count)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(timeout=60)
    rows = [json.loads(line) for line in (args.out / "results.jsonl").read_text().splitlines()]
    return write_table(args, rows, {k: len(v) for k, v in sets.items()})


def write_table(args, rows: list[dict], sets: dict) -> int:
    contenders = [c for c in args.contenders if any(r["server"] == c for r in rows)]
    text, summary = table(rows, contenders)
    (args.out / "table.md").write_text(text)
    print(text)
    print(json.dumps({"out": str(args.out), "workload": args.workload, "sets": sets, "summary": summary}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
