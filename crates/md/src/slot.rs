//! A role of the array and the member device that fills it: what the array, the
//! bitmap and the rebuild share about each member, with no behaviour of the array.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use cairn_block::BlockDevice;

/// One member device, as the array uses it.
pub(crate) struct Member {
    pub(crate) dev: Arc<dyn BlockDevice>,
    pub(crate) name: String,
    /// `data_offset` in bytes.
    pub(crate) base: u64,
}

/// A role of the array and the member (if any) that fills it.
///
/// The member can change while the array runs (a spare takes over, a replacement
/// finishes), so it sits behind a lock that I/O only reads.
pub(crate) struct Slot {
    member: RwLock<Option<Arc<Member>>>,
    pub(crate) failed: AtomicBool,
    /// How much of the member's data area holds current data, in bytes: `u64::MAX`
    /// when in sync. While a rebuild runs onto the member it is the rebuild's position
    /// (parity levels: member bytes below it are rebuilt; mirrors: 0 until the end,
    /// since mirror writes go to the rebuilding member everywhere).
    pub(crate) synced: AtomicU64,
    /// Where a rebuild onto this member resumes after a restart, in member bytes: the
    /// superblock's `recovery_offset` while `synced` is not `u64::MAX`.
    pub(crate) recovery_cp: AtomicU64,
    /// A re-added member's rebuild covers only what the live bitmap marks dirty.
    pub(crate) bitmap_guided: AtomicBool,
    /// A replacement being built for this member (`cairn md replace`), and how far.
    replacement: RwLock<Option<Arc<Member>>>,
    pub(crate) replacement_synced: AtomicU64,
}

impl Slot {
    pub(crate) fn new(member: Option<Member>) -> Slot {
        Slot::with_synced(member, u64::MAX)
    }

    pub(crate) fn with_synced(member: Option<Member>, synced: u64) -> Slot {
        Slot {
            member: RwLock::new(member.map(Arc::new)),
            failed: AtomicBool::new(false),
            synced: AtomicU64::new(synced),
            recovery_cp: AtomicU64::new(0),
            bitmap_guided: AtomicBool::new(false),
            replacement: RwLock::new(None),
            replacement_synced: AtomicU64::new(0),
        }
    }

    pub(crate) fn member(&self) -> Option<Arc<Member>> {
        self.member
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn has_member(&self) -> bool {
        self.member
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some()
    }

    /// Puts `m` in the slot (in sync up to `synced`), returning the one it held.
    /// Gives the member filling this role another name (nothing else changes).
    pub(crate) fn rename(&self, name: String) {
        let mut g = self.member.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(m) = g.as_ref() {
            *g = Some(Arc::new(Member {
                dev: m.dev.clone(),
                name,
                base: m.base,
            }));
        }
    }

    pub(crate) fn set_member(&self, m: Option<Arc<Member>>, synced: u64) -> Option<Arc<Member>> {
        let mut g = self.member.write().unwrap_or_else(PoisonError::into_inner);
        // The new member must never look in sync before its position is set.
        self.synced.store(synced, Ordering::Release);
        self.recovery_cp.store(0, Ordering::Release);
        self.bitmap_guided.store(false, Ordering::Release);
        let old = std::mem::replace(&mut *g, m);
        self.failed.store(false, Ordering::Release);
        old
    }

    pub(crate) fn replacement(&self) -> Option<Arc<Member>> {
        self.replacement
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(crate) fn set_replacement(&self, m: Option<Arc<Member>>) -> Option<Arc<Member>> {
        let mut g = self
            .replacement
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        self.replacement_synced.store(0, Ordering::Release);
        std::mem::replace(&mut *g, m)
    }
}
