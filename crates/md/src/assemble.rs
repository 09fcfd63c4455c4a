//! Assembling an array from its members' superblocks, and creating a new one.
//!
//! ```text
//!   members ─► read each v1.2 superblock (strict) ─► one array UUID? ─► freshest (events)
//!           ─► each member's role per the freshest dev_roles; stale / faulty / spare out
//!           ─► missing roles ─► still redundant? dirty + degraded parity needs force,
//!              unless the members carry a partial-parity log (ppl.rs)
//!           ─► Array (slots by role, metadata state) ─► dirty? replay the log
//!   create ─► refuse signatures (probe.rs) unless force ─► create::create (mdadm 4.2)
//!          ─► zeroed members? clean : resync pending ─► write superblocks (FUA)
//!          ─► RAID4/5/6: empty partial-parity log ─► assemble
//! ```
//!
//! The rules are the kernel's and mdadm's (ondisk-formats.md §1.6): the member with the
//! highest `events` defines the array; a member whose `events + 1` is below that is
//! stale; a member the freshest superblock marks faulty is out; a parity array that was
//! not shut down cleanly (`resync_offset != MAX`) does not start degraded unless forced,
//! because its parity may not match its data.

use std::collections::BTreeMap;
use std::sync::Arc;

use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};

use crate::bitmap::format::BitmapChoice;
use crate::create::{create, CreateParams};
use crate::layout::ArrayLayout;
use crate::level::Level;
use crate::ondisk::{FeaturePolicy, Superblock, Uuid};
use crate::probe::probe_signatures;
use crate::slot::{Member, Slot};
use crate::state::{now, Array, Extra, Identity, LeftOut, Meta};
use crate::units::{small, Sectors, SECTOR_SIZE};

/// How to assemble.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AssembleOptions {
    /// Start a dirty parity array even when degraded (mdadm `--force` /
    /// `start_dirty_degraded`): data rebuilt from parity may be wrong where a write was
    /// interrupted.
    pub force: bool,
}

/// What to create (the CLI's `cairn md create`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateOptions {
    pub level: Level,
    /// The layout word; `None` for mdadm's default.
    pub layout: Option<u32>,
    /// `None` for mdadm's default (512 KiB) where the level stripes.
    pub chunk: Option<Sectors>,
    pub name: String,
    pub homehost: Option<String>,
    /// `None` for a random one.
    pub uuid: Option<Uuid>,
    /// Overwrite members that carry a superblock or a filesystem signature.
    pub force: bool,
    /// The caller knows every member reads as zeroes (files it just created sparse), so
    /// the array is consistent without a resync. Otherwise the members are checked.
    pub members_zeroed: bool,
    /// Mark the array clean whatever the members hold (mdadm `--assume-clean`).
    pub assume_clean: bool,
    /// The write-intent bitmap (mdadm `--bitmap`); [`CreateOptions::new`] picks an
    /// internal one for the redundant levels.
    pub bitmap: BitmapChoice,
    /// RAID4/5/6: keep a partial-parity log on the members (ppl.rs,
    /// docs/write-hole.md), so that a crash during a partial-stripe write followed by a
    /// member loss cannot corrupt data that was not being written. Costs one extra
    /// durable write per partial-stripe write. Ignored for other levels.
    pub write_journal: bool,
}

impl CreateOptions {
    /// mdadm's defaults for `level`, named `name`.
    pub fn new(level: Level, name: impl Into<String>) -> CreateOptions {
        CreateOptions {
            level,
            layout: None,
            chunk: None,
            name: name.into(),
            homehost: None,
            uuid: None,
            force: false,
            members_zeroed: false,
            assume_clean: false,
            bitmap: BitmapChoice::default_for(level),
            write_journal: level.parity_members() > 0,
        }
    }
}

fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

/// One member's superblock, as read.
struct Found {
    dev: Arc<dyn BlockDevice>,
    name: String,
    sb: Superblock,
}

