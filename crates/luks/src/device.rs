//! [`CryptDevice`]: the decrypted view of a LUKS data segment, a [`BlockDevice`] over the
//! device that holds the ciphertext.
//!
//! ```text
//!   read_at(buf, off)  = below.read_at(buf, payload + off), then decrypt in place
//!   write_at(buf, off) = copy into a scratch buffer, encrypt, below.write_at(payload + off)
//!   IV of the unit at off = off / 512 + iv_tweak  (plain64; 4096-byte units step by 8)
//! ```
//!
//! A request of [`PARALLEL_CRYPT_MIN`] bytes or more is en/decrypted in unit-aligned
//! pieces on as many cores as the machine has (`cairn_block::overlap`); smaller ones on
//! the calling thread, where a hand-over would cost more than it saves.
//!
//! Flush, FUA and cache hints pass through with the payload offset added. Discard passes
//! through only when the header allows it (`config.flags` has `allow-discards`, as
//! dm-crypt requires), because it reveals which blocks are unused. `write_zeroes` is the
//! trait's emulation: zero plaintext is not zero ciphertext.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;

use cairn_block::{
    BlockDevice, Capabilities, Error, ErrorKind, Geometry, Result, Support, WriteFlags,
};

use crate::xts::SectorCipher;

/// Largest piece a write is encrypted in: bounds the per-thread scratch buffer.
const WRITE_CHUNK: usize = 1 << 20;
/// Requests at least this large are en/decrypted on more than one core.
pub const PARALLEL_CRYPT_MIN: usize = 256 << 10;
/// The smallest piece one core takes when a request is split.
const CRYPT_PIECE_MIN: usize = 128 << 10;

/// Cores available to this process (1 when unknown).
fn cores() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, usize::from))
}

thread_local! {
    /// Ciphertext scratch for writes (taken, not borrowed, so a CryptDevice stacked on
    /// another one in the same thread gets its own).
    static SCRATCH: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Where a data segment lies and how it is encrypted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentParams {
    /// Byte offset of the payload on the device below.
    pub offset: u64,
    /// Payload size in bytes (a multiple of `sector_size`).
    pub size: u64,
    /// Encryption unit: 512, 1024, 2048 or 4096.
    pub sector_size: u32,
    /// Added to every IV (LUKS2 `iv_tweak`).
    pub iv_tweak: u64,
    /// Pass discards down (`allow-discards`).
    pub allow_discards: bool,
}

/// A decrypted LUKS data segment.
pub struct CryptDevice {
    below: Arc<dyn BlockDevice>,
    cipher: SectorCipher,
    seg: SegmentParams,
    geometry: Geometry,
    description: String,
    /// Smallest request split over cores ([`PARALLEL_CRYPT_MIN`]).
    split_min: usize,
}

impl fmt::Debug for CryptDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CryptDevice")
            .field("description", &self.description)
            .field("cipher", &self.cipher)
            .field("segment", &self.seg)
            .field("below", &self.below)
            .finish()
    }
}

fn round_up(x: u64, m: u64) -> u64 {
    x.div_ceil(m).saturating_mul(m)
}

