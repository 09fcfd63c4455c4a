//! A small client for etcd v3's JSON gateway over plain HTTP: the handful of calls the
//! ownership lease needs (`/v3/lease/grant|keepalive|revoke`, `/v3/kv/txn`, `/v3/kv/range`).
//!
//! One request per connection (`Connection: close`), a deadline on every socket call,
//! bodies capped. An [`Etcd`] may name several members (`http://A:2379,http://B:2379`):
//! a request goes to the member that answered last, and to the next one in the list when
//! that one cannot be reached (no connection). A request is never sent twice: once it
//! went out, its failure is the caller's, and only the next request starts at the next
//! member. Keys and values are base64 on the wire; 64-bit numbers are JSON strings
//! (the gateway's proto3 mapping), and a false or zero field is left out of an answer.
//! No crate: ureq would pull a TLS stack in for four POSTs, and etcd's gRPC client needs
//! an async runtime the rest of cairn does not use.

use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};

/// Largest answer read.
const MAX_RESPONSE: u64 = 1 << 20;

/// Why an etcd call failed.
#[derive(Debug)]
pub enum EtcdError {
    /// The URL is not `http://HOST:PORT`.
    Url(String),
    /// Connecting, sending or reading failed (etcd down, partitioned, slow).
    Io(String),
    /// etcd answered with an error, or with something this client does not understand.
    Server(String),
    /// The member answered that it cannot serve now (HTTP 503: no leader, no quorum,
    /// stopping). Another member may.
    Unavailable(String),
}

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtcdError::Url(m) => write!(f, "etcd URL: {m}"),
            EtcdError::Io(m) => write!(f, "etcd: {m}"),
            EtcdError::Server(m) | EtcdError::Unavailable(m) => write!(f, "etcd answered: {m}"),
        }
    }
}

impl std::error::Error for EtcdError {}

pub type Result<T> = std::result::Result<T, EtcdError>;

/// A key's value and who holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

/// What a create-if-absent transaction decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Created {
    /// The key was absent and is now ours, at this revision.
    Created { revision: i64 },
    /// The key exists: its current value and holder.
    Exists(KeyValue),
}

/// An etcd cluster, as one or more members' client endpoints.
#[derive(Debug, Clone)]
pub struct Etcd {
    /// `HOST:PORT` of each member, in the order given.
    authorities: Arc<[String]>,
    /// The member requests go to first: the last that took one. Shared by the clones
    /// (a lease's keepalive client is one), so all move on together.
    current: Arc<AtomicUsize>,
    timeout: Duration,
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn unb64(v: &Value) -> Result<Vec<u8>> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::String(s) => base64::engine::general_purpose::STANDARD
            .decode(s)
            .map_err(|e| EtcdError::Server(format!("bad base64: {e}"))),
        other => Err(EtcdError::Server(format!("expected base64, got {other}"))),
    }
}

/// A proto3 int64: a JSON string, or absent for 0.
fn int(v: &Value) -> Result<i64> {
    match v {
        Value::Null => Ok(0),
        Value::String(s) => s
            .parse()
            .map_err(|_| EtcdError::Server(format!("bad integer {s:?}"))),
        Value::Number(n) => n
            .as_i64()
            .ok_or_else(|| EtcdError::Server(format!("bad integer {n}"))),
        other => Err(EtcdError::Server(format!(
            "expected an integer, got {other}"
        ))),
    }
}

impl Etcd {
    /// `http://HOST:PORT` (a trailing `/` is allowed), or several of them separated by
    /// commas: the members of one cluster. TLS endpoints are not supported.
    pub fn new(urls: &str) -> Result<Etcd> {
        let mut authorities = Vec::new();
        for url in urls.split(',').map(str::trim) {
            if url.is_empty() {
                return Err(EtcdError::Url(format!(
                    "{urls:?}: an empty endpoint in the list"
                )));
            }
            let rest = url.strip_prefix("http://").ok_or_else(|| {
                EtcdError::Url(format!(
                    "{url:?}: expected http://HOST:PORT (https is not supported)"
                ))
            })?;
            let authority = rest.trim_end_matches('/');
            if authority.is_empty() || authority.contains('/') || !authority.contains(':') {
                return Err(EtcdError::Url(format!(
                    "{url:?}: expected http://HOST:PORT"
                )));
            }
            if !authorities.iter().any(|a| a == authority) {
                authorities.push(authority.to_string());
            }
        }
        Ok(Etcd {
            authorities: authorities.into(),
            current: Arc::new(AtomicUsize::new(0)),
            timeout: Duration::from_secs(5),
        })
    }

