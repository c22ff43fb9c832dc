#!/bin/sh
# deps.sh - install the Debian packages quotagate needs, only those missing.
# Usage: scripts/deps.sh [build|test|bench|fuzz]
# (fuzz: clang and libFuzzer for make fuzz only; make test replays the
# fuzz corpora with gcc and needs neither; postgresql: the server the
# PostgreSQL ledger's tests start themselves, tests/support/pgproc.c;
# nodejs and npm: the console's assets are bundled from npm packages at
# build time, console/; chromium: the console's browser test, tests/console)
set -e
want="gcc make pkg-config libyaml-dev libjansson-dev libyajl-dev libxxhash-dev tzdata \
      libevent-dev libsqlite3-dev libssl-dev libhttp-parser-dev libhiredis-dev \
      libpq-dev"
# the console (console/build.mjs): esbuild and uPlot from npm, bundled at build time
{ command -v node && command -v npm; } >/dev/null || want="$want nodejs npm"
case "${1:-build}" in
  test)  want="$want libcmocka-dev curl prometheus nginx-light sqlite3 openssl redis-server \
               postgresql chromium"
         # tests/console: playwright-core drives Debian's chromium (headless)
         ;;
  bench) want="$want libcmocka-dev wrk nginx-light curl sqlite3 redis-server postgresql" ;;
  fuzz)  want="$want clang libfuzzer-14-dev" ;;
esac
missing=""
for p in $want; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
echo "installing:$missing"
if [ "$(id -u)" -ne 0 ]; then
  echo "deps.sh: need root to install:$missing" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing >/dev/null
