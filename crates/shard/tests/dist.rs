//! The packaging under `dist/`, checked with the tools an operator would use where they are
//! installed (each says SKIPPED when its tool is missing): the man page renders and names
//! every flag and signal `--help` names; the systemd units pass `systemd-analyze verify`;
//! logrotate's dry run parses the snippet; the shell completions parse and offer every flag;
//! the configuration the files install passes `shard -t`; the Dockerfile copies files that
//! exist and runs flags that exist.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::*;

fn dist() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn help() -> String {
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert!(out.status.success());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The flags `--help` lists (`-v`, `-c`, ...).
fn help_flags() -> Vec<String> {
    help()
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with('-'))
        // `-h, --help  Print help`: every name before the description.
        .flat_map(|l| {
            l.split("  ")
                .next()
                .unwrap()
                .split(", ")
                .map(|f| f.split_whitespace().next().unwrap().to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

const SIGNALS: [&str; 7] = ["TERM", "INT", "QUIT", "HUP", "USR1", "USR2", "WINCH"];

#[test]
fn help_documents_every_flag_and_signal() {
    let h = help();
    let flags = help_flags();
    for f in ["-v", "-V", "-t", "-T", "-q", "-s", "-p", "-c", "-g", "-h"] {
        assert!(flags.iter().any(|x| x == f), "{f} in --help: {h}");
    }
    for s in SIGNALS {
        assert!(h.contains(s), "{s} in --help: {h}");
    }
}

#[test]
fn the_man_page_names_every_flag_and_signal_and_renders() {
    let page = read(&dist().join("shard.8"));
    // roff escapes a dash as `\-`.
    let text = page.replace("\\-", "-");
    for f in help_flags() {
        assert!(text.contains(&f), "{f} in shard.8");
    }
    for s in SIGNALS {
        assert!(text.contains(s), "{s} in shard.8");
    }
    if !have("man") {
        skipped(
            "man page rendering",
            "man is not installed (apt-get install man-db)",
        );
        return;
    }
    let out = Command::new("man")
        .args(["--warnings", "-l"])
        .arg(dist().join("shard.8"))
        .env("MANWIDTH", "80")
        .env("MANPAGER", "cat")
        .output()
        .unwrap();
    let rendered = String::from_utf8_lossy(&out.stdout);
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{warnings}");
    assert!(warnings.trim().is_empty(), "groff warnings: {warnings}");
    assert!(
        rendered.contains("SIGNALS") && rendered.contains("graceful"),
        "{rendered}"
    );
}

#[test]
fn the_systemd_units_verify() {
    if !have("systemd-analyze") {
        skipped(
            "systemd units",
            "systemd-analyze is not installed (apt-get install systemd)",
        );
        return;
    }
    // The units name /usr/sbin/shard and man:shard(8): point them at this build and page.
    let dir = temp_dir("dist-systemd");
    let man = dir.join("man/man8");
    std::fs::create_dir_all(&man).unwrap();
    std::fs::copy(dist().join("shard.8"), man.join("shard.8")).unwrap();
    let mut names = Vec::new();
    for e in std::fs::read_dir(dist().join("systemd")).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_str().unwrap().to_string();
        std::fs::write(dir.join(&name), read(&p).replace("/usr/sbin/shard", BIN)).unwrap();
        names.push(name);
    }
    names.sort();
    assert_eq!(
        names,
        ["shard-socket.service", "shard.service", "shard.socket"]
    );
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&names)
        .current_dir(&*dir)
        .env("MANPATH", dir.join("man"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.trim().is_empty(), "{err}");
    // The forking unit finds the master through the pid file the configuration writes.
    let unit = read(&dist().join("systemd/shard.service"));
    let conf = read(&dist().join("shard.conf"));
    assert!(unit.contains("PIDFile=/run/shard.pid") && conf.contains("pid /run/shard.pid;"));
}

#[test]
fn logrotate_rotates_a_running_server_with_the_snippet() {
    if !have("logrotate") {
        skipped(
            "logrotate snippet",
            "logrotate is not installed (apt-get install logrotate)",
        );
        return;
    }
    let conf = "worker_processes 2;\nerror_log logs/error.log info;\npid logs/shard.pid;\n\
                events {}\nhttp { access_log logs/access.log;\n\
                server { listen 127.0.0.1:{port}; location = /status { shard_status; }\n\
                location / { return 200 \"ok\"; } } }\n";
    let s = Server::start("dist-logrotate", conf, 2);
    for i in 0..20 {
        assert_eq!(get(s.addr(), &format!("/before-{i}")).status, 200);
    }
    let logs = s.dir.join("logs");
    wait_for(
        std::time::Duration::from_secs(10),
        "the lines before",
        || {
            read(&logs.join("access.log"))
                .contains("/before-19 ")
                .then_some(())
        },
    );
    // The snippet as installed, pointed at this server: a real rotation, not a dry run.
    let shard = format!(
        "{BIN} -p {} -c {}",
        s.dir.display(),
        s.dir.join("conf/shard.conf").display()
    );
    let snippet = read(&dist().join("logrotate/shard"))
        .replace("/var/log/shard", logs.to_str().unwrap())
        .replace(
            "/usr/sbin/shard -p /etc/shard -c /etc/shard/shard.conf",
            &shard,
        )
        .replace("create 0640 www-data adm", "create 0640 root root");
    assert!(
        snippet.contains(&shard),
        "the postrotate line names the installed paths"
    );
    let conf_path = s.dir.join("conf/logrotate.conf");
    std::fs::write(&conf_path, snippet).unwrap();
    let out = Command::new("logrotate")
        .arg("-f")
        .arg("-s")
        .arg(s.dir.join("logrotate.state"))
        .arg(&conf_path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // `-s reopen` returns once the master is signalled; each worker says when it has reopened.
    wait_for(
        std::time::Duration::from_secs(10),
        "both workers to reopen",
        || {
            (read(&logs.join("error.log"))
                .matches(": reopening logs")
                .count()
                >= 2)
                .then_some(())
        },
    );
    for i in 0..20 {
        assert_eq!(get(s.addr(), &format!("/after-{i}")).status, 200);
    }
    wait_for(
        std::time::Duration::from_secs(10),
        "the lines after, in the new file",
        || {
            read(&logs.join("access.log"))
                .contains("/after-19 ")
                .then_some(())
        },
    );
    let new = read(&logs.join("access.log"));
    let rotated = read(&logs.join("access.log.1"));
    assert!(!new.contains("/before-") && rotated.contains("/before-19 "));
    assert!(!rotated.contains("/after-"));
}

#[test]
fn the_completions_parse_and_offer_every_flag() {
    let bash = dist().join("completions/shard.bash");
    let zsh = read(&dist().join("completions/_shard"));
    let bash_text = read(&bash);
    for f in help_flags() {
        assert!(
            bash_text.contains(&format!(" {f} "))
                || bash_text.contains(&format!("\"{f} "))
                || bash_text.contains(&format!(" {f}\"")),
            "{f} in shard.bash"
        );
        let z = f.trim_start_matches('-');
        assert!(
            zsh.contains(&format!("-{z}["))
                || zsh.contains(&format!("-{z},"))
                || zsh.contains(&format!(",-{z}")),
            "{f} in _shard"
        );
    }
    for s in ["stop", "quit", "reopen", "reload"] {
        assert!(bash_text.contains(s) && zsh.contains(s), "{s}");
    }
    let out = Command::new("bash").arg("-n").arg(&bash).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    if have("zsh") {
        let out = Command::new("zsh")
            .arg("-n")
            .arg(dist().join("completions/_shard"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        skipped(
            "zsh completion syntax",
            "zsh is not installed (apt-get install zsh)",
        );
    }
}

#[test]
fn the_installed_configuration_passes_the_test() {
    let dir = temp_dir("dist-conf");
    let conf = read(&dist().join("shard.conf"))
        .replace("/var/log/shard", dir.join("logs").to_str().unwrap())
        .replace(
            "/run/shard.pid",
            dir.join("logs/shard.pid").to_str().unwrap(),
        )
        .replace("/var/www/html", dir.join("html").to_str().unwrap());
    let path = dir.join("conf/shard.conf");
    std::fs::write(&path, conf).unwrap();
    let (code, err) = run_cli(&[
        "-t",
        "-p",
        dir.to_str().unwrap(),
        "-c",
        path.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("test is successful"), "{err}");
}

#[test]
fn the_dockerfile_copies_what_exists_and_runs_in_the_foreground() {
    let df = read(&dist().join("Dockerfile"));
    let root = dist().join("..");
    for line in df
        .lines()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let src = line.split_whitespace().nth(1).unwrap();
        if src != "." {
            assert!(root.join(src).exists(), "{line}");
        }
    }
    assert!(df.contains("STOPSIGNAL SIGQUIT"));
    let cmd = df.lines().find(|l| l.starts_with("CMD ")).unwrap();
    assert!(cmd.contains("\"daemon off;\""), "{cmd}");
    for f in cmd.split('"').filter(|w| w.starts_with('-')) {
        assert!(help_flags().iter().any(|x| x == f), "{f} of {cmd}");
    }
    if have("docker") {
        println!("NOTE: the Dockerfile is not built here (no registry for base images in tests)");
    }
}
