# bench/lib.sh - what the HTTP benchmarks share (sourced, not run): free
# ports, stopping what they started, quotagate serve started and waited
# for, wrk runs parsed, medians and ratios.  The caller sets TMP (its
# temporary folder), RUN_ID, THREADS, CONNS, DUR and SERVICE_KEY.

say() { printf '%s\n' "$*"; }

port_free() { ! ss -Htln 2>/dev/null | awk '{print $4}' | grep -q ":$1\$"; }
# a free port, starting from $1 (default a port derived from our pid)
pick_port() {
    p=${1:-$((20000 + $$ % 20000))}
    while ! port_free $p; do p=$((p + 1)); done
    echo $p
}

# stop one process we started, by its pid: TERM, then KILL after 5 s
stop_pid() {
    [ -n "$1" ] || return 0
    kill -TERM "$1" 2>/dev/null || return 0
    i=0
    while kill -0 "$1" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i+1)); done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}

# wait_port NAME PID FILE PATTERN: the port a child prints on its stdout
wait_port() {
    i=0
    while [ $i -lt 200 ]; do
        p=$(sed -n "s|^$4 listening on http://127\\.0\\.0\\.1:\\([0-9]*\\).*|\\1|p" "$3" | head -1)
        [ -n "$p" ] && { echo "$p"; return 0; }
        kill -0 "$2" 2>/dev/null || break
        sleep 0.1; i=$((i + 1))
    done
    return 1
}

# proxy_rules OUT VERSION: the proxy benchmarks' rules: model "light" and
# a "bench" plan whose 5 h window never fills and whose concurrency allows
# every connection (the proxy holds a lease per call)
proxy_rules() {
    cat > "$1" <<YAML
version: "$2"
unit: "weight points"
weights:
  version: "w1"
  calibrated: "2026-11-29"
  models:
    light: { per_request: 1, input_per_1k: 1, output_per_1k: 1 }
plans:
  bench:
    windows:
      - { name: burst_5h, type: rolling, length: 5h, limit: 1000000000000 }
    concurrency: 100000
    overage: { policy: reject }
subjects:
  bench: { plan: bench }
YAML
}

# bench_runs NAME: RUNS from BENCH_RUNS (default 3); exits 2 with NAME's
# message when it is not a whole number >= 1
bench_runs() {
    RUNS=${BENCH_RUNS:-3}
    case $RUNS in
        ''|*[!0-9]*|0)
            echo "$1: BENCH_RUNS must be a whole number >= 1" >&2
            exit 2 ;;
    esac
}

# bench_rules OUT: the example rules with a "bench" plan and subject: huge
# limits, no concurrency window, and 1 s leases, so that a check-only run's
# unsettled reservations expire instead of filling the reservation table
# (131072 ids: above ~130k checks/s such a run would answer 503
# "overloaded").  With a concurrency window whose leases stay open the
# check path measured ~9k req/s: it pays per live lease.
bench_rules() {
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
    ' examples/rules.yaml > "$1"
}

# bench_rules_default OUT: the same with the bench plan as the default
# plan, for loads over many subjects (bench-0, bench-1, ...: wrk_check.lua
# and wrk_settle.lua with a SPREAD) that the rules do not list.
bench_rules_default() {
    bench_rules "$1.in"
    grep -v '^default_plan:' "$1.in" > "$1"
    printf 'default_plan: bench\n' >> "$1"
    rm -f "$1.in"
}

# lint_rules FILE: exits when the rules do not load
lint_rules() {
    "$QG" lint -c "$1" >/dev/null 2>"$TMP/lint.err"
    if [ $? -eq 2 ]; then say "the bench rules do not load:"; cat "$TMP/lint.err"; exit 1; fi
}

