//! `cairn serve`: open the exports, bind, announce, serve until SIGINT/SIGTERM/SIGHUP.
//!
//! ```text
//!   FILE[:NAME]...    ─ Spec::File ─────────────────┐
//!   --md M1,M2,...    ─ Spec::Md ───────────────────┤  a bare --luks next to --md: the
//!   --luks DEV[:NAME] ─ Spec::Luks ─────────────────┤  arrays are LUKS (key: --key-file,
//!   --lvm [PV,...]    ─ Spec::Lvm ──────────────────┤  --key-dir, or the tty)
//!                       cairn_stack::open_all ──────┤  (stripe cache on RAID4/5/6)
//!   --config FILE     ─ config::open_stacks ────────┤  the [[export]] entries
//!   --scan PATH       ─ scan::for_serve ────────────┤  md, LUKS found on disk
//!   --listen / defaults ────────────────────────────┼─> Server::bind ─> announce ─> serve
//!   SIGINT/SIGTERM/SIGHUP thread ───────────────────┘   shutdown_handle().shutdown() ends
//!                                  serve, which finishes in-flight requests and flushes
//! ```

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread;

use cairn_block::BlockDevice;
use cairn_nbd::{Export, Listen, Server, ServerConfig, ServerTls};
use serde::Serialize;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

use crate::config::{Config, ExportEntry};
// A setting of the file and the flags alike; its home is the settings.
pub use crate::config::TlsMode;
use crate::daemon::OperatorOptions;
use crate::error::{CliError, Result};
use crate::global::Global;
use crate::listen;
use cairn_stack::discover::{scan, ScanOptions};
use cairn_stack::export::{self, OpenedExport};
use cairn_stack::size::format_size;
use cairn_stack::{Keys, Options, Spec};
use clap::Args;

/// Extra things `quickstart` wants said around the usual announcement.
#[derive(Debug, Default)]
pub struct Extras {
    /// Printed before the export table.
    pub preamble: Vec<String>,
    /// Printed after the example commands.
    pub epilogue: Vec<String>,
    /// Owner records this server keeps and enforces (fence.rs).
    pub fence: Option<Arc<dyn cairn_nbd::fence::FenceStore>>,
    /// Added to the JSON object as "quickstart".
    pub json: Option<serde_json::Value>,
    /// `--member-timeout`, for stacks the control API opens.
    pub remote_timeout: Option<std::time::Duration>,
    /// `--owner-id` and `--etcd`, for arrays the control API opens.
    pub ownership: cairn_stack::Ownership,
}

pub fn run(args: ServeArgs, global: &Global) -> Result<()> {
    // --config: the file's settings under the command line's, and its [[export]] stacks.
    let (args, config_stacks) = apply_config(args)?;
    let defs = stack_defs(&args)?;
    if args.key_file.as_deref() == Some(std::path::Path::new("-"))
        && defs.iter().filter(|(_, s)| has_luks(s)).count() > 1
    {
        tracing::info!("one passphrase from stdin unlocks every LUKS volume given");
    }
    let opts = open_options(&args)?;
    let mut keys = Keys::new(
        args.key_file.clone(),
        args.key_dir.clone(),
        opts.hooks.prompt.clone(),
    );
    let mut opened = cairn_stack::open_all(&defs, &opts, &mut keys)?;
    // The config's [[export]] stacks, then what --scan finds (config.rs, scan.rs).
    match open_config_stacks(&config_stacks, &args) {
        Ok(more) => opened.extend(more),
        Err(e) => {
            cairn_stack::spec::close_all(&opened);
            return Err(e);
        }
    }
    let taken = opened.iter().map(|e| e.name.clone()).collect();
    opened.extend(scan_for_serve(&args, taken)?);
    if opened.is_empty() {
        return Err(CliError::new(
            "nothing to export: the scan found no stack cairn can serve (see the lines \
             above; `cairn scan PATH` shows what is there)",
        ));
    }
    let named: Vec<cairn_stack::export::ExportSpec> = opened
        .iter()
        .map(|e| cairn_stack::export::ExportSpec {
            path: e.path.clone(),
            name: e.name.clone(),
        })
        .collect();
    cairn_stack::export::check_unique(&named)?;
    let listens = if args.server.listen.is_empty() {
        let (sock, tcp) = listen::defaults();
        vec![Listen::Unix(sock), Listen::Tcp(tcp)]
    } else {
        args.server.listen.clone()
    };
    // Owner records and etcd leases (fence.rs); held until serving ends.
    let plain = opened.iter().all(|e| {
        e.md().is_none()
            && e.luks().is_none()
            && e.lvm().is_none()
            && !cairn_stack::leaf::is_remote(&e.path)
    });
    let fencing = match crate::fence::setup(&args.fencing, plain, &opened) {
        Ok(f) => f,
        Err(e) => {
            cairn_stack::spec::close_all(&opened);
            return Err(e);
        }
    };
    let extras = Extras {
        fence: fencing.store.clone(),
        remote_timeout: opts.remote_timeout,
        ownership: opts.ownership.clone(),
        ..Extras::default()
    };
    serve(opened, listens, &args.server, global, extras)
}

