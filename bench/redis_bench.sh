#!/bin/sh
# redis_bench.sh - quotagate serve on Redis against the same server on its
# memory store, side by side, in this run (docs/benchmarks.md, "Redis").
#
#   bench/redis_bench.sh           (make bench runs it)
#
# Installs nothing: needs wrk, redis-server and redis-cli (prints why and
# exits 0 without them) and build/quotagate (or $QG_BIN).  Starts, each
# in its own temporary folder on free loopback ports:
#   - redis-server (no persistence), and a Redis Cluster of three masters
#     (redis-cli --cluster create);
#   - quotagate serve --store memory (the peer), two on redis:// (two
#     gateways on one Redis), one on redis-cluster://; the example rules
#     with a "bench" default plan (huge limits, 1 s leases, no
#     concurrency window) and store: {timeout: 1s, down: closed}, so that a
#     store failure is a 503 counted below, never a quiet local decision.
# Then BENCH_RUNS rounds (default 3), each: wrk check+settle pairs over
# 1000 subjects, then checks of one hot subject, against the memory
# store, one gateway on Redis, both gateways on Redis at once (half the
# connections each, rates summed) and the Cluster.  Prints the median and
# range of req/s per setup, the Redis/memory ratios, and what Redis spent
# per decision: the script call's own time (FCALL, or EVALSHA without
# Functions) and the server's CPU (INFO), and the
# commands per decision (INFO commandstats, the script's own calls
# included).  Environment: BENCH_DURATION (5s), BENCH_THREADS (2),
# BENCH_CONNECTIONS (32), BENCH_RUNS (3).
set -u

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
. bench/lib.sh
QG=${QG_BIN:-$ROOT/build/quotagate}
DUR=${BENCH_DURATION:-5s}
THREADS=${BENCH_THREADS:-2}
CONNS=${BENCH_CONNECTIONS:-32}
RUNS=${BENCH_RUNS:-3}
ADMIN_KEY="bench-admin-key-$$"
SERVICE_KEY="bench-service-key-$$"
RUN_ID="r$$-$(date +%s)"
SPREAD=1000

skip() { say "redis_bench: $*; skipping the Redis benchmark"; exit 0; }
command -v wrk >/dev/null 2>&1 || skip "wrk is not installed (apt-get install wrk)"
command -v redis-server >/dev/null 2>&1 || skip "redis-server is not installed"
command -v redis-cli >/dev/null 2>&1 || skip "redis-cli is not installed"
[ -x "$QG" ] || skip "$QG is not built (make build/quotagate)"

TMP=$(mktemp -d /tmp/qg-redis-bench.XXXXXX) || exit 1
PIDS=""
cleanup() {
    for p in $PIDS; do stop_pid "$p"; done
    for p in $RPORTS; do redis-cli -p "$p" shutdown nosave >/dev/null 2>&1; done
    [ -n "${BENCH_KEEP:-}" ] && say "kept $TMP" || rm -rf "$TMP"
}
RPORTS=""
trap cleanup EXIT
trap 'exit 130' INT TERM

# ------------------------------------------------------------------ Redis
start_redis() { # $1 port, $2.. extra arguments
    p=$1; shift
    mkdir -p "$TMP/redis-$p"
    (cd "$TMP/redis-$p" && redis-server --port "$p" --bind 127.0.0.1 --save '' \
        --appendonly no --daemonize yes --logfile "$TMP/redis-$p/log" "$@") ||
        { say "redis_bench: redis-server on $p did not start"; exit 1; }
    RPORTS="$RPORTS $p"
    i=0
    until redis-cli -p "$p" ping >/dev/null 2>&1; do
        i=$((i + 1)); [ $i -gt 400 ] && { say "redis_bench: redis on $p does not answer"; exit 1; }
        sleep 0.05
    done
}
RP=$(pick_port 26000); start_redis "$RP"
C1=$(pick_port $((RP + 1))); C2=$(pick_port $((C1 + 1))); C3=$(pick_port $((C2 + 1)))
for p in $C1 $C2 $C3; do
    start_redis "$p" --cluster-enabled yes --cluster-config-file nodes.conf
done
echo yes | redis-cli --cluster create 127.0.0.1:$C1 127.0.0.1:$C2 127.0.0.1:$C3 \
    --cluster-replicas 0 >"$TMP/cluster.txt" 2>&1 ||
    { say "redis_bench: the Cluster was not created:"; cat "$TMP/cluster.txt"; exit 1; }
i=0
until redis-cli -p $C1 cluster info 2>/dev/null | grep -q 'cluster_state:ok'; do
    i=$((i + 1)); [ $i -gt 200 ] && { say "redis_bench: the Cluster is not ok"; exit 1; }
    sleep 0.05
