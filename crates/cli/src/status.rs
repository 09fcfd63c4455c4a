//! `cairn status`: the running daemon's stacks as a tree, with background work.
//!
//! ```text
//!   GET /v1/status (control.rs) ─> render: one line per stack node, box-drawing tree,
//!                                  a progress line under nodes with background work
//!   --watch N: again every N s (a terminal: clear and redraw; else blank-line separated)
//! ```
//!
//! ```text
//!   export home  1.0 GiB  active  (nbd://127.0.0.1:10809/home)  1 client
//!   └─ luks LUKS2 aes-xts-plain64 512-bit  1008 MiB  data at 16 MiB  active
//!      └─ md demo  1 GiB  raid6 4 members, chunk 64 KiB  clean
//!         [=========>          ]  45.2% resync  812 MiB/s  ETA 0:42
//!         ├─ d0.img  256 MiB  active sync
//!         └─ d3.img  0 bytes  removed
//! ```

use std::io::{IsTerminal, Write};
use std::time::Duration;

use cairn_nbd::Listen;

use crate::control;
use crate::control::ControlArgs;
use crate::error::{CliError, Result};
use crate::global::Global;
use cairn_stack::node::{Node, NodeKind, Progress};
use cairn_stack::size::format_size;
use clap::Args;

/// How long `cairn status` waits for each replicated resource's own status.
const REPL_STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// Width of the progress bar between the brackets.
const BAR: usize = 20;

pub fn run(args: StatusArgs, global: &Global) -> Result<()> {
    let path = control::resolve(args.control.control.as_deref())?;
    // Replicated resources run in processes of their own (`cairn repl up`): shown too,
    // unless one daemon was named.
    let repl_socks = if args.control.control.is_none() {
        crate::repl::local_sockets()
    } else {
        Vec::new()
    };
    let tty = std::io::stdout().is_terminal();
    let mut first = true;
    loop {
        let doc = match control::get_ok(&path, "/v1/status") {
            Ok(d) => Some(d),
            Err(_) if !repl_socks.is_empty() => None,
            Err(e) => return Err(e),
        };
        // Asked all at once, a few seconds each: a socket left by a killed process, or a
        // stopped one, answers nothing and is skipped without holding the others.
        let repl: Vec<serde_json::Value> =
            cairn_repl::control::statuses_at_once(&repl_socks, REPL_STATUS_TIMEOUT)
                .into_iter()
                .filter_map(Result::ok)
                .collect();
        let text = if global.json {
            let mut doc = doc.unwrap_or_else(|| serde_json::json!({}));
            if !repl.is_empty() {
                doc["replicated"] = serde_json::Value::Array(repl);
            }
            let mut s = serde_json::to_string(&doc).unwrap_or_default();
            s.push('\n');
            s
        } else {
            // Whose tree this is: with several daemons on a machine, it matters.
            let mut t = match &doc {
                Some(doc) => format!(
                    "cairn serve, PID {}, control socket {}\n{}",
                    doc["pid"],
                    path.display(),
                    render(doc, tty)?
                ),
                None => String::new(),
            };
            if !repl.is_empty() {
                if !t.is_empty() {
                    t.push('\n');
                }
                t.push_str("replicated resources (cairn repl)\n");
                t.push_str(&crate::repl::render_all(&repl)?);
            }
            t
        };
        let mut out = std::io::stdout().lock();
        let _ = match (args.watch.is_some(), tty, first) {
            // Home, clear: a steady picture, as watch(1) shows.
            (true, true, _) => write!(out, "\x1b[H\x1b[2J{text}"),
            (true, false, false) if !global.json => write!(out, "\n{text}"),
            _ => write!(out, "{text}"),
        };
        let _ = out.flush();
        drop(out);
        first = false;
        match args.watch {
            Some(secs) => std::thread::sleep(Duration::from_secs_f64(secs.max(0.1))),
            None => return Ok(()),
        }
    }
}

