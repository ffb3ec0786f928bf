"""Soak: many concurrent clients against one OpenAI-compatible server for a bounded time, then a verdict.

    python scripts/soak.py --serve smollm2-135m --serve-args "--draft ngram"   # starts `spekula serve` on loopback
    python scripts/soak.py --url http://127.0.0.1:8000 --pid 12345              # a server already running

--serve MODEL starts `python -m spekula serve --target MODEL --port 0` (plus --serve-args; every other serve
option at its default), reads its address from its log (--server-log), and stops it with SIGINT at the end.
--url uses a running server; its RSS is measured only when --pid names its process.

The run, in order:
1. RSS at start (psutil, the server's pid).
2. The reference: each of GREEDY_PROMPTS once, greedy, one at a time, nothing else in flight.
3. The load: --clients clients (default 64), each in a loop until --duration (default 600 s) is over, picks a
   kind at random (seeded, --seed) with the weights of KINDS:
     greedy      a reference prompt again (streamed or not): its text must equal the reference's
     sampled     temperature 0.8, 8-64 tokens, streamed or not, completion or chat (chat when the server has it)
     disconnect  a stream of 256 tokens the client closes after 1-3 text events
     bad         one of BAD_INPUTS (NaN temperature, negative max_tokens, nesting too deep, unknown model, ...)
     long        a prompt past the model's context (max_model_len from /v1/models, else --context)
   A request in flight when the time is up finishes. RSS after --warmup seconds of load is the baseline.
4. The drain: every client's last request answered or past its deadline; /health polled until no request is
   running or waiting (spekula's /health reports both); RSS at the end.

Every request has one outcome:
  ok            2xx and whole (a body with choices; a stream with finish_reason and [DONE], no error event)
  disconnected  the client closed the stream on purpose, after a 200 and some text
  4xx           refused, 429 aside (expected for bad and long; a bug for a good request)
  429           queue full: correct behaviour when the response carries Retry-After (the client then waits it)
  5xx           server error, before or instead of an answer
  broken        a 200 that is not whole: a stream without finish_reason or [DONE], or with an error event
  transport     the connection failed (refused, reset, closed mid-response)
  lost          sent, but no response and no error before the client's own deadline (--deadline)

Targets (any missed: exit 1; a setup failure: exit 2): 0 5xx, 0 lost, 0 greedy mismatches, RSS growth after
warm-up <= --max-rss-growth % (default 5; when measured), and, as strict: 0 broken streams, 0 transport errors,
every bad and long input answered 4xx, no good request refused (4xx but 429), every 429 with Retry-After, no
request running or waiting once the drain is over. Prints a table, then the JSON summary as the last line
(also written to --json). Measured runs: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from spekula.bench.manifest import portable

try:
    import psutil
except ImportError:  # RSS is then reported as not measured
    psutil = None

OUTCOMES = ("ok", "disconnected", "4xx", "429", "5xx", "broken", "transport", "lost")
KINDS = {"greedy": 0.25, "sampled": 0.35, "disconnect": 0.10, "bad": 0.20, "long": 0.10}
GOOD_KINDS = ("greedy", "sampled", "disconnect")
EXPECT_4XX = ("bad", "long")

GREEDY_PROMPTS = (
    "The three primary colors are",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "The capital of France is",
    "To make a cup of tea, first",
    "import numpy as np\n\n",
    "Water boils at",
    "The quick brown fox",
)
SAMPLED_PROMPTS = (
    "Write a short poem about the sea.",
    "List three uses of a hash map.",
    "Explain what a compiler does.",
    "Tell me a story about a robot.",
    "What is the difference between a list and a tuple?",
)
GREEDY_TOKENS = 32
DISCONNECT_TOKENS = 256
NO_RETRY_AFTER = "429 without Retry-After"


def _bare(model: str, extra: str, chat: bool = False) -> bytes:
    """A body as raw JSON text, for what json.dumps would not write (NaN, Infinity, nesting)."""
    head = '"messages": [{"role": "user", "content": "hi"}]' if chat else '"prompt": "hi"'
    return f'{{"model": {json.dumps(model)}, {head}, "max_tokens": 4, {extra}}}'.encode()


BAD_INPUTS = {  # name -> (path, body for the served model's name); every one must be answered 4xx
    "nan_temperature": ("completions", lambda m: _bare(m, '"temperature": NaN')),
    "nan_temperature_stream": ("completions", lambda m: _bare(m, '"temperature": NaN, "stream": true')),
    "infinity_top_p": ("completions", lambda m: _bare(m, '"top_p": Infinity')),
    "string_nan_temperature": ("completions", lambda m: _bare(m, '"temperature": "NaN"')),
    "temperature_7": ("completions", lambda m: _bare(m, '"temperature": 7')),
    "negative_max_tokens": (
        "completions",
        lambda m: _bare(m, '"stream": true').replace(b'"max_tokens": 4', b'"max_tokens": -5'),
    ),
    "nested_50000_deep": ("completions", lambda m: _bare(m, '"metadata": ' + "[" * 50_000 + "]" * 50_000)),
    "unknown_model": ("completions", lambda m: _bare("no-such-model-" + m, '"stream": false')),
    "unknown_parameter": ("completions", lambda m: _bare(m, '"tempurature": 1')),
    "not_json": ("completions", lambda m: b'{"model": "' + m.encode() + b'", "prompt": '),
    "empty_prompt": ("completions", lambda m: _bare(m, '"n": 1').replace(b'"prompt": "hi"', b'"prompt": ""')),
    "bad_role": ("chat/completions", lambda m: _bare(m, '"n": 1', chat=True).replace(b'"user"', b'"robot"')),
}


@dataclass
class Tally:
    """Every request's outcome by kind, the checks beside the outcomes, and a few examples of each failure."""

    outcomes: dict[str, Counter] = field(default_factory=lambda: {k: Counter() for k in KINDS})
    bad_status: dict[str, Counter] = field(default_factory=dict)  # bad input name -> status (or outcome) counts
    greedy_checked: int = 0
    mismatches: int = 0
    no_retry_after: int = 0
    mismatched: Counter = field(default_factory=Counter)  # greedy prompt -> texts that differed
    latencies: list[float] = field(default_factory=list)  # seconds, whole good answers
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, kind: str, outcome: str, detail: str = "") -> None:
        self.outcomes[kind][outcome] += 1
        if outcome not in ("ok", "disconnected", "429") and not (outcome == "4xx" and kind in EXPECT_4XX):
            self.note(f"{kind}:{outcome}", detail)

    def note(self, what: str, detail: str) -> None:
        seen = self.examples.setdefault(what, [])
        if len(seen) < 3 and detail[:300] not in seen:
            seen.append(detail[:300])

    def total(self, outcome: str, kinds=KINDS) -> int:
        return sum(self.outcomes[k][outcome] for k in kinds)


