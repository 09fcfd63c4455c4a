use cairn_block::MemDisk;

use super::*;

const MIB: u64 = 1 << 20;

fn sample() -> Super {
    let l = Layout::internal(64 * MIB, 4096, 4 << 20, 2).unwrap();
    let mut peers: [PeerSlot; SLOTS] = Default::default();
    peers[0] = PeerSlot {
        in_use: true,
        node_id: 1,
        bitmap_uuid: 0xabc0,
        name: "node-b:7789".into(),
    };
    peers[1] = PeerSlot {
        in_use: true,
        node_id: 2,
        bitmap_uuid: 0,
        name: "ñ".repeat(32), // 64 bytes of UTF-8: the longest name
    };
    Super {
        uuid: *b"0123456789abcdef",
        node_id: 0,
        max_peers: 2,
        flags: FLAG_CONSISTENT | FLAG_PRIMARY,
        bm_block: 4096,
        al_extent: 4 << 20,
        data_size: l.data_size,
        bitmap_offset: l.bitmap_offset,
        al_offset: l.al_offset,
        current: 0x1234_5670,
        history: [0x1111_0000, 0],
        fence_epoch: 9,
        fence_owner: "ü".repeat(16), // 32 bytes of UTF-8: the longest owner
        fence_instance: 0x0123_4567_89ab_cdef,
        fence_generation: 8,
        peers,
    }
}

/// Re-checksums `b` so a changed field reaches validation.
fn fix(mut b: [u8; SUPER_SIZE]) -> [u8; SUPER_SIZE] {
    let crc = crc32c::crc32c(&b[..OFF_CHECKSUM]);
    put32(&mut b, OFF_CHECKSUM, crc);
    b
}

#[test]
fn round_trip_and_layout_bytes() {
    let s = sample();
    let b = s.encode();
    assert_eq!(&b[0..8], b"CAIRNRPL");
    assert_eq!(le32(&b, 8), 1);
    assert_eq!(le32(&b, 12), 512);
    assert_eq!(&b[16..32], b"0123456789abcdef");
    assert_eq!(le64(&b, 56), s.data_size);
    assert_eq!(le64(&b, 80), 0x1234_5670);
    assert_eq!(le64(&b, 104), 9);
    assert_eq!(le32(&b, 112), 1);
    assert_eq!(le32(&b, 116), SLOT_IN_USE);
    assert_eq!(le64(&b, 120), 0xabc0);
    assert_eq!(&b[128..139], b"node-b:7789");
    assert_eq!(&b[400..432], "ü".repeat(16).as_bytes());
    assert_eq!(le64(&b, 432), 0x0123_4567_89ab_cdef);
    assert_eq!(le64(&b, 440), 8);
    assert!(b[448..508].iter().all(|&x| x == 0));
    assert_eq!(le32(&b, 508), crc32c::crc32c(&b[..508]));
    assert!(b[512..].iter().all(|&x| x == 0));
    assert_eq!(Super::decode(&b).unwrap(), s);
}

#[test]
fn every_flipped_bit_is_caught() {
    let b = sample().encode();
    for i in 0..SUPER_SIZE * 8 {
        let mut c = b;
        c[i / 8] ^= 1 << (i % 8);
        assert!(Super::decode(&c).is_err(), "bit {i}");
    }
}

