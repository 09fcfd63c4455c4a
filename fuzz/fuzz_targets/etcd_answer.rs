//! cargo-fuzz entry for `etcd_harness::etcd_answer`; see ../etcd_harness.rs for what it
//! checks.
#![no_main]

#[path = "../etcd_harness.rs"]
mod etcd_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| etcd_harness::etcd_answer(data));
