# An HTTP/2 client for crates/shard/tests/http2.rs, on Python's `h2` (a pure-Python
# implementation: frames are written and read one by one, so a test can misbehave on purpose).
#
#   python3 h2client.py PORT MODE [ARGS...]
#
# Prints one line per result; exits 2 when the server did something the mode does not allow.
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

PORT = int(sys.argv[1])
MODE = sys.argv[2]
ARGS = sys.argv[3:]
DEADLINE = time.time() + 20


def connect(settings=None):
    s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    c = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    c.initiate_connection()
    if settings:
        c.update_settings(settings)
    s.sendall(c.data_to_send())
    return s, c


def headers(path, method="GET", extra=()):
    return [(":method", method), (":scheme", "http"), (":authority", "localhost"),
            (":path", path)] + list(extra)


PENDING = bytearray()


def frames(data):
    """Whole frames of what was read (after the 9-byte headers say their length): `h2`
    is given one at a time, so that a GOAWAY is seen even when a frame after it (the
    server's PING of a graceful shutdown) is more than `h2`'s closed state accepts."""
    PENDING.extend(data)
    out = []
    while len(PENDING) >= 9:
        n = 9 + int.from_bytes(PENDING[:3], "big")
        if len(PENDING) < n:
            break
        out.append(bytes(PENDING[:n]))
        del PENDING[:n]
    return out


def pump(s, c, done, on_event=None):
    """Reads until done() or the connection ends; returns how it ended."""
    while not done():
        if time.time() > DEADLINE:
            return "timeout"
        try:
            data = s.recv(65536)
        except socket.timeout:
            return "timeout"
        except ConnectionResetError:
            return "reset"
        if not data:
            return "closed"
        for f in frames(data):
            for ev in c.receive_data(f):
                if isinstance(ev, h2.events.ConnectionTerminated):
                    return "goaway %d" % ev.error_code
                if on_event:
                    on_event(ev)
        out = c.data_to_send()
        if out:
            try:
                s.sendall(out)
            except (BrokenPipeError, ConnectionResetError):
                return "reset"
    return "done"


def get_many(n, path):
    """n requests at once on one connection: status and body length of each."""
    s, c = connect()
    ids = []
    for _ in range(n):
        sid = c.get_next_available_stream_id()
        c.send_headers(sid, headers(path), end_stream=True)
        ids.append(sid)
    s.sendall(c.data_to_send())
    status, body, ended = {}, {}, set()

    def ev(e):
        if isinstance(e, h2.events.ResponseReceived):
            status[e.stream_id] = dict(e.headers)[b":status"].decode()
        elif isinstance(e, h2.events.DataReceived):
            body[e.stream_id] = body.get(e.stream_id, 0) + len(e.data)
            c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
        elif isinstance(e, h2.events.StreamEnded):
            ended.add(e.stream_id)

    how = pump(s, c, lambda: len(ended) == n, ev)
    for sid in ids:
        print("stream %d %s %d" % (sid, status.get(sid, "-"), body.get(sid, 0)))
    print("end", how)


def sequential(n, path):
    """n requests one after the other on one connection, until the server ends it."""
    s, c = connect()
    for _ in range(n):
        if c.state_machine.state == h2.connection.ConnectionState.CLOSED:
            break
        sid = c.get_next_available_stream_id()
        try:
            c.send_headers(sid, headers(path), end_stream=True)
        except h2.exceptions.ProtocolError:
            break
        s.sendall(c.data_to_send())
        st = {}

        def ev(e):
            if isinstance(e, h2.events.ResponseReceived):
                st["status"] = dict(e.headers)[b":status"].decode()
            elif isinstance(e, h2.events.StreamEnded):
                st["end"] = 1
            elif isinstance(e, h2.events.StreamReset):
                st["reset"] = e.error_code

        how = pump(s, c, lambda: "end" in st or "reset" in st, ev)
        print("stream %d %s" % (sid, st.get("status", "reset %s" % st.get("reset"))))
        if how != "done":
            print("end", how)
            return
    print("end", pump(s, c, lambda: False, lambda e: None))


