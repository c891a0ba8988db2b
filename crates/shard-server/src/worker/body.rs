//! Request bodies held for the proxy, nginx's way: the first `client_body_buffer_size` bytes
//! in memory, and a body that outgrows them in a temporary file under `client_body_temp_path`.
//!
//! This module owns the [`Spool`] (memory part, file part), the temporary files (created with
//! no name, or unlinked as soon as they are opened, so a crash, a `kill -9` or a reload leaves
//! nothing on disk; named only where `client_body_in_file_only` asks for a file others can
//! read, as nginx's `$request_body_file`) and the worker's accounting of body memory: the gauges `body_mem_bytes`
//! and `body_temp_files`, the counter `body_spooled_bytes`, and the per-worker ceiling
//! [`BODY_MEMORY_WORKER_MAX`] past which even small bodies go to a file. It does not read the
//! client (that is `conn.rs`) nor write the upstream (`proxy.rs`).

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;

use shard_config::{BodyConf, InFileOnly, TempPath};

use super::Worker;
use crate::shm::WorkerSlot;

/// Most request-body bytes a worker keeps in memory, over all its connections; past it every
/// body is written to its temporary file as it arrives. 200 connections each holding a full
/// default buffer (8 KiB) stay well under it.
pub(super) const BODY_MEMORY_WORKER_MAX: usize = 16 << 20;

/// One request body: `mem` holds what is not in the file (the whole body while there is no
/// file).
#[derive(Default, Debug)]
pub(super) struct Spool {
    pub(super) mem: Vec<u8>,
    file: Option<OwnedFd>,
    file_len: u64,
    /// The file's name under `client_body_temp_path`: where it is (`client_body_in_file_only`)
    /// or where it goes if `$request_body_file` asks for it (an unnamed file).
    path: String,
    /// The file has the name `path` now.
    linked: std::cell::Cell<bool>,
    /// `client_body_in_file_only on`: the named file stays after the request.
    keep: bool,
    /// Bytes of memory charged to the worker for `mem` (its capacity when last counted).
    charged: usize,
}

impl Spool {
    /// The file and the body bytes in it, once the body went to a file.
    pub(super) fn file(&self) -> Option<(&OwnedFd, u64)> {
        self.file.as_ref().map(|f| (f, self.file_len))
    }

    pub(super) fn len(&self) -> u64 {
        self.file_len + self.mem.len() as u64
    }
}

impl shard_http::vars::BodyFile for Spool {
    /// `$request_body_file`: the name of the body's file. An unnamed file is given its name
    /// here, the first time a request asks (so only a configuration that uses the variable
    /// leaves a name that a crash could leave behind, as nginx's every file).
    fn name(&self) -> &str {
        let Some(fd) = &self.file else {
            return "";
        };
        if !self.linked.get() {
            let proc = format!("/proc/self/fd/{}\0", fd.as_raw_fd());
            let Ok(to) = CString::new(self.path.as_bytes()) else {
                return "";
            };
            // SAFETY: both are valid NUL-terminated strings.
            let r = unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    proc.as_ptr().cast(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            };
            if r != 0 {
                crate::log!(
                    Crit,
                    "linkat() \"{}\" failed ({})",
                    self.path,
                    shard_event::os_error_text(&std::io::Error::last_os_error())
                );
                return "";
            }
            self.linked.set(true);
        }
        &self.path
    }
}

