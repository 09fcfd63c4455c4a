//! `cairn repl`: a volume mirrored between machines (DRBD's words: create-md, up,
//! primary, secondary, connect, disconnect, status, down).
//!
//! ```text
//!   cairn repl up RES ... ─> cairn_repl::Node on the disk, two NBD servers (peers: the
//!                            data area + the replication handshake; clients: the volume
//!                            while primary) and a control socket
//!   cairn repl primary|secondary|connect|disconnect|status|down RES ─> the control socket
//!   cairn repl verify|invalidate RES ─> the control socket (online verify, invalidate)
//!   cairn repl detach|attach RES ─> the control socket (drop the local disk, take it back)
//! ```

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::{json, Value};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use cairn_nbd::client::ClientOptions;
use cairn_nbd::uri::NbdUri;
use cairn_nbd::{Listen, Server, ServerConfig, ServerTls};
use cairn_repl::control;
use cairn_repl::node::{
    Exports, Node, NodeConfig, OnIoError, OnNoData, PeerConfig, Protocol, SplitBrainPolicy, Status,
};

use crate::error::{CliError, Result};
use crate::global::Global;
use crate::listen;
use crate::serve::TlsOptions;

pub const REPL_LONG: &str = "\
A volume mirrored between machines, synchronously (DRBD's protocol C): a write is answered \
only when the local disk and every connected peer have it. Any file or block device can be \
the backing disk; the replication metadata (generations, an activity log and one \
out-of-sync bitmap per peer) sits at its end, after the data, or on a metadata disk of its \
own with --meta-disk (the data is then the whole disk; docs/replication-format.md).

One node is primary and serves the volume over NBD; the others are secondary and take its \
writes. A peer that is away is tracked in a bitmap and resynced from it when it comes back; \
two nodes that both wrote while apart (split brain) are detected on both sides and stay \
apart until the operator, or a --split-brain policy, says whose changes go. `--protocol A` answers writes once the local \
disk has them (faster, but the last writes before a crash of the primary may be missing on \
the peer). With `--etcd`, the primary role is an etcd lease and a secondary can take over by \
itself (`--auto-failover`). A node whose own disk fails an I/O detaches it (`--on-io-error \
detach`, the default): a primary goes on diskless, reading and writing through an up-to-date \
peer, so the application sees no error while one is connected; with none, its requests fail \
(`--on-no-data io-error`, the default) or wait for one (`--on-no-data suspend-io`). \
docs/replication.md has the whole story.";

const REPL_EXAMPLES: &str = "\
Examples (two hosts, a and b):
  cairn repl create-md /dev/vg0/home                 # on a and on b
  cairn repl up home --disk /dev/vg0/home --node a --listen tcp:10.0.0.1:7789 \\
      --peer b=nbd://10.0.0.2:7789/home --insecure-no-tls          # on a (b likewise)
  cairn repl primary home --force                    # on a, once: a's data becomes b's
  cairn repl status                                  # roles, disks, sync progress
  cairn repl secondary home                          # on a; then on b:
  cairn repl primary home                            # b serves the volume";

#[derive(Debug, Subcommand)]
pub enum ReplCommand {
    /// Write empty replication metadata at the end of a disk (data keeps the rest), or
    /// on a metadata disk of its own (--meta-disk: the data is the whole disk)
    CreateMd(CreateMdArgs),
    /// Run a resource on this node (foreground): secondary until `cairn repl primary`
    #[command(after_help = REPL_EXAMPLES)]
    Up(Box<UpArgs>),
    /// Make this node primary: it serves the volume and replicates to its peers
    Primary(PrimaryArgs),
    /// Make this node secondary: clients are cut, everything is flushed
    Secondary(CtlArgs),
    /// Connect to peers again (after a refusal or a disconnect)
    Connect(ConnectArgs),
    /// Stop replicating to a peer (its writes are tracked in its bitmap)
    Disconnect(PeerArgs),
    /// Roles, disk states, connections, out-of-sync bytes, resync progress
    Status(StatusArgs),
    /// Stop a running resource cleanly (as SIGTERM to `cairn repl up`)
    Down(CtlArgs),
    /// On the primary, while it serves: compare every block with the peers' by digest;
    /// blocks that differ are marked out of sync (resynced at the next connect)
    Verify(VerifyArgs),
    /// On a secondary: give this node's data up; the primary resyncs all of it
    Invalidate(CtlArgs),
    /// Drop this node's disk: a primary goes on diskless through an up-to-date peer, a
    /// secondary refuses its primary until `attach`
    Detach(CtlArgs),
    /// On a diskless node: take the disk back, or a new one (--disk). A secondary's is
    /// resynced in full by the primary; a primary's is filled from an up-to-date peer
    /// while the primary goes on serving (disk Inconsistent until done)
    Attach(AttachArgs),
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    #[command(flatten)]
    pub ctl: CtlArgs,
    /// A new backing disk in place of the failed one, made by `cairn repl create-md`
    /// with the resource's sizes (file, block device, NBD URI or stack JSON); opened by
    /// the running node [default: the disk it was started with]
    #[arg(long)]
    pub disk: Option<PathBuf>,
    /// The new disk's external metadata (`create-md --meta-disk`)
    #[arg(long, value_name = "META", requires = "disk")]
    pub meta_disk: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    #[command(flatten)]
    pub peer: PeerArgs,
    /// Resync the blocks found out of sync when the verify is done (the peer is
    /// reconnected); without it they stay marked until the next connect
    #[arg(long)]
    pub resync: bool,
    /// Wait until the verify is done and print its result
    #[arg(long)]
    pub wait: bool,
}

