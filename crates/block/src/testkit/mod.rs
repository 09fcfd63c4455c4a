//! Test doubles and the conformance suite (filled in below).