done

MEM0=$(redis-cli -p "$RP" info memory | tr -d '\r' | awk -F: '/^used_memory:/ { print $2 }')

# ---------------------------------------------------------------- gateways
bench_rules_default "$TMP/rules.yaml"
printf 'store: { timeout: 1s, down: closed }\n' >> "$TMP/rules.yaml"
lint_rules "$TMP/rules.yaml"

start_qg mem "$TMP/rules.yaml";                                        MEM=$QG_URL; MEMPID=$QG_PID
start_qg ra "$TMP/rules.yaml" --store "redis://127.0.0.1:$RP";         RA=$QG_URL; RAPID=$QG_PID
start_qg rb "$TMP/rules.yaml" --store "redis://127.0.0.1:$RP";         RB=$QG_URL; RBPID=$QG_PID
start_qg rc "$TMP/rules.yaml" --store "redis-cluster://127.0.0.1:$C1"; RC=$QG_URL; RCPID=$QG_PID
PIDS="$MEMPID $RAPID $RBPID $RCPID"

# ------------------------------------------------------------ Redis's side
cpu_of() { # total CPU seconds of the Redis servers on the ports given
    for rp_ in "$@"; do redis-cli -p "$rp_" info cpu; done | tr -d '\r' |
        awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { printf "%.6f", s }'
}
calls_of() { # commands executed (all kinds), script calls (FCALL or EVALSHA), their usec
    for rp_ in "$@"; do redis-cli -p "$rp_" info commandstats; done | tr -d '\r' |
        awk -F'[:=,]' '/^cmdstat_/ { n += $3; if ($1 == "cmdstat_evalsha" || $1 == "cmdstat_fcall") { e += $3; u += $5 } }
                       END { printf "%d %d %d", n, e, u }'
}
trips_of() { # round trips and decisions+settles answered so far by gateway URL $1
    curl -s -H "Authorization: Bearer $ADMIN_KEY" "$1/metrics" | awk '
        /^quotagate_store_round_trips_total / { t = $2 }
        /^quotagate_decisions_total\{/ { d += $2 }
        /^quotagate_settles_total\{/ { d += $2 }
        END { printf "%d %d", t, d }'
}
reset_stats() { for rp_ in "$@"; do redis-cli -p "$rp_" config resetstat >/dev/null; done; }

# per_ok TICKS0 TICKS1 N: microseconds of CPU per response from clock ticks
per_ok() { awk -v t=$(($2 - $1)) -v n="$3" -v k="$TCK" 'BEGIN { if (n > 0) printf "%.1f", t * 1e6 / k / n; else print 0 }'; }

# measure NAME URL PID SCRIPT SPREAD PORTS...: one wrk run with Redis's
# figures (sets R_* and X_CPU_US, X_CMDS, X_EVAL_US per successful
# request, and X_QG_US: the gateway PID's CPU per successful request)
measure() {
    name=$1 url=$2 qpid=$3 script=$4 spr=$5; shift 5
    [ $# -gt 0 ] && reset_stats "$@"
    c0=$( [ $# -gt 0 ] && cpu_of "$@" || echo 0)
    t0=$(trips_of "$url")
    q0=$(cpu_ticks "$qpid")
    run_wrk "$name" "$url" "$script" "$spr"
    q1=$(cpu_ticks "$qpid")
    X_QG_US=$(per_ok "$q0" "$q1" $((R_REQS - R_NON2XX)))
    X_CPU_US=0 X_CMDS=0 X_EVAL_US=0 X_TRIPS=0
    if [ $# -gt 0 ]; then
        t1=$(trips_of "$url")
        X_TRIPS=$(echo "$t0 $t1" | awk '{ if ($4 > $2) printf "%.3f", ($3 - $1) / ($4 - $2); else print 0 }')
        c1=$(cpu_of "$@")
        set -- $(calls_of "$@")
        ok=$(awk -v n="$R_REQS" -v b="$R_NON2XX" 'BEGIN { print n - b }')
        X_CPU_US=$(awk -v a="$c0" -v b="$c1" -v n="$ok" 'BEGIN { if (n > 0) printf "%.1f", (b - a) * 1e6 / n; else print 0 }')
        X_CMDS=$(awk -v c="$1" -v n="$ok" 'BEGIN { if (n > 0) printf "%.2f", c / n; else print 0 }')
        X_EVAL_US=$(awk -v e="$2" -v u="$3" 'BEGIN { if (e > 0) printf "%.1f", u / e; else print 0 }')
    fi
}

# the two gateways on one Redis at once: half the connections each
measure_pair() { # NAME SCRIPT SPREAD
    half=$((CONNS / 2)); [ $half -lt 1 ] && half=1
    reset_stats "$RP"
    c0=$(cpu_of "$RP")
    q0=$(cpu_ticks "$RAPID" "$RBPID")
    QUOTAGATE_SERVICE_KEY=$SERVICE_KEY wrk -t1 -c$half -d"$DUR" --latency -s "$2" "$RA" \
        -- "$RUN_ID-$1a" bench "$3" >"$TMP/$1a.txt" 2>&1 &
    wa=$!
    QUOTAGATE_SERVICE_KEY=$SERVICE_KEY wrk -t1 -c$half -d"$DUR" --latency -s "$2" "$RB" \
        -- "$RUN_ID-$1b" bench "$3" >"$TMP/$1b.txt" 2>&1
    wait $wa
    wrk_parse "$1a"; a_rps=$R_RPS a_reqs=$R_REQS a_bad=$R_NON2XX
    wrk_parse "$1b"
    R_RPS=$(awk -v a="$a_rps" -v b="$R_RPS" 'BEGIN { printf "%.2f", a + b }')
    R_NON2XX=$((a_bad + R_NON2XX))
    ok=$((a_reqs + R_REQS - R_NON2XX))
    q1=$(cpu_ticks "$RAPID" "$RBPID")
    X_QG_US=$(per_ok "$q0" "$q1" "$ok")
    c1=$(cpu_of "$RP")
    set -- $(calls_of "$RP")
    X_CPU_US=$(awk -v a="$c0" -v b="$c1" -v n="$ok" 'BEGIN { if (n > 0) printf "%.1f", (b - a) * 1e6 / n; else print 0 }')
    X_CMDS=$(awk -v c="$1" -v n="$ok" 'BEGIN { if (n > 0) printf "%.2f", c / n; else print 0 }')
    X_EVAL_US=$(awk -v e="$2" -v u="$3" 'BEGIN { if (e > 0) printf "%.1f", u / e; else print 0 }')
}

say ""
say "Redis benchmark: wrk -t$THREADS -c$CONNS -d$DUR, $RUNS rounds; redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') on 127.0.0.1:$RP, a Cluster on $C1 $C2 $C3"

BAD=0
for W in settle check; do
    if [ $W = settle ]; then SCRIPT=bench/wrk_settle.lua SPR=$SPREAD
    else SCRIPT=bench/wrk_check.lua SPR=0; fi
    M="" A="" P="" C="" RA_="" RP_="" RC_=""
    CPU_A="" CPU_P="" CPU_C="" CMD_A="" EV_A="" EV_C="" TR_A="" TR_C=""
    QG_M="" QG_A="" QG_P="" QG_C=""
    r=1
    while [ $r -le "$RUNS" ]; do
        measure "mem-$W-$r" "$MEM" "$MEMPID" $SCRIPT $SPR;           m=$R_RPS; BAD=$((BAD + R_NON2XX))
        QG_M="$QG_M $X_QG_US"
        measure "ra-$W-$r" "$RA" "$RAPID" $SCRIPT $SPR "$RP";        a=$R_RPS; BAD=$((BAD + R_NON2XX))
        CPU_A="$CPU_A $X_CPU_US" CMD_A="$CMD_A $X_CMDS" EV_A="$EV_A $X_EVAL_US" TR_A="$TR_A $X_TRIPS"
        QG_A="$QG_A $X_QG_US"
        measure_pair "pair-$W-$r" $SCRIPT $SPR;                      pr=$R_RPS; BAD=$((BAD + R_NON2XX))
        CPU_P="$CPU_P $X_CPU_US" QG_P="$QG_P $X_QG_US"
        measure "rc-$W-$r" "$RC" "$RCPID" $SCRIPT $SPR $C1 $C2 $C3;  c=$R_RPS; BAD=$((BAD + R_NON2XX))
        CPU_C="$CPU_C $X_CPU_US" EV_C="$EV_C $X_EVAL_US" TR_C="$TR_C $X_TRIPS" QG_C="$QG_C $X_QG_US"
        M="$M $m" A="$A $a" P="$P $pr" C="$C $c"
        RA_="$RA_ $(ratio "$a" "$m")" RP_="$RP_ $(ratio "$pr" "$m")" RC_="$RC_ $(ratio "$c" "$m")"
        r=$((r + 1))
    done
    if [ $W = settle ]; then say "  check+settle pairs over $SPREAD subjects (req/s: median (min-max))"
    else say "  checks of one hot subject (req/s: median (min-max))"; fi
    printf '    %-34s %s\n' "memory store" "$(spread $M)"
    printf '    %-34s %s   ratio %sx (%s)\n' "one gateway on Redis" "$(spread $A)" "$(median $RA_)" "$(echo $RA_ | tr ' ' ',')"
    printf '    %-34s %s   ratio %sx (%s)\n' "two gateways on one Redis" "$(spread $P)" "$(median $RP_)" "$(echo $RP_ | tr ' ' ',')"
    printf '    %-34s %s   ratio %sx (%s)\n' "one gateway on a 3-master Cluster" "$(spread $C)" "$(median $RC_)" "$(echo $RC_ | tr ' ' ',')"
    printf '    Redis per decision: script call (FCALL or EVALSHA) %s us (Cluster %s), server CPU %s us (two gateways %s, Cluster %s), %s commands\n' \
        "$(median $EV_A)" "$(median $EV_C)" "$(median $CPU_A)" "$(median $CPU_P)" "$(median $CPU_C)" "$(median $CMD_A)"
    printf '    gateway CPU per response: memory store %s us, one gateway on Redis %s, two gateways %s, Cluster %s\n' \
        "$(median $QG_M)" "$(median $QG_A)" "$(median $QG_P)" "$(median $QG_C)"
    printf '    round trips per response (the gateway'"'"'s counters): one Redis %s (%s), Cluster %s (%s)\n' \
        "$(median $TR_A)" "$(echo $TR_A | tr ' ' ',')" "$(median $TR_C)" "$(echo $TR_C | tr ' ' ',')"
done
say "  (a response is one decision or one settle; the commands include the script's own calls)"

# the physical limit: a trivial script on the same Redis, from redis-benchmark
if command -v redis-benchmark >/dev/null 2>&1; then
    SHA=$(redis-cli -p "$RP" script load 'return 1')
    EV="" EVP=""
    r=1
    while [ $r -le "$RUNS" ]; do
        e=$(redis-benchmark -p "$RP" -c "$CONNS" -n 200000 -q evalsha "$SHA" 0 2>/dev/null |
            tr '\r' '\n' | awk '/requests per second/ { for (i = 2; i <= NF; i++) if ($i == "requests") v = $(i - 1) }
                   END { print v + 0 }')
        ep=$(redis-benchmark -p "$RP" -c "$CONNS" -P 16 -n 1000000 -q evalsha "$SHA" 0 2>/dev/null |
            tr '\r' '\n' | awk '/requests per second/ { for (i = 2; i <= NF; i++) if ($i == "requests") v = $(i - 1) }
                   END { print v + 0 }')
        EV="$EV $e" EVP="$EVP $ep"
        r=$((r + 1))
    done
    say "  physical limit, redis-benchmark EVALSHA of 'return 1' on the same Redis, -c $CONNS (calls/s: median (min-max))"
    printf '    %-34s %s\n' "one call per round trip" "$(spread $EV)" "pipelined 16 deep" "$(spread $EVP)"
else
    say "  (redis-benchmark is not installed: no physical limit measured)"
fi

# Redis memory per active subject: what the server holds now over what it
# held before any gateway ran, per entity state (members; the request-id
# records of the last minutes included), and one entity's own two keys
ENT=$(redis-cli -p "$RP" --scan --pattern 'qg:*:e:*' | wc -l)
MEM1=$(redis-cli -p "$RP" info memory | tr -d '\r' | awk -F: '/^used_memory:/ { print $2 }')
IDS=$(redis-cli -p "$RP" dbsize)
# one entity's two keys, over up to 50 entities: the median (the hot
# subject's long rolling log would make any single pick unrepresentative)
ONEB=0 ONEMAX=0 SIZES=""
for ONE in $(redis-cli -p "$RP" --scan --pattern 'qg:*:e:*' | head -50); do
    ZK=$(printf '%s' "$ONE" | sed 's/:e:/:l:/')
    b=$(( $(redis-cli -p "$RP" memory usage "$ONE") + $(redis-cli -p "$RP" memory usage "$ZK" 2>/dev/null | grep -E '^[0-9]+$' || echo 0) ))
    SIZES="$SIZES $b"
done
if [ -n "$SIZES" ]; then
    ONEB=$(median $SIZES)
    ONEMAX=$(printf '%s\n' $SIZES | sort -n | tail -1)
fi
say "  Redis memory: $ENT entities, $IDS keys in all; $(awk -v a="$MEM0" -v b="$MEM1" -v n="$ENT" 'BEGIN { if (n > 0) printf "%.0f", (b - a) / n; else print "n/a" }') bytes per entity with everything else held (request-id records), one entity's own keys $ONEB bytes, median of $(echo $SIZES | wc -w) (largest $ONEMAX; MEMORY USAGE)"
if [ "$BAD" != 0 ]; then
    say "note: $BAD non-2xx responses in all (a store failure is a 503 here); first lines of the gateways' stderr:"
    for n in ra rb rc; do head -3 "$TMP/$n.err"; done
fi
exit 0
