//! The stack behind each export, described as a tree: export -> LV -> LUKS -> md ->
//! members. This one description feeds `cairn status`, the control API, the metrics
//! labels and `cairn advise`, so they can never disagree about what is there.
//!
//! ```text
//!   export "home"                 kind "export"
//!   └─ vg0/home                   kind "lv"     (one child per PV the LV uses)
//!      └─ LUKS2 3f2a...           kind "luks"   data_offset = payload offset
//!         └─ md "demo" raid6      kind "md"     (one child per role)
//!            ├─ d0.img            kind "member"
//!            └─ ...
//! ```
//!
//! Every node carries its size and geometry and the byte offset at which its data
//! starts inside the node below (`data_offset`), so alignment can be checked by
//! arithmetic on real offsets. Node ids are stable for the life of the process and name
//! the node in the control API and in metrics labels.

use serde::{Deserialize, Serialize};

/// One layer of a stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Unique among all nodes of a daemon: "export:home", "md:<uuid>", "member:<path>",
    /// "luks:<uuid>", "lv:<vg>/<lv>", "file:<path>".
    pub id: String,
    pub kind: NodeKind,
    /// What a person calls it: the export name, `vg/lv`, the array name, the file path.
    pub name: String,
    /// The file or block device, for files and members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The layer's own state: serving or read-only, md's array flags, md's member
    /// state. In JSON the words status has always shown ("active", "read-only",
    /// "clean, degraded", "active sync", "faulty", ...).
    pub state: NodeState,
    /// A faulty member: why and since when it failed (when this process saw it fail).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<MemberFailure>,
    /// Bytes this node offers to the layer above.
    pub size: u64,
    pub geometry: NodeGeometry,
    /// Byte offset where this node's data starts inside each child (the LUKS payload
    /// offset, the LV's first byte on its first PV); 0 when it starts at the start.
    pub data_offset: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub md: Option<MdDetails>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub luks: Option<LuksDetails>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lv: Option<LvDetails>,
    /// Background work running on this node (resync, rebuild, scrub).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub children: Vec<Node>,
}

impl Node {
    /// A node with no details, progress or children, its data at offset 0.
    pub fn new(
        kind: NodeKind,
        id: String,
        name: String,
        state: NodeState,
        size: u64,
        geometry: NodeGeometry,
    ) -> Node {
        Node {
            id,
            kind,
            name,
            path: None,
            state,
            failure: None,
            size,
            geometry,
            data_offset: 0,
            md: None,
            luks: None,
            lv: None,
            progress: None,
            children: Vec::new(),
        }
    }
}

/// A node's state, taken from its layer's own types. In JSON it is the words status
/// has always shown, so `status --json` readers see no change; reading the words back
/// gives the same variant (md's bare "active" array state reads back as
/// [`NodeState::Active`], which is why [`NodeState::array`] makes it that).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Serving read-write (an export, LV, LUKS volume or file; an md array with no flag
    /// set): "active".
    Active,
    /// Served read-only, or a LUKS volume described from its header and left locked:
    /// "read-only".
    ReadOnly,
    /// An md array: md's state flags ("clean", "clean, degraded", "active, degraded,
    /// recovering", ...).
    Array(cairn_md::ArrayState),
    /// An md member: md's member state ("active sync", "faulty", "removed", "spare", ...).
    Member(cairn_md::MemberState),
}

/// md's member states, by their words.
const MEMBER_STATES: [cairn_md::MemberState; 7] = [
    cairn_md::MemberState::ActiveSync,
    cairn_md::MemberState::Missing,
    cairn_md::MemberState::Faulty,
    cairn_md::MemberState::LeftOut,
    cairn_md::MemberState::Rebuilding,
    cairn_md::MemberState::Spare,
    cairn_md::MemberState::Replacement,
];

impl NodeState {
    /// "active" or "read-only".
    pub fn serving(read_only: bool) -> NodeState {
        if read_only {
            NodeState::ReadOnly
        } else {
            NodeState::Active
        }
    }

    /// An md array's state (md's "active" with no flag is [`NodeState::Active`]).
    pub fn array(s: cairn_md::ArrayState) -> NodeState {
        if s.text() == "active" {
            NodeState::Active
        } else {
            NodeState::Array(s)
        }
    }

