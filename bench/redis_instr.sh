#!/bin/sh
# redis_instr.sh - instructions redis-server executes per decision of the
# Redis store (docs/benchmarks.md, "Redis store"), counted by valgrind's
# callgrind, so the figure does not move with the machine's noise the way
# redis_bench.sh's rates and CPU times do: the counterpart, on Redis's
# side, of gateway_instr.sh.
#
#   bench/redis_instr.sh        (about two minutes; not part of make bench)
#
# Needs valgrind, callgrind_annotate, wrk, redis-server and redis-cli
# (prints why and exits 0 without them) and build/quotagate (or $QG_BIN).
# Starts redis-server under callgrind twice (no persistence, a free
# loopback port, a temporary folder), each time with one quotagate serve
# on it (the bench rules, a long store timeout: under callgrind Redis runs
# ~50x slower): idle (start, the script's load, 1 s, stop: what every run
# pays once), then under wrk check+settle pairs over 1000 subjects (one
# thread, 8 connections, BENCH_DURATION, default 20s).  Prints Redis's
# instructions per response (the whole process, the idle run's
# subtracted: the scripts, the commands outside them, the network, the
# event loop), and how many of them are in the commands the scripts run
# (redis.call; scriptCall's inclusive count).  The Lua interpreter's own
# share is not split out: redis-server's Lua is partly stripped and
# recursive, and callgrind's inclusive counts through that recursion
# moved between runs by half, where the process's total held within 2%.
# A third run counts only inside the script calls (callgrind's
# --toggle-collect on FCALL and EVALSHA: exclusive counts, no recursion
# to misread) and prints them per call, the figure a change to the
# scripts moves.
# KEEP_TMP=1 keeps the temporary folder (the profiles, the logs).
set -u

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
. bench/lib.sh
QG=${QG_BIN:-$ROOT/build/quotagate}
DUR=${BENCH_DURATION:-20s}
THREADS=1
CONNS=8
ADMIN_KEY="bench-admin-key-$$"
SERVICE_KEY="bench-service-key-$$"
RUN_ID="ri$$-$(date +%s)"

for t in valgrind callgrind_annotate wrk redis-server redis-cli; do
    if ! command -v $t >/dev/null 2>&1; then
        say "redis_instr: $t not found; skipped"
        exit 0
    fi
done
[ -x "$QG" ] || { say "redis_instr: $QG not built (make)"; exit 1; }

TMP=$(mktemp -d /tmp/qg-rinstr.XXXXXX)
RPORT=$(pick_port)
RPID=
cleanup() {
    [ -n "${QG_PID:-}" ] && stop_pid "$QG_PID"
    redis-cli -p "$RPORT" shutdown nosave >/dev/null 2>&1
    [ -n "$RPID" ] && stop_pid "$RPID"
    [ -n "${KEEP_TMP:-}" ] && echo "kept $TMP" || rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

bench_rules_default "$TMP/rules.yaml"
printf 'store: { timeout: 30s, down: closed }\n' >> "$TMP/rules.yaml"

# total NAME: the program's instructions in $TMP/cg.NAME
total() {
    callgrind_annotate "$TMP/cg.$1" 2>/dev/null |
        awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1; exit }'
}

# incl NAME FUNCTION: an exported function's inclusive instructions, 0
# when absent
incl() {
    callgrind_annotate --inclusive=yes "$TMP/cg.$1" 2>/dev/null |
        awk -v f="$2" '!n && index($0, "???:" f " ") { gsub(",", "", $1); n = $1 }
                       END { printf "%d\n", n }'
}

# run NAME [callgrind options]: redis-server under callgrind with one
# gateway on it; under wrk unless NAME is idle (start, the script's load,
# 1 s, stop).  Sets REQS and CALLS.
run() {
    run_name=$1
    shift
    rm -rf "$TMP/redis"
    mkdir -p "$TMP/redis"
    (cd "$TMP/redis" && exec valgrind --tool=callgrind "$@" \
        --callgrind-out-file="$TMP/cg.$run_name" redis-server --port "$RPORT" \
        --bind 127.0.0.1 --save '' --appendonly no \
        --logfile "$TMP/redis/log" >"$TMP/redis/valgrind.log" 2>&1) &
    RPID=$!
    i=0
    until redis-cli -p "$RPORT" ping >/dev/null 2>&1; do
        i=$((i + 1))
        [ $i -gt 300 ] && { say "redis-server did not start"; exit 1; }
        sleep 0.1
    done
    start_qg "gw-$run_name" "$TMP/rules.yaml" --store "redis://127.0.0.1:$RPORT"
    sleep 1
    REQS=0
    CALLS=0
    if [ "$run_name" != idle ]; then
        redis-cli -p "$RPORT" config resetstat >/dev/null
        run_wrk "w-$run_name" "$QG_URL" bench/wrk_settle.lua 1000
        REQS=$R_REQS
        CALLS=$(redis-cli -p "$RPORT" info commandstats | awk -F'[=,:]' \
            '/^cmdstat_(fcall|evalsha):/ { n += $3 } END { print n + 0 }')
    fi
    stop_pid "$QG_PID"
    QG_PID=
    redis-cli -p "$RPORT" shutdown nosave >/dev/null 2>&1
    # valgrind writes the profile as the server exits
    i=0
    while kill -0 "$RPID" 2>/dev/null && [ $i -lt 600 ]; do
        sleep 0.1; i=$((i + 1))
    done
    RPID=
}

run idle
IDLE=$(total idle)
run load
TOTAL=$(total load)
CMDS=$(incl load scriptCall)
say "Redis instructions per response (callgrind; wrk -t1 -c8 -d$DUR, check+settle pairs, one gateway)"
say "  idle run (start, the script's load, 1 s, stop): $IDLE instructions, subtracted below"
if [ "${REQS:-0}" -gt 0 ] && [ -n "$TOTAL" ] && [ -n "$IDLE" ]; then
    say "  $REQS responses, $CALLS script calls (FCALL or EVALSHA)"
    say "  per response: $(( (TOTAL - IDLE) / REQS )) instructions in all;" \
        "$((CMDS / REQS)) of them in the commands the scripts run (redis.call)"
else
    say "  no responses counted"
fi

# The script calls alone: instructions counted only inside FCALL and
# EVALSHA (toggle-collect: no inclusive counts through Lua's recursion)
run calls --toggle-collect=fcallCommand --toggle-collect=evalShaCommand
INSIDE=$(total calls)
if [ "${CALLS:-0}" -gt 0 ] && [ -n "$INSIDE" ]; then
    say "  per script call: $((INSIDE / CALLS)) instructions from the call to" \
        "its reply ($CALLS calls, a run of its own)"
fi
