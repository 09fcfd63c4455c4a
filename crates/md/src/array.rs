//! The array: md's data layout served as one [`BlockDevice`].
//!
//! ```text
//!   read_at / write_at / flush / discard          (array byte offsets)
//!     ├─ linear, raid0         one member per piece
//!     ├─ raid1, raid10         every copy on write (range-locked), one copy on read
//!     └─ raid4/5/6 (stripe.rs) per stripe, under a striped lock: full-stripe write,
//!                              read-modify-write or reconstruct-write, degraded rows
//!   Slot[role] ── Member { dev, name, data_offset }   + failed flag
//!   Meta ── superblock state: events, dirty/clean, faulty roles  (metadata updates)
//! ```
//!
//! Members are indexed by role (slot). A member is *up* when it is present and has not
//! failed. A member fails when a write or flush to it fails while the array still has
//! redundancy: the array marks it faulty in the other members' superblocks (events + 1)
//! before the request completes, so that it is never reassembled as current. A read
//! error is repaired instead: the data comes from another copy or from parity, and is
//! written back to the member that could not read it.
//!
//! Like md, redundant levels mark the superblocks dirty (`resync_offset` 0, events + 1)
//! before the first write and clean again on [`Array::close`] (also run on drop). There
//! is no idle timer ("safemode") yet, so an array that is written to stays dirty until
//! it is closed. An array assembled with a resync pending stays so until
//! [`Array::resync`] or the background resync ([`Array::start_resync`],
//! background.rs) has run to the end; a clean stop part-way records a checkpoint.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cairn_block::{
    BlockDevice, Capabilities, Error, ErrorKind, Geometry, Result, Support, WriteFlags,
};

use crate::layout::{ArrayLayout, Location};
use crate::level::Level;
use crate::ondisk::{DevRole, MdTime, SetName, Superblock, Uuid};
use crate::parity::Parity;
use crate::units::{small, wide, Sectors, SECTOR_SIZE};

/// The largest request the array advertises (it serves larger ones too).
const MAX_IO: u32 = 32 << 20;
/// RAID1 serialises writes per region of this many bytes (so copies cannot diverge
/// under overlapping concurrent writes).
const MIRROR_REGION: u64 = 64 << 10;
/// Entries in the striped lock table.
const LOCKS: usize = 1024;
/// Requests at least this large go to their members on parallel threads. Threads are
/// started per request (`std::thread::scope`), which costs tens of microseconds: on
/// members in memory that cost more than it saved for 1 MiB requests (examples/
/// array_bench.rs, 2 cores), so only large requests fan out. A persistent per-member
/// worker would make smaller requests worth it, and matters for members with latency
/// (disks, NBD).
pub(crate) const FAN_OUT_MIN: usize = 4 << 20;

/// Runs `f` on every job; the jobs of one member run in order on one thread, different
/// members in parallel when `parallel`. Results come back in job order.
pub(crate) fn fan_out<J: Send, R: Send>(
    jobs: Vec<(usize, J)>,
    parallel: bool,
    f: impl Fn(J) -> R + Sync,
) -> Vec<R> {
    if !parallel {
        return jobs.into_iter().map(|(_, job)| f(job)).collect();
    }
    let mut groups: std::collections::BTreeMap<usize, Vec<(usize, J)>> = Default::default();
    let n = jobs.len();
    for (i, (member, job)) in jobs.into_iter().enumerate() {
        groups.entry(member).or_default().push((i, job));
    }
    let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
    if groups.len() < 2 {
        for (i, job) in groups.into_values().flatten() {
            out[i] = Some(f(job));
        }
    } else {
        std::thread::scope(|s| {
            let f = &f;
            let mut groups = groups.into_values();
            let first = groups.next().expect("two groups or more");
            let handles: Vec<_> = groups
                .map(|g| s.spawn(move || g.into_iter().map(|(i, j)| (i, f(j))).collect::<Vec<_>>()))
                .collect();
            for (i, job) in first {
                out[i] = Some(f(job));
            }
            for h in handles {
                let done = h.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
                for (i, r) in done {
                    out[i] = Some(r);
                }
            }
        });
    }
    out.into_iter().map(|r| r.expect("every job ran")).collect()
}

/// One member device, as the array uses it.
pub(crate) struct Member {
    pub(crate) dev: Arc<dyn BlockDevice>,
    pub(crate) name: String,
    /// `data_offset` in bytes.
    pub(crate) base: u64,
}

