#!/bin/bash
# User-space instructions per kept-alive static response, shard and nginx, under callgrind.
#
#   cargo build --profile profiling -p shard
#   bench/callgrind/static.sh [SHARD_BINARY] [NGINX_BINARY]
#
# One server process (`master_process off`, one worker loop), a 33 B file, `sendfile off`,
# `open_file_cache` on and off, no access log. Each case runs the server twice under
# `valgrind --tool=callgrind`, for 100 and for 900 requests on one kept-alive connection
# (LOW and HIGH in the environment change them; the bench's smoke test uses tiny ones);
# (I(900) - I(100)) / 800 leaves out start-up and exit. Counts do not drift with the machine's
# load, unlike CPU time: compare them between commits and with nginx. Kernel work is not
# counted (system calls are the same for both servers with the cache on, see docs/bench.md).
# Needs valgrind and python3; nginx is skipped, loudly, when absent. Runs as root (the
# servers keep running as root so that callgrind can write its output).
set -euo pipefail

SHARD=${1:-target/profiling/shard}
NGINX=${2:-$(command -v nginx || echo /usr/sbin/nginx)}
PORT=${PORT:-18181}
LOW=${LOW:-100}
HIGH=${HIGH:-900}
command -v valgrind >/dev/null || { echo "valgrind missing: apt-get install valgrind" >&2; exit 1; }
[ -x "$SHARD" ] || { echo "no $SHARD: cargo build --profile profiling -p shard" >&2; exit 1; }

DIR=$(mktemp -d /tmp/shard-callgrind.XXXXXX)
trap 'rm -rf "$DIR"' EXIT
mkdir -p "$DIR/html" "$DIR/logs"
. "$(dirname "$0")/lib.sh"
printf '%032d\n' 0 > "$DIR/html/a.txt"

write_client

conf() { # server cache(on|off)
  local cache=""
  [ "$2" = on ] && cache="open_file_cache max=100 inactive=60s; open_file_cache_valid 60s;"
  cat <<EOF
daemon off;
master_process off;
worker_processes 1;
user root;
error_log $DIR/logs/$1-error.log;
pid $DIR/logs/$1.pid;
events { worker_connections 64; }
http {
  access_log off;
  sendfile off;
  keepalive_requests 10000;
  $cache
  server { listen 127.0.0.1:$PORT; root $DIR/html; }
}
EOF
}

per_request() { # name binary cache
  conf "$1" "$3" > "$DIR/$1-$3.conf"
  local a b
  a=$(instructions "$2" "$DIR/$1-$3.conf" "$LOW" /a.txt)
  b=$(instructions "$2" "$DIR/$1-$3.conf" "$HIGH" /a.txt)
  echo "$1 open_file_cache $3: $(( (b - a) / (HIGH - LOW) )) instructions per request"
}

for cache in on off; do
  per_request shard "$SHARD" "$cache"
  if [ -x "$NGINX" ]; then
    per_request nginx "$NGINX" "$cache"
  else
    echo "SKIPPED nginx: not installed (apt-get install nginx-light)"
  fi
done
