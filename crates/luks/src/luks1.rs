//! LUKS1: open and serve existing volumes (`ondisk-formats.md` §3). The header is only
//! read; the data is read and written.
//!
//! ```text
//!   0       phdr (592 bytes): cipher, mode, hash, payloadOffset, key digest, 8 keyslots
//!   km*512  keyslot i's AF material, encrypted with the volume cipher under its KEK
//!   payload encrypted data, 512-byte sectors, IV counting from 0 at payloadOffset
//! ```

use std::sync::Arc;

use cairn_block::codec::{be16, be32};
use cairn_block::{BlockDevice, Error, ErrorKind, Result};
use serde::Serialize;

use crate::device::{CryptDevice, SegmentParams};
use crate::keyslot::{self, af_merge, corrupt, read_secret, Hash, NO_KEY};
use crate::secret::{ct_eq, SecretBytes, VolumeKey};
use crate::volume::Unlocked;
use crate::xts::{CipherSpec, SectorCipher};

pub const MAGIC: [u8; 6] = *b"LUKS\xba\xbe";
pub const HEADER_SIZE: usize = 592;
pub const KEYSLOTS: usize = 8;
const KEY_ENABLED: u32 = 0x00AC_71F3;
const KEY_DISABLED: u32 = 0x0000_DEAD;
const STRIPES: u32 = 4000;

/// Field offsets of `struct luks_phdr`.
pub mod off {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = MAGIC + 6;
    pub const CIPHER_NAME: usize = VERSION + 2;
    pub const CIPHER_MODE: usize = CIPHER_NAME + 32;
    pub const HASH_SPEC: usize = CIPHER_MODE + 32;
    pub const PAYLOAD_OFFSET: usize = HASH_SPEC + 32;
    pub const KEY_BYTES: usize = PAYLOAD_OFFSET + 4;
    pub const MK_DIGEST: usize = KEY_BYTES + 4;
    pub const MK_DIGEST_SALT: usize = MK_DIGEST + 20;
    pub const MK_DIGEST_ITER: usize = MK_DIGEST_SALT + 32;
    pub const UUID: usize = MK_DIGEST_ITER + 4;
    pub const KEYBLOCK: usize = UUID + 40;
    /// One keyslot: active, iterations, salt[32], keyMaterialOffset, stripes.
    pub const KEYBLOCK_SIZE: usize = 4 + 4 + 32 + 4 + 4;
    pub const END: usize = KEYBLOCK + 8 * KEYBLOCK_SIZE;
}

/// `struct luks_phdr` as on disk.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawLuks1Header {
    pub magic: [u8; 6],
    pub version: [u8; 2],
    pub cipher_name: [u8; 32],
    pub cipher_mode: [u8; 32],
    pub hash_spec: [u8; 32],
    pub payload_offset: [u8; 4],
    pub key_bytes: [u8; 4],
    pub mk_digest: [u8; 20],
    pub mk_digest_salt: [u8; 32],
    pub mk_digest_iterations: [u8; 4],
    pub uuid: [u8; 40],
    pub keyblock: [[u8; off::KEYBLOCK_SIZE]; 8],
}

const _: () = assert!(size_of::<RawLuks1Header>() == HEADER_SIZE);
const _: () = assert!(off::END == HEADER_SIZE);

fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&x| x == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// One LUKS1 keyslot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Luks1Keyslot {
    pub active: bool,
    pub iterations: u32,
    #[serde(skip)]
    pub salt: [u8; 32],
    /// In 512-byte sectors.
    pub key_material_offset: u32,
    pub stripes: u32,
}

/// The parsed LUKS1 header.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Luks1Header {
    pub cipher_name: String,
    pub cipher_mode: String,
    pub hash_spec: String,
    /// In 512-byte sectors.
    pub payload_offset: u32,
    pub key_bytes: u32,
    #[serde(skip)]
    pub mk_digest: [u8; 20],
    #[serde(skip)]
    pub mk_digest_salt: [u8; 32],
    pub mk_digest_iterations: u32,
    pub uuid: String,
    pub keyslots: Vec<Luks1Keyslot>,
}

impl Luks1Header {
    /// `cipherName-cipherMode`, e.g. `aes-xts-plain64`.
    pub fn cipher_spec(&self) -> String {
        format!("{}-{}", self.cipher_name, self.cipher_mode)
    }
}

