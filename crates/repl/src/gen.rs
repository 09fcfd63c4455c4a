//! Generation identifiers (DRBD's "UUIDs") and the sync decision taken at connect.
//!
//! ```text
//!   superblock (meta.rs) ── current, history[2] (node-wide), bitmap uuid (per peer slot)
//!        │                      │
//!        └─> Generations ───────┴─> NodeView (+ primary, crashed_primary, consistent)
//!                                      │   exchanged with the peer at connect
//!                                      v
//!                     decide(me, peer, tie) -> (Decision, Rule)
//!                                      │
//!        resync (lead's) ──> sync_finished_source / sync_finished_target ──> superblock
//! ```
//!
//! A generation is a random 64-bit id naming "the data as it was between two events". A
//! node keeps, towards each peer, the generation it holds now (`current`), the
//! generation its out-of-sync bitmap towards that peer started from (`bitmap`), and the
//! two generations before (`history`, newest first). Comparing two such views tells
//! whether the nodes hold the same data, whether one is an ancestor of the other (and
//! whether a bitmap knows the difference), or whether both changed (split brain).
//!
//! Ids: the lowest bit is reserved and always clear in ids this module makes (DRBD
//! carries a role bit there on the wire); comparisons mask it off, so a peer that sets it
//! still matches. `0` means "none" (an empty bitmap or history slot) and
//! [`JUST_CREATED`] means "no data yet"; neither ever matches anything in the table.
//!
//! The rules hold only if the caller keeps three promises (docs/replication-format.md):
//! every write made while a peer is away happens under a current the peer does not
//! hold (so a primary calls [`Generations::new_current`] before its first write without a
//! peer); a bitmap resync copies the blocks marked in either node's bitmap towards the
//! other (so a crashed primary's activity log, merged into its bitmaps, is covered in
//! either direction); and a source calls [`Generations::sync_finished_source`] only after
//! the target has every block durable.

use serde::{Deserialize, Serialize};

/// `current` of a node whose metadata was just created: no data generation yet.
pub const JUST_CREATED: u64 = 4;

/// The reserved low bit of every id (masked off when comparing).
const RESERVED_BIT: u64 = 1;

/// A node's generations as seen towards one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Generations {
    /// The data generation the node holds now.
    pub current: u64,
    /// The generation the out-of-sync bitmap towards this peer started from; 0: none.
    pub bitmap: u64,
    /// Older generations, newest first; 0: empty slot.
    pub history: [u64; 2],
}

/// What one node tells the other at connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    pub gens: Generations,
    /// The node is primary now.
    pub primary: bool,
    /// The node was primary and did not stop cleanly: writes may have been in flight.
    pub crashed_primary: bool,
    /// The node's data is one whole generation (false while a resync target is mid-way).
    pub consistent: bool,
}

/// What to do after the handshake, from this node's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Same data: nothing to sync.
    InSync,
    /// We are the source; only the blocks the bitmaps mark.
    SourceBitmap,
    /// We are the target; only the blocks the bitmaps mark.
    TargetBitmap,
    /// We are the source; every block.
    SourceFull,
    /// We are the target; every block.
    TargetFull,
    /// Both changed since their common generation. `full`: there is no common bitmap
    /// base, so only a full sync can resolve it. Refused unless the operator says which
    /// side loses ([`resolve_split_brain`]).
    SplitBrain { full: bool },
    /// No common history: refuse.
    Unrelated,
}

impl Decision {
    /// The same decision seen from the peer's side.
    pub fn mirror(self) -> Decision {
        match self {
            Decision::SourceBitmap => Decision::TargetBitmap,
            Decision::TargetBitmap => Decision::SourceBitmap,
            Decision::SourceFull => Decision::TargetFull,
            Decision::TargetFull => Decision::SourceFull,
            d => d,
        }
    }

    /// This node sends data.
    pub fn is_source(self) -> bool {
        matches!(self, Decision::SourceBitmap | Decision::SourceFull)
    }

