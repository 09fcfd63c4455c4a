//! Whole stacks built from specs, checked against an in-memory model: LVs over LUKS2 over
//! an md RAID6 on files, written at random through the opened stack, closed, opened
//! again (also with a member missing) and read back. Random: the seed is printed and
//! `CAIRN_SEED=N` replays it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_block::{BlockDevice, FileDisk, OpenOptions, WriteFlags};
use cairn_luks::{FormatOptions, Luks2, PbkdfOptions};
use cairn_lvm::{LvCreate, PvCreateOptions, PvDevice, Vg};
use cairn_md::{Array, CreateOptions, Level, Sectors};
use cairn_stack::{Keys, OpenedExport, Options, Spec};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

const PASS: &[u8] = b"stack test passphrase";
const MEMBER: u64 = 24 << 20;

struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir(tag: &str) -> Dir {
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let d = base.join(format!("cairn-stack-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    Dir(d)
}

fn seed() -> u64 {
    let s = std::env::var("CAIRN_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(rand::random::<u64>);
    eprintln!("seed {s} (replay with CAIRN_SEED={s})");
    s
}

fn open_file(p: &Path) -> Arc<dyn BlockDevice> {
    let o = OpenOptions {
        read_only: false,
        direct: false,
        create_size: Some(MEMBER),
    };
    Arc::new(FileDisk::open(p, &o).unwrap())
}

/// RAID6 over four member files, LUKS2 on it, a VG with LVs "a" (linear) and "b".
fn build(dir: &Path) -> (Vec<PathBuf>, PathBuf) {
    let members: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("m{i}.img"))).collect();
    let devs: Vec<Arc<dyn BlockDevice>> = members.iter().map(|p| open_file(p)).collect();
    let names = members.iter().map(|p| p.display().to_string()).collect();
    let mut opts = CreateOptions::new(Level::Raid6, "stk");
    opts.chunk = Some(Sectors::from_bytes_floor(64 << 10));
    opts.members_zeroed = true;
    let array = Arc::new(Array::create(devs, names, &opts).unwrap());
    let dev: Arc<dyn BlockDevice> = array.clone();
    let fo = FormatOptions {
        pbkdf: PbkdfOptions::pbkdf2(1000),
        sector_size: Some(4096),
        ..FormatOptions::default()
    };
    Luks2::format(dev.clone(), &fo, PASS).unwrap();
    let key = dir.join("key");
    std::fs::write(&key, PASS).unwrap();
    let l = cairn_luks::Luks::load(dev).unwrap();
    let u = l.unlock(PASS, None).unwrap();
    let crypt: Arc<dyn BlockDevice> = Arc::new(l.activate(&u.volume_key).unwrap());
    let pv = PvDevice::new("pv", crypt);
    cairn_lvm::pvcreate(&pv, &PvCreateOptions::default()).unwrap();
    let mut vg = Vg::create("vg", vec![pv], 1 << 20).unwrap();
    for (name, extents) in [("a", 8), ("b", 12)] {
        vg.lv_create(&LvCreate {
            name: name.into(),
            extents,
            stripes: 1,
            stripe_size: None,
        })
        .unwrap();
    }
    drop(vg);
    array.close().unwrap();
    (members, key)
}

fn spec(members: &[PathBuf], key: &Path) -> Spec {
    Spec::Lvm(vec![Spec::Luks {
        on: Box::new(Spec::Md(members.to_vec())),
        key_file: Some(key.to_path_buf()),
    }])
}

fn open(spec: &Spec, read_only: bool) -> Vec<OpenedExport> {
    let opts = Options {
        read_only,
        force: true,
        ..Options::default()
    };
    let mut v = cairn_stack::open(spec, None, &opts, &mut Keys::none()).unwrap();
    v.sort_by(|a, b| a.name.cmp(&b.name));
    v
}

fn read_all(dev: &dyn BlockDevice) -> Vec<u8> {
    let mut buf = vec![0u8; usize::try_from(dev.geometry().size).unwrap()];
    dev.read_at(&mut buf, 0).unwrap();
    buf
}

#[test]
fn lvm_over_luks_over_raid6_matches_the_model() {
    let d = tempdir("model");
    let (members, key) = build(&d.0);
    let spec = spec(&members, &key);
    let mut rng = SmallRng::seed_from_u64(seed());

    let opened = open(&spec, false);
    let names: Vec<&str> = opened.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["vg/a", "vg/b"]);
    // The tree says what was opened, layer by layer.
    let tree = cairn_stack::describe::describe(&opened[0]);
    let kinds: Vec<&str> = cairn_stack::node::walk(&tree)
        .iter()
        .map(|n| n.kind.as_str())
        .collect();
    assert_eq!(&kinds[..4], ["export", "lv", "luks", "md"], "{kinds:?}");
    assert_eq!(
        tree.children[0].children[0].children[0]
            .md
            .as_ref()
            .unwrap()
            .data_disks,
        2
    );

    // A new LV over LUKS reads as the decryption of whatever was there: the model starts
    // from what is read.
    let mut model: Vec<Vec<u8>> = opened.iter().map(|e| read_all(&*e.device)).collect();
    for _ in 0..200 {
        let i = rng.gen_range(0..opened.len());
        let dev = &opened[i].device;
        let size = dev.geometry().size;
        let blocks = rng.gen_range(1..=64u64);
        let len = blocks * 4096;
        let off = rng.gen_range(0..=(size - len) / 4096) * 4096;
        let mut data = vec![0u8; usize::try_from(len).unwrap()];
        rng.fill(&mut data[..]);
        let flags = if rng.gen_bool(0.1) {
            WriteFlags::FUA
        } else {
            WriteFlags::default()
        };
        dev.write_at(&data, off, flags).unwrap();
        let at = usize::try_from(off).unwrap();
        model[i][at..at + data.len()].copy_from_slice(&data);
        if rng.gen_bool(0.05) {
            dev.flush().unwrap();
        }
    }
    for (e, m) in opened.iter().zip(&model) {
        e.device.flush().unwrap();
        assert!(
            read_all(&*e.device) == *m,
            "{} differs from the model",
            e.name
        );
    }
    cairn_stack::spec::close_all(&opened);
    drop(opened);

    // Opened again from the same spec: the same bytes.
    let again = open(&spec, true);
    for (e, m) in again.iter().zip(&model) {
        assert!(
            read_all(&*e.device) == *m,
            "{} differs after reopening",
            e.name
        );
    }
    drop(again);

    // One member gone: RAID6 serves the same bytes degraded.
    std::fs::remove_file(&members[1]).unwrap();
    let degraded = open(&spec, true);
    let md = cairn_stack::export::all_arrays(&degraded);
    assert!(md[0].report().state.degraded);
    for (e, m) in degraded.iter().zip(&model) {
        assert!(read_all(&*e.device) == *m, "{} differs degraded", e.name);
    }
}

