//! Steering, the master's side: which workers are stalled or backlogged, judged every few
//! milliseconds from their heartbeats and their shards' accept queues, and what follows from
//! it: the `STEER_*` bits the workers read from the shared region, and the set of shards each
//! reuseport group's program sends new connections to (`listen::steer`).
//!
//! It does not accept anything: the workers poll a sibling's shard while its `STEER_HELP` bit
//! is set (`worker/accept.rs`). It never closes a shard (a closed listener resets what waits in
//! its queue and reorders the group's indices).
//!
//! What a stalled worker is: one whose loop has not turned for `reuseport_stall_threshold`
//! while it had work, that is while it was not waiting in `epoll_wait` (busy: a long request,
//! a blocking disk read, a `SIGSTOP` in the middle of a turn), or while connections waited in
//! its shard's queue (stopped while waiting), or one that is dead and not yet respawned. An
//! idle worker is never stalled, however old its heartbeat. It is live again as soon as its
//! heartbeat moves.
//!
//! What a backlogged worker is: a live one whose accept queue is longer than the mean of the
//! live workers' queues by `BACKLOG_GAP_MIN` or a sixteenth; it leaves the program (not its
//! siblings' help: it is working) until its queue is back at the mean. ARCHITECTURE.md says
//! why steering rather than stealing.
//!
//! The funnel: while every worker in it (or every live one) has at least
//! `FUNNEL_ENTER_QUEUE` connections queued (the server is saturated), each group of
//! `FUNNEL_GROUP` workers takes new connections on one shard only, its first worker's, which
//! the whole group polls (`STEER_FUNNEL`), and the group also drains the other shards'
//! queues; a stalled target stays the target, since the group polls it. Groups are
//! consecutive workers, sizes at most one apart, and each target takes new connections in
//! proportion to its group's workers in the funnel. Per-worker queues, however balanced, each
//! serve their own oldest connection first, so a worker that falls behind for a few
//! milliseconds leaves its queue's connections older than its siblings'; one queue per group
//! serves the group's oldest first,
//! as a shared socket does (E3, docs/bench.md). The funnel ends once its shards hold fewer
//! than `FUNNEL_LEAVE_QUEUE` each on average (or fewer than two workers are in it); a
//! group of eight, the ratio Intel measured, bounds how many workers contend for one queue's
//! lock. Short stalls neither start, end nor reweigh it: a saturated server's workers stall
//! too, each loop turn serving many connections; a worker stalled for `FUNNEL_OUT_MS` is out
//! ([`Funnel::tick`]).

use std::sync::atomic::Ordering::Relaxed;

use crate::shm::{Region, STEER_AWAY, STEER_FUNNEL, STEER_HELP, STEER_STALLED};

/// A live worker whose queue is this many connections (or a sixteenth, when more) above the
/// mean queue of the live workers is backlogged (a busy worker: long requests, many
/// connections, less CPU); it stops being so once its queue is back at the mean.
pub(crate) const BACKLOG_GAP_MIN: u32 = 4;

/// What the master does about a backlogged worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backlog {
    /// Its siblings also accept from its shard (work stealing); the program is unchanged.
    Steal,
    /// The program sends it no new connection until its queue is back in line.
    Steer,
    /// Nothing: only stalls count.
    Off,
}

impl Backlog {
    /// `SHARD_STEER_BACKLOG=steal|steer|off`, for measuring the alternatives (docs/bench.md);
    /// the default is the one the measurement chose.
    pub(crate) fn from_env() -> Backlog {
        match std::env::var("SHARD_STEER_BACKLOG").as_deref() {
            Ok("steal") => Backlog::Steal,
            Ok("off") => Backlog::Off,
            _ => Backlog::Steer,
        }
    }
}

/// Every worker in the funnel (or every live one) with at least this many connections
/// queued, on two looks in a row: the funnel starts.
pub(crate) const FUNNEL_ENTER_QUEUE: u32 = 4;
/// The funnel's shards holding fewer than this many each: it ends.
pub(crate) const FUNNEL_LEAVE_QUEUE: u32 = 2;
/// A worker stalled this long is out of the funnel (stopped or blocked, not busy: a
/// saturated server's loop turns were measured at up to 600 ms on an oversubscribed machine).
pub(crate) const FUNNEL_OUT_MS: u64 = 1000;
/// Workers per funnel shard.
pub(crate) const FUNNEL_GROUP: usize = 8;