#[derive(Debug, Args)]
pub struct CreateMdArgs {
    /// The backing disk: a file, a block device, an NBD URI, or any cairn stack as JSON
    /// (`{"md": ["d0.img", "d1.img"]}`, `{"lv": {"on": [...], "name": "VG/LV"}}`, ...);
    /// its end holds the metadata, unless --meta-disk is given
    pub disk: PathBuf,
    /// External metadata: on this device (file, block device or NBD URI) instead of at
    /// the end of DISK, which is then all data (DRBD's `meta-disk`). A file that does
    /// not exist is created, sparse, with the size the metadata needs
    #[arg(long, value_name = "META")]
    pub meta_disk: Option<PathBuf>,
    /// Peers this node will replicate to (room for one bitmap each)
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=3))]
    pub max_peers: u32,
    /// Bytes of data per bitmap bit (a power of two, at least 4K)
    #[arg(long, default_value = "4K", value_parser = parse_size_arg)]
    pub bitmap_block: u64,
    /// Bytes per activity-log extent (a power of two)
    #[arg(long, default_value = "4M", value_parser = parse_size_arg)]
    pub al_extent: u64,
    /// Create a sparse file of this size first, when DISK does not exist
    #[arg(long, value_parser = parse_size_arg)]
    pub size: Option<u64>,
    /// Write over existing replication metadata
    #[arg(long)]
    pub force: bool,
    /// The resource this disk is for (without it, the first `cairn repl up` records
    /// its resource); `up` of another resource is then refused
    #[arg(long, value_name = "NAME")]
    pub resource: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct UpArgs {
    /// The resource's name: the same on every node
    pub resource: String,
    /// The resource as a config file defines it (a `[[resource]]` table with one
    /// `[[resource.node]]` per node, as DRBD's resource files do; docs/replication.md):
    /// disk, addresses, peers, protocol, policies, TLS and etcd come from there
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The backing disk, with metadata from `cairn repl create-md`: a file, a block
    /// device, an NBD URI, or a cairn stack as JSON (see `cairn repl create-md --help`)
    #[arg(long)]
    pub disk: Option<PathBuf>,
    /// The metadata disk, when the metadata is external (`create-md --meta-disk`): the
    /// whole --disk is then data; `internal` is the default (at the end of --disk)
    #[arg(long, value_name = "META")]
    pub meta_disk: Option<PathBuf>,
    /// This node's name, as its peers call it in their --peer [default with --config:
    /// the host name]
    #[arg(long)]
    pub node: Option<String>,
    /// A peer: NAME=URI of its replication listener and this resource
    /// (nbd://HOST:PORT/RES, nbds://... with TLS); repeat for more peers
    #[arg(long = "peer", value_name = "NAME=URI")]
    pub peers: Vec<String>,
    /// Where peers reach this node [default: tcp:127.0.0.1:7789]
    #[arg(long, value_name = "LISTEN")]
    pub listen: Option<Listen>,
    /// Where clients reach the volume while this node is primary
    /// [default: unix:RUNDIR/repl-RES.nbd]
    #[arg(long = "client-listen", value_name = "LISTEN")]
    pub client_listen: Vec<Listen>,
    /// The control socket [default: RUNDIR/repl-RES.sock]
    #[arg(long)]
    pub control: Option<PathBuf>,
    /// Serve Prometheus metrics at http://ADDR/metrics (tcp:HOST:PORT, HOST:PORT or
    /// unix:PATH): role, connection, out-of-sync bytes, resync progress, split brain
    #[arg(long, value_name = "ADDR", value_parser = crate::daemon::parse_metrics_addr)]
    pub metrics: Option<Listen>,
    /// What to do when split brain is found: disconnect (the default: the operator
    /// decides), discard-zero-changes, discard-least-changes, discard-secondary
    #[arg(long, default_value = "disconnect")]
    pub split_brain: SplitBrainPolicy,
    /// C: a write is answered when every connected replica has it (synchronous); A:
    /// when the local disk has it and the peer's copy is sent (asynchronous: the last
    /// writes before a crash of the primary may be missing on the peer that takes over)
    #[arg(long, default_value = "C", value_name = "C|A")]
    pub protocol: Protocol,
    /// The most resync and online verify may take, in MiB/s, while the application is
    /// idle; 0 (the default) is unlimited. Also caps --resync-min-rate
    #[arg(long, value_name = "MiB/s", default_value_t = 0)]
    pub resync_rate: u64,
    /// The rate, in MiB/s, resync and online verify keep while the application reads or
    /// writes the volume: they back off to it from --resync-rate for as long as
    /// application I/O was seen in the last half second, and speed up again when it
    /// stops. 32 MiB/s is about a quarter of a 1 Gbit/s link or of one spinning disk, and
    /// still copies 1 TiB in about 9 hours under constant load
    #[arg(
        long,
        value_name = "MiB/s",
        default_value_t = cairn_repl::rate::DEFAULT_MIN_MIB,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub resync_min_rate: u64,
    /// Extents (of 4 MiB by default) the activity log keeps active: a crash of the
    /// primary resyncs at most these
    #[arg(long, default_value_t = 256)]
    pub al_extents: usize,
    /// Seconds a peer may take to answer before it is dropped (and tracked in its
    /// bitmap)
    #[arg(long, default_value_t = 10)]
    pub peer_timeout: u64,
    /// Become primary at once (with --force: also from blank or inconsistent data)
    #[arg(long)]
    pub primary: bool,
    /// With --primary: as `cairn repl primary --force`
    #[arg(long, requires = "primary")]
    pub force: bool,
    /// Quorum through etcd (http://HOST:2379, or https://HOST:2379 with
    /// --etcd-cacert/--etcd-cert/--etcd-key): the primary role is an etcd lease taken
    /// only by compare-and-swap, and a replica the primary went on without is marked
    /// outdated there so it cannot take over with old data. Several members: a
    /// comma-separated list or the flag repeated; the next is tried when one cannot be
    /// reached
    #[arg(long, value_name = "URL[,URL...]")]
    pub etcd: Vec<String>,
    /// Seconds the primary lease outlives its last keepalive
    #[arg(long, value_name = "SECONDS", default_value_t = 10, requires = "etcd")]
    pub etcd_ttl: u64,
    /// With --etcd: a consistent secondary that is not outdated becomes primary by itself
    /// when no primary holds the lease
    #[arg(long, requires = "etcd")]
    pub auto_failover: bool,
    /// With --etcd: what a primary does with requests once its lease may be gone: freeze
    /// (they wait until the node is made secondary) or error (EPERM at once)
    #[arg(
        long,
        value_name = "freeze|error",
        default_value = "freeze",
        requires = "etcd"
    )]
    pub on_lease_loss: cairn_repl::quorum::OnLoss,
    /// When this node's disk fails a read, a write or a flush: detach (drop the disk; a
    /// primary serves reads and writes through an up-to-date peer, so the application
    /// sees no error while one is connected; a secondary is dropped by its primary) or
    /// pass-on (the error goes to the application, or to the primary)
    #[arg(long, value_name = "detach|pass-on", default_value = "detach")]
    pub on_io_error: OnIoError,
    /// What a diskless primary does with a request when no up-to-date peer is connected
    /// (DRBD's on-no-data-accessible): io-error, the default (the request fails), or
    /// suspend-io (it waits, unanswered, until an up-to-date peer is connected again, or
    /// fails when the node is made secondary; `status` shows "I/O suspended")
    #[arg(long, value_name = "io-error|suspend-io", default_value = "io-error")]
    pub on_no_data: OnNoData,
    #[command(flatten)]
    pub etcd_access: crate::fence::EtcdAccessOptions,
    #[command(flatten)]
    pub tls: TlsOptions,
}

#[derive(Debug, Args)]
pub struct CtlArgs {
    pub resource: String,
    /// The control socket [default: RUNDIR/repl-RES.sock]
    #[arg(long)]
    pub control: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct PrimaryArgs {
    #[command(flatten)]
    pub ctl: CtlArgs,
    /// Promote even from blank data (the first primary of a new resource: its data
    /// becomes every peer's), inconsistent data, or when a peer seems newer
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Args)]
pub struct PeerArgs {
    #[command(flatten)]
    pub ctl: CtlArgs,
    /// Only this peer [default: all]
    #[arg(long)]
    pub peer: Option<String>,
}

#[derive(Debug, Args)]
pub struct ConnectArgs {
    #[command(flatten)]
    pub peer: PeerArgs,
    /// After a split brain: this node's changes are to go; the primary's data wins
    #[arg(long)]
    pub discard_my_data: bool,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// One resource [default: every resource running on this host]
    pub resource: Option<String>,
    /// The control socket [default: RUNDIR/repl-RES.sock]
    #[arg(long, requires = "resource")]
    pub control: Option<PathBuf>,
}

