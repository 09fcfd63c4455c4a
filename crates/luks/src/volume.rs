//! LUKS2 volumes: format, open, keyslot management, dump, header backup and restore.
//!
//! ```text
//!   Luks2::format(dev, opts, pass) ─┐
//!   Luks2::load(dev) ───────────────┴─> Luks2 (header in memory, both copies' state)
//!        .unlock(pass, slot)   -> Unlocked { keyslot, volume_key }
//!        .activate(&vk)        -> CryptDevice (a BlockDevice over the payload)
//!        .add_key / remove_key / kill_slot / change_key / repair   (rewrite both copies)
//!        .dump()               -> Dump (serialisable, no key material)
//!        .header_backup(path) / Luks2::header_restore(dev, path)
//!   Luks2::open(dev, pass, slot) = load + unlock + activate
//! ```
//!
//! Every metadata change follows one order: new keyslot material written and flushed,
//! then both header copies (primary, then secondary, each FUA), then old material wiped.
//! A crash anywhere leaves a header that opens with the old or the new passphrases.
//! Headers with requirements cairn does not implement may be read, dumped, backed up and
//! unlocked, but not activated or changed (cryptsetup's "Unmet requirements detected").

use std::fmt;
use std::io::Write as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};
use serde::Serialize;

use crate::device::{CryptDevice, SegmentParams};
use crate::keyslot::{self, Argon2Variant, Hash, KdfParams, NO_KEY};
use crate::ondisk::{
    self, BinaryHeader, Config, CopyState, IdMap, Metadata, Segment, SegmentSize, U64Str, Which,
};
use crate::secret::VolumeKey;
use crate::xts::SectorCipher;

const MIB: u64 = 1 << 20;

/// Which password-based KDF a new keyslot uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PbkdfKind {
    Pbkdf2,
    Argon2i,
    Argon2id,
}

impl PbkdfKind {
    pub fn from_name(s: &str) -> Result<PbkdfKind> {
        match s {
            "pbkdf2" => Ok(PbkdfKind::Pbkdf2),
            "argon2i" => Ok(PbkdfKind::Argon2i),
            "argon2id" => Ok(PbkdfKind::Argon2id),
            _ => Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("unknown PBKDF {s:?} (pbkdf2, argon2i or argon2id)"),
            )),
        }
    }
}

/// cryptsetup's `--pbkdf`, `--hash`, `--pbkdf-force-iterations`, `--pbkdf-memory`,
/// `--pbkdf-parallel` and `--iter-time`. Costs not given are benchmarked here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PbkdfOptions {
    pub kind: PbkdfKind,
    /// PBKDF2's hash (sha256 by default).
    pub hash: Hash,
    /// PBKDF2 iterations, or Argon2 passes; `None` benchmarks to `time`.
    pub iterations: Option<u32>,
    /// Argon2 memory in KiB; `None`: up to 1 GiB (at most half the RAM).
    pub memory_kib: Option<u32>,
    /// Argon2 lanes; `None`: min(4, CPUs).
    pub parallel: Option<u32>,
    /// Time budget of one unlock when benchmarking.
    pub time: Duration,
}

impl Default for PbkdfOptions {
    fn default() -> Self {
        PbkdfOptions {
            kind: PbkdfKind::Argon2id,
            hash: Hash::Sha256,
            iterations: None,
            memory_kib: None,
            parallel: None,
            time: Duration::from_secs(2),
        }
    }
}

impl PbkdfOptions {
    /// PBKDF2-SHA256 with a fixed iteration count (tests, `--pbkdf-force-iterations`).
    pub fn pbkdf2(iterations: u32) -> PbkdfOptions {
        PbkdfOptions {
            kind: PbkdfKind::Pbkdf2,
            iterations: Some(iterations),
            ..PbkdfOptions::default()
        }
    }

    /// Argon2id with fixed costs (tests).
    pub fn argon2id(time: u32, memory_kib: u32, parallel: u32) -> PbkdfOptions {
        PbkdfOptions {
            kind: PbkdfKind::Argon2id,
            iterations: Some(time),
            memory_kib: Some(memory_kib),
            parallel: Some(parallel),
            ..PbkdfOptions::default()
        }
    }

    /// Whether the costs were forced (no benchmark): digests then use the minimum
    /// iteration count, as cryptsetup does.
    pub fn forced(&self) -> bool {
        self.iterations.is_some()
    }

    /// The KDF parameters, benchmarking what was not given.
    pub fn resolve(&self, key_len: usize) -> Result<KdfParams> {
        let variant = match self.kind {
            PbkdfKind::Pbkdf2 => {
                let iterations = match self.iterations {
                    Some(i) if i < keyslot::MIN_PBKDF2_ITERATIONS => {
                        return Err(Error::new(
                            ErrorKind::InvalidArgument,
                            format!(
                                "PBKDF2 needs at least {} iterations",
                                keyslot::MIN_PBKDF2_ITERATIONS
                            ),
                        ))
                    }
                    Some(i) => i,
                    None => keyslot::benchmark_pbkdf2(self.hash, key_len, self.time),
                };
                return Ok(KdfParams::Pbkdf2 {
                    hash: self.hash,
                    iterations,
                });
            }
            PbkdfKind::Argon2i => Argon2Variant::Argon2i,
            PbkdfKind::Argon2id => Argon2Variant::Argon2id,
        };
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let parallel = self
            .parallel
            .unwrap_or_else(|| u32::try_from(cpus.min(4)).unwrap_or(4));
        let max_mem = self.memory_kib.unwrap_or_else(default_argon2_memory_kib);
        let p = match self.iterations {
            Some(time) => KdfParams::Argon2 {
                variant,
                time,
                memory_kib: max_mem,
                parallel,
            },
            None => keyslot::benchmark_argon2(variant, self.time, max_mem, parallel)?,
        };
        if let KdfParams::Argon2 {
            time,
            memory_kib,
            parallel,
            ..
        } = p
        {
            if time == 0
                || parallel == 0
                || parallel > keyslot::MAX_ARGON2_PARALLEL
                || memory_kib < 8 * parallel
                || memory_kib > keyslot::MAX_ARGON2_MEMORY_KIB
            {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!("argon2 costs out of range (time {time}, memory {memory_kib} KiB, parallel {parallel})"),
                ));
            }
        }
        Ok(p)
    }
}