impl Array {
    /// Assembles the array the `members` belong to. `names` name them in messages and
    /// reports (paths, usually). Members may come in any order; missing ones make the
    /// array degraded when the level allows it.
    pub fn assemble(
        members: Vec<Arc<dyn BlockDevice>>,
        names: Vec<String>,
        opts: AssembleOptions,
    ) -> Result<Array> {
        if members.len() != names.len() {
            return Err(invalid(format!(
                "{} members but {} names",
                members.len(),
                names.len()
            )));
        }
        if members.is_empty() {
            return Err(invalid("no members to assemble"));
        }
        let mut found = Vec::with_capacity(members.len());
        for (dev, name) in members.into_iter().zip(names) {
            let sb = Superblock::read_any_size(&*dev, &name, FeaturePolicy::Supported)?;
            found.push(Found { dev, name, sb });
        }
        check_one_array(&found)?;

        let freshest = found
            .iter()
            .max_by_key(|f| f.sb.events)
            .map(|f| f.sb.clone())
            .expect("at least one member");
        let events = freshest.events;
        let raid_disks = small(u64::from(freshest.raid_disks));
        let label = format!("md array {}", freshest.set_name);

        // Each member's role as the freshest superblock sees it.
        let mut by_role: Vec<Option<Found>> = (0..raid_disks).map(|_| None).collect();
        let mut left_out: Vec<LeftOut> = Vec::new();
        let mut spares: Vec<Found> = Vec::new();
        // Left out as stale or marked faulty, yet of this array's shape: what force may
        // take back in (mdadm --assemble --force).
        let mut behind: Vec<Found> = Vec::new();
        let same_shape = |sb: &Superblock| {
            sb.level == freshest.level
                && sb.layout == freshest.layout
                && sb.chunk == freshest.chunk
                && sb.raid_disks == freshest.raid_disks
                && sb.size == freshest.size
        };
        for f in found {
            let out = |reason: String, f: &Found| LeftOut {
                name: f.name.clone(),
                role: f.sb.role().slot().map(u32::from),
                events: f.sb.events,
                reason,
            };
            let sectors = Sectors::from_bytes_floor(f.dev.geometry().size);
            if let Err(e) = f.sb.check_member_size(sectors, &f.name) {
                // A device that shrank (a member server reporting too small a size):
                // md does not take it, the others run degraded if they can.
                tracing::warn!("{label}: {e}; it is left out");
                left_out.push(out(format!("too small: {e}"), &f));
                continue;
            }
            if f.sb.events.saturating_add(1) < events {
                let claimed = f.sb.role().slot();
                let taken = claimed.is_some_and(|r| {
                    freshest.dev_roles.iter().enumerate().any(|(d, role)| {
                        role.slot() == Some(r) && d != small(u64::from(f.sb.dev_number))
                    })
                });
                left_out.push(out(
                    format!(
                        "stale: events {}, the array is at {events}{}",
                        f.sb.events,
                        if taken {
                            "; its role now belongs to another device (replaced?)"
                        } else {
                            ""
                        }
                    ),
                    &f,
                ));
                if same_shape(&f.sb) {
                    behind.push(f);
                }
                continue;
            }
            if !same_shape(&f.sb) {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "{label}: {} says {} {} members layout {} chunk {} size {}, but the \
                         freshest member says {} {} members layout {} chunk {} size {}",
                        f.name,
                        f.sb.level,
                        f.sb.raid_disks,
                        f.sb.layout,
                        f.sb.chunk.0,
                        f.sb.size.0,
                        freshest.level,
                        freshest.raid_disks,
                        freshest.layout,
                        freshest.chunk.0,
                        freshest.size.0
                    ),
                ));
            }
            let seen_as = freshest
                .dev_roles
                .get(small(u64::from(f.sb.dev_number)))
                .copied()
                .unwrap_or(crate::ondisk::DevRole::SPARE);
            let Some(role) = seen_as.slot().map(usize::from) else {
                let why = match seen_as {
                    crate::ondisk::DevRole::FAULTY => "marked faulty by the other members",
                    crate::ondisk::DevRole::JOURNAL => "a journal device (not implemented)",
                    _ => {
                        spares.push(f);
                        continue;
                    }
                };
                left_out.push(out(why.to_string(), &f));
                if seen_as == crate::ondisk::DevRole::FAULTY {
                    behind.push(f);
                }
                continue;
            };
            if role >= raid_disks {
                left_out.push(out(
                    format!("role {role} is past the array's {raid_disks} members"),
                    &f,
                ));
                continue;
            }
            if let Some(other) = &by_role[role] {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "{label}: {} and {} both claim role {role} (the same device given twice?)",
                        other.name, f.name
                    ),
                ));
            }
            by_role[role] = Some(f);
        }
        let could_force = !opts.force
            && behind.iter().any(|f| {
                !f.sb.features.has(crate::ondisk::Features::RECOVERY_OFFSET)
                    && f.sb
                        .role()
                        .slot()
                        .map(usize::from)
                        .is_some_and(|r| r < raid_disks && by_role[r].is_none())
            });
        let force_hint = if could_force {
            "; with force the freshest of the members left out are taken back in (mdadm \
             --assemble --force), at the risk of inconsistent data where they missed writes"
        } else {
            ""
        };
        let forced_in = if opts.force {
            force_in(&freshest, &mut by_role, &mut behind, &mut left_out)?
        } else {
            Vec::new()
        };
        // Sizes: RAID0 and linear use each member's data_size, which missing members
        // would leave unknown; those levels cannot be degraded anyway.
        let missing: Vec<usize> = (0..raid_disks).filter(|&r| by_role[r].is_none()).collect();
        let data_sizes: Vec<Sectors> = by_role
            .iter()
            .map(|f| f.as_ref().map_or(freshest.size, |f| f.sb.data_size))
            .collect();
        if !missing.is_empty() && matches!(freshest.level, Level::Linear | Level::Raid0) {
            return Err(cannot_start(
                &label,
                &freshest,
                &missing,
                &left_out,
                &format!("it has no redundancy{force_hint}"),
            ));
        }
        let layout =
            ArrayLayout::from_superblock(&freshest, &data_sizes).map_err(|e| e.context(&label))?;
        if layout.array_sectors() == Sectors::ZERO {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{label}: the superblocks describe an array of 0 bytes (component size {} \
                     sectors, chunk {} sectors)",
                    freshest.size.0, freshest.chunk.0
                ),
            ));
        }
        let down: Vec<bool> = by_role.iter().map(Option::is_none).collect();
        if !layout.tolerates(&down) {
            let tolerance = match &layout {
                ArrayLayout::Raid10(l) => format!(
                    "raid10 {} keeps {} copies and needs one of each",
                    l.layout().short_name(),
                    l.copies()
                ),
                other => format!("{} tolerates {}", freshest.level, other.redundancy()),
            } + force_hint;
            return Err(cannot_start(
                &label, &freshest, &missing, &left_out, &tolerance,
            ));
        }
        let needed = member_extent(&layout);
        for f in by_role.iter().flatten() {
            let need = needed.unwrap_or(f.sb.data_size);
            if need > f.sb.data_size {
                return Err(Error::new(
                    ErrorKind::Corrupt,
                    format!(
                        "{label}: {} holds {} data sectors but the array uses {}",
                        f.name, f.sb.data_size.0, need.0
                    ),
                ));
            }
        }
        // A member given for a role the array still counts as in use (the freshest
        // superblock names a device in it) but left out, stale or marked faulty: the
        // array was not degraded, and starting it so would make that member more stale
        // still. mdadm refuses this (fewer devices than the array had) without --run.
        let stale_roles: Vec<usize> = missing
            .iter()
            .copied()
            .filter(|&r| {
                let r16 = u16::try_from(r).ok();
                // A member too small to hold its data is a disk that cannot be used,
                // as a missing one: not stale.
                freshest.dev_roles.iter().any(|d| d.slot() == r16)
                    && left_out.iter().any(|l| {
                        l.role == u32::try_from(r).ok() && !l.reason.starts_with("too small")
                    })
            })
            .collect();
        if !stale_roles.is_empty() && !opts.force {
            return Err(Error::new(
                ErrorKind::Degraded,
                format!(
                    "{label} cannot start: {} of {} members missing ({}); it was not degraded, \
                     so give the current member{}, or start it degraded with force (mdadm \
                     --assemble --run)",
                    missing.len(),
                    freshest.raid_disks,
                    describe_missing(&missing, &left_out),
                    if stale_roles.len() == 1 { "" } else { "s" }
                ),
            ));
        }
        // Members left out for a role that is now missing are named in the degraded
        // start's message (and the report); others only here.
        for l in &left_out {
            let explained = l
                .role
                .is_some_and(|r| missing.iter().any(|&m| u32::try_from(m).ok() == Some(r)));
            if explained {
                tracing::info!("{label}: leaving {} out: {}", l.name, l.reason);
            } else {
                tracing::warn!("{label}: leaving {} out: {}", l.name, l.reason);
            }
        }
        let dirty = !freshest.is_clean();
        let present: Vec<(&str, &Arc<dyn BlockDevice>)> = by_role
            .iter()
            .flatten()
            .map(|f| (f.name.as_str(), &f.dev))
            .collect();
        // With a partial-parity log, replay makes parity match every chunk that was not
        // being written, so a dirty degraded start is safe; a log one member's copy of
        // which cannot be used does not protect the stripes whose parity is there.
        let log = crate::ppl::probe(&present, &freshest);
        for p in &log.problems {
            tracing::warn!(
                "{label}: {p}; the array is not protected by that log against the write hole"
            );
        }
        // Replay writes: read-only members cannot have it.
        let logged =
            dirty && !present.iter().any(|(_, d)| d.capabilities().read_only) && log.protects();
        if dirty && !missing.is_empty() && freshest.level.parity_members() > 0 && !logged {
            if !opts.force {
                let why_no_log = if log.problems.is_empty() {
                    "Arrays cairn creates with a partial-parity log (the default) start safely \
                     here, unless opened read-only"
                        .to_string()
                } else {
                    format!(
                        "Its partial-parity log does not protect this start ({})",
                        log.problems.join("; ")
                    )
                };
                return Err(Error::new(
                    ErrorKind::Degraded,
                    format!(
                        "{label} cannot start: it is degraded ({}) and was not shut down \
                         cleanly, so its parity may not match its data and rebuilt data could \
                         be wrong; start it with force to accept that (mdadm --assemble --force). \
                         {why_no_log}",
                        describe_missing(&missing, &left_out)
                    ),
                ));
            }
            tracing::warn!(
                "{label}: starting dirty and degraded because of force; data rebuilt from \
                 parity may be wrong where a write was interrupted"
            );
        }
        if !forced_in.is_empty() {
            let taken: Vec<String> = forced_in
                .iter()
                .map(|(name, ev)| format!("{name} (events {ev})"))
                .collect();
            tracing::warn!(
                "{label}: started by force from the freshest members: {} taken back in at \
                 events {events}. Writes the array took after a member's own event count \
                 may be missing from it, so data rebuilt from it can be inconsistent there; \
                 run `cairn md check` and check the filesystem before trusting the data",
                taken.join(", ")
            );
        }
        // The report says degraded and why; the caller warns (the CLI loudly, once).
        if !missing.is_empty() {
            tracing::info!(
                "{label}: starting degraded, {}",
                describe_missing(&missing, &left_out)
            );
        }
        let bitmap_sb = freshest.clone();
        let identity = Identity {
            uuid: freshest.set_uuid,
            set_name: freshest.set_name,
            level: freshest.level,
            layout_word: freshest.layout,
            chunk: freshest.chunk,
            component_size: freshest.size,
            ctime: freshest.ctime,
            feature_map: freshest.features.0,
        };
        let mut sbs = Vec::with_capacity(raid_disks);
        let mut slots = Vec::with_capacity(raid_disks);
        let mirrored = matches!(layout, ArrayLayout::Raid1(_) | ArrayLayout::Raid10(_));
        for f in by_role {
            match f {
                Some(f) => {
                    let base =
                        f.sb.data_offset
                            .bytes()
                            .expect("checked at parse: data_offset + data_size fits in bytes");
                    // A member part-way through a rebuild: in sync below recovery_offset
                    // (parity levels read it there; mirrors only once it is done).
                    let recovering = f.sb.features.has(crate::ondisk::Features::RECOVERY_OFFSET);
                    let cp = f.sb.recovery_offset.0.saturating_mul(SECTOR_SIZE);
                    let slot = if recovering {
                        tracing::info!(
                            "{label}: {} was being rebuilt; the rebuild resumes at member \
                             sector {}",
                            f.name,
                            f.sb.recovery_offset.0
                        );
                        let s = Slot::with_synced(
                            Some(Member {
                                dev: f.dev,
                                name: f.name,
                                base,
                            }),
                            if mirrored { 0 } else { cp },
                        );
                        s.recovery_cp.store(
                            if matches!(layout, ArrayLayout::Raid10(_)) {
                                0
                            } else {
                                cp
                            },
                            std::sync::atomic::Ordering::Release,
                        );
                        s
                    } else {
                        Slot::new(Some(Member {
                            dev: f.dev,
                            name: f.name,
                            base,
                        }))
                    };
                    sbs.push(Some(f.sb));
                    slots.push(slot);
                }
                None => {
                    sbs.push(None);
                    slots.push(Slot::new(None));
                }
            }
        }
        let spares: Vec<Extra> = spares
            .into_iter()
            .filter_map(|f| {
                let base = f.sb.data_offset.bytes()?;
                Some(Extra {
                    member: Arc::new(Member {
                        dev: f.dev,
                        name: f.name,
                        base,
                    }),
                    sb: Some(f.sb),
                    role: None,
                })
            })
            .collect();
        let meta = Meta {
            events,
            utime: freshest.utime,
            dirty: false,
            resync_pending: dirty,
            resync_from: if dirty {
                freshest.resync_offset
            } else {
                Sectors::ZERO
            },
            sbs,
            dev_roles: freshest.dev_roles.clone(),
            spares,
            replacements: (0..raid_disks).map(|_| None).collect(),
            faulty: Vec::new(),
        };
        // Members one event behind (a superblock update cut short) are current, but a
        // second cut-short update would leave them two behind, and stale. Bring them level
        // first, without a new event, as md's first update after assembly would.
        let uneven = meta.sbs.iter().flatten().any(|sb| sb.events != events);
        let bitmap = crate::bitmap::load_bitmap(&slots, &layout, &bitmap_sb, events, &label)?;
        let forced = (opts.force && dirty) || !forced_in.is_empty();
        let mut array = Array::build(layout, slots, identity, meta, left_out, forced)?;
        if events >= u64::MAX - 1 && !array.capabilities().read_only {
            // No room for one more change: the first write would need it (superblocks
            // never say u64::MAX, see `write_superblocks`).
            return Err(crate::state::events_exhausted(&label, events));
        }
        array.install_bitmap(bitmap);
        if uneven && !array.capabilities().read_only {
            let mut meta = array.meta_lock();
            array
                .write_superblocks(&mut meta)
                .map_err(|e| e.context(format!("{label}: bringing the members' events level")))?;
        }
        array.ppl = crate::ppl::Ppl::open(&array, &freshest, dirty)
            .map_err(|e| e.context(format!("{label}: replaying the partial-parity log")))?;
        Ok(array)
    }

    /// Creates a new array on `members` (in role order) as `mdadm --create` would, and
    /// returns it assembled. Members that carry an md superblock or a recognisable
    /// filesystem, LUKS or LVM signature are refused unless `opts.force`. When every
    /// member reads as zeroes where the array keeps data (or the caller says so), the
    /// array is clean at once; otherwise it is marked for resync (see the report).
    pub fn create(
        members: Vec<Arc<dyn BlockDevice>>,
        names: Vec<String>,
        opts: &CreateOptions,
    ) -> Result<Array> {
        if members.len() != names.len() {
            return Err(invalid(format!(
                "{} members but {} names",
                members.len(),
                names.len()
            )));
        }
        for (i, a) in members.iter().enumerate() {
            if let Some(j) = members[..i].iter().position(|b| Arc::ptr_eq(a, b)) {
                return Err(invalid(format!(
                    "{} and {} are the same device",
                    names[j], names[i]
                )));
            }
        }
        if !opts.force {
            let mut found = Vec::new();
            for (dev, name) in members.iter().zip(&names) {
                for sig in probe_signatures(&**dev)? {
                    found.push(format!("{name} {sig}"));
                }
            }
            if !found.is_empty() {
                return Err(invalid(format!(
                    "refusing to create: {}; use force to overwrite",
                    found.join("; ")
                )));
            }
        }
        let params = CreateParams {
            level: opts.level,
            layout: opts.layout,
            chunk: opts.chunk,
            member_sectors: members
                .iter()
                .map(|d| Sectors::from_bytes_floor(d.geometry().size))
                .collect(),
            name: opts.name.clone(),
            homehost: opts.homehost.clone(),
            uuid: opts.uuid.unwrap_or_else(|| Uuid(random_bytes())),
            device_uuids: (0..members.len()).map(|_| Uuid(random_bytes())).collect(),
            ctime: now(),
            assume_clean: true,
            bitmap: opts.bitmap,
        };
        let mut created = create(&params)?;
        let redundant = !matches!(opts.level, Level::Linear | Level::Raid0);
        let clean = !redundant
            || opts.assume_clean
            || opts.members_zeroed
            || all_zero(&members, &names, &created.superblocks)?;
        if !clean {
            for sb in &mut created.superblocks {
                sb.resync_offset = Sectors::ZERO;
            }
            tracing::warn!(
                "md array {}: members hold data, so parity/mirrors are not known to match; \
                 the array is marked for resync",
                created.superblocks[0].set_name
            );
        }
        // The bitmap first: the superblock's feature bit points at it.
        let bitmap = created.bitmap_area();
        for ((sb, dev), name) in created.superblocks.iter().zip(&members).zip(&names) {
            if let Some(area) = &bitmap {
                dev.write_at(area, created.bitmap_byte_offset(), WriteFlags::FUA)
                    .map_err(|e| e.context(format!("writing the bitmap on {name}")))?;
            }
            sb.write_to(&**dev, name)?;
        }
        if opts.write_journal && opts.level.parity_members() > 0 {
            crate::ppl::format(&members, &names, &created.superblocks)?;
        }
        Array::assemble(members, names, AssembleOptions::default())
    }
}

