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

Today cairn serves plain files and block devices; RAID (md format), LUKS2 encryption and \
LVM2 volumes are being added as layers under the same server.";

const EXAMPLES: &str = "\
Examples:
  cairn quickstart                      # demo disk, served, with commands to try
  cairn serve disk.img                  # export \"disk\" on the default socket and port
  cairn serve /dev/sdb:backup --read-only
  cairn serve --listen tcp:127.0.0.1:10809 vm1.img vm2.img
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

    /// Create a sparse demo disk and serve it: the fastest way to try cairn
    #[command(long_about = QUICKSTART_LONG, after_help = QUICKSTART_EXAMPLES)]
    Quickstart(QuickstartArgs),
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
signal exits at once.";

const SERVE_EXAMPLES: &str = "\
Examples:
  cairn serve disk.img                         # export \"disk\"
  cairn serve a.img b.img:data                 # exports \"a\" and \"data\"
  cairn serve --read-only /dev/sdb:backup      # a block device, read-only
  cairn serve --listen unix:/tmp/nbd.sock --listen tcp:127.0.0.1:0 --json disk.img
                                               # port 0: any free port, printed in the JSON

Then, from another shell:
  nbdinfo nbd://127.0.0.1:10809/disk
  qemu-img info nbd://127.0.0.1:10809/disk
  nbdcopy image.raw nbd://127.0.0.1:10809/disk";

const QUICKSTART_LONG: &str = "\
Create a sparse demo disk and serve it, printing the commands to connect.

The demo disk is a sparse file (it takes no space until written) named demo.img in \
--dir, which defaults to $XDG_DATA_HOME/cairn (~/.local/share/cairn). An existing demo \
disk is reused, never overwritten. It is then served exactly as `cairn serve` would: \
on the default Unix socket and on TCP 127.0.0.1:10809 (or a free port if 10809 is busy).

Stop it with Ctrl-C. Delete the demo disk with `rm` when you are done.";

const QUICKSTART_EXAMPLES: &str = "\
Examples:
  cairn quickstart                         # 1 GiB demo disk in ~/.local/share/cairn
  cairn quickstart --dir ./demo --size 4G";

/// `cairn serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Files or block devices to export; append :NAME to choose the export name
    #[arg(value_name = "FILE[:NAME]", required = true)]
    pub exports: Vec<String>,

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
    /// Directory for the demo disk [default: $XDG_DATA_HOME/cairn, i.e. ~/.local/share/cairn]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Size of the demo disk when it is created, e.g. 512M, 1G, 20G
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
