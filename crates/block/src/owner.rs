//! One writer per device: the lock a [`FileDisk`](crate::FileDisk) opened for writing
//! holds for as long as it lives, and the name of whoever holds it when a second writer
//! is refused.
//!
//! ```text
//!   writer:  flock(LOCK_EX | LOCK_NB) on the open file   (+ O_EXCL on a block device)
//!            held by the open file description: a second open in the same process
//!            conflicts too, and dropping the FileDisk (closing it) releases it
//!   reader:  takes no lock at all (even a brief probe could make a writer that starts
//!            meanwhile fail); /proc/locks says whether a writer holds one, and the
//!            reader is told the data may be changing
//!   holder:  /proc/locks names the PID that took the flock; /proc/PID/cmdline says what
//!            it is ("cairn serve --md ..."); else any process with the file open
//! ```
//!
//! flock is what the kernel and util-linux use for whole-device ownership and it does not
//! interact with the POSIX record locks a client's own tools may take. O_EXCL on a block
//! device also keeps out the kernel's own claims (mounts, md, dm) and mdadm/lvm, which
//! open with O_EXCL; a flock alone would not.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::{Error, ErrorKind};

/// Who holds a device open for writing, as far as this process can see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InUse {
    /// The holding process, when it could be found.
    pub pid: Option<u32>,
    /// Its command line, shortened ("cairn serve --md m0.img,m1.img,m2.img").
    pub command: Option<String>,
    /// The holder is this very process (another export or array of the same server).
    pub this_process: bool,
    /// A block device the kernel refused to give exclusively: the holder may be the
    /// kernel itself (a mount, an md or dm device) rather than a process.
    pub maybe_kernel: bool,
}

impl std::fmt::Display for InUse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.this_process {
            return f.write_str("already open for writing in this process");
        }
        match (self.pid, &self.command) {
            (Some(pid), Some(cmd)) => write!(f, "in use by PID {pid} ({cmd})"),
            (Some(pid), None) => write!(f, "in use by PID {pid}"),
            _ if self.maybe_kernel => f.write_str(
                "in use by the kernel (mounted, or part of an md or dm device) or by a \
                 process this user cannot see",
            ),
            _ => f.write_str("in use by another process"),
        }
    }
}

impl std::error::Error for InUse {}

impl InUse {
    /// The [`InUse`] an error carries as its source, if it is a "busy" error.
    pub fn of(err: &Error) -> Option<&InUse> {
        if err.kind() != ErrorKind::Busy {
            return None;
        }
        std::error::Error::source(err).and_then(|s| s.downcast_ref::<InUse>())
    }
}

fn would_block(err: &std::io::Error) -> bool {
    err.raw_os_error() == Some(libc::EWOULDBLOCK)
}

fn flock(file: &File, op: libc::c_int) -> std::io::Result<()> {
    loop {
        // SAFETY: flock on a descriptor this File owns; no memory is passed.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EINTR) {
            return Err(err);
        }
    }
}

/// The error a second writer gets.
pub(crate) fn busy(name: &str, holder: InUse) -> Error {
    Error::new(ErrorKind::Busy, format!("open {name} for writing")).with_source(holder)
}

/// Takes the writer's lock on `file`, held until the file is closed. A lock someone else
/// holds is a [`ErrorKind::Busy`] error naming them.
pub(crate) fn lock_writer(file: &File, name: &str) -> Result<(), Error> {
    match flock(file, libc::LOCK_EX | libc::LOCK_NB) {
        Ok(()) => Ok(()),
        Err(e) if would_block(&e) => Err(busy(name, holder(file))),
        // A filesystem without flock (some network ones) cannot tell us; go on as the
        // kernel would for a plain open.
        Err(e) => {
            tracing::debug!("no flock on {name} ({e}); its ownership is not checked");
            Ok(())
        }
    }
}

