//! The contract every [`BlockDevice`] keeps, as a suite any device can be put through.
//!
//! ```text
//!   run_all(make)  ── make() a fresh device per check ──┬─ geometry, read-only refusal
//!                                                      ├─ read-after-write, I/O sizes, boundaries
//!                                                      ├─ write_zeroes, discard, extents, flush
//!                                                      ├─ concurrent disjoint writers
//!                                                      └─ random ops vs a Vec<u8> model (seeded)
//! ```
//!
//! Every check reads its results back through the device and compares them with what it
//! wrote, including the blocks around each write, so a device that drops, misplaces or
//! spreads data fails. Devices need not start zeroed: each check reads what is there
//! first. Checks panic (they are test assertions) with the offset and what differed.
//!
//! Devices must have at least [`MIN_BLOCKS`] logical blocks; a few MiB exercises the
//! internal boundaries of most layers (the random sequence models at most
//! [`MODEL_LIMIT`] bytes of the device).

use std::collections::{BTreeMap, VecDeque};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{first_difference, random_bytes, test_seed};
use crate::{BlockDevice, ErrorKind, Extent, Geometry, Support, WriteFlags};

/// The smallest device the suite accepts, in logical blocks.
pub const MIN_BLOCKS: u64 = 16;
/// The random sequence uses at most this many bytes from the start of the device, the
/// size of its in-memory model.
pub const MODEL_LIMIT: u64 = 256 << 20;

/// Tunables for [`run_with`].
#[derive(Debug, Clone)]
pub struct Options {
    /// `None`: `CAIRN_SEED` or a random one (printed either way).
    pub seed: Option<u64>,
    /// Length of the random operation sequence.
    pub random_ops: usize,
    /// Threads in the concurrency check.
    pub threads: usize,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            seed: None,
            random_ops: 3000,
            threads: 4,
        }
    }
}

/// Runs every check with default options; `make` returns a fresh device each call.
pub fn run_all(make: &dyn Fn() -> Box<dyn BlockDevice>) {
    run_with(make, &Options::default());
}

/// Runs every check. Prints `conformance seed: N`; rerun with `CAIRN_SEED=N` to replay.
pub fn run_with(make: &dyn Fn() -> Box<dyn BlockDevice>, opts: &Options) {
    let seed = match opts.seed {
        Some(s) => {
            eprintln!("conformance seed: {s}");
            s
        }
        None => test_seed("conformance"),
    };
    let probe = make();
    check_geometry(&*probe);
    let read_only = probe.capabilities().read_only;
    drop(probe);
    if read_only {
        eprintln!("conformance: read-only device, skipping the checks that write");
        check_read_only(&*make());
        check_read_consistency(&*make(), seed);
        check_extents(&*make(), seed);
        check_flush(&*make(), seed);
        return;
    }
    check_read_only(&*make());
    check_read_write_positions(&*make(), seed);
    check_io_sizes(&*make(), seed);
    check_read_consistency(&*make(), seed);
    check_write_zeroes(&*make(), seed);
    check_discard(&*make(), seed);
    check_extents(&*make(), seed);
    check_flush(&*make(), seed);
    check_concurrent_writers(&*make(), seed, opts.threads);
    check_random_ops(&*make(), seed, opts.random_ops);
}

// ---- helpers -------------------------------------------------------------------------

fn lbs(g: &Geometry) -> u64 {
    u64::from(g.logical_block_size)
}

/// The largest request the suite issues: `max_io_size`, rounded down to whole blocks.
fn max_io(g: &Geometry) -> u64 {
    let l = lbs(g);
    (u64::from(g.max_io_size) / l * l).max(l)
}

fn usize_of(v: u64) -> usize {
    // Lengths the suite asks for are bounded by max_io_size (a u32) or MODEL_LIMIT.
    usize::try_from(v).expect("request length fits in memory")
}

/// Reads `len` bytes at `off`, in pieces the device accepts; panics on error.
fn read(dev: &dyn BlockDevice, off: u64, len: u64) -> Vec<u8> {
    let step = max_io(&dev.geometry());
    let mut buf = vec![0u8; usize_of(len)];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(step);
        let piece = &mut buf[usize_of(done)..usize_of(done + n)];
        if let Err(e) = dev.read_at(piece, off + done) {
            panic!("read of {n} bytes at {} failed: {e}", off + done);
        }
        done += n;
    }
    buf
}

/// Writes `data` at `off`, in pieces the device accepts; panics on error.
fn write(dev: &dyn BlockDevice, off: u64, data: &[u8], flags: WriteFlags) {
    let step = usize_of(max_io(&dev.geometry()));
    for (i, piece) in data.chunks(step).enumerate() {
        let at = off + (i * step) as u64;
        if let Err(e) = dev.write_at(piece, at, flags) {
            panic!(
                "write of {} bytes at {at} ({flags:?}) failed: {e}",
                piece.len()
            );
        }
    }
}

fn assert_bytes(got: &[u8], want: &[u8], off: u64, what: &str) {
    // memcmp first: the byte-by-byte search is slow in debug builds.
    if got == want {
        return;
    }
    if let Some(d) = first_difference(got, want, off) {
        panic!(
            "{what}: read at {off} (+{} bytes) disagrees: {d}",
            want.len()
        );
    }
}

fn require_size(g: &Geometry) {
    assert!(
        g.size >= MIN_BLOCKS * lbs(g),
        "the conformance suite needs at least {MIN_BLOCKS} blocks; device has {} bytes \
         with {}-byte blocks",
        g.size,
        g.logical_block_size
    );
}

