//! `cairn luks format|dump|add-key|remove-key|change-key|test|header-backup|
//! header-restore`, and the `--luks` volumes `cairn serve` exports.
//!
//! ```text
//!   DEVICE | --md M1,M2,...  ─ open_target ─> Target (device, shown name, md array)
//!   --key-file F | - | tty   ─ passphrase  ─> SecretBytes (zeroed on drop)
//!   verb ─> cairn_luks (Luks2::format, Luks::load + unlock, add/kill/change keyslot, ...)
//!        ─> cryptsetup-like lines | --json ─> Target::close (md array marked clean)
//!   (serving: cairn_stack::luks unlocks a Spec::Luks)
//! ```
//!
//! The words, defaults and exit status follow cryptsetup, so its users' habits and
//! scripts carry over: "No key available with this passphrase." exits 2. Passphrases never
//! come from the command line, and no error text or log line carries one.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cairn_block::{BlockDevice, ErrorKind, FileDisk, OpenOptions};
use cairn_luks::{
    FormatOptions, Hash, KeyslotOptions, Luks, Luks2, PbkdfKind, PbkdfOptions, SecretBytes,
};
use serde::Serialize;
use serde_json::json;

use crate::global::Global;
pub use cairn_stack::luks::{luks_error, read_key_file, EXIT_NO_KEY, NO_KEY_MESSAGE};
use cairn_stack::size::format_size;
use cairn_stack::{Keys, Options, Spec};

use crate::error::{CliError, Result};
use crate::shell::shell_word;
use crate::tty;
use clap::builder::TypedValueParser as _;
use clap::Args;
use clap::Subcommand;

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
        let md = cairn_stack::md::parse_md_spec(list)?;
        let members: Vec<String> = md.members.iter().map(|p| p.display().to_string()).collect();
        let spec = Spec::Md(md.members);
        let opts = Options {
            read_only,
            ..Options::default()
        };
        let opened = cairn_stack::open_one(&spec, None, &opts, &mut Keys::none())?;
        return Ok(Target {
            device: opened.device.clone(),
            shown: spec.shown(),
            arg: format!("--md {}", members.join(",")),
            md: opened.md().cloned(),
        });
    }
    let path = t.device.as_ref().expect("clap requires DEVICE or --md");
    let shown = path.display().to_string();
    if cairn_stack::leaf::is_remote(path) {
        let device = cairn_stack::leaf::open(
            path,
            read_only,
            false,
            cairn_stack::leaf::DEFAULT_REMOTE_TIMEOUT,
        )?;
        return Ok(Target {
            device,
            arg: shell_word(&shown),
            shown,
            md: None,
        });
    }
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
        ErrorKind::Busy => cairn_stack::owner::busy(&shown, &e),
        _ => CliError::new(format!("cannot open {shown}: {e}")),
    })?;
    cairn_stack::owner::note_reader(&shown, &disk);
    Ok(Target {
        device: Arc::new(disk),
        arg: shell_word(&shown),
        shown,
        md: None,
    })
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

// ---- the command line (clap) ----------------------------------------------------
//

pub(crate) const LUKS_LONG: &str = "\
LUKS encryption in the on-disk format of cryptsetup: a volume cairn formats is one \
`cryptsetup open` unlocks, and a volume cryptsetup made (LUKS2, or LUKS1 as qemu-img and \
cryptsetup --type luks1 make) is one cairn serves. The verbs and options are \
cryptsetup's: format is luksFormat, dump is luksDump, add-key is luksAddKey, and so on.

DEVICE is a file or block device, or an md array given as --md MEMBER,MEMBER,... (its \
members, as for `cairn serve --md`): LUKS then sits on the array as dm-crypt sits on \
/dev/mdN, and format aligns the encrypted payload to the array's full stripe.

Passphrases are asked for on the terminal without echo, or read from --key-file FILE \
(its exact bytes: a trailing newline is part of the passphrase, so write key files with \
printf, not echo; `-` reads stdin). They are never taken from the command line, where \
other users could read them in the process list.

A passphrase that opens no keyslot ends with \"No key available with this passphrase.\" \
and exit status 2, as in cryptsetup. Serve a volume with `cairn serve --luks DEVICE`.

