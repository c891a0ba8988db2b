//! WebDAV's write methods (`ngx_http_dav_module`): `PUT`, `DELETE`, `MKCOL`, `COPY` and
//! `MOVE` on the files `root`/`alias` map a location's URIs to, with nginx's checks, statuses
//! and log lines.
//!
//! `PUT`'s body is read by the proxy's body machinery (memory up to
//! `client_body_buffer_size`, then an unnamed temporary file; limits, timeouts, chunked): the
//! request is a `Proxy` marked `dav` that never connects, and [`Worker::dav_put_done`] puts
//! the body in place (a hard link of the temporary file where it is on the same file system,
//! else a copy into a temporary name beside the destination) and renames it over the
//! destination, so a reader never sees half a file. The other methods act at once. This
//! module owns those file operations; it does not read the client or answer it (the phases
//! in `conn.rs` do, with the status and `Location` it gives).

use std::ffi::CString;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use shard_config::{DavConf, LocationConf};
use shard_http::request::{Method, Request};

use super::body::Spool;
use super::Worker;

/// What a DAV request comes to.
pub(super) enum DavStep {
    /// The answer: its status, and the `Location` of what was created.
    Answer(u16, Option<String>),
    /// `PUT`: its body is read first, then [`Worker::dav_put_done`].
    ReadBody,
}

/// The `dav_methods` bit of the request's method, when `loc` handles it.
pub(super) fn dav_method(loc: &LocationConf, req: &Request) -> Option<u8> {
    if loc.dav.methods == 0 {
        return None;
    }
    let bit = match &req.method {
        Method::Put => DavConf::PUT,
        Method::Delete => DavConf::DELETE,
        Method::Other(m) if m == "MKCOL" => DavConf::MKCOL,
        Method::Other(m) if m == "COPY" => DavConf::COPY,
        Method::Other(m) if m == "MOVE" => DavConf::MOVE,
        _ => return None,
    };
    (loc.dav.methods & bit != 0).then_some(bit)
}

/// A header's value in the request head, the first of that name.
fn header<'h>(head: &'h [u8], name: &str) -> Option<&'h str> {
    let mut storage = shard_http::vars::header_storage();
    let hs = shard_http::vars::request_headers(head, &mut storage);
    let v = hs.iter().find(|h| h.name.eq_ignore_ascii_case(name))?.value;
    // The head outlives the parse: the value is a slice of it.
    let start = v.as_ptr() as usize - head.as_ptr() as usize;
    std::str::from_utf8(&head[start..start + v.len()]).ok()
}

