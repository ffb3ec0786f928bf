"""What a decode step costs beyond llama.cpp's compute: spekula's Python loop against llama-server's C++ loop, at the
same verify width, on the same GGUF, token ids and threads.

For each width W (1: plain decoding; W > 1: a draft of W - 1 tokens at every step) the script starts llama-server on
loopback (plain, or `--spec-type ngram-simple --spec-ngram-simple-size-m W-1`) and, in this process, a spekula
pipeline over the same GGUF (plain, or suffix lookup with `SpecConfig(k=W-1)`), and sends the same greedy request to
each in turn, llama-server first, --rounds times after one untimed request each. The prompt is a block of code
repeated, so both drafters find W - 1 tokens to copy at every step and the target accepts them.

Both processes run with a small preloaded library (SHIM, compiled here with cc) that timestamps every OpenMP parallel
region, CLOCK_MONOTONIC at entry and exit. llama.cpp's CPU backend computes a graph in one region (ggml-cpu.c,
`#pragma omp parallel`), so a pass's regions are its compute, and the time between two passes' regions is everything
else a step does, measured the same way inside each loop: sampling or verification, the drafter, detokenizing, the
loop itself, and llama_decode's own work around the compute (building the graph, copying logits). Per request:
- passes after the first output token: llama-server's `predicted_n - 1 - draft_n_accepted` (its `timings`), whose
  time is `predicted_ms`; spekula's steps after its first (TextGeneration.steps(), text layer included), timed
  from the first step's output to the last one's;
- the last that many regions longer than --min-region-ms in the request's window are those passes: their median
  length is the compute per pass, the median gap between consecutive ones the rest of a step;
- spekula's llama_decode calls are also timed (llama_cpp._internals.LlamaContext.decode), so its gap splits into
  llama_decode outside the compute and the Python outside llama_decode.
llama-server runs with `-fa off --load-mode none`, as spekula's single-sequence context does (--server-args replaces
these two), and both processes get this one's environment (set GLIBC_TUNABLES=glibc.malloc.hugetlb=1 to give both
huge pages, as `spekula` gives itself). Prints one line per width and loop (medians over rounds), then one JSON line.

    GLIBC_TUNABLES=glibc.malloc.hugetlb=1 .venv/bin/python scripts/experiments/step_overhead_vs_server.py \\
        [--widths 1,9,17] [--tokens 128] [--rounds 3] [--port 18181]

llama-server is $LLAMA_SERVER, default .venv/bin/llama-server (`make llama-server`). Figures, command and machine:
docs/decisions/0007-llama-server-ngram.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A block the model goes on repeating when the prompt holds it several times: longer than the widest draft, so the
# last occurrence of any n-gram of the output is one block back and W - 1 tokens follow it.
BLOCK = (
    "def area(shape, size):\n"
    "    if shape == 'square':\n"
    "        return size * size\n"
    "    if shape == 'circle':\n"
    "        return 3.14159 * size * size\n"
    "    raise ValueError(shape)\n\n\n"
)
COPIES = 4
SERVER_ARGS = "-fa off --load-mode none"  # spekula's single-sequence llama.cpp context (spekula.backends.llamacpp)
NGRAM_N = 8  # ngram-simple's lookup length (also its shortest draft), at most W - 1
OUT_ENV = "STEP_REGIONS_OUT"  # where the shim appends its records
RECORD = struct.Struct("<qq")  # one region: entry and exit, CLOCK_MONOTONIC nanoseconds
SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef void (*parallel_t)(void (*)(void *), void *, unsigned, unsigned);
static parallel_t next_parallel;
static int out_fd = -1;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t) t.tv_sec * 1000000000 + t.tv_nsec;
}

__attribute__((constructor)) static void open_out(void) {
    const char *path = getenv("STEP_REGIONS_OUT");
    if (path) out_fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
}

void GOMP_parallel(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags) {
    if (!next_parallel) next_parallel = (parallel_t) dlsym(RTLD_NEXT, "GOMP_parallel");
    int64_t span[2];
    span[0] = now_ns();
    next_parallel(fn, data, num_threads, flags);
    span[1] = now_ns();
    if (out_fd >= 0 && write(out_fd, span, sizeof span) != sizeof span) out_fd = -1;
}
"""


