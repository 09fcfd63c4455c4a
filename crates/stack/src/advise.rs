//! Alignment maths over a stack tree: the mkfs.ext4 / mkfs.xfs options that put a
//! filesystem's stripes on the array's full stripes, and what is misaligned on the way
//! (a LUKS payload or an LV start off the full stripe, a LUKS sector smaller than the
//! filesystem block). Pure functions of a [`Node`] tree: the same answer for a stack
//! opened here, described by a running daemon, or described from headers alone.

use serde::Serialize;

use crate::node::{Node, NodeKind};
use crate::size::format_size;

/// The filesystem block size the advice assumes: what mkfs.ext4 and mkfs.xfs pick for
/// anything bigger than a floppy.
pub const FS_BLOCK: u64 = 4096;

/// What to tell mkfs about one export.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Advice {
    pub export: String,
    /// The layers from the export down, in words.
    pub stack: Vec<String>,
    /// The layer whose striping the advice follows, in words; `None`: nothing stripes.
    pub striped_by: Option<String>,
    pub chunk_bytes: Option<u64>,
    pub data_disks: Option<u32>,
    pub full_stripe_bytes: Option<u64>,
    /// Where the export's data starts inside the striped layer (sum of the LUKS payload
    /// and LV offsets between them).
    pub data_offset: u64,
    pub block_size: u64,
    /// ext4: chunk in filesystem blocks.
    pub stride: Option<u64>,
    /// ext4: full stripe in filesystem blocks.
    pub stripe_width: Option<u64>,
    /// XFS stripe unit in bytes (the chunk).
    pub xfs_su_bytes: Option<u64>,
    /// XFS stripe width in stripe units (the data members).
    pub xfs_sw: Option<u64>,
    /// The mkfs.ext4 options, e.g. ["-E", "stride=16,stripe_width=32"]; empty: none.
    pub ext4_options: Vec<String>,
    /// The mkfs.xfs options, e.g. ["-d", "su=64k,sw=2"]; empty: none.
    pub xfs_options: Vec<String>,
    pub mkfs_ext4: String,
    pub mkfs_xfs: String,
    pub warnings: Vec<String>,
    pub notes: Vec<String>,
}

/// The striping one layer does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Striping {
    chunk: u64,
    data: u32,
}

/// Data members per stripe for an md node, as the kernel counts them for `io_opt`
/// (raid0: all; raid4/5: one less; raid6: two less; raid10: `raid10_nr_stripes`, i.e.
/// members / near copies when that divides, else all members). `None`: no striping.
fn md_data_disks(level: &str, layout: Option<&str>, raid_devices: u32) -> Option<u32> {
    match level {
        "raid0" => Some(raid_devices),
        "raid4" | "raid5" => raid_devices.checked_sub(1),
        "raid6" => raid_devices.checked_sub(2),
        "raid10" => {
            // mdadm's words: "near=2", "far=2", "offset=2", or "near=2, far=2".
            let near = layout
                .unwrap_or("near=2")
                .split(',')
                .find_map(|p| p.trim().strip_prefix("near="))
                .and_then(|n| n.trim().parse::<u32>().ok())
                .unwrap_or(1)
                .max(1);
            Some(if raid_devices.is_multiple_of(near) {
                raid_devices / near
            } else {
                raid_devices
            })
        }
        _ => None,
    }
    .filter(|&d| d > 0)
}

/// "64K", "1M", "192K": a size as people write chunk sizes.
fn kib(bytes: u64) -> String {
    if bytes.is_multiple_of(1 << 20) {
        format!("{}M", bytes >> 20)
    } else if bytes.is_multiple_of(1024) {
        format!("{}K", bytes >> 10)
    } else {
        format!("{bytes} bytes")
    }
}

/// The first PE of each range in lvm's `seg_pe_ranges` ("pv0:2-3 pv1:0-1" -> [2, 0]).
fn first_extents(ranges: &str) -> Vec<u64> {
    ranges
        .split_whitespace()
        .filter_map(|r| r.rsplit_once(':'))
        .filter_map(|(_, span)| span.split('-').next()?.parse().ok())
        .collect()
}

/// The advice for one export's tree, with `DEVICE` standing for the block device.
pub fn advise(node: &Node) -> Advice {
    advise_on(node, "DEVICE")
}

