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
TMP=$(mktemp -d /tmp/qg-check-cpu.XXXXXX) || exit 1
PID=""
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT
awk '
    { print }
    /^plans:/ {
        print "  bench:"
        print "    price: { usd_month: 1 }"
        print "    windows:"
        print "      - { name: burst_5h, type: rolling,  length: 5h, limit: 1000000000 }"
        print "      - { name: weekly,   type: calendar, every: week, at: \"MON 00:00\", tz: \"UTC\", limit: 1000000000 }"
        print "    lease_ttl: 1s"
        print "    overage: { policy: reject }"
    }
    /^subjects:/ { print "  bench: { plan: bench }" }
' examples/rules.yaml > "$TMP/rules.yaml"
export QUOTAGATE_ADMIN_KEY="cpu-admin-$$" QUOTAGATE_SERVICE_KEY="cpu-service-$$"
"$QG" serve -c "$TMP/rules.yaml" --listen 127.0.0.1:0 --data "$TMP/qg" \
    >"$TMP/out" 2>"$TMP/err" &
PID=$!
PORT=""
for i in $(seq 200); do
    PORT=$(sed -n 's|^quotagate: listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$TMP/out")
    [ -n "$PORT" ] && break
    sleep 0.1
done
[ -n "$PORT" ] || { echo "check_cpu: serve did not start"; cat "$TMP/err"; exit 1; }
t0=$(awk '{print $14 + $15}' "/proc/$PID/stat")
OUT=$(wrk -t2 -c64 -d"$DUR" -s bench/wrk_check.lua "http://127.0.0.1:$PORT" -- "cpu$$" bench 2>&1)
t1=$(awk '{print $14 + $15}' "/proc/$PID/stat")
REQ=$(echo "$OUT" | sed -n 's/^ *\([0-9]*\) requests in.*/\1/p')
NON=$(echo "$OUT" | sed -n 's/.*Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p')
HZ=$(getconf CLK_TCK)
echo "$LABEL: $REQ checks, ${NON:-0} non-2xx, server CPU $(( (t1 - t0) * 1000000 / HZ / REQ )) us per check"
