//! One writer per file: a FileDisk opened for writing refuses a second writer (in this
//! process or another, named), lets readers in with a note that it is being written, and
//! lets go when it is dropped.

mod common;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, ErrorKind, FileDisk, InUse, OpenOptions, WriteFlags};
use common::{scratch_dir, TempFile};

const SIZE: u64 = 1 << 20;

/// The two tests run one at a time: the other one forks a child, and until the child
/// execs it holds a copy of every descriptor of this process, locks included, which a
/// lock test running meanwhile would see as a second holder.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn rw() -> OpenOptions {
    OpenOptions {
        create_size: Some(SIZE),
        ..OpenOptions::default()
    }
}

fn ro() -> OpenOptions {
    OpenOptions {
        read_only: true,
        ..OpenOptions::default()
    }
}

#[test]
fn second_writer_in_this_process_is_refused_and_readers_are_told() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let tmp = TempFile::new(&scratch_dir(), "owner");
    let first = FileDisk::open(&tmp.0, &rw()).unwrap();
    assert!(
        first.in_use().is_none(),
        "a writer is not told about itself"
    );

    let err = FileDisk::open(&tmp.0, &rw()).expect_err("a second writer was let in");
    assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    let holder = InUse::of(&err).expect("the error names the holder");
    assert!(holder.this_process, "{holder:?}");
    assert_eq!(holder.pid, Some(std::process::id()), "{holder:?}");
    assert!(
        err.to_string()
            .contains("already open for writing in this process"),
        "{err}"
    );

    // A reader gets in, reads what the writer wrote, and is told someone writes it.
    first.write_at(&[7u8; 4096], 0, WriteFlags::NONE).unwrap();
    let reader = FileDisk::open(&tmp.0, &ro()).unwrap();
    let mut buf = [0u8; 4096];
    reader.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [7u8; 4096]);
    assert!(
        reader.in_use().is_some_and(|h| h.this_process),
        "{:?}",
        reader.in_use()
    );
    // The reader holds nothing: dropping the writer frees the file for the next one,
    // even with the reader still open.
    drop(first);
    let second = FileDisk::open(&tmp.0, &rw()).expect("the first writer is gone");
    drop(second);
    let calm = FileDisk::open(&tmp.0, &ro()).unwrap();
    assert!(calm.in_use().is_none(), "nobody writes it now");
    drop(reader);
}

/// Kills and reaps the child on every way out of the test.
struct Holder(Child);

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_writer_in_another_process_is_named() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let help = Command::new("flock").arg("--help").output();
    if !help.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("--no-fork")) {
        eprintln!("SKIP: no flock(1) with --no-fork (util-linux 2.36 or later)");
        return;
    }
    let tmp = TempFile::new(&scratch_dir(), "owner-other");
    drop(FileDisk::open(&tmp.0, &rw()).unwrap());
    // --no-fork: the holder is the process we kill, not a child that would inherit it.
    let child = Command::new("flock")
        .args(["--exclusive", "--no-fork"])
        .arg(&tmp.0)
        .args(["sleep", "60"])
        .spawn()
        .unwrap();
    let holder = Holder(child);
    let pid = holder.0.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    let err = loop {
        match FileDisk::open(&tmp.0, &rw()) {
            Err(e) => break e,
            Ok(d) => {
                drop(d);
                assert!(Instant::now() < deadline, "flock(1) never took its lock");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    assert_eq!(err.kind(), ErrorKind::Busy, "{err}");
    let who = InUse::of(&err).expect("names the holder");
    assert_eq!(who.pid, Some(pid), "{who:?}");
    assert!(!who.this_process);
    let shown = err.to_string();
    assert!(
        shown.contains(&format!("in use by PID {pid} (sleep 60)")),
        "{shown}"
    );
    let reader = FileDisk::open(&tmp.0, &ro()).expect("readers are let in");
    assert_eq!(reader.in_use().and_then(|h| h.pid), Some(pid));
    drop(holder);
    FileDisk::open(&tmp.0, &rw()).expect("free again once the holder is gone");
}
