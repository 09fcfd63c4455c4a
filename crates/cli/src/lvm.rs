//! `cairn lvm pvcreate|pvs|vgcreate|vgs|vgextend|lvcreate|lvs|lvextend|lvreduce|lvrename|
//! lvremove`: LVM2 volume groups in lvm's on-disk format.
//!
//! ```text
//!   PV paths | --devices | --md M1,M2 [--luks] | --luks=FILE ─ open_pvs ─> PvDevices
//!        (each a cairn_stack::Spec: a file, an md array, LUKS on either, opened by
//!         cairn_stack::open_one; passphrases from --key-file or the terminal)
//!   verb ─> cairn_lvm (pvcreate, Vg::create/open, lv_create, ...) ─> lvm-like lines
//!        | --json ─> close (md arrays marked clean)
//! ```
//!
//! Words, options and messages follow lvm so its users' habits carry over: `lvcreate -n
//! lin -L 20M vg`, "Logical volume "lin" created.". cairn has no device scan: the VG's PVs
//! come from the command line, like lvm's `--devices`.

use std::path::PathBuf;
use std::sync::Arc;

use cairn_lvm::{LvCreate, PvCreateOptions, PvDevice, RaidCreate, Vg, VgReport, VolumeGroup};
use serde::Serialize;
use serde_json::json;

use crate::error::{CliError, Result};
use crate::global::Global;
use crate::luks::KeyFileArgs;
pub use cairn_stack::lvm::lvm_error;
use cairn_stack::size::parse_size;
use cairn_stack::{Keys, Options, Spec};
use clap::ArgAction;
use clap::Args;
use clap::Subcommand;

pub fn run(cmd: LvmCommand, global: &Global) -> Result<()> {
    match cmd {
        LvmCommand::Pvcreate(a) => pvcreate(&a, global),
        LvmCommand::Pvs(a) => pvs(&a, global),
        LvmCommand::Vgcreate(a) => vgcreate(&a, global),
        LvmCommand::Vgs(a) => vgs(&a, global),
        LvmCommand::Vgextend(a) => vgextend(&a, global),
        LvmCommand::Lvcreate(a) => lvcreate(&a, global),
        LvmCommand::Lvs(a) => lvs(&a, global),
        LvmCommand::Lvextend(a) => resize(&a, true, global),
        LvmCommand::Lvreduce(a) => resize(&a, false, global),
        LvmCommand::Lvrename(a) => lvrename(&a, global),
        LvmCommand::Lvremove(a) => lvremove(&a, global),
        LvmCommand::Lvconvert(a) => lvconvert(&a, global),
        LvmCommand::Lvchange(a) => lvchange(&a, global),
        LvmCommand::VgcfgParse(a) => vgcfg_parse(&a, global),
    }
}

fn out(text: &str) {
    println!("{text}");
}

fn print_json(v: &impl Serialize) {
    println!(
        "{}",
        serde_json::to_string(v).expect("reports serialise to JSON")
    );
}

// ---- the PVs -----------------------------------------------------------------------

/// The PVs a command works on, and the md arrays under them (closed at the end).
struct OpenedPvs {
    pvs: Vec<PvDevice>,
    arrays: Vec<Arc<cairn_md::Array>>,
    /// The remote exports used whole as PVs: their owner records are released when the
    /// verb is done with them, whichever way it ends (a failed lvcreate included).
    leaves: Vec<PathBuf>,
}

impl Drop for OpenedPvs {
    fn drop(&mut self) {
        cairn_stack::fence::release_exports(&self.leaves);
    }
}

impl OpenedPvs {
    fn close(&self) -> Result<()> {
        for a in &self.arrays {
            a.close().map_err(|e| {
                CliError::new(format!(
                    "closing the md array failed, so it will need --force or a resync: {e}"
                ))
            })?;
        }
        Ok(())
    }
}

/// The PV stacks the arguments name, each with the name lvm's metadata hints get: the
/// path, `md:M1,M2`, `luks:PATH` or `luks:md:M1,M2`.
fn pv_specs(paths: &[PathBuf], d: &LvmDevices) -> Result<Vec<(String, Spec)>> {
    let mut files: Vec<PathBuf> = paths.to_vec();
    for list in &d.devices {
        for p in list.split(',').filter(|p| !p.is_empty()) {
            files.push(PathBuf::from(p));
        }
    }
    let mut out: Vec<(String, Spec)> = Vec::new();
    for (i, p) in files.iter().enumerate() {
        if files[..i].contains(p) {
            return Err(CliError::new(format!("{} is given twice", p.display())));
        }
        out.push((p.display().to_string(), Spec::File(p.clone())));
    }
    let bare_luks = d.luks.iter().any(String::is_empty);
    if bare_luks && d.md.is_empty() {
        return Err(CliError::new(
            "a bare --luks means the --md arrays hold LUKS, but no --md is given; give \
             --luks=FILE for a LUKS file",
        ));
    }
    for m in &d.md {
        let members = cairn_stack::md::parse_md_spec(m)?.members;
        let listed: Vec<String> = members.iter().map(|p| p.display().to_string()).collect();
        let name = format!("md:{}", listed.join(","));
        let md = Spec::Md(members);
        out.push(if bare_luks {
            let on = Box::new(md);
            (format!("luks:{name}"), Spec::Luks { on, key_file: None })
        } else {
            (name, md)
        });
    }
    for f in d.luks.iter().filter(|f| !f.is_empty()) {
        let on = Box::new(Spec::File(PathBuf::from(f)));
        out.push((format!("luks:{f}"), Spec::Luks { on, key_file: None }));
    }
    Ok(out)
}

/// `force`: as `cairn serve --force`, take remote PVs over from an owner that did not
/// release them (the operator says it is gone), start a dirty degraded md array below.
fn open_pvs(paths: &[PathBuf], d: &LvmDevices, read_only: bool, force: bool) -> Result<OpenedPvs> {
    let specs = pv_specs(paths, d)?;
    if specs.is_empty() {
        return Err(CliError::new(
            "no PVs given; name them as lvm's --devices does: --devices pv0.img,pv1.img (or \
             --md M1,M2,... for an md array, --luks=FILE for a LUKS volume)",
        ));
    }
    let opts = Options {
        read_only,
        force,
        hooks: crate::hooks::hooks(true),
        ..Options::default()
    };
    let mut keys = Keys::new(d.key.key_file.clone(), None, opts.hooks.prompt.clone());
    let mut out = OpenedPvs {
        pvs: Vec::new(),
        arrays: Vec::new(),
        leaves: Vec::new(),
    };
    for (name, spec) in &specs {
        // A file's name is its path; an empty export name skips the export-name rules.
        let e = cairn_stack::open_one(spec, Some(""), &opts, &mut keys).inspect_err(|_| {
            let _ = out.close();
        })?;
        out.arrays.extend(e.arrays());
        out.leaves.extend(e.leaves());
        out.pvs.push(PvDevice::new(name.clone(), e.device));
    }
    Ok(out)
}

/// Opens the VG the devices hold, checking its name when the command names one.
fn open_vg(
    d: &LvmDevices,
    extra: &[PathBuf],
    vg: Option<&str>,
    read_only: bool,
    force: bool,
) -> Result<(Vg, OpenedPvs)> {
    let opened = open_pvs(extra, d, read_only, force)?;
    let result = Vg::open_with(
        opened.pvs.clone(),
        cairn_lvm::OpenOptions {
            partial: read_only,
            read_only,
        },
    );
    let v = match result {
        Ok(v) => v,
        Err(e) => {
            let _ = opened.close();
            return Err(lvm_error(&e));
        }
    };
    if let Some(want) = vg {
        if v.name() != want {
            let _ = opened.close();
            return Err(CliError::new(format!(
                "Volume group \"{want}\" not found: the devices given hold VG \"{}\"",
                v.name()
            )));
        }
    }
    // The notes (stale or damaged copies, missing PVs) reach stderr as tracing warnings.
    Ok((v, opened))
}

