//! The small results connection steps return to the worker's loop, shared by `conn.rs`,
//! `proxy.rs` and `respond.rs` so that none of them imports another's types.
//!
//! The steps decide; the loop acts on these: it closes, registers, queues a turn or answers.

/// What an I/O step on a client connection decided. The step never closes the connection:
/// its caller (`drive_turn`, or `drive_proxy`'s end of turn) does, so no caller has to ask
/// whether its connection still exists.
#[must_use]
#[derive(Debug, PartialEq, Eq)]
pub(in crate::worker) enum Io {
    /// Done, or bytes arrived: go on.
    Ready,
    /// Wait for the kernel (the connection is registered) or for the next turn (queued).
    Wait,
    /// End of stream or an error: the connection must close.
    Close,
}

pub(in crate::worker) enum Flush {
    Done,
    /// The socket's send buffer is full: wait for the kernel.
    Blocked,
    /// The call moved its share of a file: take another turn later.
    Yield,
    Failed,
}

/// What the HTTP layer decided for one request, before the worker moves any byte.
pub(in crate::worker) struct Reply {
    pub status: u16,
    pub body_bytes: u64,
    /// Nothing was written: the location's `error_page` number N takes over (an internal
    /// redirect or a redirect, decided by the caller).
    pub error_page: Option<usize>,
    /// Nothing was written: an internal redirect to this URI (nginx's index module), the
    /// request's arguments kept.
    pub redirect: Option<String>,
}

/// What `drive_proxy` tells the connection loop.
pub(in crate::worker) enum Step {
    /// The request is finished (answered or failed with an error page): go on as after any
    /// response.
    Done,
    /// Waiting for the kernel, or the connection was closed.
    Wait,
}