    /// The words status shows.
    pub fn text(&self) -> String {
        match self {
            NodeState::Active => "active".into(),
            NodeState::ReadOnly => "read-only".into(),
            NodeState::Array(s) => s.text(),
            NodeState::Member(m) => m.text().into(),
        }
    }

    /// An md array without full redundancy.
    pub fn degraded(&self) -> bool {
        matches!(self, NodeState::Array(s) if s.degraded)
    }

    /// An md member that failed.
    pub fn faulty(&self) -> bool {
        matches!(self, NodeState::Member(cairn_md::MemberState::Faulty))
    }

    /// Reads the words back: md's member words, md's array flags, "active", "read-only".
    pub fn parse(words: &str) -> Option<NodeState> {
        match words {
            "active" => return Some(NodeState::Active),
            "read-only" => return Some(NodeState::ReadOnly),
            _ => {}
        }
        if let Some(m) = MEMBER_STATES.into_iter().find(|m| m.text() == words) {
            return Some(NodeState::Member(m));
        }
        let mut parts = words.split(", ");
        let clean = match parts.next()? {
            "clean" => true,
            "active" => false,
            _ => return None,
        };
        let mut s = cairn_md::ArrayState {
            clean,
            degraded: false,
            resync_pending: false,
            forced: false,
            failed: false,
            recovering: false,
            fenced: false,
        };
        for p in parts {
            let flag = match p {
                "degraded" => &mut s.degraded,
                "FAILED" => &mut s.failed,
                "FENCED" => &mut s.fenced,
                "recovering" => &mut s.recovering,
                "resync pending" => &mut s.resync_pending,
                "forced" => &mut s.forced,
                _ => return None,
            };
            *flag = true;
        }
        Some(NodeState::array(s))
    }
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text())
    }
}

impl Serialize for NodeState {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(&self.text())
    }
}

impl<'de> Deserialize<'de> for NodeState {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<NodeState, D::Error> {
        let words = String::deserialize(d)?;
        NodeState::parse(&words)
            .ok_or_else(|| serde::de::Error::custom(format!("no node state {words:?}")))
    }
}

/// Why and since when an md member failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberFailure {
    /// The I/O error, or the operator's action ("marked faulty by the operator").
    pub reason: String,
    /// RFC 3339, UTC.
    pub since: String,
}

impl From<&cairn_md::Failure> for MemberFailure {
    fn from(f: &cairn_md::Failure) -> MemberFailure {
        let since = i64::try_from(f.since_unix)
            .ok()
            .and_then(|t| time::OffsetDateTime::from_unix_timestamp(t).ok())
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_default();
        MemberFailure {
            reason: f.reason.clone(),
            since,
        }
    }
}

/// What a node is; in JSON its lower-case name ("export", "lv", "luks", "md", "member",
/// "file").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    /// What NBD clients see.
    Export,
    /// An LVM2 logical volume.
    Lv,
    /// A LUKS volume's decrypted payload.
    Luks,
    /// An md array.
    Md,
    /// A member of an md array (a file or block device in a role, spare or failed).
    Member,
    /// A file or block device at the bottom of a stack.
    File,
}

impl NodeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Export => "export",
            NodeKind::Lv => "lv",
            NodeKind::Luks => "luks",
            NodeKind::Md => "md",
            NodeKind::Member => "member",
            NodeKind::File => "file",
        }
    }
}

impl std::str::FromStr for NodeKind {
    type Err = String;