pub fn run(cmd: ReplCommand, global: &Global) -> Result<()> {
    match cmd {
        ReplCommand::CreateMd(a) => create_md(&a, global),
        ReplCommand::Up(a) => up(&a, global),
        ReplCommand::Primary(a) => ctl(&a.ctl, json!({"cmd": "primary", "force": a.force}), global),
        ReplCommand::Secondary(a) => ctl(&a, json!({"cmd": "secondary"}), global),
        ReplCommand::Connect(a) => ctl(
            &a.peer.ctl,
            json!({"cmd": "connect", "peer": a.peer.peer, "discard_my_data": a.discard_my_data}),
            global,
        ),
        ReplCommand::Disconnect(a) => {
            ctl(&a.ctl, json!({"cmd": "disconnect", "peer": a.peer}), global)
        }
        ReplCommand::Status(a) => status(&a, global),
        ReplCommand::Down(a) => ctl(&a, json!({"cmd": "down"}), global),
        ReplCommand::Verify(a) => verify(&a, global),
        ReplCommand::Invalidate(a) => ctl(&a, json!({"cmd": "invalidate"}), global),
        ReplCommand::Detach(a) => ctl(&a, json!({"cmd": "detach"}), global),
        ReplCommand::Attach(a) => {
            // The running node opens the paths: make them absolute here.
            let abs = |p: &PathBuf| -> PathBuf {
                if p.is_relative()
                    && !cairn_stack::leaf::is_remote(p)
                    && !p.to_string_lossy().trim_start().starts_with('{')
                {
                    std::env::current_dir().map_or_else(|_| p.clone(), |d| d.join(p))
                } else {
                    p.clone()
                }
            };
            ctl(
                &a.ctl,
                json!({"cmd": "attach", "disk": a.disk.as_ref().map(abs),
                       "meta_disk": a.meta_disk.as_ref().map(abs)}),
                global,
            )
        }
    }
}

fn control_path(resource: &str, given: Option<&PathBuf>) -> PathBuf {
    given
        .cloned()
        .unwrap_or_else(|| control::socket_path(&listen::runtime_dir(), resource))
}

fn create_md(a: &CreateMdArgs, global: &Global) -> Result<()> {
    if let Some(size) = a.size {
        if !a.disk.exists() {
            let f = std::fs::File::create(&a.disk)
                .map_err(|e| CliError::new(format!("cannot create {}: {e}", a.disk.display())))?;
            f.set_len(size)
                .map_err(|e| CliError::new(format!("cannot size {}: {e}", a.disk.display())))?;
        }
    }
    let params = cairn_repl::store::CreateParams {
        max_peers: a.max_peers,
        bm_block: a.bitmap_block,
        al_extent: a.al_extent,
        force: a.force,
        resource: a.resource.as_deref().map(cairn_repl::node::resource_id),
    };
    let meta_disk = a.meta_disk.as_ref().filter(|m| !is_internal(m));
    let made = match meta_disk {
        None => {
            let disk = open_backing(&a.disk, false, "repl")?;
            cairn_repl::store::create(disk.dev.as_ref(), &params)
                .map_err(|e| CliError::new(format!("{}: {e}", a.disk.display())))?
        }
        Some(meta_path) => create_md_external(a, meta_path, &params)?,
    };
    if global.json {
        println!(
            "{}",
            json!({"disk": a.disk, "meta_disk": meta_disk, "data_size": made.data_size,
                   "metadata_bytes": made.metadata_bytes,
                   "max_peers": a.max_peers, "bitmap_block": a.bitmap_block, "al_extent": a.al_extent,
                   "resource": a.resource})
        );
    } else if let Some(meta_path) = meta_disk {
        println!(
            "{}: replication metadata written ({} used: {} peer bitmap{} of {}-byte blocks, {} activity-log extents) for {} of data, all of {}",
            meta_path.display(),
            human(made.metadata_bytes),
            a.max_peers,
            if a.max_peers == 1 { "" } else { "s" },
            a.bitmap_block,
            human(a.al_extent),
            human(made.data_size),
            a.disk.display(),
        );
        let res = a
            .resource
            .as_deref()
            .map_or_else(|| "RESOURCE".to_string(), crate::shell::shell_word);
        println!(
            "next: cairn repl up {res} --disk {} --meta-disk {} --node NAME --peer NAME=nbd://HOST:7789/{res}",
            crate::shell::shell_word(&a.disk.display().to_string()),
            crate::shell::shell_word(&meta_path.display().to_string())
        );
    } else {
        println!(
            "{}: replication metadata written: {} of data, {} of metadata at the end ({} peer bitmap{} of {}-byte blocks, {} activity-log extents)",
            a.disk.display(),
            human(made.data_size),
            human(made.metadata_bytes),
            a.max_peers,
            if a.max_peers == 1 { "" } else { "s" },
            a.bitmap_block,
            human(a.al_extent)
        );
        let res = a
            .resource
            .as_deref()
            .map_or_else(|| "RESOURCE".to_string(), crate::shell::shell_word);
        println!(
            "next: cairn repl up {res} --disk {} --node NAME --peer NAME=nbd://HOST:7789/{res}",
            crate::shell::shell_word(&a.disk.display().to_string())
        );
    }
    Ok(())
}

/// `--meta-disk internal` (or `meta_disk = "internal"`): DRBD's word for the default.
fn is_internal(p: &Path) -> bool {
    p.as_os_str() == "internal"
}

/// Refuses one device given as both the data and the metadata disk.
fn check_distinct(disk: &Path, meta: &Path) -> Result<()> {
    let same = disk == meta
        || matches!(
            (std::fs::canonicalize(disk), std::fs::canonicalize(meta)),
            (Ok(a), Ok(b)) if a == b
        );
    if same {
        return Err(CliError::new(format!(
            "{} is both the data disk and the metadata disk; without --meta-disk the \
             metadata goes at the end of the data disk",
            disk.display()
        )));
    }
    Ok(())
}

/// `create-md DISK --meta-disk META`: META gets the metadata for all of DISK. A META
/// file that does not exist is created sparse, with the size the metadata needs.
fn create_md_external(
    a: &CreateMdArgs,
    meta_path: &Path,
    params: &cairn_repl::store::CreateParams,
) -> Result<cairn_repl::store::Created> {
    check_distinct(&a.disk, meta_path)?;
    let backing = open_backing(&a.disk, true, "repl")?;
    let disk = backing.dev.clone();
    let data_bytes = cairn_block::BlockDevice::geometry(disk.as_ref()).size;
    let need = cairn_repl::store::external_meta_size(data_bytes, params)
        .map_err(|e| CliError::new(format!("{}: {e}", a.disk.display())))?;
    let shown = meta_path.display();
    if !cairn_stack::leaf::is_remote(meta_path) && !meta_path.exists() {
        let f = std::fs::File::create_new(meta_path)
            .map_err(|e| CliError::new(format!("cannot create {shown}: {e}")))?;
        f.set_len(need)
            .map_err(|e| CliError::new(format!("cannot size {shown}: {e}")))?;
        tracing::info!("{shown}: created, {need} bytes (sparse)");
    }
    let meta = cairn_stack::leaf::open(meta_path, false, false, Duration::from_secs(10))?;
    cairn_repl::store::create_external(disk.as_ref(), meta.as_ref(), params)
        .map_err(|e| CliError::new(format!("{shown}: {e}")))
}

fn human(b: u64) -> String {
    cairn_stack::size::format_size(b)
}

fn parse_size_arg(s: &str) -> std::result::Result<u64, String> {
    cairn_stack::size::parse_size(s).map_err(|e| e.to_string())
}

fn parse_peer(s: &str, tls: &TlsOptions) -> Result<PeerConfig> {
    let (name, uri) = s.split_once('=').ok_or_else(|| {
        CliError::new(format!(
            "--peer {s:?}: expected NAME=URI, e.g. b=nbd://10.0.0.2:7789/home"
        ))
    })?;
    if name.is_empty() {
        return Err(CliError::new(format!(
            "--peer {s:?}: the peer needs a name before '='"
        )));
    }
    let parsed = NbdUri::parse(uri).map_err(|e| CliError::new(format!("--peer {name}: {e}")))?;
    let opts = ClientOptions::from_uri(&parsed)
        .map_err(|e| CliError::new(format!("--peer {name}: {e}")))?;
    if opts.tls.is_none() && (tls.tls_psk.is_some() || tls.tls_certificates.is_some()) {
        tracing::warn!("--peer {name}: nbd:// is plaintext while this node requires TLS of its peers; use nbds://");
    }
    Ok(PeerConfig {
        name: name.to_string(),
        opts,
    })
}