def parse_widths(text: str) -> list[int]:
    try:
        values = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"widths must be comma-separated integers, got {text!r}") from None
    if not values or any(not 1 <= w <= 65 for w in values):
        raise argparse.ArgumentTypeError(f"widths must be integers in [1, 65] (1: plain decoding), got {text!r}")
    return values


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b", help="a built-in model name (its GGUF)")
    ap.add_argument("--widths", type=parse_widths, default=parse_widths("1,9,17"))
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per request")
    ap.add_argument("--rounds", type=int, default=3, help="timed requests per loop and width, alternating")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp threads (2 or more: one OpenMP region a pass)")
    ap.add_argument("--port", type=int, default=18181)
    ap.add_argument("--server-args", default=SERVER_ARGS, help="llama-server options besides model, threads, port")
    ap.add_argument("--min-region-ms", type=float, default=2.0, help="shorter OpenMP regions are not passes")
    ap.add_argument("--start-timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    if args.tokens < 3 or args.rounds < 1 or args.threads < 2:
        ap.error("--tokens must be >= 3, --rounds >= 1 and --threads >= 2")
    return args


def server_argv(binary: str, gguf: str, width: int, threads: int, port: int, extra: str = SERVER_ARGS) -> list[str]:
    """llama-server for one width: plain at width 1, else ngram-simple drafting exactly width - 1 tokens where its
    lookup n-gram (at most NGRAM_N tokens, and at most the draft: its shortest draft is that long) matches."""
    argv = [binary, "-m", gguf, "-t", str(threads), "-tb", str(threads), "-np", "1", "-c", "4096"]
    argv += ["--host", "127.0.0.1", "--port", str(port), "--metrics", *shlex.split(extra)]
    if width > 1:
        m = width - 1
        argv += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", str(m)]
        argv += ["--spec-ngram-simple-size-n", str(min(NGRAM_N, m))]
    return argv


def parse_metrics(text: str) -> dict[str, float]:
    """llama-server's Prometheus counters and gauges by name, without the `llamacpp:` prefix (labelled series left
    out)."""
    out = {}
    for line in text.splitlines():
        if line.startswith("llamacpp:") and "{" not in line:
            name, value = line[len("llamacpp:") :].split()
            out[name] = float(value)
    return out


def parse_regions(data: bytes) -> list[tuple[int, int]]:
    """The shim's records, (entry, exit) in nanoseconds; a record cut short at the end is left out."""
    whole = len(data) - len(data) % RECORD.size
    return [RECORD.unpack_from(data, i) for i in range(0, whole, RECORD.size)]


def pass_regions(
    regions: list[tuple[int, int]], start: int, end: int, passes: int, min_ns: int
) -> list[tuple[int, int]]:
    """The last `passes` regions of at least min_ns inside [start, end]: a request's passes after its first output
    token (earlier ones are the prompt's). Shorter regions (an operator of another library) are not passes."""
    inside = [(a, b) for a, b in regions if start <= a and b <= end and b - a >= min_ns]
    if len(inside) < passes:
        raise ValueError(f"{len(inside)} regions of {min_ns / 1e6:.1f} ms or more for {passes} passes")
    return inside[len(inside) - passes :]


def compute_and_gaps(
    regions: list[tuple[int, int]], decode_s: tuple[float, ...] = ()
) -> tuple[float, float, float | None]:
    """Medians in milliseconds: a pass's compute, the time between one pass's compute and the next's, and (given
    each pass's llama_decode time, in the same order) what llama_decode spends around its compute."""
    if len(regions) < 2:
        raise ValueError("a gap needs two passes")
    compute = statistics.median(b - a for a, b in regions) / 1e6
    gap = statistics.median(nxt[0] - cur[1] for cur, nxt in zip(regions, regions[1:], strict=False)) / 1e6
    if not decode_s:
        return compute, gap, None
    if len(decode_s) != len(regions):
        raise ValueError(f"{len(decode_s)} llama_decode calls for {len(regions)} passes")
    around = statistics.median(1000 * s - (b - a) / 1e6 for s, (a, b) in zip(decode_s, regions, strict=True))
    return compute, gap, around


@dataclass(frozen=True)
class Steps:
    """One request's decode steps after its first output token: target passes, tokens, seconds, and of the
    passes, how many verified a draft and how many rows they carried in all (a pass's width: 1 + its draft)."""

    passes: int
    tokens: int
    seconds: float
    drafts: int
    rows: int
    decode_s: tuple[float, ...] = ()  # spekula only: its llama_decode calls over the same passes, in order

    @property
    def ms_per_pass(self) -> float:
        return 1000 * self.seconds / self.passes

    @property
    def mean_width(self) -> float:
        return self.rows / self.passes


def server_steps(timings: dict, drafts: int) -> Steps:
    """From llama-server's `timings` (predicted_* cover the tokens after the first) and the verify steps /metrics
    counted for the request: every pass emits one token plus the drafted tokens it accepted."""
    tokens = int(timings["predicted_n"]) - 1
    passes = tokens - int(timings.get("draft_n_accepted", 0))
    rows = passes + int(timings.get("draft_n", 0))
    return Steps(passes, tokens, float(timings["predicted_ms"]) / 1000, drafts, rows)


def loop_steps(marks: list[tuple[float, int]], decodes: list[tuple[int, float]]) -> Steps:
    """From (time, tokens so far) at each step spekula's text layer yielded, and the (rows, seconds) of each
    llama_decode after the first step: the passes from the first step that emitted to the last one."""
    emitting = [m for i, m in enumerate(marks) if m[1] > (marks[i - 1][1] if i else 0)]
    (t0, n0), (t1, n1) = emitting[0], emitting[-1]
    passes = len(emitting) - 1
    if passes < 1 or len(decodes) < passes:
        raise ValueError(f"{passes} passes after the first token and {len(decodes)} llama_decode calls timed")
    decodes = decodes[:passes]
    rows = sum(r for r, _ in decodes)
    return Steps(passes, n1 - n0, t1 - t0, sum(1 for r, _ in decodes if r > 1), rows, tuple(s for _, s in decodes))


@dataclass
class Measured:
    """One request of one loop: its steps, and from the shim its median compute and gap per pass (ms)."""

    steps: Steps
    compute_ms: float
    gap_ms: float
    around_ms: float | None  # spekula only: llama_decode's time around its compute, per pass
    tokens: list[int]


class Regions:
    """One process's shim output, read on from where the last read stopped."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset = path, 0

    def new(self) -> list[tuple[int, int]]:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        records = parse_regions(data)
        self.offset += len(records) * RECORD.size
        return records

    def measure(self, steps: Steps, start: int, end: int, min_ns: int, tokens: list[int]) -> Measured:
        regions = pass_regions(self.new(), start, end, steps.passes, min_ns)
        return Measured(steps, *compute_and_gaps(regions, steps.decode_s), tokens)


@dataclass
class DecodeTimer:
    """Times every llama_decode of this process while `on`: (rows, seconds) per call."""

    on: bool = False
    calls: list[tuple[int, float]] = field(default_factory=list)

    def install(self) -> None:
        import llama_cpp._internals as internals

        inner = internals.LlamaContext.decode

        def decode(ctx, batch):
            start = time.perf_counter()
            try:
                return inner(ctx, batch)
            finally:
                if self.on:
                    self.calls.append((int(batch.batch.n_tokens), time.perf_counter() - start))

        internals.LlamaContext.decode = decode


class LlamaServer:
    """One llama-server child on loopback, with the shim preloaded; stopped (and waited for) on exit."""

    def __init__(self, argv: list[str], port: int, log: Path, env: dict[str, str]) -> None:
        self.argv, self.url, self.log, self.env = argv, f"http://127.0.0.1:{port}", log, env
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> LlamaServer:
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=self.env)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"llama-server exited ({self.proc.returncode}); its log: {self.log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.5)  # polling a child's HTTP port: there is no event to wait on
        raise SystemExit(f"llama-server did not answer /health within {timeout:.0f} s; its log: {self.log}")

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as r:
            return parse_metrics(r.read().decode())

    def complete(self, ids: list[int], tokens: int) -> tuple[Steps, list[int], int, int]:
        """One greedy /completion of exactly `tokens` tokens: its steps, the ids it emitted, and its window."""
        body = {"prompt": ids, "n_predict": tokens, "temperature": 0.0, "ignore_eos": True, "return_tokens": True}
        before = self.metrics()
        request = urllib.request.Request(
            self.url + "/completion", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        start = time.monotonic_ns()
        with urllib.request.urlopen(request, timeout=600) as r:
            answer = json.loads(r.read())
        end = time.monotonic_ns()
        drafts = self.metrics()["spec_decode_num_drafts_total"] - before.get("spec_decode_num_drafts_total", 0.0)
        return server_steps(answer["timings"], int(drafts)), list(answer.get("tokens", [])), start, end


def spekula_pipelines(model: str, threads: int, widths: list[int]) -> dict:
    """One pipeline per width over one loaded target: plain at width 1, else suffix lookup at k = width - 1."""
    from spekula.config import BackendConfig, SpecConfig
    from spekula.pipeline import Pipeline
    from spekula.proposers import build_proposer

    backend = BackendConfig(runtime="llamacpp", threads=threads)
    base = Pipeline.load(model, draft="none", spec=SpecConfig(k=0, prompt_cache=False), backend=backend)
    out = {}
    for w in widths:
        spec = SpecConfig(k=w - 1, prompt_cache=False)  # no finished request keeps a KV cache: one live at a time
        proposer = build_proposer("suffix", spec, target=base.target) if w > 1 else None
        out[w] = Pipeline(base.target, base.codec, proposer, spec, draft_name="suffix" if w > 1 else "none")
    return out


def spekula_request(pipe, ids: list[int], tokens: int, timer: DecodeTimer, namespace: str):
    """One greedy request through the text layer, as `spekula generate` runs it (a fresh namespace: the suffix
    proposer drafts from this request's own text only): its steps, the ids it emitted, and its window."""
    from spekula.config import SamplingParams, StopConfig

    stop = StopConfig(max_tokens=tokens, ignore_eos=True)
    start = time.monotonic_ns()
    text = pipe.start(ids, SamplingParams(), stop, plain=pipe.engine.proposer is None, namespace=namespace)
    marks: list[tuple[float, int]] = []
    timer.calls.clear()
    for _ in text.steps():
        marks.append((time.perf_counter(), len(text.generation.token_ids)))
        timer.on = True  # every llama_decode after the first output token
    timer.on = False
    end = time.monotonic_ns()
    return loop_steps(marks, timer.calls), list(text.generation.token_ids), start, end


def summarize(label: str, width: int, runs: list[Measured]) -> dict:
    """Medians over rounds."""
    med = statistics.median
    row = {
        "loop": label,
        "width": width,
        "rounds": len(runs),
        "ms_per_pass": round(med(m.steps.ms_per_pass for m in runs), 2),
        "compute_ms": round(med(m.compute_ms for m in runs), 2),
        "gap_ms": round(med(m.gap_ms for m in runs), 3),
        "gap_ms_each": [round(m.gap_ms, 3) for m in runs],
        "mean_width": round(med(m.steps.mean_width for m in runs), 2),
        "drafted_passes": round(med(m.steps.drafts / m.steps.passes for m in runs), 2),
        "tokens_per_pass": round(med(m.steps.tokens / m.steps.passes for m in runs), 2),
    }
    if runs[0].around_ms is not None:
        row["around_compute_ms"] = round(med(m.around_ms for m in runs), 3)
    return row


def run_width(width: int, args, env: dict, pipe, ids: list[int], timer: DecodeTimer, own: Regions, tmp: Path):
    from spekula.models import resolve

    binary = os.environ.get("LLAMA_SERVER", str(ROOT / ".venv" / "bin" / "llama-server"))
    argv = server_argv(binary, str(resolve(args.model).gguf_path), width, args.threads, args.port, args.server_args)
    print("#", shlex.join(argv), flush=True)
    out = tmp / f"server-w{width}.regions"
    runs: dict[str, list[Measured]] = {"llama-server": [], "spekula": []}
    min_ns = int(args.min_region_ms * 1e6)
    with LlamaServer(argv, args.port, tmp / f"server-w{width}.log", {**env, OUT_ENV: str(out)}) as server:
        server.wait_ready(args.start_timeout)
        server.complete(ids, args.tokens)  # untimed: first-request costs on both sides
        spekula_request(pipe, ids, args.tokens, timer, f"w{width}-warm-up")
        theirs = Regions(out)
        theirs.new(), own.new()
        for r in range(args.rounds):  # A B A B ...: llama-server, then spekula, each round
            steps, emitted, start, end = server.complete(ids, args.tokens)
            runs["llama-server"].append(theirs.measure(steps, start, end, min_ns, emitted))
            steps, emitted, start, end = spekula_request(pipe, ids, args.tokens, timer, f"w{width}-r{r}")
            runs["spekula"].append(own.measure(steps, start, end, min_ns, emitted))
    rows = [summarize(label, width, measured) for label, measured in runs.items()]
    same = sum(a.tokens == b.tokens for a, b in zip(runs["llama-server"], runs["spekula"], strict=True))
    for row in rows:
        row["same_tokens"] = same
    return rows


def build_shim(tmp: Path) -> Path:
    source, lib = tmp / "regions.c", tmp / "regions.so"
    source.write_text(SHIM)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(source), "-ldl", "-lgomp"], check=True)
    return lib