/// Parses and validates a LUKS1 header as cryptsetup does (`LUKS_check_keyslots` and the
/// device size check). A pure function of the first 592 bytes and the device size.
pub fn parse_header(b: &[u8], device_size: u64) -> Result<Luks1Header> {
    if b.len() < HEADER_SIZE {
        return Err(corrupt("device too small for a LUKS1 header"));
    }
    if b[..6] != MAGIC {
        return Err(corrupt("no LUKS magic"));
    }
    let version = be16(b, off::VERSION)?;
    if version != 1 {
        return Err(corrupt(format!("LUKS version {version}, not 1")));
    }
    let key_bytes = be32(b, off::KEY_BYTES)?;
    if key_bytes == 0 || key_bytes > 512 {
        return Err(corrupt(format!("key size {key_bytes} bytes")));
    }
    let payload_offset = be32(b, off::PAYLOAD_OFFSET)?;
    let mut keyslots = Vec::with_capacity(KEYSLOTS);
    for i in 0..KEYSLOTS {
        let k = off::KEYBLOCK + i * off::KEYBLOCK_SIZE;
        let active = match be32(b, k)? {
            KEY_ENABLED => true,
            KEY_DISABLED => false,
            other => {
                return Err(corrupt(format!(
                    "LUKS keyslot {i} is invalid (state {other:#x})"
                )))
            }
        };
        let mut salt = [0u8; 32];
        salt.copy_from_slice(&b[k + 8..k + 40]);
        keyslots.push(Luks1Keyslot {
            active,
            iterations: be32(b, k + 4)?,
            salt,
            key_material_offset: be32(b, k + 40)?,
            stripes: be32(b, k + 44)?,
        });
    }
    // Geometry of every keyslot, enabled or not.
    let sectors = u64::from(key_bytes * STRIPES).div_ceil(512);
    let mut areas: Vec<(u64, u64, usize)> = Vec::new();
    for (i, ks) in keyslots.iter().enumerate() {
        let invalid = |why: &str| corrupt(format!("LUKS keyslot {i} is invalid: {why}"));
        if ks.stripes != STRIPES {
            return Err(invalid("stripes is not 4000"));
        }
        let start = u64::from(ks.key_material_offset);
        if start * 512 < 1024 {
            return Err(invalid("key material overlaps the header"));
        }
        let end = start + sectors;
        if payload_offset != 0 {
            let p = u64::from(payload_offset);
            if start >= p || end > p {
                return Err(invalid("key material overlaps the payload"));
            }
        }
        areas.push((start, end, i));
    }
    areas.sort_unstable();
    for w in areas.windows(2) {
        if w[0].1 > w[1].0 {
            return Err(corrupt(format!(
                "LUKS keyslot {} is invalid: its key material overlaps keyslot {}",
                w[0].2, w[1].2
            )));
        }
    }
    let last_end = areas.iter().map(|a| a.1).max().unwrap_or(0) * 512;
    if device_size < last_end {
        return Err(corrupt(format!(
            "device of {device_size} bytes is too small for its keyslots (need {last_end})"
        )));
    }
    let mut mk_digest = [0u8; 20];
    mk_digest.copy_from_slice(&b[off::MK_DIGEST..off::MK_DIGEST + 20]);
    let mut mk_digest_salt = [0u8; 32];
    mk_digest_salt.copy_from_slice(&b[off::MK_DIGEST_SALT..off::MK_DIGEST_SALT + 32]);
    Ok(Luks1Header {
        cipher_name: cstr(&b[off::CIPHER_NAME..off::CIPHER_MODE]),
        cipher_mode: cstr(&b[off::CIPHER_MODE..off::HASH_SPEC]),
        hash_spec: cstr(&b[off::HASH_SPEC..off::PAYLOAD_OFFSET]),
        payload_offset,
        key_bytes,
        mk_digest,
        mk_digest_salt,
        mk_digest_iterations: be32(b, off::MK_DIGEST_ITER)?,
        uuid: cstr(&b[off::UUID..off::KEYBLOCK]),
        keyslots,
    })
}

/// An opened LUKS1 header.
#[derive(Debug)]
pub struct Luks1 {
    device: Arc<dyn BlockDevice>,
    header: Luks1Header,
}

impl Luks1 {
    pub fn load(device: Arc<dyn BlockDevice>) -> Result<Luks1> {
        let g = device.geometry();
        let lbs = g.logical_block_size.max(512) as usize;
        let len = HEADER_SIZE.div_ceil(lbs) * lbs;
        let b = crate::ondisk::read_dev(&*device, 0, len)?
            .ok_or_else(|| corrupt("device too small for a LUKS1 header"))?;
        let header = parse_header(&b, g.size)?;
        Ok(Luks1 { device, header })
    }

    pub fn open(
        device: Arc<dyn BlockDevice>,
        passphrase: &[u8],
        keyslot: Option<u32>,
    ) -> Result<CryptDevice> {
        let l = Luks1::load(device)?;
        let u = l.unlock(passphrase, keyslot)?;
        l.activate(&u.volume_key)
    }

