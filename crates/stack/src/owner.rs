//! One writer per device, in the user's words: the refusal a second writer gets, and the
//! one warning a reader gets when what it reads is being written (cairn_block's owner
//! lock does the work; this module only words it).

use std::collections::BTreeSet;
use std::sync::Mutex;

use cairn_block::{FileDisk, InUse};

use crate::error::StackError;

/// cryptsetup's exit status for "device already exists or device is busy", so scripts
/// written for it keep working.
pub const EXIT_BUSY: u8 = 5;

/// The refusal for a device another writer holds (`e` of kind [`cairn_block::ErrorKind::Busy`]).
pub fn busy(shown: &str, e: &cairn_block::Error) -> StackError {
    let message = match InUse::of(e) {
        Some(h) if h.this_process => format!(
            "{shown} is already open for writing in this process (a member or an export of \
             the same stack); a device can belong to one export or array only"
        ),
        Some(h) => format!(
            "{shown} is {h}; one writer per device: stop it first, or make the change \
             through it (read-only commands such as `cairn md examine` still work)"
        ),
        None => format!("{shown} is in use by another process or by the kernel ({e})"),
    };
    StackError::with_code(message, EXIT_BUSY)
}

/// For a device opened read-only: warns, once per writer, that another process writes
/// it and what is read may be changing.
pub fn note_reader(shown: &str, disk: &FileDisk) {
    static WARNED: Mutex<BTreeSet<Option<u32>>> = Mutex::new(BTreeSet::new());
    let Some(h) = disk.in_use() else {
        return;
    };
    if h.this_process {
        // The server itself looking at its own devices; it knows.
        return;
    }
    let mut warned = WARNED.lock().unwrap_or_else(|p| p.into_inner());
    if !warned.insert(h.pid) {
        return;
    }
    tracing::warn!("{shown} is {h}, which writes it: what is read may be changing meanwhile");
}
