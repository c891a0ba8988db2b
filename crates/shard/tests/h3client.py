# An HTTP/3 client for crates/shard/tests/http3.rs, on Python's `aioquic` (an independent
# QUIC and HTTP/3 implementation).
#
#   python3 h3client.py PORT MODE [ARGS...]
#
#   get PATH...            requests in turn on one connection: "STATUS LEN BODY" each
#   head NAME PATH         one request: the response field NAME ("-" when absent)
#   many N PATH            N requests at once on one connection: "ok K" (K answered 200)
#   post PATH SIZE         a body of SIZE bytes: "STATUS BODY"
#   migrate PATH           a request, a new source port, a request: "STATUS STATUS"
#   pause PATH             a request, then one more after a line on stdin ("first STATUS",
#                          then "STATUS" or "failed: ...")
#   zerortt PATH           a request, then one in 0-RTT data on a resumed connection:
#                          "first STATUS", then "early STATUS X-EARLY"
#   flood N                N first flights from N ports, never answered: "retry R other O"
#   long PATH              one slow response: "headers" once it begins, then "STATUS LEN"
#                          (a test reloads the server meanwhile)
#
# Exits 2 on a timeout or a connection that failed.
import asyncio
import socket
import ssl
import sys

from aioquic.asyncio.client import connect
from aioquic.asyncio.protocol import QuicConnectionProtocol
from aioquic.h3.connection import H3_ALPN, H3Connection
from aioquic.h3.events import DataReceived, HeadersReceived
from aioquic.quic.events import ConnectionTerminated
from aioquic.quic.configuration import QuicConfiguration

PORT = int(sys.argv[1])
MODE = sys.argv[2]
ARGS = sys.argv[3:]


class Client(QuicConnectionProtocol):
    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.h3 = H3Connection(self._quic)
        self.waiters = {}
        self.responses = {}

    def quic_event_received(self, event):
        if isinstance(event, ConnectionTerminated):
            # Closed or reset by the server: every request waiting fails now.
            for w in self.waiters.values():
                if not w.done():
                    w.set_exception(ConnectionError(
                        "connection terminated (error 0x%x)" % event.error_code))
            self.waiters.clear()
            return
        for ev in self.h3.handle_event(event):
            if isinstance(ev, (HeadersReceived, DataReceived)):
                r = self.responses.setdefault(ev.stream_id, {"headers": [], "body": b""})
                if isinstance(ev, HeadersReceived):
                    if not r["headers"] and MODE == "long":
                        # The response began: the test may now reload under it.
                        print("headers", flush=True)
                    r["headers"] += ev.headers
                else:
                    r["body"] += ev.data
                if ev.stream_ended and ev.stream_id in self.waiters:
                    w = self.waiters.pop(ev.stream_id)
                    if not w.done():
                        w.set_result(r)

    async def request(self, method, path, body=None, extra=()):
        sid = self._quic.get_next_available_stream_id()
        hdrs = [(b":method", method.encode()), (b":scheme", b"https"),
                (b":authority", b"localhost"), (b":path", path.encode()),
                (b"user-agent", b"h3client")] + list(extra)
        if body is not None:
            hdrs.append((b"content-length", str(len(body)).encode()))
        self.h3.send_headers(sid, hdrs, end_stream=body is None)
        fut = asyncio.get_running_loop().create_future()
        self.waiters[sid] = fut
        if body is not None:
            # In parts, so that flow control is exercised; a server that answered early
            # (413) stops the stream, and the rest is not sent.
            step = 16384
            try:
                for i in range(0, len(body), step):
                    self.h3.send_data(sid, body[i:i + step], end_stream=i + step >= len(body))
                    self.transmit()
                    await asyncio.sleep(0)
                if not body:
                    self.h3.send_data(sid, b"", end_stream=True)
            except Exception:
                pass
        self.transmit()
        return await asyncio.wait_for(fut, 20)


def status(r):
    for n, v in r["headers"]:
        if n == b":status":
            return v.decode()
    return "?"


def field(r, name):
    for n, v in r["headers"]:
        if n == name.encode():
            return v.decode()
    return "-"