    /// This node receives data (and is inconsistent until the resync finishes).
    pub fn is_target(self) -> bool {
        matches!(self, Decision::TargetBitmap | Decision::TargetFull)
    }
}

/// Who becomes the source when nothing in the data decides: both nodes crashed as
/// primary in the same generation and neither is primary now. The two sides must pass
/// opposite values; [`Tie::by_node_id`] does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tie {
    MeSource,
    PeerSource,
}

impl Tie {
    /// The node with the lower node id is the source (node ids differ within a resource).
    pub fn by_node_id(me: u32, peer: u32) -> Tie {
        if me < peer {
            Tie::MeSource
        } else {
            Tie::PeerSource
        }
    }

    /// The value the peer passes.
    pub fn flip(self) -> Tie {
        match self {
            Tie::MeSource => Tie::PeerSource,
            Tie::PeerSource => Tie::MeSource,
        }
    }
}

/// Which row of the decision table matched, for logs and tests. `Me…`/`Peer…` pairs are
/// the same row seen from either side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Rule {
    /// Neither node has data yet.
    BothJustCreated,
    /// Only I have no data yet (or no metadata): the peer sends everything.
    MeJustCreated,
    PeerJustCreated,
    /// Same current, no crash: nothing to do.
    SameCurrent,
    /// Same current, only I still have a bitmap: I was the source of a resync whose
    /// target recorded the end and I did not.
    MeMissedSyncFinished,
    PeerMissedSyncFinished,
    /// Same current, a crashed primary involved, and I am primary now.
    MePrimaryAfterCrash,
    PeerPrimaryAfterCrash,
    /// Same current, a crashed primary involved, and both are primary now: cannot say.
    BothPrimaryAfterCrash,
    /// Same current, only I crashed as primary: my in-flight writes go to the peer.
    MeCrashedPrimary,
    PeerCrashedPrimary,
    /// Same current, both crashed as primary, both secondary now: the tie decides.
    BothCrashedPrimaryTieMe,
    BothCrashedPrimaryTiePeer,
    /// The peer's bitmap started from my current: it changed, its bitmap knows where.
    PeerBitmapIsMyCurrent,
    MyBitmapIsPeerCurrent,
    /// I was a resync target and did not record the end; the peer (source) did.
    MeTargetMissedSyncFinished,
    PeerTargetMissedSyncFinished,
    /// My current is in the peer's history: the peer is ahead, no bitmap knows by how much.
    MyCurrentInPeerHistory,
    PeerCurrentInMyHistory,
    /// Both changed since the same bitmap base.
    SameBitmapBase,
    /// Both changed; they share some older generation but no bitmap base.
    HistoryOverlap,
    /// A row matched in both directions at once: ids that no sequence of transitions
    /// makes (a collision or a hand-edited superblock). Refused as a split brain.
    Contradiction,
    /// Nothing in common.
    Unrelated,
    /// The table's answer was overridden: a consistent node is always the source of an
    /// inconsistent one (a resync target interrupted mid-way never sends).
    MeConsistentPeerNot,
    PeerConsistentMeNot,
}

impl Rule {
    /// The same row seen from the peer's side.
    pub fn mirror(self) -> Rule {
        use Rule::*;
        match self {
            MeJustCreated => PeerJustCreated,
            PeerJustCreated => MeJustCreated,
            MeMissedSyncFinished => PeerMissedSyncFinished,
            PeerMissedSyncFinished => MeMissedSyncFinished,
            MePrimaryAfterCrash => PeerPrimaryAfterCrash,
            PeerPrimaryAfterCrash => MePrimaryAfterCrash,
            MeCrashedPrimary => PeerCrashedPrimary,
            PeerCrashedPrimary => MeCrashedPrimary,
            BothCrashedPrimaryTieMe => BothCrashedPrimaryTiePeer,
            BothCrashedPrimaryTiePeer => BothCrashedPrimaryTieMe,
            PeerBitmapIsMyCurrent => MyBitmapIsPeerCurrent,
            MyBitmapIsPeerCurrent => PeerBitmapIsMyCurrent,
            MeTargetMissedSyncFinished => PeerTargetMissedSyncFinished,
            PeerTargetMissedSyncFinished => MeTargetMissedSyncFinished,
            MyCurrentInPeerHistory => PeerCurrentInMyHistory,
            PeerCurrentInMyHistory => MyCurrentInPeerHistory,
            MeConsistentPeerNot => PeerConsistentMeNot,
            PeerConsistentMeNot => MeConsistentPeerNot,
            r => r,
        }
    }

