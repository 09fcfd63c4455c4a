//! The client side of the control socket: where it is, and one request to it.
//!
//! ```text
//!   cairn status / top / advise ── request(path, "GET", "/v1/status", None)
//!        └─ cairn_engine::http::unix_request ──unix socket──> daemon.rs (cairn serve)
//! ```

use std::io;
use std::path::{Path, PathBuf};

use crate::error::{CliError, Result};

/// `/run/cairn/control.sock` when /run/cairn can be written (root), else
/// `$XDG_RUNTIME_DIR/cairn/control.sock` (or `/tmp/cairn-UID/control.sock`). The daemon
/// and the clients run the same rule, so a user's `cairn status` finds the daemon that
/// user started.
pub fn default_control_path() -> PathBuf {
    let run = Path::new("/run/cairn");
    let usable = if run.is_dir() {
        writable(run)
    } else {
        writable(Path::new("/run"))
    };
    if usable {
        run.join("control.sock")
    } else {
        crate::listen::runtime_dir().join("control.sock")
    }
}

fn writable(p: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(p.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: c is a valid NUL-terminated path for the duration of the call.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// The socket a client verb talks to: `--control PATH`, or the default.
pub fn resolve(control: Option<&Path>) -> PathBuf {
    control.map_or_else(default_control_path, Path::to_path_buf)
}

/// One request to the daemon on `control`: the HTTP status and the JSON answer (a body
/// that is not JSON, such as `/metrics`, comes back as a JSON string).
pub fn request(
    control: &Path,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<(u16, serde_json::Value)> {
    // A request (and the key it may carry) must not go to a socket another user put in a
    // default runtime directory.
    if let Some(dir) = control
        .parent()
        .filter(|d| crate::listen::is_runtime_dir(d))
    {
        crate::listen::check_private_dir(dir)?;
    }
    let body = body.map(|b| serde_json::to_vec(b).unwrap_or_default());
    let (status, raw) = cairn_engine::http::unix_request(control, method, path, body.as_deref())
        .map_err(|e| connect_error(control, &e))?;
    let value = serde_json::from_slice(&raw)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&raw).into()));
    Ok((status, value))
}

/// `request`, with any non-2xx answer turned into the daemon's error sentence.
pub fn get_ok(control: &Path, path: &str) -> Result<serde_json::Value> {
    let (status, v) = request(control, "GET", path, None)?;
    if (200..300).contains(&status) {
        Ok(v)
    } else {
        Err(CliError::new(format!(
            "the daemon on {} answered {status} to GET {path}: {}",
            control.display(),
            v["error"].as_str().unwrap_or("(no reason given)")
        )))
    }
}

fn connect_error(control: &Path, e: &io::Error) -> CliError {
    let shown = control.display();
    match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => CliError::new(format!(
            "no cairn daemon on {shown} (start one with `cairn serve --control {shown} ...`)"
        )),
        io::ErrorKind::PermissionDenied => CliError::new(format!(
            "cannot use the control socket {shown}: permission denied (it is owner-only; \
             run as the user who started `cairn serve`, or as root)"
        )),
        _ => CliError::new(format!("talking to the cairn daemon on {shown}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_daemon_is_one_clear_sentence() {
        let p = Path::new("/nonexistent/cairn/control.sock");
        let err = request(p, "GET", "/v1/status", None)
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "no cairn daemon on /nonexistent/cairn/control.sock (start one with `cairn serve \
             --control /nonexistent/cairn/control.sock ...`)"
        );
    }

    #[test]
    fn default_path_is_a_socket_in_a_runtime_dir() {
        let p = default_control_path();
        assert!(p.ends_with("control.sock"), "{}", p.display());
        assert!(p.is_absolute());
    }
}