@dataclass
class Plan:
    """What the clients know about the server, found before the load starts."""

    base: str  # http://host:port (the API under /v1)
    model: str
    context: int
    chat: bool
    reference: dict[str, str]  # greedy prompt -> text
    headers: dict[str, str]
    weights: dict[str, float] = field(default_factory=lambda: dict(KINDS))  # kind -> weight in the mix


# -- one request ----------------------------------------------------------------------------------


class Answer(Exception):
    """How a request ended, when that is not a whole answer; carries the outcome."""

    def __init__(self, outcome: str, detail: str = "") -> None:
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


def _status_outcome(status: int) -> str:
    return "429" if status == 429 else "4xx" if 400 <= status < 500 else "5xx" if status >= 500 else "broken"


async def _post(client: httpx.AsyncClient, plan: Plan, path: str, body: bytes, stream: bool, stop_after: int = 0):
    """One request; returns (text, finish_reason) of a whole answer, or raises Answer.

    stop_after > 0: a stream the client closes after that many text events (Answer("disconnected")).
    """
    url = f"{plan.base}/v1/{path}"
    headers = {**plan.headers, "content-type": "application/json"}
    try:
        async with client.stream("POST", url, content=body, headers=headers) as r:
            if r.status_code != 200:
                raw = await r.aread()
                if r.status_code == 429:
                    wait = r.headers.get("retry-after")
                    raise Answer("429", NO_RETRY_AFTER if wait is None else f"retry after {wait}")
                raise Answer(_status_outcome(r.status_code), f"{r.status_code} {raw[:200]!r}")
            if not stream:
                raw = await r.aread()
                try:
                    choice = json.loads(raw)["choices"][0]
                    text = choice["text"] if "text" in choice else choice["message"]["content"]
                    finish = choice["finish_reason"]
                except (ValueError, KeyError, IndexError, TypeError):
                    raise Answer("broken", f"200 without a choice: {raw[:200]!r}") from None
                if not finish:
                    raise Answer("broken", "200 without finish_reason")
                return text or "", finish
            pieces: list[str] = []
            finish, done, events = None, False, 0
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[len("data: ") :]
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    raise Answer("broken", f"error event: {event['error']}")
                for choice in event.get("choices") or []:
                    piece = choice.get("text") if "text" in choice else (choice.get("delta") or {}).get("content")
                    if piece:
                        pieces.append(piece)
                        events += 1
                    finish = choice.get("finish_reason") or finish
                if stop_after and events >= stop_after:
                    raise Answer("disconnected")  # leaving the block closes the connection mid-stream
            if not (done and finish):
                raise Answer(
                    "broken", f"stream ended: finish_reason={finish!r}, [DONE] {'seen' if done else 'missing'}"
                )
            return "".join(pieces), finish
    except httpx.TransportError as e:
        raise Answer("transport", f"{type(e).__name__}: {e}") from None


