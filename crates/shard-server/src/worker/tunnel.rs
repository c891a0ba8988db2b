//! Upgraded connections of the HTTP proxy (WebSocket and any other `101 Switching
//! Protocols`): once the upstream switched, the client connection and its upstream connection
//! become a byte tunnel in both directions.
//!
//! This module owns the tunnel's two bounded pipes (`proxy_buffer_size` each, client →
//! upstream and upstream → client), with back-pressure (a side is not read while its pipe to
//! the other side is full, so a client that stops reading costs the worker one pipe, never
//! more), half-closes (end of stream on one side becomes `shutdown(SHUT_WR)` on the other once
//! its pipe is flushed), and which timeout runs (nginx's `ngx_http_upstream_process_upgraded`:
//! `proxy_send_timeout` while the upstream does not take what waits for it, `send_timeout`
//! while the client does not, `proxy_read_timeout` otherwise, restarted by any byte moved).
//!
//! It does not own the sockets: the client's stays on its `Conn` and the upstream's on its
//! `UpConn`, in epoll under their usual tokens, so events reach the tunnel through the proxy's
//! state machine (`proxy.rs`, `State::Tunnel`) and the tunnel counts as two connections
//! against `worker_connections`, as any proxied request. Deciding to tunnel (an asked-for
//! `101`), ending it (access-log line, closing both) and its timeouts' log lines are
//! `proxy.rs`'s.

use std::os::fd::AsRawFd;

use super::relay::{move_between, Ends, Fd, Pipe};
use super::tls::TlsSide;
use super::Worker;

/// One upgraded connection's state between turns.
pub(super) struct Tunnel {
    /// Client to upstream, and upstream to client.
    up: Pipe,
    down: Pipe,
    /// End-of-stream state of the client and upstream sides (their readiness lives on the
    /// `Conn` and `UpConn`).
    client: Ends,
    upstream: Ends,
}

/// What one turn of a tunnel came to.
pub(super) enum Pumped {
    /// Both sides must wait for the kernel (`moved`: some byte moved, so the timeout
    /// restarts), or the turn's budget was used (`yielded`).
    Wait { moved: bool, yielded: bool },
    /// Both directions ended: each side read to its end and got our FIN.
    Done,
    /// A read or write failed: the operation and the error.
    Failed(&'static str, std::io::Error),
}

/// Which timeout runs for a tunnel now (see the module documentation).
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Waiting {
    UpstreamWrite,
    ClientWrite,
    Read,
}

impl Tunnel {
    /// A tunnel whose pipes start with what already arrived: `to_upstream`, client bytes read
    /// behind the request head, and `to_client`, upstream bytes read behind the `101` head.
    pub(super) fn new(size: usize, to_upstream: &[u8], to_client: &[u8]) -> Tunnel {
        let fresh = Ends {
            readable: true,
            writable: true,
            eof: false,
            shut: false,
        };
        Tunnel {
            up: Pipe::with(size, to_upstream),
            down: Pipe::with(size, to_client),
            client: fresh,
            upstream: fresh,
        }
    }

    /// Bytes written to the client through the tunnel (after the `101` head).
    pub(super) fn bytes_to_client(&self) -> u64 {
        self.down.written
    }

