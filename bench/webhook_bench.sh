#!/bin/sh
# webhook_bench.sh - does the notifications' outbox slow decisions?
# POST /v1/check throughput of two gateways in the same run, one with a
# notifications block (thresholds 0.8, 0.95, 1.0, forecast on, a webhook)
# and one without, on the same bench rules (bench/lib.sh), measured
# alternately: off, on, off, on, off, on.  Reports per side the median
# req/s of the 3 runs with their range, the on/off ratio of the medians
# (issue 12's target: >= 0.95), and the server CPU time per check (utime
# + stime from /proc over each run, divided by the checks wrk completed:
# the steadier figure on a shared machine), then system calls per check
# counted with strace -c over a short run of each (when strace exists).
#
#   bench/webhook_bench.sh        (make bench runs it)
#
# The bench plan's limits are huge, so no threshold is reached: this
# measures what every decision pays (the thresholds compared, the hint
# table read, the forecast judged once a minute per subject and window),
# not delivery.  Needs wrk (prints why and exits 0 without it).
# Environment: BENCH_DURATION (default 10s), BENCH_THREADS (2),
# BENCH_CONNECTIONS (64).
set -u

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
. bench/lib.sh
QG=${QG_BIN:-$ROOT/build/quotagate}
DUR=${BENCH_DURATION:-10s}
THREADS=${BENCH_THREADS:-2}
CONNS=${BENCH_CONNECTIONS:-64}
ADMIN_KEY="bench-admin-key-$$"
SERVICE_KEY="bench-service-key-$$"
RUN_ID="w$$-$(date +%s)"

command -v wrk >/dev/null 2>&1 || { say "webhook_bench: wrk is not installed; skipping"; exit 0; }
[ -x "$QG" ] || { say "webhook_bench: $QG is not built; skipping"; exit 0; }

TMP=$(mktemp -d /tmp/qg-webhook-bench.XXXXXX) || exit 1
OFF_PID=""; ON_PID=""
cleanup() { stop_pid "$OFF_PID"; stop_pid "$ON_PID"; rm -rf "$TMP"; }
trap cleanup EXIT
trap 'exit 130' INT TERM

bench_rules "$TMP/off.yaml"
HOOK_PORT=$(pick_port 31000)
{ cat "$TMP/off.yaml"
  printf 'notifications:\n  thresholds: [0.8, 0.95, 1.0]\n  forecast: true\n'
  printf '  webhooks:\n    - url: http://127.0.0.1:%s/hook\n' "$HOOK_PORT"
  printf '      secret_env: QG_BENCH_WEBHOOK_SECRET\n'; } > "$TMP/on.yaml"
lint_rules "$TMP/off.yaml"
lint_rules "$TMP/on.yaml"
export QG_BENCH_WEBHOOK_SECRET=whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw
start_qg off "$TMP/off.yaml"; OFF_PID=$QG_PID; OFF_URL=$QG_URL
start_qg on "$TMP/on.yaml"; ON_PID=$QG_PID; ON_URL=$QG_URL

cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }   # clock ticks
TICK=$(getconf CLK_TCK)
OFF_RPS=""; ON_RPS=""; OFF_CPU=""; ON_CPU=""
for round in 1 2 3; do
    for side in off on; do
        if [ $side = off ]; then pid=$OFF_PID url=$OFF_URL; else pid=$ON_PID url=$ON_URL; fi
        t0=$(cpu "$pid")
        run_wrk "$side-$round" "$url" bench/wrk_check.lua
        t1=$(cpu "$pid")
        if [ "$R_NON2XX" != 0 ]; then
            say "webhook_bench: $side answered $R_NON2XX non-2xx responses"; exit 1
        fi
        us=$(awk -v t=$((t1 - t0)) -v hz="$TICK" -v n="$R_REQS" \
             'BEGIN { printf "%.2f", t * 1e6 / hz / n }')
        if [ $side = off ]; then OFF_RPS="$OFF_RPS $R_RPS"; OFF_CPU="$OFF_CPU $us"
        else ON_RPS="$ON_RPS $R_RPS"; ON_CPU="$ON_CPU $us"; fi
        say "webhook_bench: round $round, notifications $side: $R_RPS checks/s, $us us CPU per check"
    done
done
# shellcheck disable=SC2086
MOFF=$(median $OFF_RPS); MON=$(median $ON_RPS)
# shellcheck disable=SC2086
say "webhook_bench: /v1/check, notifications off: $(spread $OFF_RPS) req/s (median of 3, range), $(median $OFF_CPU) us CPU per check"
# shellcheck disable=SC2086
say "webhook_bench: /v1/check, notifications on:  $(spread $ON_RPS) req/s (median of 3, range), $(median $ON_CPU) us CPU per check"
say "webhook_bench: on / off = $(ratio "$MON" "$MOFF") (target >= 0.95)"
# system calls per check (strace -c on the whole server, every thread:
# its overhead slows the run, the count per check stays meaningful)
if command -v strace >/dev/null 2>&1; then
    for side in off on; do
        if [ $side = off ]; then pid=$OFF_PID url=$OFF_URL; else pid=$ON_PID url=$ON_URL; fi
        strace -f -c -p "$pid" -o "$TMP/strace-$side.txt" 2>/dev/null &
        SPID=$!
        sleep 1
        DUR=3s CONNS=8 THREADS=1 run_wrk "strace-$side" "$url" bench/wrk_check.lua
        kill -INT "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null
        calls=$(awk '$NF == "total" {print $4}' "$TMP/strace-$side.txt")
        say "webhook_bench: notifications $side: $(awk -v c="${calls:-0}" -v n="$R_REQS" \
             'BEGIN { printf "%.2f", c / n }') system calls per check (strace -c, $R_REQS checks)"
    done
fi
EVENTS=$(curl -s "$ON_URL/metrics" | awk '$1 == "quotagate_webhook_events_total" {print $2}')
say "webhook_bench: events created during the run: ${EVENTS:-?} (none expected: no threshold is reached)"
