//! `cairn serve --config FILE`: the same settings and stacks as the command line, in TOML
//! (docs/cairn.example.toml explains every key).
//!
//! ```text
//!   FILE ─ toml + serde (deny_unknown_fields: "FILE line N: unknown field `x`")
//!        ─ check (one of file/md per export, names, listeners) ─ paths made absolute
//!          against FILE's directory
//!   apply: ServeArgs  <── settings the command line left unset (the command line wins)
//!   open_stacks: [[export]] ─ entry_spec ─ cairn_stack::open (the same as the command line)
//! ```
//!
//! Both routes open stacks with the same functions, so a config file and the equivalent
//! command line give the same exports.

use std::path::{Path, PathBuf};

use cairn_nbd::Listen;
use serde::Deserialize;

use crate::error::{CliError, Result};
use cairn_stack::Spec;

/// `--tls off|on|require`, and the file's `tls`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    Off,
    On,
    Require,
}

/// The whole file.
#[derive(Debug, Default, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// `unix:PATH` or `tcp:ADDR:PORT`, as `--listen` takes them.
    #[serde(default)]
    pub listen: Vec<String>,
    pub threads: Option<u16>,
    #[serde(default)]
    pub read_only: bool,
    #[serde(default)]
    pub direct: bool,
    #[serde(default)]
    pub force: bool,
    pub default_export: Option<String>,
    /// As `--stripe-cache-size` and `--stripe-cache-hold-ms`.
    pub stripe_cache_size: Option<u32>,
    pub stripe_cache_hold_ms: Option<u64>,
    /// As `--scan`.
    #[serde(default)]
    pub scan: Vec<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub key_dir: Option<PathBuf>,
    /// As `--tls`, `--tls-certificates`, `--tls-verify-peer`, `--tls-psk`,
    /// `--insecure-no-tls` and `--tls-anonymous-clients`.
    pub tls: Option<TlsMode>,
    pub tls_certificates: Option<PathBuf>,
    #[serde(default)]
    pub tls_verify_peer: bool,
    pub tls_psk: Option<PathBuf>,
    #[serde(default)]
    pub insecure_no_tls: bool,
    #[serde(default)]
    pub tls_anonymous_clients: bool,
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportEntry>,
}

/// One `[[export]]`: a stack named explicitly.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportEntry {
    /// [default: the file's name, or the md array's name]
    pub name: Option<String>,
    /// A file or block device (as `cairn serve FILE`, or `--luks FILE` with `luks`).
    pub file: Option<PathBuf>,
    /// md array members (as `--md`).
    pub md: Option<Vec<PathBuf>>,
    /// The file or array holds LUKS: serve it decrypted.
    #[serde(default)]
    pub luks: bool,
    /// This volume's passphrase file [default: key_dir by UUID, then the top-level
    /// key_file, then the terminal].
    pub key_file: Option<PathBuf>,
    /// Serve this one read-only even when the rest is writable.
    #[serde(default)]
    pub read_only: bool,
    /// The stack (after LUKS, if any) is an LVM2 PV: it is not exported itself; each LV
    /// of its volume group is, as VG/LV (as `--lvm`). Every PV of a VG needs an entry.
    #[serde(default)]
    pub lvm: bool,
}

/// "line N" for a byte offset into `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

/// Parses and checks `text`; relative paths are taken from `base`. `shown` names the
/// file in errors.
pub fn parse(text: &str, shown: &str, base: &Path) -> Result<Config> {
    let mut c: Config = toml::from_str(text).map_err(|e| {
        let at = e
            .span()
            .map(|s| format!(" line {}", line_of(text, s.start)))
            .unwrap_or_default();
        CliError::new(format!("{shown}{at}: {}", e.message().trim_end()))
    })?;
    for l in &c.listen {
        l.parse::<Listen>()
            .map_err(|e| CliError::new(format!("{shown}: listen {l:?}: {e}")))?;
    }
    if let Some(t) = c.threads {
        if !(1..=256).contains(&t) {
            return Err(CliError::new(format!(
                "{shown}: threads = {t}: give 1 to 256"
            )));
        }
    }
    if c.stripe_cache_size.is_some_and(|n| n > 32768) {
        return Err(CliError::new(format!(
            "{shown}: stripe_cache_size: give 0 (off) to 32768"
        )));
    }
    if c.stripe_cache_hold_ms.is_some_and(|n| n > 1000) {
        return Err(CliError::new(format!(
            "{shown}: stripe_cache_hold_ms: give 0 to 1000"
        )));
    }
    let abs = |p: &mut PathBuf| {
        if p.is_relative() && p.as_os_str() != "-" && !cairn_stack::leaf::is_remote(p) {
            *p = base.join(&*p);
        }
    };
    c.scan.iter_mut().for_each(abs);
    c.key_file.iter_mut().for_each(abs);
    c.key_dir.iter_mut().for_each(abs);
    c.tls_certificates.iter_mut().for_each(abs);
    c.tls_psk.iter_mut().for_each(abs);
    if c.tls_certificates.is_some() && c.tls_psk.is_some() {
        return Err(CliError::new(format!(
            "{shown}: tls_certificates and tls_psk: give one"
        )));
    }
    for (i, e) in c.exports.iter_mut().enumerate() {
        let which = match &e.name {
            Some(n) => format!("{shown}: [[export]] {n:?}"),
            None => format!("{shown}: [[export]] number {}", i + 1),
        };
        match (&e.file, &e.md) {
            (Some(_), None) => {}
            (None, Some(m)) if !m.is_empty() => {}
            (None, Some(_)) => {
                return Err(CliError::new(format!("{which}: md = [] lists no members")))
            }
            _ => {
                return Err(CliError::new(format!(
                    "{which}: give exactly one of file = \"PATH\" or md = [\"MEMBER\", ...]"
                )))
            }
        }
        if e.lvm && e.name.is_some() {
            return Err(CliError::new(format!(
                "{which}: name does not apply with lvm = true: each LV is exported as VG/LV"
            )));
        }
        if let Some(n) = &e.name {
            cairn_stack::export::parse_spec(&format!("x:{n}"))
                .map_err(|err| CliError::new(format!("{which}: {err}")))?;
        }
        e.file.iter_mut().for_each(abs);
        e.md.iter_mut().flatten().for_each(abs);
        e.key_file.iter_mut().for_each(abs);
    }
    Ok(c)
}