    /// `client_pending`: TLS records wait for the client besides the pipe.
    pub(super) fn waiting(
        &self,
        client_writable: bool,
        client_pending: bool,
        upstream_writable: bool,
        upstream_pending: bool,
    ) -> Waiting {
        if (!self.up.is_empty() || upstream_pending) && !upstream_writable {
            Waiting::UpstreamWrite
        } else if (!self.down.is_empty() || client_pending) && !client_writable {
            Waiting::ClientWrite
        } else {
            Waiting::Read
        }
    }
}

impl Worker<'_> {
    /// Moves bytes both ways between client `key` and upstream connection `u` until both
    /// must wait, one failed, both directions ended, or the turn's budget is used. The
    /// client's output buffer (the `101` head) is written first: nothing from the tunnel
    /// overtakes it.
    pub(super) fn pump_tunnel(&mut self, key: usize, u: usize, t: &mut Tunnel) -> Pumped {
        let c = &mut self.conns[key];
        let uc = &mut self.upconns[u];
        let (cfd, ufd) = (c.raw_fd(), uc.fd.as_raw_fd());
        t.client.readable = c.readable;
        t.client.writable = c.writable;
        t.upstream.readable = uc.readable;
        t.upstream.writable = uc.writable;
        let mut moved = false;
        let mut rounds = 0;
        let result = loop {
            rounds += 1;
            if rounds > super::TURN_ROUNDS_MAX {
                break Ok(true);
            }
            // The head first.
            let mut progress = false;
            while c.out_pos < c.out.len() && t.client.writable {
                let res = match c.tls.as_mut() {
                    Some(tls) => super::tls::write(cfd, tls, &c.out[c.out_pos..]),
                    None => shard_event::sock::write(cfd, &c.out[c.out_pos..]),
                };
                match res {
                    Ok(n) => {
                        c.out_pos += n;
                        progress = true;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        t.client.writable = false;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => return Pumped::Failed("send()", e),
                }
            }
            let head_out = c.out_pos >= c.out.len();
            let mut up_plain = Fd(ufd);
            let mut up_tls_side;
            let up_side: &mut dyn super::relay::Endpoint = match uc.tls.as_mut() {
                Some(tt) => {
                    up_tls_side = super::tls::UpTlsSide {
                        fd: ufd,
                        c: tt,
                        fin_pending: &mut uc.fin_pending,
                    };
                    &mut up_tls_side
                }
                None => &mut up_plain,
            };
            let mut plain = Fd(cfd);
            let mut tls_side;
            let client_side: &mut dyn super::relay::Endpoint = match c.tls.as_mut() {
                Some(tls) => {
                    tls_side = TlsSide { fd: cfd, t: tls };
                    &mut tls_side
                }
                None => &mut plain,
            };
            let a = move_between(
                client_side,
                &mut t.client,
                up_side,
                &mut t.upstream,
                &mut t.up,
                usize::MAX,
            );
            let b = if head_out {
                move_between(
                    up_side,
                    &mut t.upstream,
                    client_side,
                    &mut t.client,
                    &mut t.down,
                    usize::MAX,
                )
            } else {
                Ok(false)
            };
            match (a, b) {
                (Err((op, e)), _) | (_, Err((op, e))) => break Err((op, e)),
                (Ok(false), Ok(false)) if !progress => break Ok(false),
                _ => moved = true,
            }
        };
        // Records TLS still holds for the client go out as the socket takes them.
        let mut tls_pending = false;
        if let Some(tls) = c.tls.as_mut() {
            if t.client.writable {
                match super::tls::flush(cfd, tls) {
                    Ok(true) => {}
                    Ok(false) => t.client.writable = false,
                    Err(e) => return Pumped::Failed("send()", e),
                }
            }
            tls_pending = tls.has_output();
        }
        // And those for an `https://` upstream, then its FIN.
        if let Some(tt) = uc.tls.as_mut() {
            if t.upstream.writable && (tt.wants_write() || uc.fin_pending) {
                match super::tls::finish_up(ufd, tt, &mut uc.fin_pending) {
                    Ok(true) => {}
                    Ok(false) => t.upstream.writable = false,
                    Err(e) => return Pumped::Failed("send()", e),
                }
            }
            tls_pending |= tt.wants_write() || uc.fin_pending;
        }
        c.readable = t.client.readable;
        c.writable = t.client.writable;
        uc.readable = t.upstream.readable;
        uc.writable = t.upstream.writable;
        match result {
            Err((op, e)) => Pumped::Failed(op, e),
            Ok(_) if t.client.shut && t.upstream.shut && !tls_pending => {
                c.eof = true;
                Pumped::Done
            }
            Ok(yielded) => Pumped::Wait { moved, yielded },
        }
    }
}
