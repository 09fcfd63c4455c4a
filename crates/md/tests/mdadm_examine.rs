//! cairn's superblocks against the real `mdadm --examine` (verification.md §2.1).
//!
//! For every shape in the table: compute the superblocks with `create`, write them at
//! byte 4096 of sparse member files, and check that mdadm
//! * prints `Checksum : ... - correct`,
//! * shows the level, layout, chunk, raid devices, role, array UUID, sizes, offsets and
//!   events cairn intended (asserted field by field from values this test computes on
//!   its own),
//! * prints, line for line, what `Examine`'s Display prints (so `cairn md examine`
//!   matches mdadm),
//! * agrees in `--export` and `--brief` form that the members belong together;
//!
//! and that cairn parses back exactly what it wrote. Without mdadm the test says SKIP.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use cairn_md::examine::Examine;
use cairn_md::{
    create, BitmapChoice, CreateParams, Level, MdTime, Raid10Layout, Sectors, Superblock, Uuid,
};

const MIB: u64 = 2048;
const GIB: u64 = 1024 * MIB;

fn mdadm() -> Option<PathBuf> {
    for p in ["/usr/sbin/mdadm", "/sbin/mdadm", "/usr/bin/mdadm"] {
        if Path::new(p).exists() {
            return Some(PathBuf::from(p));
        }
    }
    let out = Command::new("sh")
        .args(["-c", "command -v mdadm"])
        .output()
        .ok()?;
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| PathBuf::from(s))
}

struct Shape {
    level: Level,
    layout: Option<u32>,
    chunk_kib: Option<u64>,
    sizes: Vec<u64>,
    clean: bool,
    bitmap: BitmapChoice,
}

fn shape(level: Level, layout: Option<u32>, chunk_kib: Option<u64>, sizes: &[u64]) -> Shape {
    Shape {
        level,
        layout,
        chunk_kib,
        sizes: sizes.to_vec(),
        clean: true,
        bitmap: BitmapChoice::None,
    }
}

fn with_bitmap(mut s: Shape, chunk_bytes: Option<u64>, clean: bool) -> Shape {
    s.bitmap = BitmapChoice::Internal { chunk_bytes };
    s.clean = clean;
    s
}