Opening times each PBKDF2 derivation a header asks for (a keyslot's, the volume key \
digest's) against this machine's speed before it starts: one of more than 3 s is \
announced (\"keyslot 0: deriving the key with 4000000000 PBKDF2-sha256 iterations, about \
2000 s at this machine's speed\"), and one of more than 60 s is refused as a crafted \
header would be; --max-kdf-time SECONDS (or CAIRN_MAX_KDF_TIME; 0: no limit) moves the \
limit, for every command, `serve` included.";

pub(crate) const LUKS_EXAMPLES: &str = "\
Examples:
  truncate -s 1G vol.img && cairn luks format vol.img          # asks for a passphrase twice
  printf %s 'correct horse' > key && chmod 600 key
  cairn luks format -q --key-file key vol.img                  # no questions (scripts)
  cairn luks format --md d0.img,d1.img,d2.img,d3.img           # LUKS2 over an md array
  cairn luks dump vol.img
  cairn luks add-key --key-file key --new-key-file key2 vol.img
  cairn luks test --key-file key2 vol.img                      # \"Key slot 1 unlocked.\"
  cairn serve --luks vol.img --key-file key                    # export \"vol\", decrypted";

/// `cairn luks ...`.
#[derive(Debug, Subcommand)]
pub enum LuksCommand {
    /// Write a new LUKS2 header, making the device an empty encrypted volume (luksFormat)
    #[command(long_about = LUKS_FORMAT_LONG, after_help = LUKS_FORMAT_EXAMPLES)]
    Format(LuksFormatArgs),

    /// Print the LUKS header: segments, keyslots, digests, no key material (luksDump)
    #[command(long_about = LUKS_DUMP_LONG)]
    Dump(LuksDeviceArgs),

    /// Add a passphrase in a new keyslot, given an existing one (luksAddKey)
    #[command(long_about = LUKS_ADD_KEY_LONG)]
    AddKey(LuksNewKeyArgs),

    /// Remove the keyslot a passphrase opens (luksRemoveKey)
    #[command(long_about = LUKS_REMOVE_KEY_LONG)]
    RemoveKey(LuksKeyArgs),

    /// Replace a passphrase with a new one, in place (luksChangeKey)
    #[command(long_about = LUKS_CHANGE_KEY_LONG)]
    ChangeKey(LuksNewKeyArgs),

    /// Check a passphrase and print which keyslot it opens (open --test-passphrase)
    #[command(long_about = LUKS_TEST_LONG)]
    Test(LuksKeyArgs),

    /// Save the LUKS2 header and keyslots to a file (luksHeaderBackup)
    #[command(long_about = LUKS_HEADER_BACKUP_LONG)]
    HeaderBackup(LuksHeaderFileArgs),

    /// Write a saved LUKS2 header back onto the device (luksHeaderRestore)
    #[command(long_about = LUKS_HEADER_RESTORE_LONG)]
    HeaderRestore(LuksHeaderFileArgs),
}

pub(crate) const LUKS_FORMAT_LONG: &str = "\
Write a new LUKS2 header to DEVICE with one keyslot for a new passphrase, as `cryptsetup \
luksFormat` does. The volume key is random; data is encrypted with aes-xts-plain64. The \
encrypted payload starts at 16 MiB (aligned to 1 MiB and to an md array's full stripe, so \
a filesystem on top stays stripe-aligned); everything before it is overwritten, the \
payload itself is not touched (it reads as random data once opened).

cairn refuses a DEVICE that already carries an md superblock, a filesystem, a partition \
table, swap, or a LUKS or LVM signature, naming what it found; --force overwrites it. Either way it then asks you to \
type YES, unless -q (--batch-mode) is given, as cryptsetup does.

The default key derivation is argon2id, benchmarked on this machine to take about 2 s \
(--iter-time) with up to 1 GiB of memory: slow on purpose, so guessing passphrases is \
slow. Lower costs (--pbkdf pbkdf2 --pbkdf-force-iterations 1000) are for tests only.";

pub(crate) const LUKS_FORMAT_EXAMPLES: &str = "\
Examples:
  cairn luks format vol.img
  cairn luks format --key-size 256 --sector-size 512 --label backup /dev/sdb
  cairn luks format --md d0.img,d1.img,d2.img,d3.img --key-file key -q
  cairn luks format -q --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file key test.img
                                          # cheap KDF: tests only";

