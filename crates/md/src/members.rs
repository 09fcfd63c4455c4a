//! Members coming and going on a running array, as `mdadm --manage` does it: fail,
//! remove, add (a new spare, or a former member re-added), replace; and the rebuilds
//! that follow (run by the background worker, background.rs).
//!
//! ```text
//!   fail X ─────> X faulty (superblocks: events + 1) ─┐
//!   I/O error ──> the member fails the same way ──────┤
//!                                                     v
//!   add D ─> D spare ──────────────> worker: a down role takes a spare: the spare
//!                                    fills the role "being rebuilt", the failed member
//!                                    moves to the faulty list; rebuild stripe by stripe
//!   replace X [D] ─> D replacement of X: X keeps serving; copy X onto D; swap; X faulty
//!   remove X ─> a faulty member or a spare leaves the array (its role stays down)
//! ```
//!
//! A member being rebuilt takes writes at once. Parity levels read it below the
//! rebuild's position (advanced under each stripe's lock), mirrors only once it is
//! done. Its superblock carries `recovery_offset`, so a restart resumes the rebuild.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use cairn_block::overlap::{fan_out, start_all, Overlap};
use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};

use crate::assemble::random_bytes;
use crate::background::{Job, Pacer, SpeedLimits, MIRROR_STEP};
use crate::layout::ArrayLayout;
use crate::ondisk::{DevRole, FeaturePolicy, Features, Superblock, Uuid};
use crate::pipeline::{MirrorRebuild, Pipe, Rebuild, ReplaceCopy, Walk};
use crate::probe::probe_signatures;
use crate::slot::Member;
use crate::state::{unanswered, Array, Bytes, Extra};
use crate::units::{small, Sectors, SECTOR_SIZE};

/// Units of clean bitmap a guided re-add jumps over at once (under their stripe locks
/// for parity levels).
const CLEAN_RUN: u64 = 256;

/// Where a named member sits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Role(usize),
    Replacement(usize),
    Spare(usize),
    Faulty(usize),
}

fn invalid(msg: String) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

/// Whether `who` names `name`: the same string, the same file, or the same file name.
fn names_match(who: &str, name: &str) -> bool {
    if who == name {
        return true;
    }
    let canon = |p: &str| std::fs::canonicalize(p).ok();
    if let (Some(a), Some(b)) = (canon(who), canon(name)) {
        return a == b;
    }
    !who.contains('/') && std::path::Path::new(name).file_name() == Some(who.as_ref())
}

impl Array {
    fn find(&self, who: &str) -> Result<Place> {
        let mut hits = Vec::new();
        for (role, slot) in self.slots.iter().enumerate() {
            if slot.member().is_some_and(|m| names_match(who, &m.name)) {
                hits.push(Place::Role(role));
            }
            if slot
                .replacement()
                .is_some_and(|m| names_match(who, &m.name))
            {
                hits.push(Place::Replacement(role));
            }
        }
        {
            let meta = self.meta_lock();
            for (i, s) in meta.spares.iter().enumerate() {
                if names_match(who, &s.member.name) {
                    hits.push(Place::Spare(i));
                }
            }
            for (i, s) in meta.faulty.iter().enumerate() {
                if names_match(who, &s.member.name) {
                    hits.push(Place::Faulty(i));
                }
            }
        }
        match hits.len() {
            1 => Ok(hits[0]),
            0 => Err(Error::new(
                ErrorKind::NotFound,
                format!(
                    "{}: no member named {who}; members: {}",
                    self.array_label(),
                    self.all_names().join(", ")
                ),
            )),
            _ => Err(invalid(format!(
                "{}: {who} names more than one member; give the full path",
                self.array_label()
            ))),
        }
    }

    fn all_names(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .slots
            .iter()
            .flat_map(|s| [s.member(), s.replacement()])
            .flatten()
            .map(|m| m.name.clone())
            .collect();
        let meta = self.meta_lock();
        out.extend(meta.spares.iter().map(|s| s.member.name.clone()));
        out.extend(meta.faulty.iter().map(|s| s.member.name.clone()));
        out
    }

    /// Marks a member faulty, as `mdadm --fail` does: it takes no more I/O and the
    /// other superblocks record it. Refused when the array could not go on without it.
    /// A spare, if any, takes its role over once the array is managed.
    pub fn fail(&self, who: &str) -> Result<Change> {
        let place = self.find(who)?;
        match place {
            Place::Role(role) => {
                if !self.is_writable(role) {
                    return Ok(Change::unchanged(format!(
                        "{} is already faulty; nothing to do",
                        self.describe_role(role)
                    )));
                }
                let mut down = self.down_mask();
                down[role] = true;
                if !self.layout_is_redundant() || !self.layout.tolerates(&down) {
                    return Err(invalid(format!(
                        "{}: refusing to fail {}: the array could not serve all its data \
                         without it",
                        self.array_label(),
                        self.describe_role(role)
                    )));
                }
                self.fail_member(
                    role,
                    &Error::new(ErrorKind::Io, "marked faulty by the operator"),
                );
                Ok(Change::done(format!(
                    "{} marked faulty",
                    self.describe_role(role)
                )))
            }
            Place::Replacement(role) => {
                self.drop_replacement(
                    role,
                    &Error::new(ErrorKind::Io, "marked faulty by the operator"),
                );
                self.forget_replacement(role);
                Ok(Change::done(format!("replacement for role {role} dropped")))
            }
            Place::Spare(i) => {
                let mut meta = self.meta_lock();
                let s = meta.spares.remove(i);
                let name = s.member.name.clone();
                meta.faulty.push(s);
                meta.bump_events();
                self.write_superblocks(&mut meta)?;
                drop(meta);
                self.member_failed(&name, None, "marked faulty by the operator".into());
                Ok(Change::done(format!("spare {name} marked faulty")))
            }
            Place::Faulty(_) => Ok(Change::unchanged(format!(
                "{who} is already faulty; nothing to do"
            ))),
        }
    }

