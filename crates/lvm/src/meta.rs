//! The VG metadata model: [`VolumeGroup`] with its PVs, LVs and segments, converted
//! from and to the generic [`text`](crate::text) tree.
//!
//! ```text
//!   Section (parsed) ──from_tree──> VolumeGroup { pvs, lvs { segments } }
//!                                      │ every object keeps its raw section: keys and
//!                                      │ sections cairn does not know survive a rewrite
//!   text <──print── Section <──to_tree─┘
//! ```
//!
//! Units follow the text: `extent_size`, `dev_size`, `pe_start`, `stripe_size` in 512-byte
//! sectors; `pe_count`, `start_extent`, `extent_count` in extents. An LV cairn cannot map
//! exactly (a segment type other than `striped`, a status flag it does not know, a broken
//! segment) is kept verbatim and marked unavailable with the reason.

use std::collections::{BTreeMap, BTreeSet};

use cairn_block::{Error, ErrorKind, Result};

use crate::label::{strip_uuid, uuid_valid};
use crate::text::{self, Entry, Node, Section, Value};

/// One stripe (or the one area of a linear segment): a PV key (`pv0`) and its first PE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Area {
    pub pv: String,
    pub pe: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SegKind {
    /// `type = "striped"`: one area is linear; `stripe_size` (sectors) is 0 then.
    Striped {
        stripe_size: u64,
        stripes: Vec<Area>,
    },
    /// lvm's RAID types (`raid1`, `raid10`, `raid0`, `raid0_meta`, `raid4`, `raid5_*`,
    /// `raid6_*`) and the legacy `mirror`: the data lives on hidden sub-LVs.
    Raid(RaidSeg),
    /// Any other type, kept verbatim.
    Other(String),
}

/// A RAID (or legacy mirror) segment: images are sub-LVs named in the VG, each with its
/// own linear/striped segments; `metas` are the `_rmeta_` sub-LVs holding dm-raid's
/// superblock and bitmap, parallel to `images` (`None` for raid0 and mirror).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RaidSeg {
    /// The segment type as written (`raid1`, `raid5_ls`, `mirror`, ...).
    pub segtype: String,
    /// Sectors (0 for raid1 and mirror).
    pub stripe_size: u64,
    /// Sectors per bitmap bit (dm-raid's region); 0 for raid0.
    pub region_size: u64,
    /// raid10: copies of each chunk (lvm's `data_copies`, default 2).
    pub data_copies: u64,
    pub images: Vec<String>,
    pub metas: Vec<Option<String>>,
    /// mirror: the `mirror_log` LV, if the log is on disk.
    pub mirror_log: Option<String>,
}

impl SegKind {
    /// The RAID segment, unless it is a legacy mirror.
    fn filter_raid(self) -> Option<RaidSeg> {
        match self {
            SegKind::Raid(r) if r.segtype != "mirror" => Some(r),
            _ => None,
        }
    }
}

impl RaidSeg {
    /// Parity members: 1 for raid4/5, 2 for raid6.
    pub fn parity_devs(&self) -> usize {
        if self.segtype.starts_with("raid6") {
            2
        } else if self.segtype.starts_with("raid4") || self.segtype.starts_with("raid5") {
            1
        } else {
            0
        }
    }

    /// Data stripes: what one LV extent row spreads over (1 for mirrors).
    pub fn data_stripes(&self) -> usize {
        let n = self.images.len();
        match self.segtype.as_str() {
            "raid1" | "mirror" => 1,
            "raid10" => (n / usize::try_from(self.data_copies.max(2)).unwrap_or(2)).max(1),
            t if t.starts_with("raid0") => n,
            _ => n.saturating_sub(self.parity_devs()).max(1),
        }
    }