# start_qg NAME RULES [serve arguments...]: quotagate serve in $TMP/NAME
# on a free port; sets QG_PID and QG_URL (exits when it does not start).
start_qg() {
    name=$1 rules=$2
    shift 2
    mkdir -p "$TMP/$name"
    QUOTAGATE_ADMIN_KEY=$ADMIN_KEY QUOTAGATE_SERVICE_KEY=$SERVICE_KEY \
        ${PIN_SRV:-} "$QG" serve -c "$rules" --listen 127.0.0.1:0 \
        --data "$TMP/$name" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
    QG_PID=$!
    port="" i=0
    while [ $i -lt 200 ]; do
        port=$(sed -n 's|^quotagate: listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$TMP/$name.out" | head -1)
        [ -n "$port" ] && break
        kill -0 "$QG_PID" 2>/dev/null || break
        sleep 0.1; i=$((i + 1))
    done
    if [ -z "$port" ]; then
        say "quotagate serve ($name) did not start; its stderr:"
        cat "$TMP/$name.err"; exit 1
    fi
    QG_URL="http://127.0.0.1:$port"
}

# run_wrk NAME URL SCRIPT [SPREAD]: writes $TMP/NAME.txt and sets R_RPS
# R_P50 R_P99 (microseconds) R_REQS R_NON2XX R_SECS
run_wrk() {
    QUOTAGATE_SERVICE_KEY=$SERVICE_KEY ${PIN_WRK:-} wrk -t"$THREADS" -c"$CONNS" \
        -d"$DUR" --latency -s "$3" "$2" -- "$RUN_ID-$1" bench ${4:-0} \
        >"$TMP/$1.txt" 2>&1
    wrk_parse "$1"
}

wrk_parse() {
    R_RPS=$(awk '/^Requests\/sec:/ {print $2}' "$TMP/$1.txt")
    R_P50=$(awk 'function us(v) { if (v ~ /us$/) return v+0; if (v ~ /ms$/) return (v+0)*1000;
                 if (v ~ /m$/) return (v+0)*60e6; return (v+0)*1e6 }
                 $1 == "50%" {print us($2)}' "$TMP/$1.txt")
    R_P99=$(awk 'function us(v) { if (v ~ /us$/) return v+0; if (v ~ /ms$/) return (v+0)*1000;
                 if (v ~ /m$/) return (v+0)*60e6; return (v+0)*1e6 }
                 $1 == "99%" {print us($2)}' "$TMP/$1.txt")
    R_REQS=$(awk '/requests in/ {print $1}' "$TMP/$1.txt")
    R_SECS=$(awk '/requests in/ {v=$4; sub(/,$/, "", v);
                 if (v ~ /ms$/) print (v+0)/1000; else if (v ~ /m$/) print (v+0)*60; else print v+0}' "$TMP/$1.txt")
    R_NON2XX=$(awk '/Non-2xx or 3xx responses:/ {print $NF}' "$TMP/$1.txt")
    R_NON2XX=${R_NON2XX:-0}
    if [ -z "$R_RPS" ] || [ -z "$R_P50" ] || [ -z "$R_P99" ]; then
        say "could not parse wrk's output for $1:"; cat "$TMP/$1.txt"; exit 1
    fi
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
ms() { awk -v u="$1" 'BEGIN { printf "%.3f", u / 1000 }'; }
# spreadf FORMAT NUMBER...: the median, lowest and highest of the numbers
# given, printed with FORMAT (three conversions, in that order)
spreadf() {
    sf_fmt=$1
    shift
    printf '%s\n' "$@" | sort -g | awk -v f="$sf_fmt" '{ v[NR] = $1 }
        END { m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2;
              printf f, m, v[1], v[NR] }'
}
# "MEDIAN (MIN-MAX)" of whole numbers, of ratios (two decimals), and of
# signed milliseconds (three decimals)
spread() { spreadf '%.0f (%.0f-%.0f)' "$@"; }
spread2() { spreadf '%.2f (%.2f-%.2f)' "$@"; }
spread3() { spreadf '%+.3f (%+.3f to %+.3f)' "$@"; }
# at_least A B: true when the number A is >= B
at_least() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 >= b + 0) }'; }
# the median of the numbers given
median() { spreadf '%.6g\n' "$@"; }

# cpu_ticks PID...: utime+stime (clock ticks) of the processes and their
# children's threads (nginx: the master's workers)
cpu_ticks() {
    t=0
    for p in "$@" $(for q in "$@"; do pgrep -P "$q" 2>/dev/null; done); do
        v=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null) && t=$((t + ${v:-0}))
    done
    echo $t
}
# cpu_parts PID: "USER SYS LEDGER" clock ticks of PID and its children
# (nginx's workers): user time, system time, and the user + system time
# of its threads named qg-ledger* or qg-checkpoint (quotagate's ledger
# writer and checkpointer; 0 for nginx)
cpu_parts() {
    cp_u=0 cp_s=0 cp_l=0
    for cp_p in "$1" $(pgrep -P "$1" 2>/dev/null); do
        set -- $(awk '{print $14, $15}' "/proc/$cp_p/stat" 2>/dev/null) 0 0
        cp_u=$((cp_u + $1)) cp_s=$((cp_s + $2))
        for cp_t in /proc/"$cp_p"/task/*; do
            case $(cat "$cp_t/comm" 2>/dev/null) in
                qg-ledger*|qg-checkpoint)
                    cp_v=$(awk '{print $14 + $15}' "$cp_t/stat" 2>/dev/null)
                    cp_l=$((cp_l + ${cp_v:-0}));;
            esac
        done
    done
    echo "$cp_u $cp_s $cp_l"
}
# per_req "U0 S0 L0" "U1 S1 L1" N: the two cpu_parts readings' difference
# in microseconds per request: "CPU USER SYS LEDGER" ("- - - -" when N is 0)
per_req() {
    awk -v a="$1" -v b="$2" -v n="${3:-0}" -v k="$TCK" 'BEGIN {
        split(a, x, " "); split(b, y, " ");
        if (n <= 0) { print "- - - -"; exit }
        f = 1e6 / k / n;
        printf "%.1f %.1f %.1f %.1f\n", (y[1] + y[2] - x[1] - x[2]) * f,
               (y[1] - x[1]) * f, (y[2] - x[2]) * f, (y[3] - x[3]) * f }'
}
# ledger_commits URL: the ledger commits quotagate at URL has made since
# it started (quotagate_ledger_commits_total of its /metrics), or 0
ledger_commits() {
    curl -s -m 5 -H "Authorization: Bearer $ADMIN_KEY" "$1/metrics" \
        2>/dev/null | awk '$1 == "quotagate_ledger_commits_total" {
            print $2; f = 1 } END { if (!f) print 0 }'
}
# per_sec A B SECS: (B - A) / SECS, whole
per_sec() {
    awk -v a="$1" -v b="$2" -v s="$3" \
        'BEGIN { if (s > 0) printf "%.0f", (b - a) / s; else print "0" }'
}
# clock ticks per second, for cpu_ticks
TCK=$(getconf CLK_TCK 2>/dev/null || echo 100)
