//! LUKS2 on disk: the binary header, its checksum, the JSON metadata, their validation,
//! choosing between the two copies, and writing both back (`ondisk-formats.md` §2).
//!
//! ```text
//!   0            primary:   binary header (4096, RawHeader) + JSON area (hdr_size - 4096)
//!   hdr_size     secondary: the same, magic "SKUL\xba\xbe", own salt and checksum
//!   2*hdr_size   keyslot areas (config.keyslots_size)
//!   segment      encrypted data
//! ```
//!
//! Everything here is a pure function of bytes except [`read_headers`] and
//! [`write_headers`], which only move bytes between a device and [`load_image`]-style
//! parsing; a fuzz target can call [`load_from`] with an in-memory image.
//! Every number from disk is checked (`checked_add`, bounded sizes) before it is used
//! as an offset or a length.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use cairn_block::codec::{array, Short};
use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};
use serde::de::{self, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::{Map, Value};

/// `"LUKS\xba\xbe"`: the primary header (and LUKS1).
pub const MAGIC_PRIMARY: [u8; 6] = *cairn_block::probe::LUKS_MAGIC;
/// `"SKUL\xba\xbe"`: the secondary header.
pub const MAGIC_SECONDARY: [u8; 6] = *cairn_block::probe::LUKS2_SECONDARY_MAGIC;
/// Size of the binary part of a header copy.
pub const BINARY_SIZE: usize = 4096;
/// The header sizes (binary + JSON) cryptsetup knows, which are also where the secondary
/// copy is searched for when the primary is unusable (`LUKS2_HDR2_OFFSETS`).
pub const HDR_SIZES: [u64; 9] = cairn_block::probe::LUKS2_SECONDARY_OFFSETS;
/// At most this many keyslots (ids 0..31), and tokens.
pub const MAX_KEYSLOTS: u32 = 32;
pub const MAX_TOKENS: u32 = 32;
/// Largest `config.keyslots_size` cryptsetup accepts.
pub const MAX_KEYSLOTS_SIZE: u64 = 128 << 20;
/// Sector sizes a crypt segment may use (dm-crypt: a power of two up to 4096).
pub const SECTOR_SIZES: [u32; 4] = [512, 1024, 2048, 4096];

fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

// ---------------------------------------------------------------------------------------
// Binary header
// ---------------------------------------------------------------------------------------

/// Field offsets of the binary header, each derived from the one before it.
pub mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = MAGIC + 6;
    pub const HDR_SIZE: usize = VERSION + 2;
    pub const SEQID: usize = HDR_SIZE + 8;
    pub const LABEL: usize = SEQID + 8;
    pub const CHECKSUM_ALG: usize = LABEL + 48;
    pub const SALT: usize = CHECKSUM_ALG + 32;
    pub const UUID: usize = SALT + 64;
    pub const SUBSYSTEM: usize = UUID + 40;
    pub const HDR_OFFSET: usize = SUBSYSTEM + 48;
    pub const PADDING: usize = HDR_OFFSET + 8;
    pub const CSUM: usize = PADDING + 184;
    pub const PADDING4096: usize = CSUM + 64;
    pub const END: usize = PADDING4096 + 3584;
}

/// `struct luks2_hdr_disk` exactly as on disk (big-endian integers kept as bytes).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawHeader {
    pub magic: [u8; 6],
    pub version: [u8; 2],
    pub hdr_size: [u8; 8],
    pub seqid: [u8; 8],
    pub label: [u8; 48],
    pub checksum_alg: [u8; 32],
    pub salt: [u8; 64],
    pub uuid: [u8; 40],
    pub subsystem: [u8; 48],
    pub hdr_offset: [u8; 8],
    pub padding: [u8; 184],
    pub csum: [u8; 64],
    pub padding4096: [u8; 3584],
}

const _: () = assert!(size_of::<RawHeader>() == BINARY_SIZE);
const _: () = assert!(off::END == BINARY_SIZE);
const _: () = assert!(off::CSUM == 448 && off::HDR_OFFSET == 256 && off::UUID == 168);

impl RawHeader {
    /// Reads the first 4096 bytes of `b`; a shorter `b` is an error.
    pub fn from_bytes(b: &[u8]) -> Result<RawHeader, Short> {
        Ok(RawHeader {
            magic: array(b, off::MAGIC)?,
            version: array(b, off::VERSION)?,
            hdr_size: array(b, off::HDR_SIZE)?,
            seqid: array(b, off::SEQID)?,
            label: array(b, off::LABEL)?,
            checksum_alg: array(b, off::CHECKSUM_ALG)?,
            salt: array(b, off::SALT)?,
            uuid: array(b, off::UUID)?,
            subsystem: array(b, off::SUBSYSTEM)?,
            hdr_offset: array(b, off::HDR_OFFSET)?,
            padding: array(b, off::PADDING)?,
            csum: array(b, off::CSUM)?,
            padding4096: array(b, off::PADDING4096)?,
        })
    }