/// A role of the array and the member (if any) that fills it.
pub(crate) struct Slot {
    pub(crate) member: Option<Member>,
    pub(crate) failed: AtomicBool,
}

/// What the superblocks say about the array as a whole.
#[derive(Debug, Clone)]
pub(crate) struct Identity {
    pub(crate) uuid: Uuid,
    pub(crate) set_name: SetName,
    pub(crate) level: Level,
    pub(crate) layout_word: u32,
    pub(crate) chunk: Sectors,
    pub(crate) component_size: Sectors,
    pub(crate) ctime: MdTime,
    pub(crate) feature_map: u32,
}

/// Superblock state, owned by the metadata lock.
pub(crate) struct Meta {
    pub(crate) events: u64,
    pub(crate) utime: MdTime,
    /// The superblocks say "active": written since the last clean close.
    pub(crate) dirty: bool,
    /// Assembled with `resync_offset != MAX` (never marked clean until a resync).
    pub(crate) resync_pending: bool,
    /// Where a pending resync resumes (md's `recovery_cp`, member sectors): written to
    /// `resync_offset` by a clean stop while a resync is pending.
    pub(crate) resync_from: Sectors,
    /// Each present member's current superblock, by role; `None` for an array without
    /// superblocks (then nothing is ever written) or a missing role.
    pub(crate) sbs: Vec<Option<Superblock>>,
    /// The `dev_roles` table of the freshest superblock.
    pub(crate) dev_roles: Vec<DevRole>,
}

/// Why a member is not part of the running array, for reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub(crate) struct LeftOut {
    pub(crate) name: String,
    pub(crate) role: Option<u32>,
    pub(crate) events: u64,
    pub(crate) reason: String,
}

/// A striped lock table: a key (stripe, chunk, region) hashes to one of [`LOCKS`]
/// mutexes. Different keys usually proceed in parallel; one key is serialised.
struct LockTable {
    locks: Box<[Mutex<()>]>,
}

impl LockTable {
    fn new() -> LockTable {
        LockTable {
            locks: (0..LOCKS).map(|_| Mutex::new(())).collect(),
        }
    }

    fn index(key: u64) -> usize {
        // Fibonacci hashing: neighbouring stripes land far apart.
        small(key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 54) % LOCKS
    }

    fn lock(&self, key: u64) -> MutexGuard<'_, ()> {
        self.locks[Self::index(key)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Locks every key's mutex, in table order so that two callers cannot deadlock.
    fn lock_many(&self, keys: impl Iterator<Item = u64>) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = keys.map(Self::index).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter()
            .map(|i| self.locks[i].lock().unwrap_or_else(PoisonError::into_inner))
            .collect()
    }
}

/// An md array over its members: a [`BlockDevice`] of the array's size.
///
/// Built by [`Array::assemble`], [`Array::create`], or (without superblocks)
/// [`Array::from_layout`].
pub struct Array {
    pub(crate) layout: ArrayLayout,
    pub(crate) slots: Vec<Slot>,
    geometry: Geometry,
    caps: Capabilities,
    pub(crate) parity: Parity,
    locks: LockTable,
    next_read: AtomicUsize,
    pub(crate) meta: Mutex<Meta>,
    /// Fast-path copy of `meta.dirty`.
    dirty: AtomicBool,
    pub(crate) identity: Identity,
    pub(crate) left_out: Vec<LeftOut>,
    pub(crate) forced: bool,
    closed: AtomicBool,
    label: String,
    /// Resync running in the background (background.rs).
    pub(crate) background: Mutex<Option<Arc<crate::background::Job>>>,
    /// Client reads and writes so far: the resync slows to its minimum speed while
    /// this moves.
    fg_ops: AtomicU64,
    /// The partial-parity log closing the RAID4/5/6 write hole (ppl.rs), when the
    /// members carry one.
    pub(crate) ppl: Option<crate::ppl::Ppl>,
}

impl fmt::Debug for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Array")
            .field("uuid", &self.identity.uuid)
            .field("level", &self.identity.level)
            .field("members", &self.member_names())
            .field("geometry", &self.geometry)
            .finish()
    }
}

