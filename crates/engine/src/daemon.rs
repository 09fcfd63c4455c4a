//! The daemon's state and its management plane: the exports it serves (each an opened
//! stack), the control API's answers and actions, and the monitor that turns state
//! changes into events. The CLI binds the sockets and starts the threads; everything a
//! request or an event needs is here.
//!
//! ```text
//!   control socket (http) ─ Daemon::handle ─ GET  status, exports, arrays, stats, lvm
//!                                          └ POST/DELETE ─ Action ─ Daemon::apply
//!                                              add-export (any Spec) ─ cairn_stack::open
//!                                              md fail/add/remove/replace/check ─ md's Change
//!   md arrays ── pushed changes ─ md_events::MdEvents (registered per array) ─ events
//!                                          Fail / DegradedArray / RebuildStarted ...
//!   --metrics (http) ──── Daemon::handle_metrics ─ metrics::render (+ the replicated
//!                                                  resources' gauges, asked at each scrape)
//!   GET /v1/replication ─ cairn_repl::control ─ each `cairn repl up` process's own
//!                         control socket in the runtime directory (a status each)
//! ```
//!
//! Every answer is built from `cairn_stack::describe`, so the status tree, the API, the
//! metrics labels and the events name the same nodes. Each action is idempotent and says
//! whether it changed anything.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use cairn_block::BlockDevice;
use cairn_nbd::{Export, ExportsHandle, Listen};
use cairn_repl::control;
use cairn_stack::export::OpenedExport;
use cairn_stack::node::{self, Node, NodeKind};
use cairn_stack::size::format_size;
use cairn_stack::{Keys, Options, Spec};
use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::events::{self, EventSpec, Events};
use crate::http::{Request, Response};
use crate::md_events::MdEvents;
use crate::metrics;
use crate::stats::{self, Registry};

/// Events shown in `/v1/status`.
const STATUS_EVENTS: usize = 20;

/// How long `/v1/replication` waits for a replicated resource's process: a live one
/// answers a status at once, and one that is stopped or stuck must not hold the API.
const REPL_TIMEOUT: Duration = Duration::from_secs(2);

/// Counts an md member's I/O under its stack node id `member:NAME`.
fn wrap_member(name: &str, dev: Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice> {
    Registry::global().wrap(&format!("member:{name}"), dev)
}

/// Counts `dev`'s I/O as the export `name` (what NBD clients see).
pub fn wrap_export(name: &str, dev: Arc<dyn BlockDevice>) -> Arc<dyn BlockDevice> {
    Registry::global().wrap(&format!("export:{name}"), dev)
}

/// The running daemon's state.
#[derive(Debug)]
pub struct Daemon {
    exports: Mutex<Vec<OpenedExport>>,
    /// How stacks added through the API are opened (serve's flags, no terminal).
    open: Options,
    nbd: ExportsHandle,
    events: Arc<Events>,
    listen: Vec<Listen>,
    control: Option<PathBuf>,
    metrics: Option<String>,
    repl_dir: Option<PathBuf>,
    started: SystemTime,
}

/// Where the daemon answers, for its status.
#[derive(Debug, Clone, Default)]
pub struct Endpoints {
    /// The NBD listeners.
    pub listen: Vec<Listen>,
    pub control: Option<PathBuf>,
    pub metrics: Option<String>,
    /// Where `cairn repl up` puts the control sockets of the replicated resources on
    /// this host (`repl-RES.sock` in the runtime directory), which `/v1/replication`
    /// asks; none: it lists none.
    pub repl_dir: Option<PathBuf>,
}

impl Daemon {
    /// The daemon serving `exports` through `nbd`; stacks added through the API are
    /// opened with `open`.
    pub fn new(
        exports: Vec<OpenedExport>,
        open: Options,
        nbd: ExportsHandle,
        events: Arc<Events>,
        at: Endpoints,
    ) -> Daemon {
        let mut seen: Vec<Arc<cairn_md::Array>> = Vec::new();
        for e in &exports {
            for a in e.arrays() {
                if !seen.iter().any(|b| Arc::ptr_eq(&a, b)) {
                    MdEvents::register(&a, &e.name, &events, true);
                    seen.push(a);
                }
            }
            if let Some(a) = e.lvm().and_then(|l| l.array()) {
                MdEvents::register_lv(a, &e.name, &events, true);
            }
        }
        Daemon {
            exports: Mutex::new(exports),
            open,
            nbd,
            events,
            listen: at.listen,
            control: at.control,
            metrics: at.metrics,
            repl_dir: at.repl_dir,
            started: SystemTime::now(),
        }
    }

    /// The md arrays of the RAID LVs served now (opened at the start or added since);
    /// the server closes them at its stop.
    pub fn raid_lv_arrays(&self) -> Vec<Arc<cairn_md::Array>> {
        self.lv_arrays().into_iter().map(|(_, a)| a).collect()
    }

    /// The metrics listener's address, when there is one.
    pub fn metrics_address(&self) -> Option<&str> {
        self.metrics.as_deref()
    }
}

// ---- answers -------------------------------------------------------------------------

/// One NBD client connection, as the API shows it.
#[derive(Debug, Serialize)]
struct ConnectionView {
    id: u64,
    peer: String,
    export: Option<String>,
    connected_at: String,
    seconds: u64,
}

/// One export, as `/v1/exports` shows it.
#[derive(Debug, Serialize)]
struct ExportView {
    name: String,
    path: PathBuf,
    read_only: bool,
    size: u64,
    uris: Vec<String>,
    connections: usize,
    stack: Node,
}

/// `POST /v1/exports`: a file (`path`), or any stack (`stack`, a [`Spec`] in JSON:
/// `{"md": [...]}`, `{"luks": {"on": ..., "key_file": ...}}`, `{"lvm": [...]}`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddExport {
    /// The export's name; an LVM stack's exports are named `VG/LV` and take none.
    #[serde(default)]
    pub name: Option<String>,
    /// An absolute path to a file or block device.
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// A stack to open; its paths absolute, its LUKS volumes with a `key_file` (the
    /// daemon has no terminal to ask on).
    #[serde(default)]
    pub stack: Option<Spec>,
    #[serde(default)]
    pub read_only: bool,
}

