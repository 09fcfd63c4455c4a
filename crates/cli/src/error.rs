//! The one error type the CLI shows: a sentence for the user, printed as `cairn: ...`.
//!
//! Lower layers keep their own typed errors; by the time an error reaches here it has been
//! turned into words that say what failed and, where there is one, what to do about it.

use std::fmt;

/// A failure to report to the user and exit non-zero.
#[derive(Debug)]
pub struct CliError {
    message: String,
}

impl CliError {
    pub fn new(message: impl Into<String>) -> CliError {
        CliError {
            message: message.into(),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

pub type Result<T, E = CliError> = std::result::Result<T, E>;
