//! The data path: AES-XTS (and, for LUKS1 and old keyslots, AES-CBC) per sector, in place.
//!
//! ```text
//!   CryptDevice::read_at / write_at
//!     SectorCipher::{decrypt,encrypt}(buf, unit_size, iv0)   -- parsed from "aes-xts-plain64"
//!       Xts: tweaks for 64 units at once (one batched AES call), then windows of 256
//!            blocks: xor tweak, AES (aes crate: AES-NI / VAES-512 picked at run time), xor
//! ```
//!
//! dm-crypt's IV rule, which LUKS2 follows even for 4096-byte sectors: the IV of a data
//! unit is its byte offset within the segment / 512 (+ `iv_tweak`), so consecutive 4 KiB
//! units use IVs 0, 8, 16, … (`ondisk-formats.md` §2.8). Callers pass the IV of the first
//! unit in 512-byte units; each later unit adds `unit_size / 512`.
//!
//! The aes crate's VAES backend encrypts 64 blocks per step and falls back to one block at
//! a time for a shorter tail, so the XTS loop hands it 256-block windows and computes the
//! per-unit start tweaks for up to 64 units in a single call: a 512-byte-sector request
//! then runs at the same speed as a 4 KiB one.

use aes::cipher::{Array, BlockCipherDecrypt, BlockCipherEncrypt, KeyInit};
use aes::{Aes128, Aes192, Aes256, Block};
use cairn_block::{Error, ErrorKind, Result};
use sha2::Digest;

/// Blocks per AES call in the XTS loop: a multiple of the VAES-512 backend's 64.
const WINDOW: usize = 256;
/// Data units whose start tweaks are computed together.
const UNIT_GROUP: usize = 64;

/// How the IV is derived from the unit number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IvMode {
    /// The 64-bit unit number, little-endian, zero-padded.
    Plain64,
    /// The low 32 bits of the unit number.
    Plain,
    /// The unit number encrypted with AES under SHA-256(key) (CBC only).
    EssivSha256,
}

/// Block-cipher mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Xts,
    Cbc,
}

/// A parsed dm-crypt cipher specification `cipher-mode-iv`, e.g. `aes-xts-plain64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CipherSpec {
    pub mode: Mode,
    pub iv: IvMode,
}

impl CipherSpec {
    /// Parses a LUKS2 `encryption` string or LUKS1 `cipherName` + `-` + `cipherMode`.
    /// Anything but AES in XTS or CBC mode is [`ErrorKind::Unsupported`], as are kernel
    /// crypto API names (`capi:…`), which cryptsetup's own cipher table does not parse.
    pub fn parse(spec: &str) -> Result<CipherSpec> {
        let unsupported = |why: &str| {
            Error::new(
                ErrorKind::Unsupported,
                format!("cipher specification {spec:?}: {why}"),
            )
        };
        if spec.starts_with("capi:") {
            return Err(unsupported("no known cipher specification pattern"));
        }
        let mut parts = spec.splitn(3, '-');
        let (cipher, mode, iv) = match (parts.next(), parts.next(), parts.next()) {
            (Some(c), Some(m), Some(i)) => (c, m, i),
            (Some(c), Some(m), None) => (c, m, ""),
            _ => return Err(unsupported("expected cipher-mode-iv")),
        };
        if cipher != "aes" {
            return Err(unsupported("only the aes cipher is implemented"));
        }
        let mode = match mode {
            "xts" => Mode::Xts,
            "cbc" => Mode::Cbc,
            _ => return Err(unsupported("only the xts and cbc modes are implemented")),
        };
        let iv = match iv {
            "plain64" => IvMode::Plain64,
            "plain" => IvMode::Plain,
            "essiv:sha256" if mode == Mode::Cbc => IvMode::EssivSha256,
            _ => return Err(unsupported("unsupported IV generator")),
        };
        Ok(CipherSpec { mode, iv })
    }

    /// Whether a key of `len` bytes fits this mode (XTS: two AES keys).
    pub fn key_size_ok(&self, len: usize) -> bool {
        match self.mode {
            Mode::Xts => matches!(len, 32 | 48 | 64),
            Mode::Cbc => matches!(len, 16 | 24 | 32),
        }
    }
}

/// A keyed sector cipher, safe to share between threads (keys are only read).
pub struct SectorCipher {
    kind: Kind,
    iv: IvMode,
}

enum Kind {
    Xts128(Xts<Aes128>),
    Xts192(Xts<Aes192>),
    Xts256(Xts<Aes256>),
    Cbc128(Cbc<Aes128>),
    Cbc192(Cbc<Aes192>),
    Cbc256(Cbc<Aes256>),
}

impl std::fmt::Debug for SectorCipher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.kind {
            Kind::Xts128(_) => "aes-128-xts",
            Kind::Xts192(_) => "aes-192-xts",
            Kind::Xts256(_) => "aes-256-xts",
            Kind::Cbc128(_) => "aes-128-cbc",
            Kind::Cbc192(_) => "aes-192-cbc",
            Kind::Cbc256(_) => "aes-256-cbc",
        };
        write!(
            f,
            "SectorCipher({name}, {:?}, {:?}, key redacted)",
            self.iv,
            self.xts_path()
        )
    }
}