/// cryptsetup's default Argon2 memory: 1 GiB, at most half the physical memory.
fn default_argon2_memory_kib() -> u32 {
    let gib = 1u32 << 20;
    let half_ram_kib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map(|kib| kib / 2);
    match half_ram_kib {
        Some(h) => u32::try_from(h.min(u64::from(gib)))
            .unwrap_or(gib)
            .max(32 << 10),
        None => gib,
    }
}

/// `cryptsetup luksFormat` options.
#[derive(Debug, Clone)]
pub struct FormatOptions {
    /// Volume key size in bits: 256 (AES-128-XTS) or 512 (AES-256-XTS, the default).
    pub key_size: u32,
    /// 512, 1024, 2048 or 4096; `None`: 4096 when the device's physical block is at least
    /// 4096, else 512.
    pub sector_size: Option<u32>,
    pub pbkdf: PbkdfOptions,
    pub label: String,
    pub subsystem: String,
    /// A textual UUID; `None`: random.
    pub uuid: Option<String>,
    /// Binary header + JSON: 16 KiB (default) … 4 MiB.
    pub metadata_size: u64,
    /// Keyslots area; `None`: up to the data offset (at most 128 MiB).
    pub keyslots_size: Option<u64>,
    /// Payload offset in bytes; `None`: 16 MiB, rounded up to the alignment.
    pub data_offset: Option<u64>,
    /// A given volume key (`--volume-key-file`); `None`: random.
    pub volume_key: Option<VolumeKey>,
    /// Keyslot for the passphrase (default 0).
    pub keyslot: Option<u32>,
}

impl Default for FormatOptions {
    fn default() -> Self {
        FormatOptions {
            key_size: 512,
            sector_size: None,
            pbkdf: PbkdfOptions::default(),
            label: String::new(),
            subsystem: String::new(),
            uuid: None,
            metadata_size: 16 << 10,
            keyslots_size: None,
            data_offset: None,
            volume_key: None,
            keyslot: None,
        }
    }
}

/// Options for a new keyslot (`add_key`, `change_key`).
#[derive(Debug, Clone, Default)]
pub struct KeyslotOptions {
    pub pbkdf: PbkdfOptions,
    /// A specific keyslot id; `None`: the lowest free one (`change_key`: the same one).
    pub keyslot: Option<u32>,
    /// 0 ignore, 1 normal, 2 prefer.
    pub priority: Option<u32>,
}

