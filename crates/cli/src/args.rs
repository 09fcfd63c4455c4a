//! The command line, as clap derive structs. Help text lives here; behaviour does not.

use std::path::PathBuf;

use cairn_nbd::Listen;
use clap::builder::TypedValueParser as _;
use clap::{ArgAction, Args, Parser, Subcommand};

use crate::size::parse_size;

/// Requests one connection runs at once for `cairn serve`: measured in docs/BENCHMARKS.md.
pub const DEFAULT_THREADS: u16 = 32;

/// `cairn serve --max-connections` and `--client-timeout` defaults (quickstart too).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 256;
pub const DEFAULT_CLIENT_TIMEOUT: u64 = 30;

const ABOUT: &str = "The Linux storage stack in one userspace program, served over NBD";

const LONG_ABOUT: &str = "\
The Linux storage stack in one userspace program, served over NBD.

cairn exports files and block devices as NBD (Network Block Device) exports that \
qemu, the libnbd tools (nbdinfo, nbdcopy, nbdfuse), fio and the Linux nbd client can use. \
It runs as an ordinary process: no kernel modules, no root needed for the data path.

cairn serves plain files, block devices, md RAID arrays (levels 0, 1, 4, 5, 6, 10 and \
linear, in the on-disk format mdadm reads and writes, with spares, rebuilds, scrubs and \
the write-intent bitmap), LUKS2/LUKS1 encrypted volumes (in the format cryptsetup reads \
and writes) and LVM2 logical volumes (in lvm's format), on their own or stacked: md -> \
LUKS -> LVM is the classic stack `cairn quickstart` serves.";

const EXAMPLES: &str = "\
Examples:
  cairn quickstart                      # demo disk, served, with commands to try
  cairn serve disk.img                  # export \"disk\" on the default socket and port
  cairn serve /dev/sdb:backup --read-only
  cairn serve --listen tcp:127.0.0.1:10809 vm1.img vm2.img
  cairn md create --level 6 --chunk 64K --raid-devices 4 --size 1G d0.img d1.img d2.img d3.img
  cairn serve --md d0.img,d1.img,d2.img,d3.img:data   # the RAID6 above, exported as \"data\"
  cairn luks format --md d0.img,d1.img,d2.img,d3.img  # encrypt the array (asks a passphrase)
  cairn serve --md d0.img,d1.img,d2.img,d3.img:data --luks   # ... and serve it decrypted
  nbdinfo nbd://127.0.0.1:10809/vm1     # look at an export from another shell

Run `cairn COMMAND --help` for details on each command.";

/// `cairn`: global options and one command.
#[derive(Debug, Parser)]
#[command(
    name = "cairn",
    version,
    about = ABOUT,
    long_about = LONG_ABOUT,
    after_help = EXAMPLES,
    propagate_version = true,
    max_term_width = 100
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,

    #[command(subcommand)]
    pub command: Command,
}

/// Options every command takes.
#[derive(Debug, Clone, Args)]
pub struct Global {
    /// Log more on stderr: -v info, -vv debug, -vvv trace (RUST_LOG, if set, wins)
    #[arg(short, long, action = ArgAction::Count, global = true)]
    pub verbose: u8,

    /// Print results as one line of JSON on stdout, for scripts
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Export files or block devices over NBD
    #[command(long_about = SERVE_LONG, after_help = SERVE_EXAMPLES)]
    Serve(ServeArgs),

    /// Show the running server's stacks as a tree: states, sizes, background work
    #[command(long_about = STATUS_LONG, after_help = STATUS_EXAMPLES)]
    Status(StatusArgs),

    /// Live I/O per export and per md member, refreshed like iostat -x
    #[command(long_about = TOP_LONG, after_help = TOP_EXAMPLES)]
    Top(TopArgs),

    /// Create a demo RAID6 -> LUKS2 stack on sparse files and serve it: the fastest way to
    /// try cairn
    #[command(long_about = QUICKSTART_LONG, after_help = QUICKSTART_EXAMPLES)]
    Quickstart(QuickstartArgs),

    /// md RAID arrays (mdadm's format): create, examine, detail, fail, add, remove, replace,
    /// check, repair
    #[command(subcommand, long_about = MD_LONG)]
    Md(MdCommand),

    /// LUKS encryption (cryptsetup's format): format, dump, add-key, remove-key, ...
    #[command(subcommand, long_about = LUKS_LONG, after_help = LUKS_EXAMPLES)]
    Luks(LuksCommand),

    /// Report the md arrays and LUKS volumes on files, block devices and directories,
    /// and what `cairn serve --scan` would export; writes nothing
    #[command(long_about = SCAN_LONG, after_help = SCAN_EXAMPLES)]
    Scan(ScanArgs),

    /// Print the mkfs.ext4 and mkfs.xfs options that match an export's RAID geometry,
    /// and warn about misaligned layers
    #[command(long_about = ADVISE_LONG, after_help = ADVISE_EXAMPLES)]
    Advise(AdviseArgs),

    /// LVM2 volume groups (lvm's format): pvcreate, vgcreate, lvcreate, lvs, ...
    #[command(subcommand, long_about = LVM_LONG, after_help = LVM_EXAMPLES)]
    Lvm(LvmCommand),
}

const SCAN_LONG: &str = "\
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

const SCAN_EXAMPLES: &str = "\
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

const ADVISE_LONG: &str = "\
Print the mkfs.ext4 and mkfs.xfs command lines that match an export's real geometry: \
stride = chunk / 4 KiB and stripe_width = stride x data members for ext4, su = chunk and \
sw = data members for XFS. Data members: RAID0 all of them, RAID4/5 one less, RAID6 two \
less, RAID10 the members divided by the near copies (as the kernel counts them); RAID1 \
and linear arrays do not stripe, so there is nothing to set. A striped LV uses its \
stripe size and count.

