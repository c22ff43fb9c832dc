#!/bin/sh
# run.sh - what `make run` starts: quotagate serve on the example rules,
# with the embedded defaults (memory counters, SQLite ledger under ./var).
#
# For a ready-to-paste curl, the admin and service keys of this local
# instance are kept in var/dev-keys.env (mode 600), made once from the
# system's random source; export QUOTAGATE_ADMIN_KEY / QUOTAGATE_SERVICE_KEY
# yourself to use others.
set -e
cd "$(dirname "$0")/.."
mkdir -p var
if [ -z "${QUOTAGATE_SERVICE_KEY:-}" ] || [ -z "${QUOTAGATE_ADMIN_KEY:-}" ]; then
  if [ ! -f var/dev-keys.env ]; then
    umask 077
    {
      echo "QUOTAGATE_ADMIN_KEY=adm_$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
      echo "QUOTAGATE_SERVICE_KEY=svc_$(od -An -tx1 -N16 /dev/urandom | tr -d ' \n')"
    } > var/dev-keys.env
  fi
  . ./var/dev-keys.env
  export QUOTAGATE_ADMIN_KEY QUOTAGATE_SERVICE_KEY
fi
listen="${QG_LISTEN:-127.0.0.1:8080}"
echo "quotagate: admin key and service key of this instance: var/dev-keys.env"
echo "quotagate: paste to try it:"
echo "  curl -s -X POST http://$listen/v1/check -H 'Authorization: Bearer $QUOTAGATE_SERVICE_KEY' \\"
echo "       -d '{\"subject\":\"alice\",\"request_id\":\"try-1\",\"model\":\"standard\",\"input_tokens\":1200,\"max_output_tokens\":800}'"
echo "  curl -s http://$listen/v1/usage/alice -H 'Authorization: Bearer $QUOTAGATE_ADMIN_KEY'"
exec build/quotagate serve -c examples/rules.yaml --listen "$listen" --data var
