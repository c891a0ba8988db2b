# Shared by the callgrind scripts (sourced): the kept-alive client and the instruction count
# of one server run. Expects DIR (the run's temporary directory, with logs/) and PORT.

# Writes $DIR/client.py: `python3 client.py N PORT PATH` makes N GETs of PATH on one kept-alive
# connection, each read to the end of its Content-Length before the next is sent.
write_client() {
  cat > "$DIR/client.py" <<'PY'
import socket, sys, time
n, port, path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
deadline = time.time() + 60
while True:
    try:
        s = socket.create_connection(("127.0.0.1", port)); break
    except OSError:
        if time.time() > deadline: sys.exit("the server did not start")
        time.sleep(0.05)
s.settimeout(60)
req = b"GET " + path.encode() + b" HTTP/1.1\r\nHost: localhost\r\nUser-Agent: wrk\r\nAccept: */*\r\n\r\n"
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
PY
}

# instructions BINARY CONF REQUESTS PATH: the user-space instructions of one run of the
# server under callgrind while the client makes REQUESTS GETs of PATH.
instructions() {
  local out="$DIR/cg.$3"
  timeout 300 valgrind --tool=callgrind --callgrind-out-file="$out" "$1" -p "$DIR" -c "$2" \
    >"$DIR/logs/valgrind.log" 2>&1 &
  local vp=$!
  timeout 250 python3 "$DIR/client.py" "$3" "$PORT" "$4"
  kill -QUIT "$vp" 2>/dev/null || true  # nginx: graceful stop
  sleep 0.5
  kill -TERM "$vp" 2>/dev/null || true
  wait "$vp" || true
  sed -n 's/^summary: //p' "$out"
}
