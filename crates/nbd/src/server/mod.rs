//! The NBD server.
//!
//! ```text
//!   accept thread ── poll(listeners) ──> one thread per connection (accept.rs)
//!                                             │ handshake (handshake.rs)
//!   reader: header (+ payload) → check → running slot + buffer budget → submit
//!                                             │ (or run it here when cheap: dispatch.rs)
//!   shared pool (pool.rs): device I/O → lock the connection's writer → whole reply
//! ```
//!
//! A connection's thread reads and checks requests and hands them to a worker pool the
//! whole server shares, so one connection has up to `threads_per_connection` requests
//! running and their replies go out in the order they finish (transmission.rs). Requests
//! of a kind the export serves faster than a hand-off costs (the page cache), and every
//! request when a connection runs one at a time, the reader runs itself. Requests are validated here, once
//! (`check_io` and the flag rules of proto.md); the device below only asserts. A bad
//! request gets the protocol's error and the connection goes on; only a broken stream
//! (bad magic, EOF) or DISC ends it. The exports and what they advertise live in
//! exports.rs.
//!
//! Nothing a client does grows the server without bound: at most `max_connections`
//! connections (handshakes included), of which at most [`HANDSHAKES_PER_PEER`] unfinished
//! handshakes from one address; a handshake not finished within `client_timeout` is cut
//! by the accept thread; so is a connection whose reply the client takes slower than
//! watch.rs's minimum rate over `client_timeout` (nothing, or a trickle); and request and reply
//! buffers are reserved from a per-connection and a server-wide budget before they are
//! filled, where a connection past its fair share (the server's budget over the
//! connections being served) waits on its own thread while others go, so clients that stop
//! reading hold at most that until they are cut. When descriptors run out, accept backs
//! off instead of spinning, and says so once.

mod accept;
mod budget;
mod dispatch;
mod exports;
mod fence;
mod handshake;
mod pool;
mod transmission;
mod watch;

pub use accept::Listeners;
pub use exports::{Added, ConnectionInfo, ExportsHandle, Removed};
pub use transmission::nbd_errno;
pub(crate) use transmission::write_all_vectored;
pub use watch::MIN_DRAIN_RATE;

use accept::SocketCtl;
use budget::Budget;
use exports::ExportEntry;
use pool::Pool;
use transmission::serve_connection;

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use cairn_block::{check_io, BlockDevice, ErrorKind, Extent, IoKind, Support, WriteFlags};

use crate::proto::*;
use crate::tls::{self, ServerTls};

/// One export: a device under a name.
#[derive(Debug, Clone)]
pub struct Export {
    pub name: String,
    pub description: String,
    pub device: Arc<dyn BlockDevice>,
    pub read_only: bool,
}

/// Answers options that belong to a layer above the NBD server (cairn's replication
/// handshake, for one): the server reads and bounds the option, the handler only answers.
pub trait OptionHandler: Send + Sync + fmt::Debug {
    /// Whether `option` is this handler's.
    fn handles(&self, option: u32) -> bool;
    /// The reply type (`NBD_REP_ACK`, an error) and its data, at most 64 KiB (longer data
    /// is refused with `NBD_REP_ERR_TOO_BIG` rather than sent).
    fn answer(&self, option: u32, data: &[u8]) -> (u32, Vec<u8>);
}

/// Where to listen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(SocketAddr),
}

impl FromStr for Listen {
    type Err = String;
    /// `unix:PATH` or `tcp:ADDR:PORT` (`tcp:[::1]:10809` for IPv6).
    fn from_str(s: &str) -> Result<Listen, String> {
        if let Some(path) = s.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path, e.g. unix:/run/cairn/nbd.sock".into());
            }
            return Ok(Listen::Unix(PathBuf::from(path)));
        }
        if let Some(addr) = s.strip_prefix("tcp:") {
            return addr.parse::<SocketAddr>().map(Listen::Tcp).map_err(|e| {
                format!("tcp:{addr}: {e} (expected ADDR:PORT, e.g. tcp:127.0.0.1:10809)")
            });
        }
        Err(format!("{s:?}: expected unix:PATH or tcp:ADDR:PORT"))
    }
}

impl fmt::Display for Listen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
            Listen::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

impl Listen {
    /// An NBD URI for `export` at this address, as libnbd tools take it.
    pub fn uri(&self, export: &str) -> String {
        match self {
            Listen::Unix(p) => format!("nbd+unix:///{export}?socket={}", p.display()),
            Listen::Tcp(a) => format!("nbd://{a}/{export}"),
        }
    }
}

