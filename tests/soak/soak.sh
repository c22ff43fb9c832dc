#!/bin/sh
# soak.sh - `make soak`: quotagate serve under mixed traffic for a long
# time (default 30 minutes), its memory and file descriptors sampled every
# minute, which must stay flat.  Not part of `make test` (it is long).
#
#   tests/soak/soak.sh            (make soak runs it)
#
# What runs, all on loopback, in a temporary folder, stopped on exit:
#   - the upstream double (tests/upstream/upstream_double.c) and
#     `quotagate serve --upstream` in front of it, on rules with a "soak"
#     plan whose limits never refuse;
#   - steady traffic: wrk with tests/soak/wrk_soak.lua (check, check +
#     settle pairs, plain and streamed proxy calls, in turn, SOAK_DELAY_MS
#     between requests on each connection);
#   - careless clients: tests/soak/chaos.c (connect and leave, half heads,
#     streams closed or reset mid-way, upstream resets/hangs/500/429,
#     malformed JSON, unknown settles, answers never read);
#   - reloads: POST /v1/admin/reload every 20 s and SIGHUP every 45 s, the
#     rules file rewritten with a new version each time, so each reload
#     really swaps the rules.
# Every SOAK_SAMPLE_S seconds: the server's resident memory (VmRSS), open
# file descriptors, threads, ledger size and GET /healthz.  Verdict, over
# the samples after the warm-up (the first third of the run, at least two
# samples: the remembered request ids and SQLite's page cache fill up
# first):
#   - RSS: the last sample within 5% + 4 MiB of the first post-warm-up
#     sample, and no sample above the post-warm-up minimum by more than 10%
#     + 8 MiB;
#   - fds: no sample more than SOAK_FD_SLACK (default: the traffic's
#     connections x 2 + 64) above the idle count before traffic, and 10 s
#     after the traffic stops, back within 16 of that idle count (pooled
#     upstream connections may stay);
#   - the server answered /healthz at every sample and is still running;
#   - wrk saw only 200s and chaos saw no answer a working gateway never
#     gives.
# Prints the table and "soak: flat" (exit 0) or "soak: NOT flat: why"
# (exit 1).  Environment: SOAK_MINUTES (30), SOAK_SAMPLE_S (60),
# SOAK_CONNECTIONS (wrk, 8), SOAK_CHAOS_THREADS (8), SOAK_DELAY_MS (2),
# SOAK_WORKERS (2), QG_BIN, QG_UPSTREAM_BIN, SOAK_CHAOS_BIN.
set -u

cd "$(dirname "$0")/../.." || exit 1
ROOT=$(pwd)
QG=${QG_BIN:-$ROOT/build/quotagate}
DBL=${QG_UPSTREAM_BIN:-$ROOT/build/upstream_double}
CHAOS=${SOAK_CHAOS_BIN:-$ROOT/build/soak_chaos}
MINUTES=${SOAK_MINUTES:-30}
SAMPLE_S=${SOAK_SAMPLE_S:-60}
CONNS=${SOAK_CONNECTIONS:-8}
CHAOS_THREADS=${SOAK_CHAOS_THREADS:-8}
DELAY_MS=${SOAK_DELAY_MS:-2}
WORKERS=${SOAK_WORKERS:-2}
FD_SLACK=${SOAK_FD_SLACK:-$((CONNS * 2 + CHAOS_THREADS * 2 + 64))}
ADMIN_KEY="soak-admin-key-$$"
SERVICE_KEY="soak-service-key-$$"
DUR_S=$((MINUTES * 60))

say() { printf '%s\n' "$*"; }
die() { say "soak: $*"; exit 2; }

for t in wrk curl; do
    command -v $t >/dev/null 2>&1 || die "$t is not installed (scripts/deps.sh bench)"
done
[ -x "$QG" ] || die "$QG is not built"
[ -x "$DBL" ] || die "$DBL is not built"
[ -x "$CHAOS" ] || die "$CHAOS is not built"

TMP=$(mktemp -d /tmp/qg-soak.XXXXXX) || exit 2
DBL_PID=""; QG_PID=""; WRK_PID=""; CHAOS_PID=""; RELOAD_PID=""
stop_pid() {
    [ -n "$1" ] || return 0
    kill -TERM "$1" 2>/dev/null || return 0
    i=0
    while kill -0 "$1" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}
cleanup() {
    for p in "$RELOAD_PID" "$CHAOS_PID" "$WRK_PID" "$QG_PID" "$DBL_PID"; do
        stop_pid "$p"
    done
    if [ "${SOAK_KEEP:-0}" = 1 ]; then say "soak: kept $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_port() {
    i=0
    while [ $i -lt 300 ]; do
        p=$(sed -n "s|^$4 listening on http://127\\.0\\.0\\.1:\\([0-9]*\\).*|\\1|p" "$3" | head -1)
        [ -n "$p" ] && { echo "$p"; return 0; }
        kill -0 "$2" 2>/dev/null || break
        sleep 0.1; i=$((i + 1))
    done
    return 1
}

