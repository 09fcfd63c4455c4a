//! md superblock version 1.2, byte for byte (ondisk-formats.md §1.1–§1.6).
//!
//! ```text
//!   member:  0 ........ 4096: free (boot sector, partition table of a whole disk)
//!            4096 ..... 4096+256+2*max_dev: mdp_superblock_1 + dev_roles[]   <- this file
//!            8192 ..... bitmap (feature bit 1) and bad-block log
//!            data_offset*512 ...: array data (layout.rs)
//! ```
//!
//! [`RawSuperblock`] is the C struct with little-endian fields, its offsets checked at
//! compile time against the table in the format document. It stays a `raw_struct!`
//! rather than reads at offsets (`cairn_block::codec`, which the rest of md uses): the
//! struct *is* the kernel's field table, so each offset is derived by the compiler and
//! asserted once, instead of written out again at every read and write. [`Superblock`] is the parsed,
//! validated form. [`Superblock::parse`] applies the kernel's acceptance rules
//! (`super_1_load`) plus mdadm's, and every refusal names the member and the field.

use std::fmt;
use std::mem::{offset_of, size_of};

use cairn_block::{codec, BlockDevice, Error, ErrorKind, Result, WriteFlags};

use crate::level::{BadRaid10Layout, Level, ParityAlgorithm, Raid10Layout, UnknownLevel};
use crate::units::{small, wide, Sectors};

/// `MD_SB_MAGIC`.
pub const MD_SB_MAGIC: u32 = 0xa92b_4efc;
/// Sector of a version-1.2 superblock (byte 4096).
pub const SUPER_OFFSET_1_2: Sectors = Sectors(8);
/// Bytes readers read at the superblock offset (mdadm `MAX_SB_SIZE`).
pub const SUPERBLOCK_AREA: usize = 4096;
/// Size of the fixed part, before `dev_roles[]`.
pub const FIXED_SIZE: usize = 256;
/// Most `dev_roles` entries that fit the 4 KiB area: `(4096 - 256) / 2`.
pub const MAX_DEV_LIMIT: u32 = 1920;

/// A little-endian `u16` as stored on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct Le16([u8; 2]);
/// A little-endian `u32` as stored on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct Le32([u8; 4]);
/// A little-endian `u64` as stored on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct Le64([u8; 8]);

impl Le16 {
    pub const fn new(v: u16) -> Le16 {
        Le16(v.to_le_bytes())
    }
    pub const fn get(self) -> u16 {
        u16::from_le_bytes(self.0)
    }
}
impl Le32 {
    pub const fn new(v: u32) -> Le32 {
        Le32(v.to_le_bytes())
    }
    pub const fn get(self) -> u32 {
        u32::from_le_bytes(self.0)
    }
    pub const fn from_i32(v: i32) -> Le32 {
        Le32(v.to_le_bytes())
    }
    pub const fn get_i32(self) -> i32 {
        i32::from_le_bytes(self.0)
    }
}
impl Le64 {
    pub const fn new(v: u64) -> Le64 {
        Le64(v.to_le_bytes())
    }
    pub const fn get(self) -> u64 {
        u64::from_le_bytes(self.0)
    }
}

/// A field type of a raw struct: a fixed number of bytes, copied in and out.
pub(crate) trait RawField: Sized {
    const SIZE: usize;
    fn read(b: &[u8]) -> Self;
    fn write(&self, b: &mut [u8]);
}

macro_rules! raw_field_bytes {
    ($ty:ty, $n:expr, $wrap:expr, $unwrap:expr) => {
        impl RawField for $ty {
            const SIZE: usize = $n;
            fn read(b: &[u8]) -> Self {
                let mut a = [0u8; $n];
                a.copy_from_slice(&b[..$n]);
                $wrap(a)
            }
            fn write(&self, b: &mut [u8]) {
                let a: [u8; $n] = $unwrap(self);
                b[..$n].copy_from_slice(&a);
            }
        }
    };
}
raw_field_bytes!(u8, 1, |a: [u8; 1]| a[0], |v: &u8| [*v]);
raw_field_bytes!(Le16, 2, Le16, |v: &Le16| v.0);
raw_field_bytes!(Le32, 4, Le32, |v: &Le32| v.0);
raw_field_bytes!(Le64, 8, Le64, |v: &Le64| v.0);
raw_field_bytes!([u8; 16], 16, |a| a, |v: &[u8; 16]| *v);
raw_field_bytes!([u8; 32], 32, |a| a, |v: &[u8; 32]| *v);
raw_field_bytes!([u8; 64], 64, |a| a, |v: &[u8; 64]| *v);
raw_field_bytes!([u8; 120], 120, |a| a, |v: &[u8; 120]| *v);

