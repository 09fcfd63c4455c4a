//! `cairn serve --luks` over a crafted LUKS2 header (checksums valid) whose data segment
//! starts at offset 0 of the same file: refused in one sentence before anything is
//! served (it was served whole, header included, and one client write destroyed it).

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use cairn_luks::ondisk::{self, checksum};

const CAIRN: &str = env!("CARGO_BIN_EXE_cairn");

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn cairn(args: &[&str]) -> Output {
    Command::new(CAIRN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn serve_refuses_a_luks2_data_segment_over_its_header() {
    let d = TempDir(std::env::temp_dir().join(format!("cairn-cli-crafted-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&d.0);
    std::fs::create_dir_all(&d.0).unwrap();
    let img = d.0.join("vol.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    let key = d.0.join("key");
    std::fs::write(&key, b"crafted").unwrap();
    let (img_s, key_s) = (img.to_str().unwrap(), key.to_str().unwrap());
    let o = cairn(&[
        "luks",
        "format",
        "-q",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        key_s,
        img_s,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));

    // Data offset -> 0 in both copies' JSON, checksums recomputed.
    let mut b = std::fs::read(&img).unwrap();
    let l = ondisk::load_image(&b).unwrap();
    let hdr = usize::try_from(l.binary.hdr_size).unwrap();
    let from = format!("\"offset\":\"{}\"", l.metadata.segments.0[&0].offset.0);
    for copy in [0, hdr] {
        let area = &mut b[copy + 4096..copy + hdr];
        let at = area
            .windows(from.len())
            .position(|w| w == from.as_bytes())
            .unwrap();
        let mut json = area.to_vec();
        json.splice(at..at + from.len(), "\"offset\":\"0\"".bytes());
        json.resize(area.len(), 0);
        area.copy_from_slice(&json);
        let c = checksum("sha256", &b[copy..copy + hdr]).unwrap();
        b[copy + ondisk::off::CSUM..copy + ondisk::off::CSUM + 64].copy_from_slice(&c);
    }
    std::fs::write(&img, &b).unwrap();

    // Before the fix it served: bounded, and on sockets of its own.
    let (sock, control) = (d.0.join("nbd.sock"), d.0.join("control.sock"));
    let mut child = Command::new(CAIRN)
        .args([
            "serve",
            "--listen",
            &format!("unix:{}", sock.display()),
            "--control",
            control.to_str().unwrap(),
            "--luks",
            img_s,
            "--key-file",
            key_s,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cairn serve is serving a LUKS2 header whose data segment overlaps it");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.starts_with("cairn: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("the data segment at offset 0 overlaps the LUKS2 header"),
        "{err}"
    );
    // Nothing was written: the header is as crafted.
    assert_eq!(std::fs::read(&img).unwrap(), b);
}