    /// A kebab-case name for logs.
    pub fn name(self) -> &'static str {
        use Rule::*;
        match self {
            BothJustCreated => "both-just-created",
            MeJustCreated => "me-just-created",
            PeerJustCreated => "peer-just-created",
            SameCurrent => "same-current",
            MeMissedSyncFinished => "me-missed-sync-finished",
            PeerMissedSyncFinished => "peer-missed-sync-finished",
            MePrimaryAfterCrash => "me-primary-after-crash",
            PeerPrimaryAfterCrash => "peer-primary-after-crash",
            BothPrimaryAfterCrash => "both-primary-after-crash",
            MeCrashedPrimary => "me-crashed-primary",
            PeerCrashedPrimary => "peer-crashed-primary",
            BothCrashedPrimaryTieMe => "both-crashed-primary-tie-me",
            BothCrashedPrimaryTiePeer => "both-crashed-primary-tie-peer",
            PeerBitmapIsMyCurrent => "peer-bitmap-is-my-current",
            MyBitmapIsPeerCurrent => "my-bitmap-is-peer-current",
            MeTargetMissedSyncFinished => "me-target-missed-sync-finished",
            PeerTargetMissedSyncFinished => "peer-target-missed-sync-finished",
            MyCurrentInPeerHistory => "my-current-in-peer-history",
            PeerCurrentInMyHistory => "peer-current-in-my-history",
            SameBitmapBase => "same-bitmap-base",
            HistoryOverlap => "history-overlap",
            Contradiction => "contradiction",
            Unrelated => "unrelated",
            MeConsistentPeerNot => "me-consistent-peer-not",
            PeerConsistentMeNot => "peer-consistent-me-not",
        }
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `x` with the reserved bit cleared.
fn canon(x: u64) -> u64 {
    x & !RESERVED_BIT
}

/// `x` as an id that can match another: `None` for "none" (0) and [`JUST_CREATED`].
fn real(x: u64) -> Option<u64> {
    match canon(x) {
        0 | JUST_CREATED => None,
        v => Some(v),
    }
}

/// No data generation: just created, or no metadata at all (0).
fn blank(current: u64) -> bool {
    real(current).is_none()
}

/// `x` is a real id and equals `y`.
fn same(x: u64, y: u64) -> bool {
    real(x).is_some() && canon(x) == canon(y)
}

/// A fresh id from `ids`: the reserved bit cleared, and never 0 or [`JUST_CREATED`]
/// (those two are mapped to other values by setting the top bit, so a source that keeps
/// answering 0 cannot make this loop).
pub fn fresh_id(ids: &mut impl FnMut() -> u64) -> u64 {
    let v = canon(ids());
    if v == 0 || v == JUST_CREATED {
        v | 1 << 63
    } else {
        v
    }
}

/// Random ids for production use (tests pass a deterministic closure instead).
pub fn random_ids() -> impl FnMut() -> u64 {
    rand::random::<u64>
}

impl Generations {
    /// The generations right after create-md.
    pub const JUST_CREATED: Generations = Generations {
        current: JUST_CREATED,
        bitmap: 0,
        history: [0, 0],
    };

    /// Puts `id` at the front of the history unless it is already there or not an id.
    fn push_history(&mut self, id: u64) {
        if real(id).is_some() && canon(self.history[0]) != canon(id) {
            self.history = [id, self.history[0]];
        }
    }

