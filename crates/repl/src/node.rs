//! One replicated resource on one node: its role, its peers, the replicated data path
//! (as primary) and the answers to a primary (as secondary).
//!
//! ```text
//!   Node ── role: Secondary ─> peer-facing NBD export of the data area (target.rs answers
//!        │                     the handshake; the fence gate admits the newest primary)
//!        └─ role: Primary ───> Volume (the client-facing export): every write goes to the
//!                              local disk and to each connected peer at once and is
//!                              answered when all are done (protocol C); a peer that is
//!                              not connected gets bits in its bitmap instead; one thread
//!                              per peer connects, decides the sync direction (gen.rs)
//!                              and resyncs
//! ```
//!
//! The persisted state (generations, flags, fencing epoch, peer slots) has one owner, the
//! `p` mutex; it is written through [`MetaIo`] (store.rs) every time it changes, before
//! anything that depends on it happens.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

use cairn_block::{
    BlockDevice, Capabilities, Error, ErrorKind, Geometry, Result, Support, WriteDone, WriteFlags,
};
use cairn_nbd::client::{Client, ClientOptions, Handshake};
use cairn_nbd::fence::{FenceToken, OwnerId};
use cairn_nbd::proto::REP_ACK;
use cairn_nbd::ExportsHandle;
use serde::{Deserialize, Serialize};

use crate::al::{ActivityLog, Transaction};
use crate::bitmap::Bitmap;
use crate::gen::{self, Decision, Generations, NodeView, JUST_CREATED};
use crate::quorum::{self, OnLoss, Quorum};
use crate::ranges::{OwnedRangeGuard, RangeLocks};
use crate::rate::{Pacer, RateLimits, Speed};
use crate::wire::{self, Hello, Request, Welcome, OPT_CAIRN_REPL};
use cairn_cluster::{Etcd, Lease, LeaseError, LeaseGuard};
use cairn_nbd::client::Detached;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};

// Online verify and invalidate live in their own file, as a child module so they reach
// the node's fields as resync does.
#[path = "detach.rs"]
mod detach;
#[path = "pull.rs"]
mod pull;
#[path = "secondary.rs"]
mod secondary;
#[path = "sync.rs"]
mod sync;
#[path = "verify.rs"]
mod verify;
pub use detach::NewDisk;
pub use secondary::PEER_KEEPALIVE;
pub use verify::{block_digests, VerifyStatus};

/// What the node keeps in its metadata superblock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Persisted {
    pub current: u64,
    pub history: [u64; 2],
    /// The data is a whole generation (false while a resync to this node runs).
    pub consistent: bool,
    /// Set while primary: found set at start, the node crashed as primary.
    pub primary: bool,
    /// The node crashed as primary and has not resynced since: its activity log's
    /// extents may differ from its peers'.
    pub crashed_primary: bool,
    /// The highest fencing epoch this node knows (its own as primary, or a primary's).
    pub epoch: u64,
    /// The primary admitted on this node's peer link last (or this node as primary).
    pub fence: Option<FenceToken>,
    /// One slot per configured peer, in the order of the configuration.
    pub peers: Vec<Slot>,
}

#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Slot {
    /// The peer's node name ("" for a slot never used).
    pub name: String,
    /// Generation the bitmap towards this peer started from (0: none).
    pub bitmap_uuid: u64,
}

/// Where the node's metadata lives (store.rs implements it over meta.rs).
pub trait MetaIo: Send + Sync + fmt::Debug {
    fn data_size(&self) -> u64;
    fn bm_block(&self) -> u64;
    fn al_extent(&self) -> u64;
    fn max_peers(&self) -> usize;
    /// Ties the metadata to the resource `id` ([`resource_id`]): metadata of no resource
    /// yet takes it (recorded by the next save), another resource's is refused.
    fn bind_resource(&self, _id: [u8; 16]) -> Result<()> {
        Ok(())
    }
    fn load(&self) -> Result<Persisted>;
    /// Durable when it returns.
    fn save(&self, p: &Persisted) -> Result<()>;
    fn read_bitmap(&self, slot: usize) -> Result<Vec<u64>>;
    /// Writes whole 4 KiB pages (page index, its words); durable when it returns.
    fn write_bitmap_pages(&self, slot: usize, pages: &[(usize, Vec<u64>)]) -> Result<()>;
    /// The active extents.
    fn read_al(&self) -> Result<Vec<u64>>;
    /// Replaces the active extents; durable when it returns.
    fn write_al(&self, active: &[u64]) -> Result<()>;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Protocol {
    /// Asynchronous: a write is answered when the local disk has it and the peer's copy
    /// is on its way. The risk: writes acknowledged (flushed or not) in the last moments
    /// before the primary dies may be missing on the peer that takes over.
    A,
    /// Synchronous: a write is answered when the local disk and every connected peer
    /// have it (durably, for FUA writes and flushes).
    C,
}

impl std::str::FromStr for Protocol {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "C" | "c" => Ok(Protocol::C),
            "A" | "a" => Ok(Protocol::A),
            _ => Err(format!(
                "{s:?}: expected C (synchronous) or A (asynchronous)"
            )),
        }
    }
}

/// A protocol-A write whose peers have not answered yet: the completion thread waits for
/// them, then gives back the activity-log count and the range.
struct AsyncJob {
    offset: u64,
    len: u64,
    peers: Vec<(Arc<Peer>, Arc<Client>, Detached)>,
    _range: OwnedRangeGuard,
}

/// Protocol-A writes waiting for their peers at most: beyond it, writers wait, so a slow
/// peer holds a bounded backlog.
const ASYNC_BACKLOG: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SplitBrainPolicy {
    /// Stay disconnected; the operator decides (`connect --discard-my-data`).
    Disconnect,
    /// The side that changed nothing since the split takes the other's data.
    DiscardZeroChanges,
    /// The side with fewer changed blocks takes the other's data.
    DiscardLeastChanges,
    /// The secondary takes the primary's data.
    DiscardSecondary,
}

impl std::str::FromStr for SplitBrainPolicy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Ok(match s {
            "disconnect" => SplitBrainPolicy::Disconnect,
            "discard-zero-changes" => SplitBrainPolicy::DiscardZeroChanges,
            "discard-least-changes" => SplitBrainPolicy::DiscardLeastChanges,
            "discard-secondary" => SplitBrainPolicy::DiscardSecondary,
            _ => {
                return Err(format!(
                    "{s:?}: expected disconnect, discard-zero-changes, discard-least-changes or discard-secondary"
                ))
            }
        })
    }
}

/// What a node does when its own disk fails a read, a write or a flush (DRBD's
/// `on-io-error`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnIoError {
    /// Drop the disk and go on diskless: a primary serves reads and writes through an
    /// up-to-date peer, a secondary refuses its primary until a disk is attached again.
    Detach,
    /// Hand the error on (to the application, or to the primary), keeping the disk.
    PassOn,
}

impl std::str::FromStr for OnIoError {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "detach" => Ok(OnIoError::Detach),
            "pass-on" => Ok(OnIoError::PassOn),
            _ => Err(format!("{s:?}: expected detach or pass-on")),
        }
    }
}

/// What a diskless primary does with a request no up-to-date replica can serve (DRBD's
/// `on-no-data-accessible`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum OnNoData {
    /// Fail it.
    IoError,
    /// Hold it, unanswered, until an up-to-date peer is connected again (then it goes
    /// on), or the node stops being primary (then it fails).
    SuspendIo,
}

impl std::str::FromStr for OnNoData {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "io-error" => Ok(OnNoData::IoError),
            "suspend-io" => Ok(OnNoData::SuspendIo),
            _ => Err(format!("{s:?}: expected io-error or suspend-io")),
        }
    }
}

/// The local disk's health, apart from what its data holds (`Status::disk`).
const DISK_ATTACHED: u8 = 0;
/// It failed an I/O; the node is detaching it.
const DISK_FAILED: u8 = 1;
/// No disk: every read and write goes to a peer (primary) or is refused (secondary).
const DISK_DISKLESS: u8 = 2;

#[derive(Clone, Debug)]
pub struct PeerConfig {
    /// The peer's node name, as it calls itself (`--node` there).
    pub name: String,
    /// Its replication listener and the resource's export there (and TLS).
    pub opts: ClientOptions,
}

#[derive(Clone, Debug)]
pub struct NodeConfig {
    pub resource: String,
    /// This node's name.
    pub node: String,
    pub peers: Vec<PeerConfig>,
    pub protocol: Protocol,
    /// How fast resync and online verify copy and compare: the maximum while the
    /// application is idle, the minimum while it does I/O (rate.rs).
    pub resync: RateLimits,
    /// Extents the activity log holds.
    pub al_extents: usize,
    pub split_brain: SplitBrainPolicy,
    /// How long a peer may take to answer before it is dropped.
    pub peer_timeout: Duration,
    /// The primary role as an etcd lease, outdated replicas recorded there, and
    /// automatic failover (quorum.rs); `None`: manual promotion only.
    pub quorum: Option<Quorum>,
    /// What a failed I/O on the local disk does.
    pub on_io_error: OnIoError,
    /// What a diskless primary does with a request no up-to-date peer can serve.
    pub on_no_data: OnNoData,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Primary,
    Secondary,
}

/// The connection to one peer, as the status shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Conn {
    /// Not trying (secondary waiting for a primary, or stopped by the operator or by a
    /// refusal: split brain, unrelated data, a peer with newer data).
    StandAlone,
    /// Trying to reach the peer.
    Connecting,
    Connected,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Repl {
    Off,
    Established,
    SyncSource,
    SyncTarget,
    SplitBrain,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Progress {
    pub total_bytes: u64,
    pub done_bytes: u64,
    pub bytes_per_sec: u64,
    pub eta_secs: Option<u64>,
    pub full: bool,
    /// The rate the controller paces the resync to now (bytes/s); `None`: unlimited.
    #[serde(default)]
    pub target_bytes_per_sec: Option<u64>,
    /// Application I/O holds the resync at the minimum rate.
    #[serde(default)]
    pub throttled: bool,
}

#[derive(Debug)]
struct PeerState {
    conn: Conn,
    repl: Repl,
    last_error: Option<String>,
    /// The operator asked to connect (primary: keep trying; secondary: accept).
    want: bool,
    /// `connect --discard-my-data`: the next primary's data wins over ours.
    discard_my_data: bool,
    since: SystemTime,
    /// Bits set in the peer's bitmap towards us, as it said at the last handshake.
    peer_changes: Option<u64>,
    resync: Option<ResyncCounters>,
    /// This node was promoted after its primary vanished (unreached, or back as a crashed
    /// primary) while this peer was a secondary of that primary too: the old primary's
    /// last writes may have reached one of the two and not the other. Once connected, an
    /// online verify with `--resync` finds and copies those blocks. Cleared when that
    /// verify starts and set again if it stops early, so at every moment the verify is
    /// either owed or running until it has compared every block.
    verify_after_failover: Option<String>,
}

#[derive(Debug, Clone)]
struct ResyncCounters {
    total: u64,
    started: Instant,
    full: bool,
    pacer: Arc<Pacer>,
    /// Its speed over the last seconds, for `status`.
    speed: Arc<Speed>,
    /// Passes over the bitmap begun: one, and one more for each time a pass ended
    /// with blocks left (written behind its cursor, or a lease that came back).
    passes: u64,
}

/// One configured peer.
#[derive(Debug)]
pub struct Peer {
    cfg: PeerConfig,
    slot: usize,
    bitmap: Bitmap,
    link: RwLock<Option<Arc<Client>>>,
    st: Mutex<PeerState>,
    resync_done: AtomicU64,
    /// The primary recorded this peer as outdated in etcd (quorum.rs).
    outdated: AtomicBool,
    recording: Mutex<()>,
}

impl Peer {
    fn state(&self) -> std::sync::MutexGuard<'_, PeerState> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn link(&self) -> Option<Arc<Client>> {
        self.link.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The link for a write of `[offset, offset + len)`; without one, the write's bits
    /// are set in this peer's bitmap before the link's lock is released. A link set
    /// later (connect_peer, under the write lock) therefore finds in the bitmap every
    /// write that went without it, even one still writing locally, and its resync
    /// copies that block once the write's range is free. (Setting the bits after the
    /// local write let a resync that began meanwhile end without them: the peer was
    /// in sync by its state and lacked the write.)
    fn link_or_mark(&self, offset: u64, len: u64) -> Option<Arc<Client>> {
        let l = self.link.read().unwrap_or_else(|p| p.into_inner());
        if l.is_none() {
            self.bitmap.set_bytes(offset, len);
        }
        l.clone()
    }

    fn set(&self, conn: Conn, repl: Repl) {
        let mut s = self.state();
        if s.conn != conn || s.repl != repl {
            s.since = SystemTime::now();
        }
        s.conn = conn;
        s.repl = repl;
    }

    /// One request on a fresh handshake connection, abandoned after the answer.
    fn request(&self, req: &Request, timeout: Duration) -> std::result::Result<Vec<u8>, String> {
        let mut hs = Handshake::connect(&self.cfg.opts.addr, Some(timeout))
            .map_err(|e| format!("cannot reach {}: {e}", self.cfg.name))?;
        if let Some(tls) = &self.cfg.opts.tls {
            hs.starttls(tls)
                .map_err(|e| format!("TLS with {}: {e}", self.cfg.name))?;
        }
        let body = serde_json::to_vec(req).map_err(|e| e.to_string())?;
        let mut replies = hs
            .option(OPT_CAIRN_REPL, &body)
            .map_err(|e| format!("{}: {e}", self.cfg.name))?;
        let _ = hs.abort();
        let last = replies
            .pop()
            .ok_or_else(|| format!("{}: no answer to the replication handshake", self.cfg.name))?;
        if last.reply != REP_ACK {
            return Err(format!(
                "{} refused: {}",
                self.cfg.name,
                String::from_utf8_lossy(&last.data)
            ));
        }
        Ok(last.data)
    }
}

/// Something that happened, for `status` and the log.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Event {
    pub at: u64,
    pub kind: String,
    pub peer: Option<String>,
    pub message: String,
}

