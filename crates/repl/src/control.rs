//! The client side of a resource's control socket: where `cairn repl up` puts it, which
//! resources run on this host, and one request to one of them.
//!
//! ```text
//!   cairn repl up RES ── listens on DIR/repl-RES.sock: one JSON line in, one JSON line
//!                        out ({"ok", "message" | "error", "status"}), then it hangs up
//!   cairn repl VERB RES, cairn status ──────┐
//!   cairn serve: GET /v1/replication[/RES] ─┴─ call / statuses ──> DIR/repl-*.sock
//! ```
//!
//! DIR is the runtime directory the CLI chooses for all of cairn's sockets (its
//! `listen::runtime_dir`); callers pass it, so this module knows the names in it, not
//! where it is.

use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};

const PREFIX: &str = "repl-";
const SUFFIX: &str = ".sock";

/// The control socket of `resource` in `dir`, unless `cairn repl up --control` said
/// otherwise.
pub fn socket_path(dir: &Path, resource: &str) -> PathBuf {
    dir.join(format!("{PREFIX}{resource}{SUFFIX}"))
}

/// The resource a control socket in the runtime directory belongs to, by its name.
pub fn resource_of(path: &Path) -> Option<&str> {
    path.file_name()?
        .to_str()?
        .strip_prefix(PREFIX)?
        .strip_suffix(SUFFIX)
        .filter(|r| !r.is_empty())
}

/// The control sockets of the resources running on this host (`DIR/repl-*.sock`), in
/// name order. A socket left by a killed process is among them: [`CallError::is_gone`]
/// tells it apart when asked.
pub fn local_sockets(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| resource_of(p).is_some())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// Why a request to a resource's control socket got no answer.
#[derive(Debug)]
pub enum CallError {
    /// The socket could not be connected to (no such file, nobody listening, not
    /// allowed, or no room in its backlog within the timeout).
    Unreachable { path: PathBuf, source: io::Error },
    /// The connection broke, or the answer did not come within the timeout.
    Io { path: PathBuf, source: io::Error },
    /// The answer is not JSON.
    Malformed {
        path: PathBuf,
        source: serde_json::Error,
    },
}

impl CallError {
    /// No process is behind the socket (it was never started, or it died and left its
    /// socket file): the resource does not run here.
    pub fn is_gone(&self) -> bool {
        matches!(self, CallError::Unreachable { source, .. }
            if matches!(source.kind(), io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused))
    }

    /// The process is there but did not answer in time (stopped, or stuck).
    pub fn timed_out(&self) -> bool {
        matches!(self, CallError::Unreachable { source, .. } | CallError::Io { source, .. }
            if matches!(source.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut))
    }
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Unreachable { path, source } => write!(
                f,
                "cannot reach the resource at {} ({source}); is `cairn repl up` running?",
                path.display()
            ),
            CallError::Io { path, source } => write!(f, "{}: {source}", path.display()),
            CallError::Malformed { path, source } => {
                write!(f, "{}: malformed answer: {source}", path.display())
            }
        }
    }
}

impl std::error::Error for CallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CallError::Unreachable { source, .. } | CallError::Io { source, .. } => Some(source),
            CallError::Malformed { source, .. } => Some(source),
        }
    }
}

/// One request and its answer, each step (connecting, sending, the answer) within
/// `timeout`. A command that changes the role waits for flushes, so the CLI gives it
/// minutes; a status is answered at once by a live process.
pub fn call(path: &Path, req: &Value, timeout: Duration) -> Result<Value, CallError> {
    let unreachable = |source| CallError::Unreachable {
        path: path.to_path_buf(),
        source,
    };
    let broken = |source| CallError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut s = connect(path, timeout).map_err(unreachable)?;
    s.set_read_timeout(Some(timeout)).map_err(broken)?;
    s.write_all(format!("{req}\n").as_bytes()).map_err(broken)?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).map_err(broken)?;
    serde_json::from_str(&line).map_err(|source| CallError::Malformed {
        path: path.to_path_buf(),
        source,
    })
}

/// The status of the resource behind `path`: what `cairn --json repl status RES` prints.
pub fn status(path: &Path, timeout: Duration) -> Result<Value, CallError> {
    call(path, &json!({"cmd": "status"}), timeout)
        .map(|v| v.get("status").cloned().unwrap_or(Value::Null))
}

/// The status of each resource behind `paths`, one after the other; the first that
/// does not answer is the error.
pub fn statuses(paths: &[PathBuf], timeout: Duration) -> Result<Vec<Value>, CallError> {
    paths.iter().map(|p| status(p, timeout)).collect()
}

/// The status of each resource behind `paths`, asked all at once: a resource that does
/// not answer costs `timeout` (about three times it at worst), not `timeout` per
/// resource.
pub fn statuses_at_once(paths: &[PathBuf], timeout: Duration) -> Vec<Result<Value, CallError>> {
    std::thread::scope(|s| {
        let asks: Vec<_> = paths
            .iter()
            .map(|p| s.spawn(move || status(p, timeout)))
            .collect();
        asks.into_iter()
            .zip(paths)
            .map(|(h, p)| {
                h.join().unwrap_or_else(|_| {
                    Err(CallError::Io {
                        path: p.clone(),
                        source: io::Error::other("the request's thread panicked"),
                    })
                })
            })
            .collect()
    })
}