/// Offsets where layers commonly switch pages, chunks or stripes, strictly inside the
/// device and at least two blocks from either end.
fn boundaries(g: &Geometry) -> Vec<u64> {
    let l = lbs(g);
    let mut v: Vec<u64> = [
        u64::from(g.physical_block_size),
        u64::from(g.optimal_io_size),
        2 * u64::from(g.optimal_io_size),
        3 * u64::from(g.optimal_io_size),
        4096,
        64 << 10,
        128 << 10,
        1 << 20,
        max_io(g),
        g.size / 2 / l * l,
    ]
    .into_iter()
    .filter(|&b| b % l == 0 && b >= 2 * l && b + 2 * l <= g.size)
    .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// A random block-aligned range of `blocks` blocks inside `[0, limit)`.
fn random_range<R: Rng + ?Sized>(rng: &mut R, l: u64, limit: u64, blocks: u64) -> (u64, u64) {
    let total = limit / l;
    let blocks = blocks.clamp(1, total);
    let start = rng.gen_range(0..=total - blocks);
    (start * l, blocks * l)
}

/// Expected contents of the blocks a check has touched or looked at; everything it
/// writes is checked together with the blocks on either side.
struct SparseModel<'a> {
    dev: &'a dyn BlockDevice,
    l: u64,
    blocks: BTreeMap<u64, Vec<u8>>,
}

impl<'a> SparseModel<'a> {
    fn new(dev: &'a dyn BlockDevice) -> SparseModel<'a> {
        SparseModel {
            dev,
            l: lbs(&dev.geometry()),
            blocks: BTreeMap::new(),
        }
    }

    /// Remembers what the device holds now for blocks not yet known.
    fn learn(&mut self, off: u64, len: u64) {
        let size = self.dev.geometry().size;
        let (first, end) = (off / self.l, (off + len).min(size) / self.l);
        for b in first..end {
            if !self.blocks.contains_key(&b) {
                let data = read(self.dev, b * self.l, self.l);
                self.blocks.insert(b, data);
            }
        }
    }

    /// Learns the neighbouring blocks, so that a write that spills over is caught.
    fn learn_around(&mut self, off: u64, len: u64) {
        if off >= self.l {
            self.learn(off - self.l, self.l);
        }
        self.learn(off + len, self.l);
    }

    fn set(&mut self, off: u64, data: &[u8]) {
        for (i, chunk) in data.chunks(usize_of(self.l)).enumerate() {
            self.blocks.insert(off / self.l + i as u64, chunk.to_vec());
        }
    }

    fn forget(&mut self, off: u64, len: u64) {
        for b in off / self.l..(off + len) / self.l {
            self.blocks.remove(&b);
        }
    }

    fn write(&mut self, off: u64, data: &[u8], flags: WriteFlags) {
        self.learn_around(off, data.len() as u64);
        write(self.dev, off, data, flags);
        self.set(off, data);
    }

    fn expect_zero(&mut self, off: u64, len: u64) {
        let zero = vec![0u8; usize_of(len)];
        self.set(off, &zero);
    }

    /// Reads `[off, off + len)` in one request per max_io and compares known blocks.
    fn verify(&self, off: u64, len: u64, what: &str) {
        let got = read(self.dev, off, len);
        for (i, chunk) in got.chunks(usize_of(self.l)).enumerate() {
            let b = off / self.l + i as u64;
            if let Some(want) = self.blocks.get(&b) {
                assert_bytes(chunk, want, b * self.l, what);
            }
        }
    }

    /// Verifies `[off, off + len)` and the block on either side.
    fn verify_around(&self, off: u64, len: u64, what: &str) {
        let lo = off.saturating_sub(self.l);
        let hi = (off + len + self.l).min(self.dev.geometry().size);
        self.verify(lo, hi - lo, what);
    }

    /// Verifies every known block, reading runs of adjacent blocks as one request.
    fn verify_all(&self, what: &str) {
        let step = max_io(&self.dev.geometry()) / self.l;
        let mut run: Option<(u64, u64)> = None;
        for &b in self.blocks.keys() {
            run = match run {
                Some((s, n)) if s + n == b && n < step => Some((s, n + 1)),
                Some((s, n)) => {
                    self.verify(s * self.l, n * self.l, what);
                    Some((b, 1))
                }
                None => Some((b, 1)),
            };
        }
        if let Some((s, n)) = run {
            self.verify(s * self.l, n * self.l, what);
        }
    }
}

// ---- checks --------------------------------------------------------------------------

/// Size is a whole number of logical blocks; `optimal >= physical >= logical`, each a
/// multiple of the logical block; the geometry does not change between calls.
pub fn check_geometry(dev: &dyn BlockDevice) {
    let g = dev.geometry();
    let l = u64::from(g.logical_block_size);
    assert!(
        g.logical_block_size >= 512 && g.logical_block_size.is_power_of_two(),
        "logical block size {} is not a power of two >= 512",
        g.logical_block_size
    );
    assert!(g.size > 0, "device size is 0");
    assert_eq!(
        g.size % l,
        0,
        "size {} is not a multiple of the logical block {l}",
        g.size
    );
    assert!(
        g.physical_block_size >= g.logical_block_size && u64::from(g.physical_block_size) % l == 0,
        "physical block {} is not a multiple of the logical block {l}",
        g.physical_block_size
    );
    assert!(
        g.optimal_io_size >= g.physical_block_size && u64::from(g.optimal_io_size) % l == 0,
        "optimal I/O size {} is below the physical block {} or not a multiple of the \
         logical block",
        g.optimal_io_size,
        g.physical_block_size
    );
    assert!(
        g.max_io_size >= g.logical_block_size,
        "max I/O size {} is below one logical block",
        g.max_io_size
    );
    assert_eq!(dev.geometry(), g, "geometry changed between two calls");
}

/// A read-only device refuses every modifying op with `ReadOnly` (discard may say
/// `Unsupported`) and its contents stay as they were. Does nothing on writable devices.
pub fn check_read_only(dev: &dyn BlockDevice) {
    if !dev.capabilities().read_only {
        return;
    }
    let g = dev.geometry();
    let l = lbs(&g);
    let spots = [0, g.size / 2 / l * l, g.size - l];
    let before: Vec<Vec<u8>> = spots.iter().map(|&o| read(dev, o, l)).collect();
    let data = vec![0xa5u8; usize_of(l)];
    for &o in &spots {
        for flags in [WriteFlags::NONE, WriteFlags::FUA] {
            match dev.write_at(&data, o, flags) {
                Err(e) if e.kind() == ErrorKind::ReadOnly => {}
                other => panic!("read-only device: write at {o} ({flags:?}) gave {other:?}"),
            }
        }
        for flags in [WriteFlags::NONE, WriteFlags::NO_HOLE] {
            match dev.write_zeroes(o, l, flags) {
                Err(e) if e.kind() == ErrorKind::ReadOnly => {}
                other => panic!("read-only device: write_zeroes at {o} ({flags:?}) gave {other:?}"),
            }
        }
        match dev.discard(o, l) {
            Err(e) if matches!(e.kind(), ErrorKind::ReadOnly | ErrorKind::Unsupported) => {}
            other => panic!("read-only device: discard at {o} gave {other:?}"),
        }
    }
    for (&o, want) in spots.iter().zip(&before) {
        assert_bytes(
            &read(dev, o, l),
            want,
            o,
            "read-only device changed after refused writes",
        );
    }
}

/// Reads are repeatable and independent of how a range is split into requests.
pub fn check_read_consistency(dev: &dyn BlockDevice, seed: u64) {
    let g = dev.geometry();
    let l = lbs(&g);
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_0001);
    let span = (max_io(&g)).min(g.size).min(1 << 20);
    for _ in 0..8 {
        let (off, len) = random_range(&mut rng, l, g.size, span / l);
        let whole = read(dev, off, len);
        assert_bytes(
            &read(dev, off, len),
            &whole,
            off,
            "a second read of the same range",
        );
        let mut pieces = Vec::with_capacity(whole.len());
        let mut pos = off;
        while pos < off + len {
            let n = rng.gen_range(1..=8u64).min((off + len - pos) / l) * l;
            pieces.extend(read(dev, pos, n));
            pos += n;
        }
        assert_bytes(&pieces, &whole, off, "the same range read in small pieces");
    }
}

