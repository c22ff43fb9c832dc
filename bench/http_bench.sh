#!/bin/sh
# http_bench.sh - quotagate serve against nginx limit_req, side by side, on
# this machine, in this run (docs/benchmarks.md: ratios, not absolutes).
#
#   bench/http_bench.sh            (make bench runs it)
#
# Installs nothing: needs wrk and nginx (prints why and exits 0 without
# them) and build/quotagate (or $QG_BIN).  Steps:
#   1. quotagate serve on the example rules plus a "bench" plan whose
#      limits are huge (every check admitted) and a "bench" subject, in a
#      temporary --data directory;
#   2. nginx (daemon off, its own temp prefix and port, 2 workers) with a
#      limit_req zone keyed on $http_x_subject; the location goes through
#      limit_req, then try_files to a named location that returns the
#      JSON (a `return` in the same location would never run the limiter);
#      first checked with a 1 r/s zone to really answer 429 when exceeded,
#      then restarted with a rate that never refuses;
#   3. BENCH_RUNS rounds, each: wrk --latency, same threads/connections/
#      duration against both servers, back to back (odd rounds quotagate
#      first, even rounds nginx first): bench/wrk_settle.lua (pipelined
#      check + settle pairs; quotagate acknowledges a settle only once it
#      is durable in the ledger), then bench/wrk_check.lua (POST
#      /v1/check, unique request_id, weight 1, never settled);
#   4. per round: req/s, p50 and p99 latency of each, each server's CPU
#      per request (utime + stime from /proc over the run, nginx's workers
#      included), the quotagate/nginx ratios, quotagate's durable settles
#      and ledger commits per second; then the median and range of each
#      ratio over the rounds, and in how many rounds each target of issue
#      14 held.
# With BENCH_ASYNC=1, a second quotagate with --ledger-async (settles
# answered before their commit) takes the same check+settle load after
# the others in each round: what durable settles cost, side by side
# (docs/benchmarks.md, "What a durable settle costs"); not a target.
# Environment: BENCH_DURATION (default 10s), BENCH_RUNS (3),
# BENCH_THREADS (2),
# BENCH_CONNECTIONS (64), BENCH_SPREAD (0: every request for the subject
# "bench"; N > 0: the subjects bench-0 .. bench-(N-1) in turn, on the
# bench plan as the default plan, and nginx's zone keyed on the same
# names: the many-subject load of a real deployment, whose ledger rows
# and counters scatter), BENCH_IDS (random: the checks' request ids are
# UUID-like instead of growing counters, as clients that generate
# UUIDv4s send them; docs/benchmarks.md "Ledger"), BENCH_TASKSET=1 pins
# servers to CPU 1 and wrk to CPU 0 (needs 2 CPUs).  A round takes ~40 s
# with the defaults (3 rounds: 125 s, measured; BENCH_ASYNC=1 adds one
# load a round).
set -u

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
. bench/lib.sh
QG=${QG_BIN:-$ROOT/build/quotagate}
DUR=${BENCH_DURATION:-10s}
SPREAD=${BENCH_SPREAD:-0}
case $SPREAD in ''|*[!0-9]*) echo "http_bench: BENCH_SPREAD must be a whole number" >&2; exit 2 ;; esac
case ${BENCH_IDS:-counter} in
    counter) ;;
    random) export QG_BENCH_IDS=random ;;
    *) echo "http_bench: BENCH_IDS must be counter or random" >&2; exit 2 ;;
esac
THREADS=${BENCH_THREADS:-2}
CONNS=${BENCH_CONNECTIONS:-64}
bench_runs http_bench
ADMIN_KEY="bench-admin-key-$$"
SERVICE_KEY="bench-service-key-$$"
RUN_ID="r$$-$(date +%s)"

skip() { say "http_bench: $*; skipping the HTTP benchmark"; exit 0; }

command -v wrk >/dev/null 2>&1 || skip "wrk is not installed (apt-get install wrk)"
NGINX=$(command -v nginx 2>/dev/null || true)
[ -z "$NGINX" ] && [ -x /usr/sbin/nginx ] && NGINX=/usr/sbin/nginx
[ -n "$NGINX" ] || skip "nginx is not installed (apt-get install nginx-light)"
command -v curl >/dev/null 2>&1 || skip "curl is not installed"
[ -x "$QG" ] || skip "$QG is not built (make build/quotagate)"
"$QG" serve --help >/dev/null 2>&1 || skip "$QG has no working 'serve' command yet"