It also checks that every layer between the export and the array starts on a full \
stripe (a LUKS payload offset, an LV's first extent): a layer that does not turns each \
full-stripe write into two partial ones, and cairn says which layer and how to fix it. \
A LUKS sector smaller than the 4 KiB filesystem block is reported too.

With EXPORT alone it asks the running server (--control). With --md, --luks or --scan \
it assembles the stack itself, read-only, and needs no passphrase (only the LUKS header \
is read). Give --device with the block device the export is attached as (nbd-client, or \
nbdfuse + losetup) to get lines to paste; without it they say DEVICE.";

const ADVISE_EXAMPLES: &str = "\
Examples:
  cairn advise data                                   # ask the running server
  cairn advise --md d0.img,d1.img,d2.img,d3.img       # RAID6 4 x 64K: stride=16,stripe_width=32
  cairn advise --md d0.img,d1.img,d2.img,d3.img --luks --device /dev/nbd0
  cairn advise --scan /srv/disks --json";

/// `cairn advise`.
#[derive(Debug, Args)]
pub struct AdviseArgs {
    /// The export to advise on [default with --md/--luks/--scan: every one found]
    #[arg(value_name = "EXPORT", required_unless_present_any = ["md", "luks", "scan"])]
    pub export: Option<String>,

    /// The running server's control socket [default: the daemon in the runtime directory
    /// that serves EXPORT]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,

    /// The block device the export is attached as, for the printed command lines
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<String>,

    /// Offline: the md array on these members, as for serve --md
    #[arg(long, value_name = "MEMBER,MEMBER,...[:NAME]")]
    pub md: Vec<String>,

    /// Offline: a LUKS volume, as for serve --luks; bare, next to --md: the arrays hold LUKS
    #[arg(long, value_name = "DEVICE[:NAME]", num_args = 0..=1, default_missing_value = "")]
    pub luks: Vec<String>,

    /// Offline: the stacks found on PATH, as for serve --scan; repeatable
    #[arg(long, value_name = "PATH")]
    pub scan: Vec<PathBuf>,

    /// Accepted for symmetry with serve; not needed (only the LUKS header is read)
    #[arg(long, value_name = "FILE", visible_alias = "keyfile")]
    pub key_file: Option<PathBuf>,

    /// Offline: assemble a degraded array that was not shut down cleanly
    #[arg(short, long)]
    pub force: bool,
}

const MD_LONG: &str = "\
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
}

const MD_CREATE_LONG: &str = "\
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

const MD_CREATE_EXAMPLES: &str = "\
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

const MD_EXAMINE_LONG: &str = "\
Print each MEMBER's md superblock with mdadm --examine's fields and wording: array UUID, \
name, level, layout, chunk, raid devices, this member's role, events, state, checksum.

A member without an md superblock, or with a bad one (wrong checksum, impossible \
fields), is reported on stderr naming the member and what is wrong; the others are still \
examined, and the exit status is then non-zero. Members are only read.";

const MD_EXAMINE_EXAMPLES: &str = "\
Examples:
  cairn md examine d0.img d1.img d2.img d3.img
  cairn md examine --json /dev/sdb | jq '.[0].examine.array_uuid'";

const MD_DETAIL_LONG: &str = "\
Assemble the array the MEMBERs belong to, read-only, and print its state as mdadm \
--detail does: level, layout, chunk, size, state (clean, active, degraded, resync \
pending), and each role with the member that fills it or \"missing\".

Members are opened read-only and nothing is written: not even the superblocks, so the \
array's event count and state stay as they are. A member file that does not exist counts \
as missing (the array shows as degraded, if its level tolerates it).";

const MD_DETAIL_EXAMPLES: &str = "\
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

fn parse_level(s: &str) -> Result<cairn_md::Level, String> {
    cairn_md::Level::parse(&s.to_ascii_lowercase()).ok_or_else(|| {
        format!(
            "unknown RAID level {s:?}; use one of linear, 0, 1, 4, 5, 6, 10 (or raid0, \
             raid1, raid4, raid5, raid6, raid10, mirror, stripe)"
        )
    })
}

