//! One owner per array across hosts (docs/fencing.md).
//!
//! ```text
//!   claim (writable md array): read a superblock (uuid, level)
//!     ─ 1. with --etcd: the array's lease, by create-if-absent; held elsewhere: refused
//!     ─ 2. remote members: take them over (generation = max + 1, declared to every server);
//!          an owner that did not release them is replaced only with the lease (its lease
//!          expired, or it gave it up) or --force
//!     ─ every member device checks the lease before each I/O (FencedDevice)
//!   watch: the lease may be lost (its deadline passed), or a member refused as Fenced
//!     ─> Array::fence (background work stops, nothing more written) ─> lease given up
//!   close_array: array closed cleanly ─> records released ─> lease revoked
//! ```
//!
//! The lease comes first. A host that does not get it has not disturbed the running owner
//! (no generation raised), and one that gets it knows the previous holder's lease ran out
//! (or was given up): that owner's own deadline passed before etcd's, so it already
//! refuses I/O; whatever request of it was paused in flight meets the generation this
//! host raises next, which a cairn member server checks on every request. Only then is
//! anything written. nbdkit and qemu-nbd members carry the record but cannot enforce it.
//!
//! The member connections the array runs on are the ones that declared the generation;
//! reconnections (the supervisor in [`crate::remote`]) declare the same token and check
//! the same lease. At a clean stop the records are marked released and the lease revoked,
//! so the next owner (a restart of this host included: each process is a new owner
//! instance) takes over at once.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use cairn_block::BlockDevice;
use cairn_cluster::owner::{self, Owned, Rules, TakeoverError};
use cairn_cluster::{owner_key, Etcd, FencedDevice, Lease, LeaseError, LeaseGuard};
use cairn_md::{Array, FeaturePolicy, Level, Superblock};
use cairn_nbd::client::{Client, ClientOptions};
use cairn_nbd::fence::{FenceToken, OwnerId};

use crate::error::{Result, StackError};
use crate::hooks::Options;
use crate::leaf;

/// This process's hold on a set of remote devices one owner writes: an md array's members
/// ([`claim`]), or one remote export used whole as a LUKS volume, a PV or a served export
/// ([`claim_export`]). Its etcd lease and the devices' owner generation.
#[derive(Debug)]
pub struct Claim {
    uuid: [u8; 16],
    /// The remote export used whole, for a claim of one ([`claim_export`]).
    export: Option<PathBuf>,
    /// The remote members taken over, when there are any.
    owned: Option<Owned>,
    members: Vec<(String, ClientOptions)>,
    /// Held until the records are released; dropping it revokes it.
    lease: Mutex<Option<Lease>>,
    guard: Option<LeaseGuard>,
    released: Mutex<bool>,
    /// The array assembled on it, once there is one ([`watch`]).
    array: OnceLock<Weak<Array>>,
}

impl Claim {
    /// The token a reconnection of `member` declares, when remote members were taken
    /// over: none for a member whose first 4 KiB hold other data (it takes part
    /// unfenced; a cairn member server would refuse a token there).
    pub fn token_for(&self, member: &str) -> Option<FenceToken> {
        let owned = self.owned.as_ref()?;
        let foreign = owned.members.iter().any(|m| m.name == member && m.foreign);
        (!foreign).then(|| owned.token.clone())
    }

    /// Whether this claim is the one `array` was assembled on (by identity once the
    /// array is known, by uuid before: one process may hold two claims of one array, a
    /// test playing two hosts).
    fn is_for(&self, array: &Array) -> bool {
        if self.export.is_some() {
            return false;
        }
        match self.array.get() {
            Some(w) => std::ptr::eq(w.as_ptr(), array),
            None => self.uuid == array.uuid().0,
        }
    }

    /// The token reconnections declare, when remote members were taken over.
    pub fn token(&self) -> Option<&FenceToken> {
        self.owned.as_ref().map(|o| &o.token)
    }

    /// The array's etcd lease, when one is held.
    pub fn lease(&self) -> Option<&LeaseGuard> {
        self.guard.as_ref()
    }