    /// Takes a faulty member or a spare out of the array (`mdadm --remove`). An active
    /// member must be failed first.
    pub fn remove(&self, who: &str) -> Result<Change> {
        let place = self.find(who)?;
        let role_member = match place {
            Place::Role(r) => self.slots[r].member().map(|m| m.name.clone()),
            _ => None,
        };
        let mut meta = self.meta_lock();
        let name = match place {
            Place::Role(role) => {
                if self.is_writable(role) {
                    return Err(invalid(format!(
                        "{}: {} is active; fail it first (cairn md fail)",
                        self.array_label(),
                        self.describe_role(role)
                    )));
                }
                let name = self.describe_role(role);
                // The role stays down: no member, and no superblock claims the role any
                // more, so the next update records the old entry faulty.
                meta.sbs[role] = None;
                self.slots[role].set_member(None, u64::MAX);
                name
            }
            Place::Replacement(role) => {
                drop(meta);
                self.drop_replacement(role, &Error::new(ErrorKind::Io, "removed"));
                self.forget_replacement(role);
                return Ok(Change::done(format!("replacement for role {role} removed")));
            }
            Place::Spare(i) => {
                let s = meta.spares.remove(i);
                if let Some(sb) = &s.sb {
                    if let Some(r) = meta.dev_roles.get_mut(small(u64::from(sb.dev_number))) {
                        *r = DevRole::FAULTY;
                    }
                }
                s.member.name.clone()
            }
            Place::Faulty(i) => meta.faulty.remove(i).member.name.clone(),
        };
        if meta.sbs.iter().any(Option::is_some) {
            meta.bump_events();
            self.write_superblocks(&mut meta)?;
        }
        drop(meta);
        self.member_removed(role_member.as_deref().unwrap_or(&name));
        Ok(Change::done(format!("{name} removed")))
    }

    /// Adds `dev` (called `name`) to the running array (`mdadm --add`). A former
    /// member of this array is re-added into its old role when that role is down and
    /// rebuilt there; anything else becomes a spare, which a down role takes at once.
    /// A device holding another array, a filesystem, LUKS or LVM is refused unless
    /// `force`.
    pub fn add(&self, dev: Arc<dyn BlockDevice>, name: String, force: bool) -> Result<Change> {
        if !self.layout_is_redundant() {
            return Err(invalid(format!(
                "{}: {} has no redundancy; members cannot be added",
                self.array_label(),
                self.identity.level
            )));
        }
        let failed = match self.find(&name) {
            Ok(Place::Role(r)) => !self.is_writable(r),
            Ok(Place::Faulty(_)) => true,
            _ => false,
        };
        if failed {
            // mdadm refuses too: the failed member keeps its place until it is removed.
            return Err(invalid(format!(
                "{name} failed and is still in {}; remove it first (cairn md remove), then \
                 add it",
                self.array_label()
            )));
        }
        if self.all_names().iter().any(|n| names_match(&name, n)) {
            return Ok(Change::unchanged(format!(
                "{name} is already in the array; nothing to do"
            )));
        }
        let old = Superblock::read_from(&*dev, &name, FeaturePolicy::Supported).ok();
        if let Some(old) = old.as_ref().filter(|o| o.set_uuid == self.identity.uuid) {
            if let Some(msg) = self.re_add(&dev, &name, old)? {
                return Ok(Change::done(msg));
            }
        }
        let spare = self.new_spare(dev, name, force, old.as_ref())?;
        let member = spare.member.clone();
        {
            let mut meta = self.meta_lock();
            meta.spares.push(spare);
            meta.bump_events();
            self.write_superblocks(&mut meta)?;
        }
        self.member_added(&member.name, "added as a spare");
        self.kick();
        Ok(Change::done(format!("{} added as a spare", member.name)))
    }

