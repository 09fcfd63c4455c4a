//! One owner per array across hosts, as the stack does it with an etcd (docs/fencing.md):
//! the array's lease first, then its remote members; holding the lease replaces an owner
//! that did not release the members, without --force; losing it fences the array. Two
//! "hosts" in one process, member servers in-process on Unix sockets, a real etcd the
//! test starts (skipped loudly without the binary, a failure with CAIRN_REQUIRE_ETCD=1).

#[path = "../../cluster/tests/common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, ErrorKind, MemDisk, WriteFlags};
use cairn_cluster::{owner_key, Etcd, OwnerRecord};
use cairn_md::{Array, CreateOptions, Level, MemberState};
use cairn_nbd::Listen;
use cairn_stack::Ownership;
use cairn_stack::{Keys, OpenedExport, Options, Spec};
use common::{mem, Member, TestEtcd};

const MEMBER: u64 = 8 << 20;

fn uri(m: &Member) -> PathBuf {
    let Listen::Unix(p) = &m.listen else {
        unreachable!()
    };
    PathBuf::from(format!("nbd+unix:///disk?socket={}", p.display()))
}

fn host(etcd: &str, node: &str) -> Options {
    Options {
        ownership: Ownership {
            node: node.into(),
            etcd: Some((Etcd::new(etcd).unwrap(), Duration::from_secs(2))),
        },
        remote_timeout: Some(Duration::from_secs(5)),
        ..Options::default()
    }
}

fn open(spec: &Spec, o: &Options) -> cairn_stack::Result<OpenedExport> {
    cairn_stack::open_one(spec, Some("lease"), o, &mut Keys::none())
}

fn contains_block(disks: &[Arc<MemDisk>], byte: u8) -> bool {
    disks.iter().any(|d| {
        let mut b = vec![0u8; usize::try_from(MEMBER).unwrap()];
        d.read_at(&mut b, 0).unwrap();
        b.chunks(4096).any(|c| c.iter().all(|&x| x == byte))
    })
}

#[test]
fn the_lease_comes_first_decides_the_takeover_and_its_loss_fences_the_array() {
    let Some(etcd) = TestEtcd::start() else {
        return;
    };
    let disks: Vec<Arc<MemDisk>> = (0..3).map(|_| mem(MEMBER)).collect();
    let devs: Vec<Arc<dyn BlockDevice>> = disks
        .iter()
        .map(|d| d.clone() as Arc<dyn BlockDevice>)
        .collect();
    let names = (0..3).map(|i| format!("m{i}")).collect();
    let made = Array::create(devs, names, &CreateOptions::new(Level::Raid5, "lease")).unwrap();
    let key = owner_key(&made.uuid().to_string());
    made.close().unwrap();
    drop(made);
    let members: Vec<Member> = disks
        .iter()
        .map(|d| Member::start(d.clone(), true))
        .collect();
    let spec = Spec::Md(members.iter().map(uri).collect());
    let e = Etcd::new(&etcd.url).unwrap();

    // Host A: the lease, then the members.
    let a = open(&spec, &host(&etcd.url, "host-a")).unwrap();
    let held = e.get(key.as_bytes()).unwrap().expect("A's lease");
    assert!(held.value.starts_with(b"host-a/"), "{held:?}");
    a.device
        .write_at(&[0xaa; 4096], 0, WriteFlags::FUA)
        .unwrap();
    let rec = OwnerRecord::read(&*disks[0]).unwrap().unwrap().unwrap();
    assert_eq!(rec.token.generation, 1);
    assert!(!rec.released);

    // Host B is turned away by the lease, before it touches a member: A's generation
    // stands and A goes on writing.
    let err = open(&spec, &host(&etcd.url, "host-b")).unwrap_err();
    assert!(err.to_string().contains("served by another host"), "{err}");
    let rec = OwnerRecord::read(&*disks[0]).unwrap().unwrap().unwrap();
    assert_eq!(rec.token.generation, 1, "B disturbed the running owner");
    a.device
        .write_at(&[0xab; 4096], 4096, WriteFlags::FUA)
        .unwrap();

    // A's lease runs out behind its back (as when A is paused or cut off from etcd).
    // A learns it at its next keepalive and fences its array: no member is failed.
    e.revoke(held.lease).unwrap();
    let array_a = a.md().unwrap().clone();
    let t0 = Instant::now();
    while !array_a.report().state.fenced {
        assert!(t0.elapsed() < Duration::from_secs(5), "A never noticed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = array_a.report();
    assert!(
        r.members.iter().all(|m| m.state == MemberState::ActiveSync),
        "{r}"
    );

    // Host B gets the lease and, holding it, replaces A's unreleased generation: no
    // --force needed.
    let b = open(&spec, &host(&etcd.url, "host-b")).unwrap();
    let rec = OwnerRecord::read(&*disks[0]).unwrap().unwrap().unwrap();
    assert_eq!(rec.token.generation, 2);
    assert!(rec.token.owner.to_string().starts_with("host-b/"));
    b.device
        .write_at(&[0xbb; 4096], 0, WriteFlags::FUA)
        .unwrap();

    // A writes nothing more: refused by its own lease check, with the kind that says so.
    let err = a
        .device
        .write_at(&[0xee; 4096], 8192, WriteFlags::FUA)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced, "{err}");
    assert!(
        !contains_block(&disks, 0xee),
        "A's late write reached a member"
    );
    let mut buf = [0u8; 4096];
    b.device.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0xbb; 4096]);
    b.device.read_at(&mut buf, 4096).unwrap();
    assert_eq!(buf, [0xab; 4096], "A's acknowledged write before the loss");

    // A cannot close its array (that would write superblocks); B closes cleanly, which
    // releases the members and then revokes the lease.
    assert_eq!(
        cairn_stack::fence::close_array(&array_a)
            .unwrap_err()
            .kind(),
        ErrorKind::Fenced
    );
    cairn_stack::fence::close_array(b.md().unwrap()).unwrap();
    let rec = OwnerRecord::read(&*disks[0]).unwrap().unwrap().unwrap();
    assert!(rec.released && rec.token.generation == 2, "{rec:?}");
    assert_eq!(e.get(key.as_bytes()).unwrap(), None);
}
