//! `cairn advise`: the mkfs options that match an export's real geometry, and the layers
//! that break the alignment.
//!
//! ```text
//!   EXPORT ─ control socket GET /v1/exports/NAME ─┐
//!   --md / --luks / --scan ─ read-only assembly   ├─> stack::Node tree ─> advise()
//!      (LUKS: header only, no passphrase)  ───────┘
//!   advise: walk export -> (LUKS, LV: add their data offsets) -> striped layer
//!           (md: chunk x data members; striped LV: stripe size x stripes)
//!        ─> stride, stripe_width (4 KiB ext4 blocks), su/sw (XFS), command lines,
//!           warnings (offset not on a full stripe, LUKS sector < 4 KiB, odd chunk)
//! ```
//!
//! Worked example, the classic one: RAID6 over 4 members with 64 KiB chunks has 2 data
//! members, so a full stripe is 128 KiB: ext4 stride = 64K / 4K = 16 blocks,
//! stripe_width = 16 x 2 = 32 blocks; XFS su = 64k, sw = 2. A LUKS2 payload at 16 MiB is
//! 128 full stripes in, so everything above stays aligned.

use std::path::PathBuf;

use cairn_stack::advise::{advise_on, Advice};
use cairn_stack::discover::{scan, ScanOptions};
use cairn_stack::node::Node;
use cairn_stack::{Keys, Options, Spec};

use crate::error::{CliError, Result};
use crate::global::Global;
use clap::Args;

// ---- the verb ------------------------------------------------------------------------

pub fn run(a: &AdviseArgs, global: &Global) -> Result<()> {
    let device = a.device.clone().unwrap_or_else(|| "DEVICE".into());
    let offline = !a.md.is_empty() || !a.luks.is_empty() || !a.scan.is_empty();
    let trees: Vec<Node> = if offline {
        offline_trees(a)?
    } else {
        let name = a
            .export
            .as_deref()
            .expect("clap requires EXPORT without stack options");
        vec![online_tree(a.control.clone(), name)?]
    };
    let trees: Vec<Node> = match &a.export {
        Some(name) if offline => {
            let names: Vec<String> = trees.iter().map(|t| t.name.clone()).collect();
            let t: Vec<Node> = trees.into_iter().filter(|t| &t.name == name).collect();
            if t.is_empty() {
                return Err(CliError::new(format!(
                    "no export {name:?} in what was given (found: {})",
                    names.join(", ")
                )));
            }
            t
        }
        _ => trees,
    };
    if trees.is_empty() {
        return Err(CliError::new("nothing to advise on: no stack was found"));
    }
    let advice: Vec<Advice> = trees.iter().map(|t| advise_on(t, &device)).collect();
    if global.json {
        let v = if advice.len() == 1 && a.export.is_some() {
            serde_json::to_value(&advice[0])
        } else {
            serde_json::to_value(&advice)
        }
        .expect("serialisable");
        println!("{v}");
    } else {
        for ad in &advice {
            print!("{}", ad.text());
        }
        if a.device.is_none() {
            println!(
                "(DEVICE: the block device the export is attached as, e.g. /dev/nbd0 from \
                 nbd-client; --device puts it in the lines)"
            );
        }
    }
    Ok(())
}

/// The trees of the stacks given on the command line, assembled read-only; LUKS is
/// described from its header, so no passphrase is needed.
fn offline_trees(a: &AdviseArgs) -> Result<Vec<Node>> {
    let (mds, volumes) = cairn_stack::spec::md_and_luks_args(&a.md, &a.luks)?;
    let defs: Vec<(Option<String>, Spec)> = mds.into_iter().chain(volumes).collect();
    let opts = Options {
        read_only: true,
        force: a.force,
        ..Options::default()
    };
    let mut opened = cairn_stack::open_all(&defs, &opts, &mut Keys::locked())?;
    if !a.scan.is_empty() {
        let opts = ScanOptions {
            read_only: true,
            force: a.force,
            dry_run: true,
            taken_names: opened.iter().map(|e| e.name.clone()).collect(),
            ..ScanOptions::default()
        };
        let (found, report) = scan(&a.scan, &opts)?;
        for w in report.warnings() {
            eprintln!("cairn: {w}");
        }
        opened.extend(found);
    }
    Ok(opened.iter().map(cairn_stack::describe::describe).collect())
}

/// The tree the running server describes for `name`.
fn online_tree(control: Option<PathBuf>, name: &str) -> Result<Node> {
    let control =
        crate::control::resolve_for(control.as_deref(), crate::control::Wants::Export(name))?;
    let (status, body) =
        crate::control::request(&control, "GET", &format!("/v1/exports/{name}"), None)?;
    if status == 404 {
        return Err(CliError::new(format!(
            "the server at {} has no export {name:?}",
            control.display()
        )));
    }
    if status != 200 {
        return Err(CliError::new(format!(
            "the server at {} answered {status} for export {name:?}: {body}",
            control.display()
        )));
    }
    node_from_json(&body).ok_or_else(|| {
        CliError::new(format!(
            "the server at {} sent no stack tree for export {name:?}",
            control.display()
        ))
    })
}

/// The export node in a control API answer: the body itself, or under "tree", "stack" or
/// "node".
fn node_from_json(v: &serde_json::Value) -> Option<Node> {
    std::iter::once(v)
        .chain(["tree", "stack", "node"].iter().filter_map(|k| v.get(*k)))
        .find_map(|v| serde_json::from_value::<Node>(v.clone()).ok())
}

// ---- the command line (clap) ----------------------------------------------------
//

pub(crate) const ADVISE_LONG: &str = "\
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

pub(crate) const ADVISE_EXAMPLES: &str = "\
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

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_stack::node::NodeKind;

    #[test]
    fn control_answers_are_found_where_they_are() {
        let g = cairn_stack::node::NodeGeometry {
            logical_block: 512,
            physical_block: 4096,
            optimal_io: 128 << 10,
        };
        let file = Node::new(
            NodeKind::File,
            "file:/d.img".into(),
            "/d.img".into(),
            cairn_stack::node::NodeState::Active,
            1 << 30,
            g,
        );
        let tree = Node {
            children: vec![file],
            ..Node::new(
                NodeKind::Export,
                "export:d".into(),
                "d".into(),
                cairn_stack::node::NodeState::Active,
                1 << 30,
                g,
            )
        };
        let v = serde_json::to_value(&tree).unwrap();
        assert_eq!(node_from_json(&v).as_ref(), Some(&tree));
        let wrapped = serde_json::json!({"name": "data", "tree": v});
        assert_eq!(node_from_json(&wrapped).as_ref(), Some(&tree));
        assert_eq!(node_from_json(&serde_json::json!({"x": 1})), None);
    }
}