    /// `dev` made ready to be a spare: refused when it holds another array, a
    /// filesystem, LUKS or LVM (unless `force`; a former member of this array is fine)
    /// or is too small; given a new member's superblock (written with the next update).
    fn new_spare(
        &self,
        dev: Arc<dyn BlockDevice>,
        name: String,
        force: bool,
        old: Option<&Superblock>,
    ) -> Result<Extra> {
        let template = self.meta_lock().sbs.iter().flatten().next().cloned();
        let Some(template) = template else {
            return Err(invalid(format!(
                "{}: an array without superblocks cannot take new members",
                self.array_label()
            )));
        };
        match old {
            Some(o) if o.set_uuid == self.identity.uuid || force => {}
            Some(o) => {
                return Err(invalid(format!(
                    "{name} belongs to md array {} ({}); give --force to overwrite it",
                    o.set_name, o.set_uuid
                )))
            }
            None if force => {}
            None => {
                if let Some(s) = probe_signatures(&*dev)?.first() {
                    return Err(invalid(format!(
                        "{name} holds {} at byte {}; give --force to overwrite it",
                        s.kind, s.offset
                    )));
                }
            }
        }
        let sb = self.new_member_superblock(&template, &*dev, &name)?;
        let base = sb
            .data_offset
            .bytes()
            .ok_or_else(|| invalid("data offset overflows".into()))?;
        Ok(Extra {
            member: Arc::new(Member { dev, name, base }),
            sb: Some(sb),
            role: None,
        })
    }
    /// A former member comes back. Returns `None` when it cannot take its old role back
    /// (it is then added as a new spare).
    fn re_add(
        &self,
        dev: &Arc<dyn BlockDevice>,
        name: &str,
        old: &Superblock,
    ) -> Result<Option<String>> {
        let role = old
            .dev_roles
            .get(small(u64::from(old.dev_number)))
            .and_then(|r| r.slot())
            .map(usize::from);
        let Some(role) = role.filter(|&r| r < self.slots.len()) else {
            return Ok(None);
        };
        if self.is_writable(role) {
            return Ok(None);
        }
        if old.data_offset.bytes().is_none() {
            return Ok(None);
        }
        let base = old.data_offset.bytes().expect("checked");
        let member = Arc::new(Member {
            dev: dev.clone(),
            name: name.to_string(),
            base,
        });
        let mut sb = old.clone();
        sb.features.0 |= Features::RECOVERY_OFFSET;
        sb.recovery_offset = Sectors::ZERO;
        // md's rule: a member whose events are at least the bitmap's events_cleared
        // missed only what the bitmap marks; it is rebuilt there alone.
        let only = self
            .bitmap_allows_readd(old.events)
            .then(|| self.bitmap_dirty_ranges());
        // Ranges are shown; the rebuild reads the live bits (later writes add to them).
        self.bitmap_init_member(&member)?;
        {
            let mut meta = self.meta_lock();
            if let Some(cur) = meta.sbs[role].take() {
                if let Some(prev) = self.slots[role].member() {
                    meta.faulty.push(Extra {
                        member: prev,
                        sb: Some(cur),
                        role: Some(role),
                    });
                }
            }
            self.slots[role].set_member(Some(member), 0);
            self.slots[role]
                .bitmap_guided
                .store(only.is_some(), Ordering::Release);
            meta.sbs[role] = Some(sb);
            meta.bump_events();
            self.write_superblocks(&mut meta)?;
        }
        let how = match &only {
            Some(r) => match r.iter().map(|x| x.1).sum::<u64>() {
                0 => "the bitmap marks nothing written while it was out, so nothing is \
                      copied (writes from now on reach it as they come)"
                    .to_string(),
                dirty => format!(
                    "only the {dirty} bytes the bitmap marks (and any written meanwhile) are \
                     rebuilt"
                ),
            },
            None => match self.bitmap_info() {
                // md's rule: bits were cleared since this copy of the member was
                // current, so the bitmap no longer says all it missed.
                Some(bm) => format!(
                    "its events ({}) are older than the bitmap's last clearing ({}), so \
                     the bitmap cannot say what it missed: full recovery, it is rebuilt \
                     in full",
                    old.events, bm.events_cleared
                ),
                None => "it is rebuilt in full".to_string(),
            },
        };
        tracing::info!(
            "{}: {name} re-added into role {role}; {how}",
            self.array_label()
        );
        let msg = format!("{name} re-added into role {role}; {how}");
        self.member_added(name, &msg);
        self.kick();
        Ok(Some(msg))
    }

    /// A superblock for a new member, from a current one: a new device number and
    /// UUID, the same data offset, a spare's role.
    fn new_member_superblock(
        &self,
        template: &Superblock,
        dev: &dyn BlockDevice,
        name: &str,
    ) -> Result<Superblock> {
        let dev_sectors = Sectors(dev.geometry().size / SECTOR_SIZE);
        let need = Sectors(template.data_offset.0 + self.member_extent_bytes() / SECTOR_SIZE);
        if dev_sectors < need {
            return Err(invalid(format!(
                "{name} holds {} sectors; members of {} need at least {} (data offset {} + {} \
                 data sectors)",
                dev_sectors.0,
                self.array_label(),
                need.0,
                template.data_offset.0,
                need.0 - template.data_offset.0
            )));
        }
        let meta = self.meta_lock();
        let mut used: Vec<u32> = meta.sbs.iter().flatten().map(|s| s.dev_number).collect();
        used.extend(
            meta.spares
                .iter()
                .filter_map(|s| s.sb.as_ref().map(|s| s.dev_number)),
        );
        used.extend(
            meta.faulty
                .iter()
                .filter_map(|s| s.sb.as_ref().map(|s| s.dev_number)),
        );
        used.extend(meta.replacements.iter().flatten().map(|s| s.dev_number));
        let roles = &meta.dev_roles;
        let dev_number = (0..u32::try_from(roles.len()).unwrap_or(0))
            .find(|i| {
                !used.contains(i)
                    && roles
                        .get(small(u64::from(*i)))
                        .is_some_and(|r| r.slot().is_none())
            })
            .ok_or_else(|| {
                invalid(format!(
                    "{}: all {} device numbers are in use",
                    self.array_label(),
                    roles.len()
                ))
            })?;
        let mut sb = template.clone();
        sb.dev_number = dev_number;
        sb.device_uuid = Uuid(random_bytes());
        sb.data_size = Sectors(dev_sectors.0 - template.data_offset.0);
        sb.features.0 &= !Features::RECOVERY_OFFSET;
        sb.recovery_offset = Sectors::ZERO;
        sb.events = meta.events;
        sb.cnt_corrected_read = 0;
        Ok(sb)
    }

