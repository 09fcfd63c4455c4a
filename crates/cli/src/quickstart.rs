//! `cairn quickstart`: the classic home-server stack on four sparse member files, a
//! RAID6 with LUKS2 on it and an LVM2 volume group with `home` and `media` on that,
//! served like `cairn serve --md ... --luks --lvm`, on a fresh machine with no arguments.
//!
//! ```text
//!   demo-raid6-{0..3}.img ─ md RAID6 (64K chunk) ─ LUKS2 (demo.key) ─ VG "demo"
//!                                                   ├─ LV home  ─ export "demo/home"
//!                                                   └─ LV media ─ export "demo/media"
//! ```
//!
//! A demo directory made by an older quickstart (RAID6, or RAID6 -> LUKS2 without LVM)
//! is served as it is, never reformatted: it may hold the user's test data.
//!
//! Where `serve` fails on a busy default address, quickstart moves to a free one, because
//! its whole point is to work first time.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_block::{BlockDevice, FileDisk, OpenOptions};
use cairn_luks::{FormatOptions, Luks2, PbkdfOptions};
use cairn_md::{Array, CreateOptions, Level, Sectors};

use cairn_nbd::Listen;
use serde_json::json;

use crate::error::{CliError, Result};
use crate::global::Global;
use crate::listen;
use crate::serve::ServerOptions;
use crate::serve::{self, Extras};
use cairn_stack::size::format_size;
use cairn_stack::size::parse_size;
use cairn_stack::{Keys, Options, Spec};
use clap::Args;

const DEMO_NAME: &str = "demo";
const DEMO_MEMBERS: usize = 4;
/// 64K rather than mdadm's 512K: with two data members the full stripe is 128K, which
/// ordinary filesystem and database writes fill, so they take the fast full-stripe path
/// instead of read-modify-write; it is also the shape the benchmarks measure.
const DEMO_CHUNK: u64 = 64 << 10;

/// Room for the LUKS2 header in front of the payload (cairn's and cryptsetup's default
/// data offset), added to the array so the decrypted export has the size asked for.
const LUKS_HEADER: u64 = 16 << 20;
/// Room for the LVM2 label, metadata and extent rounding in front of the LVs.
const LVM_HEADER: u64 = 4 << 20;
const DEMO_VG: &str = "demo";
/// The LVs and their share of the VG's extents, in percent (the last takes the rest).
const DEMO_LVS: [(&str, u64); 2] = [("home", 50), ("media", 50)];
const DEMO_KEY_FILE: &str = "demo.key";
/// Printed, stored in a mode-0600 file next to the members, and labelled a demo key
/// everywhere it is shown: the demo is about the stack, not about secrecy.
const DEMO_PASSPHRASE: &[u8] = b"cairn-demo-not-a-secret";
/// Cheap argon2id costs so the demo starts at once (a real volume gets cryptsetup's
/// benchmarked ~2 s and up to 1 GiB).
const DEMO_KDF: (u32, u32, u32) = (2, 64 << 10, 2);

