#!/bin/bash
# User-space instructions per proxied request, shard and nginx as the front, under callgrind.
#
#   cargo build --profile profiling -p shard
#   bench/callgrind/proxy.sh [SHARD_BINARY] [NGINX_BINARY]
#
# The front (`master_process off`, one worker loop) passes `location /` to an upstream with
# `keepalive 32` (HTTP/1.1, `Connection ""`), no access log; the backend is shard (not under
# callgrind) answering `return 200 "OK"`. One kept-alive client connection makes LOW then
# HIGH requests (two runs); (I(HIGH) - I(LOW)) / (HIGH - LOW) leaves out start-up and exit.
# Kernel work is not counted: `shard-bench proxy` gives system calls and CPU per request.
# Needs valgrind and python3; nginx is skipped, loudly, when absent. Runs as root.
set -euo pipefail

SHARD=${1:-target/profiling/shard}
NGINX=${2:-$(command -v nginx || echo /usr/sbin/nginx)}
PORT=${PORT:-18291}
BPORT=${BPORT:-18292}
LOW=${LOW:-100}
HIGH=${HIGH:-900}
command -v valgrind >/dev/null || { echo "valgrind missing: apt-get install valgrind" >&2; exit 1; }
[ -x "$SHARD" ] || { echo "no $SHARD: cargo build --profile profiling -p shard" >&2; exit 1; }

DIR=$(mktemp -d /tmp/shard-callgrind-proxy.XXXXXX)
BP=
cleanup() { [ -n "$BP" ] && kill "$BP" 2>/dev/null; rm -rf "$DIR"; }
trap cleanup EXIT
mkdir -p "$DIR/logs"
. "$(dirname "$0")/lib.sh"

write_client

cat > "$DIR/backend.conf" <<EOC
daemon off; master_process off; worker_processes 1; user root;
error_log $DIR/logs/backend-error.log; pid $DIR/logs/backend.pid;
events { worker_connections 64; }
http { access_log off; keepalive_requests 1000000;
  server { listen 127.0.0.1:$BPORT; location / { return 200 "OK"; } } }
EOC

conf() { # name
  cat <<EOC
daemon off; master_process off; worker_processes 1; user root;
error_log $DIR/logs/$1-error.log; pid $DIR/logs/$1.pid;
events { worker_connections 64; }
http { access_log off; keepalive_requests 1000000;
  upstream backend { server 127.0.0.1:$BPORT; keepalive 32; keepalive_requests 1000000; }
  server { listen 127.0.0.1:$PORT;
    location / { proxy_pass http://backend; proxy_http_version 1.1;
                 proxy_set_header Connection ""; } } }
EOC
}

per_request() { # name binary
  conf "$1" > "$DIR/$1.conf"
  local a b
  a=$(instructions "$2" "$DIR/$1.conf" "$LOW" /x)
  b=$(instructions "$2" "$DIR/$1.conf" "$HIGH" /x)
  echo "$1 front: $(( (b - a) / (HIGH - LOW) )) instructions per proxied request"
}

"$SHARD" -p "$DIR" -c "$DIR/backend.conf" >"$DIR/logs/backend.out" 2>&1 &
BP=$!
per_request shard "$SHARD"
if [ -x "$NGINX" ]; then
  per_request nginx "$NGINX"
else
  echo "SKIPPED nginx: not installed (apt-get install nginx-light)"
fi