write_rules() {
    cat > "$TMP/rules.yaml.new" <<YAML
version: "soak-$1"
unit: "weight points"
weights:
  version: "w1"
  calibrated: "2026-11-29"
  models:
    light: { per_request: 1, input_per_1k: 1, output_per_1k: 1 }
plans:
  soak:
    windows:
      - { name: burst_5h, type: rolling, length: 5h, limit: 1000000000000 }
      - { name: weekly, type: calendar, every: week, at: "MON 00:00", tz: "UTC", limit: 1000000000000 }
      - { name: rpm, type: rate, per: 1m, limit: 100000000, unit: requests }
    concurrency: 100000
    # a third of the steady traffic checks without settling (careless
    # clients): those reservations live until their lease expires, and
    # with the default 15m at this rate they would fill the counters'
    # 524,288 request ids (the documented bound: 503 overloaded) after
    # about 20 minutes; 2m keeps the live ones near 50,000
    lease_ttl: 2m
    overage: { policy: reject }
subjects:
  soak: { plan: soak }
default_plan: soak
YAML
    mv "$TMP/rules.yaml.new" "$TMP/rules.yaml"
}

# -------------------------------------------------------------- start
"$DBL" --listen 127.0.0.1:0 >"$TMP/dbl.out" 2>"$TMP/dbl.err" &
DBL_PID=$!
DBL_PORT=$(wait_port double "$DBL_PID" "$TMP/dbl.out" upstream_double:) ||
    { cat "$TMP/dbl.err"; die "the upstream double did not start"; }

write_rules 0
"$QG" lint -c "$TMP/rules.yaml" >/dev/null 2>"$TMP/lint.err"
[ $? -eq 2 ] && { cat "$TMP/lint.err"; die "the soak rules do not load"; }
mkdir -p "$TMP/data"
QUOTAGATE_ADMIN_KEY=$ADMIN_KEY QUOTAGATE_SERVICE_KEY=$SERVICE_KEY \
    QUOTAGATE_UPSTREAM_KEY="soak-upstream-key" QUOTAGATE_UPSTREAM_TIMEOUT_MS=2000 \
    "$QG" serve -c "$TMP/rules.yaml" --listen 127.0.0.1:0 --data "$TMP/data" \
    --workers "$WORKERS" --upstream "http://127.0.0.1:$DBL_PORT" \
    >"$TMP/qg.out" 2>"$TMP/qg.err" &
QG_PID=$!
QG_PORT=$(wait_port quotagate "$QG_PID" "$TMP/qg.out" quotagate:) ||
    { cat "$TMP/qg.err"; die "quotagate serve did not start"; }
URL="http://127.0.0.1:$QG_PORT"
curl -s -m 10 -o "$TMP/key" -H "Authorization: Bearer $ADMIN_KEY" \
     -H 'Content-Type: application/json' -d '{"subject":"soak"}' "$URL/v1/admin/keys"
SUBJECT_KEY=$(sed -n 's/.*"key" *: *"\([^"]*\)".*/\1/p' "$TMP/key")
[ -n "$SUBJECT_KEY" ] || die "could not create a subject key: $(cat "$TMP/key")"

rss_kb() { awk '$1 == "VmRSS:" { print $2 }' /proc/$QG_PID/status 2>/dev/null; }
nfds() { ls /proc/$QG_PID/fd 2>/dev/null | wc -l; }
nthreads() { awk '$1 == "Threads:" { print $2 }' /proc/$QG_PID/status 2>/dev/null; }
ledger_mb() { du -sm "$TMP/data" 2>/dev/null | cut -f1; }
health() { curl -s -m 5 -o /dev/null -w '%{http_code}' "$URL/healthz"; }

sleep 1
IDLE_FDS=$(nfds)
say "soak: quotagate pid $QG_PID on $URL, ${MINUTES} min, sample every ${SAMPLE_S} s"
say "soak: idle before traffic: rss $(rss_kb) kB, fds $IDLE_FDS, threads $(nthreads)"

# ------------------------------------------------------------ traffic
QUOTAGATE_SERVICE_KEY=$SERVICE_KEY QG_SUBJECT_KEY=$SUBJECT_KEY \
    wrk -t2 -c"$CONNS" -d"${DUR_S}s" --timeout 10s -s tests/soak/wrk_soak.lua \
    "$URL" -- "soak$$" "$DELAY_MS" >"$TMP/wrk.out" 2>&1 &
WRK_PID=$!
"$CHAOS" "$QG_PORT" "$DUR_S" "$CHAOS_THREADS" "$SERVICE_KEY" "$SUBJECT_KEY" \
    >"$TMP/chaos.out" 2>"$TMP/chaos.err" &
