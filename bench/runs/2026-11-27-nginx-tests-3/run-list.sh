#!/bin/bash
# run-list.sh DIR BINARY OUTDIR LIST
D=$1; B=$2; OUT=$3; LIST=$4
mkdir -p $OUT; cd $D
for t in $(cat $LIST); do
  timeout 60 nice env TEST_NGINX_BINARY=$B TEST_NGINX_MODULES=/usr/lib/nginx/modules TEST_NGINX_GLOBALS="user root;" prove -v $t > $OUT/$t.tap 2>&1
done
echo ALLDONE > $OUT/ALLDONE