/// mdadm reads a bare `--chunk 64` as KiB; a size with a unit is taken as written.
fn parse_chunk(s: &str) -> Result<u64, String> {
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

const SERVE_LONG: &str = "\
Export files or block devices over NBD.

Each FILE becomes one export. Its name is the file name without its extension \
(disk.img -> \"disk\", /dev/sdb -> \"sdb\"), or NAME when given as FILE:NAME. Clients \
pick an export by name: nbd://HOST:PORT/NAME or nbd+unix:///NAME?socket=PATH.

Without --listen, cairn listens on a Unix socket ($XDG_RUNTIME_DIR/cairn/nbd.sock, or \
/run/cairn/nbd.sock as root) and on TCP 127.0.0.1:10809, the standard NBD port, on \
loopback only. Nothing is reachable from other machines unless you ask for it with \
--listen tcp:0.0.0.0:10809 (NBD has no authentication: only do that on a trusted \
network).

cairn runs in the foreground. Ctrl-C (SIGINT), SIGTERM or SIGHUP (its terminal closing) \
stops it cleanly: requests already received are answered, data is flushed to the files, \
then it exits 0. A second signal exits at once.

--md serves an md RAID array (made by `cairn md create` or by mdadm) from its members. \
The array is marked active while it is written and clean again when cairn stops, as the \
kernel does. NBD clients are told the full stripe as the preferred block size (when it \
is a power of two), so they write whole stripes and avoid read-modify-write.

--luks opens a LUKS2 or LUKS1 volume (made by `cairn luks format`, cryptsetup or qemu-img) \
and exports its decrypted contents: clients read and write plaintext, cairn encrypts \
(aes-xts-plain64) on the way to the disk, as dm-crypt does. `--md M1,M2,... --luks` does \
the same for an md array with LUKS on it. The passphrase comes from --key-file or is \
asked for on the terminal; it is used once to unlock the volume key and then dropped.";

const SERVE_EXAMPLES: &str = "\
Examples:
  cairn serve disk.img                         # export \"disk\"
  cairn serve --md d0.img,d1.img,d2.img,d3.img:data
                                               # an md array (cairn md create) as \"data\"
  cairn serve --luks vol.img --key-file key     # a LUKS volume, decrypted, as \"vol\"
  cairn serve --md d0.img,d1.img,d2.img,d3.img:data --luks --key-file key
                                               # LUKS2 over an md array
  cairn serve a.img b.img:data                 # exports \"a\" and \"data\"
  cairn serve --read-only /dev/sdb:backup      # a block device, read-only
  cairn serve --listen unix:/tmp/nbd.sock --listen tcp:127.0.0.1:0 --json disk.img
                                               # port 0: any free port, printed in the JSON

Then, from another shell:
  nbdinfo nbd://127.0.0.1:10809/disk
  qemu-img info nbd://127.0.0.1:10809/disk
  nbdcopy image.raw nbd://127.0.0.1:10809/disk";

const QUICKSTART_LONG: &str = "\
Create a demo stack, an md RAID6 array on four sparse files with LUKS2 encryption on \
it and an LVM volume group with two logical volumes on that, and serve it, printing the \
stack's details and the commands to connect.

The members are sparse files (they take no space until written) named \
demo-raid6-0.img ... demo-raid6-3.img in --dir, which defaults to $XDG_DATA_HOME/cairn \
(~/.local/share/cairn). The array uses a 64K chunk, so its full stripe is 128K (two \
data members), a size ordinary writes fill. Existing members are reused, never \
overwritten; with one or two of them gone the array starts degraded. It is served \
exactly as `cairn serve --md ... --luks` would: on the default Unix socket and on TCP \
127.0.0.1:10809 (or a free port if 10809 is busy), with LVM on the LUKS volume: two \
logical volumes, exported as \"demo/home\" (half the size) and \"demo/media\" (the rest).

The LUKS2 passphrase is a DEMO KEY, written to demo.key (mode 0600) in --dir, and its \
keyslot uses cheap argon2id costs so the demo starts at once: fine for trying cairn, not \
for data that must stay secret (use `cairn luks format` for that). A demo array made by \
an older cairn, without LUKS, is served as it is.

Stop it with Ctrl-C. Delete the member files and demo.key with `rm` when you are done.";

const QUICKSTART_EXAMPLES: &str = "\
Examples:
  cairn quickstart                         # 1 GiB RAID6 in ~/.local/share/cairn
  cairn quickstart --dir ./demo --array-size 4G";

/// `cairn serve`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("key_users").args(["luks", "scan", "config"]).multiple(true))]
pub struct ServeArgs {
    /// Files or block devices to export; append :NAME to choose the export name
    #[arg(value_name = "FILE[:NAME]", required_unless_present_any = ["md", "luks", "lvm", "scan", "config"])]
    pub exports: Vec<String>,

    /// Open this LUKS2 or LUKS1 volume (a file or block device) and export it decrypted
    /// as NAME [default: the file name]; repeatable. Given with no value next to --md,
    /// the md arrays themselves hold LUKS and are exported decrypted
    #[arg(long, value_name = "DEVICE[:NAME]", num_args = 0..=1, default_missing_value = "")]
    pub luks: Vec<String>,

    /// The LUKS passphrase, read from FILE's exact bytes (`-`: stdin) [default: ask on
    /// the terminal]
    #[arg(
        long,
        value_name = "FILE",
        visible_alias = "keyfile",
        requires = "key_users"
    )]
    pub key_file: Option<PathBuf>,

    /// Assemble the md array on these members (comma-separated, any order) and export
    /// it as NAME [default: the array's name]; repeatable. Missing member files make the
    /// array degraded, with a warning, when its level tolerates it
    #[arg(long, value_name = "MEMBER,MEMBER,...[:NAME]")]
    pub md: Vec<String>,

    /// Open the LVM2 volume groups on these PVs (comma-separated files or block devices;
    /// every PV of a VG must be given) and export each logical volume as VG/LV.
    /// Given with no value next to --md or --luks, those stacks are the PVs (the
    /// classic md -> LUKS -> LVM stack)
    #[arg(long, value_name = "PV,PV,...", num_args = 0..=1, default_missing_value = "")]
    pub lvm: Vec<String>,

    /// Start an md array that is degraded and was not shut down cleanly (its parity may
    /// not match where a write was interrupted), or degraded because a member given is
    /// stale (mdadm --run); or, when too many members failed, take back the freshest of
    /// them by event count (mdadm --assemble --force: data they missed may be
    /// inconsistent; run `cairn md check`)
    #[arg(short, long)]
    pub force: bool,

    #[command(flatten)]
    pub server: ServerOptions,

    /// Export everything read-only: clients may read but every write is refused
    #[arg(long)]
    pub read_only: bool,

    /// Open files with O_DIRECT, bypassing the page cache (block size becomes 4096)
    #[arg(long)]
    pub direct: bool,

    /// Find the stacks on PATH (a directory of member images, a file or a block device)
    /// and serve every one it can assemble: md arrays, LUKS on files and arrays;
    /// repeatable. A directory exports recognised stacks only (see `cairn scan --help`)
    #[arg(long, value_name = "PATH")]
    pub scan: Vec<PathBuf>,

    /// LUKS passphrases by volume: DIR/<LUKS UUID> or DIR/<LUKS UUID>.key, tried before
    /// --key-file
    #[arg(long, value_name = "DIR")]
    pub key_dir: Option<PathBuf>,

    /// Read listeners, settings and exports from this TOML file (docs/cairn.example.toml);
    /// options given on the command line win over it
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// How to serve, shared by `serve` and `quickstart`.
#[derive(Debug, Clone, Args)]
pub struct ServerOptions {
    /// Address to listen on: unix:PATH or tcp:ADDR:PORT (repeatable; default: a Unix
    /// socket and tcp:127.0.0.1:10809)
    #[arg(short, long = "listen", value_name = "ADDRESS")]
    pub listen: Vec<Listen>,

    /// Requests each client connection may have running at once. They run on one pool of
    /// worker threads shared by all connections (started when requests wait, ended when
    /// idle, at most 256), and their replies go out as each finishes. 32 matches the
    /// queue depth of common clients, so one connection gets the parallelism of a disk or
    /// network below; 1 answers one request at a time, in order
    #[arg(long, value_name = "N", default_value_t = DEFAULT_THREADS,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,

    /// Most client connections served at once, handshakes included; more are closed at
    /// once until some end
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_connections: u32,

    /// Seconds a client may take to finish the NBD handshake, and may go without reading
    /// a reply it is being sent, before it is disconnected. Such a client otherwise holds
    /// a connection slot, and the memory of its unsent replies, for ever
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_CLIENT_TIMEOUT,
          value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub client_timeout: u64,

    /// Export served to clients that ask for no name (default: the only export, if one)
    #[arg(long, value_name = "NAME")]
    pub default_export: Option<String>,

    /// Background resync speed kept while clients do I/O, KiB/s (md's speed_limit_min)
    #[arg(long, value_name = "KIB", default_value_t = 1000)]
    pub speed_limit_min: u64,

    /// Background resync speed ceiling when the array is idle, KiB/s (md's
    /// speed_limit_max)
    #[arg(long, value_name = "KIB", default_value_t = 200_000)]
    pub speed_limit_max: u64,

    /// Stripe cache of RAID4/5/6 arrays (md's stripe_cache_size, same unit: stripe heads
    /// of one 4 KiB page per member). Concurrent writes that each cover part of a stripe
    /// are held and merged into one full-stripe write, which needs no reads; a write is
    /// answered only once it is written. 0 turns it off [default: 256]
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(0..=32768))]
    pub stripe_cache_size: Option<u32>,

    /// Longest a partial-stripe write waits in the stripe cache for its neighbours, in
    /// milliseconds; FLUSH and FUA write held stripes at once [default: 2]
    #[arg(long, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub stripe_cache_hold_ms: Option<u64>,

    #[command(flatten)]
    pub operator: OperatorOptions,
}

