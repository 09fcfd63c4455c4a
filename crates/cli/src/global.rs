//! The options every command takes.

use clap::ArgAction;
use clap::Args;

// ---- the command line (clap) ----------------------------------------------------
//

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
