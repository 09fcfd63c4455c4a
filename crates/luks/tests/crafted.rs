//! Crafted LUKS2 headers with valid checksums that cryptsetup refuses must be refused
//! here too, before a single client write lands: a data segment at offset 0 of the
//! device that holds the header (one write at 0 would destroy it) and a segment of size 0
//! (cryptsetup: "Illegal segment size value").

mod common;

use std::sync::Arc;

use cairn_block::{BlockDevice, ErrorKind, MemDisk};
use cairn_luks::ondisk::{self, checksum};
use cairn_luks::{open_any, FormatOptions, Luks2, PbkdfOptions};
use common::{us, MIB};

const PASS: &[u8] = b"crafted";
const HDR: u64 = 16 << 10;

/// A cairn-formatted image: 16 KiB headers, data at 2 MiB, `size` bytes in all.
fn formatted(size: u64) -> Vec<u8> {
    let disk = Arc::new(MemDisk::new(size));
    Luks2::format(
        disk.clone(),
        &FormatOptions {
            pbkdf: PbkdfOptions::pbkdf2(1000),
            metadata_size: HDR,
            data_offset: Some(2 * MIB),
            ..FormatOptions::default()
        },
        PASS,
    )
    .unwrap();
    disk.to_vec()
}

/// Replaces `from` by `to` in the JSON of both header copies and recomputes both
/// checksums, as someone crafting a header would.
fn edit_json(img: &mut [u8], from: &str, to: &str) {
    for copy in [0, us(HDR)] {
        let area = &mut img[copy + 4096..copy + us(HDR)];
        let at = area
            .windows(from.len())
            .position(|w| w == from.as_bytes())
            .unwrap_or_else(|| panic!("{from} not in the header at {copy}"));
        let mut json = area.to_vec();
        json.splice(at..at + from.len(), to.bytes());
        json.resize(area.len(), 0);
        area.copy_from_slice(&json);
        let c = checksum("sha256", &img[copy..copy + us(HDR)]).unwrap();
        img[copy + ondisk::off::CSUM..copy + ondisk::off::CSUM + 64].copy_from_slice(&c);
    }
}

fn disk(img: &[u8]) -> Arc<dyn BlockDevice> {
    Arc::new(MemDisk::from_bytes(img))
}

#[test]
fn data_at_offset_zero_of_the_header_device_is_refused() {
    let mut img = formatted(4 * MIB);
    edit_json(&mut img, "\"offset\":\"2097152\"", "\"offset\":\"0\"");
    // The header itself is valid (a detached header's data starts at 0).
    ondisk::load_image(&img).unwrap();
    let l = Luks2::load(disk(&img)).unwrap();
    let want = "the data segment at offset 0 overlaps the LUKS2 header and keyslot areas";
    for e in [
        l.check_activatable().unwrap_err(),
        Luks2::open(disk(&img), PASS, None).unwrap_err(),
        open_any(disk(&img), PASS).err().unwrap(),
        l.activate(&l.unlock(PASS, None).unwrap().volume_key)
            .err()
            .unwrap(),
    ] {
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        assert!(e.to_string().contains(want), "{e}");
    }
    // The same header detached from its data (cryptsetup --header) is fine.
    let key = l.unlock(PASS, None).unwrap().volume_key;
    let data: Arc<dyn BlockDevice> = Arc::new(MemDisk::new(MIB));
    let dev = l.activate_on(data, &key).unwrap();
    assert_eq!(dev.geometry().size, MIB);
}

#[test]
fn a_data_segment_of_size_zero_is_refused() {
    let mut img = formatted(4 * MIB);
    edit_json(&mut img, "\"size\":\"dynamic\"", "\"size\":\"0\"");
    let e = Luks2::load(disk(&img)).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains("segment 0: size 0"), "{e}");
    let e = open_any(disk(&img), PASS).err().unwrap();
    assert!(e.to_string().contains("segment 0: size 0"), "{e}");
}

/// A digest (or a keyslot) asking for 4e9 PBKDF2 iterations, about half an hour: opening
/// refuses it before deriving anything, saying what it would do and how long that
/// would take here, and how to go on; under a limit raised high enough it would run.
#[test]
fn a_pbkdf2_count_past_the_time_limit_is_refused_not_spun() {
    for (from, to, what) in [
        (
            "\"segments\":[\"0\"],\"hash\":\"sha256\",\"iterations\":1000,",
            "\"segments\":[\"0\"],\"hash\":\"sha256\",\"iterations\":4000000000,",
            "the volume key digest",
        ),
        (
            "\"type\":\"pbkdf2\",\"hash\":\"sha256\",\"iterations\":1000,",
            "\"type\":\"pbkdf2\",\"hash\":\"sha256\",\"iterations\":4000000000,",
            "keyslot 0",
        ),
    ] {
        let mut img = formatted(4 * MIB);
        edit_json(&mut img, from, to);
        let t = std::time::Instant::now();
        let e = open_any(disk(&img), PASS).err().unwrap();
        assert!(t.elapsed() < std::time::Duration::from_secs(20), "it spun");
        let msg = e.to_string();
        assert!(
            msg.contains(&format!(
                "{what}: deriving the key with 4000000000 PBKDF2-sha256 iterations, about "
            )) && msg.contains("s at this machine's speed, more than the limit of 60 s")
                && msg.contains("--max-kdf-time"),
            "{msg}"
        );
    }
}
