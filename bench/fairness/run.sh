#!/usr/bin/env bash
# One client pipelining as fast as it can beside 50 ordinary keep-alive clients, on one worker:
# the ordinary clients' latency and throughput show whether the pipeliner starves them.
# usage: bench/fairness/run.sh [SHARD_BIN] [LABEL]   (needs python3; builds nothing)
# FAIRNESS_SECONDS (default 5) sets the load's length; SHARD_BENCH another shard-bench binary.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
BIN=${1:-$root/target/release/shard}
LABEL=${2:-shard}
BENCH=${SHARD_BENCH:-$root/target/release/shard-bench}
SECS=${FAIRNESS_SECONDS:-5}
# A port the kernel just handed out as free (not a random guess that another server may hold).
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
D=$(mktemp -d)
trap 'kill $(cat "$D/logs/f.pid" 2>/dev/null) 2>/dev/null || true; rm -rf "$D"' EXIT
mkdir -p "$D/conf" "$D/logs"
cat > "$D/conf/f.conf" <<CONF
worker_processes 1;
error_log logs/error.log error;
pid logs/f.pid;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_requests 100000000;   # the pipeliner is never cut off by keepalive_requests
    server { listen 127.0.0.1:$PORT; location = /ok { return 200 "OK"; } }
}
CONF
"$BIN" -p "$D" -c conf/f.conf &
for _ in $(seq 50); do [ -s "$D/logs/f.pid" ] && break; sleep 0.1; done
timeout 20 python3 "$here/hog.py" "$PORT" $((SECS + 3)) > "$D/hog.txt" &
hog=$!
sleep 1
echo "== $LABEL: 50 keep-alive clients for $SECS s beside one pipelining client"
timeout 20 "$BENCH" load -c 50 -d "$SECS" "http://127.0.0.1:$PORT/ok" | grep -E "requests/s|latency µs|errors"
wait "$hog" || true
cat "$D/hog.txt"