/// `SHARD_STEER_FUNNEL=off` turns the funnel off, for measuring it (docs/bench.md).
pub(crate) fn funnel_from_env() -> bool {
    std::env::var("SHARD_STEER_FUNNEL").as_deref() != Ok("off")
}

/// The funnel group of worker `k` of `n`: `n.div_ceil(FUNNEL_GROUP)` groups of consecutive
/// workers, their sizes at most one apart (9 workers: 5 and 4, not 8 and 1).
pub(crate) fn funnel_group(k: usize, n: usize) -> usize {
    let groups = n.div_ceil(FUNNEL_GROUP).max(1);
    k * groups / n.max(1)
}

/// The funnel's state between ticks (see the module's documentation).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Funnel {
    on: bool,
    /// The last tick found the workers' queues full: one more such tick starts it (a
    /// burst that one tick sees is not saturation).
    armed: bool,
}

impl Funnel {
    /// Takes one tick's queues, stalls and the workers that are out (dead, or stalled for
    /// [`FUNNEL_OUT_MS`]); returns the shards that take every new connection, each with its
    /// weight in the program (its group's workers that are not out), or nothing when the
    /// funnel is off. One per group with such a worker: the group's first worker's, stalled or
    /// not, since the group polls it (a target that moved with every stall would send new
    /// connections to a different shard each time a worker of an oversubscribed machine waits
    /// for a CPU beyond the threshold).
    ///
    /// A saturated server's workers stall too: with CPU-heavy requests one loop turn serves
    /// many connections and lasts longer than the threshold (E3 on 4 workers: every worker
    /// judged stalled every few ticks, for up to 600 ms). So short stalls neither start, end
    /// nor reweigh the funnel: it starts when every worker that is not out has its queue full
    /// (or every live one), it ends on drained queues or when fewer than two workers are not
    /// out. A worker stopped for good is out after [`FUNNEL_OUT_MS`]: its group's weight
    /// drops, and it no longer keeps the funnel from starting (its siblings drain its queue).
    pub(crate) fn tick(
        &mut self,
        queued: &[u32],
        stalled: &[bool],
        out: &[bool],
    ) -> Vec<(usize, u32)> {
        let n = queued.len();
        let counts = |k: usize| !out.get(k).copied().unwrap_or(false);
        let live = |k: usize| counts(k) && !stalled.get(k).copied().unwrap_or(false);
        if (0..n).filter(|&k| counts(k)).count() < 2 {
            *self = Funnel::default();
            return Vec::new();
        }
        let mut targets: Vec<(usize, u32)> = Vec::new();
        for k in 0..n {
            let g = funnel_group(k, n);
            if k == 0 || funnel_group(k - 1, n) != g {
                targets.push((k, 0));
            }
            if counts(k) {
                if let Some(t) = targets.last_mut() {
                    t.1 += 1;
                }
            }
        }
        targets.retain(|&(_, w)| w > 0);
        if self.on {
            let held: u32 = targets.iter().map(|&(f, _)| queued[f]).sum();
            if held >= FUNNEL_LEAVE_QUEUE * targets.len() as u32 {
                return targets;
            }
            *self = Funnel::default();
            return Vec::new();
        }
        let full_where = |keep: &dyn Fn(usize) -> bool| {
            let mut any = false;
            for k in (0..n).filter(|&k| keep(k)) {
                if queued[k] < FUNNEL_ENTER_QUEUE {
                    return false;
                }
                any = true;
            }
            any
        };
        let full = full_where(&counts) || full_where(&live);
        if full && self.armed {
            self.on = true;
            return targets;
        }
        self.armed = full;
        Vec::new()
    }

    pub(crate) fn is_on(&self) -> bool {
        self.on
    }
}

/// The longest wait between two looks while every worker waits with nothing queued.
pub(crate) const QUIET_TICK_MAX_MS: u64 = 50;

