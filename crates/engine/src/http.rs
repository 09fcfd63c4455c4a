//! A small, strict HTTP/1.1 server and client over Unix sockets and TCP, for the control
//! API and the metrics listener.
//!
//! ```text
//!   accept thread ─> one thread per connection (at most MAX_CONNECTIONS):
//!       read_request (caps, timeouts) ─> handler(&Request) -> Response ─> write, close
//! ```
//!
//! One request per connection (`Connection: close`): the clients are `cairn status`,
//! curl and Prometheus, none of which needs keep-alive, and it keeps the server simple.
//! Nothing from the wire is trusted: the header block is capped at 16 KiB, a body at
//! 1 MiB (a bigger Content-Length is refused before a byte of it is read), the whole
//! request must arrive within IO_TIMEOUT (sending a byte at a time does not extend it),
//! every write has a timeout, and every refusal is a 4xx with a JSON `{"error": "..."}`
//! naming the problem. When descriptors run out, accept pauses and says so once.
//!
//! The message heads, requests and responses alike, are parsed by `httparse` (hyper's
//! parser); what is written here is the transport around it and this API's own rules.
//! A whole server crate was weighed and left out: tiny_http 0.12 (the thread-based one)
//! reads a header line without a length cap, starts a thread for every connection without
//! a bound, has no per-request deadline, and its accept thread ends for good on the first
//! accept error (out of descriptors, which tests/interop/limits.sh provokes), so each of
//! the limits above would have to be rebuilt around it. hyper 1 was measured against this
//! server (`examples/http_hyper_bench.rs`, docs/BENCHMARKS.md): it answers a round trip
//! faster (p50 0.8x, the tail far shorter: this server starts a thread per connection)
//! and, with our own accept loop, survives running out of descriptors as this one does;
//! but a request head it cannot parse (garbage, a 20 KiB header, HTTP/2.0) it answers
//! itself with a bare 400/431 and no body, where this API's rule is a JSON `{"error"}`
//! naming the problem for every refusal; and it brings tokio (13 more crates, about
//! +300 KB stripped). So the server stays; a pool of connection threads would take its
//! tail latency. The client stays a few lines over `UnixStream`: ureq 3 reaches Unix
//! sockets only through its semver-exempt (`unversioned`) transport API.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

/// Longest request line plus headers.
pub const MAX_HEADER_BYTES: usize = 16 << 10;
/// Largest request body.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// Most header fields in one request.
pub const MAX_HEADERS: usize = 64;
/// Connections served at once; more get 503 at once.
pub const MAX_CONNECTIONS: usize = 32;
/// How long a client may take to send its whole request, and one write may wait.
pub const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest response body the client accepts.
const MAX_RESPONSE_BYTES: usize = 64 << 20;

/// A parsed request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The path, percent-decoded, without the query.
    pub path: String,
    /// The raw query string after `?`, if any.
    pub query: Option<String>,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The body as JSON of type `T`: 400 when it is not JSON, 422 when it is JSON of the
    /// wrong shape (naming the field serde complains about).
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> Result<T, Response> {
        let value: serde_json::Value = serde_json::from_slice(&self.body).map_err(|e| {
            Response::error(400, format!("the request body is not valid JSON: {e}"))
        })?;
        serde_json::from_value(value)
            .map_err(|e| Response::error(422, format!("the request body is not usable: {e}")))
    }

    /// The value of `name` in the query string (`?name=value&...`), if present.
    pub fn query_param(&self, name: &str) -> Option<String> {
        self.query.as_deref()?.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (k == name).then(|| percent_decode(v).unwrap_or_default())
        })
    }
}

/// A response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
    /// For 405: the methods the path allows.
    pub allow: Option<String>,
}

impl Response {
    /// `value` as pretty JSON with a trailing newline (curl output stays readable).
    pub fn json(status: u16, value: &impl Serialize) -> Response {
        let mut body = serde_json::to_vec_pretty(value)
            .unwrap_or_else(|e| format!("{{\"error\":\"cannot encode the answer: {e}\"}}").into());
        body.push(b'\n');
        Response {
            status,
            content_type: "application/json",
            body,
            allow: None,
        }
    }