def _completion(plan: Plan, prompt: str, chat: bool, **params: Any) -> tuple[str, bytes]:
    body: dict[str, Any] = {"model": plan.model, **params}
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return ("chat/completions" if chat else "completions"), json.dumps(body).encode()


async def one_request(client: httpx.AsyncClient, plan: Plan, rng: random.Random, tally: Tally, deadline_s: float):
    kind = rng.choices(list(plan.weights), weights=list(plan.weights.values()))[0]
    stream = rng.random() < 0.5
    stop_after = 0
    bad_name = None
    prompt = None
    if kind == "greedy":
        prompt = rng.choice(GREEDY_PROMPTS)
        path, body = _completion(plan, prompt, False, max_tokens=GREEDY_TOKENS, temperature=0.0, stream=stream)
    elif kind == "sampled":
        chat = plan.chat and rng.random() < 0.5
        path, body = _completion(
            plan,
            rng.choice(SAMPLED_PROMPTS),
            chat,
            max_tokens=rng.randint(8, 64),
            temperature=0.8,
            top_p=0.95,
            stream=stream,
        )
    elif kind == "disconnect":
        stream, stop_after = True, rng.randint(1, 3)
        path, body = _completion(
            plan, rng.choice(SAMPLED_PROMPTS), False, max_tokens=DISCONNECT_TOKENS, temperature=0.8, stream=True
        )
    elif kind == "bad":
        bad_name = rng.choice(list(BAD_INPUTS))
        path, make = BAD_INPUTS[bad_name]
        body, stream = make(plan.model), b'"stream": true' in make(plan.model)
    else:
        path, body = _completion(plan, " hello" * (plan.context + 64), False, max_tokens=8, stream=stream)
    start = time.monotonic()
    detail = ""
    try:
        text, _ = await asyncio.wait_for(_post(client, plan, path, body, stream, stop_after), deadline_s)
        outcome = "ok"
    except Answer as a:
        outcome, detail, text = a.outcome, a.detail, None
    except TimeoutError:
        outcome, detail, text = "lost", f"no answer within {deadline_s:g} s", None
    if outcome == "429" and detail == NO_RETRY_AFTER:
        tally.no_retry_after += 1
    if kind in GOOD_KINDS and outcome == "ok":
        tally.latencies.append(time.monotonic() - start)
    if kind == "greedy" and outcome == "ok":
        tally.greedy_checked += 1
        if text != plan.reference[prompt]:
            tally.mismatches += 1
            ref = plan.reference[prompt]
            at = next((i for i, (a, b) in enumerate(zip(text, ref, strict=False)) if a != b), min(len(text), len(ref)))
            tally.mismatched[prompt] += 1
            tally.note(
                "greedy:mismatch",
                f"{prompt!r} ({'stream' if stream else 'json'}) differs at character {at}: "
                f"{text[max(0, at - 40) : at + 40]!r} vs the reference's {ref[max(0, at - 40) : at + 40]!r}",
            )
    if bad_name is not None:
        tally.bad_status.setdefault(bad_name, Counter())[outcome] += 1
    tally.add(kind, outcome, f"{bad_name or kind} ({'stream' if stream else 'json'}): {detail}")
    return outcome, detail


async def client_loop(
    i: int, client: httpx.AsyncClient, plan: Plan, seed: int, until: float, tally: Tally, deadline_s: float
):
    rng = random.Random(seed * 100_003 + i)
    while True:  # every client sends at least one request
        outcome, detail = await one_request(client, plan, rng, tally, deadline_s)
        if time.monotonic() >= until:
            return
        if outcome == "429":  # a polite client waits as told (at most 5 s), then goes on
            try:
                wait = float(detail.removeprefix("retry after "))
            except ValueError:
                wait = 1.0
            await asyncio.sleep(min(wait, 5.0, max(0.0, until - time.monotonic())))