    /// A new data generation begins: called when a primary loses its last connected
    /// peer, or when a node is promoted while disconnected, before the first write that
    /// peer will not see.
    ///
    /// - The old current goes into the history, always. The history is kept once per
    ///   node in the superblock, shared by every peer's view, so whether it moves cannot
    ///   depend on one peer's bitmap (DRBD's single-peer rule pushed only when the bitmap
    ///   was already set).
    /// - If the bitmap towards this peer is empty, it starts now, from the old current:
    ///   a peer still holding that generation needs only the bits set from here on.
    ///   If it is already set it stays: it has tracked every change since its older base,
    ///   which includes this generation's.
    /// - On a node with no data yet this is [`Generations::initial_sync_start`].
    pub fn new_current(&mut self, ids: &mut impl FnMut() -> u64) {
        if blank(self.current) {
            self.initial_sync_start(ids);
            return;
        }
        if real(self.bitmap).is_none() {
            self.bitmap = self.current;
        }
        let old = self.current;
        self.push_history(old);
        self.current = fresh_id(ids);
    }

    /// `primary --force` on a node with no data yet: its (whatever) data becomes the first
    /// generation, and every peer still [`JUST_CREATED`] gets a full sync from it. The
    /// bitmap and history stay empty: there is nothing older to compare with.
    pub fn initial_sync_start(&mut self, ids: &mut impl FnMut() -> u64) {
        *self = Generations {
            current: fresh_id(ids),
            bitmap: 0,
            history: [0, 0],
        };
    }

    /// The resync this node was the source of is complete (the target has every block
    /// durable): the bitmap base becomes history and the bitmap is empty again.
    pub fn sync_finished_source(&mut self) {
        let b = self.bitmap;
        self.push_history(b);
        self.bitmap = 0;
    }

    /// The resync this node was the target of is complete: it now holds the source's
    /// current, and the source's lineage (the history the source has after its own
    /// [`Generations::sync_finished_source`]), with no bitmap. `source` may be the
    /// source's generations as exchanged at connect or as they are after it finished:
    /// both give the same result. Write it in the same superblock write that sets
    /// CONSISTENT, so no crash separates the two.
    pub fn sync_finished_target(&mut self, source: &Generations) {
        let mut g = *source;
        g.sync_finished_source();
        *self = g;
    }

    /// The view of a node that just finished a resync as target towards a third peer
    /// that took no part in it. The node's data moved from its old current to the
    /// source's, and the blocks the resync wrote must be marked in this bitmap by the
    /// data path: like [`Generations::new_current`], an empty bitmap starts from the old
    /// current. Current and history become what [`Generations::sync_finished_target`]
    /// gives, so the node-wide fields agree across views.
    pub fn sync_finished_target_other_peer(&mut self, source: &Generations) {
        let old = *self;
        self.sync_finished_target(source);
        self.bitmap = if real(old.bitmap).is_some() {
            old.bitmap
        } else {
            old.current
        };
    }
}

/// The operator's answer to a split brain: which side's changes are thrown away.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Discard {
    /// This node is the victim (DRBD's `--discard-my-data`).
    Mine,
    /// The peer is the victim.
    Peers,
}

/// Turns a split brain into a resync towards the victim: bitmap when the two share a
/// bitmap base (the union of both bitmaps covers both sides' changes), full otherwise.
/// Any other decision is returned unchanged. The victim must not be primary.
pub fn resolve_split_brain(decision: Decision, discard: Discard) -> Decision {
    match (decision, discard) {
        (Decision::SplitBrain { full: false }, Discard::Mine) => Decision::TargetBitmap,
        (Decision::SplitBrain { full: false }, Discard::Peers) => Decision::SourceBitmap,
        (Decision::SplitBrain { full: true }, Discard::Mine) => Decision::TargetFull,
        (Decision::SplitBrain { full: true }, Discard::Peers) => Decision::SourceFull,
        (d, _) => d,
    }
}

