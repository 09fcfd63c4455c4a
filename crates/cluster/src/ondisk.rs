//! The owner record: which owner, at which generation, holds an array's member.
//!
//! It lives in the first 4 KiB of each member, the bytes an md v1.2 member leaves unused
//! (the superblock starts at byte 4096; mdadm and the kernel never write before it), so
//! `mdadm --examine` and assembly from local copies of the members are unaffected.
//! Little-endian, like md's superblock. Byte by byte (docs/fencing.md says the same):
//!
//! ```text
//!   off len  field
//!     0   8  magic       "CAIRNOWN"
//!     8   4  version     1
//!    12   4  length      128: bytes the checksum covers, checksum included
//!    16  16  array       md array UUID (as in the superblock's set_uuid)
//!    32   8  generation  >= 1; raised by every new owner
//!    40   8  instance    random, drawn when the owning process started
//!    48  32  node        owner's node name, UTF-8, NUL padded
//!    80   8  since       Unix seconds when this generation was taken
//!    88   4  flags       bit 0: released (the owner stopped cleanly); others zero
//!    92  32  reserved    zero
//!   124   4  checksum    CRC32C of bytes 0..124
//!   128 ...  zero up to 4096
//! ```

use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};
use cairn_nbd::fence::{FenceStore, FenceToken, OwnerId, Stored, NODE_LEN};

/// Bytes at the start of a member the record area takes.
pub const RECORD_AREA: u64 = 4096;
/// Bytes of the record itself.
pub const RECORD_LEN: usize = 128;
pub const MAGIC: [u8; 8] = *b"CAIRNOWN";
pub const VERSION: u32 = 1;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = OFF_MAGIC + 8;
const OFF_LENGTH: usize = OFF_VERSION + 4;
const OFF_ARRAY: usize = OFF_LENGTH + 4;
const OFF_GENERATION: usize = OFF_ARRAY + 16;
const OFF_INSTANCE: usize = OFF_GENERATION + 8;
const OFF_NODE: usize = OFF_INSTANCE + 8;
const OFF_SINCE: usize = OFF_NODE + NODE_LEN;
const OFF_FLAGS: usize = OFF_SINCE + 8;
const OFF_RESERVED: usize = OFF_FLAGS + 4;
const OFF_CHECKSUM: usize = OFF_RESERVED + 32;

/// `flags` bit: the owner gave the member up cleanly; the next owner needs no force.
pub const FLAG_RELEASED: u32 = 1;
const _: () = assert!(OFF_CHECKSUM + 4 == RECORD_LEN);
const _: () = assert!(RECORD_LEN as u64 <= RECORD_AREA);

/// A parsed owner record.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct OwnerRecord {
    pub token: FenceToken,
    /// Unix seconds when the generation was taken.
    pub since: u64,
    /// The owner stopped cleanly and gave the member up.
    pub released: bool,
}

/// Why bytes are not an owner record.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum DecodeError {
    /// No record magic: the area holds something else (the text says what it looks like).
    NotARecord(String),
    /// The magic is there but a field is wrong: a damaged record.
    Corrupt(String),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::NotARecord(m) => write!(f, "not an owner record: {m}"),
            DecodeError::Corrupt(m) => write!(f, "damaged owner record: {m}"),
        }
    }
}

fn le32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

fn le64(b: &[u8], o: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[o..o + 8]);
    u64::from_le_bytes(x)
}

