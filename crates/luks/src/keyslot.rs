//! Keyslots: passphrase -> KEK (PBKDF2 or Argon2) -> decrypt the key material -> AF merge
//! -> candidate volume key -> digest check (`ondisk-formats.md` §2.6, §2.7, §3.2).
//!
//! ```text
//!   passphrase ──KDF(salt)──> KEK ──aes-xts-plain64, 512-byte units, IV from 0──┐
//!   keyslot area (key_size * stripes bytes, rounded to 512) ─────────────────────┴─> AF material
//!   AF material ──merge(hash)──> volume key ──PBKDF2(digest salt)──> == digest ?
//! ```
//!
//! Writing a keyslot runs the same chain backwards with fresh randomness. Every buffer
//! that holds a passphrase, a KEK, AF material or a key is a [`SecretBytes`].

use std::time::{Duration, Instant};

use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};

use crate::ondisk::{self, Af, Area, Kdf, Keyslot, U64Str, B64};
use crate::secret::{ct_eq, SecretBytes, VolumeKey};
use crate::xts::SectorCipher;

/// Stripes cryptsetup uses for every AF split.
pub const AF_STRIPES: u32 = 4000;
/// Salt length for keyslot KDFs and digests.
pub const SALT_LEN: usize = 32;
/// cryptsetup's minimum PBKDF2 iteration count.
pub const MIN_PBKDF2_ITERATIONS: u32 = 1000;
/// Largest Argon2 memory cost accepted from a header (4 GiB, cryptsetup's maximum).
pub const MAX_ARGON2_MEMORY_KIB: u32 = 4 << 20;
/// Largest Argon2 parallelism accepted from a header.
pub const MAX_ARGON2_PARALLEL: u32 = 64;

/// The message for a passphrase that opens no keyslot (cryptsetup's words).
pub const NO_KEY: &str = "no key available with this passphrase";

pub(crate) fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

fn unsupported(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Unsupported, msg)
}

/// The longest a PBKDF2 derivation read from a header may take at this machine's speed
/// unless told otherwise ([`set_max_kdf_time`], `CAIRN_MAX_KDF_TIME`): cryptsetup
/// formats for 2 s, so a minute leaves room for a header made on a much faster machine,
/// while a crafted count (4e9 iterations: about half an hour) is refused with a sentence
/// instead of spinning silently.
pub const DEFAULT_MAX_KDF_TIME: Duration = Duration::from_secs(60);
/// Derivations estimated to take longer than this are announced before they start.
const ANNOUNCE_KDF_TIME: Duration = Duration::from_secs(3);
/// Counts up to this are never timed or refused (cryptsetup's 2 s on a slow machine).
const CHEAP_PBKDF2_ITERATIONS: u32 = 500_000;

/// `Some(None)`: no limit; `Some(Some(d))`: `d`; `None`: the environment or the default.
static MAX_KDF_TIME: std::sync::Mutex<Option<Option<Duration>>> = std::sync::Mutex::new(None);

/// Sets the longest a PBKDF2 derivation from a header may take before opening refuses
/// it (`None`: no limit), for the whole process (`--max-kdf-time`).
pub fn set_max_kdf_time(limit: Option<Duration>) {
    *MAX_KDF_TIME.lock().unwrap_or_else(|p| p.into_inner()) = Some(limit);
}

/// The limit in force: [`set_max_kdf_time`]'s, else `CAIRN_MAX_KDF_TIME` (seconds, 0:
/// none), else [`DEFAULT_MAX_KDF_TIME`].
pub fn max_kdf_time() -> Option<Duration> {
    if let Some(l) = *MAX_KDF_TIME.lock().unwrap_or_else(|p| p.into_inner()) {
        return l;
    }
    match std::env::var("CAIRN_MAX_KDF_TIME")
        .ok()
        .and_then(|v| v.trim().parse::<f64>().ok())
    {
        Some(s) if s <= 0.0 || !s.is_finite() => None,
        Some(s) => Some(Duration::from_secs_f64(s)),
        None => Some(DEFAULT_MAX_KDF_TIME),
    }
}