/// `UnixStream::connect`, waiting at most `timeout` for room in the listener's backlog.
/// A process that stopped accepting (SIGSTOP, a stuck control thread) fills its backlog
/// with the connections nobody takes, and then a plain connect waits for ever; on a Unix
/// socket the wait is bounded by the send timeout (SO_SNDTIMEO), set before connecting.
fn connect(path: &Path, timeout: Duration) -> io::Result<UnixStream> {
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data, for which all zeros is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a usable Unix socket path (too long, or a NUL byte)",
        ));
    }
    addr.sun_family = libc::sa_family_t::try_from(libc::AF_UNIX).expect("AF_UNIX fits");
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = libc::c_char::from_ne_bytes([*s]);
    }
    // SAFETY: socket(2) takes no pointers; the result is checked below.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a socket just created here, owned by nothing else.
    let stream = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    stream.set_write_timeout(Some(timeout))?;
    let len = std::mem::offset_of!(libc::sockaddr_un, sun_path) + bytes.len() + 1;
    let len = libc::socklen_t::try_from(len).expect("a sockaddr_un's size");
    // SAFETY: addr is an initialised sockaddr_un and len is at most its size (the path
    // is shorter than sun_path and NUL-terminated by the zeroing).
    let r = unsafe {
        libc::connect(
            stream.as_raw_fd(),
            std::ptr::from_ref(&addr).cast::<libc::sockaddr>(),
            len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::time::Instant;

    /// A scratch directory, removed when the test ends, whether it passed or not.
    struct Scratch(PathBuf);

    impl std::ops::Deref for Scratch {
        type Target = Path;
        fn deref(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(name: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("cairn-repl-ctl-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    #[test]
    fn names_in_the_runtime_directory() {
        let dir = scratch("names");
        assert_eq!(
            socket_path(&dir, "home"),
            dir.join("repl-home.sock"),
            "the path `cairn repl up` listens on"
        );
        assert_eq!(resource_of(&dir.join("repl-home.sock")), Some("home"));
        assert_eq!(resource_of(&dir.join("repl-.sock")), None);
        assert_eq!(resource_of(&dir.join("repl-home.nbd")), None);
        assert_eq!(resource_of(&dir.join("control.sock")), None);
        for f in ["repl-b.sock", "repl-a.sock", "repl-a.nbd", "control.sock"] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        assert_eq!(
            local_sockets(&dir),
            vec![dir.join("repl-a.sock"), dir.join("repl-b.sock")]
        );
        assert!(local_sockets(&dir.join("missing")).is_empty());
    }

    #[test]
    fn an_answer_a_dead_socket_and_a_process_that_takes_nothing() {
        let dir = scratch("calls");
        // A resource that answers, as `cairn repl up` does.
        let live = socket_path(&dir, "home");
        let l = UnixListener::bind(&live).unwrap();
        let server = std::thread::spawn(move || {
            let (c, _) = l.accept().unwrap();
            let mut line = String::new();
            BufReader::new(&c).read_line(&mut line).unwrap();
            assert_eq!(line, "{\"cmd\":\"status\"}\n");
            (&c).write_all(b"{\"ok\":true,\"message\":\"\",\"status\":{\"resource\":\"home\"}}\n")
                .unwrap();
        });
        let t = Duration::from_secs(5);
        assert_eq!(status(&live, t).unwrap(), json!({"resource": "home"}));
        server.join().unwrap();
        // A socket file whose process died: gone, and said as the CLI always said it.
        let dead = socket_path(&dir, "dead");
        drop(UnixListener::bind(&dead).unwrap());
        let e = status(&dead, t).unwrap_err();
        assert!(e.is_gone() && !e.timed_out(), "{e:?}");
        assert!(
            e.to_string().starts_with(&format!(
                "cannot reach the resource at {} (",
                dead.display()
            )) && e.to_string().ends_with("); is `cairn repl up` running?"),
            "{e}"
        );
        // A process that accepts nothing (stopped): every call ends within its timeout:
        // first connected (into the backlog) with no answer, then, once the backlog is
        // full, without a connection, where a plain connect would wait for ever.
        let stuck = socket_path(&dir, "stuck");
        let held = UnixListener::bind(&stuck).unwrap();
        // A backlog of 1 (listen again: Linux takes the new length) fills without
        // opening thousands of descriptors.
        // SAFETY: listen(2) on a socket this test owns; no pointers.
        assert_eq!(unsafe { libc::listen(held.as_raw_fd(), 1) }, 0);
        let short = Duration::from_millis(100);
        let started = Instant::now();
        let e = status(&stuck, short).unwrap_err();
        assert!(
            matches!(e, CallError::Io { .. }) && e.timed_out() && !e.is_gone(),
            "connected, then no answer: {e:?}"
        );
        let mut queued = Vec::new();
        let full = loop {
            match connect(&stuck, short) {
                Ok(c) => queued.push(c),
                Err(e) => break e,
            }
            assert!(queued.len() < 64, "the backlog never filled");
        };
        assert_eq!(full.kind(), io::ErrorKind::WouldBlock, "{full}");
        let e = status(&stuck, short).unwrap_err();
        assert!(
            matches!(e, CallError::Unreachable { .. }) && e.timed_out() && !e.is_gone(),
            "no room in the backlog: {e:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        // All at once: one result per socket, in order.
        let all = statuses_at_once(&[dead.clone(), stuck.clone()], short);
        assert!(all[0].as_ref().unwrap_err().is_gone());
        assert!(all[1].as_ref().unwrap_err().timed_out());
    }
}
