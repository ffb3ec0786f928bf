#!/usr/bin/env bash
# server_compare.sh: spekula serve against llama-cpp-python's own OpenAI-compatible server, same GGUF, same client.
#
#   scripts/server_compare.sh OUT_DIR [MODEL]
#
# MODEL is a built-in model name (default qwen2.5-coder-1.5b: its Q4_K_M GGUF in ~/.cache/spekula) or a .gguf
# path. The script starts both servers on loopback, one after the other, with the same GGUF, the same
# threads and the same context length (llama_cpp.server gets the max_model_len spekula serve reports):
#   spekula serve --target MODEL --threads $THREADS [--draft $DRAFT]
#   python -m llama_cpp.server --model GGUF --n_threads $THREADS --n_threads_batch $THREADS --n_ctx N
#                              --interrupt_requests false
# (interruption off: by default that server cuts a running stream short whenever another request arrives).
# It waits for both to answer, warms each with one short request, then at each concurrency of $CONCURRENCIES runs
#   spekula bench --endpoint <spekula serve> --baseline-endpoint <llama_cpp.server>
#                 --baseline-extra-body '{"repeat_penalty": 1.0}' --concurrency C --repeats $REPEATS --salt
# over the built-in suite ($PER_CATEGORY prompts of each category, at most $MAX_TOKENS tokens each, greedy; a
# concurrency above the number of prompts cycles them so that C requests are in flight). The repeat penalty of 1.0
# makes llama_cpp.server's temperature 0 plain greedy decoding (its default is 1.1), so the texts can be compared.
# The servers take turns, one at a time, $REPEATS phases each, in alternating order (llama_cpp.server first,
# then spekula serve first, ...): the machine's speed drifts by tens of percent within minutes, and a
# single phase each would hand that drift to whichever server ran in the faster minutes. --salt begins every
# phase's prompts with a line of their own, so neither server answers a prompt from its cache of an earlier
# phase or concurrency (spekula serve keeps many finished requests' caches, llama_cpp.server its last one).
# Both servers are stopped on exit, whatever happens.
#
# Writes under OUT_DIR: c<C>/ (each bench run: results.json, summary.md, report.html, plots), warmup/,
# spekula-serve.log, llama-server.log, commands.txt (every command run), table.md (one row per server and
# concurrency: throughput, TTFT p50/p99, latency p50/p99, greedy identity, errors) and table.json.
# The defaults are sized for about 30 minutes on 2 cores with the 1.5B model; run it on a quiet machine.
#
# Environment (defaults in brackets):
#   CONCURRENCIES [1 4 16]  PER_CATEGORY [2]  CATEGORIES [all, or e.g. code-editing,open-chat]  MAX_TOKENS [48]
#   REPEATS [2] phases per server at each concurrency
#   SHUFFLE_SEED [unset: the suite's order] the chosen prompts in a seeded random order (an edit session's turns
#                stay in order, one after the other), written to OUT_DIR/workload.jsonl and sent in that order
#   THREADS [2]  DRAFT [spekula serve's default]  SERVE_ARGS [none: more `spekula serve` options]
#   N_CTX [spekula serve's max_model_len]  REQUEST_TIMEOUT [600]  SPEKULA_PORT [8411]  LLAMA_PORT [8412]
#   START_TIMEOUT [600] seconds to wait for each server  PYTHON [.venv/bin/python, else python3]
#   BASELINE_HUGE_PAGES [1] 1: llama_cpp.server starts with GLIBC_TUNABLES=glibc.malloc.hugetlb=1, the 2 MiB pages
#                       `spekula serve` gives itself (spekula.hugepages), so both sides decode on the same page
#                       size; 0: llama_cpp.server as a user starts it (where THP is "madvise": one-token
#                       passes 6 to 8% slower here)
#   BASELINE_SERVE_ARGS [unset] when set (even to "-"), the baseline is a second `spekula serve` with these options
#                       in place of llama_cpp.server (on LLAMA_PORT): an A/B of two settings, same method
# With DRAFT=suffix, spekula serve drafts from its earlier answers, and every concurrency sends the same prompts
# again: pass SERVE_ARGS='--suffix-cache-entries 0' to measure each request on its own.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
case "${1:-}" in
-h | --help)
    usage
    exit 0
    ;;
"")
    usage >&2
    exit 2
    ;;
esac