#[test]
fn a_wrong_key_or_a_bad_shape_opens_nothing() {
    let d = tempdir("refuse");
    let (members, key) = build(&d.0);
    let bad = d.0.join("bad");
    std::fs::write(&bad, b"wrong").unwrap();
    let s = Spec::Luks {
        on: Box::new(Spec::Md(members.clone())),
        key_file: Some(bad),
    };
    let err = cairn_stack::open(&s, None, &Options::default(), &mut Keys::none()).unwrap_err();
    assert_eq!(err.exit_code(), cairn_stack::luks::EXIT_NO_KEY, "{err}");
    // The array was closed again: a writer can open it at once.
    let ok = open(&spec(&members, &key), false);
    assert_eq!(ok.len(), 2);
    drop(ok);

    let nested = Spec::Luks {
        on: Box::new(Spec::Lvm(vec![Spec::File(members[0].clone())])),
        key_file: None,
    };
    let err = cairn_stack::open(&nested, None, &Options::default(), &mut Keys::none()).unwrap_err();
    assert!(err.to_string().contains("not supported"), "{err}");
    // Specs round-trip through JSON, as the control API takes them.
    let text = serde_json::to_string(&spec(&members, &key)).unwrap();
    assert!(
        text.starts_with("{\"lvm\":[{\"luks\":{\"on\":{\"md\":["),
        "{text}"
    );
    let back: Spec = serde_json::from_str(&text).unwrap();
    assert_eq!(back, spec(&members, &key));
}

