//! Describing an opened stack: the [`Node`] tree of an export (status, the control API,
//! metrics labels and advise all read this one tree), and its stack in words for the NBD
//! export description.

use cairn_block::BlockDevice;

use crate::export::{Layer, OpenedExport};
use crate::node::{
    JobSummary, LuksDetails, LvDetails, MdDetails, MemberFailure, Node, NodeKind, NodeState,
    Progress,
};

/// Active, or read-only for an export served read-only.
fn mode(e: &OpenedExport) -> NodeState {
    NodeState::serving(e.read_only)
}

/// The tree for one export: the export node with the stack below as its child.
pub fn describe(e: &OpenedExport) -> Node {
    let g = e.geometry();
    Node {
        children: vec![below(e)],
        ..Node::new(
            NodeKind::Export,
            format!("export:{}", e.name),
            e.name.clone(),
            mode(e),
            g.size,
            g.into(),
        )
    }
}

/// The stack under an export (or under a PV of an LV), each layer describing itself and
/// the layers it owns: LV, LUKS, md or file.
fn below(e: &OpenedExport) -> Node {
    let g = e.geometry();
    match &e.layer {
        Layer::Lv(lv) => {
            let d = &lv.details;
            let name = format!("{}/{}", d.vg, d.lv);
            // A RAID LV's last scrub, as an md array's shows it.
            let mismatch_sectors = lv
                .array()
                .and_then(|a| a.last_scrub())
                .filter(|s| s.complete)
                .map(|s| s.mismatch_sectors);
            // A degraded RAID LV says so, as an md array does; the PV under a failed
            // image says which image failed, why and since when.
            let report = lv.array().map(|a| a.report());
            let state = match &report {
                Some(r) if r.state.degraded || r.state.failed || r.state.recovering => {
                    NodeState::array(r.state)
                }
                _ => mode(e),
            };
            let image_pvs = lv.volume.raid_image_pvs();
            let children = lv
                .pvs
                .iter()
                .map(|pv| {
                    let mut n = below(pv);
                    if let Some(r) = &report {
                        mark_failed_images(&mut n, &crate::lvm::pv_name(pv), r, &image_pvs);
                    }
                    n
                })
                .collect();
            Node {
                data_offset: lv.first_byte,
                lv: Some(LvDetails {
                    mismatch_sectors,
                    ..d.clone()
                }),
                // A RAID LV's rebuild, resync or scrub, as an md array's shows.
                progress: lv.array().and_then(|a| progress(a)),
                children,
                ..Node::new(
                    NodeKind::Lv,
                    format!("lv:{name}"),
                    name,
                    state,
                    g.size,
                    g.into(),
                )
            }
        }
        Layer::Luks {
            info: l,
            below: under,
            ..
        } => Node {
            data_offset: l.data_offset,
            luks: Some(LuksDetails {
                version: l.version,
                uuid: l.uuid.clone(),
                description: l.description.clone(),
                sector_size: l.sector_size,
                payload_offset: l.data_offset,
            }),
            children: vec![below(under)],
            ..Node::new(
                NodeKind::Luks,
                format!("luks:{}", l.uuid),
                format!("LUKS{} {}", l.version, l.uuid),
                mode(e),
                g.size,
                g.into(),
            )
        },
        Layer::Md(array) => md_node(array),
        Layer::File => {
            let path = e.path.display().to_string();
            Node {
                path: Some(path.clone()),
                ..Node::new(
                    NodeKind::File,
                    format!("file:{path}"),
                    path,
                    mode(e),
                    g.size,
                    g.into(),
                )
            }
        }
    }
}

