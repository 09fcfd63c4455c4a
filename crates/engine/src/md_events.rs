//! md arrays' pushed state changes turned into the daemon's events (mdadm's names), the
//! moment md tells them: nothing is found by comparing looks, so a change that begins
//! and ends within a millisecond still gives both events, in order.
//!
//! ```text
//!   cairn_md::Array ─ MdEvent ─> MdEvents (one per array, registered by the daemon)
//!       MemberFailed  -> Fail            JobStarted          -> RebuildStarted
//!       Degraded      -> DegradedArray   JobProgress 20..80  -> Rebuild20 .. Rebuild80
//!       MemberAdded   -> MemberAdded     JobEnded            -> RebuildFinished (+ SpareActive,
//!       MemberRemoved -> MemberRemoved                           + MismatchesFound)
//!   first look, when registered: DegradedArray, Fail (at the daemon's start only) and a
//!   running job's RebuildStarted, as mdadm --monitor reports at its start
//! ```

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, PoisonError};

use cairn_md::{Array, MdEvent, MemberState};

use crate::events::{self, EventSpec, Events};

/// The observer the daemon registers on one md array.
#[derive(Debug)]
pub struct MdEvents {
    events: Arc<Events>,
    /// The export the array is served under (the first, when several share it).
    export: String,
    /// A RAID LV's array has no name of its own: events name the LV (`VG/LV`).
    lv: Option<String>,
    /// Jobs already told as started: the first look and the push may both see one.
    started: Mutex<BTreeSet<u64>>,
}

impl MdEvents {
    /// Registers an observer on `array` that emits into `events`, then reports what is
    /// already so: at the daemon's start (`first`) a degraded array and faulty members,
    /// and always a job already running.
    pub fn register(array: &Arc<Array>, export: &str, events: &Arc<Events>, first: bool) {
        Self::register_as(array, export, None, events, first);
    }

    /// [`MdEvents::register`] for the array of the RAID LV served as export `lv`
    /// (`VG/LV`): its events name the LV.
    pub fn register_lv(array: &Arc<Array>, lv: &str, events: &Arc<Events>, first: bool) {
        Self::register_as(array, lv, Some(lv), events, first);
    }

    fn register_as(
        array: &Arc<Array>,
        export: &str,
        lv: Option<&str>,
        events: &Arc<Events>,
        first: bool,
    ) {
        let sink = Arc::new(MdEvents {
            events: events.clone(),
            export: export.to_string(),
            lv: lv.map(str::to_string),
            started: Mutex::new(BTreeSet::new()),
        });
        array.observe(sink.clone());
        let r = array.report();
        if first {
            if r.state.degraded {
                sink.tell(
                    &r.name,
                    &MdEvent::Degraded {
                        state: r.state_text.clone(),
                    },
                );
            }
            for m in r.members.iter().filter(|m| m.state == MemberState::Faulty) {
                let failure = m.failure.clone().unwrap_or_else(|| cairn_md::Failure {
                    reason: "faulty when the daemon started".into(),
                    since_unix: 0,
                });
                sink.tell(
                    &r.name,
                    &MdEvent::MemberFailed {
                        member: m.name.clone().unwrap_or_else(|| "(missing)".into()),
                        role: m.role,
                        failure,
                    },
                );
            }
        }
        if let Some(job) = array.background().filter(|b| b.state == "running") {
            sink.tell(&r.name, &MdEvent::JobStarted(job));
        }
    }

    fn tell(&self, array: &str, e: &MdEvent) {
        for spec in self.specs(array, e) {
            self.events.emit(spec);
        }
    }

    /// The events one change of `array` makes.
    pub fn specs(&self, array: &str, e: &MdEvent) -> Vec<EventSpec> {
        // How messages name the array: quoted, and in a phrase.
        let (quoted, plain, device) = match &self.lv {
            Some(lv) => (format!("RAID LV {lv}"), format!("RAID LV {lv}"), lv.clone()),
            None => (
                format!("md array {array:?}"),
                format!("md array {array}"),
                array.to_string(),
            ),
        };
        let spec = |event: &'static str, member: Option<&str>, message: String| EventSpec {
            event,
            export: Some(self.export.clone()),
            device: Some(device.clone()),
            member: member.map(str::to_string),
            message,
        };
        match e {
            MdEvent::MemberFailed {
                member, failure, ..
            } => vec![spec(
                events::FAIL,
                Some(member),
                format!("member {member} of {plain} is faulty: {}", failure.reason),
            )],
            MdEvent::Degraded { state } => vec![spec(
                events::DEGRADED_ARRAY,
                None,
                format!("{quoted} is degraded ({state})"),
            )],
            MdEvent::MemberAdded { member, message } => vec![spec(
                events::MEMBER_ADDED,
                Some(member),
                format!("{quoted}: {message}"),
            )],
            MdEvent::MemberRemoved { member } => vec![spec(
                events::MEMBER_REMOVED,
                Some(member),
                format!("member {member} removed from {plain}"),
            )],
            MdEvent::JobStarted(job) => {
                let new = self
                    .started
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .insert(job.id);
                if !new {
                    return Vec::new();
                }
                vec![spec(
                    events::REBUILD_STARTED,
                    None,
                    format!("{quoted}: {} started", job.action),
                )]
            }
            MdEvent::JobProgress { job, percent } => vec![spec(
                events::rebuild_nn(*percent),
                None,
                format!("{quoted}: {} {percent}% done", job.action),
            )],
            MdEvent::JobEnded {
                job,
                mismatch_sectors,
            } => {
                let mut out = vec![spec(
                    events::REBUILD_FINISHED,
                    None,
                    format!("{quoted}: {} {}", job.action, job.state),
                )];
                // A rebuilt spare (or a replacement) is in sync now.
                if job.state == "finished" && matches!(job.action, "recovery" | "replace") {
                    let m = job.member.as_deref().unwrap_or("?");
                    out.push(spec(
                        events::SPARE_ACTIVE,
                        job.member.as_deref(),
                        format!("member {m} of {plain} is in sync"),
                    ));
                }
                if let Some(x) = mismatch_sectors.filter(|&x| x > 0) {
                    out.push(spec(
                        events::MISMATCHES_FOUND,
                        None,
                        format!("{quoted}: a scrub found {x} mismatched sectors"),
                    ));
                }
                out
            }
        }
    }
}

