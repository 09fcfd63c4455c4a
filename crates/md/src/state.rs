//! The array's state and who owns it: the [`Array`] struct, its members by role
//! ([`crate::slot`]), the superblock state (`Meta`, under the metadata lock), the stripe
//! and region lock table, member I/O with failure handling, and superblock writes.
//!
//! The modules that give the array its behaviour build on this one and never the other
//! way round (crates/structure/tests/structure.rs holds the crate to that):
//!
//! ```text
//!   array (data path: read/write/flush/discard, simple levels)   stripe (RAID4/5/6)
//!   bitmap · ppl (their runtime)   background · members · rebuild · scrub   assemble
//!        └───────────────┬──────────────────────┘
//!                  state (this module)
//!        ┌───────────────┼──────────────┬──────────────────────┐
//!   slot (Member, Slot)  bitmap::live   ppl::live    background::job, scrub::report
//!                        (Bitmap)       (Ppl)        (Job, SpeedLimits, ScrubReport)
//! ```
//!
//! The lock order is written in docs/architecture.md ("Lock order").

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError, Weak};
use std::thread::{JoinHandle, ThreadId};

use cairn_block::overlap::{
    fan_out, start_all, start_all_while, Latency, Overlap, OVERLAP_ABOVE_NS,
};
use cairn_block::{
    BlockDevice, Capabilities, Error, ErrorKind, Geometry, Result, Support, WriteFlags,
};

use crate::background::job::{Job, SpeedLimits};
use crate::bitmap::live::Bitmap;
use crate::layout::{ArrayLayout, Location};
use crate::level::Level;
use crate::ondisk::{DevRole, Features, MdTime, SetName, Superblock, Uuid};
use crate::parity::Parity;
use crate::ppl::live::Ppl;
use crate::scrub::report::ScrubReport;
use crate::slot::{Member, Slot};
use crate::units::{small, wide, Sectors, SECTOR_SIZE};

/// The largest request the array advertises (it serves larger ones too).
const MAX_IO: u32 = 32 << 20;
/// RAID1 serialises writes per region of this many bytes (so copies cannot diverge
/// under overlapping concurrent writes).
pub(crate) const MIRROR_REGION: u64 = 64 << 10;
/// Entries in the striped lock table.
const LOCKS: usize = 1024;
/// Requests at least this large overlap their member operations whatever the members'
/// latency: copying that many bytes is worth a second core.
pub(crate) const FAN_OUT_MIN: usize = 1 << 20;
/// The same for reads: a read only copies (no parity maths to share), and on members in
/// memory one core copying 1 MiB beat handing pieces to workers (examples/latency_bench.rs
/// at 0 delay).
pub(crate) const READ_FAN_OUT_MIN: usize = 4 << 20;

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
    /// Hot spares: members with no role yet, each with its superblock.
    pub(crate) spares: Vec<Extra>,
    /// The replacement being built for each role, with its superblock (written as a
    /// spare's until it takes the role over).
    pub(crate) replacements: Vec<Option<Superblock>>,
    /// Members that failed and were displaced from their role (a spare took over), kept
    /// for reports until `cairn md remove`.
    pub(crate) faulty: Vec<Extra>,
}

impl Meta {
    /// One more change to record (md's `mddev->events++`). Saturates at `u64::MAX`,
    /// which [`Array::write_superblocks`] refuses to write, so the last value written is
    /// `u64::MAX - 1`: the counter never wraps (a wrapped count would make every member
    /// look stale, or a stale one current).
    pub(crate) fn bump_events(&mut self) {
        self.events = self.events.saturating_add(1);
    }
}

/// The sentence for an event counter with no room left.
pub(crate) fn events_exhausted(label: &str, events: u64) -> Error {
    Error::new(
        ErrorKind::Corrupt,
        format!(
            "{label}: the superblocks' event counter is at its maximum ({events}); md cannot \
             record another change without wrapping it, so the array is not written \
             (serve it read-only to copy the data off)"
        ),
    )
}

/// A member outside the roles: a spare or a displaced faulty member.
#[derive(Clone)]
pub(crate) struct Extra {
    pub(crate) member: Arc<Member>,
    /// Its superblock (None for arrays without superblocks).
    pub(crate) sb: Option<Superblock>,
    /// The role it had, for faulty members.
    pub(crate) role: Option<usize>,
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
pub(crate) struct LockTable {
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

    /// Locks the whole table (every stripe and region), in table order.
    fn lock_all(&self) -> Vec<MutexGuard<'_, ()>> {
        self.locks
            .iter()
            .map(|l| l.lock().unwrap_or_else(PoisonError::into_inner))
            .collect()
    }

