//! The node's metadata on its backing device, as [`MetaIo`]: internal metadata at the
//! end, after the data.
//!
//! ```text
//!   [ data: 0 .. data_size ) [ bitmap slot 0 ] .. [ bitmap slot N-1 ] [ activity log ] [ superblock ]
//!                             one bit per bm_block, each slot          one bit per       last 4096
//!                             rounded up to 4 KiB                      al_extent,        bytes
//!                                                                      rounded to 4 KiB
//! ```
//!
//! Superblock (4096 bytes, little-endian; docs/replication.md has the same table):
//!
//! | offset | size | field |
//! |---:|---:|---|
//! | 0 | 8 | magic `CAIRNRPL` |
//! | 8 | 4 | version 1 |
//! | 12 | 4 | flags: bit 0 CONSISTENT, 1 PRIMARY, 2 CRASHED_PRIMARY; others zero |
//! | 16 | 8 | data_size (bytes; a multiple of bm_block) |
//! | 24 | 4 | bm_block (bytes per bitmap bit; power of two, >= 4096) |
//! | 28 | 4 | al_extent (bytes per activity-log extent; power of two, multiple of bm_block) |
//! | 32 | 4 | max_peers (1..=3) |
//! | 36 | 4 | zero |
//! | 40 | 8 | current generation |
//! | 48 | 16 | history generations, newest first |
//! | 64 | 8 | fencing epoch |
//! | 72 | 16 | fence: resource id of the admitted primary (zero: none) |
//! | 88 | 8 | fence: generation (epoch) of the admitted primary |
//! | 96 | 8 | fence: owner instance |
//! | 104 | 32 | fence: owner node name, NUL padded |
//! | 136 | 3 × 48 | peer slots: name (40 bytes, NUL padded), bitmap generation (8) |
//! | 280 | 3812 | zero |
//! | 4092 | 4 | CRC32C of bytes 0..4092 |
//!
//! The layout (where the bitmaps and the log start) is derived from the device size and
//! the fields above, never stored, so it cannot disagree with them.

use std::sync::Arc;

use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};
use cairn_nbd::fence::{FenceToken, OwnerId};

use crate::gen::JUST_CREATED;
use crate::node::{MetaIo, Persisted, Slot};

const MAGIC: &[u8; 8] = b"CAIRNRPL";
const VERSION: u32 = 1;
const SUPER: u64 = 4096;
const PAGE: u64 = 4096;
const F_CONSISTENT: u32 = 1;
const F_PRIMARY: u32 = 2;
const F_CRASHED: u32 = 4;
const SLOTS: usize = 3;
const SLOT_AT: usize = 136;
const SLOT_LEN: usize = 48;
const NAME_LEN: usize = 40;
const CRC_AT: usize = 4092;

/// Where everything is, derived from the device size and the geometry fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub data_size: u64,
    pub bm_block: u64,
    pub al_extent: u64,
    pub max_peers: usize,
    pub bitmap_offset: u64,
    /// Bytes of one peer's bitmap (whole pages).
    pub bitmap_bytes: u64,
    pub al_offset: u64,
    pub al_bytes: u64,
    pub super_offset: u64,
}

impl Layout {
    /// The largest data area that fits on `device` bytes with this geometry.
    pub fn internal(
        device: u64,
        bm_block: u64,
        al_extent: u64,
        max_peers: usize,
    ) -> std::result::Result<Layout, String> {
        if !bm_block.is_power_of_two() || bm_block < 4096 {
            return Err(format!(
                "bitmap block {bm_block} must be a power of two of at least 4096"
            ));
        }
        if !al_extent.is_power_of_two() || al_extent < bm_block {
            return Err(format!("activity-log extent {al_extent} must be a power of two of at least the bitmap block"));
        }
        if !(1..=SLOTS).contains(&max_peers) {
            return Err(format!("max peers {max_peers} must be 1 to {SLOTS}"));
        }
        let usable = device
            .checked_sub(SUPER)
            .ok_or("the device is smaller than the 4 KiB superblock")?;
        // Metadata for d bytes of data: bitmaps and log rounded up to pages.
        let meta = |d: u64| {
            let bm = d.div_ceil(bm_block).div_ceil(8).div_ceil(PAGE) * PAGE;
            let al = d.div_ceil(al_extent).div_ceil(8).div_ceil(PAGE).max(1) * PAGE;
            bm * max_peers as u64 + al
        };
        // Start from an over-estimate and shrink by whole blocks until it fits.
        let mut data = usable / bm_block * bm_block;
        while data > 0 && data + meta(data) > usable {
            let over = data + meta(data) - usable;
            data = data.saturating_sub(over.div_ceil(bm_block).max(1) * bm_block);
        }
        if data == 0 {
            return Err(format!(
                "a device of {device} bytes has no room for data after the replication metadata"
            ));
        }
        Layout::for_data(device, data, bm_block, al_extent, max_peers)
    }

