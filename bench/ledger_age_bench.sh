#!/bin/sh
# ledger_age_bench.sh - what the SQLite ledger's age costs the decision
# path: the same loads over 1,000 subjects on a new ledger and on one
# aged as a deployment's is after some days (docs/benchmarks.md, "An aged
# ledger").
#
#   bench/ledger_age_bench.sh         (about 3 minutes; part of make bench)
#
# Each round starts, per build and per age, a quotagate serve (memory
# store, SQLite ledger, a fresh data folder) and sends it wrk -t2 -c64
# for BENCH_DURATION (default 10s) of checks (bench/wrk_check.lua), then
# as long of check+settle pairs (bench/wrk_settle.lua), over the
# subjects bench-0 .. bench-999 (the bench plan, the rules' default).
# "aged": before the load, the ledger is given BENCH_AGE_SLOTS (300)
# quarter hours of the history's rollup per subject, stored as the
# writer stores them, and BENCH_AGE_ROWS (500) entries per subject in
# subject_rows, as a ledger holds after ~3 days of such traffic.
# Printed per run: req/s, the server's CPU per response and the ledger
# writer thread's share of it (from /proc), the bytes the server wrote
# to its disk per response (/proc/PID/io) and wrk's p99; then the median
# and range over BENCH_RUNS (3) rounds.
#
# QG_BIN (build/quotagate) is the build measured; with QG_BIN_BASE too,
# both are measured in each round, alternated (the base first in odd
# rounds), and the ratios printed.  Needs wrk and sqlite3 (prints why and
# exits 0 without them).
set -u

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
. bench/lib.sh
bench_runs ledger_age_bench
QGBIN=${QG_BIN:-$ROOT/build/quotagate}
BASE=${QG_BIN_BASE:-}
DUR=${BENCH_DURATION:-10s}
SLOTS=${BENCH_AGE_SLOTS:-300}
ROWSPER=${BENCH_AGE_ROWS:-500}
THREADS=2
CONNS=64
ADMIN_KEY="bench-admin-key-$$"
SERVICE_KEY="bench-service-key-$$"
RUN_ID="a$$-$(date +%s)"
for v in "$SLOTS" "$ROWSPER"; do
    case $v in ''|*[!0-9]*)
        echo "ledger_age_bench: BENCH_AGE_SLOTS and BENCH_AGE_ROWS must be" \
             "whole numbers" >&2
        exit 2 ;;
    esac
done
for t in wrk sqlite3; do
    if ! command -v $t >/dev/null 2>&1; then
        say "ledger_age_bench: $t not found (apt-get install $t); skipped"
        exit 0
    fi
done
for b in "$QGBIN" $BASE; do
    [ -x "$b" ] || { say "ledger_age_bench: $b not built (make)"; exit 1; }
done

TMP=$(mktemp -d /tmp/qg-age-bench.XXXXXX) || exit 1
QG_PID=
cleanup() { stop_pid "$QG_PID"; rm -rf "$TMP"; }
trap cleanup EXIT
trap 'exit 130' INT TERM
bench_rules_default "$TMP/rules.yaml"

# age DATA: the rollup's slots and subject_rows' entries of 1,000
# subjects, before the server opens the ledger (created by a first start)
age() {
    now=$(($(date +%s) * 1000))
    sqlite3 "$1/ledger.db" <<SQL >/dev/null || exit 1
BEGIN;
WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < 999),
 t(j) AS (SELECT 1 UNION ALL SELECT j + 1 FROM t WHERE j < $SLOTS)
INSERT INTO usage_slots SELECT 'bench-' || i, ($now / 900000 - j) * 900000,
  '', 1000, 1, 1, 0 FROM s, t;
WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < 999),
 t(j) AS (SELECT 1 UNION ALL SELECT j + 1 FROM t WHERE j < $ROWSPER)
INSERT INTO subject_rows SELECT 'bench-' || i, $now - 86400000 + j,
  -(i * 100000 + j) FROM s, t;
COMMIT;
PRAGMA wal_checkpoint(TRUNCATE);
SQL
}

