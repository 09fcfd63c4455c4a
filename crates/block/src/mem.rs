//! `MemDisk`: a sparse in-memory device. Pages are allocated on first write and dropped on
//! discard, so a large MemDisk costs only what is written, and `extents` reports holes.

use std::sync::Mutex;

use crate::{BlockDevice, Capabilities, Extent, Geometry, Result, Support, WriteFlags};

const PAGE: usize = 64 << 10;

/// A sparse in-memory block device.
pub struct MemDisk {
    geometry: Geometry,
    pages: Vec<Mutex<Option<Box<[u8]>>>>,
}

impl std::fmt::Debug for MemDisk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemDisk")
            .field("geometry", &self.geometry)
            .finish()
    }
}

impl MemDisk {
    /// A zero-filled device of `size` bytes (rounded down to 512) with 512-byte sectors.
    pub fn new(size: u64) -> MemDisk {
        MemDisk::with_geometry(Geometry::simple(size - size % 512))
    }

    pub fn with_geometry(geometry: Geometry) -> MemDisk {
        let pages = usize::try_from(geometry.size.div_ceil(PAGE as u64))
            .expect("MemDisk larger than the address space");
        MemDisk {
            geometry,
            pages: (0..pages).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// A device holding a copy of `data` (length rounded down to 512).
    pub fn from_bytes(data: &[u8]) -> MemDisk {
        let disk = MemDisk::new(data.len() as u64);
        let len = usize::try_from(disk.geometry.size).expect("fits: came from a slice");
        disk.write_at(&data[..len], 0, WriteFlags::NONE)
            .expect("in range by construction");
        disk
    }

    /// The whole contents as one buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; usize::try_from(self.geometry.size).expect("MemDisk fits in memory")];
        self.read_at(&mut v, 0).expect("whole device is in range");
        v
    }

    /// Calls `f(page_index, offset_in_page, range_in_caller_buf)` for each page piece.
    fn for_pages(offset: u64, len: usize, mut f: impl FnMut(usize, usize, std::ops::Range<usize>)) {
        let mut done = 0usize;
        while done < len {
            let pos = offset + done as u64;
            let page = usize::try_from(pos / PAGE as u64).expect("page index fits");
            let in_page = usize::try_from(pos % PAGE as u64).expect("< PAGE");
            let n = (PAGE - in_page).min(len - done);
            f(page, in_page, done..done + n);
            done += n;
        }
    }

    fn zero_range(&self, offset: u64, len: u64) {
        let len = usize::try_from(len).expect("range checked at the boundary");
        MemDisk::for_pages(offset, len, |page, at, range| {
            let mut slot = self.pages[page].lock().expect("MemDisk page lock");
            if range.len() == PAGE {
                *slot = None;
            } else if let Some(p) = slot.as_mut() {
                p[at..at + range.len()].fill(0);
            }
        });
    }
}

impl BlockDevice for MemDisk {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            read_only: false,
            flush: Support::Native,
            fua: Support::Native,
            discard: Support::Native,
            write_zeroes: Support::Native,
            extents: true,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        debug_assert!(offset + buf.len() as u64 <= self.geometry.size);
        MemDisk::for_pages(offset, buf.len(), |page, at, range| {
            let slot = self.pages[page].lock().expect("MemDisk page lock");
            match slot.as_ref() {
                Some(p) => buf[range.clone()].copy_from_slice(&p[at..at + range.len()]),
                None => buf[range].fill(0),
            }
        });
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, _flags: WriteFlags) -> Result<()> {
        debug_assert!(offset + buf.len() as u64 <= self.geometry.size);
        MemDisk::for_pages(offset, buf.len(), |page, at, range| {
            let mut slot = self.pages[page].lock().expect("MemDisk page lock");
            let p = slot.get_or_insert_with(|| vec![0u8; PAGE].into_boxed_slice());
            p[at..at + range.len()].copy_from_slice(&buf[range]);
        });
        Ok(())
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.zero_range(offset, len);
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64, _flags: WriteFlags) -> Result<()> {
        // NO_HOLE is honoured in spirit: a MemDisk has no allocation to preserve, and a
        // partially written page stays allocated either way.
        self.zero_range(offset, len);
        Ok(())
    }

    fn extents(&self, offset: u64, len: u64) -> Result<Vec<Extent>> {
        let mut out: Vec<Extent> = Vec::new();
        let end = offset + len;
        let mut pos = offset;
        while pos < end {
            let page = usize::try_from(pos / PAGE as u64).expect("page index fits");
            let page_end = ((page as u64 + 1) * PAGE as u64).min(end);
            let hole = self.pages[page]
                .lock()
                .expect("MemDisk page lock")
                .is_none();
            match out.last_mut() {
                Some(last) if last.hole == hole => last.length += page_end - pos,
                _ => out.push(Extent {
                    offset: pos,
                    length: page_end - pos,
                    hole,
                    zero: hole,
                }),
            }
            pos = page_end;
        }
        Ok(out)
    }
}