/// How often the master judges the workers: a quarter of the threshold, so a stall is seen
/// within 1.25 thresholds, and at least every 10 ms.
pub(crate) fn tick_ms(threshold_ms: u64) -> u64 {
    (threshold_ms / 4).clamp(1, 10)
}

/// What the master reads of one worker at a tick.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Observation {
    /// The worker has a pid (it started and was not reaped since).
    pub alive: bool,
    pub heartbeat_ms: u64,
    /// Waiting in `epoll_wait`.
    pub idle: bool,
    /// Connections waiting in its shards' accept queues.
    pub queued: u32,
}

/// The master's memory of one worker between ticks.
#[derive(Clone, Debug, Default)]
pub(crate) struct Judge {
    /// The heartbeat it had when it was found stalled; `None` while it is live.
    stalled_at: Option<(u64, u64)>,
    last_heartbeat: u64,
    /// First tick that saw connections queued while the worker waited, the heartbeat unchanged.
    queued_since: Option<u64>,
    /// No verdict before this (a worker just started has not written its heartbeat yet).
    grace_until: u64,
    backlogged: bool,
}

/// A change of verdict, for the error log.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Change {
    Stalled { idle: bool, silent_ms: u64 },
    Live { stalled_ms: u64 },
}

impl Judge {
    pub(crate) fn new(now_ms: u64, threshold_ms: u64) -> Judge {
        Judge {
            grace_until: now_ms + threshold_ms,
            ..Judge::default()
        }
    }

    pub(crate) fn stalled(&self) -> bool {
        self.stalled_at.is_some()
    }

    /// How long it has been stalled at `now` (0 while live).
    pub(crate) fn stalled_for(&self, now: u64) -> u64 {
        self.stalled_at
            .map_or(0, |(_, since)| now.saturating_sub(since))
    }

    /// Takes one tick's observation; returns the change of verdict, if any.
    pub(crate) fn observe(
        &mut self,
        o: Observation,
        now: u64,
        threshold_ms: u64,
    ) -> Option<Change> {
        if o.heartbeat_ms != self.last_heartbeat {
            self.last_heartbeat = o.heartbeat_ms;
            self.queued_since = None;
        }
        if let Some((hb, since)) = self.stalled_at {
            if o.alive && o.heartbeat_ms != hb {
                self.stalled_at = None;
                return Some(Change::Live {
                    stalled_ms: now.saturating_sub(since),
                });
            }
            return None;
        }
        if now < self.grace_until {
            return None;
        }
        let silent = now.saturating_sub(o.heartbeat_ms);
        let stalled = if !o.alive || !o.idle {
            self.queued_since = None;
            silent >= threshold_ms
        } else if o.queued > 0 {
            let since = *self.queued_since.get_or_insert(now);
            now.saturating_sub(since.max(o.heartbeat_ms)) >= threshold_ms
        } else {
            self.queued_since = None;
            false
        };
        if !stalled {
            return None;
        }
        self.stalled_at = Some((o.heartbeat_ms, now));
        self.backlogged = false;
        Some(Change::Stalled {
            idle: o.alive && o.idle,
            silent_ms: silent,
        })
    }

    /// Whether a live worker with `queued` connections waiting is backlogged, given the mean
    /// queue of the live workers (itself included; `None`: it has no live sibling). It
    /// becomes so at `mean + max(BACKLOG_GAP_MIN, mean / 16)` and stays so until its queue
    /// is back at the mean.
    pub(crate) fn judge_backlog(&mut self, queued: u32, mean: Option<f64>) -> bool {
        self.backlogged = !self.stalled()
            && mean.is_some_and(|mean| {
                let q = f64::from(queued);
                if self.backlogged {
                    q > mean
                } else {
                    q >= mean + f64::from(BACKLOG_GAP_MIN).max(mean / 16.0)
                }
            });
        self.backlogged
    }
}

