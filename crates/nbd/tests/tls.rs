//! NBD over TLS: cairn's client against cairn's server (in this process), nbdkit
//! `--tls=require` and qemu-nbd `--tls-creds`, with X.509 and PSK; wrong keys and wrong
//! CAs refused; require mode answers nothing but TLS_REQD before the handshake; a client
//! that asked for TLS never falls back to plaintext.
//!
//! Credentials come from tests/interop/tls/make-creds.sh (GnuTLS's certtool and
//! psktool). Without those tools, or nbdkit / qemu-nbd, the tests that need them say so and
//! pass, except under CI=true, where a missing tool fails.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, WriteFlags};
use cairn_nbd::client::{Client, ClientOptions, Error};
use cairn_nbd::proto::*;
use cairn_nbd::uri::NbdUri;
use cairn_nbd::{Listen, ServerConfig, ServerTls};
use common::*;

fn have(tool: &str) -> bool {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{tool} is missing (scripts/install-deps.sh installs it)"
        );
        eprintln!("skipped: {tool} is not installed");
    }
    ok
}

/// Fresh credentials in a temp dir, or `None` without certtool/psktool.
fn creds() -> Option<TempDir> {
    if !have("certtool") || !have("psktool") {
        return None;
    }
    let dir = TempDir::new("tls");
    let script =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/interop/tls/make-creds.sh");
    let st = Command::new("bash")
        .arg(&script)
        .arg(dir.path())
        .status()
        .expect("run make-creds.sh");
    assert!(st.success(), "make-creds.sh failed");
    Some(dir)
}

fn tls_server(tls: ServerTls) -> TestServer {
    let mut c = ServerConfig::new(vec![export("disk", mem(8 << 20))]);
    c.tls = Some(tls);
    TestServer::start_with(c)
}

fn uri(s: &str) -> ClientOptions {
    let u = NbdUri::parse(s).unwrap_or_else(|e| panic!("{e}"));
    let mut o = ClientOptions::from_uri(&u).unwrap_or_else(|e| panic!("{s}: {e}"));
    o.timeout = Some(TIMEOUT);
    o
}

fn tcp_port(l: &Listen) -> u16 {
    match l {
        Listen::Tcp(a) => a.port(),
        Listen::Unix(_) => panic!("not tcp"),
    }
}

fn unix_path(l: &Listen) -> PathBuf {
    match l {
        Listen::Unix(p) => p.clone(),
        Listen::Tcp(_) => panic!("not unix"),
    }
}

/// Connects, retrying while a just-started server (or one that has not yet seen the
/// previous client go: qemu-nbd --shared) is not accepting.
fn connect(opts: &ClientOptions) -> Client {
    let t = Instant::now();
    loop {
        match Client::connect(opts) {
            Ok(c) => return c,
            Err(Error::Io(e))
                if t.elapsed() < TIMEOUT
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock
                            | std::io::ErrorKind::ConnectionRefused
                            | std::io::ErrorKind::NotFound
                    ) =>
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("connect: {e}"),
        }
    }
}

/// Writes a pattern, reads it back through a second client, checks it.
fn round_trip(opts: &ClientOptions) {
    let c = connect(opts);
    let data: Vec<u8> = (0..256 * 1024u32)
        .map(|i| (i.wrapping_mul(7) + 3).to_le_bytes()[0])
        .collect();
    c.write_at(&data, 1 << 20, WriteFlags::NONE).expect("write");
    c.flush().expect("flush");
    // qemu-nbd serves a few connections at once (--shared): let these go first.
    drop(c);
    let c2 = connect(opts);
    let mut back = vec![0u8; data.len()];
    c2.read_at(&mut back, 1 << 20).expect("read");
    assert!(back == data, "data read back over TLS differs");
}

