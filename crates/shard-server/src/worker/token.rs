//! The worker's epoll tokens: what an event is for, and, for connections, which incarnation of
//! a slab slot it was registered for.
//!
//! Slab keys are reused as soon as a connection closes. One `epoll_wait` can return an event
//! for a connection that an earlier event of the same batch closed, and whose slot a new
//! connection took since: without a generation that stale event would drive the new
//! connection. nginx solves this with the `instance` bit of its event pointer; shard stores the
//! low 32 bits of the connection's id in the token and drops events whose generation differs
//! from the slot's current one.
//!
//! Layout (64 bits): `kind` in bits 56..64, `generation` in bits 24..56, `key` in bits 0..24.
//! Keys are bounded by `worker_connections`, which is clamped to [`KEY_MAX`].

/// Largest slab key a token can carry; `worker_connections` is clamped below it.
pub(super) const KEY_MAX: usize = (1 << 24) - 1;

const KIND_SHIFT: u32 = 56;
const GEN_SHIFT: u32 = 24;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Token {
    /// The worker's signalfd.
    Signal,
    /// A listening socket, by index into the worker's listener table.
    Listener(usize),
    /// A client connection of the HTTP server.
    Conn { key: usize, generation: u32 },
    /// An upstream connection of the HTTP proxy.
    Upstream { key: usize, generation: u32 },
    /// A stream relay's client side.
    RelayClient { key: usize, generation: u32 },
    /// A stream relay's upstream side.
    RelayUpstream { key: usize, generation: u32 },
    /// A DNS query's socket (`resolver.rs`).
    Resolver { key: usize, generation: u32 },
    /// A stream UDP session's socket to its peer (`udp.rs`).
    Udp { key: usize, generation: u32 },
}

/// The generation a connection id is registered under.
pub(super) fn generation(id: u64) -> u32 {
    id as u32
}

impl Token {
    pub(super) fn encode(self) -> u64 {
        let (kind, key, generation) = match self {
            Token::Signal => (1u64, 0, 0),
            Token::Listener(i) => (2, i, 0),
            Token::Conn { key, generation } => (3, key, generation),
            Token::Upstream { key, generation } => (4, key, generation),
            Token::RelayClient { key, generation } => (5, key, generation),
            Token::RelayUpstream { key, generation } => (6, key, generation),
            Token::Resolver { key, generation } => (7, key, generation),
            Token::Udp { key, generation } => (8, key, generation),
        };
        debug_assert!(key <= KEY_MAX, "token key {key} out of range");
        (kind << KIND_SHIFT) | ((generation as u64) << GEN_SHIFT) | (key as u64 & KEY_MAX as u64)
    }

    /// `None` for a value no worker registration produces.
    pub(super) fn decode(v: u64) -> Option<Token> {
        let key = (v & KEY_MAX as u64) as usize;
        let generation = (v >> GEN_SHIFT) as u32;
        Some(match v >> KIND_SHIFT {
            1 => Token::Signal,
            2 => Token::Listener(key),
            3 => Token::Conn { key, generation },
            4 => Token::Upstream { key, generation },
            5 => Token::RelayClient { key, generation },
            6 => Token::RelayUpstream { key, generation },
            7 => Token::Resolver { key, generation },
            8 => Token::Udp { key, generation },
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_keep_kinds_apart() {
        let all = [
            Token::Signal,
            Token::Listener(7),
            Token::Conn {
                key: KEY_MAX,
                generation: u32::MAX,
            },
            Token::Upstream {
                key: 0,
                generation: 1,
            },
            Token::RelayClient {
                key: 3,
                generation: 9,
            },
            Token::RelayUpstream {
                key: 3,
                generation: 9,
            },
        ];
        let mut seen = std::collections::HashSet::new();
        for t in all {
            assert_eq!(Token::decode(t.encode()), Some(t));
            assert!(seen.insert(t.encode()));
        }
        assert_eq!(Token::decode(0), None);
        assert_eq!(Token::decode(u64::MAX), None);
    }

    #[test]
    fn a_reused_slot_gets_a_different_token() {
        // The same slab key for two successive connections: their tokens differ, so an event
        // registered for the first is recognised as stale by the second.
        let first = Token::Conn {
            key: 5,
            generation: generation(41),
        };
        let second = Token::Conn {
            key: 5,
            generation: generation(42),
        };
        assert_ne!(first.encode(), second.encode());
        assert_eq!(generation(1 << 32 | 42), generation(42));
    }
}