OUT=$1
MODEL=${2:-qwen2.5-coder-1.5b}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$([ -x "$ROOT/.venv/bin/python" ] && echo "$ROOT/.venv/bin/python" || echo python3)}
CONCURRENCIES=${CONCURRENCIES:-1 4 16}
PER_CATEGORY=${PER_CATEGORY:-2}
CATEGORIES=${CATEGORIES:-}
MAX_TOKENS=${MAX_TOKENS:-48}
THREADS=${THREADS:-2}
DRAFT=${DRAFT:-}
SERVE_ARGS=${SERVE_ARGS:-}
N_CTX=${N_CTX:-}
REQUEST_TIMEOUT=${REQUEST_TIMEOUT:-600}
REPEATS=${REPEATS:-2}
SPEKULA_PORT=${SPEKULA_PORT:-8411}
LLAMA_PORT=${LLAMA_PORT:-8412}
START_TIMEOUT=${START_TIMEOUT:-600}
BASELINE_BODY='{"repeat_penalty": 1.0}'  # llama_cpp.server's temperature 0 as plain greedy decoding
BASELINE_SERVE_ARGS=${BASELINE_SERVE_ARGS:-}
BASELINE_HUGE_PAGES=${BASELINE_HUGE_PAGES:-1}
SHUFFLE_SEED=${SHUFFLE_SEED:-}
BASELINE_NAME=llama_cpp.server
if [ -n "$BASELINE_SERVE_ARGS" ]; then
    BASELINE_NAME="spekula serve $BASELINE_SERVE_ARGS"
    BASELINE_BODY='{}'
fi

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
: >"$OUT/commands.txt"
log() { echo "server_compare: $*" >&2; }
run() {
    printf '%q ' "$@" >>"$OUT/commands.txt"
    echo >>"$OUT/commands.txt"
    "$@"
}

# The GGUF both servers load: a built-in name's file in the spekula cache, or the path given.
GGUF=$("$PYTHON" - "$MODEL" <<'EOF'
import sys
from pathlib import Path

from spekula.models.cache import gguf_dir
from spekula.models.catalogue import CATALOGUE

name = sys.argv[1]
path = gguf_dir() / CATALOGUE[name].gguf_file if name in CATALOGUE else Path(name).expanduser().resolve()
if not path.is_file():
    sys.exit(f"no GGUF at {path}" + (f": spekula models fetch {name}" if name in CATALOGUE else ""))
print(path)
EOF
)

PIDS=()
stop_servers() {
    for pid in "${PIDS[@]}"; do
        kill -INT "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
}
trap stop_servers EXIT

wait_ready() { # URL PID NAME LOG: poll until URL answers 200; fail if the server exits or START_TIMEOUT passes
    local deadline=$((SECONDS + START_TIMEOUT))
    until "$PYTHON" -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=5)" "$1" 2>/dev/null; do
        if ! kill -0 "$2" 2>/dev/null; then
            log "$3 exited before it was ready; the end of $4:"
            tail -n 30 "$4" >&2
            exit 1
        fi
        if ((SECONDS > deadline)); then
            log "$3 not ready after ${START_TIMEOUT} s"
            exit 1
        fi
        sleep 0.5
    done
}

SPEKULA=http://127.0.0.1:$SPEKULA_PORT
LLAMA=http://127.0.0.1:$LLAMA_PORT
TARGET=$MODEL
[[ $MODEL == *.gguf ]] && TARGET=$GGUF

log "starting spekula serve ($TARGET) on $SPEKULA"
spekula_serve=(-m spekula serve --target "$TARGET" --threads "$THREADS" --host 127.0.0.1)
[ -n "$DRAFT" ] && spekula_serve+=(--draft "$DRAFT")
read -r -a extra <<<"$SERVE_ARGS"
serve=("${spekula_serve[@]}" --port "$SPEKULA_PORT" "${extra[@]}")
printf '%q ' "$PYTHON" "${serve[@]}" >>"$OUT/commands.txt"
echo >>"$OUT/commands.txt"
"$PYTHON" "${serve[@]}" >"$OUT/spekula-serve.log" 2>&1 &
PIDS+=($!)
wait_ready "$SPEKULA/health" "${PIDS[-1]}" "spekula serve" "$OUT/spekula-serve.log"

