//! The conformance suite over every device this crate ships, and proof that it fails on
//! devices that break the contract.

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use std::sync::Arc;

use cairn_block::testkit::conformance::{self, Method, Options};
use cairn_block::testkit::{DelayDisk, FaultyDisk, LogWritesDisk};
use cairn_block::{
    BlockDevice, Capabilities, Error, ErrorKind, Extent, FileDisk, Geometry, MemDisk, OpenOptions,
    Result, WriteFlags,
};
use common::{anonymous_file_disk, direct_io_supported, scratch_dir, TempFile};

const SIZE: u64 = 8 << 20;

#[test]
fn memdisk() {
    conformance::run_all(&|| Box::new(MemDisk::new(SIZE)));
}

#[test]
fn memdisk_4k_blocks() {
    let g = Geometry {
        size: SIZE,
        logical_block_size: 4096,
        physical_block_size: 4096,
        optimal_io_size: 64 << 10,
        max_io_size: 1 << 20,
    };
    conformance::run_all(&|| Box::new(MemDisk::with_geometry(g)));
}

#[test]
fn memdisk_small_and_odd_sized() {
    // 16 blocks, not a multiple of MemDisk's 64 KiB page.
    conformance::run_all(&|| Box::new(MemDisk::new(16 * 512)));
    conformance::run_all(&|| Box::new(MemDisk::new((1 << 20) + 3 * 512)));
}

#[test]
fn file_disk_sparse() {
    let dir = scratch_dir();
    eprintln!("file_disk_sparse in {}", dir.display());
    conformance::run_all(&|| {
        Box::new(anonymous_file_disk(&dir, SIZE, false).expect("scratch FileDisk"))
    });
}

#[test]
fn file_disk_sparse_in_temp_dir() {
    // The system temp dir is often a different filesystem from /dev/shm (ext4, xfs, …).
    let dir = std::env::temp_dir();
    conformance::run_all(&|| {
        Box::new(anonymous_file_disk(&dir, SIZE, false).expect("scratch FileDisk"))
    });
}

#[test]
fn file_disk_direct() {
    let dir = std::env::temp_dir();
    if !direct_io_supported(&dir) {
        let shm = scratch_dir();
        if shm == dir || !direct_io_supported(&shm) {
            eprintln!("SKIP file_disk_direct: no scratch filesystem supports O_DIRECT");
            return;
        }
        return conformance::run_all(&|| {
            Box::new(anonymous_file_disk(&shm, SIZE, true).expect("scratch FileDisk"))
        });
    }
    conformance::run_all(&|| {
        Box::new(anonymous_file_disk(&dir, SIZE, true).expect("scratch FileDisk"))
    });
}

#[test]
fn file_disk_read_only() {
    let dir = scratch_dir();
    conformance::run_all(&|| {
        let tmp = TempFile::new(&dir, "ro");
        let data: Vec<u8> = (0..SIZE).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&tmp.0, &data).expect("write scratch file");
        let disk = FileDisk::open(
            &tmp.0,
            &OpenOptions {
                read_only: true,
                ..OpenOptions::default()
            },
        )
        .expect("open read-only");
        Box::new(disk)
    });
}

#[test]
fn faulty_disk_healthy() {
    conformance::run_all(&|| Box::new(FaultyDisk::new(MemDisk::new(SIZE))));
}

#[test]
fn log_writes_disk() {
    conformance::run_all(&|| {
        Box::new(LogWritesDisk::new(MemDisk::new(SIZE)).expect("LogWritesDisk over MemDisk"))
    });
}

#[test]
fn faulty_over_log_writes_over_file() {
    let dir = scratch_dir();
    conformance::run_all(&|| {
        let file = anonymous_file_disk(&dir, 2 << 20, false).expect("scratch FileDisk");
        let log = LogWritesDisk::new(file).expect("LogWritesDisk");
        Box::new(FaultyDisk::new(log))
    });
}

// ---- the suite must be able to fail ---------------------------------------------------

/// Ways a device can break the contract.
#[derive(Debug, Clone, Copy)]
enum Breakage {
    /// Writes touching the last block are silently dropped.
    DropLastBlock,
    /// Every write also zeroes the block after it.
    SpillWrite,
    /// write_zeroes says Ok and does nothing.
    ZeroesIgnored,
    /// write_zeroes also zeroes the block after the range.
    ZeroesSpill,
    /// FAST_ZERO fails with Unsupported after zeroing half the range.
    FastZeroPartial,
    /// discard also zeroes the block before the range.
    DiscardSpill,
    /// extents reports the whole range as a hole.
    ExtentsAllHoles,
    /// extents returns one extent that overshoots the request by a block.
    ExtentsOvershoot,
    /// Reads of more than 8 blocks return the first 8 blocks repeated.
    LargeReadsWrong,
    /// Says read-only but accepts writes.
    ReadOnlyLiar,
    /// Concurrent writes land one block off now and then.
    RacyOffset,
    /// Geometry claims a physical block smaller than the logical block.
    BadGeometry,
}

