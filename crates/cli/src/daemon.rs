//! Starting the daemon (`cairn serve`'s operator half): binds the control socket and the
//! metrics listener, and starts their threads around the engine's [`Daemon`], which holds
//! the state and answers (md arrays push their events to it as their state changes).
//!
//! ```text
//!   daemon::start ── control socket (http, 0600) ─┐
//!                 ├─ --metrics (http) ────────────┼──> cairn_engine::daemon::Daemon
//!                 └─ md arrays push changes ──────┘    (exports, actions, events)
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_engine::daemon::{Daemon, Endpoints};
use cairn_engine::events::Events;
use cairn_engine::http::{self, Handler, Request};
use cairn_engine::stats;
use cairn_nbd::{ExportsHandle, Listen};
use cairn_stack::export::OpenedExport;
use cairn_stack::Options;
use clap::Args;

use crate::error::{CliError, Result};

/// Events kept for the API.
const EVENT_RING: usize = 256;

pub use cairn_engine::daemon::wrap_export;

/// What `start` brought up; removes the socket files when dropped.
#[derive(Debug)]
pub struct Running {
    pub control: Option<PathBuf>,
    pub metrics: Option<String>,
    pub daemon: Arc<Daemon>,
    files: Vec<PathBuf>,
}

impl Drop for Running {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

/// Starts the control socket and the metrics listener.
pub fn start(
    opts: &OperatorOptions,
    opened: &[OpenedExport],
    nbd: ExportsHandle,
    listen: &[Listen],
    open: Options,
) -> Result<Running> {
    stats::monotonic_ns(); // the clock /v1/stats reports starts now
    let events = Events::new(EVENT_RING, opts.on_event.clone());
    let mut files = Vec::new();
    let mut control_listener = None;
    if !opts.no_control {
        let explicit = opts.control.is_some();
        let path = opts
            .control
            .clone()
            .unwrap_or_else(crate::control::default_control_path);
        // The default socket taken by another daemon: this one answers on its own
        // control-PID.sock beside it, which `cairn status` and friends find.
        let bound = match bind_control(&path) {
            Ok(l) => Ok((l, path)),
            Err(e) if explicit => return Err(e),
            Err(e) => {
                let own = crate::control::daemon_control_path(std::process::id());
                bind_control(&own)
                    .map(|l| {
                        tracing::info!(
                            "{} belongs to another cairn daemon; this one answers on {} \
                             (cairn status and the md verbs find it; --control PATH chooses)",
                            path.display(),
                            own.display()
                        );
                        (l, own)
                    })
                    .map_err(|_| e)
            }
        };
        match bound {
            Ok((l, path)) => {
                files.push(path.clone());
                control_listener = Some((l, path));
            }
            Err(e) => {
                tracing::warn!("{e}; serving without a control socket (give --control PATH)")
            }
        }
    }
    let mut metrics_listener = None;
    if let Some(addr) = &opts.metrics {
        let l = match addr {
            Listen::Tcp(a) => http::bind_tcp(*a),
            Listen::Unix(p) => {
                crate::listen::prepare_socket_path(p)?;
                files.push(p.clone());
                http::bind_unix(p, 0o600)
            }
        }
        .map_err(|e| CliError::new(format!("--metrics {addr}: cannot listen: {e}")))?;
        metrics_listener = Some(l);
    }
    let at = Endpoints {
        listen: listen.to_vec(),
        control: control_listener.as_ref().map(|(_, p)| p.clone()),
        metrics: metrics_listener.as_ref().map(http::Listener::address),
        // `cairn repl up` puts its control socket there (unless told --control).
        repl_dir: Some(crate::listen::runtime_dir()),
    };
    let control = at.control.clone();
    let metrics = at.metrics.clone();
    let daemon = Arc::new(Daemon::new(opened.to_vec(), open, nbd, events, at));
    if let Some((l, _)) = control_listener {
        let d = daemon.clone();
        let h: Handler = Arc::new(move |r: &Request| d.handle(r));
        http::spawn(l, "control", h)
            .map_err(|e| CliError::new(format!("cannot start the control thread: {e}")))?;
    }
    if let Some(l) = metrics_listener {
        let d = daemon.clone();
        let h: Handler = Arc::new(move |r: &Request| d.handle_metrics(r));
        http::spawn(l, "metrics", h)
            .map_err(|e| CliError::new(format!("cannot start the metrics thread: {e}")))?;
    }
    Ok(Running {
        control,
        metrics,
        daemon,
        files,
    })
}

/// Binds the control socket: its directory made owner-only if missing, the socket 0600.
fn bind_control(path: &Path) -> Result<http::Listener> {
    // Checks the length and makes the directory, owner-only, if missing.
    crate::listen::prepare_socket_path(path)?;
    http::bind_unix(path, 0o600).map_err(|e| match e.kind() {
        std::io::ErrorKind::AddrInUse => CliError::new(format!(
            "another cairn daemon answers on the control socket {}; stop it, or give this \
             one another --control PATH",
            path.display()
        )),
        _ => CliError::new(format!(
            "cannot create the control socket {}: {e}",
            path.display()
        )),
    })
}

// ---- the command line (clap) ----------------------------------------------------
//

/// The operator's view of `serve`: control socket, metrics, event hook.
#[derive(Debug, Clone, Default, Args)]
pub struct OperatorOptions {
    /// Control socket for `cairn status`, `cairn top` and the HTTP+JSON API (owner-only,
    /// mode 0600) [default: control.sock in the runtime directory ($XDG_RUNTIME_DIR/cairn,
    /// else /run/cairn for root, /tmp/cairn-UID for others); when another daemon has it,
    /// control-PID.sock beside it]
    #[arg(long, value_name = "PATH", conflicts_with = "no_control")]
    pub control: Option<PathBuf>,

    /// Serve without a control socket
    #[arg(long)]
    pub no_control: bool,

    /// Serve Prometheus metrics at http://ADDR/metrics: tcp:HOST:PORT, HOST:PORT or
    /// unix:PATH (off unless given; metrics show export and member names)
    #[arg(long, value_name = "ADDR", value_parser = parse_metrics_addr)]
    pub metrics: Option<Listen>,

    /// Run CMD (with sh -c) on each state change, like mdadm --monitor's PROGRAM: the
    /// event is in CAIRN_EVENT, CAIRN_EXPORT, CAIRN_DEVICE, CAIRN_MEMBER, CAIRN_MESSAGE
    #[arg(long, value_name = "CMD")]
    pub on_event: Option<String>,
}

/// `--metrics`: `tcp:HOST:PORT`, `unix:PATH`, or a bare `HOST:PORT`.
pub(crate) fn parse_metrics_addr(s: &str) -> Result<Listen, String> {
    if let Ok(a) = s.parse::<std::net::SocketAddr>() {
        return Ok(Listen::Tcp(a));
    }
    s.parse::<Listen>()
        .map_err(|e| format!("{e} (e.g. --metrics 127.0.0.1:9109 or unix:/run/cairn/metrics.sock)"))
}