impl SectorCipher {
    /// Keys a cipher from a specification string and the full dm-crypt key.
    pub fn new(spec: &str, key: &[u8]) -> Result<SectorCipher> {
        SectorCipher::from_spec(CipherSpec::parse(spec)?, key)
    }

    pub fn from_spec(spec: CipherSpec, key: &[u8]) -> Result<SectorCipher> {
        let bad_len = || {
            Error::new(
                ErrorKind::Unsupported,
                format!("{}-byte key for {:?} mode", key.len(), spec.mode),
            )
        };
        let kind = match spec.mode {
            Mode::Xts => match key.len() {
                32 => Kind::Xts128(Xts::new(key)),
                48 => Kind::Xts192(Xts::new(key)),
                64 => Kind::Xts256(Xts::new(key)),
                _ => return Err(bad_len()),
            },
            Mode::Cbc => {
                let essiv = (spec.iv == IvMode::EssivSha256).then(|| {
                    let mut salt = sha2::Sha256::digest(key);
                    let e = Aes256::new(&salt);
                    zeroize::Zeroize::zeroize(salt.as_mut_slice());
                    e
                });
                match key.len() {
                    16 => Kind::Cbc128(Cbc::new(key, essiv)),
                    24 => Kind::Cbc192(Cbc::new(key, essiv)),
                    32 => Kind::Cbc256(Cbc::new(key, essiv)),
                    _ => return Err(bad_len()),
                }
            }
        };
        Ok(SectorCipher { kind, iv: spec.iv })
    }

    /// Encrypts `buf` (whole units of `unit_size` bytes, a multiple of 512) in place; the
    /// first unit's IV is `iv0` (in 512-byte units), each next one `unit_size / 512` more.
    pub fn encrypt(&self, buf: &mut [u8], unit_size: usize, iv0: u64) {
        self.crypt(buf, unit_size, iv0, true);
    }

    /// Decrypts in place; the inverse of [`encrypt`](Self::encrypt).
    pub fn decrypt(&self, buf: &mut [u8], unit_size: usize, iv0: u64) {
        self.crypt(buf, unit_size, iv0, false);
    }

    /// Encrypts `buf` as one data unit (any multiple of 16 bytes) with IV `iv`: the
    /// shape of the IEEE 1619 vectors.
    pub fn encrypt_unit(&self, buf: &mut [u8], iv: u64) {
        self.crypt(buf, buf.len(), iv, true);
    }

    /// Decrypts `buf` as one data unit with IV `iv`.
    pub fn decrypt_unit(&self, buf: &mut [u8], iv: u64) {
        self.crypt(buf, buf.len(), iv, false);
    }

    /// The XTS loop in use (`None` for CBC).
    pub fn xts_path(&self) -> Option<XtsPath> {
        match &self.kind {
            Kind::Xts128(x) => Some(x.path),
            Kind::Xts192(x) => Some(x.path),
            Kind::Xts256(x) => Some(x.path),
            _ => None,
        }
    }

    /// Uses a slower XTS loop than the best one (for tests and benchmarks that compare
    /// them); a faster one than the CPU allows is not granted.
    #[doc(hidden)]
    pub fn with_xts_path(mut self, path: XtsPath) -> SectorCipher {
        match &mut self.kind {
            Kind::Xts128(x) => x.path = x.path.min(path),
            Kind::Xts192(x) => x.path = x.path.min(path),
            Kind::Xts256(x) => x.path = x.path.min(path),
            _ => {}
        }
        self
    }

    fn crypt(&self, buf: &mut [u8], unit_size: usize, iv0: u64, enc: bool) {
        debug_assert!(unit_size > 0 && unit_size.is_multiple_of(16));
        debug_assert!(buf.len().is_multiple_of(unit_size));
        if buf.is_empty() {
            return;
        }
        let ivs = Ivs {
            first: iv0,
            step: (unit_size / 512) as u64,
            mode: self.iv,
        };
        match &self.kind {
            Kind::Xts128(x) => x.crypt(buf, unit_size, ivs, enc),
            Kind::Xts192(x) => x.crypt(buf, unit_size, ivs, enc),
            Kind::Xts256(x) => x.crypt(buf, unit_size, ivs, enc),
            Kind::Cbc128(c) => c.crypt(buf, unit_size, ivs, enc),
            Kind::Cbc192(c) => c.crypt(buf, unit_size, ivs, enc),
            Kind::Cbc256(c) => c.crypt(buf, unit_size, ivs, enc),
        }
    }
}

/// The IV sequence of consecutive units.
#[derive(Clone, Copy)]
struct Ivs {
    first: u64,
    step: u64,
    mode: IvMode,
}

impl Ivs {
    fn unit(&self, k: usize) -> u64 {
        let n = self.first.wrapping_add(self.step.wrapping_mul(k as u64));
        match self.mode {
            IvMode::Plain => n & 0xffff_ffff,
            IvMode::Plain64 | IvMode::EssivSha256 => n,
        }
    }
}

/// Multiplies an XTS tweak by the primitive element α of GF(2^128) (IEEE 1619 §5.2):
/// little-endian, reduction polynomial x^128 + x^7 + x^2 + x + 1.
#[inline(always)]
fn mul_alpha(t: u128) -> u128 {
    (t << 1) ^ (0u128.wrapping_sub(t >> 127) & 0x87)
}

