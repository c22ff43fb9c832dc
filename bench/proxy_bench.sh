#!/bin/sh
# proxy_bench.sh - the metering proxy's cost: the same wrk load sent
#   (a) straight to the upstream double (tests/upstream/upstream_double.c),
#   (b) through `quotagate serve --upstream http://127.0.0.1:DOUBLE`, with
#       a subject key on a plan that never refuses (docs/proxy.md),
#   (c) through nginx proxy_pass to the double (keepalive upstream pool,
#       HTTP/1.1, proxy_buffering off so streams are passed on at once, as
#       quotagate does),
# all in one run on this machine, for plain and for streaming (stream:
# true) chat completions (docs/benchmarks.md: ratios, not absolutes).
#
#   bench/proxy_bench.sh           (make bench runs it)
#
# Installs nothing: needs wrk, nginx and curl (prints why and exits 0
# without them), build/quotagate (or $QG_BIN) and build/upstream_double (or
# $QG_UPSTREAM_BIN): `make build/quotagate build/upstream_double`.
# Load: bench/wrk_proxy.lua, POST /v1/chat/completions, model "light",
# max_tokens $BENCH_MAX_TOKENS, X-Double-Mode: slow=0 (no pause between
# stream chunks), one request in flight per connection.
# BENCH_RUNS rounds (odd rounds quotagate first, even rounds nginx
# first), each printing req/s, p50 and p99 of each path, the p50/p99
# latency quotagate and nginx add over direct, the quotagate/nginx
# throughput ratio, and each proxy's CPU time per request (utime+stime
# from /proc over the run, nginx's workers summed: the steadier figure on
# shared cores); then the same three paths with one connection (wrk -t1
# -c1): the latency each proxy adds when nothing queues for the CPU.
# Last, the median and range of each figure over the rounds, and in how
# many rounds each target of issue 14 held.
# The double sets TCP_NODELAY on its connections (so its small SSE chunks
# are not held by Nagle + delayed ACK); quotagate sets it on its upstream
# and caller sockets, nginx on keep-alive connections by default.
# Everything listens on 127.0.0.1 only; every process started here is
# stopped on exit (trap).
# Environment: BENCH_DURATION (default 8s), BENCH_LAT_DURATION (the -c1
# runs, default 3s), BENCH_RUNS (3), BENCH_THREADS (2),
# BENCH_CONNECTIONS (32), BENCH_MAX_TOKENS (16), BENCH_WORKERS (quotagate
# --workers and nginx worker_processes, default 2), BENCH_TASKSET=1 pins
# the servers to CPU 1 and wrk to CPU 0 (needs 2 CPUs).  A round takes
# ~70 s with the defaults (12 wrk runs; 3 rounds: 205 s, measured).
set -u

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
. bench/lib.sh
QG=${QG_BIN:-$ROOT/build/quotagate}
DBL=${QG_UPSTREAM_BIN:-$ROOT/build/upstream_double}
DUR=${BENCH_DURATION:-8s}
LAT_DUR=${BENCH_LAT_DURATION:-3s}
THREADS=${BENCH_THREADS:-2}
CONNS=${BENCH_CONNECTIONS:-32}
MAXTOK=${BENCH_MAX_TOKENS:-16}
WORKERS=${BENCH_WORKERS:-2}
bench_runs proxy_bench
ADMIN_KEY="bench-admin-key-$$"
SERVICE_KEY="bench-service-key-$$"

skip() { say "proxy_bench: $*; skipping the proxy benchmark"; exit 0; }

command -v wrk >/dev/null 2>&1 || skip "wrk is not installed (apt-get install wrk)"
NGINX=$(command -v nginx 2>/dev/null || true)
[ -z "$NGINX" ] && [ -x /usr/sbin/nginx ] && NGINX=/usr/sbin/nginx
[ -n "$NGINX" ] || skip "nginx is not installed (apt-get install nginx-light)"
command -v curl >/dev/null 2>&1 || skip "curl is not installed"
[ -x "$QG" ] || skip "$QG is not built (make build/quotagate)"
[ -x "$DBL" ] || skip "$DBL is not built (make build/upstream_double)"
"$QG" serve --help 2>&1 | grep -q -- '--upstream' ||
    skip "$QG serve has no --upstream yet"

PIN_SRV=""; PIN_WRK=""
if [ "${BENCH_TASKSET:-0}" = 1 ] && command -v taskset >/dev/null 2>&1 &&
   [ "$(nproc)" -ge 2 ]; then
    PIN_SRV="taskset -c 1"; PIN_WRK="taskset -c 0"
