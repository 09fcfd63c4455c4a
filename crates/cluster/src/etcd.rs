//! A small client for etcd v3's JSON gateway, over HTTP or HTTPS: the handful of calls the
//! ownership lease needs (`/v3/lease/grant|keepalive|revoke`, `/v3/kv/txn`, `/v3/kv/range`).
//!
//! ```text
//!   Etcd::new("https://A:2379,https://B:2379") / Etcd::with_tls(urls, &EtcdTls { CA, cert, key })
//!     [.with_auth(user, password)]
//!   post(path, JSON) ─ [authenticate: a token, once, and again when etcd says it lapsed]
//!     send ─ connect: the current member, else the next (TCP, then the TLS handshake)
//!          └ exchange: one POST, `Connection: close`, the answer read to its end
//! ```
//!
//! One request per connection (over TLS the member's last session is resumed: the
//! certificate exchange is not repeated), a deadline on every socket call (the TLS handshake's
//! reads and writes included), bodies capped. An [`Etcd`] may name several members
//! (`http://A:2379,http://B:2379`): a request goes to the member that answered last, and to
//! the next one in the list when that one cannot be reached (no connection, or no TLS
//! session). A request is never sent twice (one exception, below: a token etcd refused):
//! once it went out, its failure is the caller's, and only the next request starts at the
//! next member. Keys and values are base64 on the
//! wire; 64-bit numbers are JSON strings (the gateway's proto3 mapping), and a false or
//! zero field is left out of an answer.
//!
//! TLS (`https://`, every member alike) is OpenSSL's, as for NBD: the member's certificate
//! is checked against a CA file (`--etcd-cacert`; the system's roots without one) and must
//! name the host or address of the URL; a client certificate and key (`--etcd-cert`,
//! `--etcd-key`) answer etcd's `--client-cert-auth`. OpenSSL reads the key file itself: its
//! contents never pass through cairn, and only its path is ever shown. A member whose
//! certificate does not verify is passed over like one that cannot be reached: the check
//! ends before a byte of the request is written, so the request can still go to the next
//! member safely, and one member with an expired or wrongly issued certificate does not
//! cost the lease while the others serve. It is logged as a warning each time, and when no
//! member verifies the error ([`EtcdError::Tls`]) names each and why.
//!
//! Each member's TLS session is kept after a request that went well and offered at the
//! next connection to the same `HOST:PORT` (an abbreviated handshake, no certificates
//! sent: the member's was checked against that name when the session was made). After
//! any failure the member's session is forgotten and the next handshake is a full one.
//! [`Etcd::tls_sessions_resumed`] counts the resumed handshakes.
//!
//! etcd's own users ([`Etcd::with_auth`], etcdctl's `--user`): every request carries the
//! token `/v3/auth/authenticate` gave (`Authorization` header), fetched before the first
//! request and again when etcd answers "invalid auth token" (its `--auth-token-ttl` without
//! use, a JWT's expiry); only then is a request sent a second time, because etcd checks
//! the token before the request enters raft: the refused one was never applied. The
//! password and the token live in zeroized memory and are never shown.
//!
//! No HTTP crate: ureq would pull a second TLS stack in for four POSTs, and etcd's gRPC
//! client needs an async runtime the rest of cairn does not use.

use std::collections::HashMap;
use std::fmt;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use openssl::ssl::{
    ErrorCode, SslConnector, SslFiletype, SslMethod, SslOptions, SslSession, SslStream, SslVersion,
};
use openssl::x509::store::X509StoreBuilder;
use openssl::x509::{X509VerifyResult, X509};
use serde_json::{json, Value};
use zeroize::Zeroizing;

/// Largest answer read.
const MAX_RESPONSE: u64 = 1 << 20;