#[inline(always)]
fn load(b: &Block) -> u128 {
    u128::from_le_bytes(b.0)
}

#[inline(always)]
fn store(b: &mut Block, v: u128) {
    b.0 = v.to_le_bytes();
}

/// How the XTS loop runs, fastest first; chosen per cipher from what the CPU has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum XtsPath {
    /// One block at a time for the tweaks, the aes crate for AES.
    Scalar,
    /// AVX-512 tweaks and xors around the aes crate's AES.
    Vector,
    /// One VAES-512 loop: tweak xor folded into the first and last round keys.
    Fused,
}

/// AES-XTS over one AES variant: `k1` encrypts the data, `k2` the tweak. `fused` holds
/// `k1`'s round keys for the VAES loop when the CPU has it (AES-128 and AES-256).
struct Xts<C> {
    k1: C,
    k2: C,
    fused: Option<(fused::Keys, fused::Keys)>,
    path: XtsPath,
}

impl<C> Xts<C>
where
    C: KeyInit + BlockCipherEncrypt + BlockCipherDecrypt,
    C: aes::cipher::BlockSizeUser<BlockSize = aes::cipher::consts::U16>,
{
    fn new(key: &[u8]) -> Xts<C> {
        let (a, b) = key.split_at(key.len() / 2);
        let fused = fused::Keys::expand(a).zip(fused::Keys::expand(b));
        let path = if fused.is_some() {
            XtsPath::Fused
        } else if simd::available() {
            XtsPath::Vector
        } else {
            XtsPath::Scalar
        };
        Xts {
            k1: C::new_from_slice(a).expect("key length checked by the caller"),
            k2: C::new_from_slice(b).expect("key length checked by the caller"),
            fused,
            path,
        }
    }

    fn crypt(&self, buf: &mut [u8], unit_size: usize, ivs: Ivs, enc: bool) {
        let (blocks, rest) = Block::slice_as_chunks_mut(buf);
        debug_assert!(rest.is_empty());
        let unit_blocks = unit_size / 16;
        let group_blocks = unit_blocks * UNIT_GROUP;
        // The vector paths want units of whole 16-block steps (all LUKS sector sizes).
        let whole_steps = unit_blocks.is_multiple_of(simd::BLOCKS_PER_STEP);
        let fused = self
            .fused
            .as_ref()
            .filter(|_| self.path == XtsPath::Fused && whole_steps);
        let vector =
            self.path >= XtsPath::Vector && whole_steps && WINDOW.is_multiple_of(unit_blocks);
        let mut starts = [Block::default(); UNIT_GROUP];
        // Written before it is read, every window: no need to zero it per call.
        let mut saved = [const { std::mem::MaybeUninit::<u128>::uninit() }; WINDOW];
        for (g, group) in blocks.chunks_mut(group_blocks).enumerate() {
            let units = group.len() / unit_blocks;
            for (u, s) in starts[..units].iter_mut().enumerate() {
                store(s, u128::from(ivs.unit(g * UNIT_GROUP + u)));
            }
            if let Some((k1, k2)) = fused {
                // Start tweaks 4 per register (the extra ones up to a multiple of 4 are
                // computed and ignored).
                k2.encrypt_ecb(&mut starts[..units.next_multiple_of(4)]);
                k1.crypt(group, unit_blocks, &starts[..units], enc);
                continue;
            }
            self.k2.encrypt_blocks(&mut starts[..units]);
            if vector {
                let per_window = WINDOW / unit_blocks;
                for (w, window) in group.chunks_mut(WINDOW).enumerate() {
                    let first = w * per_window;
                    let n = window.len() / unit_blocks;
                    simd::xor_tweaks(window, unit_blocks, &starts[first..first + n], &mut saved);
                    if enc {
                        self.k1.encrypt_blocks(window);
                    } else {
                        self.k1.decrypt_blocks(window);
                    }
                    // SAFETY: xor_tweaks just filled `saved` for this window.
                    unsafe { simd::xor_saved(window, &saved) };
                }
                continue;
            }
            // The tweak chain restarts at every unit; windows need not align with units.
            let mut tweaks = [0u128; WINDOW];
            let mut unit = 0usize;
            let mut in_unit = 0usize;
            let mut t = load(&starts[0]);
            for window in group.chunks_mut(WINDOW) {
                for (b, tw) in window.iter_mut().zip(tweaks.iter_mut()) {
                    if in_unit == unit_blocks {
                        unit += 1;
                        in_unit = 0;
                        t = load(&starts[unit]);
                    }
                    *tw = t;
                    t = mul_alpha(t);
                    in_unit += 1;
                    store(b, load(b) ^ *tw);
                }
                if enc {
                    self.k1.encrypt_blocks(window);
                } else {
                    self.k1.decrypt_blocks(window);
                }
                for (b, tw) in window.iter_mut().zip(tweaks.iter()) {
                    store(b, load(b) ^ *tw);
                }
            }
        }
    }
}

/// The XTS tweak work with AVX-512: 4 blocks per register and 4 independent tweak
/// chains (each stepping by α^16), so the work is bound by throughput rather than by the
/// latency of one chain; plus the xor before and after AES. Without AVX-512 the scalar
/// loop in `Xts::crypt` does the same one block at a time.
mod simd {
    use std::mem::MaybeUninit;