/// The PV node `n` (called `pv`) of a RAID LV whose array reports `r`: when an image
/// with extents on it failed, the PV shows md's "faulty" and the image's failure (the
/// image named in the reason).
fn mark_failed_images(
    n: &mut Node,
    pv: &str,
    r: &cairn_md::report::ArrayReport,
    image_pvs: &[Vec<String>],
) {
    for (i, pvs) in image_pvs.iter().enumerate() {
        if !pvs.iter().any(|p| p == pv) {
            continue;
        }
        let failed = r.members.iter().find(|m| {
            m.role.and_then(|role| usize::try_from(role).ok()) == Some(i)
                && m.state == cairn_md::MemberState::Faulty
        });
        if let Some(m) = failed {
            n.state = NodeState::Member(cairn_md::MemberState::Faulty);
            let image = m.name.clone().unwrap_or_else(|| format!("image {i}"));
            n.failure = Some(match &m.failure {
                Some(f) => {
                    let mut f = MemberFailure::from(f);
                    f.reason = format!("image {image} failed: {}", f.reason);
                    f
                }
                None => MemberFailure {
                    reason: format!("image {image} failed"),
                    since: String::new(),
                },
            });
            return;
        }
    }
}

/// An md array with its members.
fn md_node(array: &cairn_md::Array) -> Node {
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
            // Size 0 stands for "not known" (a missing or left-out member): status
            // prints no size for it.
            let in_role = matches!(
                m.state,
                cairn_md::MemberState::ActiveSync | cairn_md::MemberState::Rebuilding
            );
            let mg = match m.role.and_then(|role| array.member(role as usize)) {
                Some(d) if in_role && m.name.is_some() => d.geometry(),
                _ => cairn_block::Geometry::simple(m.size_bytes.unwrap_or(0)),
            };
            let id = match (&m.name, m.role) {
                (Some(n), _) => format!("member:{n}"),
                (None, Some(role)) => format!("member:{uuid}/{role}"),
                (None, None) => format!("member:{uuid}/?"),
            };
            Node {
                path: m.name.clone(),
                failure: m.failure.as_ref().map(MemberFailure::from),
                ..Node::new(
                    NodeKind::Member,
                    id,
                    name,
                    NodeState::Member(m.state),
                    mg.size,
                    mg.into(),
                )
            }
        })
        .collect();
    Node {
        md: Some(MdDetails {
            uuid: uuid.clone(),
            level: r.level.to_string(),
            layout: r.layout.clone(),
            chunk_bytes,
            raid_devices: r.raid_devices,
            data_disks,
            active_devices: r.active_devices,
            failed_devices: r.failed_devices,
            events: r.events,
            mismatch_sectors: array
                .last_scrub()
                .filter(|s| s.complete)
                .map(|s| s.mismatch_sectors),
            job: array.background().map(|b| JobSummary {
                id: b.id,
                action: b.action.into(),
                state: b.state,
                member: b.member,
            }),
        }),
        progress: progress(array),
        children,
        ..Node::new(
            NodeKind::Md,
            format!("md:{uuid}"),
            r.name.clone(),
            NodeState::array(r.state),
            g.size,
            g.into(),
        )
    }
}

/// The array's background work while it runs.
fn progress(array: &cairn_md::Array) -> Option<Progress> {
    array
        .background()
        .filter(|b| b.state == "running")
        .map(|b| Progress {
            action: b.action.into(),
            member: b.member.clone(),
            done_bytes: b.done_bytes,
            total_bytes: b.total_bytes,
            bytes_per_sec: b.bytes_per_sec,
        })
}

/// The NBD description of an export: its stack from the top, e.g. "LV vg0/home over
/// LUKS2 aes-xts-plain64 ... over raid6 over d0.img, d1.img, d2.img, d3.img (clean)".
pub fn export_description(e: &OpenedExport) -> String {
    match &e.layer {
        Layer::Lv(lv) => {
            let pvs: Vec<String> = lv.pvs.iter().map(export_description).collect();
            format!(
                "LV {}/{} over {}",
                lv.details.vg,
                lv.details.lv,
                pvs.join(" + ")
            )
        }
        Layer::Luks { info, below, .. } => {
            format!("{} over {}", info.description, export_description(below))
        }
        Layer::Md(a) => md_description(a),
        Layer::File => e.path.display().to_string(),
    }
}

/// "raid6 over d0.img, d1.img, d2.img, d3.img (clean, degraded)".
pub fn md_description(a: &cairn_md::Array) -> String {
    let r = a.report();
    let members: Vec<String> = r
        .members
        .iter()
        .filter(|m| m.state == cairn_md::MemberState::ActiveSync)
        .filter_map(|m| m.name.clone())
        .collect();
    format!("{} over {} ({})", r.level, members.join(", "), r.state_text)
}
