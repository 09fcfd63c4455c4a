//! The `cairn` command: parses arguments and hands them to [`cairn_cli::run`].

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    cairn_cli::run(cairn_cli::args::Cli::parse())
}