    use aes::Block;

    /// Blocks per step of the vector loop (4 registers of 4 blocks): units must be a
    /// multiple of it (256 bytes).
    pub const BLOCKS_PER_STEP: usize = 16;

    #[cfg(target_arch = "x86_64")]
    pub fn available() -> bool {
        use std::sync::OnceLock;
        static AVX512: OnceLock<bool> = OnceLock::new();
        *AVX512.get_or_init(|| {
            std::env::var_os("CAIRN_XTS_SCALAR").is_none()
                && std::arch::is_x86_feature_detected!("avx512f")
        })
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn available() -> bool {
        false
    }

    /// Xors every block of `window` with its tweak and saves the tweaks in `saved`.
    /// `starts[u]` is the first tweak of the u-th unit; units are `unit_blocks` long (a
    /// multiple of [`BLOCKS_PER_STEP`]) and fill the window exactly.
    pub fn xor_tweaks(
        window: &mut [Block],
        unit_blocks: usize,
        starts: &[Block],
        saved: &mut [MaybeUninit<u128>],
    ) {
        assert!(available() && unit_blocks.is_multiple_of(BLOCKS_PER_STEP));
        assert_eq!(window.len(), starts.len() * unit_blocks);
        assert!(saved.len() >= window.len());
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `available()` checked that the CPU has AVX-512F; the lengths were
        // checked above.
        unsafe {
            x86::xor_tweaks(window, unit_blocks, starts, saved);
        }
    }

    /// Xors every block of `window` with the tweak saved for it.
    ///
    /// # Safety
    /// `xor_tweaks` filled `saved[..window.len()]` (for this window).
    pub unsafe fn xor_saved(window: &mut [Block], saved: &[MaybeUninit<u128>]) {
        assert!(available() && window.len().is_multiple_of(4) && saved.len() >= window.len());
        #[cfg(target_arch = "x86_64")]
        // SAFETY: AVX-512F checked above; `saved` is initialised (the caller's contract)
        // and long enough.
        unsafe {
            x86::xor_saved(window, saved);
        }
    }

    #[cfg(target_arch = "x86_64")]
    pub(super) mod x86 {
        use core::arch::x86_64::*;
        use std::mem::MaybeUninit;

        use aes::Block;

        /// Multiplies each 128-bit lane (little-endian: low qword first) by α^K
        /// (`R = 64 - K`, K ≤ 57): shift by K, the K bits out of the low qword into the
        /// high one, the K bits out of the top reduced by x^128 = x^7 + x^2 + x + 1 into
        /// the low qword.
        #[inline]
        #[target_feature(enable = "avx512f")]
        pub(crate) fn mul_alpha_k<const K: u32, const R: u32>(t: __m512i) -> __m512i {
            let shl = _mm512_slli_epi64::<K>(t);
            let top = _mm512_srli_epi64::<R>(t);
            let swapped = _mm512_shuffle_epi32::<0x4E>(top);
            let reduced = _mm512_xor_si512(
                _mm512_xor_si512(swapped, _mm512_slli_epi64::<1>(swapped)),
                _mm512_xor_si512(
                    _mm512_slli_epi64::<2>(swapped),
                    _mm512_slli_epi64::<7>(swapped),
                ),
            );
            _mm512_xor_si512(shl, _mm512_mask_blend_epi64(0xAA, reduced, swapped))
        }

        /// # Safety
        /// The CPU has AVX-512F; `window.len() == starts.len() * unit_blocks`,
        /// `unit_blocks % 16 == 0`, `saved.len() >= window.len()`.
        #[target_feature(enable = "avx512f")]
        pub unsafe fn xor_tweaks(
            window: &mut [Block],
            unit_blocks: usize,
            starts: &[Block],
            saved: &mut [MaybeUninit<u128>],
        ) {
            let data = window.as_mut_ptr().cast::<__m512i>();
            let out = saved.as_mut_ptr().cast::<__m512i>();
            let mut i = 0usize;
            for s in starts {
                let t0 = super::super::load(s);
                let t1 = super::super::mul_alpha(t0);
                let t2 = super::super::mul_alpha(t1);
                let t3 = super::super::mul_alpha(t2);
                let first = [t0, t1, t2, t3];
                // SAFETY: `first` is 64 readable bytes (unaligned loads are allowed).
                let c0 = unsafe { _mm512_loadu_si512(first.as_ptr().cast()) };
                let c1 = mul_alpha_k::<4, 60>(c0);
                let c2 = mul_alpha_k::<4, 60>(c1);
                let c3 = mul_alpha_k::<4, 60>(c2);
                let mut c = [c0, c1, c2, c3];
                for _ in 0..unit_blocks / 16 {
                    for cj in &mut c {
                        // SAFETY: i < window.len() / 4 <= saved.len() / 4, so both 64-byte
                        // accesses lie inside their slices.
                        unsafe {
                            _mm512_storeu_si512(out.add(i), *cj);
                            let d = _mm512_loadu_si512(data.add(i));
                            _mm512_storeu_si512(data.add(i), _mm512_xor_si512(d, *cj));
                        }
                        *cj = mul_alpha_k::<16, 48>(*cj);
                        i += 1;
                    }
                }
            }
        }

        /// # Safety
        /// The CPU has AVX-512F; `window.len() % 4 == 0`; `saved[..window.len()]` is
        /// initialised.
        #[target_feature(enable = "avx512f")]
        pub unsafe fn xor_saved(window: &mut [Block], saved: &[MaybeUninit<u128>]) {
            let data = window.as_mut_ptr().cast::<__m512i>();
            let tw = saved.as_ptr().cast::<__m512i>();
            for i in 0..window.len() / 4 {
                // SAFETY: i < window.len() / 4 <= saved.len() / 4, initialised per the
                // contract.
                unsafe {
                    let d = _mm512_loadu_si512(data.add(i));
                    _mm512_storeu_si512(
                        data.add(i),
                        _mm512_xor_si512(d, _mm512_loadu_si512(tw.add(i))),
                    );
                }
            }
        }
    }
}

/// The fused VAES-512 XTS loop: 16 blocks (4 registers) per step, the tweak xor folded
/// into the first round (one three-way xor) and into the last round key
/// (`aesenclast(x, k ^ T) = aesenclast(x, k) ^ T`), four tweak chains stepping by α^16.
/// AES-128 and AES-256 only (AES-192 XTS uses the other paths).
mod fused {
    use aes::Block;

