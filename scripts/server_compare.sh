#!/usr/bin/env bash
# server_compare.sh: spekula serve against another server (llama-cpp-python's, or llama.cpp's own llama-server, plain
# and speculating), same GGUF, same client.
#
#   scripts/server_compare.sh OUT_DIR [MODEL]
#
# MODEL is a built-in model name (default qwen2.5-coder-1.5b: its Q4_K_M GGUF in ~/.cache/spekula) or a .gguf
# path. Every server runs on loopback with the same GGUF, the same threads and the same context length per request
# (N: the max_model_len spekula serve reports):
#   spekula serve --target MODEL --threads $THREADS [--draft $DRAFT]
# against one or more baselines:
#   llama_cpp.server (the default): python -m llama_cpp.server --model GGUF --n_threads $THREADS
#         --n_threads_batch $THREADS --n_ctx N --interrupt_requests false
#     (interruption off: by default that server cuts a running stream short whenever another request arrives);
#   llama-server, llama.cpp's own server (LLAMA_SERVER_SPECS set): one baseline per --spec-type in LLAMA_SERVER_SPECS
#     and per slot count in LLAMA_SERVER_NP:
#       $LLAMA_SERVER -m GGUF -t $THREADS -tb $THREADS -np P -c N*P --host 127.0.0.1 --port ... [--spec-type S]
#     (-c N*P: llama-server splits its context over its P slots, so each holds N as spekula's sequences do; the chat
#     template is the GGUF's, llama-server's default; its other settings are its defaults; greedy at temperature 0);
#   a second spekula serve (BASELINE_SERVE_ARGS set): an A/B of two settings, same method.
# For every baseline and every concurrency C of $CONCURRENCIES, spekula serve and the baseline are started fresh (what
# one run taught a server, spekula's memory of earlier answers or llama-server's n-gram pool, never carries into
# the next), each is warmed with one short request, then
#   spekula bench --endpoint <spekula serve> --baseline-endpoint <baseline> --concurrency C --repeats $REPEATS --salt
#                 [--baseline-extra-body '{"repeat_penalty": 1.0}' for llama_cpp.server] [--warm $WARM]
# runs over the built-in suite ($PER_CATEGORY prompts of each category, at most $MAX_TOKENS tokens each, greedy; a
# concurrency above the number of prompts cycles them so that C requests are in flight), and both are stopped.
# The repeat penalty of 1.0 makes llama_cpp.server's temperature 0 plain greedy decoding (its default is 1.1), so the
# texts can be compared. The servers take turns, one at a time, $REPEATS phases each, in alternating order (the
# baseline first, then spekula serve first, ...): the machine's speed drifts by tens of percent within minutes, and a
# single phase each would hand that drift to whichever server ran in the faster minutes. --salt begins every phase's
# prompts with a line of their own, so neither server answers a prompt from its cache of an earlier phase.
# Cold or warm: without WARM each run measures freshly started servers (a request drafts only from the run's earlier
# requests). With WARM=M every run is `spekula bench --warm M`: one long mixed sequence, its first M requests sent to
# each server unreported, then the reported ones (prompts new to the servers, plus a 'resent' row), cut into $REPEATS
# phases; REQUESTS sets how many are reported. Servers are stopped on exit, whatever happens.
#
# Writes under OUT_DIR, per run (OUT_DIR/c<C>/ with one baseline, OUT_DIR/<baseline>/c<C>/ with several): the bench's
# results.json, summary.md (per category), report.html, plots, both servers' logs and warmup/; then commands.txt
# (every command run), table.md (one row per server and run: throughput, TTFT p50/p99, latency p50/p99, greedy
# identity, errors; then spekula serve's median per-request speedup over each baseline, per category) and table.json.
# The defaults are sized for about 30 minutes on 2 cores with the 1.5B model; run it on a quiet machine.
#
# Environment (defaults in brackets):
#   CONCURRENCIES [1 4 16]  PER_CATEGORY [2; all: every prompt]  CATEGORIES [all, or e.g. code-editing,open-chat]
#   MAX_TOKENS [48]  REPEATS [2] phases per server in each run
#   SHUFFLE_SEED [unset: the suite's order] the chosen prompts in a seeded random order (an edit session's turns
#                stay in order, one after the other); with WARM, the seed of the warm sequence
#   WARM [unset: cold] requests sent to each server before the reported ones (spekula bench --warm M)
#   REQUESTS [unset] with WARM: reported requests per server (default: every prompt the sequence holds out once)
#   WAVES [0] 1: requests in waves of C, each once the last wave's answers are all in, each request once the server
#             has queued the one before (spekula bench --waves), so both servers serve the same batches in the same
#             order (for two spekula servers: llama-server answers the headers only with the first token);
#             0: a new request as soon as one ends (closed loop)
#   BASELINE_FIRST [0] 1: the baseline starts before spekula serve (by default spekula serve starts first), so
#                  an A/A run can tell a seat's effect (start order, port) from a server's; needs N_CTX unless the
#                  baseline is a second spekula serve
#   THREADS [2]  DRAFT [spekula serve's default]  SERVE_ARGS [none: more `spekula serve` options]
#   N_CTX [spekula serve's max_model_len]  REQUEST_TIMEOUT [600]  SPEKULA_PORT [8411]  LLAMA_PORT [8412]
#   START_TIMEOUT [600] seconds to wait for each server  PYTHON [.venv/bin/python, else python3]
#   BASELINE_HUGE_PAGES [1] 1: the baseline (llama_cpp.server or llama-server) starts with
#                       GLIBC_TUNABLES=glibc.malloc.hugetlb=1, the 2 MiB pages `spekula serve` gives itself
#                       (spekula.hugepages), so both sides decode on the same page size; 0: as a user starts it
#                       (where THP is "madvise": slower one-token passes, docs/decisions/0002-huge-pages.md)
#   BASELINE_SERVE_ARGS [unset] when set (even to "-"), the baseline is a second `spekula serve` with these options
#                       in place of llama_cpp.server (on LLAMA_PORT)
#   LLAMA_SERVER_SPECS [unset] when set, the baselines are llama-server's: a space-separated list of its
#                       --spec-type values, none for no speculation, e.g. "none ngram-simple ngram-mod"; all: every
#                       mode that needs no draft model (none ngram-simple ngram-map-k ngram-map-k4v ngram-mod
#                       ngram-cache)
#   LLAMA_SERVER_NP [concurrency] llama-server's -np: concurrency = the run's concurrency C, or a list such as "1 4"
#                       (every run then once per slot count)
#   LLAMA_SERVER [.venv/bin/llama-server] the binary (`make llama-server` builds it from the llama.cpp source the
#                       installed llama-cpp-python vendors)
#   LLAMA_SERVER_ARGS [none] more llama-server options for every llama-server baseline
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
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
BASELINE_SERVE_ARGS=${BASELINE_SERVE_ARGS:-}
BASELINE_HUGE_PAGES=${BASELINE_HUGE_PAGES:-1}
SHUFFLE_SEED=${SHUFFLE_SEED:-}
WARM=${WARM:-}
REQUESTS=${REQUESTS:-}
WAVES=${WAVES:-0}
BASELINE_FIRST=${BASELINE_FIRST:-0}
LLAMA_SERVER_SPECS=${LLAMA_SERVER_SPECS:-}
LLAMA_SERVER_NP=${LLAMA_SERVER_NP:-concurrency}
LLAMA_SERVER=${LLAMA_SERVER:-$ROOT/.venv/bin/llama-server}
LLAMA_SERVER_ARGS=${LLAMA_SERVER_ARGS:-}
# llama-server's --spec-type values that need no draft model (common/speculative.cpp); none: no speculation
LLAMA_SPEC_TYPES=(none ngram-simple ngram-map-k ngram-map-k4v ngram-mod ngram-cache)

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'; }
log() { echo "server_compare: $*" >&2; }
record() { # ARGV...: append one command line to commands.txt, naming no machine: paths from the checkout, from
    # $SPEKULA_CACHE or from ~ (as spekula.bench.manifest.portable writes them)
    local line cache=${SPEKULA_CACHE:-$HOME/.cache/spekula}
    line=$(printf '%q ' "$@")
    line=${line//"$ROOT/"/}
    line=${line//"$cache/"/'$SPEKULA_CACHE/'}
    line=${line//"$HOME/"/'~/'}
    echo "$line" >>"$OUT/commands.txt"
}

# The baselines, as parallel arrays: display name, kind (llama_cpp.server | llama-server | spekula), llama-server's
# --spec-type, its -np (a number, or "concurrency").
BASE_NAMES=()
BASE_KINDS=()
BASE_SPECS=()
BASE_NPS=()
add_baseline() { BASE_NAMES+=("$1"); BASE_KINDS+=("$2"); BASE_SPECS+=("${3:-}"); BASE_NPS+=("${4:-}"); }

plan_baselines() {
    if [ -n "$LLAMA_SERVER_SPECS" ]; then
        [ -n "$BASELINE_SERVE_ARGS" ] && { log "set LLAMA_SERVER_SPECS or BASELINE_SERVE_ARGS, not both"; exit 2; }
        local specs=$LLAMA_SERVER_SPECS spec np
        [ "$specs" = all ] && specs="${LLAMA_SPEC_TYPES[*]}"
        for spec in $specs; do
            if [[ " ${LLAMA_SPEC_TYPES[*]} " != *" $spec "* ]]; then
                log "LLAMA_SERVER_SPECS: unknown --spec-type '$spec'; choose from ${LLAMA_SPEC_TYPES[*]} (or all);" \
                    "a draft model's modes need -md: pass them in LLAMA_SERVER_ARGS"
                exit 2
            fi
        done
        for np in $LLAMA_SERVER_NP; do
            if [ "$np" != concurrency ] && ! [[ $np =~ ^[1-9][0-9]*$ ]]; then
                log "LLAMA_SERVER_NP: '$np' is neither a slot count nor 'concurrency'"
                exit 2
            fi
            for spec in $specs; do
                local name="llama-server"
                [ "$np" != concurrency ] && name+=" -np $np"
                [ "$spec" != none ] && name+=" $spec"
                add_baseline "$name" llama-server "$spec" "$np"
            done
        done
    elif [ -n "$BASELINE_SERVE_ARGS" ]; then
        add_baseline "spekula serve $BASELINE_SERVE_ARGS" spekula
    else
        add_baseline llama_cpp.server llama_cpp.server
    fi
}

require_llama_server() {
    if [ ! -x "$LLAMA_SERVER" ]; then
        log "no llama-server at $LLAMA_SERVER: run \`make llama-server\` (it builds llama.cpp's own server from the" \
            "source the installed llama-cpp-python vendors), or point LLAMA_SERVER at one"
        exit 1
    fi
}

# The argv of baseline I at concurrency C on LLAMA_PORT, into BASE_ARGV (and its environment into BASE_ENV).
baseline_argv() {
    local i=$1 c=$2 np
    BASE_ENV=()
    case ${BASE_KINDS[$i]} in
    spekula)
        local extra=()
        [ "$BASELINE_SERVE_ARGS" != - ] && read -r -a extra <<<"$BASELINE_SERVE_ARGS"
        BASE_ARGV=("$PYTHON" "${SPEKULA_SERVE[@]}" --port "$LLAMA_PORT" "${extra[@]}")
        return
        ;;
    llama_cpp.server)
        BASE_ARGV=("$PYTHON" -m llama_cpp.server --model "$GGUF" --n_ctx "$N_CTX" --n_threads "$THREADS")
        BASE_ARGV+=(--n_threads_batch "$THREADS" --interrupt_requests false --host 127.0.0.1 --port "$LLAMA_PORT")
        ;;
    llama-server)
        np=${BASE_NPS[$i]}
        [ "$np" = concurrency ] && np=$c
        BASE_ARGV=("$LLAMA_SERVER" -m "$GGUF" -t "$THREADS" -tb "$THREADS" -np "$np" -c $((N_CTX * np)))
        BASE_ARGV+=(--host 127.0.0.1 --port "$LLAMA_PORT")
        if [ "${BASE_SPECS[$i]}" != none ]; then BASE_ARGV+=(--spec-type "${BASE_SPECS[$i]}"); fi
        local extra=()
        read -r -a extra <<<"$LLAMA_SERVER_ARGS"
        BASE_ARGV+=("${extra[@]}")
        ;;
    esac
    if [ "$BASELINE_HUGE_PAGES" = 1 ]; then BASE_ENV=(GLIBC_TUNABLES=glibc.malloc.hugetlb=1); fi
}

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
    PIDS=()
}

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