fi

TMP=$(mktemp -d /tmp/qg-proxy-bench.XXXXXX) || exit 1
DBL_PID=""; QG_PID=""; NGX_PID=""
cleanup() {
    stop_pid "$NGX_PID"; NGX_PID=""
    stop_pid "$QG_PID"; QG_PID=""
    stop_pid "$DBL_PID"; DBL_PID=""
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

CHAT='{"model":"light","messages":[{"role":"user","content":"hello"}],"max_tokens":3}'
CHAT_S='{"model":"light","stream":true,"messages":[{"role":"user","content":"hello"}],"max_tokens":3}'
# probe NAME URL: one plain and one streaming call must answer 200 with the
# completion (and, streaming, the terminating [DONE])
probe() {
    code=$(curl -s -m 10 -o "$TMP/probe" -w '%{http_code}' -H "Authorization: Bearer $SUBJECT_KEY" \
        -H 'Content-Type: application/json' -H 'X-Double-Mode: slow=0' -d "$CHAT" "$2/v1/chat/completions")
    if [ "$code" != 200 ] || ! grep -q 'tok2' "$TMP/probe"; then
        say "proxy_bench: a probe call to $1 answered $code: $(head -c 300 "$TMP/probe")"; exit 1
    fi
    code=$(curl -s -N -m 10 -o "$TMP/probe" -w '%{http_code}' -H "Authorization: Bearer $SUBJECT_KEY" \
        -H 'Content-Type: application/json' -H 'X-Double-Mode: slow=0' -d "$CHAT_S" "$2/v1/chat/completions")
    if [ "$code" != 200 ] || ! grep -q '^data: \[DONE\]' "$TMP/probe"; then
        say "proxy_bench: a probe stream to $1 answered $code: $(head -c 300 "$TMP/probe")"; exit 1
    fi
}

# ----------------------------------------------------------- the double
SUBJECT_KEY=none
$PIN_SRV "$DBL" --listen 127.0.0.1:0 >"$TMP/dbl.out" 2>"$TMP/dbl.err" &
DBL_PID=$!
DBL_PORT=$(wait_port double "$DBL_PID" "$TMP/dbl.out" upstream_double:) || {
    say "proxy_bench: the upstream double did not start:"; cat "$TMP/dbl.err"; exit 1; }
DBL_URL="http://127.0.0.1:$DBL_PORT"
probe "the upstream double" "$DBL_URL"

# ------------------------------------------------------------ quotagate
proxy_rules "$TMP/rules.yaml" proxy-bench-1
"$QG" lint -c "$TMP/rules.yaml" >/dev/null 2>"$TMP/lint.err"
if [ $? -eq 2 ]; then say "proxy_bench: the bench rules do not load:"; cat "$TMP/lint.err"; exit 1; fi

mkdir -p "$TMP/qg"
QUOTAGATE_ADMIN_KEY=$ADMIN_KEY QUOTAGATE_SERVICE_KEY=$SERVICE_KEY \
    QUOTAGATE_UPSTREAM_KEY="bench-upstream-key-$$" QUOTAGATE_UPSTREAM_TIMEOUT_MS=10000 \
    $PIN_SRV "$QG" serve -c "$TMP/rules.yaml" --listen 127.0.0.1:0 --data "$TMP/qg" \
    --workers "$WORKERS" --upstream "$DBL_URL" >"$TMP/qg.out" 2>"$TMP/qg.err" &
QG_PID=$!
QG_PORT=$(wait_port quotagate "$QG_PID" "$TMP/qg.out" quotagate:) || {
    say "proxy_bench: quotagate serve did not start; its stderr:"; cat "$TMP/qg.err"; exit 1; }
QG_URL="http://127.0.0.1:$QG_PORT"
code=$(curl -s -m 10 -o "$TMP/key" -w '%{http_code}' -H "Authorization: Bearer $ADMIN_KEY" \
       -H 'Content-Type: application/json' -d '{"subject":"bench"}' "$QG_URL/v1/admin/keys")
SUBJECT_KEY=$(sed -n 's/.*"key" *: *"\([^"]*\)".*/\1/p' "$TMP/key")
if [ "$code" != 200 ] && [ "$code" != 201 ] || [ -z "$SUBJECT_KEY" ]; then
    say "proxy_bench: creating a subject key answered $code: $(cat "$TMP/key")"; exit 1
fi
probe quotagate "$QG_URL"

# ---------------------------------------------------------------- nginx
NGX_PORT=$(pick_port)
mkdir -p "$TMP/nginx/logs" "$TMP/nginx/tmp"
cat > "$TMP/nginx/nginx.conf" <<NGX
worker_processes $WORKERS;
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
    upstream double {
        server 127.0.0.1:$DBL_PORT;
        keepalive 256;
        keepalive_requests 100000000;
    }
    server {
        listen 127.0.0.1:$NGX_PORT reuseport;
        location / {
            proxy_pass http://double;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
            proxy_read_timeout 10s;
        }
    }
}
NGX
$PIN_SRV "$NGINX" -p "$TMP/nginx" -c "$TMP/nginx/nginx.conf" >"$TMP/nginx/logs/stdout" 2>&1 &
NGX_PID=$!
i=0
while ! curl -s -o /dev/null "http://127.0.0.1:$NGX_PORT/_double/count" 2>/dev/null; do
    if ! kill -0 "$NGX_PID" 2>/dev/null || [ $i -ge 100 ]; then
        say "proxy_bench: nginx did not start:"
        cat "$TMP/nginx/logs/stdout" "$TMP/nginx/logs/error.log" 2>/dev/null; exit 1
    fi
    sleep 0.05; i=$((i + 1))
