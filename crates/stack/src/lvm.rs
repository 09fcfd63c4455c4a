//! LVs as exports (`cairn serve --lvm`): the PV stacks below are grouped into their
//! volume groups, each VG is opened from its PVs, and every LV cairn can map becomes an
//! export named `VG/LV`, as `vgchange -ay` makes /dev/VG/LV.
//!
//! ```text
//!   PV stacks (files, md arrays, LUKS volumes)  ─ cairn_lvm::probe ─> grouped by VG uuid
//!   each VG ─ Vg::open ─> visible, mappable LVs ─> OpenedExport "VG/LV" with the PV
//!                                                  stacks kept below it (status tree)
//! ```

use std::sync::Arc;

use cairn_block::{BlockDevice, ErrorKind};
use cairn_lvm::{OpenOptions, PvDevice, Vg};

use crate::error::{Result, StackError};
use crate::export::OpenedExport;
use crate::export::{Layer, LvLayer};
use crate::node::LvDetails;

/// How a PV stack is named in messages and in the metadata's device hint.
pub(crate) fn pv_name(e: &OpenedExport) -> String {
    match (e.md(), e.luks()) {
        (Some(a), Some(_)) => format!("LUKS on md array {}", a.report().name),
        (Some(a), None) => format!("md array {}", a.report().name),
        _ => e.path.display().to_string(),
    }
}

/// The volume group a PV stack belongs to: (VG uuid, VG name), or why it is not usable.
pub fn vg_of(pv: &OpenedExport) -> Result<(String, String)> {
    let shown = pv_name(pv);
    let info = cairn_lvm::probe(&*pv.device)
        .map_err(|e| StackError::new(format!("{shown}: cannot read its LVM2 label: {e}")))?
        .ok_or_else(|| {
            StackError::new(format!(
                "{shown} holds no LVM2 physical volume label; make it one with `cairn lvm \
                 pvcreate` and a VG with `cairn lvm vgcreate`"
            ))
        })?;
    match (info.vg_uuid, info.vg_name) {
        (Some(uuid), Some(name)) => Ok((uuid, name)),
        _ => Err(StackError::new(match info.metadata_error {
            Some(why) => format!("{shown}: its LVM2 metadata cannot be read: {why}"),
            None => format!(
                "{shown} is an LVM2 PV in no volume group; add it to one with `cairn lvm \
                 vgcreate` or `vgextend`"
            ),
        })),
    }
}

/// PV stacks grouped by volume group, in the order they were given.
#[derive(Debug, Default)]
pub struct VgGroups(Vec<(String, String, Vec<OpenedExport>)>);

impl VgGroups {
    /// Adds `pv` to the group of VG `uuid` (named `name`).
    pub fn add(&mut self, (uuid, name): (String, String), pv: OpenedExport) {
        match self.0.iter_mut().find(|g| g.0 == uuid) {
            Some(g) => g.2.push(pv),
            None => self.0.push((uuid, name, vec![pv])),
        }
    }

    /// Each group: the VG's name and its PV stacks.
    pub fn into_groups(self) -> impl Iterator<Item = (String, Vec<OpenedExport>)> {
        self.0.into_iter().map(|(_, name, pvs)| (name, pvs))
    }
}

/// Opens the volume groups on `pvs` and returns one export per LV. Every PV must carry
/// an LVM2 label and every PV of each VG must be there.
pub fn open_lv_exports(pvs: Vec<OpenedExport>, read_only: bool) -> Result<Vec<OpenedExport>> {
    let mut groups = VgGroups::default();
    for pv in pvs {
        groups.add(vg_of(&pv)?, pv);
    }
    let mut out = Vec::new();
    for (vg_name, stacks) in groups.into_groups() {
        out.extend(open_vg_exports(&vg_name, stacks, read_only)?);
    }
    Ok(out)
}

