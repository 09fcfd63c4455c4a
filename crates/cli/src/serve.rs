//! `cairn serve`: open the exports, bind, announce, serve until SIGINT/SIGTERM/SIGHUP.
//!
//! ```text
//!   FILE[:NAME]...    ─ exports::open ──────────────┐
//!   --md M1,M2,...    ─ md::open_export ────────────┤  a bare --luks next to --md: the
//!                       (+ stripe cache, RAID4/5/6) │
//!   --luks DEV[:NAME] ─ exports::open ─┐            │  arrays are unlocked the same way
//!                       luks::open_export (key) ────┤  (key: --key-file, or the tty)
//!   --config FILE     ─ config::open_stacks ────────┤  the [[export]] entries
//!   --scan PATH       ─ scan::for_serve ────────────┤  md, LUKS found on disk
//!   --listen / defaults ────────────────────────────┼─> Server::bind ─> announce ─> serve
//!   SIGINT/SIGTERM/SIGHUP thread ───────────────────┘   shutdown_handle().shutdown() ends
//!                                  serve, which finishes in-flight requests and flushes
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::thread;

use cairn_block::BlockDevice;
use cairn_nbd::{Export, Listen, Server, ServerConfig};
use serde::Serialize;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::args::{Global, ServeArgs, ServerOptions};
use crate::error::{CliError, Result};
use crate::exports::{self, OpenedExport};
use crate::listen;
use crate::luks;
use crate::md;
use crate::size::format_size;

/// Extra things `quickstart` wants said around the usual announcement.
#[derive(Debug, Default)]
pub struct Extras {
    /// Printed before the export table.
    pub preamble: Vec<String>,
    /// Printed after the example commands.
    pub epilogue: Vec<String>,
    /// Added to the JSON object as "quickstart".
    pub json: Option<serde_json::Value>,
}

