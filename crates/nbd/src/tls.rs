//! NBD over TLS (`NBD_OPT_STARTTLS`): credentials for both sides, and the TLS stream that
//! a connection's reader and its writers share.
//!
//! ```text
//!   ServerTls / ClientTls    -- an OpenSSL context built once from a certificates
//!                               directory (libnbd's and nbdkit's layout) or a PSK file
//!   TlsConn                  -- one TLS session over a non-blocking socket, behind a mutex
//!     TlsReader (one thread) -- ssl_read under the lock; waits in poll() without it
//!     TlsWriter (any thread) -- ssl_write under the lock; waits in poll() without it
//! ```
//!
//! An OpenSSL session cannot be read and written by two threads at once, but the server
//! reads requests on one thread and writes replies from pool workers, and the client reads
//! replies on one thread while callers send. The socket is therefore non-blocking and every
//! `SSL_read`/`SSL_write` runs under one mutex: a call holds it only while it encrypts or
//! decrypts what is there, and a thread that must wait for the socket waits in `poll()`
//! with the lock released, so a reader waiting for a request never stalls a reply.
//!
//! TLS 1.3, and TLS 1.2 because the NBD protocol requires it of every implementation (the
//! Linux `nbd-client` speaks nothing newer): with 1.2 only forward-secret AEAD suites
//! (ECDHE with AES-GCM or ChaCha20-Poly1305), and for PSK the PSK suites with an AEAD
//! ([`TLS12_PSK_SUITES`]). PSK uses OpenSSL's PSK callbacks (TLS 1.3 external PSK, with
//! `TLS_AES_128_GCM_SHA256`); GnuTLS (libnbd, nbdkit, qemu) speaks it.
//!
//! With X.509 and no `verify_peer`, a client off loopback (its address is not a loopback
//! one and not a Unix socket) must still present a certificate the CA signed, unless the
//! server was told `anonymous_clients`: a certificate alone on the server encrypts, but
//! lets anyone in. Key material is
//! read from the PSK file into zeroized memory and never printed: `Debug` shows the kind of
//! credentials and the user names only.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use openssl::ssl::{
    ErrorCode, Ssl, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslOptions, SslStream,
    SslVerifyMode, SslVersion,
};
use zeroize::Zeroizing;

/// The socket under a TLS session: kept alive as long as the session, its descriptor
/// used for I/O and `poll()`.
pub(crate) type Socket = Arc<dyn AsRawFd + Send + Sync>;

/// Most plaintext in one TLS record: small slices of a vectored write are gathered up to
/// this so a reply header and its data leave in one record.
const RECORD: usize = 16 << 10;

/// Longest PSK accepted (OpenSSL's PSK_MAX_PSK_LEN).
const MAX_PSK: usize = 256;

// ---------------------------------------------------------------------------------------
// Credentials

/// A PSK file as psktool writes it: `username:hexkey` lines.
struct PskKeys {
    keys: HashMap<String, Zeroizing<Vec<u8>>>,
}

impl PskKeys {
    /// Reads `path`. Errors name the file and line, never what is on it.
    fn read(path: &Path) -> Result<PskKeys, String> {
        let text = Zeroizing::new(
            std::fs::read_to_string(path)
                .map_err(|e| format!("PSK file {}: {e}", path.display()))?,
        );
        let mut keys = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| format!("PSK file {} line {}: {why}", path.display(), i + 1);
            let (user, hex) = line
                .split_once(':')
                .ok_or_else(|| bad("expected username:hexkey (psktool's format)"))?;
            if user.is_empty() || user.len() > 127 {
                return Err(bad("the user name must be 1 to 127 bytes"));
            }
            let key = decode_hex(hex).ok_or_else(|| bad("the key is not hexadecimal"))?;
            if key.is_empty() || key.len() > MAX_PSK {
                return Err(bad("the key must be 1 to 256 bytes"));
            }
            keys.insert(user.to_string(), key);
        }
        if keys.is_empty() {
            return Err(format!("PSK file {} holds no keys", path.display()));
        }
        Ok(PskKeys { keys })
    }
}

fn decode_hex(s: &str) -> Option<Zeroizing<Vec<u8>>> {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return None;
    }
    let nib = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = Zeroizing::new(Vec::with_capacity(b.len() / 2));
    for pair in b.chunks(2) {
        out.push(nib(pair[0])? << 4 | nib(pair[1])?);
    }
    Some(out)
}