# -- setup, RSS and the run -----------------------------------------------------------------------


class Setup(Exception):
    """The soak could not start (exit 2)."""


def rss_mb(pid: int | None) -> float | None:
    if pid is None or psutil is None:
        return None
    try:
        return psutil.Process(pid).memory_info().rss / 2**20
    except psutil.Error:
        return None


async def discover(client: httpx.AsyncClient, base: str, headers: dict, context: int | None) -> Plan:
    try:
        r = await client.get(f"{base}/v1/models", headers=headers)
    except httpx.TransportError as e:
        raise Setup(f"no server at {base}: {type(e).__name__} {e}") from None
    if r.status_code != 200:
        raise Setup(f"GET /v1/models answered {r.status_code}: {r.text[:300]}")
    card = r.json()["data"][0]
    ctx = card.get("max_model_len") or context
    if not ctx:
        raise Setup("the server does not report max_model_len: pass --context")
    plan = Plan(base, card["id"], int(ctx), False, {}, headers)
    path, body = _completion(plan, "hi", True, max_tokens=1)
    probe = await client.post(
        f"{base}/v1/{path}", content=body, headers={**headers, "content-type": "application/json"}
    )
    plan.chat = probe.status_code == 200
    for prompt in GREEDY_PROMPTS:  # the reference: one at a time, nothing else in flight
        path, body = _completion(plan, prompt, False, max_tokens=GREEDY_TOKENS, temperature=0.0)
        try:
            plan.reference[prompt], _ = await _post(client, plan, path, body, stream=False)
        except Answer as a:
            raise Setup(f"the reference request for {prompt!r} failed: {a.outcome} {a.detail}") from None
    return plan


async def health(client: httpx.AsyncClient, base: str, wait_s: float) -> int | None:
    """Requests still running or waiting once the drain is over (None: /health does not say)."""
    end = time.monotonic() + wait_s
    busy = None
    while True:
        try:
            r = await client.get(f"{base}/health")
            info = r.json()
            busy = int(info["running"]) + int(info["waiting"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return None
        if busy == 0 or time.monotonic() > end:
            return busy
        await asyncio.sleep(0.25)  # polling a live server, not synchronising a test


async def soak(
    base: str,
    pid: int | None,
    *,
    clients: int,
    duration_s: float,
    warmup_s: float,
    deadline_s: float,
    seed: int,
    api_key: str | None = None,
    context: int | None = None,
    max_rss_growth: float = 5.0,
    weights: dict[str, float] | None = None,
) -> dict:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    rss: dict[str, float | None] = {"start": rss_mb(pid)}
    async with httpx.AsyncClient(timeout=None, limits=limits) as client:  # deadlines are the client's own
        plan = await discover(client, base, headers, context)
        plan.weights = dict(weights or KINDS)
        tally = Tally()
        began = time.monotonic()
        until = began + duration_s
        samples: list[float] = []
        timeline: list[tuple[float, float]] = []  # (seconds into the load, MB) every 30 s

        async def watch():
            while True:
                now = rss_mb(pid)
                if now is not None:
                    samples.append(now)
                    if len(samples) % 30 == 1:
                        timeline.append((round(time.monotonic() - began), round(now, 1)))
                if "warm" not in rss and time.monotonic() - began >= warmup_s:
                    rss["warm"] = now
                await asyncio.sleep(1.0)

        watcher = asyncio.create_task(watch())
        try:
            await asyncio.gather(
                *(client_loop(i, client, plan, seed, until, tally, deadline_s) for i in range(clients))
            )
        finally:
            watcher.cancel()
        elapsed = time.monotonic() - began
        busy = await health(client, base, wait_s=30.0)
    rss.setdefault("warm", None)
    rss["end"] = rss_mb(pid)
    rss["max"] = max(samples) if samples else None
    summary = summarize(plan, tally, rss, busy, clients, duration_s, warmup_s, deadline_s, elapsed, max_rss_growth)
    summary["rss_timeline"] = timeline
    return summary


def _percentile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(q * len(xs)))], 3)


