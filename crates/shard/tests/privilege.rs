//! Who the workers run as: nginx's default `nobody` when the master is root and no `user` is
//! written, the `user` directive's user and group, no capability in any set and
//! `NoNewPrivs: 1` in every worker, and nginx's errors for an unknown user or group at `-t`
//! and at start. Everything here needs root and says SKIPPED without it.

mod support;

use support::*;

fn is_root() -> bool {
    // SAFETY: geteuid has no failure mode.
    unsafe { libc::geteuid() == 0 }
}

/// A `/proc/PID/status` field's first value.
fn field(pid: u64, name: &str) -> String {
    let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    st.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in {st}"))
        .trim()
        .to_string()
}

fn group_exists(name: &str) -> bool {
    std::fs::read_to_string("/etc/group")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(':').next() == Some(name))
}

fn id_of(db: &str, name: &str) -> String {
    std::fs::read_to_string(db)
        .unwrap_or_default()
        .lines()
        .find(|l| l.split(':').next() == Some(name))
        .and_then(|l| l.split(':').nth(2).map(str::to_string))
        .unwrap_or_else(|| panic!("no {name} in {db}"))
}

/// Every worker has `uid`/`gid` in all four slots, no capability and no way to regain one.
fn assert_unprivileged(s: &Server, uid: &str, gid: &str) {
    for w in s.workers() {
        let uids: Vec<String> = field(w.pid, "Uid")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        let gids: Vec<String> = field(w.pid, "Gid")
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert_eq!(uids, vec![uid; 4], "worker {} uids", w.pid);
        assert_eq!(gids, vec![gid; 4], "worker {} gids", w.pid);
        assert_eq!(field(w.pid, "Groups"), gid, "supplementary groups");
        for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            assert_eq!(
                field(w.pid, cap),
                "0000000000000000",
                "worker {} {cap}",
                w.pid
            );
        }
        assert_eq!(field(w.pid, "NoNewPrivs"), "1");
    }
}

#[test]
fn without_a_user_line_a_root_master_runs_its_workers_as_nobody() {
    if !is_root() {
        skipped(
            "without_a_user_line_a_root_master_runs_its_workers_as_nobody",
            "needs root (run the tests as root)",
        );
        return;
    }
    let s = Server::start("priv-default", &base_conf(2, "reuseport", ""), 2);
    let group = ["nobody", "nogroup"]
        .into_iter()
        .find(|g| group_exists(g))
        .expect("a group nobody or nogroup");
    assert_unprivileged(
        &s,
        &id_of("/etc/passwd", "nobody"),
        &id_of("/etc/group", group),
    );
    assert_eq!(
        get(s.addr(), "/ok").status,
        200,
        "serving on root-bound sockets"
    );
    // The master itself keeps root: it must reopen logs and bind new addresses on reload.
    assert_eq!(
        field(s.pid() as u64, "Uid").split_whitespace().next(),
        Some("0")
    );
}

#[test]
fn the_user_directive_picks_user_and_group_as_nginx() {
    if !is_root() {
        skipped(
            "the_user_directive_picks_user_and_group_as_nginx",
            "needs root (run the tests as root)",
        );
        return;
    }
    let group = if group_exists("nogroup") {
        "nogroup"
    } else {
        "nobody"
    };
    let conf = format!("user nobody {group};\n{}", base_conf(1, "reuseport", ""));
    let s = Server::start("priv-user", &conf, 1);
    assert_unprivileged(
        &s,
        &id_of("/etc/passwd", "nobody"),
        &id_of("/etc/group", group),
    );
    assert_eq!(get(s.addr(), "/ok").status, 200);
}

#[test]
fn an_unknown_user_or_group_fails_the_test_and_the_start_in_nginx_words() {
    if !is_root() {
        skipped(
            "an_unknown_user_or_group_fails_the_test_and_the_start_in_nginx_words",
            "needs root: without it nginx (and shard) ignore \"user\" with a warning",
        );
        return;
    }
    let dir = temp_dir("priv-unknown");
    let mut cases = vec![
        (
            "user shard-no-such-user;",
            "getpwnam(\"shard-no-such-user\") failed",
        ),
        (
            "user nobody shard-no-such-group;",
            "getgrnam(\"shard-no-such-group\") failed",
        ),
    ];
    // With one name, the group is named as the user (nginx): Debian has no group nobody.
    if !group_exists("nobody") {
        cases.push(("user nobody;", "getgrnam(\"nobody\") failed"));
    }
    for (line, want) in cases {
        let conf = dir.join("conf/u.conf");
        std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
        std::fs::write(
            &conf,
            format!("{line}\n{}", base_conf(1, "", ""))
                .replace("{port}", "1")
                .replace("{dir}", dir.to_str().unwrap()),
        )
        .unwrap();
        let conf = conf.to_str().unwrap();
        let (code, err) = run_cli(&["-p", dir.to_str().unwrap(), "-t", "-c", conf]);
        assert_eq!(code, 1, "{line}: {err}");
        assert!(
            err.contains(&format!("[emerg] {want} in {conf}:1")),
            "{line}: {err}"
        );
        assert!(err.contains("test failed"), "{err}");
        let (code, err) = run_cli(&["-p", dir.to_str().unwrap(), "-c", conf]);
        assert_ne!(code, 0, "{line} started: {err}");
        assert!(err.contains(want), "{line}: {err}");
    }
}