impl OwnerRecord {
    /// The record as it is written: [`RECORD_AREA`] bytes, zero after the record.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; usize::try_from(RECORD_AREA).expect("4096")];
        b[OFF_MAGIC..OFF_VERSION].copy_from_slice(&MAGIC);
        b[OFF_VERSION..OFF_LENGTH].copy_from_slice(&VERSION.to_le_bytes());
        let len = u32::try_from(RECORD_LEN).expect("128");
        b[OFF_LENGTH..OFF_ARRAY].copy_from_slice(&len.to_le_bytes());
        b[OFF_ARRAY..OFF_GENERATION].copy_from_slice(&self.token.array);
        b[OFF_GENERATION..OFF_INSTANCE].copy_from_slice(&self.token.generation.to_le_bytes());
        b[OFF_INSTANCE..OFF_NODE].copy_from_slice(&self.token.owner.instance.to_le_bytes());
        b[OFF_NODE..OFF_SINCE].copy_from_slice(&self.token.owner.node_bytes());
        b[OFF_SINCE..OFF_FLAGS].copy_from_slice(&self.since.to_le_bytes());
        let flags = if self.released { FLAG_RELEASED } else { 0 };
        b[OFF_FLAGS..OFF_RESERVED].copy_from_slice(&flags.to_le_bytes());
        let crc = crc32c::crc32c(&b[..OFF_CHECKSUM]);
        b[OFF_CHECKSUM..RECORD_LEN].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Parses the record area (at least [`RECORD_LEN`] bytes). `Ok(None)`: all zero,
    /// never owned.
    pub fn decode(b: &[u8]) -> std::result::Result<Option<OwnerRecord>, DecodeError> {
        if b.len() < RECORD_LEN {
            return Err(DecodeError::NotARecord(format!(
                "{} bytes is shorter than a record",
                b.len()
            )));
        }
        if b[OFF_MAGIC..OFF_VERSION] != MAGIC {
            if b.iter().all(|&x| x == 0) {
                return Ok(None);
            }
            return Err(DecodeError::NotARecord(describe_foreign(b)));
        }
        let corrupt = |m: String| Err(DecodeError::Corrupt(m));
        let crc = le32(b, OFF_CHECKSUM);
        let want = crc32c::crc32c(&b[..OFF_CHECKSUM]);
        if crc != want {
            return corrupt(format!("checksum {crc:#010x}, computed {want:#010x}"));
        }
        let version = le32(b, OFF_VERSION);
        if version != VERSION {
            return corrupt(format!("version {version} is not {VERSION}"));
        }
        let len = le32(b, OFF_LENGTH);
        if u64::from(len) != RECORD_LEN as u64 {
            return corrupt(format!("length {len} is not {RECORD_LEN}"));
        }
        let flags = le32(b, OFF_FLAGS);
        if flags & !FLAG_RELEASED != 0 {
            return corrupt(format!("unknown flags {flags:#x}"));
        }
        if b[OFF_RESERVED..OFF_CHECKSUM].iter().any(|&x| x != 0) {
            return corrupt("reserved bytes are not zero".into());
        }
        let generation = le64(b, OFF_GENERATION);
        if generation == 0 {
            return corrupt("generation 0".into());
        }
        let mut node = [0u8; NODE_LEN];
        node.copy_from_slice(&b[OFF_NODE..OFF_SINCE]);
        let node = OwnerId::node_from_bytes(&node).map_err(DecodeError::Corrupt)?;
        let mut array = [0u8; 16];
        array.copy_from_slice(&b[OFF_ARRAY..OFF_GENERATION]);
        Ok(Some(OwnerRecord {
            token: FenceToken {
                array,
                generation,
                owner: OwnerId {
                    node,
                    instance: le64(b, OFF_INSTANCE),
                },
            },
            since: le64(b, OFF_SINCE),
            released: flags & FLAG_RELEASED != 0,
        }))
    }

    /// Reads the record of a member.
    pub fn read(
        dev: &dyn BlockDevice,
    ) -> Result<std::result::Result<Option<OwnerRecord>, DecodeError>> {
        let mut b = vec![0u8; usize::try_from(RECORD_AREA).expect("4096")];
        if dev.geometry().size < RECORD_AREA {
            return Ok(Err(DecodeError::NotARecord(
                "the member is smaller than the record area".into(),
            )));
        }
        // A member with bad sectors (a server that fails some reads) may fail one read
        // and answer the next: three tries before the record counts as unreadable. A
        // member that is gone fails all three at once.
        let mut tries = 0;
        loop {
            match dev.read_at(&mut b, 0) {
                Ok(()) => break,
                Err(e) if tries < 2 && e.kind() == cairn_block::ErrorKind::Io => tries += 1,
                Err(e) => return Err(e),
            }
        }
        Ok(OwnerRecord::decode(&b))
    }

    /// Writes the record to a member, durable (FUA) before it returns.
    pub fn write(&self, dev: &dyn BlockDevice) -> Result<()> {
        dev.write_at(&self.encode(), 0, WriteFlags::FUA)
    }
}