    /// `{"error": message}` with `status`.
    pub fn error(status: u16, message: impl Into<String>) -> Response {
        Response::json(status, &serde_json::json!({ "error": message.into() }))
    }

    /// 405 naming the methods `path` allows.
    pub fn method_not_allowed(method: &str, path: &str, allow: &[&str]) -> Response {
        let mut r = Response::error(
            405,
            format!(
                "{method} is not allowed on {path}; use {}",
                allow.join(" or ")
            ),
        );
        r.allow = Some(allow.join(", "));
        r
    }

    pub fn text(status: u16, content_type: &'static str, body: String) -> Response {
        Response {
            status,
            content_type,
            body: body.into_bytes(),
            allow: None,
        }
    }

    fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut head = format!(
            "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            reason(self.status),
            self.content_type,
            self.body.len()
        );
        if let Some(a) = &self.allow {
            head.push_str(&format!("Allow: {a}\r\n"));
        }
        head.push_str("\r\n");
        w.write_all(head.as_bytes())?;
        w.write_all(&self.body)?;
        w.flush()
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        411 => "Length Required",
        413 => "Content Too Large",
        422 => "Unprocessable Content",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Unknown",
    }
}

fn bad(msg: impl Into<String>) -> Response {
    Response::error(400, msg)
}

/// Why a message head could not be read.
enum HeadError {
    /// The stream ended before any byte.
    Empty,
    /// The stream ended before the blank line after the headers.
    Ended,
    /// More than MAX_HEADER_BYTES before the blank line.
    TooLong,
    Io(io::Error),
}

/// Reads a message head (start line and headers, through the blank line) of at most
/// MAX_HEADER_BYTES and parses it with `parse`, which returns the head's length once the
/// bytes hold a whole head. Returns the bytes read, which may run past the head into the
/// body (the stream serves this one message only), and the head's length.
fn read_head(
    r: &mut impl BufRead,
    mut parse: impl FnMut(&[u8]) -> Result<httparse::Status<usize>, httparse::Error>,
) -> Result<Result<(Vec<u8>, usize), httparse::Error>, HeadError> {
    let mut buf: Vec<u8> = Vec::new();
    // Where to look for a blank line next: a head is parsed only when one may have come.
    let mut scan = 0;
    loop {
        let chunk = r.fill_buf().map_err(HeadError::Io)?;
        if chunk.is_empty() {
            return Err(if buf.is_empty() {
                HeadError::Empty
            } else {
                HeadError::Ended
            });
        }
        let take = chunk.len().min(MAX_HEADER_BYTES + 1 - buf.len());
        buf.extend_from_slice(&chunk[..take]);
        r.consume(take);
        let blank = buf[scan..].windows(2).any(|w| w == b"\n\n" || w == b"\n\r");
        scan = buf.len().saturating_sub(2);
        if blank {
            match parse(&buf) {
                Ok(httparse::Status::Complete(n)) if n <= MAX_HEADER_BYTES => {
                    return Ok(Ok((buf, n)))
                }
                Ok(httparse::Status::Complete(_)) => return Err(HeadError::TooLong),
                Ok(httparse::Status::Partial) => {}
                Err(e) => return Ok(Err(e)),
            }
        }
        if buf.len() > MAX_HEADER_BYTES {
            return Err(HeadError::TooLong);
        }
    }
}

fn io_error(e: io::Error) -> Response {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Response::error(
            408,
            format!("the request was not sent within {} s", IO_TIMEOUT.as_secs()),
        ),
        _ => bad(format!("reading the request: {e}")),
    }
}