fn shapes() -> Vec<Shape> {
    let m64 = 64 * MIB;
    let mut v = vec![
        // RAID0: equal and unequal (multi-zone) members, both layouts, several chunks.
        shape(Level::Raid0, None, None, &[m64, m64]),
        shape(Level::Raid0, None, Some(64), &[m64, 96 * MIB, 96 * MIB]),
        shape(
            Level::Raid0,
            Some(2),
            Some(4),
            &[m64, 80 * MIB, 96 * MIB, 96 * MIB],
        ),
        shape(Level::Raid0, Some(2), Some(4096), &[m64; 5]),
        // RAID1, 1..3 copies, uneven sizes.
        shape(Level::Raid1, None, None, &[m64, m64]),
        shape(Level::Raid1, None, None, &[m64 + 300, 70 * MIB, m64 + 1000]),
        shape(Level::Raid1, None, None, &[m64]),
        // RAID4.
        shape(Level::Raid4, None, None, &[m64; 3]),
        shape(Level::Raid4, None, Some(128), &[m64; 5]),
        // Linear, with and without rounding.
        shape(Level::Linear, None, None, &[m64, 80 * MIB]),
        shape(Level::Linear, None, Some(64), &[m64 + 77, 80 * MIB, m64]),
        // Bigger members: data offsets 18432 (10 GiB) and 264192 (300 GiB, bad-block log
        // after a 128 KiB bitmap area).
        shape(Level::Raid5, None, None, &[10 * GIB; 3]),
        shape(Level::Raid6, None, Some(64), &[300 * GIB; 4]),
        // Resync pending.
        Shape {
            level: Level::Raid6,
            layout: None,
            chunk_kib: Some(256),
            sizes: vec![m64; 4],
            clean: false,
            bitmap: BitmapChoice::None,
        },
        // Internal bitmaps (mdadm reads the bitmap header and drops feature bit 1 when
        // its magic or UUID is wrong, so "Feature Map : 0x1" checks it too).
        with_bitmap(
            shape(Level::Raid5, None, Some(64), &[m64; 3]),
            Some(64 << 10),
            false,
        ),
        with_bitmap(shape(Level::Raid1, None, None, &[m64; 2]), None, true),
        with_bitmap(shape(Level::Raid6, None, None, &[10 * GIB; 4]), None, false),
        with_bitmap(
            shape(Level::Raid10, Some(0x102), Some(64), &[m64; 3]),
            Some(1 << 20),
            true,
        ),
        with_bitmap(shape(Level::Raid4, None, None, &[300 * GIB; 3]), None, true),
    ];
    for n in [3, 4, 5] {
        for layout in 0..=5 {
            v.push(shape(
                Level::Raid5,
                Some(layout),
                Some([64, 512][usize::try_from(layout).unwrap() % 2]),
                &vec![m64; n],
            ));
        }
    }
    v.push(shape(Level::Raid5, None, Some(4), &[m64; 2]));
    for n in [4, 5, 6] {
        for layout in [0, 1, 2, 3, 4, 5, 8, 9, 10, 16, 17, 18, 19, 20] {
            v.push(shape(
                Level::Raid6,
                Some(layout),
                Some([64, 512, 4][usize::try_from(layout).unwrap() % 3]),
                &vec![m64; n],
            ));
        }
    }
    for (n, l) in [
        (2, "n2"),
        (3, "n2"),
        (4, "n2"),
        (5, "n2"),
        (3, "n3"),
        (2, "f2"),
        (4, "f2"),
        (5, "f3"),
        (3, "o2"),
        (4, "o3"),
        (6, "n2"),
    ] {
        let word = Raid10Layout::parse(l).unwrap().to_raw();
        v.push(shape(
            Level::Raid10,
            Some(word),
            Some([64, 512, 1024][n % 3]),
            &vec![m64; n],
        ));
    }
    v
}

/// "Key : value" lines of mdadm's output (the first occurrence of each key).
fn fields(text: &str) -> BTreeMap<String, String> {
    let mut m = BTreeMap::new();
    for line in text.lines() {
        if let Some((k, v)) = line.split_once(" : ") {
            m.entry(k.trim().to_string())
                .or_insert_with(|| v.trim_end().to_string());
        }
    }
    m
}