def summarize(plan, tally, rss, busy, clients, duration_s, warmup_s, deadline_s, elapsed, max_rss_growth) -> dict:
    requests = {o: tally.total(o) for o in OUTCOMES}
    requests["sent"] = sum(requests.values())
    growth = None
    if rss.get("warm") and rss.get("end"):
        growth = round(100.0 * (rss["end"] - rss["warm"]) / rss["warm"], 2)
    expected_missed = sum(tally.outcomes[k][o] for k in EXPECT_4XX for o in ("ok", "disconnected", "broken"))
    targets = {  # name -> (value, limit); met when value <= limit; None: not measured
        "5xx": (requests["5xx"], 0),
        "lost": (requests["lost"], 0),
        "greedy_mismatches": (tally.mismatches, 0),
        "rss_growth_pct": (growth, max_rss_growth),
        "broken": (requests["broken"], 0),
        "transport": (requests["transport"], 0),
        "bad_or_long_not_4xx": (expected_missed, 0),
        "good_refused_4xx": (tally.total("4xx", GOOD_KINDS), 0),
        "429_without_retry_after": (tally.no_retry_after, 0),
        "busy_after_drain": (busy, 0),
    }
    checked = {
        name: {"value": v, "limit": lim, "met": None if v is None else v <= lim} for name, (v, lim) in targets.items()
    }
    return {
        "url": plan.base,
        "model": plan.model,
        "context": plan.context,
        "chat": plan.chat,
        "clients": clients,
        "mix": plan.weights,
        "duration_s": duration_s,
        "warmup_s": warmup_s,
        "deadline_s": deadline_s,
        "elapsed_s": round(elapsed, 1),
        "requests": requests,
        "by_kind": {k: {o: tally.outcomes[k][o] for o in OUTCOMES if tally.outcomes[k][o]} for k in KINDS},
        "bad_inputs": {name: dict(c) for name, c in sorted(tally.bad_status.items())},
        "greedy": {
            "prompts": len(plan.reference),
            "checked": tally.greedy_checked,
            "mismatches": tally.mismatches,
            "mismatched_prompts": dict(tally.mismatched),
        },
        "latency_s": {"p50": _percentile(tally.latencies, 0.5), "p99": _percentile(tally.latencies, 0.99)},
        "rss_mb": {k: None if v is None else round(v, 1) for k, v in rss.items()},
        "rss_growth_pct": growth,
        "targets": checked,
        "examples": tally.examples,
        "passed": all(t["met"] is not False for t in checked.values()),
    }


def table(s: dict) -> str:
    rows = [f"soak: {s['clients']} clients, {s['duration_s']:g} s, {s['model']} at {s['url']}"]
    rows.append(f"{'kind':<11}" + "".join(f"{o:>13}" for o in OUTCOMES))
    for kind, counts in s["by_kind"].items():
        rows.append(f"{kind:<11}" + "".join(f"{counts.get(o, 0):>13}" for o in OUTCOMES))
    rows.append(f"{'all':<11}" + "".join(f"{s['requests'][o]:>13}" for o in OUTCOMES))
    r = s["rss_mb"]
    rows.append(
        f"RSS MB: start {r.get('start')}, after warm-up {r.get('warm')}, end {r.get('end')}, max {r.get('max')}"
    )
    g = s["greedy"]
    rows.append(f"greedy: {g['checked']} checked against {g['prompts']} references, {g['mismatches']} mismatches")
    for name, t in s["targets"].items():
        mark = "n/a " if t["met"] is None else "ok  " if t["met"] else "MISS"
        rows.append(f"  {mark} {name}: {t['value']} (limit {t['limit']})")
    rows.append("PASSED" if s["passed"] else "FAILED")
    return "\n".join(rows)


# -- a server of our own --------------------------------------------------------------------------

SERVING = re.compile(r"serving .* on (http://\S+?)/v1")


class OwnServer:
    """`python -m spekula serve --target MODEL --port 0 ...` on loopback, its log in a file."""

    def __init__(self, model: str, extra: list[str], log_path: Path, startup_s: float = 900.0) -> None:
        self.cmd = [sys.executable, "-m", "spekula", "serve", "--target", model, "--host", "127.0.0.1", "--port", "0"]
        self.cmd += ["--log-level", "warning", *extra]
        self.log_path = log_path
        self.startup_s = startup_s

    def __enter__(self) -> OwnServer:
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + self.startup_s
        while True:
            found = SERVING.search(self.log_path.read_text(errors="replace"))
            if found:
                self.base = found.group(1)
                break
            if self.proc.poll() is not None or time.monotonic() > end:
                self.stop()
                raise Setup(f"`{shlex.join(self.cmd)}` did not start; its log:\n{self._tail()}")
            time.sleep(0.5)  # waiting for a child process's log line
        with httpx.Client(timeout=5.0) as c:  # the line comes just before uvicorn listens
            while True:
                try:
                    if c.get(f"{self.base}/health").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                if self.proc.poll() is not None or time.monotonic() > end:
                    self.stop()
                    raise Setup(f"the server never answered /health; its log:\n{self._tail()}")
                time.sleep(0.5)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode

    def tracebacks(self) -> int:
        return self.log_path.read_text(errors="replace").count("Traceback (most recent call last)")

    def _tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-30:])

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.stop()


