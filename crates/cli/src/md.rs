//! `cairn md create|examine|detail`, and the `--md` arrays `cairn serve` exports.
//!
//! ```text
//!   create:  check args ─> probe members (refuse signatures) ─> sparse files (--size)
//!            ─> cairn_md::Array::create ─> summary | --json report ─> close (clean)
//!   examine: per member: read-only open ─> Superblock::read_from ─> Examine text | JSON
//!   detail:  read-only open ─> Array::assemble (writes nothing) ─> ArrayReport
//!   serve --md M1,M2,...[:NAME]: open present members ─> assemble (degraded: warn)
//!            ─> OpenedExport; closed (marked clean) when the server stops
//!            ─> with_stripe_cache (RAID4/5/6 served writable): device = StripeCache
//! ```
//!
//! The md crate does the work; this module turns arguments into its calls and its errors
//! into sentences that name the member and say what to do.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_block::{BlockDevice, ErrorKind, FileDisk, OpenOptions};
use cairn_md::{
    probe_signatures, Array, ArrayReport, AssembleOptions, BitmapChoice, CreateOptions, Examine,
    FeaturePolicy, Level, MemberState, ParityAlgorithm, Raid0Layout, Raid10Layout, Sectors,
    Superblock,
};
use serde::Serialize;

use crate::args::{Global, MdCommand, MdCreateArgs, MdDetailArgs, MdExamineArgs};
use crate::error::{CliError, Result};
use crate::exports::OpenedExport;
use crate::size::format_size;

pub fn run(cmd: MdCommand, global: &Global) -> Result<()> {
    match cmd {
        MdCommand::Create(a) => create(a, global),
        MdCommand::Examine(a) => examine(&a, global),
        MdCommand::Detail(a) => detail(&a, global),
        MdCommand::Fail(a) => crate::md_manage::fail(&a, global),
        MdCommand::Remove(a) => crate::md_manage::remove(&a, global),
        MdCommand::Add(a) => crate::md_manage::add(&a, global),
        MdCommand::Replace(a) => crate::md_manage::replace(&a, global),
        MdCommand::Check(a) => crate::md_manage::scrub(&a, false, global),
        MdCommand::Repair(a) => crate::md_manage::scrub(&a, true, global),
    }
}

fn shown(p: &Path) -> String {
    p.display().to_string()
}

// ---- create ------------------------------------------------------------------------

/// The layout word for `text` at `level`, in mdadm's words.
pub fn resolve_layout(level: Level, text: Option<&str>) -> Result<Option<u32>> {
    let Some(text) = text else { return Ok(None) };
    let t = text.to_ascii_lowercase();
    let word = match level {
        Level::Raid5 => ParityAlgorithm::parse_raid5(text).map(ParityAlgorithm::to_raw),
        Level::Raid6 => ParityAlgorithm::parse(text).map(ParityAlgorithm::to_raw),
        // mdadm: "layout not meaningful for raid4 arrays"; the kernel puts parity on the
        // last member whatever the word says.
        Level::Raid4 | Level::Linear | Level::Raid1 => {
            return Err(CliError::new(format!(
                "--layout {text}: {level} has no layout choice{}; leave --layout out",
                if level == Level::Raid4 {
                    " (parity is always on the last member)"
                } else {
                    ""
                }
            )))
        }
        Level::Raid10 => Raid10Layout::parse(&t)
            .filter(|l| l.copies() >= 2)
            .map(Raid10Layout::to_raw),
        Level::Raid0 => match t.as_str() {
            "original" | "default" => Some(Raid0Layout::Original.to_raw()),
            "alternate" => Some(Raid0Layout::Alternate.to_raw()),
            _ => None,
        },
    };
    let hint = match level {
        Level::Raid5 => {
            "left-symmetric (ls), left-asymmetric (la), right-symmetric (rs), \
             right-asymmetric (ra), parity-first, parity-last, ddf-zero-restart, \
             ddf-N-restart, ddf-N-continue"
        }
        Level::Raid6 => {
            "left-symmetric (ls), left-asymmetric (la), right-symmetric (rs), \
             right-asymmetric (ra), parity-first, parity-last, ddf-zero-restart, \
             ddf-N-restart, ddf-N-continue, or a -6 form such as left-symmetric-6"
        }
        Level::Raid10 => "nN (near), fN (far) or oN (offset) with N copies >= 2, e.g. n2, f2, o2",
        _ => "original or alternate",
    };
    word.map(Some)
        .ok_or_else(|| CliError::new(format!("unknown {level} layout {text:?}; use {hint}")))
}