def small_window(path, window):
    """A response larger than the client's window: it arrives as the window is given back."""
    s, c = connect({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
    sid = c.get_next_available_stream_id()
    c.send_headers(sid, headers(path), end_stream=True)
    s.sendall(c.data_to_send())
    got = [0, None]
    ended = []

    def ev(e):
        if isinstance(e, h2.events.ResponseReceived):
            got[1] = dict(e.headers)[b":status"].decode()
        elif isinstance(e, h2.events.DataReceived):
            if len(e.data) > window:
                print("frame larger than the window: %d" % len(e.data))
                sys.exit(2)
            got[0] += len(e.data)
            c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
        elif isinstance(e, h2.events.StreamEnded):
            ended.append(1)

    how = pump(s, c, lambda: bool(ended), ev)
    print("status", got[1], "bytes", got[0], "end", how)


def post(path, body, with_length):
    """A request body in DATA frames, with or without content-length."""
    s, c = connect()
    sid = c.get_next_available_stream_id()
    extra = [("content-length", str(len(body)))] if with_length else []
    c.send_headers(sid, headers(path, "POST", extra))
    out = bytearray()
    ended = []

    def ev(e):
        if isinstance(e, h2.events.DataReceived):
            out.extend(e.data)
            c.acknowledge_received_data(e.flow_controlled_length, e.stream_id)
        elif isinstance(e, h2.events.StreamEnded):
            ended.append(1)

    # As the server's windows allow: it opens them as the body is taken.
    sent = 0
    while sent < len(body):
        room = min(c.local_flow_control_window(sid), 1000, len(body) - sent)
        if room == 0:
            s.sendall(c.data_to_send())
            how = pump(s, c, lambda: c.local_flow_control_window(sid) > 0 or bool(ended), ev)
            if how != "done" or ended:
                print("body stalled at", sent, how)
                return
            continue
        c.send_data(sid, body[sent:sent + room])
        sent += room
    c.end_stream(sid)
    s.sendall(c.data_to_send())
    how = pump(s, c, lambda: bool(ended), ev)
    print(out.decode(errors="replace").strip(), "end", how)


def rapid_reset(n):
    """CVE-2023-44487: streams opened and cancelled in a loop."""
    s, c = connect()
    sent = 0
    for _ in range(n):
        sid = c.get_next_available_stream_id()
        c.send_headers(sid, headers("/slow"), end_stream=True)
        c.reset_stream(sid, 8)  # CANCEL
        sent += 1
        if sent % 100 == 0:
            try:
                s.sendall(c.data_to_send())
            except (BrokenPipeError, ConnectionResetError):
                print("end reset after", sent)
                return
    try:
        s.sendall(c.data_to_send())
    except (BrokenPipeError, ConnectionResetError):
        print("end reset after", sent)
        return
    print("end", pump(s, c, lambda: False, lambda e: None))


def frame(ftype, flags, sid, payload):
    return (len(payload).to_bytes(3, "big") + bytes([ftype, flags]) + sid.to_bytes(4, "big")
            + payload)


FLOOD_CODE = []


def goaways(buf, codes):
    """Appends the error code of each GOAWAY among the whole frames of `buf` to `codes`;
    returns what is left of `buf` (a frame not yet whole)."""
    i = 0
    while i + 9 <= len(buf):
        ln = int.from_bytes(buf[i:i + 3], "big")
        if i + 9 + ln > len(buf):
            break
        if buf[i + 3] == 7:
            codes.append(int.from_bytes(buf[i + 13:i + 17], "big"))
        i += 9 + ln
    return buf[i:]


def flood_read(s):
    """A thread that reads and drops what the server sends, noting a GOAWAY's code."""
    import threading

    def run():
        buf = b""
        while True:
            try:
                # Small reads: each is parsed at once, so the server sees its output taken
                # steadily (a megabyte parsed in Python under load can outlast send_timeout).
                d = s.recv(1 << 16)
            except OSError:
                return
            if not d:
                return
            buf = goaways(buf + d, FLOOD_CODE)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def raw(kind):
    """Frames written by hand: a CONTINUATION flood, a PING flood, a stream id that goes
    backwards. Prints how the connection ended and the GOAWAY code when there was one."""
    s = socket.create_connection(("127.0.0.1", PORT), timeout=10)
    s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + frame(4, 0, 0, b""))
    block = bytes([0x82, 0x86, 0x84, 0x41, 0x09]) + b"localhost"
    try:
        if kind == "continuation":
            s.sendall(frame(1, 0, 1, block))  # HEADERS without END_HEADERS
            filler = bytes([0x40, 0x03]) + b"x-a" + bytes([0x7f, 0x81, 0x7f]) + b"v" * 16000
            for _ in range(2000):
                s.sendall(frame(9, 0, 1, filler[:16384]))
        elif kind == "ping":
            # 10 MB of PINGs, read back meanwhile (a client that reads its answers):
            # more than 8 times a request's bytes, past nginx's 1 MiB allowance.
            goaway = flood_read(s)
            batch = frame(6, 0, 0, b"12345678") * 1000
            for _ in range(600):
                s.sendall(batch)
            goaway.join(15)
            print("goaway", FLOOD_CODE[0] if FLOOD_CODE else None)
            return
        elif kind == "stream-id":
            s.sendall(frame(1, 5, 5, block) + frame(1, 5, 3, block))
        elif kind == "settings":
            for _ in range(20000):
                s.sendall(frame(4, 0, 0, bytes([0, 3, 0, 0, 0, 100])))
        elif kind == "priority":
            for i in range(20000):
                s.sendall(frame(2, 0, 2 * i + 1, bytes([0, 0, 0, 0, 16])))
        elif kind == "window-update":
            for _ in range(20000):
                s.sendall(frame(8, 0, 0, (1).to_bytes(4, "big")))
        elif kind == "empty-data":
            s.sendall(frame(1, 4, 1, bytes([0x83, 0x86, 0x84, 0x41, 0x09]) + b"localhost"))
            for _ in range(20000):
                s.sendall(frame(0, 0, 1, b""))
        elif kind == "zero-window":
            # SETTINGS_INITIAL_WINDOW_SIZE 0, then a request whose response cannot move.
            s.sendall(frame(4, 0, 0, bytes([0, 4, 0, 0, 0, 0])))
            s.sendall(frame(1, 5, 1, bytes([0x82, 0x86, 0x44, 0x08]) + b"/big.bin"
                            + bytes([0x41, 0x09]) + b"localhost"))
            s.settimeout(4)
        if kind in ("settings", "priority", "window-update"):
            s.settimeout(2)
    except (BrokenPipeError, ConnectionResetError):
        if kind == "ping":
            # The reader thread has what there was once it ends.
            goaway.join(15)
            print("goaway", FLOOD_CODE[0] if FLOOD_CODE else "reset")
            return
    buf = b""
    codes = []
    while time.time() < DEADLINE and not codes:
        try:
            d = s.recv(65536)
        except (socket.timeout, ConnectionResetError):
            break
        if not d:
            break
        buf = goaways(buf + d, codes)
    print("goaway", codes[0] if codes else None)


if MODE == "get":
    get_many(int(ARGS[0]), ARGS[1])
elif MODE == "seq":
    sequential(int(ARGS[0]), ARGS[1])
elif MODE == "window":
    small_window(ARGS[0], int(ARGS[1]))
elif MODE == "post":
    post(ARGS[0], b"x" * int(ARGS[1]), ARGS[2] == "length")
elif MODE == "rapid":
    rapid_reset(int(ARGS[0]))
elif MODE == "raw":
    raw(ARGS[0])
else:
    sys.exit("unknown mode " + MODE)
