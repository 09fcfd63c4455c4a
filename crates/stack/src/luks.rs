//! LUKS volumes in stacks: unlocking with a passphrase from the sources the caller allows
//! (key directory by UUID, key file, a person through [`Prompt`]), and describing a
//! volume from its header alone when it stays locked (dry runs: scan, advise).
//!
//! The words and exit status of a wrong passphrase follow cryptsetup: "No key available
//! with this passphrase." exits 2. No error text or log line carries a passphrase.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_block::{BlockDevice, ErrorKind, Geometry};
use cairn_luks::{Luks, SecretBytes};

use crate::error::{Result, StackError};
use crate::export::{Layer, LuksInfo, OpenedExport};
use crate::hooks::Prompt;

fn shown(p: &Path) -> String {
    p.display().to_string()
}

/// cryptsetup's exit status for a passphrase that opens nothing.
pub const EXIT_NO_KEY: u8 = 2;

/// cryptsetup's message for it, word for word.
pub const NO_KEY_MESSAGE: &str = "No key available with this passphrase.";

/// cryptsetup's limit on a key file (`--keyfile-size` default): 8 MiB.
const MAX_KEY_FILE: u64 = 8 << 20;

/// Turns a crypt-layer error into the user's sentence; a wrong passphrase becomes
/// cryptsetup's message and exit status.
pub fn luks_error(e: &cairn_block::Error, shown: &str) -> StackError {
    match e.kind() {
        ErrorKind::AuthFailed if e.to_string().contains(cairn_luks::NO_KEY) => {
            // Damaged or unsupported keyslots that were skipped are worth naming.
            let text = e.to_string();
            let extra = text
                .split_once(&format!("{} (", cairn_luks::NO_KEY))
                .and_then(|(_, rest)| rest.rsplit_once(')'))
                .map(|(inside, _)| format!(" (skipped: {inside})"))
                .unwrap_or_default();
            StackError::with_code(format!("{NO_KEY_MESSAGE}{extra}"), EXIT_NO_KEY)
        }
        ErrorKind::AuthFailed => StackError::with_code(format!("{shown}: {e}"), EXIT_NO_KEY),
        ErrorKind::Corrupt if e.to_string().contains("no LUKS signature") => {
            StackError::new(format!(
                "{shown} is not a LUKS device (no LUKS header found); make one with `cairn \
                 luks format`"
            ))
        }
        _ => StackError::new(format!("{shown}: {e}")),
    }
}

/// Reads a key file's exact bytes (`-`: all of stdin), up to cryptsetup's 8 MiB.
pub fn read_key_file(path: &Path) -> Result<SecretBytes> {
    let shown = path.display();
    let mut buf = Vec::new();
    let read = if path == Path::new("-") {
        std::io::stdin()
            .lock()
            .take(MAX_KEY_FILE + 1)
            .read_to_end(&mut buf)
    } else {
        std::fs::File::open(path).and_then(|f| f.take(MAX_KEY_FILE + 1).read_to_end(&mut buf))
    };
    let key = SecretBytes::from_vec(buf);
    read.map_err(|e| StackError::new(format!("cannot read the key file {shown}: {e}")))?;
    if key.is_empty() {
        return Err(StackError::new(format!(
            "the key file {shown} is empty; a passphrase needs at least one byte"
        )));
    }
    if key.len() as u64 > MAX_KEY_FILE {
        return Err(StackError::new(format!(
            "the key file {shown} is larger than 8 MiB, cryptsetup's limit"
        )));
    }
    Ok(key)
}

// ---- serve --luks ------------------------------------------------------------------