/// Refuses members of more than one array, naming each group.
fn check_one_array(found: &[Found]) -> Result<()> {
    let mut groups: BTreeMap<Uuid, Vec<&Found>> = BTreeMap::new();
    for f in found {
        groups.entry(f.sb.set_uuid).or_default().push(f);
    }
    if groups.len() < 2 {
        return Ok(());
    }
    let parts: Vec<String> = groups
        .iter()
        .map(|(uuid, fs)| {
            let names: Vec<&str> = fs.iter().map(|f| f.name.as_str()).collect();
            format!(
                "{} belong{} to array {uuid} ({})",
                names.join(", "),
                if names.len() == 1 { "s" } else { "" },
                fs[0].sb.set_name
            )
        })
        .collect();
    Err(invalid(format!(
        "members of different arrays given together: {}; assemble one array at a time",
        parts.join("; ")
    )))
}

/// mdadm --assemble --force: while the members in place cannot start the array, takes
/// back the freshest left-out member (by event count) whose own superblock claims an
/// empty role, as in sync. Returns the members taken, with their event counts.
fn force_in(
    freshest: &Superblock,
    by_role: &mut [Option<Found>],
    behind: &mut Vec<Found>,
    left_out: &mut Vec<LeftOut>,
) -> Result<Vec<(String, u64)>> {
    let redundant = !matches!(freshest.level, Level::Linear | Level::Raid0);
    // Which roles may be down depends on the level and layout, not on member sizes.
    let sizes = vec![freshest.size; by_role.len()];
    let layout = if redundant {
        Some(ArrayLayout::from_superblock(freshest, &sizes)?)
    } else {
        None
    };
    let mut taken = Vec::new();
    loop {
        let down: Vec<bool> = by_role.iter().map(Option::is_none).collect();
        let enough = match &layout {
            Some(l) => l.tolerates(&down),
            None => !down.contains(&true),
        };
        if enough {
            return Ok(taken);
        }
        // A member that was part-way through a rebuild never held its whole role: md
        // does not force such a one in either.
        let empty_role = |f: &Found| {
            if f.sb.features.has(crate::ondisk::Features::RECOVERY_OFFSET) {
                return None;
            }
            f.sb.role()
                .slot()
                .map(usize::from)
                .filter(|&r| r < by_role.len() && by_role[r].is_none())
        };
        let best = behind
            .iter()
            .enumerate()
            .filter(|(_, f)| empty_role(f).is_some())
            .max_by_key(|(_, f)| f.sb.events)
            .map(|(i, _)| i);
        let Some(i) = best else { return Ok(taken) };
        let f = behind.swap_remove(i);
        let role = empty_role(&f).expect("filtered");
        if let Some(at) = left_out.iter().position(|l| l.name == f.name) {
            left_out.remove(at);
        }
        taken.push((f.name.clone(), f.sb.events));
        by_role[role] = Some(f);
    }
}

