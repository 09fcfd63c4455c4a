//! Remote members that drop off the network and come back.
//!
//! A member named by an NBD URI fails as a disk does: a request it does not answer
//! within the member timeout, a reset connection or a server that went away fails the
//! request, and md fails the member (the array goes on degraded, the failure is
//! recorded in the other members' superblocks). Nothing in md knows the member is
//! remote. This module is the part that does: one supervisor thread per array with
//! remote members, which
//!
//! - notices a remote member that is out of the array (failed while running, or not
//!   answering when the array was assembled),
//! - reconnects in the background with backoff (1 s doubling to 30 s),
//! - and when the server answers again, removes the failed entry and adds the member
//!   back (`mdadm --re-add`): its superblock says which role it held and how far it got,
//!   so md rebuilds only what the write-intent bitmap marks dirty since.
//!
//! The supervisor stops when the array is closed or dropped.
//!
//! A RAID LV whose PVs are remote ([`supervise_lv`]) gets the same: its images are the
//! array's members, an image whose PV's server went away fails alone (its PV's
//! connection is dead), and when that server answers again the PV is reconnected, the
//! image opened over the new connection and re-added into its role, rebuilt from the
//! write-intent bitmap kept in the metadata LVs (only the regions written meanwhile).
//! An image missing when the LV was opened is not re-added: `cairn lvm lvconvert
//! --repair` rebuilds it.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::thread;
use std::time::{Duration, Instant};

use cairn_block::BlockDevice;
use cairn_md::report::{ArrayReport, MemberState};
use cairn_md::Array;

use crate::hooks::Options;
use crate::leaf::{self, RemoteError};

const FIRST_RETRY: Duration = Duration::from_secs(1);
const LONGEST_RETRY: Duration = Duration::from_secs(30);
const TICK: Duration = Duration::from_millis(250);

/// Starts the supervisor of `array` when any of `members` is remote and the array is
/// writable; returns whether one was started.
pub fn supervise(
    array: &Arc<Array>,
    members: &[PathBuf],
    opts: &Options,
    claim: Option<Arc<crate::fence::Claim>>,
) -> bool {
    let remote: Vec<String> = members
        .iter()
        .filter(|p| leaf::is_remote(p))
        .map(|p| p.display().to_string())
        .collect();
    if remote.is_empty() || opts.read_only {
        return false;
    }
    let weak = Arc::downgrade(array);
    let opts = opts.clone();
    let label = array.report().name;
    thread::Builder::new()
        .name(format!("remote-{label}"))
        .spawn(move || run(&weak, &remote, &opts, claim.as_deref()))
        .is_ok()
}

/// Where a remote member stands, as the array reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    /// In the array (in sync, rebuilding, a spare or a replacement).
    In,
    /// Failed while running: its entry must be removed before it is added back.
    Failed,
    /// Not in the array at all (missing at assembly, left out, removed).
    Out,
}

fn standing(report: &ArrayReport, name: &str) -> Standing {
    let mut out = Standing::Out;
    for m in report
        .members
        .iter()
        .filter(|m| m.name.as_deref() == Some(name))
    {
        match m.state {
            MemberState::ActiveSync
            | MemberState::Rebuilding
            | MemberState::Spare
            | MemberState::Replacement => return Standing::In,
            MemberState::Faulty => out = Standing::Failed,
            MemberState::Missing | MemberState::LeftOut => {}
        }
    }
    out
}

struct Retry {
    next: Instant,
    wait: Duration,
    /// The last failure logged, so a long outage logs once per new reason.
    said: Option<String>,
}

impl Retry {
    fn new(now: Instant) -> Retry {
        Retry {
            next: now,
            wait: FIRST_RETRY,
            said: None,
        }
    }

    /// Whether a try is due at `now`; if so, the next one waits twice as long (at most
    /// [`LONGEST_RETRY`]).
    fn due(&mut self, now: Instant) -> bool {
        if now < self.next {
            return false;
        }
        self.next = now + self.wait;
        self.wait = (self.wait * 2).min(LONGEST_RETRY);
        true
    }
}

