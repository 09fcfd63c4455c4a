//! One owner per array across hosts, as the CLI offers it (docs/fencing.md):
//!
//! ```text
//!   cairn serve FILE...           member-server role: --fence keeps each export's owner
//!                                 record and refuses all but the newest owner generation
//!   cairn serve --md ... --etcd   owner role: each array's ownership is an etcd lease,
//!                                 taken by compare-and-swap before its members are taken
//!                                 over (cairn_stack::fence); I/O stops when it is lost
//!   cairn md owner MEMBER...      the owner record of each member
//! ```
//!
//! Kept apart from serve.rs, which only flattens [`FenceOptions`] and calls [`ownership`]
//! and [`setup`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cairn_block::BlockDevice;
use cairn_cluster::ondisk::{now_unix, DecodeError, OwnerRecord};
use cairn_cluster::{Etcd, MemberStore};
use cairn_nbd::fence::FenceStore;
use cairn_stack::export::OpenedExport;
use cairn_stack::Ownership;
use clap::{Args, ValueEnum};
use serde::Serialize;

use crate::error::{CliError, Result};
use crate::global::Global;

/// Whether this server enforces owner generations on its exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FenceMode {
    /// On when every export is a plain file or block device (a disk host's members)
    Auto,
    On,
    Off,
}

/// `cairn serve`'s fencing options.
#[derive(Debug, Clone, Args)]
pub struct FenceOptions {
    /// Member-server role: keep each export's owner record (in its first 4 KiB, which an
    /// md v1.2 member leaves unused) and refuse writes from all but the newest owner
    /// generation; clients without a token may still read, and write only while nobody
    /// owns the export. auto: on when only files or block devices are exported
    #[arg(long, value_enum, value_name = "MODE", default_value_t = FenceMode::Auto)]
    pub fence: FenceMode,

    /// This host's name in owner records and in the etcd lease, at most 32 bytes
    /// [default: the host name]
    #[arg(long, value_name = "NAME")]
    pub owner_id: Option<String>,

    /// Hold each md array served writable as a lease in this etcd (http://HOST:2379, or
    /// https://HOST:2379 with the --etcd-cacert/--etcd-cert/--etcd-key below),
    /// taken only by a create-if-absent transaction and before the array's members are
    /// taken over: serve refuses to start when another host holds the array; holding it
    /// lets serve take over from an owner that did not release the members (its lease ran
    /// out), without --force. Once the lease may have run out, nothing more is written to
    /// the members (background work included) and the exports refuse I/O. Several etcd
    /// members: a comma-separated list or the flag repeated; the next is tried when one
    /// cannot be reached
    #[arg(long, value_name = "URL[,URL...]")]
    pub etcd: Vec<String>,

    /// Seconds the etcd lease outlives its last keepalive (one is sent every third of it)
    #[arg(long, value_name = "SECONDS", default_value_t = 10, requires = "etcd",
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub etcd_ttl: u64,

    #[command(flatten)]
    pub etcd_access: Box<EtcdAccessOptions>,
}

/// TLS to etcd and etcd's user authentication, with etcdctl's options under `--etcd-`
/// names. No `requires` for clap: `cairn repl up --config` may take etcd from the file and
/// these from the command line; [`etcd_client`] and the callers check the combinations.
#[derive(Debug, Clone, Default, Args)]
pub struct EtcdAccessOptions {
    /// With https:// etcd endpoints: the CA certificate (PEM) that signed the etcd
    /// members' certificates, their --cert-file (etcdctl's --cacert). Only this CA is
    /// trusted then; without it, the system's roots. Each member's certificate must also
    /// name the host or address of its URL (subjectAltName)
    #[arg(long, value_name = "FILE")]
    pub etcd_cacert: Option<PathBuf>,

    /// With https:// etcd endpoints: this host's client certificate (PEM), which an etcd
    /// started with --client-cert-auth requires, signed by a CA in its --trusted-ca-file
    /// (etcdctl's --cert). Needs --etcd-key
    #[arg(long, value_name = "FILE")]
    pub etcd_cert: Option<PathBuf>,

    /// The private key of --etcd-cert (PEM, etcdctl's --key). It is read by OpenSSL
    /// alone: its contents never appear in messages or logs. Needs --etcd-cert
    #[arg(long, value_name = "FILE")]
    pub etcd_key: Option<PathBuf>,

    /// etcd's user name, for an etcd with authentication enabled (`etcdctl auth enable`;
    /// etcdctl's --user): requests carry the token /v3/auth/authenticate gives. Needs
    /// --etcd-password-file. The user needs read and write on the keys under /cairn/
    #[arg(long, value_name = "NAME")]
    pub etcd_user: Option<String>,

