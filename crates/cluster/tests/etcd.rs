//! The ownership lease against a real etcd started by the test (skipped loudly when the
//! etcd binary is missing; scripts/install-deps.sh installs it, and CAIRN_REQUIRE_ETCD=1
//! turns the skip into a failure).

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, ErrorKind, WriteFlags};
use cairn_cluster::etcd::EtcdError;
use cairn_cluster::{
    owner_key, take_over, Etcd, EtcdTls, FencedDevice, Lease, LeaseError, OwnerRecord, Rules,
};
use common::*;

const TTL: Duration = Duration::from_secs(2);
const ARRAY: [u8; 16] = *b"array-uuid-etcd1";

#[test]
fn ownership_is_decided_by_compare_and_swap() {
    let Some(etcd) = TestEtcd::start() else {
        return;
    };
    let e = Etcd::new(&etcd.url).unwrap();
    let key = owner_key("0001");
    let a = Lease::acquire(&e, &key, b"host-a", TTL).unwrap();
    assert!(a.is_valid());
    match Lease::acquire(&e, &key, b"host-b", TTL) {
        Err(LeaseError::Held(kv)) => {
            assert_eq!(kv.value, b"host-a");
            assert_eq!(kv.lease, a.id());
        }
        other => panic!("second owner got {other:?}"),
    }
    // A lease refreshed at TTL/3 outlives its TTL.
    std::thread::sleep(TTL + Duration::from_millis(1500));
    assert!(a.is_valid());
    assert!(matches!(
        Lease::acquire(&e, &key, b"host-b", TTL),
        Err(LeaseError::Held(_))
    ));
    // Giving it up revokes the lease: the next owner gets it at once.
    drop(a);
    let b = Lease::acquire(&e, &key, b"host-b", TTL).unwrap();
    assert_eq!(e.get(key.as_bytes()).unwrap().unwrap().value, b"host-b");
    drop(b);
    assert_eq!(e.get(key.as_bytes()).unwrap(), None);
}

#[test]
fn a_lease_that_stops_refreshing_freezes_io_and_passes_on() {
    let Some(etcd) = TestEtcd::start() else {
        return;
    };
    let e = Etcd::new(&etcd.url).unwrap();
    let key = owner_key("0002");
    let mut a = Lease::acquire(&e, &key, b"host-a", TTL).unwrap();
    let dev = FencedDevice::new(mem(1 << 20), a.guard());
    dev.write_at(&[1; 4096], 0, WriteFlags::NONE).unwrap();
    let until = a.valid_until().unwrap();
    assert!(until <= Instant::now() + TTL);
    let guard = a.guard();
    assert_eq!(guard.wait_lost(Duration::from_millis(100)), None);
    a.stop_keepalive();
    // A watcher wakes at the deadline itself.
    let why = guard.wait_lost(TTL * 3).expect("the deadline passed");
    assert!(Instant::now() >= until);
    assert!(why.contains("deadline"), "{why}");
    assert!(!a.is_valid());
    let err = dev.write_at(&[2; 4096], 0, WriteFlags::NONE).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Fenced);
    assert!(err.to_string().contains("I/O is frozen"), "{err}");
    assert!(dev.flush().is_err());
    // etcd expires the key; only then can B take it.
    let t0 = Instant::now();
    let b = loop {
        match Lease::acquire(&e, &key, b"host-b", TTL) {
            Ok(b) => break b,
            Err(LeaseError::Held(_)) if t0.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(other) => panic!("{other}"),
        }
    };
    // Not before A's own deadline had passed.
    assert!(Instant::now() >= until);
    assert!(b.is_valid());
}

