//! Who the workers run as, and what they give up at start.
//!
//! This module owns the decision (nginx's `user`, with nginx's default `nobody` when the master
//! is root and no `user` is written) and the worker's side of it: switch identity with no
//! capability left in any set, then `PR_SET_NO_NEW_PRIVS`. The master resolves the identity
//! once per configuration (start, reload, `-t`), before any fork, so a worker never looks up
//! a name and a configuration naming an unknown user or group fails as a whole. It does not
//! open anything on the workers' behalf (that is the master's start-up) and does not confine
//! file access (the sandbox).

use shard_config::{Config, User};
use shard_event::process;

/// The identity workers switch to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub user: String,
    pub group: String,
    pub uid: u32,
    pub gid: u32,
}

/// nginx's default `user` when the master runs as root.
const DEFAULT_USER: &str = "nobody";
/// Groups tried, in order, for the default user: nginx's `nobody`, then Debian's `nogroup`.
const DEFAULT_GROUPS: [&str; 2] = ["nobody", "nogroup"];

/// The identity workers take under `cfg`, or `None` when the master is not root (workers then
/// keep the master's identity, and a `user` line is ignored with nginx's warning, see
/// [`ignored_user_warning`]). Errors are nginx's: `getpwnam("www") failed in FILE:LINE`.
pub fn worker_identity(cfg: &Config) -> Result<Option<Identity>, String> {
    if !process::is_root() {
        return Ok(None);
    }
    resolve(cfg.main.user.as_ref(), process::user_ids, process::group_id).map(Some)
}

/// nginx's warning for a `user` line when the master is not root, if there is one.
pub fn ignored_user_warning(cfg: &Config) -> Option<String> {
    let u = cfg.main.user.as_ref()?;
    (!process::is_root()).then(|| {
        format!(
            "the \"user\" directive makes sense only if the master process runs with super-user privileges, ignored in {}",
            u.place
        )
    })
}

/// The identity for `user` (as written, or the default), with the name lookups passed in so
/// that the rules are testable without a password database.
fn resolve(
    user: Option<&User>,
    user_ids: impl Fn(&str) -> Option<(u32, u32)>,
    group_id: impl Fn(&str) -> Option<u32>,
) -> Result<Identity, String> {
    match user {
        Some(u) => {
            let at = format!(" in {}", u.place);
            let (uid, _) =
                user_ids(&u.name).ok_or_else(|| format!("getpwnam(\"{}\") failed{at}", u.name))?;
            // nginx: "If group is omitted, a group whose name equals that of user is used."
            let group = u.group.clone().unwrap_or_else(|| u.name.clone());
            let gid =
                group_id(&group).ok_or_else(|| format!("getgrnam(\"{group}\") failed{at}"))?;
            Ok(Identity {
                user: u.name.clone(),
                group,
                uid,
                gid,
            })
        }
        None => {
            let (uid, primary) = user_ids(DEFAULT_USER)
                .ok_or_else(|| format!("getpwnam(\"{DEFAULT_USER}\") failed"))?;
            let (group, gid) = DEFAULT_GROUPS
                .iter()
                .find_map(|g| group_id(g).map(|gid| (g.to_string(), gid)))
                .unwrap_or_else(|| (primary.to_string(), primary));
            Ok(Identity {
                user: DEFAULT_USER.to_string(),
                group,
                uid,
                gid,
            })
        }
    }
}

/// What nginx only says at run time (`13: Permission denied`): the directories the workers,
/// as `id`, cannot reach. Every `root`/`alias` directory (the literal part, before any
/// variable) needs search permission on it and on each directory above it; the request-body
/// temporary directory needs search and write. One warning per directory, naming the first
/// directory on the way that stops them. Directories that do not exist are not judged (that
/// is a 404 or nginx's own `mkdir()` at run time).
pub fn unreachable_paths(cfg: &Config, id: &Identity) -> Vec<String> {
    if id.uid == 0 {
        return Vec::new();
    }
    let Some(http) = cfg.http.as_ref() else {
        return Vec::new();
    };
    let mut seen = std::collections::BTreeSet::new();
    let mut out = Vec::new();
    let locs = http
        .servers
        .iter()
        .flat_map(|s| std::iter::once(&s.base).chain(&s.locations));
    for l in locs {
        let read = [Some(l.root.as_path()), l.alias.as_deref()];
        for dir in read.into_iter().flatten() {
            if seen.insert((dir.to_path_buf(), false)) {
                if let Some(w) = blocked(dir, id, false) {
                    out.push(w);
                }
            }
        }
        let temp = l.body.temp_path.path.as_path();
        if seen.insert((temp.to_path_buf(), true)) {
            if let Some(w) = blocked(temp, id, true) {
                out.push(w);
            }
        }
    }
    out
}

