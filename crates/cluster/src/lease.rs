//! Ownership of an array as an etcd lease, and the device wrapper that stops I/O the
//! moment the lease may have run out.
//!
//! ```text
//!   Lease::acquire: grant(TTL) ─> txn: create /cairn/arrays/<uuid>/owner if absent
//!       ├─ succeeded: ours; a thread refreshes the lease every TTL/3
//!       └─ failed: held by someone else (their value is returned; our lease is revoked)
//!   deadline = (when the last successful grant/keepalive was *sent*) + TTL - margin
//!   FencedDevice: every read, write and flush checks the deadline first
//!   LeaseGuard::wait_lost: wakes at the deadline, or when etcd says the lease is gone
//! ```
//!
//! The deadline counts from before the request left, so however long etcd or the network
//! took, etcd's own countdown started later than ours. After a pause (SIGSTOP, a VM
//! freeze, a long GC-like stall) the first thing the process does is compare the clock
//! with the deadline, before any write: a resumed old owner sends nothing. Its members,
//! where a cairn server serves them, would refuse it anyway (the new owner raised the
//! generation): a lease alone is not a lock, the generation is what the data path checks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, Error, ErrorKind, Result};

use crate::etcd::{Created, Etcd, EtcdError, KeyValue};

/// The etcd key that says who owns array `uuid` (its text form).
pub fn owner_key(uuid: &str) -> String {
    format!("/cairn/arrays/{uuid}/owner")
}

/// Why a lease was not acquired.
#[derive(Debug)]
pub enum LeaseError {
    /// Another owner holds the key (its value, e.g. its owner id).
    Held(KeyValue),
    Etcd(EtcdError),
}