PIN_SRV=""; PIN_WRK=""
if [ "${BENCH_TASKSET:-0}" = 1 ] && command -v taskset >/dev/null 2>&1 &&
   [ "$(nproc)" -ge 2 ]; then
    PIN_SRV="taskset -c 1"; PIN_WRK="taskset -c 0"
fi

TMP=$(mktemp -d /tmp/qg-http-bench.XXXXXX) || exit 1
QG_PID=""; NGX_PID=""; QGA_PID=""
cleanup() {
    stop_pid "$NGX_PID"; NGX_PID=""
    stop_pid "$QG_PID"; QG_PID=""
    stop_pid "$QGA_PID"; QGA_PID=""
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- quotagate
if [ "$SPREAD" -gt 0 ]; then
    bench_rules_default "$TMP/rules.yaml"
else
    bench_rules "$TMP/rules.yaml"
fi
lint_rules "$TMP/rules.yaml"
start_qg qg "$TMP/rules.yaml"
code=$(curl -s -o "$TMP/probe" -w '%{http_code}' -H "Authorization: Bearer $SERVICE_KEY" \
       -H 'Content-Type: application/json' \
       -d "{\"subject\":\"bench\",\"request_id\":\"$RUN_ID-probe\",\"weight\":1}" "$QG_URL/v1/check")
if [ "$code" != 200 ]; then
    say "http_bench: a probe check on quotagate answered $code: $(cat "$TMP/probe")"; exit 1
fi
QGA_URL=""
if [ "${BENCH_ASYNC:-0}" = 1 ]; then
    qg_pid=$QG_PID qg_url=$QG_URL
    start_qg qga "$TMP/rules.yaml" --ledger-async
    QGA_PID=$QG_PID QGA_URL=$QG_URL QG_PID=$qg_pid QG_URL=$qg_url
fi

# -------------------------------------------------------------------- nginx
NGX_PORT=$(pick_port)
mkdir -p "$TMP/nginx/logs" "$TMP/nginx/html" "$TMP/nginx/tmp"
nginx_conf() { # $1 rate, $2 "burst=N nodelay" or ""
    cat > "$TMP/nginx/nginx.conf" <<EOF
worker_processes 2;
daemon off;
pid $TMP/nginx/nginx.pid;
error_log $TMP/nginx/logs/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path $TMP/nginx/tmp/body;
    proxy_temp_path $TMP/nginx/tmp/proxy;
    fastcgi_temp_path $TMP/nginx/tmp/fastcgi;
    uwsgi_temp_path $TMP/nginx/tmp/uwsgi;
    scgi_temp_path $TMP/nginx/tmp/scgi;
    keepalive_requests 100000000;
    limit_req_zone \$http_x_subject zone=subjects:16m rate=$1;
    limit_req_status 429;
    server {
        listen 127.0.0.1:$NGX_PORT reuseport;
        root $TMP/nginx/html;
        location / {
            limit_req zone=subjects $2;
            try_files /nonexistent @ok;
        }
        location @ok {
            default_type application/json;
            return 200 '{"decision":"allow"}';
        }
    }
}
EOF
}
start_nginx() {
    $PIN_SRV "$NGINX" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" \
        >"$TMP/nginx/logs/stdout" 2>&1 &
    NGX_PID=$!
    i=0
    while [ $i -lt 100 ]; do
        curl -s -o /dev/null "http://127.0.0.1:$NGX_PORT/" 2>/dev/null && return 0
        kill -0 "$NGX_PID" 2>/dev/null || break
        sleep 0.05; i=$((i + 1))
    done
    say "http_bench: nginx did not start:"; cat "$TMP/nginx/logs/stdout" "$TMP/nginx/logs/error.log" 2>/dev/null
    exit 1
}