/// Opens one volume group from all its PV stacks; one export per LV cairn can serve.
pub fn open_vg_exports(
    vg_name: &str,
    stacks: Vec<OpenedExport>,
    read_only: bool,
) -> Result<Vec<OpenedExport>> {
    let names: Vec<String> = stacks.iter().map(pv_name).collect();
    let devs: Vec<PvDevice> = stacks
        .iter()
        .zip(&names)
        .map(|(e, n)| PvDevice::new(n.clone(), e.device.clone()))
        .collect();
    let whole = Vg::open_with(
        devs.clone(),
        OpenOptions {
            partial: false,
            read_only,
        },
    );
    // A VG with a PV missing is served partially, as `vgchange -ay` does with lvm's
    // default activation_mode "degraded": RAID LVs whose images survive are served
    // (degraded), LVs that need the missing PV are not.
    let vg = match whole {
        Err(e) if e.kind() == ErrorKind::NotFound && e.to_string().contains("is missing PV") => {
            let vg = Vg::open_with(
                devs,
                OpenOptions {
                    partial: true,
                    read_only,
                },
            )
            .map_err(|e| StackError::new(format!("volume group {vg_name}: {}", lvm_error(&e))))?;
            let raid_ok = vg.report().lvs.iter().any(|l| {
                l.visible
                    && l.segments
                        .first()
                        .is_some_and(|s| s.segtype.starts_with("raid"))
                    && vg.lv(&l.name).is_ok()
            });
            if !raid_ok {
                return Err(StackError::new(format!(
                    "volume group {vg_name}: {}",
                    lvm_error(&e)
                )));
            }
            vg
        }
        r => {
            r.map_err(|e| StackError::new(format!("volume group {vg_name}: {}", lvm_error(&e))))?
        }
    };
    let partial = vg.notes().iter().any(|n| n.contains("is missing PV"));
    for note in vg.notes() {
        tracing::warn!("volume group {vg_name}: {note}");
    }
    let report = vg.report();
    let mut out = Vec::new();
    for lv_report in &report.lvs {
        if !lv_report.visible {
            continue;
        }
        if let Some(why) = &lv_report.unavailable {
            eprintln!("cairn: {vg_name}/{}: not served: {why}", lv_report.name);
            continue;
        }
        let lv = match vg.lv(&lv_report.name) {
            Ok(lv) => lv,
            Err(e) if partial => {
                eprintln!(
                    "cairn: {vg_name}/{}: not served: {}",
                    lv_report.name,
                    lvm_error(&e)
                );
                continue;
            }
            Err(e) => return Err(StackError::new(lvm_error(&e).to_string())),
        };
        if let Some(a) = lv.array() {
            let down = a.down_roles();
            if !down.is_empty() {
                eprintln!(
                    "cairn: WARNING: {vg_name}/{} is served DEGRADED: image(s) {:?} missing or failed; \
                     repair it with `cairn lvm lvconvert --repair`",
                    lv_report.name, down
                );
            }
        }
        // The PVs this LV uses, in the order its extents first reach them.
        let used: Vec<usize> = lv
            .pv_names()
            .iter()
            .filter_map(|n| names.iter().position(|m| m == n))
            .collect();
        let first = lv.locate(0).map_or(0, |(_, at)| at);
        let seg0 = lv_report.segments.first();
        let details = LvDetails {
            vg: vg_name.to_string(),
            lv: lv_report.name.clone(),
            extent_size: report.extent_size,
            pe_start: used
                .first()
                .and_then(|&i| report.pvs.iter().find(|p| p.name == names[i]))
                .map_or(0, |p| p.pe_start),
            // A RAID LV's full stripe spans its data stripes, not its images.
            stripes: match vg
                .metadata()
                .lv(&lv_report.name)
                .and_then(|l| l.segments.first())
                .map(|s| &s.kind)
            {
                Some(cairn_lvm::meta::SegKind::Raid(r)) => {
                    u32::try_from(r.data_stripes()).unwrap_or(u32::MAX)
                }
                _ => seg0.map_or(1, |s| u32::try_from(s.stripes).unwrap_or(u32::MAX)),
            },
            segtype: seg0.map_or(String::new(), |s| s.segtype.clone()),
            stripe_size: seg0.map_or(0, |s| s.stripe_size),
            seg_pe_ranges: lv_report
                .segments
                .iter()
                .map(|s| s.seg_pe_ranges.clone())
                .collect::<Vec<_>>()
                .join(" "),
            mismatch_sectors: None,
        };
        let device: Arc<dyn BlockDevice> = lv.clone();
        out.push(OpenedExport {
            name: format!("{vg_name}/{}", lv_report.name),
            path: stacks[used.first().copied().unwrap_or(0)].path.clone(),
            device,
            read_only: read_only || !lv_report.writable,
            layer: Layer::Lv(LvLayer {
                details,
                pvs: used.iter().map(|&i| stacks[i].clone()).collect(),
                first_byte: first,
                volume: lv,
            }),
        });
    }
    if report.lvs.iter().all(|l| !l.visible) {
        eprintln!("cairn: volume group {vg_name} has no logical volumes to serve");
    }
    Ok(out)
}

/// A library error as one sentence: the kind's words only where they add something.
pub fn lvm_error(e: &cairn_block::Error) -> StackError {
    let s = e.to_string();
    let plain = match e.kind() {
        ErrorKind::InvalidArgument | ErrorKind::NotFound | ErrorKind::Unsupported => s
            .strip_suffix(&format!(": {}", e.kind().describe()))
            .map_or(s.clone(), str::to_string),
        _ => s,
    };
    StackError::new(plain.replace("pass force", "give -f (--force)"))
}
