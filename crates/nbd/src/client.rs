//! A small synchronous NBD client: fixed newstyle handshake, `NBD_OPT_GO` with block-size
//! information, optional structured replies and `base:allocation`.
//!
//! ```text
//!   Client (BlockDevice)                 -- a remote export as a cairn member device,
//!                                           over one or more (multi-conn) pipelines
//!     Pipeline (shared by threads)       -- callers send, one reader thread matches
//!                                           replies to callers by cookie
//!     Connection (transmission phase)    -- typed ops, pipelining by cookie, raw requests
//!       Handshake (option haggling)      -- LIST / INFO / GO / STRUCTURED_REPLY / META
//!         socket: Unix or TCP, or any Read + Write pair (fuzzing, tests)
//! ```
//!
//! The layers are public so that tests can send what a well-behaved client never would:
//! [`Connection::send_raw`] puts any 28-byte request on the wire (any magic, type, flags,
//! offset, length, with or without payload) and [`Connection::recv`] reads back one reply.
//!
//! Nothing the server says is trusted: every length read from the wire is checked against
//! what was asked before anything is allocated, and a reply that breaks the protocol
//! marks the connection broken (later calls fail instead of misreading the stream).

use std::collections::HashMap;
use std::fmt;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread;
use std::time::{Duration, Instant};

use cairn_block::{
    BlockDevice, Capabilities, ErrorKind, Extent, Geometry, ReadDone, Support, WriteDone,
    WriteFlags,
};

use crate::fence::{
    FenceAnswer, FenceToken, FENCE_FLAG_QUERY, FENCE_FLAG_WHOLE, OPT_CAIRN_FENCE, REP_CAIRN_OWNER,
};
use crate::proto::*;
use crate::server::Listen;
use crate::tls::{ClientTls, TlsConn, TlsReader, TlsWriter};

/// Largest option reply payload read into memory. Replies to cairn's options are a few
/// kilobytes at most (an export name and description of up to 4096 bytes each).
const MAX_OPTION_REPLY: u32 = 64 << 10;
/// Largest READ payload accepted from a server in one reply, whatever was asked.
const MAX_READ_REPLY: u32 = 64 << 20;
/// Largest error chunk: errno, message length, message (at most `MAX_STRING`), offset.
const MAX_ERROR_CHUNK: u32 = 6 + 4096 + 8;
const _: () = assert!(MAX_STRING == 4096);
/// Largest BLOCK_STATUS chunk accepted (context id + 1 Mi descriptors).
const MAX_BLOCK_STATUS_CHUNK: u64 = 4 + 8 * (1 << 20);

/// Why a client call failed.
#[derive(Debug)]
pub enum Error {
    /// The socket failed (including a read timeout).
    Io(io::Error),
    /// The server closed the connection at a message boundary.
    Closed,
    /// The server answered an option with an error reply (`REP_ERR_*`).
    Option {
        option: u32,
        reply: u32,
        message: String,
    },
    /// The server answered a request with an NBD error value.
    Request {
        command: u16,
        errno: u32,
        message: String,
    },
    /// The server broke the protocol; the connection is unusable.
    Protocol(String),
    /// The client refused the call before sending anything (e.g. a length that does not
    /// fit a request, or a feature the server did not advertise).
    Usage(String),
    /// TLS was asked for and could not be had: the server does not offer it, or the
    /// handshake failed (wrong key, an unknown CA, a name that does not match).
    Tls(String),
}

impl Error {
    /// The NBD error value of a failed request.
    pub fn errno(&self) -> Option<u32> {
        match self {
            Error::Request { errno, .. } => Some(*errno),
            _ => None,
        }
    }
    /// A member server refused the declared owner token: a newer owner holds the export.
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Option { option, reply, .. }
            if *option == crate::fence::OPT_CAIRN_FENCE && *reply == REP_ERR_POLICY)
            || matches!(self, Error::Request { errno, message, .. }
            if *errno == EPERM && message.starts_with("fenced"))
    }

    /// The server could not be reached or went away (a refused or reset connection, a
    /// timeout): it may answer later. Anything else means it answered and said no (a
    /// failed TLS handshake, no such export, a protocol error): trying again changes
    /// nothing until someone fixes the URI or the server.
    pub fn is_unreachable(&self) -> bool {
        matches!(self, Error::Io(_) | Error::Closed)
    }

    /// The reply type of a refused option.
    pub fn option_reply(&self) -> Option<u32> {
        match self {
            Error::Option { reply, .. } => Some(*reply),
            _ => None,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io(e) => write!(f, "NBD connection: {e}"),
            Error::Closed => f.write_str("NBD server closed the connection"),
            Error::Option {
                option,
                reply,
                message,
            } => {
                write!(
                    f,
                    "NBD option {option} refused ({}): {message}",
                    reply_name(*reply)
                )
            }
            Error::Request {
                command,
                errno,
                message,
            } => {
                write!(
                    f,
                    "NBD {} failed with {}",
                    command_name(*command),
                    errno_name(*errno)
                )?;
                if !message.is_empty() {
                    write!(f, ": {message}")?;
                }
                Ok(())
            }
            Error::Protocol(m) => write!(f, "NBD server broke the protocol: {m}"),
            Error::Usage(m) => write!(f, "NBD client: {m}"),
            Error::Tls(m) => write!(f, "NBD over TLS: {m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for Error {
    fn from(e: io::Error) -> Error {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            return Error::Protocol("connection closed in the middle of a message".into());
        }
        Error::Io(e)
    }
}

/// The block layer's view of a client error: NBD error values map back to the kinds the
/// server maps them from; anything else about the connection is an I/O error.
impl From<Error> for cairn_block::Error {
    fn from(e: Error) -> cairn_block::Error {
        let kind = match &e {
            // A member server refused this connection's owner generation: a newer owner
            // took the export over. Not a read-only device: the owner above must stop.
            Error::Request { .. } if e.is_fenced() => ErrorKind::Fenced,
            Error::Request { errno, .. } => kind_of_errno(*errno),
            Error::Usage(_) => ErrorKind::InvalidArgument,
            // The connection is lost (reset, closed, timed out, or the server broke the
            // protocol): the export is unreachable until someone reconnects.
            Error::Io(_) | Error::Closed | Error::Protocol(_) | Error::Tls(_) => ErrorKind::Gone,
            Error::Option { .. } => ErrorKind::Io,
        };
        cairn_block::Error::new(kind, "remote NBD export").with_source(e)
    }
}

/// NBD error value to block-layer kind. A client treats unknown values as EINVAL.
pub fn kind_of_errno(errno: u32) -> ErrorKind {
    match errno {
        EPERM => ErrorKind::ReadOnly,
        EIO | ENOMEM => ErrorKind::Io,
        ENOSPC => ErrorKind::NoSpace,
        ENOTSUP => ErrorKind::Unsupported,
        ESHUTDOWN => ErrorKind::Shutdown,
        _ => ErrorKind::InvalidArgument,
    }
}

/// The name of an NBD error value, for messages.
pub fn errno_name(errno: u32) -> String {
    match errno {
        0 => "success".into(),
        EPERM => "EPERM".into(),
        EIO => "EIO".into(),
        ENOMEM => "ENOMEM".into(),
        EINVAL => "EINVAL".into(),
        ENOSPC => "ENOSPC".into(),
        EOVERFLOW => "EOVERFLOW".into(),
        ENOTSUP => "ENOTSUP".into(),
        ESHUTDOWN => "ESHUTDOWN".into(),
        n => format!("error {n}"),
    }
}

fn reply_name(reply: u32) -> String {
    match reply {
        REP_ACK => "ACK".into(),
        REP_SERVER => "SERVER".into(),
        REP_INFO => "INFO".into(),
        REP_META_CONTEXT => "META_CONTEXT".into(),
        REP_ERR_UNSUP => "ERR_UNSUP".into(),
        REP_ERR_POLICY => "ERR_POLICY".into(),
        REP_ERR_INVALID => "ERR_INVALID".into(),
        REP_ERR_PLATFORM => "ERR_PLATFORM".into(),
        REP_ERR_TLS_REQD => "ERR_TLS_REQD".into(),
        REP_ERR_UNKNOWN => "ERR_UNKNOWN".into(),
        REP_ERR_SHUTDOWN => "ERR_SHUTDOWN".into(),
        REP_ERR_BLOCK_SIZE_REQD => "ERR_BLOCK_SIZE_REQD".into(),
        REP_ERR_TOO_BIG => "ERR_TOO_BIG".into(),
        n => format!("reply {n:#x}"),
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------------------
// Sockets

/// A connected socket, kept to shut it down and set timeouts; reads and writes go through
/// clones of it.
#[derive(Debug)]
enum Socket {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Socket {
    /// `timeout` bounds the TCP connect too: a host that is gone does not answer at all,
    /// and the kernel's own SYN retries take minutes.
    fn connect(addr: &Listen, timeout: Option<Duration>) -> io::Result<Socket> {
        match addr {
            Listen::Unix(p) => UnixStream::connect(p).map(Socket::Unix),
            Listen::Tcp(a) => {
                let s = match timeout {
                    Some(t) => TcpStream::connect_timeout(a, t)?,
                    None => TcpStream::connect(a)?,
                };
                s.set_nodelay(true)?;
                Ok(Socket::Tcp(s))
            }
        }
    }
    fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Unix(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
            Socket::Tcp(s) => {
                s.set_read_timeout(t)?;
                s.set_write_timeout(t)
            }
        }
    }
    fn halves(&self) -> io::Result<(Box<dyn Read + Send>, Box<dyn Write + Send>)> {
        Ok(match self {
            Socket::Unix(s) => (Box::new(s.try_clone()?), Box::new(s.try_clone()?)),
            Socket::Tcp(s) => (Box::new(s.try_clone()?), Box::new(s.try_clone()?)),
        })
    }
    fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
        })
    }
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Socket::Unix(s) => s.set_read_timeout(t),
            Socket::Tcp(s) => s.set_read_timeout(t),
        }
    }
    fn shutdown(&self, how: std::net::Shutdown) {
        let _ = match self {
            Socket::Unix(s) => s.shutdown(how),
            Socket::Tcp(s) => s.shutdown(how),
        };
    }
}

/// The byte stream under a handshake or connection.
struct Wire {
    reader: BufReader<Box<dyn Read + Send>>,
    writer: BufWriter<Box<dyn Write + Send>>,
    socket: Option<Socket>,
    /// The TLS session after STARTTLS (its timeouts replace the socket's).
    tls: Option<Arc<TlsConn>>,
    /// The read timeout to restore once the next message starts arriving, while a
    /// pipeline's reader waits with a shorter one ([`Wire::shorten_read_timeout`]).
    restore_read_timeout: Option<Duration>,
}

impl fmt::Debug for Wire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Wire")
            .field("socket", &self.socket)
            .field("tls", &self.tls.is_some())
            .finish()
    }
}