/// The advice for one export's tree, with `device` in the command lines.
pub fn advise_on(node: &Node, device: &str) -> Advice {
    let mut stack_words = Vec::new();
    let mut warnings = Vec::new();
    let mut notes = Vec::new();
    // (what, bytes) for each layer that moves the data start.
    let mut shifts: Vec<(String, u64)> = Vec::new();
    let mut luks_sectors: Vec<(String, u32)> = Vec::new();
    let mut striping: Option<(Striping, String)> = None;
    let mut lv_is_striping = false;

    let mut cur = if node.kind == NodeKind::Export {
        node.children.first()
    } else {
        Some(node)
    };
    while let Some(n) = cur {
        cur = None;
        match n.kind {
            NodeKind::Luks => {
                let l = n.luks.as_ref();
                let v = l.map_or(2, |l| l.version);
                let sector = l.map_or(512, |l| l.sector_size);
                stack_words.push(format!(
                    "LUKS{v} (payload at {}, {sector}-byte sectors)",
                    format_size(n.data_offset)
                ));
                shifts.push((
                    format!("LUKS payload at {}", format_size(n.data_offset)),
                    n.data_offset,
                ));
                luks_sectors.push((format!("LUKS{v}"), sector));
                cur = n.children.first();
            }
            NodeKind::Lv => {
                let Some(lv) = &n.lv else {
                    stack_words.push(format!("LV {}", n.name));
                    break;
                };
                stack_words.push(format!(
                    "LV {}/{} ({})",
                    lv.vg,
                    lv.lv,
                    if lv.stripes > 1 {
                        format!("{} stripes of {}", lv.stripes, kib(lv.stripe_size))
                    } else {
                        "linear".into()
                    }
                ));
                if lv.stripes > 1 && lv.stripe_size > 0 {
                    striping = Some((
                        Striping {
                            chunk: lv.stripe_size,
                            data: lv.stripes,
                        },
                        format!(
                            "LV {}/{} striped over {} PVs, {} stripe size",
                            lv.vg,
                            lv.lv,
                            lv.stripes,
                            kib(lv.stripe_size)
                        ),
                    ));
                    lv_is_striping = true;
                    break;
                }
                let first = first_extents(&lv.seg_pe_ranges)
                    .into_iter()
                    .next()
                    .unwrap_or(0);
                let at = lv.pe_start + first * lv.extent_size;
                shifts.push((
                    format!(
                        "LV data at {} (pe_start {} + extent {first} x {})",
                        format_size(at),
                        format_size(lv.pe_start),
                        format_size(lv.extent_size)
                    ),
                    at,
                ));
                cur = n.children.first();
            }
            NodeKind::Md => {
                let Some(m) = &n.md else { break };
                let layout = m
                    .layout
                    .as_deref()
                    .map(|l| format!(" {l}"))
                    .unwrap_or_default();
                let chunk = if m.chunk_bytes > 0 {
                    format!(", {} chunk", kib(m.chunk_bytes))
                } else {
                    String::new()
                };
                let words = format!(
                    "md {}{layout} over {} members{chunk}",
                    m.level, m.raid_devices
                );
                stack_words.push(words.clone());
                match md_data_disks(&m.level, m.layout.as_deref(), m.raid_devices) {
                    Some(data) if m.chunk_bytes > 0 => {
                        striping = Some((
                            Striping {
                                chunk: m.chunk_bytes,
                                data,
                            },
                            format!(
                                "{words}, {data} data member{}",
                                if data == 1 { "" } else { "s" }
                            ),
                        ));
                    }
                    _ => notes.push(format!(
                        "{} does not stripe data, so there is no stride or stripe width to \
                         set: mkfs's defaults are right",
                        if m.level == "raid1" {
                            "RAID1 mirrors whole members and".to_string()
                        } else {
                            format!("md {}", m.level)
                        }
                    )),
                }
            }
            NodeKind::File | NodeKind::Member => {
                stack_words.push(format!("file {}", n.path.as_deref().unwrap_or(&n.name)));
            }
            other => stack_words.push(format!("{other} {}", n.name)),
        }
    }
    if striping.is_none() && notes.is_empty() {
        notes.push(
            "nothing below this export stripes data, so there is no stride or stripe width \
             to set: mkfs's defaults are right"
                .into(),
        );
    }

    let data_offset: u64 = if lv_is_striping {
        0
    } else {
        shifts.iter().map(|(_, b)| b).sum()
    };
    for (what, sector) in &luks_sectors {
        if u64::from(*sector) < FS_BLOCK {
            warnings.push(format!(
                "{what} encrypts in {sector}-byte sectors, smaller than the {FS_BLOCK}-byte \
                 filesystem block: every block costs {} encryption sectors. A volume \
                 formatted with --sector-size 4096 (cairn luks format, cryptsetup \
                 luksFormat) does the same work in one",
                FS_BLOCK / u64::from(*sector)
            ));
        }
    }

    let mut a = Advice {
        export: node.name.clone(),
        stack: stack_words,
        striped_by: striping.as_ref().map(|(_, w)| w.clone()),
        chunk_bytes: None,
        data_disks: None,
        full_stripe_bytes: None,
        data_offset,
        block_size: FS_BLOCK,
        stride: None,
        stripe_width: None,
        xfs_su_bytes: None,
        xfs_sw: None,
        ext4_options: Vec::new(),
        xfs_options: Vec::new(),
        mkfs_ext4: String::new(),
        mkfs_xfs: String::new(),
        warnings,
        notes,
    };
    if let Some((s, words)) = striping {
        let full = s.chunk * u64::from(s.data);
        a.chunk_bytes = Some(s.chunk);
        a.data_disks = Some(s.data);
        a.full_stripe_bytes = Some(full);
        if !data_offset.is_multiple_of(full) {
            let what: Vec<&str> = shifts
                .iter()
                .filter(|(_, b)| *b > 0)
                .map(|(w, _)| w.as_str())
                .collect();
            let partial = if data_offset.is_multiple_of(s.chunk) {
                "every full-stripe write becomes two partial ones"
            } else {
                "it is not even on a chunk boundary, so every chunk-sized write touches two \
                 chunks and every full-stripe write becomes two partial ones"
            };
            let fix = if shifts
                .iter()
                .any(|(w, b)| w.starts_with("LUKS") && !b.is_multiple_of(full))
            {
                format!(
                    "re-create the LUKS volume with its payload on a multiple of {} (cairn \
                     luks format does this by itself; cryptsetup luksFormat --offset N with N \
                     a multiple of {} sectors)",
                    kib(full),
                    full / 512
                )
            } else {
                format!(
                    "re-create the PV with pvcreate --dataalignment {} and keep extents a \
                     multiple of the full stripe",
                    kib(full)
                )
            };
            a.warnings.push(format!(
                "{} {} not a multiple of the {}'s {} full stripe ({}): {partial}. Fix: {fix}",
                what.join(" + "),
                if what.len() == 1 { "is" } else { "are" },
                if lv_is_striping { "LV" } else { "array" },
                kib(full),
                words
            ));
        }
        if !s.chunk.is_multiple_of(FS_BLOCK) {
            a.warnings.push(format!(
                "the {} chunk is not a multiple of the {FS_BLOCK}-byte filesystem block, so \
                 no whole number of blocks fills it: no stride can be given; re-create the \
                 array with a chunk of 4K or a multiple of it",
                kib(s.chunk)
            ));
        } else {
            let stride = s.chunk / FS_BLOCK;
            let width = stride * u64::from(s.data);
            a.stride = Some(stride);
            a.stripe_width = Some(width);
            a.xfs_su_bytes = Some(s.chunk);
            a.xfs_sw = Some(u64::from(s.data));
            a.ext4_options = vec!["-E".into(), format!("stride={stride},stripe_width={width}")];
            let su = if s.chunk.is_multiple_of(1024) {
                format!("{}k", s.chunk / 1024)
            } else {
                s.chunk.to_string()
            };
            a.xfs_options = vec!["-d".into(), format!("su={su},sw={}", s.data)];
        }
    }
    let line = |tool: &str, opts: &[String]| {
        let mut parts = vec![tool.to_string()];
        parts.extend(opts.iter().cloned());
        parts.push(device.to_string());
        parts.join(" ")
    };
    a.mkfs_ext4 = line("mkfs.ext4", &a.ext4_options);
    a.mkfs_xfs = line("mkfs.xfs", &a.xfs_options);
    a
}