/// For a reader: who holds `file` for writing now, if anyone. Takes no lock.
pub(crate) fn writer_of(file: &File) -> Option<InUse> {
    let meta = file.metadata().ok()?;
    if flock_pids(meta.dev(), meta.ino()).is_empty() {
        return None;
    }
    Some(holder(file))
}

/// Whoever holds the flock on `file`'s inode: /proc/locks first (it names the PID that
/// took a flock), else any other process with the same file open.
pub(crate) fn holder(file: &File) -> InUse {
    let Ok(meta) = file.metadata() else {
        return InUse {
            pid: None,
            command: None,
            this_process: false,
            maybe_kernel: false,
        };
    };
    let me = std::process::id();
    let from_locks = flock_pids(meta.dev(), meta.ino())
        .into_iter()
        .find(|&pid| pid == me || has_open(pid, &meta));
    let pid = from_locks.or_else(|| other_openers(&meta).into_iter().next());
    InUse {
        pid,
        command: pid.and_then(command_of),
        this_process: pid == Some(me),
        maybe_kernel: false,
    }
}

/// A block device's holder when an O_EXCL open found it busy: a process with the same
/// device open, if one is visible, another before this one (the kernel ties the claim to
/// an open file, so another export or array of this process can hold it too); else the
/// kernel (a mount, md, dm).
pub(crate) fn block_holder(rdev: u64) -> InUse {
    let me = std::process::id();
    let opened = |pid: u32| open_files(pid).any(|m| m.rdev() == rdev && is_block(&m));
    let pids = processes();
    let pid = pids
        .iter()
        .copied()
        .find(|&pid| pid != me && opened(pid))
        .or_else(|| opened(me).then_some(me));
    InUse {
        pid,
        command: pid.and_then(command_of),
        this_process: pid == Some(me),
        maybe_kernel: pid.is_none(),
    }
}

fn is_block(m: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::FileTypeExt;
    m.file_type().is_block_device()
}

/// PIDs of the write flocks /proc/locks lists on (dev, ino). Its lines read
/// `1: FLOCK  ADVISORY  WRITE 1234 fd:01:5678 0 EOF`; majors and minors in hex.
fn flock_pids(dev: u64, ino: u64) -> Vec<u32> {
    let Ok(text) = std::fs::read_to_string("/proc/locks") else {
        return Vec::new();
    };
    let want = format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev));
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            // Blocked waiters carry "->" after the number; they hold nothing.
            match f.as_slice() {
                [_, "FLOCK", _, "WRITE", pid, id, ..] if *id == want => pid.parse().ok(),
                _ => None,
            }
        })
        .collect()
}

fn processes() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    pids
}

/// What `pid`'s descriptors point at (those this user may look at).
fn open_files(pid: u32) -> impl Iterator<Item = std::fs::Metadata> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| std::fs::metadata(e.path()).ok())
}

fn has_open(pid: u32, meta: &std::fs::Metadata) -> bool {
    open_files(pid).any(|m| m.dev() == meta.dev() && m.ino() == meta.ino())
}

/// Other processes with the same file open: the best guess when /proc/locks named a
/// process that has since passed the descriptor on.
fn other_openers(meta: &std::fs::Metadata) -> Vec<u32> {
    let me = std::process::id();
    processes()
        .into_iter()
        .filter(|&pid| pid != me && has_open(pid, meta))
        .collect()
}

/// `pid`'s command line as a user would type it, program name without its directory,
/// shortened to a few lines' worth.
fn command_of(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut words = raw
        .split(|&b| b == 0)
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).into_owned());
    let prog = words.next()?;
    let prog = Path::new(&prog)
        .file_name()
        .map_or(prog.clone(), |n| n.to_string_lossy().into_owned());
    let mut cmd = std::iter::once(prog)
        .chain(words)
        .collect::<Vec<_>>()
        .join(" ");
    const MAX: usize = 240;
    if cmd.chars().count() > MAX {
        cmd = cmd.chars().take(MAX - 3).collect::<String>() + "...";
    }
    Some(cmd)
}
