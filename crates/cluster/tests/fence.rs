//! Fencing generations against real member servers (in this process, over Unix sockets):
//! a newer owner fences older ones at once, the generation survives a server restart, and
//! no write of an old owner lands after the new owner's first.

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use cairn_block::{BlockDevice, WriteFlags};
use cairn_cluster::{
    release, take_over, FenceAnswer, FenceToken, OwnerRecord, Rules, TakeoverError,
};
use cairn_nbd::client::Client;
use cairn_nbd::proto::EPERM;
use common::*;

const ARRAY: [u8; 16] = *b"array-uuid-0001\0";

fn token(node: &str, generation: u64) -> FenceToken {
    FenceToken {
        array: ARRAY,
        generation,
        owner: owner(node, 1),
    }
}

fn connect(m: &Member, t: Option<FenceToken>) -> cairn_nbd::client::Result<Client> {
    let mut o = m.options();
    o.fence = t;
    Client::connect(&o)
}

fn errno(e: &cairn_block::Error) -> String {
    e.to_string()
}

#[test]
fn a_newer_owner_fences_the_older_at_once() {
    let dev = mem(1 << 20);
    let m = Member::start(dev.clone(), true);
    let a = connect(&m, Some(token("a", 1))).unwrap();
    assert_eq!(a.fence(), Some(FenceAnswer::Enforced));
    a.write_at(&[0xaa; 4096], 8192, WriteFlags::NONE).unwrap();
    // Unfenced: reads allowed, writes refused once the export is owned.
    let c = connect(&m, None).unwrap();
    assert_eq!(c.fence(), None);
    let mut buf = vec![0u8; 4096];
    c.read_at(&mut buf, 8192).unwrap();
    assert_eq!(buf, vec![0xaa; 4096]);
    let e = c.write_at(&[1; 4096], 8192, WriteFlags::NONE).unwrap_err();
    assert!(errno(&e).contains("owned by a/"), "{e}");
    // B raises the generation: A is refused at once, reads included.
    let b = connect(&m, Some(token("b", 2))).unwrap();
    let e = a
        .write_at(&[0xab; 4096], 8192, WriteFlags::NONE)
        .unwrap_err();
    assert!(errno(&e).contains("fenced"), "{e}");
    assert!(a.read_at(&mut buf, 8192).is_err());
    assert!(a.flush().is_err());
    b.write_at(&[0xbb; 4096], 8192, WriteFlags::FUA).unwrap();
    // A comes back with its old generation: refused at the handshake.
    let e = connect(&m, Some(token("a", 1))).unwrap_err();
    assert!(e.is_fenced(), "{e}");
    // Same generation, other owner: refused too (two hosts that both counted max + 1).
    let e = connect(&m, Some(token("c", 2))).unwrap_err();
    assert!(e.is_fenced(), "{e}");
    // The same owner again (a reconnect, another multi-conn connection): admitted.
    let b2 = connect(&m, Some(token("b", 2))).unwrap();
    b2.write_at(&[0xbc; 4096], 12288, WriteFlags::NONE).unwrap();
    // The record area belongs to the server.
    let e = b.write_at(&[0; 4096], 0, WriteFlags::NONE).unwrap_err();
    assert!(errno(&e).contains("owner record"), "{e}");
    // And it says B, generation 2, on the member itself.
    let rec = OwnerRecord::read(&*dev).unwrap().unwrap().unwrap();
    assert_eq!(rec.token, token("b", 2));
    let mut data = vec![0u8; 4096];
    dev.read_at(&mut data, 8192).unwrap();
    assert_eq!(data, vec![0xbb; 4096]);
}

#[test]
fn the_generation_survives_a_member_server_restart() {
    let dev = mem(1 << 20);
    let mut m = Member::start(dev.clone(), true);
    drop(connect(&m, Some(token("a", 5))).unwrap());
    m.stop();
    let m = Member::start(dev.clone(), true);
    let e = connect(&m, Some(token("b", 4))).unwrap_err();
    assert!(e.is_fenced(), "{e}");
    let c = connect(&m, None).unwrap();
    assert!(c.write_at(&[1; 4096], 65536, WriteFlags::NONE).is_err());
    let b = connect(&m, Some(token("b", 6))).unwrap();
    b.write_at(&[1; 4096], 65536, WriteFlags::NONE).unwrap();
}