/// Declares a `#[repr(C)]` struct of byte-array fields (alignment 1, so no padding) and
/// its copy-in/copy-out at the compiler-derived field offsets.
macro_rules! raw_struct {
    ($(#[$m:meta])* pub struct $name:ident { $($(#[$fm:meta])* pub $field:ident: $ty:ty,)* }) => {
        $(#[$m])*
        #[repr(C)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub struct $name { $($(#[$fm])* pub $field: $ty,)* }

        impl $name {
            /// Copies the struct out of the first `size_of::<Self>()` bytes.
            pub fn read_from(b: &[u8; size_of::<$name>()]) -> $name {
                $name { $($field: <$ty as RawField>::read(&b[std::mem::offset_of!($name, $field)..]),)* }
            }
            /// Copies the struct into the first `size_of::<Self>()` bytes.
            pub fn write_to(&self, b: &mut [u8; size_of::<$name>()]) {
                $(RawField::write(&self.$field, &mut b[std::mem::offset_of!($name, $field)..]);)*
            }
        }
        // Every field is a byte array: the struct is exactly the sum of its fields.
        const _: () = assert!(0 $(+ <$ty as RawField>::SIZE)* == size_of::<$name>());
    };
}

// bitmap.rs lays out `bitmap_super_t` with the same machinery.
pub(crate) use raw_struct;

raw_struct! {
    /// `struct mdp_superblock_1` (`md_p.h`), without the `dev_roles[]` that follows it.
    pub struct RawSuperblock {
        pub magic: Le32,
        pub major_version: Le32,
        pub feature_map: Le32,
        pub pad0: Le32,
        pub set_uuid: [u8; 16],
        pub set_name: [u8; 32],
        pub ctime: Le64,
        /// s32
        pub level: Le32,
        pub layout: Le32,
        pub size: Le64,
        pub chunksize: Le32,
        pub raid_disks: Le32,
        /// s32; overlays `ppl.offset` (s16) and `ppl.size` (u16).
        pub bitmap_offset: Le32,
        pub new_level: Le32,
        pub reshape_position: Le64,
        pub delta_disks: Le32,
        pub new_layout: Le32,
        pub new_chunk: Le32,
        /// s32
        pub new_offset: Le32,
        pub data_offset: Le64,
        pub data_size: Le64,
        pub super_offset: Le64,
        /// Shares storage with `journal_tail`.
        pub recovery_offset: Le64,
        pub dev_number: Le32,
        pub cnt_corrected_read: Le32,
        pub device_uuid: [u8; 16],
        pub devflags: u8,
        pub bblog_shift: u8,
        pub bblog_size: Le16,
        /// s32
        pub bblog_offset: Le32,
        pub utime: Le64,
        pub events: Le64,
        pub resync_offset: Le64,
        pub sb_csum: Le32,
        pub max_dev: Le32,
        pub pad3: [u8; 32],
    }
}

// The byte offsets of ondisk-formats.md §1.2; the compiler derives them from the
// field order above, these asserts keep the two in step.
const _: () = {
    assert!(size_of::<RawSuperblock>() == FIXED_SIZE);
    assert!(offset_of!(RawSuperblock, set_uuid) == 16);
    assert!(offset_of!(RawSuperblock, set_name) == 32);
    assert!(offset_of!(RawSuperblock, ctime) == 64);
    assert!(offset_of!(RawSuperblock, level) == 72);
    assert!(offset_of!(RawSuperblock, size) == 80);
    assert!(offset_of!(RawSuperblock, chunksize) == 88);
    assert!(offset_of!(RawSuperblock, bitmap_offset) == 96);
    assert!(offset_of!(RawSuperblock, reshape_position) == 104);
    assert!(offset_of!(RawSuperblock, new_offset) == 124);
    assert!(offset_of!(RawSuperblock, data_offset) == 128);
    assert!(offset_of!(RawSuperblock, super_offset) == 144);
    assert!(offset_of!(RawSuperblock, dev_number) == 160);
    assert!(offset_of!(RawSuperblock, device_uuid) == 168);
    assert!(offset_of!(RawSuperblock, devflags) == 184);
    assert!(offset_of!(RawSuperblock, bblog_size) == 186);
    assert!(offset_of!(RawSuperblock, bblog_offset) == 188);
    assert!(offset_of!(RawSuperblock, utime) == 192);
    assert!(offset_of!(RawSuperblock, events) == 200);
    assert!(offset_of!(RawSuperblock, resync_offset) == 208);
    assert!(offset_of!(RawSuperblock, sb_csum) == 216);
    assert!(offset_of!(RawSuperblock, max_dev) == 220);
    assert!(offset_of!(RawSuperblock, pad3) == 224);
};

/// Byte offset of `sb_csum`, which the checksum treats as zero.
const CSUM_OFFSET: usize = offset_of!(RawSuperblock, sb_csum);

/// Byte offset of a v1.2 superblock on its member.
pub const SUPERBLOCK_BYTE_OFFSET: u64 = 4096;

/// Whether `bytes` (read at the superblock offset) start with md's magic and major
/// version 1: the cheap probe that tells "not an md member" from "a damaged one" before
/// [`Superblock::parse`] says which check failed.
pub fn looks_like_md(bytes: &[u8]) -> bool {
    codec::le32(bytes, 0) == Ok(MD_SB_MAGIC) && codec::le32(bytes, 4) == Ok(1)
}

/// The largest chunk md supports (`MAX_CHUNK_SIZE`, 1 GiB: "the largest chunk size the
/// code can support without substantial surgery"); larger ones overflow its byte
/// arithmetic, and no mdadm or cairn ever writes one.
pub const MAX_CHUNK: Sectors = Sectors(1 << 21);

/// The md superblock checksum over the first `256 + 2*max_dev` bytes of `sb`
/// (`calc_sb_1_csum` in both the kernel and mdadm), with `sb_csum` taken as zero.
///
/// `sb` must hold at least `256 + 2*max_dev` bytes, `max_dev` read from the buffer.
pub fn checksum(sb: &[u8], max_dev: u32) -> u32 {
    let len = FIXED_SIZE + 2 * small(u64::from(max_dev));
    let bytes = &sb[..len];
    let mut sum: u64 = 0;
    let mut words = bytes.chunks_exact(4);
    for (i, w) in words.by_ref().enumerate() {
        if i * 4 == CSUM_OFFSET {
            continue;
        }
        sum += u64::from(u32::from_le_bytes([w[0], w[1], w[2], w[3]]));
    }
    // len % 4 == 2 when max_dev is odd: the last le16 counts too.
    if let [a, b] = *words.remainder() {
        sum += u64::from(u16::from_le_bytes([a, b]));
    }
    let folded = (sum & 0xffff_ffff) + (sum >> 32);
    // The kernel truncates the fold to 32 bits (`u32 csum = ...`).
    u32::try_from(folded & 0xffff_ffff).expect("masked to 32 bits")
}

/// A 16-byte md UUID (array or device), printed the way mdadm prints it.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Uuid(pub [u8; 16]);

impl fmt::Display for Uuid {
    /// The 16 raw bytes in order, as four 8-hex-digit groups joined by `:`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, b) in self.0.iter().enumerate() {
            if i > 0 && i % 4 == 0 {
                f.write_str(":")?;
            }
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Uuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Uuid({self})")
    }
}

impl std::str::FromStr for Uuid {
    type Err = String;
    /// Accepts 32 hex digits with any `:`, `-`, `.` or space separators (mdadm's and
    /// the RFC 4122 forms give the same bytes in the same order).
    fn from_str(s: &str) -> Result<Uuid, String> {
        let digits: Vec<u8> = s
            .bytes()
            .filter(|c| !matches!(c, b':' | b'-' | b'.' | b' '))
            .collect();
        if digits.len() != 32 {
            return Err(format!("{s:?} is not a UUID (need 32 hex digits)"));
        }
        let mut out = [0u8; 16];
        for (i, pair) in digits.chunks_exact(2).enumerate() {
            let hex = std::str::from_utf8(pair).map_err(|_| format!("{s:?} is not hex"))?;
            out[i] = u8::from_str_radix(hex, 16).map_err(|_| format!("{s:?} is not hex"))?;
        }
        Ok(Uuid(out))
    }
}

impl serde::Serialize for Uuid {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// The 32-byte `set_name`: `homehost:name` or `name`, NUL padded. Kept as bytes because
/// nothing on disk promises UTF-8.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SetName(pub [u8; 32]);

impl SetName {
    /// Bytes up to the first NUL (all 32 when there is none).
    pub fn as_bytes(&self) -> &[u8] {
        let end = self.0.iter().position(|&b| b == 0).unwrap_or(32);
        &self.0[..end]
    }

    pub fn to_string_lossy(&self) -> String {
        String::from_utf8_lossy(self.as_bytes()).into_owned()
    }

    /// The part before `:`, if the name has a homehost.
    pub fn homehost(&self) -> Option<String> {
        let s = self.to_string_lossy();
        s.split_once(':').map(|(h, _)| h.to_string())
    }

    /// The array's name without the homehost (what mdadm uses for `/dev/md/NAME`).
    pub fn short_name(&self) -> String {
        let s = self.to_string_lossy();
        match s.split_once(':') {
            Some((_, n)) => n.to_string(),
            None => s,
        }
    }

    /// mdadm's `init_super1` rule: `homehost:name` when a homehost is given, the name has
    /// no `:` and the whole fits in 31 bytes; otherwise the name alone, cut to 31 bytes.
    pub fn from_parts(homehost: Option<&str>, name: &str) -> SetName {
        let mut out = [0u8; 32];
        let full;
        let bytes = match homehost {
            Some(h) if !name.contains(':') && h.len() + 1 + name.len() < 32 => {
                full = format!("{h}:{name}");
                full.as_bytes()
            }
            _ => name.as_bytes(),
        };
        let n = bytes.len().min(31);
        out[..n].copy_from_slice(&bytes[..n]);
        SetName(out)
    }
}

impl fmt::Display for SetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_string_lossy())
    }
}

