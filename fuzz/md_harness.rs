//! The md fuzz harnesses, shared by the cargo-fuzz targets (`fuzz_targets/md_superblock.rs`,
//! `fuzz_targets/md_ppl.rs`) and the deterministic run on stable Rust in
//! `crates/md/tests/fuzz_harness.rs`, so CI exercises them too.
//!
//! ```text
//!   md_superblock: bytes ─ fix sb_csum ─┬─> Superblock::parse (both policies) ─> Examine,
//!                                       │   encode ─> parse again, layout maths
//!                                       └─> member 0 of a real RAID5 ─> Array::assemble
//!                                           (whole, and degraded) ─> read, close
//!   md_ppl:        bytes ─ fix the CRCs ─> log header + start of the ring on member 0 of a
//!                  dirty RAID5 ─> Array::assemble (whole: replay; degraded: the start
//!                  decision) ─> read, close
//! ```
//!
//! A random mutation almost never keeps a checksum right, so the harness recomputes
//! them (the superblock's, the log header's, each entry's and its payload's) and the
//! mutations reach the validators and the replay. Every input must give an array or an
//! error: never a panic, a hang or an allocation sized by a field.

#![allow(dead_code)] // each fuzz target uses one entry point

use std::sync::{Arc, OnceLock};

use cairn_block::{BlockDevice, MemDisk, WriteFlags};
use cairn_md::layout::ArrayLayout;
use cairn_md::ondisk::checksum;
use cairn_md::{
    Array, AssembleOptions, CreateOptions, Examine, FeaturePolicy, Level, Sectors, Superblock,
};

/// Larger inputs say nothing new (a superblock is 4 KiB; the log header one block and
/// the ring a few entries).
pub const MAX_INPUT: usize = 64 << 10;

/// Superblock byte offset on a member, and the fields the fix-ups use.
const SB_AT: u64 = 4096;
const CSUM_AT: usize = 216;
const MAX_DEV_AT: usize = 220;
/// Members of the template arrays: small, so each run copies little.
const MEMBER_BYTES: u64 = 3 << 20;
const MEMBERS: usize = 3;

const RING_MAGIC: &[u8; 8] = b"cairnPLR";
const ENTRY_MAGIC: &[u8; 8] = b"cairnPLE";
const BLOCK: usize = 4096;

/// Recomputes `sb_csum` when `max_dev` leaves the role table inside `sb`.
pub fn fix_sb_checksum(sb: &mut [u8]) {
    let Some(f) = sb.get(MAX_DEV_AT..MAX_DEV_AT + 4) else {
        return;
    };
    let max_dev = u32::from_le_bytes(f.try_into().expect("4 bytes"));
    let Some(len) = usize::try_from(max_dev)
        .ok()
        .and_then(|m| m.checked_mul(2))
        .and_then(|m| m.checked_add(256))
    else {
        return;
    };
    if len > sb.len() {
        return;
    }
    let c = checksum(sb, max_dev);
    sb[CSUM_AT..CSUM_AT + 4].copy_from_slice(&c.to_le_bytes());
}

/// CRC-32C (Castagnoli, reflected), the log's checksum.
pub fn crc32c(data: &[u8]) -> u32 {
    static TABLE: OnceLock<[u32; 256]> = OnceLock::new();
    let t = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = u32::try_from(i).expect("below 256");
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    (c >> 1) ^ 0x82f6_3b78
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    let mut crc = !0u32;
    for &b in data {
        crc = t[usize::from(crc.to_le_bytes()[0] ^ b)] ^ (crc >> 8);
    }
    !crc
}

/// Recomputes the log header's CRC and, for every entry header at a block boundary of
/// the ring after it, its payload CRC (when the payload fits) and its own.
pub fn fix_log_crcs(log: &mut [u8]) {
    if log.len() >= 68 && &log[..8] == RING_MAGIC {
        let c = crc32c(&log[..64]);
        log[64..68].copy_from_slice(&c.to_le_bytes());
    }
    let mut pos = BLOCK;
    while pos + 80 <= log.len() {
        if &log[pos..pos + 8] == ENTRY_MAGIC {
            let payload = u32::from_le_bytes(log[pos + 68..pos + 72].try_into().expect("4"));
            let p0 = pos + BLOCK;
            if let Some(p1) = usize::try_from(payload)
                .ok()
                .and_then(|n| p0.checked_add(n))
                .filter(|&e| e <= log.len())
            {
                let c = crc32c(&log[p0..p1]);
                log[pos + 72..pos + 76].copy_from_slice(&c.to_le_bytes());
            }
            let c = crc32c(&log[pos..pos + 76]);
            log[pos + 76..pos + 80].copy_from_slice(&c.to_le_bytes());
        }
        pos += BLOCK;
    }
}

/// A RAID5 of three members with a partial-parity log, written with partial stripes
/// (so its ring holds entries) and closed: member images, and where the log header is.
pub struct Template {
    pub members: Vec<Vec<u8>>,
    pub log_at: usize,
    pub data_offset: usize,
}