/// `etcd = "http://A:2379"` (commas allowed) or `etcd = ["http://A:2379", "http://B:2379"]`.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged)]
enum EtcdEndpoints {
    One(String),
    Many(Vec<String>),
}

/// A config file of replicated resources.
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    #[serde(default)]
    resource: Vec<ResourceDef>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ResourceDef {
    name: String,
    /// The backing disk on every node (a node's own `disk` wins).
    disk: Option<PathBuf>,
    /// The metadata disk on every node (a node's own `meta_disk` wins); "internal" or
    /// none: at the end of `disk`.
    meta_disk: Option<PathBuf>,
    protocol: Option<String>,
    split_brain: Option<String>,
    /// MiB/s while the application is idle; 0: unlimited.
    resync_rate: Option<u64>,
    /// MiB/s kept while the application does I/O; at least 1.
    resync_min_rate: Option<u64>,
    al_extents: Option<usize>,
    /// Seconds.
    peer_timeout: Option<u64>,
    /// A psktool file every node holds: replication is then TLS-only.
    tls_psk: Option<PathBuf>,
    tls_username: Option<String>,
    /// Plaintext between nodes off loopback: anyone who reaches the port reads and writes
    /// the volume (as `--insecure-no-tls`).
    insecure_no_tls: Option<bool>,
    /// One endpoint, several comma-separated, or a list of them.
    etcd: Option<EtcdEndpoints>,
    /// TLS to etcd (https:// endpoints), as `--etcd-cacert`, `--etcd-cert`, `--etcd-key`.
    etcd_cacert: Option<PathBuf>,
    etcd_cert: Option<PathBuf>,
    etcd_key: Option<PathBuf>,
    /// etcd's user and the file with its password (`--etcd-user`, `--etcd-password-file`).
    etcd_user: Option<String>,
    etcd_password_file: Option<PathBuf>,
    etcd_ttl: Option<u64>,
    auto_failover: Option<bool>,
    on_lease_loss: Option<String>,
    /// "detach" (the default) or "pass-on", as `--on-io-error`.
    on_io_error: Option<String>,
    /// "io-error" (the default) or "suspend-io", as `--on-no-data`.
    on_no_data: Option<String>,
    node: Vec<NodeDef>,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeDef {
    name: String,
    /// IP:PORT where the other nodes reach this one.
    address: String,
    disk: Option<PathBuf>,
    meta_disk: Option<PathBuf>,
}

/// The backing device of a resource: a file, a block device, an NBD URI, or any cairn
/// stack given as the control API's JSON spec (`{"md": ["d0.img", ...]}`,
/// `{"luks": {"on": ..., "key_file": ...}}`, `{"lv": {"on": [...], "name": "VG/LV"}}`).
/// A stack is closed (its md arrays marked clean) when this drops.
struct Backing {
    dev: Arc<dyn cairn_block::BlockDevice>,
    stack: Option<cairn_stack::OpenedExport>,
}

impl Drop for Backing {
    fn drop(&mut self) {
        if let Some(e) = &self.stack {
            e.close();
        }
    }
}

fn open_backing(what: &Path, read_only: bool, name: &str) -> Result<Backing> {
    let text = what.to_string_lossy();
    if !text.trim_start().starts_with('{') {
        let dev = cairn_stack::leaf::open(what, read_only, false, Duration::from_secs(10))?;
        return Ok(Backing { dev, stack: None });
    }
    let spec: cairn_stack::Spec = serde_json::from_str(&text).map_err(|e| {
        CliError::new(format!(
            "{text}: not a stack spec ({e}); e.g. {{\"md\": [\"d0.img\", \"d1.img\"]}}"
        ))
    })?;
    let opts = cairn_stack::Options {
        read_only,
        hooks: crate::hooks::hooks(true),
        ..cairn_stack::Options::default()
    };
    let mut keys = cairn_stack::Keys::new(None, None, opts.hooks.prompt.clone());
    let e = cairn_stack::open_one(&spec, Some(name), &opts, &mut keys)?;
    if !read_only {
        // Arrays under a replicated volume run their own background work (resync after
        // an unclean stop, rebuilds onto spares), as under `cairn serve`.
        for a in cairn_stack::export::all_arrays(std::slice::from_ref(&e)) {
            a.manage(cairn_md::SpeedLimits::default());
        }
    }
    Ok(Backing {
        dev: e.device.clone(),
        stack: Some(e),
    })
}

/// The command line with what `--config` says filled in, checked to be complete.
fn resolve_up(a: &UpArgs) -> Result<UpArgs> {
    let mut r = a.clone();
    if let Some(path) = &a.config {
        let shown = path.display();
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::new(format!("--config {shown}: {e}")))?;
        let f: ConfigFile =
            toml::from_str(&text).map_err(|e| CliError::new(format!("{shown}: {e}")))?;
        let res = f
            .resource
            .iter()
            .find(|x| x.name == a.resource)
            .ok_or_else(|| {
                let names: Vec<&str> = f.resource.iter().map(|x| x.name.as_str()).collect();
                CliError::new(format!(
                    "{shown} defines no resource {:?} (it has: {})",
                    a.resource,
                    names.join(", ")
                ))
            })?;
        let me = a
            .node
            .clone()
            .unwrap_or_else(cairn_cluster::owner::host_name);
        let mine = res.node.iter().find(|n| n.name == me).ok_or_else(|| {
            let names: Vec<&str> = res.node.iter().map(|n| n.name.as_str()).collect();
            CliError::new(format!(
                "resource {} in {shown} has no node {me:?} (its nodes: {}); pass --node NAME",
                res.name,
                names.join(", ")
            ))
        })?;
        if !a.peers.is_empty() {
            return Err(CliError::new(format!(
                "--peer and --config: {shown} lists the peers; drop one"
            )));
        }
        r.node = Some(me.clone());
        if r.disk.is_none() {
            r.disk = mine.disk.clone().or_else(|| res.disk.clone());
        }
        if r.meta_disk.is_none() {
            r.meta_disk = mine.meta_disk.clone().or_else(|| res.meta_disk.clone());
        }
        if r.listen.is_none() {
            let addr = mine.address.parse().map_err(|e| {
                CliError::new(format!(
                    "{shown}: node {}'s address {:?}: {e} (expected IP:PORT)",
                    mine.name, mine.address
                ))
            })?;
            r.listen = Some(Listen::Tcp(addr));
        }
        let (scheme, query) = match &res.tls_psk {
            Some(psk) => {
                r.tls.tls_psk = Some(psk.clone());
                (
                    "nbds",
                    format!(
                        "?tls-psk-file={}&tls-username={}",
                        psk.display(),
                        res.tls_username.as_deref().unwrap_or("cairn")
                    ),
                )
            }
            None => ("nbd", String::new()),
        };
        r.peers = res
            .node
            .iter()
            .filter(|n| n.name != me)
            .map(|n| format!("{}={scheme}://{}/{}{query}", n.name, n.address, res.name))
            .collect();
        let bad = |what: &str, e: String| CliError::new(format!("{shown}: {what}: {e}"));
        if let Some(v) = &res.protocol {
            r.protocol = v.parse().map_err(|e| bad("protocol", e))?;
        }
        if let Some(v) = &res.split_brain {
            r.split_brain = v.parse().map_err(|e| bad("split_brain", e))?;
        }
        if let Some(v) = &res.on_lease_loss {
            r.on_lease_loss = v.parse().map_err(|e| bad("on_lease_loss", e))?;
        }
        if let Some(v) = &res.on_io_error {
            r.on_io_error = v.parse().map_err(|e| bad("on_io_error", e))?;
        }
        if let Some(v) = &res.on_no_data {
            r.on_no_data = v.parse().map_err(|e| bad("on_no_data", e))?;
        }
        r.tls.insecure_no_tls |= res.insecure_no_tls.unwrap_or(false);
        r.resync_rate = res.resync_rate.unwrap_or(r.resync_rate);
        if res.resync_min_rate == Some(0) {
            return Err(bad(
                "resync_min_rate",
                "0: the resync needs at least 1 MiB/s to finish under load".into(),
            ));
        }
        r.resync_min_rate = res.resync_min_rate.unwrap_or(r.resync_min_rate);
        r.al_extents = res.al_extents.unwrap_or(r.al_extents);
        r.peer_timeout = res.peer_timeout.unwrap_or(r.peer_timeout);
        if let Some(e) = &res.etcd {
            r.etcd = match e {
                EtcdEndpoints::One(u) => vec![u.clone()],
                EtcdEndpoints::Many(l) => l.clone(),
            };
        }
        let t = &mut r.etcd_access;
        for (cli, file) in [
            (&mut t.etcd_cacert, &res.etcd_cacert),
            (&mut t.etcd_cert, &res.etcd_cert),
            (&mut t.etcd_key, &res.etcd_key),
        ] {
            if cli.is_none() {
                cli.clone_from(file);
            }
        }
        if t.etcd_user.is_none() && t.etcd_password_file.is_none() {
            t.etcd_user.clone_from(&res.etcd_user);
            t.etcd_password_file.clone_from(&res.etcd_password_file);
        }
        r.etcd_ttl = res.etcd_ttl.unwrap_or(r.etcd_ttl);
        r.auto_failover = res.auto_failover.unwrap_or(r.auto_failover);
    }
    r.etcd_access.check_used(&r.etcd)?;
    if r.disk.is_none() {
        return Err(CliError::new("--disk DISK is needed (or --config FILE)"));
    }
    if r.node.is_none() {
        return Err(CliError::new("--node NAME is needed (or --config FILE)"));
    }
    if r.peers.is_empty() {
        return Err(CliError::new(
            "at least one --peer NAME=URI is needed (or --config FILE)",
        ));
    }
    Ok(r)
}

