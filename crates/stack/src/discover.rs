//! Stack discovery: `cairn serve --scan PATH...` and `cairn scan PATH...`.
//!
//! ```text
//!   PATH...  ─ candidates: a file or block device as given; a directory's regular files
//!              and block devices (not hidden, not empty, not the key file or key dir,
//!              no descent into subdirectories)
//!            ─ probe, read-only ─> md 1.2 member | LUKS | LVM2 PV | something else | nothing
//!   md members, grouped by array UUID ─ md::open_export (degraded: warned; dirty and
//!              degraded: refused unless --force) ─ probe the array: LUKS? LVM2 PV?
//!   LUKS on a file or an array ─ key: --key-dir DIR/<uuid>[.key], --key-file, the
//!              terminal; none: skipped with a warning ─ luks::open_export
//!   LVM2 PVs (files, arrays, LUKS payloads) ─ grouped by VG ─ volumes::open_lv_exports
//!              ─ one export per LV, "VG/LV"; a VG missing a PV is skipped with the reason
//!   ─> exports with unique names, and a ScanReport of what was found and skipped, and why
//! ```
//!
//! Probing only reads. md superblocks are written only when an array is then served
//! writable, exactly as `serve --md` does; `cairn scan` and `--read-only` write nothing.
//! A directory scan exports recognised stacks only; a file named on its own with no
//! signature is exported as a plain disk, as `cairn serve FILE` would.

use std::collections::{BTreeMap, HashSet};
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_block::{BlockDevice, Error};
use serde::Serialize;

use crate::error::{Result, StackError};
use crate::export::Layer;
use crate::export::{self as exports, ExportSpec, OpenedExport};
use crate::hooks::{Hooks, Options};
use crate::luks::{describe_locked, key_sources, luks_uuid, unlock_with, KeyCache};
use crate::md::{self, MdSpec};
use crate::size::format_size;

/// How to scan, and what to do with what is found.
#[derive(Debug, Clone, Default)]
pub struct ScanOptions {
    /// Serve everything read-only (nothing is written, not even md superblocks).
    pub read_only: bool,
    /// Start md arrays that are degraded and were not shut down cleanly.
    pub force: bool,
    /// Open plain files with O_DIRECT.
    pub direct: bool,
    /// One passphrase for every LUKS volume without a file in `key_dir`.
    pub key_file: Option<PathBuf>,
    /// Passphrases by LUKS UUID: `DIR/<uuid>` or `DIR/<uuid>.key`.
    pub key_dir: Option<PathBuf>,
    /// Only look (`cairn scan`, `cairn advise --scan`): arrays assembled read-only, LUKS
    /// headers read but never unlocked, no passphrase asked for.
    pub dry_run: bool,
    /// Export names already used by other arguments; found stacks avoid them.
    pub taken_names: Vec<String>,
    /// Put over the RAID4/5/6 arrays found, when writable (`md::with_stripe_cache`).
    pub stripe_cache: cairn_md::StripeCacheOptions,
    /// Statistics, and the person to ask for passphrases (none: key files only).
    pub hooks: Hooks,
    /// Owner name and etcd lease for the arrays opened writable.
    pub ownership: crate::hooks::Ownership,
}

impl ScanOptions {
    /// How each stack found is opened.
    fn open_options(&self, direct: bool) -> Options {
        Options {
            read_only: self.read_only || self.dry_run,
            direct,
            force: self.force,
            stripe_cache: Some(self.stripe_cache),
            remote_timeout: None,
            speed_limits: None,
            ownership: self.ownership.clone(),
            hooks: self.hooks.clone(),
        }
    }
}