/// PBKDF2 iterations per second of `hash` on this machine for one output block,
/// measured once per hash.
fn pbkdf2_rate(hash: Hash) -> f64 {
    static RATES: std::sync::Mutex<Vec<(Hash, f64)>> = std::sync::Mutex::new(Vec::new());
    let mut rates = RATES.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&(_, r)) = rates.iter().find(|(h, _)| *h == hash) {
        return r;
    }
    let mut iters = 4096u32;
    let mut out = [0u8; 64];
    let rate = loop {
        let t = Instant::now();
        hash.pbkdf2(
            b"cairn kdf rate",
            &[0u8; SALT_LEN],
            iters,
            &mut out[..hash.output_len()],
        );
        let el = t.elapsed();
        if el >= Duration::from_millis(20) || iters >= 1 << 24 {
            break f64::from(iters) / el.as_secs_f64().max(1e-6);
        }
        iters = iters.saturating_mul(4);
    };
    rates.push((hash, rate));
    rate
}

/// Says what a long PBKDF2 derivation from a header is about to do, and refuses one
/// that would take longer than [`max_kdf_time`] at this machine's speed. `what` names
/// it ("keyslot 0", "the volume key digest"); `out_len` is the bytes derived (PBKDF2
/// runs all its iterations once per output block).
pub fn check_pbkdf2_cost(what: &str, hash: Hash, iterations: u32, out_len: usize) -> Result<()> {
    let blocks = out_len.div_ceil(hash.output_len()).max(1);
    if u64::from(iterations).saturating_mul(blocks as u64) <= u64::from(CHEAP_PBKDF2_ITERATIONS) {
        return Ok(());
    }
    let secs = f64::from(iterations) * blocks as f64 / pbkdf2_rate(hash);
    let doing = format!(
        "{what}: deriving the key with {iterations} PBKDF2-{} iterations, about {secs:.0} s \
         at this machine's speed",
        hash.name()
    );
    if let Some(limit) = max_kdf_time() {
        if secs > limit.as_secs_f64() {
            return Err(unsupported(format!(
                "{doing}, more than the limit of {} s: refusing it (a crafted header?); \
                 give --max-kdf-time SECONDS (0: no limit) or set CAIRN_MAX_KDF_TIME to go on",
                limit.as_secs()
            )));
        }
    }
    if secs >= ANNOUNCE_KDF_TIME.as_secs_f64() {
        tracing::warn!("{doing}");
    }
    Ok(())
}

/// Hash functions LUKS uses for PBKDF2, the AF splitter and digests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hash {
    Sha1,
    Sha224,
    Sha256,
    Sha384,
    Sha512,
}