/// TLS 1.2 suites with certificates: forward secrecy (ECDHE) and an AEAD, nothing else
/// (no CBC, no RSA key exchange, no SHA-1 MAC).
pub const TLS12_X509_SUITES: &str = "ECDHE+AESGCM:ECDHE+CHACHA20";

/// TLS 1.2 suites with a PSK: an AEAD only. OpenSSL has ECDHE-PSK with ChaCha20 only; the
/// plain PSK ones follow (as GnuTLS's `+PSK` offers them).
pub const TLS12_PSK_SUITES: &str = "ECDHE-PSK-CHACHA20-POLY1305:PSK-AES128-GCM-SHA256:\
                                    PSK-AES256-GCM-SHA384:PSK-CHACHA20-POLY1305";

fn builder(method: SslMethod, kind: TlsKind) -> Result<SslContextBuilder, String> {
    let mut b = SslContextBuilder::new(method).map_err(|e| format!("TLS: {e}"))?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))
        .map_err(|e| format!("TLS 1.2: {e}"))?;
    b.set_cipher_list(match kind {
        TlsKind::X509 => TLS12_X509_SUITES,
        TlsKind::Psk => TLS12_PSK_SUITES,
    })
    .map_err(|e| format!("TLS: {e}"))?;
    // Many NBD peers (qemu among them) close without a close_notify: that is an end of
    // stream, not an error. Renegotiation (TLS 1.2) is refused.
    b.set_options(
        SslOptions::IGNORE_UNEXPECTED_EOF
            | SslOptions::NO_RENEGOTIATION
            | SslOptions::CIPHER_SERVER_PREFERENCE,
    );
    // AES-128-GCM first: as strong as NBD needs, and the cheapest with AES-NI (PSK
    // uses it anyway: its hash is SHA-256).
    b.set_ciphersuites(
        "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256",
    )
    .map_err(|e| format!("TLS: {e}"))?;
    // Read what the socket has, not one record header and body at a time: a 1 MiB
    // request is 64 records, two reads each without this.
    b.set_read_ahead(true);
    Ok(b)
}

fn file_in(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let p = dir.join(name);
    if p.is_file() {
        Ok(p)
    } else {
        Err(format!(
            "TLS certificates directory {}: no {name}",
            dir.display()
        ))
    }
}

/// Which credentials a side uses, for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsKind {
    X509,
    Psk,
}

impl fmt::Display for TlsKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TlsKind::X509 => "X.509",
            TlsKind::Psk => "PSK",
        })
    }
}

/// The server's TLS: its credentials and whether plaintext clients are served too.
#[derive(Clone)]
pub struct ServerTls {
    ctx: SslContext,
    kind: TlsKind,
    required: bool,
    users: Vec<String>,
    /// X.509: every client presents a certificate (`ctx` checks it).
    verify_peer: bool,
    /// X.509 without `verify_peer`: the context for clients off loopback, which checks
    /// their certificate (`None` when there is no `ca-cert.pem`).
    remote_ctx: Option<SslContext>,
    /// X.509 without `verify_peer`: clients off loopback need no certificate either.
    anonymous_clients: bool,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("kind", &self.kind)
            .field("required", &self.required)
            .field("users", &self.users)
            .field("verify_peer", &self.verify_peer)
            .field("anonymous_clients", &self.anonymous_clients)
            .finish()
    }
}

/// An X.509 server context from `dir`; with `verify_peer`, clients must present a
/// certificate that `ca-cert.pem` signed.
fn x509_server_ctx(dir: &Path, verify_peer: bool) -> Result<SslContext, String> {
    let mut b = builder(SslMethod::tls_server(), TlsKind::X509)?;
    let cert = file_in(dir, "server-cert.pem")?;
    let key = file_in(dir, "server-key.pem")?;
    b.set_certificate_chain_file(&cert)
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    b.set_private_key_file(&key, SslFiletype::PEM)
        .map_err(|e| format!("{}: {e}", key.display()))?;
    b.check_private_key()
        .map_err(|e| format!("{} does not match {}: {e}", key.display(), cert.display()))?;
    if verify_peer {
        let ca = file_in(dir, "ca-cert.pem")?;
        b.set_ca_file(&ca)
            .map_err(|e| format!("{}: {e}", ca.display()))?;
        b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    }
    // Resumption tickets would be written after the handshake, by whichever thread
    // touches the session next; NBD connections are long-lived and need none.
    b.set_num_tickets(0).map_err(|e| format!("TLS: {e}"))?;
    b.set_options(SslOptions::NO_TICKET);
    // Nor session-ID resumption (TLS 1.2): OpenSSL fails a resumed handshake on a
    // context that asks for client certificates and has no session ID context.
    b.set_session_cache_mode(openssl::ssl::SslSessionCacheMode::OFF);
    Ok(b.build())
}