impl ServerOptions {
    /// The resync pacing, in bytes per second.
    pub fn speed_limits(&self) -> cairn_md::SpeedLimits {
        let max = self.speed_limit_max.max(1).saturating_mul(1024);
        cairn_md::SpeedLimits {
            min: self.speed_limit_min.saturating_mul(1024).min(max),
            max,
        }
    }

    /// The stripe cache put over RAID4/5/6 arrays that are served writable.
    pub fn stripe_cache(&self) -> cairn_md::StripeCacheOptions {
        let d = cairn_md::StripeCacheOptions::default();
        cairn_md::StripeCacheOptions {
            size: self.stripe_cache_size.unwrap_or(d.size),
            hold: self
                .stripe_cache_hold_ms
                .map_or(d.hold, std::time::Duration::from_millis),
        }
    }
}

/// `cairn quickstart`.
#[derive(Debug, Args)]
pub struct QuickstartArgs {
    /// Directory for the demo array's members [default: $XDG_DATA_HOME/cairn, i.e. ~/.local/share/cairn]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Usable size of the demo stack when it is created, e.g. 512M, 1G, 20G (what the two
    /// LVs share; the four member files are sized to give it). `--size` is the old name
    #[arg(long = "array-size", alias = "size", value_name = "SIZE", default_value = "1G",
          value_parser = parse_size)]
    pub size: u64,

    /// Address to listen on: unix:PATH or tcp:ADDR:PORT (repeatable; default as for serve)
    #[arg(short, long = "listen", value_name = "ADDRESS")]
    pub listen: Vec<Listen>,
}

const LUKS_LONG: &str = "\
LUKS encryption in the on-disk format of cryptsetup: a volume cairn formats is one \
`cryptsetup open` unlocks, and a volume cryptsetup made (LUKS2, or LUKS1 as qemu-img and \
cryptsetup --type luks1 make) is one cairn serves. The verbs and options are \
cryptsetup's: format is luksFormat, dump is luksDump, add-key is luksAddKey, and so on.

DEVICE is a file or block device, or an md array given as --md MEMBER,MEMBER,... (its \
members, as for `cairn serve --md`): LUKS then sits on the array as dm-crypt sits on \
/dev/mdN, and format aligns the encrypted payload to the array's full stripe.

Passphrases are asked for on the terminal without echo, or read from --key-file FILE \
(its exact bytes: a trailing newline is part of the passphrase, so write key files with \
printf, not echo; `-` reads stdin). They are never taken from the command line, where \
other users could read them in the process list.