/// Decodes `%XX` escapes; `None` for a bad escape or a result that is not UTF-8.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Reads and checks one request. The error is the response to send.
///
/// httparse splits the head (and refuses what RFC 9112 does not allow: folded or nameless
/// headers, controls in the path, versions other than 1.0 and 1.1); the checks this API
/// adds on top (upper-case methods, absolute paths, %-escapes, the body's length) follow.
pub fn read_request(r: &mut impl BufRead) -> Result<Request, Response> {
    let (raw, head_len) = match read_head(r, |b| {
        httparse::Request::new(&mut [httparse::EMPTY_HEADER; MAX_HEADERS]).parse(b)
    }) {
        Ok(Ok(read)) => read,
        Ok(Err(httparse::Error::TooManyHeaders)) => {
            return Err(Response::error(
                431,
                format!("more than {MAX_HEADERS} header fields"),
            ))
        }
        Ok(Err(httparse::Error::Version)) => {
            return Err(bad("the request is not HTTP/1.1 or HTTP/1.0"))
        }
        Ok(Err(e)) => {
            return Err(bad(format!(
                "the request line or headers are malformed ({e})"
            )))
        }
        Err(HeadError::Empty) => return Err(bad("empty request")),
        Err(HeadError::Ended) => {
            return Err(bad(
                "the request ended before the blank line after the headers",
            ))
        }
        Err(HeadError::TooLong) => {
            return Err(Response::error(
                431,
                format!("the request line and headers are longer than {MAX_HEADER_BYTES} bytes"),
            ))
        }
        Err(HeadError::Io(e)) => return Err(io_error(e)),
    };
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut slots);
    // The same bytes parsed the same way a moment ago.
    if !matches!(req.parse(&raw), Ok(httparse::Status::Complete(_))) {
        return Err(bad("the request could not be parsed"));
    }
    let (Some(method), Some(target)) = (req.method, req.path) else {
        return Err(bad("the request line is not METHOD PATH HTTP/1.1"));
    };
    if !(1..=16).contains(&method.len()) || !method.bytes().all(|b| b.is_ascii_uppercase()) {
        return Err(bad(format!("{:?} is not an HTTP method", truncate(method))));
    }
    if !target.starts_with('/') || !target.bytes().all(|b| (0x21..0x7f).contains(&b)) {
        return Err(bad(format!(
            "the path {:?} must start with / and be printable ASCII",
            truncate(target)
        )));
    }
    let (raw_path, query) = match target.split_once('?') {
        Some((p, q)) => (p, Some(q.to_string())),
        None => (target, None),
    };
    let path = percent_decode(raw_path).ok_or_else(|| {
        bad(format!(
            "the path {:?} has a bad %-escape",
            truncate(raw_path)
        ))
    })?;
    let mut headers: Vec<(String, String)> = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value)
            .map_err(|_| bad(format!("the header {:?} is not UTF-8", truncate(h.name))))?;
        headers.push((h.name.to_ascii_lowercase(), value.trim().to_string()));
    }
    let method = method.to_string();

    if headers.iter().any(|(k, _)| k == "transfer-encoding") {
        return Err(Response::error(
            411,
            "Transfer-Encoding is not accepted; send the body with a Content-Length",
        ));
    }
    let mut length: Option<u64> = None;
    for (_, v) in headers.iter().filter(|(k, _)| k == "content-length") {
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!(
                "Content-Length {:?} is not a number",
                truncate(v)
            )));
        }
        let n: u64 = v.parse().map_err(|_| {
            Response::error(
                413,
                format!(
                    "a Content-Length of {} is more than the {MAX_BODY_BYTES} bytes accepted",
                    truncate(v)
                ),
            )
        })?;
        if length.is_some_and(|l| l != n) {
            return Err(bad("two different Content-Length headers"));
        }
        length = Some(n);
    }
    // Only POST carries a body in this API; other methods without a length have none
    // (and reach the router, which answers 405 where they do not belong).
    let needs_body = method == "POST";
    let length = match length {
        Some(n) => n,
        None if needs_body => {
            return Err(Response::error(
                411,
                format!("{method} needs a Content-Length header"),
            ))
        }
        None => 0,
    };
    if length > MAX_BODY_BYTES as u64 {
        return Err(Response::error(
            413,
            format!("a body of {length} bytes is more than the {MAX_BODY_BYTES} accepted"),
        ));
    }
    let length_usize = usize::try_from(length).unwrap_or(0);
    // What came with the head is the body's start; anything past its length is ignored.
    let mut body = raw;
    body.drain(..head_len);
    body.truncate(length_usize);
    let have = body.len();
    body.resize(length_usize, 0);
    r.read_exact(&mut body[have..])
        .map_err(|e| match e.kind() {
            io::ErrorKind::UnexpectedEof => bad(format!(
                "the body ended before its Content-Length of {length} bytes"
            )),
            _ => io_error(e),
        })?;
    Ok(Request {
        method,
        path,
        query,
        headers,
        body,
    })
}