/// nginx's `ngx_http_dav_depth`: `0`, `1`, `infinity` (absent: `default`); anything else is
/// invalid (`None`, logged).
fn depth(head: &[u8], default: Depth) -> Option<Depth> {
    match header(head, "depth") {
        None => Some(default),
        Some("0") => Some(Depth::Zero),
        Some("1") => Some(Depth::One),
        Some("infinity") => Some(Depth::Infinity),
        Some(v) => {
            crate::log!(Error, "client sent invalid \"Depth\" header: \"{v}\"");
            None
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Depth {
    Zero,
    One,
    Infinity,
}

/// nginx's `ngx_http_dav_error`: the status for a failed file operation (`not_found` for a
/// missing path), and its log line.
fn error_status(e: &std::io::Error, not_found: u16, op: &str, path: &Path) -> u16 {
    let (crit, status) = match e.raw_os_error() {
        Some(libc::ENOENT | libc::ENOTDIR | libc::ENAMETOOLONG) => (false, not_found),
        Some(libc::EACCES | libc::EPERM) => (false, 403),
        Some(libc::EEXIST) => (false, 405),
        Some(libc::ENOSPC) => (true, 507),
        _ => (true, 500),
    };
    let text = shard_event::os_error_text(e);
    if crit {
        crate::log!(Crit, "{op} \"{}\" failed ({text})", path.display());
    } else {
        crate::log!(Error, "{op} \"{}\" failed ({text})", path.display());
    }
    status
}

/// A directory's mode for `dav_access`: `x` wherever `r` is (nginx's `ngx_dir_access`).
fn dir_mode(access: u32) -> u32 {
    access | ((access & 0o444) >> 2)
}

impl<'a> Worker<'a> {
    /// The answer to a DAV request: an error page for an error status, else the status with
    /// no body (`Content-Length: 0` but for 204) and the `Location` of what was created.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dav_answer(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &Request,
        keep_alive: bool,
        head: &[u8],
        status: u16,
        location: Option<String>,
    ) -> super::step::Reply {
        if status >= 300 {
            return super::respond::status(self, key, loc, req, keep_alive, head, status);
        }
        let r = shard_http::response::Simple {
            status,
            content_type: None,
            location,
            body: Vec::new(),
        };
        super::respond::simple_reply(self, key, loc, req, keep_alive, head, r)
    }

    /// A `PUT` whose file is in place (or not: `status`): the request is answered through
    /// the phases (`Rewritten::Answer`), which log it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn dav_put_answer(
        &mut self,
        key: usize,
        server: usize,
        loc: &'a LocationConf,
        req: Request,
        head: Vec<u8>,
        keep_alive: bool,
        status: u16,
        location: Option<String>,
    ) {
        self.run_phases(
            key,
            server,
            loc,
            super::conn::Phases {
                req,
                head,
                hops: 0,
                keep_alive,
                more_input: false,
                forced: None,
                rewritten: Some(super::conn::Rewritten::Answer(status, location)),
                after_upstream: true,
            },
        );
    }

    /// The file `uri` maps to in `loc` for this request (`root`/`alias`, variables rendered).
    fn dav_path(
        &self,
        key: usize,
        loc: &LocationConf,
        req: &Request,
        head: &[u8],
        uri: &str,
    ) -> PathBuf {
        let root = self.doc_root(key, req, loc, head);
        shard_http::static_file::map_path_with(loc, uri, root.as_deref())
    }

    /// Runs a DAV method (`bit`) on `key`'s request in `loc`.
    pub(super) fn dav(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &Request,
        head: &[u8],
        bit: u8,
    ) -> DavStep {
        let has_body = matches!(
            req.body,
            shard_http::request::Body::Chunked | shard_http::request::Body::Length(1..)
        );
        let answer = |s| DavStep::Answer(s, None);
        match bit {
            DavConf::PUT => {
                if req.path.ends_with('/') {
                    crate::log!(
                        Error,
                        "cannot PUT to a collection{}",
                        self.log_context(key, Some(req))
                    );
                    return answer(409);
                }
                if header(head, "content-range").is_some() {
                    crate::log!(
                        Error,
                        "PUT with range is unsupported{}",
                        self.log_context(key, Some(req))
                    );
                    return answer(501);
                }
                DavStep::ReadBody
            }
            _ if has_body => {
                let what = match bit {
                    DavConf::DELETE => "DELETE with body is",
                    DavConf::MKCOL => "MKCOL with body is",
                    _ => "COPY and MOVE with body are",
                };
                crate::log!(
                    Error,
                    "{what} unsupported{}",
                    self.log_context(key, Some(req))
                );
                answer(415)
            }
            DavConf::DELETE => answer(self.dav_delete(key, loc, req, head)),
            DavConf::MKCOL => self.dav_mkcol(key, loc, req, head),
            _ => self.dav_copy_move(key, loc, req, head, bit == DavConf::MOVE),
        }
    }

    fn dav_delete(&mut self, key: usize, loc: &LocationConf, req: &Request, head: &[u8]) -> u16 {
        let ctx = self.log_context(key, Some(req));
        let min = loc.dav.min_delete_depth;
        if min > 0 {
            // nginx counts the `/`s that have something after them.
            let uri = req.path.as_bytes();
            let mut d = 0;
            let mut ok = false;
            for (i, &c) in uri.iter().enumerate() {
                if c == b'/' {
                    d += 1;
                    if d >= min && i + 1 < uri.len() {
                        ok = true;
                        break;
                    }
                }
            }
            if !ok {
                crate::log!(Error, "insufficient URI depth:{d} to DELETE{ctx}");
                return 409;
            }
        }
        let path = self.dav_path(key, loc, req, head, &req.path);
        let meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) => {
                let not_found = if e.raw_os_error() == Some(libc::ENOTDIR) {
                    409
                } else {
                    404
                };
                return error_status(&e, not_found, "lstat()", &path);
            }
        };
        if meta.is_dir() {
            if !req.path.ends_with('/') {
                crate::log!(
                    Error,
                    "DELETE \"{}\" failed (21: Is a directory){ctx}",
                    path.display()
                );
                return 409;
            }
            match depth(head, Depth::Infinity) {
                Some(Depth::Infinity) => {}
                _ => {
                    crate::log!(Error, "\"Depth\" header must be infinity{ctx}");
                    return 400;
                }
            }
            delete_tree(&path);
            match std::fs::remove_dir(&path) {
                Ok(()) => 204,
                Err(e) => error_status(&e, 404, "rmdir()", &path),
            }
        } else {
            match depth(head, Depth::Zero) {
                Some(Depth::Zero | Depth::Infinity) => {}
                _ => {
                    crate::log!(Error, "\"Depth\" header must be 0 or infinity{ctx}");
                    return 400;
                }
            }
            match std::fs::remove_file(&path) {
                Ok(()) => 204,
                Err(e) => error_status(&e, 404, "unlink()", &path),
            }
        }
    }

    fn dav_mkcol(&mut self, key: usize, loc: &LocationConf, req: &Request, head: &[u8]) -> DavStep {
        if !req.path.ends_with('/') {
            crate::log!(
                Error,
                "MKCOL can create a collection only{}",
                self.log_context(key, Some(req))
            );
            return DavStep::Answer(409, None);
        }
        let path = self.dav_path(key, loc, req, head, &req.path);
        let target = path.as_os_str().as_bytes();
        let target = Path::new(std::ffi::OsStr::from_bytes(
            target.strip_suffix(b"/").unwrap_or(target),
        ));
        match std::fs::DirBuilder::new()
            .mode(dir_mode(loc.dav.access))
            .create(target)
        {
            Ok(()) => DavStep::Answer(201, Some(location(&req.path))),
            Err(e) => DavStep::Answer(error_status(&e, 409, "mkdir()", target), None),
        }
    }

    fn dav_copy_move(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &Request,
        head: &[u8],
        mv: bool,
    ) -> DavStep {
        let ctx = self.log_context(key, Some(req));
        let answer = |s| DavStep::Answer(s, None);
        let Some(dest) = header(head, "destination") else {
            crate::log!(Error, "client sent no \"Destination\" header{ctx}");
            return answer(400);
        };
        let invalid = || {
            crate::log!(
                Error,
                "client sent invalid \"Destination\" header: \"{dest}\"{ctx}"
            );
            DavStep::Answer(400, None)
        };
        // An absolute path, or a URL on this host with the connection's scheme.
        let duri = if dest.starts_with('/') {
            dest
        } else {
            let Some(host) = header(head, "host").filter(|h| !h.is_empty()) else {
                crate::log!(Error, "client sent no \"Host\" header{ctx}");
                return answer(400);
            };
            let scheme = if self.is_tls(key) {
                "https://"
            } else {
                "http://"
            };
            let Some(rest) = dest.strip_prefix(scheme) else {
                return invalid();
            };
            let Some(after) = rest.strip_prefix(host) else {
                crate::log!(
                    Error,
                    "\"Destination\" URI \"{dest}\" is handled by different repository than the source URI{ctx}"
                );
                return answer(400);
            };
            match after.find('/') {
                Some(i) => &after[i..],
                None => return invalid(),
            }
        };
        // The destination's path, unescaped and checked as nginx's `ngx_http_parse_unsafe_uri`.
        let Some(dpath) = unsafe_uri(duri) else {
            return invalid();
        };
        if req.path.ends_with('/') != dpath.ends_with('/') {
            crate::log!(
                Error,
                "both URI \"{}\" and \"Destination\" URI \"{dest}\" should be either collections or non-collections{ctx}",
                req.path
            );
            return answer(409);
        }
        if loc.alias.is_some() && loc.kind != shard_config::LocationKind::Regex {
            let prefix = loc.alias_from.as_deref().unwrap_or(loc.path.as_str());
            if !dpath.starts_with(prefix) {
                return invalid();
            }
        }
        let depth_ok = match depth(head, Depth::Infinity) {
            Some(Depth::Infinity) => true,
            Some(Depth::Zero) if !mv => true,
            Some(_) if !mv => {
                crate::log!(Error, "\"Depth\" header must be 0 or infinity{ctx}");
                false
            }
            Some(_) => {
                crate::log!(Error, "\"Depth\" header must be infinity{ctx}");
                false
            }
            None => false,
        };
        if !depth_ok {
            return answer(400);
        }
        let overwrite = match header(head, "overwrite") {
            None => true,
            Some("T" | "t") => true,
            Some("F" | "f") => false,
            Some(v) => {
                crate::log!(
                    Error,
                    "client sent invalid \"Overwrite\" header: \"{v}\"{ctx}"
                );
                return answer(400);
            }
        };
        let src = merge_slashes(&self.dav_path(key, loc, req, head, &req.path));
        let mut dst = merge_slashes(&self.dav_path(key, loc, req, head, &dpath));
        let slash = dst.as_os_str().as_bytes().ends_with(b"/") && dst.as_os_str().len() > 1;
        if slash {
            let b = dst.as_os_str().as_bytes();
            dst = PathBuf::from(std::ffi::OsStr::from_bytes(&b[..b.len() - 1]));
        }
        let method = if mv { "MOVE" } else { "COPY" };
        // The same place, or a collection into itself: 403.
        let s = src.as_os_str().as_bytes();
        let s = s.strip_suffix(b"/").unwrap_or(s);
        let d = dst.as_os_str().as_bytes();
        if s == d {
            crate::log!(
                Error,
                "both URI \"{}\" and \"Destination\" URI \"{dest}\" point to the same location{ctx}",
                req.path
            );
            return answer(403);
        }
        let n = s.len().min(d.len());
        if slash
            && s[..n] == d[..n]
            && (if s.len() < d.len() {
                d[s.len()] == b'/'
            } else {
                s[d.len()] == b'/'
            })
        {
            crate::log!(
                Error,
                "\"{}\" could not be {method}ed to collection \"{dest}\"{ctx}",
                req.path
            );
            return answer(403);
        }
        let (existed, dst_dir) = match std::fs::symlink_metadata(&dst) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => (false, false),
            Err(e) => return answer(error_status(&e, 404, "lstat()", &dst)),
            Ok(m) => {
                if m.is_dir() && !slash {
                    crate::log!(
                        Error,
                        "\"{}\" could not be {method}ed to collection \"{dest}\"{ctx}",
                        req.path
                    );
                    return answer(409);
                }
                if !overwrite {
                    crate::log!(
                        Error,
                        "\"{}\" could not be created (17: File exists){ctx}",
                        dst.display()
                    );
                    return answer(412);
                }
                (true, m.is_dir())
            }
        };
        let src_meta = match std::fs::symlink_metadata(&src) {
            Ok(m) => m,
            Err(e) => return answer(error_status(&e, 404, "lstat()", &src)),
        };
        if src_meta.is_dir() {
            if !req.path.ends_with('/') {
                crate::log!(Error, "\"{}\" is collection{ctx}", req.path);
                return answer(400);
            }
            if existed {
                if dst_dir {
                    delete_tree(&dst);
                    if let Err(e) = std::fs::remove_dir(&dst) {
                        return answer(error_status(&e, 404, "rmdir()", &dst));
                    }
                } else if let Err(e) = std::fs::remove_file(&dst) {
                    return answer(error_status(&e, 404, "unlink()", &dst));
                }
            }
            let src_dir = PathBuf::from(std::ffi::OsStr::from_bytes(s));
            if mv && std::fs::rename(&src_dir, &dst).is_ok() {
                return answer(201);
            }
            let mode = src_meta.permissions().mode() & 0o7777;
            if let Err(e) = std::fs::DirBuilder::new().mode(mode).create(&dst) {
                return answer(error_status(&e, 404, "mkdir()", &dst));
            }
            copy_tree(&src_dir, &dst, loc.dav.access);
            if mv {
                delete_tree(&src_dir);
                if let Err(e) = std::fs::remove_dir(&src_dir) {
                    return answer(error_status(&e, 404, "rmdir()", &src_dir));
                }
            }
            return answer(201);
        }
        if mv {
            // A rename where it can be (the same file system), else a copy and an unlink.
            let made = make_parents(&dst, dir_mode(loc.dav.access)).and_then(|()| {
                match std::fs::rename(&src, &dst) {
                    Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                        copy_file(&src, &dst, &src_meta)?;
                        std::fs::remove_file(&src)
                    }
                    other => other,
                }
            });
            return match made {
                Ok(()) => answer(204),
                Err(e) => {
                    crate::log!(
                        Crit,
                        "rename() \"{}\" to \"{}\" failed ({}){ctx}",
                        src.display(),
                        dst.display(),
                        shard_event::os_error_text(&e)
                    );
                    answer(500)
                }
            };
        }
        match copy_file(&src, &dst, &src_meta) {
            Ok(()) => answer(204),
            Err(e) => {
                crate::log!(
                    Crit,
                    "copy \"{}\" to \"{}\" failed ({}){ctx}",
                    src.display(),
                    dst.display(),
                    shard_event::os_error_text(&e)
                );
                answer(500)
            }
        }
    }

    /// `PUT`'s body is all read (`body`): it becomes the file, renamed over what was
    /// there. Returns the answer's status (201 created, 204 replaced) and `Location`.
    pub(super) fn dav_put_done(
        &mut self,
        key: usize,
        loc: &LocationConf,
        req: &Request,
        head: &[u8],
        body: &Spool,
    ) -> (u16, Option<String>) {
        let path = self.dav_path(key, loc, req, head, &req.path);
        let ctx = self.log_context(key, Some(req));
        let status = match std::fs::metadata(&path) {
            Err(_) => 201,
            Ok(m) if m.is_dir() => {
                crate::log!(
                    Error,
                    "\"{}\" could not be created (21: Is a directory){ctx}",
                    path.display()
                );
                return (409, None);
            }
            Ok(_) => 204,
        };
        let dav = loc.dav;
        if dav.create_full_put_path {
            if let Err(e) = make_parents(&path, dir_mode(dav.access)) {
                return (error_status(&e, 409, "mkdir()", &path), None);
            }
        }
        // `Date`: the file's modification time, as nginx.
        let mtime = header(head, "date").and_then(shard_http::parse_http_date);
        let placed = put_in_place(body, &path, dav.access, mtime);
        match placed {
            Ok(()) => {
                let location = (status == 201).then(|| location(&req.path));
                (status, location)
            }
            Err(e) => {
                // The directory is missing (no `create_full_put_path`): 409, as nginx's
                // rename of the temporary file fails.
                let not_found = 409;
                let s = error_status(&e, not_found, "rename()", &path);
                (
                    if s == 409 || s == 403 || s == 507 {
                        s
                    } else {
                        500
                    },
                    None,
                )
            }
        }
    }
}

