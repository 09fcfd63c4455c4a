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

    /// Opening LUKS: refuse a PBKDF2 key derivation that would take longer than SECONDS
    /// at this machine's speed (a crafted header can ask for hours); 0: no limit
    /// [default: CAIRN_MAX_KDF_TIME, else 60]
    #[arg(long, global = true, value_name = "SECONDS")]
    pub max_kdf_time: Option<f64>,
}
