//! One cell's stack, built through the libraries as `cairn md create` and `cairn luks
//! format` build it: members (scratch sparse files, or the user's devices) -> optional
//! [`DelayDisk`] -> md [`Array`] -> [`StripeCache`] (parity levels) -> LUKS2.
//!
//! The LUKS2 passphrase is random, held only in memory and dropped (zeroised) once the
//! volume is open; its key derivation is PBKDF2 with few rounds, since nobody ever needs
//! to unlock a scratch volume again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_block::{BlockDevice, FileDisk, OpenOptions};
use cairn_luks::{FormatOptions, Luks2, PbkdfOptions};
use cairn_md::{Array, CreateOptions, Level, Sectors, StripeCache, StripeCacheOptions};
use zeroize::Zeroizing;

use super::{CellSpec, Plan};
use crate::error::{CliError, Result};

/// A member that waits a fixed time before each operation: a model of a disk's or a
/// network's latency, so that what the stack costs in member operations shows in the
/// figures whatever the machine's own speed. It counts the operations too.
#[derive(Debug)]
pub struct DelayDisk {
    inner: Arc<dyn BlockDevice>,
    delay: Duration,
    ops: AtomicU64,
}

impl DelayDisk {
    pub fn new(inner: Arc<dyn BlockDevice>, delay: Duration) -> DelayDisk {
        DelayDisk {
            inner,
            delay,
            ops: AtomicU64::new(0),
        }
    }

    /// Reads, writes, flushes, discards and zeroings passed on so far.
    pub fn ops(&self) -> u64 {
        self.ops.load(Ordering::Relaxed)
    }

    fn wait(&self) {
        self.ops.fetch_add(1, Ordering::Relaxed);
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
    }
}

/// Waits before each operation and passes everything on, `*_then` forms included: a
/// member that completes later (`--nbd`) keeps overlapping its operations (the wait is
/// on the thread that sends each one).
impl cairn_block::Filter for DelayDisk {
    type Inner = dyn BlockDevice;
    fn inner(&self) -> impl std::ops::Deref<Target = dyn BlockDevice> + '_ {
        &*self.inner
    }
    fn admit(&self, _op: cairn_block::IoOp) -> cairn_block::Result<()> {
        self.wait();
        Ok(())
    }
}

cairn_block::filter_device!(DelayDisk);

/// Where the members come from: scratch files in a directory this run made, or the
/// user's devices. The directory is made either way (it also holds `--nbd`'s sockets, key
/// file and server log) and is removed on drop, also on failure.
#[derive(Debug)]
pub struct Scratch {
    dir: PathBuf,
    devices: Vec<PathBuf>,
}

impl Scratch {
    pub fn new(dir: Option<&Path>, devices: &[PathBuf]) -> Result<Scratch> {
        let parent = dir.map_or_else(std::env::temp_dir, Path::to_path_buf);
        let d = parent.join(format!("cairn-bench-{}", std::process::id()));
        std::fs::create_dir_all(&d).map_err(|e| {
            CliError::new(format!(
                "cannot make the scratch directory {}: {e}; choose another with --dir DIR",
                d.display()
            ))
        })?;
        Ok(Scratch {
            dir: d,
            devices: devices.to_vec(),
        })
    }

