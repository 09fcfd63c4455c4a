//! md arrays in stacks: members opened, the array assembled (degraded starts warned about
//! once, by role), named as an export and put behind a stripe cache when served writable.
//!
//! ```text
//!   MdSpec (members, name) ─ open_present (missing files noted) ─ Array::assemble
//!     ─ degraded / resync-pending warnings ─ OpenedExport { device: array, layer: Md(array) }
//!     ─ with_stripe_cache (RAID4/5/6 writable): device = StripeCache over the array
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_block::{BlockDevice, ErrorKind};
use cairn_md::{Array, ArrayReport, AssembleOptions, Level, MemberState};

use crate::error::{Result, StackError};
use crate::export::OpenedExport;
use crate::hooks::{Hooks, Options};

fn shown(p: &Path) -> String {
    p.display().to_string()
}

/// An md array name as an export name: mdadm's "host:name" loses its host part, and
/// characters a URI would need escaped become '_'.
pub fn export_name_for(array_name: &str) -> String {
    let base = array_name.rsplit(':').next().unwrap_or(array_name);
    let clean: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.is_empty() || clean.starts_with('.') {
        "md0".into()
    } else {
        clean
    }
}

// ---- opening members ---------------------------------------------------------------

pub fn open_member(
    p: &Path,
    read_only: bool,
    hooks: &Hooks,
    timeout: std::time::Duration,
) -> Result<Arc<dyn BlockDevice>> {
    let dev = crate::leaf::open(p, read_only, false, timeout)?;
    // Counted as the stack node "member:PATH" (cairn top, metrics).
    Ok(hooks.wrap(&format!("member:{}", shown(p)), dev))
}

/// Members as given: the ones that exist, opened, and the paths that do not exist.
struct Members {
    devices: Vec<Arc<dyn BlockDevice>>,
    names: Vec<String>,
    missing: Vec<PathBuf>,
    /// This host's ownership of the remote members (writable arrays on remote members).
    claim: Option<Arc<crate::fence::Claim>>,
}

