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

use cairn_block::{BlockDevice, ErrorKind};
use cairn_md::{
    probe_signatures, Array, ArrayReport, BitmapChoice, CreateOptions, Examine, FeaturePolicy,
    Level, ParityAlgorithm, Raid0Layout, Raid10Layout, Sectors, Superblock,
};
use serde::Serialize;

use crate::global::Global;
use cairn_stack::md::{degraded_warning, export_name_for};
// ---- the command line (clap) ----------------------------------------------------
//

pub(crate) const MD_LONG: &str = "\
md RAID arrays, in the on-disk format of Linux md (superblock v1.2, the kernel's data \
layout), with mdadm's words: an array cairn creates is one `mdadm --examine` recognises \
and a Linux host can assemble, and members mdadm wrote can be served by cairn.

Serve an array with `cairn serve --md MEMBER,MEMBER,...[:NAME]`.";

/// `cairn md ...`.
#[derive(Debug, Subcommand)]
pub enum MdCommand {
    /// Create a new array on files or block devices (mdadm --create)
    #[command(long_about = MD_CREATE_LONG, after_help = MD_CREATE_EXAMPLES)]
    Create(MdCreateArgs),

    /// Print each member's md superblock (mdadm --examine)
    #[command(long_about = MD_EXAMINE_LONG, after_help = MD_EXAMINE_EXAMPLES)]
    Examine(MdExamineArgs),

    /// Assemble an array read-only and print its state (mdadm --detail)
    #[command(long_about = MD_DETAIL_LONG, after_help = MD_DETAIL_EXAMPLES)]
    Detail(MdDetailArgs),

    /// Mark a member of a served array faulty (mdadm --fail)
    #[command(long_about = crate::md_manage::FAIL_LONG)]
    Fail(crate::md_manage::MdMemberArgs),

    /// Take a faulty member or a spare out of a served array (mdadm --remove)
    #[command(long_about = crate::md_manage::REMOVE_LONG)]
    Remove(crate::md_manage::MdMemberArgs),

    /// Add a spare, or a former member back, to a served array (mdadm --add)
    #[command(long_about = crate::md_manage::ADD_LONG)]
    Add(crate::md_manage::MdAddArgs),

    /// Copy a member onto a new device and swap them, staying redundant (mdadm --replace)
    #[command(long_about = crate::md_manage::REPLACE_LONG)]
    Replace(crate::md_manage::MdReplaceArgs),

    /// Scrub a served array: compare parity/copies with the data (md's check)
    #[command(long_about = crate::md_manage::CHECK_LONG)]
    Check(crate::md_manage::MdScrubArgs),

    /// Scrub a served array and rewrite what does not match (md's repair)
    #[command(long_about = crate::md_manage::REPAIR_LONG)]
    Repair(crate::md_manage::MdScrubArgs),

    /// Show each member's owner record: generation, owner, since when (docs/fencing.md)
    Owner(crate::fence::OwnerArgs),
}

pub(crate) const MD_CREATE_LONG: &str = "\
Create a new md array on MEMBERs (files or block devices), as `mdadm --create` does: \
each member gets an md superblock v1.2 at 4 KiB, data starts at mdadm's default data \
offset, and the data layout is the kernel's, so `mdadm --examine` reads the members and a \
Linux host can assemble them.

Members are given in role order (the first is role 0). With --size, member files that do \
not exist yet are created sparse with that size; they read as zeroes, so the array needs \
no initial sync and is clean at once. Members that already hold data make a redundant \
array \"resync pending\" unless --assume-clean: `cairn serve` then resyncs it in the \
background (parity or mirrors rewritten from the data), as md does after a create.

RAID4/5/6 arrays get a partial-parity log by default (--write-hole log): before a write \
that covers part of a stripe, the parity of the chunks it does not touch goes durably to \
the parity members' free space between the bad-block log and the data. After a crash \
that log lets cairn start the array even with a member gone, with every block that was \
not being written intact; without it (--write-hole none, or an array mdadm made) that \
start needs --force and may rebuild garbage. The price is one extra durable write per \
partial-stripe write; see docs/write-hole.md. No md feature bit is set: Linux ignores \
the log.

cairn refuses a member that carries an md superblock or a filesystem, LUKS or LVM \
signature, naming what it found; --force overwrites it.

The array uses the smallest member's size. Its full stripe (chunk x data members) is the \
I/O size that avoids read-modify-write: cairn serve advertises it to NBD clients, and \
mkfs.ext4 wants it as -E stride=CHUNK/4K,stripe-width=FULL-STRIPE/4K.";