fn no_devices() -> LvmDevices {
    LvmDevices {
        devices: vec![],
        md: vec![],
        luks: vec![],
        key: crate::luks::KeyFileArgs { key_file: None },
    }
}

/// Splits `VG/LV`.
fn vg_lv(s: &str) -> Result<(&str, &str)> {
    let s = s.strip_prefix("/dev/").unwrap_or(s);
    match s.split_once('/') {
        Some((v, l)) if !v.is_empty() && !l.is_empty() && !l.contains('/') => Ok((v, l)),
        _ => Err(CliError::new(format!(
            "{s:?} is not VG/LV; name the logical volume as vg0/data"
        ))),
    }
}

// ---- sizes as lvm prints them ------------------------------------------------------

/// `20.00 MiB`, as lvm's messages say sizes.
pub fn lvm_size(bytes: u64) -> String {
    units(bytes, &["B", "KiB", "MiB", "GiB", "TiB", "PiB"], " ")
}

/// `60.00m`, as lvm's report columns say sizes.
pub fn lvm_short_size(bytes: u64) -> String {
    if bytes == 0 {
        return "0".into();
    }
    units(bytes, &["b", "k", "m", "g", "t", "p"], "")
}

fn units(bytes: u64, names: &[&str], sep: &str) -> String {
    let mut unit = 0;
    let mut scale: u64 = 1;
    while unit + 1 < names.len() && bytes >= scale * 1024 {
        unit += 1;
        scale *= 1024;
    }
    if unit == 0 {
        return format!("{bytes}{sep}{}", names[0]);
    }
    let hundredths = (u128::from(bytes) * 100 + u128::from(scale) / 2) / u128::from(scale);
    format!(
        "{}.{:02}{sep}{}",
        hundredths / 100,
        hundredths % 100,
        names[unit]
    )
}

/// Prints rows as lvm's reports do: two spaces, columns padded, numbers right-aligned.
fn table(head: &[&str], rows: &[Vec<String>], right: &[bool]) {
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::from(" ");
        for (i, c) in cells.iter().enumerate() {
            s.push(' ');
            if right[i] {
                s.push_str(&format!("{c:>width$}", width = w[i]));
            } else {
                s.push_str(&format!("{c:<width$}", width = w[i]));
            }
        }
        s.trim_end().to_string()
    };
    out(&line(head.to_vec()));
    for r in rows {
        out(&line(r.iter().map(String::as_str).collect()));
    }
}

// ---- verbs -------------------------------------------------------------------------

fn pvcreate(a: &LvmPvcreateArgs, global: &Global) -> Result<()> {
    let opened = open_pvs(&a.pvs, &a.devices, false, a.wipe.force)?;
    let opts = PvCreateOptions {
        data_alignment: a.data_alignment,
        force: a.wipe.wipe(),
        uuid: None,
    };
    let mut made = Vec::new();
    let mut result = Ok(());
    for pv in &opened.pvs {
        match cairn_lvm::pvcreate(pv, &opts) {
            Ok(info) => {
                if !global.json {
                    out(&format!(
                        "  Physical volume \"{}\" successfully created.",
                        pv.name
                    ));
                }
                made.push(json!({"pv_name": pv.name, "info": info}));
            }
            Err(e) => {
                result = Err(lvm_error(&e));
                break;
            }
        }
    }
    opened.close()?;
    result?;
    if global.json {
        print_json(&json!({ "pvs": made }));
    }
    Ok(())
}

/// lvm's 4 MiB, raised to a multiple of the PVs' full stripe so that every extent
/// starts on one; a warning when no sensible size does.
pub fn default_extent_size(pvs: &[PvDevice]) -> u64 {
    const LVM_DEFAULT: u64 = 4 << 20;
    match cairn_lvm::aligned_extent_size(LVM_DEFAULT, pvs) {
        Some(e) => {
            if e != LVM_DEFAULT {
                tracing::info!(
                    "extent size {} (not 4 MiB) so that every extent starts on a full stripe \
                     of the PVs",
                    cairn_stack::size::format_size(e)
                );
            }
            e
        }
        None => {
            eprintln!(
                "cairn: warning: no extent size up to 1 GiB is a multiple of the PVs' full \
                 stripes; using 4 MiB, so LVs after the first may not start on a full stripe"
            );
            LVM_DEFAULT
        }
    }
}

fn vgcreate(a: &LvmVgcreateArgs, global: &Global) -> Result<()> {
    let opened = open_pvs(&a.pvs, &a.devices, false, a.wipe.force)?;
    let extent_size = match a.extent_size {
        Some(e) => e,
        None => default_extent_size(&opened.pvs),
    };
    let r =
        Vg::create_with(&a.vg, opened.pvs.clone(), extent_size, a.wipe.wipe()).map(|v| v.report());
    opened.close()?;
    let r = r.map_err(|e| lvm_error(&e))?;
    if global.json {
        print_json(&r);
    } else {
        out(&format!(
            "  Volume group \"{}\" successfully created",
            r.name
        ));
    }
    Ok(())
}

fn vgextend(a: &LvmVgextendArgs, global: &Global) -> Result<()> {
    let (mut vg, opened) = open_vg(&a.devices, &[], Some(&a.vg), false, a.wipe.force)?;
    let new = match open_pvs(&a.new_pvs, &no_devices(), false, a.wipe.force) {
        Ok(n) => n,
        Err(e) => {
            let _ = opened.close();
            return Err(e);
        }
    };
    vg.set_description(format!("cairn lvm vgextend {}", a.vg));
    let r = vg
        .extend_with(new.pvs.clone(), a.wipe.wipe())
        .map(|()| vg.report());
    opened.close()?;
    let r = r.map_err(|e| lvm_error(&e))?;
    if global.json {
        print_json(&r);
    } else {
        out(&format!(
            "  Volume group \"{}\" successfully extended",
            r.name
        ));
    }
    Ok(())
}

/// `-l N`, `-l N%FREE`, `-l N%VG` in extents.
fn parse_extents(text: &str, r: &VgReport) -> Result<u64> {
    let bad = || {
        CliError::new(format!(
            "{text:?} is not a number of extents; give N, N%FREE or N%VG"
        ))
    };
    if let Some((n, what)) = text.split_once('%') {
        let pct: u64 = n.parse().map_err(|_| bad())?;
        if pct == 0 || pct > 100 {
            return Err(bad());
        }
        let base = match what.to_ascii_uppercase().as_str() {
            "FREE" => r.free_count,
            "VG" => r.extent_count,
            _ => return Err(bad()),
        };
        return Ok(base * pct / 100);
    }
    text.parse().map_err(|_| bad())
}