#[test]
fn writes_conditioned_on_a_lease_stop_when_it_is_gone() {
    let Some(etcd) = TestEtcd::start() else {
        return;
    };
    let e = Etcd::new(&etcd.url).unwrap();
    let key = owner_key("0003");
    let held = key.as_bytes();
    let a = Lease::acquire(&e, &key, b"host-a", TTL).unwrap();
    assert!(e.put_if_lease(b"/mark", b"1", held, a.id()).unwrap());
    assert_eq!(e.get(b"/mark").unwrap().unwrap().value, b"1");
    assert!(
        !e.put_if_lease(b"/mark", b"2", held, a.id() + 1).unwrap(),
        "another lease id"
    );
    assert!(
        !e.put_if_lease(b"/mark", b"2", b"/nothing", a.id()).unwrap(),
        "a key that does not exist"
    );
    let id = a.id();
    // Revoked: the key goes, and with it every write conditioned on it.
    drop(a);
    assert!(!e.put_if_lease(b"/mark", b"3", held, id).unwrap());
    assert!(!e.delete_if_lease(b"/mark", held, id).unwrap());
    assert_eq!(e.get(b"/mark").unwrap().unwrap().value, b"1");
    // Another holder now: the old holder's id still proves nothing.
    let b = Lease::acquire(&e, &key, b"host-b", TTL).unwrap();
    assert!(!e.put_if_lease(b"/mark", b"4", held, id).unwrap());
    assert!(e.delete_if_lease(b"/mark", held, b.id()).unwrap());
    assert_eq!(e.get(b"/mark").unwrap(), None);
    // What etcd says overrides the deadline: a guard marked lost fails at once, for good.
    let g = b.guard();
    assert!(g.check("x").is_ok());
    g.mark_lost();
    assert!(g.check("x").is_err());
    assert!(!b.is_valid());
}

#[test]
fn etcd_down_is_a_clear_error() {
    let e = Etcd::new("http://127.0.0.1:1").unwrap();
    let err = Lease::acquire(&e, "/k", b"v", TTL).unwrap_err();
    assert!(err.to_string().contains("connect"), "{err}");
}

/// etcd with TLS and client certificates (`--client-cert-auth`), and a second client
/// address, 127.0.0.2, that its certificate does not name.
fn tls_etcd() -> Option<(TestCerts, TestEtcd)> {
    let certs = TestCerts::make()?;
    let etcd = TestEtcd::start_with(Some(&certs), &["127.0.0.2"])?;
    Some((certs, etcd))
}

#[test]
fn leases_work_over_tls_with_a_client_certificate() {
    let Some((certs, etcd)) = tls_etcd() else {
        return;
    };
    assert!(etcd.url.starts_with("https://127.0.0.1:"));
    let e = Etcd::with_tls(&etcd.url, &certs.client()).unwrap();
    let key = owner_key("tls1");
    // Grant and create-if-absent (txn), then keepalives past the TTL.
    let a = Lease::acquire(&e, &key, b"host-a", TTL).unwrap();
    std::thread::sleep(TTL + Duration::from_millis(1500));
    assert!(a.is_valid(), "the keepalives did not get through");
    assert!(e.keepalive(a.id()).unwrap() > 0);
    assert!(matches!(
        Lease::acquire(&e, &key, b"host-b", TTL),
        Err(LeaseError::Held(_))
    ));
    assert!(e
        .put_if_lease(b"/tls-mark", b"1", key.as_bytes(), a.id())
        .unwrap());
    // Range.
    assert_eq!(e.get(key.as_bytes()).unwrap().unwrap().value, b"host-a");
    assert_eq!(e.get(b"/tls-mark").unwrap().unwrap().value, b"1");
    // The host name is checked as well as the address: the certificate names localhost.
    let port = etcd.url.rsplit_once(':').unwrap().1;
    let by_name = Etcd::with_tls(&format!("https://localhost:{port}"), &certs.client()).unwrap();
    assert_eq!(by_name.get(b"/tls-mark").unwrap().unwrap().value, b"1");
    drop(a);
    assert_eq!(e.get(key.as_bytes()).unwrap(), None);
}