    /// The file holding --etcd-user's password, on its first line (not on the command
    /// line, where any local user could read it in the process list). Never shown in
    /// messages or logs
    #[arg(long, value_name = "FILE")]
    pub etcd_password_file: Option<PathBuf>,
}

impl EtcdAccessOptions {
    /// Refuses TLS files or a user with no etcd to use them on (they would be silently
    /// ignored), and a user without a password or the reverse.
    pub fn check_used(&self, etcd: &[String]) -> Result<()> {
        if etcd.is_empty() && self.files() != cairn_cluster::EtcdTls::default() {
            return Err(CliError::new(
                "--etcd-cacert, --etcd-cert and --etcd-key are for TLS to etcd: give --etcd \
                 https://HOST:PORT too",
            ));
        }
        if etcd.is_empty() && (self.etcd_user.is_some() || self.etcd_password_file.is_some()) {
            return Err(CliError::new(
                "--etcd-user and --etcd-password-file are for etcd: give --etcd too",
            ));
        }
        if self.etcd_user.is_some() != self.etcd_password_file.is_some() {
            return Err(CliError::new(
                "--etcd-user and --etcd-password-file go together",
            ));
        }
        Ok(())
    }

    /// The password on the first line of `--etcd-password-file`. Errors name the file,
    /// never what is in it.
    fn password(&self, file: &std::path::Path) -> Result<zeroize::Zeroizing<String>> {
        let shown = file.display();
        let text = zeroize::Zeroizing::new(
            std::fs::read_to_string(file)
                .map_err(|e| CliError::new(format!("--etcd-password-file {shown}: {e}")))?,
        );
        let first = text.lines().next().unwrap_or("");
        if first.is_empty() {
            return Err(CliError::new(format!(
                "--etcd-password-file {shown}: its first line is empty"
            )));
        }
        Ok(zeroize::Zeroizing::new(first.to_string()))
    }

    fn files(&self) -> cairn_cluster::EtcdTls {
        cairn_cluster::EtcdTls {
            cacert: self.etcd_cacert.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
        }
    }
}

/// The etcd client for `--etcd URL...` (the list joined) with the TLS files and the user.
pub fn etcd_client(urls: &[String], access: &EtcdAccessOptions) -> Result<Etcd> {
    access.check_used(urls)?;
    let etcd = Etcd::with_tls(&urls.join(","), &access.files())
        .map_err(|e| CliError::new(format!("--etcd: {e}")))?;
    Ok(match (&access.etcd_user, &access.etcd_password_file) {
        (Some(user), Some(file)) => etcd.with_auth(user, access.password(file)?),
        _ => etcd,
    })
}

/// Who this host is in owner records and where ownership is decided, for opening stacks.
pub fn ownership(opts: &FenceOptions) -> Result<Ownership> {
    opts.etcd_access.check_used(&opts.etcd)?;
    let etcd = match opts.etcd.is_empty() {
        false => Some((
            etcd_client(&opts.etcd, &opts.etcd_access)?,
            Duration::from_secs(opts.etcd_ttl),
        )),
        true => None,
    };
    Ok(Ownership {
        node: opts.owner_id.clone().unwrap_or_default(),
        etcd,
    })
}

/// What serving with fencing holds: the member server's record store.
#[derive(Debug, Default)]
pub struct Fencing {
    pub store: Option<Arc<dyn FenceStore>>,
}

/// Turns the options into a record store for the server. `plain`: every export is a file
/// or block device. The leases were taken when the arrays were opened (`ownership`).
pub fn setup(opts: &FenceOptions, plain: bool, opened: &[OpenedExport]) -> Result<Fencing> {
    let store: Option<Arc<dyn FenceStore>> = match (opts.fence, plain) {
        (FenceMode::Off, _) | (FenceMode::Auto, false) => None,
        (FenceMode::On, false) => {
            return Err(CliError::new(
                "--fence on is for a disk host serving members (files or block devices); \
                 md, LUKS and LVM exports carry no owner record of their own",
            ))
        }
        (_, true) => {
            Some(Arc::new(MemberStore::new(opened.iter().filter_map(|e| {
                beside_path(&e.path).map(|p| (e.name.clone(), p))
            }))))
        }
    };
    if !opts.etcd.is_empty() && !opened.iter().any(cairn_stack::OpenedExport::leased) {
        tracing::warn!("--etcd: no md array is served writable, so no lease was taken");
    }
    Ok(Fencing { store })
}