start() { # NAME LOG READY_PATH PORT ENV... -- ARGV...: start a server in the background and wait until it answers
    local name=$1 logfile=$2 ready=$3 port=$4
    shift 4
    local env=()
    while [ "$1" != -- ]; do env+=("$1"); shift; done
    shift
    log "starting $name on port $port"
    record "${env[@]}" "$@"
    env "${env[@]}" "$@" >"$logfile" 2>&1 &
    PIDS+=($!)
    wait_ready "http://127.0.0.1:$port$ready" "${PIDS[-1]}" "$name" "$logfile"
}

resolve_gguf() { # the GGUF every server loads: a built-in name's file in the spekula cache, or the path given
    "$PYTHON" - "$MODEL" <<'EOF'
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
}

workload_args() { # the bench options that choose the prompts, into WORKLOAD (writes OUT/workload.jsonl if shuffled)
    WORKLOAD=()
    [ "$PER_CATEGORY" != all ] && WORKLOAD+=(--per-category "$PER_CATEGORY")
    [ -n "$CATEGORIES" ] && WORKLOAD+=(--categories "$CATEGORIES")
    if [ -n "$WARM" ]; then
        WORKLOAD+=(--warm "$WARM")
        [ -n "$REQUESTS" ] && WORKLOAD+=(--requests "$REQUESTS")
        [ -n "$SHUFFLE_SEED" ] && WORKLOAD+=(--shuffle-seed "$SHUFFLE_SEED")
        return 0
    fi
    [ -z "$SHUFFLE_SEED" ] && return 0
    "$PYTHON" - "$PER_CATEGORY" "$CATEGORIES" "$SHUFFLE_SEED" "$OUT/workload.jsonl" <<'EOF'
import json
import random
import sys

from spekula.bench.workloads import conversation_order, load_workload, select

wanted = sys.argv[2].split(",") if sys.argv[2] else None
per_category = None if sys.argv[1] == "all" else int(sys.argv[1])
items = select(load_workload("builtin"), categories_wanted=wanted, per_category=per_category)
random.Random(int(sys.argv[3])).shuffle(items)
items = conversation_order(items)  # each session's later turns right after its first, as in the suite
with open(sys.argv[4], "w", encoding="utf-8") as f:
    f.writelines(json.dumps(item.to_dict()) + "\n" for item in items)
EOF
    WORKLOAD=(--workload "$OUT/workload.jsonl")
}

