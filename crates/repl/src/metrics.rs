//! A resource's status as Prometheus text (`cairn repl up --metrics`): gauges a dashboard
//! or an alert can use (role, connection, out-of-sync bytes, resync progress and the rate
//! controller's target, split brain).

use std::fmt::Write as _;

use crate::node::{Conn, Repl, Role, Status};

/// Label values escaped as the text format asks (backslash, quote, newline).
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

pub fn prometheus(s: &Status) -> String {
    prometheus_all(std::slice::from_ref(s))
}

/// Several resources' gauges in one text (`cairn serve`'s `/metrics` carries those of the
/// resources running beside it): each metric's HELP and TYPE once, as the text format
/// asks, then a row per resource (and per peer). Nothing for no resources.
pub fn prometheus_all(all: &[Status]) -> String {
    let mut o = String::new();
    if all.is_empty() {
        return o;
    }
    let label = |s: &Status| {
        format!(
            "resource=\"{}\",node=\"{}\"",
            esc(&s.resource),
            esc(&s.node)
        )
    };
    let mut gauge = |name: &str, help: &str, rows: &[(String, Value)]| {
        let _ = writeln!(o, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, v) in rows {
            let _ = writeln!(o, "{name}{{{labels}}} {v}");
        }
    };
    let each = |f: &dyn Fn(&Status) -> Value| -> Vec<(String, Value)> {
        all.iter().map(|s| (label(s), f(s))).collect()
    };
    gauge(
        "cairn_repl_primary",
        "1 while this node is primary",
        &each(&|s| Value::from(s.role == Role::Primary)),
    );
    gauge(
        "cairn_repl_up_to_date",
        "1 while this node's disk is UpToDate",
        &each(&|s| Value::from(s.disk == "UpToDate")),
    );
    gauge(
        "cairn_repl_io_suspended",
        "1 while requests wait for an up-to-date peer (a diskless primary, --on-no-data suspend-io)",
        &each(&|s| Value::from(s.io_suspended.is_some())),
    );
    gauge(
        "cairn_repl_epoch",
        "the fencing epoch this node knows",
        &each(&|s| Value::N(s.epoch)),
    );
    gauge(
        "cairn_repl_data_bytes",
        "bytes of replicated data",
        &each(&|s| Value::N(s.data_size)),
    );
    gauge(
        "cairn_repl_resync_min_bytes_per_second",
        "the rate resync and verify keep while the application does I/O (--resync-min-rate)",
        &each(&|s| Value::N(s.resync_limits.min_bytes_per_sec)),
    );
    gauge(
        "cairn_repl_resync_max_bytes_per_second",
        "the rate resync and verify run at when the application is idle (--resync-rate; +Inf: unlimited)",
        &each(&|s| Value::rate(Some(s.resync_limits.max_bytes_per_sec).filter(|m| *m > 0))),
    );
    let per = |f: &dyn Fn(&crate::node::PeerStatus) -> Value| -> Vec<(String, Value)> {
        all.iter()
            .flat_map(|s| {
                s.peers
                    .iter()
                    .map(move |p| (format!("{},peer=\"{}\"", label(s), esc(&p.name)), f(p)))
            })
            .collect()
    };
    gauge(
        "cairn_repl_peer_connected",
        "1 while the peer is connected",
        &per(&|p| Value::from(p.connection == Conn::Connected)),
    );
    gauge(
        "cairn_repl_peer_in_sync",
        "1 while the peer is connected and in sync",
        &per(&|p| Value::from(p.replication == Repl::Established && p.out_of_sync_bytes == 0)),
    );
    gauge(
        "cairn_repl_peer_split_brain",
        "1 while split brain with the peer is unresolved",
        &per(&|p| Value::from(p.replication == Repl::SplitBrain)),
    );
    gauge(
        "cairn_repl_peer_out_of_sync_bytes",
        "bytes the peer lacks (its bitmap)",
        &per(&|p| Value::N(p.out_of_sync_bytes)),
    );
    gauge(
        "cairn_repl_peer_resync_done_bytes",
        "bytes copied by the running resync",
        &per(&|p| Value::N(p.resync.as_ref().map_or(0, |r| r.done_bytes))),
    );
    gauge(
        "cairn_repl_peer_resync_total_bytes",
        "bytes the running resync copies in all",
        &per(&|p| Value::N(p.resync.as_ref().map_or(0, |r| r.total_bytes))),
    );
    gauge(
        "cairn_repl_peer_resync_bytes_per_second",
        "speed of the running resync",
        &per(&|p| Value::N(p.resync.as_ref().map_or(0, |r| r.bytes_per_sec))),
    );
    gauge(
        "cairn_repl_peer_resync_target_bytes_per_second",
        "the rate the controller paces the running resync to (+Inf: unlimited; 0: no resync runs)",
        &per(&|p| {
            p.resync
                .as_ref()
                .map_or(Value::N(0), |r| Value::rate(r.target_bytes_per_sec))
        }),
    );
    gauge(
        "cairn_repl_peer_resync_throttled",
        "1 while application I/O holds the running resync at the minimum rate",
        &per(&|p| Value::from(p.resync.as_ref().is_some_and(|r| r.throttled))),
    );
    let verifying = |p: &crate::node::PeerStatus| p.verify.as_ref().filter(|v| v.running).cloned();
    gauge(
        "cairn_repl_peer_verify_target_bytes_per_second",
        "the rate the controller paces the running online verify to (+Inf: unlimited; 0: no verify runs)",
        &per(&|p| verifying(p).map_or(Value::N(0), |v| Value::rate(v.target_bytes_per_sec))),
    );
    gauge(
        "cairn_repl_peer_verify_throttled",
        "1 while application I/O holds the running online verify at the minimum rate",
        &per(&|p| Value::from(verifying(p).is_some_and(|v| v.throttled))),
    );
    o
}