#[derive(Debug)]
struct Broken {
    inner: MemDisk,
    how: Breakage,
    writes: std::sync::atomic::AtomicU64,
}

impl BlockDevice for Broken {
    fn geometry(&self) -> Geometry {
        let mut g = self.inner.geometry();
        if let Breakage::BadGeometry = self.how {
            g.physical_block_size = 256;
        }
        g
    }
    fn capabilities(&self) -> Capabilities {
        let mut c = self.inner.capabilities();
        if let Breakage::ReadOnlyLiar = self.how {
            c.read_only = true;
        }
        c
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.inner.read_at(buf, offset)?;
        if let Breakage::LargeReadsWrong = self.how {
            if buf.len() > 8 * 512 {
                let head = buf[..8 * 512].to_vec();
                for chunk in buf.chunks_mut(8 * 512) {
                    let n = chunk.len();
                    chunk.copy_from_slice(&head[..n]);
                }
            }
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        let g = self.inner.geometry();
        let end = offset + buf.len() as u64;
        match self.how {
            Breakage::DropLastBlock if end == g.size => Ok(()),
            Breakage::SpillWrite => {
                self.inner.write_at(buf, offset, flags)?;
                if end < g.size {
                    self.inner.write_at(&[0u8; 512], end, flags)?;
                }
                Ok(())
            }
            Breakage::RacyOffset => {
                let n = self
                    .writes
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n % 97 == 96 && end < g.size {
                    self.inner.write_at(buf, offset + 512, flags)
                } else {
                    self.inner.write_at(buf, offset, flags)
                }
            }
            _ => self.inner.write_at(buf, offset, flags),
        }
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if let Breakage::DiscardSpill = self.how {
            if offset >= 512 {
                self.inner
                    .write_zeroes(offset - 512, 512, WriteFlags::NONE)?;
            }
        }
        self.inner.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        let size = self.inner.geometry().size;
        match self.how {
            Breakage::ZeroesIgnored => Ok(()),
            Breakage::ZeroesSpill => {
                let extra = if offset + len < size { 512 } else { 0 };
                self.inner.write_zeroes(offset, len + extra, flags)
            }
            Breakage::FastZeroPartial if flags.contains(WriteFlags::FAST_ZERO) => {
                self.inner
                    .write_zeroes(offset, len / 2 / 512 * 512, flags)?;
                Err(Error::new(ErrorKind::Unsupported, "fast zero"))
            }
            _ => self.inner.write_zeroes(offset, len, flags),
        }
    }
    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        match self.how {
            Breakage::ExtentsAllHoles => Ok(vec![Extent {
                offset,
                length: len,
                hole: true,
                zero: true,
            }]),
            Breakage::ExtentsOvershoot => Ok(vec![Extent {
                offset,
                length: len + 512,
                hole: false,
                zero: false,
            }]),
            _ => self.inner.extents(offset, len),
        }
    }
}

#[test]
fn suite_fails_on_broken_devices() {
    let all = [
        Breakage::DropLastBlock,
        Breakage::SpillWrite,
        Breakage::ZeroesIgnored,
        Breakage::ZeroesSpill,
        Breakage::FastZeroPartial,
        Breakage::DiscardSpill,
        Breakage::ExtentsAllHoles,
        Breakage::ExtentsOvershoot,
        Breakage::LargeReadsWrong,
        Breakage::ReadOnlyLiar,
        Breakage::RacyOffset,
        Breakage::BadGeometry,
    ];
    let opts = Options {
        seed: Some(1),
        random_ops: 500,
        threads: 4,
    };
    for how in all {
        let make = move || -> Box<dyn BlockDevice> {
            Box::new(Broken {
                inner: MemDisk::new(2 << 20),
                how,
                writes: Default::default(),
            })
        };
        let outcome = catch_unwind(AssertUnwindSafe(|| conformance::run_with(&make, &opts)));
        assert!(
            outcome.is_err(),
            "the conformance suite passed a device with {how:?}"
        );
        eprintln!("(expected) conformance caught {how:?}");
    }
}

/// The random-sequence check alone catches a device that loses data only now and then
/// (a stale read after write_zeroes of one specific size).
#[test]
fn random_ops_catch_a_rare_bug() {
    #[derive(Debug)]
    struct StaleZero(MemDisk);
    impl BlockDevice for StaleZero {
        fn geometry(&self) -> Geometry {
            self.0.geometry()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
            self.0.write_at(buf, offset, flags)
        }
        fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
            if len == 3 * 512 {
                return self.0.write_zeroes(offset, 2 * 512, flags);
            }
            self.0.write_zeroes(offset, len, flags)
        }
    }
    let dev = StaleZero(MemDisk::new(1 << 20));
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        conformance::check_random_ops(&dev, 7, 5000)
    }));
    assert!(
        outcome.is_err(),
        "random ops missed a write_zeroes that skips a block"
    );
}

