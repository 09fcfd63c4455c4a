//! The NBD server.
//!
//! ```text
//!   accept thread ── poll(listeners) ──> one thread per connection: handshake
//!                                             │
//!                  transmission: N workers share the connection ──────────────┐
//!     worker: lock reader → header (+ payload) → unlock → device I/O → lock writer → reply
//! ```
//!
//! Workers take turns reading requests, so a request is executed by the thread that read
//! it (no hand-off between a reader thread and a pool), and replies go out in completion
//! order. Requests are validated here, once (`check_io` and the flag rules of
//! proto.md); the device below only asserts. A bad request gets the protocol's error and
//! the connection goes on; only a broken stream (bad magic, EOF) or DISC ends it.
//!
//! Nothing a client does grows the server without bound: at most `max_connections`
//! connections (handshakes included); a handshake not finished within `client_timeout` is
//! cut by the accept thread; a reply the client does not read for `client_timeout` ends the
//! connection (the socket's send timeout); and request and reply buffers are reserved from
//! a per-connection and a server-wide budget before they are filled, so clients that stop
//! reading hold at most that budget until they are cut. When descriptors run out, accept
//! backs off instead of spinning, and says so once.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use cairn_block::{check_io, BlockDevice, ErrorKind, Extent, IoKind, Support, WriteFlags};

use crate::proto::*;

/// One export: a device under a name.
#[derive(Debug, Clone)]
pub struct Export {
    pub name: String,
    pub description: String,
    pub device: Arc<dyn BlockDevice>,
    pub read_only: bool,
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
    /// Worker threads per connection (requests one connection runs at once).
    pub threads_per_connection: usize,
    /// Connections beyond this many are closed at once.
    pub max_connections: usize,
    /// How long a client may take to finish its handshake, and how long a reply write may
    /// make no progress (a client that does not read), before the connection is cut.
    pub client_timeout: Duration,
    /// Bytes of request payloads and read replies held at once by all connections.
    pub max_in_flight: usize,
    /// How long a shutdown waits for connections to finish in-flight requests.
    pub shutdown_grace: Duration,
}

impl ServerConfig {
    pub fn new(exports: Vec<Export>) -> ServerConfig {
        ServerConfig {
            exports,
            default_export: None,
            threads_per_connection: 4,
            max_connections: 256,
            client_timeout: Duration::from_secs(30),
            max_in_flight: MAX_IN_FLIGHT,
            shutdown_grace: Duration::from_secs(10),
        }
    }
}

/// Default server-wide budget of request and reply bytes held at once: eight 32 MiB
/// requests, or many more of the usual sizes.
pub const MAX_IN_FLIGHT: usize = 256 << 20;

/// One connection's share of the budget: its workers wait for each other beyond this, so
/// a connection that stops reading holds this much and no more.
const CONNECTION_IN_FLIGHT: usize = 64 << 20;

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

/// What the server knows about an export, computed once.
#[derive(Debug)]
struct ExportEntry {
    export: Export,
    min_block: u32,
    preferred_block: u32,
    max_block: u32,
    /// Transmission flags before the per-connection ones (DF).
    flags: u16,
    /// What requests are checked against: the size and the advertised minimum block.
    geometry: cairn_block::Geometry,
}

impl ExportEntry {
    fn new(export: Export) -> ExportEntry {
        let g = export.device.geometry();
        let caps = export.device.capabilities();
        let read_only = export.read_only || caps.read_only;
        let min_block = g.logical_block_size.max(1);
        let max_block = {
            let m = g.max_io_size.clamp(min_block, MAX_SAFE_PAYLOAD);
            m - m % min_block
        };
        // proto.md: preferred is a power of two, >= min. A full stripe that is not a power
        // of two (three data disks) falls back to the chunk, which still avoids
        // read-modify-write below.
        let preferred_block = [g.optimal_io_size, g.physical_block_size, min_block]
            .into_iter()
            .find(|v| v.is_power_of_two() && *v >= min_block && *v <= max_block)
            .unwrap_or(min_block.next_power_of_two());
        let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_CACHE;
        // All connections share one device and one flush path, so FLUSH and FUA on any
        // connection cover writes completed on every connection.
        flags |= FLAG_CAN_MULTI_CONN;
        if read_only {
            flags |= FLAG_READ_ONLY;
        } else {
            flags |= FLAG_SEND_WRITE_ZEROES;
            if caps.discard != Support::None {
                flags |= FLAG_SEND_TRIM;
            }
            // FAST_ZERO is always offered: where zeroing is not native the request
            // fails quickly with ENOTSUP, which is exactly what the flag asks for.
            flags |= FLAG_SEND_FAST_ZERO;
        }
        let export = Export {
            read_only,
            ..export
        };
        ExportEntry {
            geometry: cairn_block::Geometry {
                logical_block_size: min_block,
                ..g
            },
            min_block,
            preferred_block,
            max_block,
            flags,
            export,
        }
    }
}

/// Shared server state: exports, shutdown flag, live connections.
#[derive(Debug)]
struct Shared {
    /// Changed at runtime through [`ExportsHandle`]; read only at handshake, so the
    /// transmission fast path never takes this lock (a session holds its entry).
    exports: RwLock<Vec<Arc<ExportEntry>>>,
    default_export: Option<String>,
    threads: usize,
    max_connections: usize,
    client_timeout: Duration,
    /// Server-wide budget of request and reply buffers.
    in_flight: Budget,
    grace: Duration,
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

/// Stops a connection's reads from another thread.
trait SocketCtl: Send + fmt::Debug {
    fn shutdown_read(&self);
    /// Ends the connection both ways, unblocking a worker stuck writing to a client that
    /// stopped reading.
    fn shutdown_both(&self);
    fn set_write_timeout(&self, t: Duration) -> io::Result<()>;
}

impl SocketCtl for UnixStream {
    fn shutdown_read(&self) {
        let _ = self.shutdown(std::net::Shutdown::Read);
    }
    fn shutdown_both(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
    fn set_write_timeout(&self, t: Duration) -> io::Result<()> {
        UnixStream::set_write_timeout(self, Some(t))
    }
}
impl SocketCtl for TcpStream {
    fn shutdown_read(&self) {
        let _ = self.shutdown(std::net::Shutdown::Read);
    }
    fn shutdown_both(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
    fn set_write_timeout(&self, t: Duration) -> io::Result<()> {
        TcpStream::set_write_timeout(self, Some(t))
    }
}

/// A count of bytes held, with a ceiling: `take` waits until the bytes fit. One request
/// larger than the whole ceiling still goes when nothing else is held, so a budget below
/// the maximum request size slows requests down instead of stopping them.
#[derive(Debug)]
struct Budget {
    limit: usize,
    held: Mutex<usize>,
    freed: std::sync::Condvar,
}

impl Budget {
    fn new(limit: usize) -> Budget {
        Budget {
            limit: limit.max(1),
            held: Mutex::new(0),
            freed: std::sync::Condvar::new(),
        }
    }