fn lvcreate(a: &LvmLvcreateArgs, global: &Global) -> Result<()> {
    let (mut vg, opened) = open_vg(&a.devices, &a.pvs, Some(&a.vg), false, a.force)?;
    let result = (|| {
        let r = vg.report();
        let mut notes = Vec::new();
        let extents = match (&a.size, &a.extents) {
            (Some(bytes), _) => {
                let n = bytes.div_ceil(r.extent_size);
                if n * r.extent_size != *bytes {
                    notes.push(format!(
                        "Rounding up size to full physical extent {}.",
                        lvm_size(n * r.extent_size)
                    ));
                }
                n
            }
            (None, Some(t)) => parse_extents(t, &r)?,
            (None, None) => return Err(CliError::new("give a size: -L SIZE or -l EXTENTS")),
        };
        vg.set_description(format!("cairn lvm lvcreate -n {} {}", a.name, a.vg));
        let segtype = match (a.segtype.as_deref(), a.mirrors) {
            (Some(t), _) => t.to_string(),
            // lvm's mirror_segtype_default is raid1; -m with -i > 1 makes raid10.
            (None, Some(_)) if a.stripes.unwrap_or(1) > 1 => "raid10".into(),
            (None, Some(_)) => "raid1".into(),
            (None, None) => "striped".into(),
        };
        let c = if matches!(segtype.as_str(), "linear" | "striped") {
            if a.nosync || a.region_size.is_some() {
                return Err(CliError::new(
                    "--nosync and -R apply to RAID LVs (--type raid1, raid10, ...)",
                ));
            }
            if segtype == "linear" && a.stripes.unwrap_or(1) > 1 {
                return Err(CliError::new(
                    "a linear LV has one stripe; use --type striped with -i",
                ));
            }
            vg.lv_create(&LvCreate {
                name: a.name.clone(),
                extents,
                stripes: a.stripes.unwrap_or(1),
                stripe_size: a.stripe_size,
            })
        } else {
            vg.lv_create_raid(&RaidCreate {
                name: a.name.clone(),
                extents,
                segtype,
                mirrors: a.mirrors,
                stripes: a.stripes,
                stripe_size: a.stripe_size,
                region_size: a.region_size,
                nosync: a.nosync,
            })
        }
        .map_err(|e| lvm_error(&e))?;
        notes.extend(c.notes.iter().cloned());
        Ok((c, notes))
    })();
    opened.close()?;
    let (c, notes) = result?;
    if global.json {
        print_json(&json!({ "vg": a.vg, "lv": c.name, "extents": c.extents, "notes": notes }));
    } else {
        for n in &notes {
            out(&format!("  {n}"));
        }
        out(&format!("  Logical volume \"{}\" created.", c.name));
    }
    Ok(())
}