/// Why an etcd call failed.
#[derive(Debug)]
pub enum EtcdError {
    /// The URL is not `http://HOST:PORT` or `https://HOST:PORT`, or the TLS files do not
    /// fit the URLs.
    Url(String),
    /// etcd refused the user name or password, or gave no token.
    Auth(String),
    /// TLS could not be set up (a CA, certificate or key file that does not load), no
    /// member's certificate verified, or a member refused this client's certificate.
    Tls(String),
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
            EtcdError::Tls(m) => write!(f, "etcd TLS: {m}"),
            EtcdError::Auth(m) => write!(f, "etcd authentication: {m}"),
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

/// The files TLS to etcd uses, as etcdctl's `--cacert`, `--cert` and `--key`. Paths only:
/// OpenSSL reads them when [`Etcd::with_tls`] builds its context.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EtcdTls {
    /// CA certificates (PEM) that sign the members' certificates; none: the system's roots.
    pub cacert: Option<PathBuf>,
    /// This client's certificate (PEM, may hold its chain), for etcd's `--client-cert-auth`.
    pub cert: Option<PathBuf>,
    /// The private key of `cert` (PEM).
    pub key: Option<PathBuf>,
}

impl EtcdTls {
    fn is_empty(&self) -> bool {
        self.cacert.is_none() && self.cert.is_none() && self.key.is_none()
    }
}

/// An OpenSSL client context for the members, the files it came from (for messages),
/// and the last TLS session of each member, offered at the next connection to it.
struct Tls {
    connector: SslConnector,
    files: EtcdTls,
    /// By `HOST:PORT` as the URL names it: a session is only offered to the name it was
    /// made with, whose certificate was checked against that name. Replaced after each
    /// request that succeeded, dropped after any that failed (the next handshake is
    /// then a full one).
    sessions: Mutex<HashMap<String, SslSession>>,
    /// Handshakes that resumed a session.
    resumed: AtomicU64,
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Sessions hold key material: not shown.
        f.debug_struct("Tls").field("files", &self.files).finish()
    }
}

impl Tls {
    fn new(files: &EtcdTls) -> Result<Tls> {
        let fail =
            |what: &Path, e: &dyn fmt::Display| EtcdError::Tls(format!("{}: {e}", what.display()));
        let ssl = |what: &Path, e: &openssl::error::ErrorStack| fail(what, &stack_reasons(e));
        let setup = |e: openssl::error::ErrorStack| EtcdError::Tls(stack_reasons(&e));
        // SslConnector's defaults: peer verification on, the system's roots, Mozilla's
        // intermediate cipher list. TLS 1.2 is the oldest etcd accepts by default.
        let mut b = SslConnector::builder(SslMethod::tls_client()).map_err(setup)?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2))
            .map_err(setup)?;
        // etcd (Go) closes a `Connection: close` answer without a close_notify; the
        // answer's framing (JSON, chunks) shows whether it arrived whole.
        b.set_options(SslOptions::IGNORE_UNEXPECTED_EOF);
        if let Some(ca) = &files.cacert {
            // Only this CA, as etcdctl's --cacert: the system's roots would let any public
            // CA vouch for a member.
            let pem = std::fs::read(ca).map_err(|e| fail(ca, &e))?;
            let certs = X509::stack_from_pem(&pem).map_err(|e| ssl(ca, &e))?;
            if certs.is_empty() {
                return Err(fail(ca, &"no PEM certificate in it"));
            }
            let mut store = X509StoreBuilder::new().map_err(setup)?;
            for c in certs {
                store.add_cert(c).map_err(|e| ssl(ca, &e))?;
            }
            b.set_cert_store(store.build());
        }
        match (&files.cert, &files.key) {
            (Some(cert), Some(key)) => {
                b.set_certificate_chain_file(cert)
                    .map_err(|e| ssl(cert, &e))?;
                // OpenSSL compares the key with the certificate as it loads it.
                let mismatch = |e: openssl::error::ErrorStack| {
                    let why = stack_reasons(&e);
                    match why.contains("mismatch") {
                        true => EtcdError::Tls(format!(
                            "{} is not the key of {} ({why})",
                            key.display(),
                            cert.display()
                        )),
                        false => fail(key, &why),
                    }
                };
                b.set_private_key_file(key, SslFiletype::PEM)
                    .map_err(mismatch)?;
                b.check_private_key().map_err(mismatch)?;
            }
            (None, None) => {}
            _ => return Err(EtcdError::Tls(
                "a client certificate (--etcd-cert) needs its key (--etcd-key), and the reverse"
                    .into(),
            )),
        }
        Ok(Tls {
            connector: b.build(),
            files: files.clone(),
            sessions: Mutex::new(HashMap::new()),
            resumed: AtomicU64::new(0),
        })
    }

    fn sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, SslSession>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// After a request on `conn` to `authority`: its session is kept for the next
    /// connection if the request went well, else forgotten.
    fn keep_session(&self, authority: &str, conn: &mut Conn, ok: bool) {
        let session = match conn {
            Conn::Tls(s) if ok => {
                // Our close_notify (the member closed first: it may not arrive). OpenSSL
                // marks the session of a connection freed without one as not
                // resumable, and the one kept here is that same object.
                let _ = s.shutdown();
                s.ssl().session().map(ToOwned::to_owned)
            }
            _ => None,
        };
        match session {
            Some(session) => self.sessions().insert(authority.to_string(), session),
            None => self.sessions().remove(authority),
        };
    }
}