#[test]
fn cairn_client_and_server_psk_and_x509() {
    let Some(d) = creds() else { return };
    let p = d.path();
    // PSK, both users of the file, over TCP and the Unix socket.
    let srv = tls_server(ServerTls::psk(&p.join("psk/keys.psk")).unwrap());
    let port = tcp_port(&srv.tcp);
    for user in ["alice", "bob"] {
        round_trip(&uri(&format!(
            "nbds://127.0.0.1:{port}/disk?tls-psk-file={}/psk/keys.psk&tls-username={user}",
            p.display()
        )));
    }
    round_trip(&uri(&format!(
        "nbds+unix:///disk?socket={}&tls-psk-file={}/psk/keys.psk&tls-username=alice",
        unix_path(&srv.unix).display(),
        p.display()
    )));
    // Alice with the wrong key: refused, as a TLS error.
    let wrong = uri(&format!(
        "nbds://127.0.0.1:{port}/disk?tls-psk-file={}/wrong/keys.psk&tls-username=alice",
        p.display()
    ));
    match Client::connect(&wrong) {
        Err(Error::Tls(m)) => eprintln!("wrong PSK refused: {m}"),
        other => panic!("wrong PSK: {other:?}"),
    }
    drop(srv);

    // X.509, with the client's certificate checked too.
    let srv = tls_server(ServerTls::x509(&p.join("pki"), true).unwrap());
    let port = tcp_port(&srv.tcp);
    for host in ["127.0.0.1", "localhost"] {
        round_trip(&uri(&format!(
            "nbds://{host}:{port}/disk?tls-certificates={}/pki",
            p.display()
        )));
    }
    // A client that trusts another CA refuses the server.
    let e = Client::connect(&uri(&format!(
        "nbds://127.0.0.1:{port}/disk?tls-certificates={}/other",
        p.display()
    )))
    .expect_err("wrong CA");
    assert!(matches!(e, Error::Tls(_)), "{e}");
    assert!(e.to_string().contains("certificate"), "{e}");
    // A client without a certificate is refused by a server that checks clients.
    let e = Client::connect(&uri(&format!(
        "nbds://127.0.0.1:{port}/disk?tls-certificates={}/ca-only",
        p.display()
    )))
    .expect_err("no client certificate");
    eprintln!("no client certificate: {e}");
    // A client certificate from another CA, not checking the server: refused too.
    let e = Client::connect(&uri(&format!(
        "nbds://127.0.0.1:{port}/disk?tls-certificates={}/other&tls-verify-peer=false",
        p.display()
    )))
    .expect_err("client certificate from another CA");
    eprintln!("client certificate from another CA: {e}");
}

#[test]
fn require_mode_says_nothing_before_tls() {
    let Some(d) = creds() else { return };
    let srv = tls_server(ServerTls::psk(&d.path().join("psk/keys.psk")).unwrap());
    for addr in srv.addrs() {
        let mut hs = handshake(&addr);
        for (opt, data) in [
            (OPT_LIST, Vec::new()),
            (OPT_INFO, info_request("disk")),
            (OPT_GO, info_request("disk")),
            (OPT_STRUCTURED_REPLY, Vec::new()),
        ] {
            let replies = hs.option(opt, &data).expect("option reply");
            assert_eq!(replies.len(), 1, "option {opt}: {replies:?}");
            assert_eq!(replies[0].reply, REP_ERR_TLS_REQD, "option {opt}");
            assert!(!String::from_utf8_lossy(&replies[0].data).contains("disk"));
        }
        // EXPORT_NAME cannot be refused with a reply: the server hangs up.
        hs.send_option(OPT_EXPORT_NAME, b"disk").unwrap();
        hs.expect_closed()
            .expect("closed after EXPORT_NAME without TLS");
    }
    // A plaintext client (no TLS asked) cannot reach the data.
    let o = ClientOptions::new(srv.tcp.clone(), "disk");
    let e = Client::connect(&o).expect_err("plaintext client");
    assert_eq!(e.option_reply(), Some(REP_ERR_TLS_REQD), "{e}");
}