/// How many extents to add (extend) or cut (reduce) for `-L`/`-l`.
fn resize_delta(a: &LvmResizeArgs, grow: bool, cur: u64, extent: u64) -> Result<u64> {
    let sign = if grow { '+' } else { '-' };
    let (text, bytes) = match (&a.size, &a.extents) {
        (Some(s), _) => (s.as_str(), true),
        (None, Some(e)) => (e.as_str(), false),
        (None, None) => {
            return Err(CliError::new(
                "give a size: -L [+|-]SIZE or -l [+|-]EXTENTS",
            ))
        }
    };
    let (relative, num) = match text.strip_prefix(sign) {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let value = if bytes {
        parse_size(num).map_err(|e| CliError::new(e.to_string()))?
    } else {
        num.parse::<u64>()
            .map_err(|_| CliError::new(format!("{text:?} is not a number of extents")))?
    };
    let to_ext = |v: u64| if bytes { v.div_ceil(extent) } else { v };
    let delta = if relative {
        if grow {
            to_ext(value)
        } else {
            // Cut whole extents only: the new size rounds up.
            let left = if bytes {
                (cur * extent).saturating_sub(value).div_ceil(extent)
            } else {
                cur.saturating_sub(value)
            };
            cur - left.min(cur)
        }
    } else {
        let target = to_ext(value);
        match (grow, target.cmp(&cur)) {
            (true, std::cmp::Ordering::Greater) => target - cur,
            (false, std::cmp::Ordering::Less) => cur - target,
            _ => {
                return Err(CliError::new(format!(
                    "New size given ({target} extents) not {} than existing size ({cur} extents)",
                    if grow { "larger" } else { "smaller" }
                )))
            }
        }
    };
    if delta == 0 {
        return Err(CliError::new(
            "the size change is less than one extent; nothing to do",
        ));
    }
    Ok(delta)
}

fn resize(a: &LvmResizeArgs, grow: bool, global: &Global) -> Result<()> {
    let (vgn, lvn) = vg_lv(&a.lv)?;
    let (mut vg, opened) = open_vg(&a.devices, &a.pvs, Some(vgn), false, a.force)?;
    let result = (|| {
        let r = vg.report();
        let lv = r.lvs.iter().find(|l| l.name == lvn).ok_or_else(|| {
            CliError::new(format!("Failed to find logical volume \"{vgn}/{lvn}\""))
        })?;
        let cur = lv.extents;
        let delta = resize_delta(a, grow, cur, r.extent_size)?;
        vg.set_description(format!(
            "cairn lvm {} {vgn}/{lvn}",
            if grow { "lvextend" } else { "lvreduce" }
        ));
        let c = if grow {
            vg.lv_extend(lvn, delta)
        } else {
            vg.lv_reduce(lvn, delta, a.force)
        }
        .map_err(|e| lvm_error(&e))?;
        Ok((cur, c, r.extent_size))
    })();
    opened.close()?;
    let (cur, c, es) = result?;
    if global.json {
        print_json(
            &json!({ "vg": vgn, "lv": lvn, "old_extents": cur, "extents": c.extents, "notes": c.notes }),
        );
    } else {
        for n in &c.notes {
            out(&format!("  {n}"));
        }
        out(&format!(
            "  Size of logical volume {vgn}/{lvn} changed from {} ({cur} extents) to {} ({} extents).",
            lvm_size(cur * es),
            lvm_size(c.extents * es),
            c.extents
        ));
        out(&format!(
            "  Logical volume {vgn}/{lvn} successfully resized."
        ));
    }
    Ok(())
}

fn lvconvert(a: &LvmLvconvertArgs, global: &Global) -> Result<()> {
    let (vgn, lvn) = vg_lv(&a.lv)?;
    if let Some(sock) = lvconvert_daemon(a)? {
        return lvconvert_served(a, &sock, global);
    }
    let opened = open_pvs(&a.pvs, &a.devices, false, a.force)?;
    // PVs may be missing: that is what a repair is for.
    let mut vg = match Vg::open_with(
        opened.pvs.clone(),
        cairn_lvm::OpenOptions {
            partial: true,
            read_only: false,
        },
    ) {
        Ok(v) => v,
        Err(e) => {
            let _ = opened.close();
            return Err(lvm_error(&e));
        }
    };
    if vg.name() != vgn {
        let _ = opened.close();
        return Err(CliError::new(format!(
            "Volume group \"{vgn}\" not found: the devices given hold VG \"{}\"",
            vg.name()
        )));
    }
    vg.set_description(format!(
        "cairn lvm lvconvert {} {}",
        a.replace
            .as_ref()
            .map_or("--repair".to_string(), |p| format!("--replace {p}")),
        a.lv
    ));
    let mut last = 0u64;
    let json = global.json;
    let r = vg.lv_repair(lvn, a.replace.as_deref(), &mut |done, total| {
        let pct = done * 100 / total.max(1);
        if !json && (pct >= last + 10 || done == total) {
            eprintln!(
                "  {vgn}/{lvn}: rebuilt {pct}% ({} of {})",
                lvm_size(done),
                lvm_size(total)
            );
            last = pct;
        }
    });
    opened.close()?;
    let r = r.map_err(|e| lvm_error(&e))?;
    if global.json {
        print_json(&json!({ "vg": vgn, "lv": lvn, "moved": r.moved, "rebuilt": r.rebuilt }));
    } else {
        for (img, from, to) in &r.moved {
            out(&format!("  {vgn}/{img} moved from {from} to {to}."));
        }
        if r.rebuilt.is_empty() {
            out(&format!(
                "  {vgn}/{lvn} is whole and in sync; nothing to repair."
            ));
        } else {
            out(&format!(
                "  Faulty devices in {vgn}/{lvn} successfully replaced; rebuilt {}.",
                r.rebuilt.join(", ")
            ));
        }
    }
    Ok(())
}

/// `lvchange --syncaction check|repair VG/LV`: md's scrub of a served RAID LV, run by
/// the server serving it (its array is there; the PVs are open for writing there).
fn lvchange(a: &LvmLvchangeArgs, global: &Global) -> Result<()> {
    vg_lv(&a.lv)?;
    let repair = match a.syncaction.as_str() {
        "check" => false,
        "repair" => true,
        other => {
            return Err(CliError::new(format!(
                "--syncaction {other}: cairn offers check and repair (lvm's \
                 idle/frozen/resync/recover are the kernel's to run)"
            )))
        }
    };
    let Some(sock) = lv_daemon(&a.control, &a.lv)? else {
        return Err(CliError::new(format!(
            "{} is not served by a running cairn serve here: a RAID LV's check or repair \
             runs in the server that serves it (cairn serve --lvm ..., then this command, \
             or give its --control PATH)",
            a.lv
        )));
    };
    let body = json!({"action": "lv-scrub", "lv": a.lv, "repair": repair});
    crate::md_manage::scrub_through(&sock, &body, &a.lv, repair, a.wait, global)
}

fn lvconvert_daemon(a: &LvmLvconvertArgs) -> Result<Option<PathBuf>> {
    lv_daemon(&a.control, &a.lv)
}

/// The daemon serving the LV: `--control PATH`, else the live daemon that has it as an
/// export. A served LV is repaired and scrubbed by its server (one writer per device).
fn lv_daemon(control: &crate::control::ControlArgs, lv: &str) -> Result<Option<PathBuf>> {
    let route = format!("/v1/exports/{lv}");
    if let Some(p) = &control.control {
        crate::control::get_ok(p, &route)?;
        return Ok(Some(p.clone()));
    }
    Ok(crate::control::live_daemons()
        .into_iter()
        .find(|s| crate::control::get_ok(s, &route).is_ok()))
}

/// `lvconvert` through the daemon serving the LV: the files named are offered as room
/// for the images that move; the rebuild runs in the daemon, shown by `cairn status`.
fn lvconvert_served(a: &LvmLvconvertArgs, sock: &std::path::Path, global: &Global) -> Result<()> {
    let mut files: Vec<PathBuf> = a.pvs.clone();
    for list in &a.devices.devices {
        files.extend(list.split(',').filter(|p| !p.is_empty()).map(PathBuf::from));
    }
    // The PVs that are gone cannot be named by the daemon; the others absolute.
    let files: Vec<PathBuf> = files
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    let body = json!({
        "action": "lv-repair",
        "lv": a.lv,
        "replace": a.replace,
        "pvs": files,
    });
    let (status, v) = crate::control::request(sock, "POST", "/v1/actions", Some(&body))?;
    if !(200..300).contains(&status) {
        return Err(CliError::new(v["error"].as_str().map_or_else(
            || format!("the daemon answered {status}: {v}"),
            str::to_string,
        )));
    }
    if global.json {
        print_json(&v);
    } else if let Some(m) = v["message"].as_str() {
        out(&format!("  {}: {m}.", a.lv));
    }
    Ok(())
}

fn lvrename(a: &LvmLvrenameArgs, global: &Global) -> Result<()> {
    let (vgn, old, new) = match a.names.as_slice() {
        [v, o, n] => (v.clone(), o.clone(), n.clone()),
        [o, n] => {
            let (v, o) = vg_lv(o)?;
            let n = match n.split_once('/') {
                Some((nv, nl)) if nv == v => nl.to_string(),
                Some(_) => {
                    return Err(CliError::new(
                        "an LV cannot move to another VG: give the same VG in both names",
                    ))
                }
                None => n.clone(),
            };
            (v.to_string(), o.to_string(), n)
        }
        _ => return Err(CliError::new("give VG OLD NEW, or VG/OLD NEW")),
    };
    let (mut vg, opened) = open_vg(&a.devices, &[], Some(&vgn), false, a.force)?;
    vg.set_description(format!("cairn lvm lvrename {vgn} {old} {new}"));
    let r = vg.lv_rename(&old, &new);
    opened.close()?;
    r.map_err(|e| lvm_error(&e))?;
    if global.json {
        print_json(&json!({ "vg": vgn, "old": old, "new": new }));
    } else {
        out(&format!(
            "  Renamed \"{old}\" to \"{new}\" in volume group \"{vgn}\""
        ));
    }
    Ok(())
}

fn lvremove(a: &LvmLvArgs, global: &Global) -> Result<()> {
    let (vgn, lvn) = vg_lv(&a.lv)?;
    let (mut vg, opened) = open_vg(&a.devices, &a.pvs, Some(vgn), false, a.force)?;
    vg.set_description(format!("cairn lvm lvremove {vgn}/{lvn}"));
    let r = vg.lv_remove(lvn);
    opened.close()?;
    r.map_err(|e| lvm_error(&e))?;
    if global.json {
        print_json(&json!({ "vg": vgn, "removed": lvn }));
    } else {
        out(&format!("  Logical volume \"{lvn}\" successfully removed."));
    }
    Ok(())
}

// ---- reports -----------------------------------------------------------------------

/// The VG report from a running `cairn serve` that serves an LV of the VG on these
/// devices: it has them open and unlocked, so nothing is opened or unlocked again (a
/// stacked `lvs --luks` would otherwise run the key derivation every time). `None` when
/// no daemon in the runtime directory serves them, or its answer is not the whole VG.
fn report_from_daemon(a: &LvmReportArgs) -> Option<VgReport> {
    let mut given: Vec<PathBuf> = a.pvs.clone();
    for list in &a.devices.devices {
        given.extend(list.split(',').filter(|p| !p.is_empty()).map(PathBuf::from));
    }
    for m in &a.devices.md {
        given.extend(cairn_stack::md::parse_md_spec(m).ok()?.members);
    }
    given.extend(
        a.devices
            .luks
            .iter()
            .filter(|f| !f.is_empty())
            .map(PathBuf::from),
    );
    let given: Vec<PathBuf> = given
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    if given.is_empty() {
        return None;
    }
    let socks = match &a.control.control {
        Some(p) => vec![p.clone()],
        None => crate::control::live_daemons(),
    };
    for sock in socks {
        let Ok(status) = crate::control::get_ok(&sock, "/v1/status") else {
            continue;
        };
        let Some(vg) = status["exports"]
            .as_array()
            .and_then(|list| list.iter().find_map(|tree| served_vg(tree, &given)))
        else {
            continue;
        };
        let Ok(v) = crate::control::get_ok(&sock, &format!("/v1/lvm/{vg}")) else {
            continue;
        };
        let Ok(r) = serde_json::from_value::<VgReport>(v) else {
            continue;
        };
        if r.pvs.iter().any(|p| p.missing) {
            continue;
        }
        tracing::info!(
            "VG {vg} is served by cairn serve (PID {}); this report comes from it, with \
             nothing opened or unlocked again",
            status["pid"]
        );
        return Some(r);
    }
    None
}

/// The VG of the LV in export tree `tree` when one of its stack's files is in `given`.
fn served_vg(tree: &serde_json::Value, given: &[PathBuf]) -> Option<String> {
    fn nodes<'a>(n: &'a serde_json::Value, out: &mut Vec<&'a serde_json::Value>) {
        out.push(n);
        for c in n["children"].as_array().into_iter().flatten() {
            nodes(c, out);
        }
    }
    let mut all = Vec::new();
    nodes(tree, &mut all);
    let vg = all.iter().find_map(|n| n["lv"]["vg"].as_str())?;
    let uses = all.iter().any(|n| {
        n["path"]
            .as_str()
            .and_then(|p| std::fs::canonicalize(p).ok())
            .is_some_and(|p| given.contains(&p))
    });
    uses.then(|| vg.to_string())
}

