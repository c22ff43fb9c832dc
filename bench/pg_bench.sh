#!/bin/sh
# pg_bench.sh - quotagate serve on a PostgreSQL ledger against the same
# server on its SQLite ledger, side by side, in this run
# (docs/benchmarks.md, "PostgreSQL ledger").
#
#   bench/pg_bench.sh           (make bench runs it)
#
# Installs nothing: needs wrk, PostgreSQL 15's binaries
# (/usr/lib/postgresql/15/bin, or $QG_PG_BIN) and build/quotagate (or
# $QG_BIN); prints why and exits 0 without them.  Starts, in a temporary
# folder on free loopback ports: a PostgreSQL server (initdb as the
# `postgres` user when run as root; fsync and synchronous_commit on, as
# a deployment has them), quotagate serve on SQLite (the peer), one on
# PostgreSQL, and two more on one PostgreSQL database (two instances of
# one gateway).  Then BENCH_RUNS rounds (default 3) of wrk check+settle
# pairs over 1000 subjects, durable settles (each answered after its
# row's commit), against each setup; prints the median and range of req/s
# and the PostgreSQL/SQLite ratios.  Environment: BENCH_DURATION (5s),
# BENCH_THREADS (2), BENCH_CONNECTIONS (32), BENCH_RUNS (3).
set -u

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
. bench/lib.sh
QG=${QG_BIN:-$ROOT/build/quotagate}
PGBIN=${QG_PG_BIN:-/usr/lib/postgresql/15/bin}
DUR=${BENCH_DURATION:-5s}
THREADS=${BENCH_THREADS:-2}
CONNS=${BENCH_CONNECTIONS:-32}
RUNS=${BENCH_RUNS:-3}
ADMIN_KEY="bench-admin-key-$$"
SERVICE_KEY="bench-service-key-$$"
RUN_ID="p$$-$(date +%s)"
SPREAD=1000

skip() { say "pg_bench: $*; skipping the PostgreSQL benchmark"; exit 0; }
command -v wrk >/dev/null 2>&1 || skip "wrk is not installed (apt-get install wrk)"
[ -x "$PGBIN/initdb" ] && [ -x "$PGBIN/pg_ctl" ] || skip "no PostgreSQL binaries in $PGBIN"
[ -x "$QG" ] || skip "$QG is not built (make build/quotagate)"