/// A verified volume key and the keyslot that gave it.
#[derive(Debug, Clone)]
pub struct Unlocked {
    pub keyslot: u32,
    pub digest: u32,
    pub volume_key: VolumeKey,
    /// False for an unbound keyslot (its key opens no segment).
    pub bound: bool,
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// The payload alignment: 1 MiB, and the device's optimal I/O size (a full RAID stripe)
/// when that is larger and a multiple of 512 (their least common multiple, up to 1 GiB).
pub fn payload_alignment(optimal_io_size: u32) -> u64 {
    let o = u64::from(optimal_io_size);
    if o == 0 || !o.is_multiple_of(512) {
        return MIB;
    }
    let lcm = MIB / gcd(MIB, o) * o;
    if lcm <= 1 << 30 {
        lcm
    } else {
        MIB
    }
}

/// A random (version 4) UUID in the hyphenated lower-case form cryptsetup writes.
fn random_uuid() -> String {
    let mut b = [0u8; 16];
    crate::random_fill(&mut b);
    uuid::Builder::from_random_bytes(b)
        .into_uuid()
        .hyphenated()
        .to_string()
}

/// Whether `s` is a UUID in the hyphenated form (the only one a LUKS2 header holds).
fn valid_uuid(s: &str) -> bool {
    s.len() == uuid::fmt::Hyphenated::LENGTH && uuid::Uuid::try_parse(s).is_ok()
}

/// A LUKS2 header loaded from (or just written to) a device.
#[derive(Debug)]
pub struct Luks2 {
    device: Arc<dyn BlockDevice>,
    binary: BinaryHeader,
    metadata: Metadata,
    used: Which,
    primary: CopyState,
    secondary: CopyState,
    warnings: Vec<String>,
}

impl Luks2 {
    /// Writes a new LUKS2 header with one keyslot for `passphrase` (`luksFormat`).
    /// Everything before the payload is zeroed first; the payload is not touched.
    pub fn format(
        device: Arc<dyn BlockDevice>,
        opts: &FormatOptions,
        passphrase: &[u8],
    ) -> Result<Luks2> {
        let g = device.geometry();
        if !matches!(opts.key_size, 256 | 384 | 512) {
            return Err(invalid(format!(
                "key size {} bits: aes-xts-plain64 takes 256 or 512",
                opts.key_size
            )));
        }
        let key_len = (opts.key_size / 8) as usize;
        let sector_size = opts.sector_size.unwrap_or(
            if g.physical_block_size >= 4096 || g.logical_block_size >= 4096 {
                4096
            } else {
                512
            },
        );
        if !ondisk::SECTOR_SIZES.contains(&sector_size) {
            return Err(invalid(format!(
                "sector size {sector_size}: use 512, 1024, 2048 or 4096"
            )));
        }
        if sector_size < g.logical_block_size {
            return Err(invalid(format!(
                "sector size {sector_size} is smaller than the device's {}-byte logical blocks",
                g.logical_block_size
            )));
        }
        let hdr = opts.metadata_size;
        if !ondisk::HDR_SIZES.contains(&hdr) {
            return Err(invalid(format!(
                "metadata size {hdr}: use a power of two from 16 KiB to 4 MiB"
            )));
        }
        let area = keyslot::area_size_for(key_len);
        let align = payload_alignment(g.optimal_io_size);
        let data_offset = match opts.data_offset {
            Some(o) => o,
            None => {
                let min = 2 * hdr + opts.keyslots_size.unwrap_or(area);
                (16 * MIB).max(min).div_ceil(align) * align
            }
        };
        if !data_offset.is_multiple_of(u64::from(sector_size.max(g.logical_block_size))) {
            return Err(invalid(format!(
                "data offset {data_offset} is not a multiple of the sector size {sector_size}"
            )));
        }
        let keyslots_size = match opts.keyslots_size {
            Some(k) => k,
            None => {
                let room = data_offset.saturating_sub(2 * hdr);
                room.min(ondisk::MAX_KEYSLOTS_SIZE) / 4096 * 4096
            }
        };
        if keyslots_size < area
            || !keyslots_size.is_multiple_of(4096)
            || keyslots_size > ondisk::MAX_KEYSLOTS_SIZE
            || 2 * hdr + keyslots_size > data_offset
        {
            return Err(invalid(format!(
                "keyslots area of {keyslots_size} bytes does not fit one {area}-byte keyslot between the headers and the data offset {data_offset}"
            )));
        }
        let payload = g.size.saturating_sub(data_offset);
        if payload < u64::from(sector_size) {
            return Err(Error::new(
                ErrorKind::NoSpace,
                format!(
                    "device of {} bytes is too small for a LUKS2 volume with its data at {data_offset}",
                    g.size
                ),
            ));
        }
        let uuid = match &opts.uuid {
            Some(u) if valid_uuid(u) => u.to_ascii_lowercase(),
            Some(u) => return Err(invalid(format!("{u:?} is not a UUID"))),
            None => random_uuid(),
        };
        let volume_key = match &opts.volume_key {
            Some(k) if k.len() == key_len => k.clone(),
            Some(k) => {
                return Err(invalid(format!(
                    "the volume key has {} bytes, the key size asks for {key_len}",
                    k.len()
                )))
            }
            None => VolumeKey::random(key_len),
        };
        for (what, s, max) in [
            ("label", &opts.label, 47),
            ("subsystem", &opts.subsystem, 47),
        ] {
            if s.len() > max || s.as_bytes().contains(&0) {
                return Err(invalid(format!(
                    "{what} {s:?} is longer than {max} bytes or contains NUL"
                )));
            }
        }
        let slot = opts.keyslot.unwrap_or(0);
        if slot >= ondisk::MAX_KEYSLOTS {
            return Err(invalid(format!("keyslot {slot} is not below 32")));
        }
        let kdf = opts.pbkdf.resolve(key_len)?;
        let digest_iterations = if opts.pbkdf.forced() {
            keyslot::MIN_PBKDF2_ITERATIONS
        } else {
            keyslot::benchmark_pbkdf2(Hash::Sha256, key_len, Duration::from_millis(125))
        };

        // Wipe the whole metadata region: old headers (including secondaries at other
        // sizes) and old keyslot material must not survive.
        let lbs = u64::from(g.logical_block_size.max(1));
        let wipe_end = data_offset.div_ceil(lbs) * lbs;
        device
            .write_zeroes(0, wipe_end.min(g.size), WriteFlags::NONE)
            .map_err(|e| e.context("wiping the LUKS2 metadata area"))?;

        let area_offset = 2 * hdr;
        let ks = keyslot::luks2_write_keyslot(
            &*device,
            &volume_key,
            passphrase,
            &kdf,
            area_offset,
            area,
            None,
        )?;
        device.flush()?;

        let mut meta = Metadata {
            keyslots: IdMap(Default::default()),
            tokens: IdMap(Default::default()),
            segments: IdMap(Default::default()),
            digests: IdMap(Default::default()),
            config: Config {
                json_size: U64Str(hdr - ondisk::BINARY_SIZE as u64),
                keyslots_size: U64Str(keyslots_size),
                flags: None,
                requirements: None,
                extra: Default::default(),
            },
            extra: Default::default(),
        };
        meta.keyslots.0.insert(slot, ks);
        meta.segments.0.insert(
            0,
            Segment {
                kind: "crypt".into(),
                offset: U64Str(data_offset),
                size: SegmentSize::Dynamic,
                iv_tweak: Some(U64Str(0)),
                encryption: Some("aes-xts-plain64".into()),
                sector_size: Some(sector_size),
                integrity: None,
                flags: None,
                extra: Default::default(),
            },
        );
        meta.digests.0.insert(
            0,
            keyslot::make_digest(
                &volume_key,
                digest_iterations,
                vec![slot.to_string()],
                vec!["0".into()],
            ),
        );
        let mut binary = BinaryHeader {
            version: 2,
            hdr_size: hdr,
            seqid: 0,
            label: opts.label.clone(),
            checksum_alg: "sha256".into(),
            uuid,
            subsystem: opts.subsystem.clone(),
            hdr_offset: 0,
        };
        ondisk::write_headers(&*device, &mut binary, &meta)?;
        device.flush()?;
        let l = Luks2::load(device)?;
        if l.metadata != meta || !l.warnings.is_empty() {
            return Err(Error::new(
                ErrorKind::Io,
                "the LUKS2 header read back differs from the one written",
            ));
        }
        Ok(l)
    }

    /// Reads and validates the header, choosing between the copies (and warning about a
    /// bad or stale one). Writes nothing.
    pub fn load(device: Arc<dyn BlockDevice>) -> Result<Luks2> {
        let l = ondisk::read_headers(&*device)?;
        for w in &l.warnings {
            tracing::warn!("{w}");
        }
        Ok(Luks2 {
            device,
            binary: l.binary,
            metadata: l.metadata,
            used: l.used,
            primary: l.primary,
            secondary: l.secondary,
            warnings: l.warnings,
        })
    }

    /// Unlocks with `passphrase` and returns the decrypted payload (`cryptsetup open`).
    pub fn open(
        device: Arc<dyn BlockDevice>,
        passphrase: &[u8],
        keyslot: Option<u32>,
    ) -> Result<CryptDevice> {
        let l = Luks2::load(device)?;
        l.check_activatable()?;
        let u = l.unlock(passphrase, keyslot)?;
        l.activate(&u.volume_key)
    }

    pub fn device(&self) -> &Arc<dyn BlockDevice> {
        &self.device
    }

    pub fn binary(&self) -> &BinaryHeader {
        &self.binary
    }

    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    pub fn uuid(&self) -> &str {
        &self.binary.uuid
    }

    /// Warnings from loading (a corrupt or stale copy), one sentence each.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Which copy the header was read from, and the state of both.
    pub fn copies(&self) -> (Which, &CopyState, &CopyState) {
        (self.used, &self.primary, &self.secondary)
    }

    /// Active keyslot ids.
    pub fn keyslots(&self) -> Vec<u32> {
        self.metadata.keyslots.0.keys().copied().collect()
    }

    /// The data segment's payload offset in bytes.
    pub fn data_offset(&self) -> Option<u64> {
        self.metadata.segments.0.get(&0).map(|s| s.offset.0)
    }