A passphrase that opens no keyslot ends with \"No key available with this passphrase.\" \
and exit status 2, as in cryptsetup. Serve a volume with `cairn serve --luks DEVICE`.";

const LUKS_EXAMPLES: &str = "\
Examples:
  truncate -s 1G vol.img && cairn luks format vol.img          # asks for a passphrase twice
  printf %s 'correct horse' > key && chmod 600 key
  cairn luks format -q --key-file key vol.img                  # no questions (scripts)
  cairn luks format --md d0.img,d1.img,d2.img,d3.img           # LUKS2 over an md array
  cairn luks dump vol.img
  cairn luks add-key --key-file key --new-key-file key2 vol.img
  cairn luks test --key-file key2 vol.img                      # \"Key slot 1 unlocked.\"
  cairn serve --luks vol.img --key-file key                    # export \"vol\", decrypted";

/// `cairn luks ...`.
#[derive(Debug, Subcommand)]
pub enum LuksCommand {
    /// Write a new LUKS2 header, making the device an empty encrypted volume (luksFormat)
    #[command(long_about = LUKS_FORMAT_LONG, after_help = LUKS_FORMAT_EXAMPLES)]
    Format(LuksFormatArgs),

    /// Print the LUKS header: segments, keyslots, digests, no key material (luksDump)
    #[command(long_about = LUKS_DUMP_LONG)]
    Dump(LuksDeviceArgs),

    /// Add a passphrase in a new keyslot, given an existing one (luksAddKey)
    #[command(long_about = LUKS_ADD_KEY_LONG)]
    AddKey(LuksNewKeyArgs),

    /// Remove the keyslot a passphrase opens (luksRemoveKey)
    #[command(long_about = LUKS_REMOVE_KEY_LONG)]
    RemoveKey(LuksKeyArgs),

    /// Replace a passphrase with a new one, in place (luksChangeKey)
    #[command(long_about = LUKS_CHANGE_KEY_LONG)]
    ChangeKey(LuksNewKeyArgs),

    /// Check a passphrase and print which keyslot it opens (open --test-passphrase)
    #[command(long_about = LUKS_TEST_LONG)]
    Test(LuksKeyArgs),

    /// Save the LUKS2 header and keyslots to a file (luksHeaderBackup)
    #[command(long_about = LUKS_HEADER_BACKUP_LONG)]
    HeaderBackup(LuksHeaderFileArgs),

    /// Write a saved LUKS2 header back onto the device (luksHeaderRestore)
    #[command(long_about = LUKS_HEADER_RESTORE_LONG)]
    HeaderRestore(LuksHeaderFileArgs),
}

const LUKS_FORMAT_LONG: &str = "\
Write a new LUKS2 header to DEVICE with one keyslot for a new passphrase, as `cryptsetup \
luksFormat` does. The volume key is random; data is encrypted with aes-xts-plain64. The \
encrypted payload starts at 16 MiB (aligned to 1 MiB and to an md array's full stripe, so \
a filesystem on top stays stripe-aligned); everything before it is overwritten, the \
payload itself is not touched (it reads as random data once opened).

cairn refuses a DEVICE that already carries an md superblock or a filesystem, LUKS or LVM \
signature, naming what it found; --force overwrites it. Either way it then asks you to \
type YES, unless -q (--batch-mode) is given, as cryptsetup does.

The default key derivation is argon2id, benchmarked on this machine to take about 2 s \
(--iter-time) with up to 1 GiB of memory: slow on purpose, so guessing passphrases is \
slow. Lower costs (--pbkdf pbkdf2 --pbkdf-force-iterations 1000) are for tests only.";

const LUKS_FORMAT_EXAMPLES: &str = "\
Examples:
  cairn luks format vol.img
  cairn luks format --key-size 256 --sector-size 512 --label backup /dev/sdb
  cairn luks format --md d0.img,d1.img,d2.img,d3.img --key-file key -q
  cairn luks format -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file key test.img
                                          # cheap KDF: tests only";

const LUKS_DUMP_LONG: &str = "\
Print DEVICE's LUKS header as `cryptsetup luksDump` does: version, UUID, label, the data \
segment (offset, cipher, sector size), each keyslot's KDF and costs, the digests, and \
which header copy was used (a damaged copy is reported, not repaired). Nothing is \
written and no passphrase is needed. --json prints the same as one JSON object.";

const LUKS_ADD_KEY_LONG: &str = "\
Add a new passphrase to DEVICE in a free keyslot (the lowest, or --key-slot N). An \
existing passphrase is needed to unlock the volume key: from the terminal or --key-file. \
The new one comes from the terminal (asked twice) or --new-key-file. KDF options apply \
to the new keyslot. Both header copies are rewritten.";

const LUKS_REMOVE_KEY_LONG: &str = "\
Remove the keyslot that the given passphrase opens: its key material is overwritten, \
then it leaves both header copies. Removing the last keyslot makes the data unreadable \
for good, so cairn then asks you to type YES (even with -q it is refused unless you also \
give --force).";

const LUKS_CHANGE_KEY_LONG: &str = "\
Replace the passphrase of the keyslot the old passphrase opens. The new key material is \
written to free space first and the header switches to it in one step, so a crash leaves \
either the old or the new passphrase working. The keyslot keeps its number.";

const LUKS_TEST_LONG: &str = "\
Check a passphrase against DEVICE without serving anything, like `cryptsetup open \
--test-passphrase`: prints \"Key slot N unlocked.\" and exits 0, or \"No key available \
with this passphrase.\" and exits 2. --key-slot N tries only that keyslot.";