pub(crate) const LUKS_DUMP_LONG: &str = "\
Print DEVICE's LUKS header as `cryptsetup luksDump` does: version, UUID, label, the data \
segment (offset, cipher, sector size), each keyslot's KDF and costs, the digests, and \
which header copy was used (a damaged copy is reported, not repaired). Nothing is \
written and no passphrase is needed. --json prints the same as one JSON object.";

pub(crate) const LUKS_ADD_KEY_LONG: &str = "\
Add a new passphrase to DEVICE in a free keyslot (the lowest, or --key-slot N). An \
existing passphrase is needed to unlock the volume key: from the terminal or --key-file. \
The new one comes from the terminal (asked twice) or --new-key-file. KDF options apply \
to the new keyslot. Both header copies are rewritten.";

pub(crate) const LUKS_REMOVE_KEY_LONG: &str = "\
Remove the keyslot that the given passphrase opens: its key material is overwritten, \
then it leaves both header copies. Removing the last keyslot makes the data unreadable \
for good, so cairn then asks you to type YES (even with -q it is refused unless you also \
give --force).";

pub(crate) const LUKS_CHANGE_KEY_LONG: &str = "\
Replace the passphrase of the keyslot the old passphrase opens. The new key material is \
written to free space first and the header switches to it in one step, so a crash leaves \
either the old or the new passphrase working. The keyslot keeps its number.";

pub(crate) const LUKS_TEST_LONG: &str = "\
Check a passphrase against DEVICE without serving anything, like `cryptsetup open \
--test-passphrase`: prints \"Key slot N unlocked.\" and exits 0, or \"No key available \
with this passphrase.\" and exits 2. --key-slot N tries only that keyslot.";

pub(crate) const LUKS_HEADER_BACKUP_LONG: &str = "\
Write DEVICE's LUKS2 header (both copies) and keyslots area to a new file that \
`cryptsetup luksHeaderRestore` also accepts. The file holds the keyslots, so anyone with \
it and an old passphrase can open the volume even after that passphrase is removed: \
keep it safe. It is created mode 0600 and never overwritten.";

pub(crate) const LUKS_HEADER_RESTORE_LONG: &str = "\
Write a header backup made by `cairn luks header-backup` or `cryptsetup \
luksHeaderBackup` onto DEVICE. When DEVICE already holds a LUKS2 header, cairn asks you \
to type YES (or needs -q): replacing it changes which passphrases work, and a header from \
another volume makes the data unreadable.";

/// The device a `cairn luks` verb works on: a path, or an md array's members.
#[derive(Debug, Clone, Args)]
pub struct LuksTarget {
    /// A file or block device holding (or to hold) the LUKS header
    #[arg(
        value_name = "DEVICE",
        required_unless_present = "md",
        conflicts_with = "md"
    )]
    pub device: Option<PathBuf>,

    /// Use the md array assembled from these members (comma-separated) as DEVICE
    #[arg(long, value_name = "MEMBER,MEMBER,...")]
    pub md: Option<String>,
}

/// Where the passphrase comes from.
#[derive(Debug, Clone, Args)]
pub struct KeyFileArgs {
    /// Read the passphrase from FILE, its exact bytes (`-`: stdin) instead of asking
    #[arg(short = 'd', long, value_name = "FILE", visible_alias = "keyfile")]
    pub key_file: Option<PathBuf>,
}

/// cryptsetup's key derivation options.
#[derive(Debug, Clone, Args)]
pub struct PbkdfArgs {
    /// Key derivation function for the new keyslot: argon2id, argon2i or pbkdf2
    #[arg(long, value_name = "KDF", default_value = "argon2id",
          value_parser = ["argon2id", "argon2i", "pbkdf2"])]
    pub pbkdf: String,

    /// Hash for pbkdf2: sha256 (default), sha1, sha512, ...
    #[arg(long, value_name = "HASH", default_value = "sha256")]
    pub hash: String,

    /// Fixed cost instead of a benchmark: pbkdf2 iterations (at least 1000), or argon2
    /// passes (tests only)
    #[arg(long, value_name = "N")]
    pub pbkdf_force_iterations: Option<u32>,

    /// Argon2 memory cost in KiB [default: 1 GiB, at most half the RAM]
    #[arg(long, value_name = "KiB")]
    pub pbkdf_memory: Option<u32>,

    /// Argon2 threads [default: min(4, CPUs)]
    #[arg(long, value_name = "N")]
    pub pbkdf_parallel: Option<u32>,

    /// Time one unlock should take when the cost is benchmarked, in milliseconds
    #[arg(short = 'i', long, value_name = "MS", default_value_t = 2000)]
    pub iter_time: u64,
}