impl Hash {
    pub fn from_name(name: &str) -> Result<Hash> {
        Ok(match name.to_ascii_lowercase().as_str() {
            "sha1" => Hash::Sha1,
            "sha224" => Hash::Sha224,
            "sha256" => Hash::Sha256,
            "sha384" => Hash::Sha384,
            "sha512" => Hash::Sha512,
            _ => return Err(unsupported(format!("hash {name:?}"))),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Hash::Sha1 => "sha1",
            Hash::Sha224 => "sha224",
            Hash::Sha256 => "sha256",
            Hash::Sha384 => "sha384",
            Hash::Sha512 => "sha512",
        }
    }

    /// Bytes of one output block (the digest's size).
    pub fn output_len(self) -> usize {
        match self {
            Hash::Sha1 => 20,
            Hash::Sha224 => 28,
            Hash::Sha256 => 32,
            Hash::Sha384 => 48,
            Hash::Sha512 => 64,
        }
    }

    /// PBKDF2-HMAC with this hash.
    pub fn pbkdf2(self, password: &[u8], salt: &[u8], iterations: u32, out: &mut [u8]) {
        use pbkdf2::pbkdf2_hmac;
        match self {
            Hash::Sha1 => pbkdf2_hmac::<sha1::Sha1>(password, salt, iterations, out),
            Hash::Sha224 => pbkdf2_hmac::<sha2::Sha224>(password, salt, iterations, out),
            Hash::Sha256 => pbkdf2_hmac::<sha2::Sha256>(password, salt, iterations, out),
            Hash::Sha384 => pbkdf2_hmac::<sha2::Sha384>(password, salt, iterations, out),
            Hash::Sha512 => pbkdf2_hmac::<sha2::Sha512>(password, salt, iterations, out),
        }
    }

    /// The AF diffusion function: block `i` (digest-sized, the last may be shorter) is
    /// replaced by the first bytes of `hash(be32(i) || block)`.
    pub fn diffuse(self, buf: &mut [u8]) {
        fn run<D: sha2::Digest>(buf: &mut [u8]) {
            let ds = <D as sha2::Digest>::output_size();
            for (i, block) in buf.chunks_mut(ds).enumerate() {
                let i = u32::try_from(i).expect("AF blocks are few");
                let mut h = D::new();
                h.update(i.to_be_bytes());
                h.update(&*block);
                let mut out = h.finalize();
                block.copy_from_slice(&out[..block.len()]);
                zeroize::Zeroize::zeroize(out.as_mut_slice());
            }
        }
        match self {
            Hash::Sha1 => run::<sha1::Sha1>(buf),
            Hash::Sha224 => run::<sha2::Sha224>(buf),
            Hash::Sha256 => run::<sha2::Sha256>(buf),
            Hash::Sha384 => run::<sha2::Sha384>(buf),
            Hash::Sha512 => run::<sha2::Sha512>(buf),
        }
    }
}

/// The AF chain shared by split and merge: `d = H(d ^ s_j)` over all but the last stripe.
fn af_chain(material: &[u8], key_size: usize, hash: Hash) -> SecretBytes {
    let mut d = SecretBytes::zeroed(key_size);
    for stripe in material
        .chunks_exact(key_size)
        .take(material.len() / key_size - 1)
    {
        for (x, s) in d.as_mut_bytes().iter_mut().zip(stripe) {
            *x ^= s;
        }
        hash.diffuse(d.as_mut_bytes());
    }
    d
}

/// AF merge (`lib/luks1/af.c` `AF_merge`): `material` is `stripes * key_size` bytes.
pub fn af_merge(material: &[u8], key_size: usize, stripes: u32, hash: Hash) -> Result<SecretBytes> {
    let n = key_size
        .checked_mul(stripes as usize)
        .filter(|&n| n == material.len() && stripes > 0 && key_size > 0)
        .ok_or_else(|| corrupt("AF material length does not match key_size * stripes"))?;
    let mut d = af_chain(material, key_size, hash);
    for (x, s) in d.as_mut_bytes().iter_mut().zip(&material[n - key_size..]) {
        *x ^= s;
    }
    Ok(d)
}

/// AF split: random stripes, the last chosen so that [`af_merge`] gives `key` back.
pub fn af_split(key: &[u8], stripes: u32, hash: Hash) -> SecretBytes {
    let ks = key.len();
    let n = ks * stripes as usize;
    let mut m = SecretBytes::random(n);
    let d = af_chain(m.as_bytes(), ks, hash);
    for ((x, dd), k) in m.as_mut_bytes()[n - ks..]
        .iter_mut()
        .zip(d.as_bytes())
        .zip(key)
    {
        *x = dd ^ k;
    }
    m
}

/// Argon2 variants LUKS2 keyslots use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Argon2Variant {
    Argon2i,
    Argon2id,
}

/// A keyslot KDF with its costs (the salt is kept apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KdfParams {
    Pbkdf2 {
        hash: Hash,
        iterations: u32,
    },
    Argon2 {
        variant: Argon2Variant,
        /// Passes over memory.
        time: u32,
        memory_kib: u32,
        parallel: u32,
    },
}