/// The node's view of itself and its peers.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Status {
    pub resource: String,
    pub node: String,
    pub role: Role,
    pub disk: String,
    pub data_size: u64,
    pub epoch: u64,
    pub generations: Generations,
    pub crashed_primary: bool,
    /// With a quorum: the primary lease ("held, 8.1 s left", "lost: I/O frozen"), or
    /// what a secondary does ("automatic failover on").
    pub quorum: Option<String>,
    /// `--resync-min-rate` and `--resync-rate`, in bytes per second.
    #[serde(default)]
    pub resync_limits: RateLimits,
    /// Requests are held (`--on-no-data suspend-io`): why.
    #[serde(default)]
    pub io_suspended: Option<String>,
    pub peers: Vec<PeerStatus>,
    pub events: Vec<Event>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PeerStatus {
    pub name: String,
    pub address: String,
    pub connection: Conn,
    pub replication: Repl,
    pub out_of_sync_bytes: u64,
    pub peer_changes: Option<u64>,
    pub resync: Option<Progress>,
    pub last_error: Option<String>,
    pub since: u64,
    /// The online verify against this peer: running, or the last one's result.
    #[serde(default)]
    pub verify: Option<VerifyStatus>,
}

impl NodeConfig {
    /// A configuration for tests: resource `resource`, this node `node`, one peer `peer`
    /// at an address nobody answers on, protocol C, no quorum.
    #[cfg(test)]
    pub(crate) fn for_tests(resource: &str, node: &str, peer: &str) -> NodeConfig {
        NodeConfig {
            resource: resource.into(),
            node: node.into(),
            peers: vec![PeerConfig {
                name: peer.into(),
                opts: ClientOptions::new(
                    cairn_nbd::Listen::Tcp("127.0.0.1:9".parse().expect("literal")),
                    resource,
                ),
            }],
            protocol: Protocol::C,
            resync: RateLimits::default(),
            al_extents: 4,
            split_brain: SplitBrainPolicy::Disconnect,
            peer_timeout: Duration::from_secs(1),
            quorum: None,
            on_io_error: OnIoError::Detach,
            on_no_data: OnNoData::IoError,
        }
    }
}

/// Where the node's two faces are served.
#[derive(Debug, Clone)]
pub struct Exports {
    /// The client-facing server: the volume is exported there while primary.
    pub clients: ExportsHandle,
    /// The peer-facing server: the data area is exported there while secondary.
    pub peers: ExportsHandle,
}

/// One replicated resource on this node.
pub struct Node {
    cfg: NodeConfig,
    uuid: [u8; 16],
    instance: u64,
    disk: Arc<dyn BlockDevice>,
    meta: Box<dyn MetaIo>,
    data_size: u64,
    p: Mutex<Persisted>,
    role: RwLock<Role>,
    al: ActivityLog,
    locks: Arc<RangeLocks>,
    peers: Vec<Arc<Peer>>,
    /// Protocol A: where writes hand their peers' answers to the completion thread.
    async_tx: Mutex<Option<SyncSender<AsyncJob>>>,
    events: Mutex<VecDeque<Event>>,
    /// Set to stop the peer threads of a primary (demotion, shutdown).
    stop_peers: AtomicBool,
    /// The lost primary lease was told (the event, once per loss, by whichever peer
    /// thread saw it first: sync.rs).
    lease_told: AtomicBool,
    threads: Mutex<Vec<JoinHandle<()>>>,
    exports: Mutex<Option<Exports>>,
    /// Serializes role changes and connect/disconnect.
    admin: Mutex<()>,
    /// The primary role's etcd lease, while primary with a quorum configured.
    lease: Mutex<Option<Lease>>,
    guard: RwLock<Option<LeaseGuard>>,
    /// Frozen requests give up (the node is being made secondary or stopped).
    halt: AtomicBool,
    /// Why this node stepped down by itself (another node holds the primary lease), for
    /// the requests that were frozen or still arrive: they fail with it.
    superseded: Mutex<Option<String>>,
    /// The node is shutting down for good.
    stopped: AtomicBool,
    /// Online verify runs and the invalidation mark (verify.rs).
    vx: verify::Shared,
    /// Application reads and writes so far: the rate controller (rate.rs) slows resync
    /// and verify to their minimum while it moves.
    app_io: AtomicU64,
    /// As secondary: the node whose `SyncStart` came last (secondary.rs). Only it may
    /// end the resync, and while it has not, this node looks blank to every other node
    /// (`view`). Taken after the `p` lock, never before it.
    sync_source: Mutex<Option<String>>,
    /// DISK_ATTACHED, DISK_FAILED or DISK_DISKLESS (detach.rs); `disk` and `meta` stop
    /// at their gate once it leaves DISK_ATTACHED.
    disk_state: Arc<std::sync::atomic::AtomicU8>,
    /// One detach at a time: a request that finds the disk failed waits until the
    /// detach is done (the new generation adopted) before it answers.
    detaching: Mutex<()>,
    /// Set while requests are held for want of data (`--on-no-data suspend-io`): why.
    no_data: Mutex<Option<String>>,
    /// `disk` and `meta` are these, seen through their trait (`attach --disk` swaps
    /// what is inside).
    disk_gate: Arc<detach::Gate<Arc<dyn BlockDevice>>>,
    meta_gate: Arc<detach::Gate<Box<dyn MetaIo>>>,
    /// A primary filling its disk from a peer (pull.rs); `pull_on` says whether there
    /// is one without taking the lock, on every request.
    pull: Mutex<Option<Arc<pull::Pull>>>,
    pull_on: AtomicBool,
}