/// Read-after-write at the start, the end, the middle and across internal boundaries,
/// with the surrounding blocks undisturbed.
pub fn check_read_write_positions(dev: &dyn BlockDevice, seed: u64) {
    let g = dev.geometry();
    require_size(&g);
    let l = lbs(&g);
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_0002);
    let mut m = SparseModel::new(dev);
    let mut regions = vec![(0, l), (0, 4 * l), (g.size - l, l), (g.size - 4 * l, 4 * l)];
    regions.push((g.size / 2 / l * l, l));
    for b in boundaries(&g) {
        // Straddle by one block and by two, and end exactly on / start exactly at it.
        regions.push((b - l, 2 * l));
        regions.push((b - 2 * l, 4 * l));
        regions.push((b - l, l));
        regions.push((b, l));
    }
    for &(off, len) in &regions {
        let data = random_bytes(&mut rng, usize_of(len));
        m.write(off, &data, WriteFlags::NONE);
        m.verify_around(off, len, "read-after-write");
    }
    // Later writes must not have disturbed earlier ones.
    m.verify_all("read-after-write, after all writes");
}

/// Small and large requests, odd lengths, and large ranges read back in small pieces.
pub fn check_io_sizes(dev: &dyn BlockDevice, seed: u64) {
    let g = dev.geometry();
    require_size(&g);
    let l = lbs(&g);
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_0003);
    let mut m = SparseModel::new(dev);
    let big = (max_io(&g)).min(g.size / 2).min(8 << 20) / l;
    for blocks in [1, 2, 3, 7, 8, 9, 31, 129, big] {
        let (off, len) = random_range(&mut rng, l, g.size, blocks);
        let data = random_bytes(&mut rng, usize_of(len));
        m.write(off, &data, WriteFlags::NONE);
        m.verify_around(off, len, &format!("{blocks}-block write read whole"));
        // Read back block by block: a device that only handles whole requests fails.
        for b in 0..len / l {
            m.verify(
                off + b * l,
                l,
                &format!("{blocks}-block write read per block"),
            );
        }
    }
    // A large write over many small ones, then small ones inside the large one.
    let (off, len) = random_range(&mut rng, l, g.size, big);
    for b in (0..len / l).step_by(3) {
        let data = random_bytes(&mut rng, usize_of(l));
        m.write(off + b * l, &data, WriteFlags::NONE);
    }
    let data = random_bytes(&mut rng, usize_of(len));
    m.write(off, &data, WriteFlags::NONE);
    for _ in 0..16 {
        let blocks = rng.gen_range(1..=4);
        let (o, n) = random_range(&mut rng, l, len, blocks);
        let data = random_bytes(&mut rng, usize_of(n));
        m.write(off + o, &data, WriteFlags::NONE);
    }
    m.verify_all("small writes inside a large one");
}

