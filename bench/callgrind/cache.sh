#!/bin/bash
# User-space instructions per cache hit (proxy_cache), shard and nginx as the front, under callgrind.
#
#   cargo build --profile profiling -p shard
#   bench/callgrind/cache.sh [SHARD_BINARY] [NGINX_BINARY]
#
# The front (`master_process off`, one worker loop) passes `location /` to an upstream with
# `keepalive 32` (HTTP/1.1, `Connection ""`) through `proxy_cache` (`proxy_cache_valid 200
# 1h`), no access log; the backend is shard (not under callgrind) answering a 1 KiB body.
# One kept-alive client connection makes LOW then HIGH requests of one URL (two runs, each on
# an empty cache: the first request stores it, every other one is a hit); (I(HIGH) - I(LOW))
# / (HIGH - LOW) is what a hit costs. Kernel work is not counted: `shard-bench cache` gives
# worker CPU per hit.
# Needs valgrind and python3; nginx is skipped, loudly, when absent. Runs as root.
set -euo pipefail

SHARD=${1:-target/profiling/shard}
NGINX=${2:-$(command -v nginx || echo /usr/sbin/nginx)}
PORT=${PORT:-18293}
BPORT=${BPORT:-18294}
LOW=${LOW:-100}
HIGH=${HIGH:-900}
command -v valgrind >/dev/null || { echo "valgrind missing: apt-get install valgrind" >&2; exit 1; }
[ -x "$SHARD" ] || { echo "no $SHARD: cargo build --profile profiling -p shard" >&2; exit 1; }

DIR=$(mktemp -d /tmp/shard-callgrind-cache.XXXXXX)
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
  server { listen 127.0.0.1:$BPORT; location / { return 200 "$(head -c 1024 /dev/zero | tr '\0' x)"; } } }
EOC

conf() { # name
  cat <<EOC
daemon off; master_process off; worker_processes 1; user root;
error_log $DIR/logs/$1-error.log; pid $DIR/logs/$1.pid;
events { worker_connections 64; }
http { access_log off; keepalive_requests 1000000;
  upstream backend { server 127.0.0.1:$BPORT; keepalive 32; keepalive_requests 1000000; }
  proxy_cache_path $DIR/cache-$1 keys_zone=c:1m;
  server { listen 127.0.0.1:$PORT;
    location / { proxy_pass http://backend; proxy_http_version 1.1;
                 proxy_set_header Connection ""; proxy_cache c; proxy_cache_valid 200 1h; } } }
EOC
}

per_request() { # name binary
  conf "$1" > "$DIR/$1.conf"
  local a b
  rm -rf "$DIR/cache-$1"
  a=$(instructions "$2" "$DIR/$1.conf" "$LOW" /x)
  rm -rf "$DIR/cache-$1"
  b=$(instructions "$2" "$DIR/$1.conf" "$HIGH" /x)
  echo "$1 front: $(( (b - a) / (HIGH - LOW) )) instructions per cache hit"
}

"$SHARD" -p "$DIR" -c "$DIR/backend.conf" >"$DIR/logs/backend.out" 2>&1 &
BP=$!
per_request shard "$SHARD"
if [ -x "$NGINX" ]; then
  per_request nginx "$NGINX"
else
  echo "SKIPPED nginx: not installed (apt-get install nginx-light)"
fi