impl Wire {
    fn read_exact(&mut self, buf: &mut [u8]) -> Result<()> {
        self.reader.read_exact(buf).map_err(Error::from)
    }
    /// Reads a message header; a clean EOF before its first byte is [`Error::Closed`], a
    /// read timeout before it is `Error::Io` (nothing consumed: the stream is intact).
    fn read_header(&mut self, buf: &mut [u8]) -> Result<()> {
        let mut done = 0;
        while done < buf.len() {
            match self.reader.read(&mut buf[done..]) {
                Ok(0) if done == 0 => return Err(Error::Closed),
                Ok(0) => {
                    return Err(Error::Protocol(
                        "connection closed in the middle of a header".into(),
                    ))
                }
                Ok(n) => {
                    done += n;
                    // The rest of the message gets the whole timeout.
                    if let Some(t) = self.restore_read_timeout.take() {
                        self.set_read_timeout(t);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset && done == 0 => {
                    return Err(Error::Closed)
                }
                Err(e) if done > 0 => return Err(mid_message(Error::Io(e))),
                Err(e) => return Err(Error::Io(e)),
            }
        }
        Ok(())
    }
    fn set_read_timeout(&self, t: Duration) {
        if let Some(c) = &self.tls {
            c.set_read_timeout(Some(t));
        } else if let Some(s) = &self.socket {
            let _ = s.set_read_timeout(Some(t.max(Duration::from_millis(1))));
        }
    }
    /// The next wait for a message's first byte ends after `t` instead of `normal`; the
    /// message's first bytes bring `normal` back.
    fn shorten_read_timeout(&mut self, t: Duration, normal: Duration) {
        self.restore_read_timeout = Some(normal);
        self.set_read_timeout(t);
    }
    fn read_vec(&mut self, len: u32) -> Result<Vec<u8>> {
        let mut v = vec![0u8; usize::try_from(len).map_err(|_| Error::Protocol("length".into()))?];
        self.read_exact(&mut v)?;
        Ok(v)
    }
    fn send(&mut self, parts: &[&[u8]]) -> Result<()> {
        for p in parts {
            self.writer.write_all(p)?;
        }
        self.writer.flush()?;
        Ok(())
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A read timeout after part of a message was read: unlike one before a message, the
/// stream cannot be resumed.
fn mid_message(e: Error) -> Error {
    match e {
        Error::Io(io) if is_timeout(&io) => {
            Error::Protocol(format!("the server stopped in the middle of a reply: {io}"))
        }
        e => e,
    }
}

fn len_u32(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| Error::Usage(format!("{what}: {n} bytes do not fit a u32")))
}

// ---------------------------------------------------------------------------------------
// Handshake

/// How to connect: where, which export, and which optional features to ask for.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    pub addr: Listen,
    pub export: String,
    /// Ask for structured replies (`NBD_OPT_STRUCTURED_REPLY`).
    pub structured: bool,
    /// Ask for the `base:allocation` context (needs `structured`).
    pub meta_base_allocation: bool,
    /// Socket read/write timeout; `None` waits forever.
    pub timeout: Option<Duration>,
    /// Connections [`Client::connect`] opens when the server offers multi-conn (else
    /// one). Each keeps many requests in flight; more spread them over the server's
    /// connection threads.
    pub connections: usize,
    /// The array owner this client writes for: declared on every connection before
    /// `NBD_OPT_GO` (crate::fence). A cairn member server that holds a newer owner refuses
    /// the connection; one that does not enforce is reported by [`Client::fence`].
    pub fence: Option<crate::fence::FenceToken>,
    /// The owner of [`ClientOptions::fence`] uses the whole export (not an md member's
    /// data area): declared with [`crate::fence::FENCE_FLAG_WHOLE`], so the server keeps
    /// the record beside the export.
    pub fence_whole: bool,
    /// TLS: STARTTLS before anything else, and a server that does not offer it is an
    /// error (never plaintext).
    pub tls: Option<ClientTls>,
}

impl ClientOptions {
    /// Structured replies and `base:allocation` on, a 30 s timeout.
    pub fn new(addr: Listen, export: impl Into<String>) -> ClientOptions {
        ClientOptions {
            addr,
            export: export.into(),
            structured: true,
            meta_base_allocation: true,
            timeout: Some(Duration::from_secs(30)),
            connections: 4,
            fence: None,
            fence_whole: false,
            tls: None,
        }
    }

    /// Options for the export a URI names. `nbds://` asks for TLS with the URI's PSK
    /// file (user `tls-username=`, else the login name) or certificates directory (else
    /// libnbd's default places, `$HOME/.pki/libnbd` then `/etc/pki/libnbd`); the server's
    /// certificate is checked against the CA and the host name unless
    /// `tls-verify-peer=false`.
    pub fn from_uri(uri: &crate::uri::NbdUri) -> Result<ClientOptions> {
        let addr = uri.listen().map_err(Error::Usage)?;
        let mut o = ClientOptions::new(addr, uri.export.clone());
        if uri.tls {
            let tls = if let Some(f) = &uri.tls_psk_file {
                let user = match &uri.tls_username {
                    Some(u) => u.clone(),
                    None => crate::tls::default_username().ok_or_else(|| {
                        Error::Usage(format!("{uri}: name the PSK user with tls-username="))
                    })?,
                };
                ClientTls::psk(f, &user)
            } else {
                let dir = match &uri.tls_certificates {
                    Some(d) => d.clone(),
                    None => default_certificates().ok_or_else(|| {
                        Error::Usage(format!(
                            "{uri}: nbds:// needs tls-certificates=DIR or tls-psk-file=FILE"
                        ))
                    })?,
                };
                ClientTls::x509(&dir, uri.tls_verify_peer)
            }
            .map_err(|e| Error::Usage(format!("{uri}: {e}")))?;
            let host = match &uri.endpoint {
                crate::uri::Endpoint::Tcp { host, .. } => Some(host.clone()),
                crate::uri::Endpoint::Unix(_) => None,
            };
            o.tls = Some(tls.with_host(host));
        }
        Ok(o)
    }
}

/// What the server said about an export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportInfo {
    /// The name asked for (the server may also report its own name in `reported_name`).
    pub name: String,
    pub reported_name: Option<String>,
    pub description: Option<String>,
    pub size: u64,
    /// Transmission flags (`FLAG_*`).
    pub flags: u16,
    /// Whether the server sent `NBD_INFO_BLOCK_SIZE`; if not the sizes below are the
    /// protocol's defaults.
    pub block_size_sent: bool,
    pub min_block: u32,
    pub preferred_block: u32,
    pub max_block: u32,
}

impl ExportInfo {
    pub fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
}

/// One option reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionReply {
    pub option: u32,
    pub reply: u32,
    pub data: Vec<u8>,
}

impl OptionReply {
    pub fn is_error(&self) -> bool {
        self.reply & (1 << 31) != 0
    }
    /// ACK and errors end an option's replies.
    pub fn is_final(&self) -> bool {
        self.reply == REP_ACK || self.is_error()
    }
    fn into_error(self) -> Error {
        Error::Option {
            option: self.option,
            reply: self.reply,
            message: String::from_utf8_lossy(&self.data).into_owned(),
        }
    }
}

/// The option-haggling phase of a connection.
#[derive(Debug)]
pub struct Handshake {
    wire: Wire,
    /// Handshake flags the server sent.
    pub server_flags: u16,
    structured: bool,
    /// Context id of `base:allocation` after a successful SET_META_CONTEXT.
    meta_base_allocation: Option<u32>,
    timeout: Option<Duration>,
}

/// libnbd's default certificates directories, the first that exists.
fn default_certificates() -> Option<std::path::PathBuf> {
    let home = std::env::var_os("HOME").map(|h| std::path::Path::new(&h).join(".pki/libnbd"));
    home.into_iter()
        .chain(std::iter::once(std::path::PathBuf::from("/etc/pki/libnbd")))
        .find(|d| d.is_dir())
}

impl Handshake {
    /// `NBD_OPT_STARTTLS` and the TLS handshake; from then on every byte is encrypted.
    /// A server that refuses TLS, or a failed handshake, is [`Error::Tls`]: nothing falls
    /// back to plaintext.
    pub fn starttls(&mut self, tls: &ClientTls) -> Result<()> {
        if self.wire.tls.is_some() {
            return Err(Error::Usage("TLS is already on".into()));
        }
        let Some(socket) = &self.wire.socket else {
            return Err(Error::Usage("TLS needs a socket".into()));
        };
        let owner: crate::tls::Socket = match socket {
            Socket::Unix(s) => Arc::new(s.try_clone()?),
            Socket::Tcp(s) => Arc::new(s.try_clone()?),
        };
        self.send_option(OPT_STARTTLS, &[])?;
        let r = self.read_option_reply(OPT_STARTTLS)?;
        if r.is_error() {
            let why = if r.reply == REP_ERR_UNSUP || r.reply == REP_ERR_POLICY {
                "the server does not offer TLS".to_string()
            } else {
                format!("STARTTLS refused ({})", reply_name(r.reply))
            };
            let msg = String::from_utf8_lossy(&r.data);
            return Err(Error::Tls(if msg.is_empty() {
                why
            } else {
                format!("{why}: {msg}")
            }));
        }
        if r.reply != REP_ACK {
            return Err(Error::Protocol(format!(
                "STARTTLS answered with {}",
                reply_name(r.reply)
            )));
        }
        if !self.wire.reader.buffer().is_empty() {
            return Err(Error::Protocol("plaintext after the STARTTLS reply".into()));
        }
        let conn = TlsConn::connect(tls, owner, self.timeout).map_err(Error::Tls)?;
        self.wire.reader = BufReader::with_capacity(
            64 << 10,
            Box::new(TlsReader(conn.clone())) as Box<dyn Read + Send>,
        );
        self.wire.writer = BufWriter::with_capacity(
            64 << 10,
            Box::new(TlsWriter(conn.clone())) as Box<dyn Write + Send>,
        );
        self.wire.tls = Some(conn);
        // What was negotiated in plaintext does not carry over.
        self.structured = false;
        self.meta_base_allocation = None;
        Ok(())
    }

    /// Connects, reads the greeting and answers with fixed newstyle and no zeroes.
    pub fn connect(addr: &Listen, timeout: Option<Duration>) -> Result<Handshake> {
        let socket = Socket::connect(addr, timeout)?;
        socket.set_timeout(timeout)?;
        let (r, w) = socket.halves()?;
        Handshake::start(r, w, Some(socket), timeout)
    }

    /// Runs the handshake over any byte stream (a test pipe, a fuzzer's bytes).
    pub fn over(reader: Box<dyn Read + Send>, writer: Box<dyn Write + Send>) -> Result<Handshake> {
        Handshake::start(reader, writer, None, None)
    }