impl Array {
    /// An array over `members` (by role; `None` for a missing one) placed by `layout`,
    /// each member's data starting at its `data_offsets` entry, **without superblocks**:
    /// nothing but data is ever written. For tests and tools that need md's data layout
    /// on bare devices (the known-answer images use data offset 0, which no superblock
    /// can describe).
    pub fn from_layout(
        layout: ArrayLayout,
        members: Vec<Option<Arc<dyn BlockDevice>>>,
        data_offsets: &[Sectors],
    ) -> Result<Array> {
        let n = layout.raid_disks();
        if members.len() != n || data_offsets.len() != n {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "{} members and {} data offsets for {n} roles",
                    members.len(),
                    data_offsets.len()
                ),
            ));
        }
        let (level, layout_word, chunk, component) = match &layout {
            ArrayLayout::Linear(_) => (Level::Linear, 0, Sectors::ZERO, Sectors::ZERO),
            ArrayLayout::Raid0(l) => (Level::Raid0, l.layout().to_raw(), l.chunk(), Sectors::ZERO),
            ArrayLayout::Raid1(l) => (Level::Raid1, 0, Sectors::ZERO, l.array_sectors()),
            ArrayLayout::Parity(l) => (
                l.level(),
                l.algorithm().to_raw(),
                l.chunk(),
                Sectors(l.stripes() * l.chunk().0),
            ),
            ArrayLayout::Raid10(l) => (
                Level::Raid10,
                l.layout().to_raw(),
                l.chunk(),
                l.dev_sectors(),
            ),
        };
        let identity = Identity {
            uuid: Uuid::default(),
            set_name: SetName::from_parts(None, "(no superblock)"),
            level,
            layout_word,
            chunk,
            component_size: component,
            ctime: MdTime(0),
            feature_map: 0,
        };
        let slots = members
            .into_iter()
            .zip(data_offsets)
            .enumerate()
            .map(|(i, (dev, off))| {
                Ok(Slot {
                    member: match dev {
                        Some(dev) => Some(Member {
                            dev,
                            name: format!("member {i}"),
                            base: off.bytes().ok_or_else(|| {
                                Error::new(ErrorKind::InvalidArgument, "data offset overflows")
                            })?,
                        }),
                        None => None,
                    },
                    failed: AtomicBool::new(false),
                })
            })
            .collect::<Result<Vec<Slot>>>()?;
        let meta = Meta {
            events: 0,
            utime: MdTime(0),
            dirty: false,
            resync_pending: false,
            resync_from: Sectors::ZERO,
            sbs: (0..n).map(|_| None).collect(),
            dev_roles: Vec::new(),
        };
        Array::build(layout, slots, identity, meta, Vec::new(), false)
    }

    pub(crate) fn build(
        layout: ArrayLayout,
        slots: Vec<Slot>,
        identity: Identity,
        meta: Meta,
        left_out: Vec<LeftOut>,
        forced: bool,
    ) -> Result<Array> {
        let size = layout
            .array_sectors()
            .bytes()
            .expect("layouts keep the size within bytes");
        let present = || slots.iter().filter_map(|s| s.member.as_ref());
        let lbs = present()
            .map(|m| m.dev.geometry().logical_block_size)
            .max()
            .unwrap_or(512)
            .max(512);
        let member_pbs = present()
            .map(|m| m.dev.geometry().physical_block_size)
            .max()
            .unwrap_or(4096)
            .max(lbs);
        let chunk_bytes = u32::try_from(identity.chunk.0 * SECTOR_SIZE).unwrap_or(u32::MAX);
        let (pbs, optimal) = match &layout {
            ArrayLayout::Linear(_) | ArrayLayout::Raid1(_) => (member_pbs, member_pbs.max(4096)),
            ArrayLayout::Raid0(l) => (
                chunk_bytes,
                stripe_width(chunk_bytes, l.zones()[0].members.len()),
            ),
            ArrayLayout::Parity(l) => (chunk_bytes, stripe_width(chunk_bytes, l.data_disks())),
            ArrayLayout::Raid10(l) => (
                chunk_bytes,
                stripe_width(
                    chunk_bytes,
                    (l.raid_disks() / usize::from(l.layout().near)).max(1),
                ),
            ),
        };
        let pbs = pbs.max(lbs);
        let geometry = Geometry {
            size: size - size % u64::from(lbs),
            logical_block_size: lbs,
            physical_block_size: pbs,
            optimal_io_size: optimal.max(pbs),
            max_io_size: MAX_IO.max(optimal),
        };
        let mirrored = matches!(layout, ArrayLayout::Raid1(_) | ArrayLayout::Raid10(_));
        let discard =
            if mirrored || matches!(layout, ArrayLayout::Raid0(_) | ArrayLayout::Linear(_)) {
                present()
                    .map(|m| m.dev.capabilities().discard)
                    .min()
                    .unwrap_or(Support::None)
            } else {
                Support::None
            };
        let caps = Capabilities {
            read_only: present().any(|m| m.dev.capabilities().read_only),
            flush: Support::Native,
            fua: Support::Native,
            discard,
            write_zeroes: Support::Emulate,
            extents: false,
        };
        let dirty = meta.dirty;
        let label = if meta.sbs.iter().any(Option::is_some) {
            format!("md array {}", identity.set_name)
        } else {
            format!("{} array", identity.level)
        };
        Ok(Array {
            layout,
            slots,
            geometry,
            caps,
            parity: Parity::new(),
            locks: LockTable::new(),
            next_read: AtomicUsize::new(0),
            meta: Mutex::new(meta),
            dirty: AtomicBool::new(dirty),
            identity,
            left_out,
            forced,
            closed: AtomicBool::new(false),
            label,
            background: Mutex::new(None),
            fg_ops: AtomicU64::new(0),
            ppl: None,
        })
    }

    /// The placement maths in use.
    pub fn layout(&self) -> &ArrayLayout {
        &self.layout
    }

    pub fn level(&self) -> Level {
        self.identity.level
    }

    pub fn uuid(&self) -> Uuid {
        self.identity.uuid
    }

    /// The member filling each role (`None` where it is missing), in role order.
    pub fn member_names(&self) -> Vec<Option<&str>> {
        self.slots
            .iter()
            .map(|s| s.member.as_ref().map(|m| m.name.as_str()))
            .collect()
    }

    /// The device filling `role`, if any.
    pub fn member(&self, role: usize) -> Option<&Arc<dyn BlockDevice>> {
        self.slots.get(role)?.member.as_ref().map(|m| &m.dev)
    }

    /// Whether `role` is present and has not failed.
    pub fn is_up(&self, role: usize) -> bool {
        let s = &self.slots[role];
        s.member.is_some() && !s.failed.load(Ordering::Acquire)
    }

    /// Roles that are missing or have failed.
    pub fn down_roles(&self) -> Vec<usize> {
        (0..self.slots.len()).filter(|&r| !self.is_up(r)).collect()
    }

    pub(crate) fn down_mask(&self) -> Vec<bool> {
        (0..self.slots.len()).map(|r| !self.is_up(r)).collect()
    }

    /// "role 2 (disk2.img)" or "role 2 (missing)", for messages.
    pub(crate) fn describe_role(&self, role: usize) -> String {
        match &self.slots[role].member {
            Some(m) => format!("{} (role {role})", m.name),
            None => format!("role {role} (missing)"),
        }
    }

    /// "md array host:name", for messages. Never takes the metadata lock (it is used
    /// while that lock is held).
    pub(crate) fn array_label(&self) -> &str {
        &self.label
    }

    pub(crate) fn meta_lock(&self) -> MutexGuard<'_, Meta> {
        self.meta.lock().unwrap_or_else(PoisonError::into_inner)
    }

    // ---- member I/O ------------------------------------------------------------------

    fn up_member(&self, role: usize) -> Result<&Member> {
        match &self.slots[role].member {
            Some(m) if !self.slots[role].failed.load(Ordering::Acquire) => Ok(m),
            _ => Err(Error::new(
                ErrorKind::Degraded,
                format!("{} is not available", self.describe_role(role)),
            )),
        }
    }

    /// Reads `buf` from `role` at byte `off` of its data area.
    pub(crate) fn read_member(&self, role: usize, buf: &mut [u8], off: u64) -> Result<()> {
        let m = self.up_member(role)?;
        m.dev.read_at(buf, m.base + off).map_err(|e| {
            e.context(format!(
                "{}: read of {} bytes at member offset {}",
                self.describe_role(role),
                buf.len(),
                m.base + off
            ))
        })
    }

    /// Writes `buf` to `role` at byte `off` of its data area.
    pub(crate) fn write_member(
        &self,
        role: usize,
        buf: &[u8],
        off: u64,
        flags: WriteFlags,
    ) -> Result<()> {
        let m = self.up_member(role)?;
        m.dev.write_at(buf, m.base + off, flags).map_err(|e| {
            e.context(format!(
                "{}: write of {} bytes at member offset {}",
                self.describe_role(role),
                buf.len(),
                m.base + off
            ))
        })
    }

    // ---- metadata --------------------------------------------------------------------

    /// Marks `role` failed after `err`: it takes no more I/O, and the other members'
    /// superblocks record it as faulty before this returns.
    pub(crate) fn fail_member(&self, role: usize, err: &Error) {
        if self.slots[role].failed.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(
            "{}: {} failed and is now out of the array: {err}",
            self.array_label(),
            self.describe_role(role)
        );
        let mut meta = self.meta_lock();
        if meta.sbs.iter().any(Option::is_some) {
            meta.events += 1;
            if let Err(e) = self.write_superblocks(&mut meta) {
                tracing::warn!("{}: recording the failure: {e}", self.array_label());
            }
        }
    }

    /// Writes every up member's superblock from `meta` (FUA). A member whose write
    /// fails is failed in turn, and the update is repeated without it.
    pub(crate) fn write_superblocks(&self, meta: &mut Meta) -> Result<()> {
        meta.utime = now();
        for _ in 0..=self.slots.len() {
            let roles = self.current_dev_roles(meta);
            let mut failed = Vec::new();
            let mut written = 0;
            for role in 0..self.slots.len() {
                if !self.is_up(role) {
                    continue;
                }
                let Some(sb) = meta.sbs[role].as_mut() else {
                    continue;
                };
                sb.events = meta.events;
                sb.utime = meta.utime;
                sb.resync_offset = if meta.dirty {
                    Sectors::ZERO
                } else if meta.resync_pending {
                    meta.resync_from
                } else {
                    Sectors::MAX
                };
                sb.dev_roles.clone_from(&roles);
                let m = self.slots[role].member.as_ref().expect("up");
                match sb.write_to(&*m.dev, &m.name) {
                    Ok(()) => written += 1,
                    Err(e) => failed.push((role, e)),
                }
            }
            if failed.is_empty() {
                return if written > 0 {
                    Ok(())
                } else {
                    Err(Error::new(
                        ErrorKind::Io,
                        format!(
                            "{}: no member took the superblock update",
                            self.array_label()
                        ),
                    ))
                };
            }
            for (role, e) in failed {
                self.slots[role].failed.store(true, Ordering::Release);
                tracing::warn!(
                    "{}: {} failed writing its superblock and is now out of the array: {e}",
                    self.array_label(),
                    self.describe_role(role)
                );
            }
            meta.events += 1;
        }
        Err(Error::new(
            ErrorKind::Io,
            format!(
                "{}: superblock update failed on every member",
                self.array_label()
            ),
        ))
    }

    /// md's `super_1_sync` rule: roles of members that are not up become faulty.
    fn current_dev_roles(&self, meta: &Meta) -> Vec<DevRole> {
        let mut roles = meta.dev_roles.clone();
        for r in roles.iter_mut() {
            if let Some(slot) = r.slot() {
                if usize::from(slot) >= self.slots.len() || !self.is_up(usize::from(slot)) {
                    *r = DevRole::FAULTY;
                }
            }
        }
        for (role, sb) in meta.sbs.iter().enumerate() {
            if let (Some(sb), true) = (sb, self.is_up(role)) {
                let i = small(u64::from(sb.dev_number));
                if i < roles.len() {
                    roles[i] = DevRole::active(u16::try_from(role).expect("at most 1920 roles"));
                }
            }
        }
        roles
    }

    /// Before the first write: mark the superblocks dirty (md's `md_write_start`).
    fn start_write(&self) -> Result<()> {
        if self.dirty.load(Ordering::Acquire) || !self.layout_is_redundant() {
            return Ok(());
        }
        let mut meta = self.meta_lock();
        if meta.dirty || !meta.sbs.iter().any(Option::is_some) {
            self.dirty.store(true, Ordering::Release);
            return Ok(());
        }
        meta.dirty = true;
        meta.events += 1;
        self.write_superblocks(&mut meta)
            .map_err(|e| e.context("marking the array dirty before a write"))?;
        self.dirty.store(true, Ordering::Release);
        Ok(())
    }

    fn layout_is_redundant(&self) -> bool {
        !matches!(self.layout, ArrayLayout::Linear(_) | ArrayLayout::Raid0(_))
    }

    /// Flushes every member and marks the superblocks clean (unless a resync is
    /// pending). Called on drop too; calling it again after it succeeded does nothing
    /// unless the array was written to since. The array stays usable.
    pub fn close(&self) -> Result<()> {
        self.stop_background();
        self.flush()?;
        if let Some(log) = &self.ppl {
            log.reset(self)?;
        }
        let mut meta = self.meta_lock();
        if (meta.dirty || meta.resync_pending) && meta.sbs.iter().any(Option::is_some) {
            meta.dirty = false;
            meta.events += 1;
            self.write_superblocks(&mut meta)?;
        }
        meta.dirty = false;
        self.dirty.store(false, Ordering::Release);
        self.closed.store(true, Ordering::Release);
        Ok(())
    }

    /// Makes parity and mirrors agree with the data over the whole array (md's resync),
    /// then records the array clean. Needed after a crash, or after creating over old
    /// data, before the array can be trusted to rebuild a missing member. Runs stripe by
    /// stripe under the same locks as writes, so I/O may continue meanwhile.
    ///
    /// Needs every member: a degraded array cannot be resynced (its missing member
    /// would need a rebuild, which is not implemented yet).
    pub fn resync(&self) -> Result<()> {
        self.check_resync_possible()?;
        self.meta_lock().resync_from = Sectors::ZERO;
        self.run_resync(None, None).map(|_| ())
    }

    /// A degraded redundant array cannot be resynced: its missing member needs a
    /// rebuild instead.
    pub(crate) fn check_resync_possible(&self) -> Result<()> {
        let down = self.down_roles();
        if !down.is_empty() && self.layout_is_redundant() {
            let names: Vec<String> = down.iter().map(|&r| self.describe_role(r)).collect();
            return Err(Error::new(
                ErrorKind::Degraded,
                format!(
                    "{}: cannot resync while {} missing",
                    self.array_label(),
                    names.join(", ")
                ),
            ));
        }
        Ok(())
    }

    /// Copies the first copy of array bytes `[pos, pos + n)` over the others (RAID1/10).
    pub(crate) fn resync_mirrors(&self, pos: u64, n: u64) -> Result<()> {
        let _guards = self.locks.lock_many(self.mirror_keys(pos, n));
        for (at, len, locs) in self.pieces(pos, n) {
            let mut data = vec![0u8; small(len)];
            let src = locs[0];
            self.read_member(src.member, &mut data, src.sector.0 * SECTOR_SIZE)?;
            for loc in &locs[1..] {
                if let Err(e) = self.write_member(
                    loc.member,
                    &data,
                    loc.sector.0 * SECTOR_SIZE,
                    WriteFlags::NONE,
                ) {
                    self.fail_member(loc.member, &e);
                    return Err(e.context(format!("resync at array byte {at}")));
                }
            }
        }
        Ok(())
    }

    /// The end of a resync: flush, then record the array in sync.
    pub(crate) fn finish_resync(&self) -> Result<()> {
        self.flush()?;
        let mut meta = self.meta_lock();
        if meta.resync_pending {
            meta.resync_pending = false;
            meta.resync_from = Sectors::ZERO;
            if meta.sbs.iter().any(Option::is_some) {
                meta.events += 1;
                self.write_superblocks(&mut meta)?;
            }
        }
        drop(meta);
        tracing::info!("{}: resync complete", self.array_label());
        Ok(())
    }

    pub(crate) fn size_bytes(&self) -> u64 {
        self.geometry.size
    }

    pub(crate) fn foreground_ops(&self) -> u64 {
        self.fg_ops.load(Ordering::Relaxed)
    }

    // ---- the simple levels ---------------------------------------------------------

    /// Splits `[off, off + len)` (bytes) into pieces that each map contiguously onto
    /// every copy: `(array offset, length, copies)`.
    fn pieces(&self, off: u64, len: u64) -> Vec<(u64, u64, Vec<Location>)> {
        let mut out = Vec::new();
        let end = off + len;
        let mut pos = off;
        while pos < end {
            let s = Sectors(pos / SECTOR_SIZE);
            let (stop, locs) = match &self.layout {
                ArrayLayout::Linear(l) => {
                    let loc = l.map(s).expect("inside the array");
                    (l.ends()[loc.member].0 * SECTOR_SIZE, vec![loc])
                }
                ArrayLayout::Raid0(l) => {
                    let c = l.chunk().0;
                    (
                        (s.0 / c + 1) * c * SECTOR_SIZE,
                        vec![l.map(s).expect("inside the array")],
                    )
                }
                ArrayLayout::Raid1(l) => (end, l.map(s).collect()),
                ArrayLayout::Raid10(l) => {
                    let c = l.chunk().0;
                    ((s.0 / c + 1) * c * SECTOR_SIZE, l.map(s).collect())
                }
                ArrayLayout::Parity(_) => unreachable!("parity levels use the stripe path"),
            };
            let n = stop.min(end) - pos;
            out.push((pos, n, locs));
            pos += n;
        }
        out
    }

    fn simple_read(&self, buf: &mut [u8], off: u64) -> Result<()> {
        let rotate = matches!(self.layout, ArrayLayout::Raid1(_));
        for (pos, n, mut locs) in self.pieces(off, wide(buf.len())) {
            let piece = &mut buf[small(pos - off)..small(pos - off + n)];
            if rotate && locs.len() > 1 {
                let k = self.next_read.fetch_add(1, Ordering::Relaxed) % locs.len();
                locs.rotate_left(k);
            }
            let mut bad: Vec<(usize, Error)> = Vec::new();
            let mut good = None;
            for loc in &locs {
                if !self.is_up(loc.member) {
                    continue;
                }
                match self.read_member(loc.member, piece, loc.sector.0 * SECTOR_SIZE) {
                    Ok(()) => {
                        good = Some(*loc);
                        break;
                    }
                    Err(e) => bad.push((loc.member, e)),
                }
            }
            match good {
                Some(src) if !bad.is_empty() => self.repair_copies(pos, n, src, &locs, bad),
                Some(_) => {}
                None => return Err(self.no_copy_error(pos, n, &locs, bad)),
            }
        }
        Ok(())
    }

    /// After a read error on some copies of `[pos, pos + n)`: rewrite them from the good
    /// copy `src` (md's read-error correction). A copy that cannot be rewritten fails.
    fn repair_copies(
        &self,
        pos: u64,
        n: u64,
        src: Location,
        locs: &[Location],
        bad: Vec<(usize, Error)>,
    ) {
        let _guards = self.locks.lock_many(self.mirror_keys(pos, n));
        let mut data = vec![0u8; small(n)];
        if let Err(e) = self.read_member(src.member, &mut data, src.sector.0 * SECTOR_SIZE) {
            tracing::warn!("{}: re-reading for repair: {e}", self.array_label());
            return;
        }
        for (member, err) in bad {
            tracing::warn!(
                "{}: read error corrected from {}: {err}",
                self.array_label(),
                self.describe_role(src.member)
            );
            let Some(loc) = locs.iter().find(|l| l.member == member) else {
                continue;
            };
            if let Err(e) =
                self.write_member(member, &data, loc.sector.0 * SECTOR_SIZE, WriteFlags::NONE)
            {
                self.fail_member(member, &e);
            }
        }
    }

    fn no_copy_error(
        &self,
        pos: u64,
        n: u64,
        locs: &[Location],
        bad: Vec<(usize, Error)>,
    ) -> Error {
        let names: Vec<String> = locs.iter().map(|l| self.describe_role(l.member)).collect();
        match bad.into_iter().last() {
            Some((_, e)) if locs.len() == 1 => e,
            Some((_, e)) => e.context(format!(
                "{}: no copy of array bytes {pos}..{} could be read (copies on {})",
                self.array_label(),
                pos + n,
                names.join(", ")
            )),
            None => Error::new(
                ErrorKind::Degraded,
                format!(
                    "{}: array bytes {pos}..{} live only on {}, which {} not available",
                    self.array_label(),
                    pos + n,
                    names.join(", "),
                    if names.len() == 1 { "is" } else { "are" }
                ),
            ),
        }
    }

    /// Lock keys that serialise writes to mirrored `[off, off + len)`.
    fn mirror_keys(&self, off: u64, len: u64) -> impl Iterator<Item = u64> {
        let unit = match &self.layout {
            ArrayLayout::Raid10(l) => l.chunk().0 * SECTOR_SIZE,
            _ => MIRROR_REGION,
        };
        (off / unit)..=((off + len.max(1) - 1) / unit)
    }

    fn simple_write(&self, buf: &[u8], off: u64, flags: WriteFlags) -> Result<()> {
        let mirrored = self.layout_is_redundant();
        let _guards = if mirrored {
            self.locks.lock_many(self.mirror_keys(off, wide(buf.len())))
        } else {
            Vec::new()
        };
        for (pos, n, locs) in self.pieces(off, wide(buf.len())) {
            let piece = &buf[small(pos - off)..small(pos - off + n)];
            let mut written = 0;
            let mut bad: Vec<(usize, Error)> = Vec::new();
            for loc in &locs {
                if !self.is_up(loc.member) {
                    continue;
                }
                match self.write_member(loc.member, piece, loc.sector.0 * SECTOR_SIZE, flags) {
                    Ok(()) => written += 1,
                    Err(e) => bad.push((loc.member, e)),
                }
            }
            if !mirrored {
                if let Some((_, e)) = bad.pop() {
                    return Err(e);
                }
            }
            if written == 0 {
                return Err(self.no_copy_error(pos, n, &locs, bad));
            }
            for (member, e) in bad {
                self.fail_member(member, &e);
            }
        }
        Ok(())
    }

    fn simple_discard(&self, off: u64, len: u64) -> Result<()> {
        let _guards = if self.layout_is_redundant() {
            self.locks.lock_many(self.mirror_keys(off, len))
        } else {
            Vec::new()
        };
        for (pos, n, locs) in self.pieces(off, len) {
            for loc in &locs {
                if !self.is_up(loc.member) {
                    continue;
                }
                let m = self.up_member(loc.member)?;
                m.dev
                    .discard(m.base + loc.sector.0 * SECTOR_SIZE, n)
                    .map_err(|e| {
                        e.context(format!(
                            "{}: discard of array bytes {pos}..{}",
                            self.describe_role(loc.member),
                            pos + n
                        ))
                    })?;
            }
        }
        Ok(())
    }

    /// Locks one stripe of a parity array (stripe.rs).
    pub(crate) fn lock_stripe(&self, stripe: u64) -> MutexGuard<'_, ()> {
        self.locks.lock(stripe)
    }

    /// Locks several stripes (in an order that cannot deadlock).
    pub(crate) fn lock_stripes(
        &self,
        stripes: impl Iterator<Item = u64>,
    ) -> Vec<MutexGuard<'_, ()>> {
        self.locks.lock_many(stripes)
    }
}