/// The body of `p` as the file `path` (mode `access`, `mtime` when given): the temporary file
/// linked under a temporary name beside `path` where it can be, else the body written there;
/// then renamed over `path`.
fn put_in_place(body: &Spool, path: &Path, access: u32, mtime: Option<i64>) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temp = dir.join(format!(
        ".{name}.shard-put.{}.{}",
        std::process::id(),
        unique()
    ));
    let mut linked = false;
    if let Some((fd, _)) = body.file().filter(|_| body.mem.is_empty()) {
        let from = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).unwrap_or_default();
        let to = CString::new(temp.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: both are valid NUL-terminated strings.
        let r = unsafe {
            libc::linkat(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                libc::AT_SYMLINK_FOLLOW,
            )
        };
        linked = r == 0;
    }
    let result = (|| {
        if !linked {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(access)
                .open(&temp)?;
            if let Some((fd, len)) = body.file() {
                let mut off = 0u64;
                let mut buf = vec![0u8; 64 * 1024];
                while off < len {
                    let want = buf.len().min((len - off) as usize);
                    let n = shard_event::sock::pread(fd.as_raw_fd(), &mut buf[..want], off)?;
                    if n == 0 {
                        return Err(std::io::Error::from_raw_os_error(libc::EIO));
                    }
                    f.write_all(&buf[..n])?;
                    off += n as u64;
                }
            }
            f.write_all(&body.mem)?;
        }
        std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(access))?;
        if let Some(t) = mtime {
            set_mtime(&temp, t);
        }
        std::fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

fn set_mtime(path: &Path, secs: i64) {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    let t = libc::timespec {
        tv_sec: secs as libc::time_t,
        tv_nsec: 0,
    };
    let times = [t, t];
    // SAFETY: a valid path and two timespecs.
    unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), times.as_ptr(), 0) };
}

