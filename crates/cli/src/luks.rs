//! `cairn luks format|dump|add-key|remove-key|change-key|test|header-backup|
//! header-restore`, and the `--luks` volumes `cairn serve` exports.
//!
//! ```text
//!   DEVICE | --md M1,M2,...  ─ open_target ─> Target (device, shown name, md array)
//!   --key-file F | - | tty   ─ passphrase  ─> SecretBytes (zeroed on drop)
//!   verb ─> cairn_luks (Luks2::format, Luks::load + unlock, add/kill/change keyslot, ...)
//!        ─> cryptsetup-like lines | --json ─> Target::close (md array marked clean)
//!   serve --luks: OpenedExport ─ open_export ─> the CryptDevice in its place
//! ```
//!
//! The words, defaults and exit status follow cryptsetup, so its users' habits and
//! scripts carry over: "No key available with this passphrase." exits 2. Passphrases never
//! come from the command line, and no error text or log line carries one.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cairn_block::{BlockDevice, ErrorKind, FileDisk, OpenOptions};
use cairn_luks::{
    FormatOptions, Hash, KeyslotOptions, Luks, Luks2, PbkdfKind, PbkdfOptions, SecretBytes,
};
use serde::Serialize;
use serde_json::json;

use crate::args::{
    Global, KeyFileArgs, LuksCommand, LuksDeviceArgs, LuksFormatArgs, LuksHeaderFileArgs,
    LuksKeyArgs, LuksNewKeyArgs, LuksTarget, PbkdfArgs,
};
use crate::error::{CliError, Result};
use crate::exports::OpenedExport;
use crate::md;
use crate::size::format_size;
use crate::tty;

/// cryptsetup's exit status for a passphrase that opens nothing.
pub const EXIT_NO_KEY: u8 = 2;

/// cryptsetup's message for it, word for word.
pub const NO_KEY_MESSAGE: &str = "No key available with this passphrase.";

/// cryptsetup's limit on a key file (`--keyfile-size` default): 8 MiB.
const MAX_KEY_FILE: u64 = 8 << 20;

pub fn run(cmd: LuksCommand, global: &Global) -> Result<()> {
    match cmd {
        LuksCommand::Format(a) => format(a, global),
        LuksCommand::Dump(a) => dump(&a, global),
        LuksCommand::AddKey(a) => add_key(&a, global),
        LuksCommand::RemoveKey(a) => remove_key(&a, global),
        LuksCommand::ChangeKey(a) => change_key(&a, global),
        LuksCommand::Test(a) => test(&a, global),
        LuksCommand::HeaderBackup(a) => header_backup(&a, global),
        LuksCommand::HeaderRestore(a) => header_restore(&a, global),
    }
}

// ---- the device --------------------------------------------------------------------

/// The device a verb works on; an md array is closed (marked clean) by [`Target::close`].
struct Target {
    device: Arc<dyn BlockDevice>,
    /// How the user named it: the path, or "md array d0.img,d1.img,...".
    shown: String,
    /// How to name it again on a command line (`vol.img`, `--md d0.img,d1.img`).
    arg: String,
    md: Option<Arc<cairn_md::Array>>,
}

impl Target {
    fn close(&self) -> Result<()> {
        if let Some(a) = &self.md {
            a.close().map_err(|e| {
                CliError::new(format!(
                    "{}: closing the md array failed, so it will need --force or a resync: {e}",
                    self.shown
                ))
            })?;
        }
        Ok(())
    }
}

fn open_target(t: &LuksTarget, read_only: bool) -> Result<Target> {
    if let Some(list) = &t.md {
        let spec = md::parse_md_spec(list)?;
        let opened = md::open_export(&spec, read_only, false)?;
        let members: Vec<String> = spec
            .members
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        return Ok(Target {
            device: opened.device,
            shown: format!("the md array on {}", members.join(", ")),
            arg: format!("--md {}", members.join(",")),
            md: opened.md,
        });
    }
    let path = t.device.as_ref().expect("clap requires DEVICE or --md");
    let shown = path.display().to_string();
    let meta = std::fs::metadata(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => CliError::new(format!(
            "{shown} does not exist; for a new volume create it first, e.g. `truncate -s 1G \
             {shown}`"
        )),
        _ => CliError::new(format!("cannot open {shown}: {e}")),
    })?;
    if meta.is_dir() {
        return Err(CliError::new(format!(
            "{shown} is a directory; give a file or a block device"
        )));
    }
    let disk = FileDisk::open(
        path,
        &OpenOptions {
            read_only,
            direct: false,
            create_size: None,
        },
    )
    .map_err(|e| match e.kind() {
        ErrorKind::ReadOnly if !read_only => CliError::new(format!(
            "cannot open {shown} for writing ({e}); fix its permissions"
        )),
        ErrorKind::Busy => crate::owner::busy(&shown, &e),
        _ => CliError::new(format!("cannot open {shown}: {e}")),
    })?;
    crate::owner::note_reader(&shown, &disk);
    Ok(Target {
        device: Arc::new(disk),
        arg: shell_word(&shown),
        shown,
        md: None,
    })
}