    fn for_data(
        device: u64,
        data: u64,
        bm_block: u64,
        al_extent: u64,
        max_peers: usize,
    ) -> std::result::Result<Layout, String> {
        let bitmap_bytes = data.div_ceil(bm_block).div_ceil(8).div_ceil(PAGE) * PAGE;
        let al_bytes = data.div_ceil(al_extent).div_ceil(8).div_ceil(PAGE).max(1) * PAGE;
        let super_offset = device.checked_sub(SUPER).ok_or("device too small")?;
        let al_offset = super_offset
            .checked_sub(al_bytes)
            .ok_or("device too small")?;
        let bitmap_offset = al_offset
            .checked_sub(bitmap_bytes * max_peers as u64)
            .ok_or("device too small")?;
        if bitmap_offset < data {
            return Err(format!(
                "the metadata records {data} bytes of data, but the device ({device} bytes) has room for {bitmap_offset}: was it shrunk?"
            ));
        }
        Ok(Layout {
            data_size: data,
            bm_block,
            al_extent,
            max_peers,
            bitmap_offset,
            bitmap_bytes,
            al_offset,
            al_bytes,
            super_offset,
        })
    }
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_le_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

fn name_from(b: &[u8], what: &str) -> std::result::Result<String, String> {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    if b[end..].iter().any(|&c| c != 0) {
        return Err(format!("{what}: bytes after the name's NUL"));
    }
    String::from_utf8(b[..end].to_vec()).map_err(|_| format!("{what}: not UTF-8"))
}

fn put_name(b: &mut [u8], name: &str, what: &str) -> std::result::Result<(), String> {
    if name.len() > b.len() || name.contains('\0') {
        return Err(format!(
            "{what} {name:?} must be at most {} bytes without NUL",
            b.len()
        ));
    }
    b[..name.len()].copy_from_slice(name.as_bytes());
    Ok(())
}

/// The geometry fields and the persisted state of a superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Super {
    pub data_size: u64,
    pub bm_block: u64,
    pub al_extent: u64,
    pub max_peers: usize,
    pub state: Persisted,
}

impl Super {
    pub fn encode(&self) -> std::result::Result<Vec<u8>, String> {
        let mut b = vec![0u8; 4096];
        b[0..8].copy_from_slice(MAGIC);
        put32(&mut b, 8, VERSION);
        let p = &self.state;
        let flags = (if p.consistent { F_CONSISTENT } else { 0 })
            | (if p.primary { F_PRIMARY } else { 0 })
            | (if p.crashed_primary { F_CRASHED } else { 0 });
        put32(&mut b, 12, flags);
        put64(&mut b, 16, self.data_size);
        put32(
            &mut b,
            24,
            u32::try_from(self.bm_block).map_err(|_| "bitmap block too large")?,
        );
        put32(
            &mut b,
            28,
            u32::try_from(self.al_extent).map_err(|_| "activity-log extent too large")?,
        );
        put32(
            &mut b,
            32,
            u32::try_from(self.max_peers).map_err(|_| "too many peers")?,
        );
        put64(&mut b, 40, p.current);
        put64(&mut b, 48, p.history[0]);
        put64(&mut b, 56, p.history[1]);
        put64(&mut b, 64, p.epoch);
        if let Some(t) = &p.fence {
            b[72..88].copy_from_slice(&t.array);
            put64(&mut b, 88, t.generation);
            put64(&mut b, 96, t.owner.instance);
            put_name(&mut b[104..136], &t.owner.node, "fence owner")?;
        }
        if p.peers.len() > self.max_peers {
            return Err("more peer slots than max_peers".into());
        }
        for (i, s) in p.peers.iter().enumerate() {
            let at = SLOT_AT + i * SLOT_LEN;
            put_name(&mut b[at..at + NAME_LEN], &s.name, "peer name")?;
            put64(&mut b, at + NAME_LEN, s.bitmap_uuid);
        }
        let crc = crc32c::crc32c(&b[..CRC_AT]);
        put32(&mut b, CRC_AT, crc);
        Ok(b)
    }

