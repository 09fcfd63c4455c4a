//! placeholder: generation identifiers (filled in by this work).