/// The whole `create` argument check, before anything is opened or written.
fn check_create_args(a: &MdCreateArgs) -> Result<Option<u32>> {
    let n = a.members.len();
    if u32::try_from(n).ok() != Some(a.raid_devices) {
        return Err(CliError::new(format!(
            "--raid-devices {} but {n} member{} given ({}); give exactly {} members",
            a.raid_devices,
            if n == 1 { "" } else { "s" },
            a.members
                .iter()
                .map(|p| shown(p))
                .collect::<Vec<_>>()
                .join(", "),
            a.raid_devices
        )));
    }
    let min = a.level.min_raid_disks();
    if a.raid_devices < min {
        return Err(CliError::new(format!(
            "{} needs at least {min} members, not {}",
            a.level, a.raid_devices
        )));
    }
    for (i, p) in a.members.iter().enumerate() {
        if a.members[..i].contains(p) {
            return Err(CliError::new(format!(
                "{} is given twice; each member must be a different file or device",
                shown(p)
            )));
        }
    }
    if a.name.is_empty() || a.name.len() > 32 {
        return Err(CliError::new(format!(
            "--name {:?}: an md array name is 1 to 32 bytes",
            a.name
        )));
    }
    if a.chunk.is_some() && !a.level.uses_chunks() {
        return Err(CliError::new(format!(
            "--chunk: {} does not stripe, so it has no chunk size; leave --chunk out",
            a.level
        )));
    }
    let redundant = !matches!(a.level, Level::Linear | Level::Raid0);
    match (a.bitmap.as_deref(), a.bitmap_chunk) {
        (Some("internal"), _) if !redundant => {
            return Err(CliError::new(format!(
                "--bitmap internal: {} has no redundancy, so there is nothing for a bitmap to \
                 resync; leave --bitmap out",
                a.level
            )))
        }
        (Some("none"), Some(_)) => {
            return Err(CliError::new(
                "--bitmap-chunk with --bitmap none: there is no bitmap to size; drop one",
            ))
        }
        (None, Some(_)) if !redundant => {
            return Err(CliError::new(format!(
                "--bitmap-chunk: {} has no bitmap; leave it out",
                a.level
            )))
        }
        (_, Some(c)) if !c.is_power_of_two() || c < 4096 => {
            return Err(CliError::new(format!(
                "--bitmap-chunk {c}: a bitmap chunk is a power of two of at least 4K (e.g. 64K, \
                 1M, 64M)"
            )))
        }
        _ => {}
    }
    if let Some(size) = a.size {
        if size < 4 << 20 || size % 4096 != 0 {
            return Err(CliError::new(format!(
                "--size {size}: member files need at least 4M, in whole 4K blocks"
            )));
        }
    }
    resolve_layout(a.level, a.layout.as_deref())
}

/// What `create --json` prints: the report plus which member files it made.
#[derive(Debug, Serialize)]
struct Created<'a> {
    created_files: Vec<String>,
    #[serde(flatten)]
    report: &'a ArrayReport,
}

