#!/bin/sh
# gateway_instr.sh - instructions the gateway executes per response, on
# the memory store and on Redis (docs/benchmarks.md, "Redis store"):
# counted by valgrind's callgrind, so the figure does not move with the
# machine's noise the way a req/s ratio does.
#
#   bench/gateway_instr.sh        (about 2 minutes; not part of make bench)
#
# Needs valgrind, wrk, redis-server and redis-cli (prints why and exits 0
# without them) and build/quotagate (or $QG_BIN).  Starts a redis-server
# (no persistence, a free loopback port, a temporary folder), then
# quotagate serve under callgrind three times on the bench rules: idle
# (start, one second, SIGTERM: what every run pays once), on the memory
# store and on Redis, the last two under wrk check+settle pairs over 1000
# subjects (one thread, 8 connections, BENCH_DURATION, default 20s).
# Prints (instructions of the run - the idle run's) / responses for
# each, and how much of it the ledger writer thread took.  The ledger's batching depends on timing, and under callgrind the
# gateway runs ~50x slower: compare figures of this script with each
# other, not with CPU time under full load.
set -u

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
. bench/lib.sh
QGBIN=${QG_BIN:-$ROOT/build/quotagate}
DUR=${BENCH_DURATION:-20s}
THREADS=1
CONNS=8
ADMIN_KEY="bench-admin-key-$$"
SERVICE_KEY="bench-service-key-$$"
RUN_ID="i$$-$(date +%s)"

for t in valgrind callgrind_annotate wrk redis-server redis-cli; do
    if ! command -v $t >/dev/null 2>&1; then
        say "gateway_instr: $t not found; skipped"
        exit 0
    fi
done
[ -x "$QGBIN" ] || { say "gateway_instr: $QGBIN not built (make)"; exit 1; }

TMP=$(mktemp -d /tmp/qg-instr.XXXXXX)
RPORT=$(pick_port)
cleanup() {
    [ -n "${QG_PID:-}" ] && stop_pid "$QG_PID"
    redis-cli -p "$RPORT" shutdown nosave >/dev/null 2>&1
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

mkdir -p "$TMP/redis"
(cd "$TMP/redis" && redis-server --port "$RPORT" --bind 127.0.0.1 \
    --save '' --appendonly no --daemonize yes --logfile "$TMP/redis/log")
i=0
until redis-cli -p "$RPORT" ping >/dev/null 2>&1; do
    i=$((i + 1)); [ $i -gt 50 ] && { say "redis-server did not start"; exit 1; }
    sleep 0.1
done

bench_rules_default "$TMP/rules.yaml"
# a long store timeout: under callgrind a call takes ~50x longer
printf 'store: { timeout: 10s, down: closed }\n' >> "$TMP/rules.yaml"

# quotagate under callgrind, its profile in $TMP/cg.$MODE
cat > "$TMP/qg" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file=$TMP/cg.\$QG_MODE $QGBIN "\$@"
EOF
chmod +x "$TMP/qg"
QG="$TMP/qg"

instructions() {
    callgrind_annotate "$TMP/cg.$1" 2>/dev/null |
        awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }'
}

# the ledger writer thread's share (its batches grow with the request
# rate, so its cost per response moves with the run's speed)
writer() {
    callgrind_annotate --inclusive=yes "$TMP/cg.$1" 2>/dev/null |
        awk '/qg__lf_writer_main/ { gsub(",", "", $1); print $1; exit }'
}

# run MODE [serve arguments...]: one gateway under callgrind; sets REQS
run() {
    mode=$1
    shift
    QG_MODE=$mode
    export QG_MODE
    start_qg "$mode" "$TMP/rules.yaml" "$@"
    sleep 1
    REQS=0
    if [ "$mode" != idle ]; then
        run_wrk "w$mode" "$QG_URL" bench/wrk_settle.lua 1000
        REQS=$R_REQS
    fi
    # TERM, and time for valgrind to write the profile (stop_pid's 5 s
    # may not be enough under callgrind)
    kill -TERM "$QG_PID" 2>/dev/null
    i=0
    while kill -0 "$QG_PID" 2>/dev/null && [ $i -lt 600 ]; do
        sleep 0.1; i=$((i + 1))
    done
    stop_pid "$QG_PID"
    QG_PID=
}

run idle
IDLE=$(instructions idle)
say "gateway instructions per response (callgrind; wrk -t1 -c8 -d$DUR, check+settle pairs)"
say "  idle run (start, 1 s, stop): $IDLE instructions, subtracted below"
for mode in memory redis; do
    if [ $mode = redis ]; then
        run redis --store "redis://127.0.0.1:$RPORT"
    else
        run memory
    fi
    total=$(instructions $mode)
    wr=$(writer $mode)
    if [ "$REQS" -gt 0 ] 2>/dev/null && [ -n "$total" ]; then
        per=$(( (total - IDLE) / REQS ))
        rest=$(( (total - IDLE - ${wr:-0}) / REQS ))
        say "  $mode: $REQS responses, $total instructions: $per per response" \
            "($(( ${wr:-0} / REQS )) in the ledger writer, $rest in the rest)"
        eval "PER_$mode=$per REST_$mode=$rest"
    else
        say "  $mode: no responses counted"
    fi
done
if [ -n "${PER_memory:-}" ] && [ -n "${PER_redis:-}" ]; then
    say "  Redis's extra per response: $((PER_redis - PER_memory)) instructions" \
        "($((REST_redis - REST_memory)) outside the ledger writer)"
fi