    /// Whether the segment type is a kind cairn maps through md's layouts.
    pub fn known_type(t: &str) -> bool {
        matches!(
            t,
            "raid1"
                | "raid10"
                | "raid0"
                | "raid0_meta"
                | "raid4"
                | "raid5"
                | "raid5_la"
                | "raid5_ra"
                | "raid5_ls"
                | "raid5_rs"
                | "raid5_n"
                | "raid6"
                | "raid6_zr"
                | "raid6_nr"
                | "raid6_nc"
                | "raid6_ls_6"
                | "raid6_rs_6"
                | "raid6_la_6"
                | "raid6_ra_6"
                | "raid6_n_6"
                | "mirror"
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Segment {
    pub start_extent: u64,
    pub extent_count: u64,
    pub kind: SegKind,
    raw: Section,
}

impl Segment {
    pub fn striped(
        start_extent: u64,
        extent_count: u64,
        stripe_size: u64,
        stripes: Vec<Area>,
    ) -> Segment {
        Segment {
            start_extent,
            extent_count,
            kind: SegKind::Striped {
                stripe_size,
                stripes,
            },
            raw: Section::default(),
        }
    }

    /// A RAID segment over sub-LVs (see [`RaidSeg`]).
    pub fn raid(start_extent: u64, extent_count: u64, raid: RaidSeg) -> Segment {
        Segment {
            start_extent,
            extent_count,
            kind: SegKind::Raid(raid),
            raw: Section::default(),
        }
    }

    pub fn type_name(&self) -> &str {
        match &self.kind {
            SegKind::Striped { .. } => "striped",
            SegKind::Raid(r) => &r.segtype,
            SegKind::Other(t) => t,
        }
    }

    /// The stripes of a striped segment, empty for other types.
    pub fn areas(&self) -> &[Area] {
        match &self.kind {
            SegKind::Striped { stripes, .. } => stripes,
            SegKind::Raid(_) | SegKind::Other(_) => &[],
        }
    }

    /// Stripe size in sectors (striped and RAID segments; 0 otherwise).
    pub fn stripe_sectors(&self) -> u64 {
        match &self.kind {
            SegKind::Striped { stripe_size, .. } => *stripe_size,
            SegKind::Raid(r) => r.stripe_size,
            SegKind::Other(_) => 0,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PvMeta {
    /// The key in `physical_volumes` (`pv0`).
    pub key: String,
    /// Dashed uuid as in the text.
    pub id: String,
    /// The device hint (`device = "/dev/loop0"`).
    pub device: Option<String>,
    pub status: Vec<String>,
    pub flags: Vec<String>,
    pub dev_size: u64,
    pub pe_start: u64,
    pub pe_count: u64,
    raw: Section,
}

impl PvMeta {
    pub fn new(
        key: String,
        id: String,
        device: String,
        dev_size: u64,
        pe_start: u64,
        pe_count: u64,
    ) -> PvMeta {
        PvMeta {
            key,
            id,
            device: Some(device),
            status: vec!["ALLOCATABLE".into()],
            flags: vec![],
            dev_size,
            pe_start,
            pe_count,
            raw: Section::default(),
        }
    }

    pub fn allocatable(&self) -> bool {
        self.status.iter().any(|s| s == "ALLOCATABLE") && !self.flags.iter().any(|f| f == "MISSING")
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LvMeta {
    pub name: String,
    pub id: String,
    pub status: Vec<String>,
    pub flags: Vec<String>,
    pub creation_time: Option<i64>,
    pub creation_host: Option<String>,
    pub segments: Vec<Segment>,
    /// Why cairn cannot map this LV, if it cannot.
    pub unsupported: Option<String>,
    raw: Section,
}

impl LvMeta {
    pub fn new(
        name: String,
        id: String,
        creation_time: i64,
        creation_host: String,
        segments: Vec<Segment>,
    ) -> LvMeta {
        LvMeta {
            name,
            id,
            status: vec!["READ".into(), "WRITE".into(), "VISIBLE".into()],
            flags: vec![],
            creation_time: Some(creation_time),
            creation_host: Some(creation_host),
            segments,
            unsupported: None,
            raw: Section::default(),
        }
    }

    pub fn visible(&self) -> bool {
        self.status.iter().any(|s| s == "VISIBLE")
    }

    pub fn writable(&self) -> bool {
        self.status.iter().any(|s| s == "WRITE")
    }

    /// Size in extents.
    pub fn extents(&self) -> u64 {
        self.segments.iter().map(|s| s.extent_count).sum()
    }
}

/// The trailer keys outside the VG section.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Trailer {
    pub description: String,
    pub creation_host: String,
    pub creation_time: i64,
    /// Other top-level keys, kept.
    extra: Vec<Entry>,
}

/// Used runs `(first pe, count, lv name)` per PV key.
pub type UsedMap = BTreeMap<String, Vec<(u64, u64, String)>>;

/// A VG's metadata: what one committed text says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeGroup {
    pub name: String,
    pub id: String,
    pub seqno: u64,
    pub status: Vec<String>,
    pub flags: Vec<String>,
    /// Sectors.
    pub extent_size: u64,
    pub max_lv: u64,
    pub max_pv: u64,
    pub metadata_copies: u64,
    pub pvs: Vec<PvMeta>,
    pub lvs: Vec<LvMeta>,
    pub trailer: Trailer,
    raw: Section,
}

fn corrupt(line: usize, msg: impl std::fmt::Display) -> Error {
    if line > 0 {
        Error::new(ErrorKind::Corrupt, format!("line {line}: {msg}"))
    } else {
        Error::new(ErrorKind::Corrupt, msg.to_string())
    }
}

/// Reads typed values from a section, naming the section and line on failure.
struct Reader<'a> {
    sec: &'a Section,
    what: String,
    line: usize,
}

impl Reader<'_> {
    fn line_of(&self, key: &str) -> usize {
        self.sec.entry(key).map_or(self.line, |e| e.line)
    }
    fn opt_u64(&self, key: &str) -> Result<Option<u64>> {
        match self.sec.get(key) {
            None => Ok(None),
            Some(Node::Value(Value::Int(i))) => u64::try_from(*i).map(Some).map_err(|_| {
                corrupt(
                    self.line_of(key),
                    format!("{}: '{key}' is negative", self.what),
                )
            }),
            Some(_) => Err(corrupt(
                self.line_of(key),
                format!("{}: '{key}' is not an integer", self.what),
            )),
        }
    }
    fn u64(&self, key: &str) -> Result<u64> {
        self.opt_u64(key)?
            .ok_or_else(|| corrupt(self.line, format!("{}: '{key}' is missing", self.what)))
    }
    fn opt_str(&self, key: &str) -> Result<Option<String>> {
        match self.sec.get(key) {
            None => Ok(None),
            Some(Node::Value(Value::Str(s))) => Ok(Some(s.clone())),
            Some(_) => Err(corrupt(
                self.line_of(key),
                format!("{}: '{key}' is not a string", self.what),
            )),
        }
    }
    fn str(&self, key: &str) -> Result<String> {
        self.opt_str(key)?
            .ok_or_else(|| corrupt(self.line, format!("{}: '{key}' is missing", self.what)))
    }
    fn strings(&self, key: &str) -> Result<Vec<String>> {
        match self.sec.get(key) {
            None => Ok(vec![]),
            Some(Node::Value(Value::Array(a))) => a
                .iter()
                .map(|v| {
                    v.as_str().map(str::to_string).ok_or_else(|| {
                        corrupt(
                            self.line_of(key),
                            format!("{}: '{key}' holds a non-string", self.what),
                        )
                    })
                })
                .collect(),
            Some(_) => Err(corrupt(
                self.line_of(key),
                format!("{}: '{key}' is not a list", self.what),
            )),
        }
    }
    fn sub(&self, key: &str) -> Result<Option<(&Section, usize)>> {
        match self.sec.entry(key) {
            None => Ok(None),
            Some(Entry {
                node: Node::Section(s),
                line,
                ..
            }) => Ok(Some((s, *line))),
            Some(e) => Err(corrupt(
                e.line,
                format!("{}: '{key}' is not a section", self.what),
            )),
        }
    }
}

fn check_id(id: &str, line: usize, what: &str) -> Result<()> {
    if uuid_valid(&strip_uuid(id)) {
        Ok(())
    } else {
        Err(corrupt(line, format!("{what}: invalid id {id:?}")))
    }
}

const KNOWN_LV_STATUS: &[&str] = &[
    "READ",
    "WRITE",
    "VISIBLE",
    "FIXED_MINOR",
    // A RAID LV created without an initial sync (`--nosync`), and an image lvm asks to
    // rebuild: cairn serves both (see docs/lvm-raid.md).
    "NOTSYNCED",
    "REBUILD",
];

/// Reads a RAID or mirror segment's keys. `Err(why)` when they do not describe one.
fn parse_raid(ty: &str, sec: &Section) -> std::result::Result<RaidSeg, String> {
    let int = |k: &str| -> std::result::Result<u64, String> {
        match sec.value(k) {
            None => Ok(0),
            Some(Value::Int(i)) => u64::try_from(*i).map_err(|_| format!("'{k}' is negative")),
            Some(_) => Err(format!("'{k}' is not an integer")),
        }
    };
    let list = |k: &str| -> Option<&Vec<Value>> {
        match sec.value(k) {
            Some(Value::Array(a)) => Some(a),
            _ => None,
        }
    };
    let mut r = RaidSeg {
        segtype: ty.to_string(),
        stripe_size: int("stripe_size")?,
        region_size: int("region_size")?,
        data_copies: int("data_copies")?,
        images: vec![],
        metas: vec![],
        mirror_log: None,
    };
    let count;
    if ty == "mirror" {
        count = int("mirror_count")?;
        let a = list("mirrors").ok_or("'mirrors' is missing or not a list")?;
        for pair in a.chunks(2) {
            match pair {
                [Value::Str(n), Value::Int(0)] => {
                    r.images.push(n.clone());
                    r.metas.push(None);
                }
                _ => return Err("'mirrors' must pair LV names with offset 0".into()),
            }
        }
        r.mirror_log = match sec.value("mirror_log") {
            Some(Value::Str(s)) => Some(s.clone()),
            _ => None,
        };
    } else if ty == "raid0" {
        count = int("stripe_count")?;
        let a = list("raid0_lvs").ok_or("'raid0_lvs' is missing or not a list")?;
        for v in a {
            let Value::Str(n) = v else {
                return Err("'raid0_lvs' holds a non-string".into());
            };
            r.images.push(n.clone());
            r.metas.push(None);
        }
    } else {
        count = if ty == "raid0_meta" {
            int("stripe_count")?
        } else {
            int("device_count")?
        };
        let a = list("raids").ok_or("'raids' is missing or not a list")?;
        let mut it = a.iter().peekable();
        while let Some(v) = it.next() {
            let Value::Str(n) = v else {
                return Err("'raids' holds a non-string".into());
            };
            // lvm: a metadata LV (name with _rmeta_) comes first, then its image.
            if n.contains("_rmeta_") {
                let Some(Value::Str(img)) = it.next() else {
                    return Err(format!("'raids': {n} has no image after it"));
                };
                r.metas.push(Some(n.clone()));
                r.images.push(img.clone());
            } else {
                r.metas.push(None);
                r.images.push(n.clone());
            }
        }
    }
    if count == 0 || r.images.len() as u64 != count {
        return Err(format!(
            "it counts {count} devices but lists {}",
            r.images.len()
        ));
    }
    if ty == "raid10" && r.data_copies < 2 {
        r.data_copies = 2;
    }
    let min = match ty {
        "raid1" | "mirror" | "raid10" | "raid4" => 2,
        t if t.starts_with("raid5") => 2,
        t if t.starts_with("raid6") => 3,
        _ => 1,
    };
    if r.images.len() < min {
        return Err(format!("{ty} needs at least {min} devices"));
    }
    // md's bitmap takes a power-of-two chunk of at most 2^31 bytes.
    if r.region_size != 0 && (!r.region_size.is_power_of_two() || r.region_size > 1 << 22) {
        return Err(format!("invalid region_size {}", r.region_size));
    }
    let striped = !matches!(ty, "raid1" | "mirror");
    if striped && (r.stripe_size < 8 || !r.stripe_size.is_power_of_two()) {
        return Err(format!("invalid stripe_size {}", r.stripe_size));
    }
    if ty == "raid10" && !(r.images.len() as u64).is_multiple_of(r.data_copies) {
        return Err(format!(
            "{} images do not divide into {} copies (cairn maps raid10 \"near\" only)",
            r.images.len(),
            r.data_copies
        ));
    }
    Ok(r)
}

fn parse_segment(
    sec: &Section,
    line: usize,
    what: String,
    pv_keys: &BTreeSet<&str>,
) -> Result<(Segment, Option<String>)> {
    let r = Reader {
        sec,
        what: what.clone(),
        line,
    };
    let start_extent = r.u64("start_extent")?;
    let extent_count = r.u64("extent_count")?;
    let ty = r.str("type")?;
    let mut seg = Segment {
        start_extent,
        extent_count,
        kind: SegKind::Other(ty.clone()),
        raw: sec.clone(),
    };
    if RaidSeg::known_type(&ty) {
        return Ok(match parse_raid(&ty, sec) {
            Ok(r) => {
                seg.kind = SegKind::Raid(r);
                (seg, None)
            }
            Err(why) => (seg, Some(format!("{what} has type \"{ty}\" but {why}"))),
        });
    }
    if ty != "striped" {
        return Ok((
            seg,
            Some(format!(
                "{what} has type \"{ty}\", which cairn does not map"
            )),
        ));
    }
    let stripe_count = r.u64("stripe_count")?;
    let stripe_size = r.opt_u64("stripe_size")?.unwrap_or(0);
    let list = match sec.value("stripes") {
        Some(Value::Array(a)) => a,
        _ => {
            return Err(corrupt(
                line,
                format!("{what}: 'stripes' is missing or not a list"),
            ))
        }
    };
    let mut stripes = Vec::new();
    for pair in list.chunks(2) {
        match pair {
            [Value::Str(pv), Value::Int(pe)] if *pe >= 0 => stripes.push(Area {
                pv: pv.clone(),
                pe: u64::try_from(*pe).unwrap_or(0),
            }),
            _ => {
                return Err(corrupt(
                    r.line_of("stripes"),
                    format!("{what}: 'stripes' must alternate PV names and PE numbers"),
                ))
            }
        }
    }
    let mut problem = None;
    if stripe_count == 0 || stripes.len() as u64 != stripe_count {
        problem = Some(format!(
            "{what}: stripe_count {stripe_count} but {} stripes listed",
            stripes.len()
        ));
    } else if extent_count == 0 || extent_count % stripe_count != 0 {
        problem = Some(format!(
            "{what}: {extent_count} extents do not divide into {stripe_count} stripes"
        ));
    } else if stripe_count > 1 && (stripe_size == 0 || !stripe_size.is_power_of_two()) {
        problem = Some(format!("{what}: invalid stripe_size {stripe_size}"));
    } else if let Some(a) = stripes.iter().find(|a| !pv_keys.contains(a.pv.as_str())) {
        problem = Some(format!(
            "{what} refers to PV \"{}\", which the VG does not have",
            a.pv
        ));
    }
    seg.kind = SegKind::Striped {
        stripe_size: if stripe_count > 1 { stripe_size } else { 0 },
        stripes,
    };
    Ok((seg, problem))
}

fn parse_lv(
    name: &str,
    sec: &Section,
    line: usize,
    pv_keys: &BTreeSet<&str>,
    extent_size: u64,
) -> Result<LvMeta> {
    let what = format!("LV {name}");
    let r = Reader {
        sec,
        what: what.clone(),
        line,
    };
    let id = r.str("id")?;
    check_id(&id, r.line_of("id"), &what)?;
    let status = r.strings("status")?;
    let flags = r.strings("flags")?;
    let creation_time = match sec.value("creation_time") {
        Some(Value::Int(i)) => Some(*i),
        _ => None,
    };
    let creation_host = r.opt_str("creation_host")?;
    let count = r.u64("segment_count")?;
    let mut problems = Vec::new();
    if let Some(s) = status
        .iter()
        .find(|s| !KNOWN_LV_STATUS.contains(&s.as_str()))
    {
        problems.push(format!("status flag {s} is not understood by cairn"));
    }
    if let Some(f) = flags.first() {
        problems.push(format!("flag {f} is not understood by cairn"));
    }
    let mut segments = Vec::new();
    for i in 1..=count {
        let key = format!("segment{i}");
        let (s, l) = r.sub(&key)?.ok_or_else(|| {
            corrupt(
                line,
                format!("{what}: segment_count is {count} but '{key}' is missing"),
            )
        })?;
        let (seg, problem) = parse_segment(s, l, format!("{what} {key}"), pv_keys)?;
        problems.extend(problem);
        segments.push(seg);
        if segments.len() > 1 << 20 {
            return Err(corrupt(line, format!("{what}: too many segments")));
        }
    }
    let mut next = 0u64;
    for s in &segments {
        if s.start_extent != next {
            problems.push(format!(
                "segments are not contiguous (one starts at extent {}, expected {next})",
                s.start_extent
            ));
            break;
        }
        next = match next.checked_add(s.extent_count) {
            Some(n)
                if n.checked_mul(extent_size)
                    .is_some_and(|b| b.checked_mul(512).is_some()) =>
            {
                n
            }
            _ => return Err(corrupt(line, format!("{what}: size overflows"))),
        };
        if let SegKind::Striped {
            stripe_size,
            stripes,
        } = &s.kind
        {
            let k = stripes.len() as u64;
            if k > 1 && !(s.extent_count / k * extent_size).is_multiple_of(*stripe_size) {
                problems.push(format!(
                    "a stripe's length is not a multiple of the stripe size {stripe_size}"
                ));
            }
        }
    }
    Ok(LvMeta {
        name: name.to_string(),
        id,
        status,
        flags,
        creation_time,
        creation_host,
        segments,
        unsupported: if problems.is_empty() {
            None
        } else {
            Some(problems.join("; "))
        },
        raw: sec.clone(),
    })
}

/// The extents each image of `r` needs for an LV segment of `extents` extents.
pub fn image_extents(r: &RaidSeg, extents: u64) -> u64 {
    let n = r.images.len() as u64;
    match r.segtype.as_str() {
        "raid1" | "mirror" => extents,
        "raid10" => extents
            .saturating_mul(r.data_copies.max(2))
            .div_ceil(n.max(1)),
        _ => extents.div_ceil(r.data_stripes() as u64),
    }
}

/// Marks RAID LVs unavailable when their sub-LVs are missing, shared, visible, not
/// plainly mapped, or too small; and sub-LVs unavailable when no RAID LV owns them.
fn check_raid_refs(lvs: &mut [LvMeta]) {
    let mut problems: Vec<(usize, String)> = Vec::new();
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    for (i, lv) in lvs.iter().enumerate() {
        for seg in &lv.segments {
            let SegKind::Raid(r) = &seg.kind else {
                continue;
            };
            if lv.segments.len() != 1 {
                problems.push((
                    i,
                    "a RAID LV of several segments is not mapped by cairn".into(),
                ));
            }
            let need = image_extents(r, seg.extent_count);
            let subs = r
                .images
                .iter()
                .map(|n| (n, need))
                .chain(r.metas.iter().flatten().map(|n| (n, 1)));
            for (name, want) in subs {
                if let Some(prev) = owner.insert(name.clone(), lv.name.clone()) {
                    problems.push((i, format!("sub-LV {name} is also used by {prev}")));
                }
                match lvs.iter().find(|l| &l.name == name) {
                    None => problems.push((i, format!("its sub-LV {name} does not exist"))),
                    Some(sub) => {
                        if sub
                            .segments
                            .iter()
                            .any(|s| !matches!(s.kind, SegKind::Striped { .. }))
                            || sub.unsupported.is_some()
                        {
                            problems.push((
                                i,
                                format!("its sub-LV {name} is not a linear or striped LV"),
                            ));
                        } else if sub.extents() < want {
                            problems.push((
                                i,
                                format!(
                                    "its sub-LV {name} has {} extents, {want} needed",
                                    sub.extents()
                                ),
                            ));
                        }
                    }
                }
            }
        }
    }
    for (i, why) in problems {
        let lv = &mut lvs[i];
        lv.unsupported = Some(match lv.unsupported.take() {
            Some(w) => format!("{w}; {why}"),
            None => why,
        });
    }
}

impl VolumeGroup {
    /// The RAID LV whose segment names `sub` as an image or metadata sub-LV.
    pub fn raid_owner(&self, sub: &str) -> Option<&LvMeta> {
        self.lvs.iter().find(|l| {
            l.segments.iter().any(|s| match &s.kind {
                SegKind::Raid(r) => {
                    r.images.iter().any(|n| n == sub)
                        || r.metas.iter().flatten().any(|n| n == sub)
                        || r.mirror_log.as_deref() == Some(sub)
                }
                _ => false,
            })
        })
    }

    /// Parses and converts a whole metadata text.
    pub fn from_text(text: &[u8]) -> Result<VolumeGroup> {
        VolumeGroup::from_tree(&text::parse(text)?)
    }

    /// Converts a parsed text: exactly one top-level section (the VG) plus trailer keys.
    pub fn from_tree(top: &Section) -> Result<VolumeGroup> {
        let mut vg_entry = None;
        let mut extra = Vec::new();
        for e in &top.entries {
            match &e.node {
                Node::Section(_) if vg_entry.is_some() => {
                    return Err(corrupt(e.line, format!("a second VG section '{}'", e.key)))
                }
                Node::Section(_) => vg_entry = Some(e),
                Node::Value(_) => {
                    if !matches!(
                        e.key.as_str(),
                        "contents" | "version" | "description" | "creation_host" | "creation_time"
                    ) {
                        extra.push(e.clone());
                    }
                }
            }
        }
        let vg_entry = vg_entry.ok_or_else(|| corrupt(0, "no VG section in the metadata"))?;
        if let Some(Value::Str(c)) = top.value("contents") {
            if c != "Text Format Volume Group" {
                return Err(corrupt(0, format!("contents {c:?} is not a VG")));
            }
        }
        if let Some(Value::Int(v)) = top.value("version") {
            if *v != 1 {
                return Err(Error::new(
                    ErrorKind::Unsupported,
                    format!("metadata version {v}"),
                ));
            }
        }
        let Node::Section(sec) = &vg_entry.node else {
            unreachable!()
        };
        let name = vg_entry.key.clone();
        let what = format!("VG {name}");
        let r = Reader {
            sec,
            what: what.clone(),
            line: vg_entry.line,
        };
        let id = r.str("id")?;
        check_id(&id, r.line_of("id"), &what)?;
        let extent_size = r.u64("extent_size")?;
        if extent_size == 0 || extent_size > (1 << 40) {
            return Err(corrupt(
                r.line_of("extent_size"),
                format!("{what}: invalid extent_size {extent_size}"),
            ));
        }
        let mut pvs = Vec::new();
        if let Some((ps, pl)) = r.sub("physical_volumes")? {
            for e in &ps.entries {
                let Node::Section(s) = &e.node else {
                    return Err(corrupt(
                        e.line,
                        format!("{what}: '{}' in physical_volumes is not a section", e.key),
                    ));
                };
                let pr = Reader {
                    sec: s,
                    what: format!("{what} PV {}", e.key),
                    line: e.line,
                };
                let id = pr.str("id")?;
                check_id(&id, pr.line_of("id"), &pr.what)?;
                let pv = PvMeta {
                    key: e.key.clone(),
                    id,
                    device: pr.opt_str("device")?,
                    status: pr.strings("status")?,
                    flags: pr.strings("flags")?,
                    dev_size: pr.opt_u64("dev_size")?.unwrap_or(0),
                    pe_start: pr.u64("pe_start")?,
                    pe_count: pr.u64("pe_count")?,
                    raw: s.clone(),
                };
                if pv
                    .pe_count
                    .checked_mul(extent_size)
                    .and_then(|x| x.checked_add(pv.pe_start))
                    .and_then(|x| x.checked_mul(512))
                    .is_none()
                {
                    return Err(corrupt(e.line, format!("{}: pe_count overflows", pr.what)));
                }
                pvs.push(pv);
            }
            let _ = pl;
        }
        let keys: BTreeSet<&str> = pvs.iter().map(|p| p.key.as_str()).collect();
        if keys.len() != pvs.len() {
            return Err(corrupt(
                vg_entry.line,
                format!("{what}: duplicate PV names"),
            ));
        }
        let mut lvs = Vec::new();
        if let Some((ls, _)) = r.sub("logical_volumes")? {
            for e in &ls.entries {
                let Node::Section(s) = &e.node else {
                    return Err(corrupt(
                        e.line,
                        format!("{what}: '{}' in logical_volumes is not a section", e.key),
                    ));
                };
                lvs.push(parse_lv(&e.key, s, e.line, &keys, extent_size)?);
            }
        }
        check_raid_refs(&mut lvs);
        let str_of = |k: &str| {
            top.value(k)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let vg = VolumeGroup {
            name,
            id,
            seqno: r.u64("seqno")?,
            status: r.strings("status")?,
            flags: r.strings("flags")?,
            extent_size,
            max_lv: r.opt_u64("max_lv")?.unwrap_or(0),
            max_pv: r.opt_u64("max_pv")?.unwrap_or(0),
            metadata_copies: r.opt_u64("metadata_copies")?.unwrap_or(0),
            pvs,
            lvs,
            trailer: Trailer {
                description: str_of("description"),
                creation_host: str_of("creation_host"),
                creation_time: top
                    .value("creation_time")
                    .and_then(Value::as_int)
                    .unwrap_or(0),
                extra,
            },
            raw: sec.clone(),
        };
        // lvm refuses such a VG whole ("PV segments corrupted"): serving it would give two
        // LVs the same extents, or extents past the end of a PV.
        vg.used_extents()?;
        Ok(vg)
    }

    /// A new, empty VG.
    pub fn new(name: String, id: String, extent_size: u64) -> VolumeGroup {
        VolumeGroup {
            name,
            id,
            seqno: 0,
            status: vec!["RESIZEABLE".into(), "READ".into(), "WRITE".into()],
            flags: vec![],
            extent_size,
            max_lv: 0,
            max_pv: 0,
            metadata_copies: 0,
            pvs: vec![],
            lvs: vec![],
            trailer: Trailer::default(),
            raw: Section::default(),
        }
    }

    pub fn pv(&self, key: &str) -> Option<&PvMeta> {
        self.pvs.iter().find(|p| p.key == key)
    }

    pub fn lv(&self, name: &str) -> Option<&LvMeta> {
        self.lvs.iter().find(|l| l.name == name)
    }

    /// Whether cairn may change this VG, or why not.
    pub fn writable(&self) -> std::result::Result<(), String> {
        if let Some(s) = self
            .status
            .iter()
            .find(|s| !matches!(s.as_str(), "RESIZEABLE" | "READ" | "WRITE"))
        {
            return Err(format!(
                "VG {} has status {s}, which cairn does not change",
                self.name
            ));
        }
        if !self.status.iter().any(|s| s == "WRITE") {
            return Err(format!("VG {} is read-only", self.name));
        }
        if self.raw.get("lock_type").is_some() {
            return Err(format!("VG {} is a shared (lock_type) VG", self.name));
        }
        Ok(())
    }

    /// The VG section as a tree, unknown keys kept in place.
    pub fn to_tree(&self) -> Section {
        let mut s = self.raw.clone();
        let str_ = |v: &str| Value::Str(v.to_string());
        let int = |v: u64| Value::Int(i64::try_from(v).unwrap_or(i64::MAX));
        let list = |v: &[String]| Value::Array(v.iter().map(|x| Value::Str(x.clone())).collect());
        s.set_value("id", str_(&self.id), false);
        s.set_value("seqno", int(self.seqno), false);
        s.set_value("format", str_("lvm2"), false);
        s.set_value("status", list(&self.status), false);
        s.set_value("flags", list(&self.flags), false);
        s.set_value("extent_size", int(self.extent_size), false);
        s.set_value("max_lv", int(self.max_lv), false);
        s.set_value("max_pv", int(self.max_pv), false);
        s.set_value("metadata_copies", int(self.metadata_copies), false);

        let mut pvs = Section::default();
        for p in &self.pvs {
            let mut ps = p.raw.clone();
            ps.set_value("id", str_(&p.id), false);
            match &p.device {
                Some(d) => ps.set_value("device", str_(d), false),
                None => ps.remove("device"),
            }
            ps.set_value("status", list(&p.status), true);
            ps.set_value("flags", list(&p.flags), false);
            ps.set_value("dev_size", int(p.dev_size), false);
            ps.set_value("pe_start", int(p.pe_start), false);
            ps.set_value("pe_count", int(p.pe_count), false);
            pvs.set(&p.key, Node::Section(ps), true);
        }
        s.set("physical_volumes", Node::Section(pvs), true);

        if self.lvs.is_empty() {
            s.remove("logical_volumes");
        } else {
            let mut lvs = Section::default();
            for lv in &self.lvs {
                lvs.set(&lv.name, Node::Section(lv_tree(lv)), true);
            }
            // Keep logical_volumes after physical_volumes even if the raw text had none.
            s.set("logical_volumes", Node::Section(lvs), true);
        }
        s.trailing_blank = true;
        s
    }

    /// The complete text: VG section, then lvm's trailer. `now` is seconds since the epoch.
    pub fn to_text(&self) -> String {
        let mut top = Section::default();
        top.set(&self.name, Node::Section(self.to_tree()), false);
        let mut out = text::print(&top);
        let t = &self.trailer;
        let date = ctime(t.creation_time);
        out.push_str(&format!(
            "# Generated by cairn {}: {date}\n\n",
            env!("CARGO_PKG_VERSION")
        ));
        out.push_str("contents = \"Text Format Volume Group\"\nversion = 1\n\n");
        let mut rest = String::new();
        text::print_entries(
            &mut rest,
            &Section {
                entries: vec![Entry {
                    key: "description".into(),
                    node: Node::Value(Value::Str(t.description.clone())),
                    blank: false,
                    multiline: false,
                    line: 0,
                }],
                trailing_blank: false,
            },
        );
        out.push_str(&rest);
        out.push('\n');
        let mut host = String::new();
        text::print_entries(
            &mut host,
            &Section {
                entries: vec![Entry {
                    key: "creation_host".into(),
                    node: Node::Value(Value::Str(t.creation_host.clone())),
                    blank: false,
                    multiline: false,
                    line: 0,
                }],
                trailing_blank: false,
            },
        );
        out.push_str(host.trim_end());
        out.push_str("\t# cairn\n");
        out.push_str(&format!("creation_time = {}\t# {date}\n", t.creation_time));
        let mut extra = String::new();
        text::print_entries(
            &mut extra,
            &Section {
                entries: t.extra.clone(),
                trailing_blank: false,
            },
        );
        out.push_str(&extra);
        out.push('\n');
        out
    }

    /// Used extents per PV key: `(first, count, lv name)` runs, sorted; errors on overlap
    /// or extents past `pe_count`, which would make any allocation unsafe.
    pub fn used_extents(&self) -> Result<UsedMap> {
        let mut used: UsedMap = self
            .pvs
            .iter()
            .map(|p| (p.key.clone(), Vec::new()))
            .collect();
        for lv in &self.lvs {
            for seg in &lv.segments {
                match &seg.kind {
                    SegKind::Striped { stripes, .. } if !stripes.is_empty() => {
                        let per = seg.extent_count / stripes.len() as u64;
                        for a in stripes {
                            if let Some(v) = used.get_mut(&a.pv) {
                                v.push((a.pe, per, lv.name.clone()));
                            }
                        }
                    }
                    SegKind::Striped { .. } | SegKind::Raid(_) => {}
                    SegKind::Other(_) => {
                        // Segment types cairn does not map may still place areas on PVs
                        // (pvmove, old mirrors: "pvN", pe pairs). Count each such area as
                        // extent_count extents: too much is safe, too little is not.
                        for e in &seg.raw.entries {
                            if let Node::Value(Value::Array(a)) = &e.node {
                                for pair in a.chunks(2) {
                                    if let [Value::Str(pv), Value::Int(pe)] = pair {
                                        if let (Some(v), Ok(pe)) =
                                            (used.get_mut(pv), u64::try_from(*pe))
                                        {
                                            v.push((pe, seg.extent_count, lv.name.clone()));
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
        for p in &self.pvs {
            let v = used.get_mut(&p.key).expect("every PV has an entry");
            v.sort();
            let mut end = 0u64;
            let mut last = String::new();
            for (first, count, lv) in v.iter() {
                let e = first
                    .checked_add(*count)
                    .filter(|&e| e <= p.pe_count)
                    .ok_or_else(|| {
                        corrupt(
                            0,
                            format!(
                        "VG {}: LV {lv} uses extents {first}..{} of PV {}, which has only {} (PV segments corrupted)",
                        self.name,
                        first.saturating_add(*count),
                        p.key,
                        p.pe_count
                    ),
                        )
                    })?;
                if *first < end {
                    return Err(corrupt(
                        0,
                        format!(
                            "VG {}: LVs {last} and {lv} both use extent {first} of PV {} (PV segments corrupted)",
                            self.name, p.key
                        ),
                    ));
                }
                end = e;
                last.clone_from(lv);
            }
        }
        Ok(used)
    }
}

fn lv_tree(lv: &LvMeta) -> Section {
    let mut s = lv.raw.clone();
    let str_ = |v: &str| Value::Str(v.to_string());
    let int = |v: u64| Value::Int(i64::try_from(v).unwrap_or(i64::MAX));
    let list = |v: &[String]| Value::Array(v.iter().map(|x| Value::Str(x.clone())).collect());
    s.set_value("id", str_(&lv.id), false);
    s.set_value("status", list(&lv.status), false);
    s.set_value("flags", list(&lv.flags), false);
    if let Some(t) = lv.creation_time {
        s.set_value("creation_time", Value::Int(t), false);
    }
    if let Some(h) = &lv.creation_host {
        s.set_value("creation_host", str_(h), false);
    }
    s.set_value("segment_count", int(lv.segments.len() as u64), false);
    s.entries.retain(|e| {
        !(e.key.starts_with("segment")
            && e.key.len() > 7
            && e.key[7..].bytes().all(|c| c.is_ascii_digit()))
    });
    for (i, seg) in lv.segments.iter().enumerate() {
        let mut ss = seg.raw.clone();
        if let SegKind::Striped {
            stripe_size,
            stripes,
        } = &seg.kind
        {
            ss.set_value("start_extent", int(seg.start_extent), false);
            ss.set_value("extent_count", int(seg.extent_count), false);
            ss.set_value("type", str_("striped"), true);
            ss.set_value("stripe_count", int(stripes.len() as u64), false);
            if stripes.len() > 1 {
                ss.set_value("stripe_size", int(*stripe_size), false);
            } else {
                ss.remove("stripe_size");
            }
            let mut arr = Vec::new();
            for a in stripes {
                arr.push(Value::Str(a.pv.clone()));
                arr.push(int(a.pe));
            }
            ss.set_value("stripes", Value::Array(arr), true);
        }
        // A legacy mirror is read, never written: its text stays as lvm wrote it.
        if let Some(r) = seg.kind.clone().filter_raid() {
            ss.set_value("start_extent", int(seg.start_extent), false);
            ss.set_value("extent_count", int(seg.extent_count), false);
            ss.set_value("type", str_(&r.segtype), true);
            if r.segtype.starts_with("raid0") {
                ss.set_value("stripe_count", int(r.images.len() as u64), false);
            } else {
                ss.set_value("device_count", int(r.images.len() as u64), false);
                if r.segtype == "raid10" {
                    ss.set_value("data_copies", int(r.data_copies), false);
                }
                if r.region_size > 0 {
                    ss.set_value("region_size", int(r.region_size), false);
                }
            }
            if r.stripe_size > 0 {
                ss.set_value("stripe_size", int(r.stripe_size), false);
            }
            let mut arr = Vec::new();
            for (m, i) in r.metas.iter().zip(&r.images) {
                if let Some(m) = m {
                    arr.push(str_(m));
                }
                arr.push(str_(i));
            }
            let key = if r.segtype == "raid0" {
                "raid0_lvs"
            } else {
                "raids"
            };
            ss.set_value(key, Value::Array(arr), true);
        }
        // lvm puts a blank line before the first segment only.
        s.set(&format!("segment{}", i + 1), Node::Section(ss), i == 0);
    }
    s
}

/// `Sat Nov 21 18:35:26 2026` (UTC), as ctime(3) prints it, for the trailer comments.
pub fn ctime(epoch: i64) -> String {
    let days = epoch.div_euclid(86_400);
    let secs = epoch.rem_euclid(86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    const WD: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MO: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let wd = WD[usize::try_from(days.rem_euclid(7)).unwrap_or(0)];
    let mo = MO[usize::try_from(m - 1).unwrap_or(0).min(11)];
    format!(
        "{wd} {mo} {d} {:02}:{:02}:{:02} {y}",
        secs / 3600,
        secs % 3600 / 60,
        secs % 60
    )
}