def relaunch_with_shim() -> None:
    """Run this script again with the shim preloaded (the loader reads LD_PRELOAD only at start)."""
    tmp = Path(tempfile.mkdtemp(prefix="step_overhead_vs_server-"))
    env = dict(
        os.environ,
        LD_PRELOAD=str(build_shim(tmp)),
        STEP_REGIONS_DIR=str(tmp),
        **{OUT_ENV: str(tmp / "spekula.regions")},
    )
    os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], env)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if OUT_ENV not in os.environ:
        relaunch_with_shim()
    tmp = Path(os.environ["STEP_REGIONS_DIR"])
    env = {k: v for k, v in os.environ.items() if k != OUT_ENV}
    timer = DecodeTimer()
    timer.install()
    pipes = spekula_pipelines(args.model, args.threads, args.widths)
    ids = next(iter(pipes.values())).codec.encode(BLOCK * COPIES)
    own = Regions(Path(os.environ[OUT_ENV]))
    rows = []
    for width in args.widths:
        for row in run_width(width, args, env, pipes[width], ids, timer, own, tmp):
            rows.append(row)
            inside = f" (llama_decode around it {row['around_compute_ms']:.3f})" if "around_compute_ms" in row else ""
            print(
                f"W={width} {row['loop']:>12}: {row['ms_per_pass']:7.2f} ms/pass, compute {row['compute_ms']:.2f}"
                f"{inside}, between passes {row['gap_ms']:.3f} ms (each {row['gap_ms_each']}); mean width "
                f"{row['mean_width']}, drafted passes {row['drafted_passes']}, tokens/pass {row['tokens_per_pass']}, "
                f"same tokens {row['same_tokens']}/{row['rounds']}",
                flush=True,
            )
    print(f"# shim output and server logs: {tmp}")
    print(json.dumps({"prompt_tokens": len(ids), "tokens": args.tokens, "threads": args.threads, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
