//! The node's metadata, as [`MetaIo`]: a thin adapter over meta.rs, which owns the
//! format (docs/replication-format.md). The metadata is internal (at the end of the
//! backing device: [`Store::open`]) or external (on a metadata device of its own, the
//! data being the whole data device: [`Store::open_external`]); either way the data
//! path writes the data to the device it is given and the metadata through this. This
//! file encodes nothing; it maps the data path's [`Persisted`] to and from
//! [`meta::Super`]:
//!
//! ```text
//!   Persisted                         meta::Super
//!   current, history                  current, history
//!   consistent, primary,              flags CONSISTENT, PRIMARY, CRASHED_PRIMARY
//!     crashed_primary                   (CLEAN: cleared by the first save)
//!   epoch                             fence_epoch
//!   fence: Some(token)                uuid (= token.array), fence_owner,
//!                                       fence_instance, fence_generation; None: zeros
//!   peers[k]: name, bitmap_uuid       peer slot k: IN_USE (name or bitmap uuid set),
//!                                       node_id k + 1, name, bitmap_uuid
//!   (not the data path's)             uuid (the resource, bound at open), node_id 0,
//!                                       geometry
//! ```

use std::sync::{Arc, Mutex};

use cairn_block::{BlockDevice, Error, ErrorKind, Result};
use cairn_nbd::fence::{FenceToken, OwnerId};

use crate::meta::{self, Layout, MetaStore, PeerSlot};
use crate::node::{MetaIo, Persisted, Slot};

/// What `cairn repl create-md` asks for.
#[derive(Clone, Debug)]
pub struct CreateParams {
    pub max_peers: u32,
    pub bm_block: u64,
    pub al_extent: u64,
    /// Write over metadata that is there (valid or damaged).
    pub force: bool,
    /// The resource's id ([`crate::node::resource_id`]); `None` records zero, and the
    /// first `up` records its resource's.
    pub resource: Option<[u8; 16]>,
}

#[derive(Clone, Copy, Debug)]
pub struct Created {
    pub data_size: u64,
    /// Internal: the bytes after the data. External: the bytes of the metadata device
    /// the metadata uses (bitmaps, activity log, superblock).
    pub metadata_bytes: u64,
}

fn invalid(m: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, m)
}