    /// Deadline of each socket operation (default 5 s). A lease's keepalive uses a
    /// shorter one so that a slow etcd is noticed before the lease runs out.
    pub fn with_timeout(mut self, t: Duration) -> Etcd {
        self.timeout = t.max(Duration::from_millis(10));
        self
    }

    /// Every endpoint, comma-separated, as given.
    pub fn url(&self) -> String {
        self.authorities
            .iter()
            .map(|a| format!("http://{a}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The endpoint the next request goes to first.
    pub fn current_url(&self) -> String {
        let n = self.authorities.len();
        format!(
            "http://{}",
            self.authorities[self.current.load(Ordering::Relaxed) % n]
        )
    }

    /// A connection to the first member that takes one, starting at the current member.
    fn connect(&self) -> Result<(usize, TcpStream)> {
        let n = self.authorities.len();
        let first = self.current.load(Ordering::Relaxed) % n;
        let mut failed = Vec::new();
        for i in (0..n).map(|k| (first + k) % n) {
            let authority = &self.authorities[i];
            let addr = match authority.to_socket_addrs().map(|mut a| a.next()) {
                Ok(Some(a)) => a,
                Ok(None) => {
                    failed.push(format!("http://{authority}: no address"));
                    continue;
                }
                Err(e) => {
                    failed.push(format!("http://{authority} resolve: {e}"));
                    continue;
                }
            };
            match TcpStream::connect_timeout(&addr, self.timeout) {
                Ok(s) => {
                    if i != first {
                        tracing::info!(
                            "etcd: now talking to http://{authority} ({})",
                            failed.join("; ")
                        );
                        self.current.store(i, Ordering::Relaxed);
                    }
                    return Ok((i, s));
                }
                Err(e) => failed.push(format!("http://{authority} connect: {e}")),
            }
        }
        Err(EtcdError::Io(failed.join("; ")))
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let (i, s) = self.connect()?;
        let r = self.exchange(&self.authorities[i], s, path, body);
        if matches!(r, Err(EtcdError::Io(_) | EtcdError::Unavailable(_)))
            && self.authorities.len() > 1
        {
            // The member took the connection but not the request (cut off, stopped, no
            // quorum and too slow to say so), or said it cannot serve (503): the next
            // request tries the next member. This one is not sent again: it may have
            // been applied.
            let _ = self.current.compare_exchange(
                i,
                (i + 1) % self.authorities.len(),
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
        r
    }

    fn exchange(
        &self,
        authority: &str,
        mut s: TcpStream,
        path: &str,
        body: &Value,
    ) -> Result<Value> {
        let io = |what: &str, e: std::io::Error| {
            EtcdError::Io(format!("http://{authority} {what}: {e}"))
        };
        s.set_read_timeout(Some(self.timeout))
            .map_err(|e| io("socket", e))?;
        s.set_write_timeout(Some(self.timeout))
            .map_err(|e| io("socket", e))?;
        let _ = s.set_nodelay(true);
        let body = body.to_string();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            authority,
            body.len()
        );
        s.write_all(req.as_bytes()).map_err(|e| io("send", e))?;
        let mut resp = Vec::new();
        s.take(MAX_RESPONSE)
            .read_to_end(&mut resp)
            .map_err(|e| io("read", e))?;
        if resp.is_empty() {
            return Err(EtcdError::Io(format!(
                "http://{authority}: the connection closed without an answer"
            )));
        }
        let (status, chunked, body) = split_response(&resp)?;
        let body = if chunked {
            dechunk(body)?
        } else {
            body.to_vec()
        };
        let v: Value = serde_json::from_slice(&body).map_err(|e| {
            EtcdError::Server(format!(
                "HTTP {status}: not JSON ({e}): {}",
                String::from_utf8_lossy(&body)
            ))
        })?;
        if status != 200 {
            let msg = v
                .get("message")
                .or_else(|| v.get("error"))
                .and_then(Value::as_str)
                .unwrap_or("no message");
            let m = format!("HTTP {status} on {path}: {msg}");
            return Err(if status == 503 {
                EtcdError::Unavailable(m)
            } else {
                EtcdError::Server(m)
            });
        }
        if let Some(e) = v.get("error") {
            return Err(EtcdError::Server(format!("{path}: {e}")));
        }
        Ok(v)
    }

    /// Grants a lease of `ttl` seconds: (lease id, granted TTL).
    pub fn grant(&self, ttl: u64) -> Result<(i64, u64)> {
        let v = self.post("/v3/lease/grant", &json!({ "TTL": ttl.to_string() }))?;
        let id = int(&v["ID"])?;
        let granted = u64::try_from(int(&v["TTL"])?).unwrap_or(0);
        if id == 0 || granted == 0 {
            return Err(EtcdError::Server(format!(
                "lease grant gave id {id}, TTL {granted}"
            )));
        }
        Ok((id, granted))
    }

    /// Refreshes a lease: its TTL in seconds, 0 when it has already expired.
    pub fn keepalive(&self, id: i64) -> Result<u64> {
        let v = self.post("/v3/lease/keepalive", &json!({ "ID": id.to_string() }))?;
        let r = v.get("result").unwrap_or(&v);
        Ok(u64::try_from(int(&r["TTL"])?).unwrap_or(0))
    }

    /// Ends a lease; its keys are deleted. A lease already gone is not an error.
    pub fn revoke(&self, id: i64) -> Result<()> {
        match self.post("/v3/lease/revoke", &json!({ "ID": id.to_string() })) {
            Err(EtcdError::Server(m)) if m.contains("lease not found") => Ok(()),
            r => r.map(|_| ()),
        }
    }

    /// Creates `key` = `value` attached to `lease` only if the key does not exist
    /// (compare create_revision == 0). The only way ownership is decided.
    pub fn create_if_absent(&self, key: &[u8], value: &[u8], lease: i64) -> Result<Created> {
        self.create_if_absent_with(key, value, lease, &[])
    }

    /// [`Etcd::create_if_absent`], in the same transaction also requiring every key of
    /// `also_absent` not to exist (a replica marked outdated may not take the primary
    /// role). A failure because only one of those exists reports `key` as held by
    /// nobody (`create_revision` 0).
    pub fn create_if_absent_with(
        &self,
        key: &[u8],
        value: &[u8],
        lease: i64,
        also_absent: &[&[u8]],
    ) -> Result<Created> {
        let k = b64(key);
        let mut compare =
            vec![json!({"key": k, "result": "EQUAL", "target": "CREATE", "create_revision": "0"})];
        for other in also_absent {
            compare.push(json!({"key": b64(other), "result": "EQUAL", "target": "CREATE", "create_revision": "0"}));
        }
        let body = json!({
            "compare": compare,
            "success": [{"request_put": {"key": k, "value": b64(value), "lease": lease.to_string()}}],
            "failure": [{"request_range": {"key": k}}],
        });
        let v = self.post("/v3/kv/txn", &body)?;
        let revision = int(&v["header"]["revision"])?;
        if v["succeeded"].as_bool() == Some(true) {
            return Ok(Created::Created { revision });
        }
        let kvs = &v["responses"][0]["response_range"]["kvs"];
        match kvs.get(0) {
            Some(kv) => Ok(Created::Exists(key_value(kv)?)),
            // Deleted between the compare and the range (its lease just expired), or
            // refused for one of `also_absent`: report it as held by nobody.
            None => Ok(Created::Exists(KeyValue {
                value: Vec::new(),
                create_revision: 0,
                mod_revision: 0,
                lease: 0,
            })),
        }
    }

    /// Sets `key` = `value` with no lease (it stays until deleted).
    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.post("/v3/kv/put", &json!({"key": b64(key), "value": b64(value)}))
            .map(|_| ())
    }

    /// Deletes `key` (absent is not an error).
    pub fn delete(&self, key: &[u8]) -> Result<()> {
        self.post("/v3/kv/deleterange", &json!({"key": b64(key)}))
            .map(|_| ())
    }

    /// Sets `key` = `value` (no lease) only while `held` is attached to `lease`: the
    /// holder of `held` proves it still holds it with the same write (a lease alone is
    /// not a lock). `false`: `held` is not on that lease any more (expired, revoked,
    /// taken by another), and nothing was written.
    pub fn put_if_lease(&self, key: &[u8], value: &[u8], held: &[u8], lease: i64) -> Result<bool> {
        self.txn_if_lease(
            held,
            lease,
            json!({"request_put": {"key": b64(key), "value": b64(value)}}),
        )
    }

    /// Deletes `key` only while `held` is attached to `lease` (see [`Etcd::put_if_lease`]).
    pub fn delete_if_lease(&self, key: &[u8], held: &[u8], lease: i64) -> Result<bool> {
        self.txn_if_lease(
            held,
            lease,
            json!({"request_delete_range": {"key": b64(key)}}),
        )
    }

    fn txn_if_lease(&self, held: &[u8], lease: i64, op: Value) -> Result<bool> {
        // A missing key compares as lease 0, so this fails once `held` is gone.
        let body = json!({
            "compare": [{"key": b64(held), "result": "EQUAL", "target": "LEASE", "lease": lease.to_string()}],
            "success": [op],
        });
        let v = self.post("/v3/kv/txn", &body)?;
        Ok(v["succeeded"].as_bool() == Some(true))
    }

    /// Reads a key, for display only: no decision is taken from a read.
    pub fn get(&self, key: &[u8]) -> Result<Option<KeyValue>> {
        let v = self.post("/v3/kv/range", &json!({ "key": b64(key) }))?;
        match v["kvs"].get(0) {
            Some(kv) => Ok(Some(key_value(kv)?)),
            None => Ok(None),
        }
    }
}

fn key_value(kv: &Value) -> Result<KeyValue> {
    Ok(KeyValue {
        value: unb64(&kv["value"])?,
        create_revision: int(&kv["create_revision"])?,
        mod_revision: int(&kv["mod_revision"])?,
        lease: int(&kv["lease"])?,
    })
}

/// (status, chunked, body) of an HTTP/1.1 response.
fn split_response(r: &[u8]) -> Result<(u16, bool, &[u8])> {
    let bad = |m: &str| EtcdError::Server(format!("bad HTTP response: {m}"));
    let end = r
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of headers"))?;
    let head = std::str::from_utf8(&r[..end]).map_err(|_| bad("headers are not text"))?;
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse::<u16>().ok())
        .ok_or_else(|| bad(status_line))?;
    let chunked = lines.any(|l| {
        let l = l.to_ascii_lowercase();
        l.starts_with("transfer-encoding:") && l.contains("chunked")
    });
    Ok((status, chunked, &r[end + 4..]))
}

/// Joins a chunked body. The keepalive stream may end without its last chunk when etcd
/// closes it; what arrived whole is kept.
fn dechunk(mut b: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let Some(nl) = b.windows(2).position(|w| w == b"\r\n") else {
            return Ok(out);
        };
        let size = std::str::from_utf8(&b[..nl])
            .ok()
            .and_then(|s| usize::from_str_radix(s.split(';').next().unwrap_or("").trim(), 16).ok())
            .ok_or_else(|| EtcdError::Server("bad chunk size".into()))?;
        b = &b[nl + 2..];
        if size == 0 || b.len() < size {
            return Ok(out);
        }
        out.extend_from_slice(&b[..size]);
        b = &b[size..];
        b = b.strip_prefix(b"\r\n").unwrap_or(b);
        // The keepalive stream sends one JSON object per chunk plus a newline: one is enough.
        if out.len() as u64 > MAX_RESPONSE {
            return Err(EtcdError::Server("answer too large".into()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-request-per-connection HTTP server that answers every request with
    /// `status` and `body`; its `http://` URL.
    fn answering(status: &'static str, body: &'static str) -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { return };
                let mut req = [0u8; 4096];
                let _ = s.read(&mut req);
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        url
    }

    #[test]
    fn a_member_without_a_leader_sends_the_next_request_to_the_next_member() {
        let sick = answering(
            "503 Service Unavailable",
            r#"{"error":"etcdserver: no leader","code":14,"message":"etcdserver: no leader"}"#,
        );
        let well = answering("200 OK", r#"{"result":{"ID":"7","TTL":"9"}}"#);
        let e = Etcd::new(&format!("{sick},{well}")).unwrap();
        let err = e.keepalive(7).unwrap_err();
        assert!(matches!(err, EtcdError::Unavailable(_)), "{err:?}");
        assert!(err.to_string().contains("no leader"), "{err}");
        assert_eq!(
            e.current_url(),
            well,
            "still on the member without a leader"
        );
        assert_eq!(e.keepalive(7).unwrap(), 9);
        // Another error (the member serves, the request is wrong) does not move on.
        let bad = answering("400 Bad Request", r#"{"error":"bad","message":"bad"}"#);
        let e = Etcd::new(&format!("{bad},{well}")).unwrap();
        assert!(matches!(e.keepalive(7), Err(EtcdError::Server(_))));
        assert_eq!(e.current_url(), bad);
    }

    #[test]
    fn urls() {
        assert!(Etcd::new("http://127.0.0.1:2379").is_ok());
        assert!(Etcd::new("http://etcd:2379/").is_ok());
        assert!(Etcd::new("https://etcd:2379").is_err());
        assert!(Etcd::new("etcd:2379").is_err());
        assert!(Etcd::new("http://etcd").is_err());
        assert!(Etcd::new("http://etcd:1/v3").is_err());
        let e = Etcd::new("http://a:2379, http://b:2379/,http://a:2379").unwrap();
        assert_eq!(e.url(), "http://a:2379,http://b:2379");
        assert!(Etcd::new("http://a:2379,").is_err());
        assert!(Etcd::new("http://a:2379,https://b:2379").is_err());
    }

    /// A port nothing listens on (bound, then let go).
    fn closed_port() -> String {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    }

    /// Answers each request with a lease grant of `ttl`, counting the requests.
    fn tiny_etcd(ttl: u64) -> (String, Arc<AtomicUsize>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", l.local_addr().unwrap());
        let n = Arc::new(AtomicUsize::new(0));
        let seen = n.clone();
        std::thread::spawn(move || {
            for mut c in l.incoming().flatten() {
                let mut req = Vec::new();
                let mut buf = [0u8; 1024];
                while let Ok(k) = c.read(&mut buf) {
                    req.extend_from_slice(&buf[..k]);
                    if k == 0 || req.ends_with(b"}") {
                        break;
                    }
                }
                seen.fetch_add(1, Ordering::SeqCst);
                let body = format!("{{\"ID\":\"7\",\"TTL\":\"{ttl}\"}}");
                let _ = write!(
                    c,
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        (url, n)
    }

    #[test]
    fn an_unreachable_member_is_passed_over_and_the_next_one_kept() {
        let dead = closed_port();
        let (live, n) = tiny_etcd(5);
        let e = Etcd::new(&format!("{dead},{live}")).unwrap();
        assert_eq!(e.current_url(), dead);
        // A clone (a lease's keepalive client) moves with the original.
        let keepalive = e.clone().with_timeout(Duration::from_millis(500));
        assert_eq!(e.grant(5).unwrap(), (7, 5));
        assert_eq!(e.current_url(), live);
        assert_eq!(keepalive.current_url(), live);
        assert_eq!(keepalive.keepalive(7).unwrap(), 5);
        assert_eq!(
            n.load(Ordering::SeqCst),
            2,
            "one request each, none sent twice"
        );
    }

    #[test]
    fn every_member_unreachable_names_each() {
        let (a, b) = (closed_port(), closed_port());
        let e = Etcd::new(&format!("{a},{b}")).unwrap();
        match e.grant(5) {
            Err(EtcdError::Io(m)) => {
                assert!(m.contains(&format!("{a} connect")), "{m}");
                assert!(m.contains(&format!("{b} connect")), "{m}");
            }
            r => panic!("expected an I/O error, got {r:?}"),
        }
        assert_eq!(e.current_url(), a, "the first member stays first");
    }

    #[test]
    fn a_member_that_drops_the_request_sends_the_next_one_on() {
        // Takes connections and closes them unanswered: a member that cannot serve.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mute = format!("http://{}", l.local_addr().unwrap());
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                drop(c);
            }
        });
        let (live, n) = tiny_etcd(3);
        let e = Etcd::new(&format!("{mute},{live}")).unwrap();
        assert!(e.grant(3).is_err(), "a request is not sent twice");
        assert_eq!(n.load(Ordering::SeqCst), 0);
        assert_eq!(e.current_url(), live);
        assert_eq!(e.grant(3).unwrap(), (7, 3));
    }

    #[test]
    fn responses() {
        let r = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\n{\"a\":\r\n3\r\n1}\n\r\n0\r\n\r\n";
        let (s, c, b) = split_response(r).unwrap();
        assert_eq!((s, c), (200, true));
        assert_eq!(dechunk(b).unwrap(), b"{\"a\":1}\n");
        assert!(split_response(b"HTTP/1.1 200").is_err());
        assert!(dechunk(b"zz\r\n").is_err());
        assert_eq!(int(&json!("42")).unwrap(), 42);
        assert_eq!(int(&Value::Null).unwrap(), 0);
        assert!(int(&json!("x")).is_err());
    }
}
