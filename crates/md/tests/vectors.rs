//! Known answers from `../shared/vectors/raid/` (README.md there says what each file
//! holds): the left-symmetric member maps and sector examples, the GF(2^8) tables, the
//! P/Q syndrome KAT, and three complete small arrays whose member images were
//! cross-checked with mdadm's own restripe code.
//!
//! The vectors live next to the repository (`/work/shared/vectors`); set
//! `CAIRN_VECTORS` to their directory when they are elsewhere.

use std::collections::BTreeMap;
use std::path::PathBuf;

use cairn_md::layout::{ParityLayout, StripeRole};
use cairn_md::parity::{gf, Impl, Parity};
use cairn_md::{Level, Sectors, StripeNo};
use serde_json::Value;

fn vectors_dir() -> PathBuf {
    let dir = std::env::var_os("CAIRN_VECTORS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/vectors")
        });
    assert!(
        dir.join("raid").is_dir(),
        "RAID vectors not found at {} — set CAIRN_VECTORS to the shared vectors directory",
        dir.display()
    );
    dir.join("raid")
}

fn load(name: &str) -> Value {
    let path = vectors_dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn u(v: &Value) -> u64 {
    v.as_u64()
        .unwrap_or_else(|| panic!("not an unsigned integer: {v}"))
}

fn us(v: &Value) -> usize {
    usize::try_from(u(v)).unwrap()
}

fn hex(v: &Value) -> Vec<u8> {
    let s = v.as_str().unwrap();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn engines() -> Vec<Parity> {
    let v: Vec<Parity> = Impl::available()
        .into_iter()
        .filter_map(Parity::with_impl)
        .collect();
    eprintln!(
        "parity kernels under test: {:?}",
        v.iter()
            .map(|p| p.implementation().name())
            .collect::<Vec<_>>()
    );
    v
}

/// Exponent map `{"member": e}` as (member, e) pairs.
fn exponents(v: &Value) -> BTreeMap<usize, u8> {
    v.as_object()
        .unwrap()
        .iter()
        .map(|(k, e)| (k.parse().unwrap(), u8::try_from(u(e)).unwrap()))
        .collect()
}

#[test]
fn raid_layout_maps() {
    let doc = load("raid_layout_maps.json");
    let tables = doc["tables"].as_array().unwrap();
    assert_eq!(tables.len(), 4);
    for t in tables {
        let level = Level::from_raw(i32::try_from(u(&t["level"])).unwrap()).unwrap();
        let n = us(&t["raid_disks"]);
        let chunk = Sectors(1024);
        // Big enough for the sector examples (sector 123456789).
        let l = ParityLayout::new(
            level,
            u32::try_from(u(&t["layout"])).unwrap(),
            n,
            chunk,
            Sectors(1 << 40),
        )
        .unwrap();
        assert_eq!(l.data_disks(), us(&t["data_disks"]));
        let what = format!("{level} {} members", n);
        for st in t["stripes"].as_array().unwrap() {
            let s = StripeNo(u(&st["stripe"]));
            let m = l.stripe_map(s);
            let data: Vec<usize> = st["data_members"]
                .as_array()
                .unwrap()
                .iter()
                .map(us)
                .collect();
            assert_eq!(m.data, data, "{what} stripe {}", s.0);
            assert_eq!(m.p, us(&st["p_member"]), "{what} stripe {}", s.0);
            assert_eq!(m.q, st.get("q_member").map(us), "{what} stripe {}", s.0);
            if let Some(e) = st.get("q_coeff_exponent_by_member") {
                let want = exponents(e);
                let got: BTreeMap<usize, u8> = m
                    .data
                    .iter()
                    .copied()
                    .zip(m.q_exponent.iter().copied())
                    .collect();
                assert_eq!(got, want, "{what} stripe {} Q exponents", s.0);
            }
            // The picture: what each member holds.
            let first = u(&st["first_chunk"]);
            for (member, label) in st["members"].as_array().unwrap().iter().enumerate() {
                let want = label.as_str().unwrap();
                let got = match m.role_of(member) {
                    StripeRole::P => "P".to_string(),
                    StripeRole::Q => "Q".to_string(),
                    StripeRole::Data(i) => format!("D{}", first + u64::try_from(i).unwrap()),
                };
                assert_eq!(got, want, "{what} stripe {} member {member}", s.0);
            }
        }
        let examples = t["sector_examples_chunk_1024_sectors_data_offset_0"]
            .as_array()
            .unwrap();
        assert!(!examples.is_empty());
        for ex in examples {
            let s = Sectors(u(&ex["array_sector"]));
            let loc = l.map(s).unwrap();
            assert_eq!(
                loc.stripe,
                StripeNo(u(&ex["stripe"])),
                "{what} sector {}",
                s.0
            );
            assert_eq!(loc.member, us(&ex["member"]), "{what} sector {}", s.0);
            assert_eq!(
                loc.sector,
                Sectors(u(&ex["member_sector"])),
                "{what} sector {}",
                s.0
            );
            let (p, q) = l.parity_members(loc.stripe);
            assert_eq!(p, us(&ex["p_member"]), "{what} sector {}", s.0);
            assert_eq!(q, ex.get("q_member").map(us), "{what} sector {}", s.0);
        }
    }
}

#[test]
fn gf_tables_and_samples() {
    let doc = load("raid6_pq_kat.json");
    let g = &doc["gf"];
    assert_eq!(
        g["polynomial"].as_str().unwrap().split(' ').next(),
        Some("0x11d")
    );
    let exp: Vec<u8> = g["exp_table"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| u8::try_from(u(v)).unwrap())
        .collect();
    assert_eq!(exp.len(), 255);
    assert_eq!(&gf::EXP[..255], exp.as_slice());
    assert_eq!(
        format!("{:#x}", gf::inv(2)),
        g["inverse_of_2"].as_str().unwrap()
    );
    for s in g["mul_samples_a_b_product"].as_array().unwrap() {
        let [a, b, prod] = [0, 1, 2].map(|i| u8::try_from(u(&s[i])).unwrap());
        assert_eq!(gf::mul(a, b), prod, "{a}·{b}");
    }
}

/// `block` repeated `times` times: the syndrome is bytewise, so tiling the KAT's 16-byte
/// blocks tiles the expected P and Q, and lets the SIMD kernels (which need 64–256 bytes)
/// run on known answers, tail included.
fn tile(block: &[u8], times: usize) -> Vec<u8> {
    block.repeat(times)
}

#[test]
fn syndrome_kat() {
    let doc = load("raid6_pq_kat.json");
    let k = &doc["syndrome_kat"];
    let data: Vec<Vec<u8>> = k["data_hex"].as_array().unwrap().iter().map(hex).collect();
    let p_want = hex(&k["p_hex"]);
    let q_want = hex(&k["q_hex"]);
    for engine in engines() {
        for times in [1, 4, 16, 17, 259] {
            let d: Vec<Vec<u8>> = data.iter().map(|b| tile(b, times)).collect();
            let refs: Vec<&[u8]> = d.iter().map(Vec::as_slice).collect();
            let mut p = vec![0xaa; 16 * times];
            let mut q = vec![0x55; 16 * times];
            engine.gen_pq(&refs, &mut p, &mut q);
            assert_eq!(
                p,
                tile(&p_want, times),
                "{} P x{times}",
                engine.implementation().name()
            );
            assert_eq!(
                q,
                tile(&q_want, times),
                "{} Q x{times}",
                engine.implementation().name()
            );
            let mut p2 = vec![0; 16 * times];
            engine.gen_p(&refs, &mut p2);
            assert_eq!(p2, p);
        }
    }
}

/// Builds every member image of a stripe KAT array from its data with cairn's layout and
/// parity, compares with the vector, then loses every 1 (RAID5) or 1–2 (RAID6) members
/// and rebuilds them.
#[test]
fn stripe_kats() {
    let doc = load("raid6_pq_kat.json");
    let kats = doc["stripe_kats"].as_array().unwrap();
    assert_eq!(kats.len(), 3);
    for kat in kats {
        let name = kat["name"].as_str().unwrap();
        let level = Level::from_raw(i32::try_from(u(&kat["level"])).unwrap()).unwrap();
        let n = us(&kat["raid_disks"]);
        let chunk_bytes = us(&kat["chunk_bytes"]);
        assert_eq!(u(&kat["data_offset_bytes"]), 0);
        let stripes = u(&kat["stripes"]);
        // The layout works in sectors; a 16-byte chunk is below one, so use any legal
        // chunk for placement (placement depends only on stripe and index) and bytes
        // for content.
        let l = ParityLayout::new(
            level,
            u32::try_from(u(&kat["layout"])).unwrap(),
            n,
            Sectors(8),
            Sectors(8 * stripes),
        )
        .unwrap();
        let array: Vec<Vec<u8>> = kat["array_data_hex"]
            .as_array()
            .unwrap()
            .iter()
            .map(hex)
            .collect();
        // The documented data rule.
        for (c, chunk) in array.iter().enumerate() {
            assert_eq!(chunk.len(), chunk_bytes);
            for (j, &b) in chunk.iter().enumerate() {
                assert_eq!(
                    usize::from(b),
                    (31 * c + 7 * j + 1) % 256,
                    "{name} data rule"
                );
            }
        }
        let members: Vec<Vec<Vec<u8>>> = kat["member_hex"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m.as_array().unwrap().iter().map(hex).collect())
            .collect();
        assert_eq!(members.len(), n);
        let per_stripe = kat["per_stripe"].as_array().unwrap();

        for engine in engines() {
            let ename = engine.implementation().name();
            for s in 0..stripes {
                let stripe = StripeNo(s);
                let m = l.stripe_map(stripe);
                let ps = &per_stripe[usize::try_from(s).unwrap()];
                assert_eq!(u(&ps["stripe"]), s);
                let want_data: Vec<usize> = ps["data_members_in_logical_order"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(us)
                    .collect();
                assert_eq!(m.data, want_data, "{name} stripe {s}");
                assert_eq!(m.p, us(&ps["p_member"]), "{name} stripe {s}");
                assert_eq!(m.q, ps.get("q_member").map(us), "{name} stripe {s}");
                if let Some(e) = ps.get("q_coefficient_exponent_by_member") {
                    let got: BTreeMap<usize, u8> = m
                        .data
                        .iter()
                        .copied()
                        .zip(m.q_exponent.iter().copied())
                        .collect();
                    assert_eq!(got, exponents(e), "{name} stripe {s} Q exponents");
                }

                // Tile so the SIMD kernels see the same bytes (and a tail).
                let times = 67;
                let len = chunk_bytes * times;
                let first = usize::try_from(s).unwrap() * l.data_disks();
                let mut image: Vec<Vec<u8>> = vec![Vec::new(); n];
                for (i, &member) in m.data.iter().enumerate() {
                    image[member] = tile(&array[first + i], times);
                }
                let mut p = vec![0; len];
                if let Some(qm) = m.q {
                    let order = m.syndrome_order();
                    let zero = vec![0; len];
                    let slots: Vec<&[u8]> = order
                        .iter()
                        .map(|o| o.map_or(zero.as_slice(), |mm| image[mm].as_slice()))
                        .collect();
                    let mut q = vec![0; len];
                    engine.gen_pq(&slots, &mut p, &mut q);
                    image[qm] = q;
                } else {
                    let data: Vec<&[u8]> = m.data.iter().map(|&mm| image[mm].as_slice()).collect();
                    engine.gen_p(&data, &mut p);
                }
                image[m.p] = p;
                for (member, img) in image.iter().enumerate() {
                    let want = tile(&members[member][usize::try_from(s).unwrap()], times);
                    assert_eq!(img, &want, "{ename}: {name} stripe {s} member {member}");
                }

                // Lose members and rebuild them from the rest.
                let mut sets: Vec<Vec<usize>> = (0..n).map(|a| vec![a]).collect();
                if level == Level::Raid6 {
                    for a in 0..n {
                        for b in a + 1..n {
                            sets.push(vec![a, b]);
                        }
                    }
                }
                for lost in sets {
                    let mut blocks: Vec<Vec<u8>> = image.clone();
                    for &x in &lost {
                        blocks[x].fill(0xe7);
                    }
                    // Blocks in recovery order: syndrome slots, then P, then Q.
                    let order: Vec<Option<usize>> = if m.q.is_some() {
                        m.syndrome_order()
                    } else {
                        m.data.iter().map(|&d| Some(d)).collect()
                    };
                    let mut zeros: Vec<Vec<u8>> = Vec::new();
                    let mut idx_of_member = vec![usize::MAX; n];
                    let mut slots: Vec<usize> = Vec::new(); // member per recovery index (or MAX)
                    for o in &order {
                        match o {
                            Some(mm) => {
                                idx_of_member[*mm] = slots.len();
                                slots.push(*mm);
                            }
                            None => {
                                zeros.push(vec![0; len]);
                                slots.push(usize::MAX);
                            }
                        }
                    }
                    idx_of_member[m.p] = slots.len();
                    slots.push(m.p);
                    if let Some(qm) = m.q {
                        idx_of_member[qm] = slots.len();
                        slots.push(qm);
                    }
                    let failed: Vec<usize> = lost.iter().map(|&x| idx_of_member[x]).collect();
                    {
                        let mut zero_iter = zeros.iter_mut();
                        let mut member_refs: Vec<Option<&mut [u8]>> =
                            blocks.iter_mut().map(|b| Some(b.as_mut_slice())).collect();
                        let mut refs: Vec<&mut [u8]> = slots
                            .iter()
                            .map(|&mm| {
                                if mm == usize::MAX {
                                    zero_iter.next().unwrap().as_mut_slice()
                                } else {
                                    member_refs[mm].take().unwrap()
                                }
                            })
                            .collect();
                        if m.q.is_some() {
                            engine.recover_pq(&mut refs, &failed).unwrap();
                        } else {
                            engine.recover_p(&mut refs, failed[0]).unwrap();
                        }
                    }
                    assert_eq!(
                        blocks, image,
                        "{ename}: {name} stripe {s} rebuilding members {lost:?}"
                    );
                }
            }
        }
    }
}