fn shell_word(s: &str) -> String {
    if s.chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Turns a crypt-layer error into the user's sentence; a wrong passphrase becomes
/// cryptsetup's message and exit status.
pub fn luks_error(e: &cairn_block::Error, shown: &str) -> CliError {
    match e.kind() {
        ErrorKind::AuthFailed if e.to_string().contains(cairn_luks::NO_KEY) => {
            // Damaged or unsupported keyslots that were skipped are worth naming.
            let text = e.to_string();
            let extra = text
                .split_once(&format!("{} (", cairn_luks::NO_KEY))
                .and_then(|(_, rest)| rest.rsplit_once(')'))
                .map(|(inside, _)| format!(" (skipped: {inside})"))
                .unwrap_or_default();
            CliError::with_code(format!("{NO_KEY_MESSAGE}{extra}"), EXIT_NO_KEY)
        }
        ErrorKind::AuthFailed => CliError::with_code(format!("{shown}: {e}"), EXIT_NO_KEY),
        ErrorKind::Corrupt if e.to_string().contains("no LUKS signature") => {
            CliError::new(format!(
                "{shown} is not a LUKS device (no LUKS header found); make one with `cairn \
                 luks format`"
            ))
        }
        _ => CliError::new(format!("{shown}: {e}")),
    }
}

fn load(t: &Target) -> Result<Luks> {
    Luks::load(t.device.clone()).map_err(|e| luks_error(&e, &t.shown))
}

fn load_v2(t: &Target, verb: &str) -> Result<Luks2> {
    match load(t)? {
        Luks::V2(l) => Ok(l),
        Luks::V1(_) => Err(CliError::new(format!(
            "{} is a LUKS1 volume: cairn opens and serves LUKS1 but does not change its \
             header; use `cryptsetup {verb}` (or `cryptsetup convert --type luks2` first)",
            t.shown
        ))),
    }
}

// ---- passphrases -------------------------------------------------------------------

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
    read.map_err(|e| CliError::new(format!("cannot read the key file {shown}: {e}")))?;
    if key.is_empty() {
        return Err(CliError::new(format!(
            "the key file {shown} is empty; a passphrase needs at least one byte"
        )));
    }
    if key.len() as u64 > MAX_KEY_FILE {
        return Err(CliError::new(format!(
            "the key file {shown} is larger than 8 MiB, cryptsetup's limit"
        )));
    }
    Ok(key)
}

/// The passphrase of an existing keyslot: from the key file, or asked once.
fn passphrase(key: &KeyFileArgs, prompt: &str) -> Result<SecretBytes> {
    match &key.key_file {
        Some(p) => read_key_file(p),
        None => tty::passphrase(prompt),
    }
}

/// A new passphrase: from the key file, or asked twice.
fn new_passphrase(file: Option<&PathBuf>, prompt: &str) -> Result<SecretBytes> {
    match file {
        Some(p) => read_key_file(p),
        None => tty::new_passphrase(prompt),
    }
}

fn pbkdf_options(a: &PbkdfArgs) -> Result<PbkdfOptions> {
    let kind = PbkdfKind::from_name(&a.pbkdf).map_err(|e| CliError::new(e.to_string()))?;
    let hash = Hash::from_name(&a.hash)
        .map_err(|_| CliError::new(format!("--hash {}: use sha256, sha1, sha512, ...", a.hash)))?;
    if a.iter_time == 0 {
        return Err(CliError::new("--iter-time must be at least 1 ms"));
    }
    if kind == PbkdfKind::Pbkdf2 && (a.pbkdf_memory.is_some() || a.pbkdf_parallel.is_some()) {
        return Err(CliError::new(
            "--pbkdf-memory and --pbkdf-parallel are argon2 costs; pbkdf2 takes \
             --pbkdf-force-iterations or --iter-time",
        ));
    }
    Ok(PbkdfOptions {
        kind,
        hash,
        iterations: a.pbkdf_force_iterations,
        memory_kib: a.pbkdf_memory,
        parallel: a.pbkdf_parallel,
        time: Duration::from_millis(a.iter_time),
    })
}