impl KdfParams {
    /// Reads a JSON `kdf` object: the parameters and the salt.
    pub fn from_json(kdf: &Kdf) -> Result<(KdfParams, Vec<u8>)> {
        let salt = kdf
            .salt
            .as_ref()
            .ok_or_else(|| corrupt("kdf has no salt"))?
            .0
            .clone();
        let p = match kdf.kind.as_str() {
            "pbkdf2" => KdfParams::Pbkdf2 {
                hash: Hash::from_name(kdf.hash.as_deref().unwrap_or(""))?,
                iterations: kdf
                    .iterations
                    .filter(|&i| i > 0)
                    .ok_or_else(|| corrupt("pbkdf2 needs iterations > 0"))?,
            },
            "argon2i" | "argon2id" => KdfParams::Argon2 {
                variant: if kdf.kind == "argon2i" {
                    Argon2Variant::Argon2i
                } else {
                    Argon2Variant::Argon2id
                },
                time: kdf.time.ok_or_else(|| corrupt("argon2 needs time"))?,
                memory_kib: kdf.memory.ok_or_else(|| corrupt("argon2 needs memory"))?,
                parallel: kdf.cpus.ok_or_else(|| corrupt("argon2 needs cpus"))?,
            },
            other => return Err(unsupported(format!("keyslot KDF {other:?}"))),
        };
        Ok((p, salt))
    }

    pub fn to_json(&self, salt: &[u8]) -> Kdf {
        let mut k = Kdf {
            kind: String::new(),
            hash: None,
            iterations: None,
            time: None,
            memory: None,
            cpus: None,
            salt: Some(B64(salt.to_vec())),
            extra: Default::default(),
        };
        match *self {
            KdfParams::Pbkdf2 { hash, iterations } => {
                k.kind = "pbkdf2".into();
                k.hash = Some(hash.name().into());
                k.iterations = Some(iterations);
            }
            KdfParams::Argon2 {
                variant,
                time,
                memory_kib,
                parallel,
            } => {
                k.kind = match variant {
                    Argon2Variant::Argon2i => "argon2i",
                    Argon2Variant::Argon2id => "argon2id",
                }
                .into();
                k.time = Some(time);
                k.memory = Some(memory_kib);
                k.cpus = Some(parallel);
            }
        }
        k
    }

    /// Derives `out_len` bytes from `password` and `salt`.
    pub fn derive(&self, password: &[u8], salt: &[u8], out_len: usize) -> Result<SecretBytes> {
        let mut out = SecretBytes::zeroed(out_len);
        match *self {
            KdfParams::Pbkdf2 { hash, iterations } => {
                hash.pbkdf2(password, salt, iterations, out.as_mut_bytes());
            }
            KdfParams::Argon2 {
                variant,
                time,
                memory_kib,
                parallel,
            } => {
                if memory_kib > MAX_ARGON2_MEMORY_KIB
                    || parallel == 0
                    || parallel > MAX_ARGON2_PARALLEL
                    || time == 0
                {
                    return Err(unsupported(format!(
                        "argon2 costs out of range (time {time}, memory {memory_kib} KiB, cpus {parallel})"
                    )));
                }
                let params = argon2::Params::new(memory_kib, time, parallel, Some(out_len))
                    .map_err(|e| corrupt(format!("argon2 parameters: {e}")))?;
                let alg = match variant {
                    Argon2Variant::Argon2i => argon2::Algorithm::Argon2i,
                    Argon2Variant::Argon2id => argon2::Algorithm::Argon2id,
                };
                argon2::Argon2::new(alg, argon2::Version::V0x13, params)
                    .hash_password_into(password, salt, out.as_mut_bytes())
                    .map_err(|e| corrupt(format!("argon2: {e}")))?;
            }
        }
        Ok(out)
    }
}