#[derive(Debug, Serialize)]
struct PvRow {
    pv_name: String,
    vg_name: Option<String>,
    pv_uuid: String,
    /// Bytes.
    pe_start: u64,
    dev_size: u64,
    pv_size: u64,
    pv_free: u64,
    pe_count: Option<u64>,
    pe_alloc: Option<u64>,
    missing: bool,
}

fn pvs(a: &LvmReportArgs, global: &Global) -> Result<()> {
    let opened = open_pvs(&a.pvs, &a.devices, true, false)?;
    let result = (|| {
        let mut rows = Vec::new();
        let mut in_vg = Vec::new();
        for pv in &opened.pvs {
            match cairn_lvm::probe(&*pv.dev)
                .map_err(|e| CliError::new(format!("{}: {e}", pv.name)))?
            {
                None => {
                    return Err(CliError::new(format!(
                        "{} is not an LVM2 physical volume (no label); make it one with \
                         `cairn lvm pvcreate`",
                        pv.name
                    )))
                }
                Some(info) if info.vg_name.is_none() => rows.push(PvRow {
                    pv_name: pv.name.clone(),
                    vg_name: None,
                    pv_uuid: info.uuid,
                    pe_start: info.pe_start,
                    dev_size: info.device_size,
                    pv_size: info.device_size,
                    pv_free: info.device_size,
                    pe_count: None,
                    pe_alloc: None,
                    missing: false,
                }),
                Some(_) => in_vg.push(pv.clone()),
            }
        }
        if !in_vg.is_empty() {
            let vg = Vg::open_with(
                in_vg,
                cairn_lvm::OpenOptions {
                    partial: true,
                    read_only: true,
                },
            )
            .map_err(|e| lvm_error(&e))?;
            let r = vg.report();
            for p in &r.pvs {
                rows.push(PvRow {
                    pv_name: p.name.clone(),
                    vg_name: Some(r.name.clone()),
                    pv_uuid: p.uuid.clone(),
                    pe_start: p.pe_start,
                    dev_size: p.dev_size,
                    pv_size: p.size,
                    pv_free: p.free,
                    pe_count: Some(p.pe_count),
                    pe_alloc: Some(p.pe_alloc),
                    missing: p.missing,
                });
            }
        }
        Ok(rows)
    })();
    opened.close()?;
    let rows = result?;
    if global.json {
        print_json(&json!({ "pvs": rows }));
        return Ok(());
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.pv_name.clone(),
                r.vg_name.clone().unwrap_or_default(),
                "lvm2".into(),
                match (r.vg_name.is_some(), r.missing) {
                    (_, true) => "a-m".into(),
                    (true, _) => "a--".into(),
                    _ => "---".into(),
                },
                lvm_short_size(r.pv_size),
                lvm_short_size(r.pv_free),
            ]
        })
        .collect();
    table(
        &["PV", "VG", "Fmt", "Attr", "PSize", "PFree"],
        &cells,
        &[false, false, false, false, true, true],
    );
    Ok(())
}

fn report_of(a: &LvmReportArgs) -> Result<VgReport> {
    if let Some(r) = report_from_daemon(a) {
        return Ok(r);
    }
    let (vg, opened) = open_vg(&a.devices, &a.pvs, None, true, false)?;
    let r = vg.report();
    opened.close()?;
    Ok(r)
}

fn vgs(a: &LvmReportArgs, global: &Global) -> Result<()> {
    let r = report_of(a)?;
    if global.json {
        print_json(&r);
        return Ok(());
    }
    let partial = r.pvs.iter().any(|p| p.missing);
    table(
        &["VG", "#PV", "#LV", "#SN", "Attr", "VSize", "VFree"],
        &[vec![
            r.name.clone(),
            r.pv_count.to_string(),
            r.lv_count.to_string(),
            "0".into(),
            format!("wz-{}n-", if partial { "p" } else { "-" }),
            lvm_short_size(r.size),
            lvm_short_size(r.free),
        ]],
        &[false, true, true, true, false, true, true],
    );
    Ok(())
}

fn lvs(a: &LvmReportArgs, global: &Global) -> Result<()> {
    let r = report_of(a)?;
    if global.json {
        print_json(&json!({ "vg": r.name, "extent_size": r.extent_size, "lvs": r.lvs }));
        return Ok(());
    }
    let mut rows = Vec::new();
    for l in &r.lvs {
        let name = if l.visible {
            l.name.clone()
        } else {
            format!("[{}]", l.name)
        };
        // lvm's volume type letter: r RAID, m mirror, i image, e RAID metadata, l log.
        let kind = match l.segments.first().map(|s| s.segtype.as_str()) {
            Some(t) if t.starts_with("raid") => 'r',
            Some("mirror") => 'm',
            _ if l.name.contains("_rimage_") || l.name.contains("_mimage_") => 'i',
            _ if l.name.contains("_rmeta_") => 'e',
            _ if l.name.ends_with("_mlog") => 'l',
            _ => '-',
        };
        let attr = format!("{kind}{}i-------", if l.writable { 'w' } else { 'r' });
        for s in &l.segments {
            rows.push(vec![
                name.clone(),
                r.name.clone(),
                attr.clone(),
                lvm_short_size(l.size),
                if s.segtype == "striped" && s.stripes == 1 {
                    "linear".into()
                } else {
                    s.segtype.clone()
                },
                s.start_extent.to_string(),
                s.extent_count.to_string(),
                s.stripes.to_string(),
                lvm_short_size(s.stripe_size),
                s.seg_pe_ranges.clone(),
            ]);
        }
        if let Some(why) = &l.unavailable {
            eprintln!(
                "  WARNING: LV {}/{} is unavailable to cairn: {why}",
                r.name, l.name
            );
        }
    }
    let mut head = vec![
        "LV",
        "VG",
        "Attr",
        "LSize",
        "Type",
        "Start",
        "SSize",
        "#Str",
        "Stripe",
        "PE Ranges",
    ];
    let mut right = vec![
        false, false, false, true, false, true, true, true, true, false,
    ];
    // lvm's Cpy%Sync column, only when the VG has RAID LVs (the table of a plain VG
    // stays as it was).
    if r.lvs.iter().any(|l| l.sync_percent.is_some()) {
        head.push("Cpy%Sync");
        right.push(true);
        let mut i = 0;
        for l in &r.lvs {
            for _ in &l.segments {
                rows[i].push(l.sync_percent.clone().unwrap_or_default());
                i += 1;
            }
        }
    }
    // lvm's SyncAction and Mismatches (-o +raid_sync_action,raid_mismatch_count): only
    // a server running the LVs knows them, so only a report from one has them.
    if r.lvs.iter().any(|l| l.raid_sync_action.is_some()) {
        head.extend(["SyncAction", "Mismatches"]);
        right.extend([false, true]);
        let mut i = 0;
        for l in &r.lvs {
            for _ in &l.segments {
                rows[i].push(l.raid_sync_action.clone().unwrap_or_default());
                rows[i].push(
                    l.raid_mismatch_count
                        .map(|n| n.to_string())
                        .unwrap_or_default(),
                );
                i += 1;
            }
        }
    }
    table(&head, &rows, &right);
    Ok(())
}

