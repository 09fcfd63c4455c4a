//! Helpers shared by the integration tests: scratch files that clean up after themselves.

#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use cairn_block::{ErrorKind, FileDisk, OpenOptions};

/// A scratch directory for sparse files: tmpfs when available (fast, supports holes),
/// otherwise the system temp dir.
pub fn scratch_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() && tempfile_writable(shm) {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

fn tempfile_writable(dir: &Path) -> bool {
    let p = unique_path(dir, "probe");
    let ok = std::fs::write(&p, b"x").is_ok();
    let _ = std::fs::remove_file(&p);
    ok
}

/// A path no other test (or test process) uses.
pub fn unique_path(dir: &Path, tag: &str) -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("cairn-test-{tag}-{}-{n}.img", std::process::id()))
}

/// Removes the file when dropped, so a failing test leaves nothing behind.
#[derive(Debug)]
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(dir: &Path, tag: &str) -> TempFile {
        TempFile(unique_path(dir, tag))
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A FileDisk over a new sparse file of `size` bytes in `dir`. The file is unlinked as
/// soon as it is open: the descriptor keeps it alive and nothing is left on disk.
pub fn anonymous_file_disk(dir: &Path, size: u64, direct: bool) -> cairn_block::Result<FileDisk> {
    let tmp = TempFile::new(dir, "disk");
    FileDisk::open(
        &tmp.0,
        &OpenOptions {
            read_only: false,
            direct,
            create_size: Some(size),
        },
    )
}

/// Whether `dir`'s filesystem takes O_DIRECT; prints why not when it does not.
pub fn direct_io_supported(dir: &Path) -> bool {
    match anonymous_file_disk(dir, 1 << 20, true) {
        Ok(disk) => {
            use cairn_block::BlockDevice;
            let mut buf = vec![0u8; disk.geometry().logical_block_size as usize];
            match disk.read_at(&mut buf, 0) {
                Ok(()) => true,
                Err(e) => {
                    eprintln!("SKIP: O_DIRECT reads fail on {}: {e}", dir.display());
                    false
                }
            }
        }
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::InvalidArgument | ErrorKind::Unsupported
            ) =>
        {
            eprintln!("SKIP: {} does not support O_DIRECT: {e}", dir.display());
            false
        }
        Err(e) => panic!("opening a scratch file in {} failed: {e}", dir.display()),
    }
}