/// What a scan found, brought up and left alone.
#[derive(Debug, Default, Serialize)]
pub struct ScanReport {
    /// Every candidate, with what its first bytes say it is.
    pub devices: Vec<Probed>,
    /// One per export brought up (or, for a dry run, that would be).
    pub exports: Vec<StackSummary>,
    pub skipped: Vec<Skipped>,
    /// Things worth knowing that are not failures (renamed exports, LVM not built in).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Probed {
    pub path: String,
    pub size: u64,
    /// "md member", "LUKS", "LVM2 PV", "other", "none", "unreadable".
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Skipped {
    /// A path, or "md array NAME (UUID)".
    pub what: String,
    pub reason: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct StackSummary {
    pub name: String,
    pub size: u64,
    /// Top down: "LUKS2 ...", "md raid6 ...", "file ...".
    pub layers: Vec<String>,
    /// The files and block devices underneath.
    pub paths: Vec<String>,
    /// Where the LUKS passphrase came from (or, for a dry run, would come from).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// "clean", "active, degraded", ... for md; "plain" for a file.
    pub state: String,
}

impl ScanReport {
    fn skip(&mut self, what: impl Into<String>, reason: impl Into<String>) {
        self.skipped.push(Skipped {
            what: what.into(),
            reason: reason.into(),
        });
    }

    /// The report as `cairn: scan: ...` lines for stderr (skips and notes only).
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .skipped
            .iter()
            .filter(|s| !s.reason.starts_with("hidden"))
            .map(|s| format!("scan: skipped {}: {}", s.what, s.reason))
            .collect();
        out.extend(self.notes.iter().map(|n| format!("scan: {n}")));
        out
    }

    /// `cairn scan`'s human output.
    pub fn text(&self) -> String {
        let mut s = String::new();
        s.push_str(&format!(
            "Found {} device{}:\n",
            self.devices.len(),
            plural(self.devices.len())
        ));
        for d in &self.devices {
            let detail = d
                .detail
                .as_deref()
                .map(|x| format!(": {x}"))
                .unwrap_or_default();
            s.push_str(&format!(
                "  {}  {}  {}{detail}\n",
                d.path,
                format_size(d.size),
                d.kind
            ));
        }
        s.push_str(&format!(
            "\nWould export {} stack{}:\n",
            self.exports.len(),
            plural(self.exports.len())
        ));
        for e in &self.exports {
            let key = e
                .key
                .as_deref()
                .map(|k| format!("; key: {k}"))
                .unwrap_or_default();
            s.push_str(&format!(
                "  {}  {}  {}  [{}]{key}\n",
                e.name,
                format_size(e.size),
                e.layers.join(" over "),
                e.state
            ));
        }
        if !self.skipped.is_empty() {
            s.push_str("\nSkipped:\n");
            for k in &self.skipped {
                s.push_str(&format!("  {}: {}\n", k.what, k.reason));
            }
        }
        if !self.notes.is_empty() {
            s.push_str("\nNotes:\n");
            for n in &self.notes {
                s.push_str(&format!("  {n}\n"));
            }
        }
        s
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn shown(p: &Path) -> String {
    p.display().to_string()
}

// ---- candidates --------------------------------------------------------------------

/// A file or block device to probe; `explicit` when named on its own, not found in a
/// directory.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Candidate {
    path: PathBuf,
    explicit: bool,
}

fn same_file(a: &Path, b: Option<&Path>) -> bool {
    let Some(b) = b else { return false };
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => false,
    }
}

/// Smaller files hold no stack: an md 1.2 superblock alone ends at 8 KiB.
const MIN_SIZE: u64 = 8192;

/// The files and block devices under `paths`, in a stable order, without duplicates.
fn candidates(
    paths: &[PathBuf],
    opts: &ScanOptions,
    report: &mut ScanReport,
) -> Result<Vec<Candidate>> {
    let mut out: Vec<Candidate> = Vec::new();
    let mut seen: HashSet<PathBuf> = HashSet::new();
    let mut push = |path: PathBuf, explicit: bool, out: &mut Vec<Candidate>| {
        let key = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
        if seen.insert(key) {
            out.push(Candidate { path, explicit });
        }
    };
    for p in paths {
        if crate::leaf::is_remote(p) {
            // A remote export is probed like a named file; it is read when probed.
            crate::leaf::parse_remote(p).map_err(|e| StackError::new(format!("scan: {e}")))?;
            push(p.clone(), true, &mut out);
            continue;
        }
        let meta = std::fs::metadata(p)
            .map_err(|e| StackError::new(format!("scan: cannot look at {}: {e}", shown(p))))?;
        if !meta.is_dir() {
            let ft = meta.file_type();
            if !(ft.is_file() || ft.is_block_device()) {
                return Err(StackError::new(format!(
                    "scan: {} is neither a file, a block device nor a directory",
                    shown(p)
                )));
            }
            if ft.is_file() && meta.len() == 0 {
                report.skip(shown(p), "empty file");
                continue;
            }
            push(p.clone(), true, &mut out);
            continue;
        }
        let mut entries: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(|e| {
                StackError::new(format!("scan: cannot read the directory {}: {e}", shown(p)))
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .collect();
        entries.sort();
        for e in entries {
            let hidden = e
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with('.'));
            if hidden {
                report.skip(shown(&e), "hidden file");
                continue;
            }
            if same_file(&e, opts.key_dir.as_deref()) {
                report.skip(shown(&e), "the key directory");
                continue;
            }
            if same_file(&e, opts.key_file.as_deref()) {
                report.skip(shown(&e), "the key file");
                continue;
            }
            let Ok(meta) = std::fs::metadata(&e) else {
                report.skip(shown(&e), "cannot be read (a dangling link?)");
                continue;
            };
            let ft = meta.file_type();
            if meta.is_dir() {
                report.skip(
                    shown(&e),
                    "a directory (the scan does not descend; name it to scan it)",
                );
            } else if ft.is_file() && meta.len() == 0 {
                report.skip(shown(&e), "empty file");
            } else if ft.is_file() && meta.len() < MIN_SIZE {
                report.skip(
                    shown(&e),
                    format!(
                        "too small ({} bytes) to hold an md, LUKS or LVM2 stack",
                        meta.len()
                    ),
                );
            } else if ft.is_file() || ft.is_block_device() {
                push(e, false, &mut out);
            } else {
                report.skip(shown(&e), "neither a file nor a block device");
            }
        }
    }
    Ok(out)
}

// ---- probing -----------------------------------------------------------------------

/// What a device's first bytes say.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    /// An md v1.2 member: array UUID and name.
    Md {
        uuid: String,
        name: String,
    },
    Luks(u16),
    LvmPv,
    /// Signatures cairn does not assemble (md 1.0/1.1/0.90, filesystems, ...).
    Other(String),
    Nothing,
}

fn open_ro(p: &Path) -> Result<Arc<dyn BlockDevice>> {
    crate::leaf::open(p, true, false, crate::leaf::DEFAULT_REMOTE_TIMEOUT)
}

/// Classifies one device. md comes first: an md 1.0 member's data starts at sector 0, so
/// a RAID1 member also shows the array's LUKS header or LVM label there.
fn probe(dev: &dyn BlockDevice, name: &str) -> Result<Found, Error> {
    let found = cairn_block::probe::probe(dev)?;
    let kinds: Vec<&str> = found.signatures.iter().map(|s| s.kind.describe()).collect();
    if kinds.contains(&"md superblock 1.2") {
        return match cairn_md::Superblock::read_from(dev, name, cairn_md::FeaturePolicy::Supported)
        {
            Ok(sb) => Ok(Found::Md {
                uuid: sb.set_uuid.to_string(),
                name: sb.set_name.to_string(),
            }),
            Err(e) => Ok(Found::Other(format!(
                "an md superblock 1.2 cairn cannot use: {e}"
            ))),
        };
    }
    if let Some(k) = kinds.iter().find(|k| k.starts_with("md superblock")) {
        return Ok(Found::Other(format!(
            "an {k} (cairn assembles md superblock 1.2 arrays only)"
        )));
    }
    if let Some(v) = found.luks_version() {
        return Ok(Found::Luks(v));
    }
    if found.has_lvm_label() {
        return Ok(Found::LvmPv);
    }
    match kinds.first() {
        Some(k) => Ok(Found::Other(format!("an {k}"))),
        None => Ok(Found::Nothing),
    }
}

// ---- LVM2 ----------------------------------------------------------------------------

/// A device carrying an LVM2 PV label: a file, an md array or a LUKS payload.
#[derive(Debug)]
struct PvCandidate {
    shown: String,
    /// The export serving this device as it is, when it is an array or LUKS payload; a
    /// bare file PV has none.
    export: Option<OpenedExport>,
    /// The file or block device, for a bare file PV.
    file: Option<PathBuf>,
}

/// LVM2 volume groups on the PVs the scan found: grouped by VG, each VG opened from its
/// PVs, each LV exported as `VG/LV` (crate::volumes). A VG that cannot be opened (a PV
/// missing, unreadable metadata) is skipped with the reason, its PVs named.
fn assemble_lvm(
    pvs: Vec<PvCandidate>,
    open: &Options,
    report: &mut ScanReport,
) -> Vec<OpenedExport> {
    let read_only = open.read_only;
    // Open bare file PVs; group every PV stack by its VG.
    let mut groups = crate::lvm::VgGroups::default();
    // How the report names each PV stack, by its device.
    let mut shown_of: Vec<(Arc<dyn BlockDevice>, String)> = Vec::new();
    for pv in pvs {
        let e = match (pv.export, &pv.file) {
            (Some(e), _) => e,
            (None, Some(path)) => {
                let spec = ExportSpec {
                    path: path.clone(),
                    name: String::new(),
                };
                match exports::open(&spec, open) {
                    Ok(e) => e,
                    Err(err) => {
                        report.skip(pv.shown, err.to_string());
                        continue;
                    }
                }
            }
            (None, None) => continue,
        };
        match crate::lvm::vg_of(&e) {
            Ok(vg) => {
                shown_of.push((e.device.clone(), pv.shown));
                groups.add(vg, e);
            }
            Err(err) => report.skip(pv.shown, err.to_string()),
        }
    }
    let mut out = Vec::new();
    for (vg_name, stacks) in groups.into_groups() {
        let shown: Vec<String> = stacks
            .iter()
            .map(|e| e.path.display().to_string())
            .collect();
        match crate::lvm::open_vg_exports(&vg_name, stacks, read_only) {
            Ok(lvs) => {
                // RAID LVs on remote PVs: their images come back with their PVs.
                for e in &lvs {
                    if let Some(lv) = e.lvm() {
                        let pvs: Vec<std::path::PathBuf> =
                            lv.pvs.iter().flat_map(OpenedExport::leaves).collect();
                        crate::remote::supervise_lv(&lv.volume, &pvs, open);
                    }
                }
                out.extend(lvs);
            }
            Err(err) => {
                for s in shown {
                    report.skip(s, err.to_string());
                }
            }
        }
    }
    out
}

// ---- the scan ------------------------------------------------------------------------

/// Unique export names: a clash gets "-2", "-3", ... and a note.
#[derive(Debug)]
struct Names {
    taken: HashSet<String>,
}

impl Names {
    fn claim(&mut self, base: &str, what: &str, report: &mut ScanReport) -> String {
        let mut name = base.to_string();
        let mut n = 2;
        while self.taken.contains(&name) {
            name = format!("{base}-{n}");
            n += 1;
        }
        if name != base {
            report.notes.push(format!(
                "export name {base:?} is already taken, so {what} is exported as {name:?}"
            ));
        }
        self.taken.insert(name.clone());
        name
    }
}

/// The export name a file gives: its stem, made URI-safe if need be.
fn file_export_name(p: &Path) -> String {
    match exports::parse_spec(&shown(p)) {
        Ok(s) if s.path == p => s.name,
        _ => md::export_name_for(
            &p.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_default(),
        ),
    }
}

/// Scans `paths`, assembles what it finds bottom-up and returns the exports, with a report.
pub fn scan(paths: &[PathBuf], opts: &ScanOptions) -> Result<(Vec<OpenedExport>, ScanReport)> {
    let mut report = ScanReport::default();
    let cands = candidates(paths, opts, &mut report)?;
    let mut names = Names {
        taken: opts.taken_names.iter().cloned().collect(),
    };
    let mut keys = KeyCache::new(opts.hooks.prompt.clone());
    // (LUKS UUID, where its key came from), for the report.
    let mut key_texts: Vec<(String, String)> = Vec::new();
    let terminal = !opts.dry_run && opts.hooks.prompt.is_some();

    // Probe everything first, read-only; group md members by array.
    let mut arrays: BTreeMap<String, (String, Vec<PathBuf>)> = BTreeMap::new();
    let mut singles: Vec<(Candidate, Found)> = Vec::new();
    for c in cands {
        let name = shown(&c.path);
        let found = open_ro(&c.path).and_then(|d| {
            let size = d.geometry().size;
            probe(&*d, &name)
                .map(|f| (f, size))
                .map_err(|e| StackError::new(format!("cannot read {name}: {e}")))
        });
        let (found, size) = match found {
            Ok(x) => x,
            Err(e) => {
                report.devices.push(Probed {
                    path: name.clone(),
                    size: 0,
                    kind: "unreadable".into(),
                    detail: Some(e.to_string()),
                });
                report.skip(name, e.to_string());
                continue;
            }
        };
        let (kind, detail) = match &found {
            Found::Md { uuid, name } => ("md member", Some(format!("array {name} ({uuid})"))),
            Found::Luks(v) => ("LUKS", Some(format!("LUKS{v}"))),
            Found::LvmPv => ("LVM2 PV", None),
            Found::Other(what) => ("other", Some(what.clone())),
            Found::Nothing => ("none", None),
        };
        report.devices.push(Probed {
            path: name.clone(),
            size,
            kind: kind.into(),
            detail,
        });
        match found {
            Found::Md { uuid, name: array } => {
                arrays
                    .entry(uuid)
                    .or_insert_with(|| (array, Vec::new()))
                    .1
                    .push(c.path);
            }
            f => singles.push((c, f)),
        }
    }

    let mut out: Vec<OpenedExport> = Vec::new();
    let mut pvs: Vec<PvCandidate> = Vec::new();

    // md arrays, then what is on them.
    for (uuid, (array_name, mut members)) in arrays {
        members.sort();
        let what = format!("md array {array_name} ({uuid})");
        let spec = MdSpec {
            members: members.clone(),
            name: None,
        };
        let e = match md::open_export(&spec, &opts.open_options(false)) {
            Ok(e) => md::with_stripe_cache(e, opts.stripe_cache),
            Err(err) => {
                let on: Vec<String> = members.iter().map(|p| shown(p)).collect();
                report.skip(format!("{what} on {}", on.join(", ")), err.to_string());
                continue;
            }
        };
        let shown_array = format!(
            "the md array {} on {}",
            array_name,
            members
                .iter()
                .map(|p| shown(p))
                .collect::<Vec<_>>()
                .join(", ")
        );
        let base = md::export_name_for(&array_name);
        match stack_on(
            e,
            &shown_array,
            &base,
            opts,
            &mut keys,
            terminal,
            &mut report,
            &mut key_texts,
        ) {
            Ok(Some((e, lvm))) => {
                let mut e = e;
                e.name = names.claim(&e.name, &what, &mut report);
                if lvm {
                    pvs.push(PvCandidate {
                        shown: shown_array,
                        export: Some(e),
                        file: None,
                    });
                } else {
                    out.push(e);
                }
            }
            Ok(None) => {}
            Err(err) => report.skip(what, err.to_string()),
        }
    }

    // Files and block devices on their own.
    for (c, found) in singles {
        let name = shown(&c.path);
        match found {
            Found::Md { .. } => unreachable!("grouped above"),
            Found::Other(what) => report.skip(
                name,
                if c.explicit {
                    format!(
                        "it holds {what}, which cairn does not assemble; serve it as a plain \
                         disk with `cairn serve {}` if that is what you want",
                        c.path.display()
                    )
                } else {
                    format!("it holds {what}, which cairn does not assemble")
                },
            ),
            Found::Nothing if !c.explicit => report.skip(
                name,
                "no md, LUKS or LVM2 signature (a directory scan exports recognised stacks \
                 only; name the file to export it as a plain disk)",
            ),
            Found::LvmPv => pvs.push(PvCandidate {
                shown: name,
                export: None,
                file: Some(c.path.clone()),
            }),
            Found::Nothing | Found::Luks(_) => {
                let spec = ExportSpec {
                    path: c.path.clone(),
                    name: file_export_name(&c.path),
                };
                let e = match exports::open(&spec, &opts.open_options(opts.direct && !opts.dry_run))
                {
                    Ok(e) => e,
                    Err(err) => {
                        report.skip(name, err.to_string());
                        continue;
                    }
                };
                match stack_on(
                    e,
                    &name,
                    &spec.name,
                    opts,
                    &mut keys,
                    terminal,
                    &mut report,
                    &mut key_texts,
                ) {
                    Ok(Some((mut e, lvm))) => {
                        e.name = names.claim(&e.name, &name, &mut report);
                        if lvm {
                            pvs.push(PvCandidate {
                                shown: name,
                                export: Some(e),
                                file: None,
                            });
                        } else {
                            out.push(e);
                        }
                    }
                    Ok(None) => {}
                    Err(err) => report.skip(name, err.to_string()),
                }
            }
        }
    }

    out.extend(assemble_lvm(
        pvs,
        &opts.open_options(opts.direct && !opts.dry_run),
        &mut report,
    ));
    for e in &out {
        let key = e
            .luks()
            .and_then(|l| key_texts.iter().find(|(u, _)| *u == l.uuid))
            .map(|(_, k)| k.clone());
        report.exports.push(summary(e, key));
    }
    for e in &mut out {
        e.fence_by_leases();
    }
    Ok((out, report))
}

/// What sits on `e` (an array or a file): LUKS is unlocked (or described, for a dry run),
/// an LVM2 label is flagged. `Ok(None)`: skipped, with the reason in the report.
#[allow(clippy::too_many_arguments)]
fn stack_on(
    e: OpenedExport,
    shown: &str,
    base_name: &str,
    opts: &ScanOptions,
    keys: &mut KeyCache,
    terminal: bool,
    report: &mut ScanReport,
    key_texts: &mut Vec<(String, String)>,
) -> Result<Option<(OpenedExport, bool)>> {
    let close = |e: &OpenedExport| {
        if let Some(a) = e.md() {
            let _ = a.close();
        }
    };
    let mut e = e;
    e.name = base_name.to_string();
    let is_luks = match cairn_luks::probe(&*e.device) {
        Ok(v) => v.is_some(),
        Err(err) => {
            close(&e);
            return Err(StackError::new(format!("cannot read {shown}: {err}")));
        }
    };
    if is_luks {
        let uuid = match luks_uuid(e.device.clone(), shown) {
            Ok(u) => u,
            Err(err) => {
                close(&e);
                return Err(err);
            }
        };
        let sources = key_sources(
            &uuid,
            opts.key_file.as_deref(),
            opts.key_dir.as_deref(),
            terminal,
        );
        // A preview with a key at hand unlocks (read-only) as serve would, so it shows
        // the LVs inside and what serve will really export; without one it says so.
        if opts.dry_run && sources.is_empty() {
            key_texts.push((uuid, "none available: it would be skipped".into()));
            let d = describe_locked(e, shown)?;
            return Ok(Some((d, false)));
        }
        match unlock_with(&e, shown, &sources, keys) {
            Ok((u, src)) => {
                key_texts.push((uuid, src.text()));
                e = u;
            }
            Err(err) => {
                close(&e);
                report.skip(shown, err.to_string());
                return Ok(None);
            }
        }
    }
    // An LVM2 label on the top device: on an unlocked payload or an array (a plain
    // file's label was seen by the probe already).
    let lvm = cairn_block::probe::probe(&*e.device).is_ok_and(|f| f.has_lvm_label());
    Ok(Some((e, lvm)))
}

fn summary(e: &OpenedExport, key: Option<String>) -> StackSummary {
    let mut layers = Vec::new();
    let (paths, state) = stack_layers(e, &mut layers);
    StackSummary {
        name: e.name.clone(),
        size: e.geometry().size,
        layers,
        paths,
        key,
        state,
    }
}

/// The layers of `e` from the top ("LV vg/lv", "LUKS2 ...", "md ...", "file ..."), an LV's
/// PVs one after another: the member paths and the state of the bottom layers.
fn stack_layers(e: &OpenedExport, layers: &mut Vec<String>) -> (Vec<String>, String) {
    if let Layer::Lv(lv) = &e.layer {
        layers.push(format!("LV {}/{}", lv.details.vg, lv.details.lv));
        let mut paths = Vec::new();
        let mut states: Vec<String> = Vec::new();
        for pv in &lv.pvs {
            let (p, s) = stack_layers(pv, layers);
            paths.extend(p);
            if !states.contains(&s) {
                states.push(s);
            }
        }
        return (paths, states.join("; "));
    }
    if let Layer::Luks { info: l, below, .. } = &e.layer {
        layers.push(format!("LUKS{} {}", l.version, l.uuid));
        return stack_layers(below, layers);
    }
    let (paths, state) = match e.md() {
        Some(a) => {
            let r = a.report();
            let chunk = r
                .chunk_kib
                .map(|c| format!(" {c}K chunk"))
                .unwrap_or_default();
            layers.push(format!(
                "md {} {}{chunk} ({} of {} members)",
                r.level, r.name, r.active_devices, r.raid_devices
            ));
            (
                r.members.iter().filter_map(|m| m.name.clone()).collect(),
                r.state_text,
            )
        }
        None => {
            layers.push(format!("file {}", shown(&e.path)));
            (vec![shown(&e.path)], "plain".to_string())
        }
    };
    (paths, state)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::luks::KeySource;
    use cairn_block::{FileDisk, OpenOptions};

    struct Dir(PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
    fn tempdir(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("cairn-scan-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }

    fn md_create(
        dir: &Path,
        level: cairn_md::Level,
        n: usize,
        tag: &str,
        name: &str,
    ) -> Vec<PathBuf> {
        let paths: Vec<PathBuf> = (0..n).map(|i| dir.join(format!("{tag}{i}.img"))).collect();
        let devs: Vec<Arc<dyn BlockDevice>> = paths
            .iter()
            .map(|p| {
                let f = std::fs::File::create(p).unwrap();
                f.set_len(8 << 20).unwrap();
                drop(f);
                Arc::new(FileDisk::open(p, &OpenOptions::default()).unwrap())
                    as Arc<dyn BlockDevice>
            })
            .collect();
        let names = paths.iter().map(|p| shown(p)).collect();
        let mut o = cairn_md::CreateOptions::new(level, name);
        o.chunk = Some(cairn_md::Sectors(128));
        o.members_zeroed = true;
        let a = cairn_md::Array::create(devs, names, &o).unwrap();
        a.close().unwrap();
        paths
    }

    fn sums(paths: &[PathBuf]) -> Vec<Vec<u8>> {
        paths.iter().map(|p| std::fs::read(p).unwrap()).collect()
    }

    #[test]
    fn groups_arrays_skips_strays_and_survives_a_missing_member() {
        let d = tempdir("group");
        let a = md_create(&d.0, cairn_md::Level::Raid5, 3, "a", "alpha");
        let b = md_create(&d.0, cairn_md::Level::Raid1, 2, "b", "beta");
        std::fs::write(d.0.join("stray.txt"), vec![7u8; 64 << 10]).unwrap();
        std::fs::write(d.0.join("notes.txt"), b"hello").unwrap();
        std::fs::write(d.0.join(".hidden"), b"x").unwrap();
        std::fs::File::create(d.0.join("empty.img")).unwrap();
        // A LUKS file: only its magic matters to the probe, and with no key it is skipped.
        let mut luks = vec![0u8; 1 << 20];
        luks[..6].copy_from_slice(b"LUKS\xba\xbe");
        luks[6..8].copy_from_slice(&2u16.to_be_bytes());
        std::fs::write(d.0.join("vol.img"), &luks).unwrap();
        // One member of beta gone: degraded, still exported.
        std::fs::remove_file(&b[1]).unwrap();
        let before = sums(&a);

        let opts = ScanOptions {
            read_only: true,
            ..ScanOptions::default()
        };
        let (exports, report) = scan(std::slice::from_ref(&d.0), &opts).unwrap();
        let mut names: Vec<&str> = exports.iter().map(|e| e.name.as_str()).collect();
        names.sort();
        assert_eq!(names, ["alpha", "beta"], "{report:?}");
        let beta = exports.iter().find(|e| e.name == "beta").unwrap();
        assert!(beta.md().unwrap().report().state.degraded);
        let alpha = exports.iter().find(|e| e.name == "alpha").unwrap();
        assert_eq!(alpha.md().unwrap().report().active_devices, 3);
        let skipped: Vec<&str> = report.skipped.iter().map(|s| s.what.as_str()).collect();
        for want in ["stray.txt", "notes.txt", ".hidden", "empty.img", "vol.img"] {
            assert!(
                skipped.iter().any(|s| s.ends_with(want)),
                "{want} not skipped: {skipped:?}"
            );
        }
        let stray = report
            .skipped
            .iter()
            .find(|s| s.what.ends_with("stray.txt"))
            .unwrap();
        assert!(
            stray.reason.contains("no md, LUKS or LVM2 signature"),
            "{}",
            stray.reason
        );
        assert_eq!(
            report
                .devices
                .iter()
                .filter(|p| p.kind == "md member")
                .count(),
            4
        );
        drop(exports);
        assert_eq!(sums(&a), before, "a read-only scan wrote to a member");
    }

    #[test]
    fn an_explicit_blank_file_is_a_plain_disk_and_names_stay_unique() {
        let d = tempdir("plain");
        let p = d.0.join("disk.img");
        std::fs::write(&p, vec![0u8; 1 << 20]).unwrap();
        let opts = ScanOptions {
            read_only: true,
            taken_names: vec!["disk".into()],
            ..ScanOptions::default()
        };
        let (exports, report) = scan(std::slice::from_ref(&p), &opts).unwrap();
        assert_eq!(exports.len(), 1);
        assert_eq!(exports[0].name, "disk-2");
        assert!(
            report.notes.iter().any(|n| n.contains("\"disk-2\"")),
            "{report:?}"
        );
        // Found in a directory instead, the same file is not exported.
        let (exports, _) = scan(std::slice::from_ref(&d.0), &opts).unwrap();
        assert!(exports.is_empty());
    }

    #[test]
    fn key_dir_files_are_named_by_uuid() {
        let d = tempdir("keys");
        let uuid = "0b5c8e2f-8a4e-4f6b-9d2a-1c3e5f7a9b0d";
        assert_eq!(key_sources(uuid, None, Some(&d.0), false), []);
        std::fs::write(d.0.join(format!("{uuid}.key")), b"k").unwrap();
        let k = Path::new("/etc/k");
        assert_eq!(
            key_sources(uuid, Some(k), Some(&d.0), true),
            [
                KeySource::KeyDir(d.0.join(format!("{uuid}.key"))),
                KeySource::KeyFile(k.into())
            ]
        );
        std::fs::write(d.0.join(uuid), b"k").unwrap();
        assert_eq!(
            key_sources(uuid, None, Some(&d.0), true),
            [KeySource::KeyDir(d.0.join(uuid))]
        );
        assert_eq!(
            key_sources("other", None, Some(&d.0), true),
            [KeySource::Terminal]
        );
    }
}