pub fn run(args: ServeArgs, global: &Global) -> Result<()> {
    // --config: the file's settings under the command line's, and its [[export]] stacks.
    let (args, config_stacks) = crate::config::apply(args)?;
    let specs = args
        .exports
        .iter()
        .map(|a| exports::parse_spec(a))
        .collect::<Result<Vec<_>>>()?;
    let md_specs = args
        .md
        .iter()
        .map(|a| md::parse_md_spec(a))
        .collect::<Result<Vec<_>>>()?;
    // `--luks` with no value: the --md arrays hold LUKS. With a value: a LUKS volume.
    let luks_over_md = args.luks.iter().any(String::is_empty);
    if luks_over_md && md_specs.is_empty() {
        return Err(CliError::new(
            "--luks without a DEVICE means \"the --md arrays are encrypted\", but no --md was \
             given; name the volume: --luks DEVICE[:NAME]",
        ));
    }
    let luks_specs = args
        .luks
        .iter()
        .filter(|a| !a.is_empty())
        .map(|a| exports::parse_spec(a))
        .collect::<Result<Vec<_>>>()?;
    let key_file = args.key_file.as_deref();
    if key_file == Some(std::path::Path::new("-")) && luks_specs.len() + md_specs.len() > 1 {
        tracing::info!("one passphrase from stdin unlocks every LUKS volume given");
    }
    let mut opened = specs
        .iter()
        .map(|s| exports::open(s, args.read_only, args.direct))
        .collect::<Result<Vec<_>>>()?;
    // Read once when it comes from stdin; a terminal asks per volume.
    let shared_key = match key_file {
        Some(p) if !luks_specs.is_empty() || luks_over_md => Some(luks::read_key_file(p)?),
        _ => None,
    };
    let pass_for = |shown: &str| -> Result<cairn_luks::SecretBytes> {
        match &shared_key {
            Some(k) => Ok(cairn_luks::SecretBytes::from_slice(k.as_bytes())),
            None => luks::serve_passphrase(None, shown),
        }
    };
    for s in &luks_specs {
        let shown = s.path.display().to_string();
        let e = exports::open(s, args.read_only, args.direct)?;
        let pass = pass_for(&shown)?;
        opened.push(luks::open_export(e, pass.as_bytes(), &shown)?);
    }
    for s in &md_specs {
        let e = md::open_export(s, args.read_only, args.force)?;
        let e = md::with_stripe_cache(e, args.server.stripe_cache());
        if !luks_over_md {
            opened.push(e);
            continue;
        }
        let array = e.md.clone();
        let shown = format!(
            "the md array on {}",
            s.members
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        let unlocked = pass_for(&shown).and_then(|p| luks::open_export(e, p.as_bytes(), &shown));
        match unlocked {
            Ok(e) => opened.push(e),
            Err(err) => {
                // Not served after all: leave the array clean, as on shutdown.
                if let Some(a) = array {
                    let _ = a.close();
                }
                return Err(err);
            }
        }
    }
    // --lvm: the stacks above (bare) or the files listed are PVs; each LV is an export.
    if !args.lvm.is_empty() {
        let over_stacks = args.lvm.iter().any(String::is_empty);
        let mut pvs: Vec<OpenedExport> = Vec::new();
        if over_stacks {
            if md_specs.is_empty() && luks_specs.is_empty() {
                return Err(CliError::new(
                    "--lvm without PVs means \"the --md/--luks stacks hold LVM\", but neither \
                     was given; name the PVs: --lvm PV,PV,...",
                ));
            }
            pvs.extend(opened.drain(specs.len()..));
        }
        for list in args.lvm.iter().filter(|a| !a.is_empty()) {
            for p in list.split(',').filter(|p| !p.is_empty()) {
                let spec = exports::ExportSpec {
                    path: p.into(),
                    name: String::new(),
                };
                pvs.push(exports::open(&spec, args.read_only, args.direct)?);
            }
        }
        opened.extend(crate::volumes::open_lv_exports(pvs, args.read_only)?);
    }
    // The config's [[export]] stacks, then what --scan finds (config.rs, scan.rs).
    opened.extend(crate::config::open_stacks(&config_stacks, &args)?);
    let taken = opened.iter().map(|e| e.name.clone()).collect();
    opened.extend(crate::scan::for_serve(&args, taken)?);
    if opened.is_empty() {
        return Err(CliError::new(
            "nothing to export: the scan found no stack cairn can serve (see the lines \
             above; `cairn scan PATH` shows what is there)",
        ));
    }
    let named: Vec<exports::ExportSpec> = opened
        .iter()
        .map(|e| exports::ExportSpec {
            path: e.path.clone(),
            name: e.name.clone(),
        })
        .collect();
    exports::check_unique(&named)?;
    let listens = if args.server.listen.is_empty() {
        let (sock, tcp) = listen::defaults();
        vec![Listen::Unix(sock), Listen::Tcp(tcp)]
    } else {
        args.server.listen.clone()
    };
    serve(opened, listens, &args.server, global, Extras::default())
}

/// Binds `listens`, announces, and serves `opened` until a signal. Shared with quickstart.
pub fn serve(
    opened: Vec<OpenedExport>,
    listens: Vec<Listen>,
    opts: &ServerOptions,
    global: &Global,
    extras: Extras,
) -> Result<()> {
    if let Some(name) = &opts.default_export {
        if !opened.iter().any(|e| &e.name == name) {
            let names: Vec<&str> = opened.iter().map(|e| e.name.as_str()).collect();
            return Err(CliError::new(format!(
                "--default-export {name:?} is not one of the exports ({})",
                names.join(", ")
            )));
        }
    }
    for l in &listens {
        match l {
            Listen::Unix(path) => listen::prepare_socket_path(path)?,
            Listen::Tcp(addr) if !addr.ip().is_loopback() => tracing::warn!(
                "tcp:{addr} accepts connections from the network; NBD has no \
                 authentication, so anyone who can reach it can read and write these disks"
            ),
            Listen::Tcp(_) => {}
        }
    }
    let mut config = ServerConfig::new(
        opened
            .iter()
            .map(|e| Export {
                name: e.name.clone(),
                description: export_description(e),
                // Counted as the stack node "export:NAME" (cairn top, metrics).
                device: crate::daemon::wrap_export(&e.name, e.device.clone()),
                read_only: e.read_only,
            })
            .collect(),
    );
    config.default_export = opts.default_export.clone();
    config.threads_per_connection = usize::from(opts.threads);
    config.max_connections = usize::try_from(opts.max_connections).unwrap_or(usize::MAX);
    config.client_timeout = std::time::Duration::from_secs(opts.client_timeout);
    let server = Server::new(config).map_err(|e| CliError::new(e.to_string()))?;
    let listeners = server
        .bind(&listens)
        .map_err(|e| listen::bind_error(&e, &listens))?;
    let bound = listeners.addresses();
    // The operator's view: control socket, --metrics, --on-event (daemon.rs). Kept until
    // serve returns; dropping it removes the socket files.
    let operator = crate::daemon::start(&opts.operator, &opened, server.exports_handle(), &bound)?;

    // Signals are caught from here on, so one that arrives before serve() still stops it.
    // SIGHUP too: the terminal closing would otherwise kill cairn with arrays active.
    let mut signals = Signals::new([SIGINT, SIGTERM, SIGHUP])
        .map_err(|e| CliError::new(format!("cannot install signal handlers: {e}")))?;
    let shutdown = server.shutdown_handle();
    thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut seen = 0;
            for sig in signals.forever() {
                let name = match sig {
                    SIGINT => "SIGINT",
                    SIGHUP => "SIGHUP",
                    _ => "SIGTERM",
                };
                seen += 1;
                if seen == 1 {
                    tracing::info!(
                        "{name}: stopping; finishing in-flight requests and flushing data \
                         (send it again to exit at once)"
                    );
                    shutdown.shutdown();
                } else {
                    eprintln!("cairn: second {name}: exiting without waiting");
                    std::process::exit(130);
                }
            }
        })
        .map_err(|e| CliError::new(format!("cannot start the signal thread: {e}")))?;

    let default_export = opts
        .default_export
        .clone()
        .or_else(|| (opened.len() == 1).then(|| opened[0].name.clone()));
    let mut announcement = Announcement::new(&opened, &bound, default_export, extras.json.clone());
    announcement.control = operator.control.clone();
    announcement.metrics = operator.metrics.clone();
    // Writable arrays run their own background work while serving: a resync after an
    // unclean stop, rebuilds onto spares (now, or when a member fails), replacements,
    // and scrubs asked for with `cairn md check`.
    let arrays = exports::all_arrays(&opened);
    let limits = opts.speed_limits();
    for a in &arrays {
        let writable = !a.capabilities().read_only && opened.iter().any(|e| !e.read_only);
        if writable {
            a.manage(limits);
        }
    }
    let mut out = std::io::stdout().lock();
    // A closed stdout (`cairn serve ... | head -1`) must not stop the server.
    // One write of the whole line, so a reader that sees the newline has all of it.
    let _ = if global.json {
        serde_json::to_string(&announcement)
            .map_err(std::io::Error::from)
            .and_then(|line| out.write_all(format!("{line}\n").as_bytes()))
    } else {
        out.write_all(render_text(&announcement, &extras).as_bytes())
    };
    let _ = out.flush();
    drop(out);

    // The signal thread stays until the process exits: a signal during the final flush
    // is still ours (a second one exits at once) rather than the default, fatal action.
    // serve() flushes every writable export last and fails if a flush fails, so recent
    // writes that may not be on disk become the exit status, not a line in the log.
    let served = server.serve(listeners).map_err(|e| {
        CliError::new(format!(
            "the server stopped with an error, so recent writes may not be on disk: {e}"
        ))
    });
    // md arrays are marked clean even when serving failed, as far as they can be: a
    // failure here means the next start sees them dirty, which is the truth.
    let mut closed = Ok(());
    for a in &arrays {
        if let Err(err) = a.close() {
            closed = Err(CliError::new(format!(
                "{}: closing the md array failed, so it will need --force or a resync: {err}",
                a.report().name
            )));
        }
    }
    drop(operator);
    served?;
    closed?;
    tracing::info!("stopped cleanly: data flushed");
    Ok(())
}