/// `write_zeroes` zeroes exactly its range with and without `NO_HOLE`/`FUA`; `FAST_ZERO`
/// either zeroes or fails with `Unsupported` leaving the data alone.
pub fn check_write_zeroes(dev: &dyn BlockDevice, seed: u64) {
    let g = dev.geometry();
    require_size(&g);
    let l = lbs(&g);
    let caps = dev.capabilities();
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_0004);
    let mut m = SparseModel::new(dev);
    let mut ranges = vec![(0, l), (g.size - l, l)];
    for b in boundaries(&g) {
        ranges.push((b - l, 2 * l));
    }
    let page = (64u64 << 10).min(g.size / 2) / l * l;
    ranges.push((page.max(l), page.max(l)));
    let flag_sets = [
        WriteFlags::NONE,
        WriteFlags::NO_HOLE,
        WriteFlags::FUA,
        WriteFlags::NO_HOLE | WriteFlags::FUA,
        WriteFlags::FAST_ZERO,
        WriteFlags::FAST_ZERO | WriteFlags::NO_HOLE,
    ];
    for (i, &(off, len)) in ranges.iter().enumerate() {
        let flags = flag_sets[i % flag_sets.len()];
        let data = random_bytes(&mut rng, usize_of(len));
        m.write(off, &data, WriteFlags::NONE);
        match dev.write_zeroes(off, len, flags) {
            Ok(()) => m.expect_zero(off, len),
            Err(e)
                if e.kind() == ErrorKind::Unsupported
                    && (flags.contains(WriteFlags::FAST_ZERO)
                        || caps.write_zeroes == Support::None) => {}
            Err(e) => panic!("write_zeroes of {len} bytes at {off} ({flags:?}) failed: {e}"),
        }
        m.verify_around(off, len, &format!("write_zeroes {flags:?}"));
    }
    // Rewriting a zeroed range works (a punched hole must fill again).
    for &(off, len) in &ranges {
        let data = random_bytes(&mut rng, usize_of(len));
        m.write(off, &data, WriteFlags::NONE);
    }
    m.verify_all("write_zeroes, after rewriting");
    // The whole device at once (bounded, to keep the suite quick on big devices).
    if g.size <= 64 << 20 && caps.write_zeroes != Support::None {
        if let Err(e) = dev.write_zeroes(0, g.size, WriteFlags::NONE) {
            panic!("write_zeroes of the whole device failed: {e}");
        }
        let step = max_io(&g).min(4 << 20);
        let zero = vec![0u8; usize_of(step)];
        let mut pos = 0;
        while pos < g.size {
            let n = step.min(g.size - pos);
            let got = read(dev, pos, n);
            assert_bytes(
                &got,
                &zero[..usize_of(n)],
                pos,
                "write_zeroes of the whole device",
            );
            pos += n;
        }
    }
}

/// Discard leaves every block outside its range alone, and the range can be written
/// again afterwards. Its own contents are unspecified and not checked.
pub fn check_discard(dev: &dyn BlockDevice, seed: u64) {
    let g = dev.geometry();
    require_size(&g);
    let l = lbs(&g);
    let caps = dev.capabilities();
    if caps.discard == Support::None {
        eprintln!("conformance: discard not supported, skipping its check");
        return;
    }
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_0005);
    let mut m = SparseModel::new(dev);
    let page = (64u64 << 10) / l * l;
    let mut ranges = vec![(0, l), (g.size - l, l), (g.size / 2 / l * l, l)];
    for b in boundaries(&g) {
        ranges.push((b - l, 2 * l));
    }
    if page >= l && 3 * page <= g.size {
        ranges.push((page, page)); // a whole internal page
        ranges.push((page - l, page + 2 * l)); // a page and a block either side
    }
    for &(off, len) in &ranges {
        let lo = off.saturating_sub(2 * l);
        let hi = (off + len + 2 * l).min(g.size);
        let data = random_bytes(&mut rng, usize_of(hi - lo));
        m.write(lo, &data, WriteFlags::NONE);
        if let Err(e) = dev.discard(off, len) {
            panic!(
                "discard of {len} bytes at {off} failed (capabilities say {:?}): {e}",
                caps.discard
            );
        }
        m.forget(off, len);
        m.verify(lo, hi - lo, "blocks next to a discard");
    }
    m.verify_all("after all discards");
    for &(off, len) in &ranges {
        let data = random_bytes(&mut rng, usize_of(len));
        m.write(off, &data, WriteFlags::NONE);
    }
    m.verify_all("writes over discarded ranges");
}

