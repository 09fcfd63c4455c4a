//! cairn's block layer.
//!
//! ```text
//!   NBD server / engine      -- calls check_io once per request, then the top device
//!   volume / crypt / array   -- each a BlockDevice over BlockDevices
//!   filters (fence, stats)   -- a Filter over one device: change one thing, pass the rest
//!   FileDisk / MemDisk       -- leaves: files, block devices, memory
//! ```
//!
//! Every layer is a [`BlockDevice`]: byte offsets, lengths that are multiples of the
//! logical block size, thread-safe `&self` methods. Requests are validated once at the
//! boundary with [`check_io`]; layers only `debug_assert!` what the boundary guaranteed.
//! A wrapper over one device is a [`Filter`] and writes only what it changes.
//!
//! Ordering contract (that of an NVMe disk): writes between two flushes may complete in
//! any order; `flush` makes every write that completed before it durable; a write with
//! [`WriteFlags::FUA`] is durable when it returns.

pub mod codec;
mod error;
mod file;
mod filter;
mod mem;
pub mod overlap;
mod owner;
pub mod probe;
pub mod sock;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;

pub use error::{Error, ErrorKind, Result};
pub use file::{FileDisk, OpenOptions};
pub use filter::{Filter, IoOp};
pub use mem::MemDisk;
pub use owner::InUse;

use std::fmt::Debug;
use std::sync::Arc;

/// The shape of a device. Immutable while the device is open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Size in bytes; a multiple of `logical_block_size`.
    pub size: u64,
    /// Smallest addressable unit: every offset and length is a multiple of it.
    pub logical_block_size: u32,
    /// Smallest unit written without read-modify-write below (a RAID chunk, a 4K sector).
    pub physical_block_size: u32,
    /// The I/O size that performs best (a full RAID stripe); at least `physical_block_size`.
    pub optimal_io_size: u32,
    /// Largest single request the device accepts in one call.
    pub max_io_size: u32,
}

impl Geometry {
    /// A geometry with 512-byte sectors, 4 KiB physical blocks and a 32 MiB maximum.
    pub fn simple(size: u64) -> Geometry {
        Geometry {
            size,
            logical_block_size: 512,
            physical_block_size: 4096,
            optimal_io_size: 4096,
            max_io_size: 32 << 20,
        }
    }
}

/// How a device provides an optional operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Support {
    /// Not available at all.
    None,
    /// Available, but done the slow way (e.g. zeroes written as data).
    Emulate,
    /// Done natively by the layer below (fallocate, a real cache flush).
    Native,
}

/// What a device can do beyond read and write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capabilities {
    pub read_only: bool,
    pub flush: Support,
    pub fua: Support,
    pub discard: Support,
    pub write_zeroes: Support,
    /// Whether `extents` reports real holes (sparse files) rather than "all data".
    pub extents: bool,
}

impl Default for Capabilities {
    fn default() -> Self {
        Capabilities {
            read_only: false,
            flush: Support::Emulate,
            fua: Support::Emulate,
            discard: Support::None,
            write_zeroes: Support::Emulate,
            extents: false,
        }
    }
}

/// Flags on write-like requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct WriteFlags(u8);

impl WriteFlags {
    pub const NONE: WriteFlags = WriteFlags(0);
    /// Force unit access: durable before the call returns.
    pub const FUA: WriteFlags = WriteFlags(1);
    /// `write_zeroes` must leave the range allocated (no hole punching).
    pub const NO_HOLE: WriteFlags = WriteFlags(2);
    /// `write_zeroes` must fail with [`ErrorKind::Unsupported`] rather than be slow.
    pub const FAST_ZERO: WriteFlags = WriteFlags(4);

    pub const fn contains(self, other: WriteFlags) -> bool {
        self.0 & other.0 == other.0
    }
    pub const fn union(self, other: WriteFlags) -> WriteFlags {
        WriteFlags(self.0 | other.0)
    }
    pub const fn without(self, other: WriteFlags) -> WriteFlags {
        WriteFlags(self.0 & !other.0)
    }
    pub fn fua(self) -> bool {
        self.contains(WriteFlags::FUA)
    }
}

impl std::ops::BitOr for WriteFlags {
    type Output = WriteFlags;
    fn bitor(self, rhs: WriteFlags) -> WriteFlags {
        self.union(rhs)
    }
}

/// One run of a device's address space, as `extents` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub length: u64,
    /// Not allocated below (a hole in a sparse file); reads return zeroes.
    pub hole: bool,
    /// Known to read as zeroes (holes always are).
    pub zero: bool,
}

/// Called once with the result of a write started by [`BlockDevice::write_then`] (or a
/// flush or discard started by [`BlockDevice::flush_then`], [`BlockDevice::discard_then`]).
pub type WriteDone = Box<dyn FnOnce(Result<()>) + Send>;

/// Called once with the bytes of a read started by [`BlockDevice::read_then`] (exactly
/// the length asked for) or its error.
pub type ReadDone = Box<dyn FnOnce(Result<Vec<u8>>) + Send>;