/// The NBD description of an export: its stack from the top, e.g. "LV vg0/home over
/// LUKS2 aes-xts-plain64 ... over raid6 over d0.img, d1.img, d2.img, d3.img (clean)".
fn export_description(e: &OpenedExport) -> String {
    if let Some(lv) = &e.lvm {
        let pvs: Vec<String> = lv.pvs.iter().map(export_description).collect();
        return format!(
            "LV {}/{} over {}",
            lv.details.vg,
            lv.details.lv,
            pvs.join(" + ")
        );
    }
    let below = match &e.md {
        Some(a) => md_description(a),
        None => e.path.display().to_string(),
    };
    match &e.luks {
        Some(l) => format!("{} over {below}", l.description),
        None => below,
    }
}

/// "raid6 over d0.img, d1.img, d2.img, d3.img (clean, degraded)".
fn md_description(a: &cairn_md::Array) -> String {
    let r = a.report();
    let members: Vec<String> = r
        .members
        .iter()
        .filter(|m| m.state == cairn_md::MemberState::ActiveSync)
        .filter_map(|m| m.name.clone())
        .collect();
    format!("{} over {} ({})", r.level, members.join(", "), r.state_text)
}

/// What the server announces once it listens: the `--json` line, and the text's source.
#[derive(Debug, Serialize)]
pub struct Announcement {
    pub version: &'static str,
    pub pid: u32,
    pub listen: Vec<ListenInfo>,
    pub exports: Vec<ExportInfo>,
    pub default_export: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quickstart: Option<serde_json::Value>,
    /// The control socket (`cairn status --control PATH`), if one is served.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub control: Option<PathBuf>,
    /// The `--metrics` listener as bound (`tcp:127.0.0.1:9109`), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct ListenInfo {
    /// As `--listen` takes it: `unix:PATH` or `tcp:ADDR:PORT`.
    pub address: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
}