fn up(a: &UpArgs, global: &Global) -> Result<()> {
    let a = &resolve_up(a)?;
    let disk_path = a.disk.clone().expect("checked by resolve_up");
    let node_name = a.node.clone().expect("checked by resolve_up");
    let peers = a
        .peers
        .iter()
        .map(|p| parse_peer(p, &a.tls))
        .collect::<Result<Vec<_>>>()?;
    let cfg = NodeConfig {
        resource: a.resource.clone(),
        node: node_name.clone(),
        peers,
        protocol: a.protocol,
        resync: cairn_repl::rate::RateLimits {
            min_bytes_per_sec: a.resync_min_rate.saturating_mul(1 << 20),
            max_bytes_per_sec: a.resync_rate.saturating_mul(1 << 20),
        },
        al_extents: a.al_extents.max(1),
        split_brain: a.split_brain,
        peer_timeout: Duration::from_secs(a.peer_timeout.max(1)),
        quorum: match a.etcd.is_empty() {
            false => Some(cairn_repl::quorum::Quorum {
                etcd: crate::fence::etcd_client(&a.etcd, &a.etcd_access)?,
                ttl: Duration::from_secs(a.etcd_ttl.max(1)),
                auto_failover: a.auto_failover,
                on_loss: a.on_lease_loss,
            }),
            true => None,
        },
        on_io_error: a.on_io_error,
        on_no_data: a.on_no_data,
    };
    let backing = open_backing(&disk_path, false, &a.resource)?;
    let disk = backing.dev.clone();
    let meta = match a.meta_disk.as_ref().filter(|m| !is_internal(m)) {
        None => cairn_repl::store::Store::open(disk.clone())
            .map_err(|e| CliError::new(format!("{}: {e}", disk_path.display())))?,
        Some(meta_path) => {
            check_distinct(&disk_path, meta_path)?;
            let meta_dev =
                cairn_stack::leaf::open(meta_path, false, false, Duration::from_secs(10))?;
            cairn_repl::store::Store::open_external(disk.as_ref(), meta_dev).map_err(|e| {
                CliError::new(format!(
                    "{} with metadata on {}: {e}",
                    disk_path.display(),
                    meta_path.display()
                ))
            })?
        }
    };
    let node = Node::open(cfg, disk, Box::new(meta))
        .map_err(|e| CliError::new(format!("{}: {e}", a.resource)))?;

    // The peer-facing server: the data area, fenced by the primary's epoch, and the
    // replication handshake.
    let peer_listen = a
        .listen
        .clone()
        .unwrap_or_else(|| Listen::Tcp("127.0.0.1:7789".parse().expect("literal address")));
    let tls = a.tls.server_tls()?;
    crate::serve::check_exposure(
        std::slice::from_ref(&peer_listen),
        tls.as_ref().is_some_and(ServerTls::required),
        a.tls.insecure_no_tls,
    )
    .map_err(CliError::new)?;
    crate::serve::check_tls_clients(std::slice::from_ref(&peer_listen), tls.as_ref())
        .map_err(CliError::new)?;
    let target = cairn_repl::target::Target::new(&node);
    let mut pcfg = ServerConfig::new(Vec::new());
    pcfg.allow_empty = true;
    pcfg.fence = Some(Arc::new(target.clone()));
    pcfg.keepalive = Some(cairn_repl::node::PEER_KEEPALIVE);
    pcfg.extension = Some(Arc::new(target));
    pcfg.tls.clone_from(&tls);
    let peer_server = Server::new(pcfg).map_err(|e| CliError::new(e.to_string()))?;
    if let Listen::Unix(p) = &peer_listen {
        listen::prepare_socket_path(p)?;
    }
    let peer_listeners = peer_server
        .bind(std::slice::from_ref(&peer_listen))
        .map_err(|e| listen::bind_error(&e, std::slice::from_ref(&peer_listen)))?;

    // The client-facing server: empty until this node is primary.
    let client_listens = if a.client_listen.is_empty() {
        vec![Listen::Unix(
            listen::runtime_dir().join(format!("repl-{}.nbd", a.resource)),
        )]
    } else {
        a.client_listen.clone()
    };
    crate::serve::check_exposure(&client_listens, false, a.tls.insecure_no_tls)
        .map_err(CliError::new)?;
    for l in &client_listens {
        if let Listen::Unix(p) = l {
            listen::prepare_socket_path(p)?;
        }
    }
    let mut ccfg = ServerConfig::new(Vec::new());
    ccfg.allow_empty = true;
    let client_server = Server::new(ccfg).map_err(|e| CliError::new(e.to_string()))?;
    let client_listeners = client_server
        .bind(&client_listens)
        .map_err(|e| listen::bind_error(&e, &client_listens))?;
    node.attach(Exports {
        clients: client_server.exports_handle(),
        peers: peer_server.exports_handle(),
    })
    .map_err(CliError::new)?;
    node.start_failover_watch();
    let _metrics_file = match &a.metrics {
        Some(addr) => Some(serve_metrics(&node, addr)?),
        None => None,
    };

    let control = control_path(&a.resource, a.control.as_ref());
    listen::prepare_socket_path(&control)?;
    if control.exists() {
        if listen::unix_in_use(&control) {
            return Err(CliError::new(format!(
                "{} is in use: resource {} already runs here",
                control.display(),
                a.resource
            )));
        }
        // Left by a process that was killed: nobody answers on it.
        let _ = std::fs::remove_file(&control);
    }
    let ctl_listener = UnixListener::bind(&control)
        .map_err(|e| CliError::new(format!("cannot listen on {}: {e}", control.display())))?;
    let _ctl_cleanup = RemoveOnDrop(control.clone());
    // Whoever reaches the socket can promote, demote and stop the resource: owner only,
    // as `cairn serve`'s control socket.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&control, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| CliError::new(format!("cannot restrict {}: {e}", control.display())))?;
    }

    let peer_addr = peer_listeners.addresses();
    let client_addr = client_listeners.addresses();
    let peer_stop = peer_server.shutdown_handle();
    let client_stop = client_server.shutdown_handle();
    let peer_thread = thread::Builder::new()
        .name("repl-peers".into())
        .spawn(move || peer_server.serve(peer_listeners))
        .map_err(|e| CliError::new(e.to_string()))?;
    let client_thread = thread::Builder::new()
        .name("repl-clients".into())
        .spawn(move || client_server.serve(client_listeners))
        .map_err(|e| CliError::new(e.to_string()))?;

    let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
    // Disks `attach --disk` opened: kept open (and their stacks closed) with the node's.
    let attached: Arc<Mutex<Vec<Backing>>> = Arc::default();
    {
        let node = node.clone();
        let attached = attached.clone();
        let stop_tx = stop_tx.clone();
        thread::Builder::new()
            .name("repl-control".into())
            .spawn(move || {
                // A thread per request: a client that stops sending or reading holds its
                // own thread (10 s at most), never the next operator's command.
                for conn in ctl_listener.incoming().flatten() {
                    let (node, stop_tx, attached) =
                        (node.clone(), stop_tx.clone(), attached.clone());
                    let _ = thread::Builder::new()
                        .name("repl-ctl".into())
                        .spawn(move || {
                            if serve_control(&node, conn, &attached) {
                                let _ = stop_tx.send(());
                            }
                        });
                }
            })
            .map_err(|e| CliError::new(e.to_string()))?;
    }
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP])
        .map_err(|e| CliError::new(format!("cannot install signal handlers: {e}")))?;
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if signals.forever().next().is_some() {
                let _ = stop_tx.send(());
            }
        })
        .map_err(|e| CliError::new(e.to_string()))?;

    let announce = json!({
        "resource": a.resource, "node": node_name,
        "peers_listen": peer_addr.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "clients_listen": client_addr.iter().map(ToString::to_string).collect::<Vec<_>>(),
        "client_uri": client_addr.first().map(|l| l.uri(&a.resource)),
        "control": control,
    });
    if global.json {
        println!("{announce}");
    } else {
        println!(
            "cairn repl: {} on node {} (secondary); peers reach it at {}; clients at {} while primary; control {}",
            a.resource,
            node_name,
            peer_addr.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "),
            client_addr.first().map(|l| l.uri(&a.resource)).unwrap_or_default(),
            control.display()
        );
    }
    let _ = std::io::stdout().flush();
    if a.primary {
        match node.promote(a.force) {
            Ok(m) => tracing::info!("{m}"),
            Err(e) => eprintln!("cairn: cannot become primary: {e}"),
        }
    }
    let _ = stop_rx.recv();
    tracing::info!("{}: stopping", a.resource);
    let r = node.shutdown();
    client_stop.shutdown();
    peer_stop.shutdown();
    let _ = client_thread.join();
    let _ = peer_thread.join();
    drop(std::mem::take(
        &mut *attached.lock().unwrap_or_else(|p| p.into_inner()),
    ));
    r.map_err(|e| {
        CliError::new(format!(
            "{}: the clean stop failed, so recent writes may not be everywhere: {e}",
            a.resource
        ))
    })
}

