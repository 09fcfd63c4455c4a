//! State changes are pushed to observers the moment they happen: a fail then an
//! immediate remove, and a fail then an immediate re-add that rebuilds, each give every
//! event in order, with the failure's reason and time in the report meanwhile.

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn_block::BlockDevice;
use cairn_md::{Level, MdEvent, MemberState, Observer, SpeedLimits};
use common::{create, Shape};

#[derive(Default)]
struct Log(Mutex<Vec<String>>);

impl Observer for Log {
    fn md_event(&self, array: &str, e: &MdEvent) {
        let line = match e {
            MdEvent::MemberFailed {
                member, failure, ..
            } => format!("{array} failed {member}: {}", failure.reason),
            MdEvent::MemberAdded { member, .. } => format!("{array} added {member}"),
            MdEvent::MemberRemoved { member } => format!("{array} removed {member}"),
            MdEvent::Degraded { state } => format!("{array} degraded ({state})"),
            MdEvent::JobStarted(j) => format!("{array} {} started", j.action),
            MdEvent::JobProgress { job, percent } => format!("{array} {} {percent}%", job.action),
            MdEvent::JobEnded { job, .. } => format!("{array} {} {}", job.action, job.state),
        };
        self.0.lock().unwrap().push(line);
    }
}

impl Log {
    fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

#[test]
fn a_fail_and_an_immediate_remove_are_both_told_in_order() {
    let shape = Shape::new(Level::Raid5, None, 16, 3).rows(16);
    let (a, _m) = create(&shape);
    let log = Arc::new(Log::default());
    a.observe(log.clone());
    a.fail("disk1.img").unwrap();
    // Meanwhile the report says why and since when.
    let r = a.report();
    let row = r
        .members
        .iter()
        .find(|m| m.state == MemberState::Faulty)
        .unwrap();
    let f = row.failure.as_ref().expect("a failure record");
    assert!(f.reason.contains("marked faulty by the operator"), "{f:?}");
    assert!(f.since_unix > 1_600_000_000, "{f:?}");
    a.remove("disk1.img").unwrap();
    let lines = log.lines();
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[0].starts_with("test failed disk1.img: marked faulty"),
        "{lines:?}"
    );
    assert!(
        lines[1].starts_with("test degraded (") && lines[1].contains("degraded)"),
        "{lines:?}"
    );
    assert_eq!(lines[2], "test removed disk1.img", "{lines:?}");
    // Removed: the failure is forgotten.
    assert!(a.report().members.iter().all(|m| m.failure.is_none()));
}

#[test]
fn a_fail_and_an_immediate_re_add_tell_the_rebuild_from_start_to_end() {
    let shape = Shape::new(Level::Raid5, None, 16, 3).rows(16);
    let (a, m) = create(&shape);
    let a = Arc::new(a);
    let log = Arc::new(Log::default());
    a.observe(log.clone());
    a.manage(SpeedLimits {
        min: 1 << 30,
        max: 1 << 30,
    });
    a.fail("disk2.img").unwrap();
    a.remove("disk2.img").unwrap();
    a.add(
        m[2].clone() as Arc<dyn BlockDevice>,
        "disk2.img".into(),
        false,
    )
    .unwrap();
    let t = Instant::now();
    while !log.lines().iter().any(|l| l.contains("recovery finished")) {
        assert!(t.elapsed() < Duration::from_secs(20), "{:?}", log.lines());
        std::thread::sleep(Duration::from_millis(5));
    }
    let lines = log.lines();
    let pos = |needle: &str| {
        lines
            .iter()
            .position(|l| l.contains(needle))
            .unwrap_or_else(|| panic!("no {needle:?} in {lines:?}"))
    };
    let order = [
        pos("failed disk2.img"),
        pos("degraded ("),
        pos("removed disk2.img"),
        pos("added disk2.img"),
        pos("recovery started"),
        pos("recovery finished"),
    ];
    assert!(order.windows(2).all(|w| w[0] < w[1]), "{lines:?}");
    assert!(!a.report().state.degraded);
    a.close().unwrap();
}