CHAOS_PID=$!
(
    n=1; t=0
    while [ $t -lt "$DUR_S" ]; do
        sleep 5; t=$((t + 5))
        if [ $((t % 20)) -eq 0 ]; then
            write_rules $n; n=$((n + 1))
            curl -s -m 30 -o /dev/null -w '%{http_code}\n' -X POST \
                -H "Authorization: Bearer $ADMIN_KEY" "$URL/v1/admin/reload" \
                >>"$TMP/reloads"
        fi
        if [ $((t % 45)) -eq 0 ]; then
            write_rules $n; n=$((n + 1))
            kill -HUP "$QG_PID" 2>/dev/null
        fi
    done
) &
RELOAD_PID=$!

# ------------------------------------------------------------ samples
printf '%-8s %10s %6s %8s %10s %7s\n' minute rss_kb fds threads ledger_mb healthz | tee "$TMP/samples"
start=$(date +%s)
i=0
while :; do
    sleep "$SAMPLE_S"
    i=$((i + 1))
    el=$(( $(date +%s) - start ))
    kill -0 "$QG_PID" 2>/dev/null || { say "soak: NOT flat: quotagate exited"; tail -20 "$TMP/qg.err"; exit 1; }
    printf '%-8s %10s %6s %8s %10s %7s\n' "$(awk -v s=$el 'BEGIN{printf "%.1f", s/60}')" \
        "$(rss_kb)" "$(nfds)" "$(nthreads)" "$(ledger_mb)" "$(health)" | tee -a "$TMP/samples"
    [ $el -ge "$DUR_S" ] && break
done
wait "$WRK_PID"; WRK_PID=""
wait "$CHAOS_PID"; chaos_rc=$?; CHAOS_PID=""
stop_pid "$RELOAD_PID"; RELOAD_PID=""
sleep 10
AFTER_FDS=$(nfds)
say "soak: 10 s after the traffic: rss $(rss_kb) kB, fds $AFTER_FDS, threads $(nthreads)"
cat "$TMP/wrk.out" | grep -E 'requests in|Requests/sec|wrk_soak|Socket errors|Non-2xx' | sed 's/^/  /'
cat "$TMP/chaos.out" | sed 's/^/  /'
head -20 "$TMP/chaos.err" | sed 's/^/  /'
api_ok=$(grep -c '^200$' "$TMP/reloads" 2>/dev/null || true)
api_all=$(wc -l < "$TMP/reloads" 2>/dev/null || echo 0)
hups=$(grep -c 'rules reloaded' "$TMP/qg.err" 2>/dev/null || true)
say "soak: reloads: $api_ok of $api_all through the admin API answered 200; $hups reloaded on SIGHUP (log)"

# ------------------------------------------------------------ verdict
why=$(awk -v slack="$FD_SLACK" -v idle="$IDLE_FDS" -v after="$AFTER_FDS" '
    NR == 1 { next }
    { n++; rss[n] = $2; fds[n] = $3; hz[n] = $6 }
    END {
        warm = int(n / 3); if (warm < 2) warm = 2
        if (n <= warm) { print "too few samples after the warm-up (" n ")"; exit }
        min = rss[warm + 1]; first = rss[warm + 1]
        for (i = warm + 1; i <= n; i++) if (rss[i] < min) min = rss[i]
        for (i = 1; i <= n; i++) {
            if (hz[i] != "200") { print "healthz answered " hz[i] " at sample " i; exit }
            if (fds[i] > idle + slack) { print "fds " fds[i] " at sample " i " (idle " idle ", slack " slack ")"; exit }
        }
        for (i = warm + 1; i <= n; i++)
            if (rss[i] > min * 1.10 + 8192) { print "rss " rss[i] " kB at sample " i " above min " min " + 10% + 8 MiB"; exit }
        if (rss[n] > first * 1.05 + 4096) { print "rss grew from " first " to " rss[n] " kB after the warm-up"; exit }
        if (after > idle + 16) { print "fds " after " after the traffic, " idle " before"; exit }
    }' "$TMP/samples")
if [ -z "$why" ] && grep -q 'answered other than 200' "$TMP/wrk.out"; then
    bad=$(sed -n 's/.*requests, \([0-9]*\) answered other than 200.*/\1/p' "$TMP/wrk.out")
    [ "${bad:-1}" != 0 ] && why="wrk saw $bad answers other than 200"
fi
[ -z "$why" ] && [ "$chaos_rc" -ne 0 ] && why="chaos saw answers a working gateway never gives"
[ -z "$why" ] && [ "${api_ok:-0}" != "$api_all" ] && why="a reload through the admin API failed"
if [ -n "$why" ]; then
    say "soak: NOT flat: $why"
    tail -20 "$TMP/qg.err" | sed 's/^/  qg: /'
    exit 1
fi
say "soak: flat"
