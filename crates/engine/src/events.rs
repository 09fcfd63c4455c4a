//! State-change events, as `mdadm --monitor` reports them: to the log, into a bounded
//! ring the control API serves, and to an operator's `--on-event CMD`.
//!
//! ```text
//!   emit(kind, ...) ──> tracing (warn for failures, info otherwise)
//!                  ├──> ring (last N, for GET /v1/status and /v1/events)
//!                  └──> bounded queue ──> hook thread: sh -c CMD, one at a time, with
//!                                         CAIRN_EVENT, CAIRN_DEVICE, ... in the environment
//! ```
//!
//! `emit` never blocks: when the hook falls behind by more than the queue holds, events
//! are still logged and kept in the ring but not passed to the hook (which is logged).
//! Event names are mdadm's where mdadm has one (Fail, DegradedArray, RebuildStarted,
//! RebuildNN, RebuildFinished, SpareActive); cairn's own are MismatchesFound,
//! MemberAdded, MemberRemoved, ExportAdded and ExportRemoved. They are emitted where the
//! state changes: md arrays push theirs (`md_events`), the daemon's actions theirs.

use std::collections::{BTreeMap, VecDeque};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

/// An md array started (or was found) running.
pub const NEW_ARRAY: &str = "NewArray";
/// An array runs without full redundancy.
pub const DEGRADED_ARRAY: &str = "DegradedArray";
/// A member was marked faulty.
pub const FAIL: &str = "Fail";
/// A member that was there is gone.
pub const DEVICE_DISAPPEARED: &str = "DeviceDisappeared";
/// A member is in sync again (after a rebuild).
pub const SPARE_ACTIVE: &str = "SpareActive";
/// Background work (resync, recovery, check) started.
pub const REBUILD_STARTED: &str = "RebuildStarted";
/// Background work finished.
pub const REBUILD_FINISHED: &str = "RebuildFinished";
/// A check or repair found parity or copies that do not match the data (cairn's
/// name; mdadm reports this only in its RebuildFinished mail).
pub const MISMATCHES_FOUND: &str = "MismatchesFound";
/// A member was added to an md array (as a spare, or re-added into its role) (cairn's
/// name).
pub const MEMBER_ADDED: &str = "MemberAdded";
/// A faulty member, a spare or a replacement was taken out of an md array (cairn's
/// name).
pub const MEMBER_REMOVED: &str = "MemberRemoved";
/// An export was added at runtime.
pub const EXPORT_ADDED: &str = "ExportAdded";
/// An export was removed at runtime.
pub const EXPORT_REMOVED: &str = "ExportRemoved";

/// mdadm's RebuildNN event name for 20, 40, 60 or 80 %.
pub fn rebuild_nn(nn: u64) -> &'static str {
    match nn {
        20 => "Rebuild20",
        40 => "Rebuild40",
        60 => "Rebuild60",
        _ => "Rebuild80",
    }
}

/// How long a hook may run before it is killed.
const HOOK_TIMEOUT: Duration = Duration::from_secs(60);
/// Events waiting for the hook.
const HOOK_QUEUE: usize = 256;

/// One event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// 1, 2, 3, ... in the order emitted.
    pub seq: u64,
    /// RFC 3339, UTC, milliseconds.
    pub time: String,
    /// "Fail", "DegradedArray", "ExportAdded", ...
    pub event: String,
    /// The export the event concerns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<String>,
    /// The array or device (a stack node's name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    /// The member, for member events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    /// One sentence for people.
    pub message: String,
}

impl Event {
    /// The environment a hook sees.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut v = vec![
            ("CAIRN_EVENT", self.event.clone()),
            ("CAIRN_SEQ", self.seq.to_string()),
            ("CAIRN_TIME", self.time.clone()),
            ("CAIRN_MESSAGE", self.message.clone()),
        ];
        for (k, val) in [
            ("CAIRN_EXPORT", &self.export),
            ("CAIRN_DEVICE", &self.device),
            ("CAIRN_MEMBER", &self.member),
        ] {
            v.push((k, val.clone().unwrap_or_default()));
        }
        v
    }
}