#[test]
fn disable_symlinks_refuses_links_as_nginx() {
    use std::os::unix::fs::symlink;
    let conf = "worker_processes 1;\n\
         error_log logs/error.log info;\n\
         events {}\n\
         http {\n\
         access_log off;\n\
         server {\n\
         listen 127.0.0.1:{port};\n\
         location = /status { shard_status; }\n\
         location /a/ { root {dir}/site; }\n\
         location /on/ { root {dir}/site; disable_symlinks on; }\n\
         location /from/ { root {dir}/rootlink; disable_symlinks on from=$document_root; }\n\
         location /nofrom/ { root {dir}/rootlink; disable_symlinks on; }\n\
         location /owner/ { root {dir}/site; disable_symlinks if_not_owner; }\n\
         }\n\
         }\n";
    let s = Server::start("symlinks", conf, 1);
    let d = &s.dir;
    for sub in ["a", "on", "from", "nofrom", "owner"] {
        write_file(d, &format!("site/{sub}/real.txt"), b"real");
        write_file(d, &format!("site/{sub}/dir/x.txt"), b"x");
        symlink(
            d.join(format!("site/{sub}/real.txt")),
            d.join(format!("site/{sub}/link.txt")),
        )
        .unwrap();
        symlink("/etc/passwd", d.join(format!("site/{sub}/out.txt"))).unwrap();
        symlink(
            d.join(format!("site/{sub}/dir")),
            d.join(format!("site/{sub}/dirlink")),
        )
        .unwrap();
    }
    symlink(d.join("site"), d.join("rootlink")).unwrap();
    let cases = [
        ("/a/real.txt", 200),
        ("/a/link.txt", 200),
        ("/a/out.txt", 200),
        ("/a/dirlink/x.txt", 200),
        ("/on/real.txt", 200),
        ("/on/dir/x.txt", 200),
        ("/on/link.txt", 403),
        ("/on/out.txt", 403),
        ("/on/dirlink/x.txt", 403),
        ("/on/missing.txt", 404),
        // The root itself is a link: not checked with from=$document_root, checked without.
        ("/from/real.txt", 200),
        ("/from/link.txt", 403),
        ("/nofrom/real.txt", 403),
        // Same owner (root made both, or the test user did): followed.
        ("/owner/link.txt", 200),
    ];
    for (path, want) in cases {
        assert_eq!(get(s.addr(), path).status, want, "{path}");
    }
    let log = std::fs::read_to_string(d.join("logs/error.log")).unwrap();
    assert!(
        log.contains("/on/link.txt\" failed (40: Too many levels of symbolic links)"),
        "{log}"
    );
    if is_root() {
        // A link owned by someone else than its target is refused.
        let theirs = d.join("site/owner/theirs.txt");
        symlink(d.join("site/owner/real.txt"), &theirs).unwrap();
        std::os::unix::fs::lchown(&theirs, Some(65534), Some(65534)).unwrap();
        assert_eq!(get(s.addr(), "/owner/theirs.txt").status, 403);
    } else {
        skipped(
            "disable_symlinks_refuses_links_as_nginx (if_not_owner part)",
            "needs root to give a link another owner",
        );
    }
}

/// `proxy_bind ... transparent`: the workers keep `CAP_NET_RAW` (permitted and effective,
/// and in the bounding set), nothing else, as nginx keeps it for `IP_TRANSPARENT`.
#[test]
fn a_transparent_bind_keeps_cap_net_raw_and_nothing_else() {
    if !is_root() {
        skipped(
            "a_transparent_bind_keeps_cap_net_raw_and_nothing_else",
            "needs root (run the tests as root)",
        );
        return;
    }
    let conf = base_conf(1, "", "").replace("http {", "http {\n proxy_bind 127.0.0.1 transparent;");
    let s = Server::start("priv-transparent", &conf, 1);
    let raw = "0000000000002000";
    for w in s.workers() {
        assert_eq!(field(w.pid, "CapEff"), raw, "worker {}", w.pid);
        assert_eq!(field(w.pid, "CapPrm"), raw, "worker {}", w.pid);
        assert_eq!(field(w.pid, "CapBnd"), raw, "worker {}", w.pid);
        assert_eq!(field(w.pid, "CapInh"), "0000000000000000");
        assert_eq!(field(w.pid, "CapAmb"), "0000000000000000");
        assert_eq!(field(w.pid, "NoNewPrivs"), "1");
        assert_ne!(
            field(w.pid, "Uid").split_whitespace().next(),
            Some("0"),
            "not root"
        );
    }
}