fn truncate(s: &str) -> String {
    s.chars().take(80).collect()
}

/// What handles requests: called on the connection's thread.
pub type Handler = Arc<dyn Fn(&Request) -> Response + Send + Sync>;

/// A bound listening socket.
#[derive(Debug)]
pub enum Listener {
    Unix(UnixListener, PathBuf),
    Tcp(TcpListener),
}

impl Listener {
    /// `unix:PATH` or `tcp:ADDR:PORT` as bound (a port 0 shows the real port).
    pub fn address(&self) -> String {
        match self {
            Listener::Unix(_, p) => format!("unix:{}", p.display()),
            Listener::Tcp(t) => t
                .local_addr()
                .map(|a| format!("tcp:{a}"))
                .unwrap_or_else(|_| "tcp:?".into()),
        }
    }
}

/// Binds a Unix socket at `path` with permissions `mode`. An existing socket that answers
/// is another live server: refused with `AddrInUse`. A stale one is removed.
pub fn bind_unix(path: &Path, mode: u32) -> io::Result<Listener> {
    let l = cairn_block::sock::bind_unix(path, mode)?;
    Ok(Listener::Unix(l, path.to_path_buf()))
}

pub fn bind_tcp(addr: SocketAddr) -> io::Result<Listener> {
    TcpListener::bind(addr).map(Listener::Tcp)
}

/// Serves `listener` on a thread of its own, one thread per connection, until the process
/// ends.
pub fn spawn(listener: Listener, name: &str, handler: Handler) -> io::Result<()> {
    let live = Arc::new(AtomicUsize::new(0));
    let name = name.to_string();
    thread::Builder::new()
        .name(format!("{name}-accept"))
        .spawn(move || {
            // Logged once when accept starts failing, not every 100 ms while it does.
            let mut failing = false;
            loop {
                let accepted: io::Result<Box<dyn Stream>> = match &listener {
                    Listener::Unix(l, _) => l.accept().map(|(s, _)| Box::new(s) as Box<dyn Stream>),
                    Listener::Tcp(l) => l.accept().map(|(s, _)| Box::new(s) as Box<dyn Stream>),
                };
                let stream = match accepted {
                    Ok(s) => {
                        if failing {
                            failing = false;
                            tracing::info!("{name}: accepting connections again");
                        }
                        s
                    }
                    Err(e) => {
                        if !failing {
                            failing = true;
                            tracing::warn!("{name}: accept: {e}; retrying every 100 ms");
                        }
                        thread::sleep(Duration::from_millis(100));
                        continue;
                    }
                };
                let live = live.clone();
                let handler = handler.clone();
                if live.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
                    live.fetch_sub(1, Ordering::SeqCst);
                    let mut s = stream;
                    let _ = s.set_timeouts();
                    let _ =
                        Response::error(503, "too many connections; try again").write_to(&mut s);
                    continue;
                }
                let spawned =
                    thread::Builder::new()
                        .name(format!("{name}-conn"))
                        .spawn(move || {
                            serve_one(stream, &handler);
                            live.fetch_sub(1, Ordering::SeqCst);
                        });
                if let Err(e) = spawned {
                    tracing::warn!("{name}: cannot start a connection thread: {e}");
                }
            }
        })?;
    Ok(())
}

trait Stream: Read + Write + Send {
    fn set_timeouts(&self) -> io::Result<()>;
    fn set_read_timeout_to(&self, t: Duration) -> io::Result<()>;
    fn try_clone_box(&self) -> io::Result<Box<dyn Stream>>;
}

impl Stream for UnixStream {
    fn set_timeouts(&self) -> io::Result<()> {
        self.set_read_timeout(Some(IO_TIMEOUT))?;
        self.set_write_timeout(Some(IO_TIMEOUT))
    }
    fn set_read_timeout_to(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))
    }
    fn try_clone_box(&self) -> io::Result<Box<dyn Stream>> {
        Ok(Box::new(self.try_clone()?))
    }
}

impl Stream for TcpStream {
    fn set_timeouts(&self) -> io::Result<()> {
        self.set_read_timeout(Some(IO_TIMEOUT))?;
        self.set_write_timeout(Some(IO_TIMEOUT))
    }
    fn set_read_timeout_to(&self, t: Duration) -> io::Result<()> {
        self.set_read_timeout(Some(t))
    }
    fn try_clone_box(&self) -> io::Result<Box<dyn Stream>> {
        Ok(Box::new(self.try_clone()?))
    }
}