TMP=$(mktemp -d /tmp/qg-pg-bench.XXXXXX) || exit 1
chmod 755 "$TMP"
PIDS=""
AS=""
[ "$(id -u)" = 0 ] && AS="runuser -u postgres --"
cleanup() {
    for p in $PIDS; do stop_pid "$p"; done
    [ -d "$TMP/pg" ] && $AS "$PGBIN/pg_ctl" -D "$TMP/pg" -m fast stop >/dev/null 2>&1
    [ -n "${BENCH_KEEP:-}" ] && say "kept $TMP" || rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------- PostgreSQL
PGPORT=$(pick_port 27000)
mkdir -p "$TMP/pg" "$TMP/sock"
[ -n "$AS" ] && chown postgres "$TMP/pg" "$TMP/sock"
$AS "$PGBIN/initdb" -D "$TMP/pg" -U qg --auth=trust >"$TMP/initdb.log" 2>&1 ||
    { say "pg_bench: initdb failed:"; cat "$TMP/initdb.log"; exit 1; }
$AS "$PGBIN/pg_ctl" -D "$TMP/pg" -l "$TMP/sock/pg.log" -w -t 30 \
    -o "-c listen_addresses=127.0.0.1 -p $PGPORT -k $TMP/sock -c max_connections=100" \
    start >"$TMP/pgctl.log" 2>&1 ||
    { say "pg_bench: PostgreSQL did not start:"; cat "$TMP/pgctl.log" "$TMP/sock/pg.log"; exit 1; }
PSQL="$PGBIN/psql"
[ -x "$PSQL" ] || PSQL=psql
for db in one two; do
    "$PSQL" -h 127.0.0.1 -p "$PGPORT" -U qg -d postgres -qc "CREATE DATABASE $db" >/dev/null ||
        { say "pg_bench: CREATE DATABASE $db failed"; exit 1; }
done

# ---------------------------------------------------------------- gateways
bench_rules_default "$TMP/rules.yaml"
lint_rules "$TMP/rules.yaml"
start_qg sq "$TMP/rules.yaml";                                            SQ=$QG_URL; PIDS="$PIDS $QG_PID"
start_qg pa "$TMP/rules.yaml" --ledger "postgresql://qg@127.0.0.1:$PGPORT/one"; PA=$QG_URL; PIDS="$PIDS $QG_PID"
start_qg pb "$TMP/rules.yaml" --ledger "postgresql://qg@127.0.0.1:$PGPORT/two"; PB=$QG_URL; PIDS="$PIDS $QG_PID"
start_qg pc "$TMP/rules.yaml" --ledger "postgresql://qg@127.0.0.1:$PGPORT/two"; PC=$QG_URL; PIDS="$PIDS $QG_PID"

# two instances on one database at once: half the connections each
measure_pair() { # NAME
    half=$((CONNS / 2)); [ $half -lt 1 ] && half=1
    QUOTAGATE_SERVICE_KEY=$SERVICE_KEY wrk -t1 -c$half -d"$DUR" --latency -s bench/wrk_settle.lua "$PB" \
        -- "$RUN_ID-$1b" bench $SPREAD >"$TMP/$1b.txt" 2>&1 &
    wa=$!
    QUOTAGATE_SERVICE_KEY=$SERVICE_KEY wrk -t1 -c$half -d"$DUR" --latency -s bench/wrk_settle.lua "$PC" \
        -- "$RUN_ID-$1c" bench $SPREAD >"$TMP/$1c.txt" 2>&1
    wait $wa
    wrk_parse "$1b"; b_rps=$R_RPS b_bad=$R_NON2XX
    wrk_parse "$1c"
    R_RPS=$(awk -v a="$b_rps" -v b="$R_RPS" 'BEGIN { printf "%.2f", a + b }')
    R_NON2XX=$((b_bad + R_NON2XX))
}

say ""
say "PostgreSQL ledger benchmark: wrk -t$THREADS -c$CONNS -d$DUR, $RUNS rounds; $("$PGBIN/postgres" --version) on 127.0.0.1:$PGPORT"
BAD=0 S="" P="" D="" RP="" RD="" P99S="" P99P=""
r=1
while [ $r -le "$RUNS" ]; do
    run_wrk "sq-$r" "$SQ" bench/wrk_settle.lua $SPREAD; s=$R_RPS; P99S="$P99S $R_P99"; BAD=$((BAD + R_NON2XX))
    run_wrk "pa-$r" "$PA" bench/wrk_settle.lua $SPREAD; p=$R_RPS; P99P="$P99P $R_P99"; BAD=$((BAD + R_NON2XX))
    measure_pair "pair-$r"; d=$R_RPS; BAD=$((BAD + R_NON2XX))
    S="$S $s" P="$P $p" D="$D $d"
    RP="$RP $(ratio "$p" "$s")" RD="$RD $(ratio "$d" "$s")"
    r=$((r + 1))
done
rows=$("$PSQL" -h 127.0.0.1 -p "$PGPORT" -U qg -d one -Atc "SELECT count(*) FROM requests")
say "  check+settle pairs over $SPREAD subjects, durable settles (req/s: median (min-max))"
printf '    %-36s %s   p99 %s ms\n' "SQLite ledger (the peer)" "$(spread $S)" "$(ms "$(median $P99S)")"
printf '    %-36s %s   p99 %s ms   ratio %sx (%s)\n' "PostgreSQL ledger" "$(spread $P)" "$(ms "$(median $P99P)")" "$(median $RP)" "$(echo $RP | tr ' ' ',')"
printf '    %-36s %s   ratio %sx (%s)\n' "two instances on one database" "$(spread $D)" "$(median $RD)" "$(echo $RD | tr ' ' ',')"
say "  PostgreSQL rows written by the one-instance setup: $rows"
[ "$BAD" -gt 0 ] && say "  $BAD responses were not 2xx (see $TMP with BENCH_KEEP=1)"
exit 0