impl ServerTls {
    /// X.509 from `dir` (`server-cert.pem`, `server-key.pem`, and `ca-cert.pem` when
    /// client certificates are checked). With `verify_peer`, a client must present a
    /// certificate the CA signed.
    pub fn x509(dir: &Path, verify_peer: bool) -> Result<ServerTls, String> {
        let ctx = x509_server_ctx(dir, verify_peer)?;
        let remote_ctx = if verify_peer || !dir.join("ca-cert.pem").is_file() {
            None
        } else {
            Some(x509_server_ctx(dir, true)?)
        };
        Ok(ServerTls {
            ctx,
            kind: TlsKind::X509,
            required: true,
            users: Vec::new(),
            verify_peer,
            remote_ctx,
            anonymous_clients: false,
        })
    }

    /// Pre-shared keys from a psktool file (`username:hexkey`, one user a line).
    pub fn psk(file: &Path) -> Result<ServerTls, String> {
        let keys = PskKeys::read(file)?;
        let mut users: Vec<String> = keys.keys.keys().cloned().collect();
        users.sort();
        let mut b = builder(SslMethod::tls_server(), TlsKind::Psk)?;
        b.set_num_tickets(0).map_err(|e| format!("TLS: {e}"))?;
        b.set_psk_server_callback(move |_ssl, identity, psk| {
            let Some(id) = identity.and_then(|i| std::str::from_utf8(i).ok()) else {
                return Ok(0);
            };
            match keys.keys.get(id) {
                Some(k) if k.len() <= psk.len() => {
                    psk[..k.len()].copy_from_slice(k);
                    Ok(k.len())
                }
                // An unknown user: no key, and the handshake fails.
                _ => {
                    tracing::info!("TLS: PSK user {id:?} is not in the PSK file");
                    Ok(0)
                }
            }
        });
        Ok(ServerTls {
            ctx: b.build(),
            kind: TlsKind::Psk,
            required: true,
            users,
            verify_peer: true,
            remote_ctx: None,
            anonymous_clients: false,
        })
    }

    /// X.509 without `verify_peer`: `true` serves clients off loopback without a
    /// certificate too (said out loud by the caller); `false` (the default) makes them
    /// present one `ca-cert.pem` signed.
    pub fn with_anonymous_clients(mut self, anonymous: bool) -> ServerTls {
        self.anonymous_clients = anonymous;
        self
    }

    /// Who must present a client certificate: `"every client"` (PSK clients prove their
    /// key instead: `None`), `"off loopback"`, or `"none"` (anonymous clients allowed).
    pub fn client_certificates(&self) -> Option<&'static str> {
        match self.kind {
            TlsKind::Psk => None,
            TlsKind::X509 if self.verify_peer => Some("every client"),
            TlsKind::X509 if self.anonymous_clients => Some("none"),
            TlsKind::X509 => Some("off loopback"),
        }
    }

    /// Why clients off loopback could not be served: X.509 without `verify_peer` or
    /// `anonymous_clients`, and no `ca-cert.pem` to check their certificates with.
    pub fn remote_clients_problem(&self) -> Option<&'static str> {
        (self.kind == TlsKind::X509
            && !self.verify_peer
            && !self.anonymous_clients
            && self.remote_ctx.is_none())
        .then_some(
            "clients off loopback must present a certificate, and the certificates \
             directory has no ca-cert.pem to check them with",
        )
    }

    /// The context a connection from `socket` is served with: one that demands a
    /// certificate when the client is off loopback and anonymous clients are not allowed.
    fn context_for(&self, socket: &Socket) -> Result<&SslContext, String> {
        if self.kind != TlsKind::X509
            || self.verify_peer
            || self.anonymous_clients
            || peer_is_local(socket.as_raw_fd())
        {
            return Ok(&self.ctx);
        }
        self.remote_ctx.as_ref().ok_or_else(|| {
            "TLS: a client off loopback without a certificate check (no ca-cert.pem); \
             refused"
                .to_string()
        })
    }

    /// `true` (the default): nothing but STARTTLS and ABORT before the TLS handshake.
    /// `false`: TLS is offered and plaintext clients are served too.
    pub fn with_required(mut self, required: bool) -> ServerTls {
        self.required = required;
        self
    }

    pub fn required(&self) -> bool {
        self.required
    }

    pub fn kind(&self) -> TlsKind {
        self.kind
    }
}