/// A change asked for through the API. `POST /v1/actions` takes any of them as
/// `{"action": "add-export", ...}`; the REST routes build them too. md's fail, add,
/// remove, replace and check join here.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "action", rename_all = "kebab-case")]
pub enum Action {
    AddExport(AddExport),
    RemoveExport {
        name: String,
    },
    /// `cairn md fail`: mark a member faulty.
    MdFail(MdMember),
    /// `cairn md remove`: take a faulty member or a spare out.
    MdRemove(MdMember),
    /// `cairn md add`: a new spare, or a former member back into its role.
    MdAdd(MdAdd),
    /// `cairn md replace`: copy a member onto a new device, then swap.
    MdReplace(MdReplace),
    /// `cairn md check` / `cairn md repair`.
    MdScrub(MdScrub),
    /// `cairn lvm lvconvert --repair | --replace PV` of a served RAID LV: the images
    /// move, and are rebuilt in the background by the LV's running md array.
    LvRepair(LvRepair),
    /// `cairn lvm lvchange --syncaction check|repair` of a served RAID LV: md's scrub
    /// in the LV's running array.
    LvScrub(LvScrub),
}

/// A served RAID LV to check (or repair).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LvScrub {
    /// `VG/LV`, the export's name.
    pub lv: String,
    #[serde(default)]
    pub repair: bool,
}

/// A served RAID LV to repair.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LvRepair {
    /// `VG/LV`, the export's name.
    pub lv: String,
    /// Move the image off this PV (a device name or PV key), as `--replace PV`;
    /// without it, images on missing PVs move and failed ones are rebuilt.
    #[serde(default)]
    pub replace: Option<String>,
    /// PVs of the VG the daemon may not hold open yet (absolute paths): room for the
    /// images that move. PVs it holds already are taken as they are.
    #[serde(default)]
    pub pvs: Vec<PathBuf>,
}