# -- command line ---------------------------------------------------------------------------------


def mix_option(text: str) -> dict[str, float]:
    weights = {}
    for part in text.split(","):
        kind, _, weight = part.partition("=")
        if kind.strip() not in KINDS:
            raise argparse.ArgumentTypeError(f"unknown kind {kind.strip()!r}; the kinds: {', '.join(KINDS)}")
        try:
            weights[kind.strip()] = float(weight)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r}: a weight is a number, as in greedy=1") from None
    if not weights or min(weights.values()) < 0 or sum(weights.values()) <= 0:
        raise argparse.ArgumentTypeError("weights must be >= 0 and not all 0")
    return weights


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="a running server (http://host:port; the API under /v1)")
    where.add_argument("--serve", metavar="MODEL", help="start `spekula serve --target MODEL` on loopback")
    p.add_argument("--serve-args", default="", help="more options for spekula serve, one string (e.g. '--draft ngram')")
    p.add_argument("--server-log", default=None, help="--serve: the server's log file (default: a temporary file)")
    p.add_argument("--pid", type=int, default=None, help="--url: the server's process id, for its RSS")
    p.add_argument("--api-key", default=os.environ.get("SPEKULA_API_KEY"), help="(default: $SPEKULA_API_KEY)")
    p.add_argument("--clients", type=int, default=64, help="concurrent clients (default 64)")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load (default 600)")
    p.add_argument("--warmup", type=float, default=60.0, help="RSS baseline after this many seconds (default 60)")
    p.add_argument(
        "--deadline",
        type=float,
        default=660.0,
        help="a request unanswered after this many seconds is lost (default 660: spekula's default "
        "--request-timeout 600 s, its 30 s grace for a hung worker, and 30 s more)",
    )
    p.add_argument("--context", type=int, default=None, help="the model's context, if /v1/models does not say")
    p.add_argument("--max-rss-growth", type=float, default=5.0, help="RSS growth after warm-up allowed, %% (default 5)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--mix",
        type=mix_option,
        default=None,
        help="kinds and weights, e.g. greedy=1,bad=1 (default: "
        + ",".join(f"{k}={w:g}" for k, w in KINDS.items())
        + ")",
    )
    p.add_argument("--json", default=None, help="also write the JSON summary to this file")
    args = p.parse_args(argv)
    if args.clients < 1 or args.duration <= 0 or args.deadline <= 0:
        p.error("--clients, --duration and --deadline must be positive")
    if not 0 <= args.warmup < args.duration:
        p.error("--warmup must be at least 0 and less than --duration")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    own = None
    try:
        if args.serve:
            log_path = Path(args.server_log or tempfile.mkstemp(prefix="soak-server-", suffix=".log")[1])
            own = OwnServer(args.serve, shlex.split(args.serve_args), log_path).__enter__()
            base, pid = own.base, own.proc.pid
        else:
            base, pid = args.url.rstrip("/").removesuffix("/v1"), args.pid
        summary = asyncio.run(
            soak(
                base,
                pid,
                clients=args.clients,
                duration_s=args.duration,
                warmup_s=args.warmup,
                deadline_s=args.deadline,
                seed=args.seed,
                api_key=args.api_key,
                context=args.context,
                max_rss_growth=args.max_rss_growth,
                weights=args.mix,
            )
        )
    except Setup as e:
        if own is not None:
            own.stop()
        print(f"soak: {e}", file=sys.stderr)
        return 2
    # what the summary records names no machine: paths relative to the checkout (spekula.bench.manifest.portable)
    summary["command"] = shlex.join(portable([sys.executable, *sys.argv] if argv is None else argv))
    if own is not None:
        summary["server"] = {
            "command": shlex.join(portable(own.cmd)),
            "exit_code": own.stop(),
            "tracebacks_in_log": own.tracebacks(),
            "log": portable(str(own.log_path)),
        }
    print(table(summary), file=sys.stderr)
    line = json.dumps(summary)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    print(line)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
