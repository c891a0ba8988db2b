//! `grpc_pass` (nginx's `ngx_http_grpc_module`): calls relayed to an HTTP/2 upstream, their
//! trailers passed on, the upstream's windows respected, kept-alive upstream connections,
//! failures as 502, and `grpcs://` with ALPN `h2`. The upstream is a fake gRPC server on
//! shard's own frames (`shard_http::h2frame`, `hpack`), or shard itself.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use shard_http::h2frame::{self, Frame, Reader};
use shard_http::hpack;
use support::h2client::{Conn, Outcome, Raw};
use support::*;

/// What the fake upstream does with a stream once its request ended.
#[derive(Clone, Copy, PartialEq)]
enum Answer {
    /// 200, the request body back as the message, trailers `grpc-status: 0`.
    Echo,
    /// A trailers-only answer: HEADERS with END_STREAM and `grpc-status: 12`.
    Unimplemented,
    /// RST_STREAM REFUSED_STREAM before any head.
    Reset,
    /// A bidirectional stream: the head at once, each DATA echoed as it comes, the
    /// trailers at END_STREAM.
    Chat,
}

/// One call the fake upstream saw: its connection (counted from 1), stream id, request
/// fields and body.
#[derive(Clone, Debug)]
struct Call {
    conn: usize,
    stream: u32,
    fields: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Call {
    fn field(&self, name: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A fake gRPC server: `window` is the SETTINGS_INITIAL_WINDOW_SIZE it announces (it gives
/// back what it read with WINDOW_UPDATEs, so a body larger than the window still arrives).
struct Fake {
    addr: SocketAddr,
    calls: Arc<Mutex<Vec<Call>>>,
}

impl Fake {
    fn start(answer: Answer, window: u32) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let calls = Arc::new(Mutex::new(Vec::new()));
        let seen = calls.clone();
        std::thread::spawn(move || {
            for (n, s) in listener.incoming().enumerate() {
                let Ok(s) = s else { return };
                let seen = seen.clone();
                std::thread::spawn(move || serve(s, n + 1, answer, window, &seen));
            }
        });
        Fake { addr, calls }
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }
}

fn serve(mut s: TcpStream, conn: usize, answer: Answer, window: u32, seen: &Mutex<Vec<Call>>) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut preface = [0u8; 24];
    if s.read_exact(&mut preface).is_err() || preface[..] != h2frame::PREFACE[..] {
        return;
    }
    let mut out = Vec::new();
    h2frame::push_settings(&mut out, &[(4, window)]);
    s.write_all(&out).unwrap();
    let mut reader = Reader::new(16_384, 1 << 20);
    let mut decoder = hpack::Decoder::new(4096);
    let mut input = Vec::new();
    let mut calls: std::collections::HashMap<u32, Call> = Default::default();
    // What shard may still send, by stream and on the connection (id 0): a DATA frame past
    // it is answered with FLOW_CONTROL_ERROR, so a test fails if the windows are ignored.
    // Until shard acknowledges our SETTINGS, a stream's window is HTTP/2's default.
    let mut credit: std::collections::HashMap<u32, i64> = Default::default();
    let mut acked = false;
    loop {
        let mut used = 0;
        let mut out = Vec::new();
        let mut ended = Vec::new();
        while let Ok(Some((frame, n))) = reader.next(&input[used..]) {
            used += n;
            match frame {
                Frame::Settings { ack: false, .. } => h2frame::push_settings_ack(&mut out),
                Frame::Settings { ack: true, .. } if !acked => {
                    acked = true;
                    for (_, c) in credit.iter_mut().filter(|(id, _)| **id != 0) {
                        *c += i64::from(window) - 65_535;
                    }
                }
                Frame::Headers {
                    stream,
                    block,
                    end_stream,
                } => {
                    let mut fields = Vec::new();
                    decoder
                        .decode(block, 1 << 20, |n, v| {
                            fields.push((
                                String::from_utf8_lossy(n).into_owned(),
                                String::from_utf8_lossy(v).into_owned(),
                            ))
                        })
                        .unwrap();
                    credit.insert(stream, if acked { i64::from(window) } else { 65_535 });
                    calls.insert(
                        stream,
                        Call {
                            conn,
                            stream,
                            fields,
                            body: Vec::new(),
                        },
                    );
                    if answer == Answer::Chat {
                        let mut head = Vec::new();
                        hpack::Encoder.status(200, &mut head);
                        h2frame::push_headers(&mut out, stream, &head, false, 16_384);
                    }
                    if end_stream {
                        ended.push(stream);
                    }
                }
                Frame::Data {
                    stream,
                    data,
                    end_stream,
                    flow_len,
                } => {
                    let conn_credit = credit.entry(0).or_insert(65_535);
                    *conn_credit -= flow_len as i64;
                    let over = *conn_credit < 0;
                    let stream_credit = credit.entry(stream).or_insert(0);
                    *stream_credit -= flow_len as i64;
                    if over || *stream_credit < 0 {
                        h2frame::push_rst_stream(
                            &mut out,
                            stream,
                            h2frame::code::FLOW_CONTROL_ERROR,
                        );
                        calls.remove(&stream);
                        continue;
                    }
                    *stream_credit += flow_len as i64;
                    *credit.entry(0).or_insert(0) += flow_len as i64;
                    if let Some(c) = calls.get_mut(&stream) {
                        c.body.extend_from_slice(data);
                    }
                    if answer == Answer::Chat && !data.is_empty() {
                        h2frame::push_data(&mut out, stream, data, false);
                    }
                    if flow_len > 0 {
                        h2frame::push_window_update(&mut out, 0, flow_len as u32);
                        if !end_stream {
                            h2frame::push_window_update(&mut out, stream, flow_len as u32);
                        }
                    }
                    if end_stream {
                        ended.push(stream);
                    }
                }
                _ => {}
            }
        }
        input.drain(..used);
        for stream in ended {
            let Some(call) = calls.remove(&stream) else {
                continue;
            };
            let e = hpack::Encoder;
            match answer {
                Answer::Echo => {
                    let mut head = Vec::new();
                    e.status(200, &mut head);
                    e.field(b"content-type", b"application/grpc", &mut head);
                    h2frame::push_headers(&mut out, stream, &head, false, 16_384);
                    for piece in call.body.chunks(16_384) {
                        h2frame::push_data(&mut out, stream, piece, false);
                    }
                    let mut tr = Vec::new();
                    e.field(b"grpc-status", b"0", &mut tr);
                    e.field(b"grpc-message", b"", &mut tr);
                    h2frame::push_headers(&mut out, stream, &tr, true, 16_384);
                }
                Answer::Unimplemented => {
                    let mut head = Vec::new();
                    e.status(200, &mut head);
                    e.field(b"content-type", b"application/grpc", &mut head);
                    e.field(b"grpc-status", b"12", &mut head);
                    h2frame::push_headers(&mut out, stream, &head, true, 16_384);
                }
                Answer::Reset => {
                    h2frame::push_rst_stream(&mut out, stream, h2frame::code::REFUSED_STREAM);
                }
                Answer::Chat => {
                    let mut tr = Vec::new();
                    e.field(b"grpc-status", b"0", &mut tr);
                    h2frame::push_headers(&mut out, stream, &tr, true, 16_384);
                }
            }
            seen.lock().unwrap().push(call);
        }
        if !out.is_empty() && s.write_all(&out).is_err() {
            return;
        }
        let mut b = [0u8; 65536];
        match s.read(&mut b) {
            Ok(0) | Err(_) => return,
            Ok(n) => input.extend_from_slice(&b[..n]),
        }
    }
}

/// A front with `http2` on `{port}` and `locations` (where `UP` is the fake upstream's
/// address).
fn front(tag: &str, up: SocketAddr, locations: &str) -> Server {
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n access_log {{dir}}/access.log;\n \
         upstream pool {{ server {up}; keepalive 4; }}\n \
         server {{\n  listen 127.0.0.1:{{port}} http2;\n  location = /status {{ shard_status; }}\n  \
         {locations}\n }}\n}}\n"
    );
    Server::start(tag, &conf, 1)
}

