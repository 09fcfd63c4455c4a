//! Discards of linear and striped LVs over PVs that complete later (network PVs): one
//! discard per PV (a PV's stripe chunks joined), every one outstanding at once and sent
//! from the caller's thread; the LV's contents afterwards; a PV that fails discards.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::ThreadId;

use cairn_block::testkit::{DelayDisk, FaultyDisk, Gate, Op};
use cairn_block::{
    BlockDevice, Capabilities, ErrorKind, Geometry, MemDisk, Result, WriteDone, WriteFlags,
};
use cairn_lvm::lv::{MapArea, MapSegment};
use cairn_lvm::LogicalVolume;

const MIB: u64 = 1 << 20;

/// What the [`Held`] PVs of one LV saw.
#[derive(Default)]
struct Seen {
    /// `(PV, offset, calling thread)` of each `discard_then`.
    later: Mutex<Vec<(usize, u64, ThreadId)>>,
    /// Synchronous discards.
    sync: AtomicUsize,
    /// Discard answers, held until the test's count are outstanding together.
    gate: Arc<Gate>,
}

/// A PV that completes later, holding its discard answers as [`Seen`] says.
#[derive(Debug)]
struct Held {
    inner: Arc<dyn BlockDevice>,
    pv: usize,
    seen: Arc<Seen>,
}

impl std::fmt::Debug for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Seen")
    }
}

impl BlockDevice for Held {
    fn geometry(&self) -> Geometry {
        self.inner.geometry()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.inner.write_at(buf, offset, flags)
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.seen.sync.fetch_add(1, Ordering::SeqCst);
        self.inner.discard(offset, len)
    }
    fn discard_then(&self, offset: u64, len: u64, done: WriteDone) {
        let me = std::thread::current().id();
        self.seen.later.lock().unwrap().push((self.pv, offset, me));
        let r = self.inner.discard(offset, len);
        self.seen.gate.hold(Box::new(move || done(r)));
    }
    fn completes_later(&self) -> bool {
        true
    }
}

/// An LV over `pvs`: striped over all of them (64 KiB chunks, 2 MiB per PV) or, when
/// not `striped`, linear over 2 MiB of each in turn. Areas start 1 MiB into each PV.
fn lv_over(pvs: Vec<Arc<dyn BlockDevice>>, striped: bool) -> LogicalVolume {
    let k = pvs.len() as u64;
    let area = |pv| MapArea { pv, offset: MIB };
    let segments = if striped {
        vec![MapSegment {
            start: 0,
            len: 2 * MIB * k,
            stripe_size: 64 << 10,
            areas: (0..pvs.len()).map(area).collect(),
        }]
    } else {
        (0..pvs.len())
            .map(|i| MapSegment {
                start: 2 * MIB * i as u64,
                len: 2 * MIB,
                stripe_size: 0,
                areas: vec![area(i)],
            })
            .collect()
    };
    let named = pvs
        .into_iter()
        .enumerate()
        .map(|(i, d)| (format!("pv{i}"), d))
        .collect();
    LogicalVolume::new("lv".into(), named, segments, false).unwrap()
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| u8::try_from(i % 251).unwrap().wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn a_discard_over_every_pv_sends_one_discard_per_pv_before_waiting() {
    for (striped, k) in [(true, 3usize), (false, 2)] {
        let seen = Arc::new(Seen::default());
        seen.gate.reset(k);
        let pvs = (0..k)
            .map(|pv| {
                Arc::new(Held {
                    inner: Arc::new(MemDisk::new(4 * MIB)),
                    pv,
                    seen: seen.clone(),
                }) as Arc<dyn BlockDevice>
            })
            .collect();
        let lv = lv_over(pvs, striped);
        // 3 MiB written, then 1 MiB + 64 KiB of it discarded: striped, from 1 MiB -
        // 32 KiB on (partial chunks at both ends); linear, across the boundary of the
        // two PVs at 2 MiB.
        let data = pattern(3 << 20, 5);
        lv.write_at(&data, 0, WriteFlags::NONE).unwrap();
        let len = (1 << 20) + (64 << 10);
        let at = if striped {
            (1 << 20) - (32 << 10)
        } else {
            (2 << 20) - (512 << 10)
        };
        lv.discard(at as u64, len as u64).unwrap();
        let sent = seen.later.lock().unwrap().clone();
        let me = std::thread::current().id();
        assert_eq!(seen.sync.load(Ordering::SeqCst), 0, "a synchronous discard");
        let mut pvs: Vec<usize> = sent.iter().map(|d| d.0).collect();
        pvs.sort_unstable();
        assert_eq!(
            pvs,
            (0..k).collect::<Vec<_>>(),
            "striped {striped}: {sent:?}"
        );
        assert!(sent.iter().all(|d| d.2 == me), "sent from another thread");
        assert_eq!(
            seen.gate.most(),
            k,
            "striped {striped}: not every PV discard was outstanding at once"
        );
        assert!(!seen.gate.timed_out(), "waited per PV");
        let mut expect = data.clone();
        expect[at..at + len].fill(0);
        let mut back = vec![0u8; data.len()];
        lv.read_at(&mut back, 0).unwrap();
        assert!(
            back == expect,
            "striped {striped}: the LV differs from the model"
        );
    }
}

#[test]
fn a_pv_that_fails_discards_fails_the_discard_with_its_error() {
    let mut faults = None;
    let pvs = (0..3)
        .map(|i| {
            let mem: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(4 * MIB));
            let mem: Arc<dyn BlockDevice> = if i == 1 {
                let f = FaultyDisk::new(mem);
                faults = Some(f.handle());
                Arc::new(f)
            } else {
                mem
            };
            Arc::new(DelayDisk::completing_later(mem)) as Arc<dyn BlockDevice>
        })
        .collect();
    let lv = lv_over(pvs, true);
    let faults = faults.unwrap();
    let data = pattern(1 << 20, 9);
    lv.write_at(&data, 0, WriteFlags::NONE).unwrap();
    faults.fail_range(Op::Discard, 0..(4 * MIB));
    let e = lv.discard(128 << 10, 512 << 10).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Io, "{e}");
    assert!(e.to_string().contains("LV lv at"), "{e}");
    // Outside the discarded range the data is untouched; inside, unspecified.
    let mut back = vec![0u8; 1 << 20];
    lv.read_at(&mut back, 0).unwrap();
    assert!(
        back[..128 << 10] == data[..128 << 10],
        "data before the discard"
    );
    assert!(
        back[640 << 10..] == data[640 << 10..],
        "data after the discard"
    );
    faults.heal();
    lv.discard(0, 1 << 20).unwrap();
}
