#!/bin/bash
# The image's health check: GET /readyz (or the path given, e.g. /healthz) on the local API;
# exits 0 on a 200. /readyz answers 200 once postgres is up and the default template is
# built, and not while a configured template cannot be built (docs/http-api.md). bash's
# /dev/tcp does the HTTP, so the image needs no curl.
set -euo pipefail
path=${1:-/readyz}
port=${PGLEASE_HEALTH_PORT:-5480}
exec 3<>"/dev/tcp/127.0.0.1/$port"
printf 'GET %s HTTP/1.0\r\nHost: localhost\r\n\r\n' "$path" >&3
read -r -t 3 _version status _reason <&3
[ "$status" = 200 ]