/// The metadata of a text file, with PV keys in `seg_pe_ranges` replaced by the device
/// hints, so it compares with `lvs -o seg_pe_ranges`.
pub fn vgcfg_json(vg: &VolumeGroup) -> serde_json::Value {
    let es = vg.extent_size * 512;
    let hint = |key: &str| {
        vg.pv(key)
            .and_then(|p| p.device.clone())
            .unwrap_or_else(|| key.to_string())
    };
    let lvs: Vec<serde_json::Value> = vg
        .lvs
        .iter()
        .map(|l| {
            let segs: Vec<serde_json::Value> = l
                .segments
                .iter()
                .map(|s| {
                    let k = s.areas().len() as u64;
                    let per = s.extent_count.checked_div(k).unwrap_or(0);
                    let stripe_size = match &s.kind {
                        cairn_lvm::meta::SegKind::Striped { stripe_size, .. } => stripe_size * 512,
                        cairn_lvm::meta::SegKind::Raid(r) => r.stripe_size * 512,
                        cairn_lvm::meta::SegKind::Other(_) => 0,
                    };
                    json!({
                        "start_extent": s.start_extent,
                        "extent_count": s.extent_count,
                        "segtype": s.type_name(),
                        "stripes": k,
                        "stripe_size": stripe_size,
                        "seg_pe_ranges": s.areas().iter()
                            .map(|a| format!("{}:{}-{}", hint(&a.pv), a.pe, a.pe + per.max(1) - 1))
                            .collect::<Vec<_>>().join(" "),
                    })
                })
                .collect();
            json!({
                "name": l.name, "uuid": l.id, "visible": l.visible(),
                "unavailable": l.unsupported, "extents": l.extents(), "segments": segs,
            })
        })
        .collect();
    let pvs: Vec<serde_json::Value> = vg
        .pvs
        .iter()
        .map(|p| {
            json!({
                "key": p.key, "uuid": p.id, "device": p.device,
                "pe_start": p.pe_start * 512, "pe_count": p.pe_count, "dev_size": p.dev_size * 512,
            })
        })
        .collect();
    json!({
        "name": vg.name, "uuid": vg.id, "seqno": vg.seqno, "extent_size": es,
        "pvs": pvs, "lvs": lvs,
    })
}

fn vgcfg_parse(a: &LvmVgcfgParseArgs, global: &Global) -> Result<()> {
    let shown = a.file.display();
    let text =
        std::fs::read(&a.file).map_err(|e| CliError::new(format!("cannot read {shown}: {e}")))?;
    let vg = VolumeGroup::from_text(&text)
        .map_err(|e| CliError::new(format!("metadata in {shown}, {}", lvm_error(&e))))?;
    let v = vgcfg_json(&vg);
    if global.json {
        print_json(&v);
    } else {
        out(&serde_json::to_string_pretty(&v).expect("JSON"));
    }
    Ok(())
}

// ---- the command line (clap) ----------------------------------------------------
//

pub(crate) const LVM_LONG: &str = "\
LVM2 volume groups in the on-disk format of lvm: PVs cairn makes are PVs `pvs`, `vgs` \
and `lvs` show, and VGs lvm made (linear, striped and RAID LVs) are VGs cairn opens. The \
verbs and options are lvm's: pvcreate, vgcreate -s, lvcreate -n -L/-l -i -I --type -m \
--nosync, lvextend, lvreduce, lvrename, lvremove, pvs, vgs, lvs.

cairn has no device scan, so commands that work on an existing VG take its PVs: as \
arguments after the VG or LV (vg0 pv0.img pv1.img, as vgcreate takes them), or like \
lvm's --devices: --devices PV,PV,... (files or block devices), --md M1,M2,... (an md \
array assembled from its members is one PV; repeatable), --luks=FILE (a LUKS volume is \
one PV) or a bare --luks (each --md array holds LUKS, the PV is inside it), with \
--key-file for the passphrase. Every PV of the VG must be given.

pvcreate starts the data area at 1 MiB, raised to a multiple of the device's full stripe \
(an md array's chunk x data disks), so every extent starts on a full stripe and a \
filesystem on an LV stays aligned. pvcreate, and vgcreate and vgextend where they make \
PVs, refuse a device that holds anything else (a filesystem, a partition table, swap, md, \
LUKS, an LVM label), naming what they found; lvm asks, cairn does not: -y or -f (--force) \
answers yes and the old signatures are wiped. Every change writes new metadata (seqno + 1) to all \
PVs in lvm's commit order, so a crash leaves the old or the new VG, never a mix. \
Nothing is activated: serve an LV with `cairn serve --lvm`.";

pub(crate) const LVM_EXAMPLES: &str = "\
Examples:
  truncate -s 1G pv0.img pv1.img
  cairn lvm pvcreate pv0.img pv1.img
  cairn lvm vgcreate vg0 pv0.img pv1.img                 # 4 MiB extents
  cairn lvm lvcreate -n data -L 200M vg0 pv0.img pv1.img
  cairn lvm lvcreate -n fast -L 100M -i 2 -I 64k vg0 pv0.img pv1.img
  cairn lvm lvcreate --type raid10 -m 1 -i 2 -n safe -L 100M vg0 pv0.img pv1.img pv2.img pv3.img
  cairn lvm lvextend -L +100M vg0/data pv0.img pv1.img
  cairn lvm lvs pv0.img pv1.img                          # or --devices pv0.img,pv1.img
  cairn lvm vgcreate vg1 --md d0.img,d1.img,d2.img,d3.img  # a VG on an md array
  cairn lvm lvs --md d0.img,d1.img,d2.img,d3.img --luks --key-file key   # LVM on LUKS on md";

/// `cairn lvm ...`.
#[derive(Debug, Subcommand)]
pub enum LvmCommand {
    /// Make devices LVM2 physical volumes (label + metadata area)
    Pvcreate(LvmPvcreateArgs),
    /// Show physical volumes
    Pvs(LvmReportArgs),
    /// Create a volume group over PVs (blank devices are made PVs first)
    Vgcreate(LvmVgcreateArgs),
    /// Show the volume group
    Vgs(LvmReportArgs),
    /// Add PVs to a volume group
    Vgextend(LvmVgextendArgs),
    /// Create a linear, striped or RAID (raid1/10/0/4/5/6) logical volume
    #[command(after_help = LVM_LVCREATE_EXAMPLES)]
    Lvcreate(LvmLvcreateArgs),
    /// Show logical volumes, one line per segment
    Lvs(LvmReportArgs),
    /// Grow a logical volume
    Lvextend(LvmResizeArgs),
    /// Shrink a logical volume (refused without -f: the cut-off data is lost)
    Lvreduce(LvmResizeArgs),
    /// Rename a logical volume: VG OLD NEW, or VG/OLD NEW
    Lvrename(LvmLvrenameArgs),
    /// Remove a logical volume
    Lvremove(LvmLvArgs),
    /// Repair a RAID LV (--repair), or move its image off a PV (--replace PV), rebuilding
    /// from the other images with progress
    #[command(after_help = LVM_LVCONVERT_EXAMPLES)]
    Lvconvert(LvmLvconvertArgs),
    /// Check or repair a served RAID LV (--syncaction check|repair): md's scrub, its
    /// progress in cairn status, the mismatches in lvs
    #[command(after_help = LVM_LVCHANGE_EXAMPLES)]
    Lvchange(LvmLvchangeArgs),
    /// Parse a metadata text (vgcfgbackup output, or `pvck --dump metadata`) and print
    /// it as cairn reads it
    #[command(hide = true)]
    VgcfgParse(LvmVgcfgParseArgs),
}

pub(crate) const LVM_LVCREATE_EXAMPLES: &str = "\
Examples:
  cairn lvm lvcreate -n lin -L 20M vg0 pv0.img pv1.img
  cairn lvm lvcreate -n str -i 2 -I 64k -l 4 vg0 pv0.img pv1.img
  cairn lvm lvcreate -n rest -l 100%FREE --devices pv0.img,pv1.img vg0   # lvm's --devices form
  cairn lvm lvcreate --type raid1 -m 1 -n mir -L 20M vg0 pv0.img pv1.img  # an image per PV
  cairn lvm lvcreate --type raid10 -m 1 -i 2 -n r10 -L 40M vg0 --devices p0,p1,p2,p3
  cairn lvm lvcreate --type raid6 -i 3 -I 64k --nosync -n r6 -L 60M vg0 --devices p0,p1,p2,p3,p4";

