//! The parity rebuild's pipeline: while one window of stripes is rebuilt and written,
//! the member reads of the next window run on an I/O worker.
//!
//! ```text
//!   run_recovery ── step(first, read_ahead) ──────────────────────────────────────────
//!      window N   : locks held (taken when N was read ahead, or now)
//!      window N+1 : locks tried (never waited for: see below); if all were free
//!                     overlap( [ rebuild + write N   (this thread)              ,
//!                                read the sources of N+1   (an I/O worker) ] )
//!                   else: rebuild + write N alone; N+1 is locked and read next step
//!      N's locks dropped, the member counts as rebuilt past N, N+1 becomes "ahead"
//! ```
//!
//! Rules kept from the one-window rebuild:
//! - Every stripe is read, rebuilt and written under its lock (a client write to it
//!   waits), and the member counts as rebuilt past a window only after every stripe of
//!   it is written; the checkpoint (`recovery_cp`) follows that, and reaches the
//!   superblocks only after a flush (`checkpoint_recovery`).
//! - Lock order: the table's locks are taken in table order by everyone else. The locks
//!   of the window read ahead are taken while those of the current one are held, which is
//!   out of order (stripes hash far apart, and may share an entry), so they are only
//!   *tried*: when one is busy (a client holds it) or is one already held, the read-ahead
//!   is skipped for that step. Nothing ever waits while holding a lock out of order.
//! - The read-ahead runs only while the work is unpaced (the caller says so): a pause for
//!   md's speed limits never holds a stripe lock, so clients at the minimum speed see
//!   the same rebuild as before (one window, then the pause with no lock held).
//!
//! The rebuild reads only what the missing member needs: with one member missing, its
//! chunk is the XOR of the other data chunks and P (P itself: the XOR of the data), and
//! a Q chunk is computed from the data; Q is not read for a data or P chunk. A stripe with
//! another member down, or whose read fails, goes through the general path
//! (`read_row`: every member that is up, RAID6's two-failure maths). Buffers are kept
//! from window to window.

use std::sync::atomic::Ordering;
use std::sync::MutexGuard;

use cairn_block::overlap::{fan_out, overlap, Overlap};
use cairn_block::{Result, WriteFlags};

use crate::state::Array;
use crate::layout::ParityLayout;
use crate::units::{small, StripeNo, SECTOR_SIZE};

/// Member bytes a parity rebuild works on at once over members with latency (that many
/// stripes under their locks, their reads at once).
pub(crate) const REBUILD_WINDOW: u64 = 4 << 20;

/// The buffers of one stripe of a window.
#[derive(Default)]
struct Stripe {
    /// The members read, and their chunks.
    sources: Vec<usize>,
    bufs: Vec<Vec<u8>>,
    /// The rebuilt chunk, and room for the P computed beside a Q.
    out: Vec<u8>,
    scratch: Vec<u8>,
    /// Whether the sources were read (false: the general path rebuilds this stripe).
    read: bool,
}

/// A window of stripes and their buffers (the locks are held beside it: a lock guard
/// stays on the thread that took it, the buffers go to a worker).
struct Window {
    first: u64,
    count: u64,
    stripes: Vec<Stripe>,
}

/// What the two halves of a step share.
#[derive(Clone, Copy)]
struct Ctx<'a> {
    array: &'a Array,
    pl: &'a ParityLayout,
    role: usize,
    /// Chunk bytes.
    chunk: u64,
    how: Overlap,
}

/// A parity rebuild of one member, window by window.
pub(crate) struct Rebuild<'a> {
    ctx: Ctx<'a>,
    /// Stripes per window.
    window: u64,
    /// The end of the walk (stripes).
    end: u64,
    /// The window read ahead and its locks.
    ahead: Option<(Window, Vec<MutexGuard<'a, ()>>)>,
    /// Buffers of finished windows, for the next ones.
    spare: Vec<Stripe>,
}

impl<'a> Rebuild<'a> {
    /// A rebuild of `role` over stripes up to `end`: with members in memory one stripe per
    /// window (the pipeline gives the second core its work), with members that have
    /// latency up to [`REBUILD_WINDOW`] bytes of stripes, their reads and writes at once.
    pub(crate) fn new(array: &'a Array, pl: &'a ParityLayout, role: usize, end: u64) -> Self {
        let chunk = pl.chunk().0 * SECTOR_SIZE;
        let (window, how) = if array.members_slow() {
            ((REBUILD_WINDOW / chunk).clamp(1, 16), Overlap::Each)
        } else {
            (1, Overlap::No)
        };
        Rebuild {
            ctx: Ctx {
                array,
                pl,
                role,
                chunk,
                how,
            },
            window,
            end,
            ahead: None,
            spare: Vec::new(),
        }
    }

