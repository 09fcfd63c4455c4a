//! Shared by the array tests: member construction, and an independent model of what
//! every member must hold for given array data (from `layout` + the scalar parity
//! kernel, never from the array's own I/O code).

#![allow(dead_code)]

use std::sync::Arc;

use cairn_block::{BlockDevice, MemDisk};
use cairn_md::layout::{ArrayLayout, Location, ParityLayout};
use cairn_md::parity::{Impl, Parity};
use cairn_md::{Array, CreateOptions, Level, Sectors, StripeNo, Superblock};

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;

/// The scalar kernel, for the recovery maths of [`recompute_member`]: independent of
/// the SIMD kernel the array uses.
pub fn scalar() -> Parity {
    Parity::with_impl(Impl::Scalar).expect("scalar always runs")
}

/// The fastest kernel, for checking whole member images (tests/parity.rs checks it
/// byte for byte against the scalar one; debug builds make the scalar one slow).
pub fn fast() -> Parity {
    Parity::new()
}

/// One array shape.
#[derive(Debug, Clone)]
pub struct Shape {
    pub level: Level,
    pub layout: Option<u32>,
    pub chunk_kib: u64,
    pub members: usize,
    /// Stripes (rows of chunks) of data per member; unequal member sizes when set
    /// (linear and RAID0 only).
    pub rows: u64,
    pub unequal: bool,
}

impl Shape {
    pub fn new(level: Level, layout: Option<u32>, chunk_kib: u64, members: usize) -> Shape {
        Shape {
            level,
            layout,
            chunk_kib,
            members,
            rows: match chunk_kib {
                0..=4 => 24,
                5..=64 => 4,
                _ => 2,
            },
            unequal: false,
        }
    }

    pub fn rows(mut self, rows: u64) -> Shape {
        self.rows = rows;
        self
    }

    pub fn name(&self) -> String {
        let layout = match (self.level, self.layout) {
            (Level::Raid10, Some(l)) => cairn_md::Raid10Layout::from_raw(l)
                .map(|l| l.short_name())
                .unwrap_or_default(),
            (Level::Raid5 | Level::Raid6, Some(l)) => cairn_md::ParityAlgorithm::ALL
                .into_iter()
                .find(|a| a.to_raw() == l)
                .map(|a| a.name().to_string())
                .unwrap_or_default(),
            (_, Some(l)) => format!("layout {l}"),
            (_, None) => "default".into(),
        };
        format!(
            "{} {} x{} chunk {}K{}",
            self.level,
            layout,
            self.members,
            self.chunk_kib,
            if self.unequal { " unequal" } else { "" }
        )
    }

    /// Member sizes: md's default data offset (1 or 2 MiB for such small members) plus
    /// `rows` chunks of data.
    pub fn member_bytes(&self) -> Vec<u64> {
        let chunk = self.chunk_kib * KIB;
        (0..self.members)
            .map(|i| {
                let extra = if self.unequal {
                    (i as u64 % 3) * chunk
                } else {
                    0
                };
                let data = self.rows * chunk + extra;
                [MIB, 2 * MIB, 4 * MIB]
                    .into_iter()
                    .map(|off| off + data)
                    .find(|&size| {
                        cairn_md::create::default_data_offset(
                            Sectors(size / 512),
                            Sectors(chunk / 512),
                        )
                        .0 * 512
                            + data
                            == size
                    })
                    .expect("a data offset of at most 4 MiB")
            })
            .collect()
    }

    pub fn create_options(&self) -> CreateOptions {
        let mut o = CreateOptions::new(self.level, "test");
        o.layout = self.layout;
        o.chunk = Some(Sectors(self.chunk_kib * 2));
        o.members_zeroed = true;
        o
    }
}

/// Fresh sparse members for `shape`.
pub fn mem_members(shape: &Shape) -> Vec<Arc<MemDisk>> {
    shape
        .member_bytes()
        .into_iter()
        .map(|b| Arc::new(MemDisk::new(b)))
        .collect()
}

pub fn dyn_members(m: &[Arc<MemDisk>]) -> Vec<Arc<dyn BlockDevice>> {
    m.iter()
        .map(|d| d.clone() as Arc<dyn BlockDevice>)
        .collect()
}

pub fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("disk{i}.img")).collect()
}

/// A new array of `shape` on fresh MemDisks.
pub fn create(shape: &Shape) -> (Array, Vec<Arc<MemDisk>>) {
    let m = mem_members(shape);
    let a = Array::create(dyn_members(&m), names(m.len()), &shape.create_options())
        .unwrap_or_else(|e| panic!("{}: create: {e}", shape.name()));
    (a, m)
}

