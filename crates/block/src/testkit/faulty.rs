//! `FaultyDisk`: a pass-through device whose ops can be made to fail while a test runs.
//!
//! ```text
//!   test ──FaultHandle──┐ (inject / heal / stats, from any thread)
//!   layer under test ── FaultyDisk ── inner device
//! ```
//!
//! Each op is classified ([`Op`]), counted, and matched against the installed [`Fault`]
//! rules in installation order; the first rule that fires fails the op with
//! [`ErrorKind::Io`] and a context naming the op and offset ("injected fault: write of
//! 4096 bytes at 8192"). A failed op does not reach the inner device, except a torn one:
//! with [`Torn`], a failing write or write_zeroes first applies a prefix of its blocks,
//! which is what a disk that dies mid-request leaves behind.
//!
//! To also record what reached the storage, stack it as
//! `FaultyDisk(LogWritesDisk(MemDisk))`: failed ops never reach the log, and the prefix of
//! a torn write is logged as the smaller write it really was.

use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::{BlockDevice, Error, ErrorKind, Extent, Result, WriteFlags};

/// The kind of an op, as fault rules and counters see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeroes,
    Extents,
}

impl Op {
    const ALL: [Op; 6] = [
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Discard,
        Op::WriteZeroes,
        Op::Extents,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Discard => "discard",
            Op::WriteZeroes => "write_zeroes",
            Op::Extents => "extents",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of [`Op`] kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ops(u8);

impl Ops {
    pub const NONE: Ops = Ops(0);
    pub const READ: Ops = Ops(1 << Op::Read as u8);
    pub const WRITE: Ops = Ops(1 << Op::Write as u8);
    pub const FLUSH: Ops = Ops(1 << Op::Flush as u8);
    pub const DISCARD: Ops = Ops(1 << Op::Discard as u8);
    pub const WRITE_ZEROES: Ops = Ops(1 << Op::WriteZeroes as u8);
    pub const EXTENTS: Ops = Ops(1 << Op::Extents as u8);
    /// Everything that changes contents: write, write_zeroes, discard.
    pub const MODIFY: Ops = Ops(Ops::WRITE.0 | Ops::WRITE_ZEROES.0 | Ops::DISCARD.0);
    /// Every op: a dead disk.
    pub const ALL: Ops = Ops(0x3f);

    pub fn contains(self, op: Op) -> bool {
        self.0 & op.bit() != 0
    }
}

impl From<Op> for Ops {
    fn from(op: Op) -> Ops {
        Ops(op.bit())
    }
}

impl std::ops::BitOr for Ops {
    type Output = Ops;
    fn bitor(self, rhs: Ops) -> Ops {
        Ops(self.0 | rhs.0)
    }
}

impl std::ops::BitOr for Op {
    type Output = Ops;
    fn bitor(self, rhs: Op) -> Ops {
        Ops(self.bit() | rhs.bit())
    }
}

impl std::ops::BitOr<Op> for Ops {
    type Output = Ops;
    fn bitor(self, rhs: Op) -> Ops {
        Ops(self.0 | rhs.bit())
    }
}

/// How much of a failing write lands before the error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Torn {
    /// The first `n` logical blocks (all of them if the write is shorter).
    Blocks(u64),
    /// A random prefix (possibly empty, possibly all) drawn from an RNG with this seed.
    Random(u64),
}

/// What counts towards a rule's `after` threshold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counting {
    /// Only ops the rule matches.
    Matching,
    /// Every op the device sees.
    Total,
}

/// One failure rule. Built with [`Fault::new`] and the modifiers below; installed with
/// [`FaultHandle::inject`]. Counting starts when the rule is installed.
#[derive(Debug, Clone)]
pub struct Fault {
    ops: Ops,
    range: Option<Range<u64>>,
    after: u64,
    counting: Counting,
    times: Option<u64>,
    torn: Option<Torn>,
}

impl Fault {
    /// Fails every op of the given kinds, from now on, until healed.
    pub fn new(ops: impl Into<Ops>) -> Fault {
        Fault {
            ops: ops.into(),
            range: None,
            after: 0,
            counting: Counting::Matching,
            times: None,
            torn: None,
        }
    }

    /// Lets the first `n` matching ops succeed.
    pub fn after(mut self, n: u64) -> Fault {
        self.after = n;
        self.counting = Counting::Matching;
        self
    }

    /// Lets matching ops succeed until the device has seen `n` ops of any kind.
    pub fn after_total(mut self, n: u64) -> Fault {
        self.after = n;
        self.counting = Counting::Total;
        self
    }

    /// Only ops overlapping this byte range match. Flush has no range, so it never matches
    /// a ranged rule.
    pub fn in_range(mut self, range: Range<u64>) -> Fault {
        self.range = Some(range);
        self
    }