/// A connection to a member.
enum Conn {
    Plain(TcpStream),
    Tls(Box<SslStream<TcpStream>>),
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf),
            Conn::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Conn::Plain(s) => s.write(buf),
            Conn::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Conn::Plain(s) => s.flush(),
            Conn::Tls(s) => s.flush(),
        }
    }
}

/// Why no connection to a member was made.
enum ConnectError {
    /// Not reachable (no address, refused, timed out, the TLS handshake cut off).
    Unreachable(String),
    /// Its certificate does not verify, or it refused ours: nothing was sent.
    Tls(String),
}

/// etcd's user name and password authentication: the credentials, and the token
/// `/v3/auth/authenticate` gave for them. Both secret: kept in zeroized memory, never shown.
struct Auth {
    user: String,
    password: Zeroizing<String>,
    /// Shared by the clones. etcd applies an authentication through raft, so a token is
    /// known to every member, not only the one that gave it.
    token: Mutex<Option<Zeroizing<String>>>,
}

impl fmt::Debug for Auth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Auth").field("user", &self.user).finish()
    }
}

/// An etcd cluster, as one or more members' client endpoints.
#[derive(Debug, Clone)]
pub struct Etcd {
    /// `HOST:PORT` of each member, in the order given.
    authorities: Arc<[String]>,
    /// `Some` for `https://` endpoints.
    tls: Option<Arc<Tls>>,
    /// The member requests go to first: the last that took one. Shared by the clones
    /// (a lease's keepalive client is one), so all move on together.
    current: Arc<AtomicUsize>,
    timeout: Duration,
    auth: Option<Arc<Auth>>,
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
    /// `http://HOST:PORT` or `https://HOST:PORT` (a trailing `/` is allowed), or several of
    /// them separated by commas: the members of one cluster, all with the same scheme.
    /// `https` checks the members' certificates against the system's roots, with no client
    /// certificate; [`Etcd::with_tls`] names a CA and a client certificate.
    pub fn new(urls: &str) -> Result<Etcd> {
        Etcd::with_tls(urls, &EtcdTls::default())
    }

