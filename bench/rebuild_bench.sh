#!/bin/sh
# rebuild_bench.sh - how long `quotagate serve` takes to rebuild its
# counters from a ledger of N rows (default 10 million), all inside the
# rules' reach (the last 7 days), over 100,000 subjects.
#
# The rows are generated inside SQLite with a recursive CTE (no client
# round trips), into a ledger whose schema quotagate itself created, with
# the table of a subject's rows by time filled as quotagate's writer
# would have (subject_rows, docs/operations.md).
# Usage: bench/rebuild_bench.sh [ROWS]
set -eu
cd "$(dirname "$0")/.."
rows=${1:-10000000}
command -v sqlite3 >/dev/null || { echo "rebuild bench: sqlite3 not installed, skipped"; exit 0; }
dir=$(mktemp -d /tmp/qg-rebuild.XXXXXX)
trap 'kill $pid 2>/dev/null || true; rm -rf "$dir"' EXIT INT TERM
export QUOTAGATE_ADMIN_KEY=bench-admin QUOTAGATE_SERVICE_KEY=bench-service

start_server() {
  build/quotagate serve -c examples/rules.yaml --listen 127.0.0.1:0 \
    --data "$dir" > "$dir/out.log" 2> "$dir/err.log" &
  pid=$!
  for _ in $(seq 1 600); do
    grep -q "listening on" "$dir/out.log" 2>/dev/null && return 0
    kill -0 $pid 2>/dev/null || { cat "$dir/err.log"; exit 1; }
    sleep 0.1
  done
  echo "rebuild bench: server did not start"; exit 1
}

start_server                       # creates the schema
kill -TERM $pid; wait $pid || true
now_ms=$(($(date +%s) * 1000))
echo "rebuild bench: generating $rows ledger rows ..."
t0=$(date +%s)
sqlite3 "$dir/ledger.db" <<SQL
PRAGMA journal_mode=WAL;
PRAGMA synchronous=OFF;
BEGIN;
WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i + 1 < $rows)
INSERT INTO requests (request_id, subject, org, plan, rules_version,
  weights_version, model, "window", decision, status, estimated,
  input_tokens, output_tokens, reserved_milli, weight_milli, created_ms,
  settled_ms)
SELECT 'rb-' || i, 'user' || (i % 100000), '', 'pro', '2026-11-01', 'w1',
  '', '', 1, 2, 0, 0, 0, 1000, 1000,
  $now_ms - 7 * 86400000 + (i * 7 * 86400000 / $rows),
  $now_ms - 7 * 86400000 + (i * 7 * 86400000 / $rows)
FROM n;
-- what quotagate's writer keeps for these rows (schema 10): a subject's
-- rows by time, up to the mark
INSERT INTO subject_rows SELECT subject, created_ms, rowid FROM requests
  ORDER BY subject, created_ms, rowid;
UPDATE subject_rows_mark SET seq = (SELECT max(rowid) FROM requests);
COMMIT;
SQL
echo "rebuild bench: generated in $(( $(date +%s) - t0 )) s; starting quotagate"
start_server
grep "rebuilt counters" "$dir/out.log"
ms=$(sed -n 's/.*rows in \([0-9]*\) ms.*/\1/p' "$dir/out.log")
echo "rebuild: $rows rows in $ms ms = $(( rows / (ms > 0 ? ms : 1) * 1000 )) rows/s"
kill -TERM $pid; wait $pid || true
