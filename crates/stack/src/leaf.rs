//! The bottom of every stack: a local file or block device, or a remote NBD export named
//! by its URI (`nbd://HOST[:PORT]/EXPORT`, `nbd+unix:///EXPORT?socket=PATH`, `nbds://`).
//!
//! Everywhere a stack takes a file (a member of `md create` or `serve --md`, `serve FILE`,
//! a PV, the config file, the control API) it takes a URI too: the name is a [`Path`] in
//! the spec either way, and this module decides by its spelling which one it is. A
//! remote leaf is a [`cairn_nbd::client::Client`], which keeps many requests in flight
//! over one or more connections; its timeout is the longest a member may take to answer
//! before the layer above counts it failed.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cairn_block::{BlockDevice, ErrorKind, FileDisk, OpenOptions};
use cairn_nbd::client::{Client, ClientOptions};
use cairn_nbd::uri::{self, NbdUri};

use crate::error::{Result, StackError};

/// How long a remote member may take to answer a request (or to accept a connection)
/// before it counts as failed, unless told otherwise.
pub const DEFAULT_REMOTE_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether `p` names a remote NBD export rather than a local path.
pub fn is_remote(p: &Path) -> bool {
    p.to_str().is_some_and(uri::is_uri)
}

/// The parsed URI of a remote leaf, or a sentence saying what is wrong with it.
pub fn parse_remote(p: &Path) -> Result<NbdUri> {
    let s = p
        .to_str()
        .ok_or_else(|| StackError::new(format!("{} is not UTF-8", p.display())))?;
    NbdUri::parse(s).map_err(StackError::new)
}

/// Why a remote leaf could not be opened: unreachable (the layer above may go on
/// without it, degraded) or refused for a reason that retrying will not change.
#[derive(Debug)]
pub enum RemoteError {
    Unreachable(StackError),
    Refused(StackError),
}

impl RemoteError {
    pub fn into_error(self) -> StackError {
        match self {
            RemoteError::Unreachable(e) | RemoteError::Refused(e) => e,
        }
    }
}

/// Connects to the export `p` names. `read_only`: a read-only export is fine; otherwise
/// it is refused (a member that cannot take writes is of no use to a writable array).
pub fn open_remote(
    p: &Path,
    read_only: bool,
    timeout: Duration,
) -> std::result::Result<Arc<Client>, RemoteError> {
    open_remote_fenced(p, read_only, timeout, None)
}

/// [`open_remote`], declaring an owner generation to the member server (a member of an
/// array this host owns, see [`crate::fence`]).
pub fn open_remote_fenced(
    p: &Path,
    read_only: bool,
    timeout: Duration,
    fence: Option<cairn_nbd::fence::FenceToken>,
) -> std::result::Result<Arc<Client>, RemoteError> {
    let u = parse_remote(p).map_err(RemoteError::Refused)?;
    // A host name that resolves nowhere is unreachable, not wrong: the host may come
    // back. Anything else `from_uri` refuses (a TLS key file that cannot be read) is.
    u.listen()
        .map_err(|e| RemoteError::Unreachable(StackError::new(format!("{u}: {e}"))))?;
    let mut opts = ClientOptions::from_uri(&u)
        .map_err(|e| RemoteError::Refused(StackError::new(format!("{u}: {e}"))))?;
    opts.timeout = Some(timeout);
    opts.fence = fence;
    let client = Client::connect(&opts).map_err(|e| {
        let msg = StackError::new(format!("cannot reach {u}: {e}"));
        // Refused: the server answered (no such export, TLS required, a protocol error).
        if e.is_unreachable() {
            RemoteError::Unreachable(msg)
        } else {
            RemoteError::Refused(msg)
        }
    })?;
    if !read_only && client.capabilities().read_only {
        return Err(RemoteError::Refused(StackError::new(format!(
            "{u} is read-only on its server; it cannot be written"
        ))));
    }
    Ok(Arc::new(client))
}

/// Opens a local file or block device, or connects to a remote export.
pub fn open(
    p: &Path,
    read_only: bool,
    direct: bool,
    timeout: Duration,
) -> Result<Arc<dyn BlockDevice>> {
    if is_remote(p) {
        return open_remote(p, read_only, timeout)
            .map(|c| c as Arc<dyn BlockDevice>)
            .map_err(RemoteError::into_error);
    }
    let shown = p.display().to_string();
    let opts = OpenOptions {
        read_only,
        direct,
        create_size: None,
    };
    let disk = FileDisk::open(p, &opts).map_err(|e| match e.kind() {
        ErrorKind::ReadOnly if !read_only => StackError::new(format!(
            "cannot open {shown} for writing ({e}); fix its permissions"
        )),
        ErrorKind::Busy => crate::owner::busy(&shown, &e),
        _ => StackError::new(format!("cannot open {shown}: {e}")),
    })?;
    crate::owner::note_reader(&shown, &disk);
    Ok(Arc::new(disk))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_names_are_told_apart_from_paths() {
        assert!(is_remote(Path::new("nbd://h/e")));
        assert!(is_remote(Path::new("nbd+unix:///e?socket=/s")));
        assert!(!is_remote(Path::new("/dev/sdb")));
        assert!(!is_remote(Path::new("./nbd://x")));
        let e = parse_remote(Path::new("nbd://h/e?bogus=1")).unwrap_err();
        assert!(e.to_string().contains("unknown query key"), "{e}");
    }

    #[test]
    fn an_absent_server_is_unreachable_and_a_bad_uri_is_refused() {
        let dir = std::env::temp_dir().join(format!("cairn-leaf-{}", std::process::id()));
        let uri = format!("nbd+unix:///x?socket={}/none.sock", dir.display());
        match open_remote(Path::new(&uri), false, Duration::from_secs(1)) {
            Err(RemoteError::Unreachable(e)) => assert!(e.to_string().contains("cannot reach")),
            other => panic!("expected unreachable, got {other:?}"),
        }
        match open_remote(Path::new("nbd://h:0/x"), false, Duration::from_secs(1)) {
            Err(RemoteError::Refused(e)) => assert!(e.to_string().contains("bad port")),
            other => panic!("expected refused, got {other:?}"),
        }
    }
}
