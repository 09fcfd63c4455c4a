//! Fixed-endian integers at byte offsets: the one byte codec every on-disk and wire format
//! in cairn reads and writes with.
//!
//! ```text
//!   md superblock, bitmap, PPL   little-endian   le16/le32/le64, put_le*
//!   LVM2 label, mda header       little-endian
//!   LUKS1/LUKS2 binary header    big-endian      be16/be32/be64, put_be*
//!   NBD handshake and requests   big-endian      (and Reader/Writer cursors)
//! ```
//!
//! Records of a fixed size (`[u8; N]`) use the `*_at::<OFFSET, _>` forms, whose offsets
//! the compiler checks against `N`.
//!
//! Reads take bytes that came from a disk or a socket, so a short buffer is bad input:
//! they return [`Short`] (which turns into an [`ErrorKind::Corrupt`] error) instead of
//! panicking. Writes go into buffers the encoder sized itself, so a `put_*` past the end
//! is a bug in that encoder and panics like a slice index would.

use std::fmt;

use crate::{Error, ErrorKind};

/// A read reached past the end of its buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Short {
    /// Where the field starts.
    pub at: usize,
    /// How many bytes the field has.
    pub need: usize,
    /// How many bytes the buffer has.
    pub have: usize,
}

impl fmt::Display for Short {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a {}-byte field at byte {} lies past the end of a {}-byte record",
            self.need, self.at, self.have
        )
    }
}

impl std::error::Error for Short {}

impl From<Short> for Error {
    fn from(s: Short) -> Error {
        Error::new(ErrorKind::Corrupt, s.to_string())
    }
}

/// The `N` bytes at `at`.
pub fn array<const N: usize>(b: &[u8], at: usize) -> Result<[u8; N], Short> {
    at.checked_add(N)
        .and_then(|end| b.get(at..end))
        .and_then(|s| s.try_into().ok())
        .ok_or(Short {
            at,
            need: N,
            have: b.len(),
        })
}

/// The `len` bytes at `at`.
pub fn slice(b: &[u8], at: usize, len: usize) -> Result<&[u8], Short> {
    at.checked_add(len)
        .and_then(|end| b.get(at..end))
        .ok_or(Short {
            at,
            need: len,
            have: b.len(),
        })
}

macro_rules! codec {
    ($($get:ident $put:ident $ty:ty, $from:ident $to:ident;)*) => {$(
        #[doc = concat!("The `", stringify!($ty), "` at byte `at`, ", stringify!($from), ".")]
        pub fn $get(b: &[u8], at: usize) -> Result<$ty, Short> {
            array(b, at).map(<$ty>::$from)
        }
        #[doc = concat!("Stores `v` at byte `at`, ", stringify!($to), ". Panics past the end (an encoder bug).")]
        pub fn $put(b: &mut [u8], at: usize, v: $ty) {
            const N: usize = std::mem::size_of::<$ty>();
            b[at..at + N].copy_from_slice(&v.$to());
        }
    )*};
}

codec! {
    le16 put_le16 u16, from_le_bytes to_le_bytes;
    le32 put_le32 u32, from_le_bytes to_le_bytes;
    le64 put_le64 u64, from_le_bytes to_le_bytes;
    le_i32 put_le_i32 i32, from_le_bytes to_le_bytes;
    be16 put_be16 u16, from_be_bytes to_be_bytes;
    be32 put_be32 u32, from_be_bytes to_be_bytes;
    be64 put_be64 u64, from_be_bytes to_be_bytes;
}

macro_rules! fixed {
    ($($get:ident $put:ident $ty:ty, $from:ident $to:ident;)*) => {$(
        #[doc = concat!("The `", stringify!($ty), "` at byte `AT` of a fixed-size record, ", stringify!($from), "; the offset is checked when compiling.")]
        pub fn $get<const AT: usize, const N: usize>(b: &[u8; N]) -> $ty {
            const W: usize = std::mem::size_of::<$ty>();
            const { assert!(AT + W <= N, "field past the end of the record") };
            let mut a = [0u8; W];
            a.copy_from_slice(&b[AT..AT + W]);
            <$ty>::$from(a)
        }
        #[doc = concat!("Stores `v` at byte `AT` of a fixed-size record, ", stringify!($to), "; the offset is checked when compiling.")]
        pub fn $put<const AT: usize, const N: usize>(b: &mut [u8; N], v: $ty) {
            const W: usize = std::mem::size_of::<$ty>();
            const { assert!(AT + W <= N, "field past the end of the record") };
            b[AT..AT + W].copy_from_slice(&v.$to());
        }
    )*};
}

fixed! {
    le16_at put_le16_at u16, from_le_bytes to_le_bytes;
    le32_at put_le32_at u32, from_le_bytes to_le_bytes;
    le64_at put_le64_at u64, from_le_bytes to_le_bytes;
    be16_at put_be16_at u16, from_be_bytes to_be_bytes;
    be32_at put_be32_at u32, from_be_bytes to_be_bytes;
    be64_at put_be64_at u64, from_be_bytes to_be_bytes;
}

