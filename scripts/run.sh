#!/bin/sh
# run.sh - what `make run` starts.  Until the gateway server lands, the
# main job is the honest-multiplier report of the example rules: lint, then
# analyze (window ratios, redeemable allowance, effective multipliers,
# checked by running the real engine on a virtual clock).
set -e
cd "$(dirname "$0")/.."
echo "== quotagate lint -c examples/rules.yaml"
build/quotagate lint -c examples/rules.yaml || true
echo
echo "== quotagate analyze -c examples/rules.yaml"
exec build/quotagate analyze -c examples/rules.yaml