    pub fn write_to(&self, b: &mut [u8]) {
        let mut put = |at: usize, v: &[u8]| b[at..at + v.len()].copy_from_slice(v);
        put(off::MAGIC, &self.magic);
        put(off::VERSION, &self.version);
        put(off::HDR_SIZE, &self.hdr_size);
        put(off::SEQID, &self.seqid);
        put(off::LABEL, &self.label);
        put(off::CHECKSUM_ALG, &self.checksum_alg);
        put(off::SALT, &self.salt);
        put(off::UUID, &self.uuid);
        put(off::SUBSYSTEM, &self.subsystem);
        put(off::HDR_OFFSET, &self.hdr_offset);
        put(off::PADDING, &self.padding);
        put(off::CSUM, &self.csum);
        put(off::PADDING4096, &self.padding4096);
    }
}

/// A NUL-terminated text field; the text before the first NUL (lossy UTF-8).
fn cstr(field: &[u8]) -> String {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    String::from_utf8_lossy(&field[..end]).into_owned()
}

/// Puts `s` into a NUL-terminated field; it must leave room for the NUL.
fn put_cstr(field: &mut [u8], s: &str, what: &str) -> Result<()> {
    if s.len() >= field.len() || s.as_bytes().contains(&0) {
        return Err(Error::new(
            ErrorKind::InvalidArgument,
            format!(
                "{what} {s:?} is too long (at most {} bytes) or contains NUL",
                field.len() - 1
            ),
        ));
    }
    field.fill(0);
    field[..s.len()].copy_from_slice(s.as_bytes());
    Ok(())
}

/// The binary header, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BinaryHeader {
    pub version: u16,
    pub hdr_size: u64,
    pub seqid: u64,
    pub label: String,
    pub checksum_alg: String,
    pub uuid: String,
    pub subsystem: String,
    pub hdr_offset: u64,
}

/// Which copy of the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Which {
    Primary,
    Secondary,
}

impl fmt::Display for Which {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Which::Primary => "primary",
            Which::Secondary => "secondary",
        })
    }
}

/// The checks cryptsetup makes on a binary header before reading its JSON
/// (`hdr_disk_sanity_check_pre`). `offset` is where it was read.
pub fn parse_binary(b: &[u8], offset: u64) -> Result<BinaryHeader> {
    let raw = RawHeader::from_bytes(b)?;
    let which = if offset == 0 {
        Which::Primary
    } else {
        Which::Secondary
    };
    let magic = match which {
        Which::Primary => MAGIC_PRIMARY,
        Which::Secondary => MAGIC_SECONDARY,
    };
    if raw.magic != magic {
        return Err(corrupt(format!(
            "no LUKS2 {which} header magic at {offset}"
        )));
    }
    let version = u16::from_be_bytes(raw.version);
    if version != 2 {
        return Err(corrupt(format!(
            "{which} header at {offset} has version {version}, not 2"
        )));
    }
    let hdr_size = u64::from_be_bytes(raw.hdr_size);
    if !HDR_SIZES.contains(&hdr_size) {
        return Err(corrupt(format!(
            "{which} header at {offset}: header size {hdr_size} is not one of 16 KiB .. 4 MiB"
        )));
    }
    let hdr_offset = u64::from_be_bytes(raw.hdr_offset);
    if hdr_offset != offset {
        return Err(corrupt(format!(
            "{which} header at {offset} says it is at {hdr_offset}"
        )));
    }
    if which == Which::Secondary && hdr_size != offset {
        return Err(corrupt(format!(
            "secondary header at {offset} has header size {hdr_size}"
        )));
    }
    Ok(BinaryHeader {
        version,
        hdr_size,
        seqid: u64::from_be_bytes(raw.seqid),
        label: cstr(&raw.label),
        checksum_alg: cstr(&raw.checksum_alg),
        uuid: cstr(&raw.uuid),
        subsystem: cstr(&raw.subsystem),
        hdr_offset,
    })
}

/// The header checksum (§2.3): `alg` over the whole copy with the csum field zeroed.
/// Returns the 64-byte field value (digest, zero-padded).
pub fn checksum(alg: &str, copy: &[u8]) -> Result<[u8; 64]> {
    fn run<D: sha2::Digest>(copy: &[u8]) -> Vec<u8> {
        let mut h = D::new();
        h.update(&copy[..off::CSUM]);
        h.update([0u8; 64]);
        h.update(&copy[off::PADDING4096..]);
        h.finalize().to_vec()
    }
    let d = match alg {
        "sha256" => run::<sha2::Sha256>(copy),
        "sha1" => run::<sha1::Sha1>(copy),
        "sha512" => run::<sha2::Sha512>(copy),
        _ => {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("header checksum algorithm {alg:?}"),
            ))
        }
    };
    let mut out = [0u8; 64];
    out[..d.len()].copy_from_slice(&d);
    Ok(out)
}

// ---------------------------------------------------------------------------------------
// JSON metadata
// ---------------------------------------------------------------------------------------

/// Parses a decimal string as cryptsetup does for its 64-bit JSON strings: digits only,
/// no sign, and a value that fits in u64.
pub fn parse_u64_dec(s: &str) -> Option<u64> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.bytes().try_fold(0u64, |acc, b| {
        acc.checked_mul(10)?.checked_add(u64::from(b - b'0'))
    })
}

/// A 64-bit quantity stored as a decimal string.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct U64Str(pub u64);