/// The decision table on generations and crash flags alone (no consistency override):
/// see [`decide`]. Rows are tried in order; within a row both directions are tried, and a
/// row that matches both ways is a [`Rule::Contradiction`].
pub fn compare(me: &NodeView, peer: &NodeView, tie: Tie) -> (Decision, Rule) {
    let (m, p) = (&me.gens, &peer.gens);

    match (blank(m.current), blank(p.current)) {
        (true, true) => return (Decision::InSync, Rule::BothJustCreated),
        (true, false) => return (Decision::TargetFull, Rule::MeJustCreated),
        (false, true) => return (Decision::SourceFull, Rule::PeerJustCreated),
        (false, false) => {}
    }

    if canon(m.current) == canon(p.current) {
        return same_current(me, peer, tie);
    }

    // One direction of a row: `fwd` says "I am the target" when true, `back` says "I am
    // the source". Both: the ids contradict each other.
    let row = |fwd: bool, back: bool, target: (Decision, Rule)| -> Option<(Decision, Rule)> {
        match (fwd, back) {
            (true, true) => Some((Decision::SplitBrain { full: true }, Rule::Contradiction)),
            (true, false) => Some(target),
            (false, true) => Some((target.0.mirror(), target.1.mirror())),
            (false, false) => None,
        }
    };

    // The peer's bitmap started from my current: it holds my data plus what it marked.
    if let Some(r) = row(
        same(p.bitmap, m.current),
        same(m.bitmap, p.current),
        (Decision::TargetBitmap, Rule::PeerBitmapIsMyCurrent),
    ) {
        return r;
    }

    // I was the target of a resync the peer finished and I did not record (crash between
    // the source's and the target's metadata writes): the peer's bitmap base just moved
    // into its history and its bitmap is empty, so nothing was written since without me.
    // The second history slot must line up too, as a check that the lineage is the same.
    let target_missed = |t: &Generations, s: &Generations| {
        real(s.bitmap).is_none()
            && same(s.history[0], t.current)
            && canon(t.history[0]) == canon(s.history[1])
    };
    if let Some(r) = row(
        target_missed(m, p),
        target_missed(p, m),
        (Decision::TargetBitmap, Rule::MeTargetMissedSyncFinished),
    ) {
        return r;
    }

    // My current is an ancestor of the peer's, but no bitmap knows the difference.
    let in_history = |x: u64, g: &Generations| g.history.iter().any(|&h| same(x, h));
    if let Some(r) = row(
        in_history(m.current, p),
        in_history(p.current, m),
        (Decision::TargetFull, Rule::MyCurrentInPeerHistory),
    ) {
        return r;
    }

    // Both moved on from the same base: each bitmap marks its own changes, and the
    // union covers both.
    if same(m.bitmap, p.bitmap) {
        return (Decision::SplitBrain { full: false }, Rule::SameBitmapBase);
    }

    let older = |g: &Generations| [g.bitmap, g.history[0], g.history[1]];
    if older(m)
        .iter()
        .any(|&a| older(p).iter().any(|&b| same(a, b)))
    {
        return (Decision::SplitBrain { full: true }, Rule::HistoryOverlap);
    }

    (Decision::Unrelated, Rule::Unrelated)
}