impl cairn_md::Observer for MdEvents {
    fn md_event(&self, array: &str, event: &MdEvent) {
        self.tell(array, event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_block::{BlockDevice, MemDisk};
    use cairn_md::{CreateOptions, Level};

    fn raid5() -> (Arc<Array>, Vec<Arc<MemDisk>>) {
        let m: Vec<Arc<MemDisk>> = (0..3).map(|_| Arc::new(MemDisk::new(4 << 20))).collect();
        let mut o = CreateOptions::new(Level::Raid5, "demo");
        o.members_zeroed = true;
        let a = Array::create(
            m.iter()
                .map(|d| d.clone() as Arc<dyn BlockDevice>)
                .collect(),
            (0..3).map(|i| format!("d{i}.img")).collect(),
            &o,
        )
        .unwrap();
        (Arc::new(a), m)
    }

    fn names(ev: &Events) -> Vec<String> {
        ev.since(0).into_iter().map(|e| e.event).collect()
    }

    #[test]
    fn a_fail_and_an_immediate_remove_give_both_events_in_order() {
        let (a, _m) = raid5();
        let ev = Events::new(64, None);
        MdEvents::register(&a, "e", &ev, true);
        assert!(names(&ev).is_empty(), "a healthy array reports nothing");
        a.fail("d1.img").unwrap();
        a.remove("d1.img").unwrap();
        assert_eq!(names(&ev), ["Fail", "DegradedArray", "MemberRemoved"]);
        let all = ev.since(0);
        assert_eq!(all[0].member.as_deref(), Some("d1.img"));
        assert_eq!(all[0].device.as_deref(), Some("demo"));
        assert_eq!(all[0].export.as_deref(), Some("e"));
        assert!(
            all[0].message.contains("marked faulty by the operator"),
            "{}",
            all[0].message
        );
    }

    #[test]
    fn a_raid_lv_s_events_name_the_lv() {
        let (a, _m) = raid5();
        let ev = Events::new(64, None);
        MdEvents::register_lv(&a, "vg0/r", &ev, true);
        a.fail("d1.img").unwrap();
        let all = ev.since(0);
        assert_eq!(all[0].event, "Fail");
        assert_eq!(all[0].device.as_deref(), Some("vg0/r"));
        assert_eq!(all[0].export.as_deref(), Some("vg0/r"));
        assert!(
            all[0]
                .message
                .starts_with("member d1.img of RAID LV vg0/r is faulty"),
            "{}",
            all[0].message
        );
        assert_eq!(
            all[1].message,
            "RAID LV vg0/r is degraded (clean, degraded)"
        );
    }

    #[test]
    fn the_first_look_reports_problems_once() {
        let (a, _m) = raid5();
        a.fail("d0.img").unwrap();
        let ev = Events::new(64, None);
        MdEvents::register(&a, "e", &ev, true);
        assert_eq!(names(&ev), ["DegradedArray", "Fail"]);
        // An array added at run time reports only what happens from then on.
        let later = Events::new(64, None);
        MdEvents::register(&a, "e", &later, false);
        assert!(names(&later).is_empty());
    }

    #[test]
    fn a_rebuild_is_told_from_start_to_end() {
        let (a, m) = raid5();
        let ev = Events::new(64, None);
        MdEvents::register(&a, "e", &ev, true);
        a.manage(cairn_md::SpeedLimits {
            min: 1 << 30,
            max: 1 << 30,
        });
        a.fail("d2.img").unwrap();
        a.remove("d2.img").unwrap();
        a.add(m[2].clone() as Arc<dyn BlockDevice>, "d2.img".into(), false)
            .unwrap();
        let t = std::time::Instant::now();
        while !names(&ev).iter().any(|n| n == "SpareActive") {
            assert!(t.elapsed().as_secs() < 20, "{:?}", names(&ev));
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        let got = names(&ev);
        let want = [
            "Fail",
            "DegradedArray",
            "MemberRemoved",
            "MemberAdded",
            "RebuildStarted",
            "RebuildFinished",
            "SpareActive",
        ];
        let only: Vec<&String> = got.iter().filter(|n| want.contains(&n.as_str())).collect();
        assert_eq!(only, want, "{got:?}");
        a.close().unwrap();
    }
}
