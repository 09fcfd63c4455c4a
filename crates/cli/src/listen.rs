//! Where to listen when the user did not say: a Unix socket in the runtime directory plus
//! the standard NBD port on loopback.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use cairn_nbd::Listen;

use crate::error::{CliError, Result};

/// The IANA-assigned NBD port.
pub const NBD_PORT: u16 = 10809;

/// Longest path a Unix socket address holds (sun_path is 108 bytes with the NUL).
const MAX_SOCKET_PATH: usize = 107;

/// `$XDG_RUNTIME_DIR/cairn`, `/run/cairn` for root, else `/tmp/cairn-UID`.
pub fn runtime_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_RUNTIME_DIR") {
        let dir = PathBuf::from(dir);
        if dir.is_absolute() && dir.is_dir() {
            return dir.join("cairn");
        }
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        PathBuf::from("/run/cairn")
    } else {
        PathBuf::from(format!("/tmp/cairn-{uid}"))
    }
}

/// The default socket path and TCP address.
pub fn defaults() -> (PathBuf, SocketAddr) {
    (
        runtime_dir().join("nbd.sock"),
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, NBD_PORT)),
    )
}

/// Makes sure a Unix socket can be created at `path`: the path fits in a socket address,
/// and its directory exists (created owner-only if missing). A default runtime directory
/// (see [`runtime_dir`]) must also be private: see [`check_private_dir`].
pub fn prepare_socket_path(path: &Path) -> Result<()> {
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(CliError::new(format!(
            "socket path {} is longer than the {MAX_SOCKET_PATH} bytes a Unix socket allows; \
             choose a shorter one with --listen unix:PATH",
            path.display()
        )));
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        let runtime = is_runtime_dir(dir);
        if !dir.is_dir() {
            // The runtime directory itself is made with one mkdir (its parent, /tmp or
            // $XDG_RUNTIME_DIR, exists), so one that another user made first is an
            // error here and refused below, never silently used.
            let mut b = std::fs::DirBuilder::new();
            b.mode(0o700).recursive(!runtime);
            match b.create(dir) {
                Ok(()) => {}
                Err(e) if runtime && e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(CliError::new(format!(
                        "cannot create the socket directory {}: {e}; choose another place \
                         with --listen unix:PATH",
                        dir.display()
                    )))
                }
            }
        }
        if runtime {
            check_private_dir(dir)?;
        }
    }
    Ok(())
}

/// True for the directories cairn picks for its sockets when not told: whoever can write
/// there can replace a socket and receive the requests (and keys) meant for cairn.
pub fn is_runtime_dir(dir: &Path) -> bool {
    dir == runtime_dir() || dir == Path::new("/run/cairn")
}

/// Refuses a runtime directory that is not private: it must be a real directory (not a
/// symlink) owned by this user, with no permissions for others (for root, none to write:
/// /run/cairn may be 0755). A missing directory is fine (nothing to hijack).
pub fn check_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = match std::fs::symlink_metadata(dir) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(CliError::new(format!(
                "cannot check the runtime directory {}: {e}",
                dir.display()
            )))
        }
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let mode = meta.permissions().mode() & 0o7777;
    let open_to_others = if uid == 0 { 0o022 } else { 0o077 };
    let problem = if !meta.file_type().is_dir() {
        "is not a directory (a symlink or another file)".to_string()
    } else if meta.uid() != uid {
        format!("belongs to uid {}, not to you (uid {uid})", meta.uid())
    } else if mode & open_to_others != 0 {
        format!("is open to other users (mode {mode:04o})")
    } else {
        return Ok(());
    };
    Err(CliError::new(format!(
        "the runtime directory {} {problem}, so another user could replace cairn's sockets \
         there; remove it (cairn makes it again, owner-only) or choose other sockets with \
         --listen unix:PATH and --control PATH",
        dir.display()
    )))
}

/// True when something accepts connections on the Unix socket at `path`.
pub fn unix_in_use(path: &Path) -> bool {
    UnixStream::connect(path).is_ok()
}

/// True when `addr` cannot be bound right now (another server holds it).
pub fn tcp_in_use(addr: SocketAddr) -> bool {
    TcpListener::bind(addr).is_err()
}

/// Turns a bind failure into advice.
pub fn bind_error(err: &std::io::Error, listens: &[Listen]) -> CliError {
    let text = err.to_string();
    let hint = if err.kind() == std::io::ErrorKind::AddrInUse {
        if listens
            .iter()
            .any(|l| matches!(l, Listen::Tcp(a) if text.contains(&a.to_string())))
        {
            "; is another NBD server (cairn, nbdkit, qemu-nbd, nbd-server) running? Choose \
             another port with --listen tcp:127.0.0.1:PORT (PORT 0 picks a free one)"
        } else {
            "; is another cairn already serving? Stop it, or choose another socket with \
             --listen unix:PATH"
        }
    } else if err.kind() == std::io::ErrorKind::PermissionDenied {
        "; choose a place you may write to with --listen unix:PATH, or a port above 1023"
    } else {
        ""
    };
    CliError::new(format!("cannot listen: {text}{hint}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_socket_paths_are_refused_with_advice() {
        let long = PathBuf::from(format!("/tmp/{}/nbd.sock", "x".repeat(120)));
        let err = prepare_socket_path(&long).unwrap_err().to_string();
        assert!(err.contains("--listen unix:PATH"), "{err}");
    }

    #[test]
    fn default_port_is_the_nbd_port() {
        let (sock, tcp) = defaults();
        assert!(sock.ends_with("nbd.sock"));
        assert_eq!(tcp.port(), 10809);
        assert!(tcp.ip().is_loopback());
    }
}
