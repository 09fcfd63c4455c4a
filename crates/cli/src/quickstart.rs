//! `cairn quickstart`: a sparse demo disk, served like `cairn serve`, on a fresh machine
//! with no arguments. Where `serve` fails on a busy default address, quickstart moves to a
//! free one, because its whole point is to work first time.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};

use cairn_nbd::Listen;
use serde_json::json;

use crate::args::{Global, QuickstartArgs, ServerOptions};
use crate::error::{CliError, Result};
use crate::exports::{self, ExportSpec};
use crate::listen;
use crate::serve::{self, Extras};
use crate::size::format_size;

const DEMO_FILE: &str = "demo.img";
const DEMO_NAME: &str = "demo";

/// `$XDG_DATA_HOME/cairn`, `~/.local/share/cairn`, or `./cairn-demo` with no home.
pub fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_DATA_HOME").map(PathBuf::from) {
        if d.is_absolute() {
            return d.join("cairn");
        }
    }
    match std::env::var_os("HOME").map(PathBuf::from) {
        Some(h) if h.is_absolute() && h != Path::new("/") => h.join(".local/share/cairn"),
        _ => PathBuf::from("cairn-demo"),
    }
}

pub fn run(args: QuickstartArgs, global: &Global) -> Result<()> {
    if args.size < 1 << 20 || args.size & 4095 != 0 {
        return Err(CliError::new(format!(
            "--size {} is not usable for a demo disk; give at least 1M, in whole 4K blocks \
             (e.g. 512M, 1G)",
            args.size
        )));
    }
    let dir = args.dir.clone().unwrap_or_else(default_dir);
    std::fs::create_dir_all(&dir).map_err(|e| {
        CliError::new(format!(
            "cannot create the demo directory {}: {e}; choose another with --dir DIR",
            dir.display()
        ))
    })?;
    let path = dir.join(DEMO_FILE);
    let created = create_demo_disk(&path, args.size)?;
    let spec = ExportSpec {
        path: path.clone(),
        name: DEMO_NAME.into(),
    };
    let opened = exports::open(&spec, false, false)?;
    let size = opened.device.geometry().size;

    let listens = if args.listen.is_empty() {
        free_defaults()
    } else {
        args.listen.clone()
    };
    let shown = std::path::absolute(&path).unwrap_or(path);
    let verb = if created { "Created" } else { "Reusing" };
    let extras = Extras {
        preamble: vec![
            format!(
                "{verb} the demo disk {} ({}, sparse: it uses space only as it is written).",
                shown.display(),
                format_size(size)
            ),
            String::new(),
        ],
        epilogue: vec![
            String::new(),
            "A filesystem on it, through nbdfuse (above) and a loop device, as root:".into(),
            format!(
                "  LOOP=$(losetup -f --show {fuse}/{DEMO_NAME}) && mkfs.ext4 $LOOP && mount $LOOP /mnt",
                fuse = serve::fuse_dir(DEMO_NAME)
            ),
            String::new(),
            "Coming next: later versions grow this demo into RAID6 -> LUKS2 -> LVM, the stack".into(),
            "mdadm + cryptsetup + lvm build today, served by this one process.".into(),
            format!("Start over by deleting {}.", shown.display()),
        ],
        json: Some(json!({
            "file": shown,
            "created": created,
            "size": size,
        })),
    };
    let opts = ServerOptions {
        listen: listens.clone(),
        threads: 4,
        default_export: None,
    };
    serve::serve(vec![opened], listens, &opts, global, extras)
}

/// Creates a sparse file of `size` bytes unless one exists. Returns whether it created.
fn create_demo_disk(path: &Path, size: u64) -> Result<bool> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() && m.len() > 0 => {
            if m.len() != size {
                tracing::info!(
                    "{} already exists with {}; using it as it is (delete it to start over \
                     with --size {})",
                    path.display(),
                    format_size(m.len()),
                    format_size(size)
                );
            }
            return Ok(false);
        }
        Ok(m) if !m.is_file() => {
            return Err(CliError::new(format!(
                "{} exists and is not a regular file; choose another --dir",
                path.display()
            )));
        }
        _ => {}
    }
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .and_then(|f| f.set_len(size).map(|()| f))
        .map_err(|e| {
            CliError::new(format!(
                "cannot create the demo disk {}: {e}; choose another place with --dir DIR",
                path.display()
            ))
        })?;
    drop(file);
    Ok(true)
}

/// The default addresses, moved aside when something already holds them: the socket gets
/// a per-process name and the port becomes any free one.
fn free_defaults() -> Vec<Listen> {
    let (sock, tcp) = listen::defaults();
    let sock = if listen::unix_in_use(&sock) {
        let alt = sock.with_file_name(format!("quickstart-{}.sock", std::process::id()));
        tracing::info!(
            "{} is in use by another server; using {} instead",
            sock.display(),
            alt.display()
        );
        alt
    } else {
        sock
    };
    let tcp = if listen::tcp_in_use(tcp) {
        tracing::info!("port {} is in use; using a free port instead", tcp.port());
        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
    } else {
        tcp
    };
    vec![Listen::Unix(sock), Listen::Tcp(tcp)]
}