/// A VG "lvg" on one PV file with one LV "enc" holding LUKS2.
fn build_luks_on_lv(dir: &Path) -> (PathBuf, PathBuf) {
    let pv_path = dir.join("pv.img");
    let pv = PvDevice::new("pv", open_file(&pv_path));
    cairn_lvm::pvcreate(&pv, &PvCreateOptions::default()).unwrap();
    let mut vg = Vg::create("lvg", vec![pv], 1 << 20).unwrap();
    vg.lv_create(&LvCreate {
        name: "enc".into(),
        extents: 20,
        stripes: 1,
        stripe_size: None,
    })
    .unwrap();
    let lv: Arc<dyn BlockDevice> = vg.lv("enc").unwrap();
    let fo = FormatOptions {
        pbkdf: PbkdfOptions::pbkdf2(1000),
        ..FormatOptions::default()
    };
    Luks2::format(lv, &fo, PASS).unwrap();
    drop(vg);
    let key = dir.join("key");
    std::fs::write(&key, PASS).unwrap();
    (pv_path, key)
}

#[test]
fn luks_over_an_lv_opens_describes_itself_and_keeps_its_data() {
    let d = tempdir("luks-lv");
    let (pv, key) = build_luks_on_lv(&d.0);
    let spec = Spec::Luks {
        on: Box::new(Spec::Lv {
            on: vec![Spec::File(pv.clone())],
            name: "lvg/enc".into(),
        }),
        key_file: Some(key.clone()),
    };
    let text = serde_json::to_string(&spec).unwrap();
    assert!(
        text.starts_with("{\"luks\":{\"on\":{\"lv\":{\"on\":[{\"file\":"),
        "{text}"
    );
    assert_eq!(serde_json::from_str::<Spec>(&text).unwrap(), spec);
    let opts = Options::default();
    let e = cairn_stack::open_one(&spec, Some("secret"), &opts, &mut Keys::none()).unwrap();
    assert_eq!(e.name, "secret");
    let tree = cairn_stack::describe::describe(&e);
    let kinds: Vec<&str> = cairn_stack::node::walk(&tree)
        .iter()
        .map(|n| n.kind.as_str())
        .collect();
    assert_eq!(kinds, ["export", "luks", "lv", "file"]);
    assert!(
        cairn_stack::describe::export_description(&e).contains(" over LV lvg/enc over "),
        "{}",
        cairn_stack::describe::export_description(&e)
    );
    let size = e.device.geometry().size;
    assert_eq!(size, 4 << 20, "20 MiB LV less LUKS2's 16 MiB header area");
    let mut rng = SmallRng::seed_from_u64(seed());
    let mut data = vec![0u8; usize::try_from(size).unwrap()];
    rng.fill(&mut data[..]);
    e.device.write_at(&data, 0, WriteFlags::FUA).unwrap();
    e.close();
    drop(e);
    // Opened again from the spec: the same bytes come back through LV and LUKS.
    let again = cairn_stack::open_one(&spec, None, &opts, &mut Keys::none()).unwrap();
    assert_eq!(
        again.name, "lvg/enc",
        "an LV stack is named VG/LV by default"
    );
    assert!(read_all(&*again.device) == data, "LUKS over LV lost data");
    drop(again);
    // Described without a key: the LUKS layer is locked, its size the payload's, and no
    // device stands in for it.
    let locked = cairn_stack::open_one(&spec, None, &opts, &mut Keys::locked()).unwrap();
    assert!(locked.locked() && locked.read_only);
    assert_eq!(locked.geometry().size, size);
    let tree = cairn_stack::describe::describe(&locked);
    assert_eq!(tree.size, size);
    assert_eq!(tree.children[0].state.to_string(), "read-only");
    drop(locked);
    // A missing LV names the ones there are.
    let wrong = Spec::Lv {
        on: vec![Spec::File(pv)],
        name: "lvg/nope".into(),
    };
    let err = cairn_stack::open_one(&wrong, None, &opts, &mut Keys::none()).unwrap_err();
    assert!(err.to_string().contains("lvg/enc"), "{err}");
}