fn member_path(dir: &Path, i: usize) -> PathBuf {
    dir.join(format!("demo-raid6-{i}.img"))
}

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
    if args.size < 16 << 20 || args.size & 4095 != 0 {
        return Err(CliError::new(format!(
            "--array-size {} is not usable for the demo array; give at least 16M, in whole 4K \
             blocks (e.g. 512M, 1G)",
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
    let dir = std::path::absolute(&dir).unwrap_or(dir);
    let members: Vec<PathBuf> = (0..DEMO_MEMBERS).map(|i| member_path(&dir, i)).collect();
    let key_path = dir.join(DEMO_KEY_FILE);
    let created = if members.iter().any(|p| p.exists()) {
        false
    } else {
        create_demo_array(&members, args.size + LUKS_HEADER + LVM_HEADER)?;
        true
    };
    let spec = Spec::Md(members.clone());
    let damaged = |e: CliError| {
        CliError::new(format!(
            "{e}; the demo in {} is damaged: delete demo-raid6-*.img and {DEMO_KEY_FILE} there \
             to start over",
            dir.display()
        ))
    };
    let open_opts = Options {
        stripe_cache: Some(cairn_md::StripeCacheOptions::default()),
        hooks: crate::hooks::hooks(false),
        ..Options::default()
    };
    let mut keys = Keys::none();
    let opened =
        cairn_stack::open_one(&spec, Some(DEMO_NAME), &open_opts, &mut keys).map_err(damaged)?;
    let array = opened.md().cloned().expect("an md export");
    let report = array.report();
    if created {
        if let Err(e) = format_demo_luks(&opened.device, &key_path) {
            let _ = array.close();
            return Err(e);
        }
    }
    // A demo array made before quickstart grew LUKS is served as it is, not formatted:
    // it may hold the user's test data.
    let has_luks = cairn_luks::probe(&*opened.device)
        .map_err(|e| CliError::new(format!("cannot read the demo array: {e}")))?
        .is_some();
    let mut opened = if has_luks {
        keys.unlock(&opened, "the demo array", Some(&key_path))
            .map_err(|e| {
                let _ = array.close();
                damaged(e)
            })?
    } else {
        opened
    };
    if created {
        if let Err(e) = make_demo_volumes(&opened.device) {
            let _ = array.close();
            return Err(e);
        }
    }
    let has_lvm = has_luks
        && cairn_lvm::probe(&*opened.device)
            .map_err(|e| CliError::new(format!("cannot read the demo volume: {e}")))?
            .is_some();
    let exports = if has_lvm {
        let lvs = cairn_stack::lvm::open_lv_exports(vec![opened], false).map_err(|e| {
            let _ = array.close();
            damaged(e)
        })?;
        opened = lvs[0].clone();
        lvs
    } else {
        vec![opened.clone()]
    };
    let size: u64 = exports.iter().map(|e| e.device.geometry().size).sum();
    let first = opened.name.clone();

    let listens = if args.listen.is_empty() {
        free_defaults()
    } else {
        args.listen.clone()
    };
    let verb = if created { "Created" } else { "Reusing" };
    let list: Vec<String> = members.iter().map(|p| p.display().to_string()).collect();
    let stack = if has_lvm {
        "RAID6 -> LUKS2 -> LVM (home, media)"
    } else if has_luks {
        "RAID6 -> LUKS2 (made before the demo had LVM)"
    } else {
        "RAID6 (made before the demo had LUKS2)"
    };
    let mut preamble = vec![
        format!(
            "{verb} the demo stack: {stack} over {DEMO_MEMBERS} sparse files in {} ({} usable; \
             any two members can be lost).",
            dir.display(),
            format_size(size)
        ),
        String::new(),
        "$ cairn status   (the stack, from the export down to the member files)".to_string(),
    ];
    let tree = json!({ "exports": exports.iter().map(cairn_stack::describe::describe).collect::<Vec<_>>() });
    let tree = crate::status::render(&tree, false).unwrap_or_default();
    preamble.extend(tree.lines().map(|l| format!("  {l}")));
    preamble.push(String::new());
    if has_luks {
        let (t, m, p) = DEMO_KDF;
        preamble.extend([
            format!("$ cairn luks dump --md {}   (LUKS2 on the array, as cryptsetup on /dev/md0)", list.join(",")),
            "  aes-xts-plain64, 512-bit key, 4096-byte sectors, data at 16 MiB (stripe-aligned)"
                .to_string(),
            format!(
                "  DEMO KEY: the passphrase is in {} (mode 0600). It is not a secret: anyone",
                key_path.display()
            ),
            format!(
                "  who reads that file opens the volume. Its keyslot uses cheap argon2id costs ({t} passes,"
            ),
            format!(
                "  {} MiB, {p} threads) so the demo starts at once; `cairn luks format` benchmarks ~2 s.",
                m >> 10
            ),
            String::new(),
        ]);
    }
    if has_lvm {
        preamble.extend([
            format!(
                "$ cairn lvm lvs --md {} --luks --key-file {}   (LVM2 on the LUKS volume, as lvs)",
                list.join(","),
                key_path.display()
            ),
            "  VG demo: LVs home and media; the first extent at 1 MiB, 4 MiB extents: every LV"
                .to_string(),
            "  starts on a full stripe of the array, so filesystems on them stay aligned."
                .to_string(),
            String::new(),
        ]);
    }
    // The export a filesystem goes on in the example: home, or the whole volume of an
    // older demo. LUKS2 with 4K sectors needs a loop device with 4K sectors.
    let block = if has_luks { " -b 4096" } else { "" };
    let advice = cairn_stack::advise::advise(&cairn_stack::describe::describe(&opened));
    preamble.push(format!(
        "$ cairn advise {first}   (mkfs options that match the stack's real geometry)"
    ));
    preamble.extend(advice.text().lines().map(|l| format!("  {l}")));
    preamble.push(String::new());
    let ext4 = advice.ext4_options.join(" ");
    let extras = Extras {
        preamble,
        epilogue: vec![
            String::new(),
            "A filesystem on it, through nbdfuse (above) and a loop device, as root, aligned to".into(),
            "the RAID6 stripe (64K chunk x 2 data members), as cairn advise says:".into(),
            format!(
                "  LOOP=$(losetup -f --show{block} {fuse}/{file}) && mkfs.ext4 {ext4} $LOOP && mount $LOOP /mnt",
                fuse = serve::fuse_dir(&first),
                file = serve::fuse_file(&first),
            ),
            String::new(),
            "Lose a member: stop cairn, move one file away, and run quickstart again; the".into(),
            "array starts degraded and reads the same data. The members are ordinary md:".into(),
            format!("  mdadm --examine {}", list[0]),
            String::new(),
            "Serve it yourself, as quickstart does:".into(),
            format!(
                "  cairn serve --md {}{}",
                list.join(","),
                match (has_luks, has_lvm) {
                    (true, true) => format!(" --luks --lvm --key-file {}", key_path.display()),
                    (true, false) => format!(":{DEMO_NAME} --luks --key-file {}", key_path.display()),
                    _ => format!(":{DEMO_NAME}"),
                }
            ),
            String::new(),
            format!(
                "Start over by deleting {}/demo-raid6-*.img and {DEMO_KEY_FILE}.",
                dir.display()
            ),
        ],
        json: Some(json!({
            "members": members,
            "created": created,
            "size": size,
            "md": report,
            "luks": has_luks.then(|| json!({
                "key_file": key_path,
                "demo_key": true,
                "pbkdf": {"type": "argon2id", "time": DEMO_KDF.0, "memory_kib": DEMO_KDF.1, "parallel": DEMO_KDF.2},
            })),
            "lvm": has_lvm.then(|| json!({
                "vg": DEMO_VG,
                "lvs": exports.iter().map(|e| e.name.clone()).collect::<Vec<_>>(),
            })),
        })),
        fence: None,
        remote_timeout: None,
        ownership: Default::default(),
    };
    let opts = ServerOptions {
        listen: listens.clone(),
        threads: crate::serve::DEFAULT_THREADS,
        max_connections: crate::serve::DEFAULT_MAX_CONNECTIONS,
        client_timeout: crate::serve::DEFAULT_CLIENT_TIMEOUT,
        default_export: None,
        speed_limit_min: 1000,
        speed_limit_max: 200_000,
        stripe_cache_size: None,
        stripe_cache_hold_ms: None,
        safe_mode_delay: None,
        operator: crate::daemon::OperatorOptions::default(),
        // The demo keeps its own rule: a warning for a network listener, no refusal.
        tls: crate::serve::TlsOptions {
            insecure_no_tls: true,
            ..Default::default()
        },
    };
    serve::serve(exports, listens, &opts, global, extras)
}

/// The demo's LVM2 layer on the new LUKS volume: a PV, VG "demo", and the LVs.
fn make_demo_volumes(device: &Arc<dyn BlockDevice>) -> Result<()> {
    use cairn_lvm::{LvCreate, PvCreateOptions, PvDevice, Vg};
    let fail = |e: cairn_block::Error| {
        CliError::new(format!(
            "cannot put LVM2 on the demo volume: {}",
            crate::lvm::lvm_error(&e)
        ))
    };
    let pv = PvDevice::new("the demo LUKS volume", device.clone());
    cairn_lvm::pvcreate(&pv, &PvCreateOptions::default()).map_err(fail)?;
    let extent = crate::lvm::default_extent_size(std::slice::from_ref(&pv));
    let mut vg = Vg::create(DEMO_VG, vec![pv], extent).map_err(fail)?;
    let total = vg.report().extent_count;
    let mut left = total;
    for (i, (name, percent)) in DEMO_LVS.iter().enumerate() {
        let extents = if i + 1 == DEMO_LVS.len() {
            left
        } else {
            (total * percent / 100).max(1)
        };
        vg.lv_create(&LvCreate {
            name: (*name).into(),
            extents,
            stripes: 1,
            stripe_size: None,
        })
        .map_err(fail)?;
        left -= extents;
    }
    Ok(())
}

/// Writes the demo key file (mode 0600, replacing a stale one) and LUKS2 on the array.
fn format_demo_luks(device: &Arc<dyn BlockDevice>, key_path: &Path) -> Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = std::fs::remove_file(key_path);
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(key_path)
        .and_then(|mut f| f.write_all(DEMO_PASSPHRASE))
        .map_err(|e| {
            CliError::new(format!(
                "cannot write the demo key file {}: {e}",
                key_path.display()
            ))
        })?;
    let (t, m, p) = DEMO_KDF;
    let opts = FormatOptions {
        pbkdf: PbkdfOptions::argon2id(t, m, p),
        sector_size: Some(4096),
        label: "cairn-demo".into(),
        ..FormatOptions::default()
    };
    Luks2::format(device.clone(), &opts, DEMO_PASSPHRASE)
        .map(|_| ())
        .map_err(|e| CliError::new(format!("cannot put LUKS2 on the demo array: {e}")))
}

/// Each member holds half the array plus md's data offset, which itself depends on the
/// member's size: settle it so the array comes out at exactly `size` (when `size` is a
/// multiple of two chunks), the number the user asked for.
fn member_size_for(size: u64) -> u64 {
    let half = size / 2;
    let chunk = Sectors::from_bytes_floor(DEMO_CHUNK);
    let mut member = half + (8 << 20);
    for _ in 0..4 {
        let offset =
            cairn_md::create::default_data_offset(Sectors::from_bytes_floor(member), chunk);
        member = half + offset.bytes().unwrap_or(8 << 20);
    }
    member
}

/// Creates the four sparse members and the RAID6 on them. `size` is the usable size
/// wanted.
fn create_demo_array(members: &[PathBuf], size: u64) -> Result<()> {
    let member_size = member_size_for(size);
    let mut devices: Vec<Arc<dyn BlockDevice>> = Vec::new();
    for p in members {
        create_sparse(p, member_size)?;
        let disk = FileDisk::open(
            p,
            &OpenOptions {
                read_only: false,
                direct: false,
                create_size: None,
            },
        )
        .map_err(|e| match e.kind() {
            cairn_block::ErrorKind::Busy => cairn_stack::owner::busy(&p.display().to_string(), &e),
            _ => CliError::new(format!("cannot open {}: {e}", p.display())),
        })?;
        devices.push(Arc::new(disk));
    }
    let mut opts = CreateOptions::new(Level::Raid6, DEMO_NAME);
    opts.chunk = Some(Sectors::from_bytes_floor(DEMO_CHUNK));
    opts.members_zeroed = true;
    let names = members.iter().map(|p| p.display().to_string()).collect();
    let array = Array::create(devices, names, &opts).map_err(|e| {
        for p in members {
            let _ = std::fs::remove_file(p);
        }
        CliError::new(format!("cannot create the demo array: {e}"))
    })?;
    array
        .close()
        .map_err(|e| CliError::new(format!("cannot close the new demo array: {e}")))
}

/// Creates a sparse file of `size` bytes; an existing file is an error.
fn create_sparse(path: &Path, size: u64) -> Result<()> {
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .and_then(|f| f.set_len(size))
        .map_err(|e| {
            CliError::new(format!(
                "cannot create the demo member {}: {e}; choose another place with --dir DIR",
                path.display()
            ))
        })
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

// ---- the command line (clap) ----------------------------------------------------
//

pub(crate) const QUICKSTART_LONG: &str = "\
Create a demo stack, an md RAID6 array on four sparse files with LUKS2 encryption on \
it and an LVM volume group with two logical volumes on that, and serve it, printing the \
stack's details and the commands to connect.

The members are sparse files (they take no space until written) named \
demo-raid6-0.img ... demo-raid6-3.img in --dir, which defaults to $XDG_DATA_HOME/cairn \
(~/.local/share/cairn). The array uses a 64K chunk, so its full stripe is 128K (two \
data members), a size ordinary writes fill. Existing members are reused, never \
overwritten; with one or two of them gone the array starts degraded. It is served \
exactly as `cairn serve --md ... --luks` would: on the default Unix socket and on TCP \
127.0.0.1:10809 (or a free port if 10809 is busy), with LVM on the LUKS volume: two \
logical volumes, exported as \"demo/home\" (half the size) and \"demo/media\" (the rest).

The LUKS2 passphrase is a DEMO KEY, written to demo.key (mode 0600) in --dir, and its \
keyslot uses cheap argon2id costs so the demo starts at once: fine for trying cairn, not \
for data that must stay secret (use `cairn luks format` for that). A demo array made by \
an older cairn, without LUKS, is served as it is.

Stop it with Ctrl-C. Delete the member files and demo.key with `rm` when you are done.";

pub(crate) const QUICKSTART_EXAMPLES: &str = "\
Examples:
  cairn quickstart                         # 1 GiB RAID6 in ~/.local/share/cairn
  cairn quickstart --dir ./demo --array-size 4G";

/// `cairn quickstart`.
#[derive(Debug, Args)]
pub struct QuickstartArgs {
    /// Directory for the demo array's members [default: $XDG_DATA_HOME/cairn, i.e. ~/.local/share/cairn]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,

    /// Usable size of the demo stack when it is created, e.g. 512M, 1G, 20G (what the two
    /// LVs share; the four member files are sized to give it). `--size` is the old name
    #[arg(long = "array-size", alias = "size", value_name = "SIZE", default_value = "1G",
          value_parser = parse_size)]
    pub size: u64,

    /// Address to listen on: unix:PATH or tcp:ADDR:PORT (repeatable; default as for serve)
    #[arg(short, long = "listen", value_name = "ADDRESS")]
    pub listen: Vec<Listen>,
}
