//! A small client for etcd v3's JSON gateway over plain HTTP: the handful of calls the
//! ownership lease needs (`/v3/lease/grant|keepalive|revoke`, `/v3/kv/txn`, `/v3/kv/range`).
//!
//! One request per connection (`Connection: close`), a deadline on every socket call,
//! bodies capped. Keys and values are base64 on the wire; 64-bit numbers are JSON strings
//! (the gateway's proto3 mapping), and a false or zero field is left out of an answer.
//! No crate: ureq would pull a TLS stack in for four POSTs, and etcd's gRPC client needs
//! an async runtime the rest of cairn does not use.

use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
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
}

impl fmt::Display for EtcdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtcdError::Url(m) => write!(f, "etcd URL: {m}"),
            EtcdError::Io(m) => write!(f, "etcd: {m}"),
            EtcdError::Server(m) => write!(f, "etcd answered: {m}"),
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

/// An etcd endpoint.
#[derive(Debug, Clone)]
pub struct Etcd {
    /// `HOST:PORT`.
    authority: String,
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
    /// `http://HOST:PORT` (a trailing `/` is allowed). TLS endpoints are not supported.
    pub fn new(url: &str) -> Result<Etcd> {
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
        Ok(Etcd {
            authority: authority.to_string(),
            timeout: Duration::from_secs(5),
        })
    }

    /// Deadline of each socket operation (default 5 s). A lease's keepalive uses a
    /// shorter one so that a slow etcd is noticed before the lease runs out.
    pub fn with_timeout(mut self, t: Duration) -> Etcd {
        self.timeout = t.max(Duration::from_millis(10));
        self
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.authority)
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let io =
            |what: &str, e: std::io::Error| EtcdError::Io(format!("{} {what}: {e}", self.url()));
        let addr = self
            .authority
            .to_socket_addrs()
            .map_err(|e| io("resolve", e))?
            .next()
            .ok_or_else(|| EtcdError::Io(format!("{}: no address", self.authority)))?;
        let mut s =
            TcpStream::connect_timeout(&addr, self.timeout).map_err(|e| io("connect", e))?;
        s.set_read_timeout(Some(self.timeout))
            .map_err(|e| io("socket", e))?;
        s.set_write_timeout(Some(self.timeout))
            .map_err(|e| io("socket", e))?;
        let _ = s.set_nodelay(true);
        let body = body.to_string();
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.authority,
            body.len()
        );
        s.write_all(req.as_bytes()).map_err(|e| io("send", e))?;
        let mut resp = Vec::new();
        s.take(MAX_RESPONSE)
            .read_to_end(&mut resp)
            .map_err(|e| io("read", e))?;
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
            return Err(EtcdError::Server(format!("HTTP {status} on {path}: {msg}")));
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

    #[test]
    fn urls() {
        assert!(Etcd::new("http://127.0.0.1:2379").is_ok());
        assert!(Etcd::new("http://etcd:2379/").is_ok());
        assert!(Etcd::new("https://etcd:2379").is_err());
        assert!(Etcd::new("etcd:2379").is_err());
        assert!(Etcd::new("http://etcd").is_err());
        assert!(Etcd::new("http://etcd:1/v3").is_err());
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