/// How `serve` opens its stacks: its flags, the daemon's counters, the terminal for
/// passphrases (it says how to give a key file when there is none), who owns the arrays.
pub fn open_options(args: &ServeArgs) -> Result<Options> {
    Ok(Options {
        read_only: args.read_only,
        direct: args.direct,
        force: args.force,
        stripe_cache: Some(args.server.stripe_cache()),
        remote_timeout: Some(std::time::Duration::from_secs(args.member_timeout)),
        speed_limits: Some(args.server.speed_limits()),
        ownership: crate::fence::ownership(&args.fencing)?,
        hooks: crate::hooks::hooks(true),
    })
}

fn has_luks(s: &Spec) -> bool {
    match s {
        Spec::Luks { .. } => true,
        Spec::Lvm(pvs) => pvs.iter().any(has_luks),
        _ => false,
    }
}

/// The stacks the command line names, in the order they are served: FILE arguments,
/// `--luks` volumes, `--md` arrays (LUKS on them with a bare `--luks`), then `--lvm`'s
/// LVs (over those stacks with a bare `--lvm`, else over the PV files it lists).
pub fn stack_defs(args: &ServeArgs) -> Result<Vec<(Option<String>, Spec)>> {
    let files = args
        .exports
        .iter()
        .map(|a| export::parse_spec(a))
        .collect::<Result<Vec<_>>>()?;
    let (mds, volumes) = cairn_stack::spec::md_and_luks_args(&args.md, &args.luks)?;
    let mut defs: Vec<(Option<String>, Spec)> = files
        .into_iter()
        .map(|s| (Some(s.name), Spec::File(s.path)))
        .collect();
    let mut layered: Vec<(Option<String>, Spec)> = volumes.into_iter().chain(mds).collect();
    // --lvm: the stacks above (bare) or the files listed are PVs; each LV is an export.
    if !args.lvm.is_empty() {
        let mut pvs: Vec<Spec> = Vec::new();
        if args.lvm.iter().any(String::is_empty) {
            if layered.is_empty() {
                return Err(CliError::new(
                    "--lvm without PVs means \"the --md/--luks stacks hold LVM\", but neither \
                     was given; name the PVs: --lvm PV,PV,...",
                ));
            }
            pvs.extend(layered.drain(..).map(|(_, s)| s));
        }
        for list in args.lvm.iter().filter(|a| !a.is_empty()) {
            pvs.extend(
                list.split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| Spec::File(p.into())),
            );
        }
        layered.push((None, Spec::Lvm(pvs)));
    }
    defs.extend(layered);
    Ok(defs)
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
    let tls = opts.tls.server_tls()?;
    check_exposure(
        &listens,
        tls.as_ref().is_some_and(ServerTls::required),
        opts.tls.insecure_no_tls,
    )
    .map_err(CliError::new)?;
    check_tls_clients(&listens, tls.as_ref()).map_err(CliError::new)?;
    for l in &listens {
        match l {
            Listen::Unix(path) => listen::prepare_socket_path(path)?,
            Listen::Tcp(addr) if !addr.ip().is_loopback() && tls.is_none() => tracing::warn!(
                "tcp:{addr} accepts connections from the network without TLS; anyone who \
                 can reach it can read and write these disks"
            ),
            Listen::Tcp(_) => {}
        }
    }
    let mut config = ServerConfig::new(
        opened
            .iter()
            .map(|e| Export {
                name: e.name.clone(),
                description: cairn_stack::describe::export_description(e),
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
    config.fence = extras.fence.clone();
    let tls_info = TlsInfo::new(tls.as_ref(), &opts.tls);
    config.tls = tls;
    let server = Server::new(config).map_err(|e| CliError::new(e.to_string()))?;
    let listeners = server
        .bind(&listens)
        .map_err(|e| listen::bind_error(&e, &listens))?;
    let bound = listeners.addresses();
    // The operator's view: control socket, --metrics, --on-event (daemon.rs). Kept until
    // serve returns; dropping it removes the socket files.
    // Stacks added through the control API: the stripe cache as given, no terminal.
    let api_open = Options {
        stripe_cache: Some(opts.stripe_cache()),
        remote_timeout: extras.remote_timeout,
        speed_limits: Some(opts.speed_limits()),
        hooks: crate::hooks::hooks(false),
        ownership: extras.ownership.clone(),
        ..Options::default()
    };
    let operator = crate::daemon::start(
        &opts.operator,
        &opened,
        server.exports_handle(),
        &bound,
        api_open,
    )?;

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
    let mut announcement = Announcement::new(
        &opened,
        &bound,
        default_export,
        extras.json.clone(),
        tls_info,
    );
    announcement.control = operator.control.clone();
    announcement.metrics = operator.metrics.clone();
    // Writable arrays run their own background work while serving: a resync after an
    // unclean stop, rebuilds onto spares (now, or when a member fails), replacements,
    // and scrubs asked for with `cairn md check`.
    let arrays = cairn_stack::export::all_arrays(&opened);
    let limits = opts.speed_limits();
    // Arrays added through the control API later take it too.
    cairn_md::set_default_safe_mode_delay(opts.safe_mode_delay());
    for a in &arrays {
        let writable = !a.capabilities().read_only && opened.iter().any(|e| !e.read_only);
        if writable {
            a.manage(limits);
        }
    }
    // RAID LVs the same way: rebuilds of repaired images (`cairn lvm lvconvert --repair`
    // through the control socket), a resync left pending, their bitmaps' clearing.
    let lv_arrays = cairn_stack::export::raid_lv_arrays(&opened);
    for a in &lv_arrays {
        if !a.capabilities().read_only {
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
        match cairn_stack::fence::close_array(a) {
            Ok(()) => {}
            // Its lease was lost or a newer owner took the members over: nothing was
            // written since, and closing must not write either.
            Err(err) if err.kind() == cairn_block::ErrorKind::Fenced => {
                closed = Err(CliError::new(format!(
                    "{}: not closed, because this host may no longer own it (another host \
                     may serve it now): {err}",
                    a.report().name
                )));
            }
            Err(err) => {
                closed = Err(CliError::new(format!(
                    "{}: closing the md array failed, so it will need --force or a resync: \
                     {err}",
                    a.report().name
                )));
            }
        }
    }
    // The RAID LVs served now: those added through the API too, not those removed.
    for a in &operator.daemon.raid_lv_arrays() {
        if let Err(err) = a.close() {
            closed = Err(CliError::new(format!(
                "closing a RAID LV failed, so its bitmap may mark regions to resync: {err}"
            )));
        }
    }
    drop(operator);
    // Only one error becomes the exit message: the other is not lost (a fenced array's
    // final flush fails, and why it was not closed is the part that explains it).
    if let (Err(_), Err(c)) = (&served, &closed) {
        tracing::error!("{c}");
    }
    served?;
    closed?;
    tracing::info!("stopped cleanly: data flushed");
    Ok(())
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
    /// Whether NBD connections are encrypted.
    pub tls: TlsInfo,
}

/// TLS as served: `mode` is `off`, `on` (offered, plaintext served too) or `required`.
#[derive(Debug, Clone, Serialize)]
pub struct TlsInfo {
    pub mode: &'static str,
    /// `X.509` or `PSK`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
    /// X.509: who must present a client certificate: `every client`, `off loopback`,
    /// or `none` (`--tls-anonymous-clients`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub client_certificates: Option<&'static str>,
    /// What a libnbd URI needs to reach it (`tls-psk-file=...`), when TLS is required.
    #[serde(skip)]
    query: Option<String>,
}

impl TlsInfo {
    fn new(tls: Option<&ServerTls>, opts: &TlsOptions) -> TlsInfo {
        let Some(t) = tls else {
            return TlsInfo {
                mode: "off",
                credentials: None,
                client_certificates: None,
                query: None,
            };
        };
        let query = if let Some(f) = &opts.tls_psk {
            let f = std::path::absolute(f).unwrap_or_else(|_| f.clone());
            Some(format!("tls-psk-file={}", f.display()))
        } else {
            opts.tls_certificates.as_ref().map(|d| {
                let d = std::path::absolute(d).unwrap_or_else(|_| d.clone());
                format!("tls-certificates={}", d.display())
            })
        };
        TlsInfo {
            mode: if t.required() { "required" } else { "on" },
            credentials: Some(t.kind().to_string()),
            client_certificates: t.client_certificates(),
            query,
        }
    }

    /// `uri` as a client must write it: nbds:// and the credentials, when TLS is
    /// required.
    fn client_uri(&self, uri: String) -> String {
        if self.mode != "required" {
            return uri;
        }
        let uri = if let Some(rest) = uri.strip_prefix("nbd://") {
            format!("nbds://{rest}")
        } else if let Some(rest) = uri.strip_prefix("nbd+unix://") {
            format!("nbds+unix://{rest}")
        } else {
            uri
        };
        match &self.query {
            Some(q) if uri.contains('?') => format!("{uri}&{q}"),
            Some(q) => format!("{uri}?{q}"),
            None => uri,
        }
    }
}

/// Refuses a TCP listener off loopback unless TLS is required or the user said
/// `--insecure-no-tls`: NBD itself has no authentication.
pub fn check_exposure(
    listens: &[Listen],
    tls_required: bool,
    insecure: bool,
) -> std::result::Result<(), String> {
    if tls_required || insecure {
        return Ok(());
    }
    match listens.iter().find_map(|l| match l {
        Listen::Tcp(a) if !a.ip().is_loopback() => Some(a),
        _ => None,
    }) {
        Some(a) => Err(format!(
            "tcp:{a} is reachable from the network and TLS is not required: anyone who can \
             reach it could read and write these disks. Use --tls require with \
             --tls-psk FILE or --tls-certificates DIR (see docs/tls.md), or say \
             --insecure-no-tls on a network you trust"
        )),
        None => Ok(()),
    }
}

/// Refuses X.509 without `--tls-verify-peer` on a listener off loopback when clients
/// there could not be asked for a certificate (no `ca-cert.pem`) and
/// `--tls-anonymous-clients` was not said: a server certificate alone lets anyone in.
pub fn check_tls_clients(
    listens: &[Listen],
    tls: Option<&ServerTls>,
) -> std::result::Result<(), String> {
    let Some(problem) = tls.and_then(ServerTls::remote_clients_problem) else {
        return Ok(());
    };
    match listens.iter().find_map(|l| match l {
        Listen::Tcp(a) if !a.ip().is_loopback() => Some(a),
        _ => None,
    }) {
        Some(a) => Err(format!(
            "tcp:{a} is reachable from the network and {problem}: add the CA's \
             ca-cert.pem to the directory (see docs/tls.md), or say \
             --tls-anonymous-clients to let any client in without a certificate"
        )),
        None => Ok(()),
    }
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
    pub luks: Option<cairn_stack::export::LuksInfo>,
    /// For LV exports (`--lvm`): the LV's mapping and the stacks of its PVs, each as
    /// an export's `md`/`luks` fields describe them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lvm: Option<LvInfo>,
}

/// The LV behind an export, for the announcement.
#[derive(Debug, Serialize)]
pub struct LvInfo {
    #[serde(flatten)]
    pub details: cairn_stack::node::LvDetails,
    pub pvs: Vec<PvInfo>,
}

/// One PV stack under an LV.
#[derive(Debug, Serialize)]
pub struct PvInfo {
    pub file: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub md: Option<cairn_md::ArrayReport>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub luks: Option<cairn_stack::export::LuksInfo>,
}

impl Announcement {
    fn new(
        opened: &[OpenedExport],
        bound: &[Listen],
        default_export: Option<String>,
        quickstart: Option<serde_json::Value>,
        tls: TlsInfo,
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
                    uris: bound
                        .iter()
                        .map(|l| tls.client_uri(l.uri(&e.name)))
                        .collect(),
                    physical_block_size: g.physical_block_size,
                    optimal_io_size: g.optimal_io_size,
                    md: e.md().map(|a| a.report()),
                    luks: e.luks().cloned(),
                    lvm: e.lvm().map(|l| LvInfo {
                        details: l.details.clone(),
                        pvs: l
                            .pvs
                            .iter()
                            .map(|p| PvInfo {
                                file: std::path::absolute(&p.path)
                                    .unwrap_or_else(|_| p.path.clone()),
                                md: p.md().map(|a| a.report()),
                                luks: p.luks().cloned(),
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
            tls,
        }
    }
}

/// "LUKS2 aes-xts-plain64 512-bit, 4096-byte sectors (keyslot 0)".
fn luks_words(l: &cairn_stack::export::LuksInfo) -> String {
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
                let kind = if l.details.segtype.starts_with("raid") || l.details.segtype == "mirror"
                {
                    format!("{} ({} data stripes)", l.details.segtype, l.details.stripes)
                } else if l.details.stripes > 1 {
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
    s.push_str(&match (&a.tls.credentials, a.tls.mode) {
        (Some(c), "required") => format!("TLS: required ({c}); nothing is served in plaintext\n"),
        (Some(c), _) => format!("TLS: on ({c}), offered; plaintext clients are served too\n"),
        _ => "TLS: off\n".to_string(),
    });
    match a.tls.client_certificates {
        Some("every client") => {
            s.push_str("TLS clients: every one presents a certificate the CA signed\n")
        }
        Some("off loopback") => s.push_str(
            "TLS clients: off loopback they present a certificate the CA signed; on loopback \
             none is asked\n",
        ),
        Some(_) => s.push_str(
            "TLS clients: ANONYMOUS (--tls-anonymous-clients): anyone who reaches a listener \
             reads and writes the exports, encrypted but unauthenticated\n",
        ),
        None => {}
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
        let unix_uri = shell_quote(&a.tls.client_uri(pick_uri(&bound, name, false)));
        let tcp_uri = shell_quote(&a.tls.client_uri(pick_uri(&bound, name, true)));
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

// ---- --scan ------------------------------------------------------------------------

/// `serve --scan`: the stacks found, unlocked and assembled for serving, avoiding the
/// names in `taken`. What was skipped, and why, goes to stderr.
pub fn scan_for_serve(args: &ServeArgs, taken: Vec<String>) -> Result<Vec<OpenedExport>> {
    if args.scan.is_empty() {
        return Ok(Vec::new());
    }
    let opts = ScanOptions {
        read_only: args.read_only,
        force: args.force,
        direct: args.direct,
        key_file: args.key_file.clone(),
        key_dir: args.key_dir.clone(),
        dry_run: false,
        taken_names: taken,
        stripe_cache: args.server.stripe_cache(),
        hooks: crate::hooks::hooks(crate::tty::available()),
        ownership: crate::fence::ownership(&args.fencing)?,
    };
    let (exports, report) = scan(&args.scan, &opts)?;
    for w in report.warnings() {
        eprintln!("cairn: {w}");
    }
    for e in &report.exports {
        tracing::info!(
            "scan: exporting {:?}: {} [{}]",
            e.name,
            e.layers.join(" over "),
            e.state
        );
    }
    Ok(exports)
}

// ---- the config file (--config): its settings under the command line's ------------

/// Fills what the command line left unset from `--config`, and returns the config's
/// `[[export]]` stacks. Lists (listen, scan) from the command line replace the file's;
/// flags (read_only, force, direct) add to it; a `--threads` equal to the default counts
/// as unset.
pub fn apply_config(args: ServeArgs) -> Result<(ServeArgs, Vec<ExportEntry>)> {
    let Some(path) = args.config.clone() else {
        return Ok((args, Vec::new()));
    };
    let c = crate::config::load(&path)?;
    Ok(merge(args, c))
}

fn merge(mut a: ServeArgs, c: Config) -> (ServeArgs, Vec<ExportEntry>) {
    if a.server.listen.is_empty() {
        a.server.listen = c
            .listen
            .iter()
            .map(|l| l.parse().expect("checked in parse"))
            .collect();
    }
    if a.server.threads == DEFAULT_THREADS {
        if let Some(t) = c.threads {
            a.server.threads = t;
        }
    }
    if a.server.default_export.is_none() {
        a.server.default_export = c.default_export;
    }
    a.server.stripe_cache_size = a.server.stripe_cache_size.or(c.stripe_cache_size);
    a.server.stripe_cache_hold_ms = a.server.stripe_cache_hold_ms.or(c.stripe_cache_hold_ms);
    a.read_only |= c.read_only;
    a.direct |= c.direct;
    a.force |= c.force;
    if a.scan.is_empty() {
        a.scan = c.scan;
    }
    if a.key_file.is_none() {
        a.key_file = c.key_file;
    }
    if a.key_dir.is_none() {
        a.key_dir = c.key_dir;
    }
    // TLS credentials come as one set: the file's only when the command line gave none.
    let t = &mut a.server.tls;
    if t.tls_certificates.is_none() && t.tls_psk.is_none() {
        t.tls_certificates = c.tls_certificates;
        t.tls_psk = c.tls_psk;
        t.tls_verify_peer |= c.tls_verify_peer;
        t.tls_anonymous_clients |= c.tls_anonymous_clients;
    }
    t.tls = t.tls.or(c.tls);
    t.insecure_no_tls |= c.insecure_no_tls;
    (a, c.exports)
}

/// Opens the config's `[[export]]` stacks as `cairn serve FILE`, `--md`, `--luks` and
/// `--lvm` would: the entries marked `lvm` together as the PVs of their volume groups,
/// after the others.
pub fn open_config_stacks(entries: &[ExportEntry], args: &ServeArgs) -> Result<Vec<OpenedExport>> {
    let base = crate::serve::open_options(args)?;
    let opts = |read_only: bool| Options {
        read_only: args.read_only || read_only,
        hooks: crate::hooks::hooks(crate::tty::available()),
        ..base.clone()
    };
    let mut keys = Keys::new(
        args.key_file.clone(),
        args.key_dir.clone(),
        opts(false).hooks.prompt,
    );
    let mut out: Vec<OpenedExport> = Vec::new();
    for entry in entries.iter().filter(|e| !e.lvm) {
        let spec = crate::config::entry_spec(entry);
        match cairn_stack::open(
            &spec,
            entry.name.as_deref(),
            &opts(entry.read_only),
            &mut keys,
        ) {
            Ok(e) => out.extend(e),
            Err(err) => {
                // Not served after all: leave arrays clean, as on shutdown.
                cairn_stack::spec::close_all(&out);
                return Err(err);
            }
        }
    }
    let pvs: Vec<&ExportEntry> = entries.iter().filter(|e| e.lvm).collect();
    if !pvs.is_empty() {
        let spec = Spec::Lvm(pvs.iter().map(|e| crate::config::entry_spec(e)).collect());
        let read_only = pvs.iter().any(|e| e.read_only);
        match cairn_stack::open(&spec, None, &opts(read_only), &mut keys) {
            Ok(e) => out.extend(e),
            Err(err) => {
                cairn_stack::spec::close_all(&out);
                return Err(err);
            }
        }
    }
    Ok(out)
}

// ---- the command line (clap) ----------------------------------------------------
//

/// Requests one connection runs at once for `cairn serve`: measured in docs/BENCHMARKS.md.
pub const DEFAULT_THREADS: u16 = 32;

/// `cairn serve --max-connections` and `--client-timeout` defaults (quickstart too).
pub const DEFAULT_MAX_CONNECTIONS: u32 = 256;

pub const DEFAULT_CLIENT_TIMEOUT: u64 = 30;

pub(crate) const SERVE_LONG: &str = "\
Export files or block devices over NBD.

Each FILE becomes one export. Its name is the file name without its extension \
(disk.img -> \"disk\", /dev/sdb -> \"sdb\"), or NAME when given as FILE:NAME. Clients \
pick an export by name: nbd://HOST:PORT/NAME or nbd+unix:///NAME?socket=PATH.

Without --listen, cairn listens on a Unix socket ($XDG_RUNTIME_DIR/cairn/nbd.sock, or \
/run/cairn/nbd.sock as root) and on TCP 127.0.0.1:10809, the standard NBD port, on \
loopback only. Nothing is reachable from other machines unless you ask for it with \
--listen tcp:0.0.0.0:10809, which needs TLS (--tls-psk FILE or --tls-certificates DIR, \
see docs/tls.md) or --insecure-no-tls: NBD has no authentication of its own.

cairn runs in the foreground. Ctrl-C (SIGINT), SIGTERM or SIGHUP (its terminal closing) \
stops it cleanly: requests already received are answered, data is flushed to the files, \
then it exits 0. A second signal exits at once.

--md serves an md RAID array (made by `cairn md create` or by mdadm) from its members. \
The array is marked active while it is written and clean again when cairn stops, as the \
kernel does. NBD clients are told the full stripe as the preferred block size (when it \
is a power of two), so they write whole stripes and avoid read-modify-write.

--luks opens a LUKS2 or LUKS1 volume (made by `cairn luks format`, cryptsetup or qemu-img) \
and exports its decrypted contents: clients read and write plaintext, cairn encrypts \
(aes-xts-plain64) on the way to the disk, as dm-crypt does. `--md M1,M2,... --luks` does \
the same for an md array with LUKS on it. The passphrase comes from --key-file or is \
asked for on the terminal; it is used once to unlock the volume key and then dropped.";

pub(crate) const SERVE_EXAMPLES: &str = "\
Examples:
  cairn serve disk.img                         # export \"disk\"
  cairn serve --md d0.img,d1.img,d2.img,d3.img:data
                                               # an md array (cairn md create) as \"data\"
  cairn serve --luks vol.img --key-file key     # a LUKS volume, decrypted, as \"vol\"
  cairn serve --md d0.img,d1.img,d2.img,d3.img:data --luks --key-file key
                                               # LUKS2 over an md array
  cairn serve a.img b.img:data                 # exports \"a\" and \"data\"
  cairn serve --read-only /dev/sdb:backup      # a block device, read-only
  cairn serve --listen unix:/tmp/nbd.sock --listen tcp:127.0.0.1:0 --json disk.img
                                               # port 0: any free port, printed in the JSON

Then, from another shell:
  nbdinfo nbd://127.0.0.1:10809/disk
  qemu-img info nbd://127.0.0.1:10809/disk
  nbdcopy image.raw nbd://127.0.0.1:10809/disk";

/// `cairn serve`.
#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("key_users").args(["luks", "scan", "config"]).multiple(true))]
pub struct ServeArgs {
    /// Files or block devices to export; append :NAME to choose the export name
    #[arg(value_name = "FILE[:NAME]", required_unless_present_any = ["md", "luks", "lvm", "scan", "config"])]
    pub exports: Vec<String>,

    /// Open this LUKS2 or LUKS1 volume (a file or block device) and export it decrypted
    /// as NAME [default: the file name]; repeatable. Given with no value next to --md,
    /// the md arrays themselves hold LUKS and are exported decrypted
    #[arg(long, value_name = "DEVICE[:NAME]", num_args = 0..=1, default_missing_value = "")]
    pub luks: Vec<String>,

    /// The LUKS passphrase, read from FILE's exact bytes (`-`: stdin) [default: ask on
    /// the terminal]
    #[arg(
        long,
        value_name = "FILE",
        visible_alias = "keyfile",
        requires = "key_users"
    )]
    pub key_file: Option<PathBuf>,

    /// Assemble the md array on these members (comma-separated, any order) and export
    /// it as NAME [default: the array's name]; repeatable. Missing member files make the
    /// array degraded, with a warning, when its level tolerates it
    #[arg(long, value_name = "MEMBER,MEMBER,...[:NAME]")]
    pub md: Vec<String>,

    /// Open the LVM2 volume groups on these PVs (comma-separated files or block devices;
    /// every PV of a VG must be given) and export each logical volume as VG/LV.
    /// Given with no value next to --md or --luks, those stacks are the PVs (the
    /// classic md -> LUKS -> LVM stack)
    #[arg(long, value_name = "PV,PV,...", num_args = 0..=1, default_missing_value = "")]
    pub lvm: Vec<String>,

    /// Start an md array that is degraded and was not shut down cleanly (its parity may
    /// not match where a write was interrupted), or degraded because a member given is
    /// stale (mdadm --run); or, when too many members failed, take back the freshest of
    /// them by event count (mdadm --assemble --force: data they missed may be
    /// inconsistent; run `cairn md check`). On remote members, also take them over from
    /// an owner that did not release them (its host is down for good); with --etcd, the
    /// array's lease decides that instead
    #[arg(short, long)]
    pub force: bool,

    #[command(flatten)]
    pub server: ServerOptions,

    /// Export everything read-only: clients may read but every write is refused
    #[arg(long)]
    pub read_only: bool,

    /// Open files with O_DIRECT, bypassing the page cache (block size becomes 4096)
    #[arg(long)]
    pub direct: bool,

    /// Find the stacks on PATH (a directory of member images, a file or a block device)
    /// and serve every one it can assemble: md arrays, LUKS on files and arrays;
    /// repeatable. A directory exports recognised stacks only (see `cairn scan --help`)
    #[arg(long, value_name = "PATH")]
    pub scan: Vec<PathBuf>,

    /// LUKS passphrases by volume: DIR/<LUKS UUID> or DIR/<LUKS UUID>.key, tried before
    /// --key-file
    #[arg(long, value_name = "DIR")]
    pub key_dir: Option<PathBuf>,

    /// Read listeners, settings and exports from this TOML file (docs/cairn.example.toml);
    /// options given on the command line win over it
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Seconds a remote member (nbd://HOST/EXPORT, nbd+unix:///EXPORT?socket=PATH) may
    /// take to answer a request or a connection before it counts as failed: the array
    /// goes on degraded and cairn reconnects in the background, re-adding the member
    /// (rebuilt from the write-intent bitmap) when its server answers again
    #[arg(long, value_name = "SECONDS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub member_timeout: u64,

    #[command(flatten)]
    pub fencing: crate::fence::FenceOptions,
}

/// How to serve, shared by `serve` and `quickstart`.
#[derive(Debug, Clone, Args)]
pub struct ServerOptions {
    /// Address to listen on: unix:PATH or tcp:ADDR:PORT (repeatable; default: a Unix
    /// socket and tcp:127.0.0.1:10809)
    #[arg(short, long = "listen", value_name = "ADDRESS")]
    pub listen: Vec<Listen>,

    /// Requests each client connection may have running at once. They run on one pool of
    /// worker threads shared by all connections (started when requests wait, ended when
    /// idle, at most 256), and their replies go out as each finishes. 32 matches the
    /// queue depth of common clients, so one connection gets the parallelism of a disk or
    /// network below; 1 answers one request at a time, in order
    #[arg(long, value_name = "N", default_value_t = DEFAULT_THREADS,
          value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: u16,

    /// Most client connections served at once, handshakes included; more are closed at
    /// once until some end
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_connections: u32,

    /// Seconds a client may take to finish the NBD handshake, and may go without reading
    /// a reply it is being sent, before it is disconnected (a reply still going out after
    /// this must have been read at 256 KiB/s or more over it). Such a client otherwise
    /// holds a connection slot, and the memory of its unsent replies, for ever
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_CLIENT_TIMEOUT,
          value_parser = clap::value_parser!(u64).range(1..=86400))]
    pub client_timeout: u64,

    /// Export served to clients that ask for no name (default: the only export, if one)
    #[arg(long, value_name = "NAME")]
    pub default_export: Option<String>,

    /// Background resync speed kept while clients do I/O, KiB/s (md's speed_limit_min)
    #[arg(long, value_name = "KIB", default_value_t = 1000)]
    pub speed_limit_min: u64,

    /// Background resync speed ceiling when the array is idle, KiB/s (md's
    /// speed_limit_max)
    #[arg(long, value_name = "KIB", default_value_t = 200_000)]
    pub speed_limit_max: u64,

    /// Stripe cache of RAID4/5/6 arrays (md's stripe_cache_size, same unit: stripe heads
    /// of one 4 KiB page per member). Concurrent writes that each cover part of a stripe
    /// are held and merged into one full-stripe write, which needs no reads; a write is
    /// answered only once it is written. 0 turns it off [default: 256]
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u32).range(0..=32768))]
    pub stripe_cache_size: Option<u32>,

    /// Longest a partial-stripe write waits in the stripe cache for its neighbours, in
    /// milliseconds; FLUSH and FUA write held stripes at once [default: 2]
    #[arg(long, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(0..=1000))]
    pub stripe_cache_hold_ms: Option<u64>,

    /// How long an md array must go unwritten before its superblocks are marked clean
    /// again while it runs, in milliseconds (md's safe_mode_delay); the next write marks
    /// it dirty first. Each switch counts one event, which is what lets md tell an old
    /// copy of a member from a current one. 0 keeps arrays dirty from their first write
    /// until they stop [default: 200]
    #[arg(long, value_name = "MS",
          value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub safe_mode_delay: Option<u64>,

    #[command(flatten)]
    pub operator: OperatorOptions,

    #[command(flatten)]
    pub tls: TlsOptions,
}

/// NBD over TLS (docs/tls.md).
#[derive(Debug, Clone, Default, Args)]
pub struct TlsOptions {
    /// TLS for NBD connections: off; on (offered, plaintext clients served too); require
    /// (nothing but STARTTLS before the TLS handshake: no export names, no data)
    /// [default: require when credentials are given, else off]
    #[arg(long, value_name = "MODE", value_enum)]
    pub tls: Option<TlsMode>,

    /// X.509 credentials: a directory with server-cert.pem and server-key.pem (and
    /// ca-cert.pem for --tls-verify-peer), as nbdkit and libnbd lay it out
    #[arg(long, value_name = "DIR", conflicts_with = "tls_psk")]
    pub tls_certificates: Option<PathBuf>,

    /// With --tls-certificates: clients must present a certificate signed by the CA in
    /// ca-cert.pem
    #[arg(long, requires = "tls_certificates")]
    pub tls_verify_peer: bool,

    /// Pre-shared keys: a psktool file of username:hexkey lines (several users allowed)
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,

    /// Listen on a non-loopback TCP address without --tls require (anyone who reaches
    /// the port can read and write the exports)
    #[arg(long)]
    pub insecure_no_tls: bool,

    /// With --tls-certificates and no --tls-verify-peer: serve clients off loopback
    /// without a client certificate too (by default they must present one ca-cert.pem
    /// signed; on loopback none is asked)
    #[arg(
        long,
        requires = "tls_certificates",
        conflicts_with = "tls_verify_peer"
    )]
    pub tls_anonymous_clients: bool,
}

impl TlsOptions {
    /// The server's TLS, or `None` for off. Credentials are read now, so a missing or
    /// bad file stops `cairn serve` before it listens.
    pub fn server_tls(&self) -> Result<Option<ServerTls>> {
        let creds = if let Some(f) = &self.tls_psk {
            Some(ServerTls::psk(f))
        } else {
            self.tls_certificates
                .as_ref()
                .map(|d| ServerTls::x509(d, self.tls_verify_peer))
        };
        let mode = self.tls.unwrap_or(if creds.is_some() {
            TlsMode::Require
        } else {
            TlsMode::Off
        });
        match (mode, creds) {
            (TlsMode::Off, _) => Ok(None),
            (_, None) => Err(CliError::new(
                "--tls on/require needs credentials: --tls-psk FILE or --tls-certificates DIR",
            )),
            (m, Some(c)) => {
                let c = c.map_err(|e| CliError::new(format!("TLS: {e}")))?;
                Ok(Some(
                    c.with_required(m == TlsMode::Require)
                        .with_anonymous_clients(self.tls_anonymous_clients),
                ))
            }
        }
    }
}

impl ServerOptions {
    /// md's safe-mode delay (`None`: off), for every array this process serves.
    pub fn safe_mode_delay(&self) -> Option<std::time::Duration> {
        match self.safe_mode_delay {
            Some(0) => None,
            Some(ms) => Some(std::time::Duration::from_millis(ms)),
            None => Some(cairn_md::DEFAULT_SAFE_MODE_DELAY),
        }
    }

    /// The resync pacing, in bytes per second.
    pub fn speed_limits(&self) -> cairn_md::SpeedLimits {
        let max = self.speed_limit_max.max(1).saturating_mul(1024);
        cairn_md::SpeedLimits {
            min: self.speed_limit_min.saturating_mul(1024).min(max),
            max,
        }
    }

    /// The stripe cache put over RAID4/5/6 arrays that are served writable.
    pub fn stripe_cache(&self) -> cairn_md::StripeCacheOptions {
        let d = cairn_md::StripeCacheOptions::default();
        cairn_md::StripeCacheOptions {
            size: self.stripe_cache_size.unwrap_or(d.size),
            hold: self
                .stripe_cache_hold_ms
                .map_or(d.hold, std::time::Duration::from_millis),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_network_listener_needs_tls_required_or_insecure() {
        let l = |s: &str| -> Listen { s.parse().unwrap() };
        let local = [
            l("tcp:127.0.0.1:0"),
            l("tcp:[::1]:0"),
            l("unix:/tmp/x.sock"),
        ];
        assert!(check_exposure(&local, false, false).is_ok());
        for open in ["tcp:0.0.0.0:0", "tcp:[::]:0", "tcp:192.0.2.1:10809"] {
            let ls = [l("unix:/tmp/x.sock"), l(open)];
            let e = check_exposure(&ls, false, false).unwrap_err();
            assert!(
                e.contains("--insecure-no-tls") && e.contains("--tls require"),
                "{e}"
            );
            assert!(check_exposure(&ls, true, false).is_ok());
            assert!(check_exposure(&ls, false, true).is_ok());
        }
    }

    #[test]
    fn tls_uris_for_clients() {
        let t = TlsInfo {
            mode: "required",
            credentials: Some("PSK".into()),
            client_certificates: None,
            query: Some("tls-psk-file=/k.psk".into()),
        };
        assert_eq!(
            t.client_uri("nbd://127.0.0.1:10809/d".into()),
            "nbds://127.0.0.1:10809/d?tls-psk-file=/k.psk"
        );
        assert_eq!(
            t.client_uri("nbd+unix:///d?socket=/s".into()),
            "nbds+unix:///d?socket=/s&tls-psk-file=/k.psk"
        );
        let on = TlsInfo { mode: "on", ..t };
        assert_eq!(on.client_uri("nbd://h/d".into()), "nbd://h/d");
    }

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

#[cfg(test)]
mod config_tests {
    use super::*;
    use crate::config::parse;
    use clap::Parser;
    use std::path::Path;

    /// `cairn serve`'s options alone, parsed as the command line would.
    #[derive(Debug, Parser)]
    struct Serve {
        #[command(flatten)]
        args: ServeArgs,
    }

    fn try_serve_args(argv: &[&str]) -> std::result::Result<ServeArgs, clap::Error> {
        let mut full = vec!["serve"];
        full.extend_from_slice(argv);
        Serve::try_parse_from(full).map(|s| s.args)
    }

    fn serve_args(argv: &[&str]) -> ServeArgs {
        try_serve_args(argv).unwrap()
    }

    #[test]
    fn scan_and_config_stand_in_for_files() {
        let a = serve_args(&["--scan", "/d", "--key-file", "k", "--key-dir", "/keys"]);
        assert!(a.exports.is_empty());
        assert_eq!(a.scan, [PathBuf::from("/d")]);
        assert!(try_serve_args(&["--config", "c.toml"]).is_ok());
        // A key file still needs something to unlock.
        assert!(try_serve_args(&["--key-file", "k", "a.img"]).is_err());
    }

    #[test]
    fn the_command_line_wins() {
        let c = parse(
            "listen = [\"tcp:127.0.0.1:1\"]\nthreads = 4\nscan = [\"/a\"]\nkey_file = \"/k\"\n\
             read_only = true\n",
            "c",
            Path::new("/"),
        )
        .unwrap();
        let a = serve_args(&[
            "--config",
            "c",
            "--listen",
            "tcp:127.0.0.1:2",
            "--key-file",
            "/k2",
        ]);
        let (m, _) = merge(a, c.clone());
        assert_eq!(m.server.listen, ["tcp:127.0.0.1:2".parse().unwrap()]);
        assert_eq!(m.server.threads, 4);
        assert_eq!(m.scan, [PathBuf::from("/a")]);
        assert_eq!(m.key_file, Some(PathBuf::from("/k2")));
        assert!(m.read_only);
        let a = serve_args(&["--config", "c", "--threads", "8", "--scan", "/b"]);
        let (m, _) = merge(a, c);
        assert_eq!(m.server.threads, 8);
        assert_eq!(m.scan, [PathBuf::from("/b")]);
        assert_eq!(m.server.listen, ["tcp:127.0.0.1:1".parse().unwrap()]);
    }

    #[test]
    fn stripe_cache_keys() {
        let c = parse(
            "stripe_cache_size = 4096\nstripe_cache_hold_ms = 5\n",
            "c",
            Path::new("/"),
        )
        .unwrap();
        let (m, _) = merge(serve_args(&["--config", "c"]), c.clone());
        let o = m.server.stripe_cache();
        assert_eq!((o.size, o.hold.as_millis()), (4096, 5));
        let a = serve_args(&["--config", "c", "--stripe-cache-size", "0"]);
        let (m, _) = merge(a, c);
        assert_eq!(m.server.stripe_cache().size, 0);
        assert_eq!(m.server.stripe_cache().hold.as_millis(), 5);
        let d = serve_args(&["x.img"]).server.stripe_cache();
        assert_eq!(d, cairn_md::StripeCacheOptions::default());
        assert!(parse("stripe_cache_size = 40000\n", "c", Path::new("/")).is_err());
    }
}