/// Walks `extents` over `[off, off + len)`, checking the shape of each answer, and that
/// holes and zero extents read as zeroes. Returns the extents found.
pub fn walk_extents(dev: &dyn BlockDevice, off: u64, len: u64) -> Vec<Extent> {
    let g = dev.geometry();
    let l = lbs(&g);
    let end = off + len;
    let mut all = Vec::new();
    let mut pos = off;
    // Each call covers at least one block, so this many calls always suffice.
    let mut calls_left = len / l + 1;
    while pos < end {
        assert!(calls_left > 0, "extents made no progress at {pos}");
        calls_left -= 1;
        let ext = match dev.extents(pos, end - pos) {
            Ok(e) => e,
            Err(e) => panic!("extents({pos}, {}) failed: {e}", end - pos),
        };
        assert!(
            !ext.is_empty(),
            "extents({pos}, {}) returned nothing",
            end - pos
        );
        assert_eq!(
            ext[0].offset,
            pos,
            "extents({pos}, {}) start elsewhere: {ext:?}",
            end - pos
        );
        for e in &ext {
            assert_eq!(
                e.offset, pos,
                "extents({}, ..) not contiguous at {pos}: {ext:?}",
                ext[0].offset
            );
            assert!(e.length > 0, "empty extent at {pos}: {ext:?}");
            assert!(
                e.offset % l == 0 && e.length % l == 0,
                "extent {e:?} is not aligned to the {l}-byte block"
            );
            assert!(
                e.offset + e.length <= end && e.offset + e.length <= g.size,
                "extent {e:?} reaches past the request end {end} (device size {})",
                g.size
            );
            assert!(
                !e.hole || e.zero,
                "extent {e:?} is a hole but not marked zero"
            );
            if e.zero {
                // Bounded: a huge hole is sampled at its start and end.
                let n = e.length.min(1 << 20);
                let zero = vec![0u8; usize_of(n)];
                assert_bytes(&read(dev, e.offset, n), &zero, e.offset, "zero/hole extent");
                let tail = e.offset + e.length - n;
                assert_bytes(&read(dev, tail, n), &zero, tail, "zero/hole extent");
            }
            pos += e.length;
        }
        all.extend(ext);
    }
    all
}

/// `extents` answers are contiguous, start at the requested offset, are block-aligned,
/// stay inside the request and the device, and holes read as zeroes; over data, holes
/// made by zeroing/discard, and at arbitrary offsets.
pub fn check_extents(dev: &dyn BlockDevice, seed: u64) {
    let g = dev.geometry();
    let l = lbs(&g);
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_0006);
    if !dev.capabilities().read_only {
        require_size(&g);
        // Make a mixture of data, zeroed ranges and discarded ranges.
        let mut m = SparseModel::new(dev);
        for _ in 0..8 {
            let blocks = rng.gen_range(1..=256);
            let (off, len) = random_range(&mut rng, l, g.size, blocks);
            let data = random_bytes(&mut rng, usize_of(len));
            m.write(off, &data, WriteFlags::NONE);
        }
        for _ in 0..4 {
            let blocks = rng.gen_range(1..=512);
            let (off, len) = random_range(&mut rng, l, g.size, blocks);
            if dev.write_zeroes(off, len, WriteFlags::NONE).is_ok() {
                m.expect_zero(off, len);
            }
            if dev.capabilities().discard != Support::None {
                let blocks = rng.gen_range(1..=512);
                let (off, len) = random_range(&mut rng, l, g.size, blocks);
                if dev.discard(off, len).is_ok() {
                    m.forget(off, len);
                }
            }
        }
        m.verify_all("data around extents");
    }
    walk_extents(dev, 0, g.size.min(MODEL_LIMIT));
    walk_extents(dev, g.size - l, l);
    walk_extents(dev, g.size / 2 / l * l, g.size - g.size / 2 / l * l);
    for b in boundaries(&g) {
        walk_extents(dev, b - l, 2 * l);
    }
    for _ in 0..32 {
        let blocks = rng.gen_range(1..=4096);
        let (off, len) = random_range(&mut rng, l, g.size, blocks);
        walk_extents(dev, off, len);
    }
}

/// Flush succeeds (on an idle device, after writes, repeatedly) and FUA writes read back.
pub fn check_flush(dev: &dyn BlockDevice, seed: u64) {
    let g = dev.geometry();
    if let Err(e) = dev.flush() {
        panic!("flush of an idle device failed: {e}");
    }
    if dev.capabilities().read_only {
        return;
    }
    let l = lbs(&g);
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_0007);
    let mut m = SparseModel::new(dev);
    for i in 0..8 {
        let blocks = rng.gen_range(1..=16);
        let (off, len) = random_range(&mut rng, l, g.size, blocks);
        let data = random_bytes(&mut rng, usize_of(len));
        let flags = if i % 2 == 0 {
            WriteFlags::FUA
        } else {
            WriteFlags::NONE
        };
        m.write(off, &data, flags);
        if let Err(e) = dev.flush() {
            panic!("flush after a write of {len} bytes at {off} failed: {e}");
        }
    }
    if let Err(e) = dev.flush() {
        panic!("a second flush in a row failed: {e}");
    }
    m.verify_all("writes around flushes");
}

