//! `worker_sandbox on`: a sandboxed worker serves everything its configuration names (static
//! files with and without sendfile, gzip, an alias, proxied requests with spooled and streamed
//! bodies, the status pages, a log rotation, a reload that adds a root) and nothing else (a
//! symbolic link out of its root, `/proc/self/environ` through an `alias` mistake, a file the
//! configuration does not name), with `NoNewPrivs: 1` and `Seccomp: 2`. A system call missing
//! from the sandbox's table fails a request or logs `Operation not permitted`, and so fails
//! here; `.ci/run` also runs the proxy, stream, bodies and robustness suites sandboxed.

mod support;

use std::io::Write;
use std::os::unix::fs::symlink;
use std::time::Duration;

use support::upstream::{pattern, Reply, Upstream};
use support::*;

fn status_field(pid: u64, name: &str) -> String {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    st.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name}"))
        .trim()
        .to_string()
}

/// Landlock and seccomp, or a loud skip.
fn kernel_has_sandbox() -> bool {
    let (landlock, seccomp) = shard_server_probe();
    if !(landlock && seccomp) {
        skipped(
            "sandbox",
            "the kernel lacks Landlock or seccomp (Linux 5.13+ with Landlock enabled)",
        );
    }
    landlock && seccomp
}

fn shard_server_probe() -> (bool, bool) {
    // SAFETY: landlock_create_ruleset(NULL, 0, VERSION) only returns the ABI version;
    // prctl(PR_GET_SECCOMP) only reads.
    let abi = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    let seccomp = unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) } >= 0;
    (abi > 0, seccomp)
}

fn conf(site: &std::path::Path, up: u16, extra: &str) -> String {
    format!(
        "worker_sandbox on;\n\
         worker_processes 1;\n\
         error_log logs/error.log info;\n\
         events {{}}\n\
         http {{\n\
         access_log logs/access.log;\n\
         client_max_body_size 10m;\n\
         server {{\n\
         listen 127.0.0.1:{{port}};\n\
         root {site}/html;\n\
         location = /status {{ shard_status; }}\n\
         location /files/ {{ alias {site}/other/; }}\n\
         location /sf/ {{ sendfile on; }}\n\
         location /gz/ {{ gzip on; gzip_types text/plain; gzip_min_length 1; }}\n\
         location = /env {{ alias /proc/self/environ; }}\n\
         location /up {{ proxy_pass http://127.0.0.1:{up}; }}\n\
         location /stream {{ proxy_pass http://127.0.0.1:{up}; proxy_request_buffering off; }}\n\
         {extra}\n\
         }}\n\
         }}\n",
        site = site.display()
    )
}

#[test]
fn a_sandboxed_worker_serves_what_its_configuration_names_and_nothing_else() {
    if !kernel_has_sandbox() {
        return;
    }
    let site = temp_dir("sandbox-site");
    write_file(&site, "html/index.html", b"<p>home</p>");
    write_file(&site, "html/sf/big.bin", &pattern(300_000, 1));
    write_file(&site, "html/gz/t.txt", &b"gzip me ".repeat(500));
    write_file(&site, "other/x.txt", b"aliased");
    write_file(&site, "secret.txt", b"not for the web");
    symlink(site.join("secret.txt"), site.join("html/leak.txt")).unwrap();
    symlink("/etc/passwd", site.join("html/passwd")).unwrap();
    let up = Upstream::start(|_| Reply::Echo);
    let s = Server::start("sandbox", &conf(&site, up.port, ""), 1);
    let pid = parse_workers(&get(s.addr(), "/status").body_str())[0].pid;
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    assert_eq!(status_field(pid, "Seccomp"), "2");

    // What the configuration names.
    let r = get(s.addr(), "/");
    assert_eq!((r.status, r.body_str().as_str()), (200, "<p>home</p>"));
    assert_eq!(get(s.addr(), "/files/x.txt").body_str(), "aliased");
    let r = get(s.addr(), "/sf/big.bin");
    assert!(r.status == 200 && r.body == pattern(300_000, 1));
    let r = raw(
        s.addr(),
        b"GET /gz/t.txt HTTP/1.1\r\nHost: x\r\nAccept-Encoding: gzip\r\nConnection: close\r\n\r\n",
    );
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert_eq!(get(s.addr(), "/status?format=prometheus").status, 200);
    for path in ["/up", "/stream"] {
        let body = pattern(200_000, 2);
        let mut c = connect(s.addr());
        c.write_all(
            format!("POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 200000\r\n\r\n").as_bytes(),
        )
        .unwrap();
        c.write_all(&body).unwrap();
        let r = read_response(&mut c, false).unwrap();
        assert!(r.status == 200 && r.body == body, "{path}: {}", r.status);
    }

    // What it does not.
    for path in ["/leak.txt", "/passwd", "/env"] {
        assert_eq!(get(s.addr(), path).status, 403, "{path}");
    }

    // A log rotation: the master makes the new file, the sandboxed worker opens it.
    std::fs::rename(
        s.dir.join("logs/access.log"),
        s.dir.join("logs/access.log.1"),
    )
    .unwrap();
    s.signal(libc::SIGUSR1);
    wait_for(Duration::from_secs(5), "the access log reopened", || {
        get(s.addr(), "/files/x.txt");
        std::fs::read_to_string(s.dir.join("logs/access.log"))
            .ok()
            .filter(|t| t.contains("GET /files/x.txt"))
    });

    let log = std::fs::read_to_string(s.dir.join("logs/error.log")).unwrap();
    assert!(
        !log.contains("Operation not permitted") && !log.contains("[emerg]"),
        "{log}"
    );
}