impl Advice {
    /// The human form.
    pub fn text(&self) -> String {
        let mut s = format!("export {:?}: {}\n", self.export, self.stack.join(" -> "));
        if let (Some(by), Some(full)) = (&self.striped_by, self.full_stripe_bytes) {
            s.push_str(&format!("  striped by {by}: full stripe {}\n", kib(full)));
        }
        s.push_str(&format!("  {}\n  {}\n", self.mkfs_ext4, self.mkfs_xfs));
        for n in &self.notes {
            s.push_str(&format!("  note: {n}\n"));
        }
        for w in &self.warnings {
            s.push_str(&format!("  WARNING: {w}\n"));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{LuksDetails, LvDetails, MdDetails, NodeGeometry};

    fn node(kind: NodeKind, name: &str, children: Vec<Node>) -> Node {
        Node {
            children,
            ..Node::new(
                kind,
                format!("{kind}:{name}"),
                name.into(),
                crate::node::NodeState::Active,
                1 << 30,
                geom(),
            )
        }
    }

    fn geom() -> NodeGeometry {
        NodeGeometry {
            logical_block: 512,
            physical_block: 4096,
            optimal_io: 4096,
        }
    }

    fn md(level: &str, layout: Option<&str>, n: u32, chunk_k: u64) -> Node {
        let mut m = node(NodeKind::Md, "data", Vec::new());
        m.md = Some(MdDetails {
            uuid: "u".into(),
            level: level.into(),
            layout: layout.map(Into::into),
            chunk_bytes: chunk_k * 1024,
            raid_devices: n,
            data_disks: 0,
            active_devices: n,
            failed_devices: 0,
            events: 0,
            mismatch_sectors: None,
            job: None,
        });
        m
    }

    fn luks(payload: u64, sector: u32, below: Node) -> Node {
        let mut l = node(NodeKind::Luks, "LUKS2 u", vec![below]);
        l.data_offset = payload;
        l.luks = Some(LuksDetails {
            version: 2,
            uuid: "u".into(),
            description: String::new(),
            sector_size: sector,
            payload_offset: payload,
        });
        l
    }

    fn export(below: Node) -> Node {
        node(NodeKind::Export, "data", vec![below])
    }

    #[test]
    fn stride_and_width_over_the_shapes() {
        // level, layout, members, chunk KiB -> (stride, stripe_width, XFS -d value)
        type Row<'a> = (
            &'a str,
            Option<&'a str>,
            u32,
            u64,
            Option<(u64, u64, &'a str)>,
        );
        let table: &[Row] = &[
            (
                "raid6",
                Some("left-symmetric"),
                4,
                64,
                Some((16, 32, "su=64k,sw=2")),
            ),
            (
                "raid5",
                Some("left-symmetric"),
                3,
                128,
                Some((32, 64, "su=128k,sw=2")),
            ),
            ("raid0", None, 2, 512, Some((128, 256, "su=512k,sw=2"))),
            (
                "raid6",
                Some("left-symmetric"),
                6,
                32,
                Some((8, 32, "su=32k,sw=4")),
            ),
            (
                "raid10",
                Some("near=2"),
                4,
                64,
                Some((16, 32, "su=64k,sw=2")),
            ),
            (
                "raid10",
                Some("far=2"),
                4,
                64,
                Some((16, 64, "su=64k,sw=4")),
            ),
            (
                "raid10",
                Some("near=2"),
                3,
                64,
                Some((16, 48, "su=64k,sw=3")),
            ),
            ("raid4", None, 5, 256, Some((64, 256, "su=256k,sw=4"))),
            ("raid1", None, 2, 0, None),
            ("linear", None, 2, 0, None),
        ];
        for &(level, layout, n, chunk, want) in table {
            let a = advise(&export(md(level, layout, n, chunk)));
            let what = format!("{level} {layout:?} {n} x {chunk}K");
            match want {
                Some((stride, width, xfs)) => {
                    assert_eq!(a.stride, Some(stride), "{what}");
                    assert_eq!(a.stripe_width, Some(width), "{what}");
                    assert_eq!(a.xfs_options, ["-d", xfs], "{what}");
                    assert_eq!(
                        a.mkfs_ext4,
                        format!("mkfs.ext4 -E stride={stride},stripe_width={width} DEVICE"),
                        "{what}"
                    );
                    assert!(a.warnings.is_empty(), "{what}: {:?}", a.warnings);
                }
                None => {
                    assert_eq!(a.stride, None, "{what}");
                    assert_eq!(a.mkfs_ext4, "mkfs.ext4 DEVICE", "{what}");
                    assert_eq!(a.mkfs_xfs, "mkfs.xfs DEVICE", "{what}");
                    assert!(a.notes.iter().any(|n| n.contains("no stride")), "{what}");
                }
            }
        }
    }

    #[test]
    fn the_classic_raid6_lines() {
        let a = advise_on(
            &export(md("raid6", Some("left-symmetric"), 4, 64)),
            "/dev/loop3",
        );
        assert_eq!(
            a.mkfs_ext4,
            "mkfs.ext4 -E stride=16,stripe_width=32 /dev/loop3"
        );
        assert_eq!(a.mkfs_xfs, "mkfs.xfs -d su=64k,sw=2 /dev/loop3");
        assert_eq!(a.full_stripe_bytes, Some(128 << 10));
    }

    #[test]
    fn a_luks_payload_off_the_full_stripe_is_warned_about() {
        // RAID6 over 5 members with 64K chunks: a 192K full stripe; 2 MiB is not on it.
        let a = advise(&export(luks(2 << 20, 4096, md("raid6", None, 5, 64))));
        assert_eq!(a.stride, Some(16));
        assert_eq!(a.stripe_width, Some(48));
        assert_eq!(a.data_offset, 2 << 20);
        assert_eq!(a.warnings.len(), 1, "{:?}", a.warnings);
        let w = &a.warnings[0];
        assert!(
            w.starts_with(
                "LUKS payload at 2 MiB is not a multiple of the array's 192K full stripe"
            ),
            "{w}"
        );
        assert!(
            w.contains("two partial ones") && w.contains("--offset"),
            "{w}"
        );
        // 16 MiB over RAID6 4 x 64K: 128 full stripes, aligned.
        let a = advise(&export(luks(16 << 20, 4096, md("raid6", None, 4, 64))));
        assert!(a.warnings.is_empty(), "{:?}", a.warnings);
        // Off even the chunk.
        let a = advise(&export(luks(
            16 << 20 | 4096,
            4096,
            md("raid5", None, 3, 64),
        )));
        assert!(
            a.warnings[0].contains("not even on a chunk boundary"),
            "{:?}",
            a.warnings
        );
    }

    #[test]
    fn small_luks_sectors_are_warned_about() {
        let a = advise(&export(luks(16 << 20, 512, md("raid6", None, 4, 64))));
        assert_eq!(a.warnings.len(), 1);
        assert!(
            a.warnings[0].contains("512-byte sectors"),
            "{:?}",
            a.warnings
        );
    }

    fn lv(stripes: u32, stripe_k: u64, pe_start: u64, ranges: &str, below: Vec<Node>) -> Node {
        let mut n = node(NodeKind::Lv, "vg0/data", below);
        n.data_offset = pe_start;
        n.lv = Some(LvDetails {
            vg: "vg0".into(),
            lv: "data".into(),
            extent_size: 4 << 20,
            pe_start,
            stripes,
            stripe_size: stripe_k * 1024,
            seg_pe_ranges: ranges.into(),
            segtype: String::new(),
            mismatch_sectors: None,
        });
        n
    }

    #[test]
    fn lvs_shift_the_data_or_stripe_it() {
        // A linear LV on RAID6 5 x 64K (192K full stripe) at pe_start 1 MiB: misaligned.
        let a = advise(&export(lv(
            1,
            0,
            1 << 20,
            "pv0:0-9",
            vec![md("raid6", None, 5, 64)],
        )));
        assert_eq!(a.data_offset, 1 << 20);
        assert!(
            a.warnings[0].contains("pvcreate --dataalignment 192K"),
            "{:?}",
            a.warnings
        );
        // At pe_start 192K * 8 = 1.5 MiB and extent 0: aligned.
        let a = advise(&export(lv(
            1,
            0,
            1536 << 10,
            "pv0:0-9",
            vec![md("raid6", None, 5, 64)],
        )));
        assert!(a.warnings.is_empty(), "{:?}", a.warnings);
        // A striped LV over plain PVs: its own stripe size and count.
        let pv = node(NodeKind::File, "/d/pv0.img", Vec::new());
        let a = advise(&export(lv(
            3,
            128,
            1 << 20,
            "pv0:0-9 pv1:0-9 pv2:0-9",
            vec![pv],
        )));
        assert_eq!((a.stride, a.stripe_width), (Some(32), Some(96)));
        assert_eq!(a.xfs_options, ["-d", "su=128k,sw=3"]);
    }

    #[test]
    fn a_plain_file_gets_plain_lines() {
        let a = advise(&export(node(NodeKind::File, "/d/disk.img", Vec::new())));
        assert_eq!(a.mkfs_ext4, "mkfs.ext4 DEVICE");
        assert_eq!(a.stride, None);
        assert!(a.warnings.is_empty());
    }
}