    fn take(&self, n: usize) -> Held<'_> {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        while *held > 0 && held.saturating_add(n) > self.limit {
            held = self.freed.wait(held).unwrap_or_else(|p| p.into_inner());
        }
        *held += n;
        Held { budget: self, n }
    }
}

/// Bytes taken from a [`Budget`], given back on drop.
#[derive(Debug)]
struct Held<'a> {
    budget: &'a Budget,
    n: usize,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        let mut held = self.budget.held.lock().unwrap_or_else(|p| p.into_inner());
        *held -= self.n;
        self.budget.freed.notify_all();
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

/// Bound listening sockets, ready for [`Server::serve`].
#[derive(Debug)]
pub struct Listeners {
    items: Vec<(Listen, BoundListener)>,
}

#[derive(Debug)]
enum BoundListener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listeners {
    /// The addresses actually bound (a `tcp:…:0` request shows its real port).
    pub fn addresses(&self) -> Vec<Listen> {
        self.items.iter().map(|(l, _)| l.clone()).collect()
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        for (l, _) in &self.items {
            if let Listen::Unix(p) = l {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// An NBD server over a fixed set of exports.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
}

impl Server {
    pub fn new(config: ServerConfig) -> Result<Server, ConfigError> {
        if config.exports.is_empty() {
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
                max_connections: config.max_connections.max(1),
                client_timeout: config.client_timeout.max(Duration::from_millis(1)),
                in_flight: Budget::new(config.max_in_flight),
                grace: config.shutdown_grace,
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

    /// Binds every address. A stale Unix socket file (nobody listening) is replaced; a
    /// live one is an error.
    pub fn bind(&self, listen: &[Listen]) -> io::Result<Listeners> {
        let mut items = Vec::new();
        for l in listen {
            match l {
                Listen::Unix(path) => {
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
                    // Owner only: the socket gives raw access to the data. Created so under
                    // the umask (0700), then 0600: no other user can connect at any moment.
                    let lst = bind_owner_only(path).map_err(|e| {
                        io::Error::new(e.kind(), format!("bind {}: {e}", path.display()))
                    })?;
                    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
                    lst.set_nonblocking(true)?;
                    items.push((l.clone(), BoundListener::Unix(lst)));
                }
                Listen::Tcp(addr) => {
                    let lst = TcpListener::bind(addr)
                        .map_err(|e| io::Error::new(e.kind(), format!("bind {addr}: {e}")))?;
                    lst.set_nonblocking(true)?;
                    let real = lst.local_addr()?;
                    items.push((Listen::Tcp(real), BoundListener::Tcp(lst)));
                }
            }
        }
        Ok(Listeners { items })
    }

    /// Accepts connections until shutdown, then waits (up to the grace period) for
    /// connections to finish, and flushes every writable export. A failed final flush is
    /// an error.
    pub fn serve(&self, listeners: Listeners) -> io::Result<()> {
        let mut handles: Vec<thread::JoinHandle<()>> = Vec::new();
        let mut fds: Vec<libc::pollfd> = listeners
            .items
            .iter()
            .map(|(_, l)| libc::pollfd {
                fd: match l {
                    BoundListener::Unix(u) => u.as_raw_fd(),
                    BoundListener::Tcp(t) => t.as_raw_fd(),
                },
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // Conditions logged once when they start and once when they end, not per event.
        let mut starved = false;
        let mut full = false;
        while !self.shared.shutdown.load(Ordering::SeqCst) {
            handles.retain(|h| !h.is_finished());
            self.cut_slow_handshakes();
            let nfds = libc::nfds_t::try_from(fds.len()).unwrap_or(0);
            // SAFETY: fds is a live, correctly sized array of pollfd for the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), nfds, 200) };
            if n <= 0 {
                continue;
            }
            for (i, (_, l)) in listeners.items.iter().enumerate() {
                if fds[i].revents == 0 {
                    continue;
                }
                fds[i].revents = 0;
                loop {
                    let accepted = match l {
                        BoundListener::Unix(u) => u.accept().map(|(s, _)| Conn::unix(s)),
                        BoundListener::Tcp(t) => t.accept().map(|(s, a)| Conn::tcp(s, a)),
                    };
                    let e = match accepted {
                        Ok(Ok(conn)) => {
                            if starved {
                                starved = false;
                                tracing::info!("accepting connections again");
                            }
                            if handles.len() >= self.shared.max_connections {
                                if !full {
                                    full = true;
                                    tracing::warn!(
                                        "{} connections, the most allowed (--max-connections): \
                                         closing new ones until some end",
                                        handles.len()
                                    );
                                }
                                continue;
                            }
                            if full {
                                full = false;
                                tracing::info!("below the connection limit again");
                            }
                            if let Some(h) = self.spawn_connection(conn) {
                                handles.push(h);
                            }
                            continue;
                        }
                        Ok(Err(e)) => e,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => e,
                    };
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    ) {
                        // The connection waits in the backlog (or was closed); poll would
                        // report it again at once, so pause instead of spinning.
                        if !starved {
                            starved = true;
                            tracing::warn!(
                                "accepting a connection: {e}; new connections wait until \
                                 some close (raise the limit with `ulimit -n`)"
                            );
                        }
                        thread::sleep(ACCEPT_BACKOFF);
                    } else {
                        tracing::debug!("accepting a connection: {e}");
                    }
                    break;
                }
            }
        }
        tracing::info!("shutting down: finishing in-flight requests");
        let deadline = Instant::now() + self.shared.grace;
        while handles.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        let stuck = self.shared.conns.lock().expect("conns lock").len();
        if stuck > 0 {
            tracing::warn!("{stuck} connection(s) still busy after the grace period; closing them");
            for c in self.shared.conns.lock().expect("conns lock").values() {
                c.ctl.shutdown_both();
            }
            let deadline = Instant::now() + Duration::from_secs(1);
            while handles.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
        }
        let mut failed = Vec::new();
        let exports = self.shared.exports().clone();
        for e in &exports {
            if !e.export.read_only {
                if let Err(err) = e.export.device.flush() {
                    tracing::error!("flushing export {}: {err}", e.export.name);
                    failed.push(format!("export {}: {err}", e.export.name));
                }
            }
        }
        drop(listeners);
        if !failed.is_empty() {
            // Data acknowledged to clients may not be durable: the caller must know.
            return Err(io::Error::other(format!(
                "final flush failed: {}",
                failed.join("; ")
            )));
        }
        Ok(())
    }

    /// Cuts connections whose handshake outlived its deadline: their threads, blocked in
    /// a read, see the end of the stream.
    fn cut_slow_handshakes(&self) {
        let now = Instant::now();
        let conns = self.shared.conns.lock().expect("conns lock");
        for c in conns.values() {
            if c.handshake_deadline.is_some_and(|d| now >= d) {
                tracing::debug!(
                    "{}: no handshake within the client timeout; closing",
                    c.peer
                );
                c.ctl.shutdown_both();
            }
        }
    }

    fn spawn_connection(&self, conn: Conn) -> Option<thread::JoinHandle<()>> {
        // A client that stops reading makes reply writes fail after this instead of
        // blocking a worker, and the memory of its reply, for ever.
        if let Err(e) = conn.ctl.set_write_timeout(self.shared.client_timeout) {
            tracing::warn!("{}: setting a send timeout: {e}", conn.peer);
            return None;
        }
        let shared = self.shared.clone();
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let builder = thread::Builder::new().name(format!("nbd-conn-{id}"));
        let res = builder.spawn(move || {
            shared.conns.lock().expect("conns lock").insert(
                id,
                ConnEntry {
                    ctl: conn.ctl,
                    peer: conn.peer.clone(),
                    export: None,
                    since: SystemTime::now(),
                    handshake_deadline: Some(Instant::now() + shared.client_timeout),
                },
            );
            // A shutdown that raced with the insert would miss this connection.
            if shared.shutdown.load(Ordering::SeqCst) {
                if let Some(c) = shared.conns.lock().expect("conns lock").get(&id) {
                    c.ctl.shutdown_read();
                }
            }
            tracing::debug!("{}: connected", conn.peer);
            serve_connection(&shared, conn.reader, conn.writer, &conn.peer, id);
            shared.conns.lock().expect("conns lock").remove(&id);
        });
        match res {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::error!("cannot start a connection thread: {e}");
                None
            }
        }
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
        serve_connection(&self.shared, reader, writer, peer, 0);
    }
}

/// One connection as [`ExportsHandle::connections`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    pub id: u64,
    /// "unix:fd7", "tcp:127.0.0.1:50122".
    pub peer: String,
    /// The export it uses, once the handshake chose one.
    pub export: Option<String>,
    pub since: SystemTime,
}

/// What [`ExportsHandle::add`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    Added,
    /// An export of that name with the same device was there already.
    AlreadyPresent,
}

/// What [`ExportsHandle::remove`] did.
#[derive(Debug)]
pub struct Removed {
    pub export: Export,
    /// Connections that were using it and were closed (after their in-flight requests).
    pub connections: usize,
}

/// Adds and removes exports of a running server.
///
/// Removing an export stops new handshakes from finding it, then ends the connections
/// that use it the way shutdown does (reads stop, requests already received are
/// answered, the connection's writes are flushed), waits for them up to the grace
/// period, and flushes the device.
#[derive(Debug, Clone)]
pub struct ExportsHandle(Arc<Shared>);

impl ExportsHandle {
    /// The exports now, in the order they were added.
    pub fn list(&self) -> Vec<Export> {
        self.0.exports().iter().map(|e| e.export.clone()).collect()
    }

    /// Adds `export`. The same name with the same device (`Arc::ptr_eq`) is
    /// [`Added::AlreadyPresent`]; the same name with another device is an error.
    pub fn add(&self, export: Export) -> Result<Added, ConfigError> {
        if export.name.is_empty() || export.name.len() > MAX_STRING || export.name.contains('\0') {
            return Err(ConfigError(format!(
                "export name {:?} must be 1 to {MAX_STRING} bytes without NUL",
                export.name
            )));
        }
        let mut list = self.0.exports.write().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = list.iter().find(|e| e.export.name == export.name) {
            if Arc::ptr_eq(&e.export.device, &export.device) {
                return Ok(Added::AlreadyPresent);
            }
            return Err(ConfigError(format!(
                "an export named {:?} is already served",
                export.name
            )));
        }
        list.push(Arc::new(ExportEntry::new(export)));
        Ok(Added::Added)
    }

    /// Removes the export `name`; `None` if there is none.
    pub fn remove(&self, name: &str) -> Option<Removed> {
        let entry = {
            let mut list = self.0.exports.write().unwrap_or_else(|p| p.into_inner());
            let i = list.iter().position(|e| e.export.name == name)?;
            list.remove(i)
        };
        let users: Vec<u64> = {
            let conns = self.0.conns.lock().expect("conns lock");
            conns
                .iter()
                .filter(|(_, c)| c.export.as_deref() == Some(name))
                .map(|(id, c)| {
                    c.ctl.shutdown_read();
                    *id
                })
                .collect()
        };
        let deadline = Instant::now() + self.0.grace;
        loop {
            let left = {
                let conns = self.0.conns.lock().expect("conns lock");
                users.iter().filter(|id| conns.contains_key(id)).count()
            };
            if left == 0 {
                break;
            }
            if Instant::now() > deadline {
                tracing::warn!("export {name:?}: {left} connection(s) still busy; closing them");
                let conns = self.0.conns.lock().expect("conns lock");
                for id in &users {
                    if let Some(c) = conns.get(id) {
                        c.ctl.shutdown_both();
                    }
                }
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        if !entry.export.read_only {
            if let Err(e) = entry.export.device.flush() {
                tracing::error!("export {name:?}: flush on removal: {e}");
            }
        }
        Some(Removed {
            export: entry.export.clone(),
            connections: users.len(),
        })
    }

    /// Live connections, oldest first.
    pub fn connections(&self) -> Vec<ConnectionInfo> {
        let conns = self.0.conns.lock().expect("conns lock");
        let mut v: Vec<ConnectionInfo> = conns
            .iter()
            .map(|(id, c)| ConnectionInfo {
                id: *id,
                peer: c.peer.clone(),
                export: c.export.clone(),
                since: c.since,
            })
            .collect();
        v.sort_by_key(|c| c.id);
        v
    }
}

/// Binds a Unix socket that is owner-only (0700) from the moment it exists; the caller
/// makes it 0600. The umask is process-wide: a file or directory another thread creates
/// in this short window is owner-only too (0077 keeps a directory's owner bits, where
/// 0177 would make a directory its owner cannot enter).
fn bind_owner_only(path: &std::path::Path) -> io::Result<UnixListener> {
    // SAFETY: umask only swaps the process's file-creation mask; it cannot fail.
    let old = unsafe { libc::umask(0o077) };
    let res = UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    res
}

/// An accepted socket split into independent read and write handles.
struct Conn {
    reader: Box<dyn Read + Send>,
    writer: Box<dyn Write + Send>,
    ctl: Box<dyn SocketCtl>,
    peer: String,
}

impl Conn {
    // One descriptor per connection, shared by the reader, the writer and the control
    // handle: where descriptors are scarce, three per connection would run out three
    // times sooner, and an accepted connection would be lost to a failed dup.
    fn unix(s: UnixStream) -> io::Result<Conn> {
        s.set_nonblocking(false)?;
        let peer = format!("unix:fd{}", s.as_raw_fd());
        let s = Arc::new(s);
        Ok(Conn {
            reader: Box::new(SharedSocket(s.clone())),
            writer: Box::new(SharedSocket(s.clone())),
            ctl: Box::new(SharedSocket(s)),
            peer,
        })
    }
    fn tcp(s: TcpStream, addr: SocketAddr) -> io::Result<Conn> {
        s.set_nonblocking(false)?;
        s.set_nodelay(true)?;
        let s = Arc::new(s);
        Ok(Conn {
            reader: Box::new(SharedSocket(s.clone())),
            writer: Box::new(SharedSocket(s.clone())),
            ctl: Box::new(SharedSocket(s)),
            peer: format!("tcp:{addr}"),
        })
    }
}

/// A socket used from several places at once (reads and writes are independent on a
/// socket, as with `try_clone`, without another descriptor).
#[derive(Debug)]
struct SharedSocket<S>(Arc<S>);

impl<S> Read for SharedSocket<S>
where
    for<'a> &'a S: Read,
{
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self.0).read(buf)
    }
}

impl<S> Write for SharedSocket<S>
where
    for<'a> &'a S: Write,
{
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self.0).write(buf)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&*self.0).write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        (&*self.0).flush()
    }
}

impl<S: SocketCtl + Sync> SocketCtl for SharedSocket<S> {
    fn shutdown_read(&self) {
        self.0.shutdown_read();
    }
    fn shutdown_both(&self) {
        self.0.shutdown_both();
    }
    fn set_write_timeout(&self, t: Duration) -> io::Result<()> {
        self.0.set_write_timeout(t)
    }
}

// ---------------------------------------------------------------------------------------
// Handshake

/// What the handshake settled on.
struct Session {
    export: Arc<ExportEntry>,
    structured: bool,
    base_allocation: bool,
}

enum Next {
    Continue,
    Transmit(Session),
    Close,
}

struct Handshake<'a> {
    shared: &'a Shared,
    reader: &'a mut BufReader<Box<dyn Read + Send>>,
    writer: &'a mut Box<dyn Write + Send>,
    peer: &'a str,
    fixed: bool,
    no_zeroes: bool,
    structured: bool,
    /// Export name the meta contexts were set for, and whether base:allocation is on.
    meta: Option<(String, bool)>,
}

