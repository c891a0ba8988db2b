#!/bin/bash
B=$1; OUT=$2
cd /tmp/nt
: > $OUT
for t in $(cat /tmp/ntfail.list); do
  o=$(timeout 60 nice env TEST_NGINX_BINARY=$B TEST_NGINX_GLOBALS="user root;" prove -v $t 2>&1)
  okc=$(echo "$o" | grep -ac "^ok ")
  nok=$(echo "$o" | grep -a "^not ok " | grep -avc "# TODO")
  res=$(echo "$o" | grep -ao "Result: [A-Z]*" | tail -1)
  sk=$(echo "$o" | grep -ao "skipped: .*" | head -1 | cut -c1-40)
  echo "$t ok=$okc fail=$nok $res $sk" >> $OUT
done
echo ALLDONE >> $OUT