#[test]
fn each_bad_field_is_named() {
    let b = sample().encode();
    type Mutation = Box<dyn Fn(&mut [u8; SUPER_SIZE])>;
    let cases: Vec<(Mutation, &str)> = vec![
        (Box::new(|c| put32(c, OFF_VERSION, 2)), "version"),
        (Box::new(|c| put32(c, OFF_LENGTH, 4096)), "length"),
        (Box::new(|c| put32(c, OFF_MAX_PEERS, 0)), "max_peers"),
        (Box::new(|c| put32(c, OFF_MAX_PEERS, 4)), "max_peers"),
        (Box::new(|c| put32(c, OFF_NODE_ID, 3)), "node_id"),
        (Box::new(|c| put32(c, OFF_FLAGS, 32)), "flags"),
        (Box::new(|c| put32(c, OFF_BM_BLOCK, 2048)), "bm_block"),
        (Box::new(|c| put32(c, OFF_BM_BLOCK, 12288)), "bm_block"),
        (Box::new(|c| put32(c, OFF_AL_EXTENT, 3 << 20)), "al_extent"),
        (Box::new(|c| put32(c, OFF_RESERVED1, 1)), "reserved"),
        (Box::new(|c| put64(c, OFF_DATA_SIZE, 4095)), "data_size"),
        (Box::new(|c| put64(c, OFF_DATA_SIZE, 0)), "data_size"),
        (
            Box::new(|c| put64(c, OFF_DATA_SIZE, u64::MAX - 4095)),
            "data_size",
        ),
        (
            Box::new(|c| put64(c, OFF_BITMAP_OFFSET, 0)),
            "bitmap_offset",
        ),
        (Box::new(|c| put64(c, OFF_AL_OFFSET, 0)), "al_offset"),
        (Box::new(|c| put64(c, OFF_CURRENT, 0)), "current"),
        (Box::new(|c| put64(c, OFF_CURRENT, 0x1235)), "current"),
        (Box::new(|c| put64(c, OFF_HISTORY + 8, 3)), "history[1]"),
        (
            Box::new(|c| put32(c, OFF_SLOTS + SLOT_FLAGS, 2)),
            "peer slot 0",
        ),
        (Box::new(|c| put32(c, OFF_SLOTS, 0)), "peer slot 0"),
        (
            Box::new(|c| put32(c, OFF_SLOTS + SLOT_SIZE, 1)),
            "peer slot 1",
        ),
        (
            Box::new(|c| put64(c, OFF_SLOTS + SLOT_BITMAP_UUID, 1)),
            "peer slot 0",
        ),
        (Box::new(|c| c[OFF_SLOTS + SLOT_NAME] = 0xff), "UTF-8"),
        (
            Box::new(|c| c[OFF_SLOTS + SLOT_NAME + 20] = b'x'),
            "NUL padded",
        ),
        (
            Box::new(|c| c[OFF_SLOTS + SLOT_RESERVED] = 1),
            "peer slot 0",
        ),
        (
            Box::new(|c| c[OFF_SLOTS + 2 * SLOT_SIZE + 3] = 1),
            "peer slot 2",
        ),
        (
            Box::new(|c| c[OFF_FENCE_OWNER] = 0xff),
            "fence_owner is not UTF-8",
        ),
        (
            Box::new(|c| {
                c[OFF_FENCE_OWNER..OFF_FENCE_INSTANCE].fill(0);
                c[OFF_FENCE_OWNER + 31] = b'x';
            }),
            "fence_owner is not NUL padded",
        ),
        (
            Box::new(|c| put64(c, OFF_FENCE_GENERATION, 10)),
            "fence_generation",
        ),
        (
            Box::new(|c| c[OFF_UUID..OFF_NODE_ID].fill(0)),
            "uuid is zero",
        ),
        (Box::new(|c| c[OFF_RESERVED2 + 5] = 1), "reserved"),
        (Box::new(|c| c[OFF_CHECKSUM - 1] = 1), "reserved"),
        (Box::new(|c| c[4000] = 1), "not zero"),
    ];
    for (mutate, word) in cases {
        let mut c = b;
        mutate(&mut c);
        let e = Super::decode(&fix(c)).unwrap_err();
        assert!(e.contains(word), "{word:?} not in {e:?}");
    }
    let mut c = b;
    c[0] = b'X';
    assert!(Super::decode(&c).unwrap_err().contains("magic"));
    let mut c = b;
    c[200] ^= 1;
    assert!(Super::decode(&c).unwrap_err().contains("checksum"));
    // A slot past max_peers in use.
    let mut s = sample();
    s.max_peers = 1;
    s.node_id = 1;
    let l = Layout::internal(64 * MIB, 4096, 4 << 20, 1).unwrap();
    s.data_size = l.data_size;
    s.bitmap_offset = l.bitmap_offset;
    s.al_offset = l.al_offset;
    s.peers[0].node_id = 0;
    assert!(s.validate().unwrap_err().contains("peer slot 1"));
    // An owner longer than the field.
    let mut s = sample();
    s.fence_owner = "x".repeat(OWNER_LEN + 1);
    assert!(s.validate().unwrap_err().contains("fence_owner"));
}