/// Unlocks the LUKS volume on `below` and puts its decrypted payload over it: the new
/// top layer owns `below`. The passphrase is used once and dropped by the caller.
pub fn open_export(below: OpenedExport, pass: &[u8], shown: &str) -> Result<OpenedExport> {
    let l = Luks::load(below.device.clone()).map_err(|e| luks_error(&e, shown))?;
    if let Luks::V2(v2) = &l {
        v2.check_activatable()
            .map_err(|e| StackError::new(format!("cannot serve {shown}: {e}")))?;
    }
    let u = l.unlock(pass, None).map_err(|e| luks_error(&e, shown))?;
    let crypt = l
        .activate(&u.volume_key)
        .map_err(|e| StackError::new(format!("cannot serve {shown}: {e}")))?;
    let uuid = match &l {
        Luks::V1(v) => v.dump().uuid.clone(),
        Luks::V2(v) => v.uuid().to_string(),
    };
    let seg = crypt.segment();
    let info = LuksInfo {
        version: l.version(),
        uuid,
        keyslot: u.keyslot,
        data_offset: seg.offset,
        sector_size: seg.sector_size,
        description: crypt.description().to_string(),
    };
    Ok(OpenedExport {
        name: below.name.clone(),
        path: below.path.clone(),
        device: Arc::new(crypt),
        read_only: below.read_only,
        layer: Layer::Luks {
            info,
            locked: None,
            below: Box::new(below),
        },
    })
}

// ---- keys --------------------------------------------------------------------------

/// Where a LUKS passphrase comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// A file in the key directory named by the volume's UUID.
    KeyDir(PathBuf),
    /// `--key-file` (or a config export's `key_file`).
    KeyFile(PathBuf),
    /// Asked on the terminal.
    Terminal,
}

impl KeySource {
    pub fn text(&self) -> String {
        match self {
            KeySource::KeyDir(p) => format!("key directory: {}", shown(p)),
            KeySource::KeyFile(p) => format!("key file: {}", shown(p)),
            KeySource::Terminal => "asked on the terminal".into(),
        }
    }
}

/// The file in `dir` that holds the passphrase of the LUKS volume `uuid`: `DIR/<uuid>`,
/// else `DIR/<uuid>.key`.
pub fn key_in_dir(dir: &Path, uuid: &str) -> Option<PathBuf> {
    [uuid.to_string(), format!("{uuid}.key")]
        .into_iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file())
}

/// The passphrase sources to try for `uuid`, in order: the key directory's file, the
/// key file, then (when nothing else is given and there is one) the terminal.
pub fn key_sources(
    uuid: &str,
    key_file: Option<&Path>,
    key_dir: Option<&Path>,
    terminal: bool,
) -> Vec<KeySource> {
    let mut out = Vec::new();
    if let Some(p) = key_dir.and_then(|d| key_in_dir(d, uuid)) {
        out.push(KeySource::KeyDir(p));
    }
    if let Some(p) = key_file {
        out.push(KeySource::KeyFile(p.to_path_buf()));
    }
    if out.is_empty() && terminal {
        out.push(KeySource::Terminal);
    }
    out
}

/// Key files read once each: `--key-file -` reads stdin, which can be read only once.
#[derive(Default)]
pub struct KeyCache {
    read: Vec<(PathBuf, SecretBytes)>,
    prompt: Option<Arc<dyn Prompt>>,
}

impl std::fmt::Debug for KeyCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyCache({} files)", self.read.len())
    }
}

impl KeyCache {
    /// A cache that asks `prompt` for [`KeySource::Terminal`].
    pub fn new(prompt: Option<Arc<dyn Prompt>>) -> KeyCache {
        KeyCache {
            read: Vec::new(),
            prompt,
        }
    }

    fn get(&mut self, src: &KeySource, shown: &str) -> Result<SecretBytes> {
        let path = match src {
            KeySource::Terminal => {
                return match &self.prompt {
                    Some(p) => p.passphrase(shown),
                    None => Err(StackError::new(format!(
                        "{shown}: no one to ask for its passphrase (no terminal)"
                    ))),
                }
            }
            KeySource::KeyDir(p) | KeySource::KeyFile(p) => p,
        };
        if let Some((_, k)) = self.read.iter().find(|(p, _)| p == path) {
            return Ok(SecretBytes::from_slice(k.as_bytes()));
        }
        let k = read_key_file(path)?;
        let copy = SecretBytes::from_slice(k.as_bytes());
        self.read.push((path.clone(), k));
        Ok(copy)
    }
}