# 1 r/s without burst: of 10 quick requests of one subject, some must be 429
nginx_conf 1r/s ""
start_nginx
codes=""
for n in 1 2 3 4 5 6 7 8 9 10; do
    codes="$codes $(curl -s -o /dev/null -w '%{http_code}' -H 'x-subject: probe' \
        -H 'Content-Type: application/json' -d '{"weight":1}' "http://127.0.0.1:$NGX_PORT/v1/check")"
done
ok=$(echo "$codes" | tr ' ' '\n' | grep -c '^200$')
refused=$(echo "$codes" | tr ' ' '\n' | grep -Ec '^(429|503)$')
if [ "$refused" -eq 0 ] || [ "$ok" -eq 0 ]; then
    say "http_bench: nginx limit_req is not enforcing (1 r/s, 10 requests gave:$codes)"
    exit 1
fi
say "nginx limit_req check: 1 r/s zone answered$codes (the limiter runs)"
stop_pid "$NGX_PID"; NGX_PID=""
nginx_conf 100000000r/s "burst=1000000 nodelay"
start_nginx

# ---------------------------------------------------------------------- wrk
# cpu_run NAME URL SCRIPT PID: run_wrk with R_CPU, the server PID's CPU
# (utime + stime of it and its children: nginx's workers) per request, and
# its parts: R_USR (user), R_SYS (system), R_LDG (quotagate's ledger
# threads, user + system)
cpu_run() {
    c0=$(cpu_parts "$4")
    run_wrk "$1" "$2" "$3" "$SPREAD"
    c1=$(cpu_parts "$4")
    set -- $(per_req "$c0" "$c1" "${R_REQS:-0}")
    R_CPU=$1 R_USR=$2 R_SYS=$3 R_LDG=$4
}
line() { printf '  %-22s %12s %12s %12s %10s %11s %8s %8s\n' "$@"; }
# rows, for quotagate then nginx, RPS P50 P99 NON2XX CPU USER SYS (the
# latencies in microseconds): their two rows and the ratios' row
rows() {
    line "quotagate" "$1" "$(ms "$2")" "$(ms "$3")" "$4" "$5" "$6" "$7"
    line "nginx limit_req" "$8" "$(ms "$9")" "$(ms "${10}")" "${11}" \
        "${12}" "${13}" "${14}"
    line "quotagate/nginx" "$(ratio "$1" "$8")x" "$(ratio "$2" "$9")x" \
        "$(ratio "$3" "${10}")x" "" "$(ratio "$5" "${12}")x" \
        "$(ratio "$6" "${13}")x" "$(ratio "$7" "${14}")x"
}

say ""
load="one subject"
[ "$SPREAD" -gt 0 ] &&
    load="subjects bench-0 .. bench-$((SPREAD - 1)) in turn"
say "HTTP benchmark: $RUNS rounds of wrk -t$THREADS -c$CONNS -d$DUR" \
    "--latency${PIN_WRK:+ (pinned: servers CPU 1, wrk CPU 0)}, $load," \
    "check request ids ${BENCH_IDS:-counter}"
say "  quotagate $QG_URL (data in $TMP/qg), nginx $(nginx -v 2>&1 | sed 's/.*\///') limit_req on 127.0.0.1:$NGX_PORT"