    /// Locks every key's mutex if each is free now, without waiting (`None` when one is
    /// busy, or two keys share a mutex already taken here): for taking locks out of table
    /// order while others are held.
    fn try_lock_many(&self, keys: impl Iterator<Item = u64>) -> Option<Vec<MutexGuard<'_, ()>>> {
        let mut idx: Vec<usize> = keys.map(Self::index).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter()
            .map(|i| match self.locks[i].try_lock() {
                Ok(g) => Some(g),
                Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
                Err(std::sync::TryLockError::WouldBlock) => None,
            })
            .collect()
    }

    /// Locks every key's mutex, in table order so that two callers cannot deadlock.
    pub(crate) fn lock_many(&self, keys: impl Iterator<Item = u64>) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = keys.map(Self::index).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter()
            .map(|i| self.locks[i].lock().unwrap_or_else(PoisonError::into_inner))
            .collect()
    }
}

/// The state the worker thread shares with the array.
#[derive(Default)]
pub(crate) struct Manager {
    /// Set by [`Array::manage`]: the array itself (for the worker thread) and the limits.
    pub(crate) me: Option<Weak<Array>>,
    pub(crate) limits: Option<SpeedLimits>,
    /// The job running or last finished.
    pub(crate) job: Option<Arc<Job>>,
    pub(crate) thread: Option<(ThreadId, JoinHandle<()>)>,
    /// A check or repair asked for and not started yet.
    pub(crate) scrub: Option<bool>,
    /// The report of the running or last scrub.
    pub(crate) last_scrub: Option<ScrubReport>,
}

/// An md array over its members: a [`BlockDevice`] of the array's size.
///
/// Built by [`Array::assemble`], [`Array::create`], or (without superblocks)
/// [`Array::from_layout`].
pub struct Array {
    pub(crate) layout: ArrayLayout,
    pub(crate) slots: Vec<Slot>,
    pub(crate) geometry: Geometry,
    pub(crate) caps: Capabilities,
    pub(crate) parity: Parity,
    pub(crate) locks: LockTable,
    pub(crate) next_read: AtomicUsize,
    pub(crate) meta: Mutex<Meta>,
    /// Fast-path copy of `meta.dirty`.
    pub(crate) dirty: AtomicBool,
    pub(crate) identity: Identity,
    pub(crate) left_out: Vec<LeftOut>,
    pub(crate) forced: bool,
    pub(crate) closed: AtomicBool,
    pub(crate) label: String,
    /// Background work: rebuilds, resync, scrubs (background.rs).
    pub(crate) manager: Mutex<Manager>,
    /// Set by `close`: background work stops and does not start again.
    pub(crate) stopping: AtomicBool,
    /// Why this host no longer owns the array ([`Array::fence`]); once set, nothing more
    /// is written to the members.
    pub(crate) fenced: OnceLock<String>,
    /// Client reads and writes so far: the resync slows to its minimum speed while
    /// this moves.
    pub(crate) fg_ops: AtomicU64,
    /// Client reads and writes inside the array right now ([`InFlight`]): when callers
    /// already keep every member busy, a small request does not fan out.
    pub(crate) in_flight: AtomicUsize,
    /// The internal write-intent bitmap, when the array has one (bitmap.rs).
    pub(crate) bitmap: Option<Bitmap>,
    /// Bytes resynced since assembly ([`Array::resynced_bytes`]).
    pub(crate) resynced: AtomicU64,
    /// The partial-parity log closing the RAID4/5/6 write hole (ppl.rs), when the
    /// members carry one.
    pub(crate) ppl: Option<Ppl>,
    /// How long a member read or write takes, and a member flush: whether a request's
    /// member operations are worth handing to I/O workers.
    pub(crate) member_latency: Latency,
    pub(crate) flush_latency: Latency,
    /// Who hears of state changes, and why members failed (observe.rs).
    pub(crate) observers: crate::observe::types::Observers,
    /// md's safe mode (safemode.rs): client writes between [`Array::start_write`] and
    /// their end, writes ended so far, when the last one ended (ms since `born`).
    pub(crate) writes_pending: AtomicUsize,
    pub(crate) writes_done: AtomicU64,
    pub(crate) last_write_ms: AtomicU64,
    pub(crate) born: std::time::Instant,
    /// This array's safe-mode delay in ms (`u64::MAX`: the process default).
    pub(crate) safe_mode_delay_ms: AtomicU64,
    /// The thread that marks the array clean when idle, woken when writes stop.
    pub(crate) safe_mode_thread: OnceLock<std::thread::Thread>,
}

/// A client write counted from [`Array::start_write`] until dropped (md's
/// `md_write_start`/`md_write_end`): safe mode marks the array clean only when none is.
pub(crate) struct PendingWrite<'a>(&'a Array);

