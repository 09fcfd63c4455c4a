//! `cairn serve --config FILE`: the same settings and stacks as the command line, in TOML
//! (docs/cairn.example.toml explains every key).
//!
//! ```text
//!   FILE ─ toml + serde (deny_unknown_fields: "FILE line N: unknown field `x`")
//!        ─ check (one of file/md per export, names, listeners) ─ paths made absolute
//!          against FILE's directory
//!   apply: ServeArgs  <── settings the command line left unset (the command line wins)
//!   open_stacks: [[export]] ─ exports::open | md::open_export ─ (luks) scan::unlock_with
//! ```
//!
//! Both routes open stacks with the same functions, so a config file and the equivalent
//! command line give the same exports.

use std::path::{Path, PathBuf};

use cairn_nbd::Listen;
use serde::Deserialize;

use crate::args::{ServeArgs, DEFAULT_THREADS};
use crate::error::{CliError, Result};
use crate::exports::{self, ExportSpec, OpenedExport};
use crate::md::{self, MdSpec};
use crate::scan::{self, KeyCache, KeySource};

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
        if p.is_relative() && p.as_os_str() != "-" {
            *p = base.join(&*p);
        }
    };
    c.scan.iter_mut().for_each(abs);
    c.key_file.iter_mut().for_each(abs);
    c.key_dir.iter_mut().for_each(abs);
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
            exports::parse_spec(&format!("x:{n}"))
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

/// Fills what the command line left unset from `--config`, and returns the config's
/// `[[export]]` stacks. Lists (listen, scan) from the command line replace the file's;
/// flags (read_only, force, direct) add to it; a `--threads` equal to the default counts
/// as unset.
pub fn apply(args: ServeArgs) -> Result<(ServeArgs, Vec<ExportEntry>)> {
    let Some(path) = args.config.clone() else {
        return Ok((args, Vec::new()));
    };
    let c = load(&path)?;
    Ok(merge(args, c))
}

fn merge(mut a: ServeArgs, c: Config) -> (ServeArgs, Vec<ExportEntry>) {
    if a.server.listen.is_empty() {
        a.server.listen = c
            .listen
            .iter()
            .map(|l| l.parse().expect("checked in parse"))
            .collect();
    }
    if a.server.threads == DEFAULT_THREADS {
        if let Some(t) = c.threads {
            a.server.threads = t;
        }
    }
    if a.server.default_export.is_none() {
        a.server.default_export = c.default_export;
    }
    a.server.stripe_cache_size = a.server.stripe_cache_size.or(c.stripe_cache_size);
    a.server.stripe_cache_hold_ms = a.server.stripe_cache_hold_ms.or(c.stripe_cache_hold_ms);
    a.read_only |= c.read_only;
    a.direct |= c.direct;
    a.force |= c.force;
    if a.scan.is_empty() {
        a.scan = c.scan;
    }
    if a.key_file.is_none() {
        a.key_file = c.key_file;
    }
    if a.key_dir.is_none() {
        a.key_dir = c.key_dir;
    }
    (a, c.exports)
}

/// Opens the config's `[[export]]` stacks as `cairn serve FILE`, `--md` and `--luks`
/// would.
pub fn open_stacks(entries: &[ExportEntry], args: &ServeArgs) -> Result<Vec<OpenedExport>> {
    let mut out: Vec<OpenedExport> = Vec::new();
    let mut keys = KeyCache::default();
    let terminal = crate::tty::available();
    let mut pvs: Vec<OpenedExport> = Vec::new();
    for entry in entries {
        match open_one(entry, args, &mut keys, terminal) {
            Ok(e) if entry.lvm => pvs.push(e),
            Ok(e) => out.push(e),
            Err(err) => {
                // Not served after all: leave arrays clean, as on shutdown.
                for e in &out {
                    if let Some(a) = &e.md {
                        let _ = a.close();
                    }
                }
                return Err(err);
            }
        }
    }
    if !pvs.is_empty() {
        out.extend(crate::volumes::open_lv_exports(pvs, args.read_only)?);
    }
    Ok(out)
}