/// A fence epoch at its maximum (a crafted or worn-out superblock, with a valid checksum)
/// is refused on load: the next connection or promotion would wrap it to 0.
#[test]
fn fence_epoch_at_its_maximum_is_refused() {
    let mut s = sample();
    s.fence_epoch = u64::MAX;
    let e = s.validate().unwrap_err();
    assert!(
        e.contains("fence_epoch is at its maximum (18446744073709551615)"),
        "{e}"
    );
    let e = Super::decode(&s.encode()).unwrap_err().to_string();
    assert!(e.contains("fence_epoch is at its maximum"), "{e}");
    s.fence_epoch = u64::MAX - 1;
    assert_eq!(Super::decode(&s.encode()).unwrap(), s);
}

#[test]
fn no_fence_token_and_no_uuid() {
    let mut s = sample();
    s.fence_owner.clear();
    s.fence_instance = 0;
    s.fence_generation = 0;
    assert!(!s.has_fence());
    s.uuid = [0; 16];
    let b = s.encode();
    assert!(b[400..508].iter().all(|&x| x == 0));
    assert_eq!(Super::decode(&b).unwrap(), s);
    // Any one fence field makes a token, which needs a uuid.
    for set in [
        |s: &mut Super| s.fence_owner = "a".into(),
        |s: &mut Super| s.fence_instance = 1,
        |s: &mut Super| s.fence_generation = 1,
    ] {
        let mut t = s.clone();
        set(&mut t);
        assert!(t.has_fence());
        assert!(t.validate().unwrap_err().contains("uuid is zero"));
        t.uuid = [7; 16];
        assert_eq!(Super::decode(&t.encode()).unwrap(), t);
    }
}

#[test]
fn random_bytes_never_panic() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
    let good = sample().encode();
    for round in 0..3000 {
        let mut b = if round % 3 == 0 {
            [0u8; SUPER_SIZE]
        } else {
            good
        };
        if round % 3 == 0 {
            rng.fill(&mut b[..]);
            b[..8].copy_from_slice(&MAGIC);
        } else {
            for _ in 0..rng.gen_range(1..12) {
                let i = rng.gen_range(0..USED);
                b[i] = rng.gen();
            }
        }
        let _ = Super::decode(&b);
        let _ = Super::decode(&fix(b));
    }
}

#[test]
fn layout_internal_fits_and_is_maximal() {
    for (size, bm, al, peers) in [
        (64 * MIB, 4096, 4 << 20, 1),
        (64 * MIB + 512, 4096, 4 << 20, 3),
        (1 << 40, 4096, 4 << 20, 3),
        (10 * MIB + 12345 * 512, 65536, 1 << 20, 2),
        (u64::MAX / 2, 1 << 20, 1 << 30, 3),
    ] {
        let l = Layout::internal(size, bm, al, peers).unwrap();
        assert_eq!(l.data_size % u64::from(bm), 0);
        assert_eq!(l.bitmap_offset, l.data_size);
        assert_eq!(l.bitmap_bytes % PAGE, 0);
        assert_eq!(l.al_bytes % PAGE, 0);
        assert!(l.bitmap_bytes * 8 >= l.bits());
        assert!(l.al_bytes * 8 >= l.al_extents());
        assert!(l.al_offset + l.al_bytes <= l.super_offset);
        assert_eq!(l.super_offset, size / 4096 * 4096 - 4096);
        // One more block would not fit.
        let more =
            Layout::from_data_size(l.data_size + u64::from(bm), false, bm, al, peers).unwrap();
        assert!(more.super_offset > l.super_offset, "{size}");
    }
    let e = Layout::internal(4 * MIB, 4096, 4 << 20, 1).unwrap_err();
    assert!(e.contains("at least 4206592 bytes"), "{e}");
    assert!(Layout::internal(4206592, 4096, 4 << 20, 1).is_ok());
    assert!(Layout::internal(4206591, 4096, 4 << 20, 1).is_err());
    assert!(Layout::internal(0, 4096, 4 << 20, 1).is_err());
    assert!(Layout::internal(64 * MIB, 4096, 4 << 20, 4)
        .unwrap_err()
        .contains("max_peers"));
    assert!(Layout::internal(64 * MIB, 1024, 4 << 20, 1)
        .unwrap_err()
        .contains("bm_block"));
    assert!(Layout::internal(64 * MIB, 8192, 4096, 1)
        .unwrap_err()
        .contains("al_extent"));
}