/// A read cursor: each call takes the next field and moves past it.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

macro_rules! reader {
    ($($name:ident $ty:ty, $from:ident;)*) => {$(
        #[doc = concat!("The next `", stringify!($ty), "`, ", stringify!($from), ".")]
        pub fn $name(&mut self) -> Result<$ty, Short> {
            let v = array(self.b, self.pos).map(<$ty>::$from)?;
            self.pos += std::mem::size_of::<$ty>();
            Ok(v)
        }
    )*};
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { b, pos: 0 }
    }

    reader! {
        le16 u16, from_le_bytes;
        le32 u32, from_le_bytes;
        le64 u64, from_le_bytes;
        be16 u16, from_be_bytes;
        be32 u32, from_be_bytes;
        be64 u64, from_be_bytes;
    }

    /// The next `len` bytes.
    pub fn bytes(&mut self, len: usize) -> Result<&'a [u8], Short> {
        let s = slice(self.b, self.pos, len)?;
        self.pos += len;
        Ok(s)
    }

    /// Where the next field starts.
    pub fn position(&self) -> usize {
        self.pos
    }

    /// The bytes not read yet.
    pub fn rest(&self) -> &'a [u8] {
        &self.b[self.pos..]
    }
}

/// A write cursor that appends to a growing buffer (wire messages of varying length).
#[derive(Debug, Clone, Default)]
pub struct Writer {
    v: Vec<u8>,
}

macro_rules! writer {
    ($($name:ident $ty:ty, $to:ident;)*) => {$(
        #[doc = concat!("Appends a `", stringify!($ty), "`, ", stringify!($to), ".")]
        pub fn $name(mut self, x: $ty) -> Writer {
            self.v.extend_from_slice(&x.$to());
            self
        }
    )*};
}

impl Writer {
    pub fn new() -> Writer {
        Writer::default()
    }

    writer! {
        le16 u16, to_le_bytes;
        le32 u32, to_le_bytes;
        le64 u64, to_le_bytes;
        be16 u16, to_be_bytes;
        be32 u32, to_be_bytes;
        be64 u64, to_be_bytes;
    }

    pub fn bytes(mut self, b: &[u8]) -> Writer {
        self.v.extend_from_slice(b);
        self
    }

    pub fn into_vec(self) -> Vec<u8> {
        self.v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_ends_at_offsets() {
        let mut b = [0u8; 16];
        put_le32(&mut b, 1, 0x0102_0304);
        assert_eq!(b[1..5], [4, 3, 2, 1]);
        assert_eq!(le32(&b, 1), Ok(0x0102_0304));
        put_be64(&mut b, 8, 0x0102_0304_0506_0708);
        assert_eq!(b[8..], [1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(be64(&b, 8), Ok(0x0102_0304_0506_0708));
        assert_eq!(le64(&b, 8), Ok(0x0807_0605_0403_0201));
        put_be16(&mut b, 0, 0xabcd);
        assert_eq!(be16(&b, 0), Ok(0xabcd));
        assert_eq!(le16(&b, 0), Ok(0xcdab));
        put_le_i32(&mut b, 4, -2);
        assert_eq!(le_i32(&b, 4), Ok(-2));
    }

    #[test]
    fn fixed_records() {
        let mut h = [0u8; 12];
        put_be32_at::<0, _>(&mut h, 0x2560_9513);
        put_le64_at::<4, _>(&mut h, 5);
        assert_eq!(be32_at::<0, _>(&h), 0x2560_9513);
        assert_eq!(le64_at::<4, _>(&h), 5);
        assert_eq!(le32(&h, 4), Ok(5));
    }

    #[test]
    fn short_input_is_an_error_not_a_panic() {
        let b = [0u8; 7];
        assert_eq!(
            le64(&b, 0),
            Err(Short {
                at: 0,
                need: 8,
                have: 7
            })
        );
        assert!(be32(&b, 4).is_err());
        assert!(be32(&b, 3).is_ok());
        assert!(le16(&b, usize::MAX).is_err());
        assert!(slice(&b, usize::MAX, 2).is_err());
        let e: Error = le64(&b, 0).unwrap_err().into();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
    }

    #[test]
    fn cursors_round_trip() {
        let v = Writer::new()
            .be32(7)
            .be16(0x0102)
            .le64(9)
            .bytes(b"ab")
            .into_vec();
        assert_eq!(v.len(), 16);
        let mut r = Reader::new(&v);
        assert_eq!(r.be32(), Ok(7));
        assert_eq!(r.be16(), Ok(0x0102));
        assert_eq!(r.le64(), Ok(9));
        assert_eq!(r.position(), 14);
        assert_eq!(r.bytes(2), Ok(&b"ab"[..]));
        assert!(r.be16().is_err());
        assert_eq!(r.position(), 16, "a failed read does not move the cursor");
        assert!(r.rest().is_empty());
    }
}