fn keyslot_options(a: &PbkdfArgs, slot: Option<u32>) -> Result<KeyslotOptions> {
    Ok(KeyslotOptions {
        pbkdf: pbkdf_options(a)?,
        keyslot: slot,
        priority: None,
    })
}

/// Writes to stdout; a reader that went away (`| head`) is not an error.
fn out(text: &str) {
    use std::io::Write as _;
    let mut o = std::io::stdout().lock();
    let _ = o.write_all(text.as_bytes()).and_then(|()| o.flush());
}

fn print_json(v: &impl Serialize) {
    out(&format!(
        "{}\n",
        serde_json::to_string(v).expect("serialisable")
    ));
}

// ---- format ------------------------------------------------------------------------

fn format(a: LuksFormatArgs, global: &Global) -> Result<()> {
    match a.kind.as_str() {
        "luks2" | "luks" => {}
        "luks1" => {
            return Err(CliError::new(
                "--type luks1: cairn opens and serves LUKS1 volumes but formats LUKS2 only \
                 (cryptsetup and the Linux kernel open both)",
            ))
        }
        t => return Err(CliError::new(format!("--type {t}: cairn formats luks2"))),
    }
    if a.cipher != "aes-xts-plain64" {
        return Err(CliError::new(format!(
            "--cipher {}: cairn formats aes-xts-plain64 only (cryptsetup's default)",
            a.cipher
        )));
    }
    let pbkdf = pbkdf_options(&a.pbkdf)?;
    let t = open_target(&a.target, false)?;
    let result = format_on(&t, &a, pbkdf, global);
    let closed = t.close();
    result?;
    closed
}

fn format_on(t: &Target, a: &LuksFormatArgs, pbkdf: PbkdfOptions, global: &Global) -> Result<()> {
    if !a.force {
        let found = cairn_block::probe::probe(&*t.device)
            .map_err(|e| CliError::new(format!("cannot read {}: {e}", t.shown)))?;
        if !found.is_empty() {
            let what: Vec<String> = found.signatures.iter().map(ToString::to_string).collect();
            return Err(CliError::new(format!(
                "refusing to format {}: it may hold data ({}). Check with `cairn luks dump \
                 {}` or `blkid`, and add --force to overwrite it",
                t.shown,
                what.join("; "),
                t.arg
            )));
        }
    }
    if !a.batch_mode
        && !tty::confirm_yes(&format!(
            "This will overwrite data on {} irrevocably.",
            t.shown
        ))?
    {
        return Err(CliError::new("Operation aborted: nothing was written."));
    }
    let pass = new_passphrase(
        a.key.key_file.as_ref(),
        &format!("Enter passphrase for {}: ", t.shown),
    )?;
    let opts = FormatOptions {
        key_size: a.key_size,
        sector_size: a.sector_size,
        pbkdf,
        label: a.label.clone(),
        uuid: a.uuid.clone(),
        keyslot: a.key_slot,
        ..FormatOptions::default()
    };
    if opts.pbkdf.iterations.is_none() && !global.json {
        eprintln!(
            "cairn: benchmarking {} for a {} ms unlock ...",
            a.pbkdf.pbkdf, a.pbkdf.iter_time
        );
    }
    let l = Luks2::format(t.device.clone(), &opts, pass.as_bytes())
        .map_err(|e| CliError::new(format!("cannot format {}: {e}", t.shown)))?;
    drop(pass);
    let d = l.dump();
    if global.json {
        print_json(&d);
        return Ok(());
    }
    let seg = d.segments.first();
    let ks = d.keyslots.first();
    let size = t
        .device
        .geometry()
        .size
        .saturating_sub(seg.map_or(0, |s| s.offset));
    println!(
        "Formatted {} as LUKS2: {}, {}-bit key, {}-byte sectors",
        t.shown,
        seg.and_then(|s| s.cipher.clone()).unwrap_or_default(),
        ks.map_or(0, |k| k.key_bits),
        seg.and_then(|s| s.sector_size).unwrap_or(512)
    );
    println!("  UUID         {}", d.uuid);
    if !d.label.is_empty() {
        println!("  Label        {}", d.label);
    }
    if let Some(s) = seg {
        let stripe = t.device.geometry().optimal_io_size;
        let aligned = if t.md.is_some() && stripe > 0 {
            format!(
                " (aligned to 1 MiB and the array's {} full stripe)",
                format_size(u64::from(stripe))
            )
        } else {
            " (aligned to 1 MiB)".into()
        };
        println!(
            "  Data         at {}{aligned}, {} usable",
            format_size(s.offset),
            format_size(size)
        );
    }
    if let Some(k) = ks {
        println!("  Key slot {}   {}", k.id, kdf_text(k));
    }
    let serve = if t.md.is_some() {
        format!("cairn serve {} --luks", t.arg)
    } else {
        format!("cairn serve --luks {}", t.arg)
    };
    println!(
        "\nNext:\n  cairn luks dump {}\n  {serve} --key-file KEYFILE   (without --key-file it asks)",
        t.arg
    );
    Ok(())
}