    fn start(
        reader: Box<dyn Read + Send>,
        writer: Box<dyn Write + Send>,
        socket: Option<Socket>,
        timeout: Option<Duration>,
    ) -> Result<Handshake> {
        let mut wire = Wire {
            reader: BufReader::with_capacity(64 << 10, reader),
            writer: BufWriter::with_capacity(64 << 10, writer),
            socket,
            tls: None,
            restore_read_timeout: None,
        };
        let mut hello = [0u8; 18];
        wire.read_header(&mut hello)?;
        if be64(&hello, 0) != NBDMAGIC {
            return Err(Error::Protocol(format!(
                "greeting magic {:#x}",
                be64(&hello, 0)
            )));
        }
        let newstyle = be64(&hello, 8);
        if newstyle != IHAVEOPT {
            return Err(Error::Protocol(format!(
                "not a newstyle server (magic {newstyle:#x}); oldstyle is not supported"
            )));
        }
        let server_flags = be16(&hello, 16);
        if server_flags & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(Error::Protocol("server is not fixed newstyle".into()));
        }
        let mut cf = FLAG_C_FIXED_NEWSTYLE;
        if server_flags & FLAG_NO_ZEROES != 0 {
            cf |= FLAG_C_NO_ZEROES;
        }
        wire.send(&[&cf.to_be_bytes()])?;
        Ok(Handshake {
            wire,
            server_flags,
            structured: false,
            meta_base_allocation: None,
            timeout,
        })
    }

    /// Whether structured replies were negotiated so far.
    pub fn structured(&self) -> bool {
        self.structured
    }

    /// Sends one option with its data, unchecked (any option number, any data).
    pub fn send_option(&mut self, option: u32, data: &[u8]) -> Result<()> {
        let len = len_u32(data.len(), "option data")?;
        let mut h = [0u8; 16];
        h[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        h[8..12].copy_from_slice(&option.to_be_bytes());
        h[12..16].copy_from_slice(&len.to_be_bytes());
        self.wire.send(&[&h, data])
    }

    /// Sends bytes as they are (a bad magic, a truncated option).
    pub fn send_raw(&mut self, bytes: &[u8]) -> Result<()> {
        self.wire.send(&[bytes])
    }

    /// Reads exactly `buf.len()` bytes (for replies this client does not parse, such as
    /// the answer to `NBD_OPT_EXPORT_NAME`).
    pub fn read_raw(&mut self, buf: &mut [u8]) -> Result<()> {
        self.wire.read_header(buf)
    }

    /// Reads one option reply to `option`.
    pub fn read_option_reply(&mut self, option: u32) -> Result<OptionReply> {
        let mut h = [0u8; 20];
        self.wire.read_header(&mut h)?;
        if be64(&h, 0) != REPLY_MAGIC {
            return Err(Error::Protocol(format!(
                "option reply magic {:#x}",
                be64(&h, 0)
            )));
        }
        let got = be32(&h, 8);
        if got != option {
            return Err(Error::Protocol(format!(
                "reply to option {got}, expected {option}"
            )));
        }
        let reply = be32(&h, 12);
        let len = be32(&h, 16);
        if len > MAX_OPTION_REPLY {
            return Err(Error::Protocol(format!("{len}-byte option reply")));
        }
        let data = self.wire.read_vec(len)?;
        Ok(OptionReply {
            option,
            reply,
            data,
        })
    }

    /// Sends an option and reads replies up to and including the final one (ACK or an
    /// error). Replies are returned as they came; errors are not turned into `Err`.
    pub fn option(&mut self, option: u32, data: &[u8]) -> Result<Vec<OptionReply>> {
        self.send_option(option, data)?;
        let mut out = Vec::new();
        loop {
            let r = self.read_option_reply(option)?;
            let last = r.is_final();
            out.push(r);
            if last {
                return Ok(out);
            }
            if out.len() > 100_000 {
                return Err(Error::Protocol("endless option replies".into()));
            }
        }
    }

    /// Like [`Handshake::option`], but an error reply becomes `Err`.
    fn option_ok(&mut self, option: u32, data: &[u8]) -> Result<Vec<OptionReply>> {
        let mut replies = self.option(option, data)?;
        if replies.last().is_some_and(OptionReply::is_error) {
            return Err(replies.pop().expect("non-empty").into_error());
        }
        Ok(replies)
    }

    /// `NBD_OPT_LIST`: (name, description) of every export.
    pub fn list(&mut self) -> Result<Vec<(String, String)>> {
        let mut out = Vec::new();
        for r in self.option_ok(OPT_LIST, &[])? {
            match r.reply {
                REP_SERVER => {
                    if r.data.len() < 4 {
                        return Err(Error::Protocol("short REP_SERVER".into()));
                    }
                    let n = usize::try_from(be32(&r.data, 0)).unwrap_or(usize::MAX);
                    if n > r.data.len() - 4 {
                        return Err(Error::Protocol(
                            "REP_SERVER name longer than the reply".into(),
                        ));
                    }
                    let name = String::from_utf8_lossy(&r.data[4..4 + n]).into_owned();
                    let desc = String::from_utf8_lossy(&r.data[4 + n..]).into_owned();
                    out.push((name, desc));
                }
                REP_ACK => {}
                other => return Err(Error::Protocol(format!("unexpected reply {other} to LIST"))),
            }
        }
        Ok(out)
    }

    fn info_or_go(&mut self, option: u32, name: &str) -> Result<ExportInfo> {
        let data = encode_info_request(name, &[INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION]);
        let mut info = ExportInfo {
            name: name.to_string(),
            reported_name: None,
            description: None,
            size: 0,
            flags: 0,
            block_size_sent: false,
            min_block: 1,
            preferred_block: 4096,
            max_block: MAX_SAFE_PAYLOAD,
        };
        let mut got_export = false;
        for r in self.option_ok(option, &data)? {
            match r.reply {
                REP_INFO => {
                    let d = &r.data;
                    if d.len() < 2 {
                        return Err(Error::Protocol("short REP_INFO".into()));
                    }
                    match be16(d, 0) {
                        INFO_EXPORT if d.len() == 12 => {
                            info.size = be64(d, 2);
                            info.flags = be16(d, 10);
                            got_export = true;
                        }
                        INFO_BLOCK_SIZE if d.len() == 14 => {
                            info.min_block = be32(d, 2);
                            info.preferred_block = be32(d, 6);
                            info.max_block = be32(d, 10);
                            info.block_size_sent = true;
                        }
                        INFO_NAME => {
                            info.reported_name = Some(String::from_utf8_lossy(&d[2..]).into_owned())
                        }
                        INFO_DESCRIPTION => {
                            info.description = Some(String::from_utf8_lossy(&d[2..]).into_owned())
                        }
                        INFO_EXPORT | INFO_BLOCK_SIZE => {
                            return Err(Error::Protocol(format!(
                                "REP_INFO type {} with {} bytes",
                                be16(d, 0),
                                d.len()
                            )))
                        }
                        _ => {} // unknown info types are ignored, as proto.md asks
                    }
                }
                REP_ACK => {}
                other => {
                    return Err(Error::Protocol(format!(
                        "unexpected reply {other:#x} to INFO/GO"
                    )))
                }
            }
        }
        if !got_export {
            return Err(Error::Protocol("no NBD_INFO_EXPORT before the ACK".into()));
        }
        let (min, pref, max) = (info.min_block, info.preferred_block, info.max_block);
        if info.block_size_sent
            && (!min.is_power_of_two()
                || min > 64 << 10
                || !pref.is_power_of_two()
                || pref < min
                || (max != u32::MAX && (max < min || max % min != 0)))
        {
            return Err(Error::Protocol(format!(
                "bad block sizes {min}/{pref}/{max}"
            )));
        }
        Ok(info)
    }

    /// `NBD_OPT_INFO`: what GO would give, without entering transmission.
    pub fn info(&mut self, name: &str) -> Result<ExportInfo> {
        self.info_or_go(OPT_INFO, name)
    }

    /// `NBD_OPT_STRUCTURED_REPLY`.
    pub fn structured_replies(&mut self) -> Result<()> {
        self.option_ok(OPT_STRUCTURED_REPLY, &[])?;
        self.structured = true;
        Ok(())
    }

    /// `NBD_OPT_LIST_META_CONTEXT` or `_SET_`: the (id, name) contexts the server returned.
    pub fn meta_context(
        &mut self,
        set: bool,
        export: &str,
        queries: &[&str],
    ) -> Result<Vec<(u32, String)>> {
        let option = if set {
            OPT_SET_META_CONTEXT
        } else {
            OPT_LIST_META_CONTEXT
        };
        let data = encode_meta_context_request(export, queries);
        let mut out = Vec::new();
        for r in self.option_ok(option, &data)? {
            match r.reply {
                REP_META_CONTEXT => {
                    if r.data.len() < 4 {
                        return Err(Error::Protocol("short REP_META_CONTEXT".into()));
                    }
                    out.push((
                        be32(&r.data, 0),
                        String::from_utf8_lossy(&r.data[4..]).into_owned(),
                    ));
                }
                REP_ACK => {}
                other => {
                    return Err(Error::Protocol(format!(
                        "unexpected reply {other:#x} to META"
                    )))
                }
            }
        }
        if set {
            self.meta_base_allocation = out
                .iter()
                .find(|(_, n)| n == BASE_ALLOCATION)
                .map(|(id, _)| *id);
        }
        Ok(out)
    }

    /// `NBD_OPT_ABORT`: the server should ACK and close. Returns the reply, if any came.
    pub fn abort(&mut self) -> Result<Option<OptionReply>> {
        self.send_option(OPT_ABORT, &[])?;
        match self.read_option_reply(OPT_ABORT) {
            Ok(r) => Ok(Some(r)),
            Err(Error::Closed) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reads once more after the server should have closed: `Ok(())` on a clean close.
    pub fn expect_closed(&mut self) -> Result<()> {
        let mut b = [0u8; 1];
        match self.wire.read_header(&mut b) {
            Err(Error::Closed) => Ok(()),
            Err(e) => Err(e),
            Ok(()) => Err(Error::Protocol(format!("byte {:#04x} after the end", b[0]))),
        }
    }

    /// `NBD_OPT_GO`: enters transmission on `name`.
    pub fn go(mut self, name: &str) -> Result<Connection> {
        let info = self.info_or_go(OPT_GO, name)?;
        Ok(Connection {
            wire: self.wire,
            info,
            structured: self.structured,
            meta_base_allocation: self.meta_base_allocation,
            next_cookie: 1,
            in_flight: Arc::new(Mutex::new(HashMap::new())),
            partial: HashMap::new(),
            done: Vec::new(),
            broken: None,
            timeout: self.timeout,
        })
    }
}

/// The client's half of cairn's fence option (the wire format is in crate::fence).
impl Handshake {
    /// Declares `token` for `export`, with option flags ([`crate::fence::FENCE_FLAG_RELEASE`] gives
    /// the export up, [`FENCE_FLAG_WHOLE`] says the owner uses all of it). A refusal is
    /// an error ([`Error::is_fenced`]); a server that does not know the option answers
    /// [`FenceAnswer::NotEnforced`].
    pub fn declare_fence(
        &mut self,
        export: &str,
        token: &FenceToken,
        flags: u16,
    ) -> Result<FenceAnswer> {
        let data = token.encode_option_flags(export, flags);
        let mut replies = self.option(OPT_CAIRN_FENCE, &data)?;
        let last = replies
            .pop()
            .ok_or_else(|| Error::Protocol("no reply to the fence option".into()))?;
        match last.reply {
            REP_ACK => Ok(FenceAnswer::Enforced),
            REP_ERR_UNSUP => Ok(FenceAnswer::NotEnforced),
            reply => Err(Error::Option {
                option: OPT_CAIRN_FENCE,
                reply,
                message: String::from_utf8_lossy(&last.data).into_owned(),
            }),
        }
    }

    /// Asks the server for the owner record of `export` ([`FENCE_FLAG_QUERY`]; `token`
    /// names the asking owner and is not admitted). `None`: the server does not enforce
    /// (it keeps no record of its own).
    pub fn query_owner(&mut self, export: &str, token: &FenceToken) -> Result<Option<Vec<u8>>> {
        let data = token.encode_option_flags(export, FENCE_FLAG_QUERY | FENCE_FLAG_WHOLE);
        let mut replies = self.option(OPT_CAIRN_FENCE, &data)?;
        let last = replies
            .pop()
            .ok_or_else(|| Error::Protocol("no reply to the fence query".into()))?;
        match last.reply {
            REP_ACK => Ok(Some(
                replies
                    .into_iter()
                    .find(|r| r.reply == REP_CAIRN_OWNER)
                    .map(|r| r.data)
                    .unwrap_or_default(),
            )),
            REP_ERR_UNSUP => Ok(None),
            reply => Err(Error::Option {
                option: OPT_CAIRN_FENCE,
                reply,
                message: String::from_utf8_lossy(&last.data).into_owned(),
            }),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Transmission

/// A 28-byte request header with every field under the caller's control.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawRequest {
    pub magic: u32,
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

impl RawRequest {
    /// A well-formed header (right magic); the cookie is filled in by
    /// [`Connection::submit`], or set it yourself for [`Connection::send_raw`].
    pub fn new(kind: u16, flags: u16, offset: u64, length: u32) -> RawRequest {
        RawRequest {
            magic: REQUEST_MAGIC,
            flags,
            kind,
            cookie: 0,
            offset,
            length,
        }
    }
    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut h = Request {
            flags: self.flags,
            kind: self.kind,
            cookie: self.cookie,
            offset: self.offset,
            length: self.length,
        }
        .encode();
        h[0..4].copy_from_slice(&self.magic.to_be_bytes());
        h
    }
}

/// What the client remembers about a request in flight, to read its reply safely.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    kind: u16,
    flags: u16,
    offset: u64,
    length: u32,
    /// When it was sent: a pipeline's read timeout counts from here.
    sent: Instant,
}

/// One structured reply chunk, as received (payload omitted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    pub flags: u16,
    pub kind: u16,
    pub length: u32,
}

/// A complete reply to one request.
#[derive(Debug, Clone, Default)]
pub struct Reply {
    pub cookie: u64,
    /// The request's command type, as the client sent it.
    pub command: u16,
    /// 0 on success, else the (first) NBD error value.
    pub error: u32,
    /// The message of a structured error chunk.
    pub message: String,
    /// The offset of an `ERROR_OFFSET` chunk.
    pub error_offset: Option<u64>,
    /// Whether the reply was structured.
    pub structured: bool,
    /// READ: the data, exactly the requested length on success (holes read as zeroes).
    pub data: Vec<u8>,
    /// Structured chunks in arrival order.
    pub chunks: Vec<ChunkInfo>,
    /// BLOCK_STATUS: (context id, [(length, flags)]) per chunk.
    pub block_status: Vec<(u32, Vec<(u32, u32)>)>,
}

impl Reply {
    pub fn is_ok(&self) -> bool {
        self.error == 0
    }
    /// `Err(Error::Request)` for an error reply.
    pub fn result(self) -> Result<Reply> {
        if self.error == 0 {
            Ok(self)
        } else {
            Err(Error::Request {
                command: self.command,
                errno: self.error,
                message: self.message,
            })
        }
    }
}

/// A structured reply still being assembled.
#[derive(Debug, Default)]
struct Partial {
    reply: Reply,
    /// READ: byte ranges covered so far, relative to the request offset.
    covered: Vec<(u64, u64)>,
}

/// The transmission phase of one connection. Not thread-safe (`&mut self`); [`Client`]
/// puts it behind a mutex. Several requests may be in flight: [`Connection::submit`]
/// returns a cookie, [`Connection::recv`] returns replies in the order the server sends
/// them, [`Connection::wait`] picks one out.
pub struct Connection {
    wire: Wire,
    info: ExportInfo,
    structured: bool,
    meta_base_allocation: Option<u32>,
    next_cookie: u64,
    /// Shared with a [`Pipeline`]'s sending side once the connection becomes one.
    in_flight: Arc<Mutex<HashMap<u64, InFlight>>>,
    partial: HashMap<u64, Partial>,
    /// Complete replies read while waiting for another cookie.
    done: Vec<Reply>,
    /// Set after a protocol or socket error: the stream can no longer be trusted.
    broken: Option<String>,
    timeout: Option<Duration>,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("info", &self.info)
            .field("structured", &self.structured)
            .field("meta_base_allocation", &self.meta_base_allocation)
            .field("in_flight", &self.flights().len())
            .field("broken", &self.broken)
            .finish()
    }
}

impl Connection {
    pub fn info(&self) -> &ExportInfo {
        &self.info
    }
    pub fn structured(&self) -> bool {
        self.structured
    }
    /// The context id the server gave `base:allocation`, if negotiated.
    pub fn meta_base_allocation(&self) -> Option<u32> {
        self.meta_base_allocation
    }
    /// Requests sent whose replies have not been returned yet.
    pub fn in_flight(&self) -> usize {
        self.flights().len() + self.done.len()
    }
    /// Why the connection is unusable, if it is.
    pub fn broken(&self) -> Option<&str> {
        self.broken.as_deref()
    }
    pub fn set_timeout(&mut self, t: Option<Duration>) -> Result<()> {
        self.timeout = t;
        if let Some(c) = &self.wire.tls {
            c.set_timeouts(t);
        } else if let Some(s) = &self.wire.socket {
            s.set_timeout(t)?;
        }
        Ok(())
    }

    fn flights(&self) -> MutexGuard<'_, HashMap<u64, InFlight>> {
        self.in_flight
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn check_usable(&self) -> Result<()> {
        match &self.broken {
            Some(why) => Err(Error::Protocol(format!("connection unusable: {why}"))),
            None => Ok(()),
        }
    }

    /// Records why the stream is unusable and passes the error on.
    fn poison<T>(&mut self, e: Error) -> Result<T> {
        if !matches!(e, Error::Usage(_) | Error::Request { .. }) && self.broken.is_none() {
            self.broken = Some(e.to_string());
        }
        Err(e)
    }

    /// Sends `req` exactly as given, followed by `payload` (which need not match
    /// `req.length`). The client expects a reply under `req.cookie` unless the type is
    /// DISC; sending a cookie already in flight is refused.
    pub fn send_raw(&mut self, req: RawRequest, payload: &[u8]) -> Result<()> {
        self.check_usable()?;
        if req.kind != CMD_DISC {
            if self.flights().contains_key(&req.cookie)
                || self.done.iter().any(|r| r.cookie == req.cookie)
            {
                return Err(Error::Usage(format!(
                    "cookie {} is already in flight",
                    req.cookie
                )));
            }
            self.flights().insert(
                req.cookie,
                InFlight {
                    kind: req.kind,
                    flags: req.flags,
                    offset: req.offset,
                    length: req.length,
                    sent: Instant::now(),
                },
            );
        }
        let h = req.encode();
        match self.wire.send(&[&h, payload]) {
            Ok(()) => Ok(()),
            Err(e) => self.poison(e),
        }
    }

    /// Sends a well-formed request with a fresh cookie and returns the cookie. `payload`
    /// is sent for WRITE (its length is the request length) and must be empty otherwise.
    pub fn submit(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Result<u64> {
        let cookie = self.next_cookie;
        self.next_cookie = self.next_cookie.wrapping_add(1).max(1);
        let mut req = RawRequest::new(kind, flags, offset, length);
        req.cookie = cookie;
        self.send_raw(req, payload)?;
        Ok(cookie)
    }

    /// Sends a READ and returns its cookie.
    pub fn submit_read(&mut self, offset: u64, length: u32, flags: u16) -> Result<u64> {
        self.submit(CMD_READ, flags, offset, length, &[])
    }

    /// Sends a WRITE of `data` and returns its cookie.
    pub fn submit_write(&mut self, offset: u64, data: &[u8], flags: u16) -> Result<u64> {
        let len = len_u32(data.len(), "write")?;
        self.submit(CMD_WRITE, flags, offset, len, data)
    }

    /// Sends a FLUSH and returns its cookie.
    pub fn submit_flush(&mut self) -> Result<u64> {
        self.submit(CMD_FLUSH, 0, 0, 0, &[])
    }

    /// The next complete reply: one already read while waiting for another cookie, else
    /// the next one from the wire. [`Error::Closed`] when the server closed cleanly.
    pub fn recv(&mut self) -> Result<Reply> {
        if !self.done.is_empty() {
            return Ok(self.done.remove(0));
        }
        self.check_usable()?;
        loop {
            match self.recv_one() {
                Ok(Some(r)) => return Ok(r),
                Ok(None) => {}
                Err(e) => return self.poison(e),
            }
        }
    }

    /// The reply to `cookie`, buffering any others that arrive first.
    pub fn wait(&mut self, cookie: u64) -> Result<Reply> {
        if let Some(i) = self.done.iter().position(|r| r.cookie == cookie) {
            return Ok(self.done.remove(i));
        }
        if !self.flights().contains_key(&cookie) {
            return Err(Error::Usage(format!("cookie {cookie} is not in flight")));
        }
        self.check_usable()?;
        loop {
            match self.recv_one() {
                Ok(Some(r)) if r.cookie == cookie => return Ok(r),
                Ok(Some(r)) => self.done.push(r),
                Ok(None) => {}
                Err(e) => return self.poison(e),
            }
        }
    }

    /// Reads one simple reply or one structured chunk; returns a reply when complete.
    fn recv_one(&mut self) -> Result<Option<Reply>> {
        let mut magic = [0u8; 4];
        self.wire.read_header(&mut magic)?;
        match u32::from_be_bytes(magic) {
            SIMPLE_REPLY_MAGIC => self.recv_simple().map(Some),
            STRUCTURED_REPLY_MAGIC => self.recv_chunk(),
            m => Err(Error::Protocol(format!("reply magic {m:#010x}"))),
        }
        .map_err(mid_message)
    }

    fn take_in_flight(&mut self, cookie: u64) -> Result<InFlight> {
        self.flights().remove(&cookie).ok_or_else(|| {
            Error::Protocol(format!("reply to cookie {cookie}, which is not in flight"))
        })
    }

    fn recv_simple(&mut self) -> Result<Reply> {
        let mut rest = [0u8; SIMPLE_REPLY_LEN - 4];
        self.wire.read_exact(&mut rest)?;
        let error = be32(&rest, 0);
        let cookie = be64(&rest, 4);
        if self.partial.contains_key(&cookie) {
            return Err(Error::Protocol(format!(
                "simple reply to cookie {cookie} after structured chunks"
            )));
        }
        let req = self.take_in_flight(cookie)?;
        let mut reply = Reply {
            cookie,
            command: req.kind,
            error,
            ..Reply::default()
        };
        if req.kind == CMD_READ && error == 0 {
            if self.structured {
                return Err(Error::Protocol(
                    "simple reply with data to a READ after structured replies were negotiated"
                        .into(),
                ));
            }
            if req.length > MAX_READ_REPLY {
                return Err(Error::Protocol(format!(
                    "success for a {}-byte READ",
                    req.length
                )));
            }
            reply.data = self.wire.read_vec(req.length)?;
        }
        if req.kind == CMD_BLOCK_STATUS && error == 0 {
            return Err(Error::Protocol(
                "simple success reply to BLOCK_STATUS".into(),
            ));
        }
        Ok(reply)
    }

    fn recv_chunk(&mut self) -> Result<Option<Reply>> {
        let mut rest = [0u8; STRUCTURED_HEADER_LEN - 4];
        self.wire.read_exact(&mut rest)?;
        let flags = be16(&rest, 0);
        let kind = be16(&rest, 2);
        let cookie = be64(&rest, 4);
        let length = be32(&rest, 12);
        if !self.structured {
            return Err(Error::Protocol(
                "structured reply without negotiation".into(),
            ));
        }
        let req = *self.flights().get(&cookie).ok_or_else(|| {
            Error::Protocol(format!("chunk for cookie {cookie}, which is not in flight"))
        })?;
        if flags & !REPLY_FLAG_DONE != 0 {
            return Err(Error::Protocol(format!("unknown chunk flags {flags:#x}")));
        }
        // Bound the payload by what this request can legitimately get back.
        let max: u64 = match kind {
            REPLY_TYPE_NONE => 0,
            REPLY_TYPE_OFFSET_DATA if req.kind == CMD_READ => 8 + u64::from(req.length),
            REPLY_TYPE_OFFSET_HOLE if req.kind == CMD_READ => 12,
            REPLY_TYPE_BLOCK_STATUS if req.kind == CMD_BLOCK_STATUS => {
                let blocks = u64::from(req.length) / u64::from(self.info.min_block.max(1)) + 1;
                (4 + 8 * blocks).min(MAX_BLOCK_STATUS_CHUNK)
            }
            k if k & 0x8000 != 0 => u64::from(MAX_ERROR_CHUNK),
            k => {
                return Err(Error::Protocol(format!(
                    "chunk type {k} in reply to {}",
                    command_name(req.kind)
                )))
            }
        };
        if u64::from(length) > max {
            return Err(Error::Protocol(format!(
                "{length}-byte chunk of type {kind} for a {}-byte {}",
                req.length,
                command_name(req.kind)
            )));
        }
        let payload = self.wire.read_vec(length)?;
        let partial = self.partial.entry(cookie).or_default();
        let reply = &mut partial.reply;
        reply.cookie = cookie;
        reply.command = req.kind;
        reply.structured = true;
        reply.chunks.push(ChunkInfo {
            flags,
            kind,
            length,
        });
        match kind {
            REPLY_TYPE_NONE => {
                if flags & REPLY_FLAG_DONE == 0 {
                    return Err(Error::Protocol("NONE chunk without DONE".into()));
                }
            }
            REPLY_TYPE_OFFSET_DATA | REPLY_TYPE_OFFSET_HOLE => {
                if payload.len() < 8 || (kind == REPLY_TYPE_OFFSET_HOLE && payload.len() != 12) {
                    return Err(Error::Protocol(format!(
                        "{}-byte read chunk",
                        payload.len()
                    )));
                }
                let off = be64(&payload, 0);
                let n = if kind == REPLY_TYPE_OFFSET_DATA {
                    (payload.len() - 8) as u64
                } else {
                    u64::from(be32(&payload, 8))
                };
                let rel = off.checked_sub(req.offset).filter(|r| {
                    n > 0 && r.checked_add(n).is_some_and(|e| e <= u64::from(req.length))
                });
                let Some(rel) = rel else {
                    return Err(Error::Protocol(format!(
                        "read chunk {off}+{n} outside the request {}+{}",
                        req.offset, req.length
                    )));
                };
                if reply.data.is_empty() {
                    if req.length > MAX_READ_REPLY {
                        return Err(Error::Protocol(format!(
                            "data for a {}-byte READ",
                            req.length
                        )));
                    }
                    reply.data = vec![0u8; usize::try_from(req.length).expect("<= 64 MiB")];
                }
                let at = usize::try_from(rel).expect("< request length");
                if kind == REPLY_TYPE_OFFSET_DATA {
                    reply.data[at..at + payload.len() - 8].copy_from_slice(&payload[8..]);
                } else {
                    let n = usize::try_from(n).expect("< request length");
                    reply.data[at..at + n].fill(0);
                }
                partial.covered.push((rel, n));
            }
            REPLY_TYPE_BLOCK_STATUS => {
                if payload.len() < 12 || (payload.len() - 4) % 8 != 0 {
                    return Err(Error::Protocol(format!(
                        "{}-byte BLOCK_STATUS chunk",
                        payload.len()
                    )));
                }
                let id = be32(&payload, 0);
                let descs = payload[4..]
                    .chunks_exact(8)
                    .map(|d| (be32(d, 0), be32(d, 4)))
                    .collect();
                reply.block_status.push((id, descs));
            }
            _ => {
                // Errors, known or not: errno, message length, message [, offset].
                if payload.len() < 6 {
                    return Err(Error::Protocol(format!(
                        "{}-byte error chunk",
                        payload.len()
                    )));
                }
                let errno = be32(&payload, 0);
                let mlen = usize::from(be16(&payload, 4));
                let extra = if kind == REPLY_TYPE_ERROR_OFFSET {
                    8
                } else {
                    0
                };
                let known = kind == REPLY_TYPE_ERROR || kind == REPLY_TYPE_ERROR_OFFSET;
                if (known && payload.len() != 6 + mlen + extra) || payload.len() < 6 + mlen {
                    return Err(Error::Protocol(format!(
                        "error chunk of {} bytes with a {mlen}-byte message",
                        payload.len()
                    )));
                }
                if errno == 0 {
                    return Err(Error::Protocol("error chunk with error 0".into()));
                }
                if reply.error == 0 {
                    reply.error = errno;
                    reply.message = String::from_utf8_lossy(&payload[6..6 + mlen]).into_owned();
                    if kind == REPLY_TYPE_ERROR_OFFSET {
                        reply.error_offset = Some(be64(&payload, 6 + mlen));
                    }
                }
            }
        }
        if flags & REPLY_FLAG_DONE == 0 {
            return Ok(None);
        }
        self.flights().remove(&cookie);
        let Partial {
            mut reply,
            mut covered,
        } = self.partial.remove(&cookie).expect("inserted above");
        if reply.error == 0 {
            match req.kind {
                CMD_READ => {
                    covered.sort_unstable();
                    let mut pos = 0u64;
                    for (at, n) in covered {
                        if at != pos {
                            return Err(Error::Protocol(format!(
                                "READ chunks {} at byte {at} (expected {pos})",
                                if at < pos { "overlap" } else { "leave a gap" }
                            )));
                        }
                        pos = at + n;
                    }
                    if pos != u64::from(req.length) {
                        return Err(Error::Protocol(format!(
                            "READ chunks cover {pos} of {} bytes",
                            req.length
                        )));
                    }
                    if req.flags & CMD_FLAG_DF != 0
                        && reply.chunks.iter().filter(|c| c.length > 0).count() > 1
                    {
                        return Err(Error::Protocol("DF read came in several chunks".into()));
                    }
                    if req.length == 0 {
                        reply.data.clear();
                    }
                }
                CMD_BLOCK_STATUS if reply.block_status.is_empty() => {
                    return Err(Error::Protocol(
                        "BLOCK_STATUS success without descriptors".into(),
                    ));
                }
                _ => {}
            }
        } else {
            reply.data.clear();
        }
        Ok(Some(reply))
    }

    fn call(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Result<Reply> {
        let cookie = self.submit(kind, flags, offset, length, payload)?;
        self.wait(cookie)?.result()
    }

    /// READ into `buf` (one request: `buf` must not exceed the server's maximum).
    pub fn read(&mut self, offset: u64, buf: &mut [u8], flags: u16) -> Result<()> {
        let len = len_u32(buf.len(), "read")?;
        let r = self.call(CMD_READ, flags, offset, len, &[])?;
        if r.data.len() != buf.len() {
            return self.poison(Error::Protocol("READ reply has the wrong length".into()));
        }
        buf.copy_from_slice(&r.data);
        Ok(())
    }

    /// READ returning a fresh buffer.
    pub fn read_vec(&mut self, offset: u64, len: u32, flags: u16) -> Result<Vec<u8>> {
        let mut v = vec![0u8; usize::try_from(len).map_err(|_| Error::Usage("length".into()))?];
        self.read(offset, &mut v, flags)?;
        Ok(v)
    }

    /// WRITE (`flags` may carry `CMD_FLAG_FUA`).
    pub fn write(&mut self, offset: u64, data: &[u8], flags: u16) -> Result<()> {
        let len = len_u32(data.len(), "write")?;
        self.call(CMD_WRITE, flags, offset, len, data).map(drop)
    }

    pub fn flush(&mut self) -> Result<()> {
        self.call(CMD_FLUSH, 0, 0, 0, &[]).map(drop)
    }

    pub fn trim(&mut self, offset: u64, len: u32, flags: u16) -> Result<()> {
        self.call(CMD_TRIM, flags, offset, len, &[]).map(drop)
    }

    /// WRITE_ZEROES (`flags`: FUA, NO_HOLE, FAST_ZERO).
    pub fn write_zeroes(&mut self, offset: u64, len: u32, flags: u16) -> Result<()> {
        self.call(CMD_WRITE_ZEROES, flags, offset, len, &[])
            .map(drop)
    }

    pub fn cache(&mut self, offset: u64, len: u32) -> Result<()> {
        self.call(CMD_CACHE, 0, offset, len, &[]).map(drop)
    }

    /// BLOCK_STATUS for `base:allocation`: (length, flags) descriptors as the server sent
    /// them (`STATE_HOLE`, `STATE_ZERO`).
    pub fn block_status(&mut self, offset: u64, len: u32, flags: u16) -> Result<Vec<(u32, u32)>> {
        let r = self.call(CMD_BLOCK_STATUS, flags, offset, len, &[])?;
        let want = self.meta_base_allocation;
        let mut out = Vec::new();
        for (id, d) in r.block_status {
            if Some(id) != want {
                return self.poison(Error::Protocol(format!(
                    "block status for unknown context {id}"
                )));
            }
            out.extend(d);
        }
        Ok(out)
    }

    /// Sends `NBD_CMD_DISC` and waits for the server to close (replies to requests still
    /// in flight are read and dropped).
    pub fn disconnect(mut self) -> Result<()> {
        self.check_usable()?;
        let mut req = RawRequest::new(CMD_DISC, 0, 0, 0);
        req.cookie = 0;
        self.send_raw(req, &[])?;
        if let Some(c) = &self.wire.tls {
            c.close();
        }
        if let Some(s) = &self.wire.socket {
            s.shutdown(std::net::Shutdown::Write);
        }
        loop {
            match self.recv() {
                Ok(_) => {}
                Err(Error::Closed) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads until the server closes, failing if it sends anything. For tests that expect
    /// a hard disconnect.
    pub fn expect_closed(&mut self) -> Result<()> {
        let mut b = [0u8; 1];
        match self.wire.read_header(&mut b) {
            Err(Error::Closed) => Ok(()),
            // A reset is how a closed TCP peer answers data it never read.
            Err(Error::Io(e)) if e.kind() == io::ErrorKind::ConnectionReset => Ok(()),
            Err(e) => Err(e),
            Ok(()) => Err(Error::Protocol(format!(
                "byte {:#04x} instead of a close",
                b[0]
            ))),
        }
    }

    /// Closes the socket in both directions without saying goodbye.
    pub fn abandon(self) {
        if let Some(s) = &self.wire.socket {
            s.shutdown(std::net::Shutdown::Both);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Pipeline: one connection shared by many threads

/// One connection that many threads use at once: each caller sends its request under a
/// short lock and waits for its own reply; one reader thread reads replies in whatever
/// order the server sends them and hands each to its caller by cookie.
///
/// ```text
///   caller ─┐ lock sender: cookie, in-flight entry, waiter → write request ─┐
///   caller ─┤                                                             server
///   caller ─┘ <── waiter channel <── reader thread: recv, match cookie <────┘
/// ```
///
/// A broken stream (a protocol error, EOF, a reply the server does not send within the
/// timeout while requests wait) fails every request in flight and every later one.
pub struct Pipeline {
    shared: Arc<PipeShared>,
    socket: Option<Socket>,
    /// The TLS session, if any: its close_notify goes before the socket's FIN, and it
    /// holds the read timeout.
    tls: Option<Arc<TlsConn>>,
    reader: Option<thread::JoinHandle<()>>,
}

struct PipeShared {
    sender: Mutex<PipeSender>,
    /// To end the stream when requests held back (crate::cork) cannot be sent.
    socket: Option<Socket>,
    in_flight: Arc<Mutex<HashMap<u64, InFlight>>>,
    waiters: Mutex<Waiters>,
}

struct PipeSender {
    writer: BufWriter<Box<dyn Write + Send>>,
    next_cookie: u64,
}

/// Who takes a reply: a thread waiting on a channel, or a function the reader thread
/// calls.
enum Waiter {
    Channel(SyncSender<Result<Reply>>),
    Call(ReplyFn),
}

/// Called once, on the pipeline's reader thread, with the reply to a request sent by
/// [`Pipeline::submit_then`] (or with the error that ended the connection).
pub type ReplyFn = Box<dyn FnOnce(Result<Reply>) + Send>;

impl Waiter {
    fn deliver(self, r: Result<Reply>) {
        match self {
            Waiter::Channel(tx) => {
                let _ = tx.send(r);
            }
            Waiter::Call(f) => f(r),
        }
    }
}

#[derive(Default)]
struct Waiters {
    by_cookie: HashMap<u64, Waiter>,
    /// Why the connection is unusable, once it is ([`Error::Closed`] after a clean
    /// close).
    broken: Option<Error>,
}

impl fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let w = self
            .shared
            .waiters
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        f.debug_struct("Pipeline")
            .field("in_flight", &w.by_cookie.len())
            .field("broken", &w.broken.as_ref().map(ToString::to_string))
            .finish()
    }
}

/// A request sent on a [`Pipeline`] whose reply has not been taken yet.
#[derive(Debug)]
pub struct Pending {
    rx: Receiver<Result<Reply>>,
}

impl Pending {
    /// Waits for the reply; an error reply is `Err(Error::Request)`.
    pub fn wait(self) -> Result<Reply> {
        // The request may be among those this thread held back.
        crate::cork::release();
        match self.rx.recv() {
            Ok(r) => r?.result(),
            Err(_) => Err(Error::Protocol(
                "connection closed with the request in flight".into(),
            )),
        }
    }
}

/// The same failure again, for each request it ends.
fn again(e: &Error) -> Error {
    match e {
        Error::Closed => Error::Closed,
        Error::Io(io) => Error::Io(io::Error::new(io.kind(), io.to_string())),
        e => Error::Protocol(format!("connection unusable: {e}")),
    }
}

impl Connection {
    /// Turns this connection into a [`Pipeline`] (no request may be in flight). Its
    /// timeout then applies to waiting for a reply while requests are in flight: an idle
    /// pipeline stays open.
    pub fn into_pipeline(mut self) -> Result<Pipeline> {
        self.check_usable()?;
        if self.in_flight() != 0 {
            return Err(Error::Usage("requests are in flight".into()));
        }
        let writer = std::mem::replace(
            &mut self.wire.writer,
            BufWriter::new(Box::new(io::sink()) as Box<dyn Write + Send>),
        );
        let socket = match &self.wire.socket {
            Some(s) => Some(s.try_clone()?),
            None => None,
        };
        let tls = self.wire.tls.clone();
        let shared = Arc::new(PipeShared {
            sender: Mutex::new(PipeSender {
                writer,
                next_cookie: self.next_cookie,
            }),
            socket: match &self.wire.socket {
                Some(s) => Some(s.try_clone()?),
                None => None,
            },
            in_flight: self.in_flight.clone(),
            waiters: Mutex::new(Waiters::default()),
        });
        let s = shared.clone();
        let reader = thread::Builder::new()
            .name("nbd-client-reader".into())
            .spawn(move || s.read_replies(self))?;
        Ok(Pipeline {
            shared,
            socket,
            tls,
            reader: Some(reader),
        })
    }
}

/// Requests with at most this much payload may be held back (crate::cork).
const GATHER_PAYLOAD: usize = 16 << 10;

impl crate::cork::Corked for PipeShared {
    fn uncork(&self) {
        let mut s = self.sender.lock().unwrap_or_else(|p| p.into_inner());
        if s.writer.flush().is_err() {
            // As a failed send: the reader sees the end and fails what is in flight.
            if let Some(sock) = &self.socket {
                sock.shutdown(std::net::Shutdown::Both);
            }
        }
    }
}

impl PipeShared {
    fn waiters(&self) -> MutexGuard<'_, Waiters> {
        self.waiters.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The reader thread: every reply to its caller, until the stream ends.
    fn read_replies(&self, mut conn: Connection) {
        // Replies that callbacks send on while more answers are buffered here go out
        // together, before this thread next waits (crate::cork).
        let _cork = crate::cork::Scope;
        let end = loop {
            if conn.wire.reader.buffer().len() < SIMPLE_REPLY_LEN {
                crate::cork::release();
            }
            match conn.recv_one() {
                Ok(Some(r)) => {
                    if conn.wire.reader.buffer().len() >= SIMPLE_REPLY_LEN {
                        crate::cork::hold();
                    }
                    let w = self.waiters().by_cookie.remove(&r.cookie);
                    if let Some(w) = w {
                        w.deliver(Ok(r));
                    }
                }
                Ok(None) => {}
                // A read timeout before a message's first byte (one in the middle is a
                // protocol error, see `mid_message`): nothing was consumed. The server
                // failed to answer only if a request has waited the whole timeout: the
                // read may have started long before the request was sent (an idle
                // connection), and then the request gets the rest of its time.
                Err(Error::Io(e)) if is_timeout(&e) => {
                    let oldest = conn.flights().values().map(|f| f.sent).min();
                    let Some(sent) = oldest else { continue };
                    let Some(limit) = conn.timeout else {
                        break Error::Io(e);
                    };
                    let waited = sent.elapsed();
                    if waited >= limit {
                        break Error::Io(e);
                    }
                    conn.wire.shorten_read_timeout(limit - waited, limit);
                }
                Err(e) => break e,
            }
        };
        // Every later submit sees the connection broken (under the same lock as the
        // drain, so no waiter slips in between); the waiters hear it outside the lock.
        let waiting: Vec<(Waiter, Error)> = {
            let mut w = self.waiters();
            let all = w.by_cookie.drain().map(|(_, w)| (w, again(&end))).collect();
            w.broken = Some(end);
            all
        };
        for (w, e) in waiting {
            w.deliver(Err(e));
        }
    }
}

impl Pipeline {
    /// Why the connection is unusable (EOF, a protocol error, a reply not sent within the
    /// timeout), once it is: every later request fails with it.
    pub fn broken(&self) -> Option<String> {
        self.shared
            .waiters()
            .broken
            .as_ref()
            .map(ToString::to_string)
    }

    /// Sends a request and returns at once; [`Pending::wait`] takes its reply. `payload`
    /// goes with WRITE (its length is the request length) and must be empty otherwise.
    pub fn submit(
        &self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Result<Pending> {
        let (tx, rx) = sync_channel(1);
        self.send(kind, flags, offset, length, payload, Waiter::Channel(tx))?;
        Ok(Pending { rx })
    }

    /// Sends a request; the pipeline's reader thread calls `then` with its reply (an
    /// error reply is `Ok` with its error set: [`Reply::result`] tells). `then` runs on
    /// the reader thread, so it must be short and must not wait for another reply of
    /// this pipeline. `Err` here means the request did not leave and `then` will not be
    /// called; otherwise `then` is called exactly once.
    pub fn submit_then(
        &self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
        then: ReplyFn,
    ) -> Result<()> {
        self.send(kind, flags, offset, length, payload, Waiter::Call(then))
    }

    fn send(
        &self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
        waiter: Waiter,
    ) -> Result<()> {
        let mut s = self.shared.sender.lock().unwrap_or_else(|p| p.into_inner());
        let cookie = s.next_cookie;
        s.next_cookie = s.next_cookie.wrapping_add(1).max(1);
        {
            // The waiter is in place before the request leaves: the reply may come back
            // before this thread runs again.
            let mut w = self.shared.waiters();
            if let Some(e) = &w.broken {
                return Err(again(e));
            }
            w.by_cookie.insert(cookie, waiter);
        }
        self.shared
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                cookie,
                InFlight {
                    kind,
                    flags,
                    offset,
                    length,
                    sent: Instant::now(),
                },
            );
        let mut req = RawRequest::new(kind, flags, offset, length);
        req.cookie = cookie;
        // A small request may wait for the end of this thread's burst (crate::cork);
        // anything else goes now, with whatever waited before it.
        let gather = payload.len() <= GATHER_PAYLOAD && crate::cork::may_gather_requests();
        let sent = s
            .writer
            .write_all(&req.encode())
            .and_then(|()| s.writer.write_all(payload))
            .and_then(|()| if gather { Ok(()) } else { s.writer.flush() });
        if gather && sent.is_ok() {
            drop(s);
            let me: Arc<dyn crate::cork::Corked> = self.shared.clone();
            crate::cork::defer(&me);
            return Ok(());
        }
        if let Err(e) = sent {
            // Part of a request may be on the wire: the stream is lost. The reader sees
            // the end and fails everything in flight.
            let ours = self.shared.waiters().by_cookie.remove(&cookie);
            self.shared
                .in_flight
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&cookie);
            if let Some(sock) = &self.socket {
                sock.shutdown(std::net::Shutdown::Both);
            }
            // The reader may have ended first and told the waiter already: then the
            // waiter has its error, and telling the caller too would report it twice.
            if ours.is_some() {
                return Err(Error::Io(e));
            }
        }
        Ok(())
    }

    /// Sends a request and waits for its reply.
    pub fn call(
        &self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Result<Reply> {
        self.submit(kind, flags, offset, length, payload)?.wait()
    }

    /// Requests sent whose replies have not been read.
    pub fn in_flight(&self) -> usize {
        self.shared.waiters().by_cookie.len()
    }

    /// Sends `NBD_CMD_DISC` once the requests in flight are answered, and waits for the
    /// server to close.
    pub fn disconnect(mut self) -> Result<()> {
        while self.in_flight() > 0 && self.reader.as_ref().is_some_and(|r| !r.is_finished()) {
            thread::sleep(Duration::from_millis(1));
        }
        {
            let mut s = self.shared.sender.lock().unwrap_or_else(|p| p.into_inner());
            let mut req = RawRequest::new(CMD_DISC, 0, 0, 0);
            req.cookie = 0;
            s.writer.write_all(&req.encode())?;
            s.writer.flush()?;
        }
        if let Some(c) = &self.tls {
            c.close();
            c.set_timeouts(None);
        }
        if let Some(sock) = &self.socket {
            sock.shutdown(std::net::Shutdown::Write);
            // The reader now waits for the close, however long the server takes.
            let _ = sock.set_read_timeout(None);
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
        match &self.shared.waiters().broken {
            None | Some(Error::Closed) => Ok(()),
            Some(e) => Err(again(e)),
        }
    }
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        if let Some(r) = self.reader.take() {
            if let Some(sock) = &self.socket {
                if let Some(c) = &self.tls {
                    c.close();
                }
                sock.shutdown(std::net::Shutdown::Both);
                // The last owner may be a reply function running on the reader thread
                // itself (submit_then): it cannot wait for its own end.
                if r.thread().id() != thread::current().id() {
                    let _ = r.join();
                }
            }
            // A stream without a socket ends when its other side does; the reader
            // thread is left to see that.
        }
    }
}

// ---------------------------------------------------------------------------------------
// Client: a remote export as a BlockDevice

/// A connected export, usable as a [`BlockDevice`] by many threads at once: each call
/// sends its requests on a [`Pipeline`] and waits only for its own replies, so
/// concurrent callers keep many requests in flight. When the server offers multi-conn
/// (`FLAG_CAN_MULTI_CONN`), the client opens [`ClientOptions::connections`] connections
/// and spreads calls over them; a FLUSH on any one of them covers writes completed on
/// all, as multi-conn promises.
#[derive(Debug)]
pub struct Client {
    pipes: Vec<Pipeline>,
    next: AtomicUsize,
    info: ExportInfo,
    /// The context id the server gave `base:allocation`, if negotiated.
    base_allocation: Option<u32>,
    /// What the server said to the declared owner token.
    fence: Option<crate::fence::FenceAnswer>,
}

/// Requests of one [`Client`] call on the wire, not yet answered.
#[derive(Debug)]
#[must_use = "a started request is only known done after wait()"]
pub struct Started<'a> {
    client: &'a Client,
    pending: Vec<Result<Pending>>,
    flush_after: bool,
}

impl Started<'_> {
    /// Waits for every reply; the first error is returned once all are in.
    pub fn wait(self) -> cairn_block::Result<()> {
        let client = self.client;
        self.detach().wait(client)
    }

    /// The same requests, no longer tied to the borrow of the client: another thread
    /// may wait for them ([`Detached::wait`] with the same client).
    pub fn detach(self) -> Detached {
        Detached {
            pending: self.pending,
            flush_after: self.flush_after,
        }
    }
}

/// The pieces of one [`Client::write_then`]: the last to finish calls `done`.
struct Gather {
    left: AtomicUsize,
    first_err: Mutex<Option<Error>>,
    done: Mutex<Option<WriteDone>>,
}

impl Gather {
    fn one(&self, r: Result<()>) {
        if let Err(e) = r {
            self.first_err
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let err = self
            .first_err
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        let done = self.done.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(done) = done {
            done(err.map_or(Ok(()), |e| Err(e.into())));
        }
    }
}

/// The pieces of one [`Client::read_then`]: the last to finish calls `done` with the
/// bytes put together (a read of one piece hands its reply's buffer on as it is).
struct ReadGather {
    left: AtomicUsize,
    len: usize,
    parts: Mutex<Vec<(usize, Vec<u8>)>>,
    first_err: Mutex<Option<Error>>,
    done: Mutex<Option<ReadDone>>,
}

impl ReadGather {
    /// One piece in (at its offset in the read), or the sending thread's own count
    /// (an empty piece).
    fn one(&self, r: Result<(usize, Vec<u8>)>) {
        match r {
            Ok((_, d)) if d.is_empty() => {}
            Ok(part) => self
                .parts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(part),
            Err(e) => {
                self.first_err
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
            }
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let Some(done) = self.done.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        if let Some(e) = self
            .first_err
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            return done(Err(e.into()));
        }
        let mut parts = std::mem::take(&mut *self.parts.lock().unwrap_or_else(|p| p.into_inner()));
        if parts.len() == 1 && parts[0].1.len() == self.len {
            return done(Ok(parts.pop().expect("one part").1));
        }
        let mut buf = vec![0u8; self.len];
        for (at, d) in parts {
            buf[at..at + d.len()].copy_from_slice(&d);
        }
        done(Ok(buf))
    }
}

/// The data of one READ reply of `len` bytes, or its error.
fn read_piece(r: Reply, len: usize) -> Result<Vec<u8>> {
    let r = r.result()?;
    if r.data.len() != len {
        return Err(Error::Protocol("READ reply has the wrong length".into()));
    }
    Ok(r.data)
}

/// [`Started`] requests handed to another thread.
#[derive(Debug)]
#[must_use = "a started request is only known done after wait()"]
pub struct Detached {
    pending: Vec<Result<Pending>>,
    flush_after: bool,
}

impl Detached {
    /// Waits for every reply; the first error is returned once all are in. `client` is
    /// the one the requests were started on.
    pub fn wait(self, client: &Client) -> cairn_block::Result<()> {
        let mut first = None;
        for p in self.pending {
            if let Err(e) = p.and_then(Pending::wait) {
                first.get_or_insert(e);
            }
        }
        if let Some(e) = first {
            return Err(e.into());
        }
        // After every piece is answered: the flush must cover them all.
        if self.flush_after {
            client.call(CMD_FLUSH, 0, 0, 0, &[])?;
        }
        Ok(())
    }
}

impl Client {
    /// Why a connection of this client is unusable, once one is (its requests fail from
    /// then on): the server closed it, broke the protocol, or did not answer in time.
    pub fn broken(&self) -> Option<String> {
        self.pipes.iter().find_map(Pipeline::broken)
    }

    /// Handshakes and enters transmission as `opts` asks, on one connection or, when the
    /// server offers multi-conn, on `opts.connections`.
    pub fn connect(opts: &ClientOptions) -> Result<Client> {
        let (first, fence) = Client::connect_one(opts)?;
        let mut client = Client::from_connection(first)?;
        client.fence = fence;
        if client.info.has(FLAG_CAN_MULTI_CONN) {
            for _ in 1..opts.connections.max(1) {
                let (more, again) = Client::connect_one(opts)?;
                if again != fence {
                    return Err(Error::Protocol(
                        "a second connection to the export answered the fence differently".into(),
                    ));
                }
                if more.info().size != client.info.size || more.info().flags != client.info.flags {
                    return Err(Error::Protocol(
                        "a second connection to the export saw a different export".into(),
                    ));
                }
                client.pipes.push(more.into_pipeline()?);
            }
        }
        Ok(client)
    }

    fn connect_one(
        opts: &ClientOptions,
    ) -> Result<(Connection, Option<crate::fence::FenceAnswer>)> {
        let mut hs = Handshake::connect(&opts.addr, opts.timeout)?;
        // TLS first: nothing about the export, the owner token included, goes out in
        // plaintext when TLS is asked for.
        if let Some(tls) = &opts.tls {
            hs.starttls(tls)?;
        }
        let fence = match &opts.fence {
            Some(t) => {
                let flags = if opts.fence_whole {
                    crate::fence::FENCE_FLAG_WHOLE
                } else {
                    0
                };
                Some(hs.declare_fence(&opts.export, t, flags)?)
            }
            None => None,
        };
        if opts.structured || opts.meta_base_allocation {
            hs.structured_replies()?;
        }
        if opts.meta_base_allocation {
            hs.meta_context(true, &opts.export, &[BASE_ALLOCATION])?;
        }
        Ok((hs.go(&opts.export)?, fence))
    }

    /// A client over one connection already in transmission.
    pub fn from_connection(conn: Connection) -> Result<Client> {
        let info = conn.info().clone();
        let base_allocation = conn.meta_base_allocation();
        Ok(Client {
            pipes: vec![conn.into_pipeline()?],
            next: AtomicUsize::new(0),
            info,
            base_allocation,
            fence: None,
        })
    }

    /// Sends a write (every piece of it at once) and returns without waiting, so the
    /// caller can do other work (a local write of the same data) while it travels;
    /// [`Started::wait`] takes the replies. FUA on a server without FUA becomes a flush
    /// after every piece is answered.
    pub fn start_write(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Started<'_> {
        let chunk = usize::try_from(self.chunk(true)).expect("<= 32 MiB");
        let (nbd_flags, flush_after) = match (flags.fua(), self.info.has(FLAG_SEND_FUA)) {
            (true, true) => (CMD_FLAG_FUA, false),
            (true, false) => (0, true),
            (false, _) => (0, false),
        };
        let pending = buf
            .chunks(chunk)
            .enumerate()
            .map(|(i, piece)| {
                let len = len_u32(piece.len(), "write")?;
                self.pipe().submit(
                    CMD_WRITE,
                    nbd_flags,
                    offset + (i * chunk) as u64,
                    len,
                    piece,
                )
            })
            .collect();
        Started {
            client: self,
            pending,
            flush_after: flush_after && self.info.has(FLAG_SEND_FLUSH),
        }
    }

    /// Sends a write (every piece of it at once) and returns; `done` is called once with
    /// the result when every piece is answered, on a pipeline's reader thread (or here,
    /// when nothing could be sent). FUA on a server without FUA (a flush after the
    /// pieces) is done by waiting, on this thread.
    pub fn write_then(&self, buf: &[u8], offset: u64, flags: WriteFlags, done: WriteDone) {
        if flags.fua() && !self.info.has(FLAG_SEND_FUA) {
            return done(self.start_write(buf, offset, flags).wait());
        }
        let nbd_flags = if flags.fua() { CMD_FLAG_FUA } else { 0 };
        let chunk = usize::try_from(self.chunk(true)).expect("<= 32 MiB");
        // One count per piece, plus one this thread gives back when every piece is
        // sent, so `done` cannot run while pieces are still being sent.
        let all = Arc::new(Gather {
            left: AtomicUsize::new(buf.len().div_ceil(chunk) + 1),
            first_err: Mutex::new(None),
            done: Mutex::new(Some(done)),
        });
        for (i, piece) in buf.chunks(chunk).enumerate() {
            let g = all.clone();
            let sent = len_u32(piece.len(), "write").and_then(|len| {
                self.pipe().submit_then(
                    CMD_WRITE,
                    nbd_flags,
                    offset + (i * chunk) as u64,
                    len,
                    piece,
                    Box::new(move |r| g.one(r.and_then(Reply::result).map(drop))),
                )
            });
            if let Err(e) = sent {
                all.one(Err(e));
            }
        }
        all.one(Ok(()));
    }

    /// Sends a read of `len` bytes (every piece at once) and returns; `done` is called
    /// once with the bytes, or the first error, on a pipeline's reader thread (or here,
    /// when nothing could be sent).
    pub fn read_then(&self, len: usize, offset: u64, done: ReadDone) {
        let chunk = usize::try_from(self.chunk(true)).expect("<= 32 MiB");
        let pieces = len.div_ceil(chunk).max(1);
        // One count per piece, plus one this thread gives back when every piece is
        // sent, so `done` cannot run while pieces are still being sent.
        let all = Arc::new(ReadGather {
            left: AtomicUsize::new(pieces + 1),
            len,
            parts: Mutex::new(Vec::with_capacity(pieces)),
            first_err: Mutex::new(None),
            done: Mutex::new(Some(done)),
        });
        for i in 0..pieces {
            let at = i * chunk;
            let n = chunk.min(len - at);
            let g = all.clone();
            let sent = len_u32(n, "read").and_then(|n32| {
                self.pipe().submit_then(
                    CMD_READ,
                    0,
                    offset + at as u64,
                    n32,
                    &[],
                    Box::new(move |r| g.one(r.and_then(|r| read_piece(r, n)).map(|d| (at, d)))),
                )
            });
            if let Err(e) = sent {
                all.one(Err(e));
            }
        }
        all.one(Ok((0, Vec::new())));
    }

    /// Sends a flush and calls `done` with its answer on a pipeline's reader thread (at
    /// once when the server has no volatile cache, or when it could not be sent).
    pub fn flush_then(&self, done: WriteDone) {
        if !self.info.has(FLAG_SEND_FLUSH) {
            return done(Ok(()));
        }
        let all = Arc::new(Gather {
            left: AtomicUsize::new(1),
            first_err: Mutex::new(None),
            done: Mutex::new(Some(done)),
        });
        let g = all.clone();
        let sent = self.pipe().submit_then(
            CMD_FLUSH,
            0,
            0,
            0,
            &[],
            Box::new(move |r| g.one(r.and_then(Reply::result).map(drop))),
        );
        if let Err(e) = sent {
            all.one(Err(e));
        }
    }

    /// Sends a discard (TRIM, in pieces of at most 1 GiB, every piece at once) and
    /// returns; `done` is called once with the result when every piece is answered, on a
    /// pipeline's reader thread (here, when the server did not offer TRIM or nothing
    /// could be sent).
    pub fn discard_then(&self, offset: u64, len: u64, done: WriteDone) {
        if !self.info.has(FLAG_SEND_TRIM) {
            return done(Err(cairn_block::Error::new(
                ErrorKind::Unsupported,
                "remote NBD export: discard",
            )));
        }
        let chunk = self.chunk(false);
        // The sending thread's count, given back when every piece is sent, keeps `done`
        // from running while pieces are still being sent; each piece adds its own.
        let all = Arc::new(Gather {
            left: AtomicUsize::new(1),
            first_err: Mutex::new(None),
            done: Mutex::new(Some(done)),
        });
        let mut at = 0;
        while at < len {
            let n = (len - at).min(chunk);
            all.left.fetch_add(1, Ordering::AcqRel);
            let g = all.clone();
            let sent = self.pipe().submit_then(
                CMD_TRIM,
                0,
                offset + at,
                u32::try_from(n).expect("chunk fits u32"),
                &[],
                Box::new(move |r| g.one(r.and_then(Reply::result).map(drop))),
            );
            if let Err(e) = sent {
                all.one(Err(e));
            }
            at += n;
        }
        all.one(Ok(()));
    }

    /// Sends a flush and returns without waiting (nothing is sent when the server says
    /// it has no volatile cache).
    pub fn start_flush(&self) -> Started<'_> {
        let pending = if self.info.has(FLAG_SEND_FLUSH) {
            vec![self.pipe().submit(CMD_FLUSH, 0, 0, 0, &[])]
        } else {
            Vec::new()
        };
        Started {
            client: self,
            pending,
            flush_after: false,
        }
    }

    /// Whether the server enforces the owner token of [`ClientOptions::fence`] (`None`:
    /// no token was declared).
    pub fn fence(&self) -> Option<crate::fence::FenceAnswer> {
        self.fence
    }

    /// (name, description) of every export at `addr`, via `NBD_OPT_LIST`, in plaintext.
    pub fn list_exports(addr: &Listen) -> Result<Vec<(String, String)>> {
        Client::list_exports_with(&ClientOptions::new(addr.clone(), ""))
    }

    /// What `NBD_OPT_INFO` says about export `name` at `addr`, in plaintext.
    pub fn query_info(addr: &Listen, name: &str) -> Result<ExportInfo> {
        Client::query_info_with(&ClientOptions::new(addr.clone(), name))
    }

    /// (name, description) of every export at `opts.addr`, via `NBD_OPT_LIST`, after
    /// STARTTLS when `opts.tls` asks for TLS (as [`Client::connect`] does: a server that
    /// does not offer it is an error, never plaintext).
    pub fn list_exports_with(opts: &ClientOptions) -> Result<Vec<(String, String)>> {
        let mut hs = Client::options_handshake(opts)?;
        let list = hs.list()?;
        hs.abort()?;
        Ok(list)
    }

    /// What `NBD_OPT_INFO` says about `opts.export`, after STARTTLS when `opts.tls` asks
    /// for TLS.
    pub fn query_info_with(opts: &ClientOptions) -> Result<ExportInfo> {
        let mut hs = Client::options_handshake(opts)?;
        let info = hs.info(&opts.export)?;
        hs.abort()?;
        Ok(info)
    }

    /// A handshake for options only (no transmission): TLS first when asked for.
    fn options_handshake(opts: &ClientOptions) -> Result<Handshake> {
        let timeout = opts.timeout.or(Some(Duration::from_secs(30)));
        let mut hs = Handshake::connect(&opts.addr, timeout)?;
        if let Some(tls) = &opts.tls {
            hs.starttls(tls)?;
        }
        Ok(hs)
    }

    pub fn info(&self) -> &ExportInfo {
        &self.info
    }
    pub fn size(&self) -> u64 {
        self.info.size
    }
    pub fn flags(&self) -> u16 {
        self.info.flags
    }
    /// (minimum, preferred, maximum) block sizes.
    pub fn block_sizes(&self) -> (u32, u32, u32) {
        (
            self.info.min_block,
            self.info.preferred_block,
            self.info.max_block,
        )
    }

    /// How many connections the client uses.
    pub fn connections(&self) -> usize {
        self.pipes.len()
    }

    /// The next connection, round robin.
    fn pipe(&self) -> &Pipeline {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.pipes.len();
        &self.pipes[i]
    }

    /// Sends one request and waits for its reply.
    fn call(
        &self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> Result<Reply> {
        self.pipe().call(kind, flags, offset, length, payload)
    }

    /// Soft disconnect of every connection.
    pub fn disconnect(self) -> Result<()> {
        let mut first_err = None;
        for p in self.pipes {
            if let Err(e) = p.disconnect() {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Largest length one request may carry, aligned down to the minimum block.
    fn chunk(&self, data: bool) -> u64 {
        let min = u64::from(self.info.min_block.max(1));
        let cap = if data {
            u64::from(self.info.max_block).min(u64::from(MAX_SAFE_PAYLOAD))
        } else {
            1 << 30
        };
        (cap - cap % min).max(min)
    }

    /// Calls `f(offset, len)` for pieces of at most `chunk` bytes.
    fn split(
        &self,
        offset: u64,
        len: u64,
        chunk: u64,
        mut f: impl FnMut(u64, u32) -> Result<()>,
    ) -> Result<()> {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(chunk);
            f(offset + done, u32::try_from(n).expect("chunk fits u32"))?;
            done += n;
        }
        Ok(())
    }
}

impl BlockDevice for Client {
    fn geometry(&self) -> Geometry {
        let (min, pref, max) = self.block_sizes();
        Geometry {
            size: self.info.size,
            logical_block_size: min.max(1),
            physical_block_size: pref.max(min).max(1),
            optimal_io_size: pref.max(min).max(1),
            max_io_size: max.max(min).max(1),
        }
    }

    fn capabilities(&self) -> Capabilities {
        let has = |f| self.info.has(f);
        Capabilities {
            read_only: has(FLAG_READ_ONLY),
            flush: if has(FLAG_SEND_FLUSH) {
                Support::Native
            } else {
                Support::None
            },
            fua: if has(FLAG_SEND_FUA) {
                Support::Native
            } else {
                Support::Emulate
            },
            discard: if has(FLAG_SEND_TRIM) {
                Support::Native
            } else {
                Support::None
            },
            write_zeroes: if has(FLAG_SEND_FAST_ZERO) {
                Support::Native
            } else {
                Support::Emulate
            },
            extents: self.base_allocation.is_some(),
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> cairn_block::Result<()> {
        // Every piece of a large read is in flight at once, spread over the connections.
        let chunk = usize::try_from(self.chunk(true)).expect("<= 32 MiB");
        let pending = buf
            .chunks(chunk)
            .enumerate()
            .map(|(i, piece)| {
                let len = len_u32(piece.len(), "read")?;
                self.pipe()
                    .submit(CMD_READ, 0, offset + (i * chunk) as u64, len, &[])
            })
            .collect::<Vec<_>>();
        for (piece, p) in buf.chunks_mut(chunk).zip(pending) {
            let r = p?.wait()?;
            if r.data.len() != piece.len() {
                return Err(Error::Protocol("READ reply has the wrong length".into()).into());
            }
            piece.copy_from_slice(&r.data);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> cairn_block::Result<()> {
        self.start_write(buf, offset, flags).wait()
    }

    fn write_then(&self, buf: &[u8], offset: u64, flags: WriteFlags, done: WriteDone) {
        Client::write_then(self, buf, offset, flags, done);
    }

    fn read_then(&self, len: usize, offset: u64, done: ReadDone) {
        Client::read_then(self, len, offset, done);
    }

    fn flush_then(&self, done: WriteDone) {
        Client::flush_then(self, done);
    }

    fn discard_then(&self, offset: u64, len: u64, done: WriteDone) {
        Client::discard_then(self, offset, len, done);
    }

    fn completes_later(&self) -> bool {
        true
    }

    fn flush(&self) -> cairn_block::Result<()> {
        self.start_flush().wait()
    }

    fn discard(&self, offset: u64, len: u64) -> cairn_block::Result<()> {
        if !self.info.has(FLAG_SEND_TRIM) {
            return Err(cairn_block::Error::new(
                ErrorKind::Unsupported,
                "remote NBD export: discard",
            ));
        }
        self.split(offset, len, self.chunk(false), |o, n| {
            self.call(CMD_TRIM, 0, o, n, &[]).map(drop)
        })?;
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> cairn_block::Result<()> {
        let fast = flags.contains(WriteFlags::FAST_ZERO);
        if !self.info.has(FLAG_SEND_WRITE_ZEROES) || (fast && !self.info.has(FLAG_SEND_FAST_ZERO)) {
            if fast {
                return Err(cairn_block::Error::new(
                    ErrorKind::Unsupported,
                    "remote NBD export: fast zero",
                ));
            }
            return cairn_block::write_zeroes_by_writing(self, offset, len, flags);
        }
        let mut f = 0;
        if flags.fua() {
            f |= CMD_FLAG_FUA;
        }
        if flags.contains(WriteFlags::NO_HOLE) {
            f |= CMD_FLAG_NO_HOLE;
        }
        if fast {
            f |= CMD_FLAG_FAST_ZERO;
        }
        self.split(offset, len, self.chunk(false), |o, n| {
            self.call(CMD_WRITE_ZEROES, f, o, n, &[]).map(drop)
        })?;
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> cairn_block::Result<Vec<Extent>> {
        if self.base_allocation.is_none() {
            return Ok(vec![Extent {
                offset,
                length: len,
                hole: false,
                zero: false,
            }]);
        }
        let ask = u32::try_from(len.min(self.chunk(false))).expect("<= 1 GiB");
        let r = self.call(CMD_BLOCK_STATUS, 0, offset, ask, &[])?;
        let mut descs = Vec::new();
        for (id, d) in r.block_status {
            if Some(id) != self.base_allocation {
                return Err(
                    Error::Protocol(format!("block status for unknown context {id}")).into(),
                );
            }
            descs.extend(d);
        }
        let mut out: Vec<Extent> = Vec::new();
        let mut pos = offset;
        let end = offset + len;
        for (n, flags) in descs {
            if pos >= end {
                break;
            }
            if n == 0 {
                return Err(Error::Protocol("zero-length block status descriptor".into()).into());
            }
            let n = u64::from(n).min(end - pos);
            out.push(Extent {
                offset: pos,
                length: n,
                hole: flags & STATE_HOLE != 0,
                zero: flags & STATE_ZERO != 0,
            });
            pos += n;
        }
        Ok(out)
    }

    fn cache(&self, offset: u64, len: u64) -> cairn_block::Result<()> {
        if !self.info.has(FLAG_SEND_CACHE) {
            return Ok(());
        }
        self.split(offset, len, self.chunk(false), |o, n| {
            self.call(CMD_CACHE, 0, o, n, &[]).map(drop)
        })?;
        Ok(())
    }
}
