//! cargo-fuzz entry for `luks_harness::luks_header`; see ../luks_harness.rs for what it
//! checks.
#![no_main]

#[path = "../luks_harness.rs"]
mod luks_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| luks_harness::luks_header(data));