    /// This run's own directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn uses_devices(&self) -> bool {
        !self.devices.is_empty()
    }

    /// The member paths of a cell: the devices, or `n` files in the scratch directory.
    pub fn member_paths(&self, n: u32) -> Vec<PathBuf> {
        if self.devices.is_empty() {
            (0..n).map(|i| self.dir.join(format!("m{i}.img"))).collect()
        } else {
            self.devices.clone()
        }
    }

    /// Removes the last cell's files (the next cell starts from fresh ones).
    pub fn clear(&self) {
        if let Ok(rd) = std::fs::read_dir(&self.dir) {
            for e in rd.flatten() {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A cell's open stack.
#[derive(Debug)]
pub struct Stack {
    /// What the measurements drive: the LUKS volume, or the array (behind its cache).
    pub top: Arc<dyn BlockDevice>,
    pub array: Arc<Array>,
    /// The array's full stripe in bytes (its optimal I/O size).
    pub full_stripe: u64,
    /// Where the LUKS payload starts on the array; 0 without LUKS.
    pub payload_offset: u64,
    /// The members as the array sees them, counting their operations.
    pub members: Vec<Arc<DelayDisk>>,
}

impl Stack {
    /// Member operations so far, all members together.
    pub fn member_ops(&self) -> u64 {
        self.members.iter().map(|m| m.ops()).sum()
    }
}

impl Stack {
    /// Closes the array cleanly (the members are removed by [`Scratch::clear`]).
    pub fn close(self) {
        let Stack { top, array, .. } = self;
        drop(top);
        if let Err(e) = array.close() {
            tracing::warn!("closing the bench array: {e}");
        }
    }
}

/// Data members per stripe: what one member holds of the usable size.
pub fn data_members(level: Level, members: u32) -> u32 {
    match level {
        Level::Raid1 => 1,
        Level::Raid10 => (members / 2).max(1),
        Level::Raid0 | Level::Linear => members,
        l => members
            .saturating_sub(u32::try_from(l.parity_members()).unwrap_or(0))
            .max(1),
    }
}

/// A member size that gives an array of about `size` usable bytes: the data part plus
/// md's data offset, which itself depends on the member size.
fn member_size(size: u64, level: Level, members: u32, chunk: u64) -> u64 {
    let data = size.div_ceil(u64::from(data_members(level, members)));
    let chunk_s = Sectors::from_bytes_floor(chunk);
    let mut m = data + (8 << 20);
    for _ in 0..4 {
        let off = cairn_md::create::default_data_offset(Sectors::from_bytes_floor(m), chunk_s);
        m = data + off.bytes().unwrap_or(8 << 20) + chunk.max(4096);
    }
    m.next_multiple_of(1 << 20)
}

/// Builds one cell's stack.
/// With `key_file`, the LUKS passphrase is also written there (mode 0600), for `--nbd`'s
/// server to unlock the volume with.
pub fn build(
    plan: &Plan,
    spec: &CellSpec,
    scratch: &Scratch,
    key_file: Option<&Path>,
) -> Result<Stack> {
    let level = Level::parse(&spec.level)
        .ok_or_else(|| CliError::new(format!("unknown level {}", spec.level)))?;
    let paths = scratch.member_paths(spec.members);
    let create_size = (!scratch.uses_devices())
        .then(|| member_size(plan.size, level, spec.members, spec.chunk.max(4096)));
    let mut devices: Vec<Arc<dyn BlockDevice>> = Vec::new();
    let mut counters: Vec<Arc<DelayDisk>> = Vec::new();
    for p in &paths {
        let disk = FileDisk::open(
            p,
            &OpenOptions {
                read_only: false,
                direct: false,
                create_size,
            },
        )
        .map_err(|e| CliError::new(format!("cannot open {}: {e}", p.display())))?;
        // Every member is counted (an atomic add per operation); delayed only with
        // --member-latency.
        let counted = Arc::new(DelayDisk::new(
            Arc::new(disk),
            plan.member_latency.unwrap_or(Duration::ZERO),
        ));
        counters.push(counted.clone());
        devices.push(counted);
    }
    let mut opts = CreateOptions::new(level, "bench");
    if let Some(l) = &spec.layout {
        opts.layout = super::layout_word(level, l).map(|(_, word)| word);
    }
    if spec.chunk > 0 {
        opts.chunk = Some(Sectors::from_bytes_floor(spec.chunk));
    }
    // Scratch files were just made sparse; given devices are overwritten (--destructive).
    opts.members_zeroed = !scratch.uses_devices();
    opts.assume_clean = scratch.uses_devices();
    opts.force = scratch.uses_devices();
    let names = paths.iter().map(|p| p.display().to_string()).collect();
    let array = Arc::new(Array::create(devices, names, &opts).map_err(|e| {
        CliError::new(format!(
            "cannot create the {} array for {}: {e}",
            spec.level,
            spec.label()
        ))
    })?);
    let full_stripe = u64::from(array.geometry().optimal_io_size);
    let below: Arc<dyn BlockDevice> = if spec.stripe_cache > 0 && level.parity_members() > 0 {
        Arc::new(StripeCache::new(
            array.clone(),
            StripeCacheOptions {
                size: spec.stripe_cache,
                ..StripeCacheOptions::default()
            },
        ))
    } else {
        array.clone()
    };
    if spec.cipher == "none" {
        return Ok(Stack {
            top: below,
            array,
            full_stripe,
            payload_offset: 0,
            members: counters,
        });
    }
    let mut pass = Zeroizing::new([0u8; 32]);
    fill_random(pass.as_mut_slice());
    if let Some(k) = key_file {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        let _ = std::fs::remove_file(k);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(k)
            .and_then(|mut f| f.write_all(pass.as_slice()))
            .map_err(|e| {
                CliError::new(format!("cannot write the key file {}: {e}", k.display()))
            })?;
    }
    let fopts = FormatOptions {
        key_size: spec.key_size,
        sector_size: Some(spec.sector_size),
        pbkdf: PbkdfOptions::pbkdf2(1000),
        label: "cairn-bench".into(),
        ..FormatOptions::default()
    };
    let fail = |e: cairn_block::Error| {
        CliError::new(format!(
            "cannot put LUKS2 on the array for {}: {e}",
            spec.label()
        ))
    };
    let luks = Luks2::format(below, &fopts, pass.as_slice()).map_err(fail)?;
    let unlocked = luks.unlock(pass.as_slice(), None).map_err(fail)?;
    let crypt = luks.activate(&unlocked.volume_key).map_err(fail)?;
    let payload_offset = crypt.segment().offset;
    Ok(Stack {
        top: Arc::new(crypt),
        array,
        full_stripe,
        payload_offset,
        members: counters,
    })
}

/// Random bytes from the kernel (a scratch passphrase nobody needs to know).
fn fill_random(buf: &mut [u8]) {
    use std::io::Read as _;
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        if f.read_exact(buf).is_ok() {
            return;
        }
    }
    // No /dev/urandom: the time is as good a passphrase for a throwaway volume.
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
        .to_le_bytes();
    for (b, t) in buf.iter_mut().zip(t.iter().cycle()) {
        *b = *t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_block::{MemDisk, WriteFlags};

    /// A network member (`--nbd`) under the delay keeps overlapping its operations: every
    /// call, `*_then` forms included, reaches it as it was made, and it still completes
    /// later.
    #[test]
    fn the_member_delay_passes_everything_through() {
        cairn_block::testkit::conformance::check_pass_through(
            &|d| Arc::new(DelayDisk::new(d, Duration::ZERO)),
            &[],
        );
    }

    /// Member operations for writing 4 MiB sequentially in `req`-byte requests to a
    /// RAID6 over 4 members with 64 KiB chunks (full stripe 128 KiB), no stripe cache.
    fn member_ops(req: u64) -> u64 {
        let members: Vec<Arc<DelayDisk>> = (0..4)
            .map(|_| {
                Arc::new(DelayDisk::new(
                    Arc::new(MemDisk::new(64 << 20)),
                    Duration::ZERO,
                ))
            })
            .collect();
        let devices: Vec<Arc<dyn BlockDevice>> = members
            .iter()
            .map(|m| m.clone() as Arc<dyn BlockDevice>)
            .collect();
        let mut opts = CreateOptions::new(Level::Raid6, "knee");
        opts.chunk = Some(Sectors::from_bytes_floor(64 << 10));
        opts.members_zeroed = true;
        let names = (0..4).map(|i| format!("m{i}")).collect();
        let array = Array::create(devices, names, &opts).expect("create");
        assert_eq!(array.geometry().optimal_io_size, 128 << 10);
        // The first writes of a region also set its bitmap bits: warm them up first.
        let buf = vec![0x5au8; usize::try_from(req).expect("small")];
        let mut off = 0;
        while off < 4 << 20 {
            array.write_at(&buf, off, WriteFlags::NONE).expect("write");
            off += req;
        }
        array.flush().expect("flush");
        let before: u64 = members.iter().map(|m| m.ops()).sum();
        let mut off = 0;
        while off < 4 << 20 {
            array.write_at(&buf, off, WriteFlags::NONE).expect("write");
            off += req;
        }
        array.flush().expect("flush");
        let after: u64 = members.iter().map(|m| m.ops()).sum();
        array.close().expect("close");
        after - before
    }

    /// The knee the sweep shows, counted instead of timed: on a RAID6 4 x 64K, writing in
    /// 64 KiB requests (half a stripe: read-modify-write) costs at least twice the member
    /// operations of writing the same bytes in 128 KiB requests (full stripes: parity
    /// from the new data alone). With a fixed cost per member operation
    /// (--member-latency) that is write throughput at 128K >= 2 x at 64K.
    #[test]
    fn full_stripe_knee_in_member_operations() {
        let half = member_ops(64 << 10);
        let full = member_ops(128 << 10);
        println!("member operations for 4 MiB: 64K requests {half}, 128K requests {full}");
        assert!(full > 0);
        assert!(
            half >= 2 * full,
            "64K requests: {half} member ops, 128K requests: {full} for the same 4 MiB"
        );
    }
}
