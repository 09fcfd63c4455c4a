//! The etcd answer fuzz harness, shared by the cargo-fuzz target
//! (`fuzz_targets/etcd_answer.rs`) and the deterministic run on stable Rust in
//! `crates/cluster/tests/fuzz_harness.rs`, so CI exercises it too.
//!
//! ```text
//!   bytes ─> status line, headers, chunked or not ─> JSON ─> a 200's JSON read as the
//!            answer to a lease grant, a keepalive, a create-if-absent txn and a range
//! ```
//!
//! Those bytes come from the network (an etcd member, or whatever answers in its place):
//! every input must give a value or an error, never a panic.

pub fn etcd_answer(data: &[u8]) {
    cairn_cluster::etcd::fuzz_answer(data);
}
