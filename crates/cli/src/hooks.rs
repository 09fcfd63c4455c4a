//! What the CLI plugs into the stack library: the daemon's I/O counters and the terminal
//! for passphrases.

use std::sync::Arc;

use cairn_block::BlockDevice;
use cairn_engine::stats::Registry;
use cairn_luks::SecretBytes;
use cairn_stack::{Hooks, Prompt, StatsHook};

use crate::error::Result;

/// Counts each node's I/O in the process's statistics registry (`cairn top`, metrics).
#[derive(Debug)]
struct Counters;

impl StatsHook for Counters {
    fn wrap(&self, node_id: &str, dev: Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice> {
        Registry::global().wrap(node_id, dev)
    }
}

/// Asks on the terminal, without echo; with no terminal, says how to give a key file.
#[derive(Debug)]
struct Terminal;

impl Prompt for Terminal {
    fn passphrase(&self, shown: &str) -> Result<SecretBytes> {
        crate::tty::passphrase(&format!("Enter passphrase for {shown}: "))
    }
}

/// The hooks for opening stacks: counters always, the terminal when `ask`.
pub fn hooks(ask: bool) -> Hooks {
    Hooks {
        stats: Some(Arc::new(Counters)),
        prompt: ask.then(|| Arc::new(Terminal) as Arc<dyn Prompt>),
    }
}