async def zerortt(path):
    # A connection that keeps the server's session ticket, then a second one that sends its
    # request in 0-RTT data with that ticket: "first STATUS", "early STATUS X-EARLY".
    tickets = []

    def config():
        cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
        cfg.verify_mode = ssl.CERT_NONE
        cfg.server_name = "localhost"
        return cfg

    async with connect("127.0.0.1", PORT, configuration=config(), create_protocol=Client,
                       session_ticket_handler=tickets.append) as c:
        r = await c.request("GET", path)
        print("first", status(r), flush=True)
        for _ in range(100):
            if tickets:
                break
            await asyncio.sleep(0.02)
    if not tickets:
        print("no session ticket")
        return
    cfg = config()
    cfg.session_ticket = tickets[-1]
    import os
    if os.environ.get("H3DEBUG"):
        print("ticket max_early_data", tickets[-1].max_early_data_size, tickets[-1].cipher_suite, tickets[-1].other_extensions, flush=True)
    async with connect("127.0.0.1", PORT, configuration=cfg, create_protocol=Client,
                       wait_connected=False) as c:
        r = await c.request("GET", path)
        print("early", status(r), field(r, "x-early"), flush=True)


async def main():
    if MODE == "zerortt":
        await zerortt(ARGS[0])
        return
    cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
    cfg.verify_mode = ssl.CERT_NONE
    cfg.server_name = "localhost"
    cfg.idle_timeout = 20
    async with connect("127.0.0.1", PORT, configuration=cfg, create_protocol=Client,
                       wait_connected=True) as c:
        if MODE == "get":
            for p in ARGS:
                r = await c.request("GET", p)
                body = r["body"]
                text = body.decode(errors="replace").strip() if len(body) < 200 else ""
                print(status(r), len(body), text)
        elif MODE == "head":
            r = await c.request("GET", ARGS[1])
            print(field(r, ARGS[0]))
        elif MODE == "many":
            n = int(ARGS[0])
            rs = await asyncio.gather(*[c.request("GET", ARGS[1]) for _ in range(n)])
            print("ok", sum(1 for r in rs if status(r) == "200"))
        elif MODE == "post":
            size = int(ARGS[1])
            body = bytes((i * 7) % 251 for i in range(size))
            r = await c.request("POST", ARGS[0], body)
            print(status(r), r["body"].decode(errors="replace").strip())
        elif MODE == "migrate":
            r1 = await c.request("GET", ARGS[0])
            # A new local port, as a NAT rebinding makes.
            loop = asyncio.get_running_loop()
            sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(("::", 0))
            transport, _ = await loop.create_datagram_endpoint(lambda: c, sock=sock)
            c._transport = transport
            c._quic.change_connection_id()
            r2 = await c.request("GET", ARGS[0])
            print(status(r1), status(r2))
        elif MODE == "pause":
            # A request, then another on the same connection once the test says so (a line
            # on stdin): "first STATUS", then "STATUS" or "failed: ...".
            r = await c.request("GET", ARGS[0])
            print("first", status(r), flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
            try:
                r = await c.request("GET", ARGS[0])
                print(status(r), flush=True)
            except Exception as e:
                print("failed:", repr(e), flush=True)
        elif MODE == "long":
            r = await c.request("GET", ARGS[0])
            print(status(r), len(r["body"]))
        else:
            print("unknown mode", MODE)
            sys.exit(2)


def flood(n):
    # n first flights (valid Initial packets) from n ports, none ever answered: what a
    # flood from spoofed addresses looks like to a server. Prints how many answers were
    # Retry packets (long header, type 3) and how many anything else.
    import socket
    import time
    from aioquic.quic.connection import QuicConnection
    socks = []
    for _ in range(n):
        cfg = QuicConfiguration(is_client=True, alpn_protocols=H3_ALPN)
        cfg.verify_mode = ssl.CERT_NONE
        cfg.server_name = "localhost"
        q = QuicConnection(configuration=cfg)
        q.connect(("127.0.0.1", PORT), now=time.time())
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind(("127.0.0.1", 0))
        for data, _ in q.datagrams_to_send(now=time.time()):
            s.sendto(data, ("127.0.0.1", PORT))
        socks.append(s)
    retries = other = 0
    end = time.time() + 3
    for s in socks:
        s.settimeout(max(0.01, end - time.time()))
        try:
            data = s.recv(65536)
        except OSError:
            continue
        if data[0] & 0xf0 == 0xf0:
            retries += 1
        else:
            other += 1
    print("retry", retries, "other", other)


if MODE == "flood":
    flood(int(ARGS[0]))
    sys.exit(0)

try:
    asyncio.run(asyncio.wait_for(main(), 30))
except (asyncio.TimeoutError, ConnectionError) as e:
    print("failed:", repr(e))
    sys.exit(2)
