#!/bin/bash
# run-diff.sh DIR BINARY OUTDIR [extra env...]: every *.t in DIR against BINARY, one at a
# time; per file the TAP lines (ok / not ok with names) into OUTDIR/FILE.tap.
D=$1; B=$2; OUT=$3
mkdir -p $OUT
cd $D
for t in *.t; do
  timeout 60 nice env TEST_NGINX_BINARY=$B TEST_NGINX_MODULES=/usr/lib/nginx/modules TEST_NGINX_GLOBALS="${GLOBALS:-}" prove -v $t > $OUT/$t.tap 2>&1
done
echo ALLDONE > $OUT/ALLDONE