# CPU ticks of the process ($1) or of its thread named $2
ticks() {
    if [ -n "${2:-}" ]; then
        for f in /proc/"$1"/task/*/comm; do
            [ "$(cat "$f" 2>/dev/null)" = "$2" ] || continue
            awk '{print $14 + $15}' "${f%comm}stat"
            return
        done
        echo 0
    else
        awk '{print $14 + $15}' /proc/"$1"/stat
    fi
}
wbytes() { awk '/^write_bytes/ {print $2}' /proc/"$1"/io; }

# one BUILD AGE LOAD: sets L_RPS L_CPU L_WR L_BYTES L_P99 (ms)
one() {
    build=$1 aged=$2 lua=$3
    rm -rf "$TMP/d"
    QG=$build
    start_qg d "$TMP/rules.yaml"
    stop_pid "$QG_PID"
    if [ "$aged" = aged ]; then age "$TMP/d"; fi
    start_qg d "$TMP/rules.yaml"
    hz=$(getconf CLK_TCK)
    p0=$(ticks "$QG_PID"); w0=$(ticks "$QG_PID" qg-ledger)
    b0=$(wbytes "$QG_PID")
    run_wrk "$aged" "$QG_URL" "$lua" 1000
    p1=$(ticks "$QG_PID"); w1=$(ticks "$QG_PID" qg-ledger)
    b1=$(wbytes "$QG_PID")
    stop_pid "$QG_PID"; QG_PID=
    set -- $(awk -v n="$R_REQS" -v p=$((p1 - p0)) -v w=$((w1 - w0)) \
                 -v b=$((b1 - b0)) -v hz="$hz" 'BEGIN {
        if (n < 1) n = 1
        printf "%.1f %.1f %.0f", p * 1e6 / hz / n, w * 1e6 / hz / n, b / n }')
    L_RPS=$R_RPS L_CPU=$1 L_WR=$2 L_BYTES=$3 L_P99=$(ms "$R_P99")
}

line() { printf '  %-42s %9s %9s %9s %10s %9s\n' "$@"; }
say "Ledger age: wrk -t$THREADS -c$CONNS -d$DUR over 1,000 subjects;" \
    "aged = $SLOTS quarter hours of rollup and $ROWSPER subject_rows" \
    "entries per subject"
line "" "req/s" "CPU us" "writer us" "bytes/resp" "p99 ms"
builds="new"
[ -n "$BASE" ] && builds="base new"
for k in $(seq 1 "$RUNS"); do
    order=$builds
    [ -n "$BASE" ] && [ $((k % 2)) -eq 0 ] && order="new base"
    for b in $order; do
        bin=$QGBIN
        [ "$b" = base ] && bin=$BASE
        for a in new aged; do
            for load in checks pairs; do
                lua=bench/wrk_check.lua
                [ $load = pairs ] && lua=bench/wrk_settle.lua
                one "$bin" "$a" "$lua"
                line "round $k, $b build, $a ledger, $load" "$L_RPS" \
                    "$L_CPU" "$L_WR" "$L_BYTES" "$L_P99"
                key="${b}_${a}_${load}"
                eval "RPS_$key=\"\${RPS_$key:-} $L_RPS\""
                eval "CPU_$key=\"\${CPU_$key:-} $L_CPU\""
                eval "WR_$key=\"\${WR_$key:-} $L_WR\""
                eval "BY_$key=\"\${BY_$key:-} $L_BYTES\""
                eval "P99_$key=\"\${P99_$key:-} $L_P99\""
            done
        done
    done
done

say "summary of $RUNS rounds: median (lowest-highest)"
for b in $builds; do
    for a in new aged; do
        for load in checks pairs; do
            key="${b}_${a}_${load}"
            eval "r=\$RPS_$key c=\$CPU_$key w=\$WR_$key"
            eval "y=\$BY_$key p=\$P99_$key"
            say "  $b build, $a ledger, $load: req/s $(spread $r);" \
                "CPU us/resp $(spreadf '%.1f (%.1f-%.1f)' $c);" \
                "writer $(spreadf '%.1f (%.1f-%.1f)' $w);" \
                "bytes/resp $(spread $y);" \
                "p99 ms $(spreadf '%.1f (%.1f-%.1f)' $p)"
        done
    done
done
# medians' ratios: the aged ledger against the new one, per build, and
# with a base build, this build against it (CPU per response)
for b in $builds; do
    for load in checks pairs; do
        eval "n=\$CPU_${b}_new_${load} a=\$CPU_${b}_aged_${load}"
        say "  $b build, $load: CPU per response, aged / new ledger:" \
            "$(ratio "$(median $a)" "$(median $n)")"
    done
done
if [ -n "$BASE" ]; then
    for a in new aged; do
        for load in checks pairs; do
            eval "n=\$CPU_new_${a}_${load} o=\$CPU_base_${a}_${load}"
            eval "nr=\$RPS_new_${a}_${load} or=\$RPS_base_${a}_${load}"
            say "  $a ledger, $load: this build / base: CPU per response" \
                "$(ratio "$(median $n)" "$(median $o)"), req/s" \
                "$(ratio "$(median $nr)" "$(median $or)")"
        done
    done
fi