impl Serialize for U64Str {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for U64Str {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<U64Str, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = U64Str;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a decimal string that fits in 64 bits")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> std::result::Result<U64Str, E> {
                parse_u64_dec(s)
                    .map(U64Str)
                    .ok_or_else(|| E::custom(format!("{s:?} is not a decimal u64")))
            }
        }
        d.deserialize_str(V)
    }
}

/// A segment size: bytes, or `"dynamic"` (to the end of the device).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentSize {
    Dynamic,
    Bytes(u64),
}

impl Serialize for SegmentSize {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        match self {
            SegmentSize::Dynamic => s.serialize_str("dynamic"),
            SegmentSize::Bytes(n) => s.collect_str(n),
        }
    }
}

impl<'de> Deserialize<'de> for SegmentSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<SegmentSize, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = SegmentSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("\"dynamic\" or a decimal string that fits in 64 bits")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> std::result::Result<SegmentSize, E> {
                if s == "dynamic" {
                    return Ok(SegmentSize::Dynamic);
                }
                parse_u64_dec(s)
                    .map(SegmentSize::Bytes)
                    .ok_or_else(|| E::custom(format!("segment size {s:?} is not a decimal u64")))
            }
        }
        d.deserialize_str(V)
    }
}

/// Binary data as standard base64 with padding (salts, digests).
#[derive(Clone, PartialEq, Eq, Default)]
pub struct B64(pub Vec<u8>);

impl fmt::Debug for B64 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "B64({})",
            base64::engine::general_purpose::STANDARD.encode(&self.0)
        )
    }
}

impl Serialize for B64 {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(&self.0))
    }
}

impl<'de> Deserialize<'de> for B64 {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<B64, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = B64;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a base64 string")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> std::result::Result<B64, E> {
                base64::engine::general_purpose::STANDARD
                    .decode(s)
                    .map(B64)
                    .map_err(|e| E::custom(format!("bad base64: {e}")))
            }
        }
        d.deserialize_str(V)
    }
}

/// An object keyed by decimal ids (`"0"`, `"1"`, …), e.g. `keyslots`. Ids are canonical
/// decimals below `2^31`; duplicates are an error.
#[derive(Debug, Clone, PartialEq)]
pub struct IdMap<T>(pub BTreeMap<u32, T>);

impl<T> Default for IdMap<T> {
    fn default() -> Self {
        IdMap(BTreeMap::new())
    }
}

/// Parses an object key or a reference such as `"7"`.
pub fn parse_id(s: &str) -> Option<u32> {
    if s.len() > 1 && s.starts_with('0') {
        return None;
    }
    let v = parse_u64_dec(s)?;
    u32::try_from(v).ok().filter(|&v| v < (1 << 31))
}