const LUKS_HEADER_BACKUP_LONG: &str = "\
Write DEVICE's LUKS2 header (both copies) and keyslots area to a new file that \
`cryptsetup luksHeaderRestore` also accepts. The file holds the keyslots, so anyone with \
it and an old passphrase can open the volume even after that passphrase is removed: \
keep it safe. It is created mode 0600 and never overwritten.";

const LUKS_HEADER_RESTORE_LONG: &str = "\
Write a header backup made by `cairn luks header-backup` or `cryptsetup \
luksHeaderBackup` onto DEVICE. When DEVICE already holds a LUKS2 header, cairn asks you \
to type YES (or needs -q): replacing it changes which passphrases work, and a header from \
another volume makes the data unreadable.";

/// The device a `cairn luks` verb works on: a path, or an md array's members.
#[derive(Debug, Clone, Args)]
pub struct LuksTarget {
    /// A file or block device holding (or to hold) the LUKS header
    #[arg(
        value_name = "DEVICE",
        required_unless_present = "md",
        conflicts_with = "md"
    )]
    pub device: Option<PathBuf>,

    /// Use the md array assembled from these members (comma-separated) as DEVICE
    #[arg(long, value_name = "MEMBER,MEMBER,...")]
    pub md: Option<String>,
}

/// Where the passphrase comes from.
#[derive(Debug, Clone, Args)]
pub struct KeyFileArgs {
    /// Read the passphrase from FILE, its exact bytes (`-`: stdin) instead of asking
    #[arg(short = 'd', long, value_name = "FILE", visible_alias = "keyfile")]
    pub key_file: Option<PathBuf>,
}

/// cryptsetup's key derivation options.
#[derive(Debug, Clone, Args)]
pub struct PbkdfArgs {
    /// Key derivation function for the new keyslot: argon2id, argon2i or pbkdf2
    #[arg(long, value_name = "KDF", default_value = "argon2id",
          value_parser = ["argon2id", "argon2i", "pbkdf2"])]
    pub pbkdf: String,

    /// Hash for pbkdf2: sha256 (default), sha1, sha512, ...
    #[arg(long, value_name = "HASH", default_value = "sha256")]
    pub hash: String,

    /// Fixed cost instead of a benchmark: pbkdf2 iterations (at least 1000), or argon2
    /// passes (tests only)
    #[arg(long, value_name = "N")]
    pub pbkdf_force_iterations: Option<u32>,

    /// Argon2 memory cost in KiB [default: 1 GiB, at most half the RAM]
    #[arg(long, value_name = "KiB")]
    pub pbkdf_memory: Option<u32>,

    /// Argon2 threads [default: min(4, CPUs)]
    #[arg(long, value_name = "N")]
    pub pbkdf_parallel: Option<u32>,

    /// Time one unlock should take when the cost is benchmarked, in milliseconds
    #[arg(short = 'i', long, value_name = "MS", default_value_t = 2000)]
    pub iter_time: u64,
}

/// `cairn luks format`.
#[derive(Debug, Args)]
pub struct LuksFormatArgs {
    #[command(flatten)]
    pub target: LuksTarget,

    #[command(flatten)]
    pub key: KeyFileArgs,

    #[command(flatten)]
    pub pbkdf: PbkdfArgs,

    /// LUKS version to write: luks2 (cairn reads LUKS1 but does not create it)
    #[arg(long = "type", value_name = "TYPE", default_value = "luks2")]
    pub kind: String,

    /// Data cipher: aes-xts-plain64 (the only one cairn writes)
    #[arg(short, long, value_name = "CIPHER", default_value = "aes-xts-plain64")]
    pub cipher: String,

    /// Volume key size in bits: 512 (AES-256-XTS) or 256 (AES-128-XTS)
    #[arg(short = 's', long, value_name = "BITS", default_value_t = 512,
          value_parser = clap::builder::PossibleValuesParser::new(["256", "512"])
              .map(|s| s.parse::<u32>().expect("listed values are numbers")))]
    pub key_size: u32,

    /// Encryption sector size: 512 or 4096 [default: 4096 on 4K-sector devices, else 512]
    #[arg(long, value_name = "BYTES",
          value_parser = clap::builder::PossibleValuesParser::new(["512", "1024", "2048", "4096"])
              .map(|s| s.parse::<u32>().expect("listed values are numbers")))]
    pub sector_size: Option<u32>,

    /// Volume label stored in the header (shown by dump and blkid)
    #[arg(long, value_name = "LABEL", default_value = "")]
    pub label: String,

    /// Volume UUID [default: random]
    #[arg(long, value_name = "UUID")]
    pub uuid: Option<String>,

    /// Keyslot for the passphrase [default: 0]
    #[arg(short = 'S', long, value_name = "N")]
    pub key_slot: Option<u32>,

    /// Overwrite a device that carries an md, filesystem, LUKS or LVM signature
    #[arg(short, long)]
    pub force: bool,

    /// Do not ask for confirmation (cryptsetup's -q); signatures still need --force
    #[arg(short = 'q', long = "batch-mode")]
    pub batch_mode: bool,
}

/// Verbs that only read: `dump`.
#[derive(Debug, Args)]
pub struct LuksDeviceArgs {
    #[command(flatten)]
    pub target: LuksTarget,
}

/// Verbs that take one passphrase: `test`, `remove-key`.
#[derive(Debug, Args)]
pub struct LuksKeyArgs {
    #[command(flatten)]
    pub target: LuksTarget,

    #[command(flatten)]
    pub key: KeyFileArgs,

    /// Try only this keyslot
    #[arg(short = 'S', long, value_name = "N")]
    pub key_slot: Option<u32>,

