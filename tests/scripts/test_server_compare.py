"""scripts/server_compare.sh without starting a server: it parses, documents every knob it reads, refuses a missing
model or llama-server before starting anything, builds each baseline's command line (llama-server plain and in its
n-gram modes, on one GGUF with one thread count), and passes only options that spekula, llama_cpp.server and
llama-server have."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "server_compare.sh"
TEXT = SCRIPT.read_text()


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})}
    )


def help_of(*command: str) -> str:
    result = subprocess.run([sys.executable, "-m", *command, "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def sourced(commands: str, env: dict[str, str]) -> list[list[str]]:
    """The tab-separated lines `commands` print after the script is sourced (its main does not run) with GGUF
    /models/m.gguf, N_CTX 4096 and TARGET m, and its baselines planned under `env`."""
    body = f"source {shlex.quote(str(SCRIPT))}; GGUF=/models/m.gguf; N_CTX=4096; TARGET=m; plan_baselines; {commands}"
    result = subprocess.run(["bash", "-c", body], capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    return [line.split("\t") for line in result.stdout.splitlines()]


def baselines(concurrency: int, **env: str) -> dict[str, tuple[list[str], list[str]]]:
    """Each baseline the script plans under `env`: name -> (its environment, its argv) at `concurrency`, from the
    script's own functions (sourced: its main does not run), with N_CTX 4096 and GGUF /models/m.gguf."""
    rows = sourced(
        'for i in "${!BASE_NAMES[@]}"; do baseline_argv "$i" ' + str(concurrency) + "; "
        'printf "%s\\t%s\\t%s\\n" "${BASE_NAMES[$i]}" "${BASE_ENV[*]}" "${BASE_ARGV[*]}"; done',
        env,
    )
    return {name: (environ.split(), argv.split()) for name, environ, argv in rows}


def value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_the_script_parses():
    result = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr


def test_help_documents_every_environment_knob_the_script_reads():
    result = run("--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("server_compare.sh: spekula serve against another server")
    assert "set -euo" not in result.stdout and "#" not in result.stdout.splitlines()[0]
    knobs = set(re.findall(r"^([A-Z_]+)=\$\{\1:-", TEXT, flags=re.M))
    assert {"CONCURRENCIES", "PER_CATEGORY", "MAX_TOKENS", "THREADS", "N_CTX", "WARM", "LLAMA_SERVER_SPECS"} <= knobs
    for knob in knobs:
        assert re.search(rf"\b{knob} \[", result.stdout), f"{knob} is read but not documented in --help"


def test_without_an_out_dir_it_prints_usage_and_fails():
    result = run()
    assert result.returncode == 2 and "OUT_DIR" in result.stderr


def test_a_missing_gguf_fails_before_any_server_starts(tmp_path):
    result = run(str(tmp_path / "out"), str(tmp_path / "no-such-model.gguf"))
    assert result.returncode != 0
    assert f"no GGUF at {tmp_path / 'no-such-model.gguf'}" in result.stderr
    assert not list((tmp_path / "out").rglob("*.log"))


def test_a_missing_llama_server_says_how_to_build_it_before_anything_starts(tmp_path):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    env = {"LLAMA_SERVER_SPECS": "none ngram-mod", "LLAMA_SERVER": str(tmp_path / "nowhere")}
    result = run(str(tmp_path / "out"), str(gguf), env=env)
    assert result.returncode == 1
    assert f"no llama-server at {tmp_path / 'nowhere'}: run `make llama-server`" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_spec_type_that_needs_a_draft_model_or_does_not_exist_is_refused(tmp_path):
    for spec in ("draft-simple", "ngram-nope"):
        result = run(str(tmp_path / "out"), "m.gguf", env={"LLAMA_SERVER_SPECS": f"ngram-simple {spec}"})
        assert result.returncode == 2 and f"unknown --spec-type '{spec}'" in result.stderr
        assert "LLAMA_SERVER_ARGS" in result.stderr and not (tmp_path / "out").exists()


def test_an_arrival_other_than_waves_or_closed_loop_is_refused(tmp_path):
    result = run(str(tmp_path / "out"), "m.gguf", env={"WAVES": "yes"})
    assert result.returncode == 2 and "WAVES must be 0 (closed loop) or 1 (waves), got 'yes'" in result.stderr
    for env in ({}, {"LLAMA_SERVER_SPECS": "none"}):  # waves against llama_cpp.server or llama-server: refused
        result = run(str(tmp_path / "out"), "m.gguf", env={"WAVES": "1", **env})
        assert result.returncode == 2 and "WAVES=1 compares two spekula servers" in result.stderr
    assert not (tmp_path / "out").exists()


def test_llama_server_baselines_share_the_gguf_threads_and_a_context_per_slot():
    env = {"LLAMA_SERVER_SPECS": "none ngram-simple ngram-mod", "LLAMA_SERVER": "/bin/llama-server", "THREADS": "2"}
    planned = baselines(4, **env)
    assert list(planned) == ["llama-server", "llama-server ngram-simple", "llama-server ngram-mod"]
    for environ, argv in planned.values():
        assert argv[0] == "/bin/llama-server" and value(argv, "-m") == "/models/m.gguf"
        assert value(argv, "-t") == value(argv, "-tb") == "2"
        assert value(argv, "-np") == "4" and value(argv, "-c") == str(4 * 4096)  # -np: the run's concurrency
        assert value(argv, "--host") == "127.0.0.1" and value(argv, "--port") == "8412"
        assert "--chat-template" not in argv  # the GGUF's own template
        assert environ == ["GLIBC_TUNABLES=glibc.malloc.hugetlb=1"]
    assert "--spec-type" not in planned["llama-server"][1]
    assert value(planned["llama-server ngram-mod"][1], "--spec-type") == "ngram-mod"
    assert value(baselines(1, **env)["llama-server"][1], "-np") == "1"


def test_fixed_slot_counts_and_every_cpu_mode_make_one_baseline_each():
    env = {"LLAMA_SERVER_SPECS": "all", "LLAMA_SERVER_NP": "1 4", "LLAMA_SERVER_ARGS": "--cache-reuse 256"}
    planned = baselines(16, **env, BASELINE_HUGE_PAGES="0")
    modes = ["ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"]
    assert len(planned) == 2 * (1 + len(modes))
    for np in ("1", "4"):
        environ, argv = planned[f"llama-server -np {np} ngram-cache"]
        assert value(argv, "-np") == np and value(argv, "-c") == str(int(np) * 4096)  # not the concurrency's
        assert argv[-2:] == ["--cache-reuse", "256"] and environ == []
    assert {value(argv, "--spec-type") for _, argv in planned.values() if "--spec-type" in argv} == set(modes)


def test_the_default_baseline_is_still_llama_cpp_server_as_plain_greedy():
    ((name, (environ, argv)),) = baselines(4).items()
    assert name == "llama_cpp.server" and argv[1:3] == ["-m", "llama_cpp.server"]
    assert value(argv, "--n_ctx") == "4096" and value(argv, "--interrupt_requests") == "false"
    assert '"repeat_penalty": 1.0' in TEXT


def test_it_passes_only_options_spekula_has():
    serve, bench = help_of("spekula", "serve"), help_of("spekula", "bench")
    for flag in ("--target", "--threads", "--draft", "--host", "--port"):
        assert flag in serve
    flags = ("--endpoint", "--baseline-endpoint", "--baseline-extra-body", "--per-category", "--requests", "--warm")
    for flag in (*flags, "--shuffle-seed", "--salt", "--concurrency", "--repeats", "--waves"):
        assert flag in TEXT and flag in bench


def test_it_passes_only_options_llama_cpp_server_has():
    for module in ("llama_cpp", "sse_starlette", "starlette_context", "pydantic_settings"):
        pytest.importorskip(module)
    text = help_of("llama_cpp.server")
    _, argv = baselines(1)["llama_cpp.server"]
    flags = {a for a in argv if a.startswith("--")}
    assert {"--n_ctx", "--n_threads", "--n_threads_batch", "--interrupt_requests"} <= flags
    for flag in flags:
        assert f"[{flag} " in text, f"llama_cpp.server has no {flag}"


def test_it_passes_only_options_llama_server_has():
    binary = Path(os.environ.get("LLAMA_SERVER") or ROOT / ".venv" / "bin" / "llama-server")
    if not binary.is_file():
        pytest.skip(f"no llama-server at {binary} (`make llama-server` builds it)")
    result = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=120)
    text = result.stdout + result.stderr
    env = {"LLAMA_SERVER_SPECS": "all", "LLAMA_SERVER": str(binary)}
    for _, argv in baselines(4, **env).values():
        for flag in (a for a in argv if a.startswith("-") and not a.lstrip("-").isdigit()):
            assert re.search(rf"(^|[ ,]){re.escape(flag)}[ ,\n]", text, flags=re.M), f"llama-server has no {flag}"
        if "--spec-type" in argv:
            assert value(argv, "--spec-type") in text


def started(**env: str) -> list[tuple[str, ...]]:
    """The (name, port) of each server start_servers (run_one's first step) starts, in order, from the script's own
    functions with `start` replaced by a recorder (nothing starts), N_CTX 4096 and a second spekula serve as the
    baseline."""
    env = {"BASELINE_SERVE_ARGS": "--draft none", **env}
    lines = sourced('start() { printf "%s\\t%s\\n" "$1" "$4"; }; start_servers 0 4 /tmp', env)
    return [tuple(line) for line in lines]


def test_baseline_first_swaps_the_start_order_and_keeps_the_ports():
    spekula, baseline = ("spekula serve (m)", "8411"), ("spekula serve --draft none", "8412")
    assert started() == [spekula, baseline]
    assert started(BASELINE_FIRST="1") == [baseline, spekula]
    assert started(BASELINE_FIRST="1", SPEKULA_PORT="8412", LLAMA_PORT="8411") == [
        ("spekula serve --draft none", "8411"),
        ("spekula serve (m)", "8412"),
    ]


def test_baseline_first_is_0_or_1_and_needs_n_ctx_before_a_llama_server(tmp_path):
    result = run(str(tmp_path / "out"), "m.gguf", env={"BASELINE_FIRST": "yes"})
    assert result.returncode == 2 and "BASELINE_FIRST must be 0 or 1, got 'yes'" in result.stderr
    env = {"BASELINE_FIRST": "1", "LLAMA_SERVER_SPECS": "none", "LLAMA_SERVER": "/bin/true"}
    result = run(str(tmp_path / "out"), "m.gguf", env=env)
    assert result.returncode == 2 and "BASELINE_FIRST=1 starts the baseline before" in result.stderr
    assert "set N_CTX" in result.stderr and not (tmp_path / "out").exists()