#[derive(Debug, Serialize)]
pub struct ExportInfo {
    pub name: String,
    /// The file, or for an md array its first member (see `md`).
    pub file: PathBuf,
    pub size: u64,
    pub logical_block_size: u32,
    pub read_only: bool,
    /// One NBD URI per listening address, in the order of `listen`.
    pub uris: Vec<String>,
    /// Block sizes the export advertises: preferred is the full stripe for an md array.
    pub physical_block_size: u32,
    pub optimal_io_size: u32,
    /// For `--md` exports: the array as `cairn md detail --json` shows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub md: Option<cairn_md::ArrayReport>,
    /// For `--luks` exports: the LUKS volume served decrypted (no key material).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub luks: Option<luks::LuksInfo>,
    /// For LV exports (`--lvm`): the LV's mapping and the stacks of its PVs, each as
    /// an export's `md`/`luks` fields describe them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lvm: Option<LvInfo>,
}

/// The LV behind an export, for the announcement.
#[derive(Debug, Serialize)]
pub struct LvInfo {
    #[serde(flatten)]
    pub details: crate::stack::LvDetails,
    pub pvs: Vec<PvInfo>,
}

/// One PV stack under an LV.
#[derive(Debug, Serialize)]
pub struct PvInfo {
    pub file: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub md: Option<cairn_md::ArrayReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub luks: Option<luks::LuksInfo>,
}