fn read_exact_or_eof(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) if done == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads and throws away `n` bytes in bounded chunks.
fn drain(r: &mut impl Read, mut n: u64) -> io::Result<()> {
    let mut scratch = [0u8; 8192];
    while n > 0 {
        let k = usize::try_from(n.min(scratch.len() as u64)).unwrap_or(scratch.len());
        r.read_exact(&mut scratch[..k])?;
        n -= k as u64;
    }
    Ok(())
}

impl Handshake<'_> {
    fn reply(&mut self, option: u32, kind: u32, data: &[u8]) -> io::Result<()> {
        let len = u32::try_from(data.len()).map_err(|_| io::ErrorKind::InvalidData)?;
        let h = encode_option_reply_header(option, kind, len);
        write_all_vectored(self.writer, &mut [IoSlice::new(&h), IoSlice::new(data)])
    }

    fn error(&mut self, option: u32, kind: u32, msg: &str) -> io::Result<()> {
        tracing::debug!("{}: option {option}: {msg}", self.peer);
        let msg = &msg.as_bytes()[..msg.len().min(MAX_STRING)];
        self.reply(option, kind, msg)
    }

    fn run(&mut self) -> io::Result<Option<Session>> {
        let mut hello = [0u8; 18];
        hello[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
        hello[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
        hello[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        self.writer.write_all(&hello)?;
        self.writer.flush()?;
        let mut cf = [0u8; 4];
        if !read_exact_or_eof(self.reader, &mut cf)? {
            return Ok(None);
        }
        let client_flags = u32::from_be_bytes(cf);
        if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
            tracing::debug!("{}: unknown client flags {client_flags:#x}", self.peer);
            return Ok(None);
        }
        self.fixed = client_flags & FLAG_C_FIXED_NEWSTYLE != 0;
        self.no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
        loop {
            let mut h = [0u8; 16];
            if !read_exact_or_eof(self.reader, &mut h)? {
                return Ok(None);
            }
            let magic = u64::from_be_bytes(h[0..8].try_into().expect("8 bytes"));
            if magic != IHAVEOPT {
                tracing::debug!("{}: bad option magic {magic:#x}", self.peer);
                return Ok(None);
            }
            let option = u32::from_be_bytes(h[8..12].try_into().expect("4 bytes"));
            let length = u32::from_be_bytes(h[12..16].try_into().expect("4 bytes"));
            if length > MAX_OPTION_DATA {
                drain(self.reader, u64::from(length))?;
                if option == OPT_EXPORT_NAME || !self.fixed {
                    return Ok(None);
                }
                self.error(option, REP_ERR_TOO_BIG, "option data too large")?;
                continue;
            }
            let mut data = vec![0u8; usize::try_from(length).expect("<= MAX_OPTION_DATA")];
            self.reader.read_exact(&mut data)?;
            if self.shared.shutdown.load(Ordering::SeqCst) {
                if option != OPT_EXPORT_NAME && self.fixed {
                    self.error(option, REP_ERR_SHUTDOWN, "server is shutting down")?;
                }
                return Ok(None);
            }
            if !self.fixed && option != OPT_EXPORT_NAME {
                return Ok(None);
            }
            match self.option(option, &data)? {
                Next::Continue => {}
                Next::Transmit(s) => return Ok(Some(s)),
                Next::Close => return Ok(None),
            }
        }
    }

    fn transmission_flags(&self, e: &ExportEntry) -> u16 {
        if self.structured {
            e.flags | FLAG_SEND_DF
        } else {
            e.flags
        }
    }

    fn session(&self, export: Arc<ExportEntry>) -> Session {
        let base_allocation = match &self.meta {
            Some((name, on)) => {
                *on && self
                    .shared
                    .find(name)
                    .is_some_and(|e| Arc::ptr_eq(&e, &export))
            }
            None => false,
        };
        Session {
            export,
            structured: self.structured,
            base_allocation,
        }
    }

    fn option(&mut self, option: u32, data: &[u8]) -> io::Result<Next> {
        match option {
            OPT_EXPORT_NAME => {
                let Ok(name) = std::str::from_utf8(data) else {
                    return Ok(Next::Close);
                };
                let Some(e) = self.shared.find(name) else {
                    tracing::info!("{}: unknown export {name:?}; closing", self.peer);
                    return Ok(Next::Close);
                };
                let mut r = Vec::with_capacity(134);
                r.extend_from_slice(&e.geometry.size.to_be_bytes());
                r.extend_from_slice(&self.transmission_flags(&e).to_be_bytes());
                if !self.no_zeroes {
                    r.extend_from_slice(&[0u8; 124]);
                }
                self.writer.write_all(&r)?;
                self.writer.flush()?;
                Ok(Next::Transmit(self.session(e)))
            }
            OPT_ABORT => {
                let _ = self.reply(option, REP_ACK, &[]);
                Ok(Next::Close)
            }
            OPT_LIST => {
                if !data.is_empty() {
                    self.error(option, REP_ERR_INVALID, "NBD_OPT_LIST takes no data")?;
                    return Ok(Next::Continue);
                }
                let exports = self.shared.exports().clone();
                for e in exports {
                    let name = e.export.name.as_bytes();
                    let mut r = Vec::with_capacity(4 + name.len() + e.export.description.len());
                    r.extend_from_slice(&u32::try_from(name.len()).expect("<= 4096").to_be_bytes());
                    r.extend_from_slice(name);
                    let d = e.export.description.as_bytes();
                    r.extend_from_slice(&d[..d.len().min(MAX_STRING)]);
                    self.reply(option, REP_SERVER, &r)?;
                }
                self.reply(option, REP_ACK, &[])?;
                Ok(Next::Continue)
            }
            OPT_STARTTLS => {
                self.error(option, REP_ERR_UNSUP, "TLS is not supported by this server")?;
                Ok(Next::Continue)
            }
            OPT_INFO | OPT_GO => {
                let req = match parse_info_request(data) {
                    Ok(r) => r,
                    Err(OptionError(m)) => {
                        self.error(option, REP_ERR_INVALID, &m)?;
                        return Ok(Next::Continue);
                    }
                };
                let Some(e) = self.shared.find(&req.name) else {
                    let msg = if req.name.is_empty() {
                        "no default export: this server has several; name one".to_string()
                    } else {
                        format!("no export named {:?}", req.name)
                    };
                    self.error(option, REP_ERR_UNKNOWN, &msg)?;
                    return Ok(Next::Continue);
                };
                for &what in &req.requests {
                    let mut r = Vec::new();
                    match what {
                        INFO_NAME => {
                            r.extend_from_slice(&INFO_NAME.to_be_bytes());
                            r.extend_from_slice(e.export.name.as_bytes());
                        }
                        INFO_DESCRIPTION => {
                            r.extend_from_slice(&INFO_DESCRIPTION.to_be_bytes());
                            let d = e.export.description.as_bytes();
                            r.extend_from_slice(&d[..d.len().min(MAX_STRING)]);
                        }
                        _ => continue, // block size and export go out unasked, below
                    }
                    self.reply(option, REP_INFO, &r)?;
                }
                let mut bs = Vec::with_capacity(14);
                bs.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                bs.extend_from_slice(&e.min_block.to_be_bytes());
                bs.extend_from_slice(&e.preferred_block.to_be_bytes());
                bs.extend_from_slice(&e.max_block.to_be_bytes());
                self.reply(option, REP_INFO, &bs)?;
                let mut ex = Vec::with_capacity(12);
                ex.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                ex.extend_from_slice(&e.geometry.size.to_be_bytes());
                ex.extend_from_slice(&self.transmission_flags(&e).to_be_bytes());
                self.reply(option, REP_INFO, &ex)?;
                self.reply(option, REP_ACK, &[])?;
                if option == OPT_GO {
                    return Ok(Next::Transmit(self.session(e)));
                }
                Ok(Next::Continue)
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    self.error(
                        option,
                        REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    )?;
                } else if self.structured {
                    self.error(
                        option,
                        REP_ERR_INVALID,
                        "structured replies already negotiated",
                    )?;
                } else {
                    self.structured = true;
                    self.reply(option, REP_ACK, &[])?;
                }
                Ok(Next::Continue)
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.meta_context(option, data)?;
                Ok(Next::Continue)
            }
            _ => {
                self.error(
                    option,
                    REP_ERR_UNSUP,
                    &format!("option {option} is not supported"),
                )?;
                Ok(Next::Continue)
            }
        }
    }

    fn meta_context(&mut self, option: u32, data: &[u8]) -> io::Result<()> {
        let set = option == OPT_SET_META_CONTEXT;
        if !self.structured {
            return self.error(
                option,
                REP_ERR_INVALID,
                "negotiate structured replies first",
            );
        }
        let req = match parse_meta_context_request(data) {
            Ok(r) => r,
            Err(OptionError(m)) => return self.error(option, REP_ERR_INVALID, &m),
        };
        if self.shared.find(&req.name).is_none() {
            return self.error(
                option,
                REP_ERR_UNKNOWN,
                &format!("no export named {:?}", req.name),
            );
        }
        let mut selected = !set && req.queries.is_empty();
        for q in &req.queries {
            match query_selects_base_allocation(q) {
                Ok(s) => selected |= s,
                Err(OptionError(m)) => return self.error(option, REP_ERR_INVALID, &m),
            }
        }
        if selected {
            let id = if set { BASE_ALLOCATION_ID } else { 0 };
            let mut r = Vec::with_capacity(4 + BASE_ALLOCATION.len());
            r.extend_from_slice(&id.to_be_bytes());
            r.extend_from_slice(BASE_ALLOCATION.as_bytes());
            self.reply(option, REP_META_CONTEXT, &r)?;
        }
        if set {
            self.meta = Some((req.name, selected));
        }
        self.reply(option, REP_ACK, &[])
    }
}