/// The client's TLS: credentials and whether the server's certificate is checked.
#[derive(Clone)]
pub struct ClientTls {
    ctx: SslContext,
    kind: TlsKind,
    verify_peer: bool,
    username: Option<String>,
    /// The server's name, checked against its certificate (X.509).
    host: Option<String>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("kind", &self.kind)
            .field("verify_peer", &self.verify_peer)
            .field("username", &self.username)
            .field("host", &self.host)
            .finish()
    }
}

impl ClientTls {
    /// X.509 from `dir`: `ca-cert.pem` checks the server (with `verify_peer`, the
    /// default), and `client-cert.pem` + `client-key.pem`, when present, identify this
    /// client to servers that ask.
    pub fn x509(dir: &Path, verify_peer: bool) -> Result<ClientTls, String> {
        let mut b = builder(SslMethod::tls_client(), TlsKind::X509)?;
        if verify_peer {
            let ca = file_in(dir, "ca-cert.pem")?;
            b.set_ca_file(&ca)
                .map_err(|e| format!("{}: {e}", ca.display()))?;
            b.set_verify(SslVerifyMode::PEER);
        } else {
            b.set_verify(SslVerifyMode::NONE);
        }
        let cert = dir.join("client-cert.pem");
        if cert.is_file() {
            let key = file_in(dir, "client-key.pem")?;
            b.set_certificate_chain_file(&cert)
                .map_err(|e| format!("{}: {e}", cert.display()))?;
            b.set_private_key_file(&key, SslFiletype::PEM)
                .map_err(|e| format!("{}: {e}", key.display()))?;
            b.check_private_key()
                .map_err(|e| format!("{} does not match {}: {e}", key.display(), cert.display()))?;
        }
        Ok(ClientTls {
            ctx: b.build(),
            kind: TlsKind::X509,
            verify_peer,
            username: None,
            host: None,
        })
    }

    /// The key of `username` in a psktool file.
    pub fn psk(file: &Path, username: &str) -> Result<ClientTls, String> {
        let mut keys = PskKeys::read(file)?;
        let key = keys.keys.remove(username).ok_or_else(|| {
            format!(
                "PSK file {} has no key for user {username:?} (tls-username=)",
                file.display()
            )
        })?;
        let mut b = builder(SslMethod::tls_client(), TlsKind::Psk)?;
        let identity = username.as_bytes().to_vec();
        b.set_psk_client_callback(move |_ssl, _hint, id, psk| {
            // The identity goes out NUL-terminated.
            if identity.len() + 1 > id.len() || key.len() > psk.len() {
                return Ok(0);
            }
            id[..identity.len()].copy_from_slice(&identity);
            id[identity.len()] = 0;
            psk[..key.len()].copy_from_slice(&key);
            Ok(key.len())
        });
        Ok(ClientTls {
            ctx: b.build(),
            kind: TlsKind::Psk,
            verify_peer: true,
            username: Some(username.to_string()),
            host: None,
        })
    }

    pub fn kind(&self) -> TlsKind {
        self.kind
    }

    /// The server's host name or address, which its certificate must name (X.509 with
    /// verification; a Unix socket has none and only the CA is checked).
    pub fn with_host(mut self, host: Option<String>) -> ClientTls {
        self.host = host;
        self
    }
}

/// The PSK user libnbd assumes when a URI names none: the login name.
pub fn default_username() -> Option<String> {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .or_else(|| {
            // SAFETY: getpwuid returns a pointer into static storage or NULL; read at once.
            unsafe {
                let pw = libc::getpwuid(libc::geteuid());
                if pw.is_null() || (*pw).pw_name.is_null() {
                    return None;
                }
                std::ffi::CStr::from_ptr((*pw).pw_name)
                    .to_str()
                    .ok()
                    .map(str::to_string)
            }
        })
}