#[test]
fn bit_helpers() {
    let l = Layout::internal(64 * MIB, 4096, 1 << 20, 1).unwrap();
    assert_eq!(l.bit_of(0), 0);
    assert_eq!(l.bit_of(8191), 1);
    assert_eq!(l.bytes_of_bit(2), 8192..12288);
    assert_eq!(l.extent_of(3 << 20), 3);
    assert_eq!(l.bytes_of_extent(1), (1 << 20)..(2 << 20));
    assert_eq!(l.bits_of_extent(1), 256..512);
    let last = l.bits() - 1;
    assert_eq!(l.bytes_of_bit(last).end, l.data_size);
    assert_eq!(l.bytes_of_bit(u64::MAX), l.data_size..l.data_size);
    assert!(l.bits_of_extent(l.al_extents()).is_empty());
}

#[test]
fn create_open_write() {
    let dev = MemDisk::new(512 * MIB);
    // Dirty the metadata area first: create must zero it.
    dev.write_at(&vec![0xff; 1 << 20], 511 * MIB, WriteFlags::NONE)
        .unwrap();
    let e = MetaStore::open(&dev).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("create-md"), "{e}");
    let mut p = CreateParams::new(*b"0123456789abcdef", 0, 2);
    p.peers.push(PeerSlot {
        in_use: true,
        node_id: 1,
        bitmap_uuid: 0,
        name: "b".into(),
    });
    let (store, sb) = MetaStore::create(&dev, &p).unwrap();
    assert_eq!(sb.current, JUST_CREATED);
    assert!(sb.has(FLAG_CLEAN) && !sb.has(FLAG_CONSISTENT));
    assert!(!sb.has_fence());
    let (store2, sb2) = MetaStore::open(&dev).unwrap();
    assert_eq!((store2, &sb2), (store, &sb));
    let l = *store.layout();
    for slot in 0..2 {
        assert!(store
            .read_bitmap(&dev, slot)
            .unwrap()
            .iter()
            .all(|&w| w == 0));
    }
    assert!(store.read_al(&dev).unwrap().iter().all(|&w| w == 0));
    assert_eq!(
        store.read_bitmap(&dev, 2).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );

    // Superblock updates.
    let mut s = sb.clone();
    s.set(FLAG_CONSISTENT, true);
    let mut g = s.generations(0).unwrap();
    g.initial_sync_start(&mut || 0x5550);
    s.set_generations(0, &g).unwrap();
    store.write_super(&dev, &s).unwrap();
    assert_eq!(MetaStore::open(&dev).unwrap().1, s);
    let mut bad = s.clone();
    bad.peers[0].name = "x".repeat(65);
    assert_eq!(
        store.write_super(&dev, &bad).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );

    // Bitmap pages: only the touched ones are written.
    let mut words = store.read_bitmap(&dev, 1).unwrap();
    assert_eq!(words.len() as u64, l.bitmap_bytes / 8);
    words[0] = 1; // page 0 (512 words a page): not written below
    words[600] = 0x8000_0000_0000_0000;
    words[601] = 0xff; // same page as word 600: written with it
    store.write_bitmap_range(&dev, 1, &words, 600, 1).unwrap();
    let back = store.read_bitmap(&dev, 1).unwrap();
    assert_eq!((back[0], back[600], back[601]), (0, words[600], 0xff));
    // Slot 0 untouched.
    assert!(store.read_bitmap(&dev, 0).unwrap().iter().all(|&w| w == 0));
    assert_eq!(
        store
            .write_bitmap_range(&dev, 1, &words, words.len() as u64, 1)
            .unwrap_err()
            .kind(),
        ErrorKind::OutOfRange
    );
    assert_eq!(
        store
            .write_bitmap_range(&dev, 1, &words[1..], 0, 1)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );

    // Activity log, and its padding bits.
    let mut al = store.read_al(&dev).unwrap();
    let n = l.al_extents();
    let last = usize::try_from((n - 1) / 64).unwrap();
    al[last] = u64::MAX;
    store.write_al(&dev, &al, 0, al.len() as u64).unwrap();
    let back = store.read_al(&dev).unwrap();
    let ones: u64 = back.iter().map(|w| u64::from(w.count_ones())).sum();
    assert_eq!(ones, n - (n - 1) / 64 * 64, "only real extents count");

    // Damage and wrong sizes.
    let mut raw = s.encode();
    raw[100] ^= 4;
    dev.write_at(&raw, l.super_offset, WriteFlags::NONE)
        .unwrap();
    let e = MetaStore::open(&dev).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.to_string().contains("checksum"), "{e}");
    let bigger = MemDisk::new(1024 * MIB);
    bigger
        .write_at(&s.encode(), 1024 * MIB - 4096, WriteFlags::NONE)
        .unwrap();
    let e = MetaStore::open(&bigger).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.to_string().contains("resized"), "{e}");
    assert_eq!(
        MetaStore::open(&MemDisk::new(2048)).unwrap_err().kind(),
        ErrorKind::NotFound
    );
}