/// The warning for `path` when `id` cannot reach it (search on every directory down to it;
/// with `write`, also write on it).
fn blocked(path: &std::path::Path, id: &Identity, write: bool) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    // Judged as far as the path exists: a missing root is not a permission problem.
    let mut existing = path.to_path_buf();
    while std::fs::metadata(&existing).is_err() {
        if !existing.pop() {
            return None;
        }
    }
    let whole = existing == path;
    let mut at = std::path::PathBuf::new();
    let comps: Vec<_> = existing.components().collect();
    for (i, c) in comps.iter().enumerate() {
        at.push(c);
        let Ok(m) = std::fs::metadata(&at) else {
            return None;
        };
        if !m.is_dir() {
            return None;
        }
        let bits = if m.uid() == id.uid {
            m.mode() >> 6
        } else if m.gid() == id.gid {
            m.mode() >> 3
        } else {
            m.mode()
        } & 0o7;
        let last = i + 1 == comps.len();
        let need = if write && last && whole { 0o3 } else { 0o1 };
        if bits & need != need {
            let what = if need == 0o3 { "write to" } else { "reach" };
            return Some(if at == path {
                format!(
                    "workers run as \"{}\", which cannot {what} \"{}\"",
                    id.user,
                    path.display()
                )
            } else {
                format!(
                    "workers run as \"{}\", which cannot {what} \"{}\" (\"{}\" does not let them through)",
                    id.user,
                    path.display(),
                    at.display()
                )
            });
        }
    }
    None
}

/// In a new worker, before it serves anything: switch to `id` (when the master is root), then
/// `PR_SET_NO_NEW_PRIVS`. An error means the worker must not start.
pub fn enter_worker(id: Option<&Identity>, keep_net_raw: bool) -> Result<(), String> {
    if let Some(id) = id {
        process::drop_to(id.uid, id.gid, keep_net_raw)?;
    }
    process::set_no_new_privs().map_err(|e| format!("prctl(PR_SET_NO_NEW_PRIVS) failed ({e})"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use shard_config::Place;

    fn user(name: &str, group: Option<&str>) -> User {
        User {
            name: name.into(),
            group: group.map(Into::into),
            place: Place {
                file: "conf/shard.conf".into(),
                line: 1,
            },
        }
    }

    fn users(n: &str) -> Option<(u32, u32)> {
        match n {
            "nobody" => Some((65534, 65534)),
            "www" => Some((33, 33)),
            _ => None,
        }
    }

    #[test]
    fn default_and_written_users_resolve_as_nginx() {
        let debian = |g: &str| match g {
            "nogroup" => Some(65534),
            "www" => Some(33),
            "staff" => Some(50),
            _ => None,
        };
        // No `user`: nobody, and Debian's nogroup where there is no group nobody.
        let id = resolve(None, users, debian).unwrap();
        assert_eq!((id.user.as_str(), id.group.as_str()), ("nobody", "nogroup"));
        let id = resolve(None, users, |g| (g == "nobody").then_some(99)).unwrap();
        assert_eq!((id.group.as_str(), id.gid), ("nobody", 99));
        // Neither group: the user's primary group.
        let id = resolve(None, users, |_| None).unwrap();
        assert_eq!((id.group.as_str(), id.gid), ("65534", 65534));
        // Written: the group named as the user, or the one given.
        let id = resolve(Some(&user("www", None)), users, debian).unwrap();
        assert_eq!((id.uid, id.gid), (33, 33));
        let id = resolve(Some(&user("www", Some("staff"))), users, debian).unwrap();
        assert_eq!(id.gid, 50);
        // Unknown names, in nginx's words.
        assert_eq!(
            resolve(Some(&user("ghost", None)), users, debian).unwrap_err(),
            "getpwnam(\"ghost\") failed in conf/shard.conf:1"
        );
        assert_eq!(
            resolve(Some(&user("nobody", None)), users, debian).unwrap_err(),
            "getgrnam(\"nobody\") failed in conf/shard.conf:1"
        );
        assert_eq!(
            resolve(None, |_| None, debian).unwrap_err(),
            "getpwnam(\"nobody\") failed"
        );
    }
}