    /// [`Etcd::new`] with TLS files, which need `https://` endpoints (given with `http://`
    /// they would be silently unused: refused instead).
    pub fn with_tls(urls: &str, files: &EtcdTls) -> Result<Etcd> {
        let mut authorities = Vec::new();
        let mut https = None;
        for url in urls.split(',').map(str::trim) {
            if url.is_empty() {
                return Err(EtcdError::Url(format!(
                    "{urls:?}: an empty endpoint in the list"
                )));
            }
            let (tls, rest) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
                (Some(rest), _) => (false, rest),
                (_, Some(rest)) => (true, rest),
                _ => {
                    return Err(EtcdError::Url(format!(
                        "{url:?}: expected http://HOST:PORT or https://HOST:PORT"
                    )))
                }
            };
            if https.is_some_and(|h| h != tls) {
                return Err(EtcdError::Url(format!(
                    "{urls:?}: http:// and https:// members in one list; a cluster's members \
                     all serve clients the same way (etcd's --listen-client-urls)"
                )));
            }
            https = Some(tls);
            let authority = rest.trim_end_matches('/');
            if authority.is_empty() || authority.contains('/') || !authority.contains(':') {
                return Err(EtcdError::Url(format!(
                    "{url:?}: expected {}://HOST:PORT",
                    if tls { "https" } else { "http" }
                )));
            }
            if !authorities.iter().any(|a| a == authority) {
                authorities.push(authority.to_string());
            }
        }
        let tls = match https {
            Some(true) => Some(Arc::new(Tls::new(files)?)),
            _ if !files.is_empty() => {
                return Err(EtcdError::Url(format!(
                    "{urls:?}: TLS files (CA, certificate, key) are given but the endpoints \
                     are http://; write https://HOST:PORT"
                )))
            }
            _ => None,
        };
        Ok(Etcd {
            authorities: authorities.into(),
            tls,
            current: Arc::new(AtomicUsize::new(0)),
            timeout: Duration::from_secs(5),
            auth: None,
        })
    }

    /// Deadline of each socket operation (default 5 s). A lease's keepalive uses a
    /// shorter one so that a slow etcd is noticed before the lease runs out.
    pub fn with_timeout(mut self, t: Duration) -> Etcd {
        self.timeout = t.max(Duration::from_millis(10));
        self
    }

    /// Authenticates as `user` (etcd's `--auth`, etcdctl's `--user`): every request carries
    /// the token `/v3/auth/authenticate` gives, fetched before the first request and again
    /// when etcd says it is no longer valid.
    pub fn with_auth(mut self, user: &str, password: Zeroizing<String>) -> Etcd {
        self.auth = Some(Arc::new(Auth {
            user: user.to_string(),
            password,
            token: Mutex::new(None),
        }));
        self
    }

    fn scheme(&self) -> &'static str {
        match self.tls {
            Some(_) => "https",
            None => "http",
        }
    }

    /// Every endpoint, comma-separated, as given.
    pub fn url(&self) -> String {
        self.authorities
            .iter()
            .map(|a| format!("{}://{a}", self.scheme()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The endpoint the next request goes to first.
    pub fn current_url(&self) -> String {
        let n = self.authorities.len();
        format!(
            "{}://{}",
            self.scheme(),
            self.authorities[self.current.load(Ordering::Relaxed) % n]
        )
    }

    /// Over TLS: the connections so far (by this client and its clones) that resumed the
    /// member's previous session instead of a full handshake; 0 over plain HTTP.
    pub fn tls_sessions_resumed(&self) -> u64 {
        self.tls
            .as_ref()
            .map_or(0, |t| t.resumed.load(Ordering::Relaxed))
    }

    /// A connection to the first member that takes one, starting at the current member.
    fn connect(&self) -> Result<(usize, Conn)> {
        let n = self.authorities.len();
        let first = self.current.load(Ordering::Relaxed) % n;
        let mut failed = Vec::new();
        let mut refused_tls = false;
        for i in (0..n).map(|k| (first + k) % n) {
            let url = format!("{}://{}", self.scheme(), self.authorities[i]);
            let r = self.connect_one(&self.authorities[i], &url);
            if let (Err(_), Some(tls)) = (&r, &self.tls) {
                tls.sessions().remove(&self.authorities[i]);
            }
            match r {
                Ok(c) => {
                    if i != first {
                        tracing::info!("etcd: now talking to {url} ({})", failed.join("; "));
                        self.current.store(i, Ordering::Relaxed);
                    }
                    return Ok((i, c));
                }
                Err(ConnectError::Unreachable(m)) => failed.push(m),
                Err(ConnectError::Tls(m)) => {
                    tracing::warn!("etcd: {m}");
                    refused_tls = true;
                    failed.push(m);
                }
            }
        }
        let m = failed.join("; ");
        Err(match refused_tls {
            true => EtcdError::Tls(m),
            false => EtcdError::Io(m),
        })
    }

    fn connect_one(&self, authority: &str, url: &str) -> std::result::Result<Conn, ConnectError> {
        let gone = |what: &str, e: &dyn fmt::Display| {
            ConnectError::Unreachable(format!("{url} {what}: {e}"))
        };
        let addr = match authority.to_socket_addrs().map(|mut a| a.next()) {
            Ok(Some(a)) => a,
            Ok(None) => return Err(ConnectError::Unreachable(format!("{url}: no address"))),
            Err(e) => return Err(gone("resolve", &e)),
        };
        let s = TcpStream::connect_timeout(&addr, self.timeout).map_err(|e| gone("connect", &e))?;
        s.set_read_timeout(Some(self.timeout))
            .map_err(|e| gone("socket", &e))?;
        s.set_write_timeout(Some(self.timeout))
            .map_err(|e| gone("socket", &e))?;
        let _ = s.set_nodelay(true);
        let Some(tls) = &self.tls else {
            return Ok(Conn::Plain(s));
        };
        // The host as the URL names it (a name or an address), which the certificate
        // must name too.
        let host = authority
            .rsplit_once(':')
            .map_or(authority, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let mut ssl = tls
            .connector
            .configure()
            .and_then(|c| c.into_ssl(host))
            .map_err(|e| ConnectError::Tls(format!("{url}: TLS: {e}")))?;
        // The member's last session, to skip the certificate exchange and the key
        // agreement's costliest steps: the member resumes it or, if it will not, a full
        // handshake follows by itself.
        if let Some(session) = tls.sessions().get(authority) {
            // SAFETY: every cached session came from a connection made through
            // `tls.connector` (keep_session), the context this `ssl` was made from.
            if let Err(e) = unsafe { ssl.set_session(session) } {
                tracing::debug!("etcd: {url}: TLS session not offered: {e}");
            }
        }
        let mut s =
            SslStream::new(ssl, s).map_err(|e| ConnectError::Tls(format!("{url}: TLS: {e}")))?;
        // The socket's timeouts bound each read and write of the handshake; one that runs
        // out surfaces as WANT_READ / WANT_WRITE.
        match s.connect() {
            Ok(()) => {
                if s.ssl().session_reused() {
                    tls.resumed.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Conn::Tls(Box::new(s)))
            }
            Err(e) => {
                let verify = s.ssl().verify_result();
                if verify != X509VerifyResult::OK {
                    return Err(ConnectError::Tls(format!(
                        "{url}: its certificate does not verify: {} ({})",
                        verify.error_string(),
                        match &tls.files.cacert {
                            Some(ca) => format!(
                                "it must be signed by a CA in {} and name {host}",
                                ca.display()
                            ),
                            None => format!(
                                "it must be signed by a CA the system trusts, or one given \
                                 with --etcd-cacert, and name {host}"
                            ),
                        }
                    )));
                }
                match e.code() {
                    ErrorCode::WANT_READ | ErrorCode::WANT_WRITE => Err(ConnectError::Unreachable(
                        format!("{url}: TLS handshake: no answer within {:?}", self.timeout),
                    )),
                    _ => match tls_failure(&e) {
                        (why, true) => Err(ConnectError::Tls(format!("{url}: {why}"))),
                        (why, false) => Err(ConnectError::Unreachable(format!("{url}: {why}"))),
                    },
                }
            }
        }
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value> {
        let Some(auth) = &self.auth else {
            return self.send(path, &Zeroizing::new(body.to_string()), None);
        };
        let body = Zeroizing::new(body.to_string());
        let held = auth.token.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let token = match held {
            Some(t) => t,
            None => self.authenticate(auth)?,
        };
        match self.send(path, &body, Some(&token)) {
            // A simple token lapses after etcd's --auth-token-ttl without use on a member,
            // a JWT at its expiry. etcd checks the token before the request enters raft,
            // so a request refused for its token was not applied: sending it once more
            // with a fresh token does not apply anything twice.
            Err(EtcdError::Server(m)) if m.contains("invalid auth token") => {
                tracing::info!(
                    "etcd: the auth token of user {:?} expired, authenticating again",
                    auth.user
                );
                let token = self.authenticate(auth)?;
                self.send(path, &body, Some(&token))
            }
            r => r,
        }
    }

    /// A new token for `auth`'s user, kept for the next requests.
    fn authenticate(&self, auth: &Auth) -> Result<Zeroizing<String>> {
        let body = Zeroizing::new(
            json!({"name": auth.user, "password": auth.password.as_str()}).to_string(),
        );
        let v = self
            .send("/v3/auth/authenticate", &body, None)
            .map_err(|e| match e {
                EtcdError::Server(m) => EtcdError::Auth(format!("user {:?}: {m}", auth.user)),
                e => e,
            })?;
        let token = match v.get("token").and_then(Value::as_str) {
            Some(t) if !t.is_empty() => Zeroizing::new(t.to_string()),
            _ => {
                return Err(EtcdError::Auth(format!(
                    "user {:?}: etcd gave no token (is its authentication enabled?)",
                    auth.user
                )))
            }
        };
        *auth.token.lock().unwrap_or_else(|p| p.into_inner()) = Some(token.clone());
        Ok(token)
    }

    fn send(&self, path: &str, body: &str, token: Option<&str>) -> Result<Value> {
        let (i, mut s) = self.connect()?;
        let r = self.exchange(i, &mut s, path, body, token);
        if let Some(tls) = &self.tls {
            // After the answer was read to its end: with TLS 1.3 the member's session
            // ticket comes after the handshake.
            tls.keep_session(&self.authorities[i], &mut s, r.is_ok());
        }
        if matches!(
            r,
            Err(EtcdError::Io(_) | EtcdError::Unavailable(_) | EtcdError::Tls(_))
        ) && self.authorities.len() > 1
        {
            // The member took the connection but not the request (cut off, stopped, no
            // quorum and too slow to say so, our certificate refused after a TLS 1.3
            // handshake), or said it cannot serve (503): the next request tries the next
            // member. This one is not sent again: it may have been applied.
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
        i: usize,
        s: &mut Conn,
        path: &str,
        body: &str,
        token: Option<&str>,
    ) -> Result<Value> {
        let authority = &self.authorities[i];
        let url = format!("{}://{authority}", self.scheme());
        let io = |what: &str, e: std::io::Error| match tls_refusal(&e) {
            Some(why) => EtcdError::Tls(format!("{url} {what}: {why}")),
            None => EtcdError::Io(format!("{url} {what}: {e}")),
        };
        // A password or a token may be in it: zeroized once sent.
        let req =
            Zeroizing::new(format!(
            "POST {path} HTTP/1.1\r\nHost: {authority}\r\n{}{}{}Content-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            if token.is_some() { "Authorization: " } else { "" },
            token.unwrap_or(""),
            if token.is_some() { "\r\n" } else { "" },
            body.len()
        ));
        s.write_all(req.as_bytes()).map_err(|e| io("send", e))?;
        let mut resp = Vec::new();
        s.take(MAX_RESPONSE)
            .read_to_end(&mut resp)
            .map_err(|e| io("read", e))?;
        if resp.is_empty() {
            // etcd 3.4 closes plain HTTP on a TLS port this way, without a word.
            let hint = match self.tls {
                None => format!(" (if the member serves clients over TLS: https://{authority})"),
                Some(_) => String::new(),
            };
            return Err(EtcdError::Io(format!(
                "{url}: the connection closed without an answer{hint}"
            )));
        }
        decode_answer(&url, authority, path, &resp)
    }

    /// Grants a lease of `ttl` seconds: (lease id, granted TTL).
    pub fn grant(&self, ttl: u64) -> Result<(i64, u64)> {
        lease_granted(&self.post("/v3/lease/grant", &json!({ "TTL": ttl.to_string() }))?)
    }

    /// Refreshes a lease: its TTL in seconds, 0 when it has already expired.
    pub fn keepalive(&self, id: i64) -> Result<u64> {
        lease_ttl(&self.post("/v3/lease/keepalive", &json!({ "ID": id.to_string() }))?)
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
        txn_created(&self.post("/v3/kv/txn", &body)?)
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
        range_first(&self.post("/v3/kv/range", &json!({ "key": b64(key) }))?)
    }
}

/// The reasons in an OpenSSL error stack, without its codes, source files and lines.
fn stack_reasons(stack: &openssl::error::ErrorStack) -> String {
    let why: Vec<&str> = stack
        .errors()
        .iter()
        .map(|x| x.reason().unwrap_or("unknown"))
        .collect();
    match why.is_empty() {
        true => "OpenSSL gave no reason".into(),
        false => why.join("; "),
    }
}

/// The reasons OpenSSL gives for a failed TLS call.
fn ssl_reasons(e: &openssl::ssl::Error) -> Option<String> {
    e.ssl_error().map(stack_reasons)
}

/// What refusing this client's certificate (or its absence) looks like: an alert from
/// the member. TLS 1.2 sends it during the handshake, TLS 1.3 after it, in place of the
/// answer.
fn refused_certificate(reasons: &str) -> Option<String> {
    let r = reasons.to_ascii_lowercase();
    (r.contains("alert") && (r.contains("certificate") || r.contains("unknown ca"))).then(|| {
        format!(
            "the member refused this client's certificate ({reasons}): etcd with \
             --client-cert-auth wants --etcd-cert and --etcd-key, signed by a CA in its \
             --trusted-ca-file"
        )
    })
}

/// A failed TLS handshake in a sentence, and whether it is about certificates (`true`)
/// rather than a member that cannot be reached.
fn tls_failure(e: &openssl::ssl::Error) -> (String, bool) {
    if let Some(io) = e.io_error() {
        return (format!("TLS handshake: {io}"), false);
    }
    let Some(reasons) = ssl_reasons(e) else {
        return (
            "TLS handshake: the member closed the connection".into(),
            false,
        );
    };
    if let Some(m) = refused_certificate(&reasons) {
        return (m, true);
    }
    let hint = if reasons.contains("wrong version number") || reasons.contains("packet length") {
        " (does the member serve plain http? then write http://)"
    } else {
        ""
    };
    (format!("TLS handshake failed: {reasons}{hint}"), false)
}

/// A read or write that failed because the member refused this client's certificate
/// after the handshake (TLS 1.3).
fn tls_refusal(e: &std::io::Error) -> Option<String> {
    let ssl = e.get_ref()?.downcast_ref::<openssl::ssl::Error>()?;
    refused_certificate(&ssl_reasons(ssl)?)
}

fn key_value(kv: &Value) -> Result<KeyValue> {
    Ok(KeyValue {
        value: unb64(&kv["value"])?,
        create_revision: int(&kv["create_revision"])?,
        mod_revision: int(&kv["mod_revision"])?,
        lease: int(&kv["lease"])?,
    })
}

/// A lease grant's answer: (lease id, granted TTL).
fn lease_granted(v: &Value) -> Result<(i64, u64)> {
    let id = int(&v["ID"])?;
    let granted = u64::try_from(int(&v["TTL"])?).unwrap_or(0);
    if id == 0 || granted == 0 {
        return Err(EtcdError::Server(format!(
            "lease grant gave id {id}, TTL {granted}"
        )));
    }
    Ok((id, granted))
}

/// A keepalive's answer: the lease's TTL, 0 when it has expired.
fn lease_ttl(v: &Value) -> Result<u64> {
    let r = v.get("result").unwrap_or(v);
    Ok(u64::try_from(int(&r["TTL"])?).unwrap_or(0))
}

/// A create-if-absent transaction's answer.
fn txn_created(v: &Value) -> Result<Created> {
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

/// A range's first key, if any.
fn range_first(v: &Value) -> Result<Option<KeyValue>> {
    match v["kvs"].get(0) {
        Some(kv) => Ok(Some(key_value(kv)?)),
        None => Ok(None),
    }
}

/// For tests: `resp` decoded as the bytes of a member's answer to a transaction.
#[doc(hidden)]
pub fn decode_for_test(resp: &[u8]) -> Result<Value> {
    decode_answer("http://fuzz:2379", "fuzz:2379", "/v3/kv/txn", resp)
}

/// For the fuzz harness (fuzz/etcd_harness.rs): decodes `resp` as the bytes of an
/// answer from a member, and a 200's JSON as each call's answer would be. Every input
/// must give a value or an error, never a panic.
#[doc(hidden)]
pub fn fuzz_answer(resp: &[u8]) {
    if let Ok(v) = decode_for_test(resp) {
        let _ = (
            lease_granted(&v),
            lease_ttl(&v),
            txn_created(&v),
            range_first(&v),
        );
    }
}

/// What an answer's bytes say: the JSON of a 200, or the error the caller gets (a 503
/// as [`EtcdError::Unavailable`], so the next request goes to the next member). `url` and
/// `authority` name the member in messages.
fn decode_answer(url: &str, authority: &str, path: &str, resp: &[u8]) -> Result<Value> {
    let (status, chunked, body) = split_response(resp)?;
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    let v: Value = serde_json::from_slice(&body).map_err(|e| {
        let text = String::from_utf8_lossy(&body);
        // Go's answer to plain HTTP on a TLS port.
        if text.contains("HTTP request to an HTTPS server") {
            return EtcdError::Url(format!(
                "{url}: the member serves clients over TLS: write https://{authority}"
            ));
        }
        // etcd (Debian's 3.4 does) with its authentication on refuses a client certificate
        // with a CommonName on the JSON gateway: the CN would be taken for a user.
        if text.contains("CommonName of client") {
            return EtcdError::Auth(format!(
                "{url}: {}: with authentication on, etcd takes no client certificate with \
                 a CommonName (CN) on its JSON gateway, which cairn speaks: give cairn a \
                 certificate whose subject has no CN (e.g. /O=cairn), and the user with \
                 --etcd-user",
                text.trim()
            ));
        }
        EtcdError::Server(format!("{url}: HTTP {status}: not JSON ({e}): {text}"))
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
        let e = Etcd::new("https://etcd:2379/,https://[::1]:2379").unwrap();
        assert_eq!(e.url(), "https://etcd:2379,https://[::1]:2379");
        assert_eq!(e.current_url(), "https://etcd:2379");
        assert!(Etcd::new("https://etcd").is_err());
        assert!(Etcd::new("etcd:2379").is_err());
        assert!(Etcd::new("http://etcd").is_err());
        assert!(Etcd::new("http://etcd:1/v3").is_err());
        let e = Etcd::new("http://a:2379, http://b:2379/,http://a:2379").unwrap();
        assert_eq!(e.url(), "http://a:2379,http://b:2379");
        assert!(Etcd::new("http://a:2379,").is_err());
        for mixed in [
            "http://a:2379,https://b:2379",
            "https://a:2379,http://b:2379",
        ] {
            let err = Etcd::new(mixed).unwrap_err();
            assert!(err.to_string().contains("http:// and https://"), "{err}");
        }
    }

    #[test]
    fn tls_files() {
        let files = |ca: &str, cert: &str, key: &str| {
            let p = |s: &str| (!s.is_empty()).then(|| PathBuf::from(s));
            EtcdTls {
                cacert: p(ca),
                cert: p(cert),
                key: p(key),
            }
        };
        // Files that would go unused: refused.
        let err = Etcd::with_tls("http://a:2379", &files("/ca.pem", "", "")).unwrap_err();
        assert!(matches!(err, EtcdError::Url(_)), "{err}");
        assert!(err.to_string().contains("https://"), "{err}");
        // A certificate without its key, and the reverse.
        for f in [files("", "/c.pem", ""), files("", "", "/k.pem")] {
            let err = Etcd::with_tls("https://a:2379", &f).unwrap_err();
            assert!(matches!(err, EtcdError::Tls(_)), "{err}");
        }
        // A missing file is named.
        let err =
            Etcd::with_tls("https://a:2379", &files("/nonexistent-ca.pem", "", "")).unwrap_err();
        assert!(err.to_string().contains("/nonexistent-ca.pem"), "{err}");
        // A file that holds no certificate.
        let err = Etcd::with_tls("https://a:2379", &files("/dev/null", "", "")).unwrap_err();
        assert!(err.to_string().contains("/dev/null"), "{err}");
        // No files: the system's roots.
        assert!(Etcd::with_tls("https://a:2379", &EtcdTls::default()).is_ok());
    }

    #[test]
    fn a_tls_handshake_without_an_answer_times_out_and_moves_on() {
        // Takes connections and says nothing: the handshake's first read waits.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let silent = format!("https://{}", l.local_addr().unwrap());
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for c in l.incoming().flatten() {
                held.push(c);
            }
        });
        let other = closed_port().replace("http://", "https://");
        let e = Etcd::new(&format!("{silent},{other}"))
            .unwrap()
            .with_timeout(Duration::from_millis(300));
        let err = e.grant(5).unwrap_err();
        assert!(matches!(err, EtcdError::Io(_)), "{err:?}");
        let m = err.to_string();
        assert!(
            m.contains(&format!("{silent}: TLS handshake: no answer")),
            "{m}"
        );
        assert!(m.contains(&format!("{other} connect")), "{m}");
    }

    #[test]
    fn plain_http_to_a_tls_member_says_so() {
        let tls_port = answering(
            "400 Bad Request",
            "Client sent an HTTP request to an HTTPS server.\n",
        );
        let err = Etcd::new(&tls_port).unwrap().grant(5).unwrap_err();
        assert!(matches!(err, EtcdError::Url(_)), "{err:?}");
        assert!(err.to_string().contains("https://"), "{err}");
        // And TLS to a plain member: a handshake failure, passed over as unreachable.
        let plain = answering("200 OK", "{}").replace("http://", "https://");
        let err = Etcd::new(&plain).unwrap().grant(5).unwrap_err();
        assert!(matches!(err, EtcdError::Io(_)), "{err:?}");
        assert!(err.to_string().contains("TLS handshake"), "{err}");
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