    /// For an array without superblocks ([`Array::from_layout`], a RAID LV's images):
    /// puts `dev` (called `name`, data from byte 0) into `role`, which must be down, and
    /// rebuilds it from the others in the background once the array is managed
    /// ([`Array::manage`]: md's speed limits, progress in [`Array::background`]), or at
    /// the next [`Array::run_pending`]. Writes reach it at once. `bitmap_dev` holds the
    /// role's copy of a bitmap kept apart from the members
    /// ([`Array::attach_own_bitmap`]); it gets the bitmap as it is now.
    pub fn rebuild_into(
        &self,
        role: usize,
        dev: Arc<dyn BlockDevice>,
        name: String,
        bitmap_dev: Option<Arc<dyn BlockDevice>>,
    ) -> Result<Change> {
        self.fill_role(role, dev, name, bitmap_dev, None)
    }

    /// [`Array::rebuild_into`] for a former member of `role` coming back (a RAID LV's
    /// image whose PV answers again), whose own record says it left at `member_events`
    /// (its dm-raid superblock's events). md's re-add rule decides how much is copied:
    /// when the bitmap has not cleared any bit since it left (`member_events >=
    /// events_cleared`; bits are never cleared while a role is down), only the regions
    /// the bitmap marks are rebuilt, as `mdadm --re-add` does; otherwise all of it.
    pub fn readd_into(
        &self,
        role: usize,
        dev: Arc<dyn BlockDevice>,
        name: String,
        bitmap_dev: Option<Arc<dyn BlockDevice>>,
        member_events: u64,
    ) -> Result<Change> {
        self.fill_role(role, dev, name, bitmap_dev, Some(member_events))
    }

    fn fill_role(
        &self,
        role: usize,
        dev: Arc<dyn BlockDevice>,
        name: String,
        bitmap_dev: Option<Arc<dyn BlockDevice>>,
        readd_events: Option<u64>,
    ) -> Result<Change> {
        if !self.layout_is_redundant() {
            return Err(invalid(format!(
                "{}: {} has no redundancy; nothing can be rebuilt",
                self.array_label(),
                self.identity.level
            )));
        }
        if role >= self.slots.len() {
            return Err(invalid(format!(
                "{}: no role {role} (it has {})",
                self.array_label(),
                self.slots.len()
            )));
        }
        if self.is_writable(role) {
            return Ok(Change::unchanged(format!(
                "{}: role {role} is not down; nothing to rebuild",
                self.array_label()
            )));
        }
        let need = self.member_extent_bytes();
        if dev.geometry().size < need {
            return Err(invalid(format!(
                "{name} holds {} bytes; role {role} needs {need}",
                dev.geometry().size
            )));
        }
        if let Some(bm) = &self.bitmap {
            if let (Some(slot), Some(d)) = (bm.own.get(role), bitmap_dev) {
                let st = bm.lock();
                d.write_at(&st.area, bm.at, WriteFlags::FUA)
                    .map_err(|e| e.context(format!("{name}: writing the bitmap")))?;
                *slot
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(d);
            }
        }
        let member = Arc::new(Member {
            dev,
            name: name.clone(),
            base: 0,
        });
        let guided = readd_events.is_some_and(|e| self.bitmap_allows_readd(e));
        let dirty: u64 = if guided {
            self.bitmap_dirty_ranges().iter().map(|r| r.1).sum()
        } else {
            0
        };
        {
            let mut meta = self.meta_lock();
            self.slots[role].set_member(Some(member), 0);
            self.slots[role]
                .bitmap_guided
                .store(guided, Ordering::Release);
            meta.bump_events();
            self.write_superblocks(&mut meta)?;
        }
        let msg = match (readd_events, guided) {
            (None, _) => format!("{name} takes role {role}; it is rebuilt from the others"),
            (Some(_), true) => format!(
                "{name} re-added into role {role}; only the {dirty} bytes the bitmap marks \
                 (and any written meanwhile) are rebuilt"
            ),
            (Some(_), false) => format!(
                "{name} re-added into role {role}; the bitmap cannot tell what it missed, so \
                 it is rebuilt in full"
            ),
        };
        tracing::info!("{}: {msg}", self.array_label());
        self.member_added(&name, &msg);
        self.kick();
        Ok(Change::done(msg))
    }

    /// Bytes of each member's data area the array uses.
    pub(crate) fn member_extent_bytes(&self) -> u64 {
        match &self.layout {
            ArrayLayout::Parity(pl) => pl.stripes() * pl.chunk().0 * SECTOR_SIZE,
            ArrayLayout::Raid1(l) => l.array_sectors().0 * SECTOR_SIZE,
            ArrayLayout::Raid10(l) => l.dev_sectors().0 * SECTOR_SIZE,
            _ => self.identity.component_size.0 * SECTOR_SIZE,
        }
    }