# One round: check+settle first (the check-only run leaves reservations
# open until their 1 s leases expire), each load on both servers back to
# back; odd rounds start with quotagate, even rounds with nginx, so that
# neither always meets the machine's state after the other.
BAD=0
ALL_CHECK="" ALL_CP99="" ALL_CCPU="" ALL_PAIRS="" ALL_PP99="" ALL_PCPU=""
ALL_SETTLES="" MET_CHECK=0 MET_PAIRS=0 MET_SETTLES=0 ALL_ASYNC="" ALL_ACPU=""
k=1
while [ "$k" -le "$RUNS" ]; do
    order="qg ngx"; [ $((k % 2)) = 0 ] && order="ngx qg"
    for who in $order; do
        if [ "$who" = qg ]; then
            m0=$(ledger_commits "$QG_URL")
            cpu_run "qg_settle_$k" "$QG_URL" bench/wrk_settle.lua "$QG_PID"
            QS_RPS=$R_RPS QS_P50=$R_P50 QS_P99=$R_P99 QS_BAD=$R_NON2XX \
                QS_REQS=$R_REQS QS_SECS=$R_SECS QS_CPU=$R_CPU QS_USR=$R_USR \
                QS_SYS=$R_SYS QS_LDG=$R_LDG
            QS_COMMITS=$(per_sec "$m0" "$(ledger_commits "$QG_URL")" \
                "$R_SECS")
        else
            cpu_run "ngx_settle_$k" "http://127.0.0.1:$NGX_PORT" \
                bench/wrk_settle.lua "$NGX_PID"
            NS_RPS=$R_RPS NS_P50=$R_P50 NS_P99=$R_P99 NS_BAD=$R_NON2XX \
                NS_CPU=$R_CPU NS_USR=$R_USR NS_SYS=$R_SYS
        fi
    done
    if [ -n "$QGA_PID" ]; then
        m0=$(ledger_commits "$QGA_URL")
        cpu_run "qga_settle_$k" "$QGA_URL" bench/wrk_settle.lua "$QGA_PID"
        QA_RPS=$R_RPS QA_P50=$R_P50 QA_P99=$R_P99 QA_BAD=$R_NON2XX \
            QA_CPU=$R_CPU QA_USR=$R_USR QA_SYS=$R_SYS QA_LDG=$R_LDG
        QA_COMMITS=$(per_sec "$m0" "$(ledger_commits "$QGA_URL")" "$R_SECS")
    fi
    for who in $order; do
        if [ "$who" = qg ]; then
            cpu_run "qg_check_$k" "$QG_URL" bench/wrk_check.lua "$QG_PID"
            QC_RPS=$R_RPS QC_P50=$R_P50 QC_P99=$R_P99 QC_BAD=$R_NON2XX \
                QC_CPU=$R_CPU QC_USR=$R_USR QC_SYS=$R_SYS QC_LDG=$R_LDG
        else
            cpu_run "ngx_check_$k" "http://127.0.0.1:$NGX_PORT" \
                bench/wrk_check.lua "$NGX_PID"
            NC_RPS=$R_RPS NC_P50=$R_P50 NC_P99=$R_P99 NC_BAD=$R_NON2XX \
                NC_CPU=$R_CPU NC_USR=$R_USR NC_SYS=$R_SYS
        fi
    done

    say ""
    first="quotagate first, then nginx"
    [ "$order" = "qg ngx" ] || first="nginx first, then quotagate"
    say "  round $k of $RUNS ($first)"
    line "" "req/s" "p50 ms" "p99 ms" "non-2xx" "CPU us/req" "user" "kernel"
    say "  check (POST /v1/check, one request in flight per connection)"
    rows "$QC_RPS" "$QC_P50" "$QC_P99" "$QC_BAD" "$QC_CPU" "$QC_USR" \
        "$QC_SYS" "$NC_RPS" "$NC_P50" "$NC_P99" "$NC_BAD" "$NC_CPU" \
        "$NC_USR" "$NC_SYS"
    say "  check+settle (pipelined pairs; latency is per pair)"
    rows "$QS_RPS" "$QS_P50" "$QS_P99" "$QS_BAD" "$QS_CPU" "$QS_USR" \
        "$QS_SYS" "$NS_RPS" "$NS_P50" "$NS_P99" "$NS_BAD" "$NS_CPU" \
        "$NS_USR" "$NS_SYS"
    SETTLES=$(awk -v n="$QS_REQS" -v bad="$QS_BAD" -v s="$QS_SECS" '
        BEGIN { if (s > 0) printf "%.0f", (n - bad) / 2 / s; else print "0" }')
    say "  quotagate durable settles per second: $SETTLES" \
        "(each acknowledged after its ledger commit)"
    say "  of quotagate's CPU us/req, its ledger threads' (writer," \
        "checkpointer): check $QC_LDG, check+settle $QS_LDG"
    say "  quotagate ledger commits per second during check+settle:" \
        "$QS_COMMITS"
    if [ -n "$QGA_PID" ]; then
        say "  check+settle on a quotagate with --ledger-async (settles" \
            "answered before their commit; not a target):"
        line "quotagate async" "$QA_RPS" "$(ms "$QA_P50")" "$(ms "$QA_P99")" \
            "$QA_BAD" "$QA_CPU" "$QA_USR" "$QA_SYS"
        line "async/durable" "$(ratio "$QA_RPS" "$QS_RPS")x" \
            "$(ratio "$QA_P50" "$QS_P50")x" "$(ratio "$QA_P99" "$QS_P99")x" \
            "" "$(ratio "$QA_CPU" "$QS_CPU")x" \
            "$(ratio "$QA_USR" "$QS_USR")x" "$(ratio "$QA_SYS" "$QS_SYS")x"
        say "  its ledger threads: $QA_LDG us/req, $QA_COMMITS commits/s"
        ALL_ASYNC="$ALL_ASYNC $(ratio "$QA_RPS" "$QS_RPS")"
        ALL_ACPU="$ALL_ACPU $(ratio "$QA_CPU" "$QS_CPU")"
    fi
    if [ "$QC_BAD" != 0 ] || [ "$QS_BAD" != 0 ]; then
        BAD=1
        say "  note: quotagate answered non-2xx responses" \
            "(see the counts above)"
    fi

    c=$(ratio "$QC_RPS" "$NC_RPS") cp=$(ratio "$QC_P99" "$NC_P99")
    pr=$(ratio "$QS_RPS" "$NS_RPS") pp=$(ratio "$QS_P99" "$NS_P99")
    ALL_CHECK="$ALL_CHECK $c" ALL_CP99="$ALL_CP99 $cp"
    ALL_CCPU="$ALL_CCPU $(ratio "$QC_CPU" "$NC_CPU")"
    ALL_PAIRS="$ALL_PAIRS $pr" ALL_PP99="$ALL_PP99 $pp"
    ALL_PCPU="$ALL_PCPU $(ratio "$QS_CPU" "$NS_CPU")"
    ALL_SETTLES="$ALL_SETTLES $SETTLES"
    at_least "$c" 1 && at_least 1 "$cp" && MET_CHECK=$((MET_CHECK + 1))
    at_least "$pr" 1 && MET_PAIRS=$((MET_PAIRS + 1))
    at_least "$SETTLES" 30000 && MET_SETTLES=$((MET_SETTLES + 1))
    k=$((k + 1))
done

say ""
say "summary of $RUNS rounds: median (lowest-highest), quotagate/nginx"
sline() { printf '  %-30s %-22s %s\n' "$@"; }
sline "check req/s" "$(spread2 $ALL_CHECK)" \
    "target >= 1.0x with p99 <= 1.0x: $MET_CHECK of $RUNS rounds"
sline "check p99" "$(spread2 $ALL_CP99)" ""
sline "check CPU us/req" "$(spread2 $ALL_CCPU)" ""
sline "check+settle req/s" "$(spread2 $ALL_PAIRS)" \
    "target >= 1.0x: $MET_PAIRS of $RUNS rounds"
sline "check+settle p99" "$(spread2 $ALL_PP99)" ""
sline "check+settle CPU us/req" "$(spread2 $ALL_PCPU)" ""
sline "durable settles/s" "$(spread $ALL_SETTLES)" \
    "target >= 30000/s: $MET_SETTLES of $RUNS rounds"
if [ -n "$QGA_PID" ]; then
    sline "check+settle, async/durable" "$(spread2 $ALL_ASYNC)" \
        "req/s of --ledger-async over durable (not a target)"
    sline "  CPU us/req, async/durable" "$(spread2 $ALL_ACPU)" ""
fi
if [ "$BAD" != 0 ]; then
    say "note: quotagate answered non-2xx responses (see the rounds" \
        "above); first lines of its stderr:"
    head -5 "$TMP/qg.err"
fi
if [ -n "$QGA_PID" ] && ! kill -0 "$QGA_PID" 2>/dev/null; then
    say "http_bench: quotagate serve --ledger-async died during the" \
        "benchmark; its stderr:"; cat "$TMP/qga.err"; exit 1
fi
if ! kill -0 "$QG_PID" 2>/dev/null; then
    say "http_bench: quotagate serve died during the benchmark; its stderr:"; cat "$TMP/qg.err"; exit 1
fi
exit 0
