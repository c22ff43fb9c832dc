#!/bin/sh
# check_cpu.sh - server CPU time per POST /v1/check, the steadier figure on
# a shared machine (docs/benchmarks.md): quotagate serve on the bench rules
# of http_bench.sh, wrk with bench/wrk_check.lua (a new request id each
# time, never settled) for BENCH_DURATION (5s), 2 threads, 64 connections;
# the server's utime + stime from /proc before and after, divided by the
# requests wrk completed.
#
#   bench/check_cpu.sh [QUOTAGATE_BINARY [LABEL]]
#
# Run two binaries alternately to compare them in one session.  Needs wrk.
set -u
cd "$(dirname "$0")/.." || exit 1
QG=${1:-build/quotagate}
LABEL=${2:-$QG}
DUR=${BENCH_DURATION:-5s}
command -v wrk >/dev/null 2>&1 || { echo "check_cpu: wrk is not installed"; exit 0; }
. bench/lib.sh
ADMIN_KEY="cpu-admin-$$" SERVICE_KEY="cpu-service-$$"
TMP=$(mktemp -d /tmp/qg-check-cpu.XXXXXX) || exit 1
QG_PID=""
trap 'stop_pid "$QG_PID"; rm -rf "$TMP"' EXIT
bench_rules "$TMP/rules.yaml"
start_qg qg "$TMP/rules.yaml"
PID=$QG_PID
t0=$(awk '{print $14 + $15}' "/proc/$PID/stat")
OUT=$(QUOTAGATE_SERVICE_KEY=$SERVICE_KEY wrk -t2 -c64 -d"$DUR" -s bench/wrk_check.lua "$QG_URL" -- "cpu$$" bench 2>&1)
t1=$(awk '{print $14 + $15}' "/proc/$PID/stat")
REQ=$(echo "$OUT" | sed -n 's/^ *\([0-9]*\) requests in.*/\1/p')
NON=$(echo "$OUT" | sed -n 's/.*Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p')
HZ=$(getconf CLK_TCK)
echo "$LABEL: $REQ checks, ${NON:-0} non-2xx, server CPU $(( (t1 - t0) * 1000000 / HZ / REQ )) us per check"