    /// Round keys of the data key, encryption and decryption (equivalent inverse cipher)
    /// schedules, as little-endian u128s; zeroed on drop.
    pub struct Keys {
        enc: [u128; 15],
        dec: [u128; 15],
        rounds: usize,
    }

    impl Drop for Keys {
        fn drop(&mut self) {
            zeroize::Zeroize::zeroize(&mut self.enc);
            zeroize::Zeroize::zeroize(&mut self.dec);
        }
    }

    #[cfg(target_arch = "x86_64")]
    pub fn available() -> bool {
        use std::sync::OnceLock;
        static VAES: OnceLock<bool> = OnceLock::new();
        *VAES.get_or_init(|| {
            std::env::var_os("CAIRN_XTS_SCALAR").is_none()
                && std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("vaes")
                && std::arch::is_x86_feature_detected!("aes")
        })
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub fn available() -> bool {
        false
    }

    impl Keys {
        /// The schedule for a 16- or 32-byte AES key, when the CPU runs the fused loop.
        pub fn expand(key: &[u8]) -> Option<Keys> {
            if !available() || !matches!(key.len(), 16 | 32) {
                return None;
            }
            #[cfg(target_arch = "x86_64")]
            {
                // SAFETY: `available()` checked for AES-NI; the key length was checked.
                Some(unsafe { x86::expand(key) })
            }
            #[cfg(not(target_arch = "x86_64"))]
            None
        }

        /// Encrypts `blocks` (a multiple of 4) independently: the XTS start tweaks.
        pub fn encrypt_ecb(&self, blocks: &mut [Block]) {
            assert!(blocks.len().is_multiple_of(4));
            assert!(available());
            #[cfg(target_arch = "x86_64")]
            // SAFETY: CPU features checked above and when the keys were made.
            unsafe {
                match self.rounds {
                    10 => x86::ecb::<10>(&self.enc, blocks),
                    14 => x86::ecb::<14>(&self.enc, blocks),
                    _ => unreachable!("AES-128 or AES-256"),
                }
            }
        }

        /// En/decrypts `blocks`: whole units of `unit_blocks` (a multiple of 16) blocks,
        /// unit `u` starting with tweak `starts[u]`.
        pub fn crypt(&self, blocks: &mut [Block], unit_blocks: usize, starts: &[Block], enc: bool) {
            assert!(unit_blocks.is_multiple_of(16) && blocks.len() == starts.len() * unit_blocks);
            assert!(available());
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU features were checked when the keys were made (and again
            // above); the lengths were checked above.
            unsafe {
                match (self.rounds, enc) {
                    (10, true) => x86::xts::<10, true>(&self.enc, blocks, unit_blocks, starts),
                    (10, false) => x86::xts::<10, false>(&self.dec, blocks, unit_blocks, starts),
                    (14, true) => x86::xts::<14, true>(&self.enc, blocks, unit_blocks, starts),
                    (14, false) => x86::xts::<14, false>(&self.dec, blocks, unit_blocks, starts),
                    _ => unreachable!("AES-128 or AES-256"),
                }
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    mod x86 {
        use core::arch::x86_64::*;

        use aes::Block;

        use super::Keys;

        /// Prefix xor of the four 32-bit words (w0, w0^w1, w0^w1^w2, ...), the word
        /// chaining of the AES key schedule.
        #[inline]
        #[target_feature(enable = "sse2")]
        fn chain(k: __m128i) -> __m128i {
            let mut t = _mm_slli_si128::<4>(k);
            let mut k = _mm_xor_si128(k, t);
            t = _mm_slli_si128::<4>(t);
            k = _mm_xor_si128(k, t);
            t = _mm_slli_si128::<4>(t);
            _mm_xor_si128(k, t)
        }

        macro_rules! next_even {
            ($prev:expr, $from:expr, $rcon:literal) => {
                _mm_xor_si128(
                    chain($prev),
                    _mm_shuffle_epi32::<0xff>(_mm_aeskeygenassist_si128::<$rcon>($from)),
                )
            };
        }

        macro_rules! next_odd {
            ($prev:expr, $from:expr) => {
                _mm_xor_si128(
                    chain($prev),
                    _mm_shuffle_epi32::<0xaa>(_mm_aeskeygenassist_si128::<0>($from)),
                )
            };
        }

        fn to_u128(k: __m128i) -> u128 {
            let mut b = [0u8; 16];
            // SAFETY: `b` is 16 writable bytes; unaligned stores are allowed.
            unsafe { _mm_storeu_si128(b.as_mut_ptr().cast(), k) };
            u128::from_le_bytes(b)
        }

        /// # Safety
        /// The CPU has AES-NI; `key` is 16 or 32 bytes.
        #[target_feature(enable = "aes,sse2")]
        pub unsafe fn expand(key: &[u8]) -> Keys {
            let mut rk = [_mm_setzero_si128(); 15];
            // SAFETY: key has at least 16 bytes (32 for the second load).
            let k0 = unsafe { _mm_loadu_si128(key.as_ptr().cast()) };
            let rounds = if key.len() == 16 {
                rk[0] = k0;
                rk[1] = next_even!(rk[0], rk[0], 0x01);
                rk[2] = next_even!(rk[1], rk[1], 0x02);
                rk[3] = next_even!(rk[2], rk[2], 0x04);
                rk[4] = next_even!(rk[3], rk[3], 0x08);
                rk[5] = next_even!(rk[4], rk[4], 0x10);
                rk[6] = next_even!(rk[5], rk[5], 0x20);
                rk[7] = next_even!(rk[6], rk[6], 0x40);
                rk[8] = next_even!(rk[7], rk[7], 0x80);
                rk[9] = next_even!(rk[8], rk[8], 0x1b);
                rk[10] = next_even!(rk[9], rk[9], 0x36);
                10
            } else {
                rk[0] = k0;
                // SAFETY: the key is 32 bytes.
                rk[1] = unsafe { _mm_loadu_si128(key.as_ptr().add(16).cast()) };
                rk[2] = next_even!(rk[0], rk[1], 0x01);
                rk[3] = next_odd!(rk[1], rk[2]);
                rk[4] = next_even!(rk[2], rk[3], 0x02);
                rk[5] = next_odd!(rk[3], rk[4]);
                rk[6] = next_even!(rk[4], rk[5], 0x04);
                rk[7] = next_odd!(rk[5], rk[6]);
                rk[8] = next_even!(rk[6], rk[7], 0x08);
                rk[9] = next_odd!(rk[7], rk[8]);
                rk[10] = next_even!(rk[8], rk[9], 0x10);
                rk[11] = next_odd!(rk[9], rk[10]);
                rk[12] = next_even!(rk[10], rk[11], 0x20);
                rk[13] = next_odd!(rk[11], rk[12]);
                rk[14] = next_even!(rk[12], rk[13], 0x40);
                14
            };
            let mut keys = Keys {
                enc: [0; 15],
                dec: [0; 15],
                rounds,
            };
            for r in 0..=rounds {
                keys.enc[r] = to_u128(rk[r]);
                // The equivalent inverse cipher: reversed, InvMixColumns on the inner keys.
                let d = if r == 0 || r == rounds {
                    rk[rounds - r]
                } else {
                    _mm_aesimc_si128(rk[rounds - r])
                };
                keys.dec[r] = to_u128(d);
            }
            for k in &mut rk {
                *k = _mm_setzero_si128();
            }
            keys
        }

        /// # Safety
        /// The CPU has AVX-512F and VAES; `blocks.len() % 4 == 0`; `keys` holds the
        /// `NR + 1` encryption round keys.
        #[target_feature(enable = "avx512f,vaes")]
        pub unsafe fn ecb<const NR: usize>(keys: &[u128; 15], blocks: &mut [Block]) {
            let mut rk = [_mm512_setzero_si512(); 15];
            for (r, k) in rk.iter_mut().enumerate().take(NR + 1) {
                // SAFETY: a u128 is 16 readable bytes.
                *k =
                    _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128((&raw const keys[r]).cast()) });
            }
            let data = blocks.as_mut_ptr().cast::<__m512i>();
            let regs = blocks.len() / 4;
            let mut i = 0;
            while i < regs {
                let n = (regs - i).min(4);
                let mut x = [_mm512_setzero_si512(); 4];
                for (j, xj) in x.iter_mut().enumerate().take(n) {
                    // SAFETY: i + j < regs: inside `blocks`.
                    *xj = _mm512_xor_si512(unsafe { _mm512_loadu_si512(data.add(i + j)) }, rk[0]);
                }
                for k in &rk[1..NR] {
                    for xj in &mut x {
                        *xj = _mm512_aesenc_epi128(*xj, *k);
                    }
                }
                for (j, xj) in x.iter().enumerate().take(n) {
                    // SAFETY: as above.
                    unsafe {
                        _mm512_storeu_si512(data.add(i + j), _mm512_aesenclast_epi128(*xj, rk[NR]))
                    };
                }
                i += n;
            }
        }

        // Multiplying each 128-bit lane by α^K is shared with the tweak loop in `simd`.
        use super::super::simd::x86::mul_alpha_k;

        /// # Safety
        /// The CPU has AVX-512F and VAES; `blocks.len() == starts.len() * unit_blocks`,
        /// `unit_blocks % 16 == 0`; `keys` holds `NR + 1` round keys for the direction.
        #[target_feature(enable = "avx512f,vaes")]
        pub unsafe fn xts<const NR: usize, const ENC: bool>(
            keys: &[u128; 15],
            blocks: &mut [Block],
            unit_blocks: usize,
            starts: &[Block],
        ) {
            let mut rk = [_mm512_setzero_si512(); 15];
            for (r, k) in rk.iter_mut().enumerate().take(NR + 1) {
                // SAFETY: a u128 is 16 readable bytes.
                *k =
                    _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128((&raw const keys[r]).cast()) });
            }
            let data = blocks.as_mut_ptr().cast::<__m512i>();
            let mut i = 0usize;
            for s in starts {
                let t0 = crate::xts::load(s);
                let t1 = crate::xts::mul_alpha(t0);
                let t2 = crate::xts::mul_alpha(t1);
                let t3 = crate::xts::mul_alpha(t2);
                let first = [t0, t1, t2, t3];
                // SAFETY: `first` is 64 readable bytes.
                let c0 = unsafe { _mm512_loadu_si512(first.as_ptr().cast()) };
                let c1 = mul_alpha_k::<4, 60>(c0);
                let c2 = mul_alpha_k::<4, 60>(c1);
                let c3 = mul_alpha_k::<4, 60>(c2);
                let mut c = [c0, c1, c2, c3];
                for _ in 0..unit_blocks / 16 {
                    let mut x = [_mm512_setzero_si512(); 4];
                    for j in 0..4 {
                        // SAFETY: i + j < blocks.len() / 4: the 64 bytes are inside `blocks`.
                        let d = unsafe { _mm512_loadu_si512(data.add(i + j)) };
                        x[j] = _mm512_ternarylogic_epi64::<0x96>(d, c[j], rk[0]);
                    }
                    for k in &rk[1..NR] {
                        for xj in &mut x {
                            *xj = if ENC {
                                _mm512_aesenc_epi128(*xj, *k)
                            } else {
                                _mm512_aesdec_epi128(*xj, *k)
                            };
                        }
                    }
                    for j in 0..4 {
                        let last = _mm512_xor_si512(rk[NR], c[j]);
                        let y = if ENC {
                            _mm512_aesenclast_epi128(x[j], last)
                        } else {
                            _mm512_aesdeclast_epi128(x[j], last)
                        };
                        // SAFETY: as for the load above.
                        unsafe { _mm512_storeu_si512(data.add(i + j), y) };
                        c[j] = mul_alpha_k::<16, 48>(c[j]);
                    }
                    i += 4;
                }
            }
        }
    }
}

/// AES-CBC with a per-unit IV (plain, plain64 or ESSIV). Only LUKS1 volumes and old
/// keyslot areas use it, so it favours simplicity over speed.
struct Cbc<C> {
    cipher: C,
    essiv: Option<Aes256>,
}

impl<C> Cbc<C>
where
    C: KeyInit + BlockCipherEncrypt + BlockCipherDecrypt,
    C: aes::cipher::BlockSizeUser<BlockSize = aes::cipher::consts::U16>,
{
    fn new(key: &[u8], essiv: Option<Aes256>) -> Cbc<C> {
        Cbc {
            cipher: C::new_from_slice(key).expect("key length checked by the caller"),
            essiv,
        }
    }

    fn iv(&self, n: u64) -> u128 {
        let mut b = Array(u128::from(n).to_le_bytes());
        if let Some(e) = &self.essiv {
            e.encrypt_block(&mut b);
        }
        load(&b)
    }

    fn crypt(&self, buf: &mut [u8], unit_size: usize, ivs: Ivs, enc: bool) {
        for (k, unit) in buf.chunks_exact_mut(unit_size).enumerate() {
            let (blocks, _) = Block::slice_as_chunks_mut(unit);
            let mut prev = self.iv(ivs.unit(k));
            if enc {
                for b in blocks.iter_mut() {
                    store(b, load(b) ^ prev);
                    self.cipher.encrypt_block(b);
                    prev = load(b);
                }
            } else {
                // Decryption parallelises: decrypt every block, then xor each with the
                // ciphertext before it.
                let mut cts = [0u128; WINDOW];
                for window in blocks.chunks_mut(WINDOW) {
                    for (c, b) in cts.iter_mut().zip(window.iter()) {
                        *c = load(b);
                    }
                    self.cipher.decrypt_blocks(window);
                    for (i, b) in window.iter_mut().enumerate() {
                        store(b, load(b) ^ prev);
                        prev = cts[i];
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_specs() {
        let s = CipherSpec::parse("aes-xts-plain64").unwrap();
        assert_eq!((s.mode, s.iv), (Mode::Xts, IvMode::Plain64));
        let s = CipherSpec::parse("aes-cbc-essiv:sha256").unwrap();
        assert_eq!((s.mode, s.iv), (Mode::Cbc, IvMode::EssivSha256));
        for bad in [
            "capi:xts(ecb(aes-generic))-plain64",
            "serpent-xts-plain64",
            "aes-lrw-plain64",
            "aes-xts-essiv:sha256",
            "aes",
            "",
        ] {
            let e = CipherSpec::parse(bad).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{bad}");
        }
    }

    #[test]
    fn mul_alpha_reduces() {
        assert_eq!(mul_alpha(1), 2);
        assert_eq!(mul_alpha(1u128 << 127), 0x87);
        assert_eq!(mul_alpha((1u128 << 127) | 1), 0x85);
    }

    /// Batched tweaks give the same result as unit-at-a-time processing, for any mix of
    /// unit sizes and group boundaries.
    #[test]
    fn batching_matches_unit_at_a_time() {
        let key: Vec<u8> = (0u8..64).collect();
        let c = SectorCipher::new("aes-xts-plain64", &key).unwrap();
        for unit in [512usize, 1024, 4096] {
            let n = 70 * unit + 3 * unit;
            let plain: Vec<u8> = (0..n)
                .map(|i| u8::try_from(i * 31 % 251).unwrap())
                .collect();
            let mut whole = plain.clone();
            c.encrypt(&mut whole, unit, 1000);
            let mut pieces = plain.clone();
            let step = (unit / 512) as u64;
            for (k, u) in pieces.chunks_mut(unit).enumerate() {
                c.encrypt(u, unit, 1000 + k as u64 * step);
            }
            assert_eq!(whole, pieces, "unit {unit}");
            c.decrypt(&mut whole, unit, 1000);
            assert_eq!(whole, plain);
        }
    }

    /// Against a one-block-at-a-time XTS written straight from IEEE 1619 (both the vector
    /// and the scalar path, whichever this CPU runs, must match it).
    #[test]
    fn matches_reference_xts() {
        use aes::cipher::BlockCipherEncrypt;
        fn reference(key: &[u8], buf: &mut [u8], unit: usize, iv0: u64) {
            let k1 = Aes256::new_from_slice(&key[..32]).unwrap();
            let k2 = Aes256::new_from_slice(&key[32..]).unwrap();
            for (k, u) in buf.chunks_mut(unit).enumerate() {
                let mut t = Array((u128::from(iv0) + (k * unit / 512) as u128).to_le_bytes());
                k2.encrypt_block(&mut t);
                let mut t = u128::from_le_bytes(t.0);
                for b in u.chunks_mut(16) {
                    let mut blk =
                        Array((u128::from_le_bytes(b.try_into().unwrap()) ^ t).to_le_bytes());
                    k1.encrypt_block(&mut blk);
                    b.copy_from_slice(&(u128::from_le_bytes(blk.0) ^ t).to_le_bytes());
                    t = mul_alpha(t);
                }
            }
        }
        let key: Vec<u8> = (0u8..64).map(|i| i.wrapping_mul(37)).collect();
        for path in [XtsPath::Fused, XtsPath::Vector, XtsPath::Scalar] {
            let c = SectorCipher::new("aes-xts-plain64", &key)
                .unwrap()
                .with_xts_path(path);
            eprintln!("XTS path {:?}", c.xts_path());
            for unit in [512usize, 1024, 2048, 4096] {
                for units in [1usize, 3, 64, 65, 130] {
                    let plain: Vec<u8> = (0..unit * units)
                        .map(|i| u8::try_from(i % 241).unwrap())
                        .collect();
                    let mut want = plain.clone();
                    reference(&key, &mut want, unit, 77);
                    let mut got = plain.clone();
                    c.encrypt(&mut got, unit, 77);
                    assert!(got == want, "unit {unit} x {units}");
                    c.decrypt(&mut got, unit, 77);
                    assert!(got == plain, "unit {unit} x {units} decrypt");
                }
            }
        }
    }

    /// AES-128 keys through every path, against the aes crate one block at a time.
    #[test]
    fn all_paths_agree_for_aes128() {
        let key: Vec<u8> = (0u8..32)
            .map(|i| i.wrapping_mul(91).wrapping_add(3))
            .collect();
        let plain: Vec<u8> = (0..4096 * 5)
            .map(|i| u8::try_from(i % 239).unwrap())
            .collect();
        let mut results = Vec::new();
        for path in [XtsPath::Fused, XtsPath::Vector, XtsPath::Scalar] {
            for unit in [512usize, 4096] {
                let c = SectorCipher::new("aes-xts-plain64", &key)
                    .unwrap()
                    .with_xts_path(path);
                let mut b = plain.clone();
                c.encrypt(&mut b, unit, 5);
                let mut d = b.clone();
                c.decrypt(&mut d, unit, 5);
                assert!(d == plain, "{path:?} unit {unit}");
                results.push((unit, b));
            }
        }
        for r in &results[2..] {
            let first = results.iter().find(|x| x.0 == r.0).unwrap();
            assert!(first.1 == r.1, "paths disagree for unit {}", r.0);
        }
    }

    #[test]
    fn cbc_round_trip() {
        for spec in ["aes-cbc-essiv:sha256", "aes-cbc-plain64", "aes-cbc-plain"] {
            for klen in [16usize, 32] {
                let key = vec![7u8; klen];
                let c = SectorCipher::new(spec, &key).unwrap();
                let plain: Vec<u8> = (0..8192u32).map(|i| (i % 253) as u8).collect();
                let mut b = plain.clone();
                c.encrypt(&mut b, 512, 5);
                assert_ne!(b, plain);
                c.decrypt(&mut b, 512, 5);
                assert_eq!(b, plain, "{spec} {klen}");
            }
        }
    }
}