    pub fn decode(b: &[u8]) -> std::result::Result<Super, String> {
        if b.len() != 4096 {
            return Err(format!("superblock of {} bytes, expected 4096", b.len()));
        }
        if &b[0..8] != MAGIC {
            return Err("no cairn replication metadata (magic CAIRNRPL not found)".into());
        }
        let crc = le32(b, CRC_AT);
        if crc != crc32c::crc32c(&b[..CRC_AT]) {
            return Err("checksum mismatch: the superblock is damaged".into());
        }
        let version = le32(b, 8);
        if version != VERSION {
            return Err(format!(
                "version {version}: this cairn reads version {VERSION}"
            ));
        }
        let flags = le32(b, 12);
        if flags & !(F_CONSISTENT | F_PRIMARY | F_CRASHED) != 0 {
            return Err(format!("unknown flags {flags:#x}"));
        }
        let bm_block = u64::from(le32(b, 24));
        let al_extent = u64::from(le32(b, 28));
        let max_peers = usize::try_from(le32(b, 32)).map_err(|_| "max_peers")?;
        if !bm_block.is_power_of_two() || bm_block < 4096 {
            return Err(format!(
                "bitmap block {bm_block} is not a power of two of at least 4096"
            ));
        }
        if !al_extent.is_power_of_two() || al_extent < bm_block {
            return Err(format!("activity-log extent {al_extent} is not a power of two of at least the bitmap block"));
        }
        if !(1..=SLOTS).contains(&max_peers) {
            return Err(format!("max_peers {max_peers} is not 1 to {SLOTS}"));
        }
        let data_size = le64(b, 16);
        if data_size == 0 || !data_size.is_multiple_of(bm_block) {
            return Err(format!(
                "data size {data_size} is not a positive multiple of the bitmap block"
            ));
        }
        if le32(b, 36) != 0
            || b[SLOT_AT + SLOTS * SLOT_LEN..CRC_AT]
                .iter()
                .any(|&c| c != 0)
        {
            return Err("reserved bytes are not zero".into());
        }
        let fence_gen = le64(b, 88);
        let fence = if b[72..136].iter().all(|&c| c == 0) {
            None
        } else {
            Some(FenceToken {
                array: b[72..88].try_into().expect("16 bytes"),
                generation: fence_gen,
                owner: OwnerId {
                    node: name_from(&b[104..136], "fence owner")?,
                    instance: le64(b, 96),
                },
            })
        };
        let mut peers = Vec::new();
        for i in 0..SLOTS {
            let at = SLOT_AT + i * SLOT_LEN;
            let name = name_from(&b[at..at + NAME_LEN], "peer name")?;
            let bitmap_uuid = le64(b, at + NAME_LEN);
            if i >= max_peers {
                if !name.is_empty() || bitmap_uuid != 0 {
                    return Err(format!(
                        "peer slot {i} is used but max_peers is {max_peers}"
                    ));
                }
                continue;
            }
            peers.push(Slot { name, bitmap_uuid });
        }
        Ok(Super {
            data_size,
            bm_block,
            al_extent,
            max_peers,
            state: Persisted {
                current: le64(b, 40),
                history: [le64(b, 48), le64(b, 56)],
                consistent: flags & F_CONSISTENT != 0,
                primary: flags & F_PRIMARY != 0,
                crashed_primary: flags & F_CRASHED != 0,
                epoch: le64(b, 64),
                fence,
                peers,
            },
        })
    }
}

#[derive(Clone, Debug)]
pub struct CreateParams {
    pub max_peers: u32,
    pub bm_block: u64,
    pub al_extent: u64,
    pub force: bool,
}

#[derive(Clone, Copy, Debug)]
pub struct Created {
    pub data_size: u64,
    pub metadata_bytes: u64,
}

fn corrupt(m: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, m)
}

fn read_super(dev: &dyn BlockDevice) -> Result<Option<std::result::Result<Super, String>>> {
    let size = dev.geometry().size;
    if size < SUPER {
        return Ok(None);
    }
    let mut b = vec![0u8; 4096];
    dev.read_at(&mut b, size - SUPER)?;
    if &b[0..8] != MAGIC {
        return Ok(None);
    }
    Ok(Some(Super::decode(&b)))
}