/// A short guess at what occupies the area, for messages.
fn describe_foreign(b: &[u8]) -> String {
    if b.len() >= 6 && &b[..6] == b"LUKS\xba\xbe" {
        return "a LUKS header".into();
    }
    if b.len() >= 520 && &b[512..520] == b"LABELONE" {
        return "an LVM physical volume label".into();
    }
    if b.len() >= 512 && b[510] == 0x55 && b[511] == 0xaa {
        return "a partition table or boot sector".into();
    }
    "data that is not an owner record".into()
}

/// Seconds since the Unix epoch, for `since`.
pub fn now_unix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The owner record as a member server's [`FenceStore`]: `cairn serve` in the disk-host
/// role persists the generations it admits here.
#[derive(Debug, Default, Clone, Copy)]
pub struct RecordStore;

impl FenceStore for RecordStore {
    fn reserved(&self) -> u64 {
        RECORD_AREA
    }

    fn load(&self, dev: &dyn BlockDevice) -> Result<Stored> {
        match OwnerRecord::read(dev)? {
            Ok(None) => Ok(Stored::Blank),
            Ok(Some(r)) => Ok(Stored::Owner(r.token)),
            Err(DecodeError::NotARecord(what)) => Ok(Stored::Foreign(what)),
            // A damaged record must not read as "never owned": that would let any writer in.
            Err(e @ DecodeError::Corrupt(_)) => Err(Error::new(ErrorKind::Corrupt, e.to_string())),
        }
    }

    fn store(&self, dev: &dyn BlockDevice, token: &FenceToken, released: bool) -> Result<()> {
        // A release keeps the time the generation was taken.
        let since = match OwnerRecord::read(dev)? {
            Ok(Some(r)) if released && r.token.same_owner(token) => r.since,
            _ => now_unix(),
        };
        OwnerRecord {
            token: token.clone(),
            since,
            released,
        }
        .write(dev)
    }
}

/// A member server's record store that also keeps records beside its exports, for
/// owners that use a whole export (a LUKS volume, an LVM PV, an export served as it is:
/// `FENCE_FLAG_WHOLE`), whose first bytes are the owner's data. Each such record is a
/// file of its own (the same 4096 bytes as in a member), written to a temporary name,
/// synced and renamed over the old one, so a crash leaves the old record or the new one.
/// Exports without a file here keep their record in their first 4 KiB ([`RecordStore`]).
#[derive(Debug, Default, Clone)]
pub struct MemberStore {
    /// Export name -> the file its record is kept in, once an owner of the whole export
    /// has declared itself.
    beside: std::collections::HashMap<String, std::path::PathBuf>,
}

impl MemberStore {
    /// A store keeping the records of whole-export owners of `export` at `path`.
    pub fn new(beside: impl IntoIterator<Item = (String, std::path::PathBuf)>) -> MemberStore {
        MemberStore {
            beside: beside.into_iter().collect(),
        }
    }

    fn path(&self, export: &str) -> Result<&std::path::Path> {
        self.beside.get(export).map(|p| p.as_path()).ok_or_else(|| {
            Error::new(
                ErrorKind::Unsupported,
                format!("export {export:?}: no place to keep an owner record beside it"),
            )
        })
    }

    /// The bytes of the record kept beside `export`, when there is one.
    fn read_beside(&self, export: &str) -> Result<Option<Vec<u8>>> {
        let Some(p) = self.beside.get(export) else {
            return Ok(None);
        };
        match std::fs::read(p) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::new(
                ErrorKind::Io,
                format!("reading the owner record {}: {e}", p.display()),
            )),
        }
    }
}

fn decoded_beside(b: &[u8], export: &str) -> Result<Stored> {
    match OwnerRecord::decode(b) {
        Ok(Some(r)) => Ok(Stored::Owner(r.token)),
        Ok(None) => Ok(Stored::Blank),
        Err(e) => Err(Error::new(
            ErrorKind::Corrupt,
            format!("export {export:?}: the owner record kept beside it: {e}"),
        )),
    }
}

impl FenceStore for MemberStore {
    fn reserved(&self) -> u64 {
        RECORD_AREA
    }

    fn load(&self, dev: &dyn BlockDevice) -> Result<Stored> {
        RecordStore.load(dev)
    }

    fn store(&self, dev: &dyn BlockDevice, token: &FenceToken, released: bool) -> Result<()> {
        RecordStore.store(dev, token, released)
    }