/// "role 1 (disk1.img, stale), role 3 missing".
fn describe_missing(missing: &[usize], left_out: &[LeftOut]) -> String {
    let parts: Vec<String> = missing
        .iter()
        .map(|&r| {
            let why: Vec<String> = left_out
                .iter()
                .filter(|l| l.role == u32::try_from(r).ok())
                .map(|l| format!("{}: {}", l.name, l.reason))
                .collect();
            if why.is_empty() {
                format!("role {r} missing")
            } else {
                format!("role {r} missing ({})", why.join("; "))
            }
        })
        .collect();
    parts.join(", ")
}

fn cannot_start(
    label: &str,
    sb: &Superblock,
    missing: &[usize],
    left_out: &[LeftOut],
    tolerance: &str,
) -> Error {
    Error::new(
        ErrorKind::Degraded,
        format!(
            "{label} cannot start: {} of {} members missing ({}); {tolerance}",
            missing.len(),
            sb.raid_disks,
            describe_missing(missing, left_out)
        ),
    )
}

/// Sectors of every member the array uses, when the level uses the same on each.
fn member_extent(layout: &ArrayLayout) -> Option<Sectors> {
    match layout {
        ArrayLayout::Linear(_) | ArrayLayout::Raid0(_) => None,
        ArrayLayout::Raid1(l) => Some(l.array_sectors()),
        ArrayLayout::Parity(l) => Some(Sectors(l.stripes() * l.chunk().0)),
        ArrayLayout::Raid10(l) => Some(l.dev_sectors()),
    }
}