/// The directories `path` would be in, made with `mode` where missing.
fn make_parents(path: &Path, mode: u32) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(dir),
        _ => Ok(()),
    }
}

/// A copy of one file with its mode and modification time.
fn copy_file(src: &Path, dst: &Path, meta: &std::fs::Metadata) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    std::fs::copy(src, dst)?;
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    set_mtime(dst, meta.mtime());
    Ok(())
}

/// Everything under `dir` (not `dir` itself) removed, failures logged and passed over, as
/// nginx's tree walk.
fn delete_tree(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        let r = if is_dir {
            delete_tree(&p);
            std::fs::remove_dir(&p)
        } else {
            std::fs::remove_file(&p)
        };
        if let Err(e) = r {
            let op = if is_dir { "rmdir()" } else { "unlink()" };
            error_status(&e, 0, op, &p);
        }
    }
}

/// Everything under `src` copied into `dst` (which exists): directories with `dav_access`
/// made executable, files with their own mode and time.
fn copy_tree(src: &Path, dst: &Path, access: u32) {
    let Ok(entries) = std::fs::read_dir(src) else {
        return;
    };
    for e in entries.flatten() {
        let from = e.path();
        let to = dst.join(e.file_name());
        let Ok(meta) = std::fs::symlink_metadata(&from) else {
            continue;
        };
        if meta.is_dir() {
            if let Err(e) = std::fs::DirBuilder::new()
                .mode(dir_mode(access))
                .create(&to)
            {
                error_status(&e, 0, "mkdir()", &to);
                continue;
            }
            copy_tree(&from, &to, access);
            use std::os::unix::fs::MetadataExt;
            set_mtime(&to, meta.mtime());
        } else if meta.is_file() {
            if let Err(e) = copy_file(&from, &to, &meta) {
                error_status(&e, 0, "copy", &to);
            }
        }
    }
}

