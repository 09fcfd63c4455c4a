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

/// An etcd of its own on 127.0.0.1 (random ports, a temporary data dir), stopped on drop.
pub struct TestEtcd {
    pub url: String,
    child: Child,
    _dir: TempDir,
}

impl TestEtcd {
    /// `None` (and a loud message) when the etcd binary is missing.
    pub fn start() -> Option<TestEtcd> {
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
        for _ in 0..20 {
            let client = free_port();
            let peer = free_port();
            let url = format!("http://127.0.0.1:{client}");
            let peer_url = format!("http://127.0.0.1:{peer}");
            let log = std::fs::File::create(dir.path().join("etcd.log")).expect("log");
            let mut child = Command::new(bin)
                .arg("--name")
                .arg("t")
                .arg("--data-dir")
                .arg(dir.path().join("data"))
                .arg("--listen-client-urls")
                .arg(&url)
                .arg("--advertise-client-urls")
                .arg(&url)
                .arg("--listen-peer-urls")
                .arg(&peer_url)
                .arg("--initial-advertise-peer-urls")
                .arg(&peer_url)
                .arg("--initial-cluster")
                .arg(format!("t={peer_url}"))
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start etcd");
            let t0 = Instant::now();
            while t0.elapsed() < Duration::from_secs(20) {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // port taken: try others
                }
                let e = cairn_cluster::Etcd::new(&url).unwrap();
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
        }
        panic!("etcd did not start; see its log");
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