    /// Do not ask for confirmation (remove-key)
    #[arg(short = 'q', long = "batch-mode")]
    pub batch_mode: bool,

    /// remove-key: allow removing the last keyslot without a terminal (with -q)
    #[arg(short, long)]
    pub force: bool,
}

/// Verbs that take an existing and a new passphrase: `add-key`, `change-key`.
#[derive(Debug, Args)]
pub struct LuksNewKeyArgs {
    #[command(flatten)]
    pub target: LuksTarget,

    #[command(flatten)]
    pub key: KeyFileArgs,

    /// Read the new passphrase from FILE, its exact bytes (`-`: stdin) instead of asking
    #[arg(long, value_name = "FILE", visible_alias = "new-keyfile")]
    pub new_key_file: Option<PathBuf>,

    #[command(flatten)]
    pub pbkdf: PbkdfArgs,

    /// Keyslot for the new passphrase [default: the lowest free one; change-key: the same]
    #[arg(short = 'S', long, value_name = "N")]
    pub key_slot: Option<u32>,
}

/// `header-backup` and `header-restore`.
#[derive(Debug, Args)]
pub struct LuksHeaderFileArgs {
    #[command(flatten)]
    pub target: LuksTarget,

    /// The backup file (backup: created, never overwritten; restore: read)
    #[arg(long, value_name = "FILE", required = true)]
    pub header_backup_file: PathBuf,

    /// Do not ask for confirmation (restore)
    #[arg(short = 'q', long = "batch-mode")]
    pub batch_mode: bool,
}

/// The operator's view of `serve`: control socket, metrics, event hook.
#[derive(Debug, Clone, Default, Args)]
pub struct OperatorOptions {
    /// Control socket for `cairn status`, `cairn top` and the HTTP+JSON API (owner-only,
    /// mode 0600) [default: control.sock in the runtime directory ($XDG_RUNTIME_DIR/cairn,
    /// else /run/cairn for root, /tmp/cairn-UID for others); when another daemon has it,
    /// control-PID.sock beside it]
    #[arg(long, value_name = "PATH", conflicts_with = "no_control")]
    pub control: Option<PathBuf>,

    /// Serve without a control socket
    #[arg(long)]
    pub no_control: bool,

    /// Serve Prometheus metrics at http://ADDR/metrics: tcp:HOST:PORT, HOST:PORT or
    /// unix:PATH (off unless given; metrics show export and member names)
    #[arg(long, value_name = "ADDR", value_parser = parse_metrics_addr)]
    pub metrics: Option<Listen>,

    /// Run CMD (with sh -c) on each state change, like mdadm --monitor's PROGRAM: the
    /// event is in CAIRN_EVENT, CAIRN_EXPORT, CAIRN_DEVICE, CAIRN_MEMBER, CAIRN_MESSAGE
    #[arg(long, value_name = "CMD")]
    pub on_event: Option<String>,
}

/// `--metrics`: `tcp:HOST:PORT`, `unix:PATH`, or a bare `HOST:PORT`.
fn parse_metrics_addr(s: &str) -> Result<Listen, String> {
    if let Ok(a) = s.parse::<std::net::SocketAddr>() {
        return Ok(Listen::Tcp(a));
    }
    s.parse::<Listen>()
        .map_err(|e| format!("{e} (e.g. --metrics 127.0.0.1:9109 or unix:/run/cairn/metrics.sock)"))
}

/// Where client verbs find the daemon.
#[derive(Debug, Clone, Default, Args)]
pub struct ControlArgs {
    /// The daemon's control socket [default: the one daemon running in the runtime
    /// directory ($XDG_RUNTIME_DIR/cairn, else /run/cairn for root, /tmp/cairn-UID);
    /// with several, the one serving the array named, else they are listed to choose]
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

const STATUS_LONG: &str = "\
Show every export of the running `cairn serve` as a tree, top to bottom: export -> LV -> \
LUKS -> md array -> members (or the file), each with its size, geometry words and state \
(md's own: clean, active, degraded; active sync, faulty, removed). Background work \
(resync, recovery, check) shows a progress bar with speed and time left on a terminal, \
and one plain line otherwise. Recent events (Fail, DegradedArray, ExportAdded, ...) follow.

--json prints the daemon's /v1/status document. --watch redraws every SECS seconds \
(default 2) until Ctrl-C.";

const STATUS_EXAMPLES: &str = "\
Examples:
  cairn status
  cairn status --watch              # redraw every 2 s
  cairn status --json | jq '.exports[].children[0].state'
  cairn status --control /tmp/c.sock";

const TOP_LONG: &str = "\
Live I/O of every export and of each device below it (md members, files), sampled from \
the running `cairn serve` every SECS seconds, as `iostat -x` shows disks: reads and \
writes per second, MB/s, average latency (r_await, w_await) and its 99th percentile, \
average queue depth (aqu-sz) and the share of reads. The first sample averages since the \
server started. A member doing at least 1.5x the median I/O of its array is marked `!`.

--json prints one JSON object per sample, with totals since the server started.";

const TOP_EXAMPLES: &str = "\
Examples:
  cairn top
  cairn top -d 5 -n 3
  cairn top --json -n 1 | jq '.devices[] | {id, reads: .totals.reads}'";

/// `cairn status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub control: ControlArgs,

    /// Redraw every SECS seconds until Ctrl-C
    #[arg(short, long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2")]
    pub watch: Option<f64>,
}

/// `cairn top`.
#[derive(Debug, Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub control: ControlArgs,

    /// Seconds between samples
    #[arg(short, long, value_name = "SECS", default_value_t = 1.0)]
    pub delay: f64,

    /// Stop after COUNT samples
    #[arg(short = 'n', long = "iterations", value_name = "COUNT")]
    pub count: Option<u64>,
}

