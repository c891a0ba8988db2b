#!/bin/bash
# Runs nginx's test files against BINARY, one at a time (the suite uses literal ports);
# prints per file: passed/failed/result/skip reason. Every *.t of the checkout in /tmp/nt,
# or the files LIST names (one per line: how the failing ones were run again).
#   run-all.sh BINARY OUT [LIST]
B=$1; OUT=$2; LIST=${3:-}
cd /tmp/nt
: > $OUT
if [ -n "$LIST" ]; then FILES=$(cat "$LIST"); else FILES=$(ls *.t); fi
for t in $FILES; do
  o=$(timeout 60 nice env TEST_NGINX_BINARY=$B TEST_NGINX_GLOBALS="user root;" prove -v $t 2>&1)
  okc=$(echo "$o" | grep -ac "^ok ")
  nok=$(echo "$o" | grep -a "^not ok " | grep -avc "# TODO")
  res=$(echo "$o" | grep -ao "Result: [A-Z]*" | tail -1)
  sk=$(echo "$o" | grep -ao "skipped: .*" | head -1 | cut -c1-40)
  echo "$t ok=$okc fail=$nok $res $sk" >> $OUT
done
echo ALLDONE >> $OUT