    /// Builds `new` (or, without one, the first spare) as the replacement of `who`
    /// (`mdadm --replace`): `who` keeps serving while its contents are copied; then the
    /// replacement takes its role and `who` is marked faulty.
    pub fn replace(
        &self,
        who: &str,
        new: Option<(Arc<dyn BlockDevice>, String)>,
        force: bool,
    ) -> Result<Change> {
        let Place::Role(role) = self.find(who)? else {
            return Err(invalid(format!(
                "{}: {who} has no role to hand over",
                self.array_label()
            )));
        };
        if !self.is_writable(role) {
            return Err(invalid(format!(
                "{}: {} has failed; add a spare instead (it takes the role over)",
                self.array_label(),
                self.describe_role(role)
            )));
        }
        if self.slots[role].replacement().is_some() {
            return Ok(Change::unchanged(format!(
                "{} is already being replaced; nothing to do",
                self.describe_role(role)
            )));
        }
        if let Some((dev, name)) = new {
            if !self.all_names().iter().any(|n| names_match(&name, n)) {
                self.add_spare_quietly(dev, name.clone(), force)?;
            }
            return self.replace_with_spare(role, Some(&name)).map(Change::done);
        }
        self.replace_with_spare(role, None).map(Change::done)
    }

    fn add_spare_quietly(
        &self,
        dev: Arc<dyn BlockDevice>,
        name: String,
        force: bool,
    ) -> Result<()> {
        let old = Superblock::read_from(&*dev, &name, FeaturePolicy::Supported).ok();
        let spare = self.new_spare(dev, name, force, old.as_ref())?;
        self.meta_lock().spares.push(spare);
        Ok(())
    }

    fn replace_with_spare(&self, role: usize, name: Option<&str>) -> Result<String> {
        let mut meta = self.meta_lock();
        let i = match name {
            Some(n) => meta
                .spares
                .iter()
                .position(|s| names_match(n, &s.member.name)),
            None => (!meta.spares.is_empty()).then_some(0),
        };
        let Some(i) = i else {
            return Err(invalid(format!(
                "{}: no spare to replace {} with; add one, or name a device",
                self.array_label(),
                self.describe_role(role)
            )));
        };
        let spare = meta.spares.remove(i);
        let msg = format!(
            "{} is being replaced by {}",
            self.describe_role(role),
            spare.member.name
        );
        meta.replacements[role] = spare.sb;
        self.slots[role].set_replacement(Some(spare.member));
        meta.bump_events();
        self.write_superblocks(&mut meta)?;
        drop(meta);
        self.kick();
        Ok(msg)
    }

    /// Stops using the replacement being built for `role` after `err`. Takes no lock
    /// but the slot's (it runs inside superblock updates); its superblock is forgotten
    /// by [`Array::forget_replacement`].
    pub(crate) fn drop_replacement(&self, role: usize, err: &Error) {
        if let Some(r) = self.slots[role].set_replacement(None) {
            tracing::warn!(
                "{}: replacement {} for {} dropped: {err}",
                self.array_label(),
                r.name,
                self.describe_role(role)
            );
        }
    }

    fn forget_replacement(&self, role: usize) {
        let mut meta = self.meta_lock();
        if self.slots[role].replacement().is_none() {
            meta.replacements[role] = None;
        }
    }

    /// The first role that is down gets the first spare; returns that role.
    pub(crate) fn take_spare(&self) -> Option<usize> {
        let mut meta = self.meta_lock();
        if meta.spares.is_empty() {
            return None;
        }
        let role = (0..self.slots.len()).find(|&r| !self.is_writable(r))?;
        if !self.layout.tolerates(&self.down_mask()) {
            return None;
        }
        if let Err(e) = self.bitmap_init_member(&meta.spares[0].member) {
            tracing::warn!(
                "{}: spare {} cannot take the bitmap: {e}",
                self.array_label(),
                meta.spares[0].member.name
            );
            let s = meta.spares.remove(0);
            meta.faulty.push(s);
            return None;
        }
        let spare = meta.spares.remove(0);
        let mut sb = spare
            .sb
            .expect("spares of arrays with superblocks have one");
        sb.features.0 |= Features::RECOVERY_OFFSET;
        sb.recovery_offset = Sectors::ZERO;
        if let Some(prev) = self.slots[role].set_member(Some(spare.member.clone()), 0) {
            let sb = meta.sbs[role].take();
            meta.faulty.push(Extra {
                member: prev,
                sb,
                role: Some(role),
            });
        }
        meta.sbs[role] = Some(sb);
        meta.bump_events();
        if let Err(e) = self.write_superblocks(&mut meta) {
            tracing::warn!(
                "{}: recording the spare's new role: {e}",
                self.array_label()
            );
        }
        tracing::info!(
            "{}: spare {} takes over role {role}",
            self.array_label(),
            spare.member.name
        );
        Some(role)
    }

    // ---- rebuilds ------------------------------------------------------------------

