//! An incremental HTTP/1.x response reader for the load generator: it is fed the bytes as they
//! arrive and says when the response is complete, without keeping the body.
//!
//! Framing follows RFC 9112 §6.3 for a response to GET: 1xx, 204 and 304 have no body;
//! `Transfer-Encoding: chunked` is decoded (sizes, extensions, trailers); else
//! `Content-Length`; else the body runs to the end of the connection.

/// What `feed` found.
#[derive(Debug, PartialEq, Eq)]
pub enum Feed {
    /// The response needs more bytes.
    More,
    /// The response is complete; the value is how many of the fed bytes belonged to it.
    Done(usize),
    /// Not HTTP, or a framing the reader cannot follow.
    Bad,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// Hex digits of a chunk size; `digits` says whether one was seen.
    Size { val: u64, digits: bool },
    /// A chunk extension, skipped to the end of the line.
    Ext { val: u64 },
    /// After the CR of a size line.
    SizeLf { val: u64 },
    /// Chunk data still to skip.
    Data(u64),
    /// The CRLF after chunk data; `cr` says whether the CR was seen.
    DataEnd { cr: bool },
    /// Trailer fields after the last chunk; `start` says whether we are at a line start.
    Trailer { start: bool, cr: bool },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Head,
    Length(u64),
    Chunked(Chunk),
    UntilClose,
    Done,
}

/// One response being read.
#[derive(Debug)]
pub struct Reader {
    head: Vec<u8>,
    state: State,
    /// The status code, once the head is read.
    pub status: u16,
    /// Whether the connection may carry another request after this response.
    pub keep_alive: bool,
}

impl Default for Reader {
    fn default() -> Self {
        Reader {
            head: Vec::with_capacity(256),
            state: State::Head,
            status: 0,
            keep_alive: false,
        }
    }
}

/// Responses with heads larger than this are refused as `Bad`.
const MAX_HEAD: usize = 64 * 1024;

impl Reader {
    /// Starts over for the next response on the connection.
    pub fn reset(&mut self) {
        self.head.clear();
        self.state = State::Head;
        self.status = 0;
        self.keep_alive = false;
    }

    /// Whether the end of the connection now completes the response (a close-delimited body).
    pub fn eof_completes(&self) -> bool {
        self.state == State::UntilClose
    }

    /// Feeds the next bytes read from the connection.
    pub fn feed(&mut self, data: &[u8]) -> Feed {
        let mut used = 0;
        if self.state == State::Head {
            let from = self.head.len().saturating_sub(3);
            self.head.extend_from_slice(data);
            let Some(end) = self.head[from..].windows(4).position(|w| w == b"\r\n\r\n") else {
                return if self.head.len() > MAX_HEAD {
                    Feed::Bad
                } else {
                    Feed::More
                };
            };
            let head_len = from + end + 4;
            // The bytes of `data` that were part of the head.
            used = head_len - (self.head.len() - data.len());
            if !self.parse_head() {
                return Feed::Bad;
            }
        }
        let rest = &data[used..];
        match self.body(rest) {
            Some(n) => Feed::Done(used + n),
            None if self.state == State::Done => Feed::Bad,
            None => Feed::More,
        }
    }

