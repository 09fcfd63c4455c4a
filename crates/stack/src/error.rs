//! The one error type the CLI shows: a sentence for the user, printed as `cairn: ...`.
//!
//! Lower layers keep their own typed errors; by the time an error reaches here it has been
//! turned into words that say what failed and, where there is one, what to do about it.

use std::fmt;

/// A failure to report to the user and exit non-zero.
#[derive(Debug)]
pub struct StackError {
    message: String,
    code: u8,
}

impl StackError {
    pub fn new(message: impl Into<String>) -> StackError {
        StackError {
            message: message.into(),
            code: 1,
        }
    }

    /// A failure with cryptsetup's exit status for it (2: no key available with this
    /// passphrase), so scripts written for cryptsetup keep working.
    pub fn with_code(message: impl Into<String>, code: u8) -> StackError {
        StackError {
            message: message.into(),
            code,
        }
    }

    /// The process exit status: 1 unless the error says otherwise.
    pub fn exit_code(&self) -> u8 {
        self.code
    }
}

impl fmt::Display for StackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for StackError {}

pub type Result<T, E = StackError> = std::result::Result<T, E>;