/// A sample's value: a count, or +Inf for a rate without a limit.
enum Value {
    N(u64),
    Inf,
}

impl Value {
    fn rate(r: Option<u64>) -> Value {
        r.map_or(Value::Inf, Value::N)
    }
}

impl From<bool> for Value {
    fn from(b: bool) -> Value {
        Value::N(u64::from(b))
    }
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::N(n) => write!(f, "{n}"),
            Value::Inf => f.write_str("+Inf"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::Generations;
    use crate::node::{PeerStatus, Progress};
    use crate::rate::RateLimits;

    fn sample(resource: &str, node: &str) -> Status {
        let progress = |target, throttled| Progress {
            total_bytes: 100,
            done_bytes: 40,
            bytes_per_sec: 10,
            eta_secs: Some(6),
            full: true,
            target_bytes_per_sec: target,
            throttled,
        };
        let peer = |name: &str, resync| PeerStatus {
            name: name.into(),
            address: "tcp:10.0.0.2:7789".into(),
            connection: Conn::Connected,
            replication: Repl::SyncSource,
            out_of_sync_bytes: 60,
            peer_changes: None,
            resync,
            last_error: None,
            since: 0,
            verify: None,
        };
        Status {
            resource: resource.into(),
            node: node.into(),
            role: Role::Primary,
            disk: "UpToDate".into(),
            data_size: 100,
            epoch: 3,
            generations: Generations {
                current: 1,
                bitmap: 0,
                history: [0, 0],
            },
            crashed_primary: false,
            quorum: None,
            io_suspended: None,
            resync_limits: RateLimits {
                min_bytes_per_sec: 1 << 20,
                max_bytes_per_sec: 0,
            },
            peers: vec![
                peer("b", Some(progress(Some(1 << 20), true))),
                peer("c", Some(progress(None, false))),
                peer("d", None),
            ],
            events: Vec::new(),
        }
    }

    #[test]
    fn the_rate_controller_is_in_the_gauges() {
        let m = prometheus(&sample("home", "a"));
        let n = r#"resource="home",node="a""#;
        for line in [
            format!("cairn_repl_resync_min_bytes_per_second{{{n}}} 1048576"),
            format!("cairn_repl_resync_max_bytes_per_second{{{n}}} +Inf"),
            format!("cairn_repl_peer_resync_target_bytes_per_second{{{n},peer=\"b\"}} 1048576"),
            format!("cairn_repl_peer_resync_throttled{{{n},peer=\"b\"}} 1"),
            format!("cairn_repl_peer_resync_target_bytes_per_second{{{n},peer=\"c\"}} +Inf"),
            format!("cairn_repl_peer_resync_throttled{{{n},peer=\"c\"}} 0"),
            format!("cairn_repl_peer_resync_target_bytes_per_second{{{n},peer=\"d\"}} 0"),
            format!("cairn_repl_peer_verify_throttled{{{n},peer=\"b\"}} 0"),
            format!("cairn_repl_primary{{{n}}} 1"),
        ] {
            assert!(m.lines().any(|l| l == line), "{line} not in\n{m}");
        }
    }

    #[test]
    fn several_resources_share_each_metrics_help_and_type() {
        let mut b = sample("media", "b");
        b.role = Role::Secondary;
        b.peers.truncate(1);
        let m = prometheus_all(&[sample("home", "a"), b]);
        for name in ["cairn_repl_primary", "cairn_repl_peer_connected"] {
            let help = format!("# HELP {name} ");
            let kind = format!("# TYPE {name} gauge");
            assert_eq!(m.lines().filter(|l| l.starts_with(&help)).count(), 1, "{m}");
            assert_eq!(m.lines().filter(|l| *l == kind).count(), 1, "{m}");
        }
        for line in [
            r#"cairn_repl_primary{resource="home",node="a"} 1"#,
            r#"cairn_repl_primary{resource="media",node="b"} 0"#,
            r#"cairn_repl_peer_connected{resource="home",node="a",peer="d"} 1"#,
            r#"cairn_repl_peer_connected{resource="media",node="b",peer="b"} 1"#,
        ] {
            assert!(m.lines().any(|l| l == line), "{line} not in\n{m}");
        }
        // Each family's rows follow its TYPE line (a family split in two is malformed).
        let rows = m
            .lines()
            .skip_while(|l| !l.starts_with("# TYPE cairn_repl_primary "));
        let rows: Vec<_> = rows.skip(1).take_while(|l| !l.starts_with('#')).collect();
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(prometheus_all(&[]), "");
    }
}
