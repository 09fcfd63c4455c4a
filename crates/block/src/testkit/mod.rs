//! Test doubles and the conformance suite, shared by every layer's tests.
//!
//! ```text
//!   layer under test (volume, crypt, array, ...)
//!     FaultyDisk      -- fails chosen ops at run time (after N, on ranges, torn writes)
//!       LogWritesDisk -- records completed writes/flushes; rebuilds any crash state
//!         MemDisk     -- the storage
//!   DelayDisk         -- waits before every op (latency benchmarks)
//!   Gate              -- holds answers of ops that complete later until N are out
//! ```
//!
//! - [`faulty::FaultyDisk`] makes failure cheap to provoke: wrap a member, keep its
//!   [`faulty::FaultHandle`], and fail or heal it while the stack runs.
//! - [`logwrites::LogWritesDisk`] records the order in which writes completed and flushes
//!   happened, and builds the images a crash may leave ([`logwrites::WriteLog`]), plus a
//!   checker that a recovered image is one of them.
//! - [`conformance::run_all`] puts any [`BlockDevice`](crate::BlockDevice) through the
//!   contract every layer must keep, including a random sequence checked against a model.
//!
//! Everything random takes a seed; [`test_seed`] prints it and honours `CAIRN_SEED` so a
//! failure can be replayed.
//!
//! This module is compiled in normal builds (not `cfg(test)`) so that other crates' tests
//! can use it; nothing in it is meant for production paths.

pub mod conformance;
pub mod delay;
pub mod faulty;
pub mod gate;
pub mod logwrites;

pub use conformance::run_all;
pub use delay::DelayDisk;
pub use faulty::{Fault, FaultHandle, FaultStats, FaultyDisk, Op, Ops, Torn};
pub use gate::Gate;
pub use logwrites::{
    CrashPoint, CrashViolation, DiscardModel, LogClock, LogEntry, LogOp, LogOptions, LogWritesDisk,
    WriteLog,
};

/// The seed for a randomised test: `CAIRN_SEED` if set, otherwise a fresh random one.
/// Prints `"{what} seed: N"` to stderr so a failing run can be replayed with
/// `CAIRN_SEED=N`.
///
/// # Panics
/// If `CAIRN_SEED` is set but is not a decimal `u64`: silently ignoring a replay request
/// would make the replay look like a pass.
pub fn test_seed(what: &str) -> u64 {
    let seed = match std::env::var("CAIRN_SEED") {
        Ok(s) => s
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("CAIRN_SEED={s:?} is not a decimal u64")),
        Err(_) => rand::random::<u64>(),
    };
    eprintln!("{what} seed: {seed}");
    seed
}

/// A buffer of `len` bytes that no other call is likely to produce: stale or misplaced
/// data then shows up as a mismatch instead of passing by coincidence.
pub fn random_bytes<R: rand::Rng + ?Sized>(rng: &mut R, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    rng.fill_bytes(&mut v);
    v
}

/// Describes the first byte where `got` and `want` differ, for assertion messages;
/// `base` is the device offset of both buffers.
pub fn first_difference(got: &[u8], want: &[u8], base: u64) -> Option<String> {
    if got.len() != want.len() {
        return Some(format!(
            "length differs: got {} bytes, want {}",
            got.len(),
            want.len()
        ));
    }
    let i = got.iter().zip(want).position(|(a, b)| a != b)?;
    let differing = got[i..]
        .iter()
        .zip(&want[i..])
        .filter(|(a, b)| a != b)
        .count();
    Some(format!(
        "first difference at byte {} (got {:#04x}, want {:#04x}; {differing} bytes differ)",
        base + i as u64,
        got[i],
        want[i]
    ))
}