/// What to report about one event; `seq` and `time` are filled in by [`Events::emit`].
#[derive(Debug, Clone, Default)]
pub struct EventSpec {
    pub event: &'static str,
    pub export: Option<String>,
    pub device: Option<String>,
    pub member: Option<String>,
    pub message: String,
}

/// The daemon's event stream.
#[derive(Debug)]
pub struct Events {
    ring: Mutex<VecDeque<Event>>,
    capacity: usize,
    seq: AtomicU64,
    counts: Mutex<BTreeMap<String, u64>>,
    hook: Option<SyncSender<Event>>,
}

impl Events {
    /// Keeps the last `capacity` events; runs `hook` (a shell command) for each, if given.
    pub fn new(capacity: usize, hook: Option<String>) -> Arc<Events> {
        let hook = hook.and_then(|cmd| {
            let (tx, rx) = sync_channel::<Event>(HOOK_QUEUE);
            match thread::Builder::new()
                .name("on-event".into())
                .spawn(move || run_hooks(&cmd, &rx))
            {
                Ok(_) => Some(tx),
                Err(e) => {
                    tracing::error!("cannot start the --on-event thread: {e}");
                    None
                }
            }
        });
        Arc::new(Events {
            ring: Mutex::new(VecDeque::with_capacity(capacity)),
            capacity: capacity.max(1),
            seq: AtomicU64::new(0),
            counts: Mutex::new(BTreeMap::new()),
            hook,
        })
    }

    /// Logs, keeps and hands the event to the hook; returns it.
    pub fn emit(&self, spec: EventSpec) -> Event {
        let e = Event {
            seq: self.seq.fetch_add(1, Ordering::SeqCst) + 1,
            time: rfc3339_now(),
            event: spec.event.to_string(),
            export: spec.export,
            device: spec.device,
            member: spec.member,
            message: spec.message,
        };
        match e.event.as_str() {
            FAIL | DEGRADED_ARRAY | DEVICE_DISAPPEARED => {
                tracing::warn!(event = %e.event, "{}", e.message)
            }
            _ => tracing::info!(event = %e.event, "{}", e.message),
        }
        {
            let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
            if ring.len() == self.capacity {
                ring.pop_front();
            }
            ring.push_back(e.clone());
        }
        *self
            .counts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(e.event.clone())
            .or_default() += 1;
        if let Some(tx) = &self.hook {
            match tx.try_send(e.clone()) {
                Ok(()) => {}
                Err(TrySendError::Full(_)) => tracing::warn!(
                    "--on-event is {HOOK_QUEUE} events behind; event {} ({}) not passed to it",
                    e.seq,
                    e.event
                ),
                Err(TrySendError::Disconnected(_)) => {
                    tracing::warn!("the --on-event thread is gone; event {} not passed", e.seq)
                }
            }
        }
        e
    }

    /// The kept events, oldest first, with `seq` greater than `after`.
    pub fn since(&self, after: u64) -> Vec<Event> {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        ring.iter().filter(|e| e.seq > after).cloned().collect()
    }

    /// Events emitted so far, by name.
    pub fn counts(&self) -> Vec<(String, u64)> {
        let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.iter().map(|(k, v)| (k.clone(), *v)).collect()
    }
}

/// The hook thread: one `sh -c CMD` per event, in order. Like mdadm's PROGRAM, the
/// command also gets the event, device and member as `$1 $2 $3`.
fn run_hooks(cmd: &str, rx: &Receiver<Event>) {
    for e in rx {
        let mut c = Command::new("/bin/sh");
        c.arg("-c")
            .arg(cmd)
            .arg("cairn-on-event")
            .arg(&e.event)
            .arg(e.device.clone().unwrap_or_default())
            .arg(e.member.clone().unwrap_or_default())
            .stdin(Stdio::null());
        for (k, v) in e.env() {
            c.env(k, v);
        }
        let mut child = match c.spawn() {
            Ok(ch) => ch,
            Err(err) => {
                tracing::warn!("--on-event: cannot run `{cmd}` for {}: {err}", e.event);
                continue;
            }
        };
        let start = Instant::now();
        let status = loop {
            match child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if start.elapsed() > HOOK_TIMEOUT => {
                    let _ = child.kill();
                    let _ = child.wait();
                    tracing::warn!(
                        "--on-event: `{cmd}` ran longer than {} s for {} and was killed",
                        HOOK_TIMEOUT.as_secs(),
                        e.event
                    );
                    break None;
                }
                Ok(None) => thread::sleep(Duration::from_millis(20)),
                Err(err) => {
                    tracing::warn!("--on-event: waiting for `{cmd}`: {err}");
                    break None;
                }
            }
        };
        if let Some(s) = status.filter(|s| !s.success()) {
            tracing::warn!("--on-event: `{cmd}` failed for {} ({s})", e.event);
        }
    }
}

