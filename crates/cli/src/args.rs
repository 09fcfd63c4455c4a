//! The command line, as clap derive structs. Help text lives here; behaviour does not.

use std::path::PathBuf;

use cairn_nbd::Listen;
use clap::{ArgAction, Args, Parser, Subcommand};

use crate::size::parse_size;

const ABOUT: &str = "The Linux storage stack in one userspace program, served over NBD";

const LONG_ABOUT: &str = "\
The Linux storage stack in one userspace program, served over NBD.

cairn exports files and block devices as NBD (Network Block Device) exports that \
qemu, the libnbd tools (nbdinfo, nbdcopy, nbdfuse), fio and the Linux nbd client can use. \
It runs as an ordinary process: no kernel modules, no root needed for the data path.

Today cairn serves plain files, block devices and md RAID arrays (levels 0, 1, 4, 5, 6, \
10 and linear, in the on-disk format mdadm reads and writes); LUKS2 encryption and LVM2 \
volumes are being added as layers under the same server.";

const EXAMPLES: &str = "\
Examples:
  cairn quickstart                      # demo disk, served, with commands to try
  cairn serve disk.img                  # export \"disk\" on the default socket and port
  cairn serve /dev/sdb:backup --read-only
  cairn serve --listen tcp:127.0.0.1:10809 vm1.img vm2.img
  cairn md create --level 6 --chunk 64K --raid-devices 4 --size 1G d0.img d1.img d2.img d3.img
  cairn serve --md d0.img,d1.img,d2.img,d3.img:data   # the RAID6 above, exported as \"data\"
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

    /// Create a demo RAID6 on sparse files and serve it: the fastest way to try cairn
    #[command(long_about = QUICKSTART_LONG, after_help = QUICKSTART_EXAMPLES)]
    Quickstart(QuickstartArgs),

    /// md RAID arrays (mdadm's format): create, examine, detail
    #[command(subcommand, long_about = MD_LONG)]
    Md(MdCommand),
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
}

const MD_CREATE_LONG: &str = "\
Create a new md array on MEMBERs (files or block devices), as `mdadm --create` does: \
each member gets an md superblock v1.2 at 4 KiB, data starts at mdadm's default data \
offset, and the data layout is the kernel's, so `mdadm --examine` reads the members and a \
Linux host can assemble them.

Members are given in role order (the first is role 0). With --size, member files that do \
not exist yet are created sparse with that size; they read as zeroes, so the array needs \
no initial sync and is clean at once. Members that already hold data make a redundant \
array \"resync pending\" unless --assume-clean (cairn does not resync yet).

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
  right-asymmetric (ra), parity-first, parity-last, and for RAID6 also the -6 forms;
  RAID10 nN (near, default n2), fN (far), oN (offset); RAID0 original, alternate.";

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

    /// Create member files that do not exist yet, sparse, of this size (e.g. 1G); they
    /// read as zeroes, so the new array needs no sync. (Not mdadm's --size, which limits
    /// the space used on each member.)
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub size: Option<u64>,

    /// Files or block devices, in role order
    #[arg(value_name = "MEMBER", required = true)]
    pub members: Vec<PathBuf>,
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

    /// Assemble even when the array is degraded and was not shut down cleanly
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

cairn runs in the foreground. Ctrl-C (SIGINT) or SIGTERM stops it cleanly: requests \
already received are answered, data is flushed to the files, then it exits 0. A second \
signal exits at once.

--md serves an md RAID array (made by `cairn md create` or by mdadm) from its members. \
The array is marked active while it is written and clean again when cairn stops, as the \
kernel does. NBD clients are told the full stripe as the preferred block size (when it \
is a power of two), so they write whole stripes and avoid read-modify-write.";

const SERVE_EXAMPLES: &str = "\
Examples:
  cairn serve disk.img                         # export \"disk\"
  cairn serve --md d0.img,d1.img,d2.img,d3.img:data
                                               # an md array (cairn md create) as \"data\"
  cairn serve a.img b.img:data                 # exports \"a\" and \"data\"
  cairn serve --read-only /dev/sdb:backup      # a block device, read-only
  cairn serve --listen unix:/tmp/nbd.sock --listen tcp:127.0.0.1:0 --json disk.img
                                               # port 0: any free port, printed in the JSON

Then, from another shell:
  nbdinfo nbd://127.0.0.1:10809/disk
  qemu-img info nbd://127.0.0.1:10809/disk
  nbdcopy image.raw nbd://127.0.0.1:10809/disk";

const QUICKSTART_LONG: &str = "\
Create a demo md RAID6 array on four sparse files and serve it, printing the array's \
details and the commands to connect.

The members are sparse files (they take no space until written) named \
demo-raid6-0.img ... demo-raid6-3.img in --dir, which defaults to $XDG_DATA_HOME/cairn \
(~/.local/share/cairn). The array uses a 64K chunk, so its full stripe is 128K (two \
data members), a size ordinary writes fill. Existing members are reused, never \
overwritten; with one or two of them gone the array starts degraded. It is served \
exactly as `cairn serve --md` would: on the default Unix socket and on TCP \
127.0.0.1:10809 (or a free port if 10809 is busy), as the export \"demo\".

Stop it with Ctrl-C. Delete the member files with `rm` when you are done.";

const QUICKSTART_EXAMPLES: &str = "\
Examples:
  cairn quickstart                         # 1 GiB RAID6 in ~/.local/share/cairn
  cairn quickstart --dir ./demo --size 4G";

/// `cairn serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Files or block devices to export; append :NAME to choose the export name
    #[arg(value_name = "FILE[:NAME]", required_unless_present = "md")]
    pub exports: Vec<String>,

    /// Assemble the md array on these members (comma-separated, any order) and export
    /// it as NAME [default: the array's name]; repeatable. Missing member files make the
    /// array degraded, with a warning, when its level tolerates it
    #[arg(long, value_name = "MEMBER,MEMBER,...[:NAME]")]
    pub md: Vec<String>,

    /// Start an md array that is degraded and was not shut down cleanly (its parity may
    /// not match where a write was interrupted)
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
}

/// How to serve, shared by `serve` and `quickstart`.
#[derive(Debug, Clone, Args)]
pub struct ServerOptions {
    /// Address to listen on: unix:PATH or tcp:ADDR:PORT (repeatable; default: a Unix
    /// socket and tcp:127.0.0.1:10809)
    #[arg(short, long = "listen", value_name = "ADDRESS")]
    pub listen: Vec<Listen>,

    /// Requests each client connection may run at once (worker threads per connection)
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,

    /// Export served to clients that ask for no name (default: the only export, if one)
    #[arg(long, value_name = "NAME")]
    pub default_export: Option<String>,
}

/// `cairn quickstart`.
#[derive(Debug, Args)]
pub struct QuickstartArgs {
    /// Directory for the demo array's members [default: $XDG_DATA_HOME/cairn, i.e. ~/.local/share/cairn]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Usable size of the demo array when it is created, e.g. 512M, 1G, 20G
    #[arg(long, value_name = "SIZE", default_value = "1G", value_parser = parse_size)]
    pub size: u64,

    /// Address to listen on: unix:PATH or tcp:ADDR:PORT (repeatable; default as for serve)
    #[arg(short, long = "listen", value_name = "ADDRESS")]
    pub listen: Vec<Listen>,
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
    }
}
