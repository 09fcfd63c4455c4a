//! The daemon's pieces that need none of the CLI's types.
//!
//! ```text
//!   NBD server ──> StatsDisk(export) ──> LUKS / md ──> StatsDisk(member/file) ──> FileDisk
//!                     │ counters, latency histograms (stats)        │
//!                     └──────────────┬──────────────────────────────┘
//!                          stats::Registry (node id -> IoStats)
//!                                    │
//!        control socket (http) ── /v1/stats, /v1/status ── cairn status / top
//!        --metrics (http) ─────── metrics::render ───────── Prometheus
//!        state changes ────────── events::Events ────────── log, ring, --on-event CMD
//! ```

pub mod daemon;
pub mod events;
pub mod http;
pub mod md_events;
pub mod metrics;
pub mod stats;

/// Tests that start a child process and tests that look at sockets run one at a time: a
/// forked child holds a copy of every descriptor (a just-closed listening socket too)
/// until it execs, which a socket test running meanwhile sees as a live server.
#[cfg(test)]
pub(crate) static FORKING_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());