/// What the test kit's wrappers change, each said in its impl: the synchronous doubles
/// run their `*_then` forms through their synchronous ones, on the calling thread.
const SYNCHRONOUS: &[Method] = &[
    Method::CompletesLater,
    Method::ReadThen,
    Method::WriteThen,
    Method::FlushThen,
    Method::DiscardThen,
];

#[test]
fn arc_and_box_pass_everything_through() {
    conformance::check_pass_through(&|d| Arc::new(d), &[]);
    conformance::check_pass_through(&|d| Arc::new(Box::new(d)), &[]);
}

#[test]
fn the_test_kits_wrappers_pass_through_all_they_do_not_change() {
    conformance::check_pass_through(&|d| Arc::new(FaultyDisk::new(d)), SYNCHRONOUS);
    conformance::check_pass_through(
        &|d| Arc::new(LogWritesDisk::new(d).expect("log")),
        SYNCHRONOUS,
    );
    conformance::check_pass_through(&|d| Arc::new(DelayDisk::new(d)), SYNCHRONOUS);
}

/// A wrapper written by hand that forgets the `*_then` forms, as the bench's member
/// delay once did: the check names what it lost.
#[test]
fn the_pass_through_check_catches_a_wrapper_that_forgets_methods() {
    #[derive(Debug)]
    struct Forgetful(Arc<dyn BlockDevice>);
    impl BlockDevice for Forgetful {
        fn geometry(&self) -> Geometry {
            self.0.geometry()
        }
        fn capabilities(&self) -> Capabilities {
            self.0.capabilities()
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
            self.0.read_at(buf, offset)
        }
        fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
            self.0.write_at(buf, offset, flags)
        }
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        conformance::check_pass_through(&|d| Arc::new(Forgetful(d)), &[])
    }));
    assert!(outcome.is_err(), "the check passed a wrapper that forgets");
    // Told what it changes, the same wrapper passes: the check is about what is said.
    conformance::check_pass_through(
        &|d| Arc::new(Forgetful(d)),
        &[
            Method::CompletesLater,
            Method::Flush,
            Method::Discard,
            Method::WriteZeroes,
            Method::ReadThen,
            Method::WriteThen,
            Method::FlushThen,
            Method::DiscardThen,
            Method::Extents,
            Method::Cache,
        ],
    );
}

/// A filter that says only what is below passes everything through by the defaults.
#[derive(Debug)]
struct Nothing(Arc<dyn BlockDevice>);
impl cairn_block::Filter for Nothing {
    type Inner = dyn BlockDevice;
    fn inner(&self) -> impl std::ops::Deref<Target = dyn BlockDevice> + '_ {
        &*self.0
    }
}
cairn_block::filter_device!(Nothing);

/// One that refuses everything in `admit`.
#[derive(Debug)]
struct Closed(Arc<conformance::Recorder>);
impl cairn_block::Filter for Closed {
    type Inner = conformance::Recorder;
    fn inner(&self) -> impl std::ops::Deref<Target = conformance::Recorder> + '_ {
        &*self.0
    }
    fn admit(&self, op: cairn_block::IoOp) -> Result<()> {
        Err(Error::new(ErrorKind::Io, format!("{} refused", op.name())))
    }
}
cairn_block::filter_device!(Closed);

#[test]
fn a_filter_of_defaults_passes_everything_and_admit_stops_both_forms() {
    conformance::check_pass_through(&|d| Arc::new(Nothing(d)), &[]);

    let below = Arc::new(conformance::Recorder::new(1 << 20));
    let dev = Closed(below.clone());
    let mut buf = vec![0u8; 4096];
    assert!(dev.read_at(&mut buf, 0).is_err());
    assert!(dev.write_at(&buf, 0, WriteFlags::NONE).is_err());
    assert!(dev.flush().is_err());
    assert!(dev.discard(0, 4096).is_err());
    assert!(dev.write_zeroes(0, 4096, WriteFlags::NONE).is_err());
    let (tx, rx) = std::sync::mpsc::channel();
    let t = tx.clone();
    dev.read_then(4096, 0, Box::new(move |r| t.send(r.is_err()).unwrap()));
    let t = tx.clone();
    dev.write_then(
        &buf,
        0,
        WriteFlags::NONE,
        Box::new(move |r| t.send(r.is_err()).unwrap()),
    );
    let t = tx.clone();
    dev.flush_then(Box::new(move |r| t.send(r.is_err()).unwrap()));
    dev.discard_then(0, 4096, Box::new(move |r| tx.send(r.is_err()).unwrap()));
    assert_eq!(
        rx.iter().take(4).filter(|e| *e).count(),
        4,
        "all four refused"
    );
    assert!(below.take().is_empty(), "a refused call reached below");
    // Not I/O: they pass.
    assert!(dev.extents(0, 4096).is_ok() && dev.cache(0, 4096).is_ok());
    assert!(dev.completes_later());
}