fn serve_one(stream: Box<dyn Stream>, handler: &Handler) {
    if stream.set_timeouts().is_err() {
        return;
    }
    let Ok(mut writer) = stream.try_clone_box() else {
        return;
    };
    let mut reader = BufReader::new(Deadline {
        stream,
        at: Instant::now() + IO_TIMEOUT,
    });
    let response = match read_request(&mut reader) {
        Ok(req) => {
            let resp = handler(&req);
            tracing::debug!("{} {} -> {}", req.method, req.path, resp.status);
            resp
        }
        Err(resp) => {
            tracing::debug!("bad request -> {}", resp.status);
            resp
        }
    };
    let _ = response.write_to(&mut writer);
}

/// A stream whose reads all end by one deadline: each read waits only for the time left,
/// so a client sending a byte now and then cannot hold a connection for ever.
struct Deadline {
    stream: Box<dyn Stream>,
    at: Instant,
}

impl Read for Deadline {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout_to(left)?;
        self.stream.read(buf)
    }
}

/// Sends one request over a connected stream and reads the answer: (status, body).
fn exchange(
    mut stream: impl Read + Write,
    method: &str,
    target: &str,
    body: Option<&[u8]>,
) -> io::Result<(u16, Vec<u8>)> {
    let mut head = format!("{method} {target} HTTP/1.1\r\nHost: cairn\r\nConnection: close\r\n");
    if let Some(b) = body {
        head.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    } else if matches!(method, "POST" | "PUT" | "PATCH") {
        head.push_str("Content-Length: 0\r\n");
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes())?;
    if let Some(b) = body {
        stream.write_all(b)?;
    }
    stream.flush()?;
    let mut r = BufReader::new(stream);
    let invalid = |m: &str| io::Error::new(io::ErrorKind::InvalidData, m.to_string());
    let (raw, head_len) = match read_head(&mut r, |b| {
        httparse::Response::new(&mut [httparse::EMPTY_HEADER; MAX_HEADERS]).parse(b)
    }) {
        Ok(Ok(read)) => read,
        Ok(Err(e)) => return Err(invalid(&format!("a malformed response head ({e})"))),
        Err(HeadError::Empty) => {
            return Err(invalid(
                "the server closed the connection without answering",
            ))
        }
        Err(HeadError::Ended) => return Err(invalid("the response ended inside the headers")),
        Err(HeadError::TooLong) => return Err(invalid("the response headers are too long")),
        Err(HeadError::Io(e)) => return Err(e),
    };
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut slots);
    if !matches!(resp.parse(&raw), Ok(httparse::Status::Complete(_))) {
        return Err(invalid("a malformed response head"));
    }
    let status = resp.code.ok_or_else(|| invalid("bad status line"))?;
    let length: Option<usize> = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok());
    // The body's start came with the head.
    let mut start = raw;
    start.drain(..head_len);
    let mut body = start;
    match length {
        Some(n) if n <= MAX_RESPONSE_BYTES => {
            body.truncate(n);
            let have = body.len();
            body.resize(n, 0);
            r.read_exact(&mut body[have..])?;
        }
        Some(_) => return Err(invalid("the response is too large")),
        None => {
            let room = MAX_RESPONSE_BYTES.saturating_sub(body.len());
            r.take(room as u64).read_to_end(&mut body)?;
        }
    }
    Ok((status, body))
}

/// One request to a server on a Unix socket.
pub fn unix_request(
    path: &Path,
    method: &str,
    target: &str,
    body: Option<&[u8]>,
) -> io::Result<(u16, Vec<u8>)> {
    let s = UnixStream::connect(path)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    exchange(s, method, target, body)
}