fn run(cmd: &Path, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(cmd)
        .args(args)
        .env("TZ", "UTC")
        .output()
        .expect("run mdadm");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// What this test expects mdadm to print for the layout line, worked out from the
/// shape rather than from cairn's own naming code.
fn expected_layout(level: Level, word: u32) -> Option<String> {
    let r56 = [
        (0, "left-asymmetric"),
        (1, "right-asymmetric"),
        (2, "left-symmetric"),
        (3, "right-symmetric"),
        (4, "parity-first"),
        (5, "parity-last"),
        (8, "ddf-zero-restart"),
        (9, "ddf-N-restart"),
        (10, "ddf-N-continue"),
        (16, "left-asymmetric-6"),
        (17, "right-asymmetric-6"),
        (18, "left-symmetric-6"),
        (19, "right-symmetric-6"),
        (20, "parity-first-6"),
    ];
    match level {
        Level::Raid5 | Level::Raid6 => r56
            .iter()
            .find(|(w, _)| *w == word)
            .map(|(_, n)| n.to_string()),
        Level::Raid0 => Some(if word == 1 { "original" } else { "alternate" }.to_string()),
        Level::Raid10 => {
            let (near, far, off) = (word & 0xff, (word >> 8) & 0xff, word & 0x10000 != 0);
            Some(if far == 1 {
                format!("near={near}")
            } else {
                format!("{}={far}", if off { "offset" } else { "far" })
            })
        }
        _ => None,
    }
}

fn data_disks(level: Level, n: u64, layout: u32) -> (u64, u64) {
    match level {
        Level::Raid1 => (1, 1),
        Level::Raid4 | Level::Raid5 => (n - 1, 1),
        Level::Raid6 => (n - 2, 1),
        Level::Raid10 => (
            n,
            u64::from(layout & 0xff) * u64::from((layout >> 8) & 0xff),
        ),
        _ => (0, 1),
    }
}

fn write_member(path: &Path, member_sectors: u64, sb: &[u8]) {
    let mut f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .read(true)
        .open(path)
        .unwrap();
    f.set_len(member_sectors * 512).unwrap();
    f.seek(SeekFrom::Start(4096)).unwrap();
    f.write_all(sb).unwrap();
    f.sync_all().unwrap();
}

fn write_at(path: &Path, off: u64, bytes: &[u8]) {
    let mut f = OpenOptions::new().write(true).open(path).unwrap();
    f.seek(SeekFrom::Start(off)).unwrap();
    f.write_all(bytes).unwrap();
    f.sync_all().unwrap();
}

fn read_sb(path: &Path) -> Vec<u8> {
    let mut f = File::open(path).unwrap();
    f.seek(SeekFrom::Start(4096)).unwrap();
    let mut b = vec![0; 4096];
    f.read_exact(&mut b).unwrap();
    b
}

#[test]
fn mdadm_examine_accepts_every_shape() {
    let Some(mdadm) = mdadm() else {
        eprintln!("SKIP mdadm_examine_accepts_every_shape: mdadm is not installed (apt-get install mdadm)");
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("mdadm_examine-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let shapes = shapes();
    let mut checked_members = 0;
    for (si, s) in shapes.iter().enumerate() {
        let n = s.sizes.len();
        let uuid = Uuid(std::array::from_fn(|i| {
            u8::try_from((si * 37 + i * 11) % 256).unwrap()
        }));
        let params = CreateParams {
            level: s.level,
            layout: s.layout,
            chunk: s.chunk_kib.map(|k| Sectors(k * 2)),
            member_sectors: s.sizes.iter().map(|&x| Sectors(x)).collect(),
            name: format!("shape{si}"),
            homehost: Some("cairn-test".into()),
            uuid,
            device_uuids: (0..n)
                .map(|i| {
                    Uuid(std::array::from_fn(|k| {
                        u8::try_from((i * 91 + k * 7 + si) % 256).unwrap()
                    }))
                })
                .collect(),
            ctime: MdTime::from_secs(1_700_000_000 + u64::try_from(si).unwrap()),
            assume_clean: s.clean,
            bitmap: s.bitmap,
        };
        let created = create(&params).unwrap_or_else(|e| panic!("shape {si} {:?}: {e}", s.level));
        let sb0 = &created.superblocks[0];
        let paths: Vec<PathBuf> = (0..n)
            .map(|i| dir.join(format!("s{si}_m{i}.img")))
            .collect();
        for (i, sb) in created.superblocks.iter().enumerate() {
            write_member(&paths[i], s.sizes[i], &sb.encode().unwrap());
            if let Some(area) = created.bitmap_area() {
                write_at(&paths[i], created.bitmap_byte_offset(), &area);
            }
        }
        let what = format!(
            "shape {si}: {} layout {:#x} chunk {}K x{n}",
            s.level,
            sb0.layout,
            sb0.chunk.0 / 2
        );

        for (i, sb) in created.superblocks.iter().enumerate() {
            let path = paths[i].to_str().unwrap();
            let (code, out, err) = run(&mdadm, &["--examine", path]);
            assert_eq!(code, 0, "{what} member {i}: mdadm exit {code}: {err}{out}");
            let f = fields(&out);
            let get = |k: &str| {
                f.get(k)
                    .cloned()
                    .unwrap_or_else(|| panic!("{what} member {i}: no {k:?} in\n{out}"))
            };
            assert!(
                get("Checksum").ends_with("- correct"),
                "{what} member {i}: {}",
                get("Checksum")
            );
            assert_eq!(get("Checksum"), format!("{:x} - correct", sb.checksum()));
            assert_eq!(get("Raid Level"), s.level.name(), "{what}");
            assert_eq!(get("Raid Devices"), n.to_string(), "{what}");
            assert_eq!(get("Device Role"), format!("Active device {i}"), "{what}");
            assert_eq!(get("Array UUID"), uuid.to_string(), "{what}");
            assert_eq!(
                get("Device UUID"),
                params.device_uuids[i].to_string(),
                "{what}"
            );
            assert_eq!(
                get("Name").split("  (local").next().unwrap(),
                format!("cairn-test:shape{si}"),
                "{what}"
            );
            assert_eq!(get("Version"), "1.2");
            assert_eq!(get("Events"), "1");
            assert_eq!(
                get("State"),
                if s.clean || s.level == Level::Raid0 || s.level == Level::Linear {
                    "clean"
                } else {
                    "active"
                },
                "{what}"
            );
            assert_eq!(
                get("Array State"),
                format!(
                    "{} ('A' == active, '.' == missing, 'R' == replacing)",
                    "A".repeat(n)
                )
            );
            assert_eq!(get("Super Offset"), "8 sectors");
            assert_eq!(
                get("Data Offset"),
                format!("{} sectors", sb.data_offset.0),
                "{what}"
            );
            let data_size = s.sizes[i] - sb.data_offset.0;
            assert!(
                get("Avail Dev Size").starts_with(&format!("{data_size} sectors")),
                "{what}"
            );
            assert_eq!(
                get("Feature Map"),
                if s.level == Level::Raid0 {
                    "0x1000"
                } else if s.bitmap != BitmapChoice::None {
                    "0x1"
                } else {
                    "0x0"
                },
                "{what}"
            );
            match expected_layout(s.level, sb.layout) {
                Some(l) => assert_eq!(get("Layout").trim(), l, "{what}"),
                None => assert!(!f.contains_key("Layout"), "{what}: unexpected layout line"),
            }
            match s.level {
                Level::Raid1 => assert!(!f.contains_key("Chunk Size")),
                Level::Linear => assert_eq!(
                    get("Rounding"),
                    format!("{}K", s.chunk_kib.unwrap_or(0)),
                    "{what}"
                ),
                _ => assert_eq!(
                    get("Chunk Size"),
                    format!("{}K", s.chunk_kib.unwrap_or(512)),
                    "{what}"
                ),
            }
            // Sizes, from this test's own arithmetic.
            let (dd, den) = data_disks(s.level, u64::try_from(n).unwrap(), sb.layout);
            if dd > 0 {
                let min_free = s.sizes.iter().map(|x| x - sb.data_offset.0).min().unwrap();
                let unit = match s.level {
                    Level::Raid1 => 128,
                    _ => s.chunk_kib.unwrap_or(512) * 2,
                };
                let comp = min_free / unit * unit;
                assert_eq!(sb.size.0, comp, "{what}: component size");
                let kib = comp * 512 * dd / den / 1024;
                assert!(
                    get("Array Size").starts_with(&format!("{kib} KiB")),
                    "{what}: {}",
                    get("Array Size")
                );
                if comp != data_size {
                    assert!(
                        get("Used Dev Size").starts_with(&format!("{comp} sectors")),
                        "{what}"
                    );
                } else {
                    assert!(!f.contains_key("Used Dev Size"), "{what}");
                }
            } else {
                assert!(!f.contains_key("Array Size"), "{what}");
            }

            // Line for line, what cairn's examine renders.
            let ours = Examine::new(sb, Some(Sectors(s.sizes[i]))).to_string();
            let theirs: String = out
                .lines()
                .skip(1)
                .map(|l| match l.split_once("  (local to host") {
                    Some((a, _)) => a.to_string(),
                    None => l.to_string(),
                })
                .map(|l| l + "\n")
                .collect();
            assert_eq!(out.lines().next().unwrap(), format!("{path}:"));
            assert_eq!(
                ours, theirs,
                "{what} member {i}: cairn's examine differs from mdadm's"
            );

            // --export.
            let (code, exp, _) = run(&mdadm, &["--examine", "--export", path]);
            assert_eq!(code, 0);
            let e: BTreeMap<&str, &str> = exp.lines().filter_map(|l| l.split_once('=')).collect();
            assert_eq!(e["MD_LEVEL"], s.level.name());
            assert_eq!(e["MD_DEVICES"], n.to_string());
            assert_eq!(e["MD_NAME"], format!("cairn-test:shape{si}"));
            assert_eq!(e["MD_UUID"], uuid.to_string());
            assert_eq!(e["MD_DEV_UUID"], params.device_uuids[i].to_string());
            assert_eq!(e["MD_EVENTS"], "1");
            assert_eq!(e["MD_UPDATE_TIME"], params.ctime.secs().to_string());

            // Read back.
            let bytes = read_sb(&paths[i]);
            let back = Superblock::parse(&bytes, path).unwrap();
            assert_eq!(&back, sb, "{what} member {i}: parse(encode(sb)) != sb");
            back.check_member_size(Sectors(s.sizes[i]), path).unwrap();
            checked_members += 1;
        }

        // The members belong to one array.
        let args: Vec<&str> = ["--examine", "--brief"]
            .into_iter()
            .chain(paths.iter().map(|p| p.to_str().unwrap()))
            .collect();
        let (code, brief, _) = run(&mdadm, &args);
        assert_eq!(code, 0);
        let lines: Vec<&str> = brief.lines().collect();
        assert_eq!(lines.len(), 1, "{what}: {brief}");
        assert!(
            lines[0].contains(&format!("UUID={uuid}")) && lines[0].contains("metadata=1.2"),
            "{what}: {brief}"
        );
        assert!(
            lines[0].contains(&format!("/dev/md/shape{si}")),
            "{what}: {brief}"
        );

        eprintln!(
            "ok {what}: data_offset {} size {} array {} sectors, checksum(m0) {:08x}",
            sb0.data_offset.0,
            sb0.size.0,
            created.array_sectors.0,
            sb0.checksum()
        );
        for p in &paths {
            std::fs::remove_file(p).unwrap();
        }
    }
    eprintln!(
        "mdadm --examine: {} shapes, {checked_members} members, all '- correct'",
        shapes.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A flipped byte: mdadm reports the checksum as wrong and cairn refuses the member,
/// naming it and the field.
#[test]
fn mdadm_and_cairn_agree_on_a_bad_checksum() {
    let Some(mdadm) = mdadm() else {
        eprintln!("SKIP mdadm_and_cairn_agree_on_a_bad_checksum: mdadm is not installed");
        return;
    };
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("mdadm_badsum-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let params = CreateParams {
        level: Level::Raid5,
        layout: None,
        chunk: None,
        member_sectors: vec![Sectors(64 * MIB); 3],
        name: "bad".into(),
        homehost: None,
        uuid: Uuid([7; 16]),
        device_uuids: vec![Uuid([1; 16]), Uuid([2; 16]), Uuid([3; 16])],
        ctime: MdTime::from_secs(1_700_000_000),
        assume_clean: true,
        bitmap: BitmapChoice::None,
    };
    let created = create(&params).unwrap();
    let mut bytes = created.superblocks[0].encode().unwrap();
    bytes[100] ^= 0x01; // reshape_position
    let path = dir.join("bad.img");
    write_member(&path, 64 * MIB, &bytes);
    let (code, out, _) = run(&mdadm, &["--examine", path.to_str().unwrap()]);
    assert_eq!(code, 0, "mdadm exits 0 even on a bad checksum");
    let sum = fields(&out)["Checksum"].clone();
    assert!(sum.contains("- expected"), "{sum}");
    let e = Superblock::parse(&read_sb(&path), "bad.img").unwrap_err();
    assert_eq!(e.kind(), cairn_block::ErrorKind::Corrupt);
    let msg = e.to_string();
    assert!(msg.contains("bad.img") && msg.contains("sb_csum"), "{msg}");
    // mdadm's "expected" value is the checksum cairn computes.
    let computed = cairn_md::ondisk::checksum(&bytes, 128);
    assert!(
        sum.ends_with(&format!("expected {computed:x}")),
        "{sum} vs {computed:x}"
    );
    std::fs::remove_file(path).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