impl<T: Serialize> Serialize for IdMap<T> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(&k.to_string(), v)?;
        }
        m.end()
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for IdMap<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<IdMap<T>, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = IdMap<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object keyed by decimal ids")
            }
            fn visit_map<A: MapAccess<'de>>(
                self,
                mut a: A,
            ) -> std::result::Result<IdMap<T>, A::Error> {
                let mut m = BTreeMap::new();
                while let Some(k) = a.next_key::<String>()? {
                    let id = parse_id(&k).ok_or_else(|| {
                        de::Error::custom(format!("object key {k:?} is not an id"))
                    })?;
                    let v = a.next_value::<T>()?;
                    if m.insert(id, v).is_some() {
                        return Err(de::Error::custom(format!("duplicate id {k:?}")));
                    }
                }
                Ok(IdMap(m))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// Unknown members, kept verbatim on rewrite.
pub type Extra = Map<String, Value>;

/// The whole JSON area.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    pub keyslots: IdMap<Keyslot>,
    pub tokens: IdMap<Token>,
    pub segments: IdMap<Segment>,
    pub digests: IdMap<Digest>,
    pub config: Config,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Keyslot {
    #[serde(rename = "type")]
    pub kind: String,
    pub key_size: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub af: Option<Af>,
    pub area: Area,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kdf: Option<Kdf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<u32>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Af {
    #[serde(rename = "type")]
    pub kind: String,
    pub stripes: u32,
    pub hash: String,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Area {
    #[serde(rename = "type")]
    pub kind: String,
    pub offset: U64Str,
    pub size: U64Str,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_size: Option<u32>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A keyslot's KDF: `pbkdf2` uses hash + iterations; `argon2i`/`argon2id` use time,
/// memory (KiB) and cpus.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Kdf {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterations: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub salt: Option<B64>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Segment {
    #[serde(rename = "type")]
    pub kind: String,
    pub offset: U64Str,
    pub size: SegmentSize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iv_tweak: Option<U64Str>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encryption: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sector_size: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<Vec<String>>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Digest {
    #[serde(rename = "type")]
    pub kind: String,
    pub keyslots: Vec<String>,
    pub segments: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iterations: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub salt: Option<B64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<B64>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Token {
    #[serde(rename = "type")]
    pub kind: String,
    pub keyslots: Vec<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Config {
    pub json_size: U64Str,
    pub keyslots_size: U64Str,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requirements: Option<Requirements>,
    #[serde(flatten)]
    pub extra: Extra,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Requirements {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mandatory: Option<Vec<String>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// Requirement names cairn implements (none yet: reencryption and OPAL are not).
pub const KNOWN_REQUIREMENTS: [&str; 0] = [];

impl Metadata {
    /// `config.requirements.mandatory` entries cairn does not implement.
    pub fn unmet_requirements(&self) -> Vec<String> {
        self.config
            .requirements
            .as_ref()
            .and_then(|r| r.mandatory.as_ref())
            .map(|m| {
                m.iter()
                    .filter(|r| !KNOWN_REQUIREMENTS.contains(&r.as_str()))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The digest that lists keyslot `id`, if any.
    pub fn digest_of_keyslot(&self, id: u32) -> Option<(u32, &Digest)> {
        let s = id.to_string();
        self.digests
            .0
            .iter()
            .find(|(_, d)| d.keyslots.contains(&s))
            .map(|(k, d)| (*k, d))
    }

    /// Where the keyslot areas may lie: `[2*hdr_size, 2*hdr_size + keyslots_size)`.
    pub fn keyslots_range(&self, hdr_size: u64) -> Result<(u64, u64)> {
        let start = hdr_size
            .checked_mul(2)
            .ok_or_else(|| corrupt("header size overflows"))?;
        let end = start
            .checked_add(self.config.keyslots_size.0)
            .ok_or_else(|| corrupt("keyslots_size overflows"))?;
        Ok((start, end))
    }

    /// The validation rules of `ondisk-formats.md` §2.5 (`luks2_json_metadata.c`),
    /// applied on read and before every write.
    pub fn validate(&self, hdr_size: u64) -> Result<()> {
        // config
        let json_size = self.config.json_size.0;
        if json_size.checked_add(BINARY_SIZE as u64) != Some(hdr_size) {
            return Err(corrupt(format!(
                "config.json_size {json_size} does not match the header size {hdr_size}"
            )));
        }
        let ks_size = self.config.keyslots_size.0;
        if !ks_size.is_multiple_of(4096) || ks_size > MAX_KEYSLOTS_SIZE {
            return Err(corrupt(format!(
                "config.keyslots_size {ks_size} is not a multiple of 4096 up to 128 MiB"
            )));
        }
        let (ks_start, ks_end) = self.keyslots_range(hdr_size)?;

        // keyslots: ids, areas inside the keyslots area and disjoint.
        let mut areas: Vec<(u64, u64, u32)> = Vec::new();
        for (&id, ks) in &self.keyslots.0 {
            if id >= MAX_KEYSLOTS {
                return Err(corrupt(format!("keyslot id {id} is not below 32")));
            }
            if ks.key_size == 0 {
                return Err(corrupt(format!("keyslot {id}: key_size 0")));
            }
            let (off, size) = (ks.area.offset.0, ks.area.size.0);
            let end = off
                .checked_add(size)
                .ok_or_else(|| corrupt(format!("keyslot {id}: area offset + size overflows")))?;
            if size == 0 || off < ks_start || end > ks_end {
                return Err(corrupt(format!(
                    "keyslot {id}: area [{off}, {end}) is not inside the keyslots area [{ks_start}, {ks_end})"
                )));
            }
            areas.push((off, end, id));
            if ks.kind == "luks2" {
                validate_luks2_keyslot(id, ks)?;
            }
        }
        areas.sort_unstable();
        for w in areas.windows(2) {
            if w[0].1 > w[1].0 {
                return Err(corrupt(format!(
                    "keyslot areas {} and {} overlap",
                    w[0].2, w[1].2
                )));
            }
        }

        // segments
        let ids: Vec<u32> = self.segments.0.keys().copied().collect();
        if ids.iter().enumerate().any(|(i, &id)| id as usize != i) {
            return Err(corrupt("segment ids have gaps"));
        }
        let mut min_offset: Option<u64> = None;
        let last = ids.last().copied();
        for (&id, seg) in &self.segments.0 {
            let offset = seg.offset.0;
            if !offset.is_multiple_of(512) {
                return Err(corrupt(format!(
                    "segment {id}: offset {offset} is not 512-aligned"
                )));
            }
            match seg.size {
                SegmentSize::Dynamic if Some(id) != last => {
                    return Err(corrupt(format!(
                        "segment {id}: only the last segment may be dynamic"
                    )))
                }
                // cryptsetup: "Illegal segment size value" (hdr_validate_segments).
                SegmentSize::Bytes(0) => {
                    return Err(corrupt(format!(
                        "segment {id}: size 0 (a data segment is \"dynamic\" or a positive size)"
                    )))
                }
                SegmentSize::Bytes(n) if !n.is_multiple_of(512) => {
                    return Err(corrupt(format!(
                        "segment {id}: size {n} is not 512-aligned"
                    )))
                }
                _ => {}
            }
            if seg.kind == "crypt" {
                if seg.encryption.as_deref().is_none_or(str::is_empty) {
                    return Err(corrupt(format!("segment {id}: no encryption")));
                }
                if seg.iv_tweak.is_none() {
                    return Err(corrupt(format!("segment {id}: no iv_tweak")));
                }
                let ss = seg
                    .sector_size
                    .ok_or_else(|| corrupt(format!("segment {id}: no sector_size")))?;
                if !SECTOR_SIZES.contains(&ss) {
                    return Err(corrupt(format!(
                        "segment {id}: sector_size {ss} is not 512, 1024, 2048 or 4096"
                    )));
                }
                if let SegmentSize::Bytes(n) = seg.size {
                    if !n.is_multiple_of(u64::from(ss)) {
                        return Err(corrupt(format!(
                            "segment {id}: size {n} is not a multiple of its sector size {ss}"
                        )));
                    }
                }
            }
            // Offset 0 is a detached header's (the data is on another device); whether
            // the data may sit there is decided when it is activated on a device
            // (`Luks2::activate`), as cryptsetup does. Every other segment must clear
            // the keyslots, so one at 0 must not hide another inside them.
            if offset != 0 {
                min_offset = Some(min_offset.map_or(offset, |m: u64| m.min(offset)));
            }
        }
        if let Some(m) = min_offset {
            if ks_end > m {
                return Err(corrupt(format!(
                    "keyslots area ends at {ks_end}, past the data offset {m}"
                )));
            }
        }

        // digests: references exist; each keyslot in exactly one digest; every crypt
        // segment covered.
        let mut owners: BTreeMap<u32, u32> = BTreeMap::new();
        let mut covered: Vec<u32> = Vec::new();
        for (&did, d) in &self.digests.0 {
            for k in &d.keyslots {
                let kid = parse_id(k)
                    .filter(|k| self.keyslots.0.contains_key(k))
                    .ok_or_else(|| corrupt(format!("digest {did}: no keyslot {k:?}")))?;
                if owners.insert(kid, did).is_some() {
                    return Err(corrupt(format!("keyslot {kid} belongs to two digests")));
                }
            }
            for s in &d.segments {
                let sid = parse_id(s)
                    .filter(|s| self.segments.0.contains_key(s))
                    .ok_or_else(|| corrupt(format!("digest {did}: no segment {s:?}")))?;
                covered.push(sid);
            }
            if d.kind == "pbkdf2"
                && (d.hash.is_none()
                    || d.iterations.is_none()
                    || d.salt.is_none()
                    || d.digest.is_none())
            {
                return Err(corrupt(format!("digest {did}: incomplete pbkdf2 digest")));
            }
        }
        if let Some(id) = self.keyslots.0.keys().find(|k| !owners.contains_key(k)) {
            return Err(corrupt(format!("keyslot {id} has no digest")));
        }
        if let Some((id, _)) = self
            .segments
            .0
            .iter()
            .find(|(id, s)| s.kind == "crypt" && !covered.contains(id))
        {
            return Err(corrupt(format!("segment {id} has no digest")));
        }

        // tokens
        for (&tid, t) in &self.tokens.0 {
            if tid >= MAX_TOKENS {
                return Err(corrupt(format!("token id {tid} is not below 32")));
            }
            for k in &t.keyslots {
                if parse_id(k)
                    .filter(|k| self.keyslots.0.contains_key(k))
                    .is_none()
                {
                    return Err(corrupt(format!("token {tid}: no keyslot {k:?}")));
                }
            }
        }
        Ok(())
    }
}

fn validate_luks2_keyslot(id: u32, ks: &Keyslot) -> Result<()> {
    let bad = |what: &str| corrupt(format!("keyslot {id}: {what}"));
    let af = ks.af.as_ref().ok_or_else(|| bad("no af"))?;
    if af.kind != "luks1" || af.stripes == 0 {
        return Err(bad("af must be type luks1 with stripes > 0"));
    }
    if ks.area.kind != "raw" {
        return Err(bad("area type is not raw"));
    }
    if ks.area.encryption.is_none() || ks.area.key_size.is_none_or(|k| k == 0) {
        return Err(bad("area needs encryption and key_size"));
    }
    let kdf = ks.kdf.as_ref().ok_or_else(|| bad("no kdf"))?;
    if kdf.salt.is_none() {
        return Err(bad("kdf has no salt"));
    }
    if kdf.kind == "pbkdf2" {
        if kdf.hash.is_none() || kdf.iterations.is_none() {
            return Err(bad("pbkdf2 needs hash and iterations"));
        }
    } else if kdf.time.is_none() || kdf.memory.is_none() || kdf.cpus.is_none() {
        return Err(bad("argon2 needs time, memory and cpus"));
    }
    Ok(())
}

/// Parses a JSON area (the bytes after the binary header): `{` first, the text ends with
/// a NUL, zero bytes after it, then serde and [`Metadata::validate`].
pub fn parse_json_area(area: &[u8], hdr_size: u64) -> Result<Metadata> {
    if area.first() != Some(&b'{') {
        return Err(corrupt("JSON area does not start with '{'"));
    }
    let nul = area
        .iter()
        .position(|&b| b == 0)
        .ok_or_else(|| corrupt("JSON area has no terminating NUL"))?;
    if area[nul..].iter().any(|&b| b != 0) {
        return Err(corrupt("non-zero bytes after the JSON text"));
    }
    let text = std::str::from_utf8(&area[..nul]).map_err(|_| corrupt("JSON is not UTF-8"))?;
    let meta: Metadata =
        serde_json::from_str(text).map_err(|e| corrupt(format!("JSON metadata: {e}")))?;
    meta.validate(hdr_size)?;
    Ok(meta)
}

// ---------------------------------------------------------------------------------------
// Reading and choosing a copy
// ---------------------------------------------------------------------------------------

/// What was found at one copy's place.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum CopyState {
    /// Valid, with this seqid.
    Valid { offset: u64, seqid: u64 },
    /// Something is there but it is not a usable header; the reason.
    Invalid { offset: u64, reason: String },
}

impl CopyState {
    pub fn is_valid(&self) -> bool {
        matches!(self, CopyState::Valid { .. })
    }
}

/// One fully validated copy.
#[derive(Debug, Clone)]
pub struct HeaderCopy {
    pub binary: BinaryHeader,
    pub metadata: Metadata,
}

/// The header a device holds, with what was found about each copy.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub binary: BinaryHeader,
    pub metadata: Metadata,
    pub used: Which,
    pub primary: CopyState,
    pub secondary: CopyState,
    /// Human-readable warnings (a bad or stale copy), one sentence each.
    pub warnings: Vec<String>,
}

impl Loaded {
    /// Whether both copies are valid and agree (nothing to repair).
    pub fn both_good(&self) -> bool {
        matches!((&self.primary, &self.secondary),
            (CopyState::Valid { seqid: a, .. }, CopyState::Valid { seqid: b, .. }) if a == b)
    }
}

/// Reads `len` bytes at `offset` from wherever the header lives; `Ok(None)` when the
/// range lies beyond the end.
pub type ReadFn<'a> = dyn FnMut(u64, usize) -> Result<Option<Vec<u8>>> + 'a;

/// Reads and fully validates one copy at `offset`.
fn read_copy(read: &mut ReadFn<'_>, offset: u64) -> Result<HeaderCopy> {
    let first = read(offset, BINARY_SIZE)?
        .ok_or_else(|| corrupt(format!("device too small for a header at {offset}")))?;
    let binary = parse_binary(&first, offset)?;
    // hdr_size is one of HDR_SIZES (at most 4 MiB), so this allocation is bounded.
    let len = usize::try_from(binary.hdr_size).map_err(|_| corrupt("header size"))?;
    let whole = read(offset, len)?
        .ok_or_else(|| corrupt(format!("device too small for the header at {offset}")))?;
    let raw = RawHeader::from_bytes(&whole)?;
    let want = checksum(&binary.checksum_alg, &whole)?;
    if !crate::secret::ct_eq(&want, &raw.csum) {
        return Err(corrupt(format!(
            "header checksum mismatch (offset {offset})"
        )));
    }
    let metadata = parse_json_area(&whole[BINARY_SIZE..], binary.hdr_size)?;
    Ok(HeaderCopy { binary, metadata })
}

/// An error's text without the trailing kind, for nesting inside another message.
fn reason(e: &Error) -> String {
    let s = e.to_string();
    let suffix = format!(": {}", e.kind().describe());
    s.strip_suffix(&suffix).map_or(s.clone(), str::to_string)
}

/// Reads both copies and chooses one (§2.4). Does not write anything.
pub fn load_from(read: &mut ReadFn<'_>) -> Result<Loaded> {
    let p = read_copy(read, 0);
    // Where to look for the secondary: after a sane primary binary header, at its
    // hdr_size; otherwise at every known size.
    let sane_primary_size = match &p {
        Ok(c) => Some(c.binary.hdr_size),
        Err(_) => read(0, BINARY_SIZE)
            .ok()
            .flatten()
            .and_then(|b| parse_binary(&b, 0).ok())
            .map(|b| b.hdr_size),
    };
    let candidates: Vec<u64> = match sane_primary_size {
        Some(s) => vec![s],
        None => HDR_SIZES.to_vec(),
    };
    let mut s: Option<Result<HeaderCopy>> = None;
    let mut s_offset = candidates[0];
    for &off in &candidates {
        let r = read_copy(read, off);
        let ok = r.is_ok();
        // Keep the first error, unless a later offset has at least a sane magic.
        if ok || s.is_none() {
            s = Some(r);
            s_offset = off;
        }
        if ok {
            break;
        }
    }
    let s = s.expect("at least one candidate");
    let state = |r: &Result<HeaderCopy>, offset: u64| match r {
        Ok(c) => CopyState::Valid {
            offset,
            seqid: c.binary.seqid,
        },
        Err(e) => CopyState::Invalid {
            offset,
            reason: reason(e),
        },
    };
    let primary = state(&p, 0);
    let secondary = state(&s, s_offset);
    let mut warnings = Vec::new();
    let (copy, used) = match (p, s) {
        (Ok(a), Ok(b)) => {
            if b.binary.seqid > a.binary.seqid {
                warnings.push(format!(
                    "primary LUKS2 header is stale (seqid {} < {}); using the secondary",
                    a.binary.seqid, b.binary.seqid
                ));
                (b, Which::Secondary)
            } else {
                if a.binary.seqid > b.binary.seqid {
                    warnings.push(format!(
                        "secondary LUKS2 header is stale (seqid {} < {}); using the primary",
                        b.binary.seqid, a.binary.seqid
                    ));
                } else if a.metadata != b.metadata {
                    warnings.push(
                        "LUKS2 header copies have the same seqid but different metadata; using the primary"
                            .to_string(),
                    );
                }
                (a, Which::Primary)
            }
        }
        (Ok(a), Err(e)) => {
            warnings.push(format!(
                "secondary LUKS2 header is unusable ({}); using the primary",
                reason(&e)
            ));
            (a, Which::Primary)
        }
        (Err(e), Ok(b)) => {
            warnings.push(format!(
                "primary LUKS2 header is unusable ({}); recovered from the secondary",
                reason(&e)
            ));
            (b, Which::Secondary)
        }
        (Err(ep), Err(es)) => {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "not a usable LUKS2 device: primary header: {}; secondary header: {}",
                    reason(&ep),
                    reason(&es)
                ),
            ));
        }
    };
    Ok(Loaded {
        binary: copy.binary,
        metadata: copy.metadata,
        used,
        primary,
        secondary,
        warnings,
    })
}

/// [`load_from`] over an in-memory image (a header backup file, a fuzz input).
pub fn load_image(image: &[u8]) -> Result<Loaded> {
    let mut read = |off: u64, len: usize| -> Result<Option<Vec<u8>>> {
        let Ok(start) = usize::try_from(off) else {
            return Ok(None);
        };
        Ok(start
            .checked_add(len)
            .and_then(|end| image.get(start..end))
            .map(<[u8]>::to_vec))
    };
    load_from(&mut read)
}

/// Reads `len` bytes at `off` from a device, or `None` past its end.
pub(crate) fn read_dev(dev: &dyn BlockDevice, off: u64, len: usize) -> Result<Option<Vec<u8>>> {
    let size = dev.geometry().size;
    match off.checked_add(len as u64) {
        Some(end) if end <= size => {}
        _ => return Ok(None),
    }
    let mut buf = vec![0u8; len];
    dev.read_at(&mut buf, off)?;
    Ok(Some(buf))
}

/// [`load_from`] over a device.
pub fn read_headers(dev: &dyn BlockDevice) -> Result<Loaded> {
    let lbs = dev.geometry().logical_block_size;
    if lbs as usize > BINARY_SIZE {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("logical block size {lbs} is larger than the 4096-byte LUKS2 header"),
        ));
    }
    let mut read = |off: u64, len: usize| read_dev(dev, off, len);
    load_from(&mut read)
}

// ---------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------

/// Serialises the metadata compactly, as cryptsetup does.
pub fn metadata_json(meta: &Metadata) -> Result<String> {
    serde_json::to_string(meta)
        .map_err(|e| Error::new(ErrorKind::InvalidArgument, format!("serialising JSON: {e}")))
}

/// Builds one complete copy (`hdr_size` bytes) with a fresh salt and its checksum.
pub fn build_copy(bin: &BinaryHeader, json: &str, which: Which) -> Result<Vec<u8>> {
    let len = usize::try_from(bin.hdr_size).map_err(|_| corrupt("header size"))?;
    let json_room = len - BINARY_SIZE;
    if json.len() >= json_room {
        return Err(Error::new(
            ErrorKind::NoSpace,
            format!(
                "LUKS2 metadata is {} bytes; the JSON area holds {}",
                json.len() + 1,
                json_room
            ),
        ));
    }
    let offset = match which {
        Which::Primary => 0,
        Which::Secondary => bin.hdr_size,
    };
    let mut raw =
        RawHeader::from_bytes(&[0u8; BINARY_SIZE]).expect("a zeroed buffer of the header size");
    raw.magic = match which {
        Which::Primary => MAGIC_PRIMARY,
        Which::Secondary => MAGIC_SECONDARY,
    };
    raw.version = 2u16.to_be_bytes();
    raw.hdr_size = bin.hdr_size.to_be_bytes();
    raw.seqid = bin.seqid.to_be_bytes();
    put_cstr(&mut raw.label, &bin.label, "label")?;
    put_cstr(
        &mut raw.checksum_alg,
        &bin.checksum_alg,
        "checksum algorithm",
    )?;
    crate::random_fill(&mut raw.salt);
    put_cstr(&mut raw.uuid, &bin.uuid, "UUID")?;
    put_cstr(&mut raw.subsystem, &bin.subsystem, "subsystem")?;
    raw.hdr_offset = offset.to_be_bytes();
    let mut out = vec![0u8; len];
    raw.write_to(&mut out);
    out[BINARY_SIZE..BINARY_SIZE + json.len()].copy_from_slice(json.as_bytes());
    let csum = checksum(&bin.checksum_alg, &out)?;
    out[off::CSUM..off::CSUM + 64].copy_from_slice(&csum);
    Ok(out)
}

/// Writes the metadata to both copies with `seqid` incremented, primary first, each
/// durable (FUA) before the next starts. A crash at any point leaves at least one
/// valid copy: the old one (primary torn, secondary old) or the new one (primary new,
/// secondary torn or old with a lower seqid). Keyslot areas the new metadata refers to
/// must be durable before this is called.
pub fn write_headers(dev: &dyn BlockDevice, bin: &mut BinaryHeader, meta: &Metadata) -> Result<()> {
    meta.validate(bin.hdr_size)?;
    let json = metadata_json(meta)?;
    let mut next = bin.clone();
    next.seqid = bin
        .seqid
        .checked_add(1)
        .ok_or_else(|| corrupt("seqid overflows"))?;
    next.hdr_offset = 0;
    // Build both before writing either, so a too-large JSON fails before any write.
    let primary = build_copy(&next, &json, Which::Primary)?;
    let secondary = build_copy(&next, &json, Which::Secondary)?;
    dev.write_at(&primary, 0, WriteFlags::FUA)
        .map_err(|e| e.context("writing the primary LUKS2 header"))?;
    dev.write_at(&secondary, next.hdr_size, WriteFlags::FUA)
        .map_err(|e| e.context("writing the secondary LUKS2 header"))?;
    *bin = next;
    Ok(())
}

/// Signatures of other formats where a LUKS2 primary header should be (§5): cryptsetup
/// refuses automatic repair when it finds one ("Device contains ambiguous signatures").
pub fn foreign_signatures(dev: &dyn BlockDevice) -> Result<Vec<&'static str>> {
    let mut found = Vec::new();
    if let Some(b) = read_dev(dev, 0, 8192)? {
        if (0..4).any(|s| &b[s * 512..s * 512 + 8] == b"LABELONE") {
            found.push("LVM2 physical volume label");
        }
        if b[4096..4100] == [0xfc, 0x4e, 0x2b, 0xa9] || b[0..4] == [0xfc, 0x4e, 0x2b, 0xa9] {
            found.push("md RAID superblock");
        }
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u64_strings() {
        assert_eq!(parse_u64_dec("0"), Some(0));
        assert_eq!(parse_u64_dec("18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_u64_dec("18446744073709551616"), None);
        assert_eq!(parse_u64_dec("-1"), None);
        assert_eq!(parse_u64_dec("+1"), None);
        assert_eq!(parse_u64_dec(" 1"), None);
        assert_eq!(parse_u64_dec(""), None);
        assert_eq!(parse_id("07"), None);
        assert_eq!(parse_id("31"), Some(31));
    }

    fn sample() -> &'static str {
        r#"{"keyslots":{"0":{"type":"luks2","key_size":64,"af":{"type":"luks1","stripes":4000,"hash":"sha256"},"area":{"type":"raw","offset":"32768","size":"258048","encryption":"aes-xts-plain64","key_size":64},"kdf":{"type":"argon2id","time":4,"memory":1048576,"cpus":4,"salt":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="},"future":{"x":1}}},"tokens":{"3":{"type":"x-custom","keyslots":["0"],"blob":[1,2,3]}},"segments":{"0":{"type":"crypt","offset":"16777216","size":"dynamic","iv_tweak":"0","encryption":"aes-xts-plain64","sector_size":512}},"digests":{"0":{"type":"pbkdf2","keyslots":["0"],"segments":["0"],"hash":"sha256","iterations":1000,"salt":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=","digest":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="}},"config":{"json_size":"12288","keyslots_size":"16744448","unknown":true},"toplevel":"kept"}"#
    }

    #[test]
    fn unknown_fields_survive_a_round_trip() {
        let m: Metadata = serde_json::from_str(sample()).unwrap();
        m.validate(16384).unwrap();
        let text = metadata_json(&m).unwrap();
        let back: Value = serde_json::from_str(&text).unwrap();
        let orig: Value = serde_json::from_str(sample()).unwrap();
        assert_eq!(back, orig);
    }

    #[test]
    fn validation_catches_bad_numbers() {
        let m: Metadata = serde_json::from_str(sample()).unwrap();
        // Header size mismatch.
        assert!(m.validate(32768).is_err());
        let bad = sample().replace("\"size\":\"258048\"", "\"size\":\"18446744073709551615\"");
        let m: Metadata = serde_json::from_str(&bad).unwrap();
        assert!(m.validate(16384).is_err());
        let bad = sample().replace("\"sector_size\":512", "\"sector_size\":1023");
        let m: Metadata = serde_json::from_str(&bad).unwrap();
        assert!(m.validate(16384).is_err());
        let bad = sample().replace("\"offset\":\"32768\"", "\"offset\":32768");
        assert!(serde_json::from_str::<Metadata>(&bad).is_err());
    }

    #[test]
    fn copy_round_trip_and_checksum() {
        let m: Metadata = serde_json::from_str(sample()).unwrap();
        let bin = BinaryHeader {
            version: 2,
            hdr_size: 16384,
            seqid: 7,
            label: "lab".into(),
            checksum_alg: "sha256".into(),
            uuid: "12a3a118-7039-4575-a649-3f559d8d87ee".into(),
            subsystem: String::new(),
            hdr_offset: 0,
        };
        let json = metadata_json(&m).unwrap();
        let mut img = build_copy(&bin, &json, Which::Primary).unwrap();
        img.extend(build_copy(&bin, &json, Which::Secondary).unwrap());
        let l = load_image(&img).unwrap();
        assert!(l.both_good() && l.warnings.is_empty(), "{:?}", l.warnings);
        assert_eq!(l.metadata, m);
        assert_eq!(l.binary.label, "lab");
        // Corrupt the primary: recovered from the secondary, with a warning.
        let mut bad = img.clone();
        bad[5000] ^= 1;
        let l = load_image(&bad).unwrap();
        assert_eq!(l.used, Which::Secondary);
        assert_eq!(l.warnings.len(), 1);
        // And both: an error, not a panic.
        bad[16384 + 5000] ^= 1;
        let e = load_image(&bad).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        // Truncated images.
        for n in [0, 100, 4096, 16384, 20000] {
            let r = load_image(&img[..n]);
            if n >= 16384 {
                assert!(r.is_ok());
            } else {
                assert!(r.is_err());
            }
        }
    }
}
