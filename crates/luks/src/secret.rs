//! Key material: bytes that are zeroed when dropped and never printed.
//!
//! Passphrases, volume keys, keyslot KEKs and AF-split material all live in
//! [`SecretBytes`]. Its `Debug` says only how long it is, and nothing in this crate
//! formats its contents into an error or a log line.

use std::fmt;

use zeroize::{Zeroize, Zeroizing};

/// A heap buffer of secret bytes, zeroed on drop. Its length is fixed at creation so the
/// buffer is never reallocated (a reallocation would leave an unzeroed copy behind).
#[derive(Clone)]
pub struct SecretBytes(Zeroizing<Box<[u8]>>);

impl SecretBytes {
    /// `len` zero bytes, to be filled in place.
    pub fn zeroed(len: usize) -> SecretBytes {
        SecretBytes(Zeroizing::new(vec![0u8; len].into_boxed_slice()))
    }

    /// Copies `bytes`. The caller remains responsible for its own copy.
    pub fn from_slice(bytes: &[u8]) -> SecretBytes {
        let mut s = SecretBytes::zeroed(bytes.len());
        s.0.copy_from_slice(bytes);
        s
    }

    /// Takes ownership of `v` without copying it (a `Vec` with spare capacity is shrunk
    /// first, which may copy; build the vector with its final length to avoid that).
    pub fn from_vec(mut v: Vec<u8>) -> SecretBytes {
        if v.capacity() != v.len() {
            let s = SecretBytes::from_slice(&v);
            v.zeroize();
            return s;
        }
        SecretBytes(Zeroizing::new(v.into_boxed_slice()))
    }

    /// `len` bytes from the operating system's random source.
    pub fn random(len: usize) -> SecretBytes {
        let mut s = SecretBytes::zeroed(len);
        crate::random_fill(&mut s.0);
        s
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn as_mut_bytes(&mut self) -> &mut [u8] {
        &mut self.0
    }
}

impl fmt::Debug for SecretBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretBytes(<{} bytes redacted>)", self.0.len())
    }
}

impl PartialEq for SecretBytes {
    /// Constant-time in the contents (the length is not secret).
    fn eq(&self, other: &SecretBytes) -> bool {
        ct_eq(&self.0, &other.0)
    }
}

impl Eq for SecretBytes {}

/// Compares two byte strings without an early exit on the first difference.
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// The volume (master) key: the whole dm-crypt key of the data segment.
#[derive(Clone, PartialEq, Eq)]
pub struct VolumeKey(SecretBytes);

impl VolumeKey {
    pub fn from_bytes(bytes: &[u8]) -> VolumeKey {
        VolumeKey(SecretBytes::from_slice(bytes))
    }

    pub fn random(len: usize) -> VolumeKey {
        VolumeKey(SecretBytes::random(len))
    }

    pub(crate) fn from_secret(s: SecretBytes) -> VolumeKey {
        VolumeKey(s)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The raw key, for `--dump-volume-key`-style tools and tests. Handle with care.
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for VolumeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VolumeKey(<{} bytes redacted>)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_contents() {
        let s = SecretBytes::from_slice(b"hunter2-hunter2");
        let d = format!("{s:?}");
        assert!(!d.contains("hunter2") && !d.contains("104"), "{d}");
        let vk = VolumeKey::from_bytes(&[0xab; 32]);
        let d = format!("{vk:?}");
        assert!(!d.contains("ab") && !d.contains("171"), "{d}");
    }

    #[test]
    fn ct_eq_compares() {
        assert!(ct_eq(b"abc", b"abc"));
        assert!(!ct_eq(b"abc", b"abd"));
        assert!(!ct_eq(b"abc", b"ab"));
    }
}