fn open_present(paths: &[PathBuf], opts: &Options) -> Result<Members> {
    let mut m = Members {
        devices: Vec::new(),
        names: Vec::new(),
        missing: Vec::new(),
        claim: None,
    };
    for (i, p) in paths.iter().enumerate() {
        if paths[..i].contains(p) {
            return Err(StackError::new(format!("{} is given twice", shown(p))));
        }
    }
    // Writable: take the array's lease (with an etcd), then its remote members (raise
    // the owner generation); the connections that declared it are the ones the array
    // runs on.
    let mut claimed = crate::fence::claim(paths, opts)?;
    let opened = open_each(paths, opts, claimed.as_mut(), &mut m);
    m.claim = claimed.map(|c| c.claim);
    let opened = opened.and_then(|()| {
        if m.devices.is_empty() {
            return Err(StackError::new(format!(
                "none of the members exist ({})",
                paths
                    .iter()
                    .map(|p| shown(p))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(())
    });
    if let Err(e) = opened {
        // Nothing was written: the claim goes back at once.
        if let Some(c) = &m.claim {
            crate::fence::abandon(c);
        }
        return Err(e);
    }
    Ok(m)
}

/// Opens each member into `m`: local files here, remote ones from the claim's
/// connections (or connected now, when nothing was claimed).
fn open_each(
    paths: &[PathBuf],
    opts: &Options,
    mut claimed: Option<&mut crate::fence::Claimed>,
    m: &mut Members,
) -> Result<()> {
    let (read_only, hooks) = (opts.read_only, &opts.hooks);
    for p in paths {
        // `None`: missing (the array starts degraded if its level allows).
        let dev: Option<Arc<dyn BlockDevice>> = if !crate::leaf::is_remote(p) {
            if p.exists() {
                Some(crate::leaf::open(
                    p,
                    read_only,
                    false,
                    opts.remote_timeout(),
                )?)
            } else {
                None
            }
        } else if let Some(c) = claimed.as_deref_mut() {
            c.devices
                .remove(&shown(p))
                .map(|d| d as Arc<dyn BlockDevice>)
        } else {
            // A member server that does not answer now leaves the array degraded, as a
            // missing disk does; the supervisor brings it in when it answers.
            match crate::leaf::open_remote(p, read_only, opts.remote_timeout()) {
                Ok(c) => Some(c),
                Err(crate::leaf::RemoteError::Unreachable(e)) => {
                    tracing::warn!("{e}");
                    None
                }
                Err(crate::leaf::RemoteError::Refused(e)) => return Err(e),
            }
        };
        match dev {
            // Counted as the stack node "member:PATH" (cairn top, metrics); below that,
            // the ownership lease is checked before every I/O.
            Some(d) => {
                let d = match claimed.as_deref() {
                    Some(c) => c.claim.fence_device(d),
                    None => d,
                };
                m.devices
                    .push(hooks.wrap(&format!("member:{}", shown(p)), d));
                m.names.push(shown(p));
            }
            None => m.missing.push(p.clone()),
        }
    }
    Ok(())
}

/// Assembles the array on `paths`; missing files make it degraded (the caller warns).
pub fn assemble(paths: &[PathBuf], opts: &Options) -> Result<(Array, Vec<PathBuf>)> {
    assemble_claimed(paths, opts).map(|(a, m, _)| (a, m))
}

/// [`assemble`], with this host's claim on the remote members when it took one.
pub fn assemble_claimed(
    paths: &[PathBuf],
    opts: &Options,
) -> Result<(Array, Vec<PathBuf>, Option<Arc<crate::fence::Claim>>)> {
    let force = opts.force;
    let m = open_present(paths, opts)?;
    let missing = m.missing;
    let claim = m.claim;
    let array = Array::assemble(m.devices, m.names, AssembleOptions { force }).map_err(|e| {
        // Nothing was written: give the members and the lease back at once.
        if let Some(c) = &claim {
            crate::fence::abandon(c);
        }
        let mut msg = format!("cannot assemble the md array: {e}");
        if !missing.is_empty() {
            msg.push_str(&format!(" ({})", files_not_found(&missing)));
        }
        if e.kind() == ErrorKind::Degraded && !force && e.to_string().contains("force") {
            msg.push_str("; --force starts it anyway");
        }
        StackError::new(msg)
    })?;
    Ok((array, missing, claim))
}

/// "member file(s) not found: a, b" (and "member server(s) not answering: nbd://..."),
/// for errors and warnings about missing members.
fn files_not_found(missing: &[PathBuf]) -> String {
    let (remote, local): (Vec<&PathBuf>, Vec<&PathBuf>) =
        missing.iter().partition(|p| crate::leaf::is_remote(p));
    let list = |ps: &[&PathBuf], what: &str, verb: &str| {
        let names: Vec<String> = ps.iter().map(|p| shown(p)).collect();
        let plural = if ps.len() == 1 { "" } else { "s" };
        format!("member {what}{plural} {verb}: {}", names.join(", "))
    };
    let mut parts = Vec::new();
    if !local.is_empty() {
        parts.push(list(&local, "file", "not found"));
    }
    if !remote.is_empty() {
        parts.push(list(&remote, "server", "not answering"));
    }
    parts.join("; ")
}

/// The loud warning for a degraded start, naming what is missing.
pub fn degraded_warning(r: &ArrayReport, missing: &[PathBuf]) -> Option<String> {
    if !r.state.degraded {
        return None;
    }
    // One entry per role that is down (no member in sync in it); a member left out at
    // assembly, or failed and kept in the list, says why beside its role, not as another.
    let roles: Vec<String> = (0..r.raid_devices)
        .filter(|&role| {
            !r.members
                .iter()
                .any(|m| m.role == Some(role) && m.state == MemberState::ActiveSync)
        })
        .map(|role| {
            let rows: Vec<String> = r
                .members
                .iter()
                .filter(|m| m.role == Some(role))
                .filter_map(|m| {
                    let n = m.name.as_ref()?;
                    Some(match &m.reason {
                        Some(why) => format!("{n}: {why}"),
                        None => format!("{n}, {}", m.state.text()),
                    })
                })
                .collect();
            if rows.is_empty() {
                format!("role {role}")
            } else {
                format!("role {role} ({})", rows.join("; "))
            }
        })
        .collect();
    let files = if missing.is_empty() {
        String::new()
    } else {
        format!("; {}", files_not_found(missing))
    };
    let redundancy = match r.level {
        Level::Raid6 if roles.len() == 1 => "it can lose one more member",
        _ => "it has NO redundancy left: one more failure loses data",
    };
    Some(format!(
        "md array {:?} ({}) is running DEGRADED, {} of {} members missing: {}{files}; \
         {redundancy}.{}",
        r.name,
        r.level,
        roles.len(),
        r.raid_devices,
        roles.join(", "),
        if r.members.iter().any(|m| m.state == MemberState::Rebuilding) {
            " A rebuild resumes in the background when it is served writable."
        } else if r.spare_devices > 0 {
            " A spare takes the role over when it is served writable."
        } else {
            " Add a spare while it is served (`cairn md add ARRAY DEVICE`): it is rebuilt \
             in the background."
        }
    ))
}

// ---- serve --md --------------------------------------------------------------------

/// One `--md M1,M2,...[:NAME]` argument, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MdSpec {
    pub members: Vec<PathBuf>,
    pub name: Option<String>,
}

/// Splits `M1,M2,...[:NAME]`. A last member that exists as typed is not split, so paths
/// with colons work when no name is given.
pub fn parse_md_spec(arg: &str) -> Result<MdSpec> {
    let (list, name) = match arg.rsplit_once(':') {
        Some((l, n))
            if !n.contains('/')
                && !n.contains(',')
                && !l.is_empty()
                && !Path::new(arg.rsplit(',').next().unwrap_or("")).exists() =>
        {
            (l, Some(n.to_string()))
        }
        _ => (arg, None),
    };
    let members: Vec<PathBuf> = list.split(',').map(PathBuf::from).collect();
    if members.iter().any(|p| p.as_os_str().is_empty()) {
        return Err(StackError::new(format!(
            "--md {arg:?}: an empty member; give MEMBER,MEMBER,...[:NAME], e.g. \
             --md d0.img,d1.img,d2.img,d3.img:data"
        )));
    }
    if let Some(n) = &name {
        crate::export::parse_spec(&format!("x:{n}"))
            .map_err(|e| StackError::new(format!("--md {arg:?}: {e}")))?;
    }
    Ok(MdSpec { members, name })
}

/// Assembles `spec` for serving, warning loudly when degraded.
pub fn open_export(spec: &MdSpec, opts: &Options) -> Result<OpenedExport> {
    let read_only = opts.read_only;
    let (array, missing, claim) = assemble_claimed(&spec.members, opts)?;
    let report = array.report();
    // Once, through the log: a log file gets it too.
    if let Some(w) = degraded_warning(&report, &missing) {
        tracing::warn!("{w}");
    }
    if report.state.resync_pending {
        tracing::warn!(
            "md array {:?}: resync pending (parity/mirrors not known to match the data); \
             it runs in the background while the array is served writable, and a member \
             lost before it finishes may not be rebuilt correctly",
            report.name
        );
    }
    let name = spec
        .name
        .clone()
        .unwrap_or_else(|| export_name_for(&report.name));
    let array = Arc::new(array);
    crate::fence::watch(&array, claim.as_ref());
    crate::remote::supervise(&array, &spec.members, opts, claim);
    Ok(OpenedExport {
        name,
        path: spec.members[0].clone(),
        device: array.clone(),
        read_only,
        layer: crate::export::Layer::Md(array),
    })
}

/// Puts a served RAID4/5/6 array's data path behind a stripe cache
/// ([`cairn_md::StripeCache`]); `e.layer` keeps the array itself, for status and closing.
/// Other levels, read-only exports and `opts.size` 0 are returned as they are.
pub fn with_stripe_cache(mut e: OpenedExport, opts: cairn_md::StripeCacheOptions) -> OpenedExport {
    let parity = e
        .md()
        .is_some_and(|a| matches!(a.layout(), cairn_md::layout::ArrayLayout::Parity(_)));
    if parity && !e.read_only && opts.size > 0 {
        let cache = cairn_md::StripeCache::new(e.device.clone(), opts);
        tracing::info!(
            "export {}: stripe cache of {} (up to {} full stripes held, for at most {:?})",
            e.name,
            opts.size,
            cache.max_held_stripes(),
            opts.hold
        );
        e.device = Arc::new(cache);
    }
    e
}
