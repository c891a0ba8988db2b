//! The extended-BPF steering program: new connections dealt round robin over a reuseport
//! group's live sockets, where the classic program (`sock::steering_program`) can only draw
//! them at random.
//!
//! Owns the `bpf(2)` calls (one array map holding a counter, one socket-filter program) and the
//! program's instructions; attaching is `SO_ATTACH_REUSEPORT_EBPF`, which takes a program of
//! type `BPF_PROG_TYPE_SOCKET_FILTER` and, like the classic one, reads its return value as an
//! index into the group. It owns no policy: which sockets are live is the caller's.
//!
//! Why round robin: a random draw (or the kernel's flow hash) places `c` connections on `n`
//! sockets as a binomial does, so 50 kept-alive connections over 4 workers land 9 on one and 16
//! on another, and those stay for the connections' lifetime. A counter deals them 13/13/12/12.
//! Loading the program needs `CAP_BPF` (or `CAP_SYS_ADMIN`) where
//! `kernel.unprivileged_bpf_disabled` is set, as it is by default: the caller falls back to the
//! classic program when `bpf(2)` refuses. No descriptor is kept: the attached program holds
//! its map, and both go when the group detaches or replaces the program.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use crate::cvt;

/// One eBPF instruction (`struct bpf_insn`): the destination register is the low nibble of
/// `regs`, the source register the high one.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | dst,
        off,
        imm,
    }
}

/// `*(u32 *)(dst + off) = imm`
pub(crate) const ST_MEM_W: u8 = 0x62;
/// `dst = imm64` over two instructions; with `src` 1 (`BPF_PSEUDO_MAP_FD`) `imm` is a map's
/// descriptor.
pub(crate) const LD_IMM64: u8 = 0x18;
pub(crate) const MOV64_X: u8 = 0xbf;
pub(crate) const MOV64_K: u8 = 0xb7;
pub(crate) const ADD64_K: u8 = 0x07;
pub(crate) const MOD64_K: u8 = 0x97;
pub(crate) const CALL: u8 = 0x85;
pub(crate) const JA: u8 = 0x05;
pub(crate) const JEQ_K: u8 = 0x15;
pub(crate) const EXIT: u8 = 0x95;
/// `BPF_STX | BPF_ATOMIC | BPF_DW` with `imm` `BPF_ADD | BPF_FETCH`: `src = fetch_add(*(u64
/// *)(dst + off), src)` (Linux 5.12+; older kernels refuse the program and the caller falls
/// back).
pub(crate) const ATOMIC64: u8 = 0xdb;
pub(crate) const ATOMIC_FETCH_ADD: i32 = 0x01;
pub(crate) const PSEUDO_MAP_FD: u8 = 1;
pub(crate) const HELPER_MAP_LOOKUP: i32 = 1;
pub(crate) const HELPER_PRANDOM: i32 = 7;

/// The instructions that deal new connections over `live` (group indices, an index repeated
/// `w` times taking `w` shares): `r1 = fetch_add(counter, 1) % live.len()` (a random number if
/// the map's lookup ever failed, which an array map's key 0 cannot), then a jump table from `r1`
/// to `live[r1]`. `map_fd` is the counter's array map. Every path returns an entry of `live`;
/// `live` must be non-empty and hold at most [`crate::sock::STEER_MAX`] entries.
pub fn dealing_program(live: &[u32], map_fd: RawFd) -> Vec<Insn> {
    assert!(!live.is_empty() && live.len() <= crate::sock::STEER_MAX);
    let n = live.len();
    if n == 1 {
        return vec![
            insn(MOV64_K, 0, 0, 0, live[0] as i32),
            insn(EXIT, 0, 0, 0, 0),
        ];
    }
    let mut p = vec![
        // key = 0, on the stack
        insn(ST_MEM_W, 10, 0, -4, 0),
        insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, map_fd),
        insn(0, 0, 0, 0, 0),
        insn(MOV64_X, 2, 10, 0, 0),
        insn(ADD64_K, 2, 0, 0, -4),
        insn(CALL, 0, 0, 0, HELPER_MAP_LOOKUP),
        // r0 is the counter's address, or null: then draw at random.
        insn(JEQ_K, 0, 0, 3, 0),
        insn(MOV64_K, 1, 0, 0, 1),
        insn(ATOMIC64, 0, 1, 0, ATOMIC_FETCH_ADD),
        insn(JA, 0, 0, 2, 0),
        insn(CALL, 0, 0, 0, HELPER_PRANDOM),
        insn(MOV64_X, 1, 0, 0, 0),
        insn(MOD64_K, 1, 0, 0, n as i32),
    ];
    if live.iter().enumerate().all(|(k, &v)| v as usize == k) {
        p.push(insn(MOV64_X, 0, 1, 0, 0));
        p.push(insn(EXIT, 0, 0, 0, 0));
        return p;
    }
    // `r0 = live[k]; if r1 == k goto exit`, two instructions an entry (the attached program
    // must fit `net.core.optmem_max`, 20480 bytes by default before Linux 6.8: 1024 entries
    // take 16.5 KB); the last entry needs no test.
    let exit = p.len() + 2 * (n - 1) + 1;
    for (k, &idx) in live.iter().enumerate().take(n - 1) {
        p.push(insn(MOV64_K, 0, 0, 0, idx as i32));
        let off = exit - (p.len() + 1);
        p.push(insn(JEQ_K, 1, 0, off as i16, k as i32));
    }
    p.push(insn(MOV64_K, 0, 0, 0, live[n - 1] as i32));
    debug_assert_eq!(p.len(), exit);
    p.push(insn(EXIT, 0, 0, 0, 0));
    p
}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
const BPF_PROG_TYPE_SOCKET_FILTER: u32 = 1;
/// `SO_ATTACH_REUSEPORT_EBPF` (include/uapi/asm-generic/socket.h).
const SO_ATTACH_REUSEPORT_EBPF: libc::c_int = 52;