done
NGX_URL="http://127.0.0.1:$NGX_PORT"
probe nginx "$NGX_URL"

# ------------------------------------------------------------------ wrk
# run_wrk NAME URL MODE [PID] [CONNS THREADS DURATION]: writes $TMP/NAME.txt
# and sets R_RPS R_P50 R_P99 R_NON2XX R_ERR (latencies in microseconds),
# R_CPU (microseconds of PID's CPU per request, "-" without PID) and its
# parts R_USR (user), R_SYS (system), R_LDG (quotagate's ledger threads)
run_wrk() {
    name=$1 c0=""; [ -n "${4:-}" ] && c0=$(cpu_parts "$4")
    QG_SUBJECT_KEY=$SUBJECT_KEY timeout 120 $PIN_WRK wrk -t"${6:-$THREADS}" -c"${5:-$CONNS}" \
        -d"${7:-$DUR}" --latency -s bench/wrk_proxy.lua "$2" -- "$3" "$MAXTOK" >"$TMP/$1.txt" 2>&1
    R_CPU=- R_USR=- R_SYS=- R_LDG=-
    if [ -n "${4:-}" ]; then
        c1=$(cpu_parts "$4")
        n=$(awk '/requests in/ {print $1}' "$TMP/$1.txt")
        set -- $(per_req "$c0" "$c1" "${n:-0}")
        R_CPU=$1 R_USR=$2 R_SYS=$3 R_LDG=$4
    fi
    wrk_parse "$name"
    R_ERR=$(awk '/Socket errors:/ { n = 0
            for (i = 3; i <= NF; i++) if ($i ~ /^[0-9]+,?$/) n += $i
            print n }' "$TMP/$name.txt")
    R_ERR=${R_ERR:-0}
}
added() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.3f", (a - b) / 1000 }'; }
line() { printf '  %-24s %10s %10s %10s %9s %7s %9s %7s %7s\n' "$@"; }

say ""
say "Proxy benchmark: wrk -t$THREADS -c$CONNS -d$DUR --latency, POST /v1/chat/completions max_tokens $MAXTOK, X-Double-Mode: slow=0${PIN_WRK:+ (pinned: servers CPU 1, wrk CPU 0)}"
say "  direct   upstream double $DBL_URL (one event loop)"
say "  quotagate serve --workers $WORKERS --upstream $DBL_URL on $QG_URL (data in $TMP/qg)"
say "  nginx    $("$NGINX" -v 2>&1 | sed 's/.*\///'), $WORKERS workers, proxy_pass keepalive upstream on $NGX_URL"

