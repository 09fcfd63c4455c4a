//! One owner per array across hosts, as the CLI offers it (docs/fencing.md):
//!
//! ```text
//!   cairn serve FILE...           member-server role: --fence keeps each export's owner
//!                                 record and refuses all but the newest owner generation
//!   cairn serve --md ... --etcd   owner role: each array's ownership is an etcd lease,
//!                                 taken by compare-and-swap; exports stop I/O when it is lost
//!   cairn md owner MEMBER...      the owner record of each member
//! ```
//!
//! Kept apart from serve.rs, which only flattens [`FenceOptions`] and calls [`setup`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use cairn_block::BlockDevice;
use cairn_cluster::ondisk::{now_unix, DecodeError, OwnerRecord};
use cairn_cluster::{owner_key, Etcd, FencedDevice, Lease, LeaseError, RecordStore};
use cairn_nbd::fence::FenceStore;
use cairn_stack::export::OpenedExport;
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

    /// Hold each served md array as a lease in this etcd (http://HOST:2379), taken only
    /// by a create-if-absent transaction: serve refuses to start when another host holds
    /// an array, and the array's exports refuse I/O once the lease may have run out
    #[arg(long, value_name = "URL")]
    pub etcd: Option<String>,

    /// Seconds the etcd lease outlives its last keepalive (one is sent every third of it)
    #[arg(long, value_name = "SECONDS", default_value_t = 10, requires = "etcd",
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub etcd_ttl: u64,
}

/// What serving with fencing holds: the member server's record store and the leases.
#[derive(Debug, Default)]
pub struct Fencing {
    pub store: Option<Arc<dyn FenceStore>>,
    /// Held while serving; dropping them revokes the leases.
    pub leases: Vec<Lease>,
}

/// Turns the options into a record store for the server and, with --etcd, takes each
/// array's lease and wraps the exports over it. `plain`: every export is a file or block
/// device.
pub fn setup(opts: &FenceOptions, plain: bool, opened: &mut [OpenedExport]) -> Result<Fencing> {
    let store: Option<Arc<dyn FenceStore>> = match (opts.fence, plain) {
        (FenceMode::Off, _) | (FenceMode::Auto, false) => None,
        (FenceMode::On, false) => {
            return Err(CliError::new(
                "--fence on is for a disk host serving members (files or block devices); \
                 md, LUKS and LVM exports carry no owner record of their own",
            ))
        }
        (_, true) => Some(Arc::new(RecordStore)),
    };
    let mut leases = Vec::new();
    if let Some(url) = &opts.etcd {
        let etcd = Etcd::new(url).map_err(|e| CliError::new(e.to_string()))?;
        let owner = cairn_cluster::owner::new_owner(opts.owner_id.as_deref().unwrap_or(""))
            .map_err(CliError::new)?;
        let ttl = Duration::from_secs(opts.etcd_ttl);
        for e in opened.iter_mut() {
            for array in e.arrays() {
                let uuid = array.uuid().to_string();
                let key = owner_key(&uuid);
                let lease = match leases.iter().find(|l: &&Lease| l.key() == key) {
                    Some(l) => l,
                    None => {
                        let l = Lease::acquire(&etcd, &key, owner.to_string().as_bytes(), ttl)
                            .map_err(|err| match err {
                                LeaseError::Held(_) => CliError::new(format!(
                                    "md array {uuid} ({}): {err}; it is served by another \
                                     host",
                                    e.name
                                )),
                                other => CliError::new(format!("md array {uuid}: {other}")),
                            })?;
                        leases.push(l);
                        leases.last().expect("just pushed")
                    }
                };
                e.device = Arc::new(FencedDevice::new(e.device.clone(), lease.guard()));
            }
        }
        if leases.is_empty() {
            tracing::warn!("--etcd: no md array is served, so no lease was taken");
        }
    }
    Ok(Fencing { store, leases })
}

/// `cairn md owner`.
#[derive(Debug, Args)]
pub struct OwnerArgs {
    /// Members: files, block devices or NBD URIs (nbd://HOST[:PORT]/EXPORT)
    #[arg(required = true, value_name = "MEMBER")]
    pub members: Vec<String>,
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
        }
        Ok(Err(e)) => {
            l.state = match e {
                DecodeError::NotARecord(_) => "foreign",
                DecodeError::Corrupt(_) => "damaged",
            };
            l.message = Some(e.to_string());
        }
    }
    l
}

/// Prints each member's owner record: generation, owner, array, since when.
pub fn owner(a: &OwnerArgs, global: &Global) -> Result<()> {
    let lines: Vec<OwnerLine> = a.members.iter().map(|m| owner_line(m)).collect();
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