fn create(a: MdCreateArgs, global: &Global) -> Result<()> {
    let layout = check_create_args(&a)?;

    // Which members exist; without --size a missing one is an error before anything
    // is written.
    let mut to_create = Vec::new();
    for p in &a.members {
        match std::fs::metadata(p) {
            Ok(m) if m.is_dir() => {
                return Err(CliError::new(format!(
                    "{} is a directory; give a file or a block device",
                    shown(p)
                )))
            }
            Ok(m) if m.is_file() && m.len() == 0 => {
                return Err(CliError::new(format!(
                    "{} is empty; give it a size first (`truncate -s 1G {}`), or delete it \
                     and use --size",
                    shown(p),
                    shown(p)
                )))
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match a.size {
                Some(_) => to_create.push(p.clone()),
                None => {
                    return Err(CliError::new(format!(
                        "{} does not exist; add --size SIZE (e.g. --size 1G) to create missing \
                         member files sparse, or create it with `truncate -s 1G {}`",
                        shown(p),
                        shown(p)
                    )))
                }
            },
            Err(e) => return Err(CliError::new(format!("cannot open {}: {e}", shown(p)))),
        }
    }

    // Existing members: refuse signatures before any file is created.
    let mut devices: Vec<Option<Arc<dyn BlockDevice>>> = Vec::new();
    let mut found = Vec::new();
    for p in &a.members {
        if to_create.contains(p) {
            devices.push(None);
            continue;
        }
        let dev = open_member(p, false)?;
        if !a.force {
            let sigs = probe_signatures(&*dev)
                .map_err(|e| CliError::new(format!("cannot read {}: {e}", shown(p))))?;
            let what: Vec<String> = sigs.iter().map(ToString::to_string).collect();
            if !what.is_empty() {
                found.push((p.clone(), what.join("; ")));
            }
        }
        devices.push(Some(dev));
    }
    if !found.is_empty() {
        let list: Vec<String> = found
            .iter()
            .map(|(p, w)| format!("{} {w}", shown(p)))
            .collect();
        let paths: Vec<String> = found.iter().map(|(p, _)| shown(p)).collect();
        return Err(CliError::new(format!(
            "refusing to create, members may hold data: {}. Check with `cairn md examine \
             {}` or `blkid`, and add --force to overwrite",
            list.join("; "),
            paths.join(" ")
        )));
    }

    let mut made: Vec<PathBuf> = Vec::new();
    let result = (|| {
        let mut members: Vec<Arc<dyn BlockDevice>> = Vec::new();
        for (p, d) in a.members.iter().zip(devices) {
            let dev = match d {
                Some(d) => d,
                None => {
                    create_sparse(p, a.size.expect("only with --size"))?;
                    made.push(p.clone());
                    open_member(p, false)?
                }
            };
            members.push(dev);
        }
        let names: Vec<String> = a.members.iter().map(|p| shown(p)).collect();
        let mut opts = CreateOptions::new(a.level, a.name.clone());
        opts.layout = layout;
        opts.chunk = a.chunk.map(Sectors::from_bytes_floor);
        // Signatures were checked above with the user's words for the refusal.
        opts.force = true;
        opts.members_zeroed = made.len() == a.members.len();
        opts.assume_clean = a.assume_clean;
        opts.bitmap = match a.bitmap.as_deref() {
            Some("none") => BitmapChoice::None,
            Some(_) => BitmapChoice::Internal {
                chunk_bytes: a.bitmap_chunk,
            },
            None => match BitmapChoice::default_for(a.level) {
                BitmapChoice::Internal { .. } => BitmapChoice::Internal {
                    chunk_bytes: a.bitmap_chunk,
                },
                none => none,
            },
        };
        opts.write_journal = a.write_hole == crate::args::WriteHole::Log;
        let array = Array::create(members, names, &opts)
            .map_err(|e| CliError::new(format!("cannot create the array: {e}")))?;
        array.close().map_err(|e| {
            CliError::new(format!("the array was created but closing it failed: {e}"))
        })?;
        Ok(array.report())
    })();
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            // Nothing half-made is left behind: files this command created go again.
            for p in &made {
                let _ = std::fs::remove_file(p);
            }
            return Err(e);
        }
    };

    if global.json {
        let out = Created {
            created_files: made.iter().map(|p| shown(p)).collect(),
            report: &report,
        };
        println!("{}", serde_json::to_string(&out).expect("serialisable"));
        return Ok(());
    }
    print!("{}", create_summary(&report, &made, &a.members));
    Ok(())
}

fn create_sparse(p: &Path, size: u64) -> Result<()> {
    let fail =
        |e: std::io::Error| CliError::new(format!("cannot create member file {}: {e}", shown(p)));
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(p)
        .map_err(fail)?;
    if let Err(e) = f.set_len(size) {
        // create_new made it just now, so it is this command's to remove (a size the
        // filesystem cannot hold, e.g. --size 100T).
        drop(f);
        let _ = std::fs::remove_file(p);
        return Err(fail(e));
    }
    Ok(())
}