/// Where the owner record of an export used whole by its owner (a LUKS volume, a PV, an
/// export served as it is) is kept, beside the export: `FILE.cairn-owner` next to a
/// file, `/var/lib/cairn/owners/<path>` for a block device. None for a remote export.
pub fn beside_path(export: &std::path::Path) -> Option<PathBuf> {
    if cairn_stack::leaf::is_remote(export) {
        return None;
    }
    let meta = std::fs::metadata(export).ok()?;
    if meta.is_file() {
        let mut p = export.as_os_str().to_owned();
        p.push(".cairn-owner");
        return Some(PathBuf::from(p));
    }
    let flat = export
        .display()
        .to_string()
        .trim_start_matches('/')
        .replace('/', "!");
    Some(PathBuf::from("/var/lib/cairn/owners").join(flat))
}

/// `cairn md owner`.
#[derive(Debug, Args)]
pub struct OwnerArgs {
    /// Members: files, block devices or NBD URIs (nbd://HOST[:PORT]/EXPORT)
    #[arg(required = true, value_name = "MEMBER")]
    pub members: Vec<String>,

    /// Release each member's owner record (through its member server: give NBD URIs),
    /// so the next owner takes over without --force: what a clean stop of the owner
    /// does, for an owner that ended without one. An owner that did not release the
    /// member is named and kept unless --force is given too
    #[arg(long)]
    pub release: bool,

    /// With --release: release records whose owner did not (it is fenced: a new
    /// generation is taken first), once you know that owner is gone for good
    #[arg(short, long, requires = "release")]
    pub force: bool,
}

#[derive(Debug, Serialize)]
struct OwnerLine {
    member: String,
    /// "owned", "none", "foreign", "damaged" or "error".
    state: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    generation: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    owner: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    array: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    since: Option<u64>,
    /// The owner gave the member up cleanly.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    released: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    /// The record as read, for --release.
    #[serde(skip)]
    record: Option<OwnerRecord>,
    /// Kept beside an export used whole (not in its first 4 KiB).
    #[serde(skip)]
    whole: bool,
}

fn open(member: &str) -> std::result::Result<Arc<dyn BlockDevice>, String> {
    if member.starts_with("nbd") && member.contains("://") {
        let uri = cairn_nbd::uri::NbdUri::parse(member)?;
        let mut o = cairn_nbd::client::ClientOptions::from_uri(&uri).map_err(|e| e.to_string())?;
        o.connections = 1;
        let c = cairn_nbd::client::Client::connect(&o).map_err(|e| e.to_string())?;
        return Ok(Arc::new(c));
    }
    cairn_stack::md::open_member(
        &PathBuf::from(member),
        true,
        &cairn_stack::Hooks::default(),
        cairn_stack::leaf::DEFAULT_REMOTE_TIMEOUT,
    )
    .map_err(|e| e.to_string())
}

fn uuid_text(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    // mdadm's form: four groups of eight hex digits.
    format!("{}:{}:{}:{}", &h[0..8], &h[8..16], &h[16..24], &h[24..32])
}

fn owner_line(member: &str) -> OwnerLine {
    let mut l = OwnerLine {
        member: member.to_string(),
        state: "error",
        generation: None,
        owner: None,
        array: None,
        since: None,
        released: false,
        message: None,
        record: None,
        whole: false,
    };
    let rec = open(member).and_then(|d| OwnerRecord::read(&*d).map_err(|e| e.to_string()));
    match rec {
        Err(m) => l.message = Some(m),
        Ok(Ok(None)) => l.state = "none",
        Ok(Ok(Some(r))) => {
            l.state = "owned";
            l.generation = Some(r.token.generation);
            l.owner = Some(r.token.owner.to_string());
            l.array = Some(uuid_text(&r.token.array));
            l.since = Some(r.since);
            l.released = r.released;
            l.record = Some(r);
        }
        Ok(Err(e)) => {
            l.state = match e {
                DecodeError::NotARecord(_) => "foreign",
                DecodeError::Corrupt(_) => "damaged",
            };
            l.message = Some(e.to_string());
            // An export used whole (LUKS, a PV): a cairn member server keeps its record
            // beside it and says what it holds.
            if l.state == "foreign" {
                match kept_beside(member) {
                    Ok(Some(r)) => {
                        l.state = "owned";
                        l.generation = Some(r.token.generation);
                        l.owner = Some(r.token.owner.to_string());
                        l.array = Some(uuid_text(&r.token.array));
                        l.since = Some(r.since);
                        l.released = r.released;
                        l.message = None;
                        l.record = Some(r);
                        l.whole = true;
                    }
                    Ok(None) => {}
                    Err(m) => l.message = Some(m),
                }
            }
        }
    }
    l
}

