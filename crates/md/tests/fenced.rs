//! An array whose host no longer owns it (its ownership lease ran out, or a newer owner
//! generation took the members over, docs/fencing.md) is fenced: its background work
//! stops, nothing more reaches the members, and no member is failed for refusing.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_block::{
    BlockDevice, Capabilities, Error, ErrorKind, Geometry, MemDisk, Result, WriteFlags,
};
use cairn_md::{Array, Level, MemberState, SpeedLimits};
use common::{names, Shape};

/// A member that refuses everything with [`ErrorKind::Fenced`] once its gate is shut, as
/// a member behind a lost lease or on a server that admitted a newer owner does.
#[derive(Debug)]
struct Gate {
    inner: Arc<MemDisk>,
    shut: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
}

impl Gate {
    fn pass(&self) -> Result<()> {
        if !self.shut.load(Ordering::Acquire) {
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(Error::new(ErrorKind::Fenced, "ownership lease lost"))
    }
}

impl BlockDevice for Gate {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.pass()?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.pass()?;
        self.inner.write_at(buf, offset, flags)
    }
    fn flush(&self) -> Result<()> {
        self.pass()?;
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.pass()?;
        self.inner.discard(offset, len)
    }
}

struct Fixture {
    array: Arc<Array>,
    members: Vec<Arc<MemDisk>>,
    shut: Arc<AtomicBool>,
    refused: Arc<AtomicU64>,
}

/// A RAID5 created over old data (so a resync is pending), its members behind one gate,
/// resyncing slowly in the background.
fn resyncing() -> Fixture {
    let shape = Shape::new(Level::Raid5, None, 16, 4).rows(64);
    let members: Vec<Arc<MemDisk>> = shape
        .member_bytes()
        .into_iter()
        .enumerate()
        .map(|(i, b)| {
            let old: Vec<u8> = (0..b)
                .map(|x| u8::try_from(x % 251).unwrap() ^ u8::try_from(i).unwrap())
                .collect();
            Arc::new(MemDisk::from_bytes(&old))
        })
        .collect();
    let shut = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU64::new(0));
    let devs: Vec<Arc<dyn BlockDevice>> = members
        .iter()
        .map(|m| {
            Arc::new(Gate {
                inner: m.clone(),
                shut: shut.clone(),
                refused: refused.clone(),
            }) as Arc<dyn BlockDevice>
        })
        .collect();
    let mut o = shape.create_options();
    o.members_zeroed = false;
    o.force = true;
    let array = Arc::new(Array::create(devs, names(members.len()), &o).unwrap());
    let total = array.geometry().size;
    // A few stripes per 100 ms: still running when the test looks.
    let slow = SpeedLimits {
        min: total / 40,
        max: total / 40,
    };
    assert!(array.start_resync(slow).unwrap());
    let t0 = Instant::now();
    while array.background().unwrap().done_bytes == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the resync never moved"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Fixture {
        array,
        members,
        shut,
        refused,
    }
}

fn snapshot(members: &[Arc<MemDisk>]) -> Vec<Vec<u8>> {
    members
        .iter()
        .map(|m| {
            let mut b = vec![0u8; usize::try_from(m.geometry().size).unwrap()];
            m.read_at(&mut b, 0).unwrap();
            b
        })
        .collect()
}

fn wait_until(what: &str, cond: impl Fn() -> bool) {
    let t0 = Instant::now();
    while !cond() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// What a fenced array must look like: FENCED, every member still in sync, the
/// background work over, client I/O and closing refused as Fenced; and (with the gate
/// open again, so only the array itself could stop them) no byte written to a member.
fn check_fenced(f: &Fixture) {
    let a = &f.array;
    wait_until("the resync did not stop", || {
        a.background().unwrap().state != "running"
    });
    let r = a.report();
    assert!(r.state.fenced, "{}", r.state_text);
    assert!(r.state_text.contains("FENCED"), "{}", r.state_text);
    assert!(
        r.members.iter().all(|m| m.state == MemberState::ActiveSync),
        "a member was failed for refusing: {r}"
    );
    assert!(a.fenced().is_some());
    // Whatever was in flight has ended: from here on nothing may reach a member.
    std::thread::sleep(Duration::from_millis(200));
    f.shut.store(false, Ordering::Release);
    let before = snapshot(&f.members);
    let refused = f.refused.load(Ordering::Relaxed);
    let kind = |r: Result<()>| r.unwrap_err().kind();
    assert_eq!(
        kind(a.write_at(&[7u8; 4096], 0, WriteFlags::NONE)),
        ErrorKind::Fenced
    );
    let mut buf = [0u8; 4096];
    assert_eq!(kind(a.read_at(&mut buf, 0)), ErrorKind::Fenced);
    assert_eq!(kind(a.flush()), ErrorKind::Fenced);
    assert_eq!(kind(a.close()), ErrorKind::Fenced);
    assert!(a.is_closed());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(f.refused.load(Ordering::Relaxed), refused);
    assert!(
        snapshot(&f.members) == before,
        "the fenced array wrote to its members"
    );
}

/// A member refuses (the lease's check below it, or a member server that admitted a
/// newer owner) while the resync writes: the array fences itself at the first refusal.
#[test]
fn a_member_refusing_as_fenced_freezes_the_array_instead_of_failing_it() {
    let f = resyncing();
    f.shut.store(true, Ordering::Release);
    wait_until("the array did not fence itself", || {
        f.array.fenced().is_some()
    });
    assert!(f.refused.load(Ordering::Relaxed) > 0);
    // No more attempts once fenced: the background work has stopped trying.
    wait_until("the resync did not stop", || {
        f.array.background().unwrap().state != "running"
    });
    let n = f.refused.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        f.refused.load(Ordering::Relaxed),
        n,
        "still trying the members"
    );
    check_fenced(&f);
}

/// The lease's watcher learns of the loss first and fences the array itself, while the
/// members still take writes: the array stops writing on its own.
#[test]
fn fence_stops_the_background_work_and_every_write() {
    let f = resyncing();
    f.array
        .fence("etcd lease 1 for /cairn/arrays/x/owner: etcd expired it");
    check_fenced(&f);
}