/// Each member's data offset in bytes, from its superblock.
pub fn bases(members: &[Arc<MemDisk>]) -> Vec<u64> {
    members
        .iter()
        .map(|m| {
            let sb = Superblock::read_from(&**m, "m", cairn_md::FeaturePolicy::Supported)
                .expect("member superblock");
            sb.data_offset.0 * 512
        })
        .collect()
}

/// Every location holding array sector `s` (all copies).
pub fn locations(layout: &ArrayLayout, s: u64) -> Vec<Location> {
    let s = Sectors(s);
    match layout {
        ArrayLayout::Linear(l) => l.map(s).into_iter().collect(),
        ArrayLayout::Raid0(l) => l.map(s).into_iter().collect(),
        ArrayLayout::Raid1(l) => l.map(s).collect(),
        ArrayLayout::Raid10(l) => l.map(s).collect(),
        ArrayLayout::Parity(l) => l
            .map(s)
            .map(|p| Location {
                member: p.member,
                sector: p.sector,
            })
            .into_iter()
            .collect(),
    }
}

/// `u64` to `usize` (test sizes always fit).
pub fn us(v: u64) -> usize {
    usize::try_from(v).unwrap()
}

fn slice(img: &[u8], off: u64, len: u64) -> &[u8] {
    &img[us(off)..us(off + len)]
}

/// P and Q (Q only for RAID6) of one stripe of `array`, data in
/// syndrome-slot order.
pub fn stripe_parity(pl: &ParityLayout, array: &[u8], stripe: u64) -> (Vec<u8>, Option<Vec<u8>>) {
    let c = pl.chunk().0 * 512;
    let k = pl.data_disks() as u64;
    let map = pl.stripe_map(StripeNo(stripe));
    let chunk = |d: usize| slice(array, (stripe * k + d as u64) * c, c);
    let mut p = vec![0u8; us(c)];
    match map.q {
        None => {
            let data: Vec<&[u8]> = (0..pl.data_disks()).map(chunk).collect();
            fast().gen_p(&data, &mut p);
            (p, None)
        }
        Some(_) => {
            let zero = vec![0u8; us(c)];
            let data: Vec<&[u8]> = map
                .syndrome_order()
                .iter()
                .map(|o| match o {
                    Some(m) => chunk(map.data.iter().position(|x| x == m).unwrap()),
                    None => &zero[..],
                })
                .collect();
            let mut q = vec![0u8; us(c)];
            fast().gen_pq(&data, &mut p, &mut q);
            (p, Some(q))
        }
    }
}

/// Checks that every member image holds what the kernel's layout says for `array`:
/// data chunks (and every copy) where `layout` puts them; P the XOR of the stripe; Q the
/// syndrome in slot order. Members that are `None` are skipped.
pub fn check_members(
    layout: &ArrayLayout,
    images: &[Option<Vec<u8>>],
    bases: &[u64],
    array: &[u8],
) -> Result<(), String> {
    let differ = |what: String, got: &[u8], want: &[u8]| -> Result<(), String> {
        if got == want {
            return Ok(());
        }
        let i = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        Err(format!(
            "{what}: byte {i} differs (got {:#04x}, want {:#04x})",
            got[i], want[i]
        ))
    };
    match layout {
        ArrayLayout::Parity(pl) => {
            let c = pl.chunk().0 * 512;
            let k = pl.data_disks() as u64;
            let stripes = layout.array_sectors().0 * 512 / (c * k);
            for s in 0..stripes {
                let map = pl.stripe_map(StripeNo(s));
                for (d, &m) in map.data.iter().enumerate() {
                    if let Some(img) = &images[m] {
                        differ(
                            format!("stripe {s} data {d} on member {m}"),
                            slice(img, bases[m] + s * c, c),
                            slice(array, (s * k + d as u64) * c, c),
                        )?;
                    }
                }
                let (p, q) = stripe_parity(pl, array, s);
                if let Some(img) = &images[map.p] {
                    differ(
                        format!("stripe {s} P on member {}", map.p),
                        slice(img, bases[map.p] + s * c, c),
                        &p,
                    )?;
                }
                if let (Some(qm), Some(q)) = (map.q, q) {
                    if let Some(img) = &images[qm] {
                        differ(
                            format!("stripe {s} Q on member {qm}"),
                            slice(img, bases[qm] + s * c, c),
                            &q,
                        )?;
                    }
                }
            }
            Ok(())
        }
        _ => {
            let sectors = layout.array_sectors().0;
            for s in 0..sectors {
                for loc in locations(layout, s) {
                    if let Some(img) = &images[loc.member] {
                        differ(
                            format!(
                                "array sector {s} on member {} sector {}",
                                loc.member, loc.sector.0
                            ),
                            slice(img, bases[loc.member] + loc.sector.0 * 512, 512),
                            slice(array, s * 512, 512),
                        )?;
                    }
                }
            }
            Ok(())
        }
    }
}