impl fmt::Debug for SetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SetName({:?})", self.to_string_lossy())
    }
}

/// `ctime`/`utime`: low 40 bits seconds since the epoch, high 24 bits microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct MdTime(pub u64);

impl MdTime {
    const SECS_MASK: u64 = (1 << 40) - 1;

    /// Whole seconds, as mdadm writes them (microseconds 0).
    pub const fn from_secs(secs: u64) -> MdTime {
        MdTime(secs & Self::SECS_MASK)
    }
    pub const fn secs(self) -> u64 {
        self.0 & Self::SECS_MASK
    }
    pub const fn micros(self) -> u64 {
        self.0 >> 40
    }
}

/// `feature_map` (§1.5).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Features(pub u32);

impl Features {
    pub const BITMAP_OFFSET: u32 = 1;
    pub const RECOVERY_OFFSET: u32 = 2;
    pub const RESHAPE_ACTIVE: u32 = 4;
    pub const BAD_BLOCKS: u32 = 8;
    pub const REPLACEMENT: u32 = 16;
    pub const RESHAPE_BACKWARDS: u32 = 32;
    pub const NEW_OFFSET: u32 = 64;
    pub const RECOVERY_BITMAP: u32 = 128;
    pub const CLUSTERED: u32 = 256;
    pub const JOURNAL: u32 = 512;
    pub const PPL: u32 = 1024;
    pub const MULTIPLE_PPLS: u32 = 2048;
    pub const RAID0_LAYOUT: u32 = 4096;

    /// Every bit the kernel knows (`MD_FEATURE_ALL`); any other bit makes it refuse.
    pub const KNOWN_TO_MD: u32 = 0x1fff;
    /// Bits cairn implements (§1.5: "the bits cairn needs to accept are 1, 2, 8 and
    /// 4096"). The bitmap itself is handled by a later layer; parsing only carries the
    /// offset.
    pub const SUPPORTED: u32 =
        Self::BITMAP_OFFSET | Self::RECOVERY_OFFSET | Self::BAD_BLOCKS | Self::RAID0_LAYOUT;

    pub const fn has(self, bit: u32) -> bool {
        self.0 & bit == bit
    }

    /// Names of the bits set, for messages.
    pub fn names(self) -> Vec<&'static str> {
        const NAMES: [(u32, &str); 13] = [
            (Features::BITMAP_OFFSET, "bitmap"),
            (Features::RECOVERY_OFFSET, "recovery-offset"),
            (Features::RESHAPE_ACTIVE, "reshape-active"),
            (Features::BAD_BLOCKS, "bad-blocks"),
            (Features::REPLACEMENT, "replacement"),
            (Features::RESHAPE_BACKWARDS, "reshape-backwards"),
            (Features::NEW_OFFSET, "new-offset"),
            (Features::RECOVERY_BITMAP, "recovery-bitmap"),
            (Features::CLUSTERED, "clustered"),
            (Features::JOURNAL, "journal"),
            (Features::PPL, "ppl"),
            (Features::MULTIPLE_PPLS, "multiple-ppls"),
            (Features::RAID0_LAYOUT, "raid0-layout"),
        ];
        NAMES
            .iter()
            .filter(|(bit, _)| self.0 & bit != 0)
            .map(|&(_, n)| n)
            .collect()
    }
}

impl fmt::Debug for Features {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Features({:#x} {:?})", self.0, self.names())
    }
}

/// One `dev_roles[]` entry (§1.3).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DevRole(pub u16);

impl DevRole {
    pub const SPARE: DevRole = DevRole(0xffff);
    pub const FAULTY: DevRole = DevRole(0xfffe);
    pub const JOURNAL: DevRole = DevRole(0xfffd);
    /// Values at or above this have no data role (`MD_DISK_ROLE_MAX`).
    pub const FIRST_SPECIAL: u16 = 0xff00;

    pub const fn active(slot: u16) -> DevRole {
        DevRole(slot)
    }

    /// The slot this member fills, if it is active.
    pub const fn slot(self) -> Option<u16> {
        if self.0 < Self::FIRST_SPECIAL {
            Some(self.0)
        } else {
            None
        }
    }
}

impl fmt::Debug for DevRole {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            DevRole::SPARE => f.write_str("spare"),
            DevRole::FAULTY => f.write_str("faulty"),
            DevRole::JOURNAL => f.write_str("journal"),
            DevRole(v) if v < Self::FIRST_SPECIAL => write!(f, "active({v})"),
            DevRole(v) => write!(f, "special({v:#x})"),
        }
    }
}

/// `devflags`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct DevFlags(pub u8);

impl DevFlags {
    pub const WRITE_MOSTLY: u8 = 1;
    pub const FAIL_FAST: u8 = 2;
}

/// The reshape fields (valid with `RESHAPE_ACTIVE`; `new_offset` with `NEW_OFFSET`).
/// Carried verbatim so that a superblock re-encodes to the same bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Reshape {
    pub new_level: i32,
    pub position: Sectors,
    pub delta_disks: i32,
    pub new_layout: u32,
    pub new_chunk: Sectors,
    pub new_offset: i32,
}

/// A parsed, validated md v1.2 superblock.
///
/// Field names follow `struct mdp_superblock_1`. Sizes and offsets are [`Sectors`].
/// `dev_roles` has exactly `max_dev` entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    pub features: Features,
    pub set_uuid: Uuid,
    pub set_name: SetName,
    pub ctime: MdTime,
    pub level: Level,
    /// The level-specific layout word; [`crate::layout`] interprets it.
    pub layout: u32,
    /// Component size: sectors of each member the array uses (0 for RAID0/linear,
    /// which use each member's `data_size`).
    pub size: Sectors,
    /// Chunk size (0 for RAID1; the rounding factor for linear).
    pub chunk: Sectors,
    pub raid_disks: u32,
    /// Sectors from the superblock start to the bitmap (valid with `BITMAP_OFFSET`).
    pub bitmap_offset: i32,
    pub reshape: Reshape,
    pub data_offset: Sectors,
    pub data_size: Sectors,
    pub super_offset: Sectors,
    /// Sectors already rebuilt (valid with `RECOVERY_OFFSET`); `journal_tail` for a
    /// journal device.
    pub recovery_offset: Sectors,
    pub dev_number: u32,
    pub cnt_corrected_read: u32,
    pub device_uuid: Uuid,
    pub devflags: DevFlags,
    pub bblog_shift: u8,
    pub bblog_size: u16,
    pub bblog_offset: i32,
    pub utime: MdTime,
    pub events: u64,
    /// Everything below this is in sync; [`Sectors::MAX`] means clean.
    pub resync_offset: Sectors,
    pub dev_roles: Vec<DevRole>,
}

