//! placeholder: on-disk metadata (filled in by this work).