/// Recomputes the data areas of the `missing` members from the other members' images
/// alone (a rebuild): parity levels through the scalar recovery maths, mirrors from
/// another copy. `images[m]` for a missing member is its old image, returned with the
/// recomputed bytes written over it.
pub fn recompute_members(
    layout: &ArrayLayout,
    images: &mut [Vec<u8>],
    bases: &[u64],
    missing: &[usize],
) {
    match layout {
        ArrayLayout::Parity(pl) => {
            let c = pl.chunk().0 * 512;
            let n = pl.raid_disks();
            for s in 0..pl.stripes() {
                let map = pl.stripe_map(StripeNo(s));
                let mut rows: Vec<Vec<u8>> = (0..n)
                    .map(|m| {
                        if missing.contains(&m) {
                            vec![0u8; us(c)]
                        } else {
                            slice(&images[m], bases[m] + s * c, c).to_vec()
                        }
                    })
                    .collect();
                let mut order: Vec<Option<usize>> = match map.q {
                    None => map.data.iter().map(|&m| Some(m)).collect(),
                    Some(_) => map.syndrome_order(),
                };
                order.push(Some(map.p));
                order.extend(map.q.map(Some));
                let failed: Vec<usize> = missing
                    .iter()
                    .map(|&m| order.iter().position(|&o| o == Some(m)).unwrap())
                    .collect();
                let mut zeros: Vec<Vec<u8>> = order
                    .iter()
                    .filter(|o| o.is_none())
                    .map(|_| vec![0u8; us(c)])
                    .collect();
                {
                    let mut z = zeros.iter_mut();
                    let mut taken: Vec<Option<&mut [u8]>> =
                        rows.iter_mut().map(|r| Some(r.as_mut_slice())).collect();
                    let mut blocks: Vec<&mut [u8]> = order
                        .iter()
                        .map(|o| match o {
                            Some(m) => taken[*m].take().unwrap(),
                            None => z.next().unwrap().as_mut_slice(),
                        })
                        .collect();
                    if map.q.is_none() {
                        assert_eq!(failed.len(), 1, "RAID4/5 rebuilds one member");
                        scalar().recover_p(&mut blocks, failed[0]).unwrap();
                    } else {
                        scalar().recover_pq(&mut blocks, &failed).unwrap();
                    }
                }
                for &m in missing {
                    let at = us(bases[m] + s * c);
                    images[m][at..at + us(c)].copy_from_slice(&rows[m]);
                }
            }
        }
        _ => {
            for s in 0..layout.array_sectors().0 {
                let locs = locations(layout, s);
                let Some(src) = locs.iter().find(|l| !missing.contains(&l.member)) else {
                    panic!("array sector {s} has no surviving copy");
                };
                let from = slice(
                    &images[src.member],
                    bases[src.member] + src.sector.0 * 512,
                    512,
                )
                .to_vec();
                for l in locs.iter().filter(|l| missing.contains(&l.member)) {
                    let at = us(bases[l.member] + l.sector.0 * 512);
                    images[l.member][at..at + 512].copy_from_slice(&from);
                }
            }
        }
    }
}

/// Reads the whole array.
pub fn read_all(a: &dyn BlockDevice) -> Vec<u8> {
    let size = a.geometry().size;
    let mut v = vec![0u8; us(size)];
    let step = 4 * MIB;
    let mut pos = 0;
    while pos < size {
        let n = step.min(size - pos);
        a.read_at(&mut v[us(pos)..us(pos + n)], pos)
            .unwrap_or_else(|e| panic!("read of {n} at {pos}: {e}"));
        pos += n;
    }
    v
}

/// Member images under write logs, and the same devices as the array takes them.
pub type Logged = (
    Vec<Arc<cairn_block::testkit::LogWritesDisk<MemDisk>>>,
    Vec<Arc<dyn BlockDevice>>,
);

/// Copies of `images` under `LogWritesDisk`s sharing `clock` (crash tests).
pub fn logged_members(
    images: impl IntoIterator<Item = Vec<u8>>,
    clock: &cairn_block::testkit::LogClock,
) -> Logged {
    use cairn_block::testkit::{LogOptions, LogWritesDisk};
    let logged: Vec<Arc<LogWritesDisk<MemDisk>>> = images
        .into_iter()
        .map(|img| {
            Arc::new(
                LogWritesDisk::with_options(
                    MemDisk::from_bytes(&img),
                    LogOptions::with_clock(clock),
                )
                .expect("a log over a fresh MemDisk"),
            )
        })
        .collect();
    let devs = logged
        .iter()
        .map(|d| d.clone() as Arc<dyn BlockDevice>)
        .collect();
    (logged, devs)
}
