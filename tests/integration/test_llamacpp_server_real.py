"""`spekula bench --endpoint` and `spekula audit --endpoint` against a real third-party server: llama-cpp-python's
`python -m llama_cpp.server`, on SmolLM2's GGUF.

That server, by default (`--interrupt_requests true`), ends a running stream as soon as another request waits
for the model: the stream closes with [DONE] but no finish_reason and often no text. Such a stream must be an
error (counted, shown, never "identical"); with interruption off every answer is whole. Last, spekula serve is
compared with it on two prompts, as scripts/server_compare.sh does at full size: the report's structure is
checked, not the speed.

Servers run as subprocesses on free loopback ports; readiness is polled, and a fixture finaliser always ends them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from spekula.bench.commands import audit_endpoints, bench_endpoints
from spekula.bench.endpoint import Endpoint, Load
from spekula.bench.workloads import load_workload, select
from spekula.cli import main
from spekula.models.cache import gguf_dir
from spekula.models.catalogue import CATALOGUE

for module in ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings"):
    pytest.importorskip(module, reason="llama_cpp.server needs spekula[llamacpp,test]")

pytestmark = pytest.mark.model

GGUF = gguf_dir() / CATALOGUE["smollm2-135m"].gguf_file
N_CTX = 2048
MAX_TOKENS = 8
CATEGORY = "open-chat"  # short prompts: the requests cost little next to starting the servers
START_TIMEOUT_S = 120.0
# llama_cpp.server's default repeat penalty is 1.1: without this, its temperature 0 is not plain greedy decoding.
PLAIN_GREEDY = {"repeat_penalty": 1.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, url: str, log: Path) -> None:
    """Poll `url` until it answers 200; fail at once if the process exits, or after START_TIMEOUT_S."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"the server exited ({proc.returncode}) before it was ready:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)  # the poll interval, not a synchronisation: readiness is the 200 above
    pytest.fail(f"{url} was not ready after {START_TIMEOUT_S:.0f} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def serve(args: list[str], ready_path: str, tmp: Path, name: str) -> Iterator[str]:
    port = free_port()
    log = tmp / f"{name}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", *args, "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_ready(proc, url + ready_path, log)
        yield url
    finally:
        stop(proc)


def llama_server(interrupt: bool, tmp: Path) -> Iterator[str]:
    if not GGUF.is_file():
        pytest.skip(f"{GGUF} is missing: spekula models fetch smollm2-135m")
    args = ["llama_cpp.server", "--model", str(GGUF), "--n_ctx", str(N_CTX), "--verbose", "false"]
    args += ["--n_threads", "1", "--n_threads_batch", "1", "--interrupt_requests", str(interrupt).lower()]
    yield from serve(args, "/v1/models", tmp, f"llama-interrupt-{interrupt}")


@pytest.fixture(scope="module")
def interrupting(tmp_path_factory) -> Iterator[str]:
    yield from llama_server(True, tmp_path_factory.mktemp("llama-on"))


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Iterator[str]:
    yield from llama_server(False, tmp_path_factory.mktemp("llama-off"))


@pytest.fixture(scope="module")
def spekula_serve(tmp_path_factory) -> Iterator[str]:
    args = ["spekula", "serve", "--target", "smollm2-135m", "--draft", "suffix", "--threads", "1"]
    yield from serve(args, "/health", tmp_path_factory.mktemp("spekula"), "spekula-serve")


@pytest.fixture(scope="module")
def prompts():
    return select(load_workload("builtin"), categories_wanted=[CATEGORY], per_category=None, limit=3)


def test_an_interrupting_server_truncated_streams_are_errors_never_identical(interrupting, prompts, tmp_path):
    server = Endpoint("endpoint", interrupting)
    load = Load(concurrency=2, request_timeout_s=60)
    result, summary, _ = bench_endpoints(
        server, None, prompts, load, workload_name="builtin", out_dir=tmp_path, max_tokens=MAX_TOKENS, progress=False
    )
    errors = [r for r in result["requests"] if r["error"]]
    # Two requests in flight: each waiting one interrupts the running one; at least the first is cut.
    assert errors, summary
    assert all("finish_reason" in r["error"] for r in errors), [r["error"] for r in errors]
    assert not any(r["identical"] for r in errors)
    counted = result["summary"]["endpoint"]["overall"]
    assert counted["errors"] == len(errors) and f"{len(errors)} error(s)" in summary

    report = audit_endpoints(
        Endpoint("endpoint", interrupting), Endpoint("baseline", interrupting), prompts, load, max_tokens=MAX_TOKENS
    )
    assert report.endpoint_errors and not report.passed
    failed = {e["prompt_id"] for e in report.endpoint_errors}
    assert not failed & {c.prompt_id for c in report.endpoint_greedy}  # a cut prompt is compared on neither side


def test_with_interruption_off_every_answer_is_whole_and_audit_passes(whole, prompts, tmp_path, capsys):
    argv = ["--endpoint", whole, "--concurrency", "2", "--categories", CATEGORY]
    argv += ["--per-category", str(len(prompts)), "--limit", str(len(prompts))]
    argv += ["--max-tokens", str(MAX_TOKENS), "--extra-body", json.dumps(PLAIN_GREEDY), "--no-progress"]
    assert main(["bench", *argv, "--out", str(tmp_path / "bench")]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["configs"]["endpoint"]["errors"] == 0
    results = json.loads(Path(last["results"]).read_text())
    assert len(results["requests"]) == len(prompts)
    for r in results["requests"]:
        assert r["error"] is None and r["text"] and r["stats"]["finish_reason"] in ("length", "stop")
        assert r["token_count_source"] == "chunks"  # llama_cpp.server streams no usage

    audit = ["--baseline-endpoint", whole, "--baseline-extra-body", json.dumps(PLAIN_GREEDY)]
    assert main(["audit", *argv, *audit, "--out", str(tmp_path / "audit")]) == 0
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert record["passed"] and record["greedy_passed"]
    audited = json.loads(Path(record["results"]).read_text())
    assert not audited["endpoint_errors"] and len(audited["endpoint_greedy"]) == len(prompts)


def test_spekula_serve_against_llama_cpp_server_one_report_over_the_same_requests(
    spekula_serve, whole, prompts, capsys, tmp_path
):
    argv = ["bench", "--endpoint", spekula_serve, "--baseline-endpoint", whole]
    argv += ["--baseline-extra-body", json.dumps(PLAIN_GREEDY), "--categories", CATEGORY, "--limit", "2"]
    argv += ["--max-tokens", str(MAX_TOKENS), "--no-progress", "--out", str(tmp_path)]
    assert main(argv) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["mode"] == "endpoint" and last["baseline"] == "baseline"
    assert set(last["configs"]) == {"baseline", "endpoint"}
    results = json.loads(Path(last["results"]).read_text())
    models = {c["name"]: c["model"] for c in results["configs"]}
    assert models == {"baseline": str(GGUF), "endpoint": "smollm2-135m"}  # each server's own model name
    by_config = {
        name: sorted(r["prompt_id"] for r in results["requests"] if r["config"] == name)
        for name in ("baseline", "endpoint")
    }
    assert by_config["baseline"] == by_config["endpoint"] and len(by_config["endpoint"]) == 2
    for name in ("baseline", "endpoint"):
        row = last["configs"][name]
        assert row["errors"] == 0 and row["compared"] == 2 and row["tokens_per_s"] > 0
        assert 0 <= row["identical"] <= 2
    for r in results["requests"]:
        assert r["ttft_s"] > 0 and r["latency_s"] >= r["ttft_s"] and r["speedup"] > 0
        # spekula serve reports usage; llama_cpp.server's count comes from spekula's on an identical text
        assert r["token_count_source"] in ("usage", "usage (identical text)", "chunks")
    assert {r["token_count_source"] for r in results["requests"] if r["config"] == "endpoint"} == {"usage"}


def _complete(url: str, prompt: str, **sampling) -> dict:
    body = {"model": "smollm2-135m", "prompt": prompt, "max_tokens": 24, "temperature": 0, **sampling}
    request = urllib.request.Request(
        url + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def test_by_default_concurrent_and_sequential_greedy_requests_get_the_same_texts(spekula_serve):
    """Exact mode is the default: each request in a KV stream of its own, batched in passes where every row gets the
    bits it gets alone, so what else the server runs cannot change a greedy answer (issue #35)."""
    from concurrent.futures import ThreadPoolExecutor

    starts = ("def median(values):", "The capital of France", "Once upon a time", "import numpy as np\nx = np.")
    prompts = [f"{start} " for start in (*starts, "SELECT name FROM", "1, 2, 3, 4,")]
    sequential = [_complete(spekula_serve, p) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        concurrent = list(pool.map(lambda p: _complete(spekula_serve, p), prompts))
    assert [a["choices"][0]["text"] for a in concurrent] == [a["choices"][0]["text"] for a in sequential]
    assert all(a["spec"]["guarantee"]["kind"] == "bit-identical" for a in sequential + concurrent)
    assert all(a["choices"][0]["text"] for a in sequential)


def test_by_default_a_seeded_sampled_request_repeats_its_text_whatever_else_runs(spekula_serve):
    """A seed fixes each position's draw (spekula.noise) and exact mode fixes the probabilities it draws from, so
    the same seeded request gives the same text alone and beside others; another seed gives another text."""
    from concurrent.futures import ThreadPoolExecutor

    seeded = {"temperature": 1.0, "seed": 7}
    prompt = "Write a short story about a lighthouse keeper."
    alone = _complete(spekula_serve, prompt, **seeded)["choices"][0]["text"]
    others = ["The capital of France", "def median(values):", "Once upon a time"]
    with ThreadPoolExecutor(4) as pool:
        beside = pool.submit(_complete, spekula_serve, prompt, **seeded)
        list(pool.map(lambda p: _complete(spekula_serve, p, temperature=1.0), others))
        assert beside.result()["choices"][0]["text"] == alone
    other_seeds = {_complete(spekula_serve, prompt, temperature=1.0, seed=s)["choices"][0]["text"] for s in (8, 9)}
    assert other_seeds - {alone}  # the seed matters: the test could fail