/// The LUKS volume on `e` unlocked with the first source that opens it, and that source.
/// On failure `e` is untouched: the caller closes its md array.
pub fn unlock_with(
    e: &OpenedExport,
    shown: &str,
    sources: &[KeySource],
    keys: &mut KeyCache,
) -> Result<(OpenedExport, KeySource)> {
    if sources.is_empty() {
        return Err(StackError::new(format!(
            "{shown} is LUKS-encrypted and no key is available (give --key-file, put the \
             passphrase in --key-dir as a file named by its LUKS UUID, or run on a terminal)"
        )));
    }
    let mut last = None;
    for src in sources {
        let pass = match keys.get(src, shown) {
            Ok(p) => p,
            Err(err) => {
                last = Some(err);
                continue;
            }
        };
        match open_export(e.clone(), pass.as_bytes(), shown) {
            Ok(u) => return Ok((u, src.clone())),
            Err(err) => {
                last = Some(StackError::with_code(
                    format!("{err} ({})", src.text()),
                    err.exit_code(),
                ))
            }
        }
    }
    Err(last.expect("at least one source was tried"))
}

/// The LUKS UUID on `dev` without unlocking anything.
pub fn luks_uuid(dev: Arc<dyn BlockDevice>, shown: &str) -> Result<String> {
    match Luks::load(dev).map_err(|e| luks_error(&e, shown))? {
        Luks::V1(v) => Ok(v.dump().uuid.clone()),
        Luks::V2(v) => Ok(v.uuid().to_string()),
    }
}

// ---- dry runs: LUKS described from its header -----------------------------------------

/// The LUKS volume on `e` described from its header and left locked (keyslot reported
/// as 0): a read-only stack with the payload's geometry and no decrypting device.
pub fn describe_locked(e: OpenedExport, shown: &str) -> Result<OpenedExport> {
    if e.locked() {
        return Err(StackError::new(format!(
            "{shown} lies inside a LUKS volume left locked; it cannot be described without \
             unlocking that one"
        )));
    }
    let below = e.device.geometry();
    let l = Luks::load(e.device.clone()).map_err(|err| luks_error(&err, shown))?;
    let (uuid, offset, sector, cipher, key_bits, seg_size) = match &l {
        Luks::V1(v) => {
            let h = v.dump();
            (
                h.uuid.clone(),
                u64::from(h.payload_offset) * 512,
                512,
                h.cipher_spec(),
                h.key_bytes * 8,
                None,
            )
        }
        Luks::V2(v) => {
            let d = v.dump();
            let seg = d.segments.first().ok_or_else(|| {
                StackError::new(format!("{shown}: the LUKS2 header has no data segment"))
            })?;
            (
                d.uuid.clone(),
                seg.offset,
                seg.sector_size.unwrap_or(512),
                seg.cipher.clone().unwrap_or_default(),
                d.keyslots.first().map_or(0, |k| k.key_bits),
                seg.size,
            )
        }
    };
    let size = seg_size.unwrap_or_else(|| below.size.saturating_sub(offset));
    let size = size - size % u64::from(sector.max(512));
    let info = LuksInfo {
        version: l.version(),
        uuid,
        keyslot: 0,
        data_offset: offset,
        sector_size: sector,
        description: format!(
            "LUKS{} {cipher} {key_bits}-bit, {sector}-byte sectors, data at {offset}",
            l.version()
        ),
    };
    let lbs = below.logical_block_size.max(sector);
    let geometry = Geometry {
        size,
        logical_block_size: lbs,
        physical_block_size: below.physical_block_size.max(lbs),
        optimal_io_size: below.optimal_io_size.max(lbs),
        max_io_size: below.max_io_size,
    };
    Ok(OpenedExport {
        name: e.name.clone(),
        path: e.path.clone(),
        device: e.device.clone(),
        read_only: true,
        layer: Layer::Luks {
            info,
            locked: Some(geometry),
            below: Box::new(e),
        },
    })
}
