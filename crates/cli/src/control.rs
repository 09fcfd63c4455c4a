//! The client side of the control socket: where it is, and one request to it.
//!
//! ```text
//!   cairn status / top / advise ── request(path, "GET", "/v1/status", None)
//!        └─ cairn_engine::http::unix_request ──unix socket──> daemon.rs (cairn serve)
//! ```

use std::io;
use std::path::{Path, PathBuf};

use crate::error::{CliError, Result};
use clap::Args;

/// `control.sock` in the runtime directory, beside the default NBD socket
/// (`$XDG_RUNTIME_DIR/cairn`, `/run/cairn` for root, `/tmp/cairn-UID` for others). The
/// daemon and the clients run the same rule, so a user's `cairn status` finds the daemon
/// that user started; a second daemon takes `control-PID.sock` there
/// ([`daemon_control_path`]).
pub fn default_control_path() -> PathBuf {
    crate::listen::runtime_dir().join("control.sock")
}

/// The default socket of a daemon with process id `pid` when `control.sock` is taken.
pub fn daemon_control_path(pid: u32) -> PathBuf {
    crate::listen::runtime_dir().join(format!("control-{pid}.sock"))
}

/// The control sockets in the runtime directory that a daemon answers on, `control.sock`
/// first, then the `control-PID.sock` of further daemons by PID. Root also looks in
/// `/run/cairn` when its runtime directory is elsewhere: a daemon started without
/// `$XDG_RUNTIME_DIR` (by systemd) is there, and a login shell's root has one set.
///
/// A directory another user could write to, and a socket there that is not this user's,
/// are skipped without connecting: a connection alone tells a listener there that cairn
/// looked ([`resolve_for`] says why instead).
pub fn live_daemons() -> Vec<PathBuf> {
    let mut dirs = vec![crate::listen::runtime_dir()];
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 && dirs[0] != Path::new("/run/cairn") {
        dirs.push(PathBuf::from("/run/cairn"));
    }
    let mut found = Vec::new();
    for dir in dirs {
        if crate::listen::check_private_dir(&dir).is_err() {
            continue;
        }
        let mut extra: Vec<(u32, PathBuf)> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name();
                let pid = name
                    .to_str()?
                    .strip_prefix("control-")?
                    .strip_suffix(".sock")?
                    .parse()
                    .ok()?;
                Some((pid, e.path()))
            })
            .collect();
        extra.sort();
        found.extend(
            std::iter::once(dir.join("control.sock"))
                .chain(extra.into_iter().map(|(_, p)| p))
                .filter(|p| {
                    check_socket_owner(p).is_ok()
                        && std::os::unix::net::UnixStream::connect(p).is_ok()
                }),
        );
    }
    found
}

/// What a client verb is about, so that among several daemons the one that serves it
/// can be found.
#[derive(Debug, Clone, Copy)]
pub enum Wants<'a> {
    /// Any daemon will do only if there is one (status, top).
    Any,
    /// The daemon serving this md array (`GET /v1/arrays/NAME` answers 200).
    Array(&'a str),
    /// The daemon serving this export (`GET /v1/exports/NAME` answers 200).
    Export(&'a str),
}

/// The socket a client verb talks to: `--control PATH`; else the one daemon running in
/// the runtime directory; among several, the one that serves what the verb names. With
/// none running, the default path (so the error names where the daemon was looked for).
pub fn resolve_for(control: Option<&Path>, wants: Wants<'_>) -> Result<PathBuf> {
    if let Some(p) = control {
        return Ok(p.to_path_buf());
    }
    // Refused before anything there is connected to (live_daemons skips it silently).
    crate::listen::check_private_dir(&crate::listen::runtime_dir())?;
    let live = live_daemons();
    if live.len() <= 1 {
        return Ok(live.into_iter().next().unwrap_or_else(default_control_path));
    }
    let route = match wants {
        Wants::Any => None,
        Wants::Array(name) => Some(format!("/v1/arrays/{name}")),
        Wants::Export(name) => Some(format!("/v1/exports/{name}")),
    };
    if let Some(route) = &route {
        let hits: Vec<&PathBuf> = live
            .iter()
            .filter(|p| matches!(request(p, "GET", route, None), Ok((200, _))))
            .collect();
        if let [one] = hits.as_slice() {
            return Ok((*one).clone());
        }
    }
    let what = match wants {
        Wants::Any => String::new(),
        Wants::Array(n) => format!(" (and none or several serve md array {n:?})"),
        Wants::Export(n) => format!(" (and none or several serve export {n:?})"),
    };
    let list: Vec<String> = live.iter().map(|p| describe_daemon(p)).collect();
    Err(CliError::new(format!(
        "{} cairn daemons are running{what}; choose one with --control PATH:\n  {}",
        live.len(),
        list.join("\n  ")
    )))
}

/// `PATH (cairn serve PID N: exports a, b)`, for choosing among daemons.
pub fn describe_daemon(p: &Path) -> String {
    match get_ok(p, "/v1/status") {
        Ok(v) => {
            let exports: Vec<&str> = v["exports"]
                .as_array()
                .map(|a| a.iter().filter_map(|e| e["name"].as_str()).collect())
                .unwrap_or_default();
            format!(
                "{} (cairn serve, PID {}: {})",
                p.display(),
                v["pid"],
                if exports.is_empty() {
                    "no exports".to_string()
                } else {
                    format!("exports {}", exports.join(", "))
                }
            )
        }
        Err(_) => p.display().to_string(),
    }
}

/// The socket a client verb talks to when it names nothing a daemon could be chosen by:
/// see [`resolve_for`].
pub fn resolve(control: Option<&Path>) -> Result<PathBuf> {
    resolve_for(control, Wants::Any)
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
        check_socket_owner(control)?;
    }
    let body = body.map(|b| serde_json::to_vec(b).unwrap_or_default());
    let (status, raw) = cairn_engine::http::unix_request(control, method, path, body.as_deref())
        .map_err(|e| connect_error(control, &e))?;
    let value = serde_json::from_slice(&raw)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&raw).into()));
    Ok((status, value))
}

/// Refuses a socket in a runtime directory that is not this user's (root's daemon may
/// serve root only): checked before connecting, so nothing of a request reaches it. A
/// missing socket is fine here (the connect says "no cairn daemon").
fn check_socket_owner(path: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if meta.uid() == uid {
        return Ok(());
    }
    Err(CliError::new(format!(
        "the control socket {} belongs to uid {}, not to you (uid {uid}), so another user \
         could replace cairn's sockets there; remove it or choose a socket with --control PATH",
        path.display(),
        meta.uid()
    )))
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

// ---- the command line (clap) ----------------------------------------------------
//

/// Where client verbs find the daemon.
#[derive(Debug, Clone, Default, Args)]
pub struct ControlArgs {
    /// The daemon's control socket [default: the one daemon running in the runtime
    /// directory ($XDG_RUNTIME_DIR/cairn, else /run/cairn for root, /tmp/cairn-UID);
    /// with several, the one serving the array named, else they are listed to choose]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
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
    fn default_paths_are_in_the_runtime_dir() {
        assert_eq!(
            daemon_control_path(42).parent(),
            default_control_path().parent()
        );
        assert!(daemon_control_path(42).ends_with("control-42.sock"));
    }

    #[test]
    fn default_path_is_a_socket_in_a_runtime_dir() {
        let p = default_control_path();
        assert!(p.ends_with("control.sock"), "{}", p.display());
        assert!(p.is_absolute());
    }
}