impl Worker<'_> {
    /// After body bytes were appended to `s.mem`: writes them to the temporary file when the
    /// body outgrew `client_body_buffer_size`, when `client_body_in_file_only` asks for it, or
    /// when the worker holds too much body memory; with `last`, the whole body is then in the
    /// file. Errors are logged here; the request then fails with 500, as nginx's.
    pub(super) fn spool_settle(
        &mut self,
        s: &mut Spool,
        conf: &BodyConf,
        last: bool,
    ) -> std::io::Result<()> {
        let over_cap = self.body_mem > BODY_MEMORY_WORKER_MAX;
        let named = conf.in_file_only.any();
        let to_file = s.file.is_some() || named || s.mem.len() > conf.buffer_size || over_cap;
        let batch_full = s.mem.len() >= conf.buffer_size || last || over_cap;
        if to_file && batch_full && (!s.mem.is_empty() || (last && named)) {
            if s.file.is_none() {
                let (fd, path) = self.create_temp(&conf.temp_path, named)?;
                s.file = Some(fd);
                s.path = path;
                s.linked.set(named);
                s.keep = conf.in_file_only == InFileOnly::On;
                WorkerSlot::bump(&self.cx.slot.body_temp_files, 1);
            }
            self.mem_to_file(s, conf)?;
            if over_cap || last {
                // Memory is short, or nothing more comes: the buffer itself goes.
                s.mem = Vec::new();
            }
        }
        self.recharge(s);
        Ok(())
    }

    /// The client has nothing more to send for now: what is in memory goes to the file (there
    /// is one) and the buffer is given back.
    pub(super) fn spool_idle(&mut self, s: &mut Spool, conf: &BodyConf) -> std::io::Result<()> {
        if s.file.is_some() {
            self.mem_to_file(s, conf)?;
            s.mem = Vec::new();
            self.recharge(s);
        }
        Ok(())
    }

    /// Appends what `s.mem` holds to the body's file (which exists) and empties `s.mem`.
    fn mem_to_file(&mut self, s: &mut Spool, conf: &BodyConf) -> std::io::Result<()> {
        if s.mem.is_empty() {
            return Ok(());
        }
        let fd = s.file.as_ref().map_or(-1, |f| f.as_raw_fd());
        if let Err(e) = shard_event::fs::write_all(fd, &s.mem) {
            crate::log!(
                Crit,
                "write() to a client request body file in \"{}\" failed ({})",
                conf.temp_path.path.display(),
                shard_event::os_error_text(&e)
            );
            return Err(e);
        }
        s.file_len += s.mem.len() as u64;
        WorkerSlot::bump(&self.cx.slot.body_spooled_bytes, s.mem.len() as u64);
        s.mem.clear();
        Ok(())
    }

    /// Brings the worker's body-memory gauge up to date with `s.mem`'s capacity.
    pub(super) fn recharge(&mut self, s: &mut Spool) {
        let now = s.mem.capacity();
        self.body_mem = self.body_mem + now - s.charged;
        s.charged = now;
        self.cx
            .slot
            .body_mem_bytes
            .store(self.body_mem as u64, std::sync::atomic::Ordering::Relaxed);
    }

    /// The body is done with: its memory and its file are given back.
    pub(super) fn spool_release(&mut self, mut s: Spool) {
        s.mem = Vec::new();
        self.recharge(&mut s);
        if s.file.take().is_some() {
            WorkerSlot::drop_one(&self.cx.slot.body_temp_files);
        }
        if s.linked.get() && !s.keep {
            if let Err(e) = std::fs::remove_file(&s.path) {
                crate::log!(
                    Crit,
                    "unlink() \"{}\" failed ({})",
                    s.path,
                    shard_event::os_error_text(&e)
                );
            }
        }
    }

    /// A new temporary file under `tp`, with no name left on disk unless `named`, and the
    /// name it has or would have. The level directories are created on first use, as nginx's
    /// `ngx_create_temp_file`.
    fn create_temp(&mut self, tp: &TempPath, named: bool) -> std::io::Result<(OwnedFd, String)> {
        let mut created_dirs = false;
        self.temp_seq = self.temp_seq.wrapping_add(1);
        loop {
            let path = tp.file(self.temp_seq);
            let dir = path.parent().unwrap_or(&tp.path);
            let (Ok(cdir), Ok(cpath)) = (
                CString::new(dir.as_os_str().as_bytes()),
                CString::new(path.as_os_str().as_bytes()),
            ) else {
                return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
            };
            let made = if named {
                std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&path)
                    .map(OwnedFd::from)
            } else {
                shard_event::fs::create_unlinked(&cdir, &cpath)
            };
            match made {
                Ok(fd) => return Ok((fd, path.to_string_lossy().into_owned())),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    self.temp_seq = self.temp_seq.wrapping_add(1);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && !created_dirs => {
                    // The level directories of this name; the open is then tried once more
                    // and reports its own error if they could not be made.
                    created_dirs = true;
                    let mut b = std::fs::DirBuilder::new();
                    std::os::unix::fs::DirBuilderExt::mode(&mut b, 0o700);
                    let _ = b.recursive(true).create(dir);
                }
                Err(e) => {
                    crate::log!(
                        Crit,
                        "open() a client request body file in \"{}\" failed ({})",
                        dir.display(),
                        shard_event::os_error_text(&e)
                    );
                    return Err(e);
                }
            }
        }
    }
}
