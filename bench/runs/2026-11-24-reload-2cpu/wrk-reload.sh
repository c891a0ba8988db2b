#!/usr/bin/env bash
# The issue's measurement, with wrk: `wrk -t1 -c50 -d14s` (keep-alive) against `return 200`
# while the master gets 10 SIGHUPs one second apart and then a binary upgrade (USR2, WINCH,
# QUIT). Prints wrk's error line for shard, shard with `worker_shutdown_drain off`, and nginx.
# Usage: bench/runs/2026-11-24-reload-2cpu/wrk-reload.sh [path/to/shard]
set -euo pipefail
SHARD=${1:-target/release/shard}
NGINX=${NGINX:-/usr/sbin/nginx}
command -v wrk >/dev/null || { echo "wrk is not installed (apt-get install wrk)"; exit 1; }
run() { # name kind extra
  local name=$1 kind=$2 extra=$3 dir port
  dir=$(mktemp -d) port=$((20000 + RANDOM % 20000))
  mkdir -p "$dir"/{conf,logs,html}
  local head=""
  [ "$kind" = nginx ] && head="daemon off; master_process on;"
  cat > "$dir/conf/c.conf" <<CONF
$head
$extra
worker_processes 2;
pid $dir/logs/m.pid;
error_log $dir/logs/error.log error;
events { worker_connections 1024; }
http { access_log off; keepalive_requests 1000000; keepalive_timeout 300s;
  server { listen 127.0.0.1:$port reuseport; location / { return 200 "OK"; } } }
CONF
  local bin=$SHARD args=()
  [ "$kind" = nginx ] && bin=$NGINX args=(-e "$dir/logs/error.log")
  # Started through a shell that exits: nginx honours USR2 only once its parent changed.
  /bin/sh -c '"$0" "$@" & sleep 0.3' "$bin" "${args[@]}" -p "$dir" -c "$dir/conf/c.conf"
  sleep 0.5
  local master; master=$(cat "$dir/logs/m.pid")
  wrk -t1 -c50 -d14s "http://127.0.0.1:$port/" > "$dir/wrk.txt" &
  local w=$!
  sleep 1
  for _ in $(seq 10); do kill -HUP "$master"; sleep 1; done
  kill -USR2 "$master"; sleep 1
  kill -WINCH "$master"; kill -QUIT "$master"
  wait $w
  echo "== $name"; grep -E "requests in|Socket errors|Non-2xx" "$dir/wrk.txt" || echo "   no socket errors"
  kill -QUIT "$(cat "$dir/logs/m.pid")" 2>/dev/null || true
  sleep 1; rm -rf "$dir"
}
run shard shard ""
run "shard, worker_shutdown_drain off" shard "worker_shutdown_drain off;"
[ -x "$NGINX" ] && run nginx nginx ""