fn addr(s: &Server) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], s.port))
}

fn call_block(path: &str) -> Vec<u8> {
    let e = hpack::Encoder;
    let mut block = support::h2client::request_block("POST", path);
    e.field(b"content-type", b"application/grpc", &mut block);
    e.field(b"te", b"trailers", &mut block);
    block
}

fn answered(o: Outcome) -> u16 {
    match o {
        Outcome::Answered(status, _) => status,
        Outcome::Retry => panic!("not processed"),
        Outcome::Failed(why) => panic!("failed: {why}"),
    }
}

#[test]
fn a_unary_call_goes_as_an_http2_stream_and_its_trailers_come_back() {
    let up = Fake::start(Answer::Echo, 65_535);
    let s = front(
        "grpc-unary",
        up.addr,
        &format!("location / {{ grpc_pass grpc://{}; }}", up.addr),
    );
    let mut c = Conn::open(addr(&s)).unwrap();
    let msg = b"\0\0\0\0\x05Hello";
    assert_eq!(
        answered(c.send_body(&call_block("/helloworld.Greeter/SayHello"), Some(msg))),
        200
    );
    assert_eq!(c.body, msg);
    assert!(c
        .head
        .iter()
        .any(|(n, v)| n == "content-type" && v == "application/grpc"));
    assert_eq!(
        c.trailers,
        [
            ("grpc-status".to_string(), "0".to_string()),
            ("grpc-message".to_string(), String::new())
        ]
    );
    let calls = up.calls();
    let call = &calls[0];
    assert_eq!(call.field(":method"), Some("POST"));
    assert_eq!(call.field(":scheme"), Some("http"));
    assert_eq!(call.field(":path"), Some("/helloworld.Greeter/SayHello"));
    assert_eq!(call.field(":authority"), Some(&*up.addr.to_string()));
    assert_eq!(call.field("te"), Some("trailers"));
    assert_eq!(call.field("content-type"), Some("application/grpc"));
    assert_eq!(call.field("connection"), None);
    assert_eq!(call.body, msg);

    // A trailers-only answer (an error status) comes as one HEADERS with END_STREAM.
    let up2 = Fake::start(Answer::Unimplemented, 65_535);
    let s2 = front(
        "grpc-trailers-only",
        up2.addr,
        &format!("location / {{ grpc_pass {}; }}", up2.addr),
    );
    let mut c = Conn::open(addr(&s2)).unwrap();
    assert!(matches!(
        c.send_body(&call_block("/x.Y/Z"), Some(b"")),
        Outcome::Answered(200, 0)
    ));
    assert!(c.head.iter().any(|(n, v)| n == "grpc-status" && v == "12"));
    assert!(c.data_frames.is_empty(), "{:?}", c.data_frames);
}

