//! Unix sockets that give access to data or control: bound owner-only from the first
//! moment, a stale socket file replaced, a live one left to its server. The NBD server and
//! the control socket both bind through here.

use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;

/// Binds a Unix socket at `path` and gives it permissions `mode`. An existing socket that
/// answers is another live server: refused with `AddrInUse`; a stale one is removed; any
/// other file there is refused with `AlreadyExists`.
///
/// The socket is created under umask 0077 and then given `mode`: one created with the
/// usual umask and narrowed after would be open to others for a moment. The umask is
/// process-wide: a file or directory another thread creates in this short window is
/// owner-only too (0077 keeps a directory's owner bits, so it stays usable).
pub fn bind_unix(path: &Path, mode: u32) -> io::Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("{} exists and is not a socket", path.display()),
            ));
        }
        if UnixStream::connect(path).is_ok() {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{}: another server is listening there", path.display()),
            ));
        }
        std::fs::remove_file(path)?;
    }
    // SAFETY: umask only swaps the process's file-creation mask; it cannot fail.
    let old = unsafe { libc::umask(0o077) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let l = bound?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(l)
}