/// `create-md`: zeroed bitmaps and log, then the superblock (last, so a crash midway
/// leaves no superblock pointing at garbage).
pub fn create(dev: &dyn BlockDevice, p: &CreateParams) -> Result<Created> {
    let size = dev.geometry().size;
    if !p.force {
        match read_super(dev)? {
            Some(Ok(_)) => {
                return Err(Error::new(ErrorKind::Busy, "replication metadata is already there (--force writes over it, and forgets what is out of sync)"))
            }
            Some(Err(e)) => {
                return Err(Error::new(ErrorKind::Busy, format!("damaged replication metadata is there ({e}); --force writes over it")))
            }
            None => {}
        }
    }
    let max_peers = usize::try_from(p.max_peers).unwrap_or(usize::MAX);
    let l = Layout::internal(size, p.bm_block, p.al_extent, max_peers)
        .map_err(|e| Error::new(ErrorKind::InvalidArgument, e))?;
    dev.write_zeroes(
        l.bitmap_offset,
        l.super_offset - l.bitmap_offset,
        WriteFlags::NONE,
    )?;
    let sb = Super {
        data_size: l.data_size,
        bm_block: l.bm_block,
        al_extent: l.al_extent,
        max_peers,
        state: Persisted {
            current: JUST_CREATED,
            history: [0, 0],
            consistent: true,
            primary: false,
            crashed_primary: false,
            epoch: 0,
            fence: None,
            peers: vec![Slot::default(); max_peers],
        },
    };
    dev.flush()?;
    let b = sb
        .encode()
        .map_err(|e| Error::new(ErrorKind::InvalidArgument, e))?;
    dev.write_at(&b, l.super_offset, WriteFlags::FUA)?;
    Ok(Created {
        data_size: l.data_size,
        metadata_bytes: size - l.data_size,
    })
}

/// The metadata of an opened backing device.
#[derive(Debug)]
pub struct Store {
    dev: Arc<dyn BlockDevice>,
    layout: Layout,
    max_peers: usize,
}

impl Store {
    pub fn open(dev: Arc<dyn BlockDevice>) -> Result<Store> {
        let size = dev.geometry().size;
        let sb = match read_super(dev.as_ref())? {
            None => return Err(Error::new(ErrorKind::NotFound, "no cairn replication metadata at the end of the disk (create it with `cairn repl create-md`)")),
            Some(Err(e)) => return Err(corrupt(format!("replication metadata: {e}"))),
            Some(Ok(sb)) => sb,
        };
        let layout = Layout::for_data(size, sb.data_size, sb.bm_block, sb.al_extent, sb.max_peers)
            .map_err(corrupt)?;
        Ok(Store {
            dev,
            layout,
            max_peers: sb.max_peers,
        })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }

    fn words_at(&self, offset: u64, bytes: u64) -> Result<Vec<u64>> {
        let mut b = vec![0u8; usize::try_from(bytes).map_err(|_| corrupt("bitmap too large"))?];
        self.dev.read_at(&mut b, offset)?;
        Ok(b.chunks_exact(8)
            .map(|c| u64::from_le_bytes(c.try_into().expect("8")))
            .collect())
    }
}