count_prompts() {
    "$PYTHON" -c "
import sys
from spekula.bench.workloads import load_workload, select
wanted = sys.argv[2].split(',') if sys.argv[2] else None
per_category = None if sys.argv[1] == 'all' else int(sys.argv[1])
print(len(select(load_workload('builtin'), categories_wanted=wanted, per_category=per_category)))" \
        "$PER_CATEGORY" "$CATEGORIES"
}

start_spekula() { # DIR: spekula serve on SPEKULA_PORT; N_CTX from its /v1/models when unset
    start "spekula serve ($TARGET)" "$1/spekula-serve.log" /health "$SPEKULA_PORT" -- \
        "$PYTHON" "${SPEKULA_SERVE[@]}" --port "$SPEKULA_PORT" "${SERVE_EXTRA[@]}"
    if [ -z "$N_CTX" ]; then
        N_CTX=$("$PYTHON" -c "
import json, sys, urllib.request
models = json.load(urllib.request.urlopen(sys.argv[1] + '/v1/models'))['data']
print(models[0]['max_model_len'])" "http://127.0.0.1:$SPEKULA_PORT")
    fi
}

start_baseline() { # I C DIR: baseline I at concurrency C on LLAMA_PORT
    local i=$1 ready=/v1/models
    baseline_argv "$i" "$2"
    [ "${BASE_KINDS[$i]}" != llama_cpp.server ] && ready=/health
    start "${BASE_NAMES[$i]}" "$3/baseline.log" "$ready" "$LLAMA_PORT" "${BASE_ENV[@]}" -- "${BASE_ARGV[@]}"
}

start_servers() { # I C DIR: spekula serve and baseline I, in the order BASELINE_FIRST sets
    if [ "$BASELINE_FIRST" = 1 ]; then
        start_baseline "$1" "$2" "$3"
        start_spekula "$3"
    else
        start_spekula "$3"
        start_baseline "$1" "$2" "$3"
    fi
}

run_one() { # I C DIR: spekula serve against baseline I at concurrency C, on freshly started servers
    local i=$1 c=$2 dir=$3 body='{}'
    mkdir -p "$dir"
    start_servers "$i" "$c" "$dir"
    [ "${BASE_KINDS[$i]}" = llama_cpp.server ] && body='{"repeat_penalty": 1.0}'  # its temperature 0 as plain greedy
    local common=(--endpoint "http://127.0.0.1:$SPEKULA_PORT" --baseline-endpoint "http://127.0.0.1:$LLAMA_PORT")
    common+=(--baseline-extra-body "$body" --request-timeout "$REQUEST_TIMEOUT" --no-progress)
    log "warming both servers with one short request each"
    record "$PYTHON" -m spekula bench "${common[@]}" --limit 1 --max-tokens 4 --out "$dir/warmup"
    "$PYTHON" -m spekula bench "${common[@]}" --limit 1 --max-tokens 4 --out "$dir/warmup" >/dev/null
    local load=(--concurrency "$c" --repeats "$REPEATS" --salt --max-tokens "$MAX_TOKENS")
    [ -z "$WARM" ] && load+=(--requests $((c > PROMPTS ? c : PROMPTS)))
    [ "$WAVES" = 1 ] && load+=(--waves)
    log "${BASE_NAMES[$i]}, concurrency $c: $REPEATS phases per server (${WARM:+warm after $WARM requests, }max_tokens $MAX_TOKENS)"
    record "$PYTHON" -m spekula bench "${common[@]}" "${WORKLOAD[@]}" "${load[@]}" --out "$dir"
    "$PYTHON" -m spekula bench "${common[@]}" "${WORKLOAD[@]}" "${load[@]}" --out "$dir" >"$dir/bench.txt"
    stop_servers
    printf '%s\t%s\t%s\n' "${BASE_NAMES[$i]}" "$c" "$dir" >>"$OUT/runs.tsv"
}

make_table() { # OUT/table.md and table.json from every run listed in OUT/runs.tsv
    "$PYTHON" - "$OUT" <<'EOF'
import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
runs = [line.split("\t") for line in (out / "runs.tsv").read_text().splitlines() if line]
rows, speedups = [], []
for baseline, c, folder in runs:
    result = json.loads((Path(folder) / "results.json").read_text())
    memory = (result.get("proposer_memory") or {}).get("state", "server")
    for config, server in (("endpoint", "spekula serve"), ("baseline", baseline)):
        o = result["summary"][config]["overall"]
        rows.append(
            {
                "baseline": baseline,
                "concurrency": int(c),
                "memory": memory,
                "server": server,
                "requests": o["requests"],
                "errors": o["errors"],
                "throughput_tokens_per_s": o["throughput_tokens_per_s"],
                "ttft_p50_s": o["ttft_s"]["p50"],
                "ttft_p99_s": o["ttft_s"]["p99"],
                "latency_p50_s": o["latency_s"]["p50"],
                "latency_p99_s": o["latency_s"]["p99"],
                "identical": o["identical_to_plain"] if config == "endpoint" else None,
                "compared": o["compared_to_plain"] if config == "endpoint" else None,
            }
        )
    mine = result["summary"]["endpoint"]
    order = [cat for cat in result["workload"]["categories"] if cat in mine["categories"]]
    by_category = {cat: mine["categories"][cat]["speedup"]["median"] for cat in order}
    speedups.append(
        {
            "baseline": baseline,
            "concurrency": int(c),
            "memory": memory,
            "all": mine["overall"]["speedup"]["median"],
            "categories": by_category,
        }
    )


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


lines = [
    "| baseline | concurrency | memory | server | throughput (tok/s) | TTFT p50 / p99 (s) | latency p50 / p99 (s) "
    "| identical texts | errors |",
    "|---|---|---|---|---|---|---|---|---|",
]
for r in rows:
    same = "(reference)" if r["identical"] is None else f"{r['identical']}/{r['compared']}"
    lines.append(
        f"| {r['baseline']} | {r['concurrency']} | {r['memory']} | {r['server']} "
        f"| {fmt(r['throughput_tokens_per_s'], '.2f')} "
        f"| {fmt(r['ttft_p50_s'], '.3f')} / {fmt(r['ttft_p99_s'], '.3f')} "
        f"| {fmt(r['latency_p50_s'], '.3f')} / {fmt(r['latency_p99_s'], '.3f')} | {same} | {r['errors']} |"
    )
categories = list(dict.fromkeys(cat for r in speedups for cat in r["categories"]))
lines += [
    "",
    "spekula serve's tokens/s over the baseline's, median per request (same prompt, same phase):",
    "",
    "| baseline | concurrency | memory | all | " + " | ".join(categories) + " |",
    "|---|---|---|---|" + "---|" * len(categories),
]
for r in speedups:
    cells = " | ".join(fmt(r["categories"].get(cat), ".3f") for cat in categories)
    lines.append(f"| {r['baseline']} | {r['concurrency']} | {r['memory']} | {fmt(r['all'], '.3f')} | {cells} |")
(out / "table.md").write_text("\n".join(lines) + "\n")
(out / "table.json").write_text(json.dumps({"rows": rows, "speedups": speedups}, indent=1) + "\n")
print("\n".join(lines))
print(json.dumps({"kind": "spekula-server-compare", "table": str(out / "table.md"), "runs": len(runs)}))
EOF
}

main() {
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
    [[ $WAVES == [01] ]] || { log "WAVES must be 0 (closed loop) or 1 (waves), got '$WAVES'"; exit 2; }
    [[ $BASELINE_FIRST == [01] ]] || { log "BASELINE_FIRST must be 0 or 1, got '$BASELINE_FIRST'"; exit 2; }
    if [ "$WAVES" = 1 ] && [ -z "$BASELINE_SERVE_ARGS" ]; then
        log "WAVES=1 compares two spekula servers (set BASELINE_SERVE_ARGS): llama-server answers a request's headers"
        log "only with its first token, so a wave would reach it one request per first token; use WAVES=0 against it"
        exit 2
    fi
    plan_baselines
    [[ " ${BASE_KINDS[*]} " == *" llama-server "* ]] && require_llama_server
    if [ "$BASELINE_FIRST" = 1 ] && [ -z "$N_CTX" ] && [[ " ${BASE_KINDS[*]} " != " spekula " ]]; then
        log "BASELINE_FIRST=1 starts the baseline before spekula serve reports its context length: set N_CTX"
        exit 2
    fi
    mkdir -p "$OUT"
    OUT=$(cd "$OUT" && pwd)
    : >"$OUT/commands.txt"
    : >"$OUT/runs.tsv"
    GGUF=$(resolve_gguf)
    TARGET=$MODEL
    [[ $MODEL == *.gguf ]] && TARGET=$GGUF
    SPEKULA_SERVE=(-m spekula serve --target "$TARGET" --threads "$THREADS" --host 127.0.0.1)
    [ -n "$DRAFT" ] && SPEKULA_SERVE+=(--draft "$DRAFT")
    read -r -a SERVE_EXTRA <<<"$SERVE_ARGS"
    trap stop_servers EXIT
    workload_args
    PROMPTS=$(count_prompts)
    local i c dir slug
    for i in "${!BASE_NAMES[@]}"; do
        slug=$(echo "${BASE_NAMES[$i]}" | tr -c 'A-Za-z0-9.\n-' '-' | tr -s '-')
        for c in $CONCURRENCIES; do
            dir=$OUT/c$c
            [ ${#BASE_NAMES[@]} -gt 1 ] && dir=$OUT/$slug/c$c
            run_one "$i" "$c" "$dir"
        done
    done
    make_table
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
    main "$@"
fi
