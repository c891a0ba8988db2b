//! Peer choice for upstream groups: nginx's smooth weighted round robin and its failure
//! accounting (`max_fails`, `fail_timeout`, `backup`, `down`), as pure functions over a
//! per-worker [`PeerState`] table and a clock passed in.
//!
//! Shared by the stream relay and the HTTP proxy. The rules are those of nginx's
//! `ngx_http_upstream_round_robin.c` (the stream module's copy is the same):
//! - a failure counts against the peer, stamps it `accessed` and `checked`, and lowers its
//!   effective weight by `weight / max_fails`; at `max_fails` failures the peer is skipped while
//!   less than `fail_timeout` has passed since it was last `checked`;
//! - a success clears the failures **only** when the peer was checked after its last failure,
//!   i.e. when it was picked again once `fail_timeout` had passed. A success in between does not
//!   forgive earlier failures, so a peer failing every third request still trips `max_fails`;
//! - a peer picked when more than `fail_timeout` passed since its last check is checked now;
//! - a lone peer is always used and has no accounting; when every peer (primaries, then
//!   backups) is skipped, all failure counts are cleared "for quick recovery" and the request
//!   gets no peer.
//!
//! It owns no I/O and no configuration parsing.

use shard_config::PeerConf;

/// One peer's round-robin weights and failure accounting in this worker.
#[derive(Clone, Debug)]
pub(super) struct PeerState {
    current_weight: i64,
    /// Starts at `weight`, drops on failures, climbs back by one per pick.
    effective_weight: i64,
    pub(super) fails: u32,
    /// When the last failure happened.
    accessed_ms: u64,
    /// When the peer was last (re)admitted: at a failure, or at a pick after `fail_timeout`.
    checked_ms: u64,
}

impl PeerState {
    pub(super) fn new(p: &PeerConf) -> PeerState {
        PeerState {
            current_weight: 0,
            effective_weight: p.weight as i64,
            fails: 0,
            accessed_ms: 0,
            checked_ms: 0,
        }
    }

    /// One table per upstream group.
    pub(super) fn table(peers: &[PeerConf]) -> Vec<PeerState> {
        peers.iter().map(PeerState::new).collect()
    }
}

fn usable(p: &PeerConf, st: &PeerState, now_ms: u64) -> bool {
    !(p.max_fails > 0
        && st.fails >= p.max_fails
        && now_ms.saturating_sub(st.checked_ms) <= p.fail_timeout_ms)
}

/// Picks a peer among those not in `tried`: primaries first, then backups. `None` when no
/// peer can be used (then every failure count was cleared, as nginx does).
pub(super) fn pick(
    peers: &[PeerConf],
    state: &mut [PeerState],
    tried: &[bool],
    now_ms: u64,
) -> Option<usize> {
    debug_assert_eq!(peers.len(), state.len());
    if is_single(peers) {
        // nginx's `peers->single`: always the one peer, unless it is down; no accounting.
        let untried = !tried.first().copied().unwrap_or(true);
        return (!peers[0].down && untried).then_some(0);
    }
    for backup in [false, true] {
        let mut total = 0i64;
        let mut best: Option<usize> = None;
        for (i, p) in peers.iter().enumerate() {
            if p.backup != backup || p.down || tried.get(i).copied().unwrap_or(true) {
                continue;
            }
            let st = &mut state[i];
            if !usable(p, st, now_ms) {
                continue;
            }
            st.current_weight += st.effective_weight;
            total += st.effective_weight;
            if st.effective_weight < p.weight as i64 {
                st.effective_weight += 1;
            }
            let cur = st.current_weight;
            if best.is_none_or(|b| cur > state[b].current_weight) {
                best = Some(i);
            }
        }
        if let Some(b) = best {
            let st = &mut state[b];
            st.current_weight -= total;
            if now_ms.saturating_sub(st.checked_ms) > peers[b].fail_timeout_ms {
                st.checked_ms = now_ms;
            }
            return Some(b);
        }
    }
    // Every peer failed: mark them live again for quick recovery.
    for st in state.iter_mut() {
        st.fails = 0;
    }
    None
}

/// Counts a failed attempt on `peer`. Returns true when it just reached `max_fails` (nginx
/// logs "upstream server temporarily disabled").
pub(super) fn failed(
    peers: &[PeerConf],
    state: &mut [PeerState],
    peer: usize,
    now_ms: u64,
) -> bool {
    if is_single(peers) {
        return false;
    }
    let p = &peers[peer];
    let st = &mut state[peer];
    st.fails += 1;
    st.accessed_ms = now_ms;
    st.checked_ms = now_ms;
    let mut disabled = false;
    if let Some(share) = p.weight.checked_div(p.max_fails) {
        st.effective_weight -= share as i64;
        disabled = st.fails >= p.max_fails;
    }
    if st.effective_weight < 0 {
        st.effective_weight = 0;
    }
    disabled
}

/// Counts a successful attempt on `peer`: the failures are forgiven only when the peer was
/// checked after its last failure.
pub(super) fn succeeded(state: &mut [PeerState], peer: usize) {
    let st = &mut state[peer];
    if st.accessed_ms < st.checked_ms {
        st.fails = 0;
    }
}

