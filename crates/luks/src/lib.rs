//! cairn's crypt layer: LUKS2 (format, open, keyslot management) and LUKS1 (open), with
//! the AES-XTS data path, compatible with `cryptsetup` on disk.
//!
//! ```text
//!   NBD export / LVM above
//!     CryptDevice            device.rs   decrypt on read, encrypt on write (xts.rs)
//!   Luks2 / Luks1            volume.rs, luks1.rs: headers -> keyslots -> volume key
//!     ondisk.rs (LUKS2 binary headers + JSON), keyslot.rs (KDF, AF, digest)
//!   BlockDevice below        a file, a block device, an md array
//! ```
//!
//! Formats: `../shared/docs/ondisk-formats.md` §2 (LUKS2) and §3 (LUKS1). Key material
//! (passphrases, volume keys, KEKs, AF material) lives in [`SecretBytes`]/[`VolumeKey`],
//! zeroed on drop and never printed. A passphrase that opens nothing is
//! [`ErrorKind::AuthFailed`](cairn_block::ErrorKind::AuthFailed) "no key available with
//! this passphrase".
//!
//! The CLI maps onto this API one verb to one call: `format` -> [`Luks2::format`],
//! `open`/`serve --luks` -> [`open_any`], `dump` -> [`Luks::load`] + `dump_text`/`dump_json`,
//! `add-key`/`remove-key`/`change-key` -> [`Luks2::add_key`]/[`Luks2::remove_key`]/
//! [`Luks2::change_key`], `test` -> [`Luks::test_passphrase`],
//! `header-backup`/`header-restore` -> [`Luks2::header_backup`]/[`Luks2::header_restore`].

pub mod device;
pub mod keyslot;
pub mod luks1;
pub mod ondisk;
pub mod secret;
pub mod volume;
pub mod xts;

use std::sync::Arc;

use cairn_block::{BlockDevice, Error, ErrorKind, Result};

pub use device::CryptDevice;
pub use keyslot::{max_kdf_time, set_max_kdf_time, Hash, NO_KEY};
pub use luks1::Luks1;
pub use secret::{SecretBytes, VolumeKey};
pub use volume::{Dump, FormatOptions, KeyslotOptions, Luks2, PbkdfKind, PbkdfOptions, Unlocked};

/// Fills `buf` from the operating system's random source.
pub(crate) fn random_fill(buf: &mut [u8]) {
    use rand::RngCore;
    rand::rngs::OsRng.fill_bytes(buf);
}

/// Which LUKS version a device holds, from its signatures (§5, `cairn_block::probe`),
/// without validating it:
/// `Some(1)`, `Some(2)` (including a LUKS2 device whose primary header is destroyed but
/// whose secondary is there), or `None`.
pub fn probe(device: &dyn BlockDevice) -> Result<Option<u16>> {
    Ok(cairn_block::probe::probe(device)?.luks_version())
}

/// A LUKS header of either version.
// One per opened volume, never in a hot path: the size difference does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Luks {
    V1(Luks1),
    V2(Luks2),
}

impl Luks {
    /// Detects the version and loads the header (writes nothing).
    pub fn load(device: Arc<dyn BlockDevice>) -> Result<Luks> {
        match probe(&*device)? {
            Some(1) => Ok(Luks::V1(Luks1::load(device)?)),
            Some(_) => Ok(Luks::V2(Luks2::load(device)?)),
            None => Err(Error::new(
                ErrorKind::Corrupt,
                "not a LUKS device (no LUKS signature)",
            )),
        }
    }

    pub fn version(&self) -> u16 {
        match self {
            Luks::V1(_) => 1,
            Luks::V2(_) => 2,
        }
    }

    pub fn unlock(&self, passphrase: &[u8], keyslot: Option<u32>) -> Result<Unlocked> {
        match self {
            Luks::V1(l) => l.unlock(passphrase, keyslot),
            Luks::V2(l) => l.unlock(passphrase, keyslot),
        }
    }

    pub fn test_passphrase(&self, passphrase: &[u8], keyslot: Option<u32>) -> Result<u32> {
        self.unlock(passphrase, keyslot).map(|u| u.keyslot)
    }

    pub fn activate(&self, key: &VolumeKey) -> Result<CryptDevice> {
        match self {
            Luks::V1(l) => l.activate(key),
            Luks::V2(l) => l.activate(key),
        }
    }

    /// `luksDump`-style text.
    pub fn dump_text(&self) -> String {
        match self {
            Luks::V1(l) => {
                let h = l.dump();
                let mut s = format!(
                    "LUKS header information for {}\n\nVersion:       \t1\nCipher name:   \t{}\nCipher mode:   \t{}\nHash spec:     \t{}\nPayload offset:\t{}\nMK bits:       \t{}\nMK iterations: \t{}\nUUID:          \t{}\n\n",
                    l.device().geometry().size,
                    h.cipher_name, h.cipher_mode, h.hash_spec, h.payload_offset,
                    h.key_bytes * 8, h.mk_digest_iterations, h.uuid
                );
                for (i, k) in h.keyslots.iter().enumerate() {
                    if k.active {
                        s += &format!(
                            "Key Slot {i}: ENABLED\n\tIterations:         \t{}\n\tKey material offset:\t{}\n\tAF stripes:         \t{}\n",
                            k.iterations, k.key_material_offset, k.stripes
                        );
                    } else {
                        s += &format!("Key Slot {i}: DISABLED\n");
                    }
                }
                s
            }
            Luks::V2(l) => l.dump().to_string(),
        }
    }

    /// A serialisable description (no key material).
    pub fn dump_json(&self) -> serde_json::Value {
        match self {
            Luks::V1(l) => {
                let mut v = serde_json::to_value(l.dump()).unwrap_or_default();
                if let Some(o) = v.as_object_mut() {
                    o.insert("version".into(), 1.into());
                }
                v
            }
            Luks::V2(l) => serde_json::to_value(l.dump()).unwrap_or_default(),
        }
    }
}

/// Opens a LUKS1 or LUKS2 device with `passphrase` and returns its decrypted payload
/// (what `cairn serve --luks` serves).
pub fn open_any(device: Arc<dyn BlockDevice>, passphrase: &[u8]) -> Result<CryptDevice> {
    let l = Luks::load(device)?;
    if let Luks::V2(v2) = &l {
        v2.check_activatable()?;
    }
    let u = l.unlock(passphrase, None)?;
    l.activate(&u.volume_key)
}