/// The group indices that take new connections, as the steering program's list (an index
/// repeated `w` times takes `w` shares): each of the first `active` shards `weights[j]` times
/// (1 where `weights` says nothing; 0: stalled, backlogged, or out of the funnel), or each of
/// them once when that leaves none (a server whose workers are all stuck is no worse than
/// nginx; it must not refuse everything).
pub(crate) fn live_shards(active: usize, weights: &[u32]) -> Vec<u32> {
    let mut live = Vec::new();
    for j in 0..active {
        for _ in 0..weights.get(j).copied().unwrap_or(1) {
            live.push(j as u32);
        }
    }
    if live.is_empty() {
        (0..active as u32).collect()
    } else {
        live
    }
}

/// Publishes worker `idx`'s bits; returns whether they changed (the epoch is then bumped by
/// the caller, once per tick).
pub(crate) fn publish(
    region: &Region,
    idx: usize,
    stalled: bool,
    help: bool,
    away: bool,
    funnel: bool,
) -> bool {
    let bits = (if stalled { STEER_STALLED } else { 0 })
        | (if help { STEER_HELP } else { 0 })
        | (if away { STEER_AWAY } else { 0 })
        | (if funnel { STEER_FUNNEL } else { 0 });
    let Some(slot) = region.steer.get(idx) else {
        return false;
    };
    slot.swap(bits, Relaxed) != bits
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: u64 = 20;

    fn obs(alive: bool, heartbeat_ms: u64, idle: bool, queued: u32) -> Observation {
        Observation {
            alive,
            heartbeat_ms,
            idle,
            queued,
        }
    }

    #[test]
    fn an_idle_worker_is_never_stalled_however_old_its_heartbeat() {
        let mut j = Judge::new(0, T);
        for now in (100..5000).step_by(5) {
            assert_eq!(j.observe(obs(true, 50, true, 0), now, T), None);
        }
    }

    #[test]
    fn a_busy_worker_is_stalled_after_the_threshold_and_live_when_its_heartbeat_moves() {
        let mut j = Judge::new(0, T);
        assert_eq!(j.observe(obs(true, 100, false, 0), 110, T), None);
        assert_eq!(j.observe(obs(true, 100, false, 0), 119, T), None);
        assert_eq!(
            j.observe(obs(true, 100, false, 0), 120, T),
            Some(Change::Stalled {
                idle: false,
                silent_ms: 20
            })
        );
        assert!(j.stalled());
        // Still stuck, then idle (a SIGCONT woke it into epoll_wait): live only once the
        // heartbeat moved.
        assert_eq!(j.observe(obs(true, 100, false, 0), 500, T), None);
        assert_eq!(
            j.observe(obs(true, 510, true, 0), 515, T),
            Some(Change::Live { stalled_ms: 395 })
        );
        assert!(!j.stalled());
    }

    #[test]
    fn a_worker_stopped_while_waiting_is_stalled_once_its_queue_waited_the_threshold() {
        let mut j = Judge::new(0, T);
        // Idle since 100, a connection queued at about 1000.
        assert_eq!(j.observe(obs(true, 100, true, 0), 995, T), None);
        assert_eq!(j.observe(obs(true, 100, true, 1), 1000, T), None);
        assert_eq!(j.observe(obs(true, 100, true, 3), 1015, T), None);
        assert!(matches!(
            j.observe(obs(true, 100, true, 5), 1020, T),
            Some(Change::Stalled { idle: true, .. })
        ));
        // A worker that woke and took its queue is not stalled: the queue emptied.
        let mut k = Judge::new(0, T);
        assert_eq!(k.observe(obs(true, 100, true, 1), 1000, T), None);
        assert_eq!(k.observe(obs(true, 100, true, 0), 1005, T), None);
        assert_eq!(k.observe(obs(true, 100, true, 1), 1015, T), None);
        assert_eq!(k.observe(obs(true, 100, true, 1), 1030, T), None);
    }

    #[test]
    fn a_dead_worker_is_stalled_until_its_successor_runs() {
        let mut j = Judge::new(0, T);
        assert!(j.observe(obs(false, 100, false, 0), 130, T).is_some());
        // Respawned: the new worker's heartbeat differs.
        assert!(matches!(
            j.observe(obs(true, 140, true, 0), 145, T),
            Some(Change::Live { .. })
        ));
    }

    #[test]
    fn a_worker_just_started_gets_a_grace_period() {
        let mut j = Judge::new(1000, T);
        assert_eq!(j.observe(obs(false, 0, false, 0), 1005, T), None);
        assert_eq!(j.observe(obs(true, 1010, true, 0), 1015, T), None);
    }

    #[test]
    fn a_backlog_is_a_gap_above_the_mean_queue_with_hysteresis() {
        let mut j = Judge::new(0, T);
        assert!(!j.judge_backlog(100, None));
        assert!(!j.judge_backlog(3, Some(0.0)));
        assert!(j.judge_backlog(4, Some(0.0)));
        assert!(
            j.judge_backlog(101, Some(100.0)),
            "stays until back at the mean"
        );
        assert!(!j.judge_backlog(100, Some(100.0)));
        assert!(!j.judge_backlog(106, Some(100.0)));
        assert!(
            j.judge_backlog(107, Some(100.0)),
            "a sixteenth above a long mean"
        );
        // A stalled worker is not "backlogged": it is steered and helped as stalled.
        j.observe(obs(true, 0, false, 0), 100, T);
        assert!(j.stalled());
        assert!(!j.judge_backlog(100, Some(0.0)));
    }

    #[test]
    fn the_funnel_starts_when_every_live_worker_has_a_queue_and_ends_when_it_drained() {
        /// `ticks` looks in a row at the same queues, from a fresh state; the stalled workers
        /// stalled for good (out of the funnel).
        fn after(ticks: usize, q: &[u32], st: &[bool]) -> (Funnel, Vec<(usize, u32)>) {
            let mut f = Funnel::default();
            let mut t = Vec::new();
            for _ in 0..ticks {
                t = f.tick(q, st, st);
            }
            (f, t)
        }
        // Not while one live worker has room, nor with fewer than two workers in it.
        assert!(after(3, &[9, 3], &[false, false]).1.is_empty());
        assert!(after(3, &[9], &[false]).1.is_empty());
        let mut f = Funnel::default();
        for _ in 0..3 {
            assert!(f.tick(&[9, 9], &[false, true], &[false, true]).is_empty());
        }
        // Every live one at FUNNEL_ENTER_QUEUE on two looks in a row, not one: the group's
        // first shard, weighted by the group's workers in it; an out worker's queue does not
        // count.
        assert!(after(1, &[4, 4], &[false, false]).1.is_empty());
        let mut f = Funnel::default();
        f.tick(&[4, 4], &[false, false], &[]);
        assert!(f.tick(&[4, 0], &[false, false], &[]).is_empty(), "a burst");
        assert!(f.tick(&[4, 4], &[false, false], &[]).is_empty());
        assert_eq!(f.tick(&[4, 4], &[false, false], &[]), vec![(0, 2)]);
        assert!(f.is_on());
        assert_eq!(after(2, &[0, 5, 6], &[true, false, false]).1, vec![(0, 2)]);
        // It stays while its shard holds FUNNEL_LEAVE_QUEUE, whatever the others hold, and
        // its worker may stall (the group polls it; a short stall does not reweigh it, one
        // for good does); below, it ends.
        assert_eq!(f.tick(&[2, 0], &[false, false], &[]), vec![(0, 2)]);
        assert_eq!(
            f.tick(&[50, 9, 9], &[true, false, false], &[]),
            vec![(0, 3)]
        );
        let stopped = [true, false, false];
        assert_eq!(f.tick(&[50, 9, 9], &stopped, &stopped), vec![(0, 2)]);
        assert!(f.tick(&[1, 30], &[false, false], &[]).is_empty());
        assert!(!f.is_on());
        // Groups of at most FUNNEL_GROUP, their sizes at most one apart, each weighted by its
        // workers in the funnel; a group with none has no target.
        assert_eq!(after(2, &[5; 9], &[false; 9]).1, vec![(0, 5), (5, 4)]);
        let mut st = vec![false; 20];
        assert_eq!(after(2, &[5; 20], &st).1, vec![(0, 7), (7, 7), (14, 6)]);
        st[7] = true;
        assert_eq!(after(2, &[5; 20], &st).1, vec![(0, 7), (7, 6), (14, 6)]);
        for s in &mut st[14..] {
            *s = true;
        }
        let (mut f, t) = after(2, &[5; 20], &st);
        assert_eq!(t, vec![(0, 7), (7, 6)]);
        // The funnel's shards together: 2 targets hold 4, so it stays; 3 would end it.
        let mut q = vec![0u32; 20];
        q[0] = 4;
        assert_eq!(f.tick(&q, &st, &st).len(), 2);
        q[0] = 3;
        assert!(f.tick(&q, &st, &st).is_empty());
    }

    #[test]
    fn a_saturated_servers_stalls_neither_start_nor_end_the_funnel() {
        // Every worker busy past the threshold (each loop turn serves many connections), all
        // queues full: it starts, one target weighted by the workers in it.
        let mut f = Funnel::default();
        assert!(f.tick(&[6, 5, 7, 4], &[true; 4], &[false; 4]).is_empty());
        assert_eq!(f.tick(&[6, 5, 7, 4], &[true; 4], &[false; 4]), vec![(0, 4)]);
        // Short stalls come and go: the target and its weight stay (the same program).
        assert_eq!(
            f.tick(&[3, 0, 0, 9], &[false, true, false, true], &[false; 4]),
            vec![(0, 4)]
        );
        assert_eq!(f.tick(&[2, 0, 0, 0], &[true; 4], &[false; 4]), vec![(0, 4)]);
        // One live worker and one busy one, both queues full: it starts (it did not when
        // only live workers counted).
        let mut g = Funnel::default();
        g.tick(&[9, 9], &[false, true], &[false; 2]);
        assert_eq!(g.tick(&[9, 9], &[false, true], &[false; 2]), vec![(0, 2)]);
        // Out (dead, or stalled for FUNNEL_OUT_MS): not counted. Fewer than two in it ends
        // it (all stopped for good: new connections spread over every backlog again).
        assert!(f
            .tick(&[9; 4], &[false; 4], &[false, true, true, true])
            .is_empty());
        assert!(!f.is_on());
        // A worker out with an empty queue (its siblings drain it) does not keep it from
        // starting, and its group's weight leaves it out.
        let mut h = Funnel::default();
        h.tick(&[9, 9, 0], &[false; 3], &[false, false, true]);
        assert_eq!(
            h.tick(&[9, 9, 0], &[false; 3], &[false, false, true]),
            vec![(0, 2)]
        );
        // Two groups, one stopped for good while the other is busy: all to the busy one.
        let mut out = vec![false; 16];
        for o in &mut out[..8] {
            *o = true;
        }
        let mut k = Funnel::default();
        k.tick(&[5; 16], &[true; 16], &out);
        assert_eq!(k.tick(&[5; 16], &[true; 16], &out), vec![(8, 8)]);
    }

    #[test]
    fn funnel_groups_are_at_most_eight_and_even() {
        for n in 1..=64usize {
            let mut sizes = vec![0usize; n.div_ceil(FUNNEL_GROUP)];
            let mut last = 0;
            for k in 0..n {
                let g = funnel_group(k, n);
                assert!(g >= last, "consecutive");
                last = g;
                sizes[g] += 1;
            }
            let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
            assert!(*max <= FUNNEL_GROUP && max - min <= 1, "{n}: {sizes:?}");
        }
    }

    #[test]
    fn live_shards_never_empty() {
        assert_eq!(live_shards(3, &[1, 0, 1]), vec![0, 2]);
        assert_eq!(live_shards(2, &[0, 0]), vec![0, 1]);
        assert_eq!(live_shards(2, &[]), vec![0, 1]);
        // A shard beyond `active` (drained after a reload) is never live.
        assert_eq!(live_shards(2, &[1, 1, 1]), vec![0, 1]);
        // Weights repeat an index: the funnel's targets by their groups' sizes.
        assert_eq!(live_shards(9, &[5, 0, 0, 0, 0, 4, 0, 0, 0]).len(), 9);
        assert_eq!(live_shards(3, &[2, 0, 1]), vec![0, 0, 2]);
    }
}
