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

use cairn_block::BlockDevice;
use serde::{Deserialize, Serialize};

use crate::exports::OpenedExport;

/// One layer of a stack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Unique among all nodes of a daemon: "export:home", "md:<uuid>", "member:<path>",
    /// "luks:<uuid>", "lv:<vg>/<lv>", "file:<path>".
    pub id: String,
    /// "export", "lv", "luks", "md", "member" or "file".
    pub kind: String,
    /// What a person calls it: the export name, `vg/lv`, the array name, the file path.
    pub name: String,
    /// The file or block device, for files and members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// "active", "read-only", "clean", "degraded", "failed", "missing", "faulty", ...
    /// (md's own words for arrays and members).
    pub state: String,
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
}

/// Background work: resync, rebuild, scrub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// "resync", "recovery", "check", "repair".
    pub action: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Recent speed; 0 when not known yet.
    pub bytes_per_sec: u64,
}

impl Eq for Progress {}

/// What an LV export has below it: one stack per PV the VG holds.
#[derive(Debug, Clone)]
pub struct LvLayer {
    pub details: LvDetails,
    /// The PV stacks holding the LV's extents, in the order its extents reach them.
    pub pvs: Vec<OpenedExport>,
    /// Byte offset of the LV's first byte on its first PV.
    pub first_byte: u64,
}

/// The tree for one export: the export node with the stack below as its child.
pub fn describe(e: &OpenedExport) -> Node {
    let top = below(e);
    Node {
        id: format!("export:{}", e.name),
        kind: "export".into(),
        name: e.name.clone(),
        path: None,
        state: if e.read_only { "read-only" } else { "active" }.into(),
        size: e.device.geometry().size,
        geometry: e.device.geometry().into(),
        data_offset: 0,
        md: None,
        luks: None,
        lv: None,
        progress: None,
        children: vec![top],
    }
}

/// The stack under an export (or under a PV of an LV): LV, LUKS, md or file.
fn below(e: &OpenedExport) -> Node {
    if let Some(lv) = &e.lvm {
        let d = &lv.details;
        return Node {
            id: format!("lv:{}/{}", d.vg, d.lv),
            kind: "lv".into(),
            name: format!("{}/{}", d.vg, d.lv),
            path: None,
            state: if e.read_only { "read-only" } else { "active" }.into(),
            size: e.device.geometry().size,
            geometry: e.device.geometry().into(),
            data_offset: lv.first_byte,
            md: None,
            luks: None,
            lv: Some(d.clone()),
            progress: None,
            children: lv.pvs.iter().map(below).collect(),
        };
    }
    let base = base_node(e);
    match &e.luks {
        None => base,
        Some(l) => Node {
            id: format!("luks:{}", l.uuid),
            kind: "luks".into(),
            name: format!("LUKS{} {}", l.version, l.uuid),
            path: None,
            state: if e.read_only { "read-only" } else { "active" }.into(),
            size: e.device.geometry().size,
            geometry: e.device.geometry().into(),
            data_offset: l.data_offset,
            md: None,
            luks: Some(LuksDetails {
                version: l.version,
                uuid: l.uuid.clone(),
                description: l.description.clone(),
                sector_size: l.sector_size,
                payload_offset: l.data_offset,
            }),
            lv: None,
            progress: None,
            children: vec![base],
        },
    }
}

/// The bottom of a stack: an md array with its members, or a file.
fn base_node(e: &OpenedExport) -> Node {
    let path = e.path.display().to_string();
    let Some(array) = &e.md else {
        let (size, geometry) = match &e.base {
            Some(d) => (d.geometry().size, d.geometry().into()),
            None => (e.device.geometry().size, e.device.geometry().into()),
        };
        return Node {
            id: format!("file:{path}"),
            kind: "file".into(),
            name: path.clone(),
            path: Some(path),
            state: if e.read_only { "read-only" } else { "active" }.into(),
            size,
            geometry,
            data_offset: 0,
            md: None,
            luks: None,
            lv: None,
            progress: None,
            children: Vec::new(),
        };
    };
    let r = array.report();
    let g = array.geometry();
    let chunk_bytes = r.chunk_kib.unwrap_or(0) * 1024;
    let data_disks = match array.layout() {
        cairn_md::layout::ArrayLayout::Parity(p) => u32::try_from(p.data_disks()).unwrap_or(0),
        _ if chunk_bytes > 0 => {
            u32::try_from(u64::from(g.optimal_io_size) / chunk_bytes).unwrap_or(0)
        }
        _ => 1,
    };
    let uuid = r.uuid.to_string();
    let children = r
        .members
        .iter()
        .map(|m| {
            let name = m.name.clone().unwrap_or_else(|| "(missing)".into());
            let (size, geometry) = match m.role.and_then(|role| array.member(role as usize)) {
                Some(d) if m.name.is_some() => (d.geometry().size, d.geometry().into()),
                _ => (0, NodeGeometry::from(cairn_block::Geometry::simple(0))),
            };
            Node {
                id: match (&m.name, m.role) {
                    (Some(n), _) => format!("member:{n}"),
                    (None, Some(role)) => format!("member:{uuid}/{role}"),
                    (None, None) => format!("member:{uuid}/?"),
                },
                kind: "member".into(),
                name: name.clone(),
                path: m.name.clone(),
                state: m.state.text().into(),
                size,
                geometry,
                data_offset: 0,
                md: None,
                luks: None,
                lv: None,
                progress: None,
                children: Vec::new(),
            }
        })
        .collect();
    Node {
        id: format!("md:{uuid}"),
        kind: "md".into(),
        name: r.name.clone(),
        path: None,
        state: r.state_text.clone(),
        size: g.size,
        geometry: g.into(),
        data_offset: 0,
        md: Some(MdDetails {
            uuid,
            level: r.level.to_string(),
            layout: r.layout.clone(),
            chunk_bytes,
            raid_devices: r.raid_devices,
            data_disks,
            active_devices: r.active_devices,
            failed_devices: r.failed_devices,
            events: r.events,
        }),
        luks: None,
        lv: None,
        progress: array
            .background()
            .filter(|b| b.state == "running")
            .map(|b| Progress {
                action: b.action.into(),
                done_bytes: b.done_bytes,
                total_bytes: b.total_bytes,
                bytes_per_sec: b.bytes_per_sec,
            }),
        children,
    }
}

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