#[test]
fn a_reload_under_the_sandbox_serves_a_newly_added_root() {
    if !kernel_has_sandbox() {
        return;
    }
    let site = temp_dir("sandbox-reload");
    write_file(&site, "html/index.html", b"one");
    let up = Upstream::text("ok");
    let s = Server::start("sandbox-reload", &conf(&site, up.port, ""), 1);
    let added = temp_dir("sandbox-added");
    write_file(&added, "new/page.txt", b"added root");
    assert_eq!(get(s.addr(), "/new/page.txt").status, 404);
    let text = conf(
        &site,
        up.port,
        &format!("location /new/ {{ root {}; }}", added.display()),
    )
    .replace("{port}", &s.port.to_string());
    std::fs::write(s.dir.join("conf/shard.conf"), text).unwrap();
    s.signal(libc::SIGHUP);
    wait_for(Duration::from_secs(10), "the new root served", || {
        let r = get(s.addr(), "/new/page.txt");
        (r.status == 200 && r.body_str() == "added root").then_some(())
    });
}

#[test]
fn shard_dash_capital_t_prints_the_files_and_what_a_worker_may_open() {
    let dir = temp_dir("sandbox-dump");
    write_file(
        &dir,
        "conf/extra.conf",
        b"server { listen 127.0.0.1:1; root /srv/www; }\n",
    );
    write_file(
        &dir,
        "conf/shard.conf",
        b"worker_sandbox on;\nevents {}\nhttp { include extra.conf;\n map $args $x { include m.conf; include m.conf; } }\n",
    );
    write_file(&dir, "conf/m.conf", b"# nothing\n");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shard"))
        .args(["-p", dir.to_str().unwrap(), "-T", "-c", "conf/shard.conf"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("/conf/shard.conf:\nworker_sandbox on;"),
        "{text}"
    );
    assert!(
        text.contains("extra.conf:\nserver { listen 127.0.0.1:1;"),
        "{text}"
    );
    // A file included twice is printed once, as nginx's dump.
    assert_eq!(text.matches("m.conf:\n").count(), 1, "{text}");
    assert!(
        text.contains("# worker_sandbox on: what a worker may open"),
        "{text}"
    );
    assert!(text.contains("#   read: /srv/www\n"), "{text}");
    assert!(text.contains("client_body_temp\n"), "{text}");
    // The seccomp table's size, which directives.md points to instead of a number.
    let n: usize = text
        .lines()
        .find_map(|l| l.strip_prefix("#   system calls: "))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("{text}"));
    assert!(n > 20, "{text}");
}

