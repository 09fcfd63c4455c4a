#![allow(dead_code)] // each test binary uses a different part of this module

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, MemDisk};
use cairn_cluster::{OwnerId, RecordStore};
use cairn_nbd::client::ClientOptions;
use cairn_nbd::{Export, Listen, Server, ServerConfig, ShutdownHandle};

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "cairn-cluster-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&p).expect("temp dir");
        TempDir(p)
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A member server in this process: one export "disk" over a device, on a Unix socket.
pub struct Member {
    pub listen: Listen,
    handle: ShutdownHandle,
    thread: Option<JoinHandle<std::io::Result<()>>>,
    _dir: TempDir,
}

impl Member {
    /// `fence`: whether the server enforces owners (cairn serve's disk-host role) or is a
    /// plain server (standing in for nbdkit / qemu-nbd).
    pub fn start(dev: Arc<dyn BlockDevice>, fence: bool) -> Member {
        let store: Option<Arc<dyn cairn_nbd::fence::FenceStore>> = if fence {
            Some(Arc::new(RecordStore))
        } else {
            None
        };
        Member::start_with_store(dev, store)
    }

    /// [`Member::start`] with this record store (`None`: a plain server).
    pub fn start_with_store(
        dev: Arc<dyn BlockDevice>,
        store: Option<Arc<dyn cairn_nbd::fence::FenceStore>>,
    ) -> Member {
        let mut config = ServerConfig::new(vec![Export {
            name: "disk".into(),
            description: String::new(),
            device: dev,
            read_only: false,
        }]);
        config.shutdown_grace = Duration::from_secs(5);
        config.fence = store;
        let dir = TempDir::new("member");
        let server = Server::new(config).expect("server");
        let listeners = server
            .bind(&[Listen::Unix(dir.path().join("nbd.sock"))])
            .expect("bind");
        let listen = listeners.addresses()[0].clone();
        let handle = server.shutdown_handle();
        let thread = std::thread::spawn(move || server.serve(listeners));
        Member {
            listen,
            handle,
            thread: Some(thread),
            _dir: dir,
        }
    }

    pub fn options(&self) -> ClientOptions {
        let mut o = ClientOptions::new(self.listen.clone(), "disk");
        o.timeout = Some(Duration::from_secs(10));
        o
    }

    pub fn stop(&mut self) {
        self.handle.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn mem(size: u64) -> Arc<MemDisk> {
    Arc::new(MemDisk::new(size))
}

pub fn owner(node: &str, instance: u64) -> OwnerId {
    OwnerId::new(node, instance).unwrap()
}

/// A test CA, a server certificate it signed for 127.0.0.1 and localhost, a client
/// certificate it signed, and a second CA that signed nothing, made with the openssl
/// command (`None`, loudly, when it is missing).
pub struct TestCerts {
    dir: TempDir,
}

impl TestCerts {
    pub fn make() -> Option<TestCerts> {
        if Command::new("openssl").arg("version").output().is_err() {
            eprintln!("\n*** SKIPPED: the openssl command is not installed ***\n");
            assert!(
                std::env::var_os("CAIRN_REQUIRE_ETCD").is_none(),
                "CAIRN_REQUIRE_ETCD is set but openssl is missing"
            );
            return None;
        }
        let dir = TempDir::new("certs");
        let run = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir.path())
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for ca in ["ca", "other-ca"] {
            let (key, cert, subj) = (
                format!("{ca}-key.pem"),
                format!("{ca}.pem"),
                format!("/CN=cairn test {ca}"),
            );
            let mut args = vec![
                "req", "-x509", "-days", "2", "-subj", &subj, "-keyout", &key, "-out", &cert,
            ];
            args.extend(ec);
            args.extend([
                "-addext",
                "basicConstraints=critical,CA:TRUE",
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign",
            ]);
            run(&args);
        }
        for (who, ext) in [
            // etcd's JSON gateway dials etcd's own gRPC port with the server certificate as
            // its client certificate: it serves both ends.
            (
                "server",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\n\
                 extendedKeyUsage=serverAuth,clientAuth\n",
            ),
            ("client", "extendedKeyUsage=clientAuth\n"),
        ] {
            let (key, csr, cert, extfile) = (
                format!("{who}-key.pem"),
                format!("{who}.csr"),
                format!("{who}.pem"),
                format!("{who}.ext"),
            );
            std::fs::write(dir.path().join(&extfile), ext).expect("ext file");
            let subj = format!("/CN=cairn test {who}");
            let mut args = vec!["req", "-subj", &subj, "-keyout", &key, "-out", &csr];
            args.extend(ec);
            run(&args);
            run(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca-key.pem",
                "-CAcreateserial",
                "-days",
                "2",
                "-extfile",
                &extfile,
                "-out",
                &cert,
            ]);
        }
        Some(TestCerts { dir })
    }

    /// `ca.pem`, `server.pem`, `client-key.pem`, `other-ca.pem`, ...
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// What a client of the test etcd uses: the CA, the client certificate and its key.
    pub fn client(&self) -> cairn_cluster::EtcdTls {
        cairn_cluster::EtcdTls {
            cacert: Some(self.file("ca.pem")),
            cert: Some(self.file("client.pem")),
            key: Some(self.file("client-key.pem")),
        }
    }
}

/// An etcd of its own on 127.0.0.1 (random ports, a temporary data dir), stopped on drop.
pub struct TestEtcd {
    pub url: String,
    child: Child,
    _dir: TempDir,
}