    pub fn header(&self) -> &Luks1Header {
        &self.header
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    fn hash(&self) -> Result<Hash> {
        Hash::from_name(&self.header.hash_spec)
    }

    fn verify(&self, hash: Hash, key: &[u8]) -> bool {
        let mut got = [0u8; 20];
        hash.pbkdf2(
            key,
            &self.header.mk_digest_salt,
            self.header.mk_digest_iterations,
            &mut got,
        );
        ct_eq(&got, &self.header.mk_digest)
    }

    /// Tries `keyslot` or every enabled keyslot.
    pub fn unlock(&self, passphrase: &[u8], keyslot: Option<u32>) -> Result<Unlocked> {
        let h = &self.header;
        let hash = self.hash()?;
        let spec = CipherSpec::parse(&h.cipher_spec())?;
        let key_len = h.key_bytes as usize;
        if !spec.key_size_ok(key_len) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{}-byte key for {}", key_len, h.cipher_spec()),
            ));
        }
        if h.mk_digest_iterations == 0 {
            return Err(corrupt("volume key digest has 0 iterations"));
        }
        let slots: Vec<usize> = match keyslot {
            Some(i) => {
                let i = i as usize;
                if i >= KEYSLOTS || !h.keyslots[i].active {
                    return Err(Error::new(
                        ErrorKind::NotFound,
                        format!("keyslot {i} is not active"),
                    ));
                }
                vec![i]
            }
            None => (0..KEYSLOTS).filter(|&i| h.keyslots[i].active).collect(),
        };
        if slots.is_empty() {
            return Err(Error::new(ErrorKind::AuthFailed, "no usable keyslot"));
        }
        keyslot::check_pbkdf2_cost(
            "the volume key digest",
            hash,
            h.mk_digest_iterations,
            h.mk_digest.len(),
        )?;
        let material_len = key_len * STRIPES as usize;
        let read_len = material_len.div_ceil(512) * 512;
        for i in slots {
            let ks = &h.keyslots[i];
            if ks.iterations == 0 {
                continue;
            }
            keyslot::check_pbkdf2_cost(&format!("keyslot {i}"), hash, ks.iterations, key_len)?;
            let mut kek = SecretBytes::zeroed(key_len);
            hash.pbkdf2(passphrase, &ks.salt, ks.iterations, kek.as_mut_bytes());
            let mut m = read_secret(
                &*self.device,
                u64::from(ks.key_material_offset) * 512,
                read_len,
            )?;
            SectorCipher::from_spec(spec, kek.as_bytes())?.decrypt(m.as_mut_bytes(), 512, 0);
            let vk = af_merge(&m.as_bytes()[..material_len], key_len, STRIPES, hash)?;
            if self.verify(hash, vk.as_bytes()) {
                return Ok(Unlocked {
                    keyslot: u32::try_from(i).expect("below 8"),
                    digest: 0,
                    volume_key: VolumeKey::from_bytes(vk.as_bytes()),
                    bound: true,
                });
            }
        }
        Err(Error::new(ErrorKind::AuthFailed, NO_KEY))
    }

    pub fn test_passphrase(&self, passphrase: &[u8], keyslot: Option<u32>) -> Result<u32> {
        self.unlock(passphrase, keyslot).map(|u| u.keyslot)
    }

    /// The decrypted payload for a verified volume key.
    pub fn activate(&self, key: &VolumeKey) -> Result<CryptDevice> {
        let h = &self.header;
        if !self.verify(self.hash()?, key.as_bytes()) {
            return Err(Error::new(
                ErrorKind::AuthFailed,
                "this key is not the volume key",
            ));
        }
        if h.payload_offset == 0 {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "LUKS1 payload offset 0 (a detached header)",
            ));
        }
        let offset = u64::from(h.payload_offset) * 512;
        let dev_size = self.device.geometry().size;
        let room = dev_size.checked_sub(offset).ok_or_else(|| {
            corrupt(format!(
                "device of {dev_size} bytes ends before the payload at {offset}"
            ))
        })?;
        let spec = h.cipher_spec();
        let cipher = SectorCipher::new(&spec, key.as_bytes())?;
        let desc = format!("LUKS1 {spec} {}-bit, data at {offset}", key.len() * 8);
        CryptDevice::new(
            self.device.clone(),
            cipher,
            SegmentParams {
                offset,
                size: room - room % 512,
                sector_size: 512,
                iv_tweak: 0,
                allow_discards: false,
            },
            desc,
        )
    }

    /// The header's fields (no key material; the key digest and salts are left out).
    pub fn dump(&self) -> &Luks1Header {
        &self.header
    }
}
