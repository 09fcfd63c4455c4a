//! The one error type the CLI shows: a sentence for the user, printed as `cairn: ...`.
//!
//! It is the stack library's error ([`cairn_stack::StackError`]): lower layers keep their
//! own typed errors, and by the time one reaches an operator it has been turned into words
//! that say what failed and, where there is one, what to do about it, with an exit status.

pub use cairn_stack::error::{Result, StackError as CliError};
