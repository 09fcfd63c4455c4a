//! cargo-fuzz entry for `harness::nbd_client`; see ../harness.rs for what it checks.
#![no_main]

#[path = "../harness.rs"]
mod harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| harness::nbd_client(data));