fn bytes_of(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

impl MetaIo for Store {
    fn data_size(&self) -> u64 {
        self.layout.data_size
    }
    fn bm_block(&self) -> u64 {
        self.layout.bm_block
    }
    fn al_extent(&self) -> u64 {
        self.layout.al_extent
    }
    fn max_peers(&self) -> usize {
        self.max_peers
    }

    fn load(&self) -> Result<Persisted> {
        match read_super(self.dev.as_ref())? {
            Some(Ok(sb)) => Ok(sb.state),
            Some(Err(e)) => Err(corrupt(format!("replication metadata: {e}"))),
            None => Err(corrupt("replication metadata vanished")),
        }
    }

    fn save(&self, p: &Persisted) -> Result<()> {
        let sb = Super {
            data_size: self.layout.data_size,
            bm_block: self.layout.bm_block,
            al_extent: self.layout.al_extent,
            max_peers: self.max_peers,
            state: p.clone(),
        };
        let b = sb
            .encode()
            .map_err(|e| Error::new(ErrorKind::InvalidArgument, e))?;
        self.dev
            .write_at(&b, self.layout.super_offset, WriteFlags::FUA)
    }

    fn read_bitmap(&self, slot: usize) -> Result<Vec<u64>> {
        self.words_at(
            self.layout.bitmap_offset + slot as u64 * self.layout.bitmap_bytes,
            self.layout.bitmap_bytes,
        )
    }

    fn write_bitmap_pages(&self, slot: usize, pages: &[(usize, Vec<u64>)]) -> Result<()> {
        let base = self.layout.bitmap_offset + slot as u64 * self.layout.bitmap_bytes;
        for (page, words) in pages {
            let mut b = bytes_of(words);
            b.resize(4096, 0);
            let at = *page as u64 * PAGE;
            if at >= self.layout.bitmap_bytes {
                continue;
            }
            self.dev.write_at(&b, base + at, WriteFlags::NONE)?;
        }
        if !pages.is_empty() {
            self.dev.flush()?;
        }
        Ok(())
    }

    fn read_al(&self) -> Result<Vec<u64>> {
        let words = self.words_at(self.layout.al_offset, self.layout.al_bytes)?;
        let extents = self.layout.data_size.div_ceil(self.layout.al_extent);
        let mut out = Vec::new();
        for (i, w) in words.iter().enumerate() {
            let mut w = *w;
            while w != 0 {
                let e = i as u64 * 64 + u64::from(w.trailing_zeros());
                w &= w - 1;
                if e < extents {
                    out.push(e);
                }
            }
        }
        Ok(out)
    }

    fn write_al(&self, active: &[u64]) -> Result<()> {
        let n = usize::try_from(self.layout.al_bytes / 8).map_err(|_| corrupt("log too large"))?;
        let mut words = vec![0u64; n];
        for &e in active {
            if let Some(w) = words.get_mut(usize::try_from(e / 64).unwrap_or(usize::MAX)) {
                *w |= 1 << (e % 64);
            }
        }
        self.dev
            .write_at(&bytes_of(&words), self.layout.al_offset, WriteFlags::FUA)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_block::MemDisk;

    fn sample() -> Super {
        Super {
            data_size: 1 << 30,
            bm_block: 4096,
            al_extent: 4 << 20,
            max_peers: 2,
            state: Persisted {
                current: 0x1234_5678_9abc_def0,
                history: [10, 20],
                consistent: true,
                primary: true,
                crashed_primary: false,
                epoch: 7,
                fence: Some(FenceToken {
                    array: [9; 16],
                    generation: 7,
                    owner: OwnerId {
                        node: "a".into(),
                        instance: 42,
                    },
                }),
                peers: vec![
                    Slot {
                        name: "b".into(),
                        bitmap_uuid: 10,
                    },
                    Slot::default(),
                ],
            },
        }
    }

    #[test]
    fn superblock_round_trips_and_every_flipped_bit_is_caught() {
        let s = sample();
        let b = s.encode().unwrap();
        assert_eq!(Super::decode(&b).unwrap(), s);
        for bit in 0..(4096 * 8) {
            let mut c = b.clone();
            c[bit / 8] ^= 1 << (bit % 8);
            assert!(
                Super::decode(&c).is_err(),
                "bit {bit} flipped went unnoticed"
            );
        }
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        use rand::{RngCore, SeedableRng};
        for _ in 0..2000 {
            let mut b = vec![0u8; 4096];
            rng.fill_bytes(&mut b);
            b[0..8].copy_from_slice(MAGIC);
            let crc = crc32c::crc32c(&b[..CRC_AT]);
            put32(&mut b, CRC_AT, crc);
            let _ = Super::decode(&b);
        }
    }

    #[test]
    fn layout_fits_and_create_open_save_load_round_trip() {
        for size in [1u64 << 20, (64 << 20) + 12345, 10 << 30] {
            let l = Layout::internal(size, 4096, 4 << 20, 2).unwrap();
            assert!(l.data_size <= l.bitmap_offset);
            assert_eq!(l.super_offset + 4096, size);
            assert!(l.bitmap_bytes * 8 * 4096 >= l.data_size);
        }
        assert!(Layout::internal(8192, 4096, 4 << 20, 1).is_err());
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(64 << 20));
        let c = create(
            dev.as_ref(),
            &CreateParams {
                max_peers: 2,
                bm_block: 4096,
                al_extent: 1 << 20,
                force: false,
            },
        )
        .unwrap();
        assert!(create(
            dev.as_ref(),
            &CreateParams {
                max_peers: 2,
                bm_block: 4096,
                al_extent: 1 << 20,
                force: false
            }
        )
        .is_err());
        let st = Store::open(dev.clone()).unwrap();
        assert_eq!(st.data_size(), c.data_size);
        let mut p = st.load().unwrap();
        assert_eq!(p.current, JUST_CREATED);
        p.epoch = 3;
        p.peers[1].name = "c".into();
        st.save(&p).unwrap();
        assert_eq!(Store::open(dev.clone()).unwrap().load().unwrap(), p);
        st.write_al(&[0, 5, 63]).unwrap();
        assert_eq!(st.read_al().unwrap(), vec![0, 5, 63]);
        st.write_bitmap_pages(1, &[(0, vec![0b101])]).unwrap();
        assert_eq!(st.read_bitmap(1).unwrap()[0], 0b101);
        assert_eq!(st.read_bitmap(0).unwrap()[0], 0);
    }

    #[test]
    fn a_disk_without_metadata_is_named() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(1 << 20));
        let e = Store::open(dev).unwrap_err();
        assert!(e.to_string().contains("create-md"), "{e}");
    }
}