/// Server settings.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub exports: Vec<Export>,
    /// Export answered for the empty name. `None` picks the only export when there is one.
    pub default_export: Option<String>,
    /// Requests one connection runs at once. They run on the server's shared worker
    /// pool: a connection holds no thread of its own beyond its reader.
    pub threads_per_connection: usize,
    /// Most worker threads of the pool all connections share. Workers start when
    /// requests wait for one and end when idle.
    pub max_workers: usize,
    /// Connections beyond this many are closed at once.
    pub max_connections: usize,
    /// How long a client may take to finish its handshake, and how long a reply write may
    /// make no progress (a client that does not read), before the connection is cut: a
    /// reply still going out after this must have moved at [`MIN_DRAIN_RATE`] over it.
    pub client_timeout: Duration,
    /// TCP keepalive after this long without traffic (`None`: off): a client gone
    /// without a word (partitioned away) ends its connection within about twice this.
    pub keepalive: Option<Duration>,
    /// Bytes of request payloads and read replies held at once by all connections.
    pub max_in_flight: usize,
    /// How long a shutdown waits for connections to finish in-flight requests.
    pub shutdown_grace: Duration,
    /// Enforce owner generations (the member-server role, crate::fence): `None` answers
    /// the fence option as unknown and checks nothing.
    pub fence: Option<Arc<dyn crate::fence::FenceStore>>,
    /// Options of a layer above (cairn's replication handshake) answered by it: `None`
    /// answers them as unknown. Asked only after TLS when TLS is required.
    pub extension: Option<Arc<dyn OptionHandler>>,
    /// Start with no export (they are added later through [`ExportsHandle`]).
    pub allow_empty: bool,
    /// TLS (`NBD_OPT_STARTTLS`): `None` refuses it; otherwise offered, or required when
    /// [`ServerTls::required`].
    pub tls: Option<ServerTls>,
}

impl ServerConfig {
    pub fn new(exports: Vec<Export>) -> ServerConfig {
        ServerConfig {
            exports,
            default_export: None,
            threads_per_connection: REQUESTS_PER_CONNECTION,
            max_workers: MAX_WORKERS,
            max_connections: 256,
            client_timeout: Duration::from_secs(30),
            keepalive: None,
            max_in_flight: MAX_IN_FLIGHT,
            shutdown_grace: Duration::from_secs(10),
            fence: None,
            extension: None,
            allow_empty: false,
            tls: None,
        }
    }
}

/// Default requests one connection runs at once: a client at queue depth 32 (fio's and
/// qemu's usual depth) gets them all running on a disk or network member that serves
/// them in parallel.
pub const REQUESTS_PER_CONNECTION: usize = 32;

/// Default ceiling of the shared worker pool: eight connections at full depth.
pub const MAX_WORKERS: usize = 256;

/// Default server-wide budget of request and reply bytes held at once: eight 32 MiB
/// requests, or many more of the usual sizes.
pub const MAX_IN_FLIGHT: usize = 256 << 20;

/// One connection's share of the budget: its workers wait for each other beyond this, so
/// a connection that stops reading holds this much and no more.
const CONNECTION_IN_FLIGHT: usize = 64 << 20;

/// Unfinished handshakes one address may have at once: beyond this its new connections
/// are closed at once, so one host opening handshakes it never finishes (TLS hellos it
/// never sends) cannot take every connection slot until they time out.
pub const HANDSHAKES_PER_PEER: usize = 16;

/// How long accept pauses when descriptors or memory run out.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Why a configuration is refused.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
impl std::error::Error for ConfigError {}

/// Shared server state: exports, shutdown flag, live connections.
#[derive(Debug)]
struct Shared {
    /// Changed at runtime through [`ExportsHandle`]; read only at handshake, so the
    /// transmission fast path never takes this lock (a session holds its entry).
    exports: RwLock<Vec<Arc<ExportEntry>>>,
    default_export: Option<String>,
    /// Requests one connection runs at once.
    threads: usize,
    /// Runs the requests of every connection.
    pool: Pool,
    max_connections: usize,
    client_timeout: Duration,
    keepalive: Option<Duration>,
    /// Server-wide budget of request and reply buffers.
    in_flight: Arc<Budget>,
    /// Connections past their handshake: the server's budget is shared fairly among them.
    transmitting: AtomicUsize,
    grace: Duration,
    /// Where owner generations are persisted, when this server enforces them.
    fence: Option<Arc<dyn crate::fence::FenceStore>>,
    extension: Option<Arc<dyn OptionHandler>>,
    tls: Option<ServerTls>,
    shutdown: AtomicBool,
    next_id: AtomicU64,
    /// Live connections, for shutdown and removal: a handle that can stop their reads,
    /// and what `connections()` reports.
    conns: Mutex<HashMap<u64, ConnEntry>>,
}

