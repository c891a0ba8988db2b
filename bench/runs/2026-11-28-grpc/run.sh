#!/bin/bash
# gRPC proxy: shard vs nginx front, same shard h2c backend; CPU of the front per request.
cd "$(dirname "$0")"
SHARD=$(realpath "${SHARD:-../../../target/release/shard}")
$SHARD -c "$PWD/back.conf" & BP=$!
sleep 0.5
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
for round in 1 2 3; do
  for who in shard nginx; do
    if [ $who = shard ]; then $SHARD -c "$PWD/shard-front.conf" & P=$!; port=19080;
    else nginx -c "$PWD/nginx-front.conf" -p "$PWD" & P=$!; port=19081; fi
    sleep 0.5
    h2load -n 2000 -c 10 -m 10 -H 'content-type: application/grpc' -H 'te: trailers' -d /dev/null http://127.0.0.1:$port/x > /dev/null 2>&1
    c0=$(cpu $P)
    out=$(h2load -n 100000 -c 10 -m 10 -H 'content-type: application/grpc' -H 'te: trailers' http://127.0.0.1:$port/x 2>&1)
    c1=$(cpu $P)
    ok=$(echo "$out" | grep -o '[0-9]* succeeded' | head -1 | cut -d' ' -f1)
    rps=$(echo "$out" | grep -o 'finished in [^,]*, [0-9.]* req/s' | grep -o '[0-9.]* req/s')
    ticks=$((c1-c0))
    echo "$round $who succeeded=$ok cpu_ticks=$ticks $rps per_cpu_s=$(python3 -c "print(round($ok/($ticks/100.0)) if $ticks else 0)")"
    kill $P; wait $P 2>/dev/null
  done
done
kill $BP