/// `//` runs made one `/` (nginx's `ngx_http_dav_merge_slashes`).
fn merge_slashes(p: &Path) -> PathBuf {
    let b = p.as_os_str().as_bytes();
    let mut out = Vec::with_capacity(b.len());
    for &c in b {
        if c == b'/' && out.last() == Some(&b'/') {
            continue;
        }
        out.push(c);
    }
    PathBuf::from(std::ffi::OsStr::from_bytes(&out))
}

/// A `Location` for what was made: the URI, escaped as nginx's `NGX_ESCAPE_URI`.
fn location(uri: &str) -> String {
    let mut s = String::with_capacity(uri.len());
    for &c in uri.as_bytes() {
        if c <= b' ' || c >= 0x7f || matches!(c, b'"' | b'#' | b'%' | b'?') {
            s.push_str(&format!("%{c:02X}"));
        } else {
            s.push(c as char);
        }
    }
    s
}

/// The destination's path from the `Destination` URI: the query dropped, `%XX` decoded, and
/// refused (`None`) when it climbs above the root or holds a NUL, as nginx's
/// `ngx_http_parse_unsafe_uri`.
fn unsafe_uri(uri: &str) -> Option<String> {
    let uri = uri.split_once('?').map_or(uri, |(p, _)| p);
    let b = uri.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            let v = u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?;
            out.push(v);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    if out.contains(&0) {
        return None;
    }
    let s = String::from_utf8(out).ok()?;
    // `..` as a whole segment (and `.` segments) are unsafe.
    if s.split('/').any(|seg| seg == ".." || seg == ".") {
        return None;
    }
    Some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations_are_decoded_and_climbing_ones_refused() {
        assert_eq!(unsafe_uri("/a%20b?x=1").as_deref(), Some("/a b"));
        assert_eq!(unsafe_uri("/a/../b"), None);
        assert_eq!(unsafe_uri("/a%00"), None);
        assert_eq!(location("/file sp"), "/file%20sp");
        assert_eq!(dir_mode(0o640), 0o750);
        assert_eq!(
            merge_slashes(Path::new("/a//b///c")),
            PathBuf::from("/a/b/c")
        );
    }
}