/// Equal, real currents: the same data generation, except for what crashed primaries
/// may have had in flight and for a source that missed the end of its resync.
fn same_current(me: &NodeView, peer: &NodeView, tie: Tie) -> (Decision, Rule) {
    let (m, p) = (&me.gens, &peer.gens);
    match (real(m.bitmap).is_some(), real(p.bitmap).is_some()) {
        // The target took my current (sync_finished_target) but I crashed before
        // sync_finished_source: run the (now empty) resync again so both record its end.
        (true, false) => return (Decision::SourceBitmap, Rule::MeMissedSyncFinished),
        (false, true) => return (Decision::TargetBitmap, Rule::PeerMissedSyncFinished),
        _ => {}
    }
    match (me.crashed_primary, peer.crashed_primary) {
        (false, false) => (Decision::InSync, Rule::SameCurrent),
        _ if me.primary && peer.primary => (
            Decision::SplitBrain { full: false },
            Rule::BothPrimaryAfterCrash,
        ),
        // Whoever serves now is the truth: its blocks go to the other, and the other's
        // in-flight blocks (in its bitmap from its activity log) are overwritten.
        _ if me.primary => (Decision::SourceBitmap, Rule::MePrimaryAfterCrash),
        _ if peer.primary => (Decision::TargetBitmap, Rule::PeerPrimaryAfterCrash),
        (true, false) => (Decision::SourceBitmap, Rule::MeCrashedPrimary),
        (false, true) => (Decision::TargetBitmap, Rule::PeerCrashedPrimary),
        (true, true) => match tie {
            Tie::MeSource => (Decision::SourceBitmap, Rule::BothCrashedPrimaryTieMe),
            Tie::PeerSource => (Decision::TargetBitmap, Rule::BothCrashedPrimaryTiePeer),
        },
    }
}

/// The decision at connect, from `me`'s side. `decide(b, a, tie.flip())` is always the
/// mirror of `decide(a, b, tie)`.
///
/// The table ([`compare`]), first row that matches wins:
///
/// | row | condition | decision |
/// |-----|-----------|----------|
/// | both-just-created | both currents blank (JUST_CREATED or 0) | InSync |
/// | me/peer-just-created | one current blank | the other is the full source |
/// | me/peer-missed-sync-finished | equal currents, only one bitmap set | its owner is bitmap source |
/// | same-current | equal currents, no crashed primary | InSync |
/// | both-primary-after-crash | equal, a crashed primary, both primary now | SplitBrain (bitmap) |
/// | me/peer-primary-after-crash | equal, a crashed primary, one primary now | it is bitmap source |
/// | me/peer-crashed-primary | equal, one crashed primary | it is bitmap source |
/// | both-crashed-primary-tie-* | equal, both crashed, neither primary | `tie` picks the bitmap source |
/// | peer-bitmap-is-my-current (and mirror) | peer.bitmap == me.current | TargetBitmap |
/// | me-target-missed-sync-finished (and mirror) | peer.bitmap empty, peer.history[0] == me.current, me.history[0] == peer.history[1] | TargetBitmap |
/// | my-current-in-peer-history (and mirror) | me.current in peer.history | TargetFull |
/// | same-bitmap-base | me.bitmap == peer.bitmap (real) | SplitBrain (bitmap) |
/// | history-overlap | a real id in both {bitmap, history} | SplitBrain (full) |
/// | unrelated | otherwise | Unrelated |
///
/// Then the disk states: if exactly one node is consistent, it is the source whatever
/// the table said (except Unrelated, which stays refused), with a full sync where the
/// table said full or full split brain, a bitmap sync otherwise. A resync target
/// interrupted mid-way is therefore never a source. If the decision makes a node that is
/// primary now the target, the caller must refuse the connection (DRBD does too).
pub fn decide(me: &NodeView, peer: &NodeView, tie: Tie) -> (Decision, Rule) {
    let (d, r) = compare(me, peer, tie);
    if d == Decision::Unrelated || me.consistent == peer.consistent {
        return (d, r);
    }
    let full = matches!(
        d,
        Decision::SourceFull | Decision::TargetFull | Decision::SplitBrain { full: true }
    );
    let source = if full {
        Decision::SourceFull
    } else {
        Decision::SourceBitmap
    };
    let (forced, rule) = if me.consistent {
        (source, Rule::MeConsistentPeerNot)
    } else {
        (source.mirror(), Rule::PeerConsistentMeNot)
    };
    // Keep the table's row in the log when it already agrees.
    if forced == d {
        (d, r)
    } else {
        (forced, rule)
    }
}

#[cfg(test)]
mod tests;
