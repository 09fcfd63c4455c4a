//! One error type for every layer: a matchable [`ErrorKind`], the operation and offset it
//! happened at, and the underlying cause. Protocol front ends map the kind to their own
//! codes in one place (the NBD server's `nbd_errno`).

use std::fmt;

/// What went wrong, independent of which layer noticed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Offset or length reaches past the end of the device (or overflows).
    OutOfRange,
    /// Offset or length is not a multiple of the logical block size.
    Unaligned,
    /// A request that is malformed in some other way (zero length, bad flags).
    InvalidArgument,
    /// The device or export is read-only.
    ReadOnly,
    /// The backing store is full (ENOSPC, EDQUOT, EFBIG).
    NoSpace,
    /// The operation is not supported by this device (e.g. a fast zero that cannot be fast).
    Unsupported,
    /// An I/O error from below.
    Io,
    /// On-disk data failed validation (bad magic, checksum, impossible field).
    Corrupt,
    /// Not enough redundancy is left to serve the request.
    Degraded,
    /// A passphrase or key did not unlock anything.
    AuthFailed,
    /// A named thing (member, export, file) does not exist.
    NotFound,
    /// The device is shutting down and takes no more requests.
    Shutdown,
    /// A previous write or flush failed and could not be repaired; the device refuses
    /// further work rather than pretend the data is safe.
    PreviousIo,
    /// Another writer has the device open (a second `cairn serve`, a mount, mdadm): one
    /// writer per device, as the kernel's O_EXCL and lvm's and cryptsetup's locks keep.
    Busy,
    /// The device cannot be reached any more (a remote export whose connection broke or
    /// timed out): not a bad sector but the whole device, and every later request fails
    /// the same way. md fails such a member at once, as it fails a disk that vanished.
    Gone,
    /// This host no longer owns the device: its ownership lease may have run out, or a
    /// newer owner generation took the device over (docs/fencing.md). Not a failed disk:
    /// the device works, for its new owner. md freezes the whole array on it instead of
    /// failing a member, and writes nothing more.
    Fenced,
}

impl ErrorKind {
    /// A short lower-case description used as the start of the message.
    pub fn describe(self) -> &'static str {
        match self {
            ErrorKind::OutOfRange => "out of range",
            ErrorKind::Unaligned => "not aligned to the logical block size",
            ErrorKind::InvalidArgument => "invalid argument",
            ErrorKind::ReadOnly => "device is read-only",
            ErrorKind::NoSpace => "no space left on the backing store",
            ErrorKind::Unsupported => "operation not supported",
            ErrorKind::Io => "I/O error",
            ErrorKind::Corrupt => "corrupt metadata",
            ErrorKind::Degraded => "not enough redundancy",
            ErrorKind::AuthFailed => "authentication failed",
            ErrorKind::NotFound => "not found",
            ErrorKind::Shutdown => "shutting down",
            ErrorKind::PreviousIo => "an earlier write or flush failed; refusing further I/O",
            ErrorKind::Busy => "busy",
            ErrorKind::Gone => "device gone (not reachable)",
            ErrorKind::Fenced => "fenced",
        }
    }

    /// Classifies an OS error number.
    pub fn from_errno(errno: i32) -> ErrorKind {
        match errno {
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => ErrorKind::NoSpace,
            libc::EROFS | libc::EPERM | libc::EACCES => ErrorKind::ReadOnly,
            libc::EINVAL => ErrorKind::InvalidArgument,
            libc::EOPNOTSUPP => ErrorKind::Unsupported,
            libc::ENOENT | libc::ENXIO => ErrorKind::NotFound,
            libc::ESHUTDOWN => ErrorKind::Shutdown,
            libc::EBUSY => ErrorKind::Busy,
            _ => ErrorKind::Io,
        }
    }
}

/// A block-layer error: kind, context ("write at 4096 on disk.img"), optional source.
pub struct Error {
    kind: ErrorKind,
    context: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl Error {
    pub fn new(kind: ErrorKind, context: impl Into<String>) -> Error {
        Error {
            kind,
            context: context.into(),
            source: None,
        }
    }

    /// Wraps an OS error; the kind is derived from its errno.
    pub fn io(err: std::io::Error, context: impl Into<String>) -> Error {
        let kind = err.raw_os_error().map_or_else(
            || match err.kind() {
                std::io::ErrorKind::NotFound => ErrorKind::NotFound,
                std::io::ErrorKind::PermissionDenied => ErrorKind::ReadOnly,
                std::io::ErrorKind::InvalidInput => ErrorKind::InvalidArgument,
                std::io::ErrorKind::UnexpectedEof => ErrorKind::OutOfRange,
                std::io::ErrorKind::Unsupported => ErrorKind::Unsupported,
                _ => ErrorKind::Io,
            },
            ErrorKind::from_errno,
        );
        Error {
            kind,
            context: context.into(),
            source: Some(Box::new(err)),
        }
    }

    pub fn with_source(
        mut self,
        source: impl Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
    ) -> Error {
        self.source = Some(source.into());
        self
    }

    /// Adds an outer context: `"export vol0: " + inner context`.
    pub fn context(mut self, outer: impl fmt::Display) -> Error {
        self.context = format!("{outer}: {}", self.context);
        self
    }

    /// Replaces the kind, keeping context and source.
    pub fn with_kind(mut self, kind: ErrorKind) -> Error {
        self.kind = kind;
        self
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.context.is_empty() {
            write!(f, "{}", self.kind.describe())?;
        } else {
            write!(f, "{}: {}", self.context, self.kind.describe())?;
        }
        if let Some(src) = &self.source {
            write!(f, ": {src}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("context", &self.context)
            .field("source", &self.source.as_ref().map(|s| s.to_string()))
            .finish()
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
