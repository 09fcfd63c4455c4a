//! `cairn scan PATH...` and `cairn serve --scan PATH...`: the stack library's discovery
//! ([`cairn_stack::discover`]) with the terminal for passphrases and the report printed.

use cairn_stack::discover::{scan, ScanOptions};

use crate::error::Result;
use crate::global::Global;
use clap::Args;
use std::path::PathBuf;

// ---- the verbs --------------------------------------------------------------------

/// `cairn scan`: what `serve --scan` would bring up; writes nothing, asks nothing.
pub fn run(a: &ScanArgs, global: &Global) -> Result<()> {
    let opts = ScanOptions {
        read_only: true,
        force: a.force,
        key_file: a.key_file.clone(),
        key_dir: a.key_dir.clone(),
        dry_run: true,
        ..ScanOptions::default()
    };
    let (exports, report) = scan(&a.paths, &opts)?;
    // Arrays on read-only members: closing them (on drop) writes nothing.
    drop(exports);
    if global.json {
        println!("{}", serde_json::to_string(&report).expect("serialisable"));
    } else {
        print!("{}", report.text());
    }
    Ok(())
}

// ---- the command line (clap) ----------------------------------------------------
//

pub(crate) const SCAN_LONG: &str = "\
Look at PATHs (files, block devices, directories of member images) and report what \
`cairn serve --scan` would bring up, bottom-up: md arrays from the members found \
(grouped by array UUID; degraded when members are missing), LUKS volumes on files and \
on arrays, then LVM2 volume groups on files, arrays and LUKS volumes (each LV an export \
named VG/LV). Nothing is written and no passphrase is asked for: arrays are assembled \
read-only and LUKS headers are read but not unlocked (so LVM inside LUKS shows up only \
when serving, once unlocked).

Rules: a directory is read one level deep; hidden files, empty files, subdirectories, \
the key file and the key directory are skipped. Only md superblock 1.2 arrays are \
assembled. A directory scan exports recognised stacks only: a file in it with no md, \
LUKS or LVM2 signature is skipped, but a file named on its own is exported as a plain \
disk. A degraded array that was not shut down cleanly is refused unless --force. A LUKS \
volume's key is DIR/<uuid> or DIR/<uuid>.key in --key-dir, else --key-file, else (when \
serving on a terminal) asked for; with none it is skipped with a warning. Export names \
are the array's name or the file's name; a clash gets -2, -3, ... appended.";

pub(crate) const SCAN_EXAMPLES: &str = "\
Examples:
  cairn scan /srv/disks                       # what is there, and what would be served
  cairn scan --json /srv/disks --key-dir /etc/cairn/keys
  cairn serve --scan /srv/disks --key-file key  # ... and serve it";

/// `cairn scan`.
#[derive(Debug, Args)]
pub struct ScanArgs {
    /// Files, block devices or directories to look at
    #[arg(value_name = "PATH", required = true)]
    pub paths: Vec<PathBuf>,

    /// The passphrase file serve would use (reported, not read)
    #[arg(long, value_name = "FILE", visible_alias = "keyfile")]
    pub key_file: Option<PathBuf>,

    /// Passphrases by LUKS UUID: DIR/<uuid> or DIR/<uuid>.key (reported, not read)
    #[arg(long, value_name = "DIR")]
    pub key_dir: Option<PathBuf>,

    /// Assemble an array that cannot start as it is, as serve --force would: degraded and
    /// not shut down cleanly, degraded by a stale member, or only with failed members
    /// taken back (mdadm --assemble --force)
    #[arg(short, long)]
    pub force: bool,
}
