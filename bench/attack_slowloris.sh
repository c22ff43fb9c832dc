#!/bin/sh
# attack_slowloris.sh - issue 8's slow-upload attack at full size against
# the real server, with a healthy client measuring what it still gets
# (docs/benchmarks.md "Slow clients").  Not part of make test: it takes
# minutes.
#
#   bench/attack_slowloris.sh                 (make attack: both builds)
#   QG_BIN=build/asan/quotagate bench/attack_slowloris.sh
#
# Steps: raise `ulimit -n` to the hard limit (it is inherited by both the
# server and the attacker); start `quotagate serve` on the example rules
# in a temporary --data directory (keys given in the environment, as in
# the issue); run build/attack_slowloris against it (ATTACK_CONNS
# connections, default 9000, each POST /v1/check Content-Length 100000
# then one byte every ATTACK_DRIP_MS, default 4000, reopened when closed,
# for ATTACK_DURATION seconds, default 90, attackers from ATTACK_SRC,
# default 127.0.0.1, the healthy client's address too); print its report,
# the server's connection metrics scraped at the end, and stop the server.
# Extra serve flags: ATTACK_SERVE_ARGS (e.g. "--max-connections 4000").
set -u

cd "$(dirname "$0")/.." || exit 1
ROOT=$(pwd)
QG=${QG_BIN:-$ROOT/build/quotagate}
ATT=$ROOT/build/attack_slowloris
CONNS=${ATTACK_CONNS:-9000}
DRIP=${ATTACK_DRIP_MS:-4000}
DUR=${ATTACK_DURATION:-90}
SRC=${ATTACK_SRC:-127.0.0.1}
ADMIN_KEY="adm-attack-$$"
SERVICE_KEY="svc-attack-$$"

say() { printf '%s\n' "$*"; }
[ -x "$QG" ] || { say "attack: $QG is not built"; exit 1; }
[ -x "$ATT" ] || { say "attack: $ATT is not built (make build/attack_slowloris)"; exit 1; }
command -v curl >/dev/null 2>&1 || { say "attack: curl is not installed"; exit 1; }

ulimit -n "$(ulimit -Hn)" 2>/dev/null
say "attack: ulimit -n $(ulimit -n) (server and attacker), server $QG"

TMP=$(mktemp -d /tmp/qg-attack.XXXXXX) || exit 1
QG_PID=""
stop_pid() {
    # stop one process we started, by its pid: TERM, then KILL after 20 s
    [ -n "$1" ] || return 0
    kill -TERM "$1" 2>/dev/null || return 0
    i=0
    while kill -0 "$1" 2>/dev/null && [ $i -lt 200 ]; do sleep 0.1; i=$((i+1)); done
    kill -KILL "$1" 2>/dev/null
    wait "$1" 2>/dev/null
}
cleanup() {
    stop_pid "$QG_PID"; QG_PID=""
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# shellcheck disable=SC2086 # ATTACK_SERVE_ARGS is a list of flags
QUOTAGATE_ADMIN_KEY=$ADMIN_KEY QUOTAGATE_SERVICE_KEY=$SERVICE_KEY \
    "$QG" serve -c examples/rules.yaml --listen 127.0.0.1:0 \
    --data "$TMP/data" ${ATTACK_SERVE_ARGS:-} >"$TMP/qg.out" 2>"$TMP/qg.err" &
QG_PID=$!
PORT=""
i=0
while [ $i -lt 300 ]; do
    PORT=$(sed -n 's|^quotagate: listening on http://127\.0\.0\.1:\([0-9]*\).*|\1|p' "$TMP/qg.out" | head -1)
    [ -n "$PORT" ] && break
    kill -0 "$QG_PID" 2>/dev/null || break
    sleep 0.1; i=$((i + 1))
done
if [ -z "$PORT" ]; then
    say "attack: quotagate serve did not start; its stderr:"; cat "$TMP/qg.err"; exit 1
fi
grep '^quotagate: connections:' "$TMP/qg.out"

"$ATT" -p "$PORT" -k "$SERVICE_KEY" -n "$CONNS" -i "$DRIP" -d "$DUR" -s "$SRC"
rc=$?

say "server metrics at the end:"
curl -s -m 10 "http://127.0.0.1:$PORT/metrics" | grep -E '^quotagate_http_connections' \
    || say "  (no answer to /metrics)"
kill -0 "$QG_PID" 2>/dev/null || { say "attack: the server died; its stderr:"; cat "$TMP/qg.err"; exit 1; }
stop_pid "$QG_PID"; QG_PID=""
exit $rc
