//! One owner per array on remote members (docs/fencing.md).
//!
//! Before an md array on remote members is assembled writable, this host takes ownership
//! of them: it reads every member's owner record, refuses when another owner holds them
//! and did not release them (unless told `--force`: that owner is gone), raises the
//! generation to one above everything seen and declares it to every member server. A
//! cairn member server then refuses every request from an older generation, so a former
//! owner that wakes up (a paused VM, a partitioned host) cannot write a single block;
//! nbdkit and qemu-nbd members carry the record but cannot enforce it.
//!
//! The member connections the array runs on are the ones that declared the generation;
//! reconnections (the supervisor in [`crate::remote`]) declare the same token. At a clean
//! stop [`release_all`] marks the records released, so the next owner (a restart of this
//! host included: each process is a new owner instance) takes over without forcing.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use cairn_cluster::owner::{self, Owned, Rules, TakeoverError};
use cairn_md::{FeaturePolicy, Level, Superblock};
use cairn_nbd::client::{Client, ClientOptions};
use cairn_nbd::fence::FenceToken;

use crate::error::{Result, StackError};
use crate::hooks::Options;
use crate::leaf;

/// This process's hold on one array's remote members.
#[derive(Debug)]
pub struct Claim {
    owned: Owned,
    members: Vec<(String, ClientOptions)>,
    released: Mutex<bool>,
}

impl Claim {
    /// The token a reconnection of `member` declares: none for a member whose first
    /// 4 KiB hold other data (it takes part unfenced; a cairn member server would refuse
    /// a token there).
    pub fn token_for(&self, member: &str) -> Option<FenceToken> {
        let foreign = self
            .owned
            .members
            .iter()
            .any(|m| m.name == member && m.foreign);
        (!foreign).then(|| self.owned.token.clone())
    }

    /// Marks the records released (once); returns the members that could not be.
    pub fn release(&self) -> Vec<(String, String)> {
        let mut done = self.released.lock().unwrap_or_else(|p| p.into_inner());
        if *done {
            return Vec::new();
        }
        *done = true;
        owner::release(&self.owned, &self.members)
    }
}

/// Claims still held by this process, released by [`release_all`] at a clean stop. A
/// process-wide list because the claim must outlive whichever front end opened the
/// array, and be given up after every array is closed.
static CLAIMS: Mutex<Vec<Arc<Claim>>> = Mutex::new(Vec::new());

/// Gives up every claim this process holds (after the arrays are closed). Members that
/// cannot be reached keep an unreleased record; the next owner then needs `--force`.
pub fn release_all() {
    let claims: Vec<Arc<Claim>> =
        std::mem::take(&mut *CLAIMS.lock().unwrap_or_else(|p| p.into_inner()));
    for c in claims {
        for (m, e) in c.release() {
            tracing::warn!("{m}: the owner record was not released: {e}");
        }
    }
}

/// Closes `array` (marks it clean) and, when that worked, gives up this host's claim on
/// its remote members. A failed close keeps the claim: the array needs a resync, and the
/// next owner must be told (`--force`) that this one is gone.
pub fn close_array(array: &cairn_md::Array) -> cairn_block::Result<()> {
    array.close()?;
    let uuid = array.report().uuid.0;
    let mine: Vec<Arc<Claim>> = {
        let mut all = CLAIMS.lock().unwrap_or_else(|p| p.into_inner());
        let (mine, rest): (Vec<_>, Vec<_>) =
            all.drain(..).partition(|c| c.owned.token.array == uuid);
        *all = rest;
        mine
    };
    for c in mine {
        for (m, e) in c.release() {
            tracing::warn!("{m}: the owner record was not released: {e}");
        }
    }
    Ok(())
}

/// The fewest members the array runs on, for the takeover's quorum rule.
fn needed(sb: &Superblock) -> usize {
    let n = sb.raid_disks as usize;
    match sb.level {
        Level::Raid1 => 1,
        Level::Raid4 | Level::Raid5 => n.saturating_sub(1).max(1),
        Level::Raid6 => n.saturating_sub(2).max(1),
        Level::Raid10 => {
            let copies = cairn_md::Raid10Layout::from_raw(sb.layout)
                .map(|l| l.copies() as usize)
                .unwrap_or(2)
                .max(1);
            n.div_ceil(copies).max(1)
        }
        Level::Linear | Level::Raid0 => n,
    }
}