impl Announcement {
    fn new(
        opened: &[OpenedExport],
        bound: &[Listen],
        default_export: Option<String>,
        quickstart: Option<serde_json::Value>,
    ) -> Announcement {
        let listen = bound
            .iter()
            .map(|l| match l {
                Listen::Unix(p) => ListenInfo {
                    address: l.to_string(),
                    kind: "unix",
                    path: Some(p.clone()),
                    host: None,
                    port: None,
                },
                Listen::Tcp(a) => ListenInfo {
                    address: l.to_string(),
                    kind: "tcp",
                    path: None,
                    host: Some(a.ip().to_string()),
                    port: Some(a.port()),
                },
            })
            .collect();
        let exports = opened
            .iter()
            .map(|e| {
                let g = e.device.geometry();
                ExportInfo {
                    name: e.name.clone(),
                    file: std::path::absolute(&e.path).unwrap_or_else(|_| e.path.clone()),
                    size: g.size,
                    logical_block_size: g.logical_block_size,
                    read_only: e.read_only || e.device.capabilities().read_only,
                    uris: bound.iter().map(|l| l.uri(&e.name)).collect(),
                    physical_block_size: g.physical_block_size,
                    optimal_io_size: g.optimal_io_size,
                    md: e.md.as_ref().map(|a| a.report()),
                    luks: e.luks.clone(),
                    lvm: e.lvm.as_ref().map(|l| LvInfo {
                        details: l.details.clone(),
                        pvs: l
                            .pvs
                            .iter()
                            .map(|p| PvInfo {
                                file: std::path::absolute(&p.path)
                                    .unwrap_or_else(|_| p.path.clone()),
                                md: p.md.as_ref().map(|a| a.report()),
                                luks: p.luks.clone(),
                            })
                            .collect(),
                    }),
                }
            })
            .collect();
        Announcement {
            version: env!("CARGO_PKG_VERSION"),
            pid: std::process::id(),
            listen,
            exports,
            default_export,
            quickstart,
            control: None,
            metrics: None,
        }
    }
}

/// "LUKS2 aes-xts-plain64 512-bit, 4096-byte sectors (keyslot 0)".
fn luks_words(l: &luks::LuksInfo) -> String {
    let d = l
        .description
        .split(", data at")
        .next()
        .unwrap_or(&l.description);
    format!("{d} (keyslot {})", l.keyslot)
}

/// Where the example nbdfuse command mounts an export.
pub fn fuse_dir(name: &str) -> String {
    format!("/tmp/cairn-fuse-{}", fuse_file(name))
}

/// The file name nbdfuse gives the export in [`fuse_dir`]: LV exports (`vg/lv`) lose
/// the slash (`vg-lv`).
pub fn fuse_file(name: &str) -> String {
    name.replace('/', "-")
}

