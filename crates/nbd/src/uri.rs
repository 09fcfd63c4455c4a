//! NBD URIs, as libnbd, qemu and nbdkit write them: where a remote export is and how to
//! reach it.
//!
//! ```text
//!   nbd://HOST[:PORT]/EXPORT            TCP, port 10809 by default
//!   nbds://HOST[:PORT]/EXPORT           TCP with TLS required
//!   nbd+unix:///EXPORT?socket=PATH      a Unix socket
//!   nbds+unix:///EXPORT?socket=PATH     a Unix socket with TLS required
//! ```
//!
//! The export name is the path after the first `/`, percent-decoded (`nbd://h/` and
//! `nbd://h` both name the default export ""). Query keys are libnbd's: `socket`,
//! `tls-certificates` (a directory of `ca-cert.pem`, `client-cert.pem`, ...),
//! `tls-psk-file` (psktool's `username:hexkey` lines), `tls-username`, `tls-verify-peer`.
//! An unknown key is refused rather than ignored: a misspelt `tls-psk-flie` must not
//! quietly connect without the key the user meant.
//!
//! A URI names a place, never a secret: the PSK file's path may appear in messages, its
//! contents never pass through here.

use std::fmt;
use std::net::ToSocketAddrs;
use std::path::PathBuf;

use crate::server::Listen;

/// The NBD port IANA assigned.
pub const DEFAULT_PORT: u16 = 10809;

/// Where the server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// A host name or address (IPv6 without brackets) and a port.
    Tcp {
        host: String,
        port: u16,
    },
    Unix(PathBuf),
}

/// A parsed NBD URI.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    /// `nbds` / `nbds+unix`: TLS is required, never plaintext.
    pub tls: bool,
    pub endpoint: Endpoint,
    pub export: String,
    pub tls_certificates: Option<PathBuf>,
    pub tls_psk_file: Option<PathBuf>,
    pub tls_username: Option<String>,
    /// Check the server's certificate against the CA (libnbd's default: yes).
    pub tls_verify_peer: bool,
}

/// Whether `s` is written as an NBD URI (and not as a file path).
pub fn is_uri(s: &str) -> bool {
    ["nbd://", "nbds://", "nbd+unix://", "nbds+unix://"]
        .iter()
        .any(|p| s.starts_with(p))
}

impl NbdUri {
    /// Parses `s`; the error is a sentence naming what is wrong.
    pub fn parse(s: &str) -> Result<NbdUri, String> {
        let bad = |why: &str| format!("{s:?} is not a usable NBD URI: {why}");
        let (scheme, rest) = s
            .split_once("://")
            .ok_or_else(|| bad("expected nbd://HOST[:PORT]/EXPORT"))?;
        let (tls, unix) = match scheme {
            "nbd" => (false, false),
            "nbds" => (true, false),
            "nbd+unix" => (false, true),
            "nbds+unix" => (true, true),
            "nbd+vsock" | "nbds+vsock" => return Err(bad("vsock is not supported")),
            _ => return Err(bad("the scheme must be nbd, nbds, nbd+unix or nbds+unix")),
        };
        if rest.contains('#') {
            return Err(bad("a fragment (#...) means nothing here"));
        }
        let (before_query, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match before_query.find('/') {
            Some(i) => (&before_query[..i], &before_query[i + 1..]),
            None => (before_query, ""),
        };
        // `nbds://USER@HOST/...`: libnbd's other spelling of tls-username=.
        let (user, authority) = match authority.rsplit_once('@') {
            Some((u, a)) => (Some(decode(u).map_err(|e| bad(&e))?), a),
            None => (None, authority),
        };
        let export = decode(path).map_err(|e| bad(&e))?;
        if export.len() > crate::proto::MAX_STRING {
            return Err(bad("the export name is longer than 4096 bytes"));
        }

        let mut uri = NbdUri {
            tls,
            endpoint: Endpoint::Unix(PathBuf::new()),
            export,
            tls_certificates: None,
            tls_psk_file: None,
            tls_username: None,
            tls_verify_peer: true,
        };
        let mut socket = None;
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = decode(v).map_err(|e| bad(&e))?;
            let nonempty = |v: String| {
                if v.is_empty() {
                    Err(bad(&format!("{k}= needs a value")))
                } else {
                    Ok(v)
                }
            };
            match k {
                "socket" => socket = Some(PathBuf::from(nonempty(v)?)),
                "tls-certificates" => uri.tls_certificates = Some(PathBuf::from(nonempty(v)?)),
                "tls-psk-file" => uri.tls_psk_file = Some(PathBuf::from(nonempty(v)?)),
                "tls-username" => uri.tls_username = Some(nonempty(v)?),
                "tls-verify-peer" => {
                    uri.tls_verify_peer = match v.as_str() {
                        "true" | "1" | "yes" | "on" => true,
                        "false" | "0" | "no" | "off" => false,
                        _ => return Err(bad("tls-verify-peer= takes true or false")),
                    }
                }
                _ => return Err(bad(&format!("unknown query key {k:?}"))),
            }
        }
        if let Some(u) = user {
            if !tls {
                return Err(bad(
                    "a user name (the TLS PSK user) in a plaintext URI (nbds:// asks for TLS)",
                ));
            }
            if u.is_empty() || uri.tls_username.as_ref().is_some_and(|t| *t != u) {
                return Err(bad(&format!(
                    "user name {u:?} and tls-username= do not agree"
                )));
            }
            uri.tls_username = Some(u);
        }
        if !tls
            && (uri.tls_certificates.is_some()
                || uri.tls_psk_file.is_some()
                || uri.tls_username.is_some())
        {
            return Err(bad("TLS keys in a plaintext URI (nbds:// asks for TLS)"));
        }

        if unix {
            if !authority.is_empty() {
                return Err(bad(
                    "a Unix socket URI has no host (nbd+unix:///EXPORT?socket=PATH)",
                ));
            }
            let path = socket.ok_or_else(|| bad("nbd+unix needs ?socket=PATH"))?;
            uri.endpoint = Endpoint::Unix(path);
        } else {
            if socket.is_some() {
                return Err(bad("socket= belongs to nbd+unix:// URIs"));
            }
            uri.endpoint = parse_authority(authority).map_err(|e| bad(&e))?;
        }
        Ok(uri)
    }