// ---------------------------------------------------------------------------------------
// Transmission

/// Writes every byte of every slice, coping with short writes.
pub(crate) fn write_all_vectored(
    w: &mut dyn Write,
    mut bufs: &mut [IoSlice<'_>],
) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The one mapping from block-layer errors to NBD error values.
pub fn nbd_errno(kind: ErrorKind) -> u32 {
    match kind {
        ErrorKind::OutOfRange | ErrorKind::Unaligned | ErrorKind::InvalidArgument => EINVAL,
        ErrorKind::ReadOnly => EPERM,
        ErrorKind::NoSpace => ENOSPC,
        ErrorKind::Unsupported => ENOTSUP,
        ErrorKind::Shutdown => ESHUTDOWN,
        _ => EIO,
    }
}

/// A request's failure: the wire error and a message for structured replies.
struct Failure {
    errno: u32,
    message: String,
}

impl Failure {
    fn new(errno: u32, message: impl Into<String>) -> Failure {
        Failure {
            errno,
            message: message.into(),
        }
    }
}

impl From<cairn_block::Error> for Failure {
    fn from(e: cairn_block::Error) -> Failure {
        Failure {
            errno: nbd_errno(e.kind()),
            message: e.to_string(),
        }
    }
}

/// Largest per-worker buffer kept between requests.
const KEEP_BUFFER: usize = 4 << 20;

struct Transmission {
    reader: Mutex<BufReader<Box<dyn Read + Send>>>,
    writer: Mutex<Box<dyn Write + Send>>,
    export: Arc<ExportEntry>,
    flags: u16,
    structured: bool,
    base_allocation: bool,
    closing: AtomicBool,
    peer: String,
    wrote: AtomicBool,
    shared: Arc<Shared>,
    /// The connection's id in `shared.conns` (0: not listed).
    id: u64,
    /// This connection's share of the bytes in flight.
    in_flight: Budget,
}

/// What one read from the stream produced.
enum Incoming<'a> {
    /// A request to execute (payload, if any, is in the worker's buffer), or one already
    /// refused while reading; with the budget its buffer holds until the reply is sent.
    Request(Request, Result<(), Failure>, Option<(Held<'a>, Held<'a>)>),
    /// The stream ended or broke: stop.
    Stop,
}

