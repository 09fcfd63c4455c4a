//! `FileDisk`: a regular file or a block device as a [`BlockDevice`].
//!
//! Regular files may be sparse: `discard` punches holes, `write_zeroes` uses
//! `fallocate(ZERO_RANGE/PUNCH_HOLE)`, and `extents` walks `SEEK_DATA`/`SEEK_HOLE`.
//! Block devices use `BLKDISCARD`/`BLKZEROOUT`. FUA writes use `pwritev2(RWF_DSYNC)`;
//! flush is `fdatasync`. With `direct`, the file is opened `O_DIRECT` and unaligned
//! caller buffers go through an aligned bounce buffer.
//!
//! A FileDisk opened for writing owns its file or device: a second writer, in this
//! process or another, is refused with [`ErrorKind::Busy`] naming the holder (owner.rs).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::owner::{self, InUse};
use crate::{
    write_zeroes_by_writing, BlockDevice, Capabilities, Error, ErrorKind, Extent, Geometry, Result,
    Support, WriteFlags,
};

/// How to open a [`FileDisk`].
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    pub read_only: bool,
    /// Open with `O_DIRECT` (bypass the page cache).
    pub direct: bool,
    /// Create a sparse file of this size if the path does not exist.
    pub create_size: Option<u64>,
}

/// A file or block device.
pub struct FileDisk {
    file: File,
    path: PathBuf,
    geometry: Geometry,
    read_only: bool,
    direct: bool,
    block_device: bool,
    /// Cleared the first time the filesystem refuses a fallocate mode.
    fallocate_ok: AtomicBool,
    /// Cleared the first time SEEK_DATA is refused.
    seek_data_ok: AtomicBool,
    /// Cleared when the kernel refuses RWF_DSYNC; FUA then falls back to fdatasync.
    dsync_ok: AtomicBool,
    /// Opened read-only while another process (or this one) had it open for writing.
    in_use: Option<InUse>,
}

impl std::fmt::Debug for FileDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileDisk")
            .field("path", &self.path)
            .field("geometry", &self.geometry)
            .field("read_only", &self.read_only)
            .field("direct", &self.direct)
            .finish()
    }
}

const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKPBSZGET: libc::c_ulong = 0x127b;
const BLKDISCARD: libc::c_ulong = 0x1277;
const BLKZEROOUT: libc::c_ulong = 0x127f;

fn last_os_error(context: impl Into<String>) -> Error {
    Error::io(std::io::Error::last_os_error(), context)
}

