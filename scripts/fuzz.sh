#!/bin/sh
# fuzz.sh - run libFuzzer harnesses (build/fuzz/fuzz_NAME, built by
# make fuzz-build) for SECONDS each, on their corpus fuzz/corpus/NAME,
# at nice 19, and print per harness the executions, the coverage (cov:
# edges, ft: features) and the corpus size at the end (docs/fuzzing.md).
#
# Usage: scripts/fuzz.sh SECONDS NAME...
#
# With FUZZ_RUNS=N in the environment each harness stops after N
# executions instead (SECONDS still bounds it; 0 means no time bound),
# which is how a campaign of a given size is run (docs/fuzzing.md).
#
# New inputs go to build/fuzz/work/NAME (libFuzzer writes into its first
# corpus directory only), never into the repository; crashes to
# build/fuzz/artifacts/.  Logs: build/fuzz/logs/NAME.log.  Exit status 1
# when a harness found something (its log and the reproducer are named).
set -u
secs=${1:?usage: fuzz.sh SECONDS NAME...}
shift
found=0
mkdir -p build/fuzz/logs build/fuzz/artifacts
printf '%-18s %12s %8s %8s %8s  %s\n' harness executions cov ft corpus result
for name in "$@"; do
  bin=build/fuzz/fuzz_$name
  work=build/fuzz/work/$name
  log=build/fuzz/logs/$name.log
  mkdir -p "$work" "fuzz/corpus/$name"
  dict=""
  [ -f "fuzz/$name.dict" ] && dict="-dict=fuzz/$name.dict"
  # shellcheck disable=SC2086
  runs_opt=""
  [ -n "${FUZZ_RUNS:-}" ] && runs_opt="-runs=$FUZZ_RUNS"
  # shellcheck disable=SC2086
  nice -n 19 "$bin" -max_total_time="$secs" $runs_opt -print_final_stats=1 \
    -artifact_prefix="build/fuzz/artifacts/$name-" $dict \
    "$work" "fuzz/corpus/$name" >"$log" 2>&1
  rc=$?
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  last=$(grep -E '(^#[0-9]+|^Done).*cov: ' "$log" | tail -1)
  cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
  ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
  corp=$(echo "$last" | sed -n 's/.* corp: \([0-9]*\).*/\1/p')
  if [ $rc -eq 0 ]; then
    result=ok
  else
    result="FOUND (exit $rc): $log"
    found=1
  fi
  printf '%-18s %12s %8s %8s %8s  %s\n' "$name" "${runs:-?}" "${cov:-?}" \
    "${ft:-?}" "${corp:-?}" "$result"
done
if [ $found -ne 0 ]; then
  echo "reproducers:"; ls -1 build/fuzz/artifacts/
fi
exit $found