fn serve_connection(
    shared: &Arc<Shared>,
    reader: Box<dyn Read + Send>,
    mut writer: Box<dyn Write + Send>,
    peer: &str,
    id: u64,
) {
    let mut reader = BufReader::with_capacity(64 << 10, reader);
    let mut hs = Handshake {
        shared,
        reader: &mut reader,
        writer: &mut writer,
        peer,
        fixed: false,
        no_zeroes: false,
        structured: false,
        meta: None,
    };
    let session = match hs.run() {
        Ok(Some(s)) => s,
        Ok(None) => return,
        Err(e) => {
            tracing::debug!("{peer}: handshake ended: {e}");
            return;
        }
    };
    let flags = hs.transmission_flags(&session.export);
    if let Some(c) = shared.conns.lock().expect("conns lock").get_mut(&id) {
        c.export = Some(session.export.export.name.clone());
        c.handshake_deadline = None;
    }
    // An export removed while this handshake finished: removal did not see this
    // connection as a user, so do not start serving it.
    if shared
        .find(&session.export.export.name)
        .is_none_or(|e| !Arc::ptr_eq(&e, &session.export))
    {
        tracing::info!(
            "{peer}: export {:?} was removed; closing",
            session.export.export.name
        );
        return;
    }
    tracing::info!(
        "{peer}: export {:?} ({} bytes{}{})",
        session.export.export.name,
        session.export.geometry.size,
        if session.structured {
            ", structured replies"
        } else {
            ""
        },
        if session.base_allocation {
            ", base:allocation"
        } else {
            ""
        },
    );
    let t = Arc::new(Transmission {
        reader: Mutex::new(reader),
        writer: Mutex::new(writer),
        export: session.export,
        flags,
        structured: session.structured,
        base_allocation: session.base_allocation,
        closing: AtomicBool::new(false),
        peer: peer.to_string(),
        wrote: AtomicBool::new(false),
        shared: shared.clone(),
        id,
        in_flight: Budget::new(CONNECTION_IN_FLIGHT),
    });
    let workers: Vec<_> = (1..shared.threads)
        .filter_map(|i| {
            let t = t.clone();
            thread::Builder::new()
                .name(format!("nbd-worker-{i}"))
                .spawn(move || t.worker())
                .ok()
        })
        .collect();
    t.worker();
    for w in workers {
        let _ = w.join();
    }
    // A client that disconnects without flushing still gets its writes pushed down.
    if t.wrote.load(Ordering::Relaxed) {
        if let Err(e) = t.export.export.device.flush() {
            tracing::warn!("{peer}: flush at disconnect: {e}");
        }
    }
    if let Ok(mut w) = t.writer.lock() {
        let _ = w.flush();
    }
    tracing::debug!("{peer}: disconnected");
}