/// The `--metrics` listener; its socket file (if any) is removed when the value drops.
fn serve_metrics(node: &Arc<Node>, addr: &Listen) -> Result<Option<RemoveOnDrop>> {
    use cairn_engine::http::{self, Handler, Request, Response};
    let mut file = None;
    let l = match addr {
        Listen::Tcp(a) => http::bind_tcp(*a),
        Listen::Unix(p) => {
            listen::prepare_socket_path(p)?;
            file = Some(RemoveOnDrop(p.clone()));
            http::bind_unix(p, 0o600)
        }
    }
    .map_err(|e| CliError::new(format!("--metrics {addr}: cannot listen: {e}")))?;
    let weak = Arc::downgrade(node);
    let h: Handler = Arc::new(move |r: &Request| match (r.path.as_str(), weak.upgrade()) {
        ("/metrics", Some(n)) if r.method == "GET" => Response::text(
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            cairn_repl::metrics::prometheus(&n.status()),
        ),
        ("/metrics", Some(_)) => Response::method_not_allowed(&r.method, &r.path, &["GET"]),
        ("/metrics", None) => Response::error(503, "the resource is stopping"),
        _ => Response::error(404, format!("no such route: {}; use GET /metrics", r.path)),
    });
    http::spawn(l, "repl-metrics", h)
        .map_err(|e| CliError::new(format!("cannot start the metrics thread: {e}")))?;
    Ok(file)
}

struct RemoveOnDrop(PathBuf);
impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// `attach [--disk PATH [--meta-disk META]]`: the new disk is opened here, in the node's
/// process, as `up` opens its disk.
fn attach(
    node: &Arc<Node>,
    req: &Value,
    attached: &Mutex<Vec<Backing>>,
) -> std::result::Result<String, String> {
    let Some(path) = req.get("disk").and_then(Value::as_str).map(PathBuf::from) else {
        return node.attach_disk(None);
    };
    let resource = node.config().resource.clone();
    let backing = open_backing(&path, false, &resource).map_err(|e| e.to_string())?;
    let meta_path = req
        .get("meta_disk")
        .and_then(Value::as_str)
        .map(PathBuf::from)
        .filter(|m| !is_internal(m));
    let meta = match &meta_path {
        None => cairn_repl::store::Store::open(backing.dev.clone())
            .map_err(|e| format!("{}: {e}", path.display()))?,
        Some(m) => {
            check_distinct(&path, m).map_err(|e| e.to_string())?;
            let dev = cairn_stack::leaf::open(m, false, false, Duration::from_secs(10))
                .map_err(|e| e.to_string())?;
            cairn_repl::store::Store::open_external(backing.dev.as_ref(), dev)
                .map_err(|e| format!("{} with metadata on {}: {e}", path.display(), m.display()))?
        }
    };
    let m = node.attach_disk(Some((backing.dev.clone(), Box::new(meta))))?;
    attached
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(backing);
    Ok(m)
}

/// One control request and its answer; true when it asked the node to go down.
fn serve_control(node: &Arc<Node>, conn: UnixStream, attached: &Mutex<Vec<Backing>>) -> bool {
    // A client that stops sending or reading is dropped after 10 s.
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(10)));
    let mut line = String::new();
    let Ok(writer) = conn.try_clone() else {
        return false;
    };
    let mut reader = BufReader::new(conn.take(64 << 10));
    if reader.read_line(&mut line).is_err() {
        return false;
    }
    let mut down = false;
    let answer = match serde_json::from_str::<Value>(&line) {
        Err(e) => json!({"ok": false, "error": format!("malformed request: {e}")}),
        Ok(req) => {
            let peer = req.get("peer").and_then(Value::as_str);
            let flag = |k: &str| req.get(k).and_then(Value::as_bool).unwrap_or(false);
            let r = match req.get("cmd").and_then(Value::as_str).unwrap_or("") {
                "status" => Ok(String::new()),
                "primary" => node.promote(flag("force")),
                "secondary" => node.demote(),
                "connect" => node.set_connect(peer, true, flag("discard_my_data")),
                "disconnect" => node.set_connect(peer, false, false),
                "verify" => node.verify(peer, flag("resync")),
                "invalidate" => node.invalidate(),
                "detach" => node.detach(),
                "attach" => attach(node, &req, attached),
                "down" => {
                    down = true;
                    Ok("stopping".into())
                }
                other => Err(format!("unknown command {other:?}")),
            };
            match r {
                Ok(m) => json!({"ok": true, "message": m, "status": node.status()}),
                Err(e) => json!({"ok": false, "error": e, "status": node.status()}),
            }
        }
    };
    let mut w = writer;
    let _ = w.write_all(format!("{answer}\n").as_bytes());
    down
}