#[test]
fn a_blank_member_without_owner_behaves_as_before() {
    let dev = mem(1 << 20);
    let m = Member::start(dev.clone(), true);
    let c = connect(&m, None).unwrap();
    // Nobody owns it: plain clients read and write anywhere, the first 4 KiB included.
    c.write_at(&[7; 4096], 0, WriteFlags::NONE).unwrap();
    c.write_at(&[7; 4096], 4096, WriteFlags::NONE).unwrap();
    // Now the first 4 KiB hold something that is not a record: the export cannot be
    // fenced, and says so instead of overwriting it.
    let e = connect(&m, Some(token("a", 1))).unwrap_err();
    assert!(
        e.is_fenced() && e.to_string().contains("another format"),
        "{e}"
    );
}

#[test]
fn a_server_that_does_not_enforce_says_so() {
    let dev = mem(1 << 20);
    let m = Member::start(dev.clone(), false);
    let a = connect(&m, Some(token("a", 1))).unwrap();
    assert_eq!(a.fence(), Some(FenceAnswer::NotEnforced));
    a.write_at(&[1; 4096], 8192, WriteFlags::NONE).unwrap();
}

/// An old owner writing as fast as it can while a new owner takes over: once the new
/// owner's admission returned, not one of the old owner's writes succeeds, and the new
/// owner's data is what the member holds.
#[test]
fn no_old_write_lands_after_the_new_owners_first() {
    let dev = mem(4 << 20);
    let m = Member::start(dev.clone(), true);
    let mut o = m.options();
    o.fence = Some(token("a", 1));
    o.connections = 4;
    let a = Arc::new(Client::connect(&o).unwrap());
    let admitted = Arc::new(AtomicBool::new(false));
    let late = Arc::new(AtomicUsize::new(0));
    let ok = Arc::new(AtomicUsize::new(0));
    let mut threads = Vec::new();
    for t in 0..4u8 {
        let (a, admitted, late, ok) = (a.clone(), admitted.clone(), late.clone(), ok.clone());
        threads.push(std::thread::spawn(move || {
            for i in 0..4000u64 {
                let after = admitted.load(Ordering::SeqCst);
                let off = 65536 + ((i * 4 + u64::from(t)) % 64) * 4096;
                match a.write_at(&[0xa0 | t; 4096], off, WriteFlags::NONE) {
                    Ok(()) if after => {
                        late.fetch_add(1, Ordering::SeqCst);
                    }
                    Ok(()) => {
                        ok.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(_) => {}
                }
                if after && i % 50 == 0 {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        }));
    }
    while ok.load(Ordering::SeqCst) < 50 {
        std::thread::sleep(Duration::from_millis(1));
    }
    let b = connect(&m, Some(token("b", 2))).unwrap();
    admitted.store(true, Ordering::SeqCst);
    let zone = vec![0xbb; 64 * 4096];
    b.write_at(&zone, 65536, WriteFlags::NONE).unwrap();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(
        late.load(Ordering::SeqCst),
        0,
        "old owner writes succeeded after the fence"
    );
    let mut data = vec![0u8; zone.len()];
    dev.read_at(&mut data, 65536).unwrap();
    assert!(
        data == zone,
        "an old owner's write landed after the new owner's"
    );
}

#[test]
fn take_over_raises_the_generation_on_every_member() {
    let devs: Vec<_> = (0..3).map(|_| mem(1 << 20)).collect();
    // Two members enforce (cairn serve), one only stores (as nbdkit would).
    let ms: Vec<_> = devs
        .iter()
        .enumerate()
        .map(|(i, d)| Member::start(d.clone(), i != 2))
        .collect();
    let members: Vec<_> = ms
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("m{i}"), m.options()))
        .collect();
    let rules = Rules {
        needed: 2,
        ..Rules::default()
    };
    let a = take_over(ARRAY, &owner("host-a", 1), &members, rules).unwrap();
    assert_eq!(a.token.generation, 1);
    assert_eq!(
        a.members.iter().map(|m| m.enforced).collect::<Vec<_>>(),
        [true, true, false]
    );
    for m in &a.members {
        m.device
            .write_at(&[0xaa; 4096], 8192, WriteFlags::NONE)
            .unwrap();
    }
    // A second host that tries to assemble the same members writable is refused, and A
    // goes on undisturbed.
    let e = take_over(ARRAY, &owner("host-b", 2), &members, rules).unwrap_err();
    assert!(
        matches!(&e, TakeoverError::Owned { generation: 1, owner, .. } if owner.starts_with("host-a/")),
        "{e}"
    );
    for m in &a.members {
        m.device
            .write_at(&[0xac; 4096], 8192, WriteFlags::NONE)
            .unwrap();
    }
    for d in &devs {
        let r = OwnerRecord::read(&**d).unwrap().unwrap().unwrap();
        assert_eq!((r.token.generation, r.released), (1, false));
    }
    // A stops cleanly and releases; now B takes over without being told to.
    assert!(release(&a, &members).is_empty());
    for d in &devs {
        let r = OwnerRecord::read(&**d).unwrap().unwrap().unwrap();
        assert_eq!((r.token.generation, r.released), (1, true));
    }
    let b = take_over(ARRAY, &owner("host-b", 2), &members, rules).unwrap();
    assert_eq!(b.token.generation, 2);
    // Enforcing members refuse A now; the plain one cannot (that is what etcd is for).
    for m in &a.members {
        let r = m.device.write_at(&[0xab; 4096], 8192, WriteFlags::NONE);
        assert_eq!(r.is_err(), m.enforced, "{}", m.name);
    }
    for d in &devs {
        let r = OwnerRecord::read(&**d).unwrap().unwrap().unwrap();
        assert_eq!(r.token, b.token);
    }
    // B does not release; A, told B is gone, takes over: generation 3 fences B.
    assert!(take_over(ARRAY, &owner("host-a", 3), &members, rules).is_err());
    let replace = Rules {
        replace_owner: true,
        ..rules
    };
    let a2 = take_over(ARRAY, &owner("host-a", 3), &members, replace).unwrap();
    assert_eq!(a2.token.generation, 3);
    assert!(b.members[0]
        .device
        .write_at(&[1; 4096], 8192, WriteFlags::NONE)
        .is_err());
}

/// docs/fencing.md: a member whose first 4 KiB hold other data takes part unfenced, and
/// nothing is written over that data, on an enforcing member server (which refuses a
/// token there) and on a plain one alike.
#[test]
fn foreign_members_take_part_unfenced_and_keep_their_bytes() {
    let devs: Vec<_> = (0..3).map(|_| mem(1 << 20)).collect();
    let other: Vec<u8> = (0..=255u8)
        .cycle()
        .map(|b| b.wrapping_mul(7).wrapping_add(3))
        .take(4096)
        .collect();
    for d in &devs[..2] {
        d.write_at(&other, 0, WriteFlags::NONE).unwrap();
    }
    // m0 foreign on an enforcing server, m1 foreign on a plain one, m2 blank, enforcing.
    let ms: Vec<_> = devs
        .iter()
        .enumerate()
        .map(|(i, d)| Member::start(d.clone(), i != 1))
        .collect();
    let members: Vec<_> = ms
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("m{i}"), m.options()))
        .collect();
    let rules = Rules {
        needed: 2,
        ..Rules::default()
    };
    let a = take_over(ARRAY, &owner("host-a", 1), &members, rules).unwrap();
    assert_eq!(
        a.members
            .iter()
            .map(|m| (m.foreign, m.enforced))
            .collect::<Vec<_>>(),
        [(true, false), (true, false), (false, true)]
    );
    for m in &a.members {
        m.device
            .write_at(&[0xaa; 4096], 8192, WriteFlags::NONE)
            .unwrap();
    }
    assert!(release(&a, &members).is_empty());
    // Taken over again (a restart): the same, and the other data is still there.
    let b = take_over(ARRAY, &owner("host-a", 2), &members, rules).unwrap();
    assert_eq!(b.token.generation, 2);
    let mut now = vec![0u8; 4096];
    for d in &devs[..2] {
        d.read_at(&mut now, 0).unwrap();
        assert_eq!(now, other);
    }
    let r = OwnerRecord::read(&*devs[2]).unwrap().unwrap().unwrap();
    assert_eq!(r.token, b.token);
}