/// The member connections of a claimed array, by name, and the members not reached.
#[derive(Debug)]
pub struct Claimed {
    pub claim: Arc<Claim>,
    pub devices: HashMap<String, Arc<Client>>,
    pub missing: Vec<PathBuf>,
}

/// Takes ownership of the remote members among `paths` (when there are any and the
/// array is opened writable). `None`: nothing to claim.
pub fn claim(paths: &[PathBuf], opts: &Options) -> Result<Option<Claimed>> {
    if opts.read_only {
        return Ok(None);
    }
    let remote: Vec<&PathBuf> = paths.iter().filter(|p| leaf::is_remote(p)).collect();
    if remote.is_empty() {
        return Ok(None);
    }
    let mut members = Vec::new();
    for p in &remote {
        let u = leaf::parse_remote(p)?;
        let mut o =
            ClientOptions::from_uri(&u).map_err(|e| StackError::new(format!("{u}: {e}")))?;
        o.timeout = Some(opts.remote_timeout());
        members.push((p.display().to_string(), o));
    }
    // The array's identity and level, from the first member that answers.
    let sb = remote
        .iter()
        .find_map(|p| read_superblock(p, opts))
        .ok_or_else(|| {
            StackError::new(format!(
                "none of the remote members answers with an md superblock ({})",
                remote
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
    let local = paths.len() - remote.len();
    let rules = Rules {
        needed: needed(&sb).saturating_sub(local).max(1),
        force_quorum: opts.force,
        replace_owner: opts.force,
    };
    let me = owner::new_owner("").map_err(StackError::new)?;
    let owned = owner::take_over(sb.set_uuid.0, &me, &members, rules).map_err(|e| match e {
        TakeoverError::Owned { .. } => StackError::new(format!(
            "{e}. Two hosts must never write the same members: if that owner is gone \
                 for good (its host is down, not just unreachable), start with --force to \
                 take the members over"
        )),
        TakeoverError::Record { ref member, .. } => StackError::new(format!(
            "cannot take ownership of the members: {e}. cairn does not guess who owns a \
             member whose owner record is damaged (read as \"never owned\" it would let any \
             host write), and --force does not change that: `cairn md owner '{member}'` \
             shows it; once you know no other host runs the array, stop its member server, \
             zero the member's first 4 KiB on the disk host, and start again"
        )),
        TakeoverError::Refused { .. } => StackError::new(format!(
            "{e}. A member that refuses is a mistake to fix, not a missing member: the \
             array is not started degraded without it; fix its URI or its server and start \
             again"
        )),
        _ => StackError::new(format!("cannot take ownership of the members: {e}")),
    })?;
    let devices: HashMap<String, Arc<Client>> = owned
        .members
        .iter()
        .map(|m| (m.name.clone(), m.device.clone()))
        .collect();
    // A foreign member was warned about already: no record is written to it.
    for m in owned.members.iter().filter(|m| !m.enforced && !m.foreign) {
        tracing::warn!(
            "{}: its server does not enforce owner generations (not a cairn member \
             server): the record is written, but a former owner could still write",
            m.name
        );
    }
    let missing = owned.missing.iter().map(PathBuf::from).collect();
    let claim = Arc::new(Claim {
        owned,
        members,
        released: Mutex::new(false),
    });
    CLAIMS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(claim.clone());
    Ok(Some(Claimed {
        claim,
        devices,
        missing,
    }))
}

fn read_superblock(p: &Path, opts: &Options) -> Option<Superblock> {
    let c = leaf::open_remote(p, true, opts.remote_timeout()).ok()?;
    let sb = Superblock::read_from(&*c, &p.display().to_string(), FeaturePolicy::Supported).ok();
    if let Ok(c) = Arc::try_unwrap(c) {
        let _ = c.disconnect();
    }
    sb
}