/// nginx's `peers->single`: one peer and no backup.
fn is_single(peers: &[PeerConf]) -> bool {
    peers.len() == 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(weight: u32, max_fails: u32, fail_timeout_ms: u64) -> PeerConf {
        PeerConf {
            addr: "127.0.0.1:1".parse().unwrap(),
            name: String::new(),
            weight,
            max_fails,
            fail_timeout_ms,
            backup: false,
            down: false,
        }
    }

    /// Runs `n` requests, one per millisecond from `start_ms`, each on the first peer picked;
    /// `fails(peer, request)` says whether that attempt fails (then the next peer is tried, as
    /// `proxy_next_upstream error` does). Returns how many attempts each peer served
    /// successfully.
    fn run(
        peers: &[PeerConf],
        n: usize,
        step_ms: u64,
        mut fails: impl FnMut(usize, usize) -> bool,
    ) -> Vec<usize> {
        let mut st = PeerState::table(peers);
        let mut served = vec![0; peers.len()];
        let mut attempts = vec![0; peers.len()];
        for r in 0..n {
            let now = 1_000_000 + r as u64 * step_ms;
            let mut tried = vec![false; peers.len()];
            while let Some(p) = pick(peers, &mut st, &tried, now) {
                tried[p] = true;
                attempts[p] += 1;
                if fails(p, attempts[p]) {
                    failed(peers, &mut st, p, now);
                    continue;
                }
                succeeded(&mut st, p);
                served[p] += 1;
                break;
            }
        }
        served
    }

    #[test]
    fn smooth_weighted_round_robin_interleaves() {
        let peers = [peer(5, 1, 10_000), peer(1, 1, 10_000), peer(1, 1, 10_000)];
        let mut st = PeerState::table(&peers);
        let order: Vec<usize> = (0..7)
            .map(|_| pick(&peers, &mut st, &[false; 3], 0).unwrap())
            .collect();
        // nginx's documented sequence for weights 5, 1, 1: a a b a c a a.
        assert_eq!(order, [0, 0, 1, 0, 2, 0, 0]);
    }

    #[test]
    fn a_success_between_failures_does_not_reset_max_fails() {
        // A fails every third attempt, B never; max_fails=2 within 10 s. With a success
        // clearing the count A would never trip and would keep half of the traffic.
        let peers = [peer(1, 2, 10_000), peer(1, 2, 10_000)];
        let served = run(&peers, 30, 1, |p, attempt| p == 0 && attempt % 3 == 0);
        assert!(
            served[0] < 10,
            "A served {served:?}: max_fails never tripped"
        );
        assert_eq!(served[0] + served[1], 30);
    }

    #[test]
    fn a_disabled_peer_comes_back_after_fail_timeout_and_is_forgiven_on_success() {
        let peers = [peer(1, 1, 100), peer(1, 1, 100)];
        let mut st = PeerState::table(&peers);
        assert_eq!(pick(&peers, &mut st, &[false; 2], 1000), Some(0));
        assert!(failed(&peers, &mut st, 0, 1000));
        // Within fail_timeout: only B.
        for t in [1001, 1050, 1100] {
            assert_eq!(pick(&peers, &mut st, &[false; 2], t), Some(1));
        }
        // After it, A is checked again; a success then clears its failures.
        let mut got_a = false;
        for t in 1101..1110 {
            if pick(&peers, &mut st, &[false; 2], t) == Some(0) {
                succeeded(&mut st, 0);
                got_a = true;
                break;
            }
        }
        assert!(got_a);
        assert_eq!(st[0].fails, 0);
    }

    #[test]
    fn backups_only_when_no_primary_is_left_and_all_failed_clears_counts() {
        let mut peers = [peer(1, 1, 10_000), peer(1, 1, 10_000)];
        peers[1].backup = true;
        let mut st = PeerState::table(&peers);
        assert_eq!(pick(&peers, &mut st, &[false; 2], 5), Some(0));
        failed(&peers, &mut st, 0, 5);
        assert_eq!(pick(&peers, &mut st, &[false; 2], 6), Some(1));
        failed(&peers, &mut st, 1, 6);
        assert_eq!(pick(&peers, &mut st, &[false; 2], 7), None);
        assert!(st.iter().all(|s| s.fails == 0));
        assert_eq!(pick(&peers, &mut st, &[false; 2], 8), Some(0));
    }

    #[test]
    fn down_peers_and_tried_peers_are_skipped() {
        let mut peers = [peer(1, 1, 10_000), peer(1, 1, 10_000), peer(1, 1, 10_000)];
        peers[0].down = true;
        let mut st = PeerState::table(&peers);
        assert_eq!(pick(&peers, &mut st, &[false, true, false], 0), Some(2));
        assert_eq!(pick(&peers, &mut st, &[false, true, true], 0), None);
    }

    #[test]
    fn a_single_peer_is_always_used_without_accounting() {
        let peers = [peer(1, 1, 10_000)];
        let mut st = PeerState::table(&peers);
        for t in 0..5 {
            assert_eq!(pick(&peers, &mut st, &[false], t), Some(0));
            assert!(!failed(&peers, &mut st, 0, t));
        }
        assert_eq!(pick(&peers, &mut st, &[true], 9), None);
        let mut down = peers.clone();
        down[0].down = true;
        assert_eq!(pick(&down, &mut st, &[false], 9), None);
    }

    #[test]
    fn failures_lower_the_effective_weight_and_picks_restore_it() {
        let peers = [peer(4, 2, 10_000), peer(4, 2, 10_000)];
        let mut st = PeerState::table(&peers);
        failed(&peers, &mut st, 0, 1);
        assert_eq!(st[0].effective_weight, 2);
        pick(&peers, &mut st, &[false; 2], 2);
        assert_eq!(st[0].effective_weight, 3);
    }
}