/// How strict [`Superblock::parse_with`] is about feature bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeaturePolicy {
    /// Refuse bits cairn does not implement (assembly uses this).
    Supported,
    /// Accept every bit the kernel knows (for `examine`, which only displays).
    KnownToMd,
}

/// Builds the error for one bad field: "md superblock on MEMBER: FIELD: DETAIL".
fn field_error(kind: ErrorKind, member: &str, field: &str, detail: impl fmt::Display) -> Error {
    Error::new(
        kind,
        format!("md superblock on {member}: {field}: {detail}"),
    )
}

fn corrupt(member: &str, field: &str, detail: impl fmt::Display) -> Error {
    field_error(ErrorKind::Corrupt, member, field, detail)
}

impl Superblock {
    /// Parses and validates the superblock at the start of `bytes` (normally the 4096
    /// bytes read at byte 4096 of the member), refusing feature bits cairn does not
    /// implement. `member` names the member in errors.
    pub fn parse(bytes: &[u8], member: &str) -> Result<Superblock> {
        Self::parse_with(bytes, member, FeaturePolicy::Supported)
    }

    /// [`Superblock::parse`] with an explicit feature policy.
    pub fn parse_with(bytes: &[u8], member: &str, policy: FeaturePolicy) -> Result<Superblock> {
        let fixed: &[u8; FIXED_SIZE] = bytes
            .get(..FIXED_SIZE)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| {
                corrupt(
                    member,
                    "length",
                    format!("{} bytes, need at least {FIXED_SIZE}", bytes.len()),
                )
            })?;
        let raw = RawSuperblock::read_from(fixed);

        // The kernel's order: identity first, then the checksum, then the contents.
        let magic = raw.magic.get();
        if magic != MD_SB_MAGIC {
            return Err(corrupt(
                member,
                "magic",
                format!("{magic:#010x}, expected {MD_SB_MAGIC:#010x} (not an md member)"),
            ));
        }
        let major = raw.major_version.get();
        if major != 1 {
            return Err(corrupt(
                member,
                "major_version",
                format!("{major}, only version 1 is md's v1.x format"),
            ));
        }
        let max_dev = raw.max_dev.get();
        if max_dev > MAX_DEV_LIMIT {
            return Err(corrupt(
                member,
                "max_dev",
                format!("{max_dev} exceeds {MAX_DEV_LIMIT}"),
            ));
        }
        let used = FIXED_SIZE + 2 * small(u64::from(max_dev));
        if bytes.len() < used {
            return Err(corrupt(
                member,
                "length",
                format!("{} bytes, max_dev {max_dev} needs {used}", bytes.len()),
            ));
        }
        let super_offset = Sectors(raw.super_offset.get());
        if super_offset != SUPER_OFFSET_1_2 {
            return Err(corrupt(
                member,
                "super_offset",
                format!(
                    "{}, but a v1.2 superblock sits at sector {}",
                    super_offset.0, SUPER_OFFSET_1_2.0
                ),
            ));
        }
        let features = Features(raw.feature_map.get());
        let unknown = features.0 & !Features::KNOWN_TO_MD;
        if unknown != 0 {
            return Err(corrupt(
                member,
                "feature_map",
                format!(
                    "{:#x} has bits md does not define ({unknown:#x})",
                    features.0
                ),
            ));
        }
        let stored = raw.sb_csum.get();
        let computed = checksum(bytes, max_dev);
        if stored != computed {
            return Err(corrupt(
                member,
                "sb_csum",
                format!("stored {stored:08x}, computed {computed:08x}"),
            ));
        }
        if policy == FeaturePolicy::Supported {
            let unsupported = features.0 & !Features::SUPPORTED;
            if unsupported != 0 {
                return Err(field_error(
                    ErrorKind::Unsupported,
                    member,
                    "feature_map",
                    format!(
                        "{:#x}: cairn does not implement {}",
                        features.0,
                        Features(unsupported).names().join(", ")
                    ),
                ));
            }
        }
        if raw.pad0.get() != 0 {
            return Err(corrupt(member, "pad0", "not zero"));
        }
        if raw.pad3.iter().any(|&b| b != 0) {
            return Err(corrupt(member, "pad3", "not zero"));
        }

        let dev_roles = bytes[FIXED_SIZE..used]
            .chunks_exact(2)
            .map(|c| DevRole(u16::from_le_bytes([c[0], c[1]])))
            .collect();

        let level_raw = raw.level.get_i32();
        let level = Level::from_raw(level_raw).map_err(|e| match e {
            UnknownLevel::NotImplemented(name) => field_error(
                ErrorKind::Unsupported,
                member,
                "level",
                format!("{name} is not implemented by cairn"),
            ),
            UnknownLevel::Invalid(v) => corrupt(member, "level", format!("{v} is not an md level")),
        })?;