#[test]
fn list_and_info_negotiate_tls_first() {
    let Some(d) = creds() else { return };
    let p = d.path();
    let srv = tls_server(ServerTls::psk(&p.join("psk/keys.psk")).unwrap());
    let port = tcp_port(&srv.tcp);
    let o = uri(&format!(
        "nbds://127.0.0.1:{port}/disk?tls-psk-file={}/psk/keys.psk&tls-username=alice",
        p.display()
    ));
    let list = Client::list_exports_with(&o).expect("LIST over TLS");
    assert_eq!(
        list.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["disk"]
    );
    let info = Client::query_info_with(&o).expect("INFO over TLS");
    assert_eq!(info.size, 8 << 20);
    // In plaintext: TLS_REQD, as the data connection gets.
    let e = Client::list_exports(&srv.tcp).expect_err("LIST in plaintext");
    assert_eq!(e.option_reply(), Some(REP_ERR_TLS_REQD), "{e}");
    let e = Client::query_info(&srv.tcp, "disk").expect_err("INFO in plaintext");
    assert_eq!(e.option_reply(), Some(REP_ERR_TLS_REQD), "{e}");
    // A wrong key: a TLS error, never a plaintext fallback.
    let wrong = uri(&format!(
        "nbds://127.0.0.1:{port}/disk?tls-psk-file={}/wrong/keys.psk&tls-username=alice",
        p.display()
    ));
    assert!(matches!(
        Client::list_exports_with(&wrong),
        Err(Error::Tls(_))
    ));
}

fn info_request(name: &str) -> Vec<u8> {
    let mut v = u32::try_from(name.len()).unwrap().to_be_bytes().to_vec();
    v.extend_from_slice(name.as_bytes());
    v.extend_from_slice(&0u16.to_be_bytes());
    v
}

#[test]
fn tls_on_serves_plaintext_too_and_a_tls_client_never_falls_back() {
    let Some(d) = creds() else { return };
    let p = d.path();
    let srv = tls_server(
        ServerTls::psk(&p.join("psk/keys.psk"))
            .unwrap()
            .with_required(false),
    );
    let port = tcp_port(&srv.tcp);
    round_trip(&ClientOptions::new(srv.tcp.clone(), "disk"));
    round_trip(&uri(&format!(
        "nbds://127.0.0.1:{port}/disk?tls-psk-file={}/psk/keys.psk&tls-username=alice",
        p.display()
    )));
    drop(srv);
    // A server without TLS: the client asked for it, so it is an error, not plaintext.
    let srv = TestServer::start(vec![export("disk", mem(1 << 20))]);
    let port = tcp_port(&srv.tcp);
    let e = Client::connect(&uri(&format!(
        "nbds://127.0.0.1:{port}/disk?tls-psk-file={}/psk/keys.psk&tls-username=alice",
        p.display()
    )))
    .expect_err("server without TLS");
    assert!(matches!(e, Error::Tls(_)), "{e}");
    assert!(e.to_string().contains("does not offer TLS"), "{e}");
}