/// Several threads write disjoint ranges at once, interleaved finely so that they share
/// pages, chunks and stripes, and each reads back its own data; at the end every range
/// holds the last data its owner wrote.
pub fn check_concurrent_writers(dev: &dyn BlockDevice, seed: u64, threads: usize) {
    let g = dev.geometry();
    require_size(&g);
    let l = lbs(&g);
    let threads = threads.max(2) as u64;
    let span = g.size.min(8 << 20) / l; // blocks in play
                                        // Round 0: units of one block; round 1: three blocks; round 2: contiguous slices.
    for (round, unit) in [1u64, 3, (span / threads).max(1)].into_iter().enumerate() {
        let units = span / unit;
        if units < threads {
            continue;
        }
        let finals: Vec<BTreeMap<u64, Vec<u8>>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..threads)
                .map(|t| {
                    s.spawn(move || {
                        let mut rng = SmallRng::seed_from_u64(seed ^ ((round as u64) << 32) ^ t);
                        let mine: Vec<u64> = (t..units).step_by(usize_of(threads)).collect();
                        let mut last: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
                        for i in 0..200 {
                            let u = mine[rng.gen_range(0..mine.len())];
                            // Within a unit, write a random sub-range of whole blocks.
                            let blocks = rng.gen_range(1..=unit.min(64));
                            let (o, n) = random_range(&mut rng, l, unit * l, blocks);
                            let off = u * unit * l + o;
                            let data = random_bytes(&mut rng, usize_of(n));
                            let flags = if i % 7 == 0 {
                                WriteFlags::FUA
                            } else {
                                WriteFlags::NONE
                            };
                            write(dev, off, &data, flags);
                            for (k, blk) in data.chunks(usize_of(l)).enumerate() {
                                last.insert(off / l + k as u64, blk.to_vec());
                            }
                            // Read back the write and its neighbours within the unit:
                            // other threads own everything outside it.
                            let lo = off.saturating_sub(l).max(u * unit * l);
                            let hi = (off + n + l).min((u + 1) * unit * l);
                            let got = read(dev, lo, hi - lo);
                            for (k, blk) in got.chunks(usize_of(l)).enumerate() {
                                let b = lo / l + k as u64;
                                let Some(want) = last.get(&b) else { continue };
                                if blk != want.as_slice() {
                                    assert_bytes(
                                        blk,
                                        want,
                                        b * l,
                                        &format!("thread {t}: own write, concurrent"),
                                    );
                                }
                            }
                        }
                        last
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| match h.join() {
                    Ok(v) => v,
                    Err(p) => std::panic::resume_unwind(p),
                })
                .collect()
        });
        for (t, last) in finals.iter().enumerate() {
            for (&b, want) in last {
                assert_bytes(
                    &read(dev, b * l, l),
                    want,
                    b * l,
                    &format!("thread {t}: after all threads joined"),
                );
            }
        }
    }
}

/// One op of the random sequence, for failure messages.
// The fields are read only through `Debug`, in the history printed on failure.
#[allow(dead_code)]
#[derive(Debug, Clone)]
enum RandOp {
    Read(u64, u64),
    Write(u64, u64, WriteFlags),
    WriteZeroes(u64, u64, WriteFlags),
    Discard(u64, u64),
    Flush,
    Extents(u64, u64),
    Cache(u64, u64),
}