fn run(weak: &Weak<Array>, remote: &[String], opts: &Options, claim: Option<&crate::fence::Claim>) {
    let mut retries: HashMap<&str, Retry> = HashMap::new();
    let mut said_failed = false;
    loop {
        thread::sleep(TICK);
        let Some(array) = weak.upgrade() else { return };
        if array.is_closed() || array.fenced().is_some() {
            // Fenced: the members are another owner's now; nothing is reconnected.
            return;
        }
        let report = array.report();
        if report.state.failed {
            // Too many members are gone: rebuilding one from the others would invent
            // data. The operator decides (bring them back, assemble again).
            if !said_failed {
                tracing::warn!(
                    "md array {}: failed (too many members gone); remote members are not \
                     re-added automatically: bring their servers back and assemble again",
                    report.name
                );
                said_failed = true;
            }
            continue;
        }
        said_failed = false;
        for name in remote {
            let now = Instant::now();
            match standing(&report, name) {
                Standing::In => {
                    retries.remove(name.as_str());
                    continue;
                }
                Standing::Failed | Standing::Out => {}
            }
            let r = retries
                .entry(name.as_str())
                .or_insert_with(|| Retry::new(now));
            if !r.due(now) {
                continue;
            }
            let path = PathBuf::from(name);
            // A claimed array's members are reconnected under the same owner generation,
            // and checked against the same lease.
            let token = claim.and_then(|c| c.token_for(name));
            let dev = match leaf::open_remote_fenced(&path, false, opts.remote_timeout(), token) {
                Ok(dev) => {
                    let dev = dev as Arc<dyn BlockDevice>;
                    match claim {
                        Some(c) => c.fence_device(dev),
                        None => dev,
                    }
                }
                Err(RemoteError::Unreachable(e) | RemoteError::Refused(e)) => {
                    let e = e.to_string();
                    if r.said.as_deref() != Some(e.as_str()) {
                        tracing::warn!("{}: still out of the array: {e}", name);
                        r.said = Some(e);
                    }
                    continue;
                }
            };
            if array.is_closed() {
                return;
            }
            let dev = opts.hooks.wrap(&format!("member:{name}"), dev);
            match bring_back(&array, name, dev) {
                Ok(msg) => {
                    tracing::warn!("{name} answers again: {msg}");
                    retries.remove(name.as_str());
                }
                Err(e) => {
                    if r.said.as_deref() != Some(e.as_str()) {
                        tracing::warn!("{name} answers again but cannot rejoin: {e}");
                        r.said = Some(e);
                    }
                }
            }
        }
    }
}

/// Starts the supervisor of the RAID LV `lv` when any of its PVs (`pvs`, by their open
/// names) is remote and the LV is writable; returns whether one was started.
pub fn supervise_lv(lv: &Arc<cairn_lvm::LogicalVolume>, pvs: &[PathBuf], opts: &Options) -> bool {
    let remote: Vec<String> = pvs
        .iter()
        .filter(|p| leaf::is_remote(p))
        .map(|p| p.display().to_string())
        .collect();
    if remote.is_empty() || opts.read_only || lv.array().is_none() {
        return false;
    }
    let weak = Arc::downgrade(lv);
    let opts = opts.clone();
    thread::Builder::new()
        .name(format!("remote-lv-{}", lv.name()))
        .spawn(move || run_lv(&weak, &remote, &opts))
        .is_ok()
}

fn run_lv(weak: &Weak<cairn_lvm::LogicalVolume>, remote: &[String], opts: &Options) {
    let mut retries: HashMap<&str, Retry> = HashMap::new();
    loop {
        thread::sleep(TICK);
        let Some(lv) = weak.upgrade() else { return };
        let Some(array) = lv.array() else { return };
        if array.is_closed() || array.fenced().is_some() {
            return;
        }
        if array.report().state.failed {
            // As for md arrays: too many images gone; the operator decides.
            continue;
        }
        let image_pvs = lv.raid_image_pvs();
        for name in remote {
            let waiting = image_pvs
                .iter()
                .enumerate()
                .any(|(i, pvs)| array.is_out(i) && pvs.iter().any(|p| p == name));
            if !waiting {
                retries.remove(name.as_str());
                continue;
            }
            let now = Instant::now();
            let r = retries
                .entry(name.as_str())
                .or_insert_with(|| Retry::new(now));
            if !r.due(now) {
                continue;
            }
            let path = PathBuf::from(name);
            // A PV used whole was claimed: the new connection declares the same owner
            // generation and sits behind the same lease check.
            let claim = crate::fence::export_claim(&path);
            let token = claim.as_ref().and_then(|c| c.token().cloned());
            let dev = match leaf::open_remote_fenced(&path, false, opts.remote_timeout(), token) {
                Ok(dev) => {
                    let dev = dev as Arc<dyn BlockDevice>;
                    match &claim {
                        Some(c) => c.fence_device(dev),
                        None => dev,
                    }
                }
                Err(RemoteError::Unreachable(e) | RemoteError::Refused(e)) => {
                    let e = e.to_string();
                    if r.said.as_deref() != Some(e.as_str()) {
                        tracing::warn!("PV {name} of LV {}: still away: {e}", lv.name());
                        r.said = Some(e);
                    }
                    continue;
                }
            };
            let dev = opts.hooks.wrap(&format!("file:{name}"), dev);
            match lv.raid_pv_returned(name, &dev) {
                Ok(msgs) => {
                    for m in msgs {
                        tracing::warn!("PV {name} answers again: {m}");
                    }
                    retries.remove(name.as_str());
                }
                Err(e) => {
                    let e = e.to_string();
                    if r.said.as_deref() != Some(e.as_str()) {
                        tracing::warn!("PV {name} answers again but its images cannot rejoin: {e}");
                        r.said = Some(e);
                    }
                }
            }
        }
    }
}

/// Removes the failed entry of `name` (if any) and adds `dev` back under that name.
fn bring_back(array: &Array, name: &str, dev: Arc<dyn BlockDevice>) -> Result<String, String> {
    if standing(&array.report(), name) == Standing::Failed {
        array.remove(name).map_err(|e| e.to_string())?;
    }
    let change = array
        .add(dev, name.to_string(), false)
        .map_err(|e| e.to_string())?;
    Ok(change.message)
}