/// Quotes `s` for a POSIX shell when it needs it.
fn shell_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if safe {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// A URI connecting over TCP if there is a TCP listener, else the first one.
fn pick_uri(bound: &[Listen], name: &str, prefer_tcp: bool) -> String {
    let tcp = bound.iter().find(|l| matches!(l, Listen::Tcp(_)));
    let unix = bound.iter().find(|l| matches!(l, Listen::Unix(_)));
    let l = if prefer_tcp {
        tcp.or(unix)
    } else {
        unix.or(tcp)
    };
    l.map(|l| l.uri(name)).unwrap_or_default()
}

/// The human announcement: exports, addresses, commands to paste.
pub fn render_text(a: &Announcement, extras: &Extras) -> String {
    let mut s = String::new();
    for line in &extras.preamble {
        s.push_str(line);
        s.push('\n');
    }
    let n = a.exports.len();
    s.push_str(&format!(
        "cairn {} is serving {n} export{}:\n",
        a.version,
        if n == 1 { "" } else { "s" }
    ));
    let width = a.exports.iter().map(|e| e.name.len()).max().unwrap_or(0);
    let sizes: Vec<String> = a.exports.iter().map(|e| format_size(e.size)).collect();
    let size_width = sizes.iter().map(String::len).max().unwrap_or(0);
    for (e, size) in a.exports.iter().zip(&sizes) {
        let mode = if e.read_only {
            "read-only "
        } else {
            "read-write"
        };
        let default = if a.default_export.as_deref() == Some(e.name.as_str()) && n > 1 {
            "  (default)"
        } else {
            ""
        };
        let what = match (&e.md, e.lvm.as_ref().and_then(|l| l.pvs.first())) {
            (None, Some(pv)) => {
                let l = e.lvm.as_ref().expect("checked");
                let below = match (&pv.md, &pv.luks) {
                    (Some(r), Some(k)) => {
                        format!("{} over md {} {}", luks_words(k), r.level, r.name)
                    }
                    (Some(r), None) => format!("md {} {}", r.level, r.name),
                    (None, Some(k)) => format!("{} over {}", luks_words(k), pv.file.display()),
                    (None, None) => pv.file.display().to_string(),
                };
                let kind = if l.details.stripes > 1 {
                    format!(
                        "{}-way striped ({} stripes)",
                        l.details.stripes,
                        format_size(l.details.stripe_size)
                    )
                } else {
                    "linear".to_string()
                };
                let more = if l.pvs.len() > 1 {
                    format!(" and {} more PV(s)", l.pvs.len() - 1)
                } else {
                    String::new()
                };
                format!("LV {kind} over {below}{more}")
            }
            (Some(r), _) => {
                let members: Vec<String> = r
                    .members
                    .iter()
                    .filter(|m| m.state == cairn_md::MemberState::ActiveSync)
                    .filter_map(|m| m.name.clone())
                    .collect();
                let layout = r
                    .layout
                    .as_deref()
                    .map(|l| format!(" {l}"))
                    .unwrap_or_default();
                let chunk = r
                    .chunk_kib
                    .map(|c| format!(" {c}K chunk"))
                    .unwrap_or_default();
                format!(
                    "md {}{layout}{chunk} [{}] over {}; preferred I/O {}",
                    r.level,
                    r.state_text,
                    members.join(", "),
                    format_size(u64::from(e.optimal_io_size))
                )
            }
            (None, None) => e.file.display().to_string(),
        };
        let what = match &e.luks {
            Some(l) => format!("{} over {what}", luks_words(l)),
            None => what,
        };
        s.push_str(&format!(
            "  {:width$}  {:>size_width$}  {mode}  {what}{default}\n",
            e.name, size,
        ));
    }
    s.push_str("\nListening on:\n");
    for l in &a.listen {
        s.push_str(&format!("  {}\n", l.address));
    }
    if let Some(c) = &a.control {
        s.push_str(&format!(
            "Control socket: {} (cairn status, cairn top)\n",
            c.display()
        ));
    }
    if let Some(m) = &a.metrics {
        let url = m.strip_prefix("tcp:").map_or_else(
            || format!("{m} (GET /metrics)"),
            |hp| format!("http://{hp}/metrics"),
        );
        s.push_str(&format!("Metrics: {url}\n"));
    }
    let bound: Vec<Listen> = a
        .listen
        .iter()
        .filter_map(|l| l.address.parse().ok())
        .collect();
    if let Some(e) = a.exports.first() {
        let name = &e.name;
        let unix_uri = shell_quote(&pick_uri(&bound, name, false));
        let tcp_uri = shell_quote(&pick_uri(&bound, name, true));
        let fuse_dir = fuse_dir(name);
        let fuse_file = fuse_file(name);
        s.push_str("\nTry it from another shell:\n");
        s.push_str(&format!("  nbdinfo {unix_uri}\n"));
        s.push_str(&format!("  qemu-img info {tcp_uri}\n"));
        s.push_str(&format!(
            "  mkdir -p {fuse_dir} && nbdfuse {fuse_dir}/{fuse_file} {unix_uri} &\n"
        ));
        s.push_str(&format!(
            "    (the export is then the file {fuse_dir}/{fuse_file}; `fusermount3 -u {fuse_dir}` ends it)\n"
        ));
        if n > 1 {
            s.push_str("  (for the other exports, put their name in place of ");
            s.push_str(&format!("{name:?} in the URI)\n"));
        }
    }
    for line in &extras.epilogue {
        s.push_str(line);
        s.push('\n');
    }
    s.push_str("\nStop with Ctrl-C: requests in flight are answered and data is flushed first.\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting() {
        assert_eq!(
            shell_quote("nbd://127.0.0.1:10809/disk"),
            "nbd://127.0.0.1:10809/disk"
        );
        assert_eq!(
            shell_quote("nbd+unix:///disk?socket=/run/cairn/nbd.sock"),
            "'nbd+unix:///disk?socket=/run/cairn/nbd.sock'"
        );
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