    /// Rebuilds the window of stripes from `first` on (up to the window's size and the
    /// end), and when `read_ahead` also reads the next window's sources meanwhile.
    /// Returns the stripes rebuilt.
    pub(crate) fn step(&mut self, first: u64, read_ahead: bool) -> Result<u64> {
        let count = self.window.min(self.end.saturating_sub(first));
        if count == 0 {
            return Ok(0);
        }
        let (mut cur, cur_guards) = match self.ahead.take() {
            Some((w, g)) if w.first == first && w.count == count => (w, g),
            other => {
                drop(other);
                let guards = self.ctx.array.lock_stripes(first..first + count);
                let mut w = self.window_of(first, count);
                read(self.ctx, &mut w);
                (w, guards)
            }
        };
        let next_first = first + count;
        let next_count = self.window.min(self.end.saturating_sub(next_first));
        let mut next = None;
        if read_ahead && next_count > 0 {
            if let Some(g) = self
                .ctx
                .array
                .try_lock_stripes(next_first..next_first + next_count)
            {
                next = Some((self.window_of(next_first, next_count), g));
            }
        }
        let ctx = self.ctx;
        let written = match &mut next {
            None => write(ctx, &mut cur),
            Some((nw, _)) => {
                // The write on this thread, the read-ahead on a worker (or here after
                // the write when no worker is free).
                let jobs: Vec<(bool, &mut Window)> = vec![(true, &mut cur), (false, nw)];
                let mut out = overlap(jobs, |(is_write, w)| {
                    if is_write {
                        write(ctx, w)
                    } else {
                        read(ctx, w);
                        Ok(())
                    }
                });
                out.swap_remove(0)
            }
        };
        if written.is_ok() {
            // Before the locks go: a client write to these stripes from now on must
            // reach the member.
            self.ctx.array.slots[self.ctx.role]
                .synced
                .store((first + count) * self.ctx.chunk, Ordering::Release);
        }
        drop(cur_guards);
        self.spare.append(&mut cur.stripes);
        match written {
            Ok(()) => {
                self.ahead = next;
                Ok(count)
            }
            Err(e) => Err(e),
        }
    }

    /// Gives up the window read ahead (its locks too): before a pause.
    pub(crate) fn drop_ahead(&mut self) {
        if let Some((mut w, g)) = self.ahead.take() {
            drop(g);
            self.spare.append(&mut w.stripes);
        }
    }

    fn window_of(&mut self, first: u64, count: u64) -> Window {
        let keep = self.spare.len().saturating_sub(small(count));
        let mut stripes = self.spare.split_off(keep);
        stripes.resize_with(small(count), Stripe::default);
        Window {
            first,
            count,
            stripes,
        }
    }
}

/// Reads the sources of every stripe of `w` (at once over members with latency).
fn read(ctx: Ctx<'_>, w: &mut Window) {
    let c = small(ctx.chunk);
    for (i, st) in w.stripes.iter_mut().enumerate() {
        let stripe = w.first + crate::units::wide(i);
        let map = ctx.pl.stripe_map(StripeNo(stripe));
        let mut down = ctx.array.down_mask_at(stripe * ctx.chunk);
        down[ctx.role] = false;
        st.sources.clear();
        st.read = !down.iter().any(|&d| d);
        if !st.read {
            continue;
        }
        if map.q == Some(ctx.role) {
            st.sources.extend_from_slice(&map.data);
        } else {
            st.sources
                .extend(map.data.iter().copied().chain([map.p]).filter(|&m| m != ctx.role));
        }
        st.bufs.resize_with(st.sources.len(), Vec::new);
        for b in &mut st.bufs {
            b.resize(c, 0);
        }
    }
    let mut jobs = Vec::new();
    for (i, st) in w.stripes.iter_mut().enumerate() {
        if !st.read {
            continue;
        }
        let stripe = w.first + crate::units::wide(i);
        for (&m, b) in st.sources.iter().zip(st.bufs.iter_mut()) {
            jobs.push((m, (i, m, stripe, b)));
        }
    }
    let failed = fan_out(jobs, ctx.how, |(i, m, stripe, buf)| {
        ctx.array
            .read_member(m, buf, stripe * ctx.chunk)
            .err()
            .map(|_| i)
    });
    // A stripe whose read failed goes through the general path, which reads it again
    // and deals with the failure.
    for i in failed.into_iter().flatten() {
        w.stripes[i].read = false;
    }
}

/// Rebuilds the missing chunk of every stripe of `w` and writes it to the member.
fn write(ctx: Ctx<'_>, w: &mut Window) -> Result<()> {
    let jobs = w
        .stripes
        .iter_mut()
        .enumerate()
        .map(|(i, st)| (i % 1024, (w.first + crate::units::wide(i), st)))
        .collect();
    let results = fan_out(jobs, ctx.how, |(stripe, st)| rebuild_stripe(ctx, stripe, st));
    results.into_iter().collect()
}

fn rebuild_stripe(ctx: Ctx<'_>, stripe: u64, st: &mut Stripe) -> Result<()> {
    let a = ctx.array;
    let at = stripe * ctx.chunk;
    let rows;
    let chunk: &[u8] = if st.read {
        let map = ctx.pl.stripe_map(StripeNo(stripe));
        let srcs: Vec<&[u8]> = st.bufs.iter().map(Vec::as_slice).collect();
        if map.q == Some(ctx.role) {
            let order = map.syndrome_order();
            if order.iter().any(Option::is_none) {
                let (_, q) = a.gen_parity(&map, &srcs);
                st.out = q.unwrap_or_default();
            } else {
                // The data in syndrome order; P is computed on the way and thrown away.
                let by_slot: Vec<&[u8]> = order
                    .iter()
                    .flatten()
                    .filter_map(|m| map.data.iter().position(|x| x == m))
                    .map(|d| srcs[d])
                    .collect();
                st.out.resize(small(ctx.chunk), 0);
                st.scratch.resize(small(ctx.chunk), 0);
                a.parity.gen_pq(&by_slot, &mut st.scratch, &mut st.out);
            }
        } else {
            st.out.resize(small(ctx.chunk), 0);
            a.parity.gen_p(&srcs, &mut st.out);
        }
        &st.out
    } else {
        let map = ctx.pl.stripe_map(StripeNo(stripe));
        let mut down = a.down_mask_at(at);
        down[ctx.role] = true;
        let mut errs = Vec::new();
        rows = a.read_row(ctx.pl, &map, stripe, 0, ctx.chunk, &mut down, &mut errs)?;
        &rows[ctx.role]
    };
    a.write_member(ctx.role, chunk, at, WriteFlags::NONE)
        .inspect_err(|e| a.fail_member(ctx.role, e))
}