// ---- cairn lvm ---------------------------------------------------------------------

const LVM_LONG: &str = "\
LVM2 volume groups in the on-disk format of lvm: PVs cairn makes are PVs `pvs`, `vgs` \
and `lvs` show, and VGs lvm made (linear and striped LVs) are VGs cairn opens. The verbs \
and options are lvm's: pvcreate, vgcreate -s, lvcreate -n -L/-l -i -I, lvextend, \
lvreduce, lvrename, lvremove, pvs, vgs, lvs.

cairn has no device scan, so commands that work on an existing VG take its PVs: as \
arguments after the VG or LV (vg0 pv0.img pv1.img, as vgcreate takes them), or like \
lvm's --devices: --devices PV,PV,... (files or block devices), --md M1,M2,... (an md \
array assembled from its members is one PV; repeatable), --luks=FILE (a LUKS volume is \
one PV) or a bare --luks (each --md array holds LUKS, the PV is inside it), with \
--key-file for the passphrase. Every PV of the VG must be given.

pvcreate starts the data area at 1 MiB, raised to a multiple of the device's full stripe \
(an md array's chunk x data disks), so every extent starts on a full stripe and a \
filesystem on an LV stays aligned. Every change writes new metadata (seqno + 1) to all \
PVs in lvm's commit order, so a crash leaves the old or the new VG, never a mix. \
Nothing is activated: serve an LV with `cairn serve --lvm`.";

const LVM_EXAMPLES: &str = "\
Examples:
  truncate -s 1G pv0.img pv1.img
  cairn lvm pvcreate pv0.img pv1.img
  cairn lvm vgcreate vg0 pv0.img pv1.img                 # 4 MiB extents
  cairn lvm lvcreate -n data -L 200M vg0 pv0.img pv1.img
  cairn lvm lvcreate -n fast -L 100M -i 2 -I 64k vg0 pv0.img pv1.img
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
    /// Create a linear or striped logical volume
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
    /// Parse a metadata text (vgcfgbackup output, or `pvck --dump metadata`) and print
    /// it as cairn reads it
    #[command(hide = true)]
    VgcfgParse(LvmVgcfgParseArgs),
}

const LVM_LVCREATE_EXAMPLES: &str = "\
Examples:
  cairn lvm lvcreate -n lin -L 20M vg0 pv0.img pv1.img
  cairn lvm lvcreate -n str -i 2 -I 64k -l 4 vg0 pv0.img pv1.img
  cairn lvm lvcreate -n rest -l 100%FREE --devices pv0.img,pv1.img vg0   # lvm's --devices form";

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

    /// Overwrite a device that holds another signature (md, LUKS, an LVM label)
    #[arg(short, long)]
    pub force: bool,
}

/// `cairn lvm pvs|vgs|lvs`.
#[derive(Debug, Args)]
pub struct LvmReportArgs {
    /// Files or block devices to look at (as --devices)
    #[arg(value_name = "PV")]
    pub pvs: Vec<PathBuf>,

    #[command(flatten)]
    pub devices: LvmDevices,
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

    /// Number of stripes (PVs to spread over)
    #[arg(short = 'i', long = "stripes", value_name = "N", default_value_t = 1)]
    pub stripes: u32,

    /// Stripe size [default: 64 KiB]
    #[arg(short = 'I', long = "stripesize", value_name = "SIZE", value_parser = parse_size)]
    pub stripe_size: Option<u64>,

    /// The VG's PVs (files or block devices), as vgcreate takes them; the same as
    /// --devices PV,PV,...
    #[arg(value_name = "PV")]
    pub pvs: Vec<PathBuf>,

    #[command(flatten)]
    pub devices: LvmDevices,
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

    /// lvreduce: really cut the data off the end
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
}

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
    use clap::CommandFactory;

    #[test]
    fn clap_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn parses_serve() {
        let cli = Cli::try_parse_from([
            "cairn",
            "-vv",
            "serve",
            "--listen",
            "tcp:127.0.0.1:0",
            "--read-only",
            "a.img",
            "b.img:data",
            "--json",
        ])
        .unwrap();
        assert_eq!(cli.global.verbose, 2);
        assert!(cli.global.json);
        let Command::Serve(s) = cli.command else {
            panic!("not serve")
        };
        assert_eq!(s.exports, ["a.img", "b.img:data"]);
        assert!(s.read_only);
        assert_eq!(s.server.listen.len(), 1);
    }

    #[test]
    fn serve_needs_a_file_and_good_addresses() {
        assert!(Cli::try_parse_from(["cairn", "serve"]).is_err());
        assert!(Cli::try_parse_from(["cairn", "serve", "--listen", "10809", "a.img"]).is_err());
        assert!(Cli::try_parse_from(["cairn", "serve", "--threads", "0", "a.img"]).is_err());
    }

    #[test]
    fn quickstart_size() {
        let cli = Cli::try_parse_from(["cairn", "quickstart", "--size", "512M"]).unwrap();
        let Command::Quickstart(q) = cli.command else {
            panic!("not quickstart")
        };
        assert_eq!(q.size, 512 << 20);
        assert!(Cli::try_parse_from(["cairn", "quickstart", "--size", "lots"]).is_err());
        // --array-size is the name md create shares; --size stays for old scripts.
        let cli = Cli::try_parse_from(["cairn", "quickstart", "--array-size", "2G"]).unwrap();
        let Command::Quickstart(q) = cli.command else {
            panic!("not quickstart")
        };
        assert_eq!(q.size, 2 << 30);
    }
}