if [ -z "$N_CTX" ]; then
    N_CTX=$("$PYTHON" -c "
import json, sys, urllib.request
models = json.load(urllib.request.urlopen(sys.argv[1] + '/v1/models'))['data']
print(models[0]['max_model_len'])" "$SPEKULA")
fi

log "starting $BASELINE_NAME ($GGUF, n_ctx $N_CTX) on $LLAMA"
if [ -n "$BASELINE_SERVE_ARGS" ]; then
    baseline_extra=()
    [ "$BASELINE_SERVE_ARGS" != - ] && read -r -a baseline_extra <<<"$BASELINE_SERVE_ARGS"
    llama=("${spekula_serve[@]}" --port "$LLAMA_PORT" "${baseline_extra[@]}")
else
    llama=(-m llama_cpp.server --model "$GGUF" --n_ctx "$N_CTX" --n_threads "$THREADS" --n_threads_batch "$THREADS")
    llama+=(--interrupt_requests false --host 127.0.0.1 --port "$LLAMA_PORT")
fi
baseline_env=()
[ "$BASELINE_HUGE_PAGES" = 1 ] && [ -z "$BASELINE_SERVE_ARGS" ] && baseline_env=(GLIBC_TUNABLES=glibc.malloc.hugetlb=1)
printf '%q ' "${baseline_env[@]}" "$PYTHON" "${llama[@]}" >>"$OUT/commands.txt"
echo >>"$OUT/commands.txt"
env "${baseline_env[@]}" "$PYTHON" "${llama[@]}" >"$OUT/llama-server.log" 2>&1 &
PIDS+=($!)
wait_ready "$LLAMA/v1/models" "${PIDS[-1]}" "$BASELINE_NAME" "$OUT/llama-server.log"

common=(--endpoint "$SPEKULA" --baseline-endpoint "$LLAMA" --baseline-extra-body "$BASELINE_BODY")
common+=(--request-timeout "$REQUEST_TIMEOUT" --no-progress)
workload=(--per-category "$PER_CATEGORY")
[ -n "$CATEGORIES" ] && workload+=(--categories "$CATEGORIES")
if [ -n "$SHUFFLE_SEED" ]; then
    "$PYTHON" - "$PER_CATEGORY" "$CATEGORIES" "$SHUFFLE_SEED" "$OUT/workload.jsonl" <<'EOF'
import json
import random
import sys

from spekula.bench.workloads import conversation_order, load_workload, select

wanted = sys.argv[2].split(",") if sys.argv[2] else None
items = select(load_workload("builtin"), categories_wanted=wanted, per_category=int(sys.argv[1]))
random.Random(int(sys.argv[3])).shuffle(items)
items = conversation_order(items)  # each session's later turns right after its first, as in the suite
with open(sys.argv[4], "w", encoding="utf-8") as f:
    f.writelines(json.dumps(item.to_dict()) + "\n" for item in items)
EOF
    workload=(--workload "$OUT/workload.jsonl")
fi

log "warming both servers with one short request each"
run "$PYTHON" -m spekula bench "${common[@]}" --limit 1 --max-tokens 4 --out "$OUT/warmup" >/dev/null

PROMPTS=$("$PYTHON" -c "
import sys
from spekula.bench.workloads import load_workload, select
wanted = sys.argv[2].split(',') if sys.argv[2] else None
print(len(select(load_workload('builtin'), categories_wanted=wanted, per_category=int(sys.argv[1]))))" \
    "$PER_CATEGORY" "$CATEGORIES")

for c in $CONCURRENCIES; do
    requests=$((c > PROMPTS ? c : PROMPTS))
    log "concurrency $c: $REPEATS x $requests requests per server ($PROMPTS prompts, max_tokens $MAX_TOKENS)"
    run "$PYTHON" -m spekula bench "${common[@]}" "${workload[@]}" --max-tokens "$MAX_TOKENS" \
        --concurrency "$c" --requests "$requests" --repeats "$REPEATS" --salt --out "$OUT/c$c" >"$OUT/c$c.txt"
done

"$PYTHON" - "$OUT" "$BASELINE_NAME" $CONCURRENCIES <<'EOF'
import json
import sys
from pathlib import Path

out, baseline, concurrencies = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
servers = {"endpoint": "spekula serve", "baseline": baseline}
rows = []
for c in concurrencies:
    result = json.loads((out / f"c{c}" / "results.json").read_text())
    for config, server in servers.items():
        o = result["summary"][config]["overall"]
        rows.append(
            {
                "server": server,
                "concurrency": int(c),
                "requests": o["requests"],
                "errors": o["errors"],
                "throughput_tokens_per_s": o["throughput_tokens_per_s"],
                "ttft_p50_s": o["ttft_s"]["p50"],
                "ttft_p99_s": o["ttft_s"]["p99"],
                "latency_p50_s": o["latency_s"]["p50"],
                "latency_p99_s": o["latency_s"]["p99"],
                "identical": o["identical_to_plain"],
                "compared": o["compared_to_plain"],
            }
        )


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def identity(row):
    if row["server"] == servers["baseline"]:
        return "(reference)"
    return f"{row['identical']}/{row['compared']}"


lines = [
    "| server | concurrency | throughput (tok/s) | TTFT p50 / p99 (s) | latency p50 / p99 (s) | identical texts | errors |",
    "|---|---|---|---|---|---|---|",
]
for r in rows:
    lines.append(
        f"| {r['server']} | {r['concurrency']} | {fmt(r['throughput_tokens_per_s'], '.2f')} "
        f"| {fmt(r['ttft_p50_s'], '.3f')} / {fmt(r['ttft_p99_s'], '.3f')} "
        f"| {fmt(r['latency_p50_s'], '.3f')} / {fmt(r['latency_p99_s'], '.3f')} "
        f"| {identity(r)} | {r['errors']} |"
    )
(out / "table.md").write_text("\n".join(lines) + "\n")
(out / "table.json").write_text(json.dumps(rows, indent=1) + "\n")
print("\n".join(lines))
print(json.dumps({"kind": "spekula-server-compare", "table": str(out / "table.md"), "rows": len(rows)}))
EOF