#[test]
fn tls_mistakes_are_clear_errors() {
    let Some((certs, etcd)) = tls_etcd() else {
        return;
    };
    let port = etcd.url.rsplit_once(':').unwrap().1;
    let expect_tls = |e: &Etcd, want: &[&str]| {
        let err = e.grant(5).unwrap_err();
        let m = err.to_string();
        eprintln!("{m}");
        assert!(matches!(err, EtcdError::Tls(_)), "{err:?}");
        assert!(m.contains(&etcd.url), "the member is not named: {m}");
        for w in want {
            assert!(m.contains(w), "{w:?} not in: {m}");
        }
    };
    // No client certificate: etcd refuses the connection.
    let no_cert = EtcdTls {
        cacert: Some(certs.file("ca.pem")),
        ..EtcdTls::default()
    };
    expect_tls(
        &Etcd::with_tls(&etcd.url, &no_cert).unwrap(),
        &["refused this client's certificate", "--etcd-cert"],
    );
    // A CA that did not sign the member's certificate.
    let wrong_ca = EtcdTls {
        cacert: Some(certs.file("other-ca.pem")),
        ..certs.client()
    };
    expect_tls(
        &Etcd::with_tls(&etcd.url, &wrong_ca).unwrap(),
        &["does not verify", "other-ca.pem"],
    );
    // No CA at all: the system's roots do not know the test CA.
    let system = EtcdTls {
        cacert: None,
        ..certs.client()
    };
    expect_tls(
        &Etcd::with_tls(&etcd.url, &system).unwrap(),
        &["does not verify", "--etcd-cacert"],
    );
    // A key that is not the certificate's: both named, the key's contents never shown.
    let wrong_key = EtcdTls {
        key: Some(certs.file("server-key.pem")),
        ..certs.client()
    };
    let err = Etcd::with_tls(&etcd.url, &wrong_key).unwrap_err();
    let m = err.to_string();
    assert!(matches!(err, EtcdError::Tls(_)), "{err:?}");
    assert!(m.contains("server-key.pem is not the key of"), "{m}");
    assert!(m.contains("client.pem"), "{m}");
    let pem = std::fs::read_to_string(certs.file("server-key.pem")).unwrap();
    let body = pem.lines().nth(1).unwrap();
    assert!(!m.contains("PRIVATE") && !m.contains(body), "{m}");
    assert!(!format!("{:?}", Etcd::with_tls(&etcd.url, &certs.client()).unwrap()).contains(body));
    // Plain HTTP to the TLS port: etcd 3.4 closes it unanswered (newer Go servers answer
    // 400, which becomes an EtcdError::Url; the unit tests cover that).
    let err = Etcd::new(&format!("http://127.0.0.1:{port}"))
        .unwrap()
        .grant(5)
        .unwrap_err();
    assert!(
        matches!(err, EtcdError::Io(_) | EtcdError::Url(_)),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains(&format!("https://127.0.0.1:{port}")),
        "{err}"
    );
    // An address the certificate does not name.
    let other = format!("https://127.0.0.2:{port}");
    let err = Etcd::with_tls(&other, &certs.client())
        .unwrap()
        .grant(5)
        .unwrap_err();
    assert!(matches!(err, EtcdError::Tls(_)), "{err:?}");
    assert!(err.to_string().contains(&other), "{err}");
    assert!(err.to_string().contains("mismatch"), "{err}");
}

/// Each request is a connection of its own; from the second on, the member's TLS session
/// is resumed (no certificate exchange), with the same checks: a name the certificate
/// does not have still fails, and a client cut off by a failure starts over with a full
/// handshake.
#[test]
fn tls_sessions_are_resumed() {
    let Some((certs, etcd)) = tls_etcd() else {
        return;
    };
    let e = Etcd::with_tls(&etcd.url, &certs.client()).unwrap();
    let (id, _) = e.grant(5).unwrap();
    assert_eq!(
        e.tls_sessions_resumed(),
        0,
        "the first handshake is a full one"
    );
    assert!(e.keepalive(id).unwrap() > 0);
    assert_eq!(e.tls_sessions_resumed(), 1, "the second request's session");
    // Clones share the sessions (a lease's keepalive client is one).
    let c = e.clone();
    assert_eq!(c.get(b"/tls-none").unwrap(), None);
    assert_eq!(e.tls_sessions_resumed(), 2);
    // An address the certificate does not name is refused as before.
    let port = etcd.url.rsplit_once(':').unwrap().1;
    let both = Etcd::with_tls(
        &format!("https://127.0.0.2:{port},{}", etcd.url),
        &certs.client(),
    )
    .unwrap();
    both.get(b"/tls-none").unwrap();
    both.get(b"/tls-none").unwrap();
    assert_eq!(both.tls_sessions_resumed(), 1);
    let only_other = Etcd::with_tls(&format!("https://127.0.0.2:{port}"), &certs.client())
        .unwrap()
        .grant(5)
        .unwrap_err();
    assert!(only_other.to_string().contains("mismatch"), "{only_other}");
    // A request that fails (a lease etcd does not know) drops the session: the next
    // handshake is a full one.
    let err = e.create_if_absent(b"/tls-x", b"v", id + 12345).unwrap_err();
    assert!(matches!(err, EtcdError::Server(_)), "{err:?}");
    let before = e.tls_sessions_resumed();
    e.revoke(id).unwrap();
    assert_eq!(e.tls_sessions_resumed(), before, "resumed after a failure");
    e.get(b"/tls-none").unwrap();
    assert_eq!(e.tls_sessions_resumed(), before + 1);
}