/// Where the PVs of an existing VG are (lvm's --devices, plus cairn's stacks).
#[derive(Debug, Clone, Args)]
pub struct LvmDevices {
    /// PVs that are files or block devices (comma-separated; repeatable)
    #[arg(long, value_name = "PV,PV,...", action = ArgAction::Append)]
    pub devices: Vec<String>,

    /// An md array assembled from these members is a PV (repeatable)
    #[arg(long, value_name = "MEMBER,MEMBER,...", action = ArgAction::Append)]
    pub md: Vec<String>,

    /// A LUKS volume is a PV: --luks=FILE, or a bare --luks when each --md array holds
    /// LUKS (the `=` keeps a bare --luks from taking the next word as its FILE)
    #[arg(long, value_name = "FILE", num_args = 0..=1, default_missing_value = "",
          require_equals = true, action = ArgAction::Append)]
    pub luks: Vec<String>,

    #[command(flatten)]
    pub key: KeyFileArgs,
}

/// `cairn lvm pvcreate`.
#[derive(Debug, Args)]
pub struct LvmPvcreateArgs {
    /// Files or block devices to make PVs
    #[arg(value_name = "PV")]
    pub pvs: Vec<PathBuf>,

    #[command(flatten)]
    pub devices: LvmDevices,

    /// Align the data area to SIZE instead of LCM(1 MiB, the device's full stripe)
    #[arg(long = "dataalignment", value_name = "SIZE", value_parser = parse_size)]
    pub data_alignment: Option<u64>,

    #[command(flatten)]
    pub wipe: WipeArgs,
}

/// The answer to "this device holds something else; overwrite it?", which lvm asks and
/// cairn does not: without one of these, a writing verb refuses and names what it found.
#[derive(Debug, Args)]
pub struct WipeArgs {
    /// Overwrite a device that holds another signature (a filesystem, a partition
    /// table, swap, md, LUKS, an LVM label); also take remote PVs over from an owner that
    /// did not release them (it is gone for good), as `cairn serve --force`
    #[arg(short, long)]
    pub force: bool,

    /// Answer yes to overwriting a signature (lvm's -y; the same as --force here)
    #[arg(short = 'y', long = "yes")]
    pub yes: bool,
}

impl WipeArgs {
    pub fn wipe(&self) -> bool {
        self.force || self.yes
    }
}

/// `cairn lvm pvs|vgs|lvs`.
#[derive(Debug, Args)]
pub struct LvmReportArgs {
    /// Files or block devices to look at (as --devices)
    #[arg(value_name = "PV")]
    pub pvs: Vec<PathBuf>,

    #[command(flatten)]
    pub devices: LvmDevices,

    /// Ask this `cairn serve` for the report when it serves the VG (default: any
    /// daemon in the runtime directory); a served RAID LV's report then has its
    /// SyncAction and Mismatches
    #[command(flatten)]
    pub control: crate::control::ControlArgs,
}

/// `cairn lvm vgcreate`.
#[derive(Debug, Args)]
pub struct LvmVgcreateArgs {
    /// Name of the new VG
    #[arg(value_name = "VG")]
    pub vg: String,

    /// Files or block devices to use as PVs
    #[arg(value_name = "PV")]
    pub pvs: Vec<PathBuf>,

    #[command(flatten)]
    pub devices: LvmDevices,

    /// Extent size: a power of two of at least 4 KiB, or a multiple of 128 KiB
    /// [default: 4M, raised to a multiple of the PVs' full stripe (a RAID6 of 3 data
    /// members with 64K chunks: 12M) so every extent, and every LV, starts on one]
    #[arg(short = 's', long = "physicalextentsize", value_name = "SIZE",
          value_parser = parse_size)]
    pub extent_size: Option<u64>,

    /// PVs are made of the devices that have no LVM label, as pvcreate makes them
    #[command(flatten)]
    pub wipe: WipeArgs,
}

/// `cairn lvm vgextend`.
#[derive(Debug, Args)]
pub struct LvmVgextendArgs {
    #[arg(value_name = "VG")]
    pub vg: String,

    /// New PVs (files or block devices); the VG's current PVs go in --devices/--md
    #[arg(value_name = "PV", required = true)]
    pub new_pvs: Vec<PathBuf>,

    #[command(flatten)]
    pub devices: LvmDevices,

    #[command(flatten)]
    pub wipe: WipeArgs,
}

/// `cairn lvm lvcreate`.
#[derive(Debug, Args)]
pub struct LvmLvcreateArgs {
    #[arg(value_name = "VG")]
    pub vg: String,

    /// Name of the new LV
    #[arg(short = 'n', long = "name", value_name = "NAME")]
    pub name: String,

    /// Size (rounded up to whole extents)
    #[arg(short = 'L', long = "size", value_name = "SIZE", value_parser = parse_size,
          required_unless_present = "extents", conflicts_with = "extents")]
    pub size: Option<u64>,

    /// Size in extents, or N%FREE / N%VG
    #[arg(short = 'l', long = "extents", value_name = "EXTENTS")]
    pub extents: Option<String>,

    /// Number of stripes (PVs to spread over; RAID: data stripes) [default: 1; raid10,
    /// raid0, raid4/5: 2; raid6: 3]
    #[arg(short = 'i', long = "stripes", value_name = "N")]
    pub stripes: Option<u32>,

    /// Stripe size [default: 64 KiB]
    #[arg(short = 'I', long = "stripesize", value_name = "SIZE", value_parser = parse_size)]
    pub stripe_size: Option<u64>,

    /// Segment type: linear, striped, raid1, raid10, raid0, raid4, raid5 (raid5_ls,
    /// _la, _ra, _rs, _n), raid6 (raid6_zr, _nr, _nc) [default: linear or striped; with
    /// -m, raid1 (raid10 with -i)]
    #[arg(long = "type", value_name = "TYPE")]
    pub segtype: Option<String>,

    /// Extra copies of the data (raid1: images - 1; raid10: copies - 1) [default: 1]
    #[arg(short = 'm', long = "mirrors", value_name = "N")]
    pub mirrors: Option<u32>,

    /// RAID: region size, the bytes one bit of the write-intent bitmap covers [default:
    /// 2 MiB]
    #[arg(short = 'R', long = "regionsize", value_name = "SIZE", value_parser = parse_size)]
    pub region_size: Option<u64>,

    /// RAID: skip the initial synchronisation (the LV is marked NOTSYNCED, as lvm does)
    #[arg(long = "nosync")]
    pub nosync: bool,

    /// The VG's PVs (files or block devices), as vgcreate takes them; the same as
    /// --devices PV,PV,...
    #[arg(value_name = "PV")]
    pub pvs: Vec<PathBuf>,

    #[command(flatten)]
    pub devices: LvmDevices,

    /// Take remote PVs over from an owner that did not release them (it is gone for
    /// good), as `cairn serve --force`; also starts a dirty degraded md array below
    #[arg(short, long)]
    pub force: bool,
}

/// `cairn lvm lvextend|lvreduce`.
#[derive(Debug, Args)]
pub struct LvmResizeArgs {
    /// The LV as VG/LV
    #[arg(value_name = "VG/LV")]
    pub lv: String,