// ---------------------------------------------------------------------------------------
// The shared stream

/// Raw reads and writes on the descriptor (non-blocking: EAGAIN becomes OpenSSL's
/// WANT_READ / WANT_WRITE).
struct FdIo {
    fd: RawFd,
}

impl Read for FdIo {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        // SAFETY: buf is valid for buf.len() bytes; the descriptor outlives the session
        // (TlsConn holds its socket).
        let n = unsafe { libc::recv(self.fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n.unsigned_abs())
    }
}

impl Write for FdIo {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        // SAFETY: as above; MSG_NOSIGNAL turns a closed peer into EPIPE, not a signal.
        let n = unsafe { libc::send(self.fd, buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(n.unsigned_abs())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One TLS session that a reader thread and writer threads share.
pub(crate) struct TlsConn {
    ssl: Mutex<SslStream<FdIo>>,
    fd: RawFd,
    /// Milliseconds; 0 waits for ever.
    read_timeout: AtomicU64,
    write_timeout: AtomicU64,
    _socket: Socket,
}

/// Whether the peer of `fd` is on this machine's loopback: a Unix socket, 127.0.0.0/8,
/// ::1 or ::ffff:127.0.0.0/104. An address that cannot be read counts as off loopback.
pub(crate) fn peer_is_local(fd: RawFd) -> bool {
    // SAFETY: an all-zero sockaddr_storage is a valid value of the type.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::sockaddr_storage>())
        .expect("sockaddr_storage fits socklen_t");
    // SAFETY: ss is a writable sockaddr_storage and len its size, as getpeername wants.
    let r = unsafe { libc::getpeername(fd, (&raw mut ss).cast(), &raw mut len) };
    if r != 0 {
        return false;
    }
    match i32::from(ss.ss_family) {
        libc::AF_UNIX => true,
        libc::AF_INET => {
            // SAFETY: the family says ss holds a sockaddr_in.
            let sin: &libc::sockaddr_in = unsafe { &*(&raw const ss).cast() };
            std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)).is_loopback()
        }
        libc::AF_INET6 => {
            // SAFETY: the family says ss holds a sockaddr_in6.
            let sin6: &libc::sockaddr_in6 = unsafe { &*(&raw const ss).cast() };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            ip.is_loopback() || ip.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback())
        }
        _ => false,
    }
}

fn millis(t: Option<Duration>) -> u64 {
    t.map_or(0, |t| {
        u64::try_from(t.as_millis()).unwrap_or(u64::MAX).max(1)
    })
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we hold open.
    unsafe {
        let fl = libc::fcntl(fd, libc::F_GETFL);
        if fl < 0 || libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Waits until `fd` is ready for `events`, at most until `deadline`.
fn wait(fd: RawFd, events: libc::c_short, deadline: Option<Instant>) -> io::Result<()> {
    loop {
        let ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(
                        io::ErrorKind::WouldBlock,
                        "timed out waiting for the peer",
                    ));
                }
                i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX)
            }
        };
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n > 0 {
            // Readiness, hang-up or error: the next TLS call finds out which.
            return Ok(());
        }
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

fn deadline(ms: u64) -> Option<Instant> {
    (ms != 0).then(|| Instant::now() + Duration::from_millis(ms))
}

/// How a failed TLS handshake reads in a message.
fn handshake_error(e: &openssl::ssl::Error) -> String {
    if let Some(io) = e.io_error() {
        return format!("TLS handshake: {io}");
    }
    match e.ssl_error() {
        Some(stack) => {
            let why: Vec<String> = stack
                .errors()
                .iter()
                .map(|x| x.reason().unwrap_or("unknown").to_string())
                .collect();
            format!("TLS handshake failed: {}", why.join("; "))
        }
        None => "TLS handshake failed: the peer closed the connection".into(),
    }
}