/// A random sequence of reads, writes, write_zeroes, discards, flushes and extents
/// queries, checked against a `Vec<u8>` model: every read agrees with it. Discarded
/// blocks are unknown until written again.
pub fn check_random_ops(dev: &dyn BlockDevice, seed: u64, ops: usize) {
    let g = dev.geometry();
    require_size(&g);
    let l = lbs(&g);
    let limit = g.size.min(MODEL_LIMIT) / l * l;
    let mut rng = SmallRng::seed_from_u64(seed ^ 0x5eed_0008);
    let mut model = read(dev, 0, limit);
    let mut known = vec![true; usize_of(limit / l)];
    let mut recent: VecDeque<(usize, RandOp)> = VecDeque::new();
    let discard_ok = dev.capabilities().discard != Support::None;
    let bounds = boundaries(&g);
    let max_blocks = (max_io(&g).min(1 << 20) / l).max(1);

    let fail = |recent: &VecDeque<(usize, RandOp)>, msg: String| -> ! {
        let hist: Vec<String> = recent
            .iter()
            .map(|(i, op)| format!("  #{i}: {op:?}"))
            .collect();
        panic!(
            "random ops (conformance seed {seed}, replay with CAIRN_SEED={seed}): {msg}\nlast ops:\n{}",
            hist.join("\n")
        );
    };

    let check =
        |recent: &VecDeque<(usize, RandOp)>, model: &[u8], known: &[bool], off: u64, got: &[u8]| {
            for (k, blk) in got.chunks(usize_of(l)).enumerate() {
                let b = off / l + k as u64;
                if !known[usize_of(b)] {
                    continue;
                }
                let want = &model[usize_of(b * l)..usize_of((b + 1) * l)];
                if blk == want {
                    continue;
                }
                if let Some(d) = first_difference(blk, want, b * l) {
                    fail(recent, format!("read disagrees with the model: {d}"));
                }
            }
        };

    for i in 0..ops {
        // Ranges: mostly small, sometimes large, often straddling a boundary.
        let blocks = if rng.gen_bool(0.1) {
            rng.gen_range(1..=max_blocks)
        } else {
            rng.gen_range(1..=16.min(max_blocks))
        };
        let (mut off, len) = random_range(&mut rng, l, limit, blocks);
        if !bounds.is_empty() && rng.gen_bool(0.3) {
            let b = bounds[rng.gen_range(0..bounds.len())];
            if b < limit {
                let back = rng.gen_range(0..=blocks) * l;
                off = b.saturating_sub(back).min(limit - len);
            }
        }
        let (o, n) = (usize_of(off), usize_of(len));
        let blocks_of = |known: &mut [bool], v: bool| {
            known[usize_of(off / l)..usize_of((off + len) / l)].fill(v)
        };
        let op = match rng.gen_range(0..100) {
            0..=34 => RandOp::Write(
                off,
                len,
                if rng.gen_bool(0.2) {
                    WriteFlags::FUA
                } else {
                    WriteFlags::NONE
                },
            ),
            35..=64 => RandOp::Read(off, len),
            65..=74 => {
                let mut f = WriteFlags::NONE;
                if rng.gen_bool(0.3) {
                    f = f | WriteFlags::NO_HOLE;
                }
                if rng.gen_bool(0.2) {
                    f = f | WriteFlags::FUA;
                }
                if rng.gen_bool(0.2) {
                    f = f | WriteFlags::FAST_ZERO;
                }
                RandOp::WriteZeroes(off, len, f)
            }
            75..=81 if discard_ok => RandOp::Discard(off, len),
            75..=86 => RandOp::Flush,
            87..=95 => RandOp::Extents(off, len.max(rng.gen_range(1..=1024) * l).min(limit - off)),
            _ => RandOp::Cache(off, len),
        };
        recent.push_back((i, op.clone()));
        if recent.len() > 12 {
            recent.pop_front();
        }
        match op {
            RandOp::Write(_, _, flags) => {
                let data = random_bytes(&mut rng, n);
                if let Err(e) = dev.write_at(&data, off, flags) {
                    fail(&recent, format!("write failed: {e}"));
                }
                model[o..o + n].copy_from_slice(&data);
                blocks_of(&mut known, true);
            }
            RandOp::Read(..) => {
                let mut buf = vec![0u8; n];
                if let Err(e) = dev.read_at(&mut buf, off) {
                    fail(&recent, format!("read failed: {e}"));
                }
                check(&recent, &model, &known, off, &buf);
            }
            RandOp::WriteZeroes(_, _, flags) => match dev.write_zeroes(off, len, flags) {
                Ok(()) => {
                    model[o..o + n].fill(0);
                    blocks_of(&mut known, true);
                }
                Err(e)
                    if e.kind() == ErrorKind::Unsupported
                        && flags.contains(WriteFlags::FAST_ZERO) =>
                {
                    // Refused: the data must be unchanged, checked by the next reads.
                }
                Err(e) => fail(&recent, format!("write_zeroes failed: {e}")),
            },
            RandOp::Discard(..) => {
                if let Err(e) = dev.discard(off, len) {
                    fail(&recent, format!("discard failed: {e}"));
                }
                blocks_of(&mut known, false);
            }
            RandOp::Flush => {
                if let Err(e) = dev.flush() {
                    fail(&recent, format!("flush failed: {e}"));
                }
            }
            RandOp::Extents(eo, el) => {
                let ext = match dev.extents(eo, el) {
                    Ok(e) => e,
                    Err(e) => fail(&recent, format!("extents failed: {e}")),
                };
                let mut pos = eo;
                for e in &ext {
                    let ok = e.offset == pos
                        && e.length > 0
                        && e.offset % l == 0
                        && e.length % l == 0
                        && e.offset + e.length <= eo + el
                        && (!e.hole || e.zero);
                    if !ok {
                        fail(&recent, format!("bad extents for ({eo}, {el}): {ext:?}"));
                    }
                    if e.zero {
                        let z = &model[usize_of(e.offset)..usize_of(e.offset + e.length)];
                        let kn =
                            &known[usize_of(e.offset / l)..usize_of((e.offset + e.length) / l)];
                        let nonzero = z
                            .chunks(usize_of(l))
                            .zip(kn)
                            .position(|(c, &k)| k && c.iter().any(|&b| b != 0));
                        if let Some(p) = nonzero {
                            fail(
                                &recent,
                                format!(
                                    "extent {e:?} claims zeroes but block at {} holds data",
                                    e.offset + p as u64 * l
                                ),
                            );
                        }
                    }
                    pos += e.length;
                }
                if ext.is_empty() {
                    fail(&recent, format!("extents({eo}, {el}) returned nothing"));
                }
            }
            RandOp::Cache(..) => {
                if let Err(e) = dev.cache(off, len) {
                    fail(&recent, format!("cache failed: {e}"));
                }
            }
        }
    }
    let got = read(dev, 0, limit);
    check(&recent, &model, &known, 0, &got);
}

/// A [`BlockDevice`] method, as [`check_pass_through`] names what a filter changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Geometry,
    Capabilities,
    CompletesLater,
    ReadAt,
    WriteAt,
    Flush,
    Discard,
    WriteZeroes,
    ReadThen,
    WriteThen,
    FlushThen,
    DiscardThen,
    Extents,
    Cache,
}

impl Method {
    /// What reaches a [`Recorder`] below: every method but the three that describe.
    const CALLS: [Method; 11] = [
        Method::ReadAt,
        Method::WriteAt,
        Method::Flush,
        Method::Discard,
        Method::WriteZeroes,
        Method::ReadThen,
        Method::WriteThen,
        Method::FlushThen,
        Method::DiscardThen,
        Method::Extents,
        Method::Cache,
    ];
}

/// The device [`check_pass_through`] puts under a filter: a [`crate::MemDisk`] that
/// records which method each call came in by, says it completes later (its `*_then`
/// forms answer before they return, which the contract allows) and has every capability.
#[derive(Debug)]
pub struct Recorder {
    disk: crate::MemDisk,
    calls: std::sync::Mutex<Vec<Method>>,
}