/// The few lines a sysadmin wants after `create`: what was made, and what to do next.
fn create_summary(r: &ArrayReport, made: &[PathBuf], members: &[PathBuf]) -> String {
    let mut s = String::new();
    let layout = r
        .layout
        .as_deref()
        .map(|l| format!(", {l}"))
        .unwrap_or_default();
    let chunk = r
        .chunk_kib
        .map(|c| format!(", {c}K chunk"))
        .unwrap_or_default();
    s.push_str(&format!(
        "Created md array {:?}: {}{layout}{chunk}, {} members, {} usable\n",
        r.name,
        r.level,
        r.raid_devices,
        format_size(r.array_size_bytes)
    ));
    s.push_str(&format!("  UUID   {}\n", r.uuid));
    let state = if r.state.resync_pending {
        "resync pending (members held data, so parity/mirrors are not known to match; \
         `cairn serve` resyncs the array in the background, or use --assume-clean if \
         you know they match)"
            .to_string()
    } else {
        format!("{} (no initial sync needed)", r.state_text)
    };
    s.push_str(&format!("  State  {state}\n"));
    match &r.bitmap {
        Some(b) => s.push_str(&format!(
            "  Bitmap internal, {} per bit ({} bits): after a crash only written regions resync\n",
            format_size(b.chunk_bytes),
            b.chunks
        )),
        None => s.push_str("  Bitmap none\n"),
    }
    if let (Some(c), Some(data)) = (r.chunk_kib, data_members(r)) {
        let full = c * data;
        s.push_str(&format!(
            "  Full stripe {full}K ({data} data member{} x {c}K): for ext4, \
             mkfs.ext4 -E stride={},stripe-width={}\n",
            if data == 1 { "" } else { "s" },
            c / 4,
            full / 4
        ));
    }
    s.push_str("  Role  Member\n");
    for m in &r.members {
        let role = m.role.map_or("-".to_string(), |r| r.to_string());
        let name = m.name.clone().unwrap_or_default();
        let new = if made.iter().any(|p| shown(p) == name) {
            "  (created, sparse)"
        } else {
            ""
        };
        s.push_str(&format!("  {role:>4}  {name}{new}\n"));
    }
    let list: Vec<String> = members.iter().map(|p| shown(p)).collect();
    s.push_str(&format!(
        "\nNext:\n  cairn md examine {}\n  cairn serve --md {}:{}\n",
        list.join(" "),
        list.join(","),
        export_name_for(&r.name)
    ));
    s
}

