//! The `cairn` binary as a user meets it: messages, `--json`, signals, exit codes.

use std::io::{BufRead, BufReader, Read};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");

/// A directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("cairn-cli-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn file(&self, name: &str, size: u64) -> PathBuf {
        let p = self.0.join(name);
        std::fs::File::create(&p).unwrap().set_len(size).unwrap();
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cairn(args: &[&str]) -> Output {
    Command::new(CAIRN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts a failure printed exactly one `cairn: ` sentence mentioning `needle`.
fn assert_one_sentence_error(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "exit status; stderr: {err}");
    assert!(err.starts_with("cairn: "), "prefix: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains(needle), "{needle:?} in: {err}");
    assert!(
        !err.contains("panicked") && !err.contains("RUST_BACKTRACE"),
        "{err}"
    );
}

/// A running `cairn ... --json` and its announcement.
struct Running {
    child: Child,
    json: Value,
}

impl Running {
    fn start(args: &[&str], envs: &[(&str, &Path)]) -> Running {
        let mut cmd = Command::new(CAIRN);
        cmd.args(args)
            .arg("--json")
            .stdin(Stdio::null())
            .stdout(Stdio::piped());
        cmd.stderr(Stdio::piped());
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        if line.is_empty() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            panic!("cairn printed no announcement; stderr: {err}");
        }
        let json = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
        Running { child, json }
    }

    fn tcp_port(&self) -> u16 {
        let l = self.json["listen"].as_array().unwrap();
        let tcp = l.iter().find(|l| l["type"] == "tcp").unwrap();
        u16::try_from(tcp["port"].as_u64().unwrap()).unwrap()
    }

    fn signal(&self, sig: i32) {
        let pid = i32::try_from(self.child.id()).unwrap();
        // SAFETY: kill has no memory-safety preconditions; pid is our own child.
        assert_eq!(unsafe { libc::kill(pid, sig) }, 0);
    }

    /// Waits for exit, failing the test after `limit`.
    fn wait(mut self, limit: Duration) -> (i32, String) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let mut err = String::new();
                self.child
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                return (status.code().unwrap_or(-1), err);
            }
            if start.elapsed() > limit {
                let _ = self.child.kill();
                panic!("cairn did not exit within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Reads the server's first handshake bytes: proof it is serving NBD there.
fn assert_nbd_greeting(mut s: impl Read) {
    let mut magic = [0u8; 8];
    s.read_exact(&mut magic).unwrap();
    assert_eq!(&magic, b"NBDMAGIC");
}

#[test]
fn missing_file_is_one_clear_sentence() {
    let o = cairn(&["serve", "/nonexistent/cairn-test/disk.img"]);
    assert_one_sentence_error(&o, "/nonexistent/cairn-test/disk.img does not exist");
}

#[test]
fn duplicate_export_names_are_refused() {
    let d = TempDir::new("dup");
    std::fs::create_dir_all(d.0.join("a")).unwrap();
    std::fs::create_dir_all(d.0.join("b")).unwrap();
    let a = d.file("a/disk.img", 1 << 20);
    let b = d.file("b/disk.raw", 1 << 20);
    let o = cairn(&["serve", a.to_str().unwrap(), b.to_str().unwrap()]);
    assert_one_sentence_error(&o, "two exports would be named \"disk\"");
}

#[test]
fn unknown_default_export_is_refused() {
    let d = TempDir::new("defexp");
    let a = d.file("a.img", 1 << 20);
    let sock = d.0.join("s.sock");
    let o = cairn(&[
        "serve",
        "--listen",
        &format!("unix:{}", sock.display()),
        "--default-export",
        "nope",
        a.to_str().unwrap(),
    ]);
    assert_one_sentence_error(
        &o,
        "--default-export \"nope\" is not one of the exports (a)",
    );
}

#[test]
fn busy_socket_is_explained() {
    let d = TempDir::new("busy");
    let a = d.file("a.img", 1 << 20);
    let listen = format!("unix:{}", d.0.join("s.sock").display());
    // Another file: the same one would be refused first, as a second writer.
    let b = d.file("b.img", 1 << 20);
    let first = Running::start(&["serve", "--listen", &listen, a.to_str().unwrap()], &[]);
    let o = cairn(&["serve", "--listen", &listen, b.to_str().unwrap()]);
    assert_one_sentence_error(&o, "--listen unix:PATH");
    first.signal(libc::SIGTERM);
    assert_eq!(first.wait(Duration::from_secs(15)).0, 0);
}

#[test]
fn help_teaches() {
    let o = cairn(&["--help"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success());
    assert!(
        out.contains("Examples:") && out.contains("cairn quickstart"),
        "{out}"
    );
    let o = cairn(&["serve", "--help"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("FILE:NAME") && out.contains("SIGTERM"),
        "{out}"
    );
    let o = cairn(&["quickstart", "--help"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("sparse"));
}

#[test]
fn serve_json_then_sigterm_exits_zero() {
    let d = TempDir::new("serve");
    let a = d.file("vol0.img", 4 << 20);
    // One writer per file: the export named "data" is another file.
    let b = d.file("other.img", 4 << 20);
    let sock = d.0.join("nbd.sock");
    let run = Running::start(
        &[
            "serve",
            "--listen",
            &format!("unix:{}", sock.display()),
            "--listen",
            "tcp:127.0.0.1:0",
            &format!("{}:data", b.display()),
            a.to_str().unwrap(),
        ],
        &[],
    );
    let j = &run.json;
    assert_eq!(j["exports"][0]["name"], "data");
    assert_eq!(j["exports"][1]["name"], "vol0");
    assert_eq!(j["exports"][0]["size"], 4 << 20);
    assert_eq!(j["exports"][0]["read_only"], false);
    assert_eq!(j["default_export"], Value::Null);
    assert_eq!(
        j["exports"][1]["uris"][0],
        format!("nbd+unix:///vol0?socket={}", sock.display())
    );
    let port = run.tcp_port();
    assert_ne!(port, 0, "the real port is announced, not 0");
    assert_eq!(
        j["exports"][1]["uris"][1],
        format!("nbd://127.0.0.1:{port}/vol0")
    );

    assert_nbd_greeting(TcpStream::connect(("127.0.0.1", port)).unwrap());
    assert_nbd_greeting(std::os::unix::net::UnixStream::connect(&sock).unwrap());

    run.signal(libc::SIGTERM);
    let (code, err) = run.wait(Duration::from_secs(15));
    assert_eq!(code, 0, "stderr: {err}");
    assert!(err.contains("stopped cleanly"), "{err}");
    assert!(!sock.exists(), "the socket file is removed on exit");
}

#[test]
fn quickstart_works_with_no_arguments() {
    let d = TempDir::new("quick");
    let run_dir = d.0.join("run");
    std::fs::create_dir_all(&run_dir).unwrap();
    let home = d.0.join("home");
    let run = Running::start(
        &["quickstart"],
        &[("HOME", &home), ("XDG_RUNTIME_DIR", &run_dir)],
    );
    let dir = home.join(".local/share/cairn");
    assert_eq!(run.json["quickstart"]["created"], true);
    assert_eq!(
        run.json["quickstart"]["members"][0],
        dir.join("demo-raid6-0.img").to_str().unwrap()
    );
    assert_eq!(run.json["quickstart"]["md"]["level"], "raid6");
    assert_eq!(run.json["quickstart"]["md"]["chunk_kib"], 64);
    // RAID6 -> LUKS2 -> LVM: VG "demo" with home and media sharing the 1 GiB.
    assert_eq!(run.json["exports"][0]["name"], "demo/home");
    assert_eq!(run.json["exports"][1]["name"], "demo/media");
    let total = run.json["exports"][0]["size"].as_u64().unwrap()
        + run.json["exports"][1]["size"].as_u64().unwrap();
    assert_eq!(total, 1u64 << 30);
    assert_eq!(run.json["exports"][0]["optimal_io_size"], 128 << 10);
    let pv = &run.json["exports"][0]["lvm"]["pvs"][0];
    assert_eq!(pv["luks"]["version"], 2);
    assert_eq!(pv["luks"]["sector_size"], 4096);
    assert_eq!(pv["md"]["level"], "raid6");
    assert_eq!(run.json["exports"][0]["lvm"]["vg"], "demo");
    assert_eq!(run.json["quickstart"]["lvm"]["vg"], "demo");
    assert_eq!(run.json["quickstart"]["luks"]["demo_key"], true);
    let key = dir.join("demo.key");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "demo key file mode");
    // Sparse apart from the superblocks and the LUKS2 header area (16 MiB over the
    // array, zeroed as luksFormat does: 8 MiB per member).
    for i in 0..4 {
        let meta = std::fs::metadata(dir.join(format!("demo-raid6-{i}.img"))).unwrap();
        assert!(
            std::os::unix::fs::MetadataExt::blocks(&meta) < 12 * 2048,
            "demo member {i} is sparse"
        );
    }
    assert!(run_dir.join("cairn/nbd.sock").exists());
    assert_nbd_greeting(TcpStream::connect(("127.0.0.1", run.tcp_port())).unwrap());
    run.signal(libc::SIGINT);
    let (code, err) = run.wait(Duration::from_secs(15));
    assert_eq!(code, 0, "stderr: {err}");
}

/// `cairn luks`: format, test with the right and a wrong passphrase (cryptsetup's
/// sentence and exit status 2), dump --json, serve --luks; no passphrase in any output.
#[test]
fn luks_format_test_dump_and_wrong_passphrase() {
    let d = TempDir::new("luks");
    let img = d.file("vol.img", 20 << 20);
    let key = d.0.join("key");
    let bad = d.0.join("bad");
    std::fs::write(&key, b"right horse").unwrap();
    std::fs::write(&bad, b"wrong horse").unwrap();
    let (img_s, key_s, bad_s) = (
        img.to_str().unwrap(),
        key.to_str().unwrap(),
        bad.to_str().unwrap(),
    );
    let cheap = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
    // Without -q and without a terminal: refused, nothing written.
    let o = cairn(
        &[
            &["luks", "format", "--key-file", key_s][..],
            &cheap,
            &[img_s],
        ]
        .concat(),
    );
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("--batch-mode"), "{}", stderr(&o));
    let o = cairn(
        &[
            &[
                "luks",
                "format",
                "-q",
                "--sector-size",
                "4096",
                "--key-file",
                key_s,
            ][..],
            &cheap,
            &[img_s],
        ]
        .concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    // A second format finds the LUKS signature.
    let o = cairn(
        &[
            &["luks", "format", "-q", "--key-file", key_s][..],
            &cheap,
            &[img_s],
        ]
        .concat(),
    );
    assert_one_sentence_error(&o, "LUKS");
    let o = cairn(&["luks", "test", "--key-file", key_s, img_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "Key slot 0 unlocked.\n");
    let o = cairn(&["luks", "test", "--key-file", bad_s, img_s]);
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(
        stderr(&o),
        "cairn: No key available with this passphrase.\n"
    );
    let o = cairn(&["luks", "dump", "--json", img_s]);
    assert!(o.status.success(), "{}", stderr(&o));
    let j: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["segments"][0]["sector_size"], 4096);
    assert_eq!(j["keyslots"][0]["key_bits"], 512);
    let o = cairn(&[
        "serve",
        "--listen",
        "unix:/nonexistent/x.sock",
        "--luks",
        img_s,
        "--key-file",
        bad_s,
    ]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    for out in [&o.stdout, &o.stderr] {
        let t = String::from_utf8_lossy(out);
        assert!(!t.contains("horse"), "a passphrase in the output: {t}");
    }
}