fn template() -> &'static Template {
    static T: OnceLock<Template> = OnceLock::new();
    T.get_or_init(|| {
        let disks: Vec<Arc<MemDisk>> = (0..MEMBERS)
            .map(|_| Arc::new(MemDisk::new(MEMBER_BYTES)))
            .collect();
        let devs: Vec<Arc<dyn BlockDevice>> = disks
            .iter()
            .map(|d| d.clone() as Arc<dyn BlockDevice>)
            .collect();
        let names = (0..MEMBERS).map(|i| format!("disk{i}.img")).collect();
        let mut o = CreateOptions::new(Level::Raid5, "fuzz");
        o.chunk = Some(Sectors(8));
        o.members_zeroed = true;
        let a = Array::create(devs, names, &o).expect("template array");
        for (i, off) in [0u64, 4096, 12288, 65536].into_iter().enumerate() {
            let b = vec![u8::try_from(i + 1).expect("small"); 4096];
            a.write_at(&b, off, WriteFlags::NONE)
                .expect("template write");
        }
        a.flush().expect("template flush");
        drop(a);
        let members: Vec<Vec<u8>> = disks.iter().map(|d| d.to_vec()).collect();
        let sb = Superblock::read_from(&*disks[0], "disk0.img", FeaturePolicy::Supported)
            .expect("template superblock");
        let data_offset = usize::try_from(sb.data_offset.0 * 512).expect("a few MiB at most");
        let log_at = (0..data_offset)
            .step_by(BLOCK)
            .find(|&o| &members[0][o..o + 8] == RING_MAGIC)
            .expect("the template has a partial-parity log");
        Template {
            members,
            log_at,
            data_offset,
        }
    })
}

/// The template's members as disks, `edit` applied to member 0's image first.
fn disks(edit: impl FnOnce(&mut Vec<u8>)) -> Vec<Arc<dyn BlockDevice>> {
    let t = template();
    let mut first = t.members[0].clone();
    edit(&mut first);
    std::iter::once(&first)
        .chain(&t.members[1..])
        .map(|img| Arc::new(MemDisk::from_bytes(img)) as Arc<dyn BlockDevice>)
        .collect()
}

/// Assembles `members` (all of them, then without the last), reads a little of what
/// starts and closes it. Errors are fine; panics are not.
fn exercise(members: Vec<Arc<dyn BlockDevice>>) {
    let names: Vec<String> = (0..members.len()).map(|i| format!("disk{i}.img")).collect();
    for keep in [members.len(), members.len() - 1] {
        let devs = members[..keep].to_vec();
        let nm = names[..keep].to_vec();
        if let Ok(a) = Array::assemble(devs, nm, AssembleOptions { force: false }) {
            let g = a.geometry();
            let mut b = vec![0u8; 4096];
            if g.size >= 4096 {
                let _ = a.read_at(&mut b, 0);
                let _ = a.read_at(&mut b, g.size / 4096 / 2 * 4096);
            }
            let _ = a.report();
            drop(a);
        }
    }
}

/// One fuzz input: the 4096 bytes of an md v1.2 superblock (or fewer, or more).
pub fn md_superblock(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let mut sb = data.to_vec();
    fix_sb_checksum(&mut sb);

    // The parser: a pure function of the bytes.
    for policy in [FeaturePolicy::Supported, FeaturePolicy::KnownToMd] {
        let Ok(s) = Superblock::parse_with(&sb, "fuzz", policy) else {
            continue;
        };
        let _ = Examine::new(&s, None).to_string();
        let _ = Examine::new(&s, Some(Sectors(u64::MAX))).to_string();
        if let Ok(bytes) = s.encode() {
            let again = Superblock::parse_with(&bytes, "fuzz", FeaturePolicy::KnownToMd)
                .expect("cairn's own superblock parses");
            assert_eq!(
                again.encode().expect("and encodes again"),
                bytes,
                "encoding is not a fixed point"
            );
        }
        let sizes = vec![s.data_size; usize::try_from(s.raid_disks).unwrap_or(0)];
        if let Ok(l) = ArrayLayout::from_superblock(&s, &sizes) {
            let _ = l.array_sectors();
        }
    }

    // The path `cairn md assemble` and `cairn serve --md` take, as member 0 of a real
    // array (the others keep their own superblocks).
    let n = sb.len().min(4096);
    exercise(disks(|img| {
        let at = usize::try_from(SB_AT).expect("4096");
        img[at..at + n].copy_from_slice(&sb[..n]);
    }));
}

/// One fuzz input: member 0's partial-parity log header block followed by the start of
/// its ring, on a RAID5 that was not shut down cleanly.
pub fn md_ppl(data: &[u8]) {
    if data.len() > MAX_INPUT {
        return;
    }
    let t = template();
    let mut log = data.to_vec();
    log.truncate(t.data_offset - t.log_at);
    fix_log_crcs(&mut log);
    let members = disks(|img| {
        img[t.log_at..t.log_at + log.len()].copy_from_slice(&log);
    });
    // Dirty on every member (resync_offset 0), so the log is replayed.
    for m in &members {
        let mut sb = vec![0u8; 4096];
        m.read_at(&mut sb, SB_AT).expect("in memory");
        sb[208..216].copy_from_slice(&0u64.to_le_bytes());
        fix_sb_checksum(&mut sb);
        m.write_at(&sb, SB_AT, WriteFlags::NONE).expect("in memory");
    }
    exercise(members);
}

/// The template's pieces as seeds: member 0's superblock; its log header and ring start.
pub fn seeds() -> (Vec<u8>, Vec<u8>) {
    let t = template();
    let at = usize::try_from(SB_AT).expect("4096");
    let sb = t.members[0][at..at + 4096].to_vec();
    let end = (t.log_at + MAX_INPUT).min(t.data_offset);
    let log = t.members[0][t.log_at..end].to_vec();
    (sb, log)
}