/// A member server that answers but refuses (here: no such export; a wrong TLS key is
/// the same) stops the takeover instead of being counted missing.
#[test]
fn a_member_that_refuses_is_an_error_not_a_missing_member() {
    let devs: Vec<_> = (0..3).map(|_| mem(1 << 20)).collect();
    let ms: Vec<_> = devs
        .iter()
        .map(|d| Member::start(d.clone(), true))
        .collect();
    let mut members: Vec<_> = ms
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("m{i}"), m.options()))
        .collect();
    members[1].1.export = "nosuch".into();
    let rules = Rules {
        needed: 2,
        ..Rules::default()
    };
    let e = take_over(ARRAY, &owner("a", 1), &members, rules).unwrap_err();
    assert!(
        matches!(&e, TakeoverError::Refused { member, .. } if member == "m1"),
        "{e}"
    );
    // Nothing was declared or written anywhere.
    for d in &devs {
        assert_eq!(OwnerRecord::read(&**d).unwrap().unwrap(), None);
    }
}

#[test]
fn take_over_needs_a_quorum_of_members() {
    let devs: Vec<_> = (0..3).map(|_| mem(1 << 20)).collect();
    let mut ms: Vec<_> = devs
        .iter()
        .map(|d| Member::start(d.clone(), true))
        .collect();
    let members: Vec<_> = ms
        .iter()
        .enumerate()
        .map(|(i, m)| (format!("m{i}"), m.options()))
        .collect();
    ms[2].stop();
    ms[1].stop();
    // RAID5 over 3 runs on 2: with 2 members missing, they could run elsewhere? No, but
    // one reached member is not enough to be sure no one else runs the array.
    let rules = Rules {
        needed: 2,
        ..Rules::default()
    };
    let e = take_over(ARRAY, &owner("a", 1), &members, rules).unwrap_err();
    assert!(
        matches!(
            e,
            TakeoverError::NoQuorum {
                reached: 1,
                total: 3,
                needed: 2
            }
        ),
        "{e}"
    );
    // An operator who knows better forces it.
    let force = Rules {
        force_quorum: true,
        ..rules
    };
    let o = take_over(ARRAY, &owner("a", 1), &members, force).unwrap();
    assert_eq!((o.members.len(), o.missing.len()), (1, 2));
    let _ = EPERM;
}

