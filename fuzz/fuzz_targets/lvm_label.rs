//! cargo-fuzz entry for `lvm_harness::lvm_label`; see ../lvm_harness.rs for what it checks.
#![no_main]

#[path = "../lvm_harness.rs"]
mod lvm_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| lvm_harness::lvm_label(data));