# BENCH_RUNS rounds; in each, both loads and the one-connection runs,
# the two proxies back to back: odd rounds quotagate first, even rounds
# nginx first, so that neither always meets the machine's state after the
# other.
BAD=0
ALL_plain="" ALL_stream="" CPU_plain="" CPU_stream=""
QADD_plain="" NADD_plain="" QADD_stream="" NADD_stream=""
LAT_plain="" LAT_stream=""
MET_plain=0 MET_stream=0 MET_added=0 MET_lat=0
k=1
while [ "$k" -le "$RUNS" ]; do
    order="qg ngx"; [ $((k % 2)) = 0 ] && order="ngx qg"
    say ""
    first="quotagate first, then nginx"
    [ "$order" = "qg ngx" ] || first="nginx first, then quotagate"
    say "  round $k of $RUNS ($first)"
    for mode in plain stream; do
        run_wrk "direct_${mode}_$k" "$DBL_URL" "$mode"
        D_RPS=$R_RPS D_P50=$R_P50 D_P99=$R_P99 D_BAD=$R_NON2XX D_ERR=$R_ERR
        for who in $order; do
            if [ "$who" = qg ]; then
                run_wrk "qg_${mode}_$k" "$QG_URL" "$mode" "$QG_PID"
                Q_RPS=$R_RPS Q_P50=$R_P50 Q_P99=$R_P99 Q_BAD=$R_NON2XX \
                    Q_ERR=$R_ERR Q_CPU=$R_CPU Q_USR=$R_USR Q_SYS=$R_SYS \
                    Q_LDG=$R_LDG
            else
                run_wrk "ngx_${mode}_$k" "$NGX_URL" "$mode" "$NGX_PID"
                N_RPS=$R_RPS N_P50=$R_P50 N_P99=$R_P99 N_BAD=$R_NON2XX \
                    N_ERR=$R_ERR N_CPU=$R_CPU N_USR=$R_USR N_SYS=$R_SYS
            fi
        done
        [ "$D_BAD$D_ERR$Q_BAD$Q_ERR$N_BAD$N_ERR" = 000000 ] || BAD=1

        say ""
        if [ "$mode" = plain ]; then
            say "  plain (JSON answer)"
        else
            say "  stream (stream: true, $MAXTOK content chunks; quotagate" \
                "asks for include_usage and drops the usage chunk)"
        fi
        line "" "req/s" "p50 ms" "p99 ms" "non-2xx" "errors" "CPU us/req" \
            "user" "kernel"
        line "direct" "$D_RPS" "$(ms "$D_P50")" "$(ms "$D_P99")" "$D_BAD" \
            "$D_ERR" ""
        line "quotagate" "$Q_RPS" "$(ms "$Q_P50")" "$(ms "$Q_P99")" "$Q_BAD" \
            "$Q_ERR" "$Q_CPU" "$Q_USR" "$Q_SYS"
        line "nginx proxy_pass" "$N_RPS" "$(ms "$N_P50")" "$(ms "$N_P99")" \
            "$N_BAD" "$N_ERR" "$N_CPU" "$N_USR" "$N_SYS"
        line "quotagate added" "" "$(added "$Q_P50" "$D_P50")" \
            "$(added "$Q_P99" "$D_P99")" "" "" ""
        line "nginx added" "" "$(added "$N_P50" "$D_P50")" \
            "$(added "$N_P99" "$D_P99")" "" "" ""
        line "quotagate/nginx" "$(ratio "$Q_RPS" "$N_RPS")x" \
            "$(ratio "$Q_P50" "$N_P50")x" "$(ratio "$Q_P99" "$N_P99")x" "" "" \
            "$(ratio "$Q_CPU" "$N_CPU")x" "$(ratio "$Q_USR" "$N_USR")x" \
            "$(ratio "$Q_SYS" "$N_SYS")x"
        line "quotagate/direct" "$(ratio "$Q_RPS" "$D_RPS")x" "" "" "" "" ""
        line "nginx/direct" "$(ratio "$N_RPS" "$D_RPS")x" "" "" "" "" ""
        say "  of quotagate's CPU us/req, its ledger threads' (writer," \
            "checkpointer): $Q_LDG"

        r=$(ratio "$Q_RPS" "$N_RPS") cr=$(ratio "$Q_CPU" "$N_CPU")
        qa=$(added "$Q_P50" "$D_P50") na=$(added "$N_P50" "$D_P50")
        if [ "$mode" = plain ]; then
            ALL_plain="$ALL_plain $r" CPU_plain="$CPU_plain $cr"
            QADD_plain="$QADD_plain $qa" NADD_plain="$NADD_plain $na"
            at_least "$r" 1 && MET_plain=$((MET_plain + 1))
            at_least "$na" "$qa" && ! at_least "$qa" "$na" &&
                MET_added=$((MET_added + 1))
        else
            ALL_stream="$ALL_stream $r" CPU_stream="$CPU_stream $cr"
            QADD_stream="$QADD_stream $qa" NADD_stream="$NADD_stream $na"
            at_least "$r" 1 && MET_stream=$((MET_stream + 1))
        fi
    done

    # one connection: the latency each path adds when nothing queues
    say ""
    say "  one connection (wrk -t1 -c1 -d$LAT_DUR): p50 / p99 ms, and" \
        "what each proxy adds"
    line "" "direct" "quotagate" "nginx" "qg added" "ngx add" ""
    for mode in plain stream; do
        run_wrk "lat_direct_${mode}_$k" "$DBL_URL" "$mode" "" 1 1 "$LAT_DUR"
        D_P50=$R_P50 D_P99=$R_P99 D_BAD=$R_NON2XX D_ERR=$R_ERR
        for who in $order; do
            if [ "$who" = qg ]; then
                run_wrk "lat_qg_${mode}_$k" "$QG_URL" "$mode" "" 1 1 "$LAT_DUR"
                Q_P50=$R_P50 Q_P99=$R_P99 Q_BAD=$R_NON2XX Q_ERR=$R_ERR
            else
                run_wrk "lat_ngx_${mode}_$k" "$NGX_URL" "$mode" "" 1 1 \
                    "$LAT_DUR"
                N_P50=$R_P50 N_P99=$R_P99 N_BAD=$R_NON2XX N_ERR=$R_ERR
            fi
        done
        [ "$D_BAD$D_ERR$Q_BAD$Q_ERR$N_BAD$N_ERR" = 000000 ] || BAD=1
        line "$mode p50" "$(ms "$D_P50")" "$(ms "$Q_P50")" "$(ms "$N_P50")" \
            "$(added "$Q_P50" "$D_P50")" "$(added "$N_P50" "$D_P50")" ""
        line "$mode p99" "$(ms "$D_P99")" "$(ms "$Q_P99")" "$(ms "$N_P99")" \
            "$(added "$Q_P99" "$D_P99")" "$(added "$N_P99" "$D_P99")" ""
        us=$(awk -v a="$Q_P50" -v b="$D_P50" 'BEGIN { printf "%.0f", a - b }')
        if [ "$mode" = plain ]; then
            LAT_plain="$LAT_plain $us"
            at_least "$us" 100 || MET_lat=$((MET_lat + 1))
        else
            LAT_stream="$LAT_stream $us"
        fi
    done
    k=$((k + 1))