fn kdf_text(k: &cairn_luks::volume::DumpKeyslot) -> String {
    match k.pbkdf.as_deref() {
        Some("pbkdf2") => format!(
            "pbkdf2-{}, {} iterations",
            k.hash.as_deref().unwrap_or("?"),
            k.iterations.unwrap_or(0)
        ),
        Some(p) => format!(
            "{p}, {} passes, {} memory, {} threads",
            k.time_cost.unwrap_or(0),
            format_size(u64::from(k.memory_kib.unwrap_or(0)) * 1024),
            k.threads.unwrap_or(0)
        ),
        None => k.kind.clone(),
    }
}

// ---- dump and test -----------------------------------------------------------------

fn dump(a: &LuksDeviceArgs, global: &Global) -> Result<()> {
    let t = open_target(&a.target, true)?;
    let l = load(&t);
    let closed = t.close();
    let l = l?;
    if global.json {
        print_json(&l.dump_json());
    } else {
        out(&l.dump_text());
    }
    closed
}

fn test(a: &LuksKeyArgs, global: &Global) -> Result<()> {
    let t = open_target(&a.target, true)?;
    let result = (|| {
        let l = load(&t)?;
        let pass = passphrase(&a.key, &format!("Enter passphrase for {}: ", t.shown))?;
        let slot = l
            .test_passphrase(pass.as_bytes(), a.key_slot)
            .map_err(|e| luks_error(&e, &t.shown))?;
        Ok((l.version(), slot))
    })();
    let closed = t.close();
    let (version, slot) = result?;
    if global.json {
        print_json(&json!({"version": version, "keyslot": slot}));
    } else {
        println!("Key slot {slot} unlocked.");
    }
    closed
}

// ---- keyslots ----------------------------------------------------------------------

fn add_key(a: &LuksNewKeyArgs, global: &Global) -> Result<()> {
    same_stdin(&a.key, a.new_key_file.as_ref())?;
    let opts = keyslot_options(&a.pbkdf, a.key_slot)?;
    let t = open_target(&a.target, false)?;
    let result = (|| {
        let mut l = load_v2(&t, "luksAddKey")?;
        let old = passphrase(&a.key, "Enter any existing passphrase: ")?;
        let u = l
            .unlock(old.as_bytes(), None)
            .map_err(|e| luks_error(&e, &t.shown))?;
        drop(old);
        let new = new_passphrase(
            a.new_key_file.as_ref(),
            "Enter new passphrase for key slot: ",
        )?;
        l.add_key_with_volume_key(&u.volume_key, new.as_bytes(), &opts)
            .map_err(|e| CliError::new(format!("cannot add a key to {}: {e}", t.shown)))
    })();
    let closed = t.close();
    let slot = result?;
    if global.json {
        print_json(&json!({"keyslot": slot, "action": "added"}));
    } else {
        println!("Key slot {slot} created.");
    }
    closed
}