/// A server process on a Unix socket, killed on drop.
struct Proc(Child, #[allow(dead_code)] TempDir);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_on_socket(mut cmd: Command, sock: &Path, dir: TempDir) -> Proc {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("start server");
    let p = Proc(child, dir);
    let t = Instant::now();
    while !sock.exists() {
        assert!(t.elapsed() < TIMEOUT, "{cmd:?} did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    p
}

#[test]
fn cairn_client_reads_nbdkit_with_tls_required() {
    let Some(d) = creds() else { return };
    if !have("nbdkit") {
        return;
    }
    let p = d.path();
    for (name, tls_args, query) in [
        (
            "psk",
            vec![format!("--tls-psk={}/psk/keys.psk", p.display())],
            format!("tls-psk-file={}/psk/keys.psk&tls-username=bob", p.display()),
        ),
        (
            "x509",
            vec![
                format!("--tls-certificates={}/pki", p.display()),
                "--tls-verify-peer".to_string(),
            ],
            format!("tls-certificates={}/pki", p.display()),
        ),
    ] {
        let dir = TempDir::new("nbdkit");
        let sock = dir.path().join("nbdkit.sock");
        let mut cmd = Command::new("nbdkit");
        cmd.args(["-f", "--exit-with-parent", "--tls=require", "-U"])
            .arg(&sock)
            .args(&tls_args)
            .args(["memory", "8M"]);
        let _srv = spawn_on_socket(cmd, &sock, dir);
        let opts = uri(&format!("nbds+unix:///?socket={}&{query}", sock.display()));
        round_trip(&opts);
        eprintln!("nbdkit {name}: ok");
        if name == "psk" {
            let e = Client::connect(&uri(&format!(
                "nbds+unix:///?socket={}&tls-psk-file={}/wrong/keys.psk&tls-username=alice",
                sock.display(),
                p.display()
            )))
            .expect_err("wrong PSK against nbdkit");
            assert!(matches!(e, Error::Tls(_)), "{e}");
        } else {
            let e = Client::connect(&uri(&format!(
                "nbds+unix:///?socket={}&tls-certificates={}/other",
                sock.display(),
                p.display()
            )))
            .expect_err("wrong CA against nbdkit");
            assert!(matches!(e, Error::Tls(_)), "{e}");
        }
        // Plaintext against --tls=require gets TLS_REQD, no data.
        let e = Client::connect(&ClientOptions::new(Listen::Unix(sock.clone()), ""))
            .expect_err("plaintext against nbdkit --tls=require");
        assert_eq!(e.option_reply(), Some(REP_ERR_TLS_REQD), "{e}");
    }
}

#[test]
fn cairn_client_reads_qemu_nbd_with_tls_creds() {
    let Some(d) = creds() else { return };
    if !have("qemu-nbd") {
        return;
    }
    let p = d.path();
    for (name, object, query) in [
        (
            "psk",
            format!(
                "tls-creds-psk,id=tls0,endpoint=server,dir={}/psk",
                p.display()
            ),
            format!(
                "tls-psk-file={}/psk/keys.psk&tls-username=alice",
                p.display()
            ),
        ),
        (
            "x509",
            format!(
                "tls-creds-x509,id=tls0,endpoint=server,dir={}/pki,verify-peer=on",
                p.display()
            ),
            format!("tls-certificates={}/pki", p.display()),
        ),
    ] {
        let dir = TempDir::new("qemu");
        let img = dir.path().join("disk.img");
        std::fs::File::create(&img)
            .and_then(|f| f.set_len(8 << 20))
            .expect("image");
        let sock = dir.path().join("qemu.sock");
        let mut cmd = Command::new("qemu-nbd");
        cmd.args([
            "-f",
            "raw",
            "-x",
            "disk",
            "--object",
            &object,
            "--tls-creds",
            "tls0",
            "-k",
        ])
        .arg(&sock)
        .args(["--shared=16", "--persistent"])
        .arg(&img);
        let _srv = spawn_on_socket(cmd, &sock, dir);
        round_trip(&uri(&format!(
            "nbds+unix:///disk?socket={}&{query}",
            sock.display()
        )));
        eprintln!("qemu-nbd {name}: ok");
    }
}

#[test]
fn credentials_are_checked_when_loaded() {
    let Some(d) = creds() else { return };
    let p = d.path();
    // Key and certificate that do not belong together.
    let mixed = TempDir::new("mixed");
    std::fs::copy(
        p.join("pki/server-cert.pem"),
        mixed.path().join("server-cert.pem"),
    )
    .unwrap();
    std::fs::copy(
        p.join("other/server-key.pem"),
        mixed.path().join("server-key.pem"),
    )
    .unwrap();
    let e = ServerTls::x509(mixed.path(), false).unwrap_err();
    assert!(
        e.contains("server-key.pem") && e.contains("mismatch") || e.contains("does not match"),
        "{e}"
    );
    let s = ServerTls::psk(&p.join("psk/keys.psk")).unwrap();
    let shown = format!("{s:?}");
    let file = std::fs::read_to_string(p.join("psk/keys.psk")).unwrap();
    for line in file.lines() {
        let key = line.split(':').nth(1).unwrap();
        assert!(!shown.contains(key), "a key in Debug output");
    }
    let _ = Arc::new(s);
}