    /// The address to connect to; a host name is resolved now (the first address).
    pub fn listen(&self) -> Result<Listen, String> {
        match &self.endpoint {
            Endpoint::Unix(p) => Ok(Listen::Unix(p.clone())),
            Endpoint::Tcp { host, port } => (host.as_str(), *port)
                .to_socket_addrs()
                .map_err(|e| format!("cannot resolve {host}: {e}"))?
                .next()
                .map(Listen::Tcp)
                .ok_or_else(|| format!("{host} has no address")),
        }
    }
}

fn parse_authority(a: &str) -> Result<Endpoint, String> {
    if a.is_empty() {
        return Err("no host (nbd://HOST[:PORT]/EXPORT)".into());
    }
    let (host, port) = if let Some(rest) = a.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or("an IPv6 address needs its closing ]")?;
        let port = match after {
            "" => None,
            p => Some(p.strip_prefix(':').ok_or("junk after the IPv6 address")?),
        };
        (h.to_string(), port)
    } else {
        match a.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h.to_string(), Some(p)),
            Some(_) => return Err("an IPv6 address must be written in brackets, [::1]".into()),
            None => (a.to_string(), None),
        }
    };
    if host.is_empty() {
        return Err("no host".into());
    }
    let port = match port {
        None | Some("") => DEFAULT_PORT,
        Some(p) => match p.parse::<u16>() {
            Ok(0) | Err(_) => return Err(format!("bad port {p:?}")),
            Ok(n) => n,
        },
    };
    Ok(Endpoint::Tcp { host, port })
}

/// Percent-decoding; the result must be UTF-8 (export names are, in the protocol).
fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| format!("bad percent escape in {s:?}"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| format!("{s:?} does not decode to UTF-8"))
}

