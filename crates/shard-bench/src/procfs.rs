//! What the bench reads from the kernel about the servers: CPU ticks, resident memory, and
//! system-call counts through `strace -c`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// Idle-connection runs need more descriptors than the usual soft limit.
pub fn raise_nofile_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `r` is a valid rlimit for getrlimit/setrlimit to read and write.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) == 0 {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &r);
        }
    }
}

/// Runs `pid` (0: this process; its children inherit it) on `cpus` only.
pub fn pin(pid: i32, cpus: &[usize]) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET writes within it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: set is a valid cpu_set_t.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: set is valid for reads of its size.
    let rc = unsafe { libc::sched_setaffinity(pid, std::mem::size_of_val(&set), &set) };
    anyhow::ensure!(
        rc == 0,
        "sched_setaffinity({pid}): {}",
        std::io::Error::last_os_error()
    );
    Ok(())
}

pub fn ticks_per_sec() -> f64 {
    // SAFETY: sysconf has no memory effects.
    (unsafe { libc::sysconf(libc::_SC_CLK_TCK) }) as f64
}

/// utime + stime of `pids`, in clock ticks.
pub fn cpu_ticks(pids: &[i32]) -> Result<u64> {
    let mut sum = 0;
    for p in pids {
        let s = std::fs::read_to_string(format!("/proc/{p}/stat"))?;
        let after = s.rsplit(')').next().context("bad stat")?;
        let f: Vec<&str> = after.split_whitespace().collect();
        // Fields 14 and 15 of stat(5); `after` starts at field 3.
        sum += f[11].parse::<u64>()? + f[12].parse::<u64>()?;
    }
    Ok(sum)
}

/// Resident memory of `pids`, in bytes.
pub fn rss_bytes(pids: &[i32]) -> Result<u64> {
    let mut sum = 0;
    for p in pids {
        let s = std::fs::read_to_string(format!("/proc/{p}/status"))?;
        let kb: u64 = s
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS")?;
        sum += kb * 1024;
    }
    Ok(sum)
}

fn traced(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("TracerPid:"))
            .is_some_and(|v| v.trim() != "0")
    })
}

/// `strace -c -f` attached to running processes.
pub struct Strace {
    child: Child,
    out: PathBuf,
}

impl Strace {
    /// Attaches and returns once every process is traced.
    pub fn attach(bin: &Path, pids: &[i32]) -> Result<Strace> {
        let out = std::env::temp_dir().join(format!(
            "shard-bench-strace-{}-{}",
            std::process::id(),
            pids[0]
        ));
        let mut c = Command::new(bin);
        c.args(["-c", "-f", "-q", "-o"]).arg(&out);
        for p in pids {
            c.arg("-p").arg(p.to_string());
        }
        let child = c
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawn strace")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !pids.iter().all(|&p| traced(p)) {
            if Instant::now() > deadline {
                bail!("strace did not attach within 10 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(Strace { child, out })
    }

    /// Detaches and returns the total number of system calls.
    pub fn finish(mut self) -> Result<u64> {
        // SAFETY-free: kill(2) with plain integers.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        self.child.wait()?;
        let text = std::fs::read_to_string(&self.out)?;
        let _ = std::fs::remove_file(&self.out);
        let total = text
            .lines()
            .find(|l| l.trim_end().ends_with(" total"))
            .with_context(|| format!("no total in strace output: {text}"))?;
        let f: Vec<&str> = total.split_whitespace().collect();
        f.get(3)
            .and_then(|n| n.parse().ok())
            .context("bad strace total line")
    }
}