/// A body larger than the upstream's window leaves as the upstream gives room back; calls
/// to a `keepalive` upstream share one connection with stream ids 1, 3, 5.
#[test]
fn bodies_wait_for_the_upstreams_window_and_kept_connections_go_on_with_the_next_stream() {
    let up = Fake::start(Answer::Echo, 1_000);
    let s = front("grpc-window", up.addr, "location / { grpc_pass pool; }");
    let mut c = Conn::open(addr(&s)).unwrap();
    // Within shard's own stream window (the client does not wait for it), 50 times the
    // upstream's.
    let body = upstream::pattern(50_000, 7);
    for _ in 0..3 {
        assert_eq!(
            answered(c.send_body(&call_block("/big.Service/Put"), Some(&body))),
            200
        );
        assert_eq!(c.body.len(), body.len());
        assert!(c.body == body, "the echoed body differs");
    }
    let calls = up.calls();
    assert_eq!(calls.len(), 3);
    assert!(calls.iter().all(|c| c.conn == 1 && c.body == body));
    assert_eq!(
        calls.iter().map(|c| c.stream).collect::<Vec<_>>(),
        [1, 3, 5]
    );
}

#[test]
fn a_refused_stream_and_a_dead_upstream_are_502() {
    let up = Fake::start(Answer::Reset, 65_535);
    let dead = upstream::refusing_port();
    let s = front(
        "grpc-errors",
        up.addr,
        &format!(
            "location /reset {{ grpc_pass {}; }}\n location /dead {{ grpc_pass 127.0.0.1:{dead}; }}",
            up.addr
        ),
    );
    let mut c = Conn::open(addr(&s)).unwrap();
    assert_eq!(
        answered(c.send_body(&call_block("/reset"), Some(b"x"))),
        502
    );
    assert_eq!(answered(c.send_body(&call_block("/dead"), Some(b"x"))), 502);
    let log = error_log(&s);
    assert!(
        log.contains("upstream rejected request with error 7"),
        "{log}"
    );
    assert!(log.contains("upstream: \"grpc://"), "{log}");
}