#[test]
fn bitmap_pages_written_are_only_the_touched_ones() {
    let dev = MemDisk::new(512 * MIB);
    let (store, _) = MetaStore::create(&dev, &CreateParams::new([1; 16], 1, 1)).unwrap();
    let l = *store.layout();
    assert!(l.bitmap_bytes >= 3 * PAGE);
    let mut words = vec![u64::MAX; usize::try_from(l.bitmap_bytes / 8).unwrap()];
    // Words 510..514 straddle pages 0 and 1: both pages are written, page 2 is not.
    store.write_bitmap_range(&dev, 0, &words, 510, 4).unwrap();
    let back = store.read_bitmap(&dev, 0).unwrap();
    assert!(back[..1024].iter().all(|&w| w == u64::MAX));
    assert!(back[1024..].iter().all(|&w| w == 0));
    words.fill(0);
    store.write_bitmap_range(&dev, 0, &words, 0, 0).unwrap();
    assert_eq!(store.read_bitmap(&dev, 0).unwrap()[0], u64::MAX);
}

#[test]
fn bitmap_pages_by_index() {
    let dev = MemDisk::new(512 * MIB);
    let (store, _) = MetaStore::create(&dev, &CreateParams::new([1; 16], 0, 2)).unwrap();
    let l = *store.layout();
    let n_pages = l.bitmap_bytes / PAGE;
    assert!(n_pages >= 4);
    let ones = vec![u64::MAX; 512];
    // One run (pages 1 and 2), a short page (the rest zero), then two runs.
    store
        .write_bitmap_pages(&dev, 1, &[(1, &ones), (2, &ones)])
        .unwrap();
    store.write_bitmap_pages(&dev, 1, &[(2, &[5, 6])]).unwrap();
    let back = store.read_bitmap(&dev, 1).unwrap();
    assert!(back[..512].iter().all(|&w| w == 0));
    assert!(back[512..1024].iter().all(|&w| w == u64::MAX));
    assert_eq!(&back[1024..1026], &[5, 6]);
    assert!(back[1026..].iter().all(|&w| w == 0));
    store
        .write_bitmap_pages(&dev, 1, &[(0, &[1]), (3, &[3])])
        .unwrap();
    let back = store.read_bitmap(&dev, 1).unwrap();
    assert_eq!((back[0], back[1536]), (1, 3));
    assert!(store.read_bitmap(&dev, 0).unwrap().iter().all(|&w| w == 0));
    // The last page: bits past the last data block are not written.
    let last = n_pages - 1;
    store.write_bitmap_pages(&dev, 0, &[(last, &ones)]).unwrap();
    let mut raw = vec![0u8; usize::try_from(PAGE).unwrap()];
    dev.read_at(&mut raw, l.bitmap_at(0) + last * PAGE).unwrap();
    let set: u64 = raw.iter().map(|b| u64::from(b.count_ones())).sum();
    assert_eq!(set, l.bits() - last * PAGE * 8);
    // Refusals, before anything is written.
    assert_eq!(
        store
            .write_bitmap_pages(&dev, 1, &[(0, &[9]), (n_pages, &[1])])
            .unwrap_err()
            .kind(),
        ErrorKind::OutOfRange
    );
    assert_eq!(store.read_bitmap(&dev, 1).unwrap()[0], 1);
    assert_eq!(
        store
            .write_bitmap_pages(&dev, 1, &[(0, &[0; 513])])
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    assert_eq!(
        store
            .write_bitmap_pages(&dev, 2, &[(0, &[1])])
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    store.write_bitmap_pages(&dev, 1, &[]).unwrap();
}

#[test]
fn create_consistent() {
    let dev = MemDisk::new(64 * MIB);
    let mut p = CreateParams::new([0; 16], 0, 1);
    p.consistent = true;
    let (_, sb) = MetaStore::create(&dev, &p).unwrap();
    assert!(sb.has(FLAG_CONSISTENT) && sb.has(FLAG_CLEAN));
    assert_eq!(sb.uuid, [0; 16]);
    assert_eq!(MetaStore::open(&dev).unwrap().1, sb);
}

#[test]
fn create_refuses_bad_params() {
    let dev = MemDisk::new(64 * MIB);
    let mut p = CreateParams::new([0; 16], 2, 1);
    assert!(MetaStore::create(&dev, &p)
        .unwrap_err()
        .to_string()
        .contains("node_id"));
    p.node_id = 0;
    p.peers = vec![PeerSlot::default(), PeerSlot::default()];
    assert_eq!(
        MetaStore::create(&dev, &p).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let small = MemDisk::new(MIB);
    let e = MetaStore::create(&small, &CreateParams::new([0; 16], 0, 1)).unwrap_err();
    assert!(e.to_string().contains("too small"), "{e}");
}

/// An external superblock (data on a device of its own) with the sample's state.
fn sample_external() -> Super {
    let l = Layout::external(64 * MIB + 123, MIB, 4096, 4 << 20, 2).unwrap();
    let mut s = sample();
    s.flags |= FLAG_EXTERNAL;
    s.data_size = l.data_size;
    s.bitmap_offset = l.bitmap_offset;
    s.al_offset = l.al_offset;
    s
}

#[test]
fn layout_external_derivation() {
    // 64 MiB of data, 4 KiB blocks: 16384 bits = 2048 bytes, one page a peer; 16 extents
    // of 4 MiB: one page of log; then the superblock.
    let l = Layout::external(64 * MIB + 123, MIB, 4096, 4 << 20, 2).unwrap();
    assert!(l.external);
    assert_eq!(
        l.data_size,
        64 * MIB,
        "the whole device, rounded down to bm_block"
    );
    assert_eq!((l.bitmap_offset, l.bitmap_bytes), (0, 4096));
    assert_eq!((l.al_offset, l.al_bytes), (8192, 4096));
    assert_eq!(l.super_offset, MIB - 4096, "the last whole 4 KiB");
    assert_eq!(
        Layout::external_meta_size(64 * MIB + 123, 4096, 4 << 20, 2),
        Ok(16384)
    );
    let tight = Layout::external(64 * MIB, 16384, 4096, 4 << 20, 2).unwrap();
    assert_eq!(tight.super_offset, 12288);
    assert_eq!(tight.al_offset + tight.al_bytes, tight.super_offset);
    // A partial last page of the metadata device does not count.
    let e = Layout::external(64 * MIB, 16384 + 4095 - 4096, 4096, 4 << 20, 2).unwrap_err();
    assert!(e.contains("must be at least 16384 bytes"), "{e}");
    // Big: 1 TiB of data, 3 peers, 64 KiB blocks.
    let l = Layout::external(1 << 40, 1 << 30, 65536, 1 << 26, 3).unwrap();
    assert_eq!(l.bitmap_bytes, (1 << 24) / 8);
    assert_eq!(l.al_offset, 3 * l.bitmap_bytes);
    assert_eq!(
        Layout::external_meta_size(1 << 40, 65536, 1 << 26, 3).unwrap(),
        l.al_offset + l.al_bytes + 4096
    );
    // Refusals: no whole bitmap block of data, bad parameters, overflow.
    let e = Layout::external(4095, MIB, 4096, 4 << 20, 1).unwrap_err();
    assert!(e.contains("smaller than one bitmap block"), "{e}");
    assert!(Layout::external(64 * MIB, MIB, 4096, 4 << 20, 4)
        .unwrap_err()
        .contains("max_peers"));
    // The largest data device: the metadata still fits a device of u64::MAX bytes.
    let l = Layout::external(u64::MAX, u64::MAX, 4096, 4096, 3).unwrap();
    assert_eq!(l.data_size, u64::MAX / 4096 * 4096);
    assert!(l.al_offset + l.al_bytes <= l.super_offset);
    // The derivation the superblock records.
    let s = sample_external();
    assert_eq!(s.derived().unwrap().bitmap_offset, 0);
    assert_eq!(s.derived().unwrap().al_offset, s.al_offset);
}

#[test]
fn external_round_trip_and_flips() {
    let s = sample_external();
    let b = s.encode();
    assert_eq!(le32(&b, 40), FLAG_CONSISTENT | FLAG_PRIMARY | FLAG_EXTERNAL);
    assert_eq!(le64(&b, 56), 64 * MIB);
    assert_eq!((le64(&b, 64), le64(&b, 72)), (0, 8192));
    assert_eq!(Super::decode(&b).unwrap(), s);
    for i in 0..SUPER_SIZE * 8 {
        let mut c = b;
        c[i / 8] ^= 1 << (i % 8);
        assert!(Super::decode(&c).is_err(), "bit {i}");
    }
    // The flag and the offsets must agree, with the checksum right: internal offsets
    // under EXTERNAL, external ones without it.
    let mut c = b;
    put32(&mut c, OFF_FLAGS, FLAG_CONSISTENT);
    let e = Super::decode(&fix(c)).unwrap_err();
    assert!(e.contains("bitmap_offset 0 is not data_size"), "{e}");
    let mut c = sample().encode();
    put32(&mut c, OFF_FLAGS, FLAG_EXTERNAL);
    let e = Super::decode(&fix(c)).unwrap_err();
    assert!(e.contains("is not 0 (the metadata is external)"), "{e}");
    let mut c = b;
    put64(&mut c, OFF_AL_OFFSET, 4096);
    assert!(Super::decode(&fix(c)).unwrap_err().contains("al_offset"));
    let mut c = b;
    put64(&mut c, OFF_DATA_SIZE, 64 * MIB + 4096 * 4096 * 8);
    assert!(Super::decode(&fix(c)).unwrap_err().contains("al_offset"));
}

#[test]
fn create_open_external() {
    let data_bytes = 100 * MIB + 5;
    let meta = MemDisk::new(MIB);
    meta.write_at(&vec![0xff; 64 << 10], 0, WriteFlags::NONE)
        .unwrap();
    let (store, sb) =
        MetaStore::create_external(&meta, data_bytes, &CreateParams::new([3; 16], 0, 3)).unwrap();
    let l = *store.layout();
    assert!(sb.has(FLAG_EXTERNAL) && sb.has(FLAG_CLEAN));
    assert_eq!((sb.data_size, l.data_size), (100 * MIB, 100 * MIB));
    assert_eq!((sb.bitmap_offset, l.bitmap_offset), (0, 0));
    assert_eq!(l.super_offset, MIB - 4096);
    let (again, sb2) = MetaStore::open(&meta).unwrap();
    assert_eq!((again, &sb2), (store, &sb));
    for slot in 0..3 {
        assert!(store
            .read_bitmap(&meta, slot)
            .unwrap()
            .iter()
            .all(|&w| w == 0));
    }
    // Bitmap pages land from byte 0 of the metadata device.
    store.write_bitmap_pages(&meta, 0, &[(0, &[0xf0])]).unwrap();
    let mut raw = [0u8; 8];
    meta.read_at(&mut raw, 0).unwrap();
    assert_eq!(u64::from_le_bytes(raw), 0xf0);
    store.write_al(&meta, &vec![1; 512], 0, 512).unwrap();
    meta.read_at(&mut raw, l.al_offset).unwrap();
    assert_eq!(u64::from_le_bytes(raw), 1);
    // A superblock that changed kind does not match the layout.
    let mut bad = sb.clone();
    bad.set(FLAG_EXTERNAL, false);
    assert!(store.write_super(&meta, &bad).is_err());
    let mut s = sb.clone();
    s.fence_epoch = 3;
    store.write_super(&meta, &s).unwrap();
    assert_eq!(MetaStore::open(&meta).unwrap().1, s);

    // Too small a metadata device: refused with the size it needs.
    let need = Layout::external_meta_size(data_bytes, 4096, 4 << 20, 3).unwrap();
    let small = MemDisk::new(need - 4096);
    let e = MetaStore::create_external(&small, data_bytes, &CreateParams::new([3; 16], 0, 3))
        .unwrap_err();
    assert!(
        e.to_string().contains(&format!("at least {need} bytes")),
        "{e}"
    );
    MetaStore::create_external(
        &MemDisk::new(need),
        data_bytes,
        &CreateParams::new([3; 16], 0, 3),
    )
    .unwrap();
    // The superblock copied to a metadata device too small for its data: corrupt.
    let copy = MemDisk::new(need - 4096);
    copy.write_at(&s.encode(), need - 8192, WriteFlags::NONE)
        .unwrap();
    let e = MetaStore::open(&copy).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.to_string().contains("does not fit"), "{e}");
}