/// One live connection.
#[derive(Debug)]
struct ConnEntry {
    ctl: Box<dyn SocketCtl>,
    peer: String,
    /// Set when the handshake picks an export.
    export: Option<String>,
    since: SystemTime,
    /// While the handshake runs: when the accept thread cuts the connection.
    handshake_deadline: Option<Instant>,
    /// The client's address (TCP), for the limit of handshakes per address.
    peer_ip: Option<IpAddr>,
    /// Once serving: the reply being written, which the accept thread watches.
    send: Option<Arc<watch::SendClock>>,
}

impl Shared {
    fn exports(&self) -> std::sync::RwLockReadGuard<'_, Vec<Arc<ExportEntry>>> {
        self.exports.read().unwrap_or_else(|p| p.into_inner())
    }

    fn find(&self, name: &str) -> Option<Arc<ExportEntry>> {
        let name = if name.is_empty() {
            self.default_export.as_deref()?
        } else {
            name
        };
        self.exports()
            .iter()
            .find(|e| e.export.name == name)
            .cloned()
    }
}

/// A cloneable handle that asks a running server to stop.
#[derive(Debug, Clone)]
pub struct ShutdownHandle(Arc<Shared>);

impl ShutdownHandle {
    /// Stops accepting, stops reading new requests, lets in-flight ones answer, flushes.
    pub fn shutdown(&self) {
        if self.0.shutdown.swap(true, Ordering::SeqCst) {
            return;
        }
        for c in self.0.conns.lock().expect("conns lock").values() {
            c.ctl.shutdown_read();
        }
    }
    pub fn is_shutdown(&self) -> bool {
        self.0.shutdown.load(Ordering::SeqCst)
    }
}

/// An NBD server over a fixed set of exports.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
}

impl Server {
    pub fn new(config: ServerConfig) -> Result<Server, ConfigError> {
        if config.exports.is_empty() && !config.allow_empty {
            return Err(ConfigError("no exports to serve".into()));
        }
        let mut seen = std::collections::HashSet::new();
        for e in &config.exports {
            if e.name.is_empty() || e.name.len() > MAX_STRING || e.name.contains('\0') {
                return Err(ConfigError(format!(
                    "export name {:?} must be 1 to {MAX_STRING} bytes without NUL",
                    e.name
                )));
            }
            if !seen.insert(e.name.clone()) {
                return Err(ConfigError(format!(
                    "export name {:?} is used twice",
                    e.name
                )));
            }
        }
        let default_export = match &config.default_export {
            Some(name) => {
                if !config.exports.iter().any(|e| &e.name == name) {
                    return Err(ConfigError(format!(
                        "default export {name:?} is not an export"
                    )));
                }
                Some(name.clone())
            }
            None if config.exports.len() == 1 => Some(config.exports[0].name.clone()),
            None => None,
        };
        let exports = config
            .exports
            .into_iter()
            .map(|e| Arc::new(ExportEntry::new(e)))
            .collect();
        Ok(Server {
            shared: Arc::new(Shared {
                exports: RwLock::new(exports),
                default_export,
                threads: config.threads_per_connection.max(1),
                pool: Pool::new(config.max_workers),
                max_connections: config.max_connections.max(1),
                client_timeout: config.client_timeout.max(Duration::from_millis(1)),
                keepalive: config.keepalive,
                in_flight: Budget::new(config.max_in_flight),
                transmitting: AtomicUsize::new(0),
                grace: config.shutdown_grace,
                fence: config.fence,
                extension: config.extension,
                tls: config.tls,
                shutdown: AtomicBool::new(false),
                next_id: AtomicU64::new(1),
                conns: Mutex::new(HashMap::new()),
            }),
        })
    }

    pub fn shutdown_handle(&self) -> ShutdownHandle {
        ShutdownHandle(self.shared.clone())
    }

    /// A handle that adds and removes exports while the server runs, and lists
    /// connections.
    pub fn exports_handle(&self) -> ExportsHandle {
        ExportsHandle(self.shared.clone())
    }

    /// Serves one already-connected byte stream to completion on the calling thread (the
    /// transmission phase still uses the configured worker count). For tests and fuzzing.
    pub fn serve_stream(
        &self,
        reader: Box<dyn Read + Send>,
        writer: Box<dyn Write + Send>,
        peer: &str,
    ) {
        // Id 0 is never in the connection table: such a stream is not listed.
        serve_connection(&self.shared, reader, writer, None, peer, 0);
    }
}