pub(crate) const MD_CREATE_EXAMPLES: &str = "\
Examples:
  cairn md create --level 6 --chunk 64K --raid-devices 4 --size 1G d0.img d1.img d2.img d3.img
  cairn md create -l 5 -n 3 /dev/sdb /dev/sdc /dev/sdd          # 512K chunk, left-symmetric
  cairn md create -l 10 -p f2 -n 4 --size 2G --name data r0 r1 r2 r3
  cairn md create -l 1 -n 2 --force old-a.img old-b.img         # overwrite what is there

Levels: linear, 0, 1, 4, 5, 6, 10 (or raid0, raid5, mirror, stripe, ...).
Layouts: RAID5/6 left-symmetric (ls, default), left-asymmetric (la), right-symmetric (rs),
  right-asymmetric (ra), parity-first, parity-last, ddf-zero-restart, ddf-N-restart,
  ddf-N-continue (for RAID5 these three are mdadm's aliases of ra, la, ls), and for RAID6
  also the -6 forms; RAID10 nN (near, default n2), fN (far), oN (offset); RAID0 original,
  alternate. RAID4, RAID1 and linear take no layout (RAID4's parity is the last member).";

pub(crate) const MD_EXAMINE_LONG: &str = "\
Print each MEMBER's md superblock with mdadm --examine's fields and wording: array UUID, \
name, level, layout, chunk, raid devices, this member's role, events, state, checksum.

A member without an md superblock, or with a bad one (wrong checksum, impossible \
fields), is reported on stderr naming the member and what is wrong; the others are still \
examined, and the exit status is then non-zero. Members are only read.";

pub(crate) const MD_EXAMINE_EXAMPLES: &str = "\
Examples:
  cairn md examine d0.img d1.img d2.img d3.img
  cairn md examine --json /dev/sdb | jq '.[0].examine.array_uuid'";

pub(crate) const MD_DETAIL_LONG: &str = "\
Assemble the array the MEMBERs belong to, read-only, and print its state as mdadm \
--detail does: level, layout, chunk, size, state (clean, active, degraded, resync \
pending), and each role with the member that fills it or \"missing\".

Members are opened read-only and nothing is written: not even the superblocks, so the \
array's event count and state stay as they are. A member file that does not exist counts \
as missing (the array shows as degraded, if its level tolerates it).";

pub(crate) const MD_DETAIL_EXAMPLES: &str = "\
Examples:
  cairn md detail d0.img d1.img d2.img d3.img
  cairn md detail --json /dev/sd[b-e] | jq .state_text";

/// `cairn md create`.
#[derive(Debug, Args)]
pub struct MdCreateArgs {
    /// RAID level: linear, 0, 1, 4, 5, 6, 10 (also raid5, mirror, stripe, ...)
    #[arg(short, long, value_name = "LEVEL", value_parser = parse_level)]
    pub level: cairn_md::Level,

    /// Chunk size, e.g. 64K, 512K, 1M: a power of two from 4K to 4M (a bare number is
    /// KiB, as for mdadm) [default: 512K for levels that stripe]
    #[arg(short, long, value_name = "SIZE", value_parser = parse_chunk)]
    pub chunk: Option<u64>,

    /// Data layout: left-symmetric, la, rs, ... (RAID5/6), n2, f2, o2 (RAID10)
    /// [default: mdadm's for the level]
    #[arg(short = 'p', long, value_name = "LAYOUT")]
    pub layout: Option<String>,

    /// Number of members; must match the MEMBERs given
    #[arg(short = 'n', long, value_name = "N")]
    pub raid_devices: u32,

    /// Array name stored in the superblocks (at most 32 bytes) [default: md0]
    #[arg(short = 'N', long, value_name = "NAME", default_value = "md0")]
    pub name: String,

    /// Overwrite members that carry an md superblock or a filesystem signature
    #[arg(short, long)]
    pub force: bool,

    /// Mark the array clean without checking that parity/mirrors match (mdadm
    /// --assume-clean); only for members known to be zeroed or consistent
    #[arg(long)]
    pub assume_clean: bool,

    /// Write-intent bitmap: `internal` keeps one after the superblock (mdadm
    /// --bitmap=internal), so that after a crash, or when a member comes back, only the
    /// regions written shortly before are resynced instead of the whole array; each
    /// first write to a region costs one extra small write per member. `none` resyncs
    /// everything after a crash [default: internal for RAID1/4/5/6/10; linear and RAID0
    /// have nothing to resync]
    #[arg(long, value_name = "internal|none", value_parser = ["internal", "none"])]
    pub bitmap: Option<String>,

    /// Bytes one bitmap bit covers (mdadm --bitmap-chunk), e.g. 64K, 1M, 64M: a power of
    /// two of at least 4K. Smaller chunks resync less after a crash but set bits more
    /// often; the bits must fit the space mdadm leaves (4K for components up to 8G, so
    /// e.g. at least 64K per 1.8G). [default: 64M, larger on huge arrays]
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub bitmap_chunk: Option<u64>,
    /// RAID4/5/6 write-hole protection: `log` keeps a partial-parity log in the free
    /// space before the data, so a crash during a partial-stripe write followed by a
    /// lost member cannot corrupt data that was not being written, and such an array
    /// may start dirty and degraded without --force. It costs one extra durable write
    /// per partial-stripe write (full-stripe writes are almost free). `none` is mdadm's
    /// behaviour without a PPL [default: log]
    #[arg(long, value_name = "MODE", value_enum, default_value_t = WriteHole::Log)]
    pub write_hole: WriteHole,

    /// Create member files that do not exist yet, sparse, of this size (e.g. 1G); they
    /// read as zeroes, so the new array needs no sync. (Not mdadm's --size, which limits
    /// the space used on each member.)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub size: Option<u64>,

    /// Files or block devices, in role order
    #[arg(value_name = "MEMBER", required = true)]
    pub members: Vec<PathBuf>,
}

/// How `cairn md create` closes the RAID4/5/6 write hole.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WriteHole {
    /// A partial-parity log on the members (ignored for levels without parity)
    Log,
    /// No protection: a dirty degraded start needs --force
    None,
}

/// `cairn md examine`.
#[derive(Debug, Args)]
pub struct MdExamineArgs {
    /// Files or block devices holding md members
    #[arg(value_name = "MEMBER", required = true)]
    pub members: Vec<PathBuf>,
}

/// `cairn md detail`.
#[derive(Debug, Args)]
pub struct MdDetailArgs {
    /// The array's members (any order); missing files count as missing members
    #[arg(value_name = "MEMBER", required = true)]
    pub members: Vec<PathBuf>,

    /// Assemble even when the array is degraded and was not shut down cleanly, degraded by
    /// a stale member, or only with failed members taken back (mdadm --assemble --force)
    #[arg(short, long)]
    pub force: bool,
}

pub(crate) fn parse_level(s: &str) -> Result<cairn_md::Level, String> {
    cairn_md::Level::parse(&s.to_ascii_lowercase()).ok_or_else(|| {
        format!(
            "unknown RAID level {s:?}; use one of linear, 0, 1, 4, 5, 6, 10 (or raid0, \
             raid1, raid4, raid5, raid6, raid10, mirror, stripe)"
        )
    })
}

/// mdadm reads a bare `--chunk 64` as KiB; a size with a unit is taken as written.
pub(crate) fn parse_chunk(s: &str) -> Result<u64, String> {
    let bytes = if s.trim().chars().all(|c| c.is_ascii_digit()) && !s.trim().is_empty() {
        s.trim()
            .parse::<u64>()
            .ok()
            .and_then(|k| k.checked_mul(1024))
            .ok_or_else(|| format!("{s:?} is too large"))?
    } else {
        parse_size(s).map_err(|e| e.to_string())?
    };
    if !bytes.is_power_of_two() || !(4096..=4 << 20).contains(&bytes) {
        return Err(format!(
            "chunk {s} is not usable: md needs a power of two from 4K to 4M (e.g. 64K, \
             512K, 1M)"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
use cairn_stack::md::parse_md_spec;
use cairn_stack::size::format_size;
use cairn_stack::{Hooks, Options};

use crate::error::{CliError, Result};
use crate::shell::shell_word;
use cairn_stack::size::parse_size;
use clap::Args;
use clap::Subcommand;

/// A member for `create` and `examine`: opened as serving would, without counters.
fn open_member(p: &Path, read_only: bool) -> Result<Arc<dyn BlockDevice>> {
    cairn_stack::md::open_member(
        p,
        read_only,
        &Hooks::default(),
        cairn_stack::leaf::DEFAULT_REMOTE_TIMEOUT,
    )
}

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
        MdCommand::Owner(a) => crate::fence::owner(&a, global),
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
        if cairn_stack::leaf::is_remote(p) {
            continue; // a remote export exists or does not answer; opened below
        }
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
        opts.write_journal = a.write_hole == WriteHole::Log;
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
    // Quoted for the shell where needed (a URI's '?' and '&').
    let list: Vec<String> = members.iter().map(|p| shown(p)).collect();
    s.push_str(&format!(
        "\nNext:\n  cairn md examine {}\n  cairn serve --md {}\n",
        list.iter()
            .map(|w| shell_word(w))
            .collect::<Vec<_>>()
            .join(" "),
        shell_word(&format!("{}:{}", list.join(","), export_name_for(&r.name)))
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
    let opts = Options {
        read_only: true,
        force: a.force,
        ..Options::default()
    };
    let (array, missing) = cairn_stack::md::assemble(&a.members, &opts)?;
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
