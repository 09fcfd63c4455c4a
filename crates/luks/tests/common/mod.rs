//! Shared by the LUKS tests: where the vectors are, decompressed cryptsetup images,
//! temporary directories, the real tools (skipped loudly when missing, failing when
//! `CI=true`), read-only loop devices that are detached even when a test fails.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cairn_block::{BlockDevice, FileDisk, MemDisk, OpenOptions};
use sha2::Digest;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;

pub fn vectors_dir() -> PathBuf {
    let dir = std::env::var_os("CAIRN_VECTORS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors")
        });
    assert!(
        dir.join("crypto").is_dir(),
        "vectors not found at {} — set CAIRN_VECTORS to the shared vectors directory",
        dir.display()
    );
    dir
}

pub fn load_json(rel: &str) -> serde_json::Value {
    let p = vectors_dir().join(rel);
    let t = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&t).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// A test-sized `u64` as a `usize`.
pub fn us(v: u64) -> usize {
    usize::try_from(v).expect("fits in usize")
}

pub fn hex(s: &str) -> Vec<u8> {
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

pub fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

pub fn sha256_hex(b: &[u8]) -> String {
    to_hex(&sha2::Sha256::digest(b))
}

/// Whether a missing tool must fail the test (CI) rather than skip it.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Finds a tool on PATH or in the sbin directories.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let found = path
        .split(':')
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file());
    found
}

/// The tool, or `None` after printing "SKIP: …" (a panic when `CI=true`).
pub fn require_tool(name: &str, test: &str) -> Option<PathBuf> {
    match find_tool(name) {
        Some(p) => Some(p),
        None if in_ci() => {
            panic!("{test}: {name} is not installed (CI=true: a missing tool fails)")
        }
        None => {
            eprintln!(
                "SKIP: {test}: {name} is not installed (bash scripts/install-deps.sh installs it)"
            );
            None
        }
    }
}

/// A directory under the target dir, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(what: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let base = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
        let d = base.join(format!(
            "luks-{what}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("create temp dir");
        TempDir(d)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if std::env::var_os("CAIRN_KEEP_TMP").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// A cryptsetup test image from `vectors/luks-images/`, decompressed once into the target
/// dir (the copy is shared between tests: open it read-only, or copy it).
pub fn image(name: &str) -> Option<PathBuf> {
    let src = vectors_dir().join("luks-images").join(format!("{name}.xz"));
    assert!(src.is_file(), "{} missing", src.display());
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("luks-images");
    std::fs::create_dir_all(&dir).expect("create image dir");
    let dst = dir.join(name);
    if dst.is_file() {
        return Some(dst);
    }
    let xz = require_tool("xz", &format!("image {name}"))?;
    let tmp = dir.join(format!("{name}.tmp.{}", std::process::id()));
    let out = Command::new(xz)
        .arg("-dc")
        .arg(&src)
        .output()
        .expect("run xz");
    assert!(
        out.status.success(),
        "xz -dc {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let sums = std::fs::read_to_string(vectors_dir().join("luks-images/SHA256SUMS")).unwrap();
    let want = sums
        .lines()
        .find_map(|l| {
            l.split_once("  ")
                .filter(|(_, n)| *n == name)
                .map(|(h, _)| h)
        })
        .unwrap_or_else(|| panic!("{name} not in SHA256SUMS"));
    assert_eq!(
        sha256_hex(&out.stdout),
        want,
        "{name}: decompressed image differs from SHA256SUMS"
    );
    std::fs::write(&tmp, &out.stdout).expect("write image");
    std::fs::rename(&tmp, &dst).expect("rename image");
    Some(dst)
}

/// Opens a file as a block device (read-only or read-write).
pub fn file_disk(path: &Path, writable: bool) -> Arc<dyn BlockDevice> {
    let d = FileDisk::open(
        path,
        &OpenOptions {
            read_only: !writable,
            ..Default::default()
        },
    )
    .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Arc::new(d)
}

/// A memory disk holding a copy of a file.
pub fn mem_copy(path: &Path) -> Arc<MemDisk> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Arc::new(MemDisk::from_bytes(&b))
}

/// Runs a command; returns its output (never panics on a non-zero exit).
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

pub fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A read-only loop device over a file, detached on drop (also when the test panics).
pub struct Loop(pub String);

impl Loop {
    pub fn ro(file: &Path) -> Loop {
        let out = run(Command::new("losetup")
            .args(["-r", "-f", "--show"])
            .arg(file));
        assert!(
            out.status.success(),
            "losetup -r {}: {}",
            file.display(),
            text(&out)
        );
        Loop(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }

    pub fn path(&self) -> &str {
        &self.0
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").args(["-d", &self.0]).status();
    }
}

/// cryptsetup, or a loud skip (a failure in CI). Also checks that loop devices work,
/// since every check runs on a read-only loop device.
pub fn cryptsetup(test: &str) -> Option<PathBuf> {
    let c = require_tool("cryptsetup", test)?;
    require_tool("losetup", test)?;
    Some(c)
}

/// Writes a passphrase file exactly (no trailing newline).
pub fn pass_file(dir: &TempDir, name: &str, pass: &[u8]) -> PathBuf {
    let p = dir.path(name);
    std::fs::write(&p, pass).expect("write pass file");
    p
}