/// The leading fields of `union bpf_attr` for `BPF_MAP_CREATE`, the rest zero.
#[repr(C)]
struct MapCreate {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    rest: [u32; 28],
}

/// The leading fields of `union bpf_attr` for `BPF_MAP_UPDATE_ELEM`, the rest zero.
#[repr(C)]
struct MapUpdate {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
    rest: [u32; 24],
}

/// The leading fields of `union bpf_attr` for `BPF_PROG_LOAD`, the rest zero.
#[repr(C)]
struct ProgLoad {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    rest: [u32; 22],
}

/// One `bpf(2)` call; its non-negative result.
fn bpf_call<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<libc::c_int> {
    // SAFETY: `attr` is a `bpf_attr` prefix followed by zeroes, valid for the size passed;
    // the kernel reads it, and what it points at (which outlives the call), and writes a log
    // only into a buffer the attr points at.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            size_of::<T>() as libc::c_uint,
        )
    };
    cvt(ret as libc::c_int)
}

/// A `bpf(2)` call that creates a descriptor.
fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> io::Result<OwnedFd> {
    let fd = bpf_call(cmd, attr)?;
    // SAFETY: a new descriptor the kernel just returned (close-on-exec), owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn counter_map() -> io::Result<OwnedFd> {
    let mut attr = MapCreate {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: 8,
        max_entries: 1,
        rest: [0; 28],
    };
    let map = bpf(BPF_MAP_CREATE, &mut attr)?;
    // Start the count anywhere: every replacement of the program (a stall, a recovery) starts
    // a new map, and a count from 0 each time would favour the list's first entries. Below
    // 2^62: the count then never wraps (which would repeat a turn where the list's length is
    // not a power of two).
    let key = 0u32;
    let value = crate::process::random_u64() & ((1 << 62) - 1);
    let mut up = MapUpdate {
        map_fd: map.as_raw_fd() as u32,
        _pad: 0,
        key: &key as *const u32 as u64,
        value: &value as *const u64 as u64,
        flags: 0,
        rest: [0; 24],
    };
    // A count from 0, should this fail, still deals in turn.
    let _ = bpf_call(BPF_MAP_UPDATE_ELEM, &mut up);
    Ok(map)
}

fn load(prog: &[Insn]) -> io::Result<OwnedFd> {
    load_typed(prog, BPF_PROG_TYPE_SOCKET_FILTER)
}