impl Transmission {
    fn worker(&self) {
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let incoming = {
                let Ok(mut r) = self.reader.lock() else {
                    return;
                };
                if self.closing.load(Ordering::Acquire) {
                    return;
                }
                let inc = self.read_request(&mut r, &mut buf);
                if matches!(inc, Incoming::Stop) {
                    self.closing.store(true, Ordering::Release);
                }
                inc
            };
            let (req, verdict, held) = match incoming {
                Incoming::Stop => return,
                Incoming::Request(req, v, held) => (req, v, held),
            };
            let result = verdict.and_then(|()| self.execute(&req, &mut buf));
            if let Err(e) = self.send_reply(&req, result, &buf) {
                tracing::debug!("{}: writing reply: {e}; closing", self.peer);
                self.closing.store(true, Ordering::Release);
                // A client that does not read (the send timed out): end the connection
                // both ways, so the other workers, blocked reading or waiting to write,
                // let go of their buffers too.
                if let Some(c) = self.shared.conns.lock().expect("conns lock").get(&self.id) {
                    c.ctl.shutdown_both();
                }
                return;
            }
            // Keep the common sizes (up to 4 MiB) warm, but do not let one 32 MiB request
            // pin 32 MiB per worker for the life of the connection.
            if buf.capacity() > KEEP_BUFFER {
                buf = Vec::new();
            }
            drop(held);
        }
    }

    /// Reads one request header and its payload. Validation happens here so a refused
    /// WRITE's payload is still consumed and the stream stays in sync.
    fn read_request(
        &self,
        r: &mut BufReader<Box<dyn Read + Send>>,
        buf: &mut Vec<u8>,
    ) -> Incoming<'_> {
        let mut h = [0u8; REQUEST_HEADER_LEN];
        match read_exact_or_eof(r, &mut h) {
            Ok(true) => {}
            Ok(false) => return Incoming::Stop,
            Err(e) => {
                tracing::debug!("{}: reading request: {e}", self.peer);
                return Incoming::Stop;
            }
        }
        let req = match Request::parse(&h) {
            Ok(req) => req,
            Err(HeaderError::BadMagic(m)) => {
                tracing::warn!("{}: bad request magic {m:#010x}; closing", self.peer);
                return Incoming::Stop;
            }
        };
        if req.kind == CMD_DISC {
            return Incoming::Stop;
        }
        let verdict = self.validate(&req);
        if req.has_payload() && req.length > MAX_SAFE_PAYLOAD && req.length > self.export.max_block
        {
            // proto.md allows a hard disconnect here: the payload is a denial of service.
            tracing::warn!("{}: {}-byte write payload; closing", self.peer, req.length);
            return Incoming::Stop;
        }
        // The buffer this request fills (its payload, or the data a READ answers) is
        // reserved before it is filled; while the budget is spent, this worker waits
        // here, holding the reader, so the connection reads nothing more.
        let need = if req.has_payload() || (req.kind == CMD_READ && verdict.is_ok()) {
            usize::try_from(req.length).expect("<= 32 MiB")
        } else {
            0
        };
        let held =
            (need > 0).then(|| (self.in_flight.take(need), self.shared.in_flight.take(need)));
        if req.has_payload() {
            buf.resize(need, 0);
            if let Err(e) = r.read_exact(&mut buf[..need]) {
                tracing::debug!("{}: reading write payload: {e}", self.peer);
                return Incoming::Stop;
            }
        }
        Incoming::Request(req, verdict, held)
    }

    fn validate(&self, req: &Request) -> Result<(), Failure> {
        let e = &self.export;
        let fail = |m: String| Err(Failure::new(EINVAL, m));
        let mut allowed = 0u16;
        if self.flags & FLAG_SEND_FUA != 0 {
            allowed |= CMD_FLAG_FUA;
        }
        match req.kind {
            CMD_READ if self.flags & FLAG_SEND_DF != 0 => allowed |= CMD_FLAG_DF,
            CMD_WRITE_ZEROES => {
                allowed |= CMD_FLAG_NO_HOLE;
                if self.flags & FLAG_SEND_FAST_ZERO != 0 {
                    allowed |= CMD_FLAG_FAST_ZERO;
                }
            }
            CMD_BLOCK_STATUS => allowed |= CMD_FLAG_REQ_ONE,
            _ => {}
        }
        let name = command_name(req.kind);
        if req.flags & !allowed != 0 {
            return fail(format!(
                "{name}: flags {:#x} not allowed",
                req.flags & !allowed
            ));
        }
        let (off, len) = (req.offset, u64::from(req.length));
        let writes = matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        let advertised = match req.kind {
            CMD_READ | CMD_WRITE | CMD_FLUSH => true,
            CMD_TRIM => self.flags & FLAG_SEND_TRIM != 0,
            CMD_WRITE_ZEROES => self.flags & FLAG_SEND_WRITE_ZEROES != 0,
            CMD_CACHE => self.flags & FLAG_SEND_CACHE != 0,
            CMD_BLOCK_STATUS => self.base_allocation,
            _ => false,
        };
        if writes && e.export.read_only {
            return Err(Failure::new(EPERM, format!("{name}: export is read-only")));
        }
        if !advertised {
            return fail(match req.kind {
                CMD_BLOCK_STATUS => "BLOCK_STATUS: no metadata context was negotiated".into(),
                k if command_name(k) == "UNKNOWN" => format!("unknown command {k}"),
                _ => format!("{name}: not supported on this export"),
            });
        }
        if req.kind == CMD_FLUSH {
            if off != 0 || len != 0 {
                return fail("FLUSH: offset and length must be zero".into());
            }
            return Ok(());
        }
        if len == 0 {
            return fail(format!("{name}: zero length"));
        }
        if matches!(req.kind, CMD_READ | CMD_WRITE) && len > u64::from(e.max_block) {
            return fail(format!(
                "{name}: {len} bytes is more than the maximum {}",
                e.max_block
            ));
        }
        let kind = match req.kind {
            CMD_WRITE => IoKind::Write,
            CMD_WRITE_ZEROES => IoKind::WriteZeroes,
            CMD_TRIM => IoKind::Discard,
            CMD_READ => IoKind::Read,
            _ => IoKind::Other,
        };
        check_io(&e.geometry, kind, off, len).map_err(Failure::from)
    }

    fn execute(&self, req: &Request, buf: &mut Vec<u8>) -> Result<(), Failure> {
        let dev = &self.export.export.device;
        let (off, len) = (req.offset, u64::from(req.length));
        let fua = req.flags & CMD_FLAG_FUA != 0;
        let wf = if fua {
            WriteFlags::FUA
        } else {
            WriteFlags::NONE
        };
        match req.kind {
            CMD_READ => {
                let n = usize::try_from(len).expect("<= max block");
                buf.resize(n, 0);
                dev.read_at(&mut buf[..n], off)?;
            }
            CMD_WRITE => {
                self.wrote.store(true, Ordering::Relaxed);
                dev.write_at(&buf[..], off, wf)?;
            }
            CMD_FLUSH => dev.flush()?,
            CMD_TRIM => {
                self.wrote.store(true, Ordering::Relaxed);
                dev.discard(off, len)?;
                if fua {
                    dev.flush()?;
                }
            }
            CMD_WRITE_ZEROES => {
                self.wrote.store(true, Ordering::Relaxed);
                let mut f = wf;
                if req.flags & CMD_FLAG_NO_HOLE != 0 {
                    f = f | WriteFlags::NO_HOLE;
                }
                let fast = req.flags & CMD_FLAG_FAST_ZERO != 0;
                if fast {
                    f = f | WriteFlags::FAST_ZERO;
                }
                match dev.write_zeroes(off, len, f) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::Unsupported && !fast => {
                        return Err(Failure::new(EIO, e.to_string()))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            CMD_CACHE => dev.cache(off, len)?,
            CMD_BLOCK_STATUS => {
                let mut ext = dev.extents(off, len)?;
                if req.flags & CMD_FLAG_REQ_ONE != 0 {
                    ext.truncate(1);
                }
                encode_block_status(&ext, off, len, buf)?;
            }
            _ => unreachable!("validate refuses unknown commands"),
        }
        Ok(())
    }

    fn send_reply(&self, req: &Request, result: Result<(), Failure>, buf: &[u8]) -> io::Result<()> {
        let mut w = self
            .writer
            .lock()
            .map_err(|_| io::Error::other("writer lock poisoned"))?;
        let w: &mut dyn Write = &mut **w;
        match result {
            Err(f) => {
                if f.errno == EIO {
                    tracing::warn!("{}: {}: {}", self.peer, command_name(req.kind), f.message);
                } else {
                    tracing::debug!("{}: {}: {}", self.peer, command_name(req.kind), f.message);
                }
                if self.structured {
                    let msg = &f.message.as_bytes()[..f.message.len().min(MAX_STRING)];
                    let msg_len = u16::try_from(msg.len()).expect("<= 4096");
                    let hdr = encode_structured_header(
                        REPLY_FLAG_DONE,
                        REPLY_TYPE_ERROR,
                        req.cookie,
                        6 + u32::from(msg_len),
                    );
                    let mut e = [0u8; 6];
                    e[0..4].copy_from_slice(&f.errno.to_be_bytes());
                    e[4..6].copy_from_slice(&msg_len.to_be_bytes());
                    write_all_vectored(
                        w,
                        &mut [IoSlice::new(&hdr), IoSlice::new(&e), IoSlice::new(msg)],
                    )
                } else {
                    w.write_all(&encode_simple_reply(f.errno, req.cookie))
                }
            }
            Ok(()) if req.kind == CMD_READ => {
                let data = &buf[..usize::try_from(req.length).expect("<= max block")];
                if self.structured {
                    let len = u32::try_from(data.len() + 8).expect("<= 32 MiB + 8");
                    let hdr = encode_structured_header(
                        REPLY_FLAG_DONE,
                        REPLY_TYPE_OFFSET_DATA,
                        req.cookie,
                        len,
                    );
                    let off = req.offset.to_be_bytes();
                    write_all_vectored(
                        w,
                        &mut [IoSlice::new(&hdr), IoSlice::new(&off), IoSlice::new(data)],
                    )
                } else {
                    let hdr = encode_simple_reply(0, req.cookie);
                    write_all_vectored(w, &mut [IoSlice::new(&hdr), IoSlice::new(data)])
                }
            }
            Ok(()) if req.kind == CMD_BLOCK_STATUS => {
                let len = u32::try_from(buf.len()).expect("bounded descriptor list");
                let hdr = encode_structured_header(
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_BLOCK_STATUS,
                    req.cookie,
                    len,
                );
                write_all_vectored(w, &mut [IoSlice::new(&hdr), IoSlice::new(buf)])
            }
            Ok(()) => w.write_all(&encode_simple_reply(0, req.cookie)),
        }
    }
}

/// Encodes `base:allocation` descriptors into `out`: context id, then (length, flags)
/// pairs. Extents are clipped to the request; at least one descriptor is sent.
fn encode_block_status(
    ext: &[Extent],
    off: u64,
    len: u64,
    out: &mut Vec<u8>,
) -> Result<(), Failure> {
    out.clear();
    out.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
    let end = off + len;
    let mut pos = off;
    for e in ext {
        if pos >= end {
            break;
        }
        if e.offset != pos || e.length == 0 {
            return Err(Failure::new(
                EIO,
                format!("device returned a bad extent list at {pos}"),
            ));
        }
        let stop = (e.offset + e.length).min(end);
        let n = u32::try_from(stop - pos).expect("clipped to a u32 request");
        let mut flags = 0;
        if e.hole {
            flags |= STATE_HOLE;
        }
        if e.zero || e.hole {
            flags |= STATE_ZERO;
        }
        out.extend_from_slice(&n.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
        pos = stop;
    }
    if out.len() == 4 {
        return Err(Failure::new(EIO, "device returned no extents"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_waits_until_bytes_are_given_back() {
        let b = Arc::new(Budget::new(100));
        let first = b.take(80);
        let (tx, rx) = std::sync::mpsc::channel();
        let b2 = b.clone();
        let t = thread::spawn(move || {
            let _h = b2.take(30);
            tx.send(()).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "did not wait"
        );
        drop(first);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("woke when bytes came back");
        t.join().unwrap();
        assert_eq!(*b.held.lock().unwrap(), 0);
    }

    #[test]
    fn a_request_larger_than_the_budget_goes_alone() {
        let b = Budget::new(10);
        let h = b.take(50);
        assert_eq!(*b.held.lock().unwrap(), 50);
        drop(h);
        assert_eq!(*b.held.lock().unwrap(), 0);
    }
}