    /// The rule removes itself after failing `n` ops (a transient error).
    pub fn times(mut self, n: u64) -> Fault {
        self.times = Some(n);
        self
    }

    /// Failing writes and write_zeroes apply a prefix first.
    pub fn torn(mut self, torn: Torn) -> Fault {
        self.torn = Some(torn);
        self
    }

    fn matches(&self, op: Op, offset: u64, len: u64) -> bool {
        if !self.ops.contains(op) {
            return false;
        }
        match (&self.range, op) {
            (None, _) => true,
            (Some(_), Op::Flush) => false,
            (Some(r), _) => offset < r.end && offset.saturating_add(len) > r.start && len > 0,
        }
    }
}

/// Ops seen by a [`FaultyDisk`] (failed ones included) since creation or the last
/// [`FaultHandle::reset_stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultStats {
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    pub discards: u64,
    pub write_zeroes: u64,
    pub extents: u64,
    /// Ops that returned an injected error.
    pub failed: u64,
    /// Failed ops that applied a prefix first.
    pub torn: u64,
}

impl FaultStats {
    pub fn count(&self, op: Op) -> u64 {
        match op {
            Op::Read => self.reads,
            Op::Write => self.writes,
            Op::Flush => self.flushes,
            Op::Discard => self.discards,
            Op::WriteZeroes => self.write_zeroes,
            Op::Extents => self.extents,
        }
    }

    pub fn total(&self) -> u64 {
        Op::ALL.iter().map(|&op| self.count(op)).sum()
    }

    fn bump(&mut self, op: Op) {
        let c = match op {
            Op::Read => &mut self.reads,
            Op::Write => &mut self.writes,
            Op::Flush => &mut self.flushes,
            Op::Discard => &mut self.discards,
            Op::WriteZeroes => &mut self.write_zeroes,
            Op::Extents => &mut self.extents,
        };
        *c += 1;
    }
}

#[derive(Debug)]
struct Rule {
    fault: Fault,
    /// Ops counted towards `fault.after` so far.
    seen: u64,
    /// Failures still to inject; `None` is forever.
    left: Option<u64>,
    rng: Option<SmallRng>,
}

#[derive(Debug, Default)]
struct State {
    rules: Vec<Rule>,
    stats: FaultStats,
}

/// What to do with one op.
enum Verdict {
    Pass,
    /// Fail; with `Some(blocks)` apply that many leading logical blocks first.
    Fail {
        torn_blocks: Option<u64>,
    },
}

/// Controls a [`FaultyDisk`] from the test, from any thread. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct FaultHandle {
    state: Arc<Mutex<State>>,
}

impl FaultHandle {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic elsewhere (a failing assertion) must not turn every later op into a
        // second panic; the state is plain counters and rules, valid at any point.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Installs a rule after the existing ones.
    pub fn inject(&self, fault: Fault) {
        let rng = match fault.torn {
            Some(Torn::Random(seed)) => Some(SmallRng::seed_from_u64(seed)),
            _ => None,
        };
        let left = fault.times;
        if left == Some(0) {
            return;
        }
        self.lock().rules.push(Rule {
            fault,
            seen: 0,
            left,
            rng,
        });
    }

    /// Lets the next `n` ops of these kinds succeed, then fails every one after.
    pub fn fail_after(&self, ops: impl Into<Ops>, n: u64) {
        self.inject(Fault::new(ops).after(n));
    }

    /// Lets the next `n` ops of any kind succeed, then fails every op of these kinds.
    pub fn fail_after_total(&self, ops: impl Into<Ops>, n: u64) {
        self.inject(Fault::new(ops).after_total(n));
    }

    /// Fails every op of these kinds that overlaps `range`.
    pub fn fail_range(&self, ops: impl Into<Ops>, range: Range<u64>) {
        self.inject(Fault::new(ops).in_range(range));
    }

    /// Fails every op: the disk is dead.
    pub fn fail_always(&self) {
        self.inject(Fault::new(Ops::ALL));
    }

    /// Removes every rule; the counters are kept.
    pub fn heal(&self) {
        self.lock().rules.clear();
    }

    /// Whether any rule is installed.
    pub fn is_faulty(&self) -> bool {
        !self.lock().rules.is_empty()
    }

    pub fn stats(&self) -> FaultStats {
        self.lock().stats
    }

    pub fn reset_stats(&self) {
        self.lock().stats = FaultStats::default();
    }

