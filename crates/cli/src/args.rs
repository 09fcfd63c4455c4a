//! The top of the command line: `cairn`, its global options and its commands. Each
//! command's options and help text live next to the command (serve.rs, md.rs, luks.rs,
//! lvm.rs, ...); behaviour does not live here.

use clap::{Parser, Subcommand};

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
  cairn repl up home --config /etc/cairn/repl.toml   # mirror a disk between machines
                                        # (docs/replication.md; `cairn repl --help`)
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
    pub global: crate::global::Global,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Export files or block devices over NBD
    #[command(long_about = crate::serve::SERVE_LONG, after_help = crate::serve::SERVE_EXAMPLES)]
    Serve(crate::serve::ServeArgs),

    /// Show the running server's stacks as a tree: states, sizes, background work
    #[command(long_about = crate::status::STATUS_LONG, after_help = crate::status::STATUS_EXAMPLES)]
    Status(crate::status::StatusArgs),

    /// Live I/O per export and per md member, refreshed like iostat -x
    #[command(long_about = crate::top::TOP_LONG, after_help = crate::top::TOP_EXAMPLES)]
    Top(crate::top::TopArgs),

    /// Create a demo RAID6 -> LUKS2 stack on sparse files and serve it: the fastest way to
    /// try cairn
    #[command(long_about = crate::quickstart::QUICKSTART_LONG, after_help = crate::quickstart::QUICKSTART_EXAMPLES)]
    Quickstart(crate::quickstart::QuickstartArgs),

    /// md RAID arrays (mdadm's format): create, examine, detail, fail, add, remove, replace,
    /// check, repair
    #[command(subcommand, long_about = crate::md::MD_LONG)]
    Md(crate::md::MdCommand),

    /// A volume mirrored between machines (DRBD's protocol C): create-md, up, primary,
    /// secondary, connect, disconnect, status, down
    #[command(subcommand, long_about = crate::repl::REPL_LONG)]
    Repl(crate::repl::ReplCommand),

    /// LUKS encryption (cryptsetup's format): format, dump, add-key, remove-key, ...
    #[command(subcommand, long_about = crate::luks::LUKS_LONG, after_help = crate::luks::LUKS_EXAMPLES)]
    Luks(crate::luks::LuksCommand),

    /// Report the md arrays and LUKS volumes on files, block devices and directories,
    /// and what `cairn serve --scan` would export; writes nothing
    #[command(long_about = crate::scan::SCAN_LONG, after_help = crate::scan::SCAN_EXAMPLES)]
    Scan(crate::scan::ScanArgs),

    /// Print the mkfs.ext4 and mkfs.xfs options that match an export's RAID geometry,
    /// and warn about misaligned layers
    #[command(long_about = crate::advise::ADVISE_LONG, after_help = crate::advise::ADVISE_EXAMPLES)]
    Advise(crate::advise::AdviseArgs),

    /// Ask an NBD server what it exports (NBD_OPT_LIST, NBD_OPT_INFO), over TLS with an
    /// nbds:// URI
    #[command(subcommand, after_help = crate::nbd::NBD_EXAMPLES)]
    Nbd(crate::nbd::NbdCommand),

    /// LVM2 volume groups (lvm's format): pvcreate, vgcreate, lvcreate, lvs, ...
    #[command(subcommand, long_about = crate::lvm::LVM_LONG, after_help = crate::lvm::LVM_EXAMPLES)]
    Lvm(crate::lvm::LvmCommand),

    /// Benchmark candidate stacks (level x chunk x cipher x stripe cache) on scratch files:
    /// throughput, the full-stripe knee, fsync latency, IOPS; plots and a recommendation
    #[command(long_about = crate::bench::BENCH_LONG, after_help = crate::bench::BENCH_EXAMPLES)]
    Bench(crate::bench::BenchArgs),
}

// ---- cairn lvm ---------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advise_and_scan_need_something_to_look_at() {
        assert!(Cli::try_parse_from(["cairn", "advise"]).is_err());
        assert!(Cli::try_parse_from(["cairn", "advise", "--md", "a,b"]).is_ok());
        assert!(Cli::try_parse_from(["cairn", "scan"]).is_err());
    }
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
    fn etcd_access_options() {
        let serve = |extra: &[&str]| {
            let mut a = vec!["cairn", "serve", "--md", "a.img,b.img"];
            a.extend(extra);
            Cli::try_parse_from(a)
        };
        let cli = serve(&[
            "--etcd",
            "https://e1:2379,https://e2:2379",
            "--etcd-cacert",
            "ca.pem",
            "--etcd-cert",
            "c.pem",
            "--etcd-key",
            "k.pem",
        ])
        .unwrap();
        let Command::Serve(s) = cli.command else {
            panic!("not serve")
        };
        let t = &s.fencing.etcd_access;
        assert_eq!(
            t.etcd_cacert.as_deref(),
            Some(std::path::Path::new("ca.pem"))
        );
        assert_eq!(t.etcd_key.as_deref(), Some(std::path::Path::new("k.pem")));
        // TLS files without an etcd, a certificate without its key and the reverse: clap
        // lets them through (repl's --config may hold the rest); the client refuses them.
        let ownership = |extra: &[&str]| {
            let Command::Serve(s) = serve(extra).unwrap().command else {
                panic!("not serve")
            };
            crate::fence::ownership(&s.fencing).map(|_| ())
        };
        let err = ownership(&["--etcd-cacert", "ca.pem"]).unwrap_err();
        assert!(err.to_string().contains("give --etcd"), "{err}");
        let err = ownership(&["--etcd", "https://e:2379", "--etcd-cert", "c.pem"]).unwrap_err();
        assert!(err.to_string().contains("needs its key"), "{err}");
        let err = ownership(&["--etcd", "https://e:2379", "--etcd-key", "k.pem"]).unwrap_err();
        assert!(err.to_string().contains("needs its key"), "{err}");
        let err = ownership(&["--etcd", "http://e:2379", "--etcd-cacert", "ca.pem"]).unwrap_err();
        assert!(err.to_string().contains("https://"), "{err}");
        // A user needs its password file, and both an etcd.
        let err = ownership(&["--etcd", "http://e:2379", "--etcd-user", "u"]).unwrap_err();
        assert!(err.to_string().contains("go together"), "{err}");
        let err = ownership(&["--etcd-user", "u", "--etcd-password-file", "p"]).unwrap_err();
        assert!(err.to_string().contains("give --etcd"), "{err}");
        // The password file: missing, empty first line, and read (only its first line).
        let pw = std::env::temp_dir().join(format!("cairn-etcd-pw-{}", std::process::id()));
        let with_pw = || {
            ownership(&[
                "--etcd",
                "http://e:2379",
                "--etcd-user",
                "u",
                "--etcd-password-file",
                pw.to_str().unwrap(),
            ])
        };
        let err = with_pw().unwrap_err();
        assert!(err.to_string().contains("--etcd-password-file"), "{err}");
        std::fs::write(&pw, "\nsecret-9\n").unwrap();
        let err = with_pw().unwrap_err();
        assert!(err.to_string().contains("first line is empty"), "{err}");
        assert!(!err.to_string().contains("secret-9"), "{err}");
        std::fs::write(&pw, "secret-9\n").unwrap();
        with_pw().unwrap();
        let _ = std::fs::remove_file(&pw);
        let up = |extra: &[&str]| {
            let mut a = vec!["cairn", "repl", "up", "home"];
            a.extend(extra);
            Cli::try_parse_from(a)
        };
        assert!(up(&["--etcd", "https://e:2379", "--etcd-cacert", "ca.pem"]).is_ok());
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
