#!/bin/sh
# proxy_floor.sh - what the metering proxy costs without its metering:
# the floor of quotagate's own forwarding against nginx, and what each
# part of the metering costs a call (docs/benchmarks.md, "Proxy
# overhead", "The floor").
#
#   bench/proxy_floor.sh          the floor: bench/proxy_bench.sh run on a
#                                 build with every part switched off
#   bench/proxy_floor.sh parts    each part alone: one gateway at a time,
#                                 the parts' builds in turn, BENCH_SETS sets
#
# The build is HEAD of this checkout with bench/proxy_floor.patch
# applied, made in a temporary git worktree: the switches are never in
# the product.  The patch reads QG_BENCH_METERING_OFF, a sum of parts:
#   1 the ledger rows (the check's and the settle's row not queued; also
#     the decision's count in /metrics and its notification check),
#   2 the JSON scans (the request's model, estimate and cap, and the
#     answer's usage, taken as the bench's constants),
#   4 the engine (no check, no settle: every call admitted by an empty
#     decision, so its rate-limit headers are few),
#   8 the key (any key of a subject key's length is subject "bench":
#     no SHA-256, no cache).
# Only the plain route's figures mean anything with parts off: with the
# scans off a stream is read as a plain answer.
# Needs what bench/proxy_bench.sh needs, and git.  Environment:
# BENCH_SETS (parts: 8), BENCH_DURATION (parts: 6s), BENCH_PARTS (parts:
# "0 1 2 4 8 15"); the floor passes the rest to bench/proxy_bench.sh.
# Everything listens on 127.0.0.1 only; the worktree and every process
# started here are removed and stopped on exit (trap).
set -u

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
. bench/lib.sh
MODE=${1:-floor}

skip() { say "proxy_floor: $*; skipping"; exit 0; }
command -v git >/dev/null 2>&1 || skip "git is not installed"
command -v wrk >/dev/null 2>&1 ||
    skip "wrk is not installed (apt-get install wrk)"
command -v curl >/dev/null 2>&1 || skip "curl is not installed"
git rev-parse --verify -q HEAD >/dev/null 2>&1 || skip "not a git checkout"
case $MODE in
    floor|parts) ;;
    *) echo "usage: bench/proxy_floor.sh [floor|parts]" >&2; exit 2 ;;
esac

