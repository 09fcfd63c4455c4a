//! FileDisk specifics on sparse files: discard and write_zeroes punch holes that extents()
//! reports and that read as zeroes, neighbours survive, and the file keeps its size.

mod common;

use cairn_block::testkit::conformance::walk_extents;
use cairn_block::{BlockDevice, FileDisk, OpenOptions, Support, WriteFlags};
use common::{scratch_dir, TempFile};

const SIZE: u64 = 4 << 20;
const K: u64 = 1024;

/// Test sizes are small; a failed conversion is a broken test, not a truncation.
fn us(v: u64) -> usize {
    usize::try_from(v).expect("test sizes fit in usize")
}

/// The byte ranges `extents` reports as holes inside `[0, len)`, merged.
fn holes(dev: &dyn BlockDevice, len: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for e in walk_extents(dev, 0, len).into_iter().filter(|e| e.hole) {
        match out.last_mut() {
            Some(last) if last.1 == e.offset => last.1 += e.length,
            _ => out.push((e.offset, e.offset + e.length)),
        }
    }
    out
}

fn read(dev: &dyn BlockDevice, off: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; us(len)];
    dev.read_at(&mut buf, off).unwrap();
    buf
}

fn run_in(dir: &std::path::Path) {
    eprintln!("file_disk specifics in {}", dir.display());
    let tmp = TempFile::new(dir, "specifics");
    let disk = FileDisk::open(
        &tmp.0,
        &OpenOptions {
            create_size: Some(SIZE),
            ..OpenOptions::default()
        },
    )
    .unwrap();
    let caps = disk.capabilities();
    if caps.discard != Support::Native || !caps.extents {
        eprintln!(
            "SKIP: {} has no hole punching or SEEK_DATA ({caps:?})",
            dir.display()
        );
        return;
    }
    // A new file is one big hole.
    assert_eq!(holes(&disk, SIZE), vec![(0, SIZE)], "a fresh sparse file");

    let data: Vec<u8> = (0..1024 * K).map(|i| (i % 251) as u8 | 1).collect();
    disk.write_at(&data, 0, WriteFlags::NONE).unwrap();
    assert_eq!(holes(&disk, 1024 * K), vec![], "fully written");

    // discard punches a hole.
    disk.discard(256 * K, 128 * K).unwrap();
    assert_eq!(holes(&disk, 1024 * K), vec![(256 * K, 384 * K)]);
    assert_eq!(read(&disk, 256 * K, 128 * K), vec![0u8; us(128 * K)]);
    // Neighbours kept their data.
    assert_eq!(read(&disk, 252 * K, 4 * K), data[us(252 * K)..us(256 * K)]);
    assert_eq!(read(&disk, 384 * K, 4 * K), data[us(384 * K)..us(388 * K)]);

    // write_zeroes without NO_HOLE may punch too.
    disk.write_zeroes(512 * K, 64 * K, WriteFlags::NONE)
        .unwrap();
    assert_eq!(
        holes(&disk, 1024 * K),
        vec![(256 * K, 384 * K), (512 * K, 576 * K)]
    );
    assert_eq!(read(&disk, 512 * K, 64 * K), vec![0u8; us(64 * K)]);

    // With NO_HOLE the range reads zero; whether it is allocated is the filesystem's
    // business (ext4 keeps unwritten extents), so only the data is checked.
    disk.write_zeroes(640 * K, 64 * K, WriteFlags::NO_HOLE)
        .unwrap();
    assert_eq!(read(&disk, 640 * K, 64 * K), vec![0u8; us(64 * K)]);
    assert_eq!(read(&disk, 704 * K, 4 * K), data[us(704 * K)..us(708 * K)]);

    // Discarding the tail keeps the file size (FALLOC_FL_KEEP_SIZE).
    disk.write_at(&data[..us(64 * K)], SIZE - 64 * K, WriteFlags::FUA)
        .unwrap();
    disk.discard(SIZE - 64 * K, 64 * K).unwrap();
    disk.write_zeroes(SIZE - 128 * K, 64 * K, WriteFlags::NONE)
        .unwrap();
    disk.flush().unwrap();
    assert_eq!(
        std::fs::metadata(&tmp.0).unwrap().len(),
        SIZE,
        "file size preserved"
    );
    assert_eq!(disk.geometry().size, SIZE);
    assert_eq!(read(&disk, SIZE - 128 * K, 128 * K), vec![0u8; us(128 * K)]);
    let tail = walk_extents(&disk, SIZE - 64 * K, 64 * K);
    assert!(
        tail.iter().all(|e| e.hole),
        "discarded tail is a hole: {tail:?}"
    );

    // Reopening sees the same size and contents.
    drop(disk);
    let again = FileDisk::open(&tmp.0, &OpenOptions::default()).unwrap();
    assert_eq!(again.geometry().size, SIZE);
    assert_eq!(read(&again, 0, 256 * K), data[..us(256 * K)]);
    assert_eq!(holes(&again, 1024 * K)[0], (256 * K, 384 * K));
}

#[test]
fn sparse_file_specifics() {
    let mut dirs = vec![scratch_dir(), std::env::temp_dir()];
    dirs.dedup();
    for dir in dirs {
        run_in(&dir);
    }
}