impl Drop for PendingWrite<'_> {
    fn drop(&mut self) {
        let a = self.0;
        let ms = u64::try_from(a.born.elapsed().as_millis()).unwrap_or(u64::MAX);
        a.last_write_ms.store(ms, Ordering::SeqCst);
        a.writes_done.fetch_add(1, Ordering::SeqCst);
        if a.writes_pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            // The last one: the safe-mode timer starts now.
            if let Some(t) = a.safe_mode_thread.get() {
                t.unpark();
            }
        }
    }
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
                Ok(Slot::new(match dev {
                    Some(dev) => Some(Member {
                        dev,
                        name: format!("member {i}"),
                        base: off.bytes().ok_or_else(|| {
                            Error::new(ErrorKind::InvalidArgument, "data offset overflows")
                        })?,
                    }),
                    None => None,
                }))
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
            spares: Vec::new(),
            replacements: (0..n).map(|_| None).collect(),
            faulty: Vec::new(),
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
        let members: Vec<Arc<Member>> = slots.iter().filter_map(Slot::member).collect();
        let present = || members.iter();
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
            manager: Mutex::new(Manager::default()),
            stopping: AtomicBool::new(false),
            fenced: OnceLock::new(),
            fg_ops: AtomicU64::new(0),
            in_flight: AtomicUsize::new(0),
            // From "fast": the first slow operation (it counts 1/16 of its time) is
            // enough to switch to overlapping.
            member_latency: Latency::starting_at(0),
            // Flushes are rare: start from "fast" (memory, tmpfs); a slow one or slow
            // member operations switch flushes to overlap.
            flush_latency: Latency::starting_at(0),
            observers: crate::observe::types::Observers::default(),
            bitmap: None,
            resynced: AtomicU64::new(0),
            ppl: None,
            writes_pending: AtomicUsize::new(0),
            writes_done: AtomicU64::new(0),
            last_write_ms: AtomicU64::new(0),
            born: std::time::Instant::now(),
            safe_mode_delay_ms: AtomicU64::new(u64::MAX),
            safe_mode_thread: OnceLock::new(),
        })
    }

    /// What logs and errors call the array (an array without superblocks has no name of
    /// its own: "raid1 array" unless its owner names it, e.g. "RAID LV vg0/r").
    pub fn set_label(&mut self, label: String) {
        self.label = label;
    }

    /// Names the members of an array built without superblocks ([`Array::from_layout`]
    /// calls them "member N"): role `i` is called `names[i]` in reports, events and
    /// errors (a RAID LV's image sub-LVs, `vg/lv_rimage_i`).
    pub fn name_members(&mut self, names: &[String]) {
        for (slot, name) in self.slots.iter().zip(names) {
            slot.rename(name.clone());
        }
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
    pub fn member_names(&self) -> Vec<Option<String>> {
        self.slots
            .iter()
            .map(|s| s.member().map(|m| m.name.clone()))
            .collect()
    }

    /// The device filling `role`, if any.
    pub fn member(&self, role: usize) -> Option<Arc<dyn BlockDevice>> {
        self.slots.get(role)?.member().map(|m| m.dev.clone())
    }

    /// Whether `role` is present, has not failed and is in sync (not being rebuilt).
    pub fn is_up(&self, role: usize) -> bool {
        self.is_writable(role) && self.slots[role].synced.load(Ordering::Acquire) == u64::MAX
    }

    /// Whether `role` is out of the array: missing, or failed (a role being rebuilt is
    /// in: it takes writes).
    pub fn is_out(&self, role: usize) -> bool {
        !self.is_writable(role)
    }

    /// Whether `role` is present and has not failed: it takes writes, even while it is
    /// being rebuilt.
    pub(crate) fn is_writable(&self, role: usize) -> bool {
        let s = &self.slots[role];
        !s.failed.load(Ordering::Acquire) && s.has_member()
    }

    /// Whether `role` holds current data at byte `member_off` of its data area (parity
    /// levels ask per stripe: a member being rebuilt is up below the rebuild's
    /// position). Call it under the stripe's lock, which the rebuild takes too.
    pub(crate) fn is_up_at(&self, role: usize, member_off: u64) -> bool {
        self.is_writable(role) && member_off < self.slots[role].synced.load(Ordering::Acquire)
    }

    /// Roles that are missing, have failed or are being rebuilt.
    pub fn down_roles(&self) -> Vec<usize> {
        (0..self.slots.len()).filter(|&r| !self.is_up(r)).collect()
    }

    pub(crate) fn down_mask(&self) -> Vec<bool> {
        (0..self.slots.len()).map(|r| !self.is_up(r)).collect()
    }

    /// [`Array::down_mask`] for the stripe at member byte `member_off`.
    pub(crate) fn down_mask_at(&self, member_off: u64) -> Vec<bool> {
        (0..self.slots.len())
            .map(|r| !self.is_up_at(r, member_off))
            .collect()
    }

    /// "role 2 (disk2.img)" or "role 2 (missing)", for messages.
    pub(crate) fn describe_role(&self, role: usize) -> String {
        match self.slots[role].member() {
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

    /// How a request moving `bytes` issues its member operations: all at once when
    /// members are slow enough that a worker's wake-up is small beside them (on members
    /// in memory it is not), by member when the request is large.
    pub(crate) fn overlap_pays(&self, bytes: usize) -> Overlap {
        if self.callers_keep_members_busy(bytes) {
            return Overlap::No;
        }
        self.member_latency.choose(bytes, FAN_OUT_MIN)
    }

    /// Whether a request of `bytes` smaller than a full stripe should run its member
    /// operations one after another even though members have latency, because enough
    /// client requests are in flight to keep every member busy. Handing a job to a worker
    /// costs a thread wake-up; on a CPU-bound machine with many callers those wake-ups
    /// cost more than the overlap saves (QD32 4K random writes at 100 µs: 44k IOPS serial,
    /// 25k fanned out). The bar rises with the callers per member: with `k` requests per
    /// member in flight, overlapping pays only when a member operation takes more than
    /// `k` wake-ups' worth ([`OVERLAP_ABOVE_NS`] each). One caller (QD1) always overlaps.
    fn callers_keep_members_busy(&self, bytes: usize) -> bool {
        let callers = self.in_flight.load(Ordering::Relaxed);
        let members = self.slots.len().max(1);
        if callers < members || bytes >= self.geometry.optimal_io_size as usize {
            return false;
        }
        let per_member = wide(callers / members);
        self.member_latency.nanos() < OVERLAP_ABOVE_NS.saturating_mul(per_member)
    }

    /// Whether member operations take long enough to overlap whatever their size.
    pub(crate) fn members_slow(&self) -> bool {
        self.member_latency.slow()
    }

    /// [`Array::overlap_pays`] for a read of `bytes`.
    pub(crate) fn read_overlap_pays(&self, bytes: usize) -> Overlap {
        if self.callers_keep_members_busy(bytes) {
            return Overlap::No;
        }
        self.member_latency.choose(bytes, READ_FAN_OUT_MIN)
    }

    /// Flushes one member's device, timed for [`Array::flush`]'s choice.
    pub(crate) fn flush_dev(&self, dev: &dyn BlockDevice) -> Result<()> {
        self.flush_latency.time(0, || dev.flush())
    }

    /// How flushes and durable (FUA) metadata writes to every member are issued.
    pub(crate) fn flush_overlap_pays(&self) -> Overlap {
        if self.flush_latency.slow() || self.member_latency.slow() {
            Overlap::Each
        } else {
            Overlap::No
        }
    }

    pub(crate) fn up_member(&self, role: usize) -> Result<Arc<Member>> {
        match self.slots[role].member() {
            Some(m) if !self.slots[role].failed.load(Ordering::Acquire) => Ok(m),
            _ => Err(Error::new(
                ErrorKind::Degraded,
                format!("{} is not available", self.describe_role(role)),
            )),
        }
    }

    /// Reads `buf` from `role` at byte `off` of its data area.
    pub(crate) fn read_member(&self, role: usize, buf: &mut [u8], off: u64) -> Result<()> {
        self.check_fenced()?;
        let m = self.up_member(role)?;
        let len = buf.len();
        let r = self
            .member_latency
            .time(len, || m.dev.read_at(buf, m.base + off));
        r.map_err(|e| self.member_read_failed(role, len, m.base + off, e))
    }

    /// The error of a member read of `len` bytes at `at` (its device's offset), with
    /// what follows from it: a member that is gone (not a bad sector: its connection is
    /// lost) fails at once, as md fails a disk that vanished; a bad sector is repaired
    /// by the caller instead. A refusal to a former owner fences the array.
    fn member_read_failed(&self, role: usize, len: usize, at: u64, e: Error) -> Error {
        let e = e.context(format!(
            "{}: read of {len} bytes at member offset {at}",
            self.describe_role(role)
        ));
        if matches!(e.kind(), ErrorKind::Gone | ErrorKind::Fenced) {
            self.fail_member(role, &e);
        }
        e
    }

    /// The members of `roles` when every one is up and completes its operations later
    /// by itself (remote members, [`BlockDevice::completes_later`]); `None` otherwise.
    pub(crate) fn later_members(
        &self,
        roles: impl Iterator<Item = usize>,
    ) -> Option<Vec<Arc<Member>>> {
        if self.is_fenced() {
            return None;
        }
        roles
            .map(|role| {
                self.up_member(role)
                    .ok()
                    .filter(|m| m.dev.completes_later())
            })
            .collect()
    }

    /// Whether every member that is up completes later (and one is): the background
    /// work then sends a window's reads from one thread (pipeline.rs). Mixed arrays and
    /// a fenced one take the old path.
    pub(crate) fn up_members_complete_later(&self) -> bool {
        let up: Vec<Arc<Member>> = (0..self.slots.len())
            .filter_map(|role| self.up_member(role).ok())
            .collect();
        !self.is_fenced() && !up.is_empty() && up.iter().all(|m| m.dev.completes_later())
    }

    /// [`Array::read_member`] for every `(tag, (role, buf, off))`, issued as `how` says,
    /// returning each job's failure. Over members that complete later, every read is
    /// sent from this thread and waited for once, whatever `how` says: no worker thread
    /// is woken per read.
    pub(crate) fn read_members(
        &self,
        jobs: Vec<(usize, ReadJob<'_>)>,
        how: Overlap,
    ) -> Vec<Option<(usize, Error)>> {
        let (tags, mut reads): (Vec<usize>, Vec<ReadJob<'_>>) = jobs.into_iter().unzip();
        if let Some(failed) = self.read_later(&mut reads) {
            return reads
                .iter()
                .zip(failed)
                .map(|((role, _, _), e)| e.map(|e| (*role, e)))
                .collect();
        }
        fan_out(
            tags.into_iter().zip(reads).collect(),
            how,
            |(role, buf, off)| self.read_member(role, buf, off).err().map(|e| (role, e)),
        )
    }

    /// The reads `(role, buf, off)` of `jobs` when every member they touch is up and
    /// completes later: each sent from this thread, all waited for once, and each one's
    /// error with what follows from it as in [`Array::read_member`]. `None`, nothing
    /// read, when some member is not up or does not complete later.
    pub(crate) fn read_later(&self, jobs: &mut [ReadJob<'_>]) -> Option<Vec<Option<Error>>> {
        self.read_later_while(jobs, None)
    }

    /// [`Array::read_later`] that runs `meanwhile` on this thread while the reads are
    /// out (the writes of the window before, in the background work's pipeline); not
    /// run when it gives `None`. The latency estimate gets the reads' time only when
    /// nothing ran meanwhile.
    pub(crate) fn read_later_while(
        &self,
        jobs: &mut [ReadJob<'_>],
        meanwhile: Option<&mut dyn FnMut()>,
    ) -> Option<Vec<Option<Error>>> {
        let members = self.later_members(jobs.iter().map(|(role, _, _)| *role))?;
        let largest = jobs.iter().map(|(_, b, _)| b.len()).max().unwrap_or(0);
        let t = std::time::Instant::now();
        let alone = meanwhile.is_none();
        let (answers, ()) = start_all_while(
            jobs.iter().zip(&members).collect(),
            |((_, buf, off), m), answer| m.dev.read_then(buf.len(), m.base + off, answer),
            || {
                if let Some(f) = meanwhile {
                    f();
                }
            },
        );
        if alone && largest > 0 {
            self.member_latency.sample(largest, t.elapsed());
        }
        let failed = jobs
            .iter_mut()
            .zip(members)
            .zip(answers)
            .map(|(((role, buf, off), m), answer)| {
                let at = m.base + *off;
                let e = match answer {
                    Some(Ok(data)) if data.len() == buf.len() => {
                        buf.copy_from_slice(&data);
                        return None;
                    }
                    Some(Ok(data)) => Error::new(
                        ErrorKind::Io,
                        format!("the device answered {} bytes", data.len()),
                    ),
                    Some(Err(e)) => e,
                    None => unanswered(),
                };
                Some(self.member_read_failed(*role, buf.len(), at, e))
            })
            .collect();
        Some(failed)
    }

    /// [`Array::write_member`] for every `(tag, (role, buf, off))`, issued as `how`
    /// says, returning each job's failure. Over members that complete later, every write
    /// is sent from this thread and waited for once (see [`Array::read_members`]).
    pub(crate) fn write_members(
        &self,
        jobs: Vec<(usize, (usize, Bytes<'_>, u64))>,
        flags: WriteFlags,
        how: Overlap,
    ) -> Vec<Option<(usize, Error)>> {
        let Some(members) = self.later_members(jobs.iter().map(|(_, (role, _, _))| *role)) else {
            return fan_out(jobs, how, |(role, buf, off)| {
                self.write_member(role, &buf, off, flags)
                    .err()
                    .map(|e| (role, e))
            });
        };
        let largest = jobs.iter().map(|(_, (_, b, _))| b.len()).max().unwrap_or(0);
        let t = std::time::Instant::now();
        let answers = start_all(
            jobs.iter().zip(&members).collect(),
            |((_, (_, buf, off)), m), answer| m.dev.write_then(buf, m.base + off, flags, answer),
        );
        self.member_latency.sample(largest, t.elapsed());
        jobs.into_iter()
            .zip(members)
            .zip(answers)
            .map(|(((_, (role, buf, off)), m), answer)| {
                match answer.unwrap_or_else(|| Err(unanswered())) {
                    Ok(()) => {
                        self.write_replacement(role, &buf, off, flags);
                        None
                    }
                    Err(e) => Some((
                        role,
                        self.member_write_failed(role, buf.len(), m.base + off, e),
                    )),
                }
            })
            .collect()
    }

    /// Writes `buf` to `role` at byte `off` of its data area.
    pub(crate) fn write_member(
        &self,
        role: usize,
        buf: &[u8],
        off: u64,
        flags: WriteFlags,
    ) -> Result<()> {
        self.check_fenced()?;
        let m = self.up_member(role)?;
        let r = self
            .member_latency
            .time(buf.len(), || m.dev.write_at(buf, m.base + off, flags));
        r.map_err(|e| self.member_write_failed(role, buf.len(), m.base + off, e))?;
        self.write_replacement(role, buf, off, flags);
        Ok(())
    }

    fn member_write_failed(&self, role: usize, len: usize, at: u64, e: Error) -> Error {
        e.context(format!(
            "{}: write of {len} bytes at member offset {at}",
            self.describe_role(role)
        ))
    }

    /// Copies a member write to the replacement being built for `role`, where the
    /// replacement already holds that region (parity levels: below its position, which
    /// advances under the stripe locks; mirrors: everywhere). A replacement that fails
    /// is dropped; the member it was to replace goes on serving.
    fn write_replacement(&self, role: usize, buf: &[u8], off: u64, flags: WriteFlags) {
        let slot = &self.slots[role];
        let Some(r) = slot.replacement() else { return };
        let parity = matches!(self.layout, ArrayLayout::Parity(_));
        if parity && off >= slot.replacement_synced.load(Ordering::Acquire) {
            return;
        }
        if let Err(e) = r.dev.write_at(buf, r.base + off, flags) {
            self.drop_replacement(role, &e);
        }
    }

    // ---- metadata --------------------------------------------------------------------

    /// Marks `role` failed after `err`: it takes no more I/O, and the other members'
    /// superblocks record it as faulty before this returns. A member that refused because
    /// this host no longer owns it ([`ErrorKind::Fenced`]) has not failed: the whole array
    /// is fenced instead, and no member is marked.
    pub(crate) fn fail_member(&self, role: usize, err: &Error) {
        if err.kind() == ErrorKind::Fenced {
            self.fence(&err.to_string());
            return;
        }
        if self.is_fenced() {
            // Whatever a member answers now, this host records nothing about it.
            return;
        }
        if self.slots[role].failed.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::warn!(
            "{}: {} failed and is now out of the array: {err}",
            self.array_label(),
            self.describe_role(role)
        );
        let mut meta = self.meta_lock();
        if meta.sbs.iter().any(Option::is_some) && !self.caps.read_only {
            meta.bump_events();
            if let Err(e) = self.write_superblocks(&mut meta) {
                tracing::warn!("{}: recording the failure: {e}", self.array_label());
            }
        }
        drop(meta);
        self.role_failed(role, err);
        // A spare, if there is one, takes the role over.
        self.kick();
    }

    /// Writes the superblock of every member that takes writes (in sync or being
    /// rebuilt), of replacements and of spares, from `meta` (FUA). A role member whose
    /// write fails is failed in turn, and the update is repeated without it; a spare or
    /// replacement that fails is dropped.
    pub(crate) fn write_superblocks(&self, meta: &mut Meta) -> Result<()> {
        self.check_fenced()?;
        if self.caps.read_only {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!(
                    "{}: opened read-only; its superblocks are not updated",
                    self.array_label()
                ),
            ));
        }
        if meta.events == u64::MAX {
            return Err(events_exhausted(self.array_label(), meta.events));
        }
        meta.utime = now();
        if !meta.sbs.iter().any(Option::is_some) && meta.spares.is_empty() {
            // An array without superblocks (from_layout): only a bitmap kept apart
            // records the events.
            self.bitmap_write_events(meta.events);
            return Ok(());
        }
        for _ in 0..=self.slots.len() {
            self.bitmap_write_events(meta.events);
            let roles = self.current_dev_roles(meta);
            let resync_offset = if meta.dirty {
                Sectors::ZERO
            } else if meta.resync_pending {
                meta.resync_from
            } else {
                Sectors::MAX
            };
            let (events, utime) = (meta.events, meta.utime);
            let stamp = |sb: &mut Superblock| {
                sb.events = events;
                sb.utime = utime;
                sb.resync_offset = resync_offset;
                sb.dev_roles.clone_from(&roles);
            };
            let mut failed = Vec::new();
            let mut written = 0;
            for role in 0..self.slots.len() {
                if !self.is_writable(role) {
                    continue;
                }
                let Some(sb) = meta.sbs[role].as_mut() else {
                    continue;
                };
                stamp(sb);
                let slot = &self.slots[role];
                if slot.synced.load(Ordering::Acquire) == u64::MAX {
                    sb.features.0 &= !Features::RECOVERY_OFFSET;
                    sb.recovery_offset = Sectors::ZERO;
                } else {
                    sb.features.0 |= Features::RECOVERY_OFFSET;
                    sb.recovery_offset =
                        Sectors(slot.recovery_cp.load(Ordering::Acquire) / SECTOR_SIZE);
                }
                let m = slot.member().expect("writable");
                match sb.write_to(&*m.dev, &m.name) {
                    Ok(()) => written += 1,
                    Err(e) => failed.push((role, e)),
                }
            }
            // Replacements and spares: written as spares; losing one is not fatal.
            for role in 0..self.slots.len() {
                let Some(r) = self.slots[role].replacement() else {
                    continue;
                };
                if let Some(sb) = meta.replacements[role].as_mut() {
                    stamp(sb);
                    if let Err(e) = sb.write_to(&*r.dev, &r.name) {
                        self.drop_replacement(role, &e);
                    }
                }
            }
            let mut lost = Vec::new();
            for (i, spare) in meta.spares.iter_mut().enumerate() {
                if let Some(sb) = spare.sb.as_mut() {
                    stamp(sb);
                    if let Err(e) = sb.write_to(&*spare.member.dev, &spare.member.name) {
                        tracing::warn!(
                            "{}: spare {} failed writing its superblock and is dropped: {e}",
                            self.array_label(),
                            spare.member.name
                        );
                        lost.push(i);
                    }
                }
            }
            for i in lost.into_iter().rev() {
                let s = meta.spares.remove(i);
                meta.faulty.push(s);
            }
            // A member refused because this host no longer owns the array: nothing has
            // failed, and nothing more is written (the other members' superblocks least
            // of all: they would record a failure that did not happen).
            if let Some((_, e)) = failed.iter().find(|(_, e)| e.kind() == ErrorKind::Fenced) {
                self.fence(&e.to_string());
                return self.check_fenced();
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
                if let Some(m) = self.slots[role].member() {
                    self.record_failure(&m.name, e.to_string());
                }
                tracing::warn!(
                    "{}: {} failed writing its superblock and is now out of the array: {e}",
                    self.array_label(),
                    self.describe_role(role)
                );
            }
            meta.bump_events();
        }
        Err(Error::new(
            ErrorKind::Io,
            format!(
                "{}: superblock update failed on every member",
                self.array_label()
            ),
        ))
    }

    /// md's `super_1_sync` rule: each role member is active in its role (faulty once it
    /// failed), spares are spares, and any other entry claiming a role is faulty.
    fn current_dev_roles(&self, meta: &Meta) -> Vec<DevRole> {
        let mut roles = meta.dev_roles.clone();
        for r in roles.iter_mut() {
            if r.slot().is_some() {
                *r = DevRole::FAULTY;
            }
        }
        let mut set = |dev_number: u32, v: DevRole| {
            if let Some(r) = roles.get_mut(small(u64::from(dev_number))) {
                *r = v;
            }
        };
        for (role, sb) in meta.sbs.iter().enumerate() {
            if let Some(sb) = sb {
                let active = DevRole::active(u16::try_from(role).expect("at most 1920 roles"));
                set(
                    sb.dev_number,
                    if self.is_writable(role) {
                        active
                    } else {
                        DevRole::FAULTY
                    },
                );
            }
        }
        for sb in meta.replacements.iter().flatten() {
            set(sb.dev_number, DevRole::SPARE);
        }
        for s in &meta.spares {
            if let Some(sb) = &s.sb {
                set(sb.dev_number, DevRole::SPARE);
            }
        }
        for f in &meta.faulty {
            if let Some(sb) = &f.sb {
                set(sb.dev_number, DevRole::FAULTY);
            }
        }
        roles
    }

    /// Before a client write: counts it as pending until the returned guard drops, and
    /// marks the superblocks dirty first when they say clean (md's `md_write_start`).
    /// The count goes up before `dirty` is read, and safe mode clears `dirty` before it
    /// reads the count (both SeqCst): a write either is seen pending, or sees the array
    /// clean and waits here for the metadata lock to mark it dirty again.
    pub(crate) fn start_write(&self) -> Result<PendingWrite<'_>> {
        self.writes_pending.fetch_add(1, Ordering::SeqCst);
        let pending = PendingWrite(self);
        if self.dirty.load(Ordering::SeqCst) || !self.layout_is_redundant() {
            return Ok(pending);
        }
        let mut meta = self.meta_lock();
        if meta.dirty || !meta.sbs.iter().any(Option::is_some) {
            self.dirty.store(true, Ordering::SeqCst);
            return Ok(pending);
        }
        meta.dirty = true;
        meta.bump_events();
        if let Err(e) = self.write_superblocks(&mut meta) {
            // Not marked: the next write tries again rather than taking it as done.
            meta.dirty = false;
            return Err(e.context("marking the array dirty before a write"));
        }
        self.dirty.store(true, Ordering::SeqCst);
        Ok(pending)
    }

    pub(crate) fn layout_is_redundant(&self) -> bool {
        !matches!(self.layout, ArrayLayout::Linear(_) | ArrayLayout::Raid0(_))
    }

    /// Whether [`Array::close`] has run. Background helpers outside the array (the
    /// remote-member supervisor) stop at this.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// This host no longer owns the array: its ownership lease ran out, or a newer owner
    /// generation took the members over (docs/fencing.md). From now on nothing is
    /// written to the members, not a superblock, not a bitmap bit, not a resync stripe;
    /// background work stops; client I/O is refused with [`ErrorKind::Fenced`]; no member
    /// is failed (they are fine, for their new owner). For good: only a new assembly,
    /// which takes ownership again, writes to them. Called by whoever learns it first
    /// (the lease's watcher, or a member refusing a request); safe from any thread, the
    /// I/O path included, as it takes no lock and waits for nothing.
    pub fn fence(&self, reason: &str) {
        if self.fenced.set(reason.to_string()).is_err() {
            return;
        }
        self.stopping.store(true, Ordering::Release);
        tracing::error!(
            "{}: fenced, this host may no longer own it ({reason}); nothing more is \
             written to its members: background work stopped, client I/O refused",
            self.array_label()
        );
    }

    /// Why the array is fenced ([`Array::fence`]), if it is.
    pub fn fenced(&self) -> Option<&str> {
        self.fenced.get().map(String::as_str)
    }

    pub(crate) fn is_fenced(&self) -> bool {
        self.fenced.get().is_some()
    }

    /// Refuses once the array is fenced.
    pub(crate) fn check_fenced(&self) -> Result<()> {
        match self.fenced.get() {
            None => Ok(()),
            Some(why) => Err(Error::new(
                ErrorKind::Fenced,
                format!(
                    "{}: fenced ({why}); this host writes nothing more to its members",
                    self.array_label()
                ),
            )),
        }
    }

    /// Flushes every member and marks the superblocks clean (unless a resync is
    /// pending). Called on drop too; calling it again after it succeeded does nothing
    /// unless the array was written to since. The array stays usable.
    pub fn close(&self) -> Result<()> {
        self.stop_background();
        if self.is_fenced() {
            // Not closed cleanly, and not to be: the superblocks are the new owner's.
            self.closed.store(true, Ordering::Release);
            return self.check_fenced();
        }
        if self.caps.read_only {
            // Opened to look (scan, detail): nothing was written and nothing may be. The
            // members may belong to an array served elsewhere, whose superblocks, bitmap
            // and log are its owner's to update.
            self.closed.store(true, Ordering::Release);
            return Ok(());
        }
        self.flush()?;
        self.bitmap_close()?;
        if let Some(log) = &self.ppl {
            log.reset(self)?;
        }
        let mut meta = self.meta_lock();
        if (meta.dirty || meta.resync_pending) && meta.sbs.iter().any(Option::is_some) {
            meta.dirty = false;
            meta.bump_events();
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
        // A resync writes parity or copies: an array on read-only members never does,
        // whoever asks (the library's callers, not only the CLI, see the same rule).
        if self.caps.read_only {
            return Err(Error::new(
                ErrorKind::ReadOnly,
                format!(
                    "{}: opened read-only; it is not resynced",
                    self.array_label()
                ),
            ));
        }
        let down = self.down_roles();
        // md resyncs a degraded array while redundancy remains, so a member lost
        // during a resync does not stop it: the parity or copies left are made to agree.
        let redundancy_left = match &self.layout {
            ArrayLayout::Parity(pl) => down.len() < pl.level().parity_members(),
            ArrayLayout::Raid1(_) => self.slots.len() - down.len() >= 2,
            _ => false,
        };
        if !down.is_empty() && self.layout_is_redundant() && !redundancy_left {
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
        self.resync_mirrors_locked(pos, n)
    }

    /// [`Array::resync_mirrors`] with the mirror locks held by the caller.
    pub(crate) fn resync_mirrors_locked(&self, pos: u64, n: u64) -> Result<()> {
        for (at, len, locs) in self.pieces(pos, n) {
            let mut data = vec![0u8; small(len)];
            // The first copy that is up and reads is the source; a copy that fails
            // leaves the array, and the resync goes on over the others while two remain
            // (md goes on too).
            let mut src = None;
            let mut last = None;
            for loc in locs.iter().filter(|l| self.is_up(l.member)) {
                match self.read_member(loc.member, &mut data, loc.sector.0 * SECTOR_SIZE) {
                    Ok(()) => {
                        src = Some(loc.member);
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            let Some(src) = src else {
                return Err(last
                    .unwrap_or_else(|| Error::new(ErrorKind::Degraded, "no copy is up"))
                    .context(format!("resync at array byte {at}")));
            };
            for loc in locs
                .iter()
                .filter(|l| l.member != src && self.is_up(l.member))
            {
                if let Err(e) = self.write_member(
                    loc.member,
                    &data,
                    loc.sector.0 * SECTOR_SIZE,
                    WriteFlags::NONE,
                ) {
                    self.fail_member(loc.member, &e);
                }
            }
            self.check_resync_possible()
                .map_err(|e| e.context(format!("resync at array byte {at}")))?;
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
                meta.bump_events();
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

    // ---- locks ---------------------------------------------------------------------

    /// Excludes every write to the array (a member hand-over).
    pub(crate) fn lock_all(&self) -> Vec<MutexGuard<'_, ()>> {
        self.locks.lock_all()
    }

    /// [`Array::pieces`] for the mirrored levels.
    pub(crate) fn mirror_pieces(&self, off: u64, len: u64) -> Vec<(u64, u64, Vec<Location>)> {
        self.pieces(off, len)
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

    /// [`Array::lock_stripes`] only if every lock is free now (see `try_lock_many`).
    pub(crate) fn try_lock_stripes(
        &self,
        stripes: impl Iterator<Item = u64>,
    ) -> Option<Vec<MutexGuard<'_, ()>>> {
        self.locks.try_lock_many(stripes)
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

/// Bytes a request reads or writes (a member write's buffer): borrowed from the caller or
/// owned.
pub(crate) type Bytes<'a> = Cow<'a, [u8]>;

/// A member read: (role, buffer, offset in the member's data area).
pub(crate) type ReadJob<'b> = (usize, &'b mut [u8], u64);

/// A member operation whose device dropped its completion without calling it (a bug or
/// a panic below): failed, never taken as done.
pub(crate) fn unanswered() -> Error {
    Error::new(
        ErrorKind::Io,
        "the device dropped the operation without answering",
    )
}
