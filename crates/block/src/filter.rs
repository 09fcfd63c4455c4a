//! Filters: a layer over one device that changes a few of its operations and passes the
//! rest through, as nbdkit's filters do.
//!
//! ```text
//!   caller ─> impl BlockDevice for F (filter_device!) ─> F's Filter method
//!                                                          │ overridden: what F changes
//!                                                          └ default: admit(op)?, then the
//!                                                            same method of F::inner()
//! ```
//!
//! A wrapper implements [`Filter`] (never [`BlockDevice`] by hand) and says
//! [`filter_device!`](crate::filter_device) once: it names the device below with
//! [`Filter::inner`] and overrides only what it changes. Every default passes the call to
//! the same method below, the `*_then` forms to the `*_then` forms, so a member that
//! completes later (a network device) keeps overlapping its operations through any
//! number of filters, and the capabilities and [`BlockDevice::completes_later`] below
//! show through. A filter that checks, counts or waits before each operation does it
//! once, in [`Filter::admit`], which every default read, write, flush, discard and
//! write-zeroes (in both forms) calls first.
//!
//! A filter that changes an operation changes both its forms (`read_at` and
//! `read_then`, ...), or sets [`Filter::SYNCHRONOUS`]: its `*_then` forms then run
//! through its own synchronous ones on the calling thread, as the plain trait's defaults
//! do. `testkit::conformance::check_pass_through` checks a filter against what it says.
//!
//! The defaults are static calls: a filter allocates nothing per operation beyond what
//! the trait's own defaults do (a `SYNCHRONOUS` filter's `read_then` fills a buffer, as
//! the trait's default does). `Arc<T>` and `Box<T>` are plain forwards of their own
//! (crate root).

use std::fmt::Debug;
use std::ops::Deref;

use crate::{BlockDevice, Capabilities, Extent, Geometry, ReadDone, Result, WriteDone, WriteFlags};

/// The operation [`Filter::admit`] is asked about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoOp {
    Read,
    Write,
    Flush,
    Discard,
    WriteZeroes,
}

impl IoOp {
    /// Its name in an error sentence ("write zeroes").
    pub fn name(self) -> &'static str {
        match self {
            IoOp::Read => "read",
            IoOp::Write => "write",
            IoOp::Flush => "flush",
            IoOp::Discard => "discard",
            IoOp::WriteZeroes => "write zeroes",
        }
    }
}

/// A layer over one device that passes through whatever it does not override; with
/// [`filter_device!`](crate::filter_device) it is a [`BlockDevice`].
pub trait Filter: Send + Sync + Debug {
    /// The device below.
    type Inner: BlockDevice + ?Sized;

    /// `true`: the `*_then` forms run through this filter's own synchronous forms on the
    /// calling thread, and [`BlockDevice::completes_later`] is `false` (the plain trait's
    /// defaults). For a filter that changes the synchronous forms only and has no need to
    /// let a member overlap its operations (a test double, a view of a local disk).
    const SYNCHRONOUS: bool = false;

    /// The device below; a guard when it sits behind a lock (held for the one call).
    fn inner(&self) -> impl Deref<Target = Self::Inner> + '_;

    /// Asked before each read, write, flush, discard and write-zeroes that a default
    /// passes on, in either form: an error is the operation's answer and nothing goes
    /// below. The default lets everything through.
    fn admit(&self, op: IoOp) -> Result<()> {
        let _ = op;
        Ok(())
    }