    /// Parses the complete head in `self.head` and sets the body's framing.
    fn parse_head(&mut self) -> bool {
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut r = httparse::Response::new(&mut headers);
        match r.parse(&self.head) {
            Ok(httparse::Status::Complete(_)) => {}
            _ => return false,
        }
        let (Some(code), Some(version)) = (r.code, r.version) else {
            return false;
        };
        self.status = code;
        let mut keep_alive = version == 1;
        let mut length = None;
        let mut chunked = false;
        for h in r.headers.iter() {
            if h.name.eq_ignore_ascii_case("content-length") {
                let Some(n) = std::str::from_utf8(h.value)
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                else {
                    return false;
                };
                if length.is_some_and(|l| l != n) {
                    return false;
                }
                length = Some(n);
            } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                chunked = h
                    .value
                    .rsplit(|&b| b == b',')
                    .next()
                    .is_some_and(|v| v.trim_ascii().eq_ignore_ascii_case(b"chunked"));
                if !chunked {
                    // Another coding last: the body runs to the close.
                    length = None;
                }
            } else if h.name.eq_ignore_ascii_case("connection") {
                for tok in h.value.split(|&b| b == b',') {
                    let tok = tok.trim_ascii();
                    if tok.eq_ignore_ascii_case(b"close") {
                        keep_alive = false;
                    } else if tok.eq_ignore_ascii_case(b"keep-alive") {
                        keep_alive = true;
                    }
                }
            }
        }
        self.state = if (100..200).contains(&code) || code == 204 || code == 304 {
            State::Length(0)
        } else if chunked {
            State::Chunked(Chunk::Size {
                val: 0,
                digits: false,
            })
        } else if let Some(n) = length {
            State::Length(n)
        } else {
            keep_alive = false;
            State::UntilClose
        };
        self.keep_alive = keep_alive;
        true
    }

    /// Consumes body bytes; `Some(n)` when the body ends after `n` of them. A framing error
    /// leaves the state `Done` and returns `None`.
    fn body(&mut self, data: &[u8]) -> Option<usize> {
        let mut i = 0;
        loop {
            match self.state {
                State::Head | State::Done => return None,
                State::UntilClose => return None,
                State::Length(n) => {
                    let take = n.min((data.len() - i) as u64);
                    i += take as usize;
                    if take == n {
                        self.state = State::Done;
                        return Some(i);
                    }
                    self.state = State::Length(n - take);
                    return None;
                }
                State::Chunked(c) => {
                    if let Chunk::Data(n) = c {
                        let take = n.min((data.len() - i) as u64);
                        i += take as usize;
                        self.state = State::Chunked(if take == n {
                            Chunk::DataEnd { cr: false }
                        } else {
                            Chunk::Data(n - take)
                        });
                        if i == data.len() {
                            return None;
                        }
                        continue;
                    }
                    let &b = data.get(i)?;
                    i += 1;
                    match self.chunk_byte(c, b) {
                        Some(next) => self.state = next,
                        None => {
                            self.state = State::Done;
                            return None;
                        }
                    }
                    if self.state == State::Done {
                        return Some(i);
                    }
                }
            }
        }
    }

    /// One byte of chunked framing outside chunk data: the next state, or `None` on an error.
    fn chunk_byte(&self, c: Chunk, b: u8) -> Option<State> {
        let next = |c| Some(State::Chunked(c));
        let after_size = |val: u64| {
            if val == 0 {
                next(Chunk::Trailer {
                    start: true,
                    cr: false,
                })
            } else {
                next(Chunk::Data(val))
            }
        };
        match c {
            Chunk::Size { val, digits } => match b {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                    let d = (b as char).to_digit(16)? as u64;
                    let val = val.checked_mul(16)?.checked_add(d)?;
                    next(Chunk::Size { val, digits: true })
                }
                b';' | b' ' | b'\t' if digits => next(Chunk::Ext { val }),
                b'\r' if digits => next(Chunk::SizeLf { val }),
                b'\n' if digits => after_size(val),
                _ => None,
            },
            Chunk::Ext { val } => match b {
                b'\r' => next(Chunk::SizeLf { val }),
                b'\n' => after_size(val),
                _ => next(Chunk::Ext { val }),
            },
            Chunk::SizeLf { val } if b == b'\n' => after_size(val),
            Chunk::SizeLf { .. } => None,
            Chunk::Data(_) => unreachable!("chunk data is skipped in bulk"),
            Chunk::DataEnd { cr } => match b {
                b'\r' if !cr => next(Chunk::DataEnd { cr: true }),
                b'\n' => next(Chunk::Size {
                    val: 0,
                    digits: false,
                }),
                _ => None,
            },
            Chunk::Trailer { start, cr } => match b {
                b'\r' => next(Chunk::Trailer { start, cr: true }),
                b'\n' if start => Some(State::Done),
                b'\n' => next(Chunk::Trailer {
                    start: true,
                    cr: false,
                }),
                _ if cr => None,
                _ => next(Chunk::Trailer {
                    start: false,
                    cr: false,
                }),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `resp` split at every position and checks it completes with `used` bytes.
    fn check_split(resp: &[u8], status: u16, keep_alive: bool) {
        for cut in 0..=resp.len() {
            let mut r = Reader::default();
            let (a, b) = resp.split_at(cut);
            let got = match r.feed(a) {
                Feed::Done(n) => {
                    assert_eq!(n, a.len(), "cut {cut}");
                    assert!(b.is_empty(), "done early at cut {cut}");
                    n
                }
                Feed::More => match r.feed(b) {
                    Feed::Done(n) => a.len() + n,
                    other => panic!("cut {cut}: {other:?}"),
                },
                Feed::Bad => panic!("cut {cut}: bad"),
            };
            assert_eq!(got, resp.len());
            assert_eq!(r.status, status);
            assert_eq!(r.keep_alive, keep_alive);
        }
    }

    #[test]
    fn content_length() {
        check_split(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK", 200, true);
        check_split(
            b"HTTP/1.1 500 X\r\ncontent-length: 0\r\nConnection: close\r\n\r\n",
            500,
            false,
        );
        check_split(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\nx", 200, false);
    }

    #[test]
    fn chunked_with_extension_and_trailer() {
        check_split(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\na\r\n0123456789\r\n0\r\nT: v\r\n\r\n",
            200,
            true,
        );
        check_split(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            200,
            true,
        );
    }

    #[test]
    fn no_body_statuses() {
        check_split(b"HTTP/1.1 304 NM\r\nContent-Length: 10\r\n\r\n", 304, true);
        check_split(b"HTTP/1.1 204 NC\r\n\r\n", 204, true);
    }

    #[test]
    fn close_delimited() {
        let mut r = Reader::default();
        assert_eq!(r.feed(b"HTTP/1.1 200 OK\r\n\r\nsome body"), Feed::More);
        assert!(r.eof_completes());
        assert!(!r.keep_alive);
    }

    #[test]
    fn extra_bytes_are_not_counted() {
        let mut r = Reader::default();
        assert_eq!(
            r.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOKHTTP"),
            Feed::Done(40)
        );
    }

    #[test]
    fn garbage_is_bad() {
        assert_eq!(Reader::default().feed(b"SSH-2.0-x\r\n\r\n"), Feed::Bad);
        let mut r = Reader::default();
        assert_eq!(
            r.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"),
            Feed::Bad
        );
    }
}
