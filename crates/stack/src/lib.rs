//! cairn's control plane as a library: what a stack is, how it is opened, described,
//! discovered and advised on. The `cairn` command, the daemon's control API and the
//! benchmarks are front ends over it.
//!
//! ```text
//!   spec      Spec (file | md | LUKS | LVM | one LV, any sub-stack) ─ open ─> OpenedExport(s)
//!   export    OpenedExport: the device to serve over a tree of Layers (file | md | LUKS
//!             over a stack | LV over PV stacks), each owning the one below; files opened
//!   md        md arrays assembled from members, degraded starts warned about, stripe cache
//!   luks      LUKS unlocked from key sources (key dir, key file, Prompt), or described locked
//!   lvm       volume groups opened from PV stacks, one export per LV
//!   node      the stack as a tree of Nodes (data only): status, control API, metrics, advise
//!   describe  an opened stack as its Node tree, and in words
//!   discover  probe devices bottom-up (md -> LUKS -> LVM), what `scan` and `serve --scan` do
//!   advise    alignment maths over a Node tree: mkfs lines, misalignment findings
//!   owner     one writer per device, in words
//!   hooks     what the caller plugs in: statistics, a person to ask for passphrases
//! ```
//!
//! Errors are [`StackError`]s: a sentence for an operator that says what failed and what to
//! do, with an exit status class (cryptsetup's 2 for a wrong passphrase, 5 for busy).

pub mod advise;
pub mod describe;
pub mod discover;
pub mod error;
pub mod export;
pub mod fence;
pub mod hooks;
pub mod leaf;
pub mod luks;
pub mod lvm;
pub mod md;
pub mod node;
pub mod owner;
pub mod remote;
pub mod size;
pub mod spec;

pub use error::{Result, StackError};
pub use export::{Layer, OpenedExport};
pub use hooks::{Hooks, Options, Ownership, Prompt, StatsHook};
pub use node::Node;
pub use spec::{open, open_all, open_one, Keys, Spec};