    fn from_str(s: &str) -> Result<NodeKind, String> {
        [
            NodeKind::Export,
            NodeKind::Lv,
            NodeKind::Luks,
            NodeKind::Md,
            NodeKind::Member,
            NodeKind::File,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
        .ok_or_else(|| format!("no node kind {s:?}"))
    }
}

impl std::fmt::Display for NodeKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeGeometry {
    pub logical_block: u32,
    pub physical_block: u32,
    /// The I/O size that performs best: an md array's full stripe.
    pub optimal_io: u32,
}

impl From<cairn_block::Geometry> for NodeGeometry {
    fn from(g: cairn_block::Geometry) -> NodeGeometry {
        NodeGeometry {
            logical_block: g.logical_block_size,
            physical_block: g.physical_block_size,
            optimal_io: g.optimal_io_size,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MdDetails {
    pub uuid: String,
    /// "raid6", "raid10", ...
    pub level: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    /// Chunk size in bytes; 0 for levels without one (RAID1).
    pub chunk_bytes: u64,
    pub raid_devices: u32,
    /// Members holding data in each stripe (raid6: raid_devices - 2).
    pub data_disks: u32,
    pub active_devices: u32,
    pub failed_devices: u32,
    pub events: u64,
    /// The last finished check or repair: mismatched sectors found (md's mismatch_cnt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mismatch_sectors: Option<u64>,
    /// The array's background job, running or last ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<JobSummary>,
}

/// A background job of an md array, for status and events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSummary {
    pub id: u64,
    /// "resync", "recovery", "replace", "check", "repair".
    pub action: String,
    /// "running", "finished", "stopped", "failed: ...".
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LuksDetails {
    pub version: u16,
    pub uuid: String,
    /// "LUKS2 aes-xts-plain64 512-bit, 4096-byte sectors, data at 16777216".
    pub description: String,
    pub sector_size: u32,
    /// Byte offset of the encrypted payload on the device below (= `data_offset`).
    pub payload_offset: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LvDetails {
    pub vg: String,
    pub lv: String,
    pub extent_size: u64,
    /// Byte offset of physical extent 0 on each PV (pe_start), per child in order.
    pub pe_start: u64,
    /// 1 for linear.
    pub stripes: u32,
    /// Bytes per stripe chunk; 0 for linear.
    pub stripe_size: u64,
    /// lvm's `seg_pe_ranges`, e.g. "pv0:2-3 pv1:0-1".
    pub seg_pe_ranges: String,
    /// lvm's segment type of the first segment ("striped", "raid10", "raid5_ls",
    /// "mirror"); empty when not known. For RAID types `stripes` counts data stripes.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub segtype: String,
    /// A RAID LV's last finished check or repair: mismatched sectors found (lvm's
    /// `raid_mismatch_count`, md's mismatch_cnt).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mismatch_sectors: Option<u64>,
}

/// Background work: resync, rebuild, scrub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// "resync", "recovery", "replace", "check", "repair".
    pub action: String,
    /// The member a recovery or replacement writes to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<String>,
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Recent speed; 0 when not known yet.
    pub bytes_per_sec: u64,
}

impl Eq for Progress {}

/// Every node of a tree, breadth first, the root first.
pub fn walk(root: &Node) -> Vec<&Node> {
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let n = out[i];
        i += 1;
        out.extend(n.children.iter());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_keep_their_words_and_read_back_as_the_same_variant() {
        let words = [
            "active",
            "read-only",
            "clean",
            "clean, degraded",
            "active, degraded, recovering",
            "active, degraded, FAILED",
            "active, FENCED",
            "clean, resync pending, forced",
            "active sync",
            "removed",
            "faulty",
            "left out",
            "spare rebuilding",
            "spare",
            "replacement",
        ];
        for w in words {
            let s = NodeState::parse(w).unwrap_or_else(|| panic!("{w}"));
            assert_eq!(s.text(), w);
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(json, format!("{w:?}"));
            assert_eq!(serde_json::from_str::<NodeState>(&json).unwrap(), s);
        }
        assert!(NodeState::parse("clean, degraded").unwrap().degraded());
        assert!(!NodeState::parse("clean").unwrap().degraded());
        assert!(NodeState::parse("faulty").unwrap().faulty());
        assert_eq!(NodeState::parse("sideways"), None);
        assert_eq!(NodeState::parse("clean, sideways"), None);
        // md's bare "active" is the serving state, whichever way it is built.
        let bare = cairn_md::ArrayState {
            clean: false,
            degraded: false,
            resync_pending: false,
            forced: false,
            failed: false,
            recovering: false,
            fenced: false,
        };
        assert_eq!(NodeState::array(bare), NodeState::Active);
    }
}