/// How long a command may take to answer: `secondary` and `down` flush every replica.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

fn call(path: &Path, req: &Value) -> Result<Value> {
    control::call(path, req, CALL_TIMEOUT).map_err(|e| CliError::new(e.to_string()))
}

fn ctl(a: &CtlArgs, req: Value, global: &Global) -> Result<()> {
    let path = control_path(&a.resource, a.control.as_ref());
    let v = call(&path, &req)?;
    if global.json {
        println!("{v}");
    }
    if v.get("ok").and_then(Value::as_bool) == Some(true) {
        if !global.json {
            if let Some(m) = v.get("message").and_then(Value::as_str) {
                println!("{m}");
            }
        }
        Ok(())
    } else {
        Err(CliError::new(
            v.get("error")
                .and_then(Value::as_str)
                .unwrap_or("the resource refused")
                .to_string(),
        ))
    }
}

/// `verify`: started through the control socket; with --wait, the status is polled until
/// every run is done.
fn verify(a: &VerifyArgs, global: &Global) -> Result<()> {
    let ctl_args = &a.peer.ctl;
    let req = json!({"cmd": "verify", "peer": a.peer.peer, "resync": a.resync});
    if !a.wait {
        return ctl(ctl_args, req, global);
    }
    let path = control_path(&ctl_args.resource, ctl_args.control.as_ref());
    let v = call(&path, &req)?;
    if v.get("ok").and_then(Value::as_bool) != Some(true) {
        return Err(CliError::new(
            v.get("error")
                .and_then(Value::as_str)
                .unwrap_or("the resource refused")
                .to_string(),
        ));
    }
    let status = loop {
        thread::sleep(Duration::from_millis(200));
        let v = call(&path, &json!({"cmd": "status"}))?;
        let s: Status = serde_json::from_value(v.get("status").cloned().unwrap_or(Value::Null))
            .map_err(|e| CliError::new(format!("malformed status: {e}")))?;
        if !s
            .peers
            .iter()
            .any(|p| p.verify.as_ref().is_some_and(|r| r.running))
        {
            break s;
        }
    };
    let mut failed = Vec::new();
    let chosen = status
        .peers
        .iter()
        .filter(|p| a.peer.peer.as_ref().is_none_or(|n| *n == p.name));
    if global.json {
        let runs: Vec<Value> = chosen
            .clone()
            .map(|p| json!({"peer": p.name, "verify": p.verify}))
            .collect();
        println!("{}", json!({"ok": true, "verify": runs}));
    }
    for p in chosen {
        let Some(r) = &p.verify else { continue };
        if let Some(e) = &r.error {
            failed.push(format!("verify against {}: {e}", p.name));
        } else if !global.json {
            println!(
                "verify against {}: {} blocks checked in {:.2} s, {} out of sync",
                p.name, r.blocks_checked, r.secs, r.out_of_sync_blocks
            );
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(CliError::new(failed.join("; ")))
    }
}

/// The control sockets of the resources running on this host (RUNDIR/repl-*.sock).
pub fn local_sockets() -> Vec<PathBuf> {
    control::local_sockets(&listen::runtime_dir())
}

/// The status of each resource behind `paths` (JSON as the control socket gives it).
pub fn statuses(paths: &[PathBuf]) -> Result<Vec<Value>> {
    control::statuses(paths, CALL_TIMEOUT).map_err(|e| CliError::new(e.to_string()))
}

/// Text for statuses as [`statuses`] returns them.
pub fn render_all(all: &[Value]) -> Result<String> {
    let mut o = String::new();
    for s in all {
        let s: Status = serde_json::from_value(s.clone())
            .map_err(|e| CliError::new(format!("malformed status: {e}")))?;
        o.push_str(&render(&s));
    }
    Ok(o)
}

fn status(a: &StatusArgs, global: &Global) -> Result<()> {
    let paths: Vec<PathBuf> = match &a.resource {
        Some(r) => vec![control_path(r, a.control.as_ref())],
        None => {
            let v = local_sockets();
            if v.is_empty() {
                return Err(CliError::new(format!(
                    "no replicated resource runs here (no repl-*.sock in {})",
                    listen::runtime_dir().display()
                )));
            }
            v
        }
    };
    let all = statuses(&paths)?;
    if global.json {
        println!(
            "{}",
            if a.resource.is_some() {
                all[0].clone()
            } else {
                Value::Array(all)
            }
        );
        return Ok(());
    }
    print!("{}", render_all(&all)?);
    Ok(())
}

/// /proc/drbd's facts, readable.
pub fn render(s: &Status) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let _ = writeln!(
        o,
        "{} on {}: {:?}, disk {}, {} of data, fencing epoch {}{}",
        s.resource,
        s.node,
        s.role,
        s.disk,
        human(s.data_size),
        s.epoch,
        if s.crashed_primary {
            " (crashed as primary: its activity log resyncs)"
        } else {
            ""
        }
    );
    if let Some(q) = &s.quorum {
        let _ = writeln!(o, "  etcd: {q}");
    }
    if let Some(why) = &s.io_suspended {
        let _ = writeln!(o, "  I/O suspended: {why}");
    }
    for p in &s.peers {
        let _ = writeln!(
            o,
            "  peer {} ({}): {:?}, {:?}, out of sync {}{}",
            p.name,
            p.address,
            p.connection,
            p.replication,
            human(p.out_of_sync_bytes),
            p.peer_changes
                .filter(|c| *c > 0)
                .map(|c| format!(", its own changes {}", human(c)))
                .unwrap_or_default()
        );
        if let Some(r) = &p.resync {
            let pct = if r.total_bytes == 0 {
                100.0
            } else {
                r.done_bytes as f64 * 100.0 / r.total_bytes as f64
            };
            let width = 30usize;
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let fill = ((pct / 100.0) * width as f64) as usize;
            let _ = writeln!(
                o,
                "    {} resync [{}{}] {pct:.1}%  {}/s  {}  ({})",
                if r.full { "full" } else { "bitmap" },
                "#".repeat(fill.min(width)),
                "-".repeat(width - fill.min(width)),
                human(r.bytes_per_sec),
                r.eta_secs
                    .map(|e| format!("finish in {}:{:02}", e / 60, e % 60))
                    .unwrap_or_else(|| "finish time unknown".into()),
                render_target(r.target_bytes_per_sec, r.throttled)
            );
        }
        if let Some(v) = &p.verify {
            let _ = writeln!(o, "    {}", render_verify(v));
        }
        if let Some(e) = &p.last_error {
            let _ = writeln!(o, "    last error: {e}");
        }
    }
    for e in s.events.iter().rev().take(5).rev() {
        let _ = writeln!(o, "  event {}: {}", e.kind, e.message);
    }
    o
}

