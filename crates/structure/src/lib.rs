//! Nothing to link: the workspace's structure is checked by `tests/structure.rs`, which
//! reads every crate's `src/` (STYLE.md 14, "structure is a test").