/// A block device: the one trait every cairn layer implements.
///
/// Offsets and lengths are bytes, multiples of `geometry().logical_block_size`, inside
/// `geometry().size`; the caller (the boundary) guarantees that with [`check_io`].
pub trait BlockDevice: Send + Sync + Debug {
    fn geometry(&self) -> Geometry;

    fn capabilities(&self) -> Capabilities {
        Capabilities::default()
    }

    /// Fills `buf` from `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()>;

    /// Writes `buf` at `offset`; with FUA the data is durable on return.
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()>;

    /// Starts the write of `buf` at `offset` and calls `done` with its result once it is
    /// complete: perhaps on another thread, perhaps before this returns, always exactly
    /// once. When this returns, `buf` is no longer used. The write counts as completed
    /// (for [`BlockDevice::flush`], and for FUA's durability) when `done` is called, not
    /// before.
    ///
    /// The default writes with [`BlockDevice::write_at`] and then calls `done` on the
    /// calling thread. A device whose writes wait on something other than this CPU (a
    /// replica's acknowledgement over the network) overrides it, so the caller's thread is
    /// free while it waits: the NBD server then answers the request from the thread that
    /// sees the write complete, with no thread of its own blocked per request.
    fn write_then(&self, buf: &[u8], offset: u64, flags: WriteFlags, done: WriteDone) {
        done(self.write_at(buf, offset, flags));
    }

    /// Starts a read of `len` bytes at `offset` and calls `done` with them once they are
    /// in (the same rules as [`BlockDevice::write_then`]: exactly once, perhaps on another
    /// thread, perhaps before this returns). The default reads with
    /// [`BlockDevice::read_at`] on the calling thread.
    fn read_then(&self, len: usize, offset: u64, done: ReadDone) {
        let mut buf = vec![0u8; len];
        done(self.read_at(&mut buf, offset).map(|()| buf));
    }

    /// Starts a flush and calls `done` with its result ([`BlockDevice::flush`]'s rules,
    /// "returns" read as "calls `done`"). The default flushes on the calling thread.
    fn flush_then(&self, done: WriteDone) {
        done(self.flush());
    }

    /// Starts a discard and calls `done` with its result ([`BlockDevice::discard`]'s
    /// rules, "returns" read as "calls `done`"). The default discards on the calling
    /// thread.
    fn discard_then(&self, offset: u64, len: u64, done: WriteDone) {
        done(self.discard(offset, len));
    }

    /// Whether [`BlockDevice::read_then`], [`BlockDevice::write_then`],
    /// [`BlockDevice::flush_then`] and [`BlockDevice::discard_then`] return before the
    /// operation is done (a network device: the request is sent, the answer comes later
    /// on another thread). A layer with several operations for such devices starts them
    /// all from one thread and waits once, instead of handing each to a worker thread.
    /// `false` (the default) means they run to completion on the calling thread.
    fn completes_later(&self) -> bool {
        false
    }

    /// Makes every write that completed before this call durable.
    fn flush(&self) -> Result<()> {
        Ok(())
    }

    /// Tells the device the range is no longer needed. Contents afterwards are unspecified
    /// (they may or may not read as zeroes).
    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        let _ = (offset, len);
        Err(Error::new(ErrorKind::Unsupported, "discard"))
    }

    /// Makes the range read as zeroes. The default writes zero buffers; it refuses
    /// `FAST_ZERO` because it is not fast.
    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        if flags.contains(WriteFlags::FAST_ZERO) {
            return Err(Error::new(ErrorKind::Unsupported, "fast write_zeroes"));
        }
        write_zeroes_by_writing(self, offset, len, flags)
    }

    /// Describes allocation of `[offset, offset + len)`. The extents returned are
    /// contiguous, start at `offset`, and may stop short of `offset + len` (never
    /// past the device size), but always cover at least one block. The default says
    /// "all data".
    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        Ok(vec![Extent {
            offset,
            length: len,
            hole: false,
            zero: false,
        }])
    }

    /// Hints that the range will be read soon. The default does nothing.
    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        let _ = (offset, len);
        Ok(())
    }
}

/// Writes zeroes as data, in bounded chunks. The emulation behind `write_zeroes`.
pub fn write_zeroes_by_writing<D: BlockDevice + ?Sized>(
    dev: &D,
    offset: u64,
    len: u64,
    flags: WriteFlags,
) -> Result<()> {
    const CHUNK: u64 = 1 << 20;
    let zeroes = vec![0u8; usize::try_from(len.min(CHUNK)).unwrap_or(1 << 20)];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(zeroes.len() as u64);
        // n <= zeroes.len(), which is a usize.
        let n_usize = usize::try_from(n).expect("chunk fits in usize");
        // Every chunk carries FUA: it makes only its own write durable, not the earlier
        // chunks. NO_HOLE and FAST_ZERO mean nothing to write_at.
        let f = flags.without(WriteFlags::NO_HOLE.union(WriteFlags::FAST_ZERO));
        dev.write_at(&zeroes[..n_usize], offset + done, f)?;
        done += n;
    }
    Ok(())
}