impl TestEtcd {
    /// `None` (and a loud message) when the etcd binary is missing.
    pub fn start() -> Option<TestEtcd> {
        TestEtcd::start_with(None, &[])
    }

    /// Clients over TLS only, with client certificates required (etcd's
    /// `--client-cert-auth`) signed by `certs`' CA. Besides `url` (127.0.0.1, which the
    /// server certificate names), it serves clients on `also` (other addresses, same port).
    pub fn start_with(certs: Option<&TestCerts>, also: &[&str]) -> Option<TestEtcd> {
        TestEtcd::start_args(certs, also, &[])
    }

    /// [`TestEtcd::start_with`], with more arguments for etcd.
    pub fn start_args(
        certs: Option<&TestCerts>,
        also: &[&str],
        extra: &[&str],
    ) -> Option<TestEtcd> {
        let bin = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
            .into_iter()
            .find(|p| Path::new(p).exists());
        let Some(bin) = bin else {
            eprintln!(
                "\n*** SKIPPED: etcd is not installed (Debian package etcd-server; \
                 scripts/install-deps.sh installs it) ***\n"
            );
            assert!(
                std::env::var_os("CAIRN_REQUIRE_ETCD").is_none(),
                "CAIRN_REQUIRE_ETCD is set but etcd is missing"
            );
            return None;
        };
        let dir = TempDir::new("etcd");
        let scheme = if certs.is_some() { "https" } else { "http" };
        for _ in 0..20 {
            let client = free_port();
            let peer = free_port();
            let url = format!("{scheme}://127.0.0.1:{client}");
            let mut listen = vec![url.clone()];
            listen.extend(also.iter().map(|a| format!("{scheme}://{a}:{client}")));
            let peer_url = format!("http://127.0.0.1:{peer}");
            let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log");
            let mut cmd = Command::new(bin);
            cmd.arg("--name")
                .arg("t")
                .arg("--data-dir")
                .arg(dir.path().join("data"))
                .arg("--listen-client-urls")
                .arg(listen.join(","))
                .arg("--advertise-client-urls")
                .arg(&url)
                .arg("--listen-peer-urls")
                .arg(&peer_url)
                .arg("--initial-advertise-peer-urls")
                .arg(&peer_url)
                .arg("--initial-cluster")
                .arg(format!("t={peer_url}"));
            cmd.args(extra);
            if let Some(c) = certs {
                cmd.arg("--cert-file")
                    .arg(c.file("server.pem"))
                    .arg("--key-file")
                    .arg(c.file("server-key.pem"))
                    .arg("--trusted-ca-file")
                    .arg(c.file("ca.pem"))
                    .arg("--client-cert-auth");
            }
            let mut child = cmd
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start etcd");
            let e = match certs {
                Some(c) => cairn_cluster::Etcd::with_tls(&url, &c.client()).unwrap(),
                None => cairn_cluster::Etcd::new(&url).unwrap(),
            };
            let t0 = Instant::now();
            let mut exited = false;
            while t0.elapsed() < Duration::from_secs(20) {
                if let Ok(Some(_)) = child.try_wait() {
                    exited = true; // port taken: try others
                    break;
                }
                if e.grant(1).is_ok() {
                    return Some(TestEtcd {
                        url,
                        child,
                        _dir: dir,
                    });
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = child.kill();
            let _ = child.wait();
            if !exited {
                break; // running but not answering: trying other ports will not help
            }
        }
        panic!(
            "etcd did not start; its log: {}",
            std::fs::read_to_string(dir.path().join("etcd.log")).unwrap_or_default()
        );
    }
}

impl TestEtcd {
    /// One v3 gateway call over plain HTTP, for what cairn's client does not do (users,
    /// roles): the answer's body, after checking it is a 200.
    pub fn call(&self, path: &str, body: &str, token: Option<&str>) -> String {
        use std::io::{Read, Write};
        let authority = self.url.strip_prefix("http://").expect("a plain etcd");
        let mut s = std::net::TcpStream::connect(authority).expect("connect to etcd");
        let auth = token.map_or(String::new(), |t| format!("Authorization: {t}\r\n"));
        write!(
            s,
            "POST {path} HTTP/1.1\r\nHost: {authority}\r\n{auth}Content-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200"), "{path}: {out}");
        out.split_once("\r\n\r\n").unwrap().1.to_string()
    }

    /// Turns on authentication: users root and `user` (password `password`, read and
    /// write on every key).
    pub fn enable_auth(&self, user: &str, password: &str) {
        self.call(
            "/v3/auth/user/add",
            r#"{"name":"root","password":"root-pw"}"#,
            None,
        );
        self.call(
            "/v3/auth/user/grant",
            r#"{"user":"root","role":"root"}"#,
            None,
        );
        self.call("/v3/auth/role/add", r#"{"name":"rw"}"#, None);
        // key "\0", range_end "\0": every key.
        self.call(
            "/v3/auth/role/grant",
            r#"{"name":"rw","perm":{"permType":"READWRITE","key":"AA==","range_end":"AA=="}}"#,
            None,
        );
        self.call(
            "/v3/auth/user/add",
            &format!(r#"{{"name":"{user}","password":"{password}"}}"#),
            None,
        );
        self.call(
            "/v3/auth/user/grant",
            &format!(r#"{{"user":"{user}","role":"rw"}}"#),
            None,
        );
        self.call("/v3/auth/enable", "{}", None);
    }
}

impl Drop for TestEtcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}
