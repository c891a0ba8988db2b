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
//!   backups) is skipped, the request gets no peer (nginx's "no live upstreams"), and the
//!   counts stay: since nginx 1.11.5 no "quick recovery" clears them.
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

/// `tried` with every peer at its `max_conns` (given this worker's `active` connections per
/// peer) marked too, so that no balancer picks it; `None` when no peer has a limit.
pub(super) fn with_full(peers: &[PeerConf], tried: &[bool], active: &[u64]) -> Option<Vec<bool>> {
    if peers.iter().all(|p| p.max_conns == 0) {
        return None;
    }
    Some(
        peers
            .iter()
            .enumerate()
            .map(|(i, p)| {
                tried.get(i).copied().unwrap_or(true)
                    || (p.max_conns > 0
                        && active.get(i).copied().unwrap_or(0) >= u64::from(p.max_conns))
            })
            .collect(),
    )
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
    // Every peer skipped: none, until `fail_timeout` brings one back (nginx 1.11.5 dropped
    // its "quick recovery" that cleared every count here).
    None
}

/// `random [two]`: a usable peer drawn by weight (primaries, then backups), or with `two`
/// two draws of which the one with fewer `active` connections (relative to weight) wins.
/// `rng` is the worker's xorshift state.
pub(super) fn pick_random(
    peers: &[PeerConf],
    state: &mut [PeerState],
    tried: &[bool],
    active: &[u64],
    two: bool,
    rng: &mut u64,
    now_ms: u64,
) -> Option<usize> {
    let mut next = || {
        *rng ^= *rng << 13;
        *rng ^= *rng >> 7;
        *rng ^= *rng << 17;
        *rng
    };
    for backup in [false, true] {
        let usable: Vec<usize> = (0..peers.len())
            .filter(|&i| {
                let p = &peers[i];
                p.backup == backup
                    && !p.down
                    && !tried.get(i).copied().unwrap_or(true)
                    && usable(p, &state[i], now_ms)
            })
            .collect();
        let total: u64 = usable.iter().map(|&i| u64::from(peers[i].weight)).sum();
        if total == 0 {
            continue;
        }
        let mut draw = || {
            let mut x = next() % total;
            for &i in &usable {
                let w = u64::from(peers[i].weight);
                if x < w {
                    return i;
                }
                x -= w;
            }
            usable[usable.len() - 1]
        };
        let mut pick = draw();
        if two && usable.len() > 1 {
            let mut other = draw();
            for _ in 0..20 {
                if other != pick {
                    break;
                }
                other = draw();
            }
            let load = |i: usize| {
                u128::from(active.get(i).copied().unwrap_or(0)) * 1_000_000
                    / u128::from(peers[i].weight.max(1))
            };
            if load(other) < load(pick) {
                pick = other;
            }
        }
        let st = &mut state[pick];
        if now_ms.saturating_sub(st.checked_ms) > peers[pick].fail_timeout_ms {
            st.checked_ms = now_ms;
        }
        return Some(pick);
    }
    // As `pick`: no quick recovery.
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
            unix: None,
            addr: "127.0.0.1:1".parse().unwrap(),
            name: String::new(),
            weight,
            max_fails,
            fail_timeout_ms,
            max_conns: 0,
            backup: false,
            down: false,
            resolve: None,
        }
    }

    #[test]
    fn random_draws_by_weight_and_two_takes_the_less_busy() {
        let peers = vec![peer(3, 1, 10_000), peer(1, 1, 10_000)];
        let mut st = PeerState::table(&peers);
        let mut rng = 0x1234_5678_9abc_def1;
        let mut counts = [0u32; 2];
        for _ in 0..4000 {
            let i = pick_random(&peers, &mut st, &[false, false], &[], false, &mut rng, 0).unwrap();
            counts[i] += 1;
        }
        assert!(
            (2700..3300).contains(&counts[0]),
            "weight 3 of 4: {counts:?}"
        );
        // `two`: of two draws, the one with fewer active connections (always the second
        // peer here, whenever both are drawn).
        let mut second = 0;
        for _ in 0..2000 {
            let i = pick_random(
                &peers,
                &mut st,
                &[false, false],
                &[10, 0],
                true,
                &mut rng,
                0,
            )
            .unwrap();
            second += usize::from(i == 1);
        }
        assert!(second > 600, "{second}");
        assert_eq!(
            pick_random(&peers, &mut st, &[true, false], &[], false, &mut rng, 0),
            Some(1)
        );
        assert_eq!(
            pick_random(&peers, &mut st, &[true, true], &[], true, &mut rng, 0),
            None
        );
    }

    #[test]
    fn peers_at_max_conns_are_not_picked() {
        let mut peers = vec![peer(1, 1, 10_000), peer(1, 1, 10_000)];
        peers[0].max_conns = 2;
        let tried = [false, false];
        let full = with_full(&peers, &tried, &[2, 5]).unwrap();
        assert_eq!(full, [true, false], "the second has no limit");
        let mut st = PeerState::table(&peers);
        for _ in 0..4 {
            assert_eq!(pick(&peers, &mut st, &full, 0), Some(1));
        }
        assert_eq!(with_full(&peers, &tried, &[1, 5]).unwrap(), [false, false]);
        peers[0].max_conns = 0;
        assert_eq!(with_full(&peers, &tried, &[9, 9]), None);
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
    fn backups_only_when_no_primary_is_left_and_all_failed_wait_for_fail_timeout() {
        let mut peers = [peer(1, 1, 10_000), peer(1, 1, 10_000)];
        peers[1].backup = true;
        let mut st = PeerState::table(&peers);
        assert_eq!(pick(&peers, &mut st, &[false; 2], 5), Some(0));
        failed(&peers, &mut st, 0, 5);
        assert_eq!(pick(&peers, &mut st, &[false; 2], 6), Some(1));
        failed(&peers, &mut st, 1, 6);
        // No live peer, and no "quick recovery" (nginx 1.11.5+): still none a moment later,
        // the first back once its `fail_timeout` has passed.
        assert_eq!(pick(&peers, &mut st, &[false; 2], 7), None);
        assert_eq!(pick(&peers, &mut st, &[false; 2], 8), None);
        assert_eq!(pick(&peers, &mut st, &[false; 2], 10_006), Some(0));
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

/// `least_conn`: the round robin among the usable peers with the fewest `active`
/// connections relative to their weight (primaries first, then backups), as nginx.
pub(super) fn pick_least_conn(
    peers: &[PeerConf],
    state: &mut [PeerState],
    tried: &[bool],
    active: &[u64],
    now_ms: u64,
) -> Option<usize> {
    if is_single(peers) {
        return pick(peers, state, tried, now_ms);
    }
    for backup in [false, true] {
        let mut best: Option<usize> = None;
        for (i, p) in peers.iter().enumerate() {
            if p.backup != backup || !takes(peers, state, tried, i, now_ms) {
                continue;
            }
            let better = best.is_none_or(|b| {
                u128::from(active[i]) * u128::from(peers[b].weight)
                    < u128::from(active[b]) * u128::from(p.weight)
            });
            if better {
                best = Some(i);
            }
        }
        if let Some(b) = best {
            // Round robin among the peers as good as the best.
            let mask: Vec<bool> = (0..peers.len())
                .map(|i| {
                    tried.get(i).copied().unwrap_or(true)
                        || peers[i].backup != backup
                        || u128::from(active[i]) * u128::from(peers[b].weight)
                            != u128::from(active[b]) * u128::from(peers[i].weight)
                })
                .collect();
            if let Some(i) = pick(peers, state, &mask, now_ms) {
                return Some(i);
            }
        }
    }
    pick(peers, state, tried, now_ms)
}

/// The peer a weighted draw `w` (below the total weight) lands on, in order.
fn by_weight(peers: &[PeerConf], mut w: u64) -> usize {
    for (i, p) in peers.iter().enumerate() {
        if w < u64::from(p.weight) {
            return i;
        }
        w -= u64::from(p.weight);
    }
    peers.len() - 1
}

/// How many times a hash is drawn again before round robin takes over (nginx's 20).
const HASH_TRIES: u32 = 20;

/// Whether peer `i` can take the request: not tried (out of range counts as tried), not
/// down, not failed.
fn takes(peers: &[PeerConf], state: &[PeerState], tried: &[bool], i: usize, now_ms: u64) -> bool {
    !tried.get(i).copied().unwrap_or(true) && !peers[i].down && usable(&peers[i], &state[i], now_ms)
}

/// `ip_hash`: nginx's hash of the client's IPv4 /24 (the first three bytes) or IPv6
/// address, redrawn while it lands on an unusable peer, then round robin.
pub(super) fn pick_ip_hash(
    peers: &[PeerConf],
    state: &mut [PeerState],
    tried: &[bool],
    addr: Option<std::net::IpAddr>,
    now_ms: u64,
) -> Option<usize> {
    let bytes: Vec<u8> = match addr {
        Some(std::net::IpAddr::V4(v4)) => v4.octets()[..3].to_vec(),
        Some(std::net::IpAddr::V6(v6)) => match v6.to_ipv4_mapped() {
            Some(v4) => v4.octets()[..3].to_vec(),
            None => v6.octets().to_vec(),
        },
        // A client without an IP address (a Unix-domain socket): nginx's pseudo address of
        // three zero bytes, so such clients all hash alike.
        None => vec![0, 0, 0],
    };
    let mut hash: u64 = 89;
    draw(peers, state, tried, now_ms, || {
        for &b in &bytes {
            hash = (hash * 113 + u64::from(b)) % 6271;
        }
        hash
    })
}

/// nginx's hash balancers' loop: up to [`HASH_TRIES`] draws (`next` gives each, before the
/// modulo of the total weight) until one lands on a peer that can take the request, then
/// round robin.
fn draw(
    peers: &[PeerConf],
    state: &mut [PeerState],
    tried: &[bool],
    now_ms: u64,
    mut next: impl FnMut() -> u64,
) -> Option<usize> {
    let total: u64 = peers.iter().map(|p| u64::from(p.weight)).sum();
    if total == 0 || is_single(peers) {
        return pick(peers, state, tried, now_ms);
    }
    for _ in 0..HASH_TRIES {
        let i = by_weight(peers, next() % total);
        if takes(peers, state, tried, i, now_ms) {
            return Some(i);
        }
    }
    pick(peers, state, tried, now_ms)
}

/// `hash KEY`: nginx's CRC32 draw over the weights, redrawn (with the attempt number mixed
/// in) while it lands on an unusable peer, then round robin.
pub(super) fn pick_hash(
    peers: &[PeerConf],
    state: &mut [PeerState],
    tried: &[bool],
    key: &[u8],
    now_ms: u64,
) -> Option<usize> {
    let mut acc: u64 = 0;
    let mut rehash = 0u32;
    draw(peers, state, tried, now_ms, || {
        let n = rehash.to_string();
        let h = if rehash > 0 {
            shard_http::gzip::crc32(&[n.as_bytes(), key])
        } else {
            shard_http::gzip::crc32(&[key])
        };
        rehash += 1;
        acc += u64::from((h >> 16) & 0x7fff);
        acc
    })
}

/// The points of a consistent-hash ring: 160 per unit of weight for each peer, by the CRC32
/// of its name and the point's number; sorted.
pub(super) fn ring(peers: &[PeerConf]) -> Vec<(u32, usize)> {
    let mut pts = Vec::new();
    for (i, p) in peers.iter().enumerate() {
        for j in 0..160 * p.weight {
            let n = j.to_string();
            pts.push((
                shard_http::gzip::crc32(&[p.name.as_bytes(), b"-", n.as_bytes()]),
                i,
            ));
        }
    }
    pts.sort_unstable();
    pts
}

/// `hash KEY consistent`: the first point of `ring` at or after the key's CRC32 whose peer
/// can take the request; adding or removing a peer moves only its share of keys.
pub(super) fn pick_consistent(
    peers: &[PeerConf],
    state: &mut [PeerState],
    tried: &[bool],
    ring: &[(u32, usize)],
    key: &[u8],
    now_ms: u64,
) -> Option<usize> {
    if ring.is_empty() || is_single(peers) {
        return pick(peers, state, tried, now_ms);
    }
    let h = shard_http::gzip::crc32(&[key]);
    let start = ring.partition_point(|&(p, _)| p < h);
    for k in 0..ring.len() {
        let (_, i) = ring[(start + k) % ring.len()];
        if takes(peers, state, tried, i, now_ms) {
            return Some(i);
        }
    }
    pick(peers, state, tried, now_ms)
}

#[cfg(test)]
mod method_tests {
    use super::*;

    fn peers(n: usize) -> Vec<PeerConf> {
        (0..n)
            .map(|i| PeerConf {
                unix: None,
                addr: format!("127.0.0.1:{}", 1000 + i).parse().unwrap(),
                name: format!("127.0.0.1:{}", 1000 + i),
                weight: 1,
                max_fails: 1,
                fail_timeout_ms: 10_000,
                max_conns: 0,
                backup: false,
                down: false,
                resolve: None,
            })
            .collect()
    }

    #[test]
    fn least_conn_prefers_the_idlest_and_rotates_among_equals() {
        let p = peers(3);
        let mut st = PeerState::table(&p);
        let tried = [false; 3];
        assert_eq!(pick_least_conn(&p, &mut st, &tried, &[2, 0, 1], 1), Some(1));
        let picks: Vec<_> = (0..4)
            .map(|_| pick_least_conn(&p, &mut st, &tried, &[1, 1, 1], 1).unwrap())
            .collect();
        let mut seen = picks.clone();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), 3, "equals share: {picks:?}");
        // Weight counts: 2 active on weight 3 beats 1 active on weight 1.
        let mut w = peers(2);
        w[0].weight = 3;
        let mut st = PeerState::table(&w);
        assert_eq!(
            pick_least_conn(&w, &mut st, &[false; 2], &[2, 1], 1),
            Some(0)
        );
    }

    #[test]
    fn hashes_are_stable_spread_and_skip_down_peers() {
        let mut p = peers(4);
        let mut st = PeerState::table(&p);
        let tried = [false; 4];
        let mut counts = [0; 4];
        for k in 0..400 {
            let key = format!("user-{k}");
            let a = pick_hash(&p, &mut st, &tried, key.as_bytes(), 1).unwrap();
            let b = pick_hash(&p, &mut st, &tried, key.as_bytes(), 1).unwrap();
            assert_eq!(a, b, "the same key, the same peer");
            counts[a] += 1;
        }
        assert!(counts.iter().all(|&c| c > 50), "{counts:?}");
        // Consistent: removing a peer moves only that peer's keys.
        let r4 = ring(&p);
        let before: Vec<usize> = (0..400)
            .map(|k| {
                pick_consistent(&p, &mut st, &tried, &r4, format!("k{k}").as_bytes(), 1).unwrap()
            })
            .collect();
        p[2].down = true;
        let after: Vec<usize> = (0..400)
            .map(|k| {
                pick_consistent(&p, &mut st, &tried, &r4, format!("k{k}").as_bytes(), 1).unwrap()
            })
            .collect();
        for (b, a) in before.iter().zip(&after) {
            if *b != 2 {
                assert_eq!(a, b, "a key of a live peer does not move");
            } else {
                assert_ne!(*a, 2);
            }
        }
        // ip_hash: one /24, one peer.
        let ip = |s: &str| Some(s.parse().unwrap());
        let a = pick_ip_hash(&p, &mut st, &tried, ip("192.0.2.1"), 1);
        let b = pick_ip_hash(&p, &mut st, &tried, ip("192.0.2.200"), 1);
        assert_eq!(a, b);
        // Clients without an address (Unix-domain sockets) hash as 0.0.0: one peer for all.
        let unix: Vec<_> = (0..6)
            .map(|_| pick_ip_hash(&p, &mut st, &tried, None, 1))
            .collect();
        assert!(unix.iter().all(|u| *u == unix[0]), "{unix:?}");
        assert_eq!(unix[0], pick_ip_hash(&p, &mut st, &tried, ip("0.0.0.1"), 1));
    }
}