/// The whole status document as text.
pub fn render(doc: &serde_json::Value, tty: bool) -> Result<String> {
    let exports: Vec<Node> = serde_json::from_value(doc["exports"].clone()).map_err(|e| {
        CliError::new(format!(
            "the daemon's status is not what this cairn understands ({e}); is it another \
             version?"
        ))
    })?;
    let listen: Vec<Listen> = doc["listen"]
        .as_array()
        .map(|a| a.iter().filter_map(|v| v.as_str()?.parse().ok()).collect())
        .unwrap_or_default();
    let conns = doc["connections"].as_array().cloned().unwrap_or_default();
    let mut s = String::new();
    if exports.is_empty() {
        s.push_str("no exports\n");
    }
    for root in &exports {
        let uri = pick_uri(&listen, &root.name);
        let clients = conns
            .iter()
            .filter(|c| c["export"].as_str() == Some(root.name.as_str()))
            .count();
        let mut first = node_line(root);
        if let Some(u) = uri {
            first.push_str(&format!("  ({u})"));
        }
        if clients > 0 {
            first.push_str(&format!(
                "  {clients} client{}",
                if clients == 1 { "" } else { "s" }
            ));
        }
        s.push_str(&first);
        s.push('\n');
        if let Some(p) = &root.progress {
            s.push_str(&format!("  {}\n", progress_line(p, tty)));
        }
        children(&mut s, root, "", tty);
    }
    let events = doc["events"].as_array().cloned().unwrap_or_default();
    let recent: Vec<&serde_json::Value> = events.iter().rev().take(5).collect();
    if !recent.is_empty() {
        s.push_str("\nrecent events:\n");
        for e in recent.into_iter().rev() {
            s.push_str(&format!(
                "  {}  {}  {}\n",
                e["time"].as_str().unwrap_or("?"),
                e["event"].as_str().unwrap_or("?"),
                e["message"].as_str().unwrap_or("")
            ));
        }
    }
    Ok(s)
}

fn children(s: &mut String, n: &Node, prefix: &str, tty: bool) {
    let count = n.children.len();
    for (i, c) in n.children.iter().enumerate() {
        let last = i + 1 == count;
        let (branch, cont) = if last {
            ("└─ ", "   ")
        } else {
            ("├─ ", "│  ")
        };
        s.push_str(&format!("{prefix}{branch}{}\n", node_line(c)));
        let inner = format!("{prefix}{cont}");
        if let Some(p) = &c.progress {
            let bar_prefix = if c.children.is_empty() {
                format!("{inner}   ")
            } else {
                format!("{inner}│  ")
            };
            s.push_str(&format!("{bar_prefix}{}\n", progress_line(p, tty)));
        }
        children(s, c, &inner, tty);
    }
}

/// A TCP URI if there is a TCP listener, else the first one.
fn pick_uri(listen: &[Listen], name: &str) -> Option<String> {
    listen
        .iter()
        .find(|l| matches!(l, Listen::Tcp(_)))
        .or(listen.first())
        .map(|l| l.uri(name))
}

/// One node's line, without the tree drawing.
pub fn node_line(n: &Node) -> String {
    let size = format_size(n.size);
    match n.kind {
        NodeKind::Export => format!("export {}  {size}  {}", n.name, n.state),
        NodeKind::Lv => {
            let layout = match &n.lv {
                Some(lv) if lv.segtype.starts_with("raid") || lv.segtype == "mirror" => {
                    if lv.stripe_size > 0 {
                        format!(
                            "{} {} x {}",
                            lv.segtype,
                            lv.stripes,
                            format_size(lv.stripe_size)
                        )
                    } else {
                        lv.segtype.clone()
                    }
                }
                Some(lv) if lv.stripes > 1 => {
                    format!("striped {} x {}", lv.stripes, format_size(lv.stripe_size))
                }
                _ => "linear".into(),
            };
            format!("lv {}  {size}  {layout}  {}", n.name, n.state)
        }
        NodeKind::Luks => {
            let (words, offset) = match &n.luks {
                Some(l) => (
                    l.description
                        .split(", data at")
                        .next()
                        .unwrap_or(&l.description)
                        .to_string(),
                    l.payload_offset,
                ),
                None => (n.name.clone(), n.data_offset),
            };
            format!(
                "luks {words}  {size}  data at {}  {}",
                format_size(offset),
                n.state
            )
        }
        NodeKind::Md => {
            let shape = match &n.md {
                Some(md) => {
                    let chunk = if md.chunk_bytes > 0 {
                        format!(", chunk {}", format_size(md.chunk_bytes))
                    } else {
                        String::new()
                    };
                    format!("{} {} members{chunk}", md.level, md.raid_devices)
                }
                None => String::new(),
            };
            format!("md {}  {size}  {shape}  {}", n.name, n.state)
        }
        // A member the array does not hold open has no size to show; a failed one says
        // why and since when.
        NodeKind::Member => {
            let why = match &n.failure {
                Some(f) => format!(" (since {}: {})", f.since, f.reason),
                None => String::new(),
            };
            if n.size == 0 {
                format!("{}  {}{why}", n.name, n.state)
            } else {
                format!("{}  {size}  {}{why}", n.name, n.state)
            }
        }
        // A PV under a failed RAID LV image says why, as a failed member does.
        _ => {
            let why = match &n.failure {
                Some(f) if f.since.is_empty() => format!(" ({})", f.reason),
                Some(f) => format!(" (since {}: {})", f.since, f.reason),
                None => String::new(),
            };
            format!("{} {}  {size}  {}{why}", n.kind, n.name, n.state)
        }
    }
}

