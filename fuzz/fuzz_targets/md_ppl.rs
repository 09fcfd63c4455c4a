//! cargo-fuzz entry for `md_harness::md_ppl` (the partial-parity log header and ring);
//! see ../md_harness.rs for what it checks.
#![no_main]

#[path = "../md_harness.rs"]
mod md_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| md_harness::md_ppl(data));