    /// Refuses when the header needs features cairn lacks.
    fn check_requirements(&self, what: &str) -> Result<()> {
        let unmet = self.metadata.unmet_requirements();
        if unmet.is_empty() {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::Unsupported,
            format!(
                "unmet requirements detected ({}): refusing to {what}",
                unmet.join(", ")
            ),
        ))
    }

    /// Whether the data segment can be served at all (before asking for a passphrase).
    pub fn check_activatable(&self) -> Result<()> {
        self.check_requirements("open the data")?;
        self.check_data_clear_of_header()?;
        self.segment_params(self.device.geometry().size).map(|_| ())
    }

    /// Refuses a data segment that starts inside the header and keyslot areas of the
    /// device holding the header (cryptsetup: "Device header overlaps with data area"):
    /// a client write would overwrite the header. Offset 0 is a detached header's, whose
    /// data lies on another device ([`activate_on`](Self::activate_on)).
    fn check_data_clear_of_header(&self) -> Result<()> {
        let (_, areas_end) = self.metadata.keyslots_range(self.binary.hdr_size)?;
        match self.data_offset() {
            Some(off) if off < areas_end => Err(keyslot::corrupt(format!(
                "the data segment at offset {off} overlaps the LUKS2 header and keyslot areas, \
                 which end at {areas_end} (offset 0 is for a detached header, whose data is on \
                 another device)"
            ))),
            _ => Ok(()),
        }
    }

    /// Tries `keyslot`, or every keyslot (priority 2 first, priority 0 skipped), and
    /// returns the volume key the digest confirms. A passphrase that fits no keyslot is
    /// [`ErrorKind::AuthFailed`] "no key available with this passphrase".
    pub fn unlock(&self, passphrase: &[u8], keyslot: Option<u32>) -> Result<Unlocked> {
        let candidates: Vec<u32> = match keyslot {
            Some(id) => {
                if !self.metadata.keyslots.0.contains_key(&id) {
                    return Err(Error::new(
                        ErrorKind::NotFound,
                        format!("keyslot {id} is not active"),
                    ));
                }
                vec![id]
            }
            None => {
                let mut v: Vec<(u32, u32)> = self
                    .metadata
                    .keyslots
                    .0
                    .iter()
                    .filter(|(_, k)| k.priority != Some(0))
                    .map(|(&id, k)| (if k.priority == Some(2) { 0 } else { 1 }, id))
                    .collect();
                v.sort_unstable();
                v.into_iter().map(|(_, id)| id).collect()
            }
        };
        if candidates.is_empty() {
            return Err(Error::new(ErrorKind::AuthFailed, "no usable keyslot"));
        }
        let mut skipped: Vec<String> = Vec::new();
        for id in candidates {
            let ks = &self.metadata.keyslots.0[&id];
            let Some((did, digest)) = self.metadata.digest_of_keyslot(id) else {
                continue;
            };
            match keyslot::luks2_open_keyslot(&*self.device, id, ks, passphrase) {
                Ok(key) => {
                    if keyslot::verify_digest(digest, key.as_bytes())? {
                        return Ok(Unlocked {
                            keyslot: id,
                            digest: did,
                            volume_key: VolumeKey::from_secret(key),
                            bound: !digest.segments.is_empty(),
                        });
                    }
                }
                // One damaged or unsupported keyslot does not stop the others.
                Err(e) if matches!(e.kind(), ErrorKind::Unsupported | ErrorKind::Corrupt) => {
                    tracing::warn!("keyslot {id}: {e}");
                    skipped.push(format!("keyslot {id}: {e}"));
                }
                Err(e) => return Err(e),
            }
        }
        let mut msg = NO_KEY.to_string();
        if !skipped.is_empty() {
            msg = format!("{msg} ({})", skipped.join("; "));
        }
        Err(Error::new(ErrorKind::AuthFailed, msg))
    }

    /// `cryptsetup open --test-passphrase`: the keyslot that `passphrase` opens.
    pub fn test_passphrase(&self, passphrase: &[u8], keyslot: Option<u32>) -> Result<u32> {
        self.unlock(passphrase, keyslot).map(|u| u.keyslot)
    }