/// What kind of access `check_io` validates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    Discard,
    WriteZeroes,
    Other,
}

/// The boundary check: `offset` and `len` are aligned to the logical block size and
/// `[offset, offset + len)` lies inside the device, with no overflow. Write-like requests
/// past the end are `NoSpace` (the NBD rule: ENOSPC), the others `OutOfRange`.
pub fn check_io(geometry: &Geometry, kind: IoKind, offset: u64, len: u64) -> Result<()> {
    let op = match kind {
        IoKind::Read => "read",
        IoKind::Write => "write",
        IoKind::Discard => "discard",
        IoKind::WriteZeroes => "write_zeroes",
        IoKind::Other => "request",
    };
    let lbs = u64::from(geometry.logical_block_size.max(1));
    let end = offset.checked_add(len);
    match end {
        Some(end) if end <= geometry.size => {}
        _ => {
            let past_end_kind = match kind {
                // A write that starts inside the device but overflows is still a write
                // that does not fit; one that starts past the end likewise.
                IoKind::Write | IoKind::WriteZeroes if end.is_some() => ErrorKind::NoSpace,
                _ => ErrorKind::OutOfRange,
            };
            return Err(Error::new(
                past_end_kind,
                format!(
                    "{op} of {len} bytes at {offset} (device size {})",
                    geometry.size
                ),
            ));
        }
    }
    if !offset.is_multiple_of(lbs) || !len.is_multiple_of(lbs) {
        return Err(Error::new(
            ErrorKind::Unaligned,
            format!("{op} of {len} bytes at {offset} (logical block {lbs})"),
        ));
    }
    Ok(())
}

macro_rules! forward_block_device {
    ($ty:ty) => {
        impl<T: BlockDevice + ?Sized> BlockDevice for $ty {
            fn geometry(&self) -> Geometry {
                (**self).geometry()
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
                (**self).read_at(buf, offset)
            }
            fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
                (**self).write_at(buf, offset, flags)
            }
            fn write_then(&self, buf: &[u8], offset: u64, flags: WriteFlags, done: WriteDone) {
                (**self).write_then(buf, offset, flags, done)
            }
            fn read_then(&self, len: usize, offset: u64, done: ReadDone) {
                (**self).read_then(len, offset, done)
            }
            fn flush_then(&self, done: WriteDone) {
                (**self).flush_then(done)
            }
            fn discard_then(&self, offset: u64, len: u64, done: WriteDone) {
                (**self).discard_then(offset, len, done)
            }
            fn completes_later(&self) -> bool {
                (**self).completes_later()
            }
            fn flush(&self) -> Result<()> {
                (**self).flush()
            }
            fn discard(&self, offset: u64, len: u64) -> Result<()> {
                (**self).discard(offset, len)
            }
            fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
                (**self).write_zeroes(offset, len, flags)
            }
            fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
                (**self).extents(offset, len)
            }
            fn cache(&self, offset: u64, len: u64) -> Result<()> {
                (**self).cache(offset, len)
            }
        }
    };
}

forward_block_device!(Arc<T>);
forward_block_device!(Box<T>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_io_rules() {
        let g = Geometry::simple(1 << 20);
        assert!(check_io(&g, IoKind::Read, 0, 512).is_ok());
        assert!(check_io(&g, IoKind::Read, (1 << 20) - 512, 512).is_ok());
        assert!(check_io(&g, IoKind::Read, 0, 0).is_ok());
        let k = |kind, off, len| check_io(&g, kind, off, len).unwrap_err().kind();
        assert_eq!(k(IoKind::Read, 1 << 20, 512), ErrorKind::OutOfRange);
        assert_eq!(k(IoKind::Write, 1 << 20, 512), ErrorKind::NoSpace);
        assert_eq!(
            k(IoKind::WriteZeroes, (1 << 20) - 512, 1024),
            ErrorKind::NoSpace
        );
        assert_eq!(k(IoKind::Discard, 1 << 20, 512), ErrorKind::OutOfRange);
        assert_eq!(k(IoKind::Read, u64::MAX - 255, 512), ErrorKind::OutOfRange);
        assert_eq!(k(IoKind::Write, u64::MAX - 255, 512), ErrorKind::OutOfRange);
        assert_eq!(k(IoKind::Read, 100, 512), ErrorKind::Unaligned);
        assert_eq!(k(IoKind::Read, 0, 100), ErrorKind::Unaligned);
    }

    #[test]
    fn error_message_is_one_sentence_with_cause() {
        let e = Error::io(
            std::io::Error::from_raw_os_error(libc::ENOSPC),
            "write at 0",
        )
        .context("disk.img");
        assert_eq!(e.kind(), ErrorKind::NoSpace);
        let s = e.to_string();
        assert!(s.starts_with("disk.img: write at 0: no space"), "{s}");
    }
}
