#!/bin/sh
# redis_diff.sh - the differential test of the Redis store (memory store
# and a real Redis fed the same random stream, every answer compared) with
# a long stream and a fresh seed, as make bench runs it; make test runs the
# same test with a fixed seed and 20,000 operations.  The seed is printed:
# QG_REDIS_DIFF_SEED=<it> build/tests/test_store_redis replays a failure.
#   bench/redis_diff.sh [OPERATIONS]      (default 100000 per mode)
set -u
cd "$(dirname "$0")/.." || exit 1
T=build/tests/test_store_redis
[ -x "$T" ] || { echo "redis_diff: $T is not built (make $T)"; exit 1; }
command -v redis-server >/dev/null 2>&1 ||
    { echo "redis_diff: redis-server is not installed; skipping"; exit 0; }
seed=${QG_REDIS_DIFF_SEED:-$(od -An -N4 -tu4 /dev/urandom | tr -d ' ')}
ops=${1:-100000}
echo ""
echo "Differential memory store vs Redis: seed $seed, $ops operations per mode"
start=$(date +%s)
QG_TESTDATA=$(pwd)/tests/data QG_REDIS_DIFF_SEED=$seed QG_REDIS_DIFF_OPS=$ops \
    "$T" >/tmp/qg-redis-diff.$$ 2>&1
rc=$?
grep -E '^([A-Za-z_ 0-9]+: [0-9]+ ops|exact: Redis holds|check: |settle|\[  (PASSED|FAILED))' \
    /tmp/qg-redis-diff.$$ | awk '!seen[$0]++' | sed 's/^/  /'
echo "  $(($(date +%s) - start)) s; exit $rc"
[ $rc -ne 0 ] && { echo "  the stream parted: the full output follows"; cat /tmp/qg-redis-diff.$$; }
rm -f /tmp/qg-redis-diff.$$
exit $rc