/// An md array and one of its members. The array is named by its name (with or
/// without the `host:` part), its UUID, or an export it is under.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MdMember {
    pub array: String,
    pub member: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MdAdd {
    pub array: String,
    /// An absolute path to a file or block device.
    pub path: PathBuf,
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MdReplace {
    pub array: String,
    pub member: String,
    /// The new device (absolute path); without it the first spare is used.
    #[serde(default)]
    pub with: Option<PathBuf>,
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MdScrub {
    pub array: String,
    #[serde(default)]
    pub repair: bool,
}

/// What an action did.
#[derive(Debug, Serialize)]
pub struct Outcome {
    #[serde(skip)]
    status: u16,
    pub changed: bool,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub export: Option<serde_json::Value>,
}

impl Outcome {
    fn unchanged(message: String) -> Outcome {
        Outcome {
            status: 200,
            changed: false,
            message,
            export: None,
        }
    }
}

const ROUTES: &str = "GET /v1/status, GET /v1/exports, GET /v1/exports/NAME, \
POST /v1/exports, DELETE /v1/exports/NAME, GET /v1/arrays, GET /v1/arrays/NAME, \
GET /v1/replication, GET /v1/replication/NAME, GET /v1/lvm/VG, \
GET /v1/stats, GET /v1/events, POST /v1/actions, GET /metrics";

impl Daemon {
    fn exports(&self) -> std::sync::MutexGuard<'_, Vec<OpenedExport>> {
        self.exports.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The trees of every export now, and the exports' names, paths and modes.
    fn trees(&self) -> Vec<(OpenedExport, Node)> {
        let list = self.exports().clone();
        list.into_iter()
            .map(|e| {
                let n = cairn_stack::describe::describe(&e);
                (e, n)
            })
            .collect()
    }

    fn connections(&self) -> Vec<ConnectionView> {
        let now = SystemTime::now();
        self.nbd
            .connections()
            .into_iter()
            .map(|c| {
                let since = c
                    .since
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .unwrap_or_default();
                ConnectionView {
                    id: c.id,
                    peer: c.peer,
                    export: c.export,
                    connected_at: rfc3339(since),
                    seconds: now.duration_since(c.since).unwrap_or_default().as_secs(),
                }
            })
            .collect()
    }

    fn export_view(&self, e: &OpenedExport, stack: Node, conns: &[ConnectionView]) -> ExportView {
        ExportView {
            name: e.name.clone(),
            path: if cairn_stack::leaf::is_remote(&e.path) {
                e.path.clone()
            } else {
                std::path::absolute(&e.path).unwrap_or_else(|_| e.path.clone())
            },
            read_only: e.read_only,
            size: stack.size,
            uris: self.listen.iter().map(|l| l.uri(&e.name)).collect(),
            connections: conns
                .iter()
                .filter(|c| c.export.as_deref() == Some(e.name.as_str()))
                .count(),
            stack,
        }
    }

    fn status(&self) -> serde_json::Value {
        let trees = self.trees();
        let events = self.events.since(0);
        let recent = &events[events.len().saturating_sub(STATUS_EVENTS)..];
        json!({
            "version": env!("CARGO_PKG_VERSION"),
            "pid": std::process::id(),
            "uptime_seconds": SystemTime::now()
                .duration_since(self.started)
                .unwrap_or_default()
                .as_secs(),
            "control": self.control,
            "metrics": self.metrics,
            "listen": self.listen.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "exports": trees.iter().map(|(_, n)| n).collect::<Vec<_>>(),
            "connections": self.connections(),
            "events": recent,
        })
    }

    /// Every counted node of the current trees: (export, node) once per node id.
    fn counted_nodes(trees: &[(OpenedExport, Node)]) -> Vec<(String, Node)> {
        let mut seen = std::collections::HashSet::new();
        let mut out = Vec::new();
        for (e, root) in trees {
            for n in node::walk(root) {
                if matches!(n.kind, NodeKind::Export | NodeKind::File | NodeKind::Member)
                    && seen.insert(n.id.clone())
                {
                    let mut n = n.clone();
                    n.children.clear();
                    out.push((e.name.clone(), n));
                }
            }
        }
        out
    }

    fn stats(&self) -> serde_json::Value {
        let trees = self.trees();
        let snaps = Registry::global().snapshot();
        let mut nodes = serde_json::Map::new();
        for (export, n) in Self::counted_nodes(&trees) {
            if let Some(s) = snaps.get(&n.id) {
                nodes.insert(
                    n.id.clone(),
                    json!({
                        "export": export,
                        "kind": n.kind,
                        "name": n.name,
                        "stats": s,
                    }),
                );
            }
        }
        json!({
            "monotonic_ns": stats::monotonic_ns(),
            "bucket_bounds_ns": stats::BUCKET_BOUNDS_NS,
            "nodes": nodes,
        })
    }

    fn metrics_text(&self) -> String {
        let trees = self.trees();
        let snaps = Registry::global().snapshot();
        let conns = self.nbd.connections();
        let mut s = metrics::Sample {
            version: env!("CARGO_PKG_VERSION").into(),
            events: self.events.counts(),
            ..metrics::Sample::default()
        };
        for (e, root) in &trees {
            s.exports.push(metrics::ExportSample {
                export: e.name.clone(),
                size_bytes: root.size,
                read_only: e.read_only,
                connections: conns
                    .iter()
                    .filter(|c| c.export.as_deref() == Some(e.name.as_str()))
                    .count() as u64,
            });
            for n in node::walk(root) {
                if let Some(md) = &n.md {
                    s.arrays.push(metrics::ArraySample {
                        export: e.name.clone(),
                        device: n.name.clone(),
                        level: md.level.clone(),
                        state: n.state.to_string(),
                        raid_devices: md.raid_devices,
                        active_devices: md.active_devices,
                        failed_devices: md.raid_devices.saturating_sub(md.active_devices),
                        degraded: n.state.degraded(),
                    });
                }
                if let Some(p) = &n.progress {
                    s.progress.push(metrics::ProgressSample {
                        export: e.name.clone(),
                        device: n.name.clone(),
                        action: p.action.clone(),
                        done_bytes: p.done_bytes,
                        total_bytes: p.total_bytes,
                        bytes_per_sec: p.bytes_per_sec,
                    });
                }
            }
        }
        for (export, n) in Self::counted_nodes(&trees) {
            if let Some(st) = snaps.get(&n.id) {
                s.devices.push(metrics::DeviceSample {
                    export,
                    device: n.name.clone(),
                    kind: n.kind.to_string(),
                    stats: st.clone(),
                });
            }
        }
        let mut text = metrics::render(&s);
        // The replicated resources beside this server, asked as GET /v1/replication asks
        // them; one that does not answer in time has no rows this time.
        let repl: Vec<cairn_repl::node::Status> = self
            .replication()
            .into_iter()
            .filter_map(|v| serde_json::from_value(v).ok())
            .collect();
        text.push_str(&cairn_repl::metrics::prometheus_all(&repl));
        text
    }

    fn metrics_response(&self) -> Response {
        Response::text(
            200,
            "text/plain; version=0.0.4; charset=utf-8",
            self.metrics_text(),
        )
    }

    /// The `--metrics` listener: `GET /metrics` only.
    pub fn handle_metrics(&self, r: &Request) -> Response {
        match r.path.as_str() {
            "/metrics" if r.method == "GET" => self.metrics_response(),
            "/metrics" => Response::method_not_allowed(&r.method, &r.path, &["GET"]),
            _ => Response::error(404, format!("no such route: {}; use GET /metrics", r.path)),
        }
    }

    /// The control socket's routes.
    pub fn handle(&self, r: &Request) -> Response {
        let path = r.path.trim_end_matches('/');
        let segs: Vec<&str> = path.split('/').skip(1).collect();
        let m = r.method.as_str();
        let only = |allowed: &[&str], f: &dyn Fn() -> Response| {
            if allowed.contains(&m) {
                f()
            } else {
                Response::method_not_allowed(m, &r.path, allowed)
            }
        };
        match segs.as_slice() {
            [] | ["v1"] => only(&["GET"], &|| {
                Response::json(
                    200,
                    &json!({ "version": env!("CARGO_PKG_VERSION"), "routes": ROUTES }),
                )
            }),
            ["v1", "status"] => only(&["GET"], &|| Response::json(200, &self.status())),
            ["v1", "stats"] => only(&["GET"], &|| Response::json(200, &self.stats())),
            ["v1", "events"] => only(&["GET"], &|| {
                let after = r
                    .query_param("after")
                    .and_then(|a| a.parse().ok())
                    .unwrap_or(0);
                Response::json(200, &json!({ "events": self.events.since(after) }))
            }),
            ["metrics"] => only(&["GET"], &|| self.metrics_response()),
            ["v1", "exports"] => match m {
                "GET" => {
                    let conns = self.connections();
                    let list: Vec<ExportView> = self
                        .trees()
                        .into_iter()
                        .map(|(e, n)| self.export_view(&e, n, &conns))
                        .collect();
                    Response::json(200, &json!({ "exports": list }))
                }
                "POST" => match r.json::<AddExport>() {
                    Ok(a) => self.respond(Action::AddExport(a)),
                    Err(resp) => resp,
                },
                _ => Response::method_not_allowed(m, &r.path, &["GET", "POST"]),
            },
            // LV exports are named VG/LV: the name is every segment after "exports", so
            // both /v1/exports/vg0/home and /v1/exports/vg0%2Fhome reach it.
            ["v1", "exports", rest @ ..] => match m {
                "GET" => {
                    let name = &rest.join("/");
                    let conns = self.connections();
                    match self.trees().into_iter().find(|(e, _)| e.name == *name) {
                        Some((e, n)) => Response::json(200, &self.export_view(&e, n, &conns)),
                        None => Response::error(404, self.no_export(name)),
                    }
                }
                "DELETE" => self.respond(Action::RemoveExport {
                    name: rest.join("/"),
                }),
                _ => Response::method_not_allowed(m, &r.path, &["GET", "DELETE"]),
            },
            ["v1", "arrays"] => only(&["GET"], &|| Response::json(200, &self.arrays_view())),
            ["v1", "lvm", vg] => only(&["GET"], &|| self.lvm_view(vg)),
            // A RAID LV's array is named VG/LV, as its export.
            ["v1", "arrays", vg, lv] => only(&["GET"], &|| {
                let name = format!("{vg}/{lv}");
                match self.find_lv_array(&name) {
                    Ok(a) => Response::json(200, &lv_array_view(&name, &a)),
                    Err(resp) => resp,
                }
            }),
            ["v1", "arrays", name] => only(&["GET"], &|| {
                let v = self.arrays_view();
                let hit = self.find_array(name).map(|a| a.uuid().to_string());
                match hit {
                    Ok(uuid) => v["arrays"]
                        .as_array()
                        .and_then(|l| l.iter().find(|x| x["uuid"] == uuid.as_str()))
                        .map_or_else(
                            || Response::error(404, format!("no md array named {name:?}")),
                            |x| Response::json(200, x),
                        ),
                    Err(resp) => resp,
                }
            }),
            ["v1", "replication"] => only(&["GET"], &|| {
                Response::json(200, &json!({ "resources": self.replication() }))
            }),
            ["v1", "replication", name] => only(&["GET"], &|| self.replication_one(name)),
            ["v1", "actions"] => match m {
                "POST" => match r.json::<Action>() {
                    Ok(a) => self.respond(a),
                    Err(resp) => resp,
                },
                _ => Response::method_not_allowed(m, &r.path, &["POST"]),
            },
            _ => Response::error(404, format!("no such route: {}; routes: {ROUTES}", r.path)),
        }
    }

    /// The control sockets of the replicated resources on this host.
    fn repl_sockets(&self) -> Vec<PathBuf> {
        self.repl_dir
            .as_deref()
            .map(control::local_sockets)
            .unwrap_or_default()
    }

    /// Each replicated resource's status, as `cairn --json repl status` prints it, asked
    /// all at once; one whose process does not answer in time is an entry
    /// `{resource, control, error}`. A socket file nobody listens on (left by a killed
    /// process) is no resource: skipped, as `cairn status` does.
    fn replication(&self) -> Vec<serde_json::Value> {
        let paths = self.repl_sockets();
        let answers = control::statuses_at_once(&paths, REPL_TIMEOUT);
        paths
            .iter()
            .zip(answers)
            .filter_map(|(p, r)| match r {
                Ok(status) => Some(status),
                Err(e) if e.is_gone() => None,
                Err(e) => Some(json!({
                    "resource": control::resource_of(p),
                    "control": p,
                    "error": repl_error(p, &e),
                })),
            })
            .collect()
    }

    /// `/v1/replication/NAME`: its status; 404 when it does not run here, 503 when its
    /// process does not answer.
    fn replication_one(&self, name: &str) -> Response {
        let paths = self.repl_sockets();
        let names: Vec<&str> = paths
            .iter()
            .filter_map(|p| control::resource_of(p))
            .collect();
        let missing = |why: String| {
            Response::error(
                404,
                format!(
                    "no replicated resource named {name:?} runs here{why}; resources with \
                     a control socket here: {}",
                    if names.is_empty() {
                        "(none)".to_string()
                    } else {
                        names.join(", ")
                    }
                ),
            )
        };
        let Some(path) = paths.iter().find(|p| control::resource_of(p) == Some(name)) else {
            return missing(String::new());
        };
        match control::status(path, REPL_TIMEOUT) {
            Ok(status) => Response::json(200, &status),
            Err(e) if e.is_gone() => missing(format!(
                " (nothing answers on {}: its process is gone)",
                path.display()
            )),
            Err(e) => Response::error(503, repl_error(path, &e)),
        }
    }

    fn no_export(&self, name: &str) -> String {
        let names: Vec<String> = self.exports().iter().map(|e| e.name.clone()).collect();
        format!(
            "no export named {name:?}; the exports are: {}",
            if names.is_empty() {
                "(none)".to_string()
            } else {
                names.join(", ")
            }
        )
    }

    fn respond(&self, action: Action) -> Response {
        match self.apply(action) {
            Ok(o) => Response::json(o.status, &o),
            Err(e) => e,
        }
    }

    /// Applies one action. Idempotent: asking for what is already so changes nothing and
    /// says so.
    pub fn apply(&self, action: Action) -> std::result::Result<Outcome, Response> {
        match action {
            Action::AddExport(a) => self.add_export(a),
            Action::RemoveExport { name } => self.remove_export(&name),
            Action::MdFail(m) => self.md_change(&m.array, |a| a.fail(&m.member)),
            Action::MdRemove(m) => self.md_change(&m.array, |a| a.remove(&m.member)),
            Action::MdAdd(m) => {
                let name = m.path.display().to_string();
                // A member this array already holds is open for writing here, so it
                // cannot be opened again; the answer is the array's own.
                match self.array_holds(&m.array, &m.path) {
                    Some(cairn_md::MemberState::Faulty) => {
                        // mdadm refuses too: a failed member keeps its role until it is
                        // removed, and only then can it come back (re-added or rebuilt).
                        return Err(Response::error(
                            409,
                            format!(
                                "{name} failed and is still in the array; remove it first \
                                 (cairn md remove {} {name}), then add it",
                                m.array
                            ),
                        ));
                    }
                    Some(_) => {
                        return self.md_change(&m.array, |_| {
                            Ok(cairn_md::Change::unchanged(format!(
                                "{name} is already in the array; nothing to do"
                            )))
                        });
                    }
                    None => {}
                }
                let dev = open_new_member(&m.path, self.open.remote_timeout())?;
                self.md_change(&m.array, |a| {
                    let dev = cairn_stack::fence::fence_member(a, dev.clone());
                    a.add(dev, name.clone(), m.force)
                })
            }
            Action::MdReplace(m) => {
                let with = match &m.with {
                    Some(p) => Some((
                        open_new_member(p, self.open.remote_timeout())?,
                        p.display().to_string(),
                    )),
                    None => None,
                };
                self.md_change(&m.array, |a| {
                    let with = with
                        .clone()
                        .map(|(d, n)| (cairn_stack::fence::fence_member(a, d), n));
                    a.replace(&m.member, with, m.force)
                })
            }
            Action::LvRepair(r) => self.lv_repair(&r),
            Action::LvScrub(r) => {
                let a = self.find_lv_array(&r.lv)?;
                let what = if r.repair { "repair" } else { "check" };
                match a.request_scrub(r.repair) {
                    Ok(()) => {
                        let message = format!(
                            "{what} started; follow it with cairn status, the result with \
                             cairn lvm lvchange --syncaction {what} --wait"
                        );
                        tracing::info!("LV {}: {message}", r.lv);
                        Ok(Outcome {
                            status: 200,
                            changed: true,
                            message,
                            export: None,
                        })
                    }
                    Err(e) => Err(Response::error(409, format!("LV {}: {e}", r.lv))),
                }
            }
            Action::MdScrub(m) => self.md_change(&m.array, |a| {
                a.request_scrub(m.repair).map(|()| {
                    cairn_md::Change::done(format!(
                        "{} started; follow it with cairn status, the result with cairn md \
                         check --wait",
                        if m.repair { "repair" } else { "check" }
                    ))
                })
            }),
        }
    }

    /// The state of `path` in the array `who` names, when the array holds it open
    /// (active, spare, replacement or faulty).
    fn array_holds(&self, who: &str, path: &Path) -> Option<cairn_md::MemberState> {
        let a = self.find_array(who).ok()?;
        a.report()
            .members
            .iter()
            .filter(|m| m.reason.is_none())
            .find(|m| {
                m.name
                    .as_deref()
                    .is_some_and(|n| same_file(Path::new(n), path))
            })
            .map(|m| m.state)
    }

    /// The md arrays being served: (name, array, the exports it is under).
    fn md_arrays(&self) -> Vec<(String, Arc<cairn_md::Array>, Vec<String>)> {
        let list = self.exports();
        let mut out: Vec<(String, Arc<cairn_md::Array>, Vec<String>)> = Vec::new();
        for e in list.iter() {
            for a in e.arrays() {
                match out.iter_mut().find(|(_, b, _)| Arc::ptr_eq(&a, b)) {
                    Some((_, _, exports)) => exports.push(e.name.clone()),
                    None => out.push((a.report().name, a, vec![e.name.clone()])),
                }
            }
        }
        out
    }

    /// The RAID LVs being served, each with its md array: (`VG/LV`, array).
    fn lv_arrays(&self) -> Vec<(String, Arc<cairn_md::Array>)> {
        self.exports()
            .iter()
            .filter_map(|e| Some((e.name.clone(), e.lvm()?.array()?.clone())))
            .collect()
    }

    /// The array of the served RAID LV `lv` (`VG/LV`), or a 404 that lists them.
    fn find_lv_array(&self, lv: &str) -> std::result::Result<Arc<cairn_md::Array>, Response> {
        let lvs = self.lv_arrays();
        if let Some((_, a)) = lvs.iter().find(|(n, _)| n == lv) {
            return Ok(a.clone());
        }
        let names: Vec<&str> = lvs.iter().map(|(n, _)| n.as_str()).collect();
        Err(Response::error(
            404,
            format!(
                "no RAID LV {lv} is served here; the RAID LVs are: {}",
                if names.is_empty() {
                    "(none)".to_string()
                } else {
                    names.join(", ")
                }
            ),
        ))
    }

    /// The array `who` names (its name, with or without `host:`, its UUID, or an
    /// export in front of it), or a 404 that lists them.
    fn find_array(&self, who: &str) -> std::result::Result<Arc<cairn_md::Array>, Response> {
        let arrays = self.md_arrays();
        let short = |n: &str| n.rsplit(':').next().unwrap_or(n).to_string();
        let hits: Vec<&Arc<cairn_md::Array>> = arrays
            .iter()
            .filter(|(name, a, exports)| {
                name == who
                    || short(name) == who
                    || a.uuid().to_string() == who
                    || exports.iter().any(|e| e == who)
            })
            .map(|(_, a, _)| a)
            .collect();
        match hits.as_slice() {
            [a] => Ok((*a).clone()),
            [] => Err(Response::error(
                404,
                format!(
                    "no md array named {who:?}; the arrays are: {}",
                    if arrays.is_empty() {
                        "(none)".to_string()
                    } else {
                        arrays
                            .iter()
                            .map(|(n, _, e)| format!("{n} (export {})", e.join(", ")))
                            .collect::<Vec<_>>()
                            .join("; ")
                    }
                ),
            )),
            _ => Err(Response::error(
                409,
                format!("{who:?} names more than one md array; use its UUID"),
            )),
        }
    }

    /// Runs a change on an array and words the outcome: "nothing to do" answers are
    /// unchanged, refusals 409 (conflict with the array's state) or 404 (no such member).
    fn md_change(
        &self,
        array: &str,
        f: impl FnOnce(&cairn_md::Array) -> cairn_block::Result<cairn_md::Change>,
    ) -> std::result::Result<Outcome, Response> {
        let a = self.find_array(array)?;
        match f(&a) {
            Ok(cairn_md::Change { changed, message }) => {
                tracing::info!("md array {}: {message}", a.report().name);
                Ok(Outcome {
                    status: 200,
                    changed,
                    message,
                    export: None,
                })
            }
            Err(e) => Err(Response::error(
                match e.kind() {
                    cairn_block::ErrorKind::NotFound => 404,
                    cairn_block::ErrorKind::Io => 500,
                    _ => 409,
                },
                e.to_string(),
            )),
        }
    }

    /// [`Action::LvRepair`]: the VG opened over the PVs the daemon holds and the new
    /// ones given, the moves committed, the rebuilds handed to the LV's md array.
    fn lv_repair(&self, r: &LvRepair) -> std::result::Result<Outcome, Response> {
        let (vg, lv_name) = r
            .lv
            .split_once('/')
            .ok_or_else(|| Response::error(422, format!("give the LV as VG/LV, not {:?}", r.lv)))?;
        let mut list = self.exports();
        let Some(at) = list
            .iter()
            .position(|e| e.name == r.lv && e.lvm().is_some_and(|l| l.array().is_some()))
        else {
            return Err(Response::error(
                404,
                format!("no RAID LV {} is served here", r.lv),
            ));
        };
        let mut pvs: Vec<cairn_lvm::PvDevice> = Vec::new();
        let mut held: Vec<PathBuf> = Vec::new();
        for e in list.iter() {
            let Some(l) = e.lvm().filter(|l| l.details.vg == vg) else {
                continue;
            };
            for pv in &l.pvs {
                let same = |p: &cairn_lvm::PvDevice| {
                    std::ptr::addr_eq(Arc::as_ptr(&p.dev), Arc::as_ptr(&pv.device))
                };
                if !pvs.iter().any(same) {
                    pvs.push(cairn_lvm::PvDevice::new(pv_label(pv), pv.device.clone()));
                    held.push(pv.path.clone());
                }
            }
        }
        let mut new_pvs = Vec::new();
        for p in &r.pvs {
            if held.iter().any(|h| same_file(h, p)) {
                continue;
            }
            let dev = open_new_member(p, self.open.remote_timeout())?;
            let name = p.display().to_string();
            pvs.push(cairn_lvm::PvDevice::new(name.clone(), dev.clone()));
            new_pvs.push(OpenedExport {
                name,
                path: p.clone(),
                device: dev,
                read_only: false,
                layer: cairn_stack::export::Layer::File,
            });
        }
        let opts = cairn_lvm::OpenOptions {
            partial: true,
            read_only: false,
        };
        let err = |e: cairn_block::Error| {
            Response::error(
                match e.kind() {
                    cairn_block::ErrorKind::NotFound => 404,
                    cairn_block::ErrorKind::InvalidArgument
                    | cairn_block::ErrorKind::NoSpace
                    | cairn_block::ErrorKind::Unsupported => 409,
                    _ => 500,
                },
                e.to_string(),
            )
        };
        let mut v = cairn_lvm::Vg::open_with(pvs, opts).map_err(err)?;
        v.set_description(format!(
            "cairn lvm lvconvert {} {} (served)",
            r.replace
                .as_ref()
                .map_or("--repair".to_string(), |p| format!("--replace {p}")),
            r.lv
        ));
        let Some(layer) = list[at].lvm() else {
            return Err(Response::error(500, "the LV export changed"));
        };
        let volume = layer.volume.clone();
        let done = v
            .lv_repair_live(lv_name, r.replace.as_deref(), &volume)
            .map_err(err)?;
        // The new PVs belong to the LV's stack now (status shows them under it).
        if let cairn_stack::export::Layer::Lv(l) = &mut list[at].layer {
            l.pvs.extend(new_pvs);
        }
        let mut words: Vec<String> = done
            .moved
            .iter()
            .map(|(img, from, to)| format!("{vg}/{img} moved from {from} to {to}"))
            .collect();
        if done.rebuilt.is_empty() {
            words.push(format!("{} is whole and in sync; nothing to repair", r.lv));
        } else {
            words.push(format!(
                "rebuilding {} in the background; cairn status shows its progress",
                done.rebuilt.join(", ")
            ));
        }
        let message = words.join("; ");
        tracing::info!("LV {}: {message}", r.lv);
        Ok(Outcome {
            status: 200,
            changed: !done.rebuilt.is_empty(),
            message,
            export: None,
        })
    }

    /// `GET /v1/lvm/VG`: the VG's report, as `cairn lvm vgs/lvs` print it, read from the
    /// PVs this daemon has open (and unlocked) already, so a client does not open or
    /// unlock them again. Only PVs that hold a served LV are known here: a PV that holds
    /// none shows as missing, and the client then reads the VG itself.
    fn lvm_view(&self, vg: &str) -> Response {
        let mut pvs: Vec<cairn_lvm::PvDevice> = Vec::new();
        for e in self.exports().iter() {
            let Some(lv) = e.lvm().filter(|lv| lv.details.vg == vg) else {
                continue;
            };
            for pv in &lv.pvs {
                let same = |p: &cairn_lvm::PvDevice| {
                    std::ptr::addr_eq(Arc::as_ptr(&p.dev), Arc::as_ptr(&pv.device))
                };
                if !pvs.iter().any(same) {
                    pvs.push(cairn_lvm::PvDevice::new(pv_label(pv), pv.device.clone()));
                }
            }
        }
        if pvs.is_empty() {
            return Response::error(404, format!("no LV of a VG named {vg:?} is served here"));
        }
        let opts = cairn_lvm::OpenOptions {
            partial: true,
            read_only: true,
        };
        match cairn_lvm::Vg::open_with(pvs, opts) {
            Ok(v) => {
                // What only the runner of a RAID LV's array knows: its sync action and
                // the last scrub's mismatches (lvs -o +raid_sync_action,raid_mismatch_count).
                let mut r = v.report();
                let running = self.lv_arrays();
                for l in &mut r.lvs {
                    let full = format!("{vg}/{}", l.name);
                    if let Some((_, a)) = running.iter().find(|(n, _)| *n == full) {
                        l.raid_sync_action = Some(raid_sync_action(a).to_string());
                        l.raid_mismatch_count = Some(
                            a.last_scrub()
                                .filter(|s| s.complete)
                                .map_or(0, |s| s.mismatch_sectors),
                        );
                    }
                }
                Response::json(200, &r)
            }
            Err(e) => Response::error(500, format!("VG {vg}: {e}")),
        }
    }

    /// `GET /v1/arrays`: each md array's report, background work and last scrub; then
    /// each served RAID LV's array the same way (`"kind": "raid-lv"`, named `VG/LV`,
    /// no UUID: it has no md superblocks).
    fn arrays_view(&self) -> serde_json::Value {
        let mut list: Vec<serde_json::Value> = self
            .md_arrays()
            .into_iter()
            .map(|(name, a, exports)| {
                json!({
                    "kind": "md",
                    "name": name,
                    "uuid": a.uuid().to_string(),
                    "exports": exports,
                    "detail": a.report(),
                    "background": a.background(),
                    "scrub": a.last_scrub(),
                })
            })
            .collect();
        list.extend(
            self.lv_arrays()
                .into_iter()
                .map(|(name, a)| lv_array_view(&name, &a)),
        );
        json!({ "arrays": list })
    }

    fn add_export(&self, a: AddExport) -> std::result::Result<Outcome, Response> {
        let spec = match (&a.path, &a.stack) {
            (Some(p), None) => Spec::File(p.clone()),
            (None, Some(s)) => s.clone(),
            _ => {
                return Err(Response::error(
                    422,
                    "give either \"path\" (a file or block device) or \"stack\" (e.g. \
                     {\"md\": [\"/srv/d0.img\", ...]}), not both",
                ))
            }
        };
        spec.check()
            .map_err(|e| Response::error(422, e.to_string()))?;
        for p in spec.paths() {
            if !p.is_absolute() && !cairn_stack::leaf::is_remote(&p) {
                return Err(Response::error(
                    422,
                    format!(
                        "path {:?} must be absolute (the daemon does not share your working \
                         directory)",
                        p.display().to_string()
                    ),
                ));
            }
        }
        let lvm = matches!(spec, Spec::Lvm(_));
        let name = match (&a.name, lvm) {
            (Some(n), false) => n.clone(),
            (None, false) => {
                return Err(Response::error(
                    422,
                    "missing field `name` (the export's name)",
                ))
            }
            (Some(_), true) => {
                return Err(Response::error(
                    422,
                    "an LVM stack's exports are named VG/LV; give no \"name\"",
                ))
            }
            (None, true) => String::new(),
        };
        if !lvm {
            check_export_name(&name).map_err(|m| Response::error(422, m))?;
        }
        // Conflicts with what is served, looked at before opening and again after: the
        // exports stay unlocked while the stack opens (a LUKS key derivation takes
        // seconds, and status must not wait for it).
        let conflict = |list: &[OpenedExport]| -> Option<std::result::Result<Outcome, Response>> {
            if let (false, Some(e)) = (lvm, list.iter().find(|e| e.name == name)) {
                let plain = matches!(e.layer, cairn_stack::export::Layer::File);
                let same = match &spec {
                    Spec::File(p) => plain && same_file(&e.path, p),
                    _ => false,
                };
                if same && e.read_only == a.read_only {
                    return Some(Ok(Outcome::unchanged(format!(
                        "export {name:?} already present; nothing to do"
                    ))));
                }
                return Some(Err(Response::error(
                    409,
                    format!(
                        "export {:?} is already served from {} ({}); remove it first with \
                         DELETE /v1/exports/{} or choose another name",
                        name,
                        e.path.display(),
                        if e.read_only {
                            "read-only"
                        } else {
                            "read-write"
                        },
                        name
                    ),
                )));
            }
            if let Spec::File(p) = &spec {
                if let Some(e) = list
                    .iter()
                    .find(|e| e.md().is_none() && same_file(&e.path, p))
                {
                    return Some(Err(Response::error(
                        409,
                        format!("{} is already served as export {:?}", p.display(), e.name),
                    )));
                }
            }
            None
        };
        if let Some(answer) = conflict(&self.exports()) {
            return answer;
        }
        let opts = Options {
            read_only: a.read_only,
            ..self.open.clone()
        };
        let opened = cairn_stack::open(
            &spec,
            (!lvm).then_some(name.as_str()),
            &opts,
            &mut Keys::none(),
        )
        .map_err(|e| {
            let busy = e.exit_code() == cairn_stack::owner::EXIT_BUSY;
            Response::error(if busy { 409 } else { 422 }, e.to_string())
        })?;
        let mut list = self.exports();
        if let Some(answer) = conflict(&list) {
            cairn_stack::spec::close_all(&opened);
            return answer;
        }
        if let Some(e) = opened
            .iter()
            .find(|e| list.iter().any(|o| o.name == e.name))
        {
            let taken = e.name.clone();
            cairn_stack::spec::close_all(&opened);
            return Err(Response::error(
                409,
                format!("export {taken:?} is already served; remove it first"),
            ));
        }
        let mut messages = Vec::new();
        let mut views = Vec::new();
        for (i, e) in opened.iter().enumerate() {
            let g = e.device.geometry();
            let device = wrap_export(&e.name, e.device.clone());
            let description = cairn_stack::describe::export_description(e);
            let added = self.nbd.add(Export {
                name: e.name.clone(),
                description: description.clone(),
                device,
                read_only: e.read_only,
            });
            if let Err(err) = added {
                for done in &opened[..i] {
                    self.nbd.remove(&done.name);
                }
                cairn_stack::spec::close_all(&opened);
                return Err(Response::error(409, err.to_string()));
            }
            let mode = if e.read_only {
                "read-only"
            } else {
                "read-write"
            };
            messages.push(format!(
                "export {:?} added: {description}, {}, {mode}",
                e.name,
                format_size(g.size)
            ));
            let n = cairn_stack::describe::describe(e);
            views.extend(serde_json::to_value(self.export_view(e, n, &[])).ok());
        }
        let mut seen: Vec<Arc<cairn_md::Array>> = Vec::new();
        for e in &opened {
            for a in e.arrays() {
                if !seen.iter().any(|b| Arc::ptr_eq(&a, b)) {
                    MdEvents::register(&a, &e.name, &self.events, false);
                    seen.push(a);
                }
            }
            // A RAID LV added now is run as one opened at the start: its rebuilds (a
            // served lvconvert --repair), a pending resync, its bitmap's clearing, scrubs.
            if let Some(a) = e.lvm().and_then(|l| l.array()) {
                MdEvents::register_lv(a, &e.name, &self.events, false);
                if let (Some(limits), false) = (self.open.speed_limits, a.capabilities().read_only)
                {
                    a.manage(limits);
                }
            }
        }
        for (e, message) in opened.iter().zip(&messages) {
            self.events.emit(EventSpec {
                event: events::EXPORT_ADDED,
                export: Some(e.name.clone()),
                device: Some(e.path.display().to_string()),
                member: None,
                message: message.clone(),
            });
        }
        list.extend(opened);
        drop(list);
        let message = if messages.is_empty() {
            "no logical volumes to serve on that stack".to_string()
        } else {
            messages.join("; ")
        };
        Ok(Outcome {
            status: 201,
            changed: !views.is_empty(),
            message,
            // An LVM stack answers a list (one view per LV, however many); the others one.
            export: if lvm {
                Some(serde_json::Value::Array(views))
            } else {
                views.pop()
            },
        })
    }

    fn remove_export(&self, name: &str) -> std::result::Result<Outcome, Response> {
        let removed = {
            let mut list = self.exports();
            let Some(i) = list.iter().position(|e| e.name == name) else {
                return Ok(Outcome::unchanged(format!(
                    "export {name:?} is not present; nothing to do"
                )));
            };
            list.remove(i)
        };
        // Outside the lock: this waits for the export's connections to finish.
        let closed = self.nbd.remove(name).map_or(0, |r| r.connections);
        // A RAID LV's array is the daemon's to close (its bitmap clean, its background
        // work stopped); the server's stop closes only the LVs still served.
        if let Some(a) = removed.lvm().and_then(|l| l.array()) {
            if let Err(e) = a.close() {
                tracing::warn!(
                    "LV {name}: closing its array failed, so its bitmap may mark regions \
                     to resync: {e}"
                );
            }
        }
        // The remote exports it used whole (a LUKS volume, its VG's PVs) that no export
        // still served uses are given up: this daemon may reopen them in another shape
        // (another LV of the VG, the PV as a plain export), and so may another host,
        // without meeting its own unreleased claim.
        let still: Vec<std::path::PathBuf> = self
            .exports()
            .iter()
            .flat_map(OpenedExport::leaves)
            .collect();
        let free: Vec<std::path::PathBuf> = removed
            .leaves()
            .into_iter()
            .filter(|p| !still.contains(p))
            .collect();
        cairn_stack::fence::release_exports(&free);
        let message = format!(
            "export {name:?} removed ({}); {closed} client connection{} closed",
            removed.path.display(),
            if closed == 1 { "" } else { "s" }
        );
        self.events.emit(EventSpec {
            event: events::EXPORT_REMOVED,
            export: Some(name.to_string()),
            device: Some(removed.path.display().to_string()),
            member: None,
            message: message.clone(),
        });
        Ok(Outcome {
            status: 200,
            changed: true,
            message,
            export: None,
        })
    }
}

/// A RAID LV's array in `/v1/arrays`.
fn lv_array_view(name: &str, a: &cairn_md::Array) -> serde_json::Value {
    json!({
        "kind": "raid-lv",
        "name": name,
        "exports": [name],
        "detail": a.report(),
        "background": a.background(),
        "scrub": a.last_scrub(),
    })
}

/// lvm's `raid_sync_action` for an md array's background work.
fn raid_sync_action(a: &cairn_md::Array) -> &'static str {
    match a.background().filter(|b| b.state == "running") {
        None => "idle",
        Some(b) => match b.action {
            "recovery" | "replace" => "recover",
            "resync" => "resync",
            "check" => "check",
            "repair" => "repair",
            _ => "idle",
        },
    }
}

/// A PV's name in reports, as `cairn lvm` names the PVs it opens: `md:M1,M2,...` for an
/// array, `luks:` before an encrypted one, else the path.
fn pv_label(e: &OpenedExport) -> String {
    let base = match e.md() {
        Some(a) => {
            let members: Vec<String> = a
                .report()
                .members
                .into_iter()
                .filter(|m| m.role.is_some() && m.state == cairn_md::MemberState::ActiveSync)
                .filter_map(|m| m.name)
                .collect();
            format!("md:{}", members.join(","))
        }
        None => e.path.display().to_string(),
    };
    if e.luks().is_some() {
        format!("luks:{base}")
    } else {
        base
    }
}

/// Opens a device named in an md action (read-write, counted like other members).
fn open_new_member(
    path: &Path,
    remote_timeout: std::time::Duration,
) -> std::result::Result<Arc<dyn cairn_block::BlockDevice>, Response> {
    if cairn_stack::leaf::is_remote(path) {
        let dev = cairn_stack::leaf::open(path, false, false, remote_timeout)
            .map_err(|e| Response::error(422, e.to_string()))?;
        return Ok(wrap_member(&path.display().to_string(), dev));
    }
    if !path.is_absolute() {
        return Err(Response::error(
            422,
            format!(
                "path {:?} must be absolute (the daemon does not share your working \
                 directory)",
                path.display().to_string()
            ),
        ));
    }
    let opts = cairn_block::OpenOptions {
        read_only: false,
        direct: false,
        create_size: None,
    };
    let disk = cairn_block::FileDisk::open(path, &opts).map_err(|e| match e.kind() {
        cairn_block::ErrorKind::NotFound => Response::error(
            404,
            format!(
                "{} does not exist; make it first (a file: `truncate -s SIZE {}`, at least \
                 as large as the other members)",
                path.display(),
                path.display()
            ),
        ),
        cairn_block::ErrorKind::Busy => Response::error(
            409,
            cairn_stack::owner::busy(&path.display().to_string(), &e).to_string(),
        ),
        // The error's own context already says "open PATH".
        _ => Response::error(422, format!("cannot use it: {e}")),
    })?;
    Ok(wrap_member(&path.display().to_string(), Arc::new(disk)))
}

/// One sentence for a resource that did not answer its status.
fn repl_error(path: &Path, e: &control::CallError) -> String {
    let name = control::resource_of(path).unwrap_or("?");
    if e.timed_out() {
        format!(
            "resource {name} does not answer on {} within {} s (is its `cairn repl up` \
             process stopped or stuck?)",
            path.display(),
            REPL_TIMEOUT.as_secs()
        )
    } else {
        format!("resource {name}: {e}")
    }
}

fn rfc3339(since_epoch: Duration) -> String {
    events::rfc3339_at(since_epoch)
}

/// The rules of `cairn_stack::export::parse_spec` for names: they appear in URIs and shells.
fn check_export_name(name: &str) -> std::result::Result<(), String> {
    if cairn_stack::export::export_name_ok(name) {
        Ok(())
    } else {
        Err(format!(
            "export name {name:?} must be 1 to 255 letters, digits, '.', '_', '-', '+' or \
             ':', not starting with '.'"
        ))
    }
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_names_follow_the_cli_rules() {
        assert!(check_export_name("home-2.x").is_ok());
        assert!(check_export_name("").is_err());
        assert!(check_export_name(".hidden").is_err());
        assert!(check_export_name("a b").is_err());
        assert!(check_export_name("a/b").is_err());
    }

    fn get(d: &Daemon, path: &str) -> (u16, serde_json::Value) {
        let r = d.handle(&Request {
            method: "GET".into(),
            path: path.into(),
            query: None,
            headers: Vec::new(),
            body: Vec::new(),
        });
        (r.status, serde_json::from_slice(&r.body).unwrap())
    }

    /// `/v1/replication` asks each `cairn repl up` process on its control socket: one that
    /// answers is listed with its status as it gave it, one that answers nothing in time
    /// with an error naming it, and a socket whose process died not at all.
    #[test]
    fn replication_lists_each_resource_by_its_control_socket() {
        use std::io::{BufRead, BufReader, Write};
        use std::os::unix::net::UnixListener;
        let _one = crate::FORKING_TESTS
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let dir = std::env::temp_dir().join(format!("cairn-daemon-repl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let status = json!({"resource": "home", "node": "a", "role": "Primary",
                            "peers": [{"name": "b", "connection": "Connected",
                                       "replication": "Established"}]});
        // As `cairn repl up` answers: one JSON line per connection.
        let live = UnixListener::bind(dir.join("repl-home.sock")).unwrap();
        let answer = json!({"ok": true, "message": "", "status": status});
        let server = std::thread::spawn(move || {
            for c in live.incoming().take(2) {
                let c = c.unwrap();
                let mut line = String::new();
                BufReader::new(&c).read_line(&mut line).unwrap();
                assert_eq!(line.trim(), r#"{"cmd":"status"}"#);
                (&c).write_all(format!("{answer}\n").as_bytes()).unwrap();
            }
        });
        drop(UnixListener::bind(dir.join("repl-dead.sock")).unwrap());
        let _stuck = UnixListener::bind(dir.join("repl-stuck.sock")).unwrap();
        std::fs::write(dir.join("repl-home.nbd"), b"").unwrap();
        let nbd = cairn_nbd::Server::new({
            let mut c = cairn_nbd::ServerConfig::new(Vec::new());
            c.allow_empty = true;
            c
        })
        .unwrap()
        .exports_handle();
        let at = Endpoints {
            repl_dir: Some(dir.clone()),
            ..Endpoints::default()
        };
        let d = Daemon::new(
            Vec::new(),
            Options::default(),
            nbd,
            Events::new(4, None),
            at,
        );

        let started = std::time::Instant::now();
        let (code, v) = get(&d, "/v1/replication");
        assert_eq!(code, 200);
        let list = v["resources"].as_array().unwrap();
        assert_eq!(list.len(), 2, "{v:#}");
        assert_eq!(
            list[0], status,
            "the status exactly as the resource gave it"
        );
        assert_eq!(list[1]["resource"], "stuck");
        assert_eq!(
            list[1]["control"],
            dir.join("repl-stuck.sock").to_str().unwrap()
        );
        let e = list[1]["error"].as_str().unwrap();
        assert!(e.starts_with("resource stuck does not answer on "), "{e}");
        assert!(
            started.elapsed() < REPL_TIMEOUT * 2,
            "a stuck resource holds the answer {:?}",
            started.elapsed()
        );

        assert_eq!(get(&d, "/v1/replication/home"), (200, status));
        let (code, v) = get(&d, "/v1/replication/nope");
        assert_eq!(code, 404);
        assert_eq!(
            v["error"],
            "no replicated resource named \"nope\" runs here; resources with a control \
             socket here: dead, home, stuck"
        );
        let (code, v) = get(&d, "/v1/replication/dead");
        assert_eq!(code, 404);
        assert!(
            v["error"].as_str().unwrap().contains("its process is gone"),
            "{v}"
        );
        let (code, v) = get(&d, "/v1/replication/stuck");
        assert_eq!(code, 503);
        assert!(
            v["error"].as_str().unwrap().contains("does not answer"),
            "{v}"
        );
        assert!(get(&d, "/v1/nothing").1["error"]
            .as_str()
            .unwrap()
            .contains("GET /v1/replication/NAME"));
        server.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