/// Reads and checks the file at `path`.
pub fn load(path: &Path) -> Result<Config> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::new(format!("cannot read the config file {shown}: {e}")))?;
    let base = std::path::absolute(path)
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
        .unwrap_or_default();
    parse(&text, &shown, &base)
}

/// The stack an `[[export]]` entry names.
pub fn entry_spec(entry: &ExportEntry) -> Spec {
    let base = match (&entry.file, &entry.md) {
        (Some(f), _) => Spec::File(f.clone()),
        (None, Some(members)) => Spec::Md(members.clone()),
        (None, None) => unreachable!("checked in parse"),
    };
    if entry.luks {
        Spec::Luks {
            on: Box::new(base),
            key_file: entry.key_file.clone(),
        }
    } else {
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../../docs/cairn.example.toml");

    #[test]
    fn the_shipped_example_parses() {
        let c = parse(EXAMPLE, "cairn.example.toml", Path::new("/etc/cairn")).unwrap();
        assert_eq!(c.listen.len(), 2);
        assert!(!c.exports.is_empty());
        assert!(c.exports.iter().any(|e| e.md.is_some() && e.luks));
        assert!(c.exports.iter().any(|e| e.file.is_some()));
        // Relative paths are taken from the file's directory.
        for e in &c.exports {
            for p in e.file.iter().chain(e.md.iter().flatten()) {
                assert!(p.is_absolute(), "{p:?}");
            }
        }
    }

    #[test]
    fn unknown_keys_are_named_with_their_line() {
        let text = "threads = 2\n\n[[export]]\nname = \"a\"\nfile = \"a.img\"\nlukz = true\n";
        let err = parse(text, "c.toml", Path::new("/"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("c.toml line 6:"), "{err}");
        assert!(err.contains("lukz"), "{err}");
        let err = parse("listn = []\n", "c.toml", Path::new("/"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 1") && err.contains("listn"), "{err}");
    }

    #[test]
    fn tls_keys() {
        let c = parse(
            "tls = \"on\"\ntls_psk = \"keys.psk\"\ninsecure_no_tls = true\n",
            "c",
            Path::new("/etc/cairn"),
        )
        .unwrap();
        assert_eq!(c.tls, Some(TlsMode::On));
        assert_eq!(c.tls_psk, Some(PathBuf::from("/etc/cairn/keys.psk")));
        assert!(c.insecure_no_tls && !c.tls_verify_peer);
        assert!(parse("tls = \"maybe\"\n", "c", Path::new("/")).is_err());
        assert!(parse(
            "tls_psk = \"k\"\ntls_certificates = \"d\"\n",
            "c",
            Path::new("/")
        )
        .is_err());
    }

    #[test]
    fn bad_entries_are_refused() {
        let both = "[[export]]\nfile = \"a\"\nmd = [\"b\"]\n";
        assert!(parse(both, "c", Path::new("/"))
            .unwrap_err()
            .to_string()
            .contains("exactly one of"));
        assert!(parse("[[export]]\nname = \"x\"\n", "c", Path::new("/")).is_err());
        assert!(parse("listen = [\"10809\"]\n", "c", Path::new("/")).is_err());
        assert!(parse("threads = 0\n", "c", Path::new("/")).is_err());
        let bad_name = "[[export]]\nname = \"a b\"\nfile = \"a\"\n";
        assert!(parse(bad_name, "c", Path::new("/")).is_err());
    }
}