/// A member whose certificate does not verify is passed over: nothing was sent to it, so
/// the request goes to the next member.
#[test]
fn a_member_that_does_not_verify_is_passed_over() {
    let Some((certs, etcd)) = tls_etcd() else {
        return;
    };
    let port = etcd.url.rsplit_once(':').unwrap().1;
    let unverified = format!("https://127.0.0.2:{port}");
    let e = Etcd::with_tls(&format!("{unverified},{}", etcd.url), &certs.client()).unwrap();
    assert_eq!(e.current_url(), unverified);
    let (id, _) = e.grant(5).unwrap();
    assert_eq!(e.current_url(), etcd.url);
    assert!(e.keepalive(id).unwrap() > 0);
    e.revoke(id).unwrap();
}

/// etcd's user name and password authentication: a token fetched before the first
/// request, fetched again once etcd lets it lapse (`--auth-token-ttl 1`).
#[test]
fn leases_work_with_a_user_name_and_password() {
    let Some(etcd) = TestEtcd::start_args(None, &[], &["--auth-token-ttl", "1"]) else {
        return;
    };
    etcd.enable_auth("cairn", "pw-4e1d");
    let password = |p: &str| zeroize::Zeroizing::new(p.to_string());
    // No credentials: etcd refuses the transaction.
    let anonymous = Etcd::new(&etcd.url).unwrap();
    let err = Lease::acquire(&anonymous, &owner_key("auth0"), b"host-a", TTL).unwrap_err();
    assert!(err.to_string().contains("user name is empty"), "{err}");
    // A wrong password: one clear error, the password not in it.
    let wrong = Etcd::new(&etcd.url)
        .unwrap()
        .with_auth("cairn", password("not-it-77"));
    let err = wrong.get(b"/x").unwrap_err();
    eprintln!("{err}");
    assert!(matches!(err, EtcdError::Auth(_)), "{err:?}");
    assert!(err.to_string().contains("\"cairn\""), "{err}");
    assert!(!err.to_string().contains("not-it-77"), "{err}");
    let e = Etcd::new(&etcd.url)
        .unwrap()
        .with_auth("cairn", password("pw-4e1d"));
    assert!(!format!("{e:?}").contains("pw-4e1d"));
    assert_eq!(e.get(b"/x").unwrap(), None);
    // Idle past the token's TTL: the next request finds it lapsed, authenticates again
    // and goes through.
    std::thread::sleep(Duration::from_millis(2500));
    let key = owner_key("auth1");
    let a = Lease::acquire(&e, &key, b"host-a", TTL).unwrap();
    assert_eq!(e.get(key.as_bytes()).unwrap().unwrap().value, b"host-a");
    std::thread::sleep(TTL + Duration::from_millis(500));
    assert!(a.is_valid(), "the keepalives did not get through");
    assert!(e
        .put_if_lease(b"/auth-mark", b"1", key.as_bytes(), a.id())
        .unwrap());
    assert_eq!(e.get(b"/auth-mark").unwrap().unwrap().value, b"1");
    drop(a);
    assert_eq!(e.get(key.as_bytes()).unwrap(), None);
}