/// `cairn luks format`.
#[derive(Debug, Args)]
pub struct LuksFormatArgs {
    #[command(flatten)]
    pub target: LuksTarget,

    #[command(flatten)]
    pub key: KeyFileArgs,

    #[command(flatten)]
    pub pbkdf: PbkdfArgs,

    /// LUKS version to write: luks2 (cairn reads LUKS1 but does not create it)
    #[arg(long = "type", value_name = "TYPE", default_value = "luks2")]
    pub kind: String,

    /// Data cipher: aes-xts-plain64 (the only one cairn writes)
    #[arg(short, long, value_name = "CIPHER", default_value = "aes-xts-plain64")]
    pub cipher: String,

    /// Volume key size in bits: 512 (AES-256-XTS) or 256 (AES-128-XTS)
    #[arg(short = 's', long, value_name = "BITS", default_value_t = 512,
          value_parser = clap::builder::PossibleValuesParser::new(["256", "512"])
              .map(|s| s.parse::<u32>().expect("listed values are numbers")))]
    pub key_size: u32,

    /// Encryption sector size: 512 or 4096 [default: 4096 on 4K-sector devices, else 512]
    #[arg(long, value_name = "BYTES",
          value_parser = clap::builder::PossibleValuesParser::new(["512", "1024", "2048", "4096"])
              .map(|s| s.parse::<u32>().expect("listed values are numbers")))]
    pub sector_size: Option<u32>,

    /// Volume label stored in the header (shown by dump and blkid)
    #[arg(long, value_name = "LABEL", default_value = "")]
    pub label: String,

    /// Volume UUID [default: random]
    #[arg(long, value_name = "UUID")]
    pub uuid: Option<String>,

    /// Keyslot for the passphrase [default: 0]
    #[arg(short = 'S', long, value_name = "N")]
    pub key_slot: Option<u32>,

    /// Overwrite a device that carries an md, filesystem, LUKS or LVM signature
    #[arg(short, long)]
    pub force: bool,

    /// Do not ask for confirmation (cryptsetup's -q); signatures still need --force
    #[arg(short = 'q', long = "batch-mode")]
    pub batch_mode: bool,
}

/// Verbs that only read: `dump`.
#[derive(Debug, Args)]
pub struct LuksDeviceArgs {
    #[command(flatten)]
    pub target: LuksTarget,
}

/// Verbs that take one passphrase: `test`, `remove-key`.
#[derive(Debug, Args)]
pub struct LuksKeyArgs {
    #[command(flatten)]
    pub target: LuksTarget,

    #[command(flatten)]
    pub key: KeyFileArgs,

    /// Try only this keyslot
    #[arg(short = 'S', long, value_name = "N")]
    pub key_slot: Option<u32>,

    /// Do not ask for confirmation (remove-key)
    #[arg(short = 'q', long = "batch-mode")]
    pub batch_mode: bool,

    /// remove-key: allow removing the last keyslot without a terminal (with -q)
    #[arg(short, long)]
    pub force: bool,
}

/// Verbs that take an existing and a new passphrase: `add-key`, `change-key`.
#[derive(Debug, Args)]
pub struct LuksNewKeyArgs {
    #[command(flatten)]
    pub target: LuksTarget,

    #[command(flatten)]
    pub key: KeyFileArgs,

    /// Read the new passphrase from FILE, its exact bytes (`-`: stdin) instead of asking
    #[arg(long, value_name = "FILE", visible_alias = "new-keyfile")]
    pub new_key_file: Option<PathBuf>,

    #[command(flatten)]
    pub pbkdf: PbkdfArgs,

    /// Keyslot for the new passphrase [default: the lowest free one; change-key: the same]
    #[arg(short = 'S', long, value_name = "N")]
    pub key_slot: Option<u32>,
}

/// `header-backup` and `header-restore`.
#[derive(Debug, Args)]
pub struct LuksHeaderFileArgs {
    #[command(flatten)]
    pub target: LuksTarget,

    /// The backup file (backup: created, never overwritten; restore: read)
    #[arg(long, value_name = "FILE", required = true)]
    pub header_backup_file: PathBuf,

    /// Do not ask for confirmation (restore)
    #[arg(short = 'q', long = "batch-mode")]
    pub batch_mode: bool,
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