/// A member server that is not cairn's: it stores the record like any bytes and cannot
/// refuse an old owner (docs/fencing.md: there, the etcd lease is the protection).
struct External {
    child: std::process::Child,
    sock: std::path::PathBuf,
    _dir: TempDir,
}

impl External {
    fn start(tool: &str) -> Option<External> {
        if !std::path::Path::new(&format!("/usr/bin/{tool}")).exists() {
            eprintln!("\n*** SKIPPED: {tool} is not installed (scripts/install-deps.sh installs it) ***\n");
            return None;
        }
        let dir = TempDir::new(tool);
        let file = dir.path().join("disk.img");
        std::fs::File::create(&file)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let sock = dir.path().join("nbd.sock");
        let mut cmd = std::process::Command::new(tool);
        match tool {
            "nbdkit" => cmd.arg("-f").arg("-U").arg(&sock).arg("file").arg(&file),
            _ => cmd
                .arg("-k")
                .arg(&sock)
                .args(["-f", "raw", "-x", "disk", "-t", "-e", "8"])
                .arg(&file),
        };
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        while !sock.exists() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(sock.exists(), "{tool} did not start");
        Some(External {
            child,
            sock,
            _dir: dir,
        })
    }

    fn options(&self) -> cairn_nbd::client::ClientOptions {
        cairn_nbd::client::ClientOptions::new(cairn_nbd::Listen::Unix(self.sock.clone()), "disk")
    }
}

impl Drop for External {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn nbdkit_and_qemu_nbd_members_carry_the_record_but_cannot_enforce() {
    for tool in ["nbdkit", "qemu-nbd"] {
        let Some(ext) = External::start(tool) else {
            continue;
        };
        let members = vec![(tool.to_string(), ext.options())];
        let rules = Rules {
            needed: 1,
            ..Rules::default()
        };
        let a = take_over(ARRAY, &owner("host-a", 1), &members, rules).unwrap();
        assert!(!a.members[0].enforced, "{tool}");
        let r = OwnerRecord::read(&*a.members[0].device)
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.token, a.token, "{tool}");
        // The record still turns a second host away.
        let e = take_over(ARRAY, &owner("host-b", 2), &members, rules).unwrap_err();
        assert!(matches!(e, TakeoverError::Owned { .. }), "{tool}: {e}");
        // Replaced: the record moves on, but the server lets the old owner write.
        let replace = Rules {
            replace_owner: true,
            ..rules
        };
        let b = take_over(ARRAY, &owner("host-b", 2), &members, replace).unwrap();
        assert_eq!(b.token.generation, 2);
        a.members[0]
            .device
            .write_at(&[0xaa; 4096], 8192, WriteFlags::NONE)
            .unwrap();
        // Clean stop: released on the member itself.
        assert!(release(&b, &members).is_empty());
        let r = OwnerRecord::read(&*b.members[0].device)
            .unwrap()
            .unwrap()
            .unwrap();
        assert!(r.released && r.token == b.token, "{tool}");
    }
}