impl TlsConn {
    /// Runs the TLS handshake on `socket` (which this makes non-blocking) as server or
    /// client, within `timeout`.
    fn handshake(
        ssl: Ssl,
        socket: Socket,
        server: bool,
        timeout: Option<Duration>,
    ) -> Result<Arc<TlsConn>, String> {
        let fd = socket.as_raw_fd();
        set_nonblocking(fd).map_err(|e| format!("TLS: {e}"))?;
        let mut s = SslStream::new(ssl, FdIo { fd }).map_err(|e| format!("TLS: {e}"))?;
        let end = timeout.map(|t| Instant::now() + t);
        loop {
            let r = if server { s.accept() } else { s.connect() };
            match r {
                Ok(()) => break,
                Err(e) => {
                    let events = match e.code() {
                        ErrorCode::WANT_READ => libc::POLLIN,
                        ErrorCode::WANT_WRITE => libc::POLLOUT,
                        _ => return Err(handshake_error(&e)),
                    };
                    wait(fd, events, end).map_err(|e| format!("TLS handshake: {e}"))?;
                }
            }
        }
        let ms = millis(timeout);
        Ok(Arc::new(TlsConn {
            ssl: Mutex::new(s),
            fd,
            read_timeout: AtomicU64::new(ms),
            write_timeout: AtomicU64::new(ms),
            _socket: socket,
        }))
    }

    /// The server side of STARTTLS. `timeout` bounds the handshake and each later wait
    /// to send (a client that stops reading).
    pub(crate) fn accept(
        tls: &ServerTls,
        socket: Socket,
        timeout: Duration,
    ) -> Result<Arc<TlsConn>, String> {
        let ssl = Ssl::new(tls.context_for(&socket)?).map_err(|e| format!("TLS: {e}"))?;
        let c = TlsConn::handshake(ssl, socket, true, Some(timeout))?;
        // A server waits for requests as long as the client likes.
        c.read_timeout.store(0, Ordering::Relaxed);
        Ok(c)
    }

    /// The client side of STARTTLS; `host` is checked against the server's certificate
    /// (X.509 with verification on).
    pub(crate) fn connect(
        tls: &ClientTls,
        socket: Socket,
        timeout: Option<Duration>,
    ) -> Result<Arc<TlsConn>, String> {
        let mut ssl = Ssl::new(&tls.ctx).map_err(|e| format!("TLS: {e}"))?;
        let host = tls.host.as_deref();
        if tls.kind == TlsKind::X509 && tls.verify_peer {
            if let Some(h) = host {
                let p = ssl.param_mut();
                let r = match h.parse::<std::net::IpAddr>() {
                    Ok(ip) => p.set_ip(ip),
                    Err(_) => p.set_host(h),
                };
                r.map_err(|e| format!("TLS: host {h}: {e}"))?;
            }
            if let Some(h) = host.filter(|h| h.parse::<std::net::IpAddr>().is_err()) {
                ssl.set_hostname(h)
                    .map_err(|e| format!("TLS: SNI {h}: {e}"))?;
            }
        }
        TlsConn::handshake(ssl, socket, false, timeout).map_err(|e| match &tls.username {
            // OpenSSL names the alert ("illegal parameter", "decrypt error"), not the
            // cause; with PSK the cause is nearly always a key or user the server lacks.
            Some(user) if tls.kind == TlsKind::Psk && e.starts_with("TLS handshake failed") => {
                format!(
                    "{e} (the server did not accept the key of PSK user {user:?}: compare \
                     tls-psk-file= and tls-username= with the server's key file)"
                )
            }
            _ => e,
        })
    }

    pub(crate) fn set_timeouts(&self, t: Option<Duration>) {
        self.read_timeout.store(millis(t), Ordering::Relaxed);
        self.write_timeout.store(millis(t), Ordering::Relaxed);
    }