impl fmt::Debug for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Node")
            .field("resource", &self.cfg.resource)
            .field("node", &self.cfg.node)
            .field("role", &self.role())
            .finish_non_exhaustive()
    }
}

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The resource's 16-byte id (the fencing token's array field), from its name.
pub fn resource_id(name: &str) -> [u8; 16] {
    let a = crc32c::crc32c(name.as_bytes());
    let b = crc32c::crc32c_append(a, b"cairn-repl");
    let c = crc32c::crc32c_append(b, name.as_bytes());
    let d = crc32c::crc32c_append(c, b"resource");
    let mut id = [0u8; 16];
    for (i, w) in [a, b, c, d].iter().enumerate() {
        id[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
    }
    id
}

fn io_err(kind: ErrorKind, msg: impl Into<String>) -> Error {
    Error::new(kind, msg)
}

impl Node {
    /// Opens the resource on `disk` (its metadata through `meta`). A node always starts
    /// as secondary; one that crashed as primary marks its activity log's extents out
    /// of sync with every peer first.
    pub fn open(
        cfg: NodeConfig,
        disk: Arc<dyn BlockDevice>,
        meta: Box<dyn MetaIo>,
    ) -> Result<Arc<Node>> {
        // The node's name travels in the fencing token: the same limits apply.
        OwnerId::new(cfg.node.clone(), 0).map_err(|e| {
            io_err(
                ErrorKind::InvalidArgument,
                format!("node name {:?}: {e}", cfg.node),
            )
        })?;
        if cfg.peers.is_empty() {
            return Err(io_err(
                ErrorKind::InvalidArgument,
                "a replicated resource needs at least one --peer",
            ));
        }
        if cfg.peers.len() > meta.max_peers() {
            return Err(io_err(
                ErrorKind::InvalidArgument,
                format!(
                    "{} peers configured, but the metadata has room for {} (create-md --max-peers)",
                    cfg.peers.len(),
                    meta.max_peers()
                ),
            ));
        }
        meta.bind_resource(resource_id(&cfg.resource))?;
        let mut p = meta.load()?;
        let data_size = meta.data_size();
        let bits = data_size.div_ceil(meta.bm_block());
        let mut peers = Vec::new();
        for (slot, pc) in cfg.peers.iter().enumerate() {
            if pc.name == cfg.node {
                return Err(io_err(
                    ErrorKind::InvalidArgument,
                    format!("peer {:?} has this node's own name", pc.name),
                ));
            }
            let s = &mut p.peers[slot];
            if !s.name.is_empty() && s.name != pc.name {
                return Err(io_err(
                    ErrorKind::InvalidArgument,
                    format!(
                        "the metadata's peer slot {slot} belongs to {:?}, not {:?}: list the peers in the order they were first used",
                        s.name, pc.name
                    ),
                ));
            }
            s.name.clone_from(&pc.name);
            let words = meta.read_bitmap(slot)?;
            peers.push(Arc::new(Peer {
                cfg: pc.clone(),
                slot,
                bitmap: Bitmap::from_words(bits, meta.bm_block(), &words),
                link: RwLock::new(None),
                st: Mutex::new(PeerState {
                    conn: Conn::StandAlone,
                    repl: Repl::Off,
                    last_error: None,
                    want: true,
                    discard_my_data: false,
                    verify_after_failover: None,
                    since: SystemTime::now(),
                    peer_changes: None,
                    resync: None,
                }),
                resync_done: AtomicU64::new(0),
                outdated: AtomicBool::new(false),
                recording: Mutex::new(()),
            }));
        }
        let active = meta.read_al()?;
        let crashed = p.primary;
        if crashed || !active.is_empty() {
            // Writes may have reached one replica and not another in these extents.
            let ext = meta.al_extent();
            for e in &active {
                for peer in &peers {
                    peer.bitmap
                        .set_bytes(e * ext, ext.min(data_size.saturating_sub(e * ext)));
                }
            }
            for peer in &peers {
                let pages = peer.bitmap.take_dirty_pages();
                meta.write_bitmap_pages(peer.slot, &pages)?;
            }
            meta.write_al(&[])?;
            if crashed {
                p.crashed_primary = true;
                p.primary = false;
            }
        }
        meta.save(&p)?;
        let disk_state = Arc::new(std::sync::atomic::AtomicU8::new(DISK_ATTACHED));
        let disk_gate = Arc::new(detach::Gate::new(disk_state.clone(), disk));
        let meta_gate = Arc::new(detach::Gate::new(disk_state.clone(), meta));
        let node = Node {
            uuid: resource_id(&cfg.resource),
            instance: rand::random::<u64>() | 1,
            al: ActivityLog::new(meta_gate.al_extent(), cfg.al_extents, &[]),
            cfg,
            data_size,
            p: Mutex::new(p),
            role: RwLock::new(Role::Secondary),
            locks: Arc::new(RangeLocks::default()),
            async_tx: Mutex::new(None),
            peers,
            events: Mutex::new(VecDeque::new()),
            stop_peers: AtomicBool::new(false),
            lease_told: AtomicBool::new(false),
            threads: Mutex::new(Vec::new()),
            exports: Mutex::new(None),
            admin: Mutex::new(()),
            lease: Mutex::new(None),
            guard: RwLock::new(None),
            halt: AtomicBool::new(false),
            superseded: Mutex::new(None),
            stopped: AtomicBool::new(false),
            vx: verify::Shared::default(),
            app_io: AtomicU64::new(0),
            sync_source: Mutex::new(None),
            disk_state,
            detaching: Mutex::new(()),
            no_data: Mutex::new(None),
            disk: disk_gate.clone(),
            disk_gate,
            meta: Box::new(meta_gate.clone()),
            meta_gate,
            pull: Mutex::new(None),
            pull_on: AtomicBool::new(false),
        };
        if crashed {
            node.event("crashed-primary", None, "this node stopped as primary without a clean stop: its activity log's extents will be resynced".into());
        }
        Ok(Arc::new(node))
    }

    pub fn config(&self) -> &NodeConfig {
        &self.cfg
    }

    pub fn data_size(&self) -> u64 {
        self.data_size
    }

    pub fn role(&self) -> Role {
        *self.role.read().unwrap_or_else(|p| p.into_inner())
    }

    fn persisted(&self) -> std::sync::MutexGuard<'_, Persisted> {
        self.p.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn event(&self, kind: &'static str, peer: Option<&str>, message: String) {
        match kind {
            "split-brain" | "refused" | "disconnect" | "crashed-primary" | "fenced" => {
                tracing::warn!("{}: {message}", self.cfg.resource)
            }
            _ => tracing::info!("{}: {message}", self.cfg.resource),
        }
        let mut ev = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if ev.len() >= 64 {
            ev.pop_front();
        }
        ev.push_back(Event {
            at: now_secs(),
            kind: kind.to_string(),
            peer: peer.map(str::to_string),
            message,
        });
    }

    /// This node's generations and flags as `peer` should see them.
    ///
    /// A node inconsistent from another node's resync (two primaries after a split
    /// brain both reaching it, or a new primary after the old one died mid-resync) looks
    /// blank to `peer`: part of its data is the other node's copies, which no bitmap of
    /// `peer`'s marks, so only a full resync from `peer` makes it whole (gen.rs:
    /// peer-just-created). Only the node it follows sees its generations.
    pub fn view(&self, peer: &Peer) -> NodeView {
        let p = self.persisted();
        let other_source = !p.consistent
            && self
                .sync_source
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .as_deref()
                .is_some_and(|s| s != peer.cfg.name);
        NodeView {
            gens: if other_source {
                Generations::JUST_CREATED
            } else {
                Generations {
                    current: p.current,
                    bitmap: p.peers[peer.slot].bitmap_uuid,
                    history: p.history,
                }
            },
            primary: self.role() == Role::Primary,
            crashed_primary: p.crashed_primary,
            consistent: p.consistent,
        }
    }

    /// Who is the source when nothing in the data decides: the node whose name sorts
    /// first (both sides compute the same answer).
    fn tie(&self, peer: &Peer) -> gen::Tie {
        if self.cfg.node < peer.cfg.name {
            gen::Tie::MeSource
        } else {
            gen::Tie::PeerSource
        }
    }

    fn token(&self, epoch: u64) -> FenceToken {
        FenceToken {
            array: self.uuid,
            generation: epoch,
            owner: OwnerId {
                node: self.cfg.node.clone(),
                instance: self.instance,
            },
        }
    }

    /// The data area (what a primary writes to this node), for the peer-facing export.
    pub fn data_area(self: &Arc<Self>) -> Arc<dyn BlockDevice> {
        Arc::new(DataArea {
            disk: self.disk.clone(),
            size: self.data_size,
            node: Arc::downgrade(self),
        })
    }

    /// Registers where the node's faces are served, and exports the data area to peers
    /// (the node starts as secondary).
    pub fn attach(self: &Arc<Self>, exports: Exports) -> std::result::Result<(), String> {
        exports
            .peers
            .add(self.peer_export())
            .map_err(|e| e.to_string())?;
        *self.exports.lock().unwrap_or_else(|p| p.into_inner()) = Some(exports);
        Ok(())
    }

    fn peer_export(self: &Arc<Self>) -> cairn_nbd::Export {
        cairn_nbd::Export {
            name: self.cfg.resource.clone(),
            description: format!("replication target of {}", self.cfg.resource),
            device: self.data_area(),
            read_only: false,
        }
    }

    // ----- the data path (primary) ------------------------------------------------------

    fn check_primary(&self) -> Result<()> {
        if self.role() != Role::Primary {
            return Err(io_err(
                ErrorKind::ReadOnly,
                format!("{}: this node is not primary", self.cfg.resource),
            ));
        }
        self.lease_check()
    }

    /// With a quorum: Ok while the primary lease is certainly ours; after that, frozen or
    /// refused as configured. A frozen request goes on if the lease turns out to be held
    /// after all (a keepalive got through again: etcd still had it, e.g. its leader changed
    /// and took longer than this node's margin), and gives up when the node is made
    /// secondary or stops.
    fn lease_check(&self) -> Result<()> {
        let Some(g) = self.guard.read().unwrap_or_else(|p| p.into_inner()).clone() else {
            return Ok(());
        };
        let what = self.cfg.resource.as_str();
        let freeze = self.cfg.quorum.as_ref().map(|q| q.on_loss) == Some(OnLoss::Freeze);
        loop {
            let r = g.check(what);
            if r.is_err() {
                if let Some(why) = self.superseded_by() {
                    return Err(io_err(
                        ErrorKind::Shutdown,
                        format!("{what}: this node is no longer primary: {why}"),
                    ));
                }
            }
            if r.is_ok()
                || !freeze
                || self.halt.load(Ordering::SeqCst)
                || self.role() != Role::Primary
            {
                return r;
            }
            // Frozen: writes this thread held back (cairn_nbd::cork) go out first.
            cairn_nbd::cork::release();
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn superseded_by(&self) -> Option<String> {
        self.superseded
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The primary lease's guard, while this node holds one.
    fn lease_guard(&self) -> Option<LeaseGuard> {
        self.guard.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// With a quorum: records in etcd that `peer` misses writes, before any write it
    /// did not get is acknowledged, so it cannot take the primary role with old data.
    ///
    /// The record is a transaction that succeeds only while this node's lease holds the
    /// primary key: a primary whose lease ran out (the peer may have taken over by now)
    /// writes nothing to etcd and acknowledges nothing; it freezes or fails as its
    /// lease check says. Once the mark is in, this node's data moves on to a new
    /// generation the peer does not hold (`new_generation_without`), before the write
    /// that needed the mark is acknowledged.
    /// Marks `node`'s data outdated in etcd (stamped with this node's current generation
    /// and name), only while this node holds the primary lease `lease` (a transaction on
    /// it): `Ok(false)` when etcd no longer holds that lease, and nothing was written.
    fn put_outdated_mark(
        &self,
        q: &Quorum,
        node: &str,
        lease: i64,
    ) -> std::result::Result<bool, cairn_cluster::etcd::EtcdError> {
        let key = quorum::outdated_key(&self.cfg.resource, node);
        let held = quorum::primary_key(&self.cfg.resource);
        let value = format!("{:016x} {}", self.persisted().current, self.cfg.node);
        q.etcd
            .put_if_lease(key.as_bytes(), value.as_bytes(), held.as_bytes(), lease)
    }

    fn ensure_outdated(&self, peer: &Peer) -> Result<()> {
        let Some(q) = &self.cfg.quorum else {
            return Ok(());
        };
        if peer.outdated.load(Ordering::Acquire) {
            return Ok(());
        }
        let _one = peer.recording.lock().unwrap_or_else(|p| p.into_inner());
        if peer.outdated.load(Ordering::Acquire) {
            return Ok(());
        }
        let held = quorum::primary_key(&self.cfg.resource);
        loop {
            self.lease_check()?;
            let Some(g) = self.lease_guard() else {
                return Err(io_err(
                    ErrorKind::ReadOnly,
                    format!("{}: this node is not primary", self.cfg.resource),
                ));
            };
            match self.put_outdated_mark(q, &peer.cfg.name, g.id()) {
                Ok(true) => {
                    peer.outdated.store(true, Ordering::Release);
                    self.event(
                        "outdated",
                        Some(&peer.cfg.name),
                        format!(
                        "peer {} marked outdated in etcd: it cannot take over until it is resynced",
                        peer.cfg.name
                    ),
                    );
                    self.new_generation_without(peer);
                    return Ok(());
                }
                Ok(false) => {
                    // The lease is gone in etcd, whatever the local deadline says.
                    tracing::error!(
                        "{}: cannot mark {} outdated: etcd no longer holds this node's lease on {held}",
                        self.cfg.resource,
                        peer.cfg.name
                    );
                    g.mark_lost();
                }
                Err(e) => {
                    tracing::warn!(
                        "{}: cannot mark {} outdated in etcd: {e}",
                        self.cfg.resource,
                        peer.cfg.name
                    );
                    if self.halt.load(Ordering::SeqCst) {
                        return Err(io_err(ErrorKind::Shutdown, "stopping"));
                    }
                    thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }

    /// The peer holds this node's data again: it may take over. The mark goes only while
    /// this node holds the lease; the flag goes anyway, so the next loss marks again (a
    /// mark left behind only keeps the peer from taking over, which is safe).
    fn clear_outdated(&self, peer: &Peer) {
        if self.cfg.quorum.is_none() {
            return;
        }
        peer.outdated.store(false, Ordering::Release);
        self.delete_outdated_mark(&peer.cfg.name);
    }

    /// Deletes `node`'s outdated mark in etcd, only while this node holds the primary
    /// lease (a transaction on it); says so when the mark stays.
    fn delete_outdated_mark(&self, node: &str) {
        let (Some(q), Some(g)) = (&self.cfg.quorum, self.lease_guard()) else {
            return;
        };
        let key = quorum::outdated_key(&self.cfg.resource, node);
        let held = quorum::primary_key(&self.cfg.resource);
        match q
            .etcd
            .delete_if_lease(key.as_bytes(), held.as_bytes(), g.id())
        {
            Ok(true) => {}
            Ok(false) => tracing::warn!(
                "{}: {node}'s outdated mark stays: etcd no longer holds this node's lease",
                self.cfg.resource
            ),
            Err(e) => tracing::warn!(
                "{}: cannot clear {node}'s outdated mark in etcd: {e}",
                self.cfg.resource
            ),
        }
    }

    fn persist_al(&self, tx: &Transaction) -> Result<()> {
        if !tx.evict.is_empty() {
            // What the evicted extents hold must be durable everywhere, or accounted for
            // in the bitmaps, before the log forgets them.
            let ext = self.al.extent();
            self.flush_all(|peer| {
                for e in &tx.evict {
                    peer.bitmap
                        .set_bytes(e * ext, ext.min(self.data_size - e * ext));
                }
            })?;
            self.write_out_bitmaps()?;
        }
        self.meta.write_al(&tx.after)
    }

    /// Flushes the local disk and every connected peer at once; a peer whose flush fails
    /// is dropped after `on_lost` accounts for what it may not have.
    fn flush_all(&self, on_lost: impl Fn(&Peer)) -> Result<()> {
        self.flush_replicas(on_lost).0
    }

    /// [`Node::flush_all`], and how many up-to-date (Established) peers flushed.
    fn flush_replicas(&self, on_lost: impl Fn(&Peer)) -> (Result<()>, usize) {
        let links: Vec<(&Arc<Peer>, Arc<Client>)> = self
            .peers
            .iter()
            .filter_map(|p| p.link().map(|l| (p, l)))
            .collect();
        let started: Vec<_> = links.iter().map(|(p, l)| (*p, l.start_flush())).collect();
        let local = self.disk.flush();
        let mut up_to_date = 0;
        for (peer, st) in started {
            match st.wait() {
                Ok(()) => up_to_date += usize::from(peer.state().repl == Repl::Established),
                Err(e) => {
                    on_lost(peer);
                    self.lose(peer, &e.to_string());
                }
            }
        }
        (local, up_to_date)
    }

    /// Marks the extents the activity log holds out of sync with `peer`: its unflushed
    /// writes can only be there.
    fn mark_active(&self, peer: &Peer) {
        let ext = self.al.extent();
        for e in self.al.active() {
            peer.bitmap
                .set_bytes(e * ext, ext.min(self.data_size.saturating_sub(e * ext)));
        }
    }

    fn write(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.check_primary()?;
        self.wait_for_data()?;
        self.pull_needs_a_peer()?;
        self.app_io.fetch_add(1, Ordering::Relaxed);
        let len = buf.len() as u64;
        let range = self.locks.lock_owned(offset, len);
        // A diskless node keeps no activity log: it has no disk to be out of step with.
        let logged = !self.is_diskless()
            && match self.al.begin(offset, len, |tx| self.persist_al(tx)) {
                Ok(()) => true,
                Err(e) if self.local_failed(&e) => false,
                Err(e) => return Err(e),
            };
        let links: Vec<(&Arc<Peer>, Option<Arc<Client>>)> = self
            .peers
            .iter()
            .map(|p| (p, p.link_or_mark(offset, len)))
            .collect();
        // Every replica's write is on its way before the local one starts.
        let started: Vec<_> = links
            .iter()
            .map(|(p, l)| (*p, l.as_ref().map(|l| l.start_write(buf, offset, flags))))
            .collect();
        let local = self.disk.write_at(buf, offset, flags);
        if local.is_ok() {
            self.pulled_by_write(offset, len);
        }
        // Detached (now or before): the write is answered by the up-to-date peers alone,
        // with protocol A too.
        let gone = local.as_ref().is_err_and(|e| self.local_failed(e));
        let mut missed = Ok(());
        // While the disk is being filled, the local copy is no whole replica: the
        // write waits for its peers (as protocol C).
        if self.cfg.protocol == Protocol::A && local.is_ok() && self.pulling().is_none() {
            let tx = self
                .async_tx
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if let Some(tx) = tx {
                let mut peers = Vec::new();
                for ((peer, st), (_, link)) in started.into_iter().zip(&links) {
                    match (st, link) {
                        (Some(st), Some(l)) => {
                            peers.push(((*peer).clone(), l.clone(), st.detach()))
                        }
                        _ => {
                            peer.bitmap.set_bytes(offset, len);
                            missed = missed.and_then(|()| self.ensure_outdated(peer));
                        }
                    }
                }
                // Blocks while the backlog is full.
                let job = AsyncJob {
                    offset,
                    len,
                    peers,
                    _range: range,
                };
                debug_assert!(logged, "a local write succeeded on a detached disk");
                if let Err(back) = tx.send(job) {
                    self.complete(back.0);
                }
                return missed;
            }
        }
        let mut up_to_date = 0;
        for (peer, st) in started {
            match st.map(cairn_nbd::client::Started::wait) {
                Some(Ok(())) if local.is_ok() || gone => {
                    let (a, b) = peer.bitmap.inside(offset, len);
                    peer.bitmap.clear(a, b);
                    up_to_date += usize::from(peer.state().repl == Repl::Established);
                }
                Some(Ok(())) => peer.bitmap.set_bytes(offset, len),
                Some(Err(e)) => {
                    peer.bitmap.set_bytes(offset, len);
                    self.lose(peer, &e.to_string());
                    missed = missed.and_then(|()| self.ensure_outdated(peer));
                }
                None => {
                    peer.bitmap.set_bytes(offset, len);
                    missed = missed.and_then(|()| self.ensure_outdated(peer));
                }
            }
        }
        if logged {
            self.al.end(offset, len);
        }
        let r = match self.answer_write(local, gone, up_to_date) {
            // `--on-no-data suspend-io`: held (with its range) until an up-to-date peer
            // can take it.
            Err(e) if gone && up_to_date == 0 => {
                self.write_when_data_returns(buf, offset, flags, e)
            }
            r => r,
        };
        drop(range);
        r.and(missed)
    }

    /// A write's answer: the local result, or, once the local disk is detached (or
    /// while it is being filled from a peer), OK only if an up-to-date peer has the
    /// write.
    fn answer_write(&self, local: Result<()>, gone: bool, up_to_date: usize) -> Result<()> {
        match local {
            Err(e) if gone && up_to_date == 0 => Err(e.context(format!(
                "{}: the local disk is detached and no up-to-date peer took the write",
                self.cfg.resource
            ))),
            Err(_) if gone => Ok(()),
            Ok(()) if up_to_date == 0 && self.pulling().is_some() => Err(io_err(
                ErrorKind::Io,
                format!(
                    "{}: the local disk is being filled from a peer (inconsistent) and no up-to-date peer took the write",
                    self.cfg.resource
                ),
            )),
            r => r,
        }
    }

    /// Protocol C without a thread waiting: the write leaves for every replica and is
    /// written here, and the last of them to finish (usually a replica's answer, on
    /// its connection's reader thread) settles the bitmaps and calls `done`. Exactly
    /// what [`Node::write`] does, in the same order, but no thread sleeps through the
    /// round trip. A replica that failed is handled on a thread of its own: losing it
    /// saves metadata and may ask etcd, which must not hold a connection's reader.
    fn write_then(self: &Arc<Self>, buf: &[u8], offset: u64, flags: WriteFlags, done: WriteDone) {
        if self.cfg.protocol != Protocol::C
            || self.is_diskless() && self.cfg.on_no_data == OnNoData::SuspendIo
        {
            // (A diskless node's write may be held: on the caller's thread, as a
            // frozen one is.)
            return done(self.write(buf, offset, flags));
        }
        if let Err(e) = self.check_primary().and_then(|()| self.pull_needs_a_peer()) {
            return done(Err(e));
        }
        self.app_io.fetch_add(1, Ordering::Relaxed);
        let len = buf.len() as u64;
        let range = self.locks.lock_owned(offset, len);
        let logged = !self.is_diskless()
            && match self.al.begin(offset, len, |tx| self.persist_al(tx)) {
                Ok(()) => true,
                Err(e) if self.local_failed(&e) => false,
                Err(e) => return done(Err(e)),
            };
        let op = Arc::new(ReplWrite {
            node: self.clone(),
            offset,
            len,
            logged,
            left: std::sync::atomic::AtomicUsize::new(self.peers.len() + 1),
            answers: Mutex::new(Vec::with_capacity(self.peers.len())),
            missed: Mutex::new(Ok(())),
            local: Mutex::new(None),
            range: Mutex::new(Some(range)),
            done: Mutex::new(Some(done)),
            held: (self.cfg.on_no_data == OnNoData::SuspendIo).then(|| (buf.to_vec(), flags)),
        });
        // Every replica's write is on its way before the local one starts.
        for peer in &self.peers {
            match peer.link_or_mark(offset, len) {
                Some(link) => {
                    let (op2, peer2) = (op.clone(), peer.clone());
                    // Sent with the rest of the burst this thread is working through
                    // (cairn_nbd::cork): the waits that could need it send it first.
                    cairn_nbd::cork::gathering(|| {
                        link.write_then(
                            buf,
                            offset,
                            flags,
                            Box::new(move |r| op2.answer(peer2, r)),
                        );
                    });
                }
                None => {
                    // Not connected: tracked (link_or_mark set the bits), and (with
                    // etcd) recorded as outdated before this write is acknowledged.
                    // Done here, on the caller's thread, as the waiting path does.
                    let m = self.ensure_outdated(peer);
                    let mut missed = op.missed.lock().unwrap_or_else(|p| p.into_inner());
                    *missed = std::mem::replace(&mut *missed, Ok(())).and(m);
                    drop(missed);
                    op.one();
                }
            }
        }
        let local = self.disk.write_at(buf, offset, flags);
        if local.is_ok() {
            // Under the write's range, as in `write`.
            self.pulled_by_write(offset, len);
        }
        *op.local.lock().unwrap_or_else(|p| p.into_inner()) = Some(local);
        op.one();
    }

    /// Protocol A: the peers' answers to one write, after it was acknowledged.
    fn complete(&self, job: AsyncJob) {
        for (peer, client, d) in job.peers {
            match d.wait(&client) {
                Ok(()) => {
                    let (a, b) = peer.bitmap.inside(job.offset, job.len);
                    peer.bitmap.clear(a, b);
                }
                Err(e) => {
                    peer.bitmap.set_bytes(job.offset, job.len);
                    self.lose(&peer, &e.to_string());
                    if let Err(e) = self.ensure_outdated(&peer) {
                        tracing::error!("{}: {}: {e}", self.cfg.resource, peer.cfg.name);
                    }
                }
            }
        }
        self.al.end(job.offset, job.len);
    }

    fn run_completions(self: Arc<Self>, rx: Receiver<AsyncJob>) {
        for job in rx {
            self.complete(job);
        }
    }

    fn flush(&self) -> Result<()> {
        self.check_primary()?;
        self.wait_for_data()?;
        self.pull_needs_a_peer()?;
        // Diskless at the start: the gate's refusal is no failure of a disk an
        // `attach` may bring meanwhile.
        let was_diskless = self.is_diskless();
        let lost = std::cell::RefCell::new(Vec::new());
        let (local, up_to_date) = self.flush_replicas(|peer| {
            self.mark_active(peer);
            lost.borrow_mut().push(peer.slot);
        });
        let gone = local
            .as_ref()
            .is_err_and(|e| was_diskless || self.local_failed(e));
        let local = self.answer_write(local, gone, up_to_date);
        // Writes acknowledged before may not be durable on a peer whose flush failed: with
        // a quorum it is marked outdated before this flush is acknowledged.
        let mut missed = Ok(());
        for slot in lost.into_inner() {
            missed = missed.and_then(|()| self.ensure_outdated(&self.peers[slot]));
        }
        if local.is_err() && gone && up_to_date == 0 && self.wait_for_data()? {
            // `--on-no-data suspend-io`: an up-to-date peer is back; it flushes.
            return missed.and_then(|()| self.flush());
        }
        local.and(missed)
    }

    /// Drops the link to `peer` after a failure: from now on its writes are counted in
    /// its bitmap, and (as primary) the data takes a new generation, so the next
    /// handshake sees that this side changed while the peer was away.
    fn lose(&self, peer: &Peer, why: &str) {
        // The link goes under the fill's lock too (pull.rs `pull_lost`): two peers lost
        // at once are then ordered as their links went, and the later one, the last to
        // take every acknowledged write, is the one a fill may resume with.
        let mut old = None;
        self.pull_lost(peer, || {
            old = peer.link.write().unwrap_or_else(|p| p.into_inner()).take();
            if old.is_some() {
                peer.set(Conn::Connecting, Repl::Off);
            }
        });
        if old.is_none() {
            return;
        }
        peer.state().last_error = Some(why.to_string());
        self.event(
            "disconnect",
            Some(&peer.cfg.name),
            format!("lost peer {}: {why}", peer.cfg.name),
        );
        // With a quorum the new generation waits for the peer's outdated mark
        // (ensure_outdated), that is for the first write acknowledged without it. A
        // primary that loses its lease first acknowledges nothing more: its peer, promoted
        // meanwhile, then meets it as an ordinary resync target (its unacknowledged
        // writes are in its bitmap), not as a split brain.
        if self.role() == Role::Primary && self.cfg.quorum.is_none() {
            self.new_generation_without(peer);
        }
        drop(old);
    }

    /// This node's data moves on to a new generation `peer` does not hold, before the
    /// first write it lacks is acknowledged; peers still in sync take it too. With a
    /// quorum, nothing to do if the generation moved on already since the peer was last
    /// in sync (its bitmap has a base: e.g. this node was promoted while it was away).
    fn new_generation_without(&self, peer: &Peer) {
        let mut p = self.persisted();
        if self.cfg.quorum.is_some() && p.peers[peer.slot].bitmap_uuid != 0 {
            return;
        }
        self.rotate(&mut p, &[peer.slot]);
        if let Err(e) = self.meta.save(&p) {
            tracing::error!("{}: cannot save the new generation: {e}", self.cfg.resource);
        }
        drop(p);
        let others: Vec<&Arc<Peer>> = self
            .peers
            .iter()
            .filter(|o| {
                o.slot != peer.slot && o.link().is_some() && o.state().repl == Repl::Established
            })
            .collect();
        self.announce_current(&others);
    }

    /// Peers still in sync take the primary's new current generation (it changed because
    /// another peer went away), so their next handshake finds them in sync rather than
    /// behind.
    fn announce_current(&self, peers: &[&Arc<Peer>]) {
        if peers.is_empty() {
            return;
        }
        let gens = {
            let p = self.persisted();
            Generations {
                current: p.current,
                bitmap: 0,
                history: p.history,
            }
        };
        for other in peers {
            let req = Request::Adopt {
                node: self.cfg.node.clone(),
                gens,
            };
            if let Err(e) = other.request(&req, self.cfg.peer_timeout) {
                // It may have missed writes since: treat it as gone.
                self.lose(other, &format!("could not take the new generation: {e}"));
            }
        }
    }

    /// A new current generation; the slots in `away` whose bitmap had no base take the
    /// old current as theirs.
    fn rotate(&self, p: &mut Persisted, away: &[usize]) {
        let old = p.current;
        let first = away.first().copied().unwrap_or(0);
        let mut g = Generations {
            current: p.current,
            bitmap: p.peers[first].bitmap_uuid,
            history: p.history,
        };
        g.new_current(&mut gen::random_ids());
        p.current = g.current;
        p.history = g.history;
        p.peers[first].bitmap_uuid = g.bitmap;
        for &s in away.iter().skip(1) {
            if p.peers[s].bitmap_uuid == 0 {
                p.peers[s].bitmap_uuid = old;
            }
        }
    }

    fn write_out_bitmaps(&self) -> Result<()> {
        for peer in &self.peers {
            let pages = peer.bitmap.take_dirty_pages();
            if pages.is_empty() {
                continue;
            }
            if let Err(e) = self.meta.write_bitmap_pages(peer.slot, &pages) {
                peer.bitmap
                    .redirty(&pages.iter().map(|(i, _)| *i).collect::<Vec<_>>());
                return Err(e);
            }
        }
        Ok(())
    }

    // ----- roles --------------------------------------------------------------------------

    /// Asks every peer for its view; `None` for a peer not reached.
    fn ask_peers(&self) -> Vec<(Arc<Peer>, std::result::Result<Welcome, String>)> {
        self.peers
            .iter()
            .map(|peer| {
                let r = self.hello(peer);
                (peer.clone(), r)
            })
            .collect()
    }

    fn hello(&self, peer: &Peer) -> std::result::Result<Welcome, String> {
        let hello = Hello {
            resource: self.cfg.resource.clone(),
            node: self.cfg.node.clone(),
            view: self.view(peer),
            epoch: self.persisted().epoch,
            data_size: self.data_size,
            bm_block: self.meta.bm_block(),
        };
        let data = peer.request(
            &Request::Hello(hello),
            self.cfg.peer_timeout.min(Duration::from_secs(5)),
        )?;
        let w: Welcome = serde_json::from_slice(&data)
            .map_err(|e| format!("{}: malformed answer: {e}", peer.cfg.name))?;
        if w.node != peer.cfg.name {
            return Err(format!(
                "the node at {} calls itself {:?}, not {:?}",
                peer.cfg.opts.addr, w.node, peer.cfg.name
            ));
        }
        peer.state().peer_changes = Some(w.changes);
        Ok(w)
    }

    /// `primary [--force]`.
    pub fn promote(self: &Arc<Self>, force: bool) -> std::result::Result<String, String> {
        let _admin = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        if self.role() == Role::Primary {
            return Ok(format!(
                "{} is already primary on {}",
                self.cfg.resource, self.cfg.node
            ));
        }
        if self.is_diskless() {
            return Err(format!(
                "{} on {} is diskless (its disk failed or was detached): `cairn repl attach` first; a diskless node does not become primary",
                self.cfg.resource, self.cfg.node
            ));
        }
        {
            let p = self.persisted();
            if !p.consistent && !force {
                return Err("this node's data is inconsistent (a resync to it did not finish); only --force promotes it, and only do that when no peer has better data".into());
            }
            if p.current == JUST_CREATED && !force {
                return Err("this node's data was never made current: the first primary of a new resource needs --force (its data becomes every peer's)".into());
            }
        }
        // With a quorum the role is an etcd lease first: a successful transaction, never
        // a read, decides. It is given back if anything below refuses.
        let lease = match &self.cfg.quorum {
            Some(q) => Some(self.take_lease(q, force)?),
            None => None,
        };
        // The primary this node last followed (its fence token names it): if it is gone
        // now (not reached, or back as a crashed primary), the writes it had in flight
        // may have reached some of its secondaries and not others.
        let old_primary = self
            .persisted()
            .fence
            .as_ref()
            .map(|t| t.owner.node.clone())
            .filter(|n| *n != self.cfg.node && self.peer_named(n).is_some());
        let answers = self.ask_peers();
        let vanished = old_primary.as_ref().filter(|old| {
            answers.iter().any(|(p, a)| {
                p.cfg.name == **old && a.as_ref().map_or(true, |w| w.view.crashed_primary)
            })
        });
        let mut away = Vec::new();
        let mut rotated = false;
        let mut in_sync = Vec::new();
        let mut top_epoch = self.persisted().epoch;
        for (peer, a) in &answers {
            match a {
                Ok(w) => {
                    // A peer that still says primary while this node holds the lease has
                    // lost its own: its I/O is frozen and the epoch below fences it.
                    if w.view.primary && lease.is_none() {
                        return Err(format!("peer {} is primary: make it secondary first (cairn repl secondary {} on {})", peer.cfg.name, self.cfg.resource, peer.cfg.name));
                    }
                    let (d, rule) = gen::decide(&self.view(peer), &w.view, self.tie(peer));
                    if matches!(d, Decision::TargetBitmap | Decision::TargetFull) && !force {
                        return Err(format!("peer {} has newer data ({rule:?}): promote it instead, or use --force to make this node's data win", peer.cfg.name));
                    }
                    top_epoch = top_epoch.max(w.epoch);
                    if d == Decision::InSync {
                        in_sync.push(peer.slot);
                    }
                }
                Err(e) => {
                    tracing::info!(
                        "{}: peer {} not reached before promotion: {e}",
                        self.cfg.resource,
                        peer.cfg.name
                    );
                    away.push(peer.slot);
                }
            }
        }
        // The data area stops being a target: no old primary writes after this point.
        if let Some(ex) = self
            .exports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            ex.peers.remove(&self.cfg.resource);
        }
        {
            let mut p = self.persisted();
            if p.current == JUST_CREATED {
                let mut g = Generations {
                    current: p.current,
                    bitmap: 0,
                    history: p.history,
                };
                g.initial_sync_start(&mut gen::random_ids());
                p.current = g.current;
                p.history = g.history;
                p.consistent = true;
            } else if !away.is_empty() {
                self.rotate(&mut p, &away);
                rotated = true;
            }
            // A counter at its maximum is refused, not wrapped: epoch 0 would be below
            // every token the peers admitted, and they would refuse this primary.
            let Some(epoch) = top_epoch.checked_add(1) else {
                drop(p);
                self.readd_peer_export();
                return Err(epoch_exhausted(top_epoch));
            };
            p.epoch = epoch;
            p.fence = Some(self.token(p.epoch));
            p.primary = true;
            if let Err(e) = self.meta.save(&p) {
                drop(p);
                self.readd_peer_export();
                return Err(format!("cannot save the metadata: {e}"));
            }
        }
        if rotated {
            let reached: Vec<&Arc<Peer>> = answers
                .iter()
                .filter(|(p, _)| in_sync.contains(&p.slot))
                .map(|(p, _)| p)
                .collect();
            self.announce_current(&reached);
        }
        if let Some(l) = lease {
            *self.guard.write().unwrap_or_else(|p| p.into_inner()) = Some(l.guard());
            *self.lease.lock().unwrap_or_else(|p| p.into_inner()) = Some(l);
            if force {
                self.clear_own_outdated();
            }
        }
        if let Some(old) = vanished {
            for peer in self.peers.iter().filter(|p| p.cfg.name != *old) {
                peer.state().verify_after_failover = Some(old.clone());
            }
        }
        self.halt.store(false, Ordering::SeqCst);
        *self.superseded.lock().unwrap_or_else(|p| p.into_inner()) = None;
        *self.role.write().unwrap_or_else(|p| p.into_inner()) = Role::Primary;
        self.stop_peers.store(false, Ordering::SeqCst);
        self.lease_told.store(false, Ordering::SeqCst);
        if self.cfg.protocol == Protocol::A {
            let (tx, rx) = sync_channel(ASYNC_BACKLOG);
            *self.async_tx.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
            let node = self.clone();
            let h = thread::Builder::new()
                .name("repl-async".into())
                .spawn(move || node.run_completions(rx))
                .map_err(|e| e.to_string())?;
            self.threads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(h);
        }
        for peer in &self.peers {
            peer.set(Conn::Connecting, Repl::Off);
            let (node, peer) = (self.clone(), peer.clone());
            let h = thread::Builder::new()
                .name(format!("repl-{}", peer.cfg.name))
                .spawn(move || node.run_peer(&peer))
                .map_err(|e| e.to_string())?;
            self.threads
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(h);
        }
        if let Some(ex) = self
            .exports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            ex.clients
                .add(cairn_nbd::Export {
                    name: self.cfg.resource.clone(),
                    description: format!("replicated volume {}", self.cfg.resource),
                    device: Arc::new(Volume(self.clone())),
                    read_only: false,
                })
                .map_err(|e| e.to_string())?;
        }
        let epoch = self.persisted().epoch;
        self.event(
            "promoted",
            None,
            format!(
                "{} is primary on {} (epoch {epoch})",
                self.cfg.resource, self.cfg.node
            ),
        );
        Ok(format!(
            "{} is primary on {} (fencing epoch {epoch})",
            self.cfg.resource, self.cfg.node
        ))
    }

    /// The primary lease: created only if no primary holds it and (unless forced) this
    /// node is not marked outdated, in one transaction.
    fn take_lease(&self, q: &Quorum, force: bool) -> std::result::Result<Lease, String> {
        let key = quorum::primary_key(&self.cfg.resource);
        let mine = quorum::outdated_key(&self.cfg.resource, &self.cfg.node);
        let also: Vec<&[u8]> = if force {
            Vec::new()
        } else {
            vec![mine.as_bytes()]
        };
        let value = format!(
            "{} epoch {}",
            self.cfg.node,
            self.persisted().epoch.saturating_add(1)
        );
        match Lease::acquire_with(&q.etcd, &key, value.as_bytes(), q.ttl, &also) {
            Ok(l) => Ok(l),
            Err(LeaseError::Held(kv)) if kv.create_revision != 0 => Err(format!(
                "{} is primary elsewhere: {} holds {key} (etcd lease {:x})",
                self.cfg.resource,
                String::from_utf8_lossy(&kv.value),
                kv.lease
            )),
            Err(LeaseError::Held(_)) => Err(format!(
                "{} on {} is marked outdated in etcd ({mine}): a primary went on without it, so its data is old; \
                 wait for that primary, or --force to take over with this data and lose the writes it missed",
                self.cfg.resource, self.cfg.node
            )),
            Err(LeaseError::Etcd(e)) => Err(format!("etcd: {e}: the primary role cannot be taken")),
        }
    }

    fn clear_own_outdated(&self) {
        self.delete_outdated_mark(&self.cfg.node);
    }

    /// With automatic failover: a consistent secondary that is not outdated takes the
    /// primary role when no primary holds the lease. Both nodes may try at once; the
    /// etcd transaction lets one through. And a primary whose lease is lost steps down
    /// once etcd shows another node holding the primary key (`step_down_if_superseded`).
    pub fn start_failover_watch(self: &Arc<Self>) {
        let Some(q) = self.cfg.quorum.clone().filter(|q| q.auto_failover) else {
            return;
        };
        let node = Arc::downgrade(self);
        let period = (q.ttl / 3).max(Duration::from_millis(300));
        let _ = thread::Builder::new()
            .name("repl-failover".into())
            .spawn(move || loop {
                thread::sleep(period);
                let Some(n) = node.upgrade() else { return };
                if n.stopping() {
                    return;
                }
                if n.role() == Role::Primary {
                    if n.lease_lost() {
                        n.step_down_if_superseded(&q.etcd);
                    }
                    continue;
                }
                {
                    let p = n.persisted();
                    if !p.consistent || p.current == JUST_CREATED {
                        continue;
                    }
                }
                let key = quorum::primary_key(&n.cfg.resource);
                // A read only to avoid pointless transactions; the transaction decides.
                if !matches!(q.etcd.get(key.as_bytes()), Ok(None)) {
                    continue;
                }
                match n.promote(false) {
                    Ok(m) => n.event("failover", None, format!("no primary held the lease: {m}")),
                    Err(e) => tracing::debug!("{}: failover not taken: {e}", n.cfg.resource),
                }
            });
    }

    /// A primary whose lease is lost, with automatic failover: when a successful etcd
    /// read shows the primary key held by another node, this node is certainly not
    /// primary any more (its own lease no longer holds the key, and only a transaction
    /// creates it), so it steps down by itself: frozen and new requests fail with the
    /// reason, and as a secondary it waits for the new primary, whose connect-time
    /// decision resyncs it (its bitmap and this node's) or detects a split brain. A
    /// read is enough to give the role up, never to take it. An unanswered read, or no
    /// holder at all (nobody took over: the lease may yet be renewed, or the operator
    /// decides), changes nothing.
    fn step_down_if_superseded(self: &Arc<Self>, etcd: &Etcd) {
        let key = quorum::primary_key(&self.cfg.resource);
        let kv = match etcd.get(key.as_bytes()) {
            Ok(Some(kv)) => kv,
            Ok(None) => return,
            Err(e) => {
                tracing::debug!("{}: lease lost, etcd not read: {e}", self.cfg.resource);
                return;
            }
        };
        let value = String::from_utf8_lossy(&kv.value).into_owned();
        let holder = value.split(' ').next().unwrap_or("");
        let own_lease = self.lease_guard().map(|g| g.id());
        if holder == self.cfg.node || Some(kv.lease) == own_lease {
            return;
        }
        let why = format!(
            "{holder} holds the primary lease in etcd ({key} = {value:?}, etcd lease {:x}) since this node's ran out",
            kv.lease
        );
        let _admin = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        // Under the admin lock: still primary (not demoted by the operator meanwhile) and
        // the lease still lost (not renewed by a late keepalive: it cannot be, once
        // another node holds the key, but the check costs nothing).
        if self.role() != Role::Primary || !self.lease_lost() {
            return;
        }
        *self.superseded.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
        match self.demote_locked(Some(&why)) {
            Ok(_) => {}
            Err(e) => tracing::error!("{}: stepping down ({why}) failed: {e}", self.cfg.resource),
        }
    }

    fn lease_lost(&self) -> bool {
        self.guard
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|g| g.check("").is_err())
    }

    fn stopping(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    fn readd_peer_export(self: &Arc<Self>) {
        if let Some(ex) = self
            .exports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            if let Err(e) = ex.peers.add(self.peer_export()) {
                tracing::error!(
                    "{}: cannot export the data area to peers: {e}",
                    self.cfg.resource
                );
            }
        }
    }

    /// `secondary`: clients are cut, everything is flushed and written out, the node
    /// waits for a primary.
    pub fn demote(self: &Arc<Self>) -> std::result::Result<String, String> {
        let _admin = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        self.demote_locked(None)
    }

    /// `demote` under the admin lock; `superseded`: the node steps down by itself, why.
    fn demote_locked(
        self: &Arc<Self>,
        superseded: Option<&str>,
    ) -> std::result::Result<String, String> {
        if self.role() == Role::Secondary {
            return Ok(format!(
                "{} is already secondary on {}",
                self.cfg.resource, self.cfg.node
            ));
        }
        // Frozen requests (a lost lease) give up now rather than hold the stop.
        self.halt.store(true, Ordering::SeqCst);
        if let Some(ex) = self
            .exports
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            // Removing the export ends its connections (their requests answered first).
            ex.clients.remove(&self.cfg.resource);
        }
        let stopped = self.clean_stop();
        // A fill cut short is given up whether or not the stop saved everything.
        self.abandon_pull();
        stopped.map_err(|e| e.to_string())?;
        // Giving the lease back (revoking it) lets another node take over at once.
        *self.guard.write().unwrap_or_else(|p| p.into_inner()) = None;
        drop(self.lease.lock().unwrap_or_else(|p| p.into_inner()).take());
        *self.role.write().unwrap_or_else(|p| p.into_inner()) = Role::Secondary;
        self.readd_peer_export();
        self.event(
            "demoted",
            None,
            match superseded {
                None => format!("{} is secondary on {}", self.cfg.resource, self.cfg.node),
                Some(why) => format!(
                    "{} is secondary on {} by itself (automatic failover): {why}; its requests failed, it waits for the new primary to resync it",
                    self.cfg.resource, self.cfg.node
                ),
            },
        );
        Ok(format!(
            "{} is secondary on {}",
            self.cfg.resource, self.cfg.node
        ))
    }

    /// Stops the peer threads, flushes every replica, writes the bitmaps out and clears
    /// the activity log: after this, nothing is in flight anywhere.
    fn clean_stop(&self) -> Result<()> {
        // Protocol A: the completion thread drains what is in flight and ends.
        drop(
            self.async_tx
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take(),
        );
        self.stop_peers.store(true, Ordering::SeqCst);
        let threads: Vec<_> = self
            .threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
            .collect();
        for t in threads {
            let _ = t.join();
        }
        // A diskless node stops without its disk: the peers' flushes are what counts,
        // and the metadata stays as the detach left it.
        let diskless = self.is_diskless();
        let keep = |r: Result<()>| if diskless { Ok(()) } else { r };
        keep(self.flush_all(|peer| self.mark_active(peer)))?;
        keep(self.write_out_bitmaps())?;
        keep(self.meta.write_al(&[]))?;
        self.al.clear_idle();
        for peer in &self.peers {
            if let Some(l) = peer.link.write().unwrap_or_else(|p| p.into_inner()).take() {
                if let Ok(c) = Arc::try_unwrap(l) {
                    let _ = c.disconnect();
                }
            }
            peer.set(Conn::StandAlone, Repl::Off);
        }
        let mut p = self.persisted();
        p.primary = false;
        keep(self.meta.save(&p))
    }

    /// Clean shutdown of the node (`down`, SIGTERM).
    pub fn shutdown(self: &Arc<Self>) -> std::result::Result<(), String> {
        self.stopped.store(true, Ordering::SeqCst);
        if self.role() == Role::Primary {
            self.demote()?;
        }
        Ok(())
    }

    /// `connect [--discard-my-data]` / `disconnect` for one peer or all.
    pub fn set_connect(
        &self,
        peer: Option<&str>,
        on: bool,
        discard_my_data: bool,
    ) -> std::result::Result<String, String> {
        let mut n = 0;
        for p in &self.peers {
            if peer.is_some_and(|name| name != p.cfg.name) {
                continue;
            }
            n += 1;
            {
                let mut s = p.state();
                s.want = on;
                s.discard_my_data = on && discard_my_data;
                if on && s.conn == Conn::StandAlone && self.role() == Role::Primary {
                    s.conn = Conn::Connecting;
                    s.repl = Repl::Off;
                }
            }
            if !on {
                self.lose(p, "disconnected by the operator");
                p.set(Conn::StandAlone, Repl::Off);
            }
        }
        if n == 0 {
            return Err(format!("no peer named {:?}", peer.unwrap_or("")));
        }
        Ok(if on {
            "connecting".into()
        } else {
            "disconnected".into()
        })
    }

    // ----- status -------------------------------------------------------------------------

    pub fn status(&self) -> Status {
        let p = self.persisted().clone();
        let role = self.role();
        let peers = self
            .peers
            .iter()
            .map(|peer| {
                let s = peer.state();
                let oos = peer.bitmap.count_bytes(self.data_size);
                let pull = self.pull_progress(peer.slot);
                let resync = s.resync.as_ref().map(|r| {
                    let done = peer.resync_done.load(Ordering::Relaxed);
                    let rate = r.speed.rate(Instant::now(), done);
                    let target = r.pacer.target(&self.app_io);
                    Progress {
                        total_bytes: r.total.max(done + oos),
                        done_bytes: done,
                        bytes_per_sec: rate,
                        eta_secs: (rate > 0).then(|| oos / rate),
                        full: r.full,
                        target_bytes_per_sec: target.bytes_per_sec,
                        throttled: target.throttled,
                    }
                });
                PeerStatus {
                    name: peer.cfg.name.clone(),
                    address: peer.cfg.opts.addr.to_string(),
                    connection: s.conn,
                    // The peer a primary fills its disk from is, seen from here, the
                    // source of a resync to this node.
                    replication: if pull.is_some() && s.repl == Repl::Established {
                        Repl::SyncTarget
                    } else {
                        s.repl
                    },
                    out_of_sync_bytes: oos,
                    peer_changes: s.peer_changes.map(|c| c * self.meta.bm_block()),
                    resync: pull.or(resync),
                    last_error: s.last_error.clone(),
                    since: s
                        .since
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0, |d| d.as_secs()),
                    verify: self.vx.status(&peer.cfg.name, &self.app_io),
                }
            })
            .collect();
        let disk = if self.disk_state.load(Ordering::SeqCst) == DISK_FAILED {
            "Failed"
        } else if self.is_diskless() {
            "Diskless"
        } else if !p.consistent || self.pulling().is_some() {
            "Inconsistent"
        } else if p.current == JUST_CREATED {
            "Blank"
        } else if role == Role::Primary
            || self
                .peers
                .iter()
                .any(|pe| pe.state().repl == Repl::Established)
        {
            "UpToDate"
        } else {
            "Consistent"
        };
        Status {
            resource: self.cfg.resource.clone(),
            node: self.cfg.node.clone(),
            role,
            disk: disk.to_string(),
            data_size: self.data_size,
            epoch: p.epoch,
            generations: Generations {
                current: p.current,
                bitmap: 0,
                history: p.history,
            },
            crashed_primary: p.crashed_primary,
            quorum: self.quorum_status(role),
            resync_limits: self.cfg.resync,
            io_suspended: self.no_data_status(),
            peers,
            events: self
                .events
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
                .cloned()
                .collect(),
        }
    }

    fn quorum_status(&self, role: Role) -> Option<String> {
        let q = self.cfg.quorum.as_ref()?;
        if role == Role::Secondary {
            return Some(if q.auto_failover {
                "automatic failover on".into()
            } else {
                "manual promotion".into()
            });
        }
        let lease = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        Some(match lease.as_ref().and_then(Lease::valid_until) {
            Some(until) if until > Instant::now() => format!(
                "primary lease held, {:.1} s left",
                (until - Instant::now()).as_secs_f64()
            ),
            _ => format!(
                "primary lease lost: I/O {}",
                if q.on_loss == OnLoss::Freeze {
                    "frozen"
                } else {
                    "refused"
                }
            ),
        })
    }
}

/// One protocol C write in flight ([`Node::write_then`]): the replicas' answers and the
/// local result, gathered until the last one is in.
struct ReplWrite {
    node: Arc<Node>,
    offset: u64,
    len: u64,
    /// The write holds its extents in the activity log (not when diskless).
    logged: bool,
    /// The local write and each replica count one; the last to finish settles.
    left: std::sync::atomic::AtomicUsize,
    answers: Mutex<Vec<(Arc<Peer>, Result<()>)>>,
    /// Replicas that were not connected, recorded as outdated (or why not).
    missed: Mutex<Result<()>>,
    local: Mutex<Option<Result<()>>>,
    range: Mutex<Option<OwnedRangeGuard>>,
    done: Mutex<Option<WriteDone>>,
    /// `--on-no-data suspend-io`: the data and flags, for a write that no replica with
    /// the data took (the disk failed under it) and that waits for one.
    held: Option<(Vec<u8>, WriteFlags)>,
}

impl ReplWrite {
    fn answer(self: &Arc<Self>, peer: Arc<Peer>, r: Result<()>) {
        self.answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((peer, r));
        self.one();
    }

    fn one(self: &Arc<Self>) {
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        // A failed local write may detach the disk, which asks the peers to adopt a
        // new generation: not on a connection's reader thread either.
        let failed = self
            .answers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .any(|(_, r)| r.is_err())
            || self
                .local
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .as_ref()
                .is_some_and(Result::is_err)
                && self.node.disk_state.load(Ordering::SeqCst) != DISK_DISKLESS;
        if !failed {
            return self.settle();
        }
        let op = self.clone();
        if let Err(e) = thread::Builder::new()
            .name("repl-lost-peer".into())
            .spawn(move || op.settle())
        {
            tracing::warn!("cannot start a thread for a failed replica write: {e}");
            self.settle();
        }
    }

    /// The bitmaps, the activity log, the range, and the answer: as [`Node::write`].
    fn settle(&self) {
        let node = &self.node;
        let (offset, len) = (self.offset, self.len);
        let local = self
            .local
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .unwrap_or_else(|| Err(io_err(ErrorKind::Io, "the local write did not finish")));
        let mut missed = std::mem::replace(
            &mut *self.missed.lock().unwrap_or_else(|p| p.into_inner()),
            Ok(()),
        );
        let gone = local.as_ref().is_err_and(|e| node.local_failed(e));
        let mut up_to_date = 0;
        let answers = std::mem::take(&mut *self.answers.lock().unwrap_or_else(|p| p.into_inner()));
        for (peer, r) in answers {
            match r {
                Ok(()) if local.is_ok() || gone => {
                    let (a, b) = peer.bitmap.inside(offset, len);
                    peer.bitmap.clear(a, b);
                    up_to_date += usize::from(peer.state().repl == Repl::Established);
                }
                Ok(()) => peer.bitmap.set_bytes(offset, len),
                Err(e) => {
                    peer.bitmap.set_bytes(offset, len);
                    node.lose(&peer, &e.to_string());
                    missed = missed.and_then(|()| node.ensure_outdated(&peer));
                }
            }
        }
        if self.logged {
            node.al.end(offset, len);
        }
        let range = self.range.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(done) = self.done.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        match (node.answer_write(local, gone, up_to_date), &self.held) {
            (Err(e), Some((buf, flags))) if gone && up_to_date == 0 => {
                // Held until an up-to-date peer takes it, on a thread of its own (this
                // may be a connection's reader).
                let job = Arc::new(Mutex::new(Some((range, done, e, missed))));
                let (node, buf, flags, j) = (node.clone(), buf.clone(), *flags, job.clone());
                let spawned =
                    thread::Builder::new()
                        .name("repl-held-write".into())
                        .spawn(move || {
                            let taken = j.lock().unwrap_or_else(|p| p.into_inner()).take();
                            if let Some((range, done, e, missed)) = taken {
                                let r = node.write_when_data_returns(&buf, offset, flags, e);
                                drop(range);
                                done(r.and(missed));
                            }
                        });
                if let Err(te) = spawned {
                    tracing::warn!("cannot start a thread to hold a write: {te}");
                    let taken = job.lock().unwrap_or_else(|p| p.into_inner()).take();
                    if let Some((range, done, e, _missed)) = taken {
                        drop(range);
                        done(Err(e));
                    }
                }
            }
            (r, _) => {
                drop(range);
                done(r.and(missed));
            }
        }
    }
}

/// The replicated volume a primary serves.
#[derive(Debug, Clone)]
pub struct Volume(pub Arc<Node>);

impl BlockDevice for Volume {
    fn geometry(&self) -> Geometry {
        Geometry {
            size: self.0.data_size,
            ..self.0.disk.geometry()
        }
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            read_only: false,
            flush: Support::Native,
            fua: Support::Native,
            discard: Support::None,
            write_zeroes: Support::Emulate,
            extents: false,
        }
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.0.check_primary()?;
        self.0.app_io.fetch_add(1, Ordering::Relaxed);
        self.0.read(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.0.write(buf, offset, flags)
    }

    fn write_then(&self, buf: &[u8], offset: u64, flags: WriteFlags, done: WriteDone) {
        self.0.write_then(buf, offset, flags, done);
    }

    fn flush(&self) -> Result<()> {
        self.0.flush()
    }
}

/// The first `size` bytes of the backing device: what a primary writes to a secondary.
#[derive(Debug)]
struct DataArea {
    disk: Arc<dyn BlockDevice>,
    size: u64,
    /// Told when the disk fails (it detaches, as `--on-io-error` says); the error goes
    /// to the primary either way, which drops this node as it drops a lost peer.
    node: std::sync::Weak<Node>,
}

impl DataArea {
    fn seen<T>(&self, r: Result<T>) -> Result<T> {
        if let (Err(e), Some(n)) = (&r, self.node.upgrade()) {
            n.local_failed(e);
        }
        r
    }
}

/// A view of the local disk: each result is seen on its way up. Its `*_then` forms run
/// through the synchronous ones (the local disk completes on the calling thread).
impl cairn_block::Filter for DataArea {
    type Inner = dyn BlockDevice;
    const SYNCHRONOUS: bool = true;
    fn inner(&self) -> impl std::ops::Deref<Target = dyn BlockDevice> + '_ {
        &*self.disk
    }
    fn geometry(&self) -> Geometry {
        Geometry {
            size: self.size,
            ..self.disk.geometry()
        }
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities {
            discard: Support::None,
            extents: false,
            ..self.disk.capabilities()
        }
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<()> {
        self.seen(self.disk.read_at(buf, offset))
    }
    fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
        self.seen(self.disk.write_at(buf, offset, flags))
    }
    fn flush(&self) -> Result<()> {
        self.seen(self.disk.flush())
    }
    fn write_zeroes(&self, offset: u64, len: u64, flags: WriteFlags) -> Result<()> {
        self.seen(self.disk.write_zeroes(offset, len, flags))
    }
    /// Its capabilities say none: a primary never sends one.
    fn discard(&self, _offset: u64, _len: u64) -> Result<()> {
        Err(io_err(ErrorKind::Unsupported, "discard"))
    }
    /// Its capabilities say none: what the trait's default says.
    fn extents(&self, offset: u64, len: u64) -> Result<Vec<cairn_block::Extent>> {
        Ok(vec![cairn_block::Extent {
            offset,
            length: len,
            hole: false,
            zero: false,
        }])
    }
}

cairn_block::filter_device!(DataArea);

/// The error for a fence epoch at its maximum: a new one cannot be taken (wrapped to 0,
/// every peer would refuse it, or worse, admit an old primary's queued writes).
pub(crate) fn epoch_exhausted(epoch: u64) -> String {
    format!(
        "the fence epoch is at its maximum ({epoch}); a new one cannot be taken, so this \
         node cannot write to its peers (recreate the metadata with `cairn repl create-md \
         --force` on every node)"
    )
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::fake_etcd::FakeEtcd;
    use crate::store::{create, CreateParams, Store};
    use cairn_block::MemDisk;
    use cairn_cluster::Etcd;

    /// The data area a secondary writes shows a smaller size, no discard and no
    /// extents, and runs its `*_then` forms through the synchronous ones (where it sees
    /// each result); the rest reaches the disk as it was called.
    #[test]
    fn the_data_area_passes_through_all_it_does_not_change() {
        use cairn_block::testkit::conformance::{check_pass_through, Method};
        check_pass_through(
            &|d| {
                Arc::new(DataArea {
                    disk: d,
                    size: 512 << 10,
                    node: std::sync::Weak::new(),
                })
            },
            &[
                Method::Geometry,
                Method::Capabilities,
                Method::CompletesLater,
                Method::ReadThen,
                Method::WriteThen,
                Method::FlushThen,
                Method::DiscardThen,
                Method::Discard,
                Method::Extents,
            ],
        );
    }

    fn fresh() -> Arc<dyn BlockDevice> {
        fresh_of(64 << 20)
    }

    fn open(dev: &Arc<dyn BlockDevice>) -> Arc<Node> {
        let meta = Box::new(Store::open(dev.clone()).unwrap());
        Node::open(NodeConfig::for_tests("home", "a", "b"), dev.clone(), meta).unwrap()
    }

    #[test]
    fn a_crashed_primary_marks_its_activity_log_out_of_sync_and_clears_it() {
        let dev = fresh();
        {
            let st = Store::open(dev.clone()).unwrap();
            let mut p = st.load().unwrap();
            p.current = 0x1000;
            p.primary = true;
            st.save(&p).unwrap();
            st.write_al(&[2, 5]).unwrap();
        }
        let node = open(&dev);
        let s = node.status();
        assert!(s.crashed_primary, "the crash is remembered");
        assert_eq!(s.role, Role::Secondary, "a node always starts secondary");
        // Exactly the two 1 MiB extents, no more.
        assert_eq!(s.peers[0].out_of_sync_bytes, 2 << 20);
        let peer = &node.peers[0];
        assert!(peer.bitmap.get((2 << 20) / 4096) && peer.bitmap.get((6 << 20) / 4096 - 1));
        assert!(!peer.bitmap.get((3 << 20) / 4096));
        drop(node);
        // On disk: the log is empty, PRIMARY is off, CRASHED_PRIMARY and the bits stay.
        let st = Store::open(dev.clone()).unwrap();
        assert!(st.read_al().unwrap().is_empty());
        let p = st.load().unwrap();
        assert!(!p.primary && p.crashed_primary);
        let again = open(&dev);
        assert_eq!(again.status().peers[0].out_of_sync_bytes, 2 << 20);
    }

    fn open_quorum(
        dev: &Arc<dyn BlockDevice>,
        etcd: &FakeEtcd,
        ttl: u64,
        on_loss: OnLoss,
    ) -> Arc<Node> {
        open_quorum_at(dev, &etcd.url, ttl, on_loss, false)
    }

    fn open_quorum_at(
        dev: &Arc<dyn BlockDevice>,
        urls: &str,
        ttl: u64,
        on_loss: OnLoss,
        auto_failover: bool,
    ) -> Arc<Node> {
        let meta = Box::new(Store::open(dev.clone()).unwrap());
        let mut cfg = NodeConfig::for_tests("home", "a", "b");
        cfg.quorum = Some(Quorum {
            etcd: Etcd::new(urls).unwrap(),
            ttl: Duration::from_secs(ttl),
            auto_failover,
            on_loss,
        });
        Node::open(cfg, dev.clone(), meta).unwrap()
    }

    /// The primary lease's holder in etcd, as its value says ("b epoch 9").
    fn holder(etcd: &FakeEtcd) -> Option<String> {
        let e = Etcd::new(&etcd.url).unwrap();
        let kv = e.get(quorum::primary_key("home").as_bytes()).unwrap()?;
        Some(String::from_utf8_lossy(&kv.value).into_owned())
    }

    /// Node b takes the primary role in etcd (its own lease, a transaction).
    fn b_takes_over(etcd: &FakeEtcd) {
        let e = Etcd::new(&etcd.url).unwrap();
        let (lease, _) = e.grant(30).unwrap();
        let key = quorum::primary_key("home");
        assert!(matches!(
            e.create_if_absent(key.as_bytes(), b"b epoch 9", lease)
                .unwrap(),
            cairn_cluster::etcd::Created::Created { .. }
        ));
    }

    fn wait_lost(node: &Node) {
        let t0 = Instant::now();
        while !node.status().quorum.unwrap().contains("lost") {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the lease never lapsed"
            );
            thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_superseded_primary_steps_down_by_itself_and_fails_its_frozen_requests() {
        let etcd = FakeEtcd::start();
        let dev = fresh();
        let node = open_quorum_at(&dev, &etcd.url, 2, OnLoss::Freeze, true);
        node.promote(true).unwrap();
        node.start_failover_watch();
        let vol = Volume(node.clone());
        vol.write_at(&[1u8; 4096], 0, WriteFlags::NONE).unwrap();
        // The lease runs out in etcd (a partition): I/O freezes.
        etcd.expire(node.lease_guard().unwrap().id());
        wait_lost(&node);
        let (tx, rx) = std::sync::mpsc::channel();
        let v = vol.clone();
        thread::spawn(move || tx.send(v.write_at(&[2u8; 4096], 8192, WriteFlags::NONE)));
        // Nobody holds the primary key: no reason to step down, the request waits.
        thread::sleep(Duration::from_millis(1200));
        assert!(
            rx.try_recv().is_err(),
            "a request went through without a lease"
        );
        assert_eq!(
            node.role(),
            Role::Primary,
            "stepped down with nobody else primary"
        );
        // Another node takes the lease: the watch reads it and this node steps down.
        b_takes_over(&etcd);
        let e = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the frozen request still waits after another node took over")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Shutdown, "{e}");
        assert!(
            e.to_string()
                .contains("no longer primary: b holds the primary lease"),
            "{e}"
        );
        let t0 = Instant::now();
        while node.role() != Role::Secondary {
            assert!(t0.elapsed() < Duration::from_secs(5), "never stepped down");
            thread::sleep(Duration::from_millis(20));
        }
        let s = node.status();
        let ev = s
            .events
            .iter()
            .rev()
            .find(|e| e.kind == "demoted")
            .expect("a demoted event");
        assert!(
            ev.message.contains("by itself") && ev.message.contains("b holds"),
            "{}",
            ev.message
        );
        assert!(!node.persisted().primary, "the metadata still says primary");
        let mut b = [0u8; 4096];
        dev.read_at(&mut b, 8192).unwrap();
        assert_eq!(b, [0u8; 4096], "the failed request was written");
        // The new holder's key is untouched (the stale lease's revoke is harmless), and as
        // a secondary with automatic failover this node does not contest it.
        thread::sleep(Duration::from_millis(800));
        assert_eq!(holder(&etcd).as_deref(), Some("b epoch 9"));
        assert_eq!(node.role(), Role::Secondary);
        node.shutdown().unwrap();
    }

    #[test]
    fn without_automatic_failover_a_superseded_primary_waits_for_the_operator() {
        let etcd = FakeEtcd::start();
        let dev = fresh();
        let node = open_quorum_at(&dev, &etcd.url, 2, OnLoss::Error, false);
        node.promote(true).unwrap();
        node.start_failover_watch();
        etcd.expire(node.lease_guard().unwrap().id());
        wait_lost(&node);
        b_takes_over(&etcd);
        thread::sleep(Duration::from_millis(1200));
        assert_eq!(node.role(), Role::Primary);
        let e = Volume(node.clone())
            .write_at(&[1u8; 4096], 0, WriteFlags::NONE)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
        node.demote().unwrap();
    }

    #[test]
    fn an_unreachable_first_etcd_endpoint_is_passed_over() {
        let etcd = FakeEtcd::start();
        let closed = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let dev = fresh();
        let node = open_quorum_at(
            &dev,
            &format!("{closed},{}", etcd.url),
            30,
            OnLoss::Error,
            false,
        );
        node.promote(true).unwrap();
        assert_eq!(holder(&etcd).as_deref(), Some("a epoch 1"));
        // The write marks the absent peer outdated through the same client, and the lease
        // keeps being renewed.
        Volume(node.clone())
            .write_at(&[1u8; 4096], 0, WriteFlags::NONE)
            .unwrap();
        assert!(outdated_b(&etcd).is_some(), "b marked outdated");
        assert!(node.status().quorum.unwrap().contains("held"));
        node.demote().unwrap();
        assert_eq!(holder(&etcd), None, "the lease given back");
    }

    fn outdated_b(etcd: &FakeEtcd) -> Option<Vec<u8>> {
        let key = quorum::outdated_key("home", "b");
        let e = Etcd::new(&etcd.url).unwrap();
        e.get(key.as_bytes()).unwrap().map(|kv| kv.value)
    }

    #[test]
    fn the_generation_moves_on_when_the_absent_peer_is_marked_outdated() {
        let etcd = FakeEtcd::start();
        let dev = fresh();
        let node = open_quorum(&dev, &etcd, 30, OnLoss::Error);
        node.promote(true).unwrap();
        let first = node.status().generations.current;
        assert_eq!(node.persisted().peers[0].bitmap_uuid, 0);
        // The peer (nobody listens at its address) misses the first write: it is marked
        // outdated and this node's data takes a generation it does not hold, before the
        // write is acknowledged.
        let vol = Volume(node.clone());
        vol.write_at(&[1u8; 4096], 0, WriteFlags::NONE).unwrap();
        assert!(outdated_b(&etcd).is_some(), "b marked outdated");
        let second = node.status().generations.current;
        assert_ne!(second, first);
        assert_eq!(node.persisted().peers[0].bitmap_uuid, first);
        // Once per absence.
        vol.write_at(&[2u8; 4096], 4096, WriteFlags::NONE).unwrap();
        vol.flush().unwrap();
        assert_eq!(node.status().generations.current, second);
        node.demote().unwrap();
    }

    #[test]
    fn a_primary_whose_lease_is_gone_in_etcd_marks_nothing_and_acknowledges_nothing() {
        let etcd = FakeEtcd::start();
        let dev = fresh();
        let node = open_quorum(&dev, &etcd, 30, OnLoss::Error);
        node.promote(true).unwrap();
        let before = node.status().generations.current;
        // The lease ends in etcd (its TTL ran out there; the peer may be primary by now)
        // long before this node's own deadline, 27 s away.
        etcd.expire(node.lease_guard().unwrap().id());
        let vol = Volume(node.clone());
        let e = vol.write_at(&[1u8; 4096], 0, WriteFlags::NONE).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Fenced, "{e}");
        assert_eq!(
            outdated_b(&etcd),
            None,
            "a stale primary marked its peer outdated"
        );
        assert_eq!(
            node.status().generations.current,
            before,
            "no new generation"
        );
        let q = node.status().quorum.unwrap();
        assert!(q.contains("lost"), "{q}");
        assert!(vol.read_at(&mut [0u8; 4096], 0).is_err());
        node.demote().unwrap();
    }

    #[test]
    fn a_frozen_request_goes_on_when_the_lease_turns_out_to_be_held() {
        let etcd = FakeEtcd::start();
        let dev = fresh();
        let node = open_quorum(&dev, &etcd, 2, OnLoss::Freeze);
        node.promote(true).unwrap();
        let vol = Volume(node.clone());
        vol.write_at(&[1u8; 4096], 0, WriteFlags::NONE).unwrap();
        // No keepalive is answered (etcd elects a leader, say) past the lease's margin:
        // I/O freezes.
        etcd.stall_keepalives(true);
        let t0 = Instant::now();
        while !node.status().quorum.unwrap().contains("lost") {
            assert!(
                t0.elapsed() < Duration::from_secs(5),
                "the lease never lapsed"
            );
            thread::sleep(Duration::from_millis(20));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        let v = vol.clone();
        thread::spawn(move || tx.send(v.write_at(&[2u8; 4096], 8192, WriteFlags::NONE)));
        thread::sleep(Duration::from_millis(500));
        assert!(
            rx.try_recv().is_err(),
            "a request went through while the lease was lost"
        );
        // The next keepalive is answered: etcd held the lease all along. The frozen
        // request goes on.
        etcd.stall_keepalives(false);
        let r = rx.recv_timeout(Duration::from_secs(5));
        node.demote().unwrap();
        r.expect("the frozen request still waits with the lease held again")
            .unwrap();
        let mut b = [0u8; 4096];
        dev.read_at(&mut b, 8192).unwrap();
        assert_eq!(b, [2u8; 4096]);
    }

    #[test]
    fn blank_data_needs_force_and_an_unreachable_peer_gets_a_bitmap_base() {
        let dev = fresh();
        let node = open(&dev);
        let e = node.promote(false).unwrap_err();
        assert!(e.contains("--force"), "{e}");
        node.promote(true).unwrap();
        let s = node.status();
        assert_eq!(s.role, Role::Primary);
        assert_eq!(s.epoch, 1);
        // The peer (nobody listens at its address) missed the start: a write marks it.
        let vol = Volume(node.clone());
        vol.write_at(&[7u8; 8192], 1 << 20, WriteFlags::NONE)
            .unwrap();
        assert_eq!(node.status().peers[0].out_of_sync_bytes, 8192);
        // Application I/O is counted for the rate controller (rate.rs).
        let mut buf = [0u8; 4096];
        vol.read_at(&mut buf, 0).unwrap();
        assert_eq!(node.app_io.load(Ordering::Relaxed), 2);
        node.demote().unwrap();
        assert!(
            vol.write_at(&[7u8; 4096], 0, WriteFlags::NONE).is_err(),
            "a secondary refuses writes"
        );
        // The next promotion, still alone, takes a new generation and epoch.
        let before = node.status().generations.current;
        node.promote(false).unwrap();
        let s = node.status();
        assert_ne!(s.generations.current, before);
        assert_eq!(s.epoch, 2);
        node.demote().unwrap();
    }

    /// Node a with peers b and c (nobody answers at their addresses), its data in
    /// generation 0x1000 and its fence token from `follows`' last data connection.
    fn a_of_three(follows: &str) -> Arc<Node> {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(16 << 20));
        let p = CreateParams {
            max_peers: 2,
            bm_block: 4096,
            al_extent: 1 << 20,
            force: false,
            resource: None,
        };
        create(dev.as_ref(), &p).unwrap();
        let mut cfg = NodeConfig::for_tests("home", "a", "b");
        let mut c = cfg.peers[0].clone();
        c.name = "c".into();
        cfg.peers.push(c);
        let st = Store::open(dev.clone()).unwrap();
        let mut p = st.load().unwrap();
        p.current = 0x1000;
        p.consistent = true;
        p.epoch = 3;
        st.bind_resource(resource_id("home")).unwrap();
        p.fence = Some(FenceToken {
            array: resource_id("home"),
            generation: 3,
            owner: OwnerId {
                node: follows.into(),
                instance: 1,
            },
        });
        st.save(&p).unwrap();
        Node::open(cfg, dev, Box::new(st)).unwrap()
    }

    #[test]
    fn a_promotion_after_the_primary_vanished_verifies_the_other_secondaries() {
        // a followed b; b is not reached: c may hold b's last writes that a lacks, or
        // lack some a holds.
        let node = a_of_three("b");
        node.promote(false).unwrap();
        let flags: Vec<_> = node
            .peers
            .iter()
            .map(|p| p.state().verify_after_failover.clone())
            .collect();
        assert_eq!(flags, [None, Some("b".to_string())]);
        node.demote().unwrap();
        // a's own token (it was primary last, and stopped cleanly): nothing to verify.
        let node = a_of_three("a");
        node.promote(false).unwrap();
        assert!(node
            .peers
            .iter()
            .all(|p| p.state().verify_after_failover.is_none()));
        node.demote().unwrap();
    }

    /// Two primaries (a split brain) reach this secondary a in turn: b's resync began,
    /// then c's. While b's did not finish a looks blank to c (c's bitmaps do not mark
    /// b's copies: only a full resync from c makes a whole); b may not end it once c's
    /// began (c's copies may have landed over b's); c ends it only as the primary a
    /// admitted last.
    #[test]
    fn only_the_last_resync_and_the_last_admitted_primary_end_a_resync() {
        let node = a_of_three("b");
        let gens = |current| Generations {
            current,
            bitmap: 0,
            history: [0x1000, 0],
        };
        let (b, c) = (&node.peers[0], &node.peers[1]);
        assert_eq!(node.view(c).gens.current, 0x1000);
        node.sync_start("b", false).unwrap();
        assert_eq!(node.view(b).gens.current, 0x1000, "b's own resync");
        assert_eq!(node.view(c).gens, Generations::JUST_CREATED);
        let (d, rule) = gen::decide(
            &NodeView {
                gens: gens(0x3000),
                primary: true,
                crashed_primary: false,
                consistent: true,
            },
            &node.view(c),
            gen::Tie::MeSource,
        );
        assert_eq!(
            (d, rule),
            (Decision::SourceFull, gen::Rule::PeerJustCreated)
        );
        node.sync_start("c", true).unwrap();
        assert_eq!(node.view(b).gens, Generations::JUST_CREATED);
        // b's SyncDone, its data connection still the last admitted.
        let e = node.sync_done("b", &gens(0x2000), &[]).unwrap_err();
        assert!(e.contains("not the current one"), "{e}");
        // c's, before its data connection was admitted: refused too.
        assert!(node.sync_done("c", &gens(0x3000), &[]).is_err());
        let mut token = node.persisted().fence.clone().unwrap();
        token.owner.node = "c".into();
        token.generation += 1;
        node.fence_store(&token).unwrap();
        node.sync_done("c", &gens(0x3000), &[]).unwrap();
        let s = node.status();
        assert_eq!(
            (s.disk.as_str(), s.generations.current),
            ("UpToDate", 0x3000)
        );
        // Consistent again: the next resync may be a bitmap one, from anyone.
        node.sync_start("b", false).unwrap();
    }

    /// Overlapping writes that reach the primary in one burst are all answered, and
    /// both replicas end with the same one: the reader runs them one after the other and
    /// holds back each one's request to the peer (cairn_nbd::cork), so the second waits
    /// for a range whose write this very thread has not sent yet. The wait must send it
    /// first, or the connection hangs.
    #[test]
    fn a_burst_of_overlapping_writes_is_answered() {
        use cairn_nbd::{Export, Listen, Server, ServerConfig};
        use std::io::{Read, Write};
        let (_far, far_disk, addr, far_stop) = far_secondary();
        let disk = fresh_of(16 << 20);
        // A loaded machine must not drop the peer (its answers are what is checked).
        let node = node_a_towards(addr, &disk, |cfg| {
            cfg.peer_timeout = Duration::from_secs(30)
        });
        node.promote(true).unwrap();
        let until = Instant::now() + Duration::from_secs(30);
        while node.status().peers[0].replication != Repl::Established {
            assert!(Instant::now() < until, "{:?}", node.status().peers[0]);
            thread::sleep(Duration::from_millis(10));
        }
        let srv = Server::new(ServerConfig::new(vec![Export {
            name: "home".into(),
            description: String::new(),
            device: Arc::new(Volume(node.clone())),
            read_only: false,
        }]))
        .unwrap();
        let l = srv
            .bind(&[Listen::Tcp("127.0.0.1:0".parse().unwrap())])
            .unwrap();
        let Listen::Tcp(at) = l.addresses().remove(0) else {
            panic!("not TCP")
        };
        let stop = srv.shutdown_handle();
        thread::spawn(move || srv.serve(l));

        // The fixed newstyle handshake, by hand (NBD_OPT_EXPORT_NAME, no zeroes).
        let mut s = std::net::TcpStream::connect(at).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&3u32.to_be_bytes()).unwrap();
        let mut opt = Vec::new();
        opt.extend_from_slice(b"IHAVEOPT");
        opt.extend_from_slice(&1u32.to_be_bytes());
        opt.extend_from_slice(&4u32.to_be_bytes());
        opt.extend_from_slice(b"home");
        s.write_all(&opt).unwrap();
        let mut info = [0u8; 10];
        s.read_exact(&mut info).unwrap();
        let request = |cookie: u64, off: u64, fill: u8| {
            let mut r = Vec::with_capacity(28 + 4096);
            r.extend_from_slice(&0x2560_9513u32.to_be_bytes());
            r.extend_from_slice(&0u16.to_be_bytes());
            r.extend_from_slice(&1u16.to_be_bytes()); // WRITE
            r.extend_from_slice(&cookie.to_be_bytes());
            r.extend_from_slice(&off.to_be_bytes());
            r.extend_from_slice(&4096u32.to_be_bytes());
            r.extend_from_slice(&[fill; 4096]);
            r
        };
        let replies = |s: &mut std::net::TcpStream, n: usize| {
            for _ in 0..n {
                let mut r = [0u8; 16];
                s.read_exact(&mut r)
                    .expect("a reply (none within 20 s: the burst hangs)");
                assert_eq!(&r[4..8], &[0, 0, 0, 0], "error in reply {r:?}");
            }
        };
        // Writes one at a time first, until the server runs them on the reader.
        for i in 0..200u64 {
            s.write_all(&request(i + 1, (i % 64) * 65536, 1)).unwrap();
            replies(&mut s, 1);
        }
        for round in 0..20u8 {
            let mut burst = Vec::new();
            for i in 0..8u8 {
                burst.extend(request(1000 + u64::from(i), 4096, round * 8 + i));
            }
            s.write_all(&burst).unwrap();
            replies(&mut s, 8);
            // Writes in flight together may be applied in any order (the NBD protocol
            // promises none, and a request the pool runs can start after a later one
            // the reader runs), but both replicas must apply them in the same one.
            let mut here = vec![0u8; 4096];
            disk.read_at(&mut here, 4096).unwrap();
            let mut there = vec![0u8; 4096];
            far_disk.read_at(&mut there, 4096).unwrap();
            assert!(
                (round * 8..round * 8 + 8).contains(&here[0]) && here.iter().all(|&b| b == here[0]),
                "round {round}: the primary holds {}",
                here[0]
            );
            assert!(
                here == there,
                "round {round}: primary {}, peer {}",
                here[0],
                there[0]
            );
        }
        stop.shutdown();
        far_stop.shutdown();
    }

    pub(super) fn fresh_of(size: u64) -> Arc<dyn BlockDevice> {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(size));
        let p = CreateParams {
            max_peers: 1,
            bm_block: 4096,
            al_extent: 1 << 20,
            force: false,
            resource: None,
        };
        create(dev.as_ref(), &p).unwrap();
        dev
    }

    /// Node "far" on a fresh 16 MiB disk, served to its peers on a loopback port: the
    /// node, its disk, the address and the server's handle.
    pub(super) fn far_secondary() -> (
        Arc<Node>,
        Arc<dyn BlockDevice>,
        cairn_nbd::Listen,
        cairn_nbd::ShutdownHandle,
    ) {
        let far_disk = fresh_of(16 << 20);
        let meta = Box::new(Store::open(far_disk.clone()).unwrap());
        let far = Node::open(
            NodeConfig::for_tests("home", "far", "a"),
            far_disk.clone(),
            meta,
        )
        .unwrap();
        let (addr, stop) = serve_peers(&far);
        (far, far_disk, addr, stop)
    }

    /// Node "a" on `disk`, with "far" at `addr` as its peer, its configuration changed by
    /// `adjust` first.
    pub(super) fn node_a_towards(
        addr: cairn_nbd::Listen,
        disk: &Arc<dyn BlockDevice>,
        adjust: impl FnOnce(&mut NodeConfig),
    ) -> Arc<Node> {
        let mut cfg = NodeConfig::for_tests("home", "a", "far");
        cfg.peers[0].opts = ClientOptions::new(addr, "home");
        adjust(&mut cfg);
        Node::open(
            cfg,
            disk.clone(),
            Box::new(Store::open(disk.clone()).unwrap()),
        )
        .unwrap()
    }

    /// Serves `node` to its peers as `cairn repl up` does (the data area behind the
    /// fence gate, and the replication handshake) on a loopback port.
    pub(super) fn serve_peers(node: &Arc<Node>) -> (cairn_nbd::Listen, cairn_nbd::ShutdownHandle) {
        use cairn_nbd::{Listen, Server, ServerConfig};
        let target = crate::target::Target::new(node);
        let mut cfg = ServerConfig::new(Vec::new());
        cfg.allow_empty = true;
        cfg.fence = Some(Arc::new(target.clone()));
        cfg.extension = Some(Arc::new(target));
        let peers = Server::new(cfg).unwrap();
        let mut ccfg = ServerConfig::new(Vec::new());
        ccfg.allow_empty = true;
        let clients = Server::new(ccfg).unwrap();
        let l = peers
            .bind(&[Listen::Tcp("127.0.0.1:0".parse().unwrap())])
            .unwrap();
        let addr = l.addresses().remove(0);
        node.attach(Exports {
            clients: clients.exports_handle(),
            peers: peers.exports_handle(),
        })
        .unwrap();
        let stop = peers.shutdown_handle();
        thread::spawn(move || peers.serve(l));
        (addr, stop)
    }

    /// A primary whose etcd lease runs out during a resync stops copying and waits,
    /// without spinning, until the lease is valid again; then the resync ends as usual.
    #[test]
    fn a_resync_waits_for_a_lost_lease_without_spinning() {
        let (_far, far_disk, addr, far_stop) = far_secondary();
        let disk = fresh_of(16 << 20);
        disk.write_at(&[0x5a; 1 << 20], 3 << 20, WriteFlags::NONE)
            .unwrap();
        let node = node_a_towards(addr, &disk, |cfg| {
            // Slow enough to be caught half-way: about 2 s for the 15 MiB of data.
            cfg.resync = RateLimits {
                min_bytes_per_sec: 1 << 20,
                max_bytes_per_sec: 8 << 20,
            };
        });
        let guard = LeaseGuard::for_tests(Instant::now() + Duration::from_secs(3600));
        node.promote(true).unwrap();
        *node.guard.write().unwrap() = Some(guard.clone());
        let done = || node.peers[0].resync_done.load(Ordering::Relaxed);
        let until = Instant::now() + Duration::from_secs(20);
        while done() == 0 {
            assert!(
                Instant::now() < until,
                "no resync: {:?}",
                node.status().peers[0]
            );
            thread::sleep(Duration::from_millis(10));
        }

        // The lease runs out: what was in flight ends, then nothing moves.
        guard.set_deadline(Instant::now());
        thread::sleep(Duration::from_millis(300));
        let passes = || node.peers[0].state().resync.as_ref().map(|r| r.passes);
        let (held, begun) = (done(), passes());
        thread::sleep(Duration::from_secs(1));
        assert_eq!(done(), held, "copies went on without the lease");
        assert_eq!(
            passes(),
            begun,
            "passes that copy nothing, one after the other"
        );
        let s = node.status();
        assert_eq!(s.peers[0].replication, Repl::SyncSource, "{s:?}");
        assert!(s.peers[0].out_of_sync_bytes > 0);
        assert_eq!(
            s.events.iter().filter(|e| e.kind == "lease-lost").count(),
            1,
            "{:?}",
            s.events
        );

        // A keepalive got through after all: the resync picks up where it was.
        guard.set_deadline(Instant::now() + Duration::from_secs(3600));
        let until = Instant::now() + Duration::from_secs(30);
        while node.status().peers[0].replication != Repl::Established {
            assert!(
                Instant::now() < until,
                "no end: {:?}",
                node.status().peers[0]
            );
            thread::sleep(Duration::from_millis(20));
        }
        assert!(node.status().events.iter().any(|e| e.kind == "resync-done"));
        let n = usize::try_from(node.data_size).unwrap();
        let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
        disk.read_at(&mut a, 0).unwrap();
        far_disk.read_at(&mut b, 0).unwrap();
        assert!(a == b, "the replicas differ after the resync");
        node.demote().unwrap();
        far_stop.shutdown();
    }

    /// The secondary sees its primary's data connection end (here the primary steps
    /// down; a kill or a keepalive that finds no answer ends it the same way): its status
    /// no longer shows a primary that is gone as connected and in sync.
    #[test]
    fn a_secondary_sees_its_primary_go() {
        let (far, _far_disk, addr, far_stop) = far_secondary();
        let disk = fresh_of(16 << 20);
        let node = node_a_towards(addr, &disk, |_| {});
        node.promote(true).unwrap();
        let seen = |want: fn(Conn) -> bool| {
            let until = Instant::now() + Duration::from_secs(20);
            loop {
                let s = far.status();
                if want(s.peers[0].connection) {
                    return s;
                }
                assert!(Instant::now() < until, "{:?}", s.peers[0]);
                thread::sleep(Duration::from_millis(10));
            }
        };
        seen(|c| c == Conn::Connected);
        node.demote().unwrap();
        let s = seen(|c| c != Conn::Connected);
        assert_eq!(s.peers[0].connection, Conn::Connecting, "{:?}", s.peers[0]);
        assert_eq!(s.peers[0].replication, Repl::Off);
        assert!(
            s.events.iter().any(|e| e.kind == "disconnect"),
            "{:?}",
            s.events
        );
        far_stop.shutdown();
    }

    /// A disk whose write at one offset, once armed, waits until it is let go.
    #[derive(Debug)]
    struct HeldDisk {
        disk: Arc<dyn BlockDevice>,
        at: Mutex<Option<u64>>,
        entered: Mutex<Option<std::sync::mpsc::Sender<()>>>,
        go: Mutex<Option<std::sync::mpsc::Receiver<()>>>,
    }

    impl cairn_block::Filter for HeldDisk {
        type Inner = dyn BlockDevice;
        const SYNCHRONOUS: bool = true;
        fn inner(&self) -> impl std::ops::Deref<Target = dyn BlockDevice> + '_ {
            &*self.disk
        }
        fn write_at(&self, buf: &[u8], offset: u64, flags: WriteFlags) -> Result<()> {
            if *self.at.lock().unwrap() == Some(offset) {
                *self.at.lock().unwrap() = None;
                self.entered
                    .lock()
                    .unwrap()
                    .take()
                    .unwrap()
                    .send(())
                    .unwrap();
                let go = self.go.lock().unwrap().take().unwrap();
                let _ = go.recv_timeout(Duration::from_secs(30));
            }
            self.disk.write_at(buf, offset, flags)
        }
    }

    cairn_block::filter_device!(HeldDisk);

    /// A write that found the peer unconnected, still writing locally while the peer
    /// thread connects it and runs its resync, must be in that resync: its bits used to
    /// be set only after the local write, so a resync that began meanwhile ended without
    /// them and the peer, "in sync", lacked the block.
    #[test]
    fn a_write_in_flight_while_the_peer_connects_is_resynced() {
        let far_disk = fresh_of(16 << 20);
        let far = Node::open(
            NodeConfig::for_tests("home", "far", "a"),
            far_disk.clone(),
            Box::new(Store::open(far_disk.clone()).unwrap()),
        )
        .unwrap();
        let (addr, far_stop) = serve_peers(&far);
        let (entered_tx, entered) = std::sync::mpsc::channel();
        let (go, go_rx) = std::sync::mpsc::channel();
        let held = Arc::new(HeldDisk {
            disk: fresh_of(16 << 20),
            at: Mutex::new(None),
            entered: Mutex::new(Some(entered_tx)),
            go: Mutex::new(Some(go_rx)),
        });
        let disk: Arc<dyn BlockDevice> = held.clone();
        let mut cfg = NodeConfig::for_tests("home", "a", "far");
        cfg.peers[0].opts = ClientOptions::new(addr, "home");
        let node = Node::open(
            cfg,
            disk.clone(),
            Box::new(Store::open(disk.clone()).unwrap()),
        )
        .unwrap();
        node.promote(true).unwrap();
        let repl = || node.status().peers[0].replication;
        let wait_established = |what: &str| {
            let until = Instant::now() + Duration::from_secs(30);
            while repl() != Repl::Established {
                assert!(
                    Instant::now() < until,
                    "{what}: {:?}",
                    node.status().peers[0]
                );
                thread::sleep(Duration::from_millis(10));
            }
        };
        wait_established("the initial sync");
        node.set_connect(Some("far"), false, false).unwrap();
        // A write that finds no link and is held in its local write.
        let at = 5 << 20;
        *held.at.lock().unwrap() = Some(at);
        let w = {
            let node = node.clone();
            thread::spawn(move || Volume(node).write_at(&[0xa5; 4096], at, WriteFlags::NONE))
        };
        entered.recv_timeout(Duration::from_secs(10)).unwrap();
        node.set_connect(Some("far"), true, false).unwrap();
        // The peer connects and resyncs meanwhile; its resync of the write's block waits
        // for the write.
        let until = Instant::now() + Duration::from_secs(3);
        while repl() != Repl::Established && Instant::now() < until {
            thread::sleep(Duration::from_millis(10));
        }
        go.send(()).unwrap();
        w.join().unwrap().unwrap();
        wait_established("the resync after the reconnect");
        let n = usize::try_from(node.data_size).unwrap();
        let (mut a, mut b) = (vec![0u8; n], vec![0u8; n]);
        disk.read_at(&mut a, 0).unwrap();
        far_disk.read_at(&mut b, 0).unwrap();
        let differ: Vec<usize> = (0..n / 4096)
            .filter(|&i| a[i * 4096..(i + 1) * 4096] != b[i * 4096..(i + 1) * 4096])
            .collect();
        assert!(
            differ.is_empty(),
            "blocks that differ with the peer in sync: {differ:?}; out of sync: {} bytes",
            node.status().peers[0].out_of_sync_bytes
        );
        node.demote().unwrap();
        far_stop.shutdown();
    }
}