    fn verdict(&self, op: Op, offset: u64, len: u64, blocks: u64) -> Verdict {
        let mut st = self.lock();
        st.stats.bump(op);
        let mut fired: Option<usize> = None;
        for (i, rule) in st.rules.iter_mut().enumerate() {
            let matches = rule.fault.matches(op, offset, len);
            let counted = match rule.fault.counting {
                Counting::Matching => matches,
                Counting::Total => true,
            };
            // The op fails if `after` ops were counted before it; count it either way,
            // so every rule sees the same op stream whichever one fires.
            let due = rule.seen >= rule.fault.after;
            if counted {
                rule.seen += 1;
            }
            if matches && due && fired.is_none() {
                fired = Some(i);
            }
        }
        let Some(i) = fired else {
            return Verdict::Pass;
        };
        st.stats.failed += 1;
        let rule = &mut st.rules[i];
        let torn_blocks = match (rule.fault.torn, op) {
            (Some(Torn::Blocks(n)), Op::Write | Op::WriteZeroes) => Some(n.min(blocks)),
            (Some(Torn::Random(_)), Op::Write | Op::WriteZeroes) => {
                rule.rng.as_mut().map(|rng| rng.gen_range(0..=blocks))
            }
            _ => None,
        };
        if let Some(left) = rule.left.as_mut() {
            *left = left.saturating_sub(1);
            if *left == 0 {
                st.rules.remove(i);
            }
        }
        if torn_blocks.is_some() {
            st.stats.torn += 1;
        }
        Verdict::Fail { torn_blocks }
    }
}

/// A pass-through device that fails ops on command; see the module docs.
#[derive(Debug)]
pub struct FaultyDisk<D> {
    inner: D,
    handle: FaultHandle,
}

impl<D: BlockDevice> FaultyDisk<D> {
    /// A healthy wrapper around `inner`.
    pub fn new(inner: D) -> FaultyDisk<D> {
        FaultyDisk {
            inner,
            handle: FaultHandle::default(),
        }
    }

    /// The control for this device; clones share it.
    pub fn handle(&self) -> FaultHandle {
        self.handle.clone()
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }

    pub fn into_inner(self) -> D {
        self.inner
    }

    fn lbs(&self) -> u64 {
        u64::from(self.inner.geometry().logical_block_size.max(1))
    }

    fn injected(op: Op, offset: u64, len: u64) -> Error {
        let ctx = match op {
            Op::Flush => "injected fault: flush".to_string(),
            _ => format!("injected fault: {} of {len} bytes at {offset}", op.name()),
        };
        Error::new(ErrorKind::Io, ctx)
    }

    fn torn_error(op: Op, offset: u64, len: u64, landed: u64) -> Error {
        Error::new(
            ErrorKind::Io,
            format!(
                "injected fault: {} of {len} bytes at {offset} (torn: first {landed} bytes landed)",
                op.name()
            ),
        )
    }

    /// Fails unless no rule fires; for ops that cannot tear.
    fn gate(&self, op: Op, offset: u64, len: u64) -> Result<()> {
        match self.handle.verdict(op, offset, len, 0) {
            Verdict::Pass => Ok(()),
            Verdict::Fail { .. } => Err(Self::injected(op, offset, len)),
        }
    }
}

/// Its faults are in the synchronous forms; the `*_then` forms run through them.
impl<D: BlockDevice> crate::Filter for FaultyDisk<D> {
    type Inner = D;
    const SYNCHRONOUS: bool = true;

    fn inner(&self) -> impl std::ops::Deref<Target = D> + '_ {
        &self.inner
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.gate(Op::Read, offset, buf.len() as u64)?;
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        let len = buf.len() as u64;
        let lbs = self.lbs();
        match self.handle.verdict(Op::Write, offset, len, len / lbs) {
            Verdict::Pass => self.inner.write_at(buf, offset, flags),
            Verdict::Fail { torn_blocks: None } => Err(Self::injected(Op::Write, offset, len)),
            Verdict::Fail {
                torn_blocks: Some(n),
            } => {
                // n <= len / lbs, so the prefix is inside buf.
                let landed = n * lbs;
                let prefix = usize::try_from(landed).expect("prefix of a slice fits usize");
                if prefix > 0 {
                    self.inner.write_at(&buf[..prefix], offset, flags)?;
                }
                Err(Self::torn_error(Op::Write, offset, len, landed))
            }
        }
    }

    fn flush(&self) -> Result<()> {
        self.gate(Op::Flush, 0, 0)?;
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.gate(Op::Discard, offset, len)?;
        self.inner.discard(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        let lbs = self.lbs();
        match self.handle.verdict(Op::WriteZeroes, offset, len, len / lbs) {
            Verdict::Pass => self.inner.write_zeroes(offset, len, flags),
            Verdict::Fail { torn_blocks: None } => {
                Err(Self::injected(Op::WriteZeroes, offset, len))
            }
            Verdict::Fail {
                torn_blocks: Some(n),
            } => {
                let landed = n * lbs;
                if landed > 0 {
                    self.inner.write_zeroes(offset, landed, flags)?;
                }
                Err(Self::torn_error(Op::WriteZeroes, offset, len, landed))
            }
        }
    }

    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.gate(Op::Extents, offset, len)?;
        self.inner.extents(offset, len)
    }
}

crate::filter_device!([D: BlockDevice] FaultyDisk<D>);