fn change_key(a: &LuksNewKeyArgs, global: &Global) -> Result<()> {
    same_stdin(&a.key, a.new_key_file.as_ref())?;
    let opts = keyslot_options(&a.pbkdf, a.key_slot)?;
    let t = open_target(&a.target, false)?;
    let result = (|| {
        let mut l = load_v2(&t, "luksChangeKey")?;
        let old = passphrase(&a.key, "Enter passphrase to be changed: ")?;
        // Asking for the new passphrase only makes sense once the old one is known to
        // work; with a key file there is nobody to ask, so skip the extra KDF run.
        if a.new_key_file.is_none() {
            l.test_passphrase(old.as_bytes(), None)
                .map_err(|e| luks_error(&e, &t.shown))?;
        }
        let new = new_passphrase(a.new_key_file.as_ref(), "Enter new passphrase: ")?;
        l.change_key(old.as_bytes(), new.as_bytes(), &opts)
            .map_err(|e| match e.kind() {
                ErrorKind::AuthFailed => luks_error(&e, &t.shown),
                _ => CliError::new(format!("cannot change the key of {}: {e}", t.shown)),
            })
    })();
    let closed = t.close();
    let slot = result?;
    if global.json {
        print_json(&json!({"keyslot": slot, "action": "changed"}));
    } else {
        println!("Key slot {slot} changed.");
    }
    closed
}

fn remove_key(a: &LuksKeyArgs, global: &Global) -> Result<()> {
    let t = open_target(&a.target, false)?;
    let result = (|| {
        let mut l = load_v2(&t, "luksRemoveKey")?;
        let pass = passphrase(&a.key, "Enter passphrase to be deleted: ")?;
        let u = l
            .unlock(pass.as_bytes(), a.key_slot)
            .map_err(|e| luks_error(&e, &t.shown))?;
        drop(pass);
        if l.keyslots().len() == 1 {
            let warning = format!(
                "Key slot {} is the last one on {}: after removing it no passphrase opens \
                 the volume and its data is lost for good.",
                u.keyslot, t.shown
            );
            let ok = if a.batch_mode {
                a.force
            } else {
                tty::confirm_yes(&warning)?
            };
            if !ok {
                return Err(CliError::new(if a.batch_mode {
                    format!("{warning} Refusing with -q alone; add --force as well")
                } else {
                    "Operation aborted: nothing was removed.".into()
                }));
            }
        }
        l.kill_slot(u.keyslot)
            .map_err(|e| CliError::new(format!("cannot remove the key from {}: {e}", t.shown)))?;
        Ok(u.keyslot)
    })();
    let closed = t.close();
    let slot = result?;
    if global.json {
        print_json(&json!({"keyslot": slot, "action": "removed"}));
    } else {
        println!("Key slot {slot} removed.");
    }
    closed
}

/// Both passphrases cannot come from one stdin.
fn same_stdin(key: &KeyFileArgs, new: Option<&PathBuf>) -> Result<()> {
    let dash = Path::new("-");
    if key.key_file.as_deref() == Some(dash) && new.map(PathBuf::as_path) == Some(dash) {
        return Err(CliError::new(
            "--key-file - and --new-key-file - both read stdin; give one of them as a file",
        ));
    }
    Ok(())
}

// ---- header backup and restore -----------------------------------------------------

fn header_backup(a: &LuksHeaderFileArgs, global: &Global) -> Result<()> {
    let f = &a.header_backup_file;
    if f.exists() {
        return Err(CliError::new(format!(
            "{} exists; a header backup is never written over another file",
            f.display()
        )));
    }
    let t = open_target(&a.target, true)?;
    let result = (|| {
        let l = load_v2(&t, "luksHeaderBackup")?;
        l.header_backup(f)
            .map_err(|e| CliError::new(format!("cannot back up the header of {}: {e}", t.shown)))
    })();
    let closed = t.close();
    result?;
    if global.json {
        print_json(&json!({"header_backup_file": f}));
    } else {
        println!(
            "Header of {} saved to {} (mode 0600). It opens the volume with any passphrase it \
             holds, even one removed later: keep it safe.",
            t.shown,
            f.display()
        );
    }
    closed
}

fn header_restore(a: &LuksHeaderFileArgs, global: &Global) -> Result<()> {
    let f = &a.header_backup_file;
    let t = open_target(&a.target, false)?;
    let result = (|| {
        let has_luks = cairn_luks::probe(&*t.device)
            .map_err(|e| CliError::new(format!("cannot read {}: {e}", t.shown)))?
            .is_some();
        if has_luks
            && !a.batch_mode
            && !tty::confirm_yes(&format!(
                "Device {} already contains a LUKS header. Replacing it will destroy its \
                 keyslots.",
                t.shown
            ))?
        {
            return Err(CliError::new("Operation aborted: nothing was written."));
        }
        Luks2::header_restore(t.device.clone(), f, true).map_err(|e| {
            CliError::new(format!(
                "cannot restore {} onto {}: {e}",
                f.display(),
                t.shown
            ))
        })
    })();
    let closed = t.close();
    let l = result?;
    if global.json {
        print_json(&json!({"restored": f, "uuid": l.uuid()}));
    } else {
        println!(
            "Header restored onto {} from {} (UUID {}).",
            t.shown,
            f.display(),
            l.uuid()
        );
    }
    closed
}