/// One request to a server on TCP.
pub fn tcp_request(
    addr: SocketAddr,
    method: &str,
    target: &str,
    body: Option<&[u8]>,
) -> io::Result<(u16, Vec<u8>)> {
    let s = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    exchange(s, method, target, body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::io::Cursor;
    use std::os::unix::fs::PermissionsExt;

    fn parse(raw: &[u8]) -> Result<Request, Response> {
        read_request(&mut BufReader::new(Cursor::new(raw.to_vec())))
    }

    fn status_of(raw: &[u8]) -> u16 {
        match parse(raw) {
            Ok(_) => 200,
            Err(r) => r.status,
        }
    }

    #[test]
    fn parses_a_good_request() {
        let r = parse(
            b"POST /v1/exports%2Fx?watch=1&a=b%20c HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n{\"a\":1}",
        )
        .unwrap();
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/v1/exports/x");
        assert_eq!(r.query_param("a").as_deref(), Some("b c"));
        assert_eq!(r.header("content-length"), Some("7"));
        assert_eq!(r.body, b"{\"a\":1}");
        // Bare LF line ends are accepted; GET needs no length.
        let r = parse(b"GET / HTTP/1.0\nHost: x\n\n").unwrap();
        assert_eq!((r.method.as_str(), r.body.len()), ("GET", 0));
    }

    /// A request arriving a byte at a time is read the same as in one piece, with
    /// nothing of the body lost or read twice; the same for a response.
    #[test]
    fn heads_and_bodies_split_anywhere() {
        struct Trickle(Cursor<Vec<u8>>);
        impl Read for Trickle {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(1);
                self.0.read(&mut buf[..n])
            }
        }
        for raw in [
            &b"POST /a?b=c HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\n\r\n{\"a\":1}"[..],
            b"POST /a?b=c HTTP/1.1\nContent-Length: 7\n\n{\"a\":1}trailing",
        ] {
            let whole = parse(raw).unwrap();
            for cap in [1, 2, 3, 7, 64] {
                let mut r = BufReader::with_capacity(cap, Trickle(Cursor::new(raw.to_vec())));
                assert_eq!(read_request(&mut r).unwrap(), whole, "capacity {cap}");
            }
            assert_eq!(whole.body, b"{\"a\":1}");
        }
        struct Duplex(Cursor<Vec<u8>>);
        impl Read for Duplex {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = buf.len().min(3);
                self.0.read(&mut buf[..n])
            }
        }
        impl Write for Duplex {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let answer = |raw: &[u8]| exchange(Duplex(Cursor::new(raw.to_vec())), "GET", "/", None);
        let (st, body) =
            answer(b"HTTP/1.1 409 Conflict\r\nContent-Length: 5\r\n\r\nbusy!extra").unwrap();
        assert_eq!((st, body.as_slice()), (409, &b"busy!"[..]));
        let (st, body) = answer(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end").unwrap();
        assert_eq!((st, body.as_slice()), (200, &b"to the end"[..]));
        assert!(answer(b"").is_err());
        assert!(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nshort").is_err());
        assert!(answer(b"garbage\r\n\r\n").is_err());
    }

    #[test]
    fn malformed_requests_get_the_right_4xx() {
        let big = format!(
            "GET /{} HTTP/1.1\r\n\r\n",
            "a".repeat(MAX_HEADER_BYTES + 10)
        );
        let many = format!(
            "GET / HTTP/1.1\r\n{}\r\n",
            "X-A: 1\r\n".repeat(MAX_HEADERS + 1)
        );
        let table: Vec<(&[u8], u16)> = vec![
            (b"", 400),
            (b"\r\n\r\n", 400),
            (b"GET\r\n\r\n", 400),
            (b"GET /\r\n\r\n", 400),
            (b"GET / HTTP/1.1", 400),
            (b"GET / HTTP/1.1\r\n", 400),
            (b"GET / HTTP/2.0\r\n\r\n", 400),
            (b"get / HTTP/1.1\r\n\r\n", 400),
            (b"GET  / HTTP/1.1\r\n\r\n", 400),
            (b"GET / HTTP/1.1 extra\r\n\r\n", 400),
            (b"GET relative HTTP/1.1\r\n\r\n", 400),
            (b"GET /a\x01b HTTP/1.1\r\n\r\n", 400),
            (b"GET /%zz HTTP/1.1\r\n\r\n", 400),
            (b"GET /%ff HTTP/1.1\r\n\r\n", 400),
            (b"GET /\xff HTTP/1.1\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nA: b\r\n folded\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\n\r\n", 411),
            (
                b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
                411,
            ),
            (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nContent-Length: 1e3\r\n\r\n", 400),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n",
                413,
            ),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 18446744073709551615\r\n\r\n",
                413,
            ),
            (b"POST / HTTP/1.1\r\nContent-Length: 1048577\r\n\r\n", 413),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc",
                400,
            ),
            (b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nshort", 400),
            (big.as_bytes(), 431),
            (many.as_bytes(), 431),
            (
                b"POST / HTTP/1.1\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab",
                200,
            ),
        ];
        for (raw, want) in table {
            assert_eq!(
                status_of(raw),
                want,
                "{:?}",
                String::from_utf8_lossy(&raw[..raw.len().min(100)])
            );
            if let Err(r) = parse(raw) {
                let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
                assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()));
            }
        }
    }

    #[test]
    fn json_bodies_400_for_syntax_422_for_shape() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Want {
            name: String,
        }
        let req = |b: &[u8]| Request {
            method: "POST".into(),
            path: "/".into(),
            query: None,
            headers: vec![],
            body: b.to_vec(),
        };
        assert_eq!(req(b"{bad").json::<Want>().unwrap_err().status, 400);
        let e = req(b"{\"name\": 3}").json::<Want>().unwrap_err();
        assert_eq!(e.status, 422);
        assert!(String::from_utf8_lossy(&e.body).contains("invalid type"));
        assert!(req(b"{\"name\": \"x\"}").json::<Want>().is_ok());
    }

    /// Random mutations of good requests: never a panic, always a request or a 4xx.
    #[test]
    fn fuzzed_requests_never_panic() {
        let seeds: [&[u8]; 3] = [
            b"POST /v1/exports HTTP/1.1\r\nHost: x\r\nContent-Length: 13\r\n\r\n{\"name\":\"a\"}\n",
            b"GET /v1/status?x=%41 HTTP/1.1\r\nHost: x\r\n\r\n",
            b"DELETE /v1/exports/a HTTP/1.0\r\n\r\n",
        ];
        let mut rng = rand::rngs::SmallRng::seed_from_u64(6);
        for i in 0..20_000 {
            let mut raw = seeds[i % seeds.len()].to_vec();
            for _ in 0..rng.gen_range(1..6) {
                let pos = rng.gen_range(0..=raw.len());
                match rng.gen_range(0..4) {
                    0 if pos < raw.len() => raw[pos] = rng.gen(),
                    1 => raw.insert(pos, rng.gen()),
                    2 if pos < raw.len() => {
                        raw.remove(pos);
                    }
                    _ => raw.truncate(pos),
                }
            }
            if let Err(r) = parse(&raw) {
                assert!((400..500).contains(&r.status), "{} for {raw:?}", r.status);
            }
        }
    }

    #[test]
    fn serves_and_answers_over_a_unix_socket() {
        let dir = std::env::temp_dir().join(format!("cairn-http-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let l = bind_unix(&path, 0o600).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let handler: Handler = Arc::new(|r: &Request| {
            if r.method != "GET" {
                return Response::method_not_allowed(&r.method, &r.path, &["GET"]);
            }
            Response::json(200, &serde_json::json!({ "path": r.path }))
        });
        spawn(l, "test", handler).unwrap();
        // A second server on the same live socket is refused.
        let again = bind_unix(&path, 0o600).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AddrInUse);
        let (st, body) = unix_request(&path, "GET", "/hello", None).unwrap();
        assert_eq!(st, 200);
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["path"], "/hello");
        let (st, _) = unix_request(&path, "POST", "/hello", Some(b"{}")).unwrap();
        assert_eq!(st, 405);
        // Garbage straight on the socket: a 400, and the server lives on.
        let mut s = UnixStream::connect(&path).unwrap();
        s.write_all(b"\x00\x01garbage\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 400"), "{out}");
        assert_eq!(unix_request(&path, "GET", "/", None).unwrap().0, 200);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_stale_socket_is_replaced() {
        let _one = crate::FORKING_TESTS
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let dir = std::env::temp_dir().join(format!("cairn-http-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        assert!(bind_unix(&path, 0o600).is_ok());
        std::fs::write(dir.join("file"), b"x").unwrap();
        assert_eq!(
            bind_unix(&dir.join("file"), 0o600).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