/// Reads `[off, off + len)` from a device whose logical block may be larger than the
/// alignment of the range, into a secret buffer.
pub(crate) fn read_secret(dev: &dyn BlockDevice, off: u64, len: usize) -> Result<SecretBytes> {
    let lbs = u64::from(dev.geometry().logical_block_size.max(1));
    let start = off - off % lbs;
    let end = off
        .checked_add(len as u64)
        .ok_or_else(|| corrupt("keyslot area overflows"))?;
    let aend = end.div_ceil(lbs) * lbs;
    if aend > dev.geometry().size {
        return Err(corrupt(format!(
            "keyslot area [{off}, {end}) lies beyond the end of the device"
        )));
    }
    let alen = usize::try_from(aend - start).map_err(|_| corrupt("keyslot area too large"))?;
    let mut buf = SecretBytes::zeroed(alen);
    dev.read_at(buf.as_mut_bytes(), start)?;
    let skip = usize::try_from(off - start).expect("less than a block");
    Ok(if skip == 0 && alen == len {
        buf
    } else {
        SecretBytes::from_slice(&buf.as_bytes()[skip..skip + len])
    })
}

/// Unlocks one LUKS2 keyslot: the candidate volume key, not yet checked against the
/// digest (a wrong passphrase gives a wrong key, not an error).
pub fn luks2_open_keyslot(
    dev: &dyn BlockDevice,
    id: u32,
    ks: &Keyslot,
    passphrase: &[u8],
) -> Result<SecretBytes> {
    if ks.kind != "luks2" {
        return Err(unsupported(format!("keyslot {id} has type {:?}", ks.kind)));
    }
    let af = ks
        .af
        .as_ref()
        .ok_or_else(|| corrupt(format!("keyslot {id}: no af")))?;
    let hash = Hash::from_name(&af.hash)?;
    let key_size = ks.key_size as usize;
    let material_len = key_size
        .checked_mul(af.stripes as usize)
        .ok_or_else(|| corrupt(format!("keyslot {id}: key material size overflows")))?;
    let read_len = material_len.div_ceil(512) * 512;
    if read_len as u64 > ks.area.size.0 {
        return Err(corrupt(format!(
            "keyslot {id}: {read_len} bytes of key material do not fit its {}-byte area",
            ks.area.size.0
        )));
    }
    let enc = ks
        .area
        .encryption
        .as_deref()
        .ok_or_else(|| corrupt(format!("keyslot {id}: no area encryption")))?;
    let area_key = ks.area.key_size.unwrap_or(ks.key_size) as usize;
    let kdf = ks
        .kdf
        .as_ref()
        .ok_or_else(|| corrupt(format!("keyslot {id}: no kdf")))?;
    let (params, salt) = KdfParams::from_json(kdf)?;
    let spec = crate::xts::CipherSpec::parse(enc)?;
    if !spec.key_size_ok(area_key) {
        return Err(unsupported(format!(
            "keyslot {id}: {area_key}-byte key for area cipher {enc}"
        )));
    }
    if let KdfParams::Pbkdf2 { hash, iterations } = params {
        check_pbkdf2_cost(&format!("keyslot {id}"), hash, iterations, area_key)?;
    }
    let mut material = read_secret(dev, ks.area.offset.0, read_len)?;
    let kek = params.derive(passphrase, &salt, area_key)?;
    SectorCipher::from_spec(spec, kek.as_bytes())?.decrypt(material.as_mut_bytes(), 512, 0);
    af_merge(
        &material.as_bytes()[..material_len],
        key_size,
        af.stripes,
        hash,
    )
}

/// Checks a candidate key against a `pbkdf2` digest (§2.7).
pub fn verify_digest(d: &ondisk::Digest, key: &[u8]) -> Result<bool> {
    if d.kind != "pbkdf2" {
        return Err(unsupported(format!("digest type {:?}", d.kind)));
    }
    let hash = Hash::from_name(d.hash.as_deref().unwrap_or(""))?;
    let want = d
        .digest
        .as_ref()
        .ok_or_else(|| corrupt("digest has no value"))?;
    let salt = d
        .salt
        .as_ref()
        .ok_or_else(|| corrupt("digest has no salt"))?;
    let iterations = d
        .iterations
        .filter(|&i| i > 0)
        .ok_or_else(|| corrupt("digest has no iterations"))?;
    if want.0.is_empty() || want.0.len() > 1024 {
        return Err(corrupt("digest length out of range"));
    }
    check_pbkdf2_cost("the volume key digest", hash, iterations, want.0.len())?;
    let mut got = SecretBytes::zeroed(want.0.len());
    hash.pbkdf2(key, &salt.0, iterations, got.as_mut_bytes());
    Ok(ct_eq(got.as_bytes(), &want.0))
}