#[test]
fn a_damaged_record_stops_writers_but_not_readers() {
    let dev = mem(1 << 20);
    let mut rec = OwnerRecord {
        token: token("a", 3),
        since: 1,
        released: false,
    }
    .encode();
    rec[40] ^= 1; // the instance: checksum no longer matches
    dev.write_at(&rec, 0, WriteFlags::NONE).unwrap();
    let m = Member::start(dev.clone(), true);
    let c = connect(&m, None).unwrap();
    let mut buf = vec![0u8; 4096];
    c.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, rec);
    let e = c.write_at(&[1; 4096], 65536, WriteFlags::NONE).unwrap_err();
    assert!(e.to_string().contains("damaged"), "{e}");
    let e = connect(&m, Some(token("b", 9))).unwrap_err();
    assert!(e.is_fenced() && e.to_string().contains("damaged"), "{e}");
    // The record is left as it was, for the operator.
    let mut now = vec![0u8; 4096];
    dev.read_at(&mut now, 0).unwrap();
    assert_eq!(now, rec);
}

/// A LUKS header where an owner record would go: an export its owner uses whole.
fn luks_like(size: u64) -> Arc<cairn_block::MemDisk> {
    let dev = mem(size);
    let mut head = vec![0x5au8; 4096];
    head[..6].copy_from_slice(b"LUKS\xba\xbe");
    dev.write_at(&head, 0, WriteFlags::NONE).unwrap();
    dev
}

#[test]
fn whole_export_owners_keep_their_record_beside_it() {
    use cairn_cluster::{take_over_whole, MemberStore};
    const ID: [u8; 16] = *b"whole-export-id\0";
    let dir = TempDir::new("beside");
    let beside = dir.path().join("disk.cairn-owner");
    let dev = luks_like(1 << 20);
    let store = MemberStore::new([("disk".to_string(), beside.clone())]);
    let mut m = Member::start_with_store(dev.clone(), Some(Arc::new(store.clone())));
    let (a, b, c) = (owner("host-a", 1), owner("host-b", 2), owner("host-c", 3));
    let oa = take_over_whole(ID, &a, "disk", &m.options(), false).unwrap();
    assert!(oa.members[0].enforced && !oa.members[0].foreign);
    assert_eq!(oa.token.generation, 1);
    assert!(beside.exists(), "the record is kept beside the export");
    // The owner writes the export's first bytes (its LUKS header): nothing is reserved.
    let da = oa.members[0].device.clone();
    da.write_at(&[0x11; 4096], 0, WriteFlags::FUA).unwrap();
    // Without a token: reads yes, writes no.
    let plain = connect(&m, None).unwrap();
    let mut buf = [0u8; 4096];
    plain.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0x11; 4096]);
    assert!(plain
        .write_at(&[0x99; 4096], 8192, WriteFlags::NONE)
        .is_err());
    // A second owner is refused while A has not released it.
    match take_over_whole(ID, &b, "disk", &m.options(), false) {
        Err(TakeoverError::Owned {
            owner, generation, ..
        }) => assert!(owner.starts_with("host-a/") && generation == 1),
        other => panic!("expected Owned, got {other:?}"),
    }
    // Told to replace it: generation 2, and A is fenced at once.
    let ob = take_over_whole(ID, &b, "disk", &m.options(), true).unwrap();
    assert_eq!(ob.token.generation, 2);
    let e = da.write_at(&[0x22; 4096], 0, WriteFlags::NONE).unwrap_err();
    assert_eq!(e.kind(), cairn_block::ErrorKind::Fenced, "{e}");
    let db = ob.members[0].device.clone();
    db.write_at(&[0x33; 4096], 0, WriteFlags::FUA).unwrap();
    // The generation survives a restart of the member server (it is in the file).
    drop((da, db, plain));
    drop(oa);
    m.stop();
    let m = Member::start_with_store(dev.clone(), Some(Arc::new(store)));
    assert!(matches!(
        take_over_whole(ID, &c, "disk", &m.options(), false),
        Err(TakeoverError::Owned { generation: 2, .. })
    ));
    // B releases it; C then takes it without being told.
    assert!(release(&ob, &[("disk".to_string(), m.options())]).is_empty());
    let oc = take_over_whole(ID, &c, "disk", &m.options(), false).unwrap();
    assert_eq!(oc.token.generation, 3);
    // The export holds B's bytes, not a record.
    dev.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0x33; 4096]);
}

#[test]
fn whole_exports_on_a_plain_server_run_unfenced_and_untouched() {
    use cairn_cluster::take_over_whole;
    let dev = luks_like(1 << 20);
    let m = Member::start(dev.clone(), false);
    let o = take_over_whole([9; 16], &owner("host-a", 1), "disk", &m.options(), false).unwrap();
    assert!(!o.members[0].enforced && o.members[0].foreign);
    assert!(release(&o, &[("disk".to_string(), m.options())]).is_empty());
    let mut buf = [0u8; 6];
    dev.read_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"LUKS\xba\xbe", "nothing was written over the header");
}