fn stripe_width(chunk: u32, data_members: usize) -> u32 {
    u32::try_from(u64::from(chunk) * wide(data_members)).unwrap_or(u32::MAX / chunk.max(1) * chunk)
}

pub(crate) fn now() -> MdTime {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    MdTime::from_secs(secs)
}

impl BlockDevice for Array {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        self.caps
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        debug_assert!(offset + wide(buf.len()) <= self.geometry.size);
        debug_assert_eq!(offset % u64::from(self.geometry.logical_block_size), 0);
        if buf.is_empty() {
            return Ok(());
        }
        self.fg_ops.fetch_add(1, Ordering::Relaxed);
        match &self.layout {
            ArrayLayout::Parity(pl) => self.parity_read(pl, buf, offset),
            _ => self.simple_read(buf, offset),
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        debug_assert!(offset + wide(buf.len()) <= self.geometry.size);
        debug_assert_eq!(offset % u64::from(self.geometry.logical_block_size), 0);
        if buf.is_empty() {
            return Ok(());
        }
        if self.caps.read_only {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!("{}: a member is read-only", self.array_label()),
            ));
        }
        self.start_write()?;
        self.fg_ops.fetch_add(1, Ordering::Relaxed);
        match &self.layout {
            ArrayLayout::Parity(pl) => self.parity_write(pl, buf, offset, flags),
            _ => self.simple_write(buf, offset, flags),
        }
    }

    fn flush(&self) -> Result<()> {
        let generation = self.ppl.as_ref().map(crate::ppl::Ppl::begin_flush);
        let mut last = None;
        for role in 0..self.slots.len() {
            if !self.is_up(role) {
                continue;
            }
            let m = self.slots[role].member.as_ref().expect("up");
            if let Err(e) = m.dev.flush() {
                let e = e.context(format!("{}: flush", self.describe_role(role)));
                if self.layout_is_redundant() {
                    self.fail_member(role, &e);
                }
                last = Some(e);
            }
        }
        if let (Some(log), Some(g), None) = (&self.ppl, generation, &last) {
            log.end_flush(g);
        }
        match last {
            Some(e) if !self.layout.tolerates(&self.down_mask()) || !self.layout_is_redundant() => {
                Err(e)
            }
            _ => Ok(()),
        }
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if self.caps.discard == Support::None {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("discard on {}", self.array_label()),
            ));
        }
        if len == 0 {
            return Ok(());
        }
        self.start_write()?;
        self.simple_discard(offset, len)
    }
}

impl Drop for Array {
    fn drop(&mut self) {
        let dirty = self.meta_lock().dirty;
        if dirty || !self.closed.load(Ordering::Acquire) {
            if let Err(e) = self.close() {
                tracing::warn!("{}: closing: {e}", self.array_label());
            }
        }
    }
}

/// Borrowed or owned bytes for a member write.
pub(crate) type Bytes<'a> = Cow<'a, [u8]>;