/// "0:42", "1:02:03"; "?" when unknown.
fn eta(p: &Progress) -> String {
    if p.bytes_per_sec == 0 {
        return "?".into();
    }
    let left = p.total_bytes.saturating_sub(p.done_bytes);
    let secs = left.div_ceil(p.bytes_per_sec);
    let (h, m, s) = (secs / 3600, secs % 3600 / 60, secs % 60);
    if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// The progress of background work: a bar on a terminal, words otherwise.
///
/// ```text
///   tty:   [=========>          ]  45.2% resync  812 MiB/s  ETA 0:42
///   plain: resync 45.2% done (463 MiB of 1 GiB), 812 MiB/s, ETA 0:42
/// ```
pub fn progress_line(p: &Progress, tty: bool) -> String {
    // Tenths of a percent, truncated in integers: 99.96% never shows as 100.0% while
    // work remains, and no float rounding moves a digit.
    let tenths = if p.total_bytes == 0 {
        0
    } else {
        u64::try_from(
            u128::from(p.done_bytes.min(p.total_bytes)) * 1000 / u128::from(p.total_bytes),
        )
        .unwrap_or(1000)
    };
    let pct = format!("{}.{}", tenths / 10, tenths % 10);
    let action = match &p.member {
        Some(m) => format!("{} of {m}", p.action),
        None => p.action.clone(),
    };
    let speed = if p.bytes_per_sec == 0 {
        "speed ?".to_string()
    } else {
        format!("{}/s", format_size(p.bytes_per_sec))
    };
    if tty {
        // Whole cells only, in integers like the percentage.
        let filled = usize::try_from(tenths).unwrap_or(1000) * BAR / 1000;
        let bar = if filled == BAR {
            "=".repeat(BAR)
        } else {
            format!("{}>{}", "=".repeat(filled), " ".repeat(BAR - filled - 1))
        };
        format!("[{bar}] {pct:>5}% {action}  {speed}  ETA {}", eta(p))
    } else {
        format!(
            "{action} {pct}% done ({} of {}), {speed}, ETA {}",
            format_size(p.done_bytes),
            format_size(p.total_bytes),
            eta(p)
        )
    }
}

// ---- the command line (clap) ----------------------------------------------------
//

pub(crate) const STATUS_LONG: &str = "\
Show every export of the running `cairn serve` as a tree, top to bottom: export -> LV -> \
LUKS -> md array -> members (or the file), each with its size, geometry words and state \
(md's own: clean, active, degraded; active sync, faulty, removed). Background work \
(resync, recovery, check) shows a progress bar with speed and time left on a terminal, \
and one plain line otherwise. Recent events (Fail, DegradedArray, ExportAdded, ...) follow.

--json prints the daemon's /v1/status document. --watch redraws every SECS seconds \
(default 2) until Ctrl-C.";

pub(crate) const STATUS_EXAMPLES: &str = "\
Examples:
  cairn status
  cairn status --watch              # redraw every 2 s
  cairn status --json | jq '.exports[].children[0].state'
  cairn status --control /tmp/c.sock";

/// `cairn status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub control: ControlArgs,

    /// Redraw every SECS seconds until Ctrl-C
    #[arg(short, long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2")]
    pub watch: Option<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_stack::node::{LuksDetails, MdDetails, NodeGeometry};
    use serde_json::json;

    fn p(done: u64, total: u64, speed: u64) -> Progress {
        Progress {
            member: None,
            action: "resync".into(),
            done_bytes: done,
            total_bytes: total,
            bytes_per_sec: speed,
        }
    }

    #[test]
    fn progress_bar_exact() {
        let mib = 1 << 20;
        assert_eq!(
            progress_line(&p(452 * mib, 1000 * mib, 812 * mib), true),
            "[=========>          ]  45.2% resync  812 MiB/s  ETA 0:01"
        );
        assert_eq!(
            progress_line(&p(0, 1 << 30, 0), true),
            "[>                   ]   0.0% resync  speed ?  ETA ?"
        );
        assert_eq!(
            progress_line(&p(1 << 30, 1 << 30, 10 * mib), true),
            "[====================] 100.0% resync  10 MiB/s  ETA 0:00"
        );
        // 42 s left at 10 MiB/s; 99.96% is not rounded up to 100.
        assert_eq!(
            progress_line(&p(581 * mib, 1000 * mib, 10 * mib), true),
            "[===========>        ]  58.1% resync  10 MiB/s  ETA 0:42"
        );
        assert_eq!(
            progress_line(&p(9996, 10000, 1), true),
            "[===================>]  99.9% resync  1 bytes/s  ETA 0:04"
        );
        assert_eq!(
            progress_line(&p(3 * (1 << 30) / 4, 1 << 30, mib / 4), true),
            "[===============>    ]  75.0% resync  256 KiB/s  ETA 17:04"
        );
        assert_eq!(
            progress_line(&p(0, 4 << 30, mib), false),
            "resync 0.0% done (0 bytes of 4 GiB), 1 MiB/s, ETA 1:08:16"
        );
        assert_eq!(
            progress_line(&p(452 * mib, 1000 * mib, 812 * mib), false),
            "resync 45.2% done (452 MiB of 1000 MiB), 812 MiB/s, ETA 0:01"
        );
    }

    fn node(kind: &str, name: &str, state: &str, size: u64, children: Vec<Node>) -> Node {
        Node {
            children,
            ..Node::new(
                kind.parse().unwrap(),
                format!("{kind}:{name}"),
                name.into(),
                cairn_stack::node::NodeState::parse(state).unwrap(),
                size,
                geom(),
            )
        }
    }

    fn geom() -> NodeGeometry {
        NodeGeometry {
            logical_block: 512,
            physical_block: 4096,
            optimal_io: 4096,
        }
    }

    #[test]
    fn tree_lines() {
        let members = vec![
            node("member", "d0.img", "active sync", 256 << 20, vec![]),
            node("member", "d1.img", "active sync", 256 << 20, vec![]),
            node("member", "(missing)", "removed", 0, vec![]),
        ];
        let mut md = node("md", "demo", "clean, degraded", 512 << 20, members);
        md.md = Some(MdDetails {
            uuid: "u".into(),
            level: "raid5".into(),
            layout: Some("left-symmetric".into()),
            chunk_bytes: 64 << 10,
            raid_devices: 3,
            data_disks: 2,
            active_devices: 2,
            failed_devices: 0,
            events: 3,
            mismatch_sectors: None,
            job: None,
        });
        md.progress = Some(p(1 << 28, 1 << 29, 1 << 20));
        let mut luks = node("luks", "LUKS2 u", "active", 496 << 20, vec![md]);
        luks.luks = Some(LuksDetails {
            version: 2,
            uuid: "u".into(),
            description: "LUKS2 aes-xts-plain64 512-bit, 4096-byte sectors, data at 16777216"
                .into(),
            sector_size: 4096,
            payload_offset: 16 << 20,
        });
        let root = node("export", "home", "active", 496 << 20, vec![luks]);
        let doc = json!({
            "exports": [root],
            "listen": ["unix:/tmp/s.sock", "tcp:127.0.0.1:10809"],
            "connections": [{"export": "home"}],
            "events": [{"time": "2026-01-01T00:00:00.000Z", "event": "DegradedArray",
                        "message": "md array \"demo\" is degraded"}],
        });
        let text = render(&doc, false).unwrap();
        assert_eq!(
            text,
            "\
export home  496 MiB  active  (nbd://127.0.0.1:10809/home)  1 client
└─ luks LUKS2 aes-xts-plain64 512-bit, 4096-byte sectors  496 MiB  data at 16 MiB  active
   └─ md demo  512 MiB  raid5 3 members, chunk 64 KiB  clean, degraded
      │  resync 50.0% done (256 MiB of 512 MiB), 1 MiB/s, ETA 4:16
      ├─ d0.img  256 MiB  active sync
      ├─ d1.img  256 MiB  active sync
      └─ (missing)  removed

recent events:
  2026-01-01T00:00:00.000Z  DegradedArray  md array \"demo\" is degraded
"
        );
        let tty = render(&doc, true).unwrap();
        assert!(
            tty.contains("      │  [==========>         ]  50.0% resync  1 MiB/s  ETA 4:16\n"),
            "{tty}"
        );
    }
}