    /// `dev`, checking the lease before every I/O when there is one: a member of the
    /// array gets nothing from this host, md's own writes included, once it may be lost.
    pub fn fence_device(&self, dev: Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice> {
        match &self.guard {
            Some(g) => Arc::new(FencedDevice::new(dev, g.clone())),
            None => dev,
        }
    }

    /// Revokes the lease (if still held) without touching the records: the array is
    /// fenced here, and another host may take it over now.
    fn give_up_lease(&self) {
        let lease = self.lease.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(l) = lease {
            let key = l.key().to_string();
            drop(l);
            tracing::warn!("{key}: the ownership lease is given up; this host writes nothing more to the array");
        }
    }

    /// Marks the records released and then gives the lease up (once); returns the
    /// members that could not be released.
    pub fn release(&self) -> Vec<(String, String)> {
        let mut done = self.released.lock().unwrap_or_else(|p| p.into_inner());
        if *done {
            return Vec::new();
        }
        *done = true;
        if let Some(g) = self.guard.as_ref().filter(|g| !g.is_valid()) {
            // Another host may own the members now: a "released" record written at this
            // host's generation would overwrite its record where the server does not
            // enforce. The records stay as they are; the lease is gone already.
            tracing::warn!(
                "{}: the ownership lease is lost, so the members' owner records are left \
                 to their new owner",
                g.key()
            );
            return Vec::new();
        }
        let failed = match &self.owned {
            Some(o) => owner::release(o, &self.members),
            None => Vec::new(),
        };
        // The records first, then the lease: the next owner finds them released.
        drop(self.lease.lock().unwrap_or_else(|p| p.into_inner()).take());
        failed
    }
}

/// Claims still held by this process, released by [`release_all`] at a clean stop. A
/// process-wide list because the claim must outlive whichever front end opened the
/// array, and be given up after every array is closed.
static CLAIMS: Mutex<Vec<Arc<Claim>>> = Mutex::new(Vec::new());

fn claims() -> std::sync::MutexGuard<'static, Vec<Arc<Claim>>> {
    CLAIMS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Gives up every claim this process holds (after the arrays are closed). Members that
/// cannot be reached keep an unreleased record; the next owner then needs the lease or
/// `--force`.
pub fn release_all() {
    let all: Vec<Arc<Claim>> = std::mem::take(&mut *claims());
    for c in all {
        for (m, e) in c.release() {
            tracing::warn!("{m}: the owner record was not released: {e}");
        }
    }
}

/// Gives up the claims on remote exports used whole (a LUKS volume, a PV, an export
/// served as it is), keeping those on md arrays: a command that failed is done writing
/// them, and unlike an array they have no clean state to get wrong, so the next owner
/// must not need `--force` (or a hand-deleted owner file) because a verb failed. An
/// array whose close failed keeps its claim, as a crash would.
pub fn release_whole_exports() {
    let mine: Vec<Arc<Claim>> = {
        let mut all = claims();
        let (mine, rest): (Vec<_>, Vec<_>) = all.drain(..).partition(|c| c.export.is_some());
        *all = rest;
        mine
    };
    for c in mine {
        for (m, e) in c.release() {
            tracing::warn!("{m}: the owner record was not released: {e}");
        }
    }
}

/// Closes `array` (marks it clean) and, when that worked, gives up this host's claim on
/// it. A failed close keeps the claim: the array needs a resync, and the next owner
/// takes over once the lease runs out (or is told with `--force` that this one is gone).
/// A fenced array is not closed: its members are another owner's now.
pub fn close_array(array: &Array) -> cairn_block::Result<()> {
    array.close()?;
    let mine: Vec<Arc<Claim>> = {
        let mut all = claims();
        let (mine, rest): (Vec<_>, Vec<_>) = all.drain(..).partition(|c| c.is_for(array));
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

/// Gives `claim` up at once (the array did not assemble: nothing was written) and
/// forgets it.
pub fn abandon(claim: &Arc<Claim>) {
    claims().retain(|c| !Arc::ptr_eq(c, claim));
    for (m, e) in claim.release() {
        tracing::warn!("{m}: the owner record was not released: {e}");
    }
}

/// The lease check of `array`, when this process holds the array as an etcd lease.
pub fn lease_of(array: &Array) -> Option<LeaseGuard> {
    claims()
        .iter()
        .find(|c| c.is_for(array))
        .and_then(|c| c.guard.clone())
}

/// `dev`, about to join `array` (`md add`, `md replace`), behind the array's lease check
/// when it holds one, as its other members are.
pub fn fence_member(array: &Array, dev: Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice> {
    let claim = claims().iter().find(|c| c.is_for(array)).cloned();
    match claim {
        Some(c) => c.fence_device(dev),
        None => dev,
    }
}

/// Whether any of `arrays`, or any remote export in `leaves` (used whole), is held as
/// an etcd lease.
pub fn leased(arrays: &[Arc<Array>], leaves: &[PathBuf]) -> bool {
    let all = claims();
    arrays
        .iter()
        .any(|a| all.iter().any(|c| c.is_for(a) && c.guard.is_some()))
        || all
            .iter()
            .any(|c| c.guard.is_some() && c.export.as_ref().is_some_and(|p| leaves.contains(p)))
}

/// Ties `claim` to the `array` assembled on it and, when it holds a lease, watches it:
/// once the lease may be lost (etcd expired it, no keepalive was answered by its
/// deadline, the process was paused past it), or the array was fenced by a member's
/// refusal, the array is fenced for good (background work stops, nothing more is
/// written to its members, status says FENCED) and the lease is given up, so another
/// host can take over at once. A keepalive that renews the lease after its deadline
/// changes nothing: md cannot take back the refusals of the gap.
pub fn watch(array: &Arc<Array>, claim: Option<&Arc<Claim>>) {
    let Some(claim) = claim else { return };
    let weak: Weak<Array> = Arc::downgrade(array);
    let _ = claim.array.set(weak.clone());
    let Some(guard) = claim.guard.clone() else {
        return;
    };
    let claim = claim.clone();
    let spawned = std::thread::Builder::new()
        .name("lease-watch".into())
        .spawn(move || loop {
            let Some(a) = weak.upgrade().filter(|a| !a.is_closed()) else {
                return;
            };
            let why = match a.fenced() {
                Some(w) => w.to_string(),
                None => {
                    drop(a);
                    match guard.wait_lost(Duration::from_secs(1)) {
                        Some(why) => {
                            tracing::error!(
                                "{why}: the ownership lease is lost, another host may own \
                                 the array now"
                            );
                            why
                        }
                        None => continue,
                    }
                }
            };
            if let Some(a) = weak.upgrade().filter(|a| !a.is_closed()) {
                a.fence(&why);
            }
            claim.give_up_lease();
            return;
        });
    if let Err(e) = spawned {
        // The member devices still check the lease on every I/O; the early stop of
        // background work, the status line and the lease given up depend on this thread.
        tracing::warn!("cannot start the lease watcher: {e}");
    }
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

/// A claimed array's remote member connections, by name, and the members not reached.
#[derive(Debug)]
pub struct Claimed {
    pub claim: Arc<Claim>,
    pub devices: HashMap<String, Arc<Client>>,
    pub missing: Vec<PathBuf>,
}

/// Takes ownership of the array on `paths` when it is opened writable: its etcd lease
/// (with an etcd configured), then its remote members. `None`: nothing to claim.
pub fn claim(paths: &[PathBuf], opts: &Options) -> Result<Option<Claimed>> {
    if opts.read_only {
        return Ok(None);
    }
    let remote: Vec<&PathBuf> = paths.iter().filter(|p| leaf::is_remote(p)).collect();
    let etcd = opts.ownership.etcd.as_ref();
    if remote.is_empty() && etcd.is_none() {
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
    let sb = paths
        .iter()
        .find_map(|p| read_superblock(p, opts))
        .ok_or_else(|| {
            StackError::new(format!(
                "none of the members answers with an md superblock ({})",
                paths
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
    let me = owner::new_owner(&opts.ownership.node).map_err(StackError::new)?;
    // 1. The lease. Not getting it changes nothing anywhere.
    let lease = match etcd {
        Some((etcd, ttl)) => Some(take_lease(etcd, *ttl, &sb, &me)?),
        None => None,
    };
    // 2. The members. Holding the lease proves the previous owner's ran out (or was
    //    given up), so an owner that did not release them is replaced; dropping the
    //    lease on a failure here revokes it.
    let owned = if remote.is_empty() {
        None
    } else {
        let local = paths.len() - remote.len();
        let rules = Rules {
            needed: needed(&sb).saturating_sub(local).max(1),
            force_quorum: opts.force,
            replace_owner: opts.force || lease.is_some(),
        };
        let owned = owner::take_over(sb.set_uuid.0, &me, &members, rules).map_err(|e| match e {
            TakeoverError::Owned { .. } => StackError::new(format!(
                "{e}. Two hosts must never write the same members: if that owner is \
                     gone for good (its host is down, not just unreachable), start with \
                     --force to take the members over (with --etcd, its lease running out \
                     says so)"
            )),
            TakeoverError::Record { ref member, .. } => StackError::new(format!(
                "cannot take ownership of the members: {e}. cairn does not guess who owns \
                 a member whose owner record is damaged (read as \"never owned\" it would \
                 let any host write), and --force does not change that: `cairn md owner \
                 '{member}'` shows it; once you know no other host runs the array, stop its \
                 member server, zero the member's first 4 KiB on the disk host, and start \
                 again"
            )),
            TakeoverError::Refused { .. } => StackError::new(format!(
                "{e}. A member that refuses is a mistake to fix, not a missing member: the \
                 array is not started degraded without it; fix its URI or its server and \
                 start again"
            )),
            _ => StackError::new(format!("cannot take ownership of the members: {e}")),
        })?;
        // A foreign member was warned about already: no record is written to it.
        for m in owned.members.iter().filter(|m| !m.enforced && !m.foreign) {
            tracing::warn!(
                "{}: its server does not enforce owner generations (not a cairn member \
                 server): the record is written, but a former owner could still write{}",
                m.name,
                if lease.is_some() {
                    " if it ignored its lease"
                } else {
                    ""
                }
            );
        }
        Some(owned)
    };
    let devices: HashMap<String, Arc<Client>> = owned
        .iter()
        .flat_map(|o| o.members.iter())
        .map(|m| (m.name.clone(), m.device.clone()))
        .collect();
    let missing = owned
        .iter()
        .flat_map(|o| o.missing.iter())
        .map(PathBuf::from)
        .collect();
    let guard = lease.as_ref().map(Lease::guard);
    let claim = Arc::new(Claim {
        uuid: sb.set_uuid.0,
        export: None,
        owned,
        members,
        lease: Mutex::new(lease),
        guard,
        released: Mutex::new(false),
        array: OnceLock::new(),
    });
    claims().push(claim.clone());
    Ok(Some(Claimed {
        claim,
        devices,
        missing,
    }))
}

/// A 16-byte id for a remote export used whole, in its owner record and its etcd key:
/// two 64-bit FNV-1a hashes of its URI (its query, the TLS files, left out: the same
/// export reached with another key file is the same export).
fn export_id(u: &cairn_nbd::uri::NbdUri) -> [u8; 16] {
    let text = format!("{:?}/{}", u.listen().ok(), u.export);
    let mut out = [0u8; 16];
    for (i, seed) in [0xcbf2_9ce4_8422_2325u64, 0x6c62_272e_07bb_0142]
        .iter()
        .enumerate()
    {
        let mut h = *seed;
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        out[i * 8..i * 8 + 8].copy_from_slice(&h.to_le_bytes());
    }
    out
}

/// A remote export opened writable and used whole, with the connection it runs on.
#[derive(Debug)]
pub struct ClaimedExport {
    pub claim: Arc<Claim>,
    pub device: Arc<Client>,
}

/// Takes ownership of the remote export `path` opened writable and used whole (`serve
/// URI`, `--luks URI`, a PV named by its URI): with an etcd, the export's lease first
/// (`/cairn/exports/<id>/owner`); then the export itself, its record kept beside it by a
/// cairn member server (the export's first bytes are its owner's data). Another owner
/// that did not release it refuses the open, unless the lease is held or `--force`.
/// `None`: nothing to claim (a local path, or opened read-only).
pub fn claim_export(path: &Path, opts: &Options) -> Result<Option<ClaimedExport>> {
    if opts.read_only || !leaf::is_remote(path) {
        return Ok(None);
    }
    let u = leaf::parse_remote(path)?;
    let shown = path.display().to_string();
    let mut o = ClientOptions::from_uri(&u).map_err(|e| StackError::new(format!("{u}: {e}")))?;
    o.timeout = Some(opts.remote_timeout());
    let id = export_id(&u);
    let me = owner::new_owner(&opts.ownership.node).map_err(StackError::new)?;
    let lease = match opts.ownership.etcd.as_ref() {
        Some((etcd, ttl)) => {
            let key = format!("/cairn/exports/{}/owner", uuid_text(&id));
            Some(
                Lease::acquire(etcd, &key, me.to_string().as_bytes(), *ttl).map_err(
                    |err| match err {
                        LeaseError::Held(kv) => StackError::new(format!(
                            "{shown}: the export is owned by {} (etcd lease {:x}); it is \
                                 served by another host",
                            String::from_utf8_lossy(&kv.value),
                            kv.lease
                        )),
                        other => StackError::new(format!(
                            "{shown}: cannot take its ownership lease: {other}"
                        )),
                    },
                )?,
            )
        }
        None => None,
    };
    let replace = opts.force || lease.is_some();
    let owned = owner::take_over_whole(id, &me, &shown, &o, replace).map_err(|e| match e {
        TakeoverError::Owned { .. } => StackError::new(format!(
            "{e}. Two hosts must never write the same export: if that owner is gone for \
             good (its host is down, not just unreachable), start with --force to take it \
             over (with --etcd, its lease running out says so)"
        )),
        TakeoverError::Record { .. } => StackError::new(format!(
            "cannot take ownership of {shown}: {e}. cairn does not guess who owns an export \
             whose owner record is damaged; `cairn md owner '{shown}'` shows it"
        )),
        TakeoverError::Refused { .. } => StackError::new(format!("cannot reach {e}")),
        TakeoverError::Member { .. } => StackError::new(format!("cannot reach {e}")),
        _ => StackError::new(format!("cannot take ownership of {shown}: {e}")),
    })?;
    let device = owned.members[0].device.clone();
    if !read_only_ok(&device) {
        return Err(StackError::new(format!(
            "{u} is read-only on its server; it cannot be written"
        )));
    }
    let guard = lease.as_ref().map(Lease::guard);
    let claim = Arc::new(Claim {
        uuid: id,
        export: Some(path.to_path_buf()),
        owned: Some(owned),
        members: vec![(shown, o)],
        lease: Mutex::new(lease),
        guard,
        released: Mutex::new(false),
        array: OnceLock::new(),
    });
    claims().push(claim.clone());
    Ok(Some(ClaimedExport { claim, device }))
}

fn read_only_ok(c: &Client) -> bool {
    !c.capabilities().read_only
}

fn uuid_text(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}:{}:{}:{}", &h[0..8], &h[8..16], &h[16..24], &h[24..32])
}

/// The claim of the remote export used whole at `path`, if this process holds one: a
/// reconnection to it declares the claim's owner generation and sits behind its lease
/// check, as the first connection did.
pub fn export_claim(path: &Path) -> Option<Arc<Claim>> {
    claims()
        .iter()
        .find(|c| c.export.as_deref() == Some(path))
        .cloned()
}

/// Gives up the claims of the remote exports used whole at `paths` (a stack closed on a
/// failure path: nothing is served from them any more).
pub fn release_exports(paths: &[PathBuf]) {
    let mine: Vec<Arc<Claim>> = {
        let mut all = claims();
        let (mine, rest): (Vec<_>, Vec<_>) = all
            .drain(..)
            .partition(|c| c.export.as_ref().is_some_and(|e| paths.contains(e)));
        *all = rest;
        mine
    };
    for c in mine {
        for (m, e) in c.release() {
            tracing::warn!("{m}: the owner record was not released: {e}");
        }
    }
}

/// The array's etcd lease, taken only by a create-if-absent transaction; a lease held by
/// another host refuses the start with who holds it.
fn take_lease(etcd: &Etcd, ttl: Duration, sb: &Superblock, me: &OwnerId) -> Result<Lease> {
    let uuid = sb.set_uuid.to_string();
    let name = sb.set_name.to_string_lossy();
    Lease::acquire(etcd, &owner_key(&uuid), me.to_string().as_bytes(), ttl).map_err(|err| match err
    {
        LeaseError::Held(_) => StackError::new(format!(
            "md array {name} ({uuid}): {err}; it is served by another host"
        )),
        other => StackError::new(format!(
            "md array {name} ({uuid}): cannot take its ownership lease: {other}"
        )),
    })
}

fn read_superblock(p: &Path, opts: &Options) -> Option<Superblock> {
    let shown = p.display().to_string();
    if leaf::is_remote(p) {
        let c = leaf::open_remote(p, true, opts.remote_timeout()).ok()?;
        let sb = Superblock::read_from(&*c, &shown, FeaturePolicy::Supported).ok();
        if let Ok(c) = Arc::try_unwrap(c) {
            let _ = c.disconnect();
        }
        return sb;
    }
    let dev = leaf::open(p, true, false, opts.remote_timeout()).ok()?;
    Superblock::read_from(&*dev, &shown, FeaturePolicy::Supported).ok()
}