/// Makes a new digest object over `key` for the given keyslots and segments.
pub fn make_digest(
    key: &VolumeKey,
    iterations: u32,
    keyslots: Vec<String>,
    segments: Vec<String>,
) -> ondisk::Digest {
    let salt = SecretBytes::random(SALT_LEN);
    let mut out = [0u8; 32];
    Hash::Sha256.pbkdf2(key.as_bytes(), salt.as_bytes(), iterations, &mut out);
    ondisk::Digest {
        kind: "pbkdf2".into(),
        keyslots,
        segments,
        hash: Some("sha256".into()),
        iterations: Some(iterations),
        salt: Some(B64(salt.as_bytes().to_vec())),
        digest: Some(B64(out.to_vec())),
        extra: Default::default(),
    }
}

/// The bytes a keyslot area needs for a key of `key_size` bytes (cryptsetup rounds the
/// AF material up to 4096).
pub fn area_size_for(key_size: usize) -> u64 {
    ((key_size * AF_STRIPES as usize) as u64).div_ceil(4096) * 4096
}

/// Writes a new LUKS2 keyslot's material into `[area_offset, area_offset + area_size)`
/// and returns its JSON. The write is not flushed: the caller flushes before the header
/// that refers to it is written.
pub fn luks2_write_keyslot(
    dev: &dyn BlockDevice,
    key: &VolumeKey,
    passphrase: &[u8],
    kdf: &KdfParams,
    area_offset: u64,
    area_size: u64,
    priority: Option<u32>,
) -> Result<Keyslot> {
    let key_size = key.len();
    let encryption = "aes-xts-plain64";
    let material = af_split(key.as_bytes(), AF_STRIPES, Hash::Sha256);
    let len = usize::try_from(area_size).map_err(|_| corrupt("area too large"))?;
    if material.len() > len {
        return Err(Error::new(ErrorKind::NoSpace, "keyslot area too small"));
    }
    // The whole area is written: material, then zeroes (encrypted like the rest, as
    // cryptsetup does for the 512-byte rounding; the rest of the area is only padding).
    let mut buf = SecretBytes::zeroed(len);
    buf.as_mut_bytes()[..material.len()].copy_from_slice(material.as_bytes());
    drop(material);
    let salt = SecretBytes::random(SALT_LEN);
    let kek = kdf.derive(passphrase, salt.as_bytes(), key_size)?;
    let enc_len = (key_size * AF_STRIPES as usize).div_ceil(512) * 512;
    SectorCipher::new(encryption, kek.as_bytes())?.encrypt(
        &mut buf.as_mut_bytes()[..enc_len],
        512,
        0,
    );
    dev.write_at(buf.as_bytes(), area_offset, WriteFlags::NONE)
        .map_err(|e| e.context("writing keyslot material"))?;
    Ok(Keyslot {
        kind: "luks2".into(),
        key_size: u32::try_from(key_size).map_err(|_| corrupt("key size"))?,
        af: Some(Af {
            kind: "luks1".into(),
            stripes: AF_STRIPES,
            hash: "sha256".into(),
            extra: Default::default(),
        }),
        area: Area {
            kind: "raw".into(),
            offset: U64Str(area_offset),
            size: U64Str(area_size),
            encryption: Some(encryption.into()),
            key_size: Some(u32::try_from(key_size).map_err(|_| corrupt("key size"))?),
            extra: Default::default(),
        },
        kdf: Some(kdf.to_json(salt.as_bytes())),
        priority,
        extra: Default::default(),
    })
}