fn open_one(
    entry: &ExportEntry,
    args: &ServeArgs,
    keys: &mut KeyCache,
    terminal: bool,
) -> Result<OpenedExport> {
    let read_only = args.read_only || entry.read_only;
    let (e, shown) = match (&entry.file, &entry.md) {
        (Some(f), _) => {
            let name = match &entry.name {
                Some(n) => n.clone(),
                None => exports::parse_spec(&f.display().to_string())?.name,
            };
            let spec = ExportSpec {
                path: f.clone(),
                name,
            };
            (
                exports::open(&spec, read_only, args.direct)?,
                f.display().to_string(),
            )
        }
        (None, Some(members)) => {
            let spec = MdSpec {
                members: members.clone(),
                name: entry.name.clone(),
            };
            let shown = format!(
                "the md array on {}",
                members
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let e = md::open_export(&spec, read_only, args.force)?;
            (md::with_stripe_cache(e, args.server.stripe_cache()), shown)
        }
        (None, None) => unreachable!("checked in parse"),
    };
    if !entry.luks {
        return Ok(e);
    }
    let sources = match &entry.key_file {
        Some(k) => vec![KeySource::KeyFile(k.clone())],
        None => {
            let uuid = match scan::luks_uuid(e.device.clone(), &shown) {
                Ok(u) => u,
                Err(err) => {
                    if let Some(a) = &e.md {
                        let _ = a.close();
                    }
                    return Err(err);
                }
            };
            scan::key_sources(
                &uuid,
                args.key_file.as_deref(),
                args.key_dir.as_deref(),
                terminal,
            )
        }
    };
    scan::unlock_with(&e, &shown, &sources, keys)
        .map(|(u, _)| u)
        .inspect_err(|_| {
            if let Some(a) = &e.md {
                let _ = a.close();
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{Cli, Command};
    use clap::Parser;

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

    fn serve_args(argv: &[&str]) -> ServeArgs {
        let mut full = vec!["cairn", "serve"];
        full.extend_from_slice(argv);
        match Cli::try_parse_from(full).unwrap().command {
            Command::Serve(s) => s,
            _ => unreachable!(),
        }
    }

    #[test]
    fn scan_and_config_stand_in_for_files() {
        let a = serve_args(&["--scan", "/d", "--key-file", "k", "--key-dir", "/keys"]);
        assert!(a.exports.is_empty());
        assert_eq!(a.scan, [PathBuf::from("/d")]);
        assert!(Cli::try_parse_from(["cairn", "serve", "--config", "c.toml"]).is_ok());
        // A key file still needs something to unlock.
        assert!(Cli::try_parse_from(["cairn", "serve", "--key-file", "k", "a.img"]).is_err());
        assert!(Cli::try_parse_from(["cairn", "advise"]).is_err());
        assert!(Cli::try_parse_from(["cairn", "advise", "--md", "a,b"]).is_ok());
        assert!(Cli::try_parse_from(["cairn", "scan"]).is_err());
    }

    #[test]
    fn the_command_line_wins() {
        let c = parse(
            "listen = [\"tcp:127.0.0.1:1\"]\nthreads = 4\nscan = [\"/a\"]\nkey_file = \"/k\"\n\
             read_only = true\n",
            "c",
            Path::new("/"),
        )
        .unwrap();
        let a = serve_args(&[
            "--config",
            "c",
            "--listen",
            "tcp:127.0.0.1:2",
            "--key-file",
            "/k2",
        ]);
        let (m, _) = merge(a, c.clone());
        assert_eq!(m.server.listen, ["tcp:127.0.0.1:2".parse().unwrap()]);
        assert_eq!(m.server.threads, 4);
        assert_eq!(m.scan, [PathBuf::from("/a")]);
        assert_eq!(m.key_file, Some(PathBuf::from("/k2")));
        assert!(m.read_only);
        let a = serve_args(&["--config", "c", "--threads", "8", "--scan", "/b"]);
        let (m, _) = merge(a, c);
        assert_eq!(m.server.threads, 8);
        assert_eq!(m.scan, [PathBuf::from("/b")]);
        assert_eq!(m.server.listen, ["tcp:127.0.0.1:1".parse().unwrap()]);
    }

    #[test]
    fn stripe_cache_keys() {
        let c = parse(
            "stripe_cache_size = 4096\nstripe_cache_hold_ms = 5\n",
            "c",
            Path::new("/"),
        )
        .unwrap();
        let (m, _) = merge(serve_args(&["--config", "c"]), c.clone());
        let o = m.server.stripe_cache();
        assert_eq!((o.size, o.hold.as_millis()), (4096, 5));
        let a = serve_args(&["--config", "c", "--stripe-cache-size", "0"]);
        let (m, _) = merge(a, c);
        assert_eq!(m.server.stripe_cache().size, 0);
        assert_eq!(m.server.stripe_cache().hold.as_millis(), 5);
        let d = serve_args(&["x.img"]).server.stripe_cache();
        assert_eq!(d, cairn_md::StripeCacheOptions::default());
        assert!(parse("stripe_cache_size = 40000\n", "c", Path::new("/")).is_err());
    }
}