    /// Rebuilds the member of `role` from the others, from its checkpoint on.
    pub(crate) fn run_recovery(
        &self,
        role: usize,
        limits: Option<SpeedLimits>,
        job: Option<&Job>,
    ) -> Result<bool> {
        let slot = &self.slots[role];
        let from = slot.recovery_cp.load(Ordering::Acquire);
        let step = self.rebuild_step();
        let end = self.member_extent_bytes();
        let mut pos = from - from % step;
        // A bitmap-guided re-add works only where the bitmap is dirty: its progress and
        // its pacing count those bytes (as a guided resync does), so the window in which
        // the member is not in sync lasts as long as what it missed, not as the member.
        let guided = self.guided(role);
        let mut done = if guided { 0 } else { pos };
        if let Some(j) = job {
            if guided {
                j.total
                    .store(self.guided_recovery_work(pos, end), Ordering::Relaxed);
            }
            j.done.store(done, Ordering::Relaxed);
        }
        let mut pacer = Pacer::new(self, limits, done);
        let mut last_cp = std::time::Instant::now();
        // Windows of units, the next one read meanwhile (pipeline.rs); a bitmap-guided
        // re-add works only on the dirty units of a window, and jumps over runs of clean
        // ones (`skip_clean_units`).
        let units = end.div_ceil(step);
        let mut pipe: Option<Box<dyn Walk + '_>> = match &self.layout {
            ArrayLayout::Parity(pl) => {
                let stage = Rebuild {
                    array: self,
                    pl,
                    role,
                    guided,
                };
                Some(Box::new(Pipe::new(self, stage, step, units)))
            }
            ArrayLayout::Raid1(_) | ArrayLayout::Raid10(_) => {
                let stage = MirrorRebuild {
                    array: self,
                    role,
                    step,
                    end,
                    guided,
                    to_replacement: false,
                };
                Some(Box::new(Pipe::new(self, stage, step, units)))
            }
            _ => None,
        };
        while pos < end {
            if self.stopping() {
                drop(pipe);
                self.checkpoint_recovery()?;
                return Ok(false);
            }
            if !self.is_writable(role) {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!("{} failed during its rebuild", self.describe_role(role)),
                ));
            }
            let mut n = step.min(end - pos);
            let worked = match pipe.as_mut() {
                Some(pipe) => {
                    let first = pos / step;
                    let skipped = if guided {
                        self.skip_clean_units(role, &mut **pipe, first, units, step, end)
                    } else {
                        0
                    };
                    if skipped > 0 {
                        n = (skipped * step).min(end - pos);
                        0
                    } else {
                        let (count, worked) = pipe.step(first, pacer.unhindered(self))?;
                        n = (count * step).min(end - pos);
                        if guided {
                            worked
                        } else {
                            n
                        }
                    }
                }
                None => 0,
            };
            pos += n;
            done = if guided { done + worked } else { pos };
            let cp = match self.layout {
                ArrayLayout::Raid10(_) => 0,
                _ => pos,
            };
            slot.recovery_cp.store(cp, Ordering::Release);
            if let Some(j) = job {
                // Writes during the rebuild can dirty more than was counted at its start.
                if guided {
                    j.total.fetch_max(done, Ordering::Relaxed);
                }
                j.done.store(done, Ordering::Relaxed);
                j.worked.fetch_add(worked, Ordering::Relaxed);
            }
            if last_cp.elapsed() >= std::time::Duration::from_secs(5) {
                self.checkpoint_recovery()?;
                last_cp = std::time::Instant::now();
            }
            if pacer.pause_due(self, done) {
                // A pause for the speed limits holds no stripe lock.
                if let Some(pipe) = pipe.as_mut() {
                    pipe.drop_ahead();
                }
            }
            pacer.step(self, job, done);
        }
        drop(pipe);
        self.flush()?;
        {
            let mut meta = self.meta_lock();
            slot.synced.store(u64::MAX, Ordering::Release);
            slot.recovery_cp.store(0, Ordering::Release);
            meta.bump_events();
            self.write_superblocks(&mut meta)?;
        }
        tracing::info!(
            "{}: {} rebuilt and in sync",
            self.array_label(),
            self.describe_role(role)
        );
        Ok(true)
    }

    /// For a bitmap-guided re-add at unit `first` (of `units`, each `step` member bytes
    /// up to `end`): jumps over the run of units from `first` on that the bitmap says
    /// `role` already holds (at most [`CLEAN_RUN`]), and returns how many it marked
    /// rebuilt; 0 when `first` is dirty, or when the window `walk` read ahead holds dirty
    /// units too (their reads are done: the walk goes on with it). The bits are looked
    /// at without a lock to find the run, then for parity levels again under the run's
    /// stripe locks before `synced` passes it: a write sets its bits before it takes
    /// that lock, so none can slip past unseen (and they are not cleared while a member
    /// is rebuilt). Mirror writes reach a member being rebuilt anyway.
    fn skip_clean_units(
        &self,
        role: usize,
        walk: &mut dyn Walk,
        first: u64,
        units: u64,
        step: u64,
        end: u64,
    ) -> u64 {
        let mut k = first;
        while k < units && k - first < CLEAN_RUN && !self.guided_unit_dirty(k, step, end) {
            k += 1;
        }
        let run = k - first;
        if run == 0 || walk.ahead().is_some_and(|(f, c)| f == first && c > run) {
            return 0;
        }
        // Whatever is ahead is clean: no read is lost, and no lock is held out of order
        // while the run's are taken.
        walk.drop_ahead();
        if matches!(self.layout, ArrayLayout::Parity(_)) {
            let _g = self.lock_stripes(first..k);
            if self.bitmap_range_dirty(first * step, (k * step).min(end)) {
                return 0;
            }
            self.slots[role].synced.store(k * step, Ordering::Release);
        }
        run
    }

    /// Whether the bitmap has a dirty bit over unit `k` of a rebuild (member bytes
    /// `[k·step, (k + 1)·step)` up to `end`; RAID10: the array bytes they stand for).
    fn guided_unit_dirty(&self, k: u64, step: u64, end: u64) -> bool {
        let pos = k * step;
        let n = step.min(end.saturating_sub(pos));
        let (from, len) = match &self.layout {
            ArrayLayout::Raid10(_) => self.raid10_scan(pos, n),
            _ => (pos, n),
        };
        len > 0 && self.bitmap_range_dirty(from, from + len)
    }

    /// The member bytes a guided re-add will copy from member offset `pos` to `end`, as
    /// the bitmap stands now: dirty stripes for parity levels, dirty bitmap chunks of the
    /// mirrored ranges otherwise.
    fn guided_recovery_work(&self, pos: u64, end: u64) -> u64 {
        match &self.layout {
            ArrayLayout::Parity(pl) => {
                let c = pl.chunk().0 * SECTOR_SIZE;
                (pos / c..end.div_ceil(c))
                    .filter(|s| self.bitmap_range_dirty(s * c, (s + 1) * c))
                    .map(|_| c)
                    .sum()
            }
            _ => {
                let Some(chunk) = self.bitmap_chunk() else {
                    return end - pos;
                };
                let step = self.rebuild_step();
                let mut total = 0;
                let mut at = pos;
                while at < end {
                    let n = step.min(end - at);
                    let (from, len) = match &self.layout {
                        ArrayLayout::Raid10(_) => self.raid10_scan(at, n),
                        _ => (at, n),
                    };
                    let mut b = from;
                    while b < from + len {
                        let stop = ((b / chunk + 1) * chunk).min(from + len);
                        if self.bitmap_range_dirty(b, stop) {
                            total += stop - b;
                        }
                        b = stop;
                    }
                    at += n;
                }
                total
            }
        }
    }

    /// Whether the rebuild of `role` is a bitmap-guided re-add.
    fn guided(&self, role: usize) -> bool {
        self.slots[role].bitmap_guided.load(Ordering::Acquire)
    }

    /// Writes the rebuild checkpoints into the superblocks.
    pub(crate) fn checkpoint_recovery(&self) -> Result<()> {
        self.flush()?;
        let mut meta = self.meta_lock();
        if meta.sbs.iter().any(Option::is_some) {
            meta.bump_events();
            self.write_superblocks(&mut meta)?;
        }
        Ok(())
    }

    /// Member bytes per rebuild unit: a chunk for parity levels (one stripe), 1 MiB of
    /// mirrors (RAID10: rounded to whole chunks).
    pub(crate) fn rebuild_step(&self) -> u64 {
        match &self.layout {
            ArrayLayout::Parity(pl) => pl.chunk().0 * SECTOR_SIZE,
            ArrayLayout::Raid10(l) => {
                let c = l.chunk().0 * SECTOR_SIZE;
                MIRROR_STEP.div_ceil(c) * c
            }
            _ => MIRROR_STEP,
        }
    }

    /// RAID10 rebuilds walk the array, not the member: member unit `[pos, pos + n)` of
    /// the walk covers array bytes `[pos·A/M, (pos + n)·A/M)` (A the array size, M the
    /// member extent), so the walk ends with the array.
    pub(crate) fn raid10_scan(&self, pos: u64, n: u64) -> (u64, u64) {
        let a = u128::from(self.size_bytes());
        let m = u128::from(self.member_extent_bytes().max(1));
        let scale = |x: u64| u64::try_from(u128::from(x) * a / m).unwrap_or(u64::MAX);
        let c = match &self.layout {
            ArrayLayout::Raid10(l) => l.chunk().0 * SECTOR_SIZE,
            _ => SECTOR_SIZE,
        };
        let lo = scale(pos) / c * c;
        let hi = if pos + n >= self.member_extent_bytes() {
            self.size_bytes()
        } else {
            scale(pos + n) / c * c
        };
        (lo, hi.saturating_sub(lo))
    }

    /// Copies array bytes `[pos, pos + n)` onto `role` (or its replacement) from
    /// another copy (the member itself first when replacing), with the mirror locks held
    /// by the caller: the pipelined copies' path for a piece no copy was read for, which
    /// tries every copy again and says why none could be read.
    pub(crate) fn copy_mirror_range_locked(
        &self,
        role: usize,
        pos: u64,
        n: u64,
        to_replacement: bool,
    ) -> Result<()> {
        for (at, len, locs) in self.mirror_pieces(pos, n) {
            let Some(dst) = locs.iter().find(|l| l.member == role) else {
                continue;
            };
            let mut data = vec![0u8; small(len)];
            let mut ok = false;
            // The member itself first when replacing (it is the natural source).
            let mut sources: Vec<_> = locs.iter().filter(|l| self.is_up(l.member)).collect();
            if to_replacement {
                sources.sort_by_key(|l| l.member != role);
            } else {
                sources.retain(|l| l.member != role);
            }
            let mut last = None;
            for src in sources {
                match self.read_member(src.member, &mut data, src.sector.0 * SECTOR_SIZE) {
                    Ok(()) => {
                        ok = true;
                        break;
                    }
                    Err(e) => last = Some(e),
                }
            }
            if !ok {
                return Err(last.unwrap_or_else(|| {
                    Error::new(
                        ErrorKind::Degraded,
                        format!(
                            "{}: no copy of array bytes {at}..{} is left to rebuild {} from",
                            self.array_label(),
                            at + len,
                            self.describe_role(role)
                        ),
                    )
                }));
            }
            let off = dst.sector.0 * SECTOR_SIZE;
            if to_replacement {
                self.write_replacement_copy(role, &data, off)?;
            } else {
                self.write_member(role, &data, off, WriteFlags::NONE)
                    .inspect_err(|e| self.fail_member(role, e))?;
            }
        }
        Ok(())
    }

    /// Writes `data` to the replacement being built for `role` at byte `off` of its data
    /// area; a replacement that fails is dropped (the member goes on serving).
    pub(crate) fn write_replacement_copy(&self, role: usize, data: &[u8], off: u64) -> Result<()> {
        let r = self.slots[role]
            .replacement()
            .ok_or_else(|| Error::new(ErrorKind::Io, "the replacement was dropped"))?;
        r.dev
            .write_at(data, r.base + off, WriteFlags::NONE)
            .inspect_err(|e| self.drop_replacement(role, e))
    }

    /// [`Array::write_replacement_copy`] for every `(data, off)` of `writes`, returning
    /// each one's error. Over a replacement that completes later (the array not fenced)
    /// every write is sent from this thread and waited for once (an answer the device
    /// dropped is an error); otherwise they are written as `how` says. A failed write
    /// drops the replacement, as one alone does.
    pub(crate) fn write_replacement_copies(
        &self,
        role: usize,
        writes: Vec<(Bytes<'_>, u64)>,
        how: Overlap,
    ) -> Vec<Option<Error>> {
        let r = self.slots[role].replacement();
        let Some(r) = r.filter(|r| !self.is_fenced() && r.dev.completes_later()) else {
            let jobs = writes.into_iter().map(|w| (role, w)).collect();
            return fan_out(jobs, how, |(data, off)| {
                self.write_replacement_copy(role, &data, off).err()
            });
        };
        let answers = start_all(writes.iter().collect(), |(data, off), answer| {
            r.dev
                .write_then(data, r.base + off, WriteFlags::NONE, answer);
        });
        answers
            .into_iter()
            .map(|answer| {
                let e = answer.unwrap_or_else(|| Err(unanswered())).err()?;
                self.drop_replacement(role, &e);
                Some(e)
            })
            .collect()
    }

    /// Copies the member of `role` onto its replacement, then hands the role over.
    /// Pipelined as the rebuild is (pipeline.rs): the next window of the member is read
    /// while the current one is written to the replacement, under their locks.
    pub(crate) fn run_replace(
        &self,
        role: usize,
        limits: Option<SpeedLimits>,
        job: Option<&Job>,
    ) -> Result<bool> {
        let slot = &self.slots[role];
        let step = self.rebuild_step();
        let end = self.member_extent_bytes();
        let units = end.div_ceil(step);
        let mut pos = 0;
        let mut pacer = Pacer::new(self, limits, 0);
        let mut pipe: Option<Box<dyn Walk + '_>> = match &self.layout {
            ArrayLayout::Parity(pl) => {
                let stage = ReplaceCopy {
                    array: self,
                    pl,
                    role,
                };
                Some(Box::new(Pipe::new(self, stage, step, units)))
            }
            ArrayLayout::Raid1(_) | ArrayLayout::Raid10(_) => {
                let stage = MirrorRebuild {
                    array: self,
                    role,
                    step,
                    end,
                    guided: false,
                    to_replacement: true,
                };
                Some(Box::new(Pipe::new(self, stage, step, units)))
            }
            _ => None,
        };
        while pos < end {
            if self.stopping() {
                return Ok(false);
            }
            if slot.replacement().is_none() {
                drop(pipe);
                self.forget_replacement(role);
                return Err(Error::new(ErrorKind::Io, "the replacement was dropped"));
            }
            let mut n = step.min(end - pos);
            if let Some(pipe) = pipe.as_mut() {
                let (count, _) = pipe.step(pos / step, pacer.unhindered(self))?;
                n = (count * step).min(end - pos);
            }
            pos += n;
            if let Some(j) = job {
                j.done.store(pos, Ordering::Relaxed);
                j.worked.fetch_add(n, Ordering::Relaxed);
            }
            if pacer.pause_due(self, pos) {
                // A pause for the speed limits holds no stripe lock.
                if let Some(pipe) = pipe.as_mut() {
                    pipe.drop_ahead();
                }
            }
            pacer.step(self, job, pos);
        }
        drop(pipe);
        self.flush()?;
        // Hand over with every write excluded, so none lands on one device only.
        let _all = self.lock_all();
        let mut meta = self.meta_lock();
        let Some(r) = slot.replacement() else {
            meta.replacements[role] = None;
            return Err(Error::new(ErrorKind::Io, "the replacement was dropped"));
        };
        slot.set_replacement(None);
        self.bitmap_init_member(&r)?;
        let Some(mut sb) = meta.replacements[role].take() else {
            return Err(Error::new(
                ErrorKind::Io,
                "the replacement has no superblock",
            ));
        };
        sb.features.0 &= !Features::RECOVERY_OFFSET;
        sb.recovery_offset = Sectors::ZERO;
        let old_sb = meta.sbs[role].replace(sb);
        if let Some(old) = slot.set_member(Some(r.clone()), u64::MAX) {
            tracing::info!(
                "{}: {} replaced by {}; it is now faulty and can be removed",
                self.array_label(),
                old.name,
                r.name
            );
            meta.faulty.push(Extra {
                member: old,
                sb: old_sb,
                role: Some(role),
            });
        }
        meta.bump_events();
        self.write_superblocks(&mut meta)?;
        Ok(true)
    }
}

/// What an operator's action on the array did: whether it changed anything (an action
/// asked for twice changes nothing the second time) and what, in words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub changed: bool,
    pub message: String,
}

impl Change {
    /// Something changed.
    pub fn done(message: String) -> Change {
        Change {
            changed: true,
            message,
        }
    }

    /// Nothing needed doing; the message says why.
    pub fn unchanged(message: String) -> Change {
        Change {
            changed: false,
            message,
        }
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}