fn encode(s: &str) -> String {
    let mut out = String::new();
    for &c in s.as_bytes() {
        if c.is_ascii_alphanumeric() || b"-._~/:".contains(&c) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

impl fmt::Display for NbdUri {
    /// The URI again, in a canonical spelling (used to name a member in messages and
    /// in md's member list).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.tls { "s" } else { "" };
        let mut query = Vec::new();
        match &self.endpoint {
            Endpoint::Tcp { host, port } => {
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host.clone()
                };
                if *port == DEFAULT_PORT {
                    write!(f, "nbd{s}://{host}/{}", encode(&self.export))?;
                } else {
                    write!(f, "nbd{s}://{host}:{port}/{}", encode(&self.export))?;
                }
            }
            Endpoint::Unix(p) => {
                write!(f, "nbd{s}+unix:///{}", encode(&self.export))?;
                query.push(format!("socket={}", encode(&p.to_string_lossy())));
            }
        }
        if let Some(c) = &self.tls_certificates {
            query.push(format!("tls-certificates={}", encode(&c.to_string_lossy())));
        }
        if let Some(p) = &self.tls_psk_file {
            query.push(format!("tls-psk-file={}", encode(&p.to_string_lossy())));
        }
        if let Some(u) = &self.tls_username {
            query.push(format!("tls-username={}", encode(u)));
        }
        if !self.tls_verify_peer {
            query.push("tls-verify-peer=false".into());
        }
        if !query.is_empty() {
            write!(f, "?{}", query.join("&"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(h: &str, p: u16) -> Endpoint {
        Endpoint::Tcp {
            host: h.into(),
            port: p,
        }
    }

    #[test]
    fn the_four_schemes() {
        let u = NbdUri::parse("nbd://disk1/data").unwrap();
        assert_eq!(
            (u.tls, u.endpoint, u.export.as_str()),
            (false, tcp("disk1", 10809), "data")
        );
        let u = NbdUri::parse("nbds://10.0.0.2:10900/a%20b").unwrap();
        assert_eq!(
            (u.tls, u.endpoint, u.export.as_str()),
            (true, tcp("10.0.0.2", 10900), "a b")
        );
        let u = NbdUri::parse("nbd+unix:///m0?socket=/run/x.sock").unwrap();
        assert_eq!(u.endpoint, Endpoint::Unix("/run/x.sock".into()));
        assert_eq!(u.export, "m0");
        let u = NbdUri::parse("nbds+unix://?socket=/s&tls-psk-file=/k&tls-username=bob").unwrap();
        assert!(u.tls);
        assert_eq!(u.export, "");
        assert_eq!(u.tls_psk_file.as_deref(), Some(std::path::Path::new("/k")));
        assert_eq!(u.tls_username.as_deref(), Some("bob"));
        let u = NbdUri::parse("nbd://[::1]:1234").unwrap();
        assert_eq!(u.endpoint, tcp("::1", 1234));
        assert_eq!(u.export, "");
    }

    #[test]
    fn refused_with_a_reason() {
        for (s, why) in [
            ("http://x/y", "scheme"),
            ("nbd:///e", "no host"),
            ("nbd://h:0/e", "bad port"),
            ("nbd://h:99999/e", "bad port"),
            ("nbd://::1/e", "brackets"),
            ("nbd+unix:///e", "socket=PATH"),
            ("nbd+unix://h/e?socket=/s", "no host"),
            ("nbd://h/e?socket=/s", "nbd+unix"),
            ("nbd://h/e?tls-psk-file=/k", "plaintext"),
            ("nbds://h/e?tls-psk-flie=/k", "unknown query key"),
            ("nbd://h/%zz", "percent"),
            ("nbd://h/%ff", "UTF-8"),
            ("nbds://h/?tls-verify-peer=maybe", "true or false"),
            ("nbd://u@h/e", "user name"),
            ("nbds://u@h/e?tls-username=v", "do not agree"),
        ] {
            let e = NbdUri::parse(s).expect_err(s);
            assert!(e.contains(why), "{s}: {e}");
        }
        assert!(NbdUri::parse(&format!("nbd://h/{}", "x".repeat(4097))).is_err());
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "nbd://disk1/data",
            "nbds://h:10900/a%20b?tls-psk-file=/etc/k.psk&tls-username=me",
            "nbd+unix:///m0?socket=/run/x.sock",
            "nbd://[::1]/e",
            "nbds://h/?tls-certificates=/pki&tls-verify-peer=false",
        ] {
            let u = NbdUri::parse(s).unwrap();
            assert_eq!(u.to_string(), s);
            assert_eq!(NbdUri::parse(&u.to_string()).unwrap(), u);
        }
        let u = NbdUri::parse("nbds://alice@h/e?tls-psk-file=/k").unwrap();
        assert_eq!(u.tls_username.as_deref(), Some("alice"));
        assert_eq!(
            u.endpoint,
            Endpoint::Tcp {
                host: "h".into(),
                port: DEFAULT_PORT
            }
        );
        assert!(is_uri("nbd://h/e") && is_uri("nbds+unix:///?socket=/s"));
        assert!(!is_uri("/srv/nbd://x") && !is_uri("disk.img"));
    }
}