// ---- serve --luks ------------------------------------------------------------------

/// What the announcement says about a LUKS export.
#[derive(Debug, Clone, Serialize)]
pub struct LuksInfo {
    pub version: u16,
    pub uuid: String,
    /// The keyslot the passphrase opened.
    pub keyslot: u32,
    /// Byte offset of the encrypted payload on the device below.
    pub data_offset: u64,
    pub sector_size: u32,
    /// "LUKS2 aes-xts-plain64 512-bit, 4096-byte sectors, data at 16777216".
    pub description: String,
}

/// Unlocks the LUKS volume on `opened` and puts its decrypted payload in its place.
/// The passphrase is used once and dropped by the caller.
pub fn open_export(mut opened: OpenedExport, pass: &[u8], shown: &str) -> Result<OpenedExport> {
    let l = Luks::load(opened.device.clone()).map_err(|e| luks_error(&e, shown))?;
    if let Luks::V2(v2) = &l {
        v2.check_activatable()
            .map_err(|e| CliError::new(format!("cannot serve {shown}: {e}")))?;
    }
    let u = l.unlock(pass, None).map_err(|e| luks_error(&e, shown))?;
    let crypt = l
        .activate(&u.volume_key)
        .map_err(|e| CliError::new(format!("cannot serve {shown}: {e}")))?;
    let uuid = match &l {
        Luks::V1(v) => v.dump().uuid.clone(),
        Luks::V2(v) => v.uuid().to_string(),
    };
    let seg = crypt.segment();
    opened.luks = Some(LuksInfo {
        version: l.version(),
        uuid,
        keyslot: u.keyslot,
        data_offset: seg.offset,
        sector_size: seg.sector_size,
        description: crypt.description().to_string(),
    });
    opened.device = Arc::new(crypt);
    Ok(opened)
}

/// The passphrase for `shown` when serving: the key file, or asked on the terminal.
pub fn serve_passphrase(key_file: Option<&Path>, shown: &str) -> Result<SecretBytes> {
    match key_file {
        Some(p) => read_key_file(p),
        None => tty::passphrase(&format!("Enter passphrase for {shown}: ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_passphrase_is_cryptsetups_sentence_and_status() {
        let e = cairn_block::Error::new(ErrorKind::AuthFailed, cairn_luks::NO_KEY);
        let c = luks_error(&e, "vol.img");
        assert_eq!(c.to_string(), NO_KEY_MESSAGE);
        assert_eq!(c.exit_code(), 2);
        let e = cairn_block::Error::new(
            ErrorKind::AuthFailed,
            format!("{} (keyslot 1: bad)", cairn_luks::NO_KEY),
        );
        let c = luks_error(&e, "vol.img").to_string();
        assert!(
            c.starts_with(NO_KEY_MESSAGE) && c.contains("keyslot 1: bad"),
            "{c}"
        );
    }

    #[test]
    fn key_files_are_exact_bytes() {
        let dir = std::env::temp_dir().join(format!("cairn-keyfile-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("key");
        std::fs::write(&p, b"pass\n").unwrap();
        assert_eq!(read_key_file(&p).unwrap().as_bytes(), b"pass\n");
        std::fs::write(&p, b"").unwrap();
        assert!(read_key_file(&p).unwrap_err().to_string().contains("empty"));
        let err = read_key_file(&dir.join("nope")).unwrap_err().to_string();
        assert!(err.contains("cannot read the key file"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pbkdf_words() {
        let mut a = PbkdfArgs {
            pbkdf: "pbkdf2".into(),
            hash: "sha256".into(),
            pbkdf_force_iterations: Some(1000),
            pbkdf_memory: None,
            pbkdf_parallel: None,
            iter_time: 2000,
        };
        let o = pbkdf_options(&a).unwrap();
        assert_eq!((o.kind, o.iterations), (PbkdfKind::Pbkdf2, Some(1000)));
        a.pbkdf_memory = Some(1024);
        assert!(pbkdf_options(&a).is_err());
        a.pbkdf = "argon2id".into();
        assert_eq!(pbkdf_options(&a).unwrap().memory_kib, Some(1024));
    }
}