#[test]
fn on_a_kernel_without_landlock_the_master_says_so_once_and_seccomp_still_applies() {
    use std::os::unix::process::CommandExt;
    if !kernel_has_sandbox() {
        return;
    }
    // A kernel without Landlock, as the process sees it: a seccomp filter installed before
    // exec makes the three Landlock calls fail with ENOSYS (inherited by every worker).
    fn hide_landlock() -> std::io::Result<()> {
        let ld = |k: u32| libc::sock_filter {
            code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
            jt: 0,
            jf: 0,
            k,
        };
        let jeq = |k: libc::c_long, jt: u8| libc::sock_filter {
            code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
            jt,
            jf: 0,
            k: k as u32,
        };
        let ret = |k: u32| libc::sock_filter {
            code: (libc::BPF_RET | libc::BPF_K) as u16,
            jt: 0,
            jf: 0,
            k,
        };
        let mut f = [
            ld(0),
            jeq(libc::SYS_landlock_create_ruleset, 3),
            jeq(libc::SYS_landlock_add_rule, 2),
            jeq(libc::SYS_landlock_restrict_self, 1),
            ret(libc::SECCOMP_RET_ALLOW),
            ret(libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        ];
        let prog = libc::sock_fprog {
            len: f.len() as u16,
            filter: f.as_mut_ptr(),
        };
        // SAFETY: prctl and seccomp with a valid program, in the child before exec.
        unsafe {
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::syscall(
                    libc::SYS_seccomp,
                    1u32,
                    0u32,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }
    let dir = temp_dir("sandbox-nolandlock");
    write_file(&dir, "html/index.html", b"served");
    let port = free_port();
    std::fs::write(
        dir.join("conf/shard.conf"),
        format!(
            "worker_sandbox on;\nworker_processes 2;\nerror_log logs/error.log info;\nevents {{}}\n\
             http {{ access_log off; server {{ listen 127.0.0.1:{port}; root {}/html; }} }}\n",
            dir.display()
        ),
    )
    .unwrap();
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_shard"));
    cmd.args(["-g", "daemon off;"]);
    cmd.arg("-p").arg(&*dir).arg("-c").arg("conf/shard.conf");
    cmd.stderr(std::process::Stdio::null());
    // SAFETY: the closure only makes two system calls, async-signal-safe.
    unsafe { cmd.pre_exec(hide_landlock) };
    let mut child = cmd.spawn().unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let r = wait_for(Duration::from_secs(10), "the sandboxed server", || {
        try_get(addr, "/index.html").ok()
    });
    let pid = child.id();
    // Each worker adds its own filter to the inherited one once it is set up.
    let filters = wait_for(Duration::from_secs(10), "both workers confined", || {
        let workers: Vec<u64> = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .ok()?
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        let f: Vec<String> = workers
            .iter()
            .map(|w| status_field(*w, "Seccomp_filters"))
            .collect();
        (f.len() == 2 && f.iter().all(|x| x == "2")).then_some(f)
    });
    // SAFETY: plain kill(2) on our child.
    unsafe { libc::kill(pid as i32, libc::SIGQUIT) };
    let _ = child.wait();
    assert_eq!(r.status, 200);
    assert_eq!(r.body_str(), "served");
    assert_eq!(filters, vec!["2".to_string(); 2]);
    let log = std::fs::read_to_string(dir.join("logs/error.log")).unwrap();
    assert_eq!(
        log.matches("worker_sandbox: the kernel has no Landlock")
            .count(),
        1,
        "{log}"
    );
    assert!(!log.contains("[emerg]"), "{log}");
}

#[test]
fn a_root_created_after_a_sandboxed_worker_started_is_served_after_a_reload() {
    if !kernel_has_sandbox() {
        return;
    }
    let site = temp_dir("sandbox-late-root");
    write_file(&site, "html/index.html", b"one");
    let late = site.join("lateroot");
    let up = Upstream::text("ok");
    let extra = format!("location /late/ {{ root {}; }}", late.display());
    let s = Server::start("sandbox-late", &conf(&site, up.port, &extra), 1);
    // The root did not exist when the worker confined itself: not granted.
    write_file(&site, "lateroot/late/page.txt", b"late page");
    assert!(late.is_dir());
    assert_eq!(get(s.addr(), "/late/page.txt").status, 403);
    // A reload forks workers confined to what exists now.
    s.signal(libc::SIGHUP);
    wait_for(Duration::from_secs(10), "the late root served", || {
        let r = get(s.addr(), "/late/page.txt");
        (r.status == 200 && r.body_str() == "late page").then_some(())
    });
}