fn load_typed(prog: &[Insn], prog_type: u32) -> io::Result<OwnedFd> {
    // The program calls no GPL-only helper; the license string is shard's own.
    let license = c"MIT OR Apache-2.0";
    let mut attr = ProgLoad {
        prog_type,
        insn_cnt: prog.len() as u32,
        insns: prog.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 0,
        log_size: 0,
        log_buf: 0,
        rest: [0; 22],
    };
    match bpf(BPF_PROG_LOAD, &mut attr) {
        Err(e)
            if e.raw_os_error() == Some(libc::EINVAL) || e.raw_os_error() == Some(libc::EACCES) =>
        {
            // The verifier refused it: load again with its log, for the error message.
            let mut log = vec![0u8; 16 * 1024];
            attr.log_level = 1;
            attr.log_size = log.len() as u32;
            attr.log_buf = log.as_mut_ptr() as u64;
            let _ = bpf(BPF_PROG_LOAD, &mut attr);
            let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let last = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            Err(io::Error::new(
                e.kind(),
                format!("{e}; the verifier says: {last}"),
            ))
        }
        r => r,
    }
}

/// Attaches a program that deals new connections round robin over `live` (group indices) to
/// the reuseport group of listener `fd`, replacing any program it has. Fails where `bpf(2)` is
/// refused (`EPERM` without `CAP_BPF`, `EINVAL` before Linux 5.12): the caller falls back to
/// the classic program.
pub fn deal_reuseport_to(fd: RawFd, live: &[u32]) -> io::Result<()> {
    let map = counter_map()?;
    let prog = load(&dealing_program(live, map.as_raw_fd()))?;
    let pfd: libc::c_int = prog.as_raw_fd();
    // SAFETY: an int option pointing at a live descriptor; the kernel takes its own reference
    // to the program, so both descriptors may be closed when this returns.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            SO_ATTACH_REUSEPORT_EBPF,
            &pfd as *const _ as *const libc::c_void,
            size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

// --- QUIC: datagrams steered by connection ID -------------------------------------------

/// Connection IDs shard's QUIC endpoints choose are this long: the socket's key in their
/// first two bytes (big-endian), random bytes after.
pub const QUIC_CID_LEN: usize = 8;
/// Keys are below this (the socket array's size).
pub const QUIC_KEYS: u32 = 4096;

const BPF_MAP_TYPE_REUSEPORT_SOCKARRAY: u32 = 20;
const BPF_PROG_TYPE_SK_REUSEPORT: u32 = 21;
const HELPER_SKB_LOAD_BYTES: i32 = 26;
const HELPER_SK_SELECT_REUSEPORT: i32 = 82;
pub(crate) const LDX_B: u8 = 0x71;
pub(crate) const LDX_W: u8 = 0x61;
pub(crate) const STX_W: u8 = 0x63;
pub(crate) const AND64_K: u8 = 0x57;
pub(crate) const LSH64_K: u8 = 0x67;
pub(crate) const OR64_X: u8 = 0x4f;
pub(crate) const JNE_K: u8 = 0x55;
pub(crate) const JLT_K: u8 = 0xa5;
/// `struct sk_reuseport_md`'s `hash`: the kernel's hash of the datagram's addresses.
const MD_HASH: i16 = 32;

/// The program that places each datagram of a `quic` group: a packet whose destination
/// connection ID is one of shard's (a short header, or a Handshake packet) goes to the socket
/// whose key its first two bytes hold (`map` is a `REUSEPORT_SOCKARRAY` from key to socket),
/// so a client that changes address still reaches the worker holding its connection; any
/// other (an Initial or 0-RTT packet, whose ID the client chose; a key whose socket is gone)
/// goes to one of `fresh` (keys), chosen by the hash of its addresses so that a client's
/// retransmissions land together. `fresh` must hold between 1 and
/// [`crate::sock::STEER_MAX`] keys.
pub fn quic_program(fresh: &[u32], map_fd: RawFd) -> Vec<Insn> {
    assert!(!fresh.is_empty() && fresh.len() <= crate::sock::STEER_MAX);
    let mut p: Vec<Insn> = Vec::new();
    // Labels are patched once their places are known.
    let mut to_new: Vec<usize> = Vec::new();
    let mut to_pass: Vec<usize> = Vec::new();
    p.push(insn(MOV64_X, 6, 1, 0, 0));
    // The first 16 bytes of the UDP payload, onto the stack at r10-16.
    p.push(insn(MOV64_X, 1, 6, 0, 0));
    p.push(insn(MOV64_K, 2, 0, 0, 8));
    p.push(insn(MOV64_X, 3, 10, 0, 0));
    p.push(insn(ADD64_K, 3, 0, 0, -16));
    p.push(insn(MOV64_K, 4, 0, 0, 16));
    p.push(insn(CALL, 0, 0, 0, HELPER_SKB_LOAD_BYTES));
    to_new.push(p.len());
    p.push(insn(JNE_K, 0, 0, 0, 0));
    p.push(insn(LDX_B, 2, 10, -16, 0));
    p.push(insn(MOV64_X, 3, 2, 0, 0));
    p.push(insn(AND64_K, 3, 0, 0, 0x80));
    // A short header: the ID at payload offset 1.
    p.push(insn(JNE_K, 3, 0, 3, 0));
    p.push(insn(LDX_B, 4, 10, -15, 0));
    p.push(insn(LDX_B, 5, 10, -14, 0));
    let to_key = p.len();
    p.push(insn(JA, 0, 0, 0, 0));
    // A long header: only a Handshake packet (type 2) carries shard's ID, at offset 6
    // behind its length at offset 5.
    p.push(insn(MOV64_X, 3, 2, 0, 0));
    p.push(insn(AND64_K, 3, 0, 0, 0x30));
    to_new.push(p.len());
    p.push(insn(JNE_K, 3, 0, 0, 0x20));
    p.push(insn(LDX_B, 3, 10, -11, 0));
    to_new.push(p.len());
    p.push(insn(JLT_K, 3, 0, 0, 2));
    p.push(insn(LDX_B, 4, 10, -10, 0));
    p.push(insn(LDX_B, 5, 10, -9, 0));
    let key_at = p.len();
    p[to_key].off = (key_at - to_key - 1) as i16;
    p.push(insn(LSH64_K, 4, 0, 0, 8));
    p.push(insn(OR64_X, 4, 5, 0, 0));
    // Select by key; a key without a socket falls through to a fresh choice.
    push_select(&mut p, map_fd);
    to_pass.push(p.len());
    p.push(insn(JEQ_K, 0, 0, 0, 0));
    // A fresh choice: `fresh[hash % n]` by a jump table.
    let new_at = p.len();
    for at in to_new {
        p[at].off = (new_at - at - 1) as i16;
    }
    let n = fresh.len();
    p.push(insn(LDX_W, 2, 6, MD_HASH, 0));
    p.push(insn(MOD64_K, 2, 0, 0, n as i32));
    let select_at = p.len() + 2 * (n - 1) + 1;
    for (k, &key) in fresh.iter().enumerate().take(n - 1) {
        p.push(insn(MOV64_K, 4, 0, 0, key as i32));
        let off = select_at - (p.len() + 1);
        p.push(insn(JEQ_K, 2, 0, off as i16, k as i32));
    }
    p.push(insn(MOV64_K, 4, 0, 0, fresh[n - 1] as i32));
    debug_assert_eq!(p.len(), select_at);
    push_select(&mut p, map_fd);
    // SK_PASS, selected or not (without a selection the kernel's hash places it).
    let pass_at = p.len();
    for at in to_pass {
        p[at].off = (pass_at - at - 1) as i16;
    }
    p.push(insn(MOV64_K, 0, 0, 0, 1));
    p.push(insn(EXIT, 0, 0, 0, 0));
    p
}

/// `bpf_sk_select_reuseport(ctx, map, &r4, 0)`: the socket under key `r4` (through the stack
/// at r10-20; the context is in r6), `r0` 0 when one was chosen.
fn push_select(p: &mut Vec<Insn>, map_fd: RawFd) {
    p.push(insn(STX_W, 10, 4, -20, 0));
    p.push(insn(MOV64_X, 1, 6, 0, 0));
    p.push(insn(LD_IMM64, 2, PSEUDO_MAP_FD, 0, map_fd));
    p.push(insn(0, 0, 0, 0, 0));
    p.push(insn(MOV64_X, 3, 10, 0, 0));
    p.push(insn(ADD64_K, 3, 0, 0, -20));
    p.push(insn(MOV64_K, 4, 0, 0, 0));
    p.push(insn(CALL, 0, 0, 0, HELPER_SK_SELECT_REUSEPORT));
}

/// A `quic` group's steering: the socket array its program selects from. Dropping it
/// closes the map's descriptor (the attached program keeps the map).
#[derive(Debug)]
pub struct QuicSteering {
    map: OwnedFd,
}

impl QuicSteering {
    /// Creates the socket array. Fails where `bpf(2)` is refused (no `CAP_BPF`).
    pub fn new() -> io::Result<QuicSteering> {
        let mut attr = MapCreate {
            map_type: BPF_MAP_TYPE_REUSEPORT_SOCKARRAY,
            key_size: 4,
            value_size: 8,
            max_entries: QUIC_KEYS,
            rest: [0; 28],
        };
        Ok(QuicSteering {
            map: bpf(BPF_MAP_CREATE, &mut attr)?,
        })
    }

    /// The socket array a previous master handed over (a binary upgrade): its keys keep
    /// reaching the previous master's sockets while this master adds its own.
    pub fn from_map(map: OwnedFd) -> QuicSteering {
        QuicSteering { map }
    }

    /// The socket array's descriptor (to hand over to a new binary).
    pub fn map_fd(&self) -> RawFd {
        self.map.as_raw_fd()
    }

    /// Puts socket `fd` (bound, in the group) under `key`. A socket that closes leaves the
    /// array by itself.
    pub fn insert(&self, key: u32, fd: RawFd) -> io::Result<()> {
        let value = fd as u64;
        let mut up = MapUpdate {
            map_fd: self.map.as_raw_fd() as u32,
            _pad: 0,
            key: &key as *const u32 as u64,
            value: &value as *const u64 as u64,
            flags: 0,
            rest: [0; 24],
        };
        bpf_call(BPF_MAP_UPDATE_ELEM, &mut up).map(|_| ())
    }

    /// Attaches the program that sends new connections to `fresh` (keys) to the group of
    /// `fd`, replacing its program.
    pub fn attach(&self, fd: RawFd, fresh: &[u32]) -> io::Result<()> {
        let prog = load_typed(
            &quic_program(fresh, self.map.as_raw_fd()),
            BPF_PROG_TYPE_SK_REUSEPORT,
        )?;
        let pfd: libc::c_int = prog.as_raw_fd();
        // SAFETY: an int option pointing at a live descriptor; the kernel takes its own
        // reference to the program.
        cvt(unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                SO_ATTACH_REUSEPORT_EBPF,
                &pfd as *const _ as *const libc::c_void,
                size_of::<libc::c_int>() as libc::socklen_t,
            )
        })
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model of the kernel's eBPF interpreter for the instructions a dealing program uses.
    /// `counter` is the map's value (`None`: the lookup fails); `random` what the helper gives.
    fn run(prog: &[Insn], counter: Option<&mut u64>, random: u32) -> u32 {
        let mut r = [0u64; 11];
        let mut counter = counter;
        let mut found = false;
        let mut pc = 0usize;
        loop {
            let i = prog[pc];
            let (dst, src) = (usize::from(i.regs & 0xf), usize::from(i.regs >> 4));
            pc += 1;
            match i.code {
                ST_MEM_W => assert_eq!((dst, i.off, i.imm), (10, -4, 0), "the key"),
                LD_IMM64 => {
                    assert_eq!((dst, src), (1, usize::from(PSEUDO_MAP_FD)));
                    assert_eq!(prog[pc], insn(0, 0, 0, 0, 0));
                    r[1] = 0xfd;
                    pc += 1;
                }
                MOV64_X => r[dst] = r[src],
                MOV64_K => r[dst] = i.imm as i64 as u64,
                ADD64_K => r[dst] = r[dst].wrapping_add(i.imm as i64 as u64),
                MOD64_K => {
                    assert!(i.imm > 0, "the kernel rejects a modulo by zero");
                    r[dst] %= i.imm as u64;
                }
                CALL if i.imm == HELPER_MAP_LOOKUP => {
                    assert_eq!(r[1], 0xfd, "the map");
                    found = counter.is_some();
                    r[0] = u64::from(found);
                    r[1..6].fill(0xdead);
                }
                CALL if i.imm == HELPER_PRANDOM => {
                    r[0] = u64::from(random);
                    r[1..6].fill(0xdead);
                }
                ATOMIC64 => {
                    assert_eq!((i.imm, i.off), (ATOMIC_FETCH_ADD, 0));
                    assert!(found && r[dst] == 1, "only through a found counter");
                    let c = counter.as_deref_mut().unwrap();
                    let old = *c;
                    *c = c.wrapping_add(r[src]);
                    r[src] = old;
                }
                JA => pc = (pc as isize + isize::from(i.off)) as usize,
                JEQ_K if r[dst] == i.imm as i64 as u64 => {
                    pc = (pc as isize + isize::from(i.off)) as usize
                }
                JEQ_K => {}
                EXIT => return r[0] as u32,
                c => panic!("unexpected opcode {c:#x}"),
            }
            assert!(pc < prog.len(), "fell off the end of the program");
        }
    }

    fn check(live: &[u32]) {
        let prog = dealing_program(live, 7);
        // Attaching copies the program into socket option memory: within the default
        // `net.core.optmem_max` of older kernels (20480 bytes), with room for its header.
        assert!(prog.len() * 8 + 512 <= 20480, "{}", prog.len());
        let n = live.len();
        // Consecutive connections take consecutive entries of `live`, wrapping around, from
        // any starting count (it starts below 2^62, so it never wraps).
        for start in [0u64, 5, u64::MAX - 2 * n as u64] {
            let mut c = start;
            for i in 0..2 * n as u64 {
                let out = run(&prog, Some(&mut c), 0);
                let want = live[((start + i) % n as u64) as usize];
                assert_eq!(out, want, "{live:?}: connection {i} from {start}");
            }
            // A single socket needs no counter.
            assert_eq!(c, if n == 1 { start } else { start + 2 * n as u64 });
        }
        // Without the counter, the random number chooses, still among `live`.
        for r in [0, 1, u32::MAX, 0x8000_0000] {
            assert_eq!(
                run(&prog, None, r),
                live[r as usize % n],
                "{live:?}: random {r}"
            );
        }
    }

    #[test]
    fn every_live_set_of_up_to_64_shards_is_dealt_in_turn() {
        crate::sock::tests::each_live_set(10, 2_000, check);
        // Weighted: an index repeated takes that many turns.
        check(&[0, 0, 0, 1, 2, 2]);
    }

    fn kernel_before_5_12() -> bool {
        let rel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut it = rel
            .trim()
            .split(['.', '-'])
            .map(|x| x.parse::<u32>().unwrap_or(0));
        let (major, minor) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
        (major, minor) < (5, 12)
    }

    /// An IPv4 socket of `ty` with `SO_REUSEPORT`, bound to loopback `port` (0: any).
    fn reuseport_bound(ty: libc::c_int, port: u16) -> RawFd {
        // SAFETY: plain socket calls on a descriptor created here.
        unsafe {
            let fd = libc::socket(libc::AF_INET, ty | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0);
            let one: libc::c_int = 1;
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEPORT,
                &one as *const _ as *const libc::c_void,
                4,
            );
            let mut sa: libc::sockaddr_in = std::mem::zeroed();
            sa.sin_family = libc::AF_INET as u16;
            sa.sin_port = port.to_be();
            sa.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::LOCALHOST).to_be();
            let r = libc::bind(fd, &sa as *const _ as *const libc::sockaddr, 16);
            assert_eq!(r, 0, "{}", io::Error::last_os_error());
            fd
        }
    }

    /// Sends `pkt` from `client` to `port`; the index of the socket of `socks` it reached.
    fn placed(
        client: &std::net::UdpSocket,
        port: u16,
        socks: &[&std::net::UdpSocket],
        pkt: &[u8],
    ) -> usize {
        client.send_to(pkt, ("127.0.0.1", port)).unwrap();
        let mut buf = [0u8; 256];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            for (k, l) in socks.iter().enumerate() {
                l.set_nonblocking(true).unwrap();
                if l.recv_from(&mut buf).is_ok() {
                    return k;
                }
            }
            assert!(std::time::Instant::now() < deadline, "no socket got it");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The real kernel: datagrams of a `quic` group placed by the key in their connection ID,
    /// the rest by the fresh keys. Needs `CAP_BPF`; says SKIPPED where `bpf(2)` is refused.
    #[test]
    fn the_kernel_steers_quic_datagrams_by_connection_id() {
        use std::net::UdpSocket;
        // SAFETY: a descriptor `reuseport_bound` just made, owned by nobody else.
        let sock =
            |port: u16| unsafe { UdpSocket::from_raw_fd(reuseport_bound(libc::SOCK_DGRAM, port)) };
        let first = sock(0);
        let port = first.local_addr().unwrap().port();
        let ls = [first, sock(port), sock(port)];
        let steering = match QuicSteering::new() {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                eprintln!("SKIPPED: bpf(2) refused here ({e}); QUIC keeps the kernel's hash");
                return;
            }
            r => r.unwrap(),
        };
        for (k, key) in [(0, 7u32), (1, 9), (2, 0x0102)] {
            steering.insert(key, ls[k].as_raw_fd()).unwrap();
        }
        steering.attach(ls[0].as_raw_fd(), &[7]).unwrap();
        let short = |key: u16| -> Vec<u8> {
            let mut p = vec![0x40u8];
            p.extend_from_slice(&key.to_be_bytes());
            p.extend_from_slice(&[0xee; 30]);
            p
        };
        let long = |ty: u8, key: u16| -> Vec<u8> {
            let mut p = vec![0xc0u8 | (ty << 4), 0, 0, 0, 1, 8];
            p.extend_from_slice(&key.to_be_bytes());
            p.extend_from_slice(&[0xdd; 40]);
            p
        };
        let client = UdpSocket::bind("127.0.0.1:0").unwrap();
        let place = |pkt: &[u8]| placed(&client, port, &ls.iter().collect::<Vec<_>>(), pkt);
        assert_eq!(place(&short(9)), 1);
        assert_eq!(place(&short(0x0102)), 2);
        assert_eq!(place(&short(7)), 0);
        // A Handshake packet carries shard's ID; an Initial the client's: a fresh choice.
        assert_eq!(place(&long(2, 0x0102)), 2);
        assert_eq!(place(&long(0, 0x0102)), 0);
        // A key without a socket, and a datagram too short to hold an ID: fresh.
        assert_eq!(place(&short(5)), 0);
        assert_eq!(place(&[0x40, 0]), 0);
        // Fresh choices over two keys, by the hash of the addresses: one client, one place.
        steering.attach(ls[1].as_raw_fd(), &[9, 0x0102]).unwrap();
        let a = place(&long(0, 0));
        for _ in 0..5 {
            assert_eq!(place(&long(0, 0)), a);
        }
        assert!(a == 1 || a == 2);
        // A socket that joins later (a new generation): the old keys still reach theirs.
        let late = sock(port);
        steering.insert(0x0200, late.as_raw_fd()).unwrap();
        steering.attach(late.as_raw_fd(), &[0x0200]).unwrap();
        let ls2 = [&ls[0], &ls[1], &ls[2], &late];
        let place2 = |pkt: &[u8]| placed(&client, port, &ls2, pkt);
        assert_eq!(place2(&short(9)), 1);
        assert_eq!(place2(&short(7)), 0);
        assert_eq!(place2(&long(0, 0)), 3);
        assert_eq!(place2(&short(0x0200)), 3);
    }

    /// The real kernel: three listeners of one group, 30 connections, 10 each. Needs
    /// `CAP_BPF`; says SKIPPED where `bpf(2)` is refused.
    #[test]
    fn the_kernel_deals_connections_in_turn() {
        use std::net::{TcpListener, TcpStream};
        let sock = |port: u16| {
            let fd = reuseport_bound(libc::SOCK_STREAM, port);
            // SAFETY: listen(2) on the descriptor just made; then owned by the listener.
            unsafe {
                assert_eq!(libc::listen(fd, 64), 0);
                TcpListener::from_raw_fd(fd)
            }
        };
        if kernel_before_5_12() {
            eprintln!("SKIPPED: no BPF_ATOMIC fetch before Linux 5.12: shard falls back to cBPF");
            return;
        }
        let first = sock(0);
        let port = first.local_addr().unwrap().port();
        let ls = [first, sock(port), sock(port)];
        match deal_reuseport_to(ls[0].as_raw_fd(), &[0, 1, 2]) {
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                eprintln!("SKIPPED: bpf(2) refused here ({e}); shard falls back to cBPF");
                return;
            }
            r => r.unwrap(),
        }
        let deal = || {
            let _conns: Vec<TcpStream> = (0..30)
                .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
                .collect();
            let mut got = [0usize; 3];
            for (k, l) in ls.iter().enumerate() {
                l.set_nonblocking(true).unwrap();
                while l.accept().is_ok() {
                    got[k] += 1;
                }
            }
            got
        };
        assert_eq!(deal(), [10, 10, 10]);
        // The jump table, weighted, replacing the first program through another member.
        deal_reuseport_to(ls[1].as_raw_fd(), &[2, 0, 2]).unwrap();
        assert_eq!(deal(), [10, 0, 20]);
        // The verifier takes the longest table.
        let most: Vec<u32> = (0..crate::sock::STEER_MAX as u32)
            .map(|k| k % 3)
            .rev()
            .collect();
        deal_reuseport_to(ls[2].as_raw_fd(), &most).unwrap();
        assert_eq!(deal().iter().sum::<usize>(), 30);
    }
}