    fn load_beside(&self, export: &str) -> Result<Option<Stored>> {
        match self.read_beside(export)? {
            Some(b) => decoded_beside(&b, export).map(Some),
            None => Ok(None),
        }
    }

    fn released_beside(&self, export: &str) -> Result<bool> {
        Ok(self
            .read_beside(export)?
            .and_then(|b| OwnerRecord::decode(&b).ok().flatten())
            .is_some_and(|r| r.released))
    }

    fn store_beside(&self, export: &str, token: &FenceToken, released: bool) -> Result<()> {
        use std::io::Write;
        let path = self.path(export)?;
        let old = self
            .read_beside(export)?
            .and_then(|b| OwnerRecord::decode(&b).ok().flatten());
        let since = match old {
            Some(r) if released && r.token.same_owner(token) => r.since,
            _ => now_unix(),
        };
        let bytes = OwnerRecord {
            token: token.clone(),
            since,
            released,
        }
        .encode();
        let io = |what: &str, e: std::io::Error| {
            Error::new(
                ErrorKind::Io,
                format!("{what} the owner record {}: {e}", path.display()),
            )
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| io("making the directory of", e))?;
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(".new");
        let tmp = std::path::PathBuf::from(tmp);
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("creating", e))?;
        f.write_all(&bytes).map_err(|e| io("writing", e))?;
        f.sync_all().map_err(|e| io("syncing", e))?;
        std::fs::rename(&tmp, path).map_err(|e| io("renaming", e))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if let Ok(d) = std::fs::File::open(dir) {
                d.sync_all()
                    .map_err(|e| io("syncing the directory of", e))?;
            }
        }
        Ok(())
    }

    fn record_bytes(&self, export: &str, dev: &dyn BlockDevice) -> Result<Vec<u8>> {
        if let Some(b) = self.read_beside(export)? {
            decoded_beside(&b, export)?;
            return Ok(b);
        }
        match OwnerRecord::read(dev)? {
            Ok(Some(r)) => Ok(r.encode()),
            Ok(None) | Err(DecodeError::NotARecord(_)) => Ok(Vec::new()),
            Err(e @ DecodeError::Corrupt(_)) => Err(Error::new(ErrorKind::Corrupt, e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> OwnerRecord {
        OwnerRecord {
            token: FenceToken {
                array: *b"0123456789abcdef",
                generation: 7,
                owner: OwnerId::new("node-a", 0xfeed_beef).unwrap(),
            },
            since: 1_700_000_000,
            released: false,
        }
    }

    #[test]
    fn round_trip_and_layout() {
        let r = record();
        let b = r.encode();
        assert_eq!(b.len(), 4096);
        assert_eq!(&b[0..8], b"CAIRNOWN");
        assert_eq!(&b[16..32], b"0123456789abcdef");
        assert_eq!(le64(&b, 32), 7);
        assert_eq!(&b[48..54], b"node-a");
        assert!(b[128..].iter().all(|&x| x == 0));
        assert_eq!(OwnerRecord::decode(&b).unwrap(), Some(r.clone()));
        let rel = OwnerRecord {
            released: true,
            ..r
        };
        let b = rel.encode();
        assert_eq!(le32(&b, 88), 1);
        assert_eq!(OwnerRecord::decode(&b).unwrap(), Some(rel));
        assert_eq!(OwnerRecord::decode(&[0u8; 4096]).unwrap(), None);
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let b = record().encode();
        for i in 0..RECORD_LEN * 8 {
            let mut c = b.clone();
            c[i / 8] ^= 1 << (i % 8);
            assert!(OwnerRecord::decode(&c).is_err(), "bit {i}");
        }
    }

    #[test]
    fn malformed_records_are_clear_errors() {
        let b = record().encode();
        for n in 0..RECORD_LEN {
            assert!(OwnerRecord::decode(&b[..n]).is_err());
        }
        // Fields wrong but the checksum right: each is named.
        let fix = |mut c: Vec<u8>| {
            let crc = crc32c::crc32c(&c[..OFF_CHECKSUM]);
            c[OFF_CHECKSUM..RECORD_LEN].copy_from_slice(&crc.to_le_bytes());
            c
        };
        let mut c = b.clone();
        c[OFF_VERSION] = 2;
        assert!(OwnerRecord::decode(&fix(c))
            .unwrap_err()
            .to_string()
            .contains("version"));
        let mut c = b.clone();
        c[OFF_GENERATION..OFF_INSTANCE].fill(0);
        assert!(OwnerRecord::decode(&fix(c))
            .unwrap_err()
            .to_string()
            .contains("generation"));
        let mut c = b.clone();
        c[OFF_NODE..OFF_SINCE].fill(0xff);
        assert!(matches!(
            OwnerRecord::decode(&fix(c)),
            Err(DecodeError::Corrupt(_))
        ));
        let mut c = b.clone();
        c[OFF_FLAGS] = 2;
        assert!(OwnerRecord::decode(&fix(c))
            .unwrap_err()
            .to_string()
            .contains("flags"));
        let mut c = b.clone();
        c[OFF_RESERVED] = 1;
        assert!(OwnerRecord::decode(&fix(c))
            .unwrap_err()
            .to_string()
            .contains("reserved"));
        // Foreign formats are named, not called corrupt.
        let mut luks = vec![0u8; 4096];
        luks[..6].copy_from_slice(b"LUKS\xba\xbe");
        assert!(OwnerRecord::decode(&luks)
            .unwrap_err()
            .to_string()
            .contains("LUKS"));
        let mut lvm = vec![0u8; 4096];
        lvm[512..520].copy_from_slice(b"LABELONE");
        assert!(OwnerRecord::decode(&lvm)
            .unwrap_err()
            .to_string()
            .contains("LVM"));
    }

    #[test]
    fn random_bytes_never_panic() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let good = record().encode();
        for round in 0..2000 {
            let mut b = if round % 2 == 0 {
                good.clone()
            } else {
                vec![0u8; 4096]
            };
            let flips = 1 + next() % 16;
            for _ in 0..flips {
                let i = usize::try_from(next() % 160).unwrap();
                b[i] = next().to_le_bytes()[0];
            }
            let _ = OwnerRecord::decode(&b);
        }
    }

    #[test]
    fn store_on_a_member() {
        let dev = cairn_block::MemDisk::new(1 << 20);
        assert_eq!(RecordStore.load(&dev).unwrap(), Stored::Blank);
        let t = record().token;
        RecordStore.store(&dev, &t, false).unwrap();
        assert_eq!(RecordStore.load(&dev).unwrap(), Stored::Owner(t));
        dev.write_at(&[0xab; 4096], 0, WriteFlags::NONE).unwrap();
        assert!(matches!(
            RecordStore.load(&dev).unwrap(),
            Stored::Foreign(_)
        ));
        let mut bad = record().encode();
        bad[OFF_SINCE] ^= 1;
        dev.write_at(&bad, 0, WriteFlags::NONE).unwrap();
        assert_eq!(
            RecordStore.load(&dev).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
    }

    #[test]
    fn records_kept_beside_an_export() {
        let dir = std::env::temp_dir().join(format!("cairn-beside-{}", std::process::id()));
        let path = dir.join("sub/vol.cairn-owner");
        let st = MemberStore::new([("vol".to_string(), path.clone())]);
        let dev = cairn_block::MemDisk::new(1 << 20);
        dev.write_at(b"LUKS\xba\xbe", 0, WriteFlags::NONE).unwrap();
        assert_eq!(st.load_beside("vol").unwrap(), None);
        assert!(st.record_bytes("vol", &dev).unwrap().is_empty());
        assert!(st.store_beside("other", &record().token, false).is_err());
        let t = record().token;
        st.store_beside("vol", &t, false).unwrap();
        assert_eq!(
            st.load_beside("vol").unwrap(),
            Some(Stored::Owner(t.clone()))
        );
        // The export's own bytes are untouched.
        let mut b = [0u8; 6];
        dev.read_at(&mut b, 0).unwrap();
        assert_eq!(&b, b"LUKS\xba\xbe");
        st.store_beside("vol", &t, true).unwrap();
        let r = OwnerRecord::decode(&st.record_bytes("vol", &dev).unwrap())
            .unwrap()
            .unwrap();
        assert!(r.released && r.token == t);
        std::fs::write(&path, [0xffu8; 4096]).unwrap();
        assert_eq!(
            st.load_beside("vol").unwrap_err().kind(),
            ErrorKind::Corrupt
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
