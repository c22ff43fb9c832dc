#!/bin/sh
# run.sh - run every test binary of each build flavour given (build,
# build/asan), tally cmocka's counts, and end with "N passed, M failed".
# Tests find the CLI through $QG_BIN and data through $QG_TESTDATA.
# Skipped tests (cmocka's skip(): a server the test needs is absent) are
# counted and shown with the reason their log gives, never passed in
# silence.
set -u
passed=0; failed=0; skipped=0; broken=""
QG_TESTDATA="$(pwd)/tests/data"; export QG_TESTDATA
QG_EXAMPLES="$(pwd)/examples"; export QG_EXAMPLES
for dir in "$@"; do
  QG_BIN="$(pwd)/$dir/quotagate"; export QG_BIN
  QG_UPSTREAM_BIN="$(pwd)/$dir/upstream_double"; export QG_UPSTREAM_BIN
  for t in "$dir"/tests/test_*; do
    [ -x "$t" ] || continue
    log="$dir/tests/$(basename "$t").log"
    echo "== $t"
    "$t" >"$log" 2>&1
    rc=$?
    p=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    f=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    s=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) test.*/\1/p' "$log" | awk '{s+=$1} END {print s+0}')
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    if [ $rc -ne 0 ] || [ "$f" -ne 0 ]; then
      cat "$log"
      [ "$f" -eq 0 ] && failed=$((failed + 1))
      broken="$broken $t"
    elif [ "$s" -ne 0 ]; then
      echo "   $p passed, $s SKIPPED: $(grep -i 'skipped' "$log" | grep -v '^\[' | head -1)"
    else
      echo "   $p passed"
    fi
  done
done
# The npm-based suites, once, on the optimised build (node --test; their
# TAP "# pass N" / "# fail M" tallied), each installed from its committed
# lockfile when missing:
#   tests/sdk      the official openai and @anthropic-ai/sdk packages
#                  against the proxy
#   tests/console  the usage console in Debian's chromium (playwright-core)
node_suite() {
  t=$1; log=build/tests/$(basename "$t").log; mkdir -p build/tests; echo "== $t"
  { [ -d $t/node_modules ] || npm ci --prefix $t --no-audit --no-fund; } >"$log" 2>&1 &&
    QG_BIN="$(pwd)/build/quotagate" QG_UPSTREAM_BIN="$(pwd)/build/upstream_double" \
    node --test --test-reporter=tap $t/ >>"$log" 2>&1
  rc=$?
  p=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$log" | tail -1); p=${p:-0}
  f=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$log" | tail -1); f=${f:-0}
  passed=$((passed + p)); failed=$((failed + f))
  if [ $rc -ne 0 ] || [ "$f" -ne 0 ]; then
    cat "$log"; [ "$f" -eq 0 ] && failed=$((failed + 1)); broken="$broken $t"
  else echo "   $p passed"; fi
}
case " $* " in *" build "*)
  node_suite tests/sdk
  node_suite tests/console ;;
esac
[ "$skipped" -ne 0 ] && echo "$skipped skipped (see above why)"
[ -n "$broken" ] && echo "failing:$broken"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
