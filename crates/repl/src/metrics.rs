//! A resource's status as Prometheus text (`cairn repl up --metrics`): gauges a dashboard
//! or an alert can use (role, connection, out-of-sync bytes, resync progress, split brain).

use std::fmt::Write as _;

use crate::node::{Conn, Repl, Role, Status};

/// Label values escaped as the text format asks (backslash, quote, newline).
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub fn prometheus(s: &Status) -> String {
    let mut o = String::new();
    let node = format!(
        "resource=\"{}\",node=\"{}\"",
        esc(&s.resource),
        esc(&s.node)
    );
    let mut gauge = |name: &str, help: &str, rows: &[(String, u64)]| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, v) in rows {
            let _ = writeln!(o, "{name}{{{labels}}} {v}");
        }
    };
    gauge(
        "cairn_repl_primary",
        "1 while this node is primary",
        &[(node.clone(), u64::from(s.role == Role::Primary))],
    );
    gauge(
        "cairn_repl_up_to_date",
        "1 while this node's disk is UpToDate",
        &[(node.clone(), u64::from(s.disk == "UpToDate"))],
    );
    gauge(
        "cairn_repl_epoch",
        "the fencing epoch this node knows",
        &[(node.clone(), s.epoch)],
    );
    gauge(
        "cairn_repl_data_bytes",
        "bytes of replicated data",
        &[(node.clone(), s.data_size)],
    );
    let per = |f: &dyn Fn(&crate::node::PeerStatus) -> u64| -> Vec<(String, u64)> {
        s.peers
            .iter()
            .map(|p| (format!("{node},peer=\"{}\"", esc(&p.name)), f(p)))
            .collect()
    };
    gauge(
        "cairn_repl_peer_connected",
        "1 while the peer is connected",
        &per(&|p| u64::from(p.connection == Conn::Connected)),
    );
    gauge(
        "cairn_repl_peer_in_sync",
        "1 while the peer is connected and in sync",
        &per(&|p| u64::from(p.replication == Repl::Established && p.out_of_sync_bytes == 0)),
    );
    gauge(
        "cairn_repl_peer_split_brain",
        "1 while split brain with the peer is unresolved",
        &per(&|p| u64::from(p.replication == Repl::SplitBrain)),
    );
    gauge(
        "cairn_repl_peer_out_of_sync_bytes",
        "bytes the peer lacks (its bitmap)",
        &per(&|p| p.out_of_sync_bytes),
    );
    gauge(
        "cairn_repl_peer_resync_done_bytes",
        "bytes copied by the running resync",
        &per(&|p| p.resync.as_ref().map_or(0, |r| r.done_bytes)),
    );
    gauge(
        "cairn_repl_peer_resync_total_bytes",
        "bytes the running resync copies in all",
        &per(&|p| p.resync.as_ref().map_or(0, |r| r.total_bytes)),
    );
    gauge(
        "cairn_repl_peer_resync_bytes_per_second",
        "speed of the running resync",
        &per(&|p| p.resync.as_ref().map_or(0, |r| r.bytes_per_sec)),
    );
    o
}