fn hex(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Refuses (unless `force`) a device that has metadata, valid or damaged.
fn refuse_existing(dev: &dyn BlockDevice, force: bool) -> Result<()> {
    if !force {
        match MetaStore::open(dev) {
            Ok(_) => {
                return Err(Error::new(
                    ErrorKind::Busy,
                    "replication metadata is already there (--force writes over it, and forgets what is out of sync)",
                ))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) if e.kind() == ErrorKind::Corrupt => {
                return Err(Error::new(
                    ErrorKind::Busy,
                    format!("damaged replication metadata is there ({e}); --force writes over it"),
                ))
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// meta.rs's create parameters: consistent and just created.
fn meta_params(p: &CreateParams) -> Result<meta::CreateParams> {
    let bm_block = u32::try_from(p.bm_block)
        .map_err(|_| invalid(format!("bitmap block {} is too large", p.bm_block)))?;
    let al_extent = u32::try_from(p.al_extent)
        .map_err(|_| invalid(format!("activity-log extent {} is too large", p.al_extent)))?;
    let mut params = meta::CreateParams::new(p.resource.unwrap_or([0; 16]), 0, p.max_peers);
    params.bm_block = bm_block;
    params.al_extent = al_extent;
    params.consistent = true;
    Ok(params)
}

/// `create-md`: fresh internal metadata at the end of `dev` (meta.rs zeroes the bitmaps
/// and the log, then writes the superblock), consistent and just created. Refuses a
/// device that has metadata, valid or damaged, unless `force`.
pub fn create(dev: &dyn BlockDevice, p: &CreateParams) -> Result<Created> {
    refuse_existing(dev, p.force)?;
    let (store, _) = MetaStore::create(dev, &meta_params(p)?)?;
    let data_size = store.layout().data_size;
    Ok(Created {
        data_size,
        metadata_bytes: dev.geometry().size - data_size,
    })
}

/// Bytes a metadata device needs at least for external metadata over a data device of
/// `data_bytes` bytes (`create-md --meta-disk` sizes a new file with it).
pub fn external_meta_size(data_bytes: u64, p: &CreateParams) -> Result<u64> {
    let m = meta_params(p)?;
    Layout::external_meta_size(data_bytes, m.bm_block, m.al_extent, m.max_peers).map_err(invalid)
}

/// `create-md --meta-disk`: fresh external metadata on `meta` for the whole of `data`
/// (its size rounded down to the bitmap block), consistent and just created. The data
/// device is not written. Refuses a metadata device that has metadata, valid or
/// damaged, unless `force`; one too small is refused with the size it needs.
pub fn create_external(
    data: &dyn BlockDevice,
    meta: &dyn BlockDevice,
    p: &CreateParams,
) -> Result<Created> {
    refuse_existing(meta, p.force)?;
    let (store, _) = MetaStore::create_external(meta, data.geometry().size, &meta_params(p)?)?;
    let l = store.layout();
    Ok(Created {
        data_size: l.data_size,
        metadata_bytes: l.al_offset + l.al_bytes + meta::SUPER_SIZE as u64,
    })
}

/// The metadata of an opened backing device.
#[derive(Debug)]
pub struct Store {
    /// The device holding the metadata: the backing device (internal) or the metadata
    /// device (external).
    dev: Arc<dyn BlockDevice>,
    meta: MetaStore,
    /// The superblock as last read or written: what a save keeps of it (uuid, node id,
    /// geometry), and the uuid bound by [`MetaIo::bind_resource`].
    last: Mutex<meta::Super>,
}

impl Store {
    /// Internal metadata: at the end of `dev`, the data before it.
    pub fn open(dev: Arc<dyn BlockDevice>) -> Result<Store> {
        let (meta, sb) = MetaStore::open(dev.as_ref())?;
        if sb.has(meta::FLAG_EXTERNAL) {
            return Err(invalid(format!(
                "this device holds external replication metadata (for {} bytes of data on \
                 another device): give it as --meta-disk, with the data device as --disk",
                sb.data_size
            )));
        }
        Ok(Store {
            dev,
            meta,
            last: Mutex::new(sb),
        })
    }

    /// External metadata on `meta` for the data on `data` (the data path writes the
    /// data there, from byte 0). Refuses a data device smaller than the data size the
    /// metadata records (it shrank, or is not the one the metadata was created for); a
    /// larger one is used up to that size.
    pub fn open_external(data: &dyn BlockDevice, meta: Arc<dyn BlockDevice>) -> Result<Store> {
        let (m, sb) = MetaStore::open(meta.as_ref()).map_err(|e| {
            if e.kind() == ErrorKind::NotFound {
                Error::new(
                    ErrorKind::NotFound,
                    "no cairn replication metadata at the end of the metadata device \
                     (create it with cairn repl create-md DISK --meta-disk META)",
                )
            } else {
                e
            }
        })?;
        if !sb.has(meta::FLAG_EXTERNAL) {
            return Err(invalid(
                "the metadata device holds internal replication metadata (its own data \
                 before it), not external: give it as --disk without --meta-disk, or \
                 write external metadata over it with create-md --meta-disk --force",
            ));
        }
        let have = data.geometry().size;
        if have < sb.data_size {
            return Err(invalid(format!(
                "the data device has {have} bytes, but its external metadata records {} \
                 bytes of data ({} bytes missing): the data device shrank, or is not the \
                 one this metadata was created for",
                sb.data_size,
                sb.data_size - have
            )));
        }
        if have - sb.data_size >= u64::from(sb.bm_block) {
            tracing::warn!(
                "the data device has {have} bytes; its external metadata records {} bytes \
                 of data: the rest is not replicated",
                sb.data_size
            );
        }
        Ok(Store {
            dev: meta,
            meta: m,
            last: Mutex::new(sb),
        })
    }

    pub fn layout(&self) -> Layout {
        *self.meta.layout()
    }

    fn last(&self) -> std::sync::MutexGuard<'_, meta::Super> {
        self.last.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The data path's view of a superblock.
fn persisted(sb: &meta::Super) -> Persisted {
    let n = usize::try_from(sb.max_peers).unwrap_or(0);
    Persisted {
        current: sb.current,
        history: sb.history,
        consistent: sb.has(meta::FLAG_CONSISTENT),
        primary: sb.has(meta::FLAG_PRIMARY),
        crashed_primary: sb.has(meta::FLAG_CRASHED_PRIMARY),
        epoch: sb.fence_epoch,
        fence: sb.has_fence().then(|| FenceToken {
            array: sb.uuid,
            generation: sb.fence_generation,
            owner: OwnerId {
                node: sb.fence_owner.clone(),
                instance: sb.fence_instance,
            },
        }),
        peers: sb
            .peers
            .iter()
            .take(n)
            .map(|s| Slot {
                name: s.name.clone(),
                bitmap_uuid: s.bitmap_uuid,
            })
            .collect(),
    }
}

/// `base` with the data path's state `p` in it.
fn with_state(base: &meta::Super, p: &Persisted) -> Result<meta::Super> {
    let mut sb = base.clone();
    if p.peers.len()
        > sb.peers
            .len()
            .min(usize::try_from(sb.max_peers).unwrap_or(0))
    {
        return Err(invalid(format!(
            "{} peer slots, but the metadata has room for {}",
            p.peers.len(),
            sb.max_peers
        )));
    }
    sb.current = p.current;
    sb.history = p.history;
    sb.set(meta::FLAG_CONSISTENT, p.consistent);
    sb.set(meta::FLAG_PRIMARY, p.primary);
    sb.set(meta::FLAG_CRASHED_PRIMARY, p.crashed_primary);
    // The node runs: it is no longer stopped cleanly.
    sb.set(meta::FLAG_CLEAN, false);
    sb.fence_epoch = p.epoch;
    match &p.fence {
        Some(t) => {
            if t.array != sb.uuid {
                return Err(invalid(format!(
                    "a fencing token for resource {} on metadata of resource {}",
                    hex(&t.array),
                    hex(&sb.uuid)
                )));
            }
            sb.fence_owner.clone_from(&t.owner.node);
            sb.fence_instance = t.owner.instance;
            sb.fence_generation = t.generation;
        }
        None => {
            sb.fence_owner.clear();
            sb.fence_instance = 0;
            sb.fence_generation = 0;
        }
    }
    for (k, slot) in sb.peers.iter_mut().enumerate() {
        *slot = match p.peers.get(k) {
            Some(s) if !s.name.is_empty() || s.bitmap_uuid != 0 => PeerSlot {
                in_use: true,
                node_id: u32::try_from(k + 1).map_err(|_| invalid("peer slot"))?,
                bitmap_uuid: s.bitmap_uuid,
                name: s.name.clone(),
            },
            _ => PeerSlot::default(),
        };
    }
    Ok(sb)
}

impl MetaIo for Store {
    fn data_size(&self) -> u64 {
        self.meta.layout().data_size
    }
    fn bm_block(&self) -> u64 {
        u64::from(self.meta.layout().bm_block)
    }
    fn al_extent(&self) -> u64 {
        u64::from(self.meta.layout().al_extent)
    }
    fn max_peers(&self) -> usize {
        usize::try_from(self.meta.layout().max_peers).unwrap_or(0)
    }

    fn bind_resource(&self, id: [u8; 16]) -> Result<()> {
        let mut last = self.last();
        if last.uuid == [0; 16] {
            // Recorded by the next save (Node::open saves at once).
            last.uuid = id;
        } else if last.uuid != id {
            return Err(invalid(format!(
                "this disk belongs to another replicated resource (its metadata names resource id {}, this resource's is {})",
                hex(&last.uuid),
                hex(&id)
            )));
        }
        Ok(())
    }

    fn load(&self) -> Result<Persisted> {
        let (_, sb) = MetaStore::open(self.dev.as_ref())?;
        Ok(persisted(&sb))
    }

    fn save(&self, p: &Persisted) -> Result<()> {
        let mut last = self.last();
        let sb = with_state(&last, p)?;
        self.meta.write_super(self.dev.as_ref(), &sb)?;
        *last = sb;
        Ok(())
    }

    fn read_bitmap(&self, slot: usize) -> Result<Vec<u64>> {
        let slot = u32::try_from(slot).map_err(|_| invalid("peer slot"))?;
        self.meta.read_bitmap(self.dev.as_ref(), slot)
    }

    fn write_bitmap_pages(&self, slot: usize, pages: &[(usize, Vec<u64>)]) -> Result<()> {
        let slot = u32::try_from(slot).map_err(|_| invalid("peer slot"))?;
        let pages: Vec<(u64, &[u64])> = pages
            .iter()
            .map(|(i, w)| (*i as u64, w.as_slice()))
            .collect();
        self.meta
            .write_bitmap_pages(self.dev.as_ref(), slot, &pages)
    }

    fn read_al(&self) -> Result<Vec<u64>> {
        let words = self.meta.read_al(self.dev.as_ref())?;
        let mut out = Vec::new();
        for (i, &w) in words.iter().enumerate() {
            let mut w = w;
            while w != 0 {
                out.push(i as u64 * 64 + u64::from(w.trailing_zeros()));
                w &= w - 1;
            }
        }
        Ok(out)
    }

    fn write_al(&self, active: &[u64]) -> Result<()> {
        let l = self.meta.layout();
        let extents = l.al_extents();
        let mut words = vec![0u64; usize::try_from(l.al_bytes / 8).map_err(|_| invalid("log"))?];
        for &e in active {
            if e >= extents {
                return Err(Error::new(
                    ErrorKind::OutOfRange,
                    format!("activity-log extent {e} past the {extents} of the device"),
                ));
            }
            // In range: e / 64 < words.len().
            words[usize::try_from(e / 64).map_err(|_| invalid("log"))?] |= 1 << (e % 64);
        }
        let n = words.len() as u64;
        self.meta.write_al(self.dev.as_ref(), &words, 0, n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::JUST_CREATED;
    use crate::node::resource_id;
    use cairn_block::{MemDisk, WriteFlags};

    fn params(force: bool) -> CreateParams {
        CreateParams {
            max_peers: 2,
            bm_block: 4096,
            al_extent: 1 << 20,
            force,
            resource: None,
        }
    }

    #[test]
    fn create_open_save_load_round_trip() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(64 << 20));
        let c = create(dev.as_ref(), &params(false)).unwrap();
        let e = create(dev.as_ref(), &params(false)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy);
        assert!(e.to_string().contains("--force"), "{e}");
        let st = Store::open(dev.clone()).unwrap();
        assert_eq!(st.data_size(), c.data_size);
        assert_eq!(c.metadata_bytes, (64 << 20) - c.data_size);
        assert_eq!(
            (st.bm_block(), st.al_extent(), st.max_peers()),
            (4096, 1 << 20, 2)
        );
        let mut p = st.load().unwrap();
        assert_eq!(p.current, JUST_CREATED);
        assert!(p.consistent && !p.primary && !p.crashed_primary);
        assert_eq!((p.epoch, &p.fence), (0, &None));
        assert_eq!(p.peers, vec![Slot::default(); 2]);

        let id = resource_id("home");
        st.bind_resource(id).unwrap();
        p.current = 0x1230;
        p.history = [0x4560, 0];
        p.primary = true;
        p.crashed_primary = true;
        p.epoch = 7;
        p.fence = Some(FenceToken {
            array: id,
            generation: 6,
            owner: OwnerId {
                node: "a".into(),
                instance: 43,
            },
        });
        p.peers[1] = Slot {
            name: "c".into(),
            bitmap_uuid: 0x4560,
        };
        st.save(&p).unwrap();
        let again = Store::open(dev.clone()).unwrap();
        assert_eq!(again.load().unwrap(), p);
        // The superblock meta.rs reads: uuid bound, node ids local, CLEAN cleared.
        let (_, sb) = MetaStore::open(dev.as_ref()).unwrap();
        assert_eq!(sb.uuid, id);
        assert_eq!(sb.node_id, 0);
        assert!(!sb.peers[0].in_use);
        assert_eq!((sb.peers[1].in_use, sb.peers[1].node_id), (true, 2));
        assert!(!sb.has(meta::FLAG_CLEAN));
        assert!(sb.has(meta::FLAG_CRASHED_PRIMARY) && sb.has(meta::FLAG_PRIMARY));

        // Back to no token.
        p.fence = None;
        p.peers[1] = Slot::default();
        st.save(&p).unwrap();
        assert_eq!(st.load().unwrap(), p);

        // Too many slots, or a token naming another resource.
        let mut bad = p.clone();
        bad.peers.push(Slot::default());
        assert!(st.save(&bad).is_err());
        let mut bad = p.clone();
        bad.fence = Some(FenceToken {
            array: resource_id("other"),
            generation: 1,
            owner: OwnerId {
                node: "a".into(),
                instance: 1,
            },
        });
        assert_eq!(
            st.save(&bad).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        assert_eq!(st.load().unwrap(), p);

        create(dev.as_ref(), &params(true)).unwrap();
        assert_eq!(Store::open(dev).unwrap().load().unwrap().epoch, 0);
    }

    #[test]
    fn the_resource_is_bound_once() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(64 << 20));
        create(dev.as_ref(), &params(false)).unwrap();
        let st = Store::open(dev.clone()).unwrap();
        st.bind_resource(resource_id("home")).unwrap();
        st.save(&st.load().unwrap()).unwrap();
        let st = Store::open(dev.clone()).unwrap();
        st.bind_resource(resource_id("home")).unwrap();
        let e = st.bind_resource(resource_id("work")).unwrap_err();
        assert!(
            e.to_string()
                .contains("this disk belongs to another replicated resource"),
            "{e}"
        );
        // Given at create.
        let mut p = params(true);
        p.resource = Some(resource_id("work"));
        create(dev.as_ref(), &p).unwrap();
        let st = Store::open(dev).unwrap();
        assert!(st.bind_resource(resource_id("home")).is_err());
        st.bind_resource(resource_id("work")).unwrap();
    }

    #[test]
    fn node_open_binds_the_resource() {
        use crate::node::{Node, NodeConfig};
        let cfg = |resource: &str| NodeConfig::for_tests(resource, "a", "b");
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(64 << 20));
        create(dev.as_ref(), &params(false)).unwrap();
        let meta = Box::new(Store::open(dev.clone()).unwrap());
        drop(Node::open(cfg("home"), dev.clone(), meta).unwrap());
        let (_, sb) = MetaStore::open(dev.as_ref()).unwrap();
        assert_eq!(sb.uuid, resource_id("home"));
        assert_eq!(
            (
                sb.peers[0].in_use,
                sb.peers[0].node_id,
                sb.peers[0].name.as_str()
            ),
            (true, 1, "b")
        );
        let meta = Box::new(Store::open(dev.clone()).unwrap());
        let e = Node::open(cfg("work"), dev.clone(), meta).unwrap_err();
        assert!(e.to_string().contains("another replicated resource"), "{e}");
        let meta = Box::new(Store::open(dev.clone()).unwrap());
        drop(Node::open(cfg("home"), dev, meta).unwrap());
    }

    #[test]
    fn activity_log_and_bitmap_round_trip() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(256 << 20));
        create(dev.as_ref(), &params(false)).unwrap();
        let st = Store::open(dev).unwrap();
        let extents = st.layout().al_extents();
        st.write_al(&[0, 5, 63, 64, extents - 1]).unwrap();
        assert_eq!(st.read_al().unwrap(), vec![0, 5, 63, 64, extents - 1]);
        assert_eq!(
            st.write_al(&[extents]).unwrap_err().kind(),
            ErrorKind::OutOfRange
        );
        st.write_al(&[]).unwrap();
        assert!(st.read_al().unwrap().is_empty());

        let mut page = vec![0u64; 512];
        page[0] = 0b101;
        page[511] = 1 << 63;
        st.write_bitmap_pages(1, &[(0, page.clone()), (1, vec![7])])
            .unwrap();
        let words = st.read_bitmap(1).unwrap();
        assert_eq!(words[..512], page[..]);
        assert_eq!(words[512], 7);
        assert!(st.read_bitmap(0).unwrap().iter().all(|&w| w == 0));
    }

    #[test]
    fn external_create_open_save_load() {
        let data_bytes = (48 << 20) + 1024;
        let data: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(data_bytes));
        data.write_at(&vec![0xab; 1 << 20], 47 << 20, WriteFlags::NONE)
            .unwrap();
        let need = external_meta_size(data_bytes, &params(false)).unwrap();
        // 2 bitmaps of 12288 bits (one page each), 48 extents of 1 MiB (one page), super.
        assert_eq!(need, 4 * 4096);
        let e =
            create_external(data.as_ref(), &MemDisk::new(need - 1), &params(false)).unwrap_err();
        assert!(
            e.to_string().contains(&format!("at least {need} bytes")),
            "{e}"
        );
        let meta: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(need));
        let c = create_external(data.as_ref(), meta.as_ref(), &params(false)).unwrap();
        assert_eq!((c.data_size, c.metadata_bytes), (48 << 20, need));
        // The data device is not written: its last bytes are data too.
        let mut tail = vec![0u8; 4096];
        data.read_at(&mut tail, (48 << 20) - 4096).unwrap();
        assert!(tail.iter().all(|&b| b == 0xab));
        let e = create_external(data.as_ref(), meta.as_ref(), &params(false)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy);

        let st = Store::open_external(data.as_ref(), meta.clone()).unwrap();
        assert_eq!(st.data_size(), 48 << 20);
        assert!(st.layout().external);
        assert_eq!(st.layout().bitmap_offset, 0);
        let mut p = st.load().unwrap();
        assert!(p.consistent);
        st.bind_resource(resource_id("home")).unwrap();
        p.epoch = 5;
        p.peers[0] = Slot {
            name: "b".into(),
            bitmap_uuid: 0x10,
        };
        st.save(&p).unwrap();
        st.write_al(&[0, 47]).unwrap();
        let again = Store::open_external(data.as_ref(), meta.clone()).unwrap();
        assert_eq!(again.load().unwrap(), p);
        assert_eq!(again.read_al().unwrap(), vec![0, 47]);
        // The superblock is the metadata device's last 4 KiB and says EXTERNAL.
        let (_, sb) = MetaStore::open(meta.as_ref()).unwrap();
        assert!(sb.has(meta::FLAG_EXTERNAL));
        assert_eq!(sb.uuid, resource_id("home"));
        // A larger data device is used up to the recorded size.
        let bigger = MemDisk::new(64 << 20);
        assert_eq!(
            Store::open_external(&bigger, meta.clone())
                .unwrap()
                .data_size(),
            48 << 20
        );
    }

    #[test]
    fn external_refusals_are_named() {
        let data: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(32 << 20));
        let meta: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(1 << 20));
        // No metadata yet: create-md with --meta-disk is named.
        let e = Store::open_external(data.as_ref(), meta.clone()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(
            e.to_string()
                .contains("cairn repl create-md DISK --meta-disk META"),
            "{e}"
        );
        create_external(data.as_ref(), meta.as_ref(), &params(false)).unwrap();
        // The data device shrank.
        let shrunk = MemDisk::new((32 << 20) - 8192);
        let e = Store::open_external(&shrunk, meta.clone()).unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "the data device has {} bytes, but its external metadata records {} bytes of \
                 data (8192 bytes missing): the data device shrank, or is not the one this \
                 metadata was created for",
                (32 << 20) - 8192,
                32 << 20
            )),
            "{e}"
        );
        // The metadata device given as an internal disk, and an internal disk given as
        // a metadata device.
        let e = Store::open(meta.clone()).unwrap_err();
        assert!(e.to_string().contains("--meta-disk"), "{e}");
        let internal: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(64 << 20));
        create(internal.as_ref(), &params(false)).unwrap();
        let e = Store::open_external(data.as_ref(), internal.clone()).unwrap_err();
        assert!(
            e.to_string().contains("internal replication metadata"),
            "{e}"
        );
        // --force turns it into external metadata.
        create_external(data.as_ref(), internal.as_ref(), &params(true)).unwrap();
        Store::open_external(data.as_ref(), internal).unwrap();
        // Damaged external metadata is Corrupt, and create needs --force over it.
        let mut b = vec![0u8; 4096];
        meta.read_at(&mut b, (1 << 20) - 4096).unwrap();
        b[100] ^= 1;
        meta.write_at(&b, (1 << 20) - 4096, WriteFlags::NONE)
            .unwrap();
        assert_eq!(
            Store::open_external(data.as_ref(), meta.clone())
                .unwrap_err()
                .kind(),
            ErrorKind::Corrupt
        );
        let e = create_external(data.as_ref(), meta.as_ref(), &params(false)).unwrap_err();
        assert!(e.to_string().contains("damaged"), "{e}");
    }

    #[test]
    fn node_runs_on_external_metadata() {
        use crate::node::{Node, NodeConfig};
        let data: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(16 << 20));
        let meta: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(1 << 20));
        create_external(data.as_ref(), meta.as_ref(), &params(false)).unwrap();
        let cfg = NodeConfig::for_tests("home", "a", "b");
        let st = Box::new(Store::open_external(data.as_ref(), meta.clone()).unwrap());
        let node = Node::open(cfg, data.clone(), st).unwrap();
        assert_eq!(node.data_size(), 16 << 20, "the whole data device");
        drop(node);
        let (_, sb) = MetaStore::open(meta.as_ref()).unwrap();
        assert_eq!(sb.uuid, resource_id("home"));
        assert_eq!(sb.peers[0].name, "b");
    }

    #[test]
    fn a_disk_without_metadata_is_named() {
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(1 << 20));
        let e = Store::open(dev).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(e.to_string().contains("create-md"), "{e}");
        // A damaged superblock is refused, and create needs --force over it.
        let dev: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(64 << 20));
        create(dev.as_ref(), &params(false)).unwrap();
        let at = (64 << 20) - 4096;
        let mut b = vec![0u8; 4096];
        dev.read_at(&mut b, at).unwrap();
        b[200] ^= 0xff;
        dev.write_at(&b, at, WriteFlags::NONE).unwrap();
        assert_eq!(
            Store::open(dev.clone()).unwrap_err().kind(),
            ErrorKind::Corrupt
        );
        let e = create(dev.as_ref(), &params(false)).unwrap_err();
        assert!(e.to_string().contains("damaged"), "{e}");
        create(dev.as_ref(), &params(true)).unwrap();
        Store::open(dev).unwrap();
    }
}