/// Whether every member reads as zeroes over the part the array uses. Holes count as
/// zeroes; allocated ranges are read, up to a budget past which the answer is "no".
fn all_zero(
    members: &[Arc<dyn BlockDevice>],
    names: &[String],
    sbs: &[Superblock],
) -> Result<bool> {
    const READ_BUDGET: u64 = 64 << 20;
    let mut budget = READ_BUDGET;
    for ((dev, name), sb) in members.iter().zip(names).zip(sbs) {
        let start = sb.data_offset.bytes().expect("checked by create");
        let len = sb.size.bytes().expect("checked by create");
        let end = start + len;
        let mut pos = start;
        while pos < end {
            let extents = dev
                .extents(pos, end - pos)
                .map_err(|e| e.context(format!("{name}: checking for data")))?;
            if extents.is_empty() {
                break;
            }
            for e in extents {
                if !e.zero && !e.hole {
                    if e.length > budget {
                        return Ok(false);
                    }
                    budget -= e.length;
                    if !reads_zero(&**dev, name, e.offset, e.length)? {
                        return Ok(false);
                    }
                }
                pos = e.offset + e.length;
            }
        }
    }
    Ok(true)
}

fn reads_zero(dev: &dyn BlockDevice, name: &str, off: u64, len: u64) -> Result<bool> {
    let mut buf = vec![0u8; small(len.min(1 << 20))];
    let mut pos = off;
    while pos < off + len {
        let n = small((off + len - pos).min(1 << 20));
        dev.read_at(&mut buf[..n], pos)
            .map_err(|e| e.context(format!("{name}: checking for data")))?;
        if buf[..n].iter().any(|&b| b != 0) {
            return Ok(false);
        }
        pos += crate::units::wide(n);
    }
    Ok(true)
}

/// 16 random bytes for UUIDs (the kernel's generator; a time-and-counter hash when it
/// cannot be read).
pub(crate) fn random_bytes() -> [u8; 16] {
    use std::io::Read;
    let mut out = [0u8; 16];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut out))
        .is_ok()
    {
        return out;
    }
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    for half in out.chunks_mut(8) {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        half.copy_from_slice(&h.finish().to_le_bytes());
    }
    out
}