impl Recorder {
    pub fn new(size: u64) -> Recorder {
        Recorder {
            disk: crate::MemDisk::new(size),
            calls: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn note(&self, m: Method) {
        self.calls
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(m);
    }

    /// The calls seen since the last `take`.
    pub fn take(&self) -> Vec<Method> {
        std::mem::take(
            &mut *self
                .calls
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    pub const CAPABILITIES: crate::Capabilities = crate::Capabilities {
        read_only: false,
        flush: Support::Native,
        fua: Support::Native,
        discard: Support::Native,
        write_zeroes: Support::Native,
        extents: true,
    };
}

impl BlockDevice for Recorder {
    fn geometry(&self) -> Geometry {
        self.disk.geometry()
    }
    fn capabilities(&self) -> crate::Capabilities {
        Recorder::CAPABILITIES
    }
    fn completes_later(&self) -> bool {
        true
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> crate::Result<()> {
        self.note(Method::ReadAt);
        self.disk.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> crate::Result<()> {
        self.note(Method::WriteAt);
        self.disk.write_at(buf, offset, flags)
    }
    fn flush(&self) -> crate::Result<()> {
        self.note(Method::Flush);
        self.disk.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> crate::Result<()> {
        self.note(Method::Discard);
        self.disk.discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> crate::Result<()> {
        self.note(Method::WriteZeroes);
        self.disk.write_zeroes(offset, len, flags)
    }
    fn read_then(&self, len: usize, offset: u64, done: crate::ReadDone) {
        self.note(Method::ReadThen);
        let mut buf = vec![0u8; len];
        done(self.disk.read_at(&mut buf, offset).map(|()| buf));
    }
    fn write_then(&self, buf: &[u8], offset: u64, flags: WriteFlags, done: crate::WriteDone) {
        self.note(Method::WriteThen);
        done(self.disk.write_at(buf, offset, flags));
    }
    fn flush_then(&self, done: crate::WriteDone) {
        self.note(Method::FlushThen);
        done(self.disk.flush());
    }
    fn discard_then(&self, offset: u64, len: u64, done: crate::WriteDone) {
        self.note(Method::DiscardThen);
        done(self.disk.discard(offset, len));
    }
    fn extents(&self, offset: u64, len: u64) -> crate::Result<Vec<Extent>> {
        self.note(Method::Extents);
        self.disk.extents(offset, len)
    }
    fn cache(&self, offset: u64, len: u64) -> crate::Result<()> {
        self.note(Method::Cache);
        self.disk.cache(offset, len)
    }
}

/// Checks that a filter keeps what the device below says (geometry, capabilities,
/// [`BlockDevice::completes_later`]) and passes each call to the same method below,
/// exactly once (a `*_then` form to the `*_then` form, so a member that completes later
/// keeps overlapping its operations), except the methods in `changes`, which the filter
/// says it changes. `wrap` puts the filter over the [`Recorder`] it is given (1 MiB).
/// Panics with the first method that does not pass through.
pub fn check_pass_through(
    wrap: &dyn Fn(std::sync::Arc<dyn BlockDevice>) -> std::sync::Arc<dyn BlockDevice>,
    changes: &[Method],
) {
    let below = std::sync::Arc::new(Recorder::new(1 << 20));
    let dev = wrap(below.clone());
    let kept = |m: Method| !changes.contains(&m);
    if kept(Method::Geometry) {
        assert_eq!(dev.geometry(), below.geometry(), "geometry changed");
    }
    if kept(Method::Capabilities) {
        assert_eq!(
            dev.capabilities(),
            Recorder::CAPABILITIES,
            "capabilities changed"
        );
    }
    if kept(Method::CompletesLater) {
        assert!(dev.completes_later(), "completes_later() changed");
    }
    below.take();
    for m in Method::CALLS {
        if !kept(m) {
            continue;
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let ok = |r: crate::Result<()>| {
            if let Err(e) = r {
                panic!("{m:?} through the filter failed: {e}");
            }
        };
        let mut buf = vec![0u8; 4096];
        match m {
            Method::ReadAt => ok(dev.read_at(&mut buf, 4096)),
            Method::WriteAt => ok(dev.write_at(&buf, 4096, WriteFlags::NONE)),
            Method::Flush => ok(dev.flush()),
            Method::Discard => ok(dev.discard(4096, 4096)),
            Method::WriteZeroes => ok(dev.write_zeroes(4096, 4096, WriteFlags::NONE)),
            Method::ReadThen => {
                dev.read_then(4096, 4096, Box::new(move |r| tx.send(r.map(drop)).unwrap()));
            }
            Method::WriteThen => {
                let t = tx.clone();
                dev.write_then(
                    &buf,
                    4096,
                    WriteFlags::NONE,
                    Box::new(move |r| t.send(r).unwrap()),
                );
            }
            Method::FlushThen => {
                let t = tx.clone();
                dev.flush_then(Box::new(move |r| t.send(r).unwrap()));
            }
            Method::DiscardThen => {
                let t = tx.clone();
                dev.discard_then(4096, 4096, Box::new(move |r| t.send(r).unwrap()));
            }
            Method::Extents => ok(dev.extents(4096, 4096).map(drop)),
            Method::Cache => ok(dev.cache(4096, 4096)),
            Method::Geometry | Method::Capabilities | Method::CompletesLater => unreachable!(),
        }
        if matches!(
            m,
            Method::ReadThen | Method::WriteThen | Method::FlushThen | Method::DiscardThen
        ) {
            let r = rx
                .recv_timeout(std::time::Duration::from_secs(10))
                .unwrap_or_else(|_| panic!("{m:?} through the filter never completed"));
            ok(r);
        }
        assert_eq!(
            below.take(),
            vec![m],
            "{m:?} through the filter did not arrive below as {m:?}, once"
        );
    }
}