impl FileDisk {
    pub fn open(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<FileDisk> {
        let path = path.as_ref().to_path_buf();
        let name = path.display().to_string();
        // A block device opened for writing is claimed with O_EXCL, as mdadm and lvm do
        // (O_EXCL means "exclusive" there; with O_CREAT it would mean "new file").
        let claim = !opts.read_only
            && std::fs::metadata(&path).is_ok_and(|m| m.file_type().is_block_device());
        let mut oo = std::fs::OpenOptions::new();
        oo.read(true).write(!opts.read_only);
        if opts.create_size.is_some() && !claim {
            oo.create(!opts.read_only);
        }
        let mut flags = 0;
        if opts.direct {
            flags |= libc::O_DIRECT;
        }
        if claim {
            flags |= libc::O_EXCL;
        }
        oo.custom_flags(flags);
        let file = oo.open(&path).map_err(|e| {
            if claim && e.raw_os_error() == Some(libc::EBUSY) {
                let rdev = std::fs::metadata(&path).map_or(0, |m| m.rdev());
                return owner::busy(&name, owner::block_holder(rdev));
            }
            Error::io(e, format!("open {name}"))
        })?;
        let meta = file
            .metadata()
            .map_err(|e| Error::io(e, format!("stat {name}")))?;
        let block_device = meta.file_type().is_block_device();
        // One writer per device, for as long as this FileDisk lives (the lock goes with
        // the descriptor); a reader only learns whether someone writes it now.
        let in_use = if opts.read_only {
            owner::writer_of(&file)
        } else {
            owner::lock_writer(&file, &name)?;
            None
        };
        let (size, lbs, pbs) = if block_device {
            let mut size: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid.
            if unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size) } != 0 {
                return Err(last_os_error(format!("BLKGETSIZE64 on {name}")));
            }
            let mut lbs: libc::c_int = 512;
            let mut pbs: libc::c_uint = 4096;
            // SAFETY: both ioctls write one int through a valid pointer; failure leaves
            // the defaults, which are safe.
            unsafe {
                libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut lbs);
                libc::ioctl(file.as_raw_fd(), BLKPBSZGET, &mut pbs);
            }
            (size, u32::try_from(lbs).unwrap_or(512), pbs.max(4096))
        } else if meta.file_type().is_file() {
            let mut size = meta.len();
            if size == 0 {
                if let Some(want) = opts.create_size {
                    file.set_len(want)
                        .map_err(|e| Error::io(e, format!("resize {name}")))?;
                    size = want;
                }
            }
            (size, 512, 4096)
        } else {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("{name} is neither a regular file nor a block device"),
            ));
        };
        let lbs = if opts.direct { lbs.max(4096) } else { lbs };
        let size = size - size % u64::from(lbs);
        if size == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("{name} is smaller than one {lbs}-byte block"),
            ));
        }
        Ok(FileDisk {
            file,
            path,
            geometry: Geometry {
                size,
                logical_block_size: lbs,
                physical_block_size: pbs.max(lbs),
                optimal_io_size: pbs.max(lbs),
                max_io_size: 32 << 20,
            },
            read_only: opts.read_only,
            direct: opts.direct,
            block_device,
            fallocate_ok: AtomicBool::new(true),
            seek_data_ok: AtomicBool::new(!block_device),
            dsync_ok: AtomicBool::new(true),
            in_use,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// For a read-only open: who had the device open for writing when it was opened, so
    /// the caller can say that what it reads may be changing. Always `None` for a writer
    /// (a second writer is refused with [`ErrorKind::Busy`]).
    pub fn in_use(&self) -> Option<&InUse> {
        self.in_use.as_ref()
    }

    fn ctx(&self, op: &str, offset: u64, len: u64) -> String {
        format!("{op} of {len} bytes at {offset} on {}", self.path.display())
    }

    fn check_writable(&self, op: &str, offset: u64, len: u64) -> Result<()> {
        if self.read_only {
            return Err(Error::new(ErrorKind::ReadOnly, self.ctx(op, offset, len)));
        }
        Ok(())
    }

    fn needs_bounce(&self, ptr: *const u8) -> bool {
        self.direct && !(ptr as usize).is_multiple_of(4096)
    }

    fn pwrite_dsync(&self, buf: &[u8], offset: u64) -> Result<bool> {
        if !self.dsync_ok.load(Ordering::Relaxed) {
            return Ok(false);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let iov = libc::iovec {
                iov_base: buf[done..].as_ptr() as *mut libc::c_void,
                iov_len: buf.len() - done,
            };
            let off = libc::off_t::try_from(offset + done as u64)
                .map_err(|_| Error::new(ErrorKind::OutOfRange, self.ctx("write", offset, 0)))?;
            // SAFETY: iov points at live memory of iov_len bytes that outlives the call.
            let n = unsafe { libc::pwritev2(self.file.as_raw_fd(), &iov, 1, off, libc::RWF_DSYNC) };
            if n < 0 {
                let err = std::io::Error::last_os_error();
                match err.raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) if done == 0 => {
                        self.dsync_ok.store(false, Ordering::Relaxed);
                        return Ok(false);
                    }
                    _ => return Err(Error::io(err, self.ctx("write", offset, buf.len() as u64))),
                }
            }
            if n == 0 {
                return Err(Error::new(
                    ErrorKind::NoSpace,
                    self.ctx("write", offset, buf.len() as u64),
                ));
            }
            done += usize::try_from(n).expect("n > 0");
        }
        Ok(true)
    }

    fn fallocate(&self, mode: libc::c_int, offset: u64, len: u64) -> std::io::Result<()> {
        let (Ok(off), Ok(l)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
        };
        loop {
            // SAFETY: plain syscall on an owned fd.
            let r = unsafe { libc::fallocate(self.file.as_raw_fd(), mode, off, l) };
            if r == 0 {
                return Ok(());
            }
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(err);
            }
        }
    }

    fn blk_range_ioctl(&self, req: libc::c_ulong, offset: u64, len: u64) -> std::io::Result<()> {
        let range: [u64; 2] = [offset, len];
        // SAFETY: the ioctl reads two u64s from a valid pointer.
        if unsafe { libc::ioctl(self.file.as_raw_fd(), req, &range) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn lseek(&self, offset: u64, whence: libc::c_int) -> std::io::Result<Option<u64>> {
        let off = libc::off_t::try_from(offset)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
        // SAFETY: plain syscall on an owned fd.
        let r = unsafe { libc::lseek(self.file.as_raw_fd(), off, whence) };
        if r < 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::ENXIO) {
                return Ok(None);
            }
            return Err(err);
        }
        Ok(Some(u64::try_from(r).expect("lseek returned >= 0")))
    }
}