/// The record a cairn member server keeps for a remote export (beside it, for an
/// export used whole), when it keeps one.
fn kept_beside(member: &str) -> std::result::Result<Option<OwnerRecord>, String> {
    if !cairn_stack::leaf::is_remote(std::path::Path::new(member)) {
        return Ok(None);
    }
    let uri = cairn_nbd::uri::NbdUri::parse(member)?;
    let o = cairn_nbd::client::ClientOptions::from_uri(&uri).map_err(|e| e.to_string())?;
    let asker = cairn_nbd::fence::FenceToken {
        array: [0; 16],
        generation: 1,
        owner: cairn_nbd::fence::OwnerId::new("cairn-md-owner", 0)?,
    };
    let bytes = (|| {
        let mut hs = cairn_nbd::client::Handshake::connect(&o.addr, o.timeout)?;
        if let Some(tls) = &o.tls {
            hs.starttls(tls)?;
        }
        let b = hs.query_owner(&o.export, &asker)?;
        let _ = hs.abort();
        Ok::<_, cairn_nbd::client::Error>(b)
    })()
    .map_err(|e| e.to_string())?;
    match bytes {
        Some(b) if !b.is_empty() => OwnerRecord::decode(&b).map_err(|e| e.to_string()),
        _ => Ok(None),
    }
}

/// `--release`: gives `l`'s record up through its member server, as its owner's clean
/// stop would. An owner that did not release it is named and kept without `force`;
/// with it, a takeover at a new generation fences that owner first.
fn release_line(l: &OwnerLine, force: bool) -> std::result::Result<String, String> {
    let m = &l.member;
    let Some(r) = &l.record else {
        return match l.state {
            "none" | "foreign" => Ok(format!("{m}: no owner record; nothing to release")),
            _ => Err(format!(
                "{m}: {}",
                l.message.as_deref().unwrap_or("unreadable")
            )),
        };
    };
    let holder = format!(
        "{} (generation {}, since {})",
        r.token.owner, r.token.generation, r.since
    );
    if r.released {
        return Ok(format!("{m}: released already (last owner {holder})"));
    }
    if !force {
        return Err(format!(
            "{m}: owned by {holder}, which has not released it; if that owner is gone for \
             good (its process ended, its host is down), add --force to release it"
        ));
    }
    if !cairn_stack::leaf::is_remote(std::path::Path::new(m)) {
        return Err(format!(
            "{m}: a record is released through the member server that keeps it: give the \
             member's NBD URI"
        ));
    }
    let uri = cairn_nbd::uri::NbdUri::parse(m)?;
    let o = cairn_nbd::client::ClientOptions::from_uri(&uri).map_err(|e| e.to_string())?;
    let me = cairn_cluster::owner::new_owner("")?;
    let members = vec![(m.clone(), o.clone())];
    let owned = if l.whole {
        cairn_cluster::take_over_whole(r.token.array, &me, m, &o, true)
    } else {
        let rules = cairn_cluster::Rules {
            needed: 1,
            force_quorum: true,
            replace_owner: true,
        };
        cairn_cluster::take_over(r.token.array, &me, &members, rules)
    }
    .map_err(|e| format!("{m}: {e}"))?;
    let failed = cairn_cluster::release(&owned, &members);
    if let Some((_, e)) = failed.first() {
        return Err(format!("{m}: the record could not be released: {e}"));
    }
    Ok(format!("{m}: released (it was owned by {holder})"))
}

/// Prints each member's owner record: generation, owner, array, since when. With
/// `--release`, gives the records up instead.
pub fn owner(a: &OwnerArgs, global: &Global) -> Result<()> {
    let lines: Vec<OwnerLine> = a.members.iter().map(|m| owner_line(m)).collect();
    if a.release {
        let mut errors = Vec::new();
        for l in &lines {
            match release_line(l, a.force) {
                Ok(said) => println!("{said}"),
                Err(e) => errors.push(e),
            }
        }
        if errors.is_empty() {
            return Ok(());
        }
        return Err(CliError::new(errors.join("; ")));
    }
    if global.json {
        println!("{}", serde_json::to_string(&lines).expect("serialisable"));
    } else {
        let now = now_unix();
        for l in &lines {
            match l.state {
                "owned" => println!(
                    "{}: generation {}, owner {}, array {}, since {} ({} s ago){}",
                    l.member,
                    l.generation.unwrap_or(0),
                    l.owner.as_deref().unwrap_or(""),
                    l.array.as_deref().unwrap_or(""),
                    l.since.unwrap_or(0),
                    now.saturating_sub(l.since.unwrap_or(0)),
                    if l.released { ", released" } else { "" },
                ),
                "none" => println!("{}: no owner record (never owned)", l.member),
                _ => println!("{}: {}", l.member, l.message.as_deref().unwrap_or("")),
            }
        }
    }
    if lines.iter().any(|l| matches!(l.state, "error" | "damaged")) {
        return Err(CliError::new(
            "some members' owner records could not be read",
        ));
    }
    Ok(())
}