/// The case: an old owner paused past its lease (SIGSTOP) and resumed cannot write
/// a single block, checked on the member's data. The old owner is a child process (this
/// test binary again, running `child_owner`); the member server runs here.
#[test]
fn an_owner_paused_past_its_lease_cannot_write_a_block() {
    let Some(etcd) = TestEtcd::start() else {
        return;
    };
    let dev = mem(4 << 20);
    let member = Member::start(dev.clone(), true);
    let cairn_nbd::Listen::Unix(sock) = &member.listen else {
        unreachable!()
    };
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_owner", "--nocapture", "--test-threads=1"])
        .env("CAIRN_CHILD_ETCD", &etcd.url)
        .env("CAIRN_CHILD_SOCK", sock)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let pid = child.id().to_string();
    let signal = |sig: &str| {
        assert!(Command::new("kill")
            .args([sig, &pid])
            .status()
            .unwrap()
            .success());
    };
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    // Wait until the old owner is writing.
    let mut written = 0;
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(n) = line.strip_prefix("wrote ") {
            written = n.parse::<u64>().unwrap();
            if written >= 20 {
                break;
            }
        }
        assert!(!line.starts_with("child failed"), "{line}");
    }
    assert!(written >= 20, "the old owner never wrote");
    let drain = std::thread::spawn(move || {
        let mut refused_after_resume = 0;
        for line in lines.map_while(Result::ok) {
            if line.starts_with("refused") {
                refused_after_resume += 1;
            }
            if line.starts_with("LATE WRITE") {
                panic!("{line}");
            }
        }
        refused_after_resume
    });
    signal("-STOP");
    // The new owner: the lease first (only once etcd expired the old one), then the
    // generation on the member.
    let e = Etcd::new(&etcd.url).unwrap();
    let key = owner_key("sigstop");
    let t0 = Instant::now();
    let lease = loop {
        match Lease::acquire(&e, &key, b"host-b", TTL) {
            Ok(l) => break l,
            Err(LeaseError::Held(_)) if t0.elapsed() < Duration::from_secs(15) => {
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(other) => panic!("{other}"),
        }
    };
    let members = vec![("m0".to_string(), member.options())];
    // B holds the lease, so A is gone as far as B may know: it replaces A's generation.
    let rules = Rules {
        needed: 1,
        replace_owner: true,
        ..Rules::default()
    };
    let b = take_over(ARRAY, &owner("host-b", 2), &members, rules).unwrap();
    assert_eq!(b.token.generation, 2);
    let bdev = FencedDevice::new(b.members[0].device.clone(), lease.guard());
    bdev.write_at(&[0xbb; 4096], 1 << 20, WriteFlags::FUA)
        .unwrap();
    let mut before = vec![0u8; 2 << 20];
    dev.read_at(&mut before, 0).unwrap();
    // Resume the old owner and let it try for a while.
    signal("-CONT");
    std::thread::sleep(Duration::from_millis(1500));
    let _ = child.kill();
    let _ = child.wait();
    let refused = drain.join().expect("no late write");
    let mut after = vec![0u8; 2 << 20];
    dev.read_at(&mut after, 0).unwrap();
    assert!(
        before == after,
        "the old owner changed the member after it was fenced"
    );
    assert!(refused > 0, "the old owner never tried after resuming");
    let rec = OwnerRecord::read(&*dev).unwrap().unwrap().unwrap();
    assert_eq!(rec.token, b.token);
}

/// The old owner of the test above (does nothing unless started by it).
#[test]
fn child_owner() {
    let (Some(url), Some(sock)) = (
        std::env::var_os("CAIRN_CHILD_ETCD"),
        std::env::var_os("CAIRN_CHILD_SOCK"),
    ) else {
        return;
    };
    let fail = |m: String| -> ! {
        println!("child failed: {m}");
        std::process::exit(1)
    };
    let e = Etcd::new(url.to_str().unwrap()).unwrap();
    let lease = Lease::acquire(&e, &owner_key("sigstop"), b"host-a", TTL)
        .unwrap_or_else(|e| fail(e.to_string()));
    let mut opts =
        cairn_nbd::client::ClientOptions::new(cairn_nbd::Listen::Unix(sock.into()), "disk");
    opts.timeout = Some(Duration::from_secs(10));
    let a = take_over(
        ARRAY,
        &owner("host-a", 1),
        &[("m0".into(), opts)],
        Rules {
            needed: 1,
            replace_owner: true,
            ..Rules::default()
        },
    )
    .unwrap_or_else(|e| fail(e.to_string()));
    let raw: Arc<dyn BlockDevice> = a.members[0].device.clone();
    let dev = FencedDevice::new(raw.clone(), lease.guard());
    let t0 = Instant::now();
    let mut i = 0u64;
    let mut frozen = false;
    while t0.elapsed() < Duration::from_secs(30) {
        let off = 65536 + (i % 256) * 4096;
        let block = [0xa0 | u8::try_from(i % 16).unwrap(); 4096];
        // Through the lease check, as the stack would; once that refuses, straight to
        // the member server too, to show it refuses as well.
        match dev.write_at(&block, off, WriteFlags::NONE) {
            Ok(()) if frozen => println!("LATE WRITE {i} through the lease check"),
            Ok(()) => println!("wrote {i}"),
            Err(_) => {
                frozen = true;
                match raw.write_at(&block, off, WriteFlags::NONE) {
                    Ok(()) => println!("LATE WRITE {i} straight to the member"),
                    Err(e) => println!("refused {i}: {e}"),
                }
            }
        }
        i += 1;
        std::thread::sleep(Duration::from_millis(10));
    }
}