/// A heap buffer aligned to 4096 bytes, for O_DIRECT bounces.
struct AlignedBuf {
    ptr: *mut u8,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len.max(4096), 4096).expect("layout");
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        assert!(
            !ptr.is_null(),
            "out of memory for an O_DIRECT bounce buffer"
        );
        AlignedBuf { ptr, len }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr is a live allocation of at least len bytes owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(4096), 4096).expect("layout");
        // SAFETY: allocated in new() with this same layout.
        unsafe { std::alloc::dealloc(self.ptr, layout) }
    }
}

impl BlockDevice for FileDisk {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        let fallocate = self.fallocate_ok.load(Ordering::Relaxed);
        Capabilities {
            read_only: self.read_only,
            flush: Support::Native,
            fua: if self.dsync_ok.load(Ordering::Relaxed) {
                Support::Native
            } else {
                Support::Emulate
            },
            discard: if self.read_only {
                Support::None
            } else if self.block_device || fallocate {
                Support::Native
            } else {
                Support::None
            },
            write_zeroes: if self.block_device || fallocate {
                Support::Native
            } else {
                Support::Emulate
            },
            extents: self.seek_data_ok.load(Ordering::Relaxed),
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        debug_assert!(offset + buf.len() as u64 <= self.geometry.size);
        let res = if self.needs_bounce(buf.as_ptr()) {
            let mut b = AlignedBuf::new(buf.len());
            let r = self.file.read_exact_at(b.as_mut_slice(), offset);
            buf.copy_from_slice(b.as_mut_slice());
            r
        } else {
            self.file.read_exact_at(buf, offset)
        };
        res.map_err(|e| Error::io(e, self.ctx("read", offset, buf.len() as u64)))
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        debug_assert!(offset + buf.len() as u64 <= self.geometry.size);
        self.check_writable("write", offset, buf.len() as u64)?;
        let mut bounce;
        let data: &[u8] = if self.needs_bounce(buf.as_ptr()) {
            bounce = AlignedBuf::new(buf.len());
            bounce.as_mut_slice().copy_from_slice(buf);
            bounce.as_mut_slice()
        } else {
            buf
        };
        if flags.fua() && self.pwrite_dsync(data, offset)? {
            return Ok(());
        }
        self.file
            .write_all_at(data, offset)
            .map_err(|e| Error::io(e, self.ctx("write", offset, buf.len() as u64)))?;
        if flags.fua() {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&self) -> Result<()> {
        if self.read_only {
            return Ok(());
        }
        self.file
            .sync_data()
            .map_err(|e| Error::io(e, format!("flush {}", self.path.display())))
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check_writable("discard", offset, len)?;
        let res = if self.block_device {
            self.blk_range_ioctl(BLKDISCARD, offset, len)
        } else {
            self.fallocate(
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            )
        };
        res.map_err(|e| {
            if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
                self.fallocate_ok.store(false, Ordering::Relaxed);
            }
            Error::io(e, self.ctx("discard", offset, len))
        })
    }

    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.check_writable("write_zeroes", offset, len)?;
        let native = if self.block_device {
            self.blk_range_ioctl(BLKZEROOUT, offset, len)
        } else if !self.fallocate_ok.load(Ordering::Relaxed) {
            Err(std::io::Error::from_raw_os_error(libc::EOPNOTSUPP))
        } else if flags.contains(WriteFlags::NO_HOLE) {
            self.fallocate(
                libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            )
        } else {
            // Punching leaves a hole that reads as zeroes; tmpfs has no ZERO_RANGE but
            // punches fine, so try that first when holes are allowed.
            self.fallocate(
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                offset,
                len,
            )
            .or_else(|_| {
                self.fallocate(
                    libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
                    offset,
                    len,
                )
            })
        };
        match native {
            Ok(()) => {
                if flags.fua() {
                    self.flush()?;
                }
                Ok(())
            }
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::EINVAL)
                ) =>
            {
                if flags.contains(WriteFlags::FAST_ZERO) {
                    return Err(Error::io(e, self.ctx("fast write_zeroes", offset, len))
                        .with_kind(ErrorKind::Unsupported));
                }
                write_zeroes_by_writing(self, offset, len, flags)
            }
            Err(e) => Err(Error::io(e, self.ctx("write_zeroes", offset, len))),
        }
    }

    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let data_all = || {
            Ok(vec![Extent {
                offset,
                length: len,
                hole: false,
                zero: false,
            }])
        };
        if !self.seek_data_ok.load(Ordering::Relaxed) {
            return data_all();
        }
        let end = offset + len;
        let mut out = Vec::new();
        let mut pos = offset;
        // Bound the work per call; the caller asks again for the rest.
        while pos < end && out.len() < 1024 {
            let data = match self.lseek(pos, libc::SEEK_DATA) {
                Ok(d) => d.unwrap_or(u64::MAX),
                Err(_) => {
                    self.seek_data_ok.store(false, Ordering::Relaxed);
                    return data_all();
                }
            };
            if data > pos {
                let hole_end = data.min(end);
                out.push(Extent {
                    offset: pos,
                    length: hole_end - pos,
                    hole: true,
                    zero: true,
                });
                pos = hole_end;
                continue;
            }
            let hole = match self.lseek(pos, libc::SEEK_HOLE) {
                Ok(h) => h.unwrap_or(end).max(pos + 1),
                Err(e) => return Err(Error::io(e, self.ctx("SEEK_HOLE", pos, 0))),
            };
            let data_end = hole.min(end);
            out.push(Extent {
                offset: pos,
                length: data_end - pos,
                hole: false,
                zero: false,
            });
            pos = data_end;
        }
        // Extents must be block-aligned for the protocol; round the last one to a block.
        let lbs = u64::from(self.geometry.logical_block_size);
        let mut aligned: Vec<Extent> = Vec::with_capacity(out.len());
        for e in out {
            // Keep the answer contiguous from `offset` whatever rounding did before.
            let start = aligned
                .last()
                .map_or(offset, |l: &Extent| l.offset + l.length);
            let mut stop = e.offset + e.length;
            if stop % lbs != 0 {
                // Only whole blocks may be called a hole: a hole's end rounds down and
                // the partial block goes to the data after it; data's end rounds up.
                stop = if e.hole {
                    stop - stop % lbs
                } else {
                    (stop + lbs - stop % lbs).min(end)
                };
            }
            if stop <= start {
                continue;
            }
            let ext = Extent {
                offset: start,
                length: stop - start,
                ..e
            };
            match aligned.last_mut() {
                Some(l) if l.hole == ext.hole => l.length += ext.length,
                // A partial-block hole rounded into data is data.
                _ => aligned.push(ext),
            }
        }
        if aligned.is_empty() {
            return data_all();
        }
        Ok(aligned)
    }

    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        let (Ok(off), Ok(l)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Ok(());
        };
        // SAFETY: advisory syscall on an owned fd; failure is harmless.
        unsafe { libc::posix_fadvise(self.file.as_raw_fd(), off, l, libc::POSIX_FADV_WILLNEED) };
        Ok(())
    }
}