/// Members holding data in each stripe, for the levels with a full-stripe size.
fn data_members(r: &ArrayReport) -> Option<u64> {
    let n = u64::from(r.raid_devices);
    match r.level {
        Level::Raid0 => Some(n),
        Level::Raid4 | Level::Raid5 => Some(n - 1),
        Level::Raid6 => Some(n - 2),
        Level::Raid10 => {
            let l = Raid10Layout::from_raw(r.layout_word).ok()?;
            Some((n / u64::from(l.near)).max(1))
        }
        Level::Linear | Level::Raid1 => None,
    }
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

fn open_member(p: &Path, read_only: bool) -> Result<Arc<dyn BlockDevice>> {
    let opts = OpenOptions {
        read_only,
        direct: false,
        create_size: None,
    };
    let disk = FileDisk::open(p, &opts).map_err(|e| match e.kind() {
        ErrorKind::ReadOnly if !read_only => CliError::new(format!(
            "cannot open {} for writing ({e}); fix its permissions",
            shown(p)
        )),
        ErrorKind::Busy => crate::owner::busy(&shown(p), &e),
        _ => CliError::new(format!("cannot open {}: {e}", shown(p))),
    })?;
    crate::owner::note_reader(&shown(p), &disk);
    // Counted as the stack node "member:PATH" (cairn top, metrics).
    Ok(crate::daemon::wrap_member(&shown(p), Arc::new(disk)))
}

/// Members as given: the ones that exist, opened, and the paths that do not exist.
struct Members {
    devices: Vec<Arc<dyn BlockDevice>>,
    names: Vec<String>,
    missing: Vec<PathBuf>,
}

fn open_present(paths: &[PathBuf], read_only: bool) -> Result<Members> {
    let mut m = Members {
        devices: Vec::new(),
        names: Vec::new(),
        missing: Vec::new(),
    };
    for (i, p) in paths.iter().enumerate() {
        if paths[..i].contains(p) {
            return Err(CliError::new(format!("{} is given twice", shown(p))));
        }
        if !p.exists() {
            m.missing.push(p.clone());
            continue;
        }
        m.devices.push(open_member(p, read_only)?);
        m.names.push(shown(p));
    }
    if m.devices.is_empty() {
        return Err(CliError::new(format!(
            "none of the members exist ({})",
            paths
                .iter()
                .map(|p| shown(p))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(m)
}

/// Assembles the array on `paths`; missing files make it degraded (the caller warns).
fn assemble(paths: &[PathBuf], read_only: bool, force: bool) -> Result<(Array, Vec<PathBuf>)> {
    let m = open_present(paths, read_only)?;
    let missing = m.missing;
    let array = Array::assemble(m.devices, m.names, AssembleOptions { force }).map_err(|e| {
        let mut msg = format!("cannot assemble the md array: {e}");
        if !missing.is_empty() {
            msg.push_str(&format!(" ({})", files_not_found(&missing)));
        }
        if e.kind() == ErrorKind::Degraded && !force && e.to_string().contains("force") {
            msg.push_str("; --force starts it anyway");
        }
        CliError::new(msg)
    })?;
    Ok((array, missing))
}

/// "member file(s) not found: a, b", for errors and warnings about missing members.
fn files_not_found(missing: &[PathBuf]) -> String {
    let names: Vec<String> = missing.iter().map(|p| shown(p)).collect();
    let plural = if missing.len() == 1 { "" } else { "s" };
    format!("member file{plural} not found: {}", names.join(", "))
}

/// The loud warning for a degraded start, naming what is missing.
fn degraded_warning(r: &ArrayReport, missing: &[PathBuf]) -> Option<String> {
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
        return Err(CliError::new(format!(
            "--md {arg:?}: an empty member; give MEMBER,MEMBER,...[:NAME], e.g. \
             --md d0.img,d1.img,d2.img,d3.img:data"
        )));
    }
    if let Some(n) = &name {
        crate::exports::parse_spec(&format!("x:{n}"))
            .map_err(|e| CliError::new(format!("--md {arg:?}: {e}")))?;
    }
    Ok(MdSpec { members, name })
}

/// Assembles `spec` for serving, warning loudly when degraded.
pub fn open_export(spec: &MdSpec, read_only: bool, force: bool) -> Result<OpenedExport> {
    let (array, missing) = assemble(&spec.members, read_only, force)?;
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
    Ok(OpenedExport {
        name,
        path: spec.members[0].clone(),
        device: array.clone(),
        read_only,
        md: Some(array),
        luks: None,
        base: None,
        lvm: None,
    })
}

/// Puts a served RAID4/5/6 array's data path behind a stripe cache
/// ([`cairn_md::StripeCache`]); `e.md` stays the array itself, for status and closing.
/// Other levels, read-only exports and `opts.size` 0 are returned as they are.
pub fn with_stripe_cache(mut e: OpenedExport, opts: cairn_md::StripeCacheOptions) -> OpenedExport {
    let parity =
        e.md.as_ref()
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

// ---- examine -----------------------------------------------------------------------

#[derive(Debug, Serialize)]
struct Examined {
    member: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    examine: Option<Examine>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

fn examine_one(p: &Path) -> std::result::Result<Examine, String> {
    let dev = open_member(p, true).map_err(|e| e.to_string())?;
    let name = shown(p);
    let sb = Superblock::read_from(&*dev, &name, FeaturePolicy::KnownToMd).map_err(|e| {
        if e.kind() == ErrorKind::Corrupt || e.kind() == ErrorKind::InvalidArgument {
            e.to_string()
        } else {
            format!("cannot read the md superblock: {e}")
        }
    })?;
    Ok(Examine::new(
        &sb,
        Some(Sectors::from_bytes_floor(dev.geometry().size)),
    ))
}

fn examine(a: &MdExamineArgs, global: &Global) -> Result<()> {
    let mut results = Vec::new();
    let mut bad = 0;
    for p in &a.members {
        let r = examine_one(p);
        if !global.json {
            match &r {
                Ok(ex) => print!("{}:\n{ex}\n", shown(p)),
                Err(e) => eprintln!("cairn: md examine: {e}"),
            }
        }
        if r.is_err() {
            bad += 1;
        }
        let (examine, error) = match r {
            Ok(e) => (Some(e), None),
            Err(e) => (None, Some(e)),
        };
        results.push(Examined {
            member: shown(p),
            examine,
            error,
        });
    }
    if global.json {
        println!("{}", serde_json::to_string(&results).expect("serialisable"));
        for r in &results {
            if let Some(e) = &r.error {
                eprintln!("cairn: md examine: {e}");
            }
        }
    }
    if bad > 0 {
        return Err(CliError::new(format!(
            "{bad} of {} member{} had no usable md superblock (see above)",
            a.members.len(),
            if a.members.len() == 1 { "" } else { "s" }
        )));
    }
    Ok(())
}

// ---- detail ------------------------------------------------------------------------

fn detail(a: &MdDetailArgs, global: &Global) -> Result<()> {
    // Read-only members: assembly and the close on drop cannot write anything.
    let (array, missing) = assemble(&a.members, true, a.force)?;
    let report = array.report();
    if global.json {
        println!("{}", serde_json::to_string(&report).expect("serialisable"));
    } else {
        print!("{}", detail_text(&report));
    }
    if let Some(w) = degraded_warning(&report, &missing) {
        eprintln!("cairn: warning: {w}");
    }
    Ok(())
}

/// `mdadm --detail`'s layout: a header line naming the array, then the report.
pub fn detail_text(r: &ArrayReport) -> String {
    format!("md array {}:\n{r}", r.name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md_specs() {
        let s = parse_md_spec("a.img,b.img,c.img:data").unwrap();
        assert_eq!(s.members.len(), 3);
        assert_eq!(s.name.as_deref(), Some("data"));
        let s = parse_md_spec("/x/a.img,/x/b.img").unwrap();
        assert_eq!(
            s.members,
            [PathBuf::from("/x/a.img"), PathBuf::from("/x/b.img")]
        );
        assert_eq!(s.name, None);
        assert!(parse_md_spec("a.img,,b.img").is_err());
        assert!(parse_md_spec("a.img,b.img:bad name").is_err());
    }

    #[test]
    fn layouts_in_mdadm_words() {
        assert_eq!(resolve_layout(Level::Raid5, Some("la")).unwrap(), Some(0));
        assert_eq!(
            resolve_layout(Level::Raid6, Some("left-symmetric")).unwrap(),
            Some(2)
        );
        assert_eq!(
            resolve_layout(Level::Raid10, Some("f2")).unwrap(),
            Some(0x201)
        );
        assert_eq!(
            resolve_layout(Level::Raid10, Some("o2")).unwrap(),
            Some(0x10201)
        );
        assert_eq!(resolve_layout(Level::Raid5, None).unwrap(), None);
        let e = resolve_layout(Level::Raid5, Some("left-symmetric-6"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("left-symmetric (ls)"), "{e}");
        assert!(resolve_layout(Level::Raid1, Some("n2")).is_err());
        assert!(resolve_layout(Level::Raid10, Some("n1")).is_err());
        // mdadm's spelling has a capital N; lower case works too.
        for (word, raw) in [
            ("ddf-zero-restart", 8),
            ("ddf-N-restart", 9),
            ("ddf-n-restart", 9),
            ("ddf-N-continue", 10),
            ("DDF-N-CONTINUE", 10),
        ] {
            assert_eq!(
                resolve_layout(Level::Raid6, Some(word)).unwrap(),
                Some(raw),
                "{word}"
            );
        }
        // For RAID5 mdadm's r5layout table maps the DDF names onto md layouts.
        for (word, raw) in [
            ("ddf-zero-restart", 1),
            ("ddf-N-restart", 0),
            ("ddf-N-continue", 2),
        ] {
            assert_eq!(
                resolve_layout(Level::Raid5, Some(word)).unwrap(),
                Some(raw),
                "{word}"
            );
        }
        // RAID4 takes no layout, as in mdadm; the message says why.
        for word in ["parity-first", "parity-last"] {
            let e = resolve_layout(Level::Raid4, Some(word))
                .unwrap_err()
                .to_string();
            assert!(e.contains("no layout choice"), "{e}");
        }
    }

    #[test]
    fn export_names_from_array_names() {
        assert_eq!(export_name_for("myhost:data"), "data");
        assert_eq!(export_name_for("md0"), "md0");
        assert_eq!(export_name_for("a b"), "a_b");
        assert_eq!(export_name_for(""), "md0");
    }
}