impl std::fmt::Display for LeaseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LeaseError::Held(kv) => write!(
                f,
                "the array is owned by {} (etcd lease {:x})",
                String::from_utf8_lossy(&kv.value),
                kv.lease
            ),
            LeaseError::Etcd(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for LeaseError {}

impl From<EtcdError> for LeaseError {
    fn from(e: EtcdError) -> LeaseError {
        LeaseError::Etcd(e)
    }
}

#[derive(Debug)]
struct State {
    /// After this instant the lease may have expired in etcd.
    deadline: Instant,
    /// etcd said the lease is gone, or the holder gave it up.
    lost: bool,
}

#[derive(Debug)]
struct Inner {
    etcd: Etcd,
    key: String,
    id: i64,
    ttl: Duration,
    state: Mutex<State>,
    stop: AtomicBool,
    wake: Condvar,
}

/// The margin kept below the TTL for clock-rate differences between hosts.
fn margin(ttl: Duration) -> Duration {
    (ttl / 10).max(Duration::from_millis(100)).min(ttl / 2)
}

impl Inner {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn valid_until(&self) -> Option<Instant> {
        let s = self.state();
        (!s.lost).then_some(s.deadline)
    }

    fn is_valid(&self) -> bool {
        self.valid_until().is_some_and(|d| Instant::now() < d)
    }

    fn keepalive_loop(self: Arc<Inner>) {
        let period = self.ttl / 3;
        loop {
            {
                let s = self.state();
                let (s, _) = self
                    .wake
                    .wait_timeout_while(s, period, |_| !self.stop.load(Ordering::Acquire))
                    .unwrap_or_else(|p| p.into_inner());
                if self.stop.load(Ordering::Acquire) || s.lost {
                    return;
                }
            }
            let sent = Instant::now();
            match self.etcd.keepalive(self.id) {
                Ok(0) => {
                    tracing::error!(
                        "etcd lease {:x} for {} expired: I/O is frozen",
                        self.id,
                        self.key
                    );
                    self.state().lost = true;
                    self.wake.notify_all();
                    return;
                }
                Ok(ttl) => {
                    let ttl = Duration::from_secs(ttl);
                    let mut s = self.state();
                    s.deadline = s.deadline.max(sent + ttl - margin(ttl));
                }
                Err(e) => {
                    // Keep trying until the deadline; I/O stops by itself when it passes.
                    tracing::warn!("etcd lease {:x} keepalive: {e}", self.id);
                }
            }
        }
    }
}

/// Ownership held in etcd. Dropping it revokes the lease (the key goes with it).
#[derive(Debug)]
pub struct Lease {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

impl Lease {
    /// Takes `key` with `value` under a new lease of `ttl` (whole seconds, at least 1),
    /// only through a successful create-if-absent transaction.
    pub fn acquire(
        etcd: &Etcd,
        key: &str,
        value: &[u8],
        ttl: Duration,
    ) -> std::result::Result<Lease, LeaseError> {
        Lease::acquire_with(etcd, key, value, ttl, &[])
    }

    /// [`Lease::acquire`], with the same transaction also requiring the keys of
    /// `also_absent` not to exist.
    pub fn acquire_with(
        etcd: &Etcd,
        key: &str,
        value: &[u8],
        ttl: Duration,
        also_absent: &[&[u8]],
    ) -> std::result::Result<Lease, LeaseError> {
        let secs = ttl.as_secs().max(1);
        // Keepalives wait at most a third of the TTL for an answer.
        let etcd = etcd.clone().with_timeout(Duration::from_secs(secs) / 3);
        let sent = Instant::now();
        let (id, granted) = etcd.grant(secs)?;
        let created = match etcd.create_if_absent_with(key.as_bytes(), value, id, also_absent) {
            Ok(c) => c,
            Err(e) => {
                let _ = etcd.revoke(id);
                return Err(e.into());
            }
        };
        if let Created::Exists(kv) = created {
            let _ = etcd.revoke(id);
            return Err(LeaseError::Held(kv));
        }
        let ttl = Duration::from_secs(granted);
        let inner = Arc::new(Inner {
            etcd,
            key: key.to_string(),
            id,
            ttl,
            state: Mutex::new(State {
                deadline: sent + ttl - margin(ttl),
                lost: false,
            }),
            stop: AtomicBool::new(false),
            wake: Condvar::new(),
        });
        let i = inner.clone();
        let thread = std::thread::Builder::new()
            .name("etcd-lease".into())
            .spawn(move || i.keepalive_loop())
            .map_err(|e| LeaseError::Etcd(EtcdError::Io(format!("keepalive thread: {e}"))))?;
        tracing::info!("took {key} with etcd lease {id:x} (TTL {granted} s)");
        Ok(Lease {
            inner,
            thread: Some(thread),
        })
    }

    pub fn id(&self) -> i64 {
        self.inner.id
    }

    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// Until when I/O may go on; `None` once the lease is known lost.
    pub fn valid_until(&self) -> Option<Instant> {
        self.inner.valid_until()
    }

    pub fn is_valid(&self) -> bool {
        self.inner.is_valid()
    }

    /// A check the data path calls before each I/O.
    pub fn guard(&self) -> LeaseGuard {
        LeaseGuard(self.inner.clone())
    }

    /// Stops refreshing without revoking, as a paused or partitioned owner would: the
    /// lease runs out in etcd. For tests of expiry.
    #[doc(hidden)]
    pub fn stop_keepalive(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop_keepalive();
        let lost = std::mem::replace(&mut self.inner.state().lost, true);
        self.inner.wake.notify_all();
        if !lost {
            if let Err(e) = self.inner.etcd.revoke(self.inner.id) {
                tracing::warn!("revoking etcd lease {:x}: {e}", self.inner.id);
            }
        }
    }
}

/// A cheap, cloneable view of a lease's validity.
#[derive(Debug, Clone)]
pub struct LeaseGuard(Arc<Inner>);

impl LeaseGuard {
    /// The etcd lease id, for transactions conditioned on it ([`Etcd::put_if_lease`]).
    pub fn id(&self) -> i64 {
        self.0.id
    }

    /// The key the lease holds.
    pub fn key(&self) -> &str {
        &self.0.key
    }

    /// etcd said the lease is gone (a transaction conditioned on it failed): from now on
    /// [`LeaseGuard::check`] fails, for good, whatever the deadline says.
    pub fn mark_lost(&self) {
        if !std::mem::replace(&mut self.0.state().lost, true) {
            tracing::error!(
                "etcd lease {:x} for {} is gone in etcd: I/O is frozen",
                self.0.id,
                self.0.key
            );
        }
        self.0.wake.notify_all();
    }

    /// Ok while the lease is certainly still ours; [`ErrorKind::Fenced`] once it may not
    /// be (another host may own what it guards).
    pub fn check(&self, what: &str) -> Result<()> {
        if self.0.is_valid() {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Fenced,
            format!(
                "{what}: ownership lease {} ({:x}) lost or expired; I/O is frozen",
                self.0.key, self.0.id
            ),
        ))
    }

    pub fn is_valid(&self) -> bool {
        self.0.is_valid()
    }

    /// Waits up to `timeout` for the lease to stop being certainly ours: etcd said it is
    /// gone, it was given up, or its deadline passed (a keepalive may still renew it
    /// after that; what the holder does about the gap is its own decision). Returns
    /// why, or `None` while it is valid. Wakes at the deadline itself, so a pause or a
    /// silent etcd is seen at once, not at the next keepalive.
    pub fn wait_lost(&self, timeout: Duration) -> Option<String> {
        let end = Instant::now() + timeout;
        let mut s = self.0.state();
        loop {
            let now = Instant::now();
            let why = if s.lost {
                Some("etcd expired it, or it was given up")
            } else if now >= s.deadline {
                Some("no keepalive was answered before its deadline, so etcd may have expired it")
            } else {
                None
            };
            if let Some(why) = why {
                return Some(format!(
                    "etcd lease {:x} for {}: {why}",
                    self.0.id, self.0.key
                ));
            }
            if now >= end {
                return None;
            }
            let wait = s.deadline.min(end) - now;
            s = self
                .0
                .wake
                .wait_timeout(s, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

impl LeaseGuard {
    /// A guard of no lease in etcd, valid until `until`; [`LeaseGuard::set_deadline`]
    /// moves it. For tests of what a holder does when its lease runs out, and when it
    /// comes back (a late keepalive that got through before etcd's TTL ran out).
    #[doc(hidden)]
    pub fn for_tests(until: Instant) -> LeaseGuard {
        LeaseGuard(Arc::new(Inner {
            etcd: Etcd::new("http://127.0.0.1:9").expect("a literal URL"),
            key: "/cairn/tests/lease".into(),
            id: 0,
            ttl: Duration::from_secs(1),
            state: Mutex::new(State {
                deadline: until,
                lost: false,
            }),
            stop: AtomicBool::new(true),
            wake: Condvar::new(),
        }))
    }

    /// See [`LeaseGuard::for_tests`].
    #[doc(hidden)]
    pub fn set_deadline(&self, until: Instant) {
        self.0.state().deadline = until;
    }
}

/// A device whose every I/O first checks that the ownership lease is still valid. Put it
/// under the array, on each member, so no member I/O leaves once the deadline passed.
#[derive(Debug)]
pub struct FencedDevice {
    inner: Arc<dyn BlockDevice>,
    lease: LeaseGuard,
}

impl FencedDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, lease: LeaseGuard) -> FencedDevice {
        FencedDevice { inner, lease }
    }
}

impl cairn_block::Filter for FencedDevice {
    type Inner = dyn BlockDevice;
    fn inner(&self) -> impl std::ops::Deref<Target = dyn BlockDevice> + '_ {
        &*self.inner
    }
    fn admit(&self, op: cairn_block::IoOp) -> Result<()> {
        self.lease.check(op.name())
    }
}

cairn_block::filter_device!(FencedDevice);

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_block::testkit::conformance::{check_pass_through, Method, Recorder};
    use cairn_block::WriteFlags;

    #[test]
    fn a_fenced_device_passes_everything_through_while_its_lease_holds() {
        let lease = LeaseGuard::for_tests(Instant::now() + Duration::from_secs(600));
        check_pass_through(&|d| Arc::new(FencedDevice::new(d, lease.clone())), &[]);
    }

    #[test]
    fn a_fenced_device_stops_both_forms_once_its_lease_is_gone() {
        let lease = LeaseGuard::for_tests(Instant::now() - Duration::from_secs(1));
        let below = Arc::new(Recorder::new(1 << 20));
        let dev = FencedDevice::new(below.clone(), lease);
        let buf = vec![0u8; 4096];
        assert!(dev.write_at(&buf, 0, WriteFlags::NONE).is_err());
        let (tx, rx) = std::sync::mpsc::channel();
        dev.write_then(
            &buf,
            0,
            WriteFlags::NONE,
            Box::new(move |r| tx.send(r).unwrap()),
        );
        assert!(rx.recv().unwrap().is_err());
        assert!(
            below.take().is_empty(),
            "{:?} went below",
            Method::WriteThen
        );
    }
}