TMP=$(mktemp -d /tmp/qg-proxy-floor.XXXXXX)
WT="$TMP/src"
DBL_PID="" QG_PID=""
cleanup() {
    stop_pid "$QG_PID"
    stop_pid "$DBL_PID"
    git worktree remove --force "$WT" >/dev/null 2>&1
    git worktree prune >/dev/null 2>&1
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

say "proxy_floor: building HEAD ($(git rev-parse --short HEAD))" \
    "with bench/proxy_floor.patch in $WT"
git worktree add -q --detach "$WT" HEAD ||
    { say "proxy_floor: git worktree add failed"; exit 1; }
(cd "$WT" && git apply "$ROOT/bench/proxy_floor.patch") || {
    say "proxy_floor: bench/proxy_floor.patch does not apply to HEAD" \
        "(the code it changes moved): update it"; exit 1; }
(cd "$WT" &&
    make -s build/quotagate build/upstream_double >"$TMP/build.log" 2>&1) || {
    say "proxy_floor: the build failed:"; tail -20 "$TMP/build.log"; exit 1; }
QG="$WT/build/quotagate"
DBL="$WT/build/upstream_double"

if [ "$MODE" = floor ]; then
    say "proxy_floor: bench/proxy_bench.sh with every part of the" \
        "metering off (QG_BENCH_METERING_OFF=15)"
    QG_BENCH_METERING_OFF=15 QG_BIN="$QG" QG_UPSTREAM_BIN="$DBL" \
        bench/proxy_bench.sh
    exit $?
fi

# ------------------------------------------------------------- parts
SETS=${BENCH_SETS:-8}
DUR=${BENCH_DURATION:-6s}
PARTS=${BENCH_PARTS:-0 1 2 4 8 15}
ADMIN_KEY="floor-admin-key-$$"

"$DBL" --listen 127.0.0.1:0 >"$TMP/dbl.out" 2>"$TMP/dbl.err" &
DBL_PID=$!
DBL_PORT=$(wait_port double "$DBL_PID" "$TMP/dbl.out" upstream_double:) || {
    say "proxy_floor: the upstream double did not start:"
    cat "$TMP/dbl.err"; exit 1; }
proxy_rules "$TMP/rules.yaml" proxy-floor-1

# one_run PARTS: a fresh gateway with those parts off, wrk plain over it;
# writes "REQ/S CPU_US_PER_CALL" to $TMP/one
one_run() {
    rm -rf "$TMP/qg"; mkdir -p "$TMP/qg"
    QG_BENCH_METERING_OFF=$1 QUOTAGATE_ADMIN_KEY=$ADMIN_KEY \
        QUOTAGATE_UPSTREAM_TIMEOUT_MS=10000 \
        "$QG" serve -c "$TMP/rules.yaml" --listen 127.0.0.1:0 \
        --data "$TMP/qg" --workers 2 \
        --upstream "http://127.0.0.1:$DBL_PORT" \
        >"$TMP/qg.out" 2>"$TMP/qg.err" &
    QG_PID=$!
    port=$(wait_port quotagate "$QG_PID" "$TMP/qg.out" quotagate:) || {
        say "proxy_floor: quotagate did not start:"
        cat "$TMP/qg.err"; exit 1; }
    key=$(curl -s -m 10 -H "Authorization: Bearer $ADMIN_KEY" \
          -H 'Content-Type: application/json' -d '{"subject":"bench"}' \
          "http://127.0.0.1:$port/v1/admin/keys" |
          sed -n 's/.*"key" *: *"\([^"]*\)".*/\1/p')
    [ -n "$key" ] || { say "proxy_floor: no subject key"; exit 1; }
    t0=$(cpu_ticks "$QG_PID")
    QG_SUBJECT_KEY=$key wrk -t2 -c32 -d"$DUR" --latency \
        -s bench/wrk_proxy.lua "http://127.0.0.1:$port" -- plain 16 \
        >"$TMP/wrk.txt" 2>&1
    t1=$(cpu_ticks "$QG_PID")
    stop_pid "$QG_PID"; QG_PID=""
    n=$(awk '/requests in/ {print $1}' "$TMP/wrk.txt")
    bad=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$TMP/wrk.txt")
    [ -z "$bad" ] || { say "proxy_floor: $bad answers were not 2xx"; exit 1; }
    if [ "${n:-0}" -le 0 ]; then
        say "proxy_floor: wrk made no request:"; cat "$TMP/wrk.txt"; exit 1
    fi
    awk -v n="$n" -v a="$t0" -v b="$t1" -v k="$TCK" \
        -v r="$(awk '/^Requests\/sec:/ {print $2}' "$TMP/wrk.txt")" \
        'BEGIN { printf "%.0f %.1f\n", r, (b - a) * 1e6 / k / n }' >"$TMP/one"
}

say "proxy_floor: each part off alone, wrk -t2 -c32 -d$DUR plain," \
    "$SETS sets, parts $PARTS in turn"
say "  (server CPU time per call from /proc; 0 = the product, 15 = all off)"
: > "$TMP/results"
k=1
while [ $k -le "$SETS" ]; do
    for p in $PARTS; do
        one_run "$p"
        set -- $(cat "$TMP/one")
        say "  set $k, off $p: $1 req/s, $2 us/call"
        echo "$k $p $1 $2" >> "$TMP/results"
    done
    k=$((k + 1))
done
say ""
say "median (lowest-highest) of the sets; saved: the median of each set's"
say "difference to the product's run in the same set"
for p in $PARTS; do
    awk -v p="$p" '
        $2 == 0 { base[$1] = $4 }
        $2 == p { cpu[$1] = $4; rps[$1] = $3 }
        END {
            n = 0
            for (k in cpu) { n++; c[n] = cpu[k]; r[n] = rps[k];
                             d[n] = base[k] - cpu[k] }
            printf "  off %-2s  CPU %s us/call  req/s %s  saved %s us\n", p,
                   med(c, n, "%.1f"), med(r, n, "%.0f"), med(d, n, "%.1f")
        }
        function med(a, n, f,   i, j, t, m) {
            for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
                if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
            m = n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
            return sprintf(f " (" f " to " f ")", m, a[1], a[n])
        }' "$TMP/results"
done