        let sb = Superblock {
            features,
            set_uuid: Uuid(raw.set_uuid),
            set_name: SetName(raw.set_name),
            ctime: MdTime(raw.ctime.get()),
            level,
            layout: raw.layout.get(),
            size: Sectors(raw.size.get()),
            chunk: Sectors(u64::from(raw.chunksize.get())),
            raid_disks: raw.raid_disks.get(),
            bitmap_offset: raw.bitmap_offset.get_i32(),
            reshape: Reshape {
                new_level: raw.new_level.get_i32(),
                position: Sectors(raw.reshape_position.get()),
                delta_disks: raw.delta_disks.get_i32(),
                new_layout: raw.new_layout.get(),
                new_chunk: Sectors(u64::from(raw.new_chunk.get())),
                new_offset: raw.new_offset.get_i32(),
            },
            data_offset: Sectors(raw.data_offset.get()),
            data_size: Sectors(raw.data_size.get()),
            super_offset,
            recovery_offset: Sectors(raw.recovery_offset.get()),
            dev_number: raw.dev_number.get(),
            cnt_corrected_read: raw.cnt_corrected_read.get(),
            device_uuid: Uuid(raw.device_uuid),
            devflags: DevFlags(raw.devflags),
            bblog_shift: raw.bblog_shift,
            bblog_size: raw.bblog_size.get(),
            bblog_offset: raw.bblog_offset.get_i32(),
            utime: MdTime(raw.utime.get()),
            events: raw.events.get(),
            resync_offset: Sectors(raw.resync_offset.get()),
            dev_roles,
        };
        sb.check_fields(member)?;
        Ok(sb)
    }

    /// Where the bad-block log is, when there is one (`bblog_size` and `bblog_offset`
    /// both set; md records bad blocks there even before the feature bit is set): it must
    /// lie outside the superblock and the data area, or the first bad block md records
    /// would overwrite client data (and client writes the log).
    fn check_bblog_placement(&self, member: &str, sb_end: Sectors) -> Result<()> {
        if self.bblog_size == 0 || self.bblog_offset == 0 {
            return Ok(());
        }
        let start = i128::from(self.super_offset.0) + i128::from(self.bblog_offset);
        let end = start + i128::from(self.bblog_size);
        let data = i128::from(self.data_offset.0);
        let data_end = data + i128::from(self.data_size.0);
        let overlaps = |a: i128, b: i128| start < b && end > a;
        let what = if start < 0 {
            Some("starts before the member".to_string())
        } else if overlaps(data, data_end) {
            Some(format!(
                "overlaps the data area (sectors {data}..{data_end})"
            ))
        } else if overlaps(i128::from(self.super_offset.0), i128::from(sb_end.0)) {
            Some("overlaps the superblock".to_string())
        } else {
            None
        };
        match what {
            None => Ok(()),
            Some(w) => Err(corrupt(
                member,
                "bblog_offset",
                format!(
                    "the bad-block log ({} sectors at sector {start}) {w}",
                    self.bblog_size
                ),
            )),
        }
    }

    /// The field-level rules: sizes and offsets that fit together without overflow,
    /// level/layout/chunk combinations the kernel would run, a consistent role table.
    fn check_fields(&self, member: &str) -> Result<()> {
        let f = self.features;
        // Kernel: data_offset must clear the superblock (rounded up to a 512-byte
        // block) — for minor version 1.2 it lies after it.
        let sb_sectors = Sectors(wide(self.superblock_bytes().div_ceil(512)));
        let sb_end = self
            .super_offset
            .checked_add(sb_sectors)
            .expect("both small");
        if self.data_offset < sb_end {
            return Err(corrupt(
                member,
                "data_offset",
                format!(
                    "{} overlaps the superblock (ends at sector {})",
                    self.data_offset.0, sb_end.0
                ),
            ));
        }
        if self.data_size.0 < 10 {
            return Err(corrupt(
                member,
                "data_size",
                format!(
                    "{} sectors is below the kernel's minimum of 10",
                    self.data_size.0
                ),
            ));
        }
        if self
            .data_offset
            .checked_add(self.data_size)
            .is_none_or(|end| end.bytes().is_none())
        {
            return Err(corrupt(
                member,
                "data_size",
                format!(
                    "data_offset {} + data_size {} overflows",
                    self.data_offset.0, self.data_size.0
                ),
            ));
        }
        if f.has(Features::RAID0_LAYOUT) && self.level != Level::Raid0 {
            return Err(corrupt(
                member,
                "feature_map",
                format!("raid0-layout bit set on a {} array", self.level),
            ));
        }
        if f.has(Features::PPL) && (f.has(Features::BITMAP_OFFSET) || f.has(Features::JOURNAL)) {
            return Err(corrupt(
                member,
                "feature_map",
                "PPL combined with a bitmap or journal",
            ));
        }
        if self.raid_disks < self.level.min_raid_disks() || self.raid_disks > MAX_DEV_LIMIT {
            return Err(corrupt(
                member,
                "raid_disks",
                format!(
                    "{} is not a valid member count for {}",
                    self.raid_disks, self.level
                ),
            ));
        }
        // Levels > 0 use `size` sectors of every member; mdadm refuses a member that
        // cannot hold them (`load_super1`), journal devices excepted.
        let journal = self.role() == DevRole::JOURNAL;
        if self.level_uses_size() && !journal && self.size > self.data_size {
            return Err(corrupt(
                member,
                "size",
                format!(
                    "component size {} exceeds data_size {}",
                    self.size.0, self.data_size.0
                ),
            ));
        }
        self.check_geometry(member)?;
        if f.has(Features::BITMAP_OFFSET) {
            let start = i128::from(self.super_offset.0) + i128::from(self.bitmap_offset);
            let sb_start = i128::from(self.super_offset.0);
            let sb_stop = i128::from(sb_end.0);
            if start < 0
                || (start >= sb_start && start < sb_stop)
                || start >= i128::from(self.data_offset.0)
            {
                return Err(corrupt(member, "bitmap_offset", format!("{} puts the bitmap at sector {start}, outside the space between superblock and data", self.bitmap_offset)));
            }
        }
        if f.has(Features::BAD_BLOCKS) {
            // The kernel reads at most one page of log and needs to know where it is.
            if self.bblog_size == 0 || self.bblog_size > 8 || self.bblog_offset == 0 {
                return Err(corrupt(
                    member,
                    "bblog",
                    format!(
                        "bad blocks flagged but log is {} sectors at offset {}",
                        self.bblog_size, self.bblog_offset
                    ),
                ));
            }
            if self
                .super_offset
                .0
                .checked_add_signed(i64::from(self.bblog_offset))
                .is_none()
            {
                return Err(corrupt(
                    member,
                    "bblog_offset",
                    format!(
                        "{} points before the start of the member",
                        self.bblog_offset
                    ),
                ));
            }
        }
        self.check_bblog_placement(member, sb_end)?;
        // Active roles must name slots of this array, at most twice (a replacement).
        let slot_limit = u64::from(self.raid_disks)
            + if f.has(Features::RESHAPE_ACTIVE) {
                u64::from(self.reshape.delta_disks.min(0).unsigned_abs())
            } else {
                0
            };
        let mut seen = vec![0u8; small(slot_limit.min(u64::from(MAX_DEV_LIMIT)))];
        for (dev, role) in self.dev_roles.iter().enumerate() {
            if let Some(slot) = role.slot() {
                let count = seen.get_mut(usize::from(slot)).ok_or_else(|| {
                    corrupt(
                        member,
                        "dev_roles",
                        format!(
                            "device {dev} has role {slot}, but the array has {slot_limit} slots"
                        ),
                    )
                })?;
                *count += 1;
                if *count > 2 {
                    return Err(corrupt(
                        member,
                        "dev_roles",
                        format!("role {slot} is held by more than two devices"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Chunk and layout words the kernel's personality would accept.
    fn check_geometry(&self, member: &str) -> Result<()> {
        let chunk = self.chunk;
        if self.level.uses_chunks() {
            // md's chunk_sectors is an int; RAID4/5/6/10 also need a power of two of at
            // least a page, which the create path enforces; RAID0 is laxer in the
            // kernel, and so is this check.
            if chunk.0 == 0 {
                return Err(corrupt(
                    member,
                    "chunksize",
                    format!("0 for {}", self.level),
                ));
            }
            if matches!(
                self.level,
                Level::Raid4 | Level::Raid5 | Level::Raid6 | Level::Raid10
            ) && (!chunk.0.is_power_of_two() || chunk.0 < 8)
            {
                return Err(corrupt(
                    member,
                    "chunksize",
                    format!(
                        "{} sectors: {} needs a power of two of at least 4 KiB",
                        chunk.0, self.level
                    ),
                ));
            }
            if chunk > MAX_CHUNK {
                return Err(corrupt(
                    member,
                    "chunksize",
                    format!(
                        "{} sectors is past md's largest chunk of {} sectors (1 GiB)",
                        chunk.0, MAX_CHUNK.0
                    ),
                ));
            }
            // The component size is rounded down to whole chunks: a chunk larger than it
            // leaves an array of 0 bytes (the kernel: "smaller than chunk_size").
            if self.level_uses_size() && self.role() != DevRole::JOURNAL && self.size < chunk {
                return Err(corrupt(
                    member,
                    "chunksize",
                    format!(
                        "{} sectors is larger than the component size of {} sectors, which \
                         leaves the array no data",
                        chunk.0, self.size.0
                    ),
                ));
            }
        }
        match self.level {
            Level::Raid5 | Level::Raid6
                if ParityAlgorithm::for_level(self.level, self.layout).is_none() =>
            {
                return Err(corrupt(
                    member,
                    "layout",
                    format!("{} is not a {} layout", self.layout, self.level),
                ));
            }
            Level::Raid10 => match Raid10Layout::from_raw(self.layout) {
                Ok(l) if l.copies() >= 2 && l.copies() <= self.raid_disks => {}
                Ok(l) => {
                    return Err(corrupt(
                        member,
                        "layout",
                        format!(
                            "{:#x}: {} copies on {} members",
                            self.layout,
                            l.copies(),
                            self.raid_disks
                        ),
                    ));
                }
                Err(BadRaid10Layout::FarSets(v)) => {
                    return Err(field_error(
                        ErrorKind::Unsupported,
                        member,
                        "layout",
                        format!(
                            "{:#x}: RAID10 far-sets variant {v} is not implemented by cairn",
                            self.layout
                        ),
                    ));
                }
                Err(_) => {
                    return Err(corrupt(
                        member,
                        "layout",
                        format!("{:#x} is not a RAID10 layout", self.layout),
                    ))
                }
            },
            _ => {}
        }
        Ok(())
    }

    /// Whether the level uses `size` (the component size) rather than `data_size`.
    pub fn level_uses_size(&self) -> bool {
        !matches!(self.level, Level::Linear | Level::Raid0)
    }

    /// Number of `dev_roles` entries.
    pub fn max_dev(&self) -> u32 {
        u32::try_from(self.dev_roles.len()).expect("at most MAX_DEV_LIMIT entries")
    }

    /// Bytes covered by the checksum: `256 + 2*max_dev`.
    pub fn superblock_bytes(&self) -> usize {
        FIXED_SIZE + 2 * self.dev_roles.len()
    }

    /// This member's role: `dev_roles[dev_number]`, or spare when the number is past
    /// the table (the kernel's rule).
    pub fn role(&self) -> DevRole {
        usize::try_from(self.dev_number)
            .ok()
            .and_then(|i| self.dev_roles.get(i).copied())
            .unwrap_or(DevRole::SPARE)
    }

    /// Whether the array is marked clean (`resync_offset == MaxSector`).
    pub fn is_clean(&self) -> bool {
        self.resync_offset == Sectors::MAX
    }

    /// The raw struct for these values, `sb_csum` zero.
    fn to_raw(&self) -> RawSuperblock {
        let chunk = u32::try_from(self.chunk.0).unwrap_or(u32::MAX);
        let new_chunk = u32::try_from(self.reshape.new_chunk.0).unwrap_or(u32::MAX);
        RawSuperblock {
            magic: Le32::new(MD_SB_MAGIC),
            major_version: Le32::new(1),
            feature_map: Le32::new(self.features.0),
            pad0: Le32::new(0),
            set_uuid: self.set_uuid.0,
            set_name: self.set_name.0,
            ctime: Le64::new(self.ctime.0),
            level: Le32::from_i32(self.level.to_raw()),
            layout: Le32::new(self.layout),
            size: Le64::new(self.size.0),
            chunksize: Le32::new(chunk),
            raid_disks: Le32::new(self.raid_disks),
            bitmap_offset: Le32::from_i32(self.bitmap_offset),
            new_level: Le32::from_i32(self.reshape.new_level),
            reshape_position: Le64::new(self.reshape.position.0),
            delta_disks: Le32::from_i32(self.reshape.delta_disks),
            new_layout: Le32::new(self.reshape.new_layout),
            new_chunk: Le32::new(new_chunk),
            new_offset: Le32::from_i32(self.reshape.new_offset),
            data_offset: Le64::new(self.data_offset.0),
            data_size: Le64::new(self.data_size.0),
            super_offset: Le64::new(self.super_offset.0),
            recovery_offset: Le64::new(self.recovery_offset.0),
            dev_number: Le32::new(self.dev_number),
            cnt_corrected_read: Le32::new(self.cnt_corrected_read),
            device_uuid: self.device_uuid.0,
            devflags: self.devflags.0,
            bblog_shift: self.bblog_shift,
            bblog_size: Le16::new(self.bblog_size),
            bblog_offset: Le32::from_i32(self.bblog_offset),
            utime: Le64::new(self.utime.0),
            events: Le64::new(self.events),
            resync_offset: Le64::new(self.resync_offset.0),
            sb_csum: Le32::new(0),
            max_dev: Le32::new(self.max_dev()),
            pad3: [0; 32],
        }
    }

    /// The 4096 bytes to write at the superblock offset, checksum filled in. Unused
    /// `dev_roles` space is `0xff`, as mdadm writes it.
    ///
    /// Refuses (with `InvalidArgument`) values that [`Superblock::parse_with`] with
    /// [`FeaturePolicy::KnownToMd`] would refuse, so cairn never writes a superblock it
    /// would not read back.
    pub fn encode(&self) -> Result<Vec<u8>> {
        if self.dev_roles.len() > small(u64::from(MAX_DEV_LIMIT)) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "md superblock: {} dev_roles entries, at most {MAX_DEV_LIMIT} fit",
                    self.dev_roles.len()
                ),
            ));
        }
        if u32::try_from(self.chunk.0).is_err() || u32::try_from(self.reshape.new_chunk.0).is_err()
        {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "md superblock: chunk size does not fit 32 bits",
            ));
        }
        let mut out = vec![0xffu8; SUPERBLOCK_AREA];
        let fixed: &mut [u8; FIXED_SIZE] = (&mut out[..FIXED_SIZE]).try_into().expect("256 bytes");
        self.to_raw().write_to(fixed);
        for (i, role) in self.dev_roles.iter().enumerate() {
            codec::put_le16(&mut out, FIXED_SIZE + 2 * i, role.0);
        }
        let csum = checksum(&out, self.max_dev());
        codec::put_le32(&mut out, CSUM_OFFSET, csum);
        Self::parse_with(&out, "(being encoded)", FeaturePolicy::KnownToMd)
            .map_err(|e| e.with_kind(ErrorKind::InvalidArgument))?;
        Ok(out)
    }

    /// The checksum `encode` stores for these values.
    pub fn checksum(&self) -> u32 {
        let mut buf = vec![0u8; self.superblock_bytes()];
        let fixed: &mut [u8; FIXED_SIZE] = (&mut buf[..FIXED_SIZE]).try_into().expect("256 bytes");
        self.to_raw().write_to(fixed);
        for (i, role) in self.dev_roles.iter().enumerate() {
            codec::put_le16(&mut buf, FIXED_SIZE + 2 * i, role.0);
        }
        checksum(&buf, self.max_dev())
    }

    /// Reads, parses and size-checks the v1.2 superblock of `dev` (the 4096 bytes at
    /// byte 4096). `member` names the device in errors.
    pub fn read_from(
        dev: &dyn BlockDevice,
        member: &str,
        policy: FeaturePolicy,
    ) -> Result<Superblock> {
        let sb = Self::read_any_size(dev, member, policy)?;
        sb.check_member_size(Sectors::from_bytes_floor(dev.geometry().size), member)?;
        Ok(sb)
    }

    /// [`Superblock::read_from`] without the member-size check: assembly leaves a
    /// member smaller than its superblock says out (degraded) rather than failing.
    pub(crate) fn read_any_size(
        dev: &dyn BlockDevice,
        member: &str,
        policy: FeaturePolicy,
    ) -> Result<Superblock> {
        let size = dev.geometry().size;
        let area = u64::try_from(SUPERBLOCK_AREA).expect("4096");
        if size < SUPERBLOCK_BYTE_OFFSET + area {
            return Err(corrupt(
                member,
                "length",
                format!("device of {size} bytes cannot hold a v1.2 superblock"),
            ));
        }
        let mut buf = vec![0u8; SUPERBLOCK_AREA];
        dev.read_at(&mut buf, SUPERBLOCK_BYTE_OFFSET)
            .map_err(|e| e.context(format!("reading md superblock on {member}")))?;
        Self::parse_with(&buf, member, policy)
    }

    /// Writes the encoded superblock to `dev` at byte 4096, durable on return (FUA).
    pub fn write_to(&self, dev: &dyn BlockDevice, member: &str) -> Result<()> {
        let bytes = self.encode()?;
        dev.write_at(&bytes, SUPERBLOCK_BYTE_OFFSET, WriteFlags::FUA)
            .map_err(|e| e.context(format!("writing md superblock on {member}")))
    }

    /// The device checks that need the member's size (kernel `super_1_load`, mdadm
    /// `load_super1`): the member holds `data_offset + data_size` sectors, and, for
    /// levels that use it, `data_offset + size`.
    pub fn check_member_size(&self, member_sectors: Sectors, member: &str) -> Result<()> {
        let end = self
            .data_offset
            .checked_add(self.data_size)
            .expect("checked at parse");
        if end > member_sectors {
            return Err(corrupt(
                member,
                "data_size",
                format!(
                    "data ends at sector {} but the member has {} sectors",
                    end.0, member_sectors.0
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A plausible member 0 of a 4-member RAID5 on 64 MiB members.
    pub(crate) fn sample() -> Superblock {
        let mut roles = vec![DevRole::SPARE; 128];
        for (i, r) in roles.iter_mut().take(4).enumerate() {
            *r = DevRole::active(u16::try_from(i).unwrap());
        }
        Superblock {
            features: Features(0),
            set_uuid: "01234567:89abcdef:01234567:89abcdef".parse().unwrap(),
            set_name: SetName::from_parts(Some("host"), "0"),
            ctime: MdTime::from_secs(1_700_000_000),
            level: Level::Raid5,
            layout: 2,
            size: Sectors(126_976),
            chunk: Sectors(1024),
            raid_disks: 4,
            bitmap_offset: 0,
            reshape: Reshape::default(),
            data_offset: Sectors(4096),
            data_size: Sectors(126_976),
            super_offset: SUPER_OFFSET_1_2,
            recovery_offset: Sectors(0),
            dev_number: 0,
            cnt_corrected_read: 0,
            device_uuid: Uuid([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0]),
            devflags: DevFlags(0),
            bblog_shift: 0,
            bblog_size: 8,
            bblog_offset: 16,
            utime: MdTime::from_secs(1_700_000_000),
            events: 1,
            resync_offset: Sectors::MAX,
            dev_roles: roles,
        }
    }

    #[test]
    fn checksum_matches_the_documented_example() {
        // verification.md §2.1 prints "Checksum : 968c625d - correct" for exactly this
        // superblock (events 1, clean, device UUID ...:00001000).
        let sb = sample();
        assert_eq!(sb.checksum(), 0x968c_625d);
        let bytes = sb.encode().unwrap();
        assert_eq!(&bytes[216..220], &0x968c_625du32.to_le_bytes());
        assert_eq!(Superblock::parse(&bytes, "m0").unwrap(), sb);
    }

    #[test]
    fn checksum_with_odd_max_dev_adds_the_last_half_word() {
        let mut sb = sample();
        sb.dev_roles.truncate(5);
        let bytes = sb.encode().unwrap();
        // Recompute by hand: words of the first 256+10 bytes, csum field as zero.
        let mut sum: u64 = 0;
        for i in (0..264).step_by(4) {
            if i != 216 {
                sum += u64::from(u32::from_le_bytes(bytes[i..i + 4].try_into().unwrap()));
            }
        }
        sum += u64::from(u16::from_le_bytes([bytes[264], bytes[265]]));
        let want = ((sum & 0xffff_ffff) + (sum >> 32)) & 0xffff_ffff;
        assert_eq!(u64::from(checksum(&bytes, 5)), want);
        assert_eq!(Superblock::parse(&bytes, "m").unwrap(), sb);
    }

    fn expect_err(bytes: &[u8], kind: ErrorKind, needle: &str) {
        let e = Superblock::parse(bytes, "disk3.img").unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.kind(), kind, "{msg}");
        assert!(msg.contains("disk3.img"), "{msg}");
        assert!(msg.contains(needle), "{msg} should mention {needle}");
    }

    /// Rewrites a little-endian field and fixes the checksum, so that only the field's
    /// own rule can fail.
    fn patch(bytes: &[u8], off: usize, new: &[u8]) -> Vec<u8> {
        let mut b = bytes.to_vec();
        b[off..off + new.len()].copy_from_slice(new);
        let max_dev = u32::from_le_bytes(b[220..224].try_into().unwrap());
        let max_dev = max_dev.min(MAX_DEV_LIMIT);
        let c = checksum(&b, max_dev);
        b[216..220].copy_from_slice(&c.to_le_bytes());
        b
    }

    #[test]
    fn every_refusal_names_member_and_field() {
        let good = sample().encode().unwrap();
        let c = ErrorKind::Corrupt;
        expect_err(&good[..100], c, "length");
        expect_err(&patch(&good, 0, &[0, 0, 0, 0]), c, "magic");
        expect_err(&patch(&good, 4, &2u32.to_le_bytes()), c, "major_version");
        expect_err(&patch(&good, 220, &1921u32.to_le_bytes()), c, "max_dev");
        expect_err(&patch(&good, 144, &0u64.to_le_bytes()), c, "super_offset");
        expect_err(&patch(&good, 8, &0x4000u32.to_le_bytes()), c, "feature_map");
        expect_err(
            &patch(&good, 8, &4u32.to_le_bytes()),
            ErrorKind::Unsupported,
            "reshape-active",
        );
        let mut bad_csum = good.clone();
        bad_csum[216] ^= 1;
        expect_err(&bad_csum, c, "sb_csum");
        let mut flipped = good.clone();
        flipped[100] ^= 0x40;
        expect_err(&flipped, c, "sb_csum");
        expect_err(&patch(&good, 12, &1u32.to_le_bytes()), c, "pad0");
        expect_err(&patch(&good, 240, &[1]), c, "pad3");
        expect_err(&patch(&good, 72, &3u32.to_le_bytes()), c, "level");
        expect_err(
            &patch(&good, 72, &(-4i32).to_le_bytes()),
            ErrorKind::Unsupported,
            "level",
        );
        expect_err(&patch(&good, 128, &8u64.to_le_bytes()), c, "data_offset");
        expect_err(&patch(&good, 136, &9u64.to_le_bytes()), c, "data_size");
        expect_err(&patch(&good, 136, &u64::MAX.to_le_bytes()), c, "data_size");
        expect_err(&patch(&good, 80, &200_000u64.to_le_bytes()), c, "size");
        expect_err(
            &patch(&good, 8, &0x1000u32.to_le_bytes()),
            c,
            "raid0-layout",
        );
        expect_err(&patch(&good, 92, &1u32.to_le_bytes()), c, "raid_disks");
        expect_err(&patch(&good, 88, &0u32.to_le_bytes()), c, "chunksize");
        expect_err(&patch(&good, 88, &24u32.to_le_bytes()), c, "chunksize");
        expect_err(&patch(&good, 76, &8u32.to_le_bytes()), c, "layout");
        expect_err(&patch(&good, 256 + 8, &7u16.to_le_bytes()), c, "dev_roles");
        let mut three = patch(&good, 256 + 8, &1u16.to_le_bytes());
        three = patch(&three, 256 + 10, &1u16.to_le_bytes());
        expect_err(&three, c, "dev_roles");
        // Bitmap offset must land between superblock and data.
        let with_bitmap = patch(&good, 8, &1u32.to_le_bytes());
        expect_err(
            &patch(&with_bitmap, 96, &0i32.to_le_bytes()),
            c,
            "bitmap_offset",
        );
        expect_err(
            &patch(&with_bitmap, 96, &5000i32.to_le_bytes()),
            c,
            "bitmap_offset",
        );
        let ok = patch(&with_bitmap, 96, &8i32.to_le_bytes());
        assert_eq!(Superblock::parse(&ok, "m").unwrap().bitmap_offset, 8);
        // Bad blocks flagged without a log.
        let bb = patch(&good, 8, &8u32.to_le_bytes());
        assert!(Superblock::parse(&bb, "m").is_ok());
        expect_err(&patch(&bb, 186, &0u16.to_le_bytes()), c, "bblog");
    }

    /// A bad-block log inside the data area (data_offset 24 with the log at its usual
    /// place, 16 sectors after the superblock: sectors 24..32) or on the superblock is
    /// refused with a sentence, behind a valid checksum, with or without the feature bit.
    #[test]
    fn a_bad_block_log_over_data_or_superblock_is_refused() {
        let c = ErrorKind::Corrupt;
        // cairn's encoder refuses to write one at all.
        let mut sb = sample();
        sb.data_offset = Sectors(24);
        assert!(sb.encode().is_err());
        let good = sample().encode().unwrap();
        let over_data = patch(&good, 128, &24u64.to_le_bytes());
        let e = Superblock::parse(&over_data, "m").unwrap_err();
        assert_eq!(e.kind(), c);
        assert!(
            e.to_string().contains(
                "bblog_offset: the bad-block log (8 sectors at sector 24) overlaps the data \
                 area (sectors 24.."
            ),
            "{e}"
        );
        expect_err(
            &patch(&over_data, 8, &8u32.to_le_bytes()),
            c,
            "overlaps the data",
        );
        expect_err(
            &patch(&good, 188, &(-4i32).to_le_bytes()),
            c,
            "overlaps the superblock",
        );
        expect_err(
            &patch(&good, 188, &(-9i32).to_le_bytes()),
            c,
            "starts before the member",
        );
        // Its usual place with room for it is fine.
        assert!(Superblock::parse(&patch(&good, 128, &32u64.to_le_bytes()), "m").is_ok());
    }

    #[test]
    fn lenient_policy_accepts_md_features_cairn_lacks() {
        let good = sample().encode().unwrap();
        let reshaping = patch(&good, 8, &4u32.to_le_bytes());
        let sb = Superblock::parse_with(&reshaping, "m", FeaturePolicy::KnownToMd).unwrap();
        assert!(sb.features.has(Features::RESHAPE_ACTIVE));
        assert_eq!(sb.encode().unwrap(), reshaping);
    }

    #[test]
    fn through_a_block_device() {
        use cairn_block::MemDisk;
        let sb = sample();
        let disk = MemDisk::new(131_072 * 512);
        assert!(!looks_like_md(&disk.to_vec()[4096..]));
        sb.write_to(&disk, "mem0").unwrap();
        let image = disk.to_vec();
        assert!(looks_like_md(&image[4096..]));
        assert_eq!(&image[4096..8192], sb.encode().unwrap().as_slice());
        let back = Superblock::read_from(&disk, "mem0", FeaturePolicy::Supported).unwrap();
        assert_eq!(back, sb);
        // A device too small for the data the superblock describes.
        let short = MemDisk::from_bytes(&image[..100_000 * 512]);
        let e = Superblock::read_from(&short, "short0", FeaturePolicy::Supported).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        assert!(e.to_string().contains("short0"), "{e}");
        let tiny = MemDisk::new(4096);
        assert!(Superblock::read_from(&tiny, "tiny", FeaturePolicy::Supported).is_err());
    }

    #[test]
    fn member_size_check() {
        let sb = sample();
        assert!(sb.check_member_size(Sectors(131_072), "m").is_ok());
        let e = sb.check_member_size(Sectors(131_071), "m").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
    }

    #[test]
    fn names_and_uuids() {
        assert_eq!(SetName::from_parts(Some("host"), "0").to_string(), "host:0");
        assert_eq!(SetName::from_parts(Some("host"), "a:b").to_string(), "a:b");
        let long = "x".repeat(40);
        assert_eq!(
            SetName::from_parts(Some("host"), &long).to_string(),
            "x".repeat(31)
        );
        assert_eq!(
            SetName::from_parts(Some(&"h".repeat(27)), "name").to_string(),
            "name"
        );
        assert_eq!(
            SetName::from_parts(Some(&"h".repeat(26)), "name")
                .to_string()
                .len(),
            31
        );
        let n = SetName::from_parts(Some("host"), "data");
        assert_eq!(n.homehost().as_deref(), Some("host"));
        assert_eq!(n.short_name(), "data");
        let u: Uuid = "01234567-89ab-cdef-0123-456789abcdef".parse().unwrap();
        assert_eq!(u.to_string(), "01234567:89abcdef:01234567:89abcdef");
        assert!("0123".parse::<Uuid>().is_err());
        assert_eq!(MdTime((5 << 40) | 77).secs(), 77);
        assert_eq!(MdTime((5 << 40) | 77).micros(), 5);
    }
}