    fn segment_params(&self, dev_size: u64) -> Result<(SegmentParams, String, &Segment)> {
        let segs = &self.metadata.segments.0;
        if segs.len() != 1 {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("{} data segments (a reencryption in progress?)", segs.len()),
            ));
        }
        let seg = segs
            .get(&0)
            .ok_or_else(|| keyslot::corrupt("no segment 0"))?;
        if seg.kind != "crypt" {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!("segment type {:?}", seg.kind),
            ));
        }
        if seg.integrity.is_some() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "authenticated encryption (dm-integrity) segments",
            ));
        }
        let enc = seg.encryption.clone().unwrap_or_default();
        crate::xts::CipherSpec::parse(&enc)?;
        let sector_size = seg.sector_size.unwrap_or(512);
        let offset = seg.offset.0;
        let size = match seg.size {
            SegmentSize::Bytes(n) => n,
            SegmentSize::Dynamic => {
                let room = dev_size.checked_sub(offset).ok_or_else(|| {
                    keyslot::corrupt(format!(
                        "device of {dev_size} bytes ends before the data offset {offset}"
                    ))
                })?;
                room - room % u64::from(sector_size)
            }
        };
        let allow_discards = self
            .metadata
            .config
            .flags
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == "allow-discards"));
        Ok((
            SegmentParams {
                offset,
                size,
                sector_size,
                iv_tweak: seg.iv_tweak.map_or(0, |t| t.0),
                allow_discards,
            },
            enc,
            seg,
        ))
    }

    /// The decrypted payload for a verified volume key.
    pub fn activate(&self, key: &VolumeKey) -> Result<CryptDevice> {
        self.check_data_clear_of_header()?;
        self.activate_on(self.device.clone(), key)
    }

    /// As [`activate`](Self::activate), with the data on another device than the header
    /// (cryptsetup's `--header`: a detached header, usually with data offset 0).
    pub fn activate_on(&self, data: Arc<dyn BlockDevice>, key: &VolumeKey) -> Result<CryptDevice> {
        self.check_requirements("open the data")?;
        let (params, enc, _) = self.segment_params(data.geometry().size)?;
        let covering = self
            .metadata
            .digests
            .0
            .values()
            .find(|d| d.segments.iter().any(|s| s == "0"))
            .ok_or_else(|| keyslot::corrupt("segment 0 has no digest"))?;
        if !keyslot::verify_digest(covering, key.as_bytes())? {
            return Err(Error::new(
                ErrorKind::AuthFailed,
                "this key is not the data segment's volume key (unbound keyslot?)",
            ));
        }
        let cipher = SectorCipher::new(&enc, key.as_bytes())?;
        let desc = format!(
            "LUKS2 {enc} {}-bit, {}-byte sectors, data at {}",
            key.len() * 8,
            params.sector_size,
            params.offset
        );
        CryptDevice::new(data, cipher, params, desc)
    }

    /// Refuses metadata changes cairn must not make: unmet requirements, or a damaged
    /// primary with another format's signature where it should be.
    fn check_writable(&self) -> Result<()> {
        self.check_requirements("change the header")?;
        if !self.primary.is_valid() {
            let found = ondisk::foreign_signatures(&*self.device)?;
            if !found.is_empty() {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "device contains ambiguous signatures ({}) where the LUKS2 primary header should be; refusing to write",
                        found.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Writes `meta` to both copies and makes it current.
    fn commit(&mut self, meta: Metadata) -> Result<()> {
        let mut bin = self.binary.clone();
        ondisk::write_headers(&*self.device, &mut bin, &meta)?;
        self.binary = bin;
        self.metadata = meta;
        self.used = Which::Primary;
        let st = CopyState::Valid {
            offset: 0,
            seqid: self.binary.seqid,
        };
        self.primary = st.clone();
        self.secondary = CopyState::Valid {
            offset: self.binary.hdr_size,
            seqid: self.binary.seqid,
        };
        self.warnings.clear();
        Ok(())
    }

    /// Rewrites both copies from the one in use when a copy was bad or stale (what
    /// cryptsetup does automatically on load). Returns whether anything was written.
    pub fn repair(&mut self) -> Result<bool> {
        let good = matches!((&self.primary, &self.secondary),
            (CopyState::Valid { seqid: a, .. }, CopyState::Valid { seqid: b, .. }) if a == b);
        if good {
            return Ok(false);
        }
        self.check_writable()?;
        let meta = self.metadata.clone();
        self.commit(meta)?;
        Ok(true)
    }

    /// Lowest free 4096-aligned area of `size` bytes in the keyslots area.
    fn free_area(&self, size: u64, ignore: Option<u32>) -> Result<u64> {
        let (start, end) = self.metadata.keyslots_range(self.binary.hdr_size)?;
        let mut used: Vec<(u64, u64)> = self
            .metadata
            .keyslots
            .0
            .iter()
            .filter(|(id, _)| Some(**id) != ignore)
            .map(|(_, k)| {
                (
                    k.area.offset.0,
                    k.area.offset.0.saturating_add(k.area.size.0),
                )
            })
            .collect();
        used.sort_unstable();
        let mut at = start;
        for (a, b) in used {
            if at.saturating_add(size) <= a {
                break;
            }
            at = at.max(b.div_ceil(4096) * 4096);
        }
        if at.saturating_add(size) > end {
            return Err(Error::new(
                ErrorKind::NoSpace,
                "no room for another keyslot in the keyslots area",
            ));
        }
        Ok(at)
    }

    fn free_slot(&self) -> Result<u32> {
        (0..ondisk::MAX_KEYSLOTS)
            .find(|i| !self.metadata.keyslots.0.contains_key(i))
            .ok_or_else(|| Error::new(ErrorKind::NoSpace, "all 32 keyslots are in use"))
    }

    /// Adds a keyslot for `new_passphrase` holding the volume key that
    /// `existing_passphrase` unlocks (`luksAddKey`). Returns the new keyslot id.
    pub fn add_key(
        &mut self,
        existing_passphrase: &[u8],
        new_passphrase: &[u8],
        opts: &KeyslotOptions,
    ) -> Result<u32> {
        self.check_writable()?;
        let u = self.unlock(existing_passphrase, None)?;
        self.add_key_with_volume_key(&u.volume_key, new_passphrase, opts)
    }

    /// Adds a keyslot for a volume key the caller already holds (it must match the
    /// digest of the data segment).
    pub fn add_key_with_volume_key(
        &mut self,
        key: &VolumeKey,
        new_passphrase: &[u8],
        opts: &KeyslotOptions,
    ) -> Result<u32> {
        self.check_writable()?;
        let (did, _) = self
            .metadata
            .digests
            .0
            .iter()
            .find(|(_, d)| keyslot::verify_digest(d, key.as_bytes()).unwrap_or(false))
            .map(|(k, d)| (*k, d))
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::AuthFailed,
                    "volume key does not match any digest",
                )
            })?;
        let id = match opts.keyslot {
            Some(id) if id >= ondisk::MAX_KEYSLOTS => {
                return Err(invalid(format!("keyslot {id} is not below 32")))
            }
            Some(id) if self.metadata.keyslots.0.contains_key(&id) => {
                return Err(invalid(format!("keyslot {id} is in use")))
            }
            Some(id) => id,
            None => self.free_slot()?,
        };
        let size = keyslot::area_size_for(key.len());
        let offset = self.free_area(size, None)?;
        let kdf = opts.pbkdf.resolve(key.len())?;
        let ks = keyslot::luks2_write_keyslot(
            &*self.device,
            key,
            new_passphrase,
            &kdf,
            offset,
            size,
            opts.priority,
        )?;
        self.device.flush()?;
        let mut meta = self.metadata.clone();
        meta.keyslots.0.insert(id, ks);
        meta.digests
            .0
            .get_mut(&did)
            .expect("digest found above")
            .keyslots
            .push(id.to_string());
        self.commit(meta)?;
        Ok(id)
    }

    /// Removes the keyslot that `passphrase` opens (`luksRemoveKey`); returns its id.
    /// Removing the last keyslot is allowed: the caller asks the user first.
    pub fn remove_key(&mut self, passphrase: &[u8]) -> Result<u32> {
        self.check_writable()?;
        let u = self.unlock(passphrase, None)?;
        self.kill_slot(u.keyslot)?;
        Ok(u.keyslot)
    }

    /// Destroys keyslot `id` without a passphrase (`luksKillSlot`): its area is
    /// overwritten, then it leaves the header (and its digest's and tokens' lists).
    pub fn kill_slot(&mut self, id: u32) -> Result<()> {
        self.check_writable()?;
        let ks = self.metadata.keyslots.0.get(&id).ok_or_else(|| {
            Error::new(ErrorKind::NotFound, format!("keyslot {id} is not active"))
        })?;
        keyslot::wipe_area(&*self.device, ks.area.offset.0, ks.area.size.0)?;
        self.device.flush()?;
        let mut meta = self.metadata.clone();
        meta.keyslots.0.remove(&id);
        let s = id.to_string();
        for d in meta.digests.0.values_mut() {
            d.keyslots.retain(|k| *k != s);
        }
        for t in meta.tokens.0.values_mut() {
            t.keyslots.retain(|k| *k != s);
        }
        self.commit(meta)
    }

    /// Replaces the passphrase of the keyslot `old_passphrase` opens (`luksChangeKey`).
    /// The new material goes to a free area and the header switches to it in one write,
    /// so a crash leaves either the old or the new passphrase working. The keyslot keeps
    /// its id unless `opts.keyslot` names another. Returns the keyslot id.
    pub fn change_key(
        &mut self,
        old_passphrase: &[u8],
        new_passphrase: &[u8],
        opts: &KeyslotOptions,
    ) -> Result<u32> {
        self.check_writable()?;
        let u = self.unlock(old_passphrase, None)?;
        let old = self.metadata.keyslots.0[&u.keyslot].clone();
        let new_id = match opts.keyslot {
            Some(id) if id >= ondisk::MAX_KEYSLOTS => {
                return Err(invalid(format!("keyslot {id} is not below 32")))
            }
            Some(id) if id != u.keyslot && self.metadata.keyslots.0.contains_key(&id) => {
                return Err(invalid(format!("keyslot {id} is in use")))
            }
            Some(id) => id,
            None => u.keyslot,
        };
        let size = keyslot::area_size_for(u.volume_key.len());
        let offset = self.free_area(size, None)?;
        let kdf = opts.pbkdf.resolve(u.volume_key.len())?;
        let ks = keyslot::luks2_write_keyslot(
            &*self.device,
            &u.volume_key,
            new_passphrase,
            &kdf,
            offset,
            size,
            opts.priority.or(old.priority),
        )?;
        self.device.flush()?;
        let mut meta = self.metadata.clone();
        meta.keyslots.0.remove(&u.keyslot);
        meta.keyslots.0.insert(new_id, ks);
        if new_id != u.keyslot {
            let (olds, news) = (u.keyslot.to_string(), new_id.to_string());
            for d in meta.digests.0.values_mut() {
                for k in d.keyslots.iter_mut().filter(|k| **k == olds) {
                    k.clone_from(&news);
                }
            }
            for t in meta.tokens.0.values_mut() {
                t.keyslots.retain(|k| *k != olds);
            }
        }
        self.commit(meta)?;
        keyslot::wipe_area(&*self.device, old.area.offset.0, old.area.size.0)?;
        self.device.flush()?;
        Ok(new_id)
    }

    /// Bytes from the start of the device that hold metadata: both copies and the
    /// keyslots area.
    pub fn metadata_area_size(&self) -> Result<u64> {
        Ok(self.metadata.keyslots_range(self.binary.hdr_size)?.1)
    }

    /// Writes a header backup (`luksHeaderBackup`): both header copies, rebuilt from the
    /// copy in use, and the keyslots area, as a file cryptsetup can read. Refuses to
    /// overwrite an existing file; the file is created mode 0600.
    pub fn header_backup(&self, path: &Path) -> Result<()> {
        let len = self.metadata_area_size()?;
        let len_usize = usize::try_from(len).map_err(|_| invalid("metadata area too large"))?;
        let ks_start = 2 * self.binary.hdr_size;
        let ks = keyslot::read_secret(
            &*self.device,
            ks_start,
            len_usize - usize::try_from(ks_start).map_err(|_| invalid("header size"))?,
        )?;
        let json = ondisk::metadata_json(&self.metadata)?;
        let mut image = ondisk::build_copy(&self.binary, &json, Which::Primary)?;
        image.extend_from_slice(&ondisk::build_copy(&self.binary, &json, Which::Secondary)?);
        image.extend_from_slice(ks.as_bytes());
        drop(ks);
        use std::os::unix::fs::OpenOptionsExt;
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(|e| Error::io(e, format!("creating header backup {}", path.display())))?;
        f.write_all(&image)
            .and_then(|()| f.sync_all())
            .map_err(|e| Error::io(e, format!("writing header backup {}", path.display())))?;
        zeroize::Zeroize::zeroize(&mut image);
        Ok(())
    }

    /// Restores a header backup onto `device` (`luksHeaderRestore`). The backup must be
    /// a valid LUKS2 header; when the device already holds a LUKS2 header with another
    /// UUID or data offset, `force` must be set (its data would become unreadable).
    pub fn header_restore(device: Arc<dyn BlockDevice>, path: &Path, force: bool) -> Result<Luks2> {
        // The largest metadata area: two 4 MiB headers and a 128 MiB keyslots area.
        let max = 2 * (4 * MIB) + ondisk::MAX_KEYSLOTS_SIZE;
        let len = std::fs::metadata(path)
            .map_err(|e| Error::io(e, format!("reading header backup {}", path.display())))?
            .len();
        if len > max {
            return Err(invalid(format!(
                "{} ({len} bytes) is larger than any LUKS2 header backup",
                path.display()
            )));
        }
        let bytes = std::fs::read(path)
            .map_err(|e| Error::io(e, format!("reading header backup {}", path.display())))?;
        let l = ondisk::load_image(&bytes)
            .map_err(|e| e.context(format!("header backup {}", path.display())))?;
        let (_, end) = l.metadata.keyslots_range(l.binary.hdr_size)?;
        let end_usize = usize::try_from(end).map_err(|_| invalid("metadata area"))?;
        if bytes.len() < end_usize {
            return Err(keyslot::corrupt(format!(
                "header backup {} is shorter than its metadata area ({end} bytes)",
                path.display()
            )));
        }
        if device.geometry().size < end {
            return Err(Error::new(
                ErrorKind::NoSpace,
                "device is smaller than the header backup",
            ));
        }
        if !l.metadata.unmet_requirements().is_empty() {
            return Err(Error::new(
                ErrorKind::Unsupported,
                "the backup has requirements cairn does not implement",
            ));
        }
        let mut seqid = l.binary.seqid;
        if let Ok(cur) = ondisk::read_headers(&*device) {
            let same_offset = cur.metadata.segments.0.get(&0).map(|s| s.offset)
                == l.metadata.segments.0.get(&0).map(|s| s.offset);
            if (cur.binary.uuid != l.binary.uuid || !same_offset) && !force {
                return Err(invalid(format!(
                    "the device holds another LUKS2 header (UUID {}); restoring {} (UUID {}) would replace it",
                    cur.binary.uuid,
                    path.display(),
                    l.binary.uuid
                )));
            }
            seqid = seqid.max(cur.binary.seqid);
        }
        let ks_start =
            usize::try_from(2 * l.binary.hdr_size).map_err(|_| invalid("header size"))?;
        device.write_at(
            &bytes[ks_start..end_usize],
            2 * l.binary.hdr_size,
            WriteFlags::NONE,
        )?;
        device.flush()?;
        let mut bin = l.binary.clone();
        bin.seqid = seqid;
        ondisk::write_headers(&*device, &mut bin, &l.metadata)?;
        Luks2::load(device)
    }

    /// A description of the header like `cryptsetup luksDump`, without key material.
    pub fn dump(&self) -> Dump {
        let m = &self.metadata;
        let keyslots = m
            .keyslots
            .0
            .iter()
            .map(|(&id, k)| {
                let kdf = k.kdf.as_ref();
                DumpKeyslot {
                    id,
                    kind: k.kind.clone(),
                    key_bits: k.key_size * 8,
                    priority: k.priority.map_or("normal", |p| match p {
                        0 => "ignore",
                        2 => "preferred",
                        _ => "normal",
                    }),
                    cipher: k.area.encryption.clone(),
                    cipher_key_bits: k.area.key_size.map(|b| b * 8),
                    pbkdf: kdf.map(|k| k.kind.clone()),
                    hash: kdf.and_then(|k| k.hash.clone()),
                    iterations: kdf.and_then(|k| k.iterations),
                    time_cost: kdf.and_then(|k| k.time),
                    memory_kib: kdf.and_then(|k| k.memory),
                    threads: kdf.and_then(|k| k.cpus),
                    salt: kdf.and_then(|k| k.salt.as_ref()).map(|s| hex(&s.0)),
                    af_stripes: k.af.as_ref().map(|a| a.stripes),
                    af_hash: k.af.as_ref().map(|a| a.hash.clone()),
                    area_offset: k.area.offset.0,
                    area_length: k.area.size.0,
                    digest: m.digest_of_keyslot(id).map(|(d, _)| d),
                }
            })
            .collect();
        let segments = m
            .segments
            .0
            .iter()
            .map(|(&id, s)| DumpSegment {
                id,
                kind: s.kind.clone(),
                offset: s.offset.0,
                size: match s.size {
                    SegmentSize::Dynamic => None,
                    SegmentSize::Bytes(n) => Some(n),
                },
                iv_tweak: s.iv_tweak.map(|t| t.0),
                cipher: s.encryption.clone(),
                sector_size: s.sector_size,
                flags: s.flags.clone().unwrap_or_default(),
            })
            .collect();
        let digests = m
            .digests
            .0
            .iter()
            .map(|(&id, d)| DumpDigest {
                id,
                kind: d.kind.clone(),
                hash: d.hash.clone(),
                iterations: d.iterations,
                salt: d.salt.as_ref().map(|s| hex(&s.0)),
                digest: d.digest.as_ref().map(|s| hex(&s.0)),
                keyslots: d.keyslots.clone(),
                segments: d.segments.clone(),
            })
            .collect();
        let tokens = m
            .tokens
            .0
            .iter()
            .map(|(&id, t)| DumpToken {
                id,
                kind: t.kind.clone(),
                keyslots: t.keyslots.clone(),
            })
            .collect();
        Dump {
            version: 2,
            uuid: self.binary.uuid.clone(),
            label: self.binary.label.clone(),
            subsystem: self.binary.subsystem.clone(),
            seqid: self.binary.seqid,
            metadata_size: self.binary.hdr_size,
            keyslots_size: m.config.keyslots_size.0,
            checksum_alg: self.binary.checksum_alg.clone(),
            flags: m.config.flags.clone().unwrap_or_default(),
            requirements: m
                .config
                .requirements
                .as_ref()
                .and_then(|r| r.mandatory.clone())
                .unwrap_or_default(),
            unmet_requirements: m.unmet_requirements(),
            header_used: self.used,
            primary: self.primary.clone(),
            secondary: self.secondary.clone(),
            warnings: self.warnings.clone(),
            segments,
            keyslots,
            tokens,
            digests,
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// What `cairn luks dump` shows: every header field, never key material. Salts and
/// digests are included, as `cryptsetup luksDump` prints them (they are not secret).
#[derive(Debug, Clone, Serialize)]
pub struct Dump {
    pub version: u16,
    pub uuid: String,
    pub label: String,
    pub subsystem: String,
    pub seqid: u64,
    pub metadata_size: u64,
    pub keyslots_size: u64,
    pub checksum_alg: String,
    pub flags: Vec<String>,
    pub requirements: Vec<String>,
    pub unmet_requirements: Vec<String>,
    pub header_used: Which,
    pub primary: CopyState,
    pub secondary: CopyState,
    pub warnings: Vec<String>,
    pub segments: Vec<DumpSegment>,
    pub keyslots: Vec<DumpKeyslot>,
    pub tokens: Vec<DumpToken>,
    pub digests: Vec<DumpDigest>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DumpSegment {
    pub id: u32,
    pub kind: String,
    pub offset: u64,
    /// `None`: dynamic (to the end of the device).
    pub size: Option<u64>,
    pub iv_tweak: Option<u64>,
    pub cipher: Option<String>,
    pub sector_size: Option<u32>,
    pub flags: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DumpKeyslot {
    pub id: u32,
    pub kind: String,
    pub key_bits: u32,
    pub priority: &'static str,
    pub cipher: Option<String>,
    pub cipher_key_bits: Option<u32>,
    pub pbkdf: Option<String>,
    pub hash: Option<String>,
    pub iterations: Option<u32>,
    pub time_cost: Option<u32>,
    pub memory_kib: Option<u32>,
    pub threads: Option<u32>,
    pub salt: Option<String>,
    pub af_stripes: Option<u32>,
    pub af_hash: Option<String>,
    pub area_offset: u64,
    pub area_length: u64,
    pub digest: Option<u32>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DumpToken {
    pub id: u32,
    pub kind: String,
    pub keyslots: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct DumpDigest {
    pub id: u32,
    pub kind: String,
    pub hash: Option<String>,
    pub iterations: Option<u32>,
    pub salt: Option<String>,
    pub digest: Option<String>,
    pub keyslots: Vec<String>,
    pub segments: Vec<String>,
}

impl fmt::Display for Dump {
    /// The layout of `cryptsetup luksDump`, so the user's habits carry over.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let or = |s: &str| {
            if s.is_empty() {
                "(no label)".to_string()
            } else {
                s.to_string()
            }
        };
        writeln!(f, "LUKS header information")?;
        writeln!(f, "Version:       \t{}", self.version)?;
        writeln!(f, "Epoch:         \t{}", self.seqid)?;
        writeln!(f, "Metadata area: \t{} [bytes]", self.metadata_size)?;
        writeln!(f, "Keyslots area: \t{} [bytes]", self.keyslots_size)?;
        writeln!(f, "UUID:          \t{}", self.uuid)?;
        writeln!(f, "Label:         \t{}", or(&self.label))?;
        writeln!(
            f,
            "Subsystem:     \t{}",
            if self.subsystem.is_empty() {
                "(no subsystem)"
            } else {
                &self.subsystem
            }
        )?;
        writeln!(
            f,
            "Flags:       \t{}",
            if self.flags.is_empty() {
                "(no flags)".to_string()
            } else {
                self.flags.join(" ")
            }
        )?;
        if !self.requirements.is_empty() {
            writeln!(f, "Requirements:\t{}", self.requirements.join(" "))?;
        }
        for w in &self.warnings {
            writeln!(f, "Warning:       \t{w}")?;
        }
        writeln!(f, "\nData segments:")?;
        for s in &self.segments {
            writeln!(f, "  {}: {}", s.id, s.kind)?;
            writeln!(f, "\toffset: {} [bytes]", s.offset)?;
            match s.size {
                Some(n) => writeln!(f, "\tlength: {n} [bytes]")?,
                None => writeln!(f, "\tlength: (whole device)")?,
            }
            if let Some(c) = &s.cipher {
                writeln!(f, "\tcipher: {c}")?;
            }
            if let Some(ss) = s.sector_size {
                writeln!(f, "\tsector: {ss} [bytes]")?;
            }
        }
        writeln!(f, "\nKeyslots:")?;
        for k in &self.keyslots {
            writeln!(f, "  {}: {}", k.id, k.kind)?;
            writeln!(f, "\tKey:        {} bits", k.key_bits)?;
            writeln!(f, "\tPriority:   {}", k.priority)?;
            if let (Some(c), Some(b)) = (&k.cipher, k.cipher_key_bits) {
                writeln!(f, "\tCipher:     {c}")?;
                writeln!(f, "\tCipher key: {b} bits")?;
            }
            if let Some(p) = &k.pbkdf {
                writeln!(f, "\tPBKDF:      {p}")?;
            }
            if let Some(h) = &k.hash {
                writeln!(f, "\tHash:       {h}")?;
            }
            if let Some(i) = k.iterations {
                writeln!(f, "\tIterations: {i}")?;
            }
            if let Some(t) = k.time_cost {
                writeln!(f, "\tTime cost:  {t}")?;
            }
            if let Some(m) = k.memory_kib {
                writeln!(f, "\tMemory:     {m}")?;
            }
            if let Some(t) = k.threads {
                writeln!(f, "\tThreads:    {t}")?;
            }
            if let Some(s) = &k.salt {
                writeln!(f, "\tSalt:       {s}")?;
            }
            if let (Some(s), Some(h)) = (k.af_stripes, &k.af_hash) {
                writeln!(f, "\tAF stripes: {s}")?;
                writeln!(f, "\tAF hash:    {h}")?;
            }
            writeln!(f, "\tArea offset:{} [bytes]", k.area_offset)?;
            writeln!(f, "\tArea length:{} [bytes]", k.area_length)?;
            if let Some(d) = k.digest {
                writeln!(f, "\tDigest ID:  {d}")?;
            }
        }
        writeln!(f, "Tokens:")?;
        for t in &self.tokens {
            writeln!(f, "  {}: {}", t.id, t.kind)?;
            writeln!(f, "\tKeyslot:    {}", t.keyslots.join(" "))?;
        }
        writeln!(f, "Digests:")?;
        for d in &self.digests {
            writeln!(f, "  {}: {}", d.id, d.kind)?;
            if let Some(h) = &d.hash {
                writeln!(f, "\tHash:       {h}")?;
            }
            if let Some(i) = d.iterations {
                writeln!(f, "\tIterations: {i}")?;
            }
            if let Some(s) = &d.salt {
                writeln!(f, "\tSalt:       {s}")?;
            }
            if let Some(s) = &d.digest {
                writeln!(f, "\tDigest:     {s}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_is_lcm_of_mib_and_stripe() {
        assert_eq!(payload_alignment(0), MIB);
        assert_eq!(payload_alignment(4096), MIB);
        assert_eq!(payload_alignment(2 * 1024 * 1024), 2 * MIB);
        // 3 data disks x 64 KiB chunks: 192 KiB -> 3 MiB.
        assert_eq!(payload_alignment(192 * 1024), 3 * MIB);
        assert_eq!(payload_alignment(1000), MIB);
    }

    #[test]
    fn uuids() {
        let u = random_uuid();
        assert!(valid_uuid(&u), "{u}");
        assert_eq!(&u[14..15], "4");
        assert!(!valid_uuid("12a3a118-7039-4575-a649-3f559d8d87e"));
        assert!(valid_uuid("12A3A118-7039-4575-a649-3f559d8d87ef"));
        // The other forms a UUID is written in are not a LUKS2 uuid field.
        assert!(!valid_uuid("12a3a118703945754a6493f559d8d87ef"));
        assert!(!valid_uuid("12a3a1187039457_a649_3f559d8d87ef0000"));
        assert!(!valid_uuid("{12a3a118-7039-4575-a649-3f559d8d87ef}"));
    }
}
