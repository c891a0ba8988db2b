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
printf '%032d\n' 0 > "$DIR/html/a.txt"

cat > "$DIR/client.py" <<'EOF'
import socket, sys, time
n, port = int(sys.argv[1]), int(sys.argv[2])
deadline = time.time() + 60
while True:
    try:
        s = socket.create_connection(("127.0.0.1", port)); break
    except OSError:
        if time.time() > deadline: sys.exit("the server did not start")
        time.sleep(0.05)
s.settimeout(60)
req = b"GET /a.txt HTTP/1.1\r\nHost: localhost\r\nUser-Agent: wrk\r\nAccept: */*\r\n\r\n"
buf = b""
for _ in range(n):
    s.sendall(req)
    while True:
        h = buf.find(b"\r\n\r\n")
        if h >= 0:
            head = buf[:h].decode("latin-1").lower()
            cl = int(head.split("content-length:")[1].split("\r\n")[0])
            if len(buf) >= h + 4 + cl:
                buf = buf[h + 4 + cl:]
                break
        d = s.recv(65536)
        if not d: sys.exit("the server closed the connection")
        buf += d
EOF

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

instructions() { # binary conf requests
  local out="$DIR/cg.$3"
  timeout 300 valgrind --tool=callgrind --callgrind-out-file="$out" "$1" -c "$2" \
    >"$DIR/logs/valgrind.log" 2>&1 &
  local vp=$!
  timeout 250 python3 "$DIR/client.py" "$3" "$PORT"
  kill -QUIT "$vp" 2>/dev/null || true  # nginx: graceful stop
  sleep 0.5
  kill -TERM "$vp" 2>/dev/null || true
  wait "$vp" || true
  sed -n 's/^summary: //p' "$out"
}

per_request() { # name binary cache
  conf "$1" "$3" > "$DIR/$1-$3.conf"
  local a b
  a=$(instructions "$2" "$DIR/$1-$3.conf" "$LOW")
  b=$(instructions "$2" "$DIR/$1-$3.conf" "$HIGH")
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