impl CryptDevice {
    /// Checks that the segment fits the device below and builds the layer.
    pub fn new(
        below: Arc<dyn BlockDevice>,
        cipher: SectorCipher,
        seg: SegmentParams,
        description: String,
    ) -> Result<CryptDevice> {
        let g = below.geometry();
        let ss = seg.sector_size;
        if !crate::ondisk::SECTOR_SIZES.contains(&ss) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("sector size {ss}"),
            ));
        }
        let lbs = ss.max(g.logical_block_size);
        let lbs64 = u64::from(lbs);
        if !seg
            .offset
            .is_multiple_of(u64::from(g.logical_block_size.max(1)))
        {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "payload offset {} is not aligned to the device's {}-byte blocks",
                    seg.offset, g.logical_block_size
                ),
            ));
        }
        match seg.offset.checked_add(seg.size) {
            Some(end) if end <= g.size => {}
            _ => {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "data segment [{}, +{}) does not fit the {}-byte device",
                        seg.offset, seg.size, g.size
                    ),
                ))
            }
        }
        // A payload not a multiple of the (possibly larger) device block is cut.
        let size = seg.size - seg.size % lbs64;
        let to_u32 = |v: u64| u32::try_from(v).unwrap_or(u32::MAX - (u32::MAX % lbs));
        let physical = to_u32(round_up(u64::from(g.physical_block_size.max(lbs)), lbs64));
        let optimal = to_u32(round_up(u64::from(g.optimal_io_size.max(physical)), lbs64));
        let max_io = (g.max_io_size - g.max_io_size % lbs).max(lbs);
        let geometry = Geometry {
            size,
            logical_block_size: lbs,
            physical_block_size: physical,
            optimal_io_size: optimal,
            max_io_size: max_io,
        };
        Ok(CryptDevice {
            below,
            cipher,
            seg: SegmentParams { size, ..seg },
            geometry,
            description,
            split_min: PARALLEL_CRYPT_MIN,
        })
    }

    /// Splits requests over cores only from `bytes` up (`usize::MAX`: never), for
    /// benchmarks that compare the two.
    #[doc(hidden)]
    pub fn with_split_min(mut self, bytes: usize) -> CryptDevice {
        self.split_min = bytes;
        self
    }

    /// The device holding the ciphertext.
    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.below
    }

    pub fn segment(&self) -> SegmentParams {
        self.seg
    }

    /// A one-line description, e.g. `LUKS2 aes-xts-plain64 512-bit, 4096-byte sectors`.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// En- or decrypts `buf`, the units at payload offset `off`, in place: large buffers
    /// in unit-aligned pieces on several cores at once.
    fn crypt(&self, buf: &mut [u8], off: u64, enc: bool) {
        let unit = self.seg.sector_size as usize;
        let parts = cores().min(buf.len() / CRYPT_PIECE_MIN);
        if buf.len() < self.split_min || parts < 2 {
            self.crypt_piece(buf, off, enc);
            return;
        }
        let per = buf.len().div_ceil(parts).next_multiple_of(unit);
        let jobs: Vec<(u64, &mut [u8])> = buf
            .chunks_mut(per)
            .enumerate()
            .map(|(i, piece)| (off + (i * per) as u64, piece))
            .collect();
        cairn_block::overlap::overlap(jobs, |(o, piece)| self.crypt_piece(piece, o, enc));
    }

    fn crypt_piece(&self, buf: &mut [u8], off: u64, enc: bool) {
        let unit = self.seg.sector_size as usize;
        if enc {
            self.cipher.encrypt(buf, unit, self.iv(off));
        } else {
            self.cipher.decrypt(buf, unit, self.iv(off));
        }
    }

    /// The IV (in 512-byte units) of the unit at payload offset `off`.
    fn iv(&self, off: u64) -> u64 {
        (off / 512).wrapping_add(self.seg.iv_tweak)
    }
}

impl BlockDevice for CryptDevice {
    fn geometry(&self) -> Geometry {
        self.geometry
    }

    fn capabilities(&self) -> Capabilities {
        let c = self.below.capabilities();
        Capabilities {
            read_only: c.read_only,
            flush: c.flush,
            fua: c.fua,
            discard: if self.seg.allow_discards {
                c.discard
            } else {
                Support::None
            },
            write_zeroes: Support::Emulate,
            extents: false,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        debug_assert!(offset.is_multiple_of(u64::from(self.geometry.logical_block_size)));
        debug_assert!(buf
            .len()
            .is_multiple_of(self.geometry.logical_block_size as usize));
        self.below.read_at(buf, self.seg.offset + offset)?;
        self.crypt(buf, offset, false);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        debug_assert!(offset.is_multiple_of(u64::from(self.geometry.logical_block_size)));
        debug_assert!(buf
            .len()
            .is_multiple_of(self.geometry.logical_block_size as usize));
        let mut scratch = SCRATCH.take();
        let mut result = Ok(());
        let mut off = offset;
        for piece in buf.chunks(WRITE_CHUNK) {
            scratch.clear();
            scratch.extend_from_slice(piece);
            self.crypt(&mut scratch, off, true);
            result = self.below.write_at(&scratch, self.seg.offset + off, flags);
            if result.is_err() {
                break;
            }
            off += piece.len() as u64;
        }
        if scratch.capacity() <= WRITE_CHUNK {
            SCRATCH.set(scratch);
        }
        result
    }

    fn flush(&self) -> Result<()> {
        self.below.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        if !self.seg.allow_discards {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "discard (the LUKS header does not allow discards)",
            ));
        }
        self.below.discard(self.seg.offset + offset, len)
    }

    fn cache(&self, offset: u64, len: u64) -> Result<()> {
        self.below.cache(self.seg.offset + offset, len)
    }
}
