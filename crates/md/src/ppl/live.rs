//! The running partial-parity log's state: the rings, the live entries, the flush
//! generations. Data only; writing entries, reclaiming and replaying is in ppl.rs.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::AtomicU64;
use std::sync::{Condvar, Mutex};

use crate::ondisk::Uuid;

/// One write's entry on one ring, while it is live.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Live {
    pub(crate) seq: u64,
    pub(crate) pos: u64,
    /// The stripe of a partial entry (counted in `State::live`); `None` for a full one.
    pub(crate) stripe: Option<u64>,
    /// The flush generation read when its writes completed.
    pub(crate) done: Option<u64>,
}

#[derive(Debug, Default)]
pub(crate) struct RingState {
    /// Next free byte (ring-relative).
    pub(crate) head: u64,
    /// Live entries in ring order (= sequence order).
    pub(crate) live: VecDeque<Live>,
    /// What the ring header on the member says.
    pub(crate) floor: u64,
}

#[derive(Debug)]
pub(crate) struct State {
    pub(crate) next_seq: u64,
    /// By role.
    pub(crate) rings: Vec<RingState>,
    /// Partial entries still live, by stripe.
    pub(crate) live: HashMap<u64, u32>,
    /// Rows written to a stripe and not yet known durable: (lo, hi, completion generation).
    pub(crate) unflushed: HashMap<u64, Vec<(u64, u64, u64)>>,
    /// How many rows `unflushed` holds.
    pub(crate) unflushed_rows: usize,
}

/// Past this many unflushed rows a write flushes the members first, which bounds the
/// memory the overlap rule needs when a client never flushes.
pub(crate) const UNFLUSHED_MAX: usize = 1 << 16;

/// The log of an assembled array (`Array::ppl`).
#[derive(Debug)]
pub(crate) struct Ppl {
    pub(crate) header_off: u64,
    pub(crate) ring_off: u64,
    pub(crate) ring_len: u64,
    pub(crate) log_id: u64,
    pub(crate) uuid: Uuid,
    pub(crate) chunk: u64,
    pub(crate) state: Mutex<State>,
    /// Serialises reclaims (each flushes the members).
    pub(crate) reclaim: Mutex<()>,
    /// Signalled when a batch's writes return (a writer waiting for ring room).
    pub(crate) completed: Condvar,
    /// Flush generations: a write completed at generation g is durable once a flush that
    /// started at g or later has finished (`durable >= g`).
    pub(crate) gen: AtomicU64,
    pub(crate) durable: AtomicU64,
}

/// What one stripe of a batch asks of the log.
pub(crate) struct LogItem<'a> {
    pub(crate) stripe: u64,
    pub(crate) x: u64,
    pub(crate) y: u64,
    pub(crate) data: &'a [u8],
}

/// Entries written for a batch, to be marked complete after its data writes.
#[derive(Debug, Default)]
pub(crate) struct Ticket {
    pub(crate) seq: u64,
    pub(crate) roles: Vec<usize>,
    pub(crate) rows: Vec<(u64, u64, u64)>,
}
