//! The `cairn` command line.
//!
//! ```text
//!   main.rs ── args::Cli::parse ──> run ──> serve::run       (cairn serve)
//!                                      ├──> quickstart::run  (cairn quickstart)
//!                                      ├──> md::run          (cairn md create|examine|detail)
//!                                      ├──> luks::run        (cairn luks format|dump|add-key|...)
//!                                      ├──> scan::run        (cairn scan: what serve --scan finds)
//!                                      ├──> advise::run      (cairn advise: mkfs lines)
//!                                      └──> bench::run       (cairn bench: matrix, plots)
//!   config: serve --config TOML
//!   exports: FILE[:NAME] -> opened FileDisk    listen: default addresses, bind advice
//!   size: "1G" <-> bytes                       logging: tracing on stderr
//!   tty: passphrase prompts without echo, YES confirmations
//! ```
//!
//! Every failure reaches [`run`] as a [`error::CliError`] sentence and is printed as
//! `cairn: ...` with a non-zero exit status.

// No terminal write may abort cairn. std's print macros panic when the write fails (EPIPE
// once the reader of a pipe is gone: Rust ignores SIGPIPE, so the write returns the error),
// and a panic while printing the panic aborts, which leaves md arrays marked active. These
// shadow std's for every module of this crate (macro_rules are textually scoped, so they
// come before the `mod` lines): the text is written and a failed write is dropped.
macro_rules! println {
    ($($t:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stdout(), $($t)*);
    }};
}
macro_rules! print {
    ($($t:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::write!(::std::io::stdout(), $($t)*);
    }};
}
macro_rules! eprintln {
    ($($t:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr(), $($t)*);
    }};
}

pub mod advise;
pub mod args;
pub mod bench;
pub mod config;
pub mod control;
pub mod daemon;
pub mod error;
pub mod fence;
pub mod global;
pub mod hooks;
pub mod listen;
pub mod logging;
pub mod luks;
pub mod lvm;
pub mod md;
pub mod md_manage;
pub mod nbd;
pub mod quickstart;
pub mod repl;
pub mod scan;
pub mod serve;
pub mod shell;
pub mod status;
pub mod top;
pub mod tty;

use std::process::ExitCode;

use args::{Cli, Command};

/// Runs one parsed command line to completion.
pub fn run(cli: Cli) -> ExitCode {
    logging::init(cli.global.verbose);
    install_panic_hook();
    if let Some(s) = cli.global.max_kdf_time {
        cairn_luks::set_max_kdf_time(
            (s > 0.0 && s.is_finite()).then(|| std::time::Duration::from_secs_f64(s)),
        );
    }
    let result = match cli.command {
        Command::Serve(a) => serve::run(a, &cli.global),
        Command::Status(a) => status::run(a, &cli.global),
        Command::Top(a) => top::run(a, &cli.global),
        Command::Quickstart(a) => quickstart::run(a, &cli.global),
        Command::Md(c) => md::run(c, &cli.global),
        Command::Luks(c) => luks::run(c, &cli.global),
        Command::Scan(a) => scan::run(&a, &cli.global),
        Command::Advise(a) => advise::run(&a, &cli.global),
        Command::Lvm(c) => lvm::run(c, &cli.global),
        Command::Nbd(c) => nbd::run(c, &cli.global),
        Command::Repl(c) => repl::run(c, &cli.global),
        Command::Bench(a) => bench::run(&a, &cli.global),
    };
    // A clean end gives up what this process still owns across hosts (remote exports
    // used whole; md arrays are given up as they close): the next owner takes over
    // without --force. A failure gives up the remote exports used whole (nothing more is
    // written to them; a failed lvcreate must not leave its PVs owned) and keeps the md
    // arrays whose close failed, as a crash would.
    if result.is_ok() {
        cairn_stack::fence::release_all();
    } else {
        cairn_stack::fence::release_whole_exports();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cairn: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// A bug reads as one line asking for a report, not a backtrace.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()));
        let thread = std::thread::current()
            .name()
            .unwrap_or("unnamed")
            .to_string();
        eprintln!(
            "cairn: internal error in thread {thread}: {msg}{}; this is a bug, please report it",
            at.unwrap_or_default()
        );
    }));
}