/// shard to shard: an HTTP/1.1 client, `grpc_pass grpcs://` to a TLS listener with
/// `http2`, which sees an `h2` connection (ALPN) and the `:authority` of the pass.
#[test]
fn grpcs_negotiates_h2_with_alpn() {
    let dir = temp_dir("grpc-tls-cert").keep();
    let cert = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let (crt, key) = (dir.join("c.pem"), dir.join("c.key"));
    std::fs::write(&crt, cert.cert.pem()).unwrap();
    std::fs::write(&key, cert.key_pair.serialize_pem()).unwrap();
    let conf = format!(
        "worker_processes 1;\nevents {{}}\nhttp {{\n \
         server {{ listen 127.0.0.1:{{port}}; location = /status {{ shard_status; }}\n  \
           location / {{ grpc_pass grpcs://127.0.0.1:{{port1}}; }}\n  \
           location /plain {{ grpc_pass grpc://127.0.0.1:{{port2}}; }}\n  \
           location /var {{ grpc_pass grpcs://$arg_h:{{port1}}; }}\n  \
           location /named {{ grpc_pass $arg_u; }} }}\n \
         server {{ listen 127.0.0.1:{{port1}} ssl http2; listen 127.0.0.1:{{port2}} http2;\n  \
           ssl_certificate {}; ssl_certificate_key {};\n  \
           location / {{ return 200 \"$http2 $server_protocol $http_host\"; }} }}\n}}\n",
        crt.display(),
        key.display()
    );
    let s = Server::start_ports("grpc-tls", &conf, 1, 2);
    let r = get(addr(&s), "/x");
    assert_eq!(r.status, 200, "{}", error_log(&s));
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        format!("h2 HTTP/2.0 127.0.0.1:{}", s.ports[0])
    );
    let r = get(addr(&s), "/plain");
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        format!("h2c HTTP/2.0 127.0.0.1:{}", s.ports[1])
    );
    // With variables the same TLS: the scheme written before them, or in their value.
    let r = get(addr(&s), "/var?h=127.0.0.1");
    assert_eq!(r.status, 200, "{}", error_log(&s));
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        format!("h2 HTTP/2.0 127.0.0.1:{}", s.ports[0])
    );
    let r = get(
        addr(&s),
        &format!("/named?u=grpcs://127.0.0.1:{}", s.ports[0]),
    );
    assert_eq!(r.status, 200, "{}", error_log(&s));
    assert_eq!(
        String::from_utf8_lossy(&r.body),
        format!("h2 HTTP/2.0 127.0.0.1:{}", s.ports[0])
    );
}

/// A bidirectional stream: the client sends a message, waits for its echo, then sends the
/// next; each goes upstream while the response is already being read.
#[test]
fn a_bidirectional_stream_moves_both_ways_at_once() {
    let up = Fake::start(Answer::Chat, 65_535);
    let s = front(
        "grpc-bidi",
        up.addr,
        &format!("location / {{ grpc_pass {}; }}", up.addr),
    );
    let mut c = Raw::open(addr(&s), false);
    let mut out = Vec::new();
    h2frame::push_headers(&mut out, 1, &call_block("/chat.Chat/Talk"), false, 16_384);
    h2frame::push_data(&mut out, 1, b"ping-1", false);
    c.write(&out);
    // Reads frames until `want` DATA bytes came on stream 1 (false), or trailers (true).
    let wait_for = |c: &mut Raw, want: &[u8]| -> bool {
        let mut got = Vec::new();
        c.read_until(|f, acks| match f {
            Frame::Settings { ack: false, .. } => {
                h2frame::push_settings_ack(acks);
                None
            }
            Frame::Data {
                stream: 1, data, ..
            } => {
                got.extend_from_slice(data);
                (!want.is_empty() && got == want).then_some(false)
            }
            Frame::Headers {
                stream: 1,
                end_stream: true,
                ..
            } => Some(true),
            Frame::RstStream { code, .. } => panic!("reset {code}"),
            _ => None,
        })
    };
    assert!(!wait_for(&mut c, b"ping-1"));
    let mut out = Vec::new();
    h2frame::push_data(&mut out, 1, b"ping-2", false);
    c.write(&out);
    assert!(!wait_for(&mut c, b"ping-2"));
    let mut out = Vec::new();
    h2frame::push_data(&mut out, 1, b"", true);
    c.write(&out);
    assert!(wait_for(&mut c, b""), "trailers end the stream");
    assert_eq!(up.calls()[0].body, b"ping-1ping-2");
}