    fn geometry(&self) -> Geometry {
        self.inner().geometry()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }
    fn completes_later(&self) -> bool {
        !Self::SYNCHRONOUS && self.inner().completes_later()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.admit(IoOp::Read)?;
        self.inner().read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.admit(IoOp::Write)?;
        self.inner().write_at(buf, offset, flags)
    }
    fn flush(&self) -> Result<()> {
        self.admit(IoOp::Flush)?;
        self.inner().flush()
    }
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.admit(IoOp::Discard)?;
        self.inner().discard(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.admit(IoOp::WriteZeroes)?;
        self.inner().write_zeroes(offset, len, flags)
    }
    fn read_then(&self, len: usize, offset: u64, done: ReadDone) {
        if Self::SYNCHRONOUS {
            let mut buf = vec![0u8; len];
            return done(Filter::read_at(self, &mut buf, offset).map(|()| buf));
        }
        match self.admit(IoOp::Read) {
            Ok(()) => self.inner().read_then(len, offset, done),
            Err(e) => done(Err(e)),
        }
    }
    fn write_then(&self, buf: &[u8], offset: u64, flags: WriteFlags, done: WriteDone) {
        if Self::SYNCHRONOUS {
            return done(Filter::write_at(self, buf, offset, flags));
        }
        match self.admit(IoOp::Write) {
            Ok(()) => self.inner().write_then(buf, offset, flags, done),
            Err(e) => done(Err(e)),
        }
    }
    fn flush_then(&self, done: WriteDone) {
        if Self::SYNCHRONOUS {
            return done(Filter::flush(self));
        }
        match self.admit(IoOp::Flush) {
            Ok(()) => self.inner().flush_then(done),
            Err(e) => done(Err(e)),
        }
    }
    fn discard_then(&self, offset: u64, len: u64, done: WriteDone) {
        if Self::SYNCHRONOUS {
            return done(Filter::discard(self, offset, len));
        }
        match self.admit(IoOp::Discard) {
            Ok(()) => self.inner().discard_then(offset, len, done),
            Err(e) => done(Err(e)),
        }
    }
    /// Allocation is the device's below: not admitted (a status query, not I/O).
    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        self.inner().extents(offset, len)
    }
    /// A hint: not admitted.
    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        self.inner().cache(offset, len)
    }
}

/// Makes a [`Filter`] a [`BlockDevice`]: every method goes to the filter's. Write it once
/// under the `impl Filter`, with the impl's generics in brackets when it has any:
/// `cairn_block::filter_device!(FencedDevice);`,
/// `cairn_block::filter_device!([D: BlockDevice] StatsDisk<D>);`.
///
/// (A macro, not a blanket `impl<F: Filter> BlockDevice for F`: that would collide with
/// `Box<T>`'s impl, and in every filter's impl a call on an `Arc` of a device would find
/// two methods of the same name.)
#[macro_export]
macro_rules! filter_device {
    ([$($g:tt)*] $ty:ty) => {
        impl<$($g)*> $crate::BlockDevice for $ty {
            fn geometry(&self) -> $crate::Geometry {
                $crate::Filter::geometry(self)
            }
            fn capabilities(&self) -> $crate::Capabilities {
                $crate::Filter::capabilities(self)
            }
            fn read_at(&self, buf: &mut [u8], offset: u64) -> $crate::Result<()> {
                $crate::Filter::read_at(self, buf, offset)
            }
            fn write_at(&self, buf: &[u8], offset: u64, flags: $crate::WriteFlags) -> $crate::Result<()> {
                $crate::Filter::write_at(self, buf, offset, flags)
            }
            fn write_then(&self, buf: &[u8], offset: u64, flags: $crate::WriteFlags, done: $crate::WriteDone) {
                $crate::Filter::write_then(self, buf, offset, flags, done)
            }
            fn read_then(&self, len: usize, offset: u64, done: $crate::ReadDone) {
                $crate::Filter::read_then(self, len, offset, done)
            }
            fn flush_then(&self, done: $crate::WriteDone) {
                $crate::Filter::flush_then(self, done)
            }
            fn discard_then(&self, offset: u64, len: u64, done: $crate::WriteDone) {
                $crate::Filter::discard_then(self, offset, len, done)
            }
            fn completes_later(&self) -> bool {
                $crate::Filter::completes_later(self)
            }
            fn flush(&self) -> $crate::Result<()> {
                $crate::Filter::flush(self)
            }
            fn discard(&self, offset: u64, len: u64) -> $crate::Result<()> {
                $crate::Filter::discard(self, offset, len)
            }
            fn write_zeroes(&self, offset: u64, len: u64, flags: $crate::WriteFlags) -> $crate::Result<()> {
                $crate::Filter::write_zeroes(self, offset, len, flags)
            }
            fn extents(&self, offset: u64, len: u64) -> $crate::Result<Vec<$crate::Extent>> {
                $crate::Filter::extents(self, offset, len)
            }
            fn cache(&self, offset: u64, len: u64) -> $crate::Result<()> {
                $crate::Filter::cache(self, offset, len)
            }
        }
    };
    ($ty:ty) => {
        $crate::filter_device!([] $ty);
    };
}