/// Overwrites a keyslot area (with random bytes, so the old material cannot be told from
/// free space).
pub fn wipe_area(dev: &dyn BlockDevice, offset: u64, size: u64) -> Result<()> {
    let len = usize::try_from(size).map_err(|_| corrupt("area too large"))?;
    let mut buf = vec![0u8; len];
    crate::random_fill(&mut buf);
    dev.write_at(&buf, offset, WriteFlags::NONE)
        .map_err(|e| e.context("wiping keyslot area"))
}

/// PBKDF2 iterations that take about `target` on this machine (at least 1000).
pub fn benchmark_pbkdf2(hash: Hash, key_len: usize, target: Duration) -> u32 {
    let mut iters = 1000u32;
    let mut out = vec![0u8; key_len];
    loop {
        let t = Instant::now();
        hash.pbkdf2(b"cairn benchmark", &[0u8; SALT_LEN], iters, &mut out);
        let el = t.elapsed();
        if el >= Duration::from_millis(50) || iters >= u32::MAX / 4 {
            let per_sec = f64::from(iters) / el.as_secs_f64().max(1e-6);
            let n = (per_sec * target.as_secs_f64()).min(f64::from(u32::MAX));
            // n is in [0, u32::MAX] by the min above.
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            return (n as u32).max(MIN_PBKDF2_ITERATIONS);
        }
        iters = iters.saturating_mul(4);
    }
}

/// Argon2 costs for about `target` on this machine, as cryptsetup chooses them: the
/// memory at `max_memory_kib` (less if even 4 passes would take too long), then as many
/// passes (at least 4) as fit the time.
pub fn benchmark_argon2(
    variant: Argon2Variant,
    target: Duration,
    max_memory_kib: u32,
    parallel: u32,
) -> Result<KdfParams> {
    const MIN_TIME: u32 = 4;
    const MIN_MEMORY_KIB: u32 = 32 << 10;
    let probe_mem = (64u32 << 10).min(max_memory_kib).max(8 * parallel);
    let probe = KdfParams::Argon2 {
        variant,
        time: 1,
        memory_kib: probe_mem,
        parallel,
    };
    let t = Instant::now();
    probe.derive(b"cairn benchmark", &[0u8; SALT_LEN], 32)?;
    // Cost is proportional to memory * passes.
    let kib_passes_per_sec = f64::from(probe_mem) / t.elapsed().as_secs_f64().max(1e-6);
    let budget = kib_passes_per_sec * target.as_secs_f64();
    let mut memory = f64::from(max_memory_kib);
    if memory * f64::from(MIN_TIME) > budget {
        memory = (budget / f64::from(MIN_TIME)).max(f64::from(MIN_MEMORY_KIB.min(max_memory_kib)));
    }
    // Both quotients are clamped into u32 range first.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let memory_kib = (memory.min(f64::from(max_memory_kib)) as u32).max(8 * parallel);
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let time = ((budget / f64::from(memory_kib)).min(1e6) as u32).max(MIN_TIME);
    Ok(KdfParams::Argon2 {
        variant,
        time,
        memory_kib,
        parallel,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn af_split_merge_round_trip() {
        for hash in [Hash::Sha1, Hash::Sha256, Hash::Sha512] {
            for ks in [16usize, 32, 64] {
                let key: Vec<u8> = (0..ks).map(|i| u8::try_from(i).unwrap()).collect();
                let m = af_split(&key, 40, hash);
                assert_eq!(m.len(), ks * 40);
                let back = af_merge(m.as_bytes(), ks, 40, hash).unwrap();
                assert_eq!(back.as_bytes(), &key[..]);
            }
        }
        assert!(af_merge(&[0u8; 10], 4, 3, Hash::Sha256).is_err());
        assert!(af_merge(&[], 0, 0, Hash::Sha256).is_err());
    }

    #[test]
    fn area_sizes_match_cryptsetup() {
        assert_eq!(area_size_for(32), 131072);
        assert_eq!(area_size_for(64), 258048);
    }
}