    /// The read timeout alone (a pipeline's reader thread; senders keep theirs).
    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) {
        self.read_timeout.store(millis(t), Ordering::Relaxed);
    }

    /// The protocol and suite agreed, for the log: `TLSv1.2 ECDHE-RSA-AES128-GCM-SHA256`.
    pub(crate) fn describe(&self) -> String {
        let s = self.lock();
        let ssl = s.ssl();
        format!(
            "{} {}",
            ssl.version_str(),
            ssl.current_cipher().map_or("(no suite)", |c| c.name())
        )
    }

    fn lock(&self) -> MutexGuard<'_, SslStream<FdIo>> {
        self.ssl.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let end = deadline(self.read_timeout.load(Ordering::Relaxed));
        loop {
            let r = self.lock().ssl_read(buf);
            match r {
                Ok(n) => return Ok(n),
                Err(e) => match e.code() {
                    ErrorCode::ZERO_RETURN => return Ok(0),
                    ErrorCode::WANT_READ => wait(self.fd, libc::POLLIN, end)?,
                    ErrorCode::WANT_WRITE => wait(self.fd, libc::POLLOUT, end)?,
                    _ => return Err(stream_error(e)),
                },
            }
        }
    }

    fn write(&self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        let end = deadline(self.write_timeout.load(Ordering::Relaxed));
        loop {
            let r = self.lock().ssl_write(buf);
            match r {
                Ok(n) => return Ok(n),
                Err(e) => match e.code() {
                    ErrorCode::WANT_WRITE => wait(self.fd, libc::POLLOUT, end)?,
                    // Not in TLS 1.3 after the handshake; do not sleep on a socket the
                    // reader drains.
                    ErrorCode::WANT_READ => std::thread::sleep(Duration::from_millis(1)),
                    _ => return Err(stream_error(e)),
                },
            }
        }
    }
}

impl TlsConn {
    /// Sends TLS's close_notify (once; peers such as qemu and nbdkit call a close
    /// without it an improper end). Best effort: the socket may already be gone.
    pub(crate) fn close(&self) {
        let mut s = self.lock();
        if !s.get_shutdown().contains(openssl::ssl::ShutdownState::SENT) {
            let _ = s.shutdown();
        }
    }
}

impl Drop for TlsConn {
    fn drop(&mut self) {
        self.close();
    }
}

fn stream_error(e: openssl::ssl::Error) -> io::Error {
    if e.code() == ErrorCode::SYSCALL && e.io_error().is_none() {
        return io::ErrorKind::UnexpectedEof.into();
    }
    match e.into_io_error() {
        Ok(io) => io,
        Err(e) => io::Error::other(format!("TLS: {e}")),
    }
}

/// The reading half of a TLS connection.
pub(crate) struct TlsReader(pub(crate) Arc<TlsConn>);

impl Read for TlsReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

/// A writing half of a TLS connection (several may exist; writes are whole calls).
pub(crate) struct TlsWriter(pub(crate) Arc<TlsConn>);

impl Write for TlsWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }
    /// Small slices (a reply header and a short payload) go out in one record.
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let mut parts = bufs.iter().filter(|b| !b.is_empty());
        let Some(first) = parts.next() else {
            return Ok(0);
        };
        if first.len() >= RECORD || parts.next().is_none() {
            return self.0.write(first);
        }
        let mut gather = Vec::with_capacity(RECORD);
        for b in bufs {
            let take = b.len().min(RECORD - gather.len());
            gather.extend_from_slice(&b[..take]);
            if gather.len() == RECORD {
                break;
            }
        }
        self.0.write(&gather)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_file_parses_several_users_and_refuses_garbage() {
        let dir = std::env::temp_dir().join(format!("cairn-psk-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("keys.psk");
        std::fs::write(&f, "alice:00ff10\n\nbob:ABCDEF01\n").unwrap();
        let k = PskKeys::read(&f).unwrap();
        assert_eq!(k.keys["alice"].as_slice(), &[0x00, 0xff, 0x10]);
        assert_eq!(k.keys["bob"].as_slice(), &[0xab, 0xcd, 0xef, 0x01]);
        let s = ServerTls::psk(&f).unwrap();
        let dbg = format!("{s:?}");
        assert!(dbg.contains("alice") && !dbg.contains("00ff10"), "{dbg}");
        assert!(ClientTls::psk(&f, "carol").unwrap_err().contains("carol"));
        for bad in ["alice", "alice:0g", "alice:abc", ":00", ""] {
            std::fs::write(&f, bad).unwrap();
            let e = PskKeys::read(&f).err().expect(bad);
            assert!(!e.contains("0g") || bad != "alice:0g", "{e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_certificate_is_named() {
        let e = ServerTls::x509(Path::new("/nonexistent-cairn"), false).unwrap_err();
        assert!(e.contains("server-cert.pem"), "{e}");
        let e = ClientTls::x509(Path::new("/nonexistent-cairn"), true).unwrap_err();
        assert!(e.contains("ca-cert.pem"), "{e}");
    }
}