done

say ""
say "summary of $RUNS rounds: median (lowest-highest)"
sline() { printf '  %-36s %-26s %s\n' "$@"; }
sline "plain req/s, quotagate/nginx" "$(spread2 $ALL_plain)" \
    "target >= 1.0x: $MET_plain of $RUNS rounds"
sline "plain CPU us/req, quotagate/nginx" "$(spread2 $CPU_plain)" ""
sline "stream req/s, quotagate/nginx" "$(spread2 $ALL_stream)" \
    "target >= 1.0x: $MET_stream of $RUNS rounds"
sline "stream CPU us/req, quotagate/nginx" "$(spread2 $CPU_stream)" ""
sline "plain added p50 ms, quotagate" "$(spread3 $QADD_plain)" \
    "target under nginx's: $MET_added of $RUNS rounds"
sline "plain added p50 ms, nginx" "$(spread3 $NADD_plain)" ""
sline "stream added p50 ms, quotagate" "$(spread3 $QADD_stream)" ""
sline "stream added p50 ms, nginx" "$(spread3 $NADD_stream)" ""
sline "one connection, plain added p50 us" \
    "$(spreadf '%+.0f (%+.0f to %+.0f)' $LAT_plain)" \
    "target < 100 us: $MET_lat of $RUNS rounds"
sline "one connection, stream added p50 us" \
    "$(spreadf '%+.0f (%+.0f to %+.0f)' $LAT_stream)" ""

# the proxy really metered: the subject's 5 h window holds the calls
USED=$(curl -s -m 10 -H "Authorization: Bearer $ADMIN_KEY" "$QG_URL/v1/usage/bench" |
       tr -d ' \n' | sed -n 's/.*"name":"burst_5h"[^}]*"used":\([0-9.eE+-]*\).*/\1/p')
say ""
say "quotagate metered: burst_5h used ${USED:-?} weight points for subject bench"
if [ "$BAD" != 0 ]; then
    say "note: non-2xx answers or socket errors above; first lines of quotagate's stderr:"
    head -5 "$TMP/qg.err"
fi
for n in "$DBL_PID:upstream double" "$QG_PID:quotagate serve" "$NGX_PID:nginx"; do
    if ! kill -0 "${n%%:*}" 2>/dev/null; then
        say "proxy_bench: ${n#*:} died during the benchmark"; cat "$TMP/qg.err"; exit 1
    fi
done
exit 0