/// Now as RFC 3339 UTC with milliseconds: "2026-11-21T18:36:30.123Z".
pub fn rfc3339_now() -> String {
    rfc3339_at(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default(),
    )
}

/// `since_epoch` after 1970-01-01 UTC as RFC 3339 with milliseconds.
pub fn rfc3339_at(since_epoch: Duration) -> String {
    rfc3339(since_epoch.as_secs(), since_epoch.subsec_millis())
}

fn rfc3339(secs: u64, millis: u32) -> String {
    const FORMAT: &[time::format_description::BorrowedFormatItem<'_>] = time::macros::format_description!(
        "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:3]Z"
    );
    i64::try_from(secs)
        .ok()
        .and_then(|s| time::OffsetDateTime::from_unix_timestamp(s).ok())
        .and_then(|t| {
            t.replace_millisecond(u16::try_from(millis.min(999)).unwrap_or(0))
                .ok()
        })
        .and_then(|t| t.format(FORMAT).ok())
        // Past year 9999 (a clock gone wild): the epoch's seconds, still readable.
        .unwrap_or_else(|| format!("@{secs}.{millis:03}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_795_286_190, 123), "2026-11-21T18:36:30.123Z");
        assert_eq!(rfc3339(253_402_300_799, 999), "9999-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(u64::MAX, 0), format!("@{}.000", u64::MAX));
    }

    #[test]
    fn ring_keeps_the_last_events_and_counts_all() {
        let ev = Events::new(3, None);
        for i in 0..5 {
            ev.emit(EventSpec {
                event: if i == 0 { DEGRADED_ARRAY } else { EXPORT_ADDED },
                export: Some(format!("e{i}")),
                message: format!("event {i}"),
                ..EventSpec::default()
            });
        }
        let kept = ev.since(0);
        assert_eq!(
            kept.iter().map(|e| e.seq).collect::<Vec<_>>(),
            vec![3, 4, 5]
        );
        assert_eq!(ev.since(4).len(), 1);
        assert_eq!(
            ev.counts(),
            vec![("DegradedArray".into(), 1), ("ExportAdded".into(), 4)]
        );
    }

    #[test]
    fn the_hook_gets_the_event_in_its_environment() {
        let _one = crate::FORKING_TESTS
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let dir = std::env::temp_dir().join(format!("cairn-events-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("out");
        let cmd = format!(
            "echo \"$CAIRN_EVENT|$CAIRN_EXPORT|$CAIRN_DEVICE|$CAIRN_MEMBER|$CAIRN_MESSAGE|$1|$3\" >> {}; exit 3",
            out.display()
        );
        let ev = Events::new(8, Some(cmd));
        ev.emit(EventSpec {
            event: FAIL,
            export: Some("home".into()),
            device: Some("demo".into()),
            member: Some("d1.img".into()),
            message: "member d1.img failed".into(),
        });
        ev.emit(EventSpec {
            event: EXPORT_REMOVED,
            export: Some("x".into()),
            message: "gone".into(),
            ..EventSpec::default()
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        let text = loop {
            let t = std::fs::read_to_string(&out).unwrap_or_default();
            if t.lines().count() == 2 || Instant::now() > deadline {
                break t;
            }
            thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(
            text,
            "Fail|home|demo|d1.img|member d1.img failed|Fail|d1.img\nExportRemoved|x|||gone|ExportRemoved|\n"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