fn render_verify(v: &cairn_repl::node::VerifyStatus) -> String {
    if v.running {
        #[allow(clippy::cast_precision_loss)]
        let pct = if v.total_bytes == 0 {
            100.0
        } else {
            v.done_bytes as f64 * 100.0 / v.total_bytes as f64
        };
        return format!(
            "verify {pct:.1}% ({} of {})  {}/s  {}  {} out of sync so far  ({})",
            human(v.done_bytes),
            human(v.total_bytes),
            human(v.bytes_per_sec),
            v.eta_secs
                .map(|e| format!("finish in {}:{:02}", e / 60, e % 60))
                .unwrap_or_else(|| "finish time unknown".into()),
            v.out_of_sync_blocks,
            render_target(v.target_bytes_per_sec, v.throttled)
        );
    }
    match &v.error {
        Some(e) => format!(
            "last verify stopped after {} of {}: {e} ({} out of sync found)",
            human(v.done_bytes),
            human(v.total_bytes),
            v.out_of_sync_blocks
        ),
        None => format!(
            "last verify: {} blocks checked in {:.2} s, {} out of sync",
            v.blocks_checked, v.secs, v.out_of_sync_blocks
        ),
    }
}

/// The rate controller's target, as the resync and verify lines show it.
fn render_target(target: Option<u64>, throttled: bool) -> String {
    match (target, throttled) {
        (Some(t), true) => format!("held at {}/s: application I/O", human(t)),
        (Some(t), false) => format!("rate limit {}/s", human(t)),
        (None, _) => "no rate limit".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(resync: Value) -> Status {
        serde_json::from_value(json!({
            "resource": "home", "node": "a", "role": "Primary", "disk": "UpToDate",
            "data_size": 1u64 << 30, "epoch": 1,
            "generations": {"current": 1, "bitmap": 0, "history": [0, 0]},
            "crashed_primary": false, "quorum": null,
            "peers": [{"name": "b", "address": "tcp:10.0.0.2:7789", "connection": "Connected",
                       "replication": "SyncSource", "out_of_sync_bytes": 1u64 << 29,
                       "peer_changes": null, "resync": resync, "last_error": null, "since": 0}],
            "events": []
        }))
        .unwrap()
    }

    #[test]
    fn etcd_in_a_config_file_is_one_string_or_a_list() {
        let etcd = |v: &str| {
            let f: ConfigFile = toml::from_str(&format!(
                "[[resource]]\nname = \"home\"\nnode = []\netcd = {v}\n"
            ))
            .unwrap();
            match f.resource[0].etcd.clone().unwrap() {
                EtcdEndpoints::One(u) => vec![u],
                EtcdEndpoints::Many(l) => l,
            }
        };
        assert_eq!(
            etcd(r#""http://a:2379,http://b:2379""#),
            ["http://a:2379,http://b:2379"]
        );
        assert_eq!(
            etcd(r#"["http://a:2379", "http://b:2379"]"#),
            ["http://a:2379", "http://b:2379"]
        );
        assert!(toml::from_str::<ConfigFile>(
            "[[resource]]\nname = \"home\"\nnode = []\netcd = 5\n"
        )
        .is_err());
    }

    #[test]
    fn etcd_access_in_a_config_file() {
        let dir = std::env::temp_dir().join(format!("cairn-repl-etcd-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Removed when the test ends, whether it passed or not.
        struct Rm(PathBuf);
        impl Drop for Rm {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
        let _rm = Rm(dir.clone());
        let file = dir.join("r.toml");
        let write = |extra: &str| {
            std::fs::write(
                &file,
                format!(
                    "[[resource]]\nname = \"home\"\ndisk = \"/dev/null\"\n{extra}\
                     [[resource.node]]\nname = \"a\"\naddress = \"127.0.0.1:7789\"\n\
                     [[resource.node]]\nname = \"b\"\naddress = \"127.0.0.2:7789\"\n"
                ),
            )
            .unwrap();
        };
        let args = |extra: &[&str]| {
            let mut a = vec!["cairn", "repl", "up", "home", "--node", "a", "--config"];
            a.push(file.to_str().unwrap());
            a.extend(extra);
            let crate::args::Command::Repl(ReplCommand::Up(u)) =
                <crate::args::Cli as clap::Parser>::try_parse_from(a)
                    .unwrap()
                    .command
            else {
                panic!("not repl up")
            };
            resolve_up(&u)
        };
        write(
            "etcd = \"https://e:2379\"\netcd_cacert = \"/ca.pem\"\n\
             etcd_cert = \"/c.pem\"\netcd_key = \"/k.pem\"\n",
        );
        let r = args(&[]).unwrap();
        assert_eq!(r.etcd_access.etcd_cacert, Some(PathBuf::from("/ca.pem")));
        assert_eq!(r.etcd_access.etcd_cert, Some(PathBuf::from("/c.pem")));
        assert_eq!(r.etcd_access.etcd_key, Some(PathBuf::from("/k.pem")));
        // The command line wins.
        let r = args(&["--etcd-cacert", "/other.pem"]).unwrap();
        assert_eq!(r.etcd_access.etcd_cacert, Some(PathBuf::from("/other.pem")));
        // A user and its password file, from the file too.
        write(
            "etcd = \"http://e:2379\"\netcd_user = \"cairn\"\n\
             etcd_password_file = \"/etc/cairn/etcd.pw\"\n",
        );
        let r = args(&[]).unwrap();
        assert_eq!(r.etcd_access.etcd_user.as_deref(), Some("cairn"));
        assert_eq!(
            r.etcd_access.etcd_password_file,
            Some(PathBuf::from("/etc/cairn/etcd.pw"))
        );
        // TLS files with no etcd to use them on.
        write("etcd_cacert = \"/ca.pem\"\n");
        let err = args(&[]).unwrap_err();
        assert!(err.to_string().contains("give --etcd"), "{err}");
        // The I/O error policy: detach by default, pass-on from the file, a typo refused.
        write("");
        assert_eq!(args(&[]).unwrap().on_io_error, OnIoError::Detach);
        write("on_io_error = \"pass-on\"\n");
        assert_eq!(args(&[]).unwrap().on_io_error, OnIoError::PassOn);
        // Requests without data: io-error by default, suspend-io from the file.
        assert_eq!(args(&[]).unwrap().on_no_data, OnNoData::IoError);
        write("on_no_data = \"suspend-io\"\n");
        assert_eq!(args(&[]).unwrap().on_no_data, OnNoData::SuspendIo);
        write("on_io_error = \"detatch\"\n");
        let err = args(&[]).unwrap_err();
        assert!(err.to_string().contains("on_io_error"), "{err}");
        write("on_no_data = \"suspend\"\n");
        let err = args(&[]).unwrap_err();
        assert!(err.to_string().contains("on_no_data"), "{err}");
    }

    #[test]
    fn the_resync_line_shows_the_rate_controller() {
        let r = json!({"total_bytes": 1u64 << 30, "done_bytes": 1u64 << 29,
                       "bytes_per_sec": 1u64 << 25, "eta_secs": 16, "full": true,
                       "target_bytes_per_sec": 1u64 << 25, "throttled": true});
        let text = render(&status(r));
        assert!(
            text.contains("finish in 0:16  (held at 32 MiB/s: application I/O)"),
            "{text}"
        );
        // A status from a node without the controller (no such fields) still reads.
        let old = json!({"total_bytes": 1u64 << 30, "done_bytes": 1u64 << 29,
                         "bytes_per_sec": 1u64 << 25, "eta_secs": 16, "full": true});
        let s = status(old);
        assert_eq!(s.resync_limits, cairn_repl::rate::RateLimits::default());
        assert!(render(&s).contains("(no rate limit)"));
        assert_eq!(
            render_target(Some(200 << 20), false),
            "rate limit 200 MiB/s"
        );
    }
}
