//! cargo-fuzz entry for `repl_harness::repl_super`; see ../repl_harness.rs for what it
//! checks.
#![no_main]

#[path = "../repl_harness.rs"]
mod repl_harness;

libfuzzer_sys::fuzz_target!(|data: &[u8]| repl_harness::repl_super(data));