    /// New size, or +SIZE (lvextend) / -SIZE (lvreduce) relative
    #[arg(
        short = 'L',
        long = "size",
        value_name = "[+|-]SIZE",
        allow_hyphen_values = true,
        required_unless_present = "extents",
        conflicts_with = "extents"
    )]
    pub size: Option<String>,

    /// New size in extents, or +N / -N relative
    #[arg(
        short = 'l',
        long = "extents",
        value_name = "[+|-]EXTENTS",
        allow_hyphen_values = true
    )]
    pub extents: Option<String>,

    /// lvreduce: really cut the data off the end. Both: take remote PVs over from an
    /// owner that did not release them (it is gone for good), as `cairn serve --force`
    #[arg(short, long)]
    pub force: bool,

    /// The VG's PVs (files or block devices), as vgcreate takes them; the same as
    /// --devices PV,PV,...
    #[arg(value_name = "PV")]
    pub pvs: Vec<PathBuf>,

    #[command(flatten)]
    pub devices: LvmDevices,
}

/// `cairn lvm lvrename`.
#[derive(Debug, Args)]
pub struct LvmLvrenameArgs {
    /// VG OLD NEW, or VG/OLD NEW (or VG/OLD VG/NEW)
    #[arg(value_name = "NAMES", num_args = 2..=3, required = true)]
    pub names: Vec<String>,

    #[command(flatten)]
    pub devices: LvmDevices,

    /// Take remote PVs over from an owner that did not release them (it is gone for
    /// good), as `cairn serve --force`; also starts a dirty degraded md array below
    #[arg(short, long)]
    pub force: bool,
}

/// `cairn lvm lvremove`.
#[derive(Debug, Args)]
pub struct LvmLvArgs {
    /// The LV as VG/LV
    #[arg(value_name = "VG/LV")]
    pub lv: String,

    /// The VG's PVs (files or block devices), as vgcreate takes them; the same as
    /// --devices PV,PV,...
    #[arg(value_name = "PV")]
    pub pvs: Vec<PathBuf>,

    #[command(flatten)]
    pub devices: LvmDevices,

    /// Take remote PVs over from an owner that did not release them (it is gone for
    /// good), as `cairn serve --force`; also starts a dirty degraded md array below
    #[arg(short, long)]
    pub force: bool,
}

/// `cairn lvm lvconvert`.
#[derive(Debug, Args)]
pub struct LvmLvconvertArgs {
    /// The RAID LV as VG/LV
    #[arg(value_name = "VG/LV")]
    pub lv: String,

    /// Rebuild images that missed writes, and move images off missing PVs to PVs with
    /// room
    #[arg(long, conflicts_with = "replace", required_unless_present = "replace")]
    pub repair: bool,

    /// Move the image(s) on this PV (a device name or PV key) to another PV and rebuild
    #[arg(long, value_name = "PV")]
    pub replace: Option<String>,

    /// The VG's PVs (files or block devices); PVs that are gone may be left out
    #[arg(value_name = "PV")]
    pub pvs: Vec<PathBuf>,

    #[command(flatten)]
    pub devices: LvmDevices,

    /// Take remote PVs over from an owner that did not release them (it is gone for
    /// good), as `cairn serve --force`; also starts a dirty degraded md array below
    #[arg(short, long)]
    pub force: bool,

    /// A served LV is repaired by the `cairn serve` serving it (found in the runtime
    /// directory, or given here), its images rebuilt in the background
    #[command(flatten)]
    pub control: crate::control::ControlArgs,
}

pub(crate) const LVM_LVCONVERT_EXAMPLES: &str = "\
Examples:
  cairn lvm lvconvert --repair vg0/r10 --devices p0,p2,p3,p4   # p1 is gone: its image moves
  cairn lvm lvconvert --replace p1 vg0/r10 --devices p0,p1,p2,p3,p4
  cairn lvm lvconvert --repair vg0/r10 --devices p0,p2,p3,p4 --control /run/cairn/control.sock
      # served: the daemon moves the image and rebuilds it while serving (cairn status)";

/// `cairn lvm lvchange`.
#[derive(Debug, Args)]
pub struct LvmLvchangeArgs {
    /// The RAID LV as VG/LV
    #[arg(value_name = "VG/LV")]
    pub lv: String,

    /// check: read every image and compare the copies (RAID1/10) or the parity
    /// (RAID4/5/6) with the data, writing nothing; repair: also make them agree (md's
    /// rules, docs/md-scrub.md)
    #[arg(long, value_name = "check|repair")]
    pub syncaction: String,

    /// Follow the scrub until it ends and print the mismatches; exit 1 when any (or a
    /// read error) were found
    #[arg(short, long)]
    pub wait: bool,

    /// The `cairn serve` serving the LV (found in the runtime directory, or given here)
    #[command(flatten)]
    pub control: crate::control::ControlArgs,
}

pub(crate) const LVM_LVCHANGE_EXAMPLES: &str = "\
Examples:
  cairn lvm lvchange --syncaction check vg0/r1 --wait   # scrub and print the mismatches
  cairn lvm lvchange --syncaction repair vg0/r1
  cairn lvm lvs --devices p0,p1     # SyncAction and Mismatches of the served RAID LVs
  cairn status                      # the scrub's progress on the LV";

/// `cairn lvm vgcfg-parse`.
#[derive(Debug, Args)]
pub struct LvmVgcfgParseArgs {
    /// A metadata text file
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_like_lvm() {
        assert_eq!(lvm_size(20 << 20), "20.00 MiB");
        assert_eq!(lvm_size(1536 << 20), "1.50 GiB");
        assert_eq!(lvm_short_size(60 << 20), "60.00m");
        assert_eq!(lvm_short_size(0), "0");
        assert_eq!(lvm_short_size(512), "512b");
    }

    #[test]
    fn vg_lv_names() {
        assert_eq!(vg_lv("vg/lv").unwrap(), ("vg", "lv"));
        assert_eq!(vg_lv("/dev/vg/lv").unwrap(), ("vg", "lv"));
        assert!(vg_lv("vg").is_err());
        assert!(vg_lv("vg/").is_err());
    }

    fn resize_args(size: Option<&str>, extents: Option<&str>) -> LvmResizeArgs {
        LvmResizeArgs {
            lv: "vg/lv".into(),
            size: size.map(str::to_string),
            extents: extents.map(str::to_string),
            force: false,
            pvs: vec![],
            devices: no_devices(),
        }
    }

    #[test]
    fn resize_deltas() {
        let m = 4u64 << 20;
        assert_eq!(
            resize_delta(&resize_args(Some("+8M"), None), true, 5, m).unwrap(),
            2
        );
        assert_eq!(
            resize_delta(&resize_args(Some("+5M"), None), true, 5, m).unwrap(),
            2
        );
        assert_eq!(
            resize_delta(&resize_args(Some("28M"), None), true, 5, m).unwrap(),
            2
        );
        assert!(resize_delta(&resize_args(Some("20M"), None), true, 5, m).is_err());
        assert_eq!(
            resize_delta(&resize_args(None, Some("+3")), true, 5, m).unwrap(),
            3
        );
        assert_eq!(
            resize_delta(&resize_args(None, Some("-2")), false, 5, m).unwrap(),
            2
        );
        assert_eq!(
            resize_delta(&resize_args(None, Some("3")), false, 5, m).unwrap(),
            2
        );
        assert_eq!(
            resize_delta(&resize_args(Some("-8M"), None), false, 5, m).unwrap(),
            2
        );
        // Cutting 5M of 4M extents cuts one whole extent (the new size rounds up).
        assert_eq!(
            resize_delta(&resize_args(Some("-5M"), None), false, 5, m).unwrap(),
            1
        );
        assert_eq!(
            resize_delta(&resize_args(Some("12M"), None), false, 5, m).unwrap(),
            2
        );
    }
}
