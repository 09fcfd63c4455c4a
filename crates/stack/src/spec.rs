//! A stack as data: what to open, layer over layer, and the one function that opens it.
//!
//! Every front end (`cairn serve` arguments, the config file's `[[export]]` tables, the
//! control API's `POST /v1/exports`, `advise`, `quickstart`, the `luks` and `lvm` verbs)
//! says what it wants as a [`Spec`] and calls [`open`]; none of them wires layers by hand.
//!
//! ```text
//!   Spec::File(path)                 a file or block device
//!   Spec::Md([member, ...])          the md array on these members (files or devices)
//!   Spec::Luks { on: Spec, key_file } the LUKS volume on any stack that makes one export
//!   Spec::Lvm([Spec, ...])           the volume groups on these PV stacks: one export per LV
//!   Spec::Lv { on: [Spec, ...], name } one LV ("VG/LV") of the volume groups on these PVs
//! ```
//!
//! In JSON (the control API) a spec is `{"file": "/srv/d.img"}`, `{"md": ["a", "b"]}`,
//! `{"luks": {"on": {"md": [...]}, "key_file": "/etc/cairn/key"}}`,
//! `{"lvm": [{"file": "pv.img"}]}` or `{"lv": {"on": [{"file": "pv.img"}], "name": "vg0/home"}}`.
//!
//! The opened stack is a tree of layers ([`crate::export::Layer`]), each owning the one
//! below, so any shape that makes one export opens: LUKS over an LV, over LUKS, over an
//! array. What cannot be (LUKS over a whole LVM spec, which makes several exports; LVM
//! over LVs) is refused with a sentence, not opened halfway.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::{Result, StackError};
use crate::export::{self, ExportSpec, OpenedExport};
use crate::hooks::{Options, Prompt};
use crate::luks::{self, KeyCache, KeySource};
use crate::md::{self, MdSpec};

/// A stack and the name its export is to get (`None`: the file's or array's own).
pub type NamedSpec = (Option<String>, Spec);

/// What to open.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Spec {
    /// A file or block device.
    File(PathBuf),
    /// The md array on these members, in any order; missing ones make it degraded.
    Md(Vec<PathBuf>),
    /// The LUKS volume on the stack below.
    Luks {
        on: Box<Spec>,
        /// The passphrase's file for this volume (otherwise the key directory, the
        /// general key file, then the prompt).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        key_file: Option<PathBuf>,
    },
    /// The volume groups on these PV stacks; every LV becomes an export `VG/LV`.
    Lvm(Vec<Spec>),
    /// One LV of the volume groups on the PV stacks `on`, named `VG/LV`: one export, so
    /// LUKS can be opened over it.
    Lv { on: Vec<Spec>, name: String },
}

impl Spec {
    /// How messages name this stack: a path, "the md array on a, b", "LUKS on ...".
    pub fn shown(&self) -> String {
        match self {
            Spec::File(p) => p.display().to_string(),
            Spec::Md(members) => format!("the md array on {}", paths(members)),
            Spec::Luks { on, .. } => on.shown(),
            Spec::Lvm(pvs) => format!(
                "the volume groups on {}",
                pvs.iter().map(Spec::shown).collect::<Vec<_>>().join(", ")
            ),
            Spec::Lv { on, name } => format!(
                "LV {name} on {}",
                on.iter().map(Spec::shown).collect::<Vec<_>>().join(", ")
            ),
        }
    }

    /// Every file or block device the stack reads, bottom first.
    pub fn paths(&self) -> Vec<PathBuf> {
        match self {
            Spec::File(p) => vec![p.clone()],
            Spec::Md(m) => m.clone(),
            Spec::Luks { on, .. } => on.paths(),
            Spec::Lvm(pvs) | Spec::Lv { on: pvs, .. } => pvs.iter().flat_map(Spec::paths).collect(),
        }
    }

    /// Refuses the shapes an opened stack cannot hold, before anything is opened.
    pub fn check(&self) -> Result<()> {
        match self {
            Spec::File(p) if p.as_os_str().is_empty() => {
                Err(StackError::new("an empty file name in a stack"))
            }
            Spec::Md(m) if m.is_empty() => Err(StackError::new("an md array needs members")),
            Spec::Md(m) if m.iter().any(|p| p.as_os_str().is_empty()) => {
                Err(StackError::new("an empty member name in an md array"))
            }
            Spec::File(_) | Spec::Md(_) => Ok(()),
            Spec::Luks { on, .. } => match &**on {
                Spec::Lvm(_) => Err(StackError::new(format!(
                    "LUKS on {} is not supported: that makes one export per LV; name the LV \
                     ({{\"lv\": {{\"on\": [...], \"name\": \"VG/LV\"}}}}) to open LUKS on it",
                    on.shown()
                ))),
                _ => on.check(),
            },
            Spec::Lv { name, .. } if !name.contains('/') => {
                Err(StackError::new(format!("LV {name:?}: name it as VG/LV")))
            }
            Spec::Lvm(pvs) | Spec::Lv { on: pvs, .. } if pvs.is_empty() => {
                Err(StackError::new("LVM needs at least one PV stack"))
            }
            Spec::Lvm(pvs) | Spec::Lv { on: pvs, .. } => {
                for pv in pvs {
                    if matches!(pv, Spec::Lvm(_) | Spec::Lv { .. }) {
                        return Err(StackError::new(
                            "LVM over LVs is not supported: a PV is a file, a block \
                             device, an md array or a LUKS volume",
                        ));
                    }
                    pv.check()?;
                }
                Ok(())
            }
        }
    }
}

fn paths(ps: &[PathBuf]) -> String {
    ps.iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// The stacks `--md M1,M2,...[:NAME]` and `--luks [DEVICE[:NAME]]` arguments name (serve,
/// advise): the md arrays (LUKS on each when a bare `--luks` is given), and the LUKS
/// volumes on the devices given. Callers serve them in their own order.
pub fn md_and_luks_args(
    md: &[String],
    luks: &[String],
) -> Result<(Vec<NamedSpec>, Vec<NamedSpec>)> {
    let arrays = md
        .iter()
        .map(|a| md::parse_md_spec(a))
        .collect::<Result<Vec<_>>>()?;
    let luks_over_md = luks.iter().any(String::is_empty);
    if luks_over_md && arrays.is_empty() {
        return Err(StackError::new(
            "--luks without a DEVICE means \"the --md arrays are encrypted\", but no --md was \
             given; name the volume: --luks DEVICE[:NAME]",
        ));
    }
    let mut mds = Vec::new();
    for m in arrays {
        let spec = Spec::Md(m.members);
        let spec = if luks_over_md {
            Spec::Luks {
                on: Box::new(spec),
                key_file: None,
            }
        } else {
            spec
        };
        mds.push((m.name, spec));
    }
    let mut volumes = Vec::new();
    for a in luks.iter().filter(|a| !a.is_empty()) {
        let s = export::parse_spec(a)?;
        let on = Box::new(Spec::File(s.path));
        volumes.push((Some(s.name), Spec::Luks { on, key_file: None }));
    }
    Ok((mds, volumes))
}

/// Where passphrases come from while opening stacks: a key directory (files named by
/// LUKS UUID), a key file, then a person through [`Prompt`]. Key files are read once
/// each (`-`, stdin, can be read only once).
#[derive(Debug)]
pub struct Keys {
    cache: KeyCache,
    key_file: Option<PathBuf>,
    key_dir: Option<PathBuf>,
    ask: bool,
    /// Describe LUKS volumes from their headers and leave them locked (dry runs).
    locked: bool,
}

impl Keys {
    pub fn new(
        key_file: Option<PathBuf>,
        key_dir: Option<PathBuf>,
        prompt: Option<Arc<dyn Prompt>>,
    ) -> Keys {
        Keys {
            ask: prompt.is_some(),
            cache: KeyCache::new(prompt),
            key_file,
            key_dir,
            locked: false,
        }
    }

    /// No passphrase at all: LUKS volumes are described from their headers and stay
    /// locked (their exports read-only, reads refused). For `advise` and dry runs.
    pub fn locked() -> Keys {
        Keys {
            locked: true,
            ..Keys::none()
        }
    }

    /// No keys at all: opening a LUKS spec fails with advice.
    pub fn none() -> Keys {
        Keys::new(None, None, None)
    }

    /// Pushes a LUKS layer: the volume on `e` unlocked, with `own` (the spec's key file)
    /// as its only source when given. On failure `e` is untouched (its caller closes it).
    pub fn unlock(
        &mut self,
        e: &OpenedExport,
        shown: &str,
        own: Option<&Path>,
    ) -> Result<OpenedExport> {
        if self.locked {
            return luks::describe_locked(e.clone(), shown);
        }
        let sources = match own {
            Some(k) => vec![KeySource::KeyFile(k.to_path_buf())],
            None => {
                let uuid = luks::luks_uuid(e.device.clone(), shown)?;
                luks::key_sources(
                    &uuid,
                    self.key_file.as_deref(),
                    self.key_dir.as_deref(),
                    self.ask,
                )
            }
        };
        luks::unlock_with(e, shown, &sources, &mut self.cache).map(|(u, _)| u)
    }
}

/// Opens `spec`. `name` names the export (a file's stem or an array's name otherwise);
/// LVs are named `VG/LV` whatever it says. An LVM spec gives one export per LV, every
/// other spec exactly one. On failure nothing stays open: arrays opened on the way are
/// closed (marked clean) again.
pub fn open(
    spec: &Spec,
    name: Option<&str>,
    opts: &Options,
    keys: &mut Keys,
) -> Result<Vec<OpenedExport>> {
    spec.check()?;
    let mut opened = match spec {
        Spec::Lvm(pvs) => open_lvs(pvs, opts, keys)?,
        _ => vec![open_checked(spec, name, opts, keys)?],
    };
    opened.iter_mut().for_each(OpenedExport::fence_by_leases);
    Ok(opened)
}

/// Every LV of the volume groups on the PV stacks `pvs`; on failure the PV stacks are
/// closed again.
fn open_lvs(pvs: &[Spec], opts: &Options, keys: &mut Keys) -> Result<Vec<OpenedExport>> {
    let mut opened: Vec<OpenedExport> = Vec::new();
    for pv in pvs {
        match open_checked(pv, Some(""), opts, keys) {
            Ok(e) => opened.push(e),
            Err(err) => {
                close_all(&opened);
                return Err(err);
            }
        }
    }
    let arrays = export::all_arrays(&opened);
    let leaves: Vec<PathBuf> = opened.iter().flat_map(OpenedExport::leaves).collect();
    let lvs = crate::lvm::open_lv_exports(opened, opts.read_only).inspect_err(|_| {
        for a in arrays {
            let _ = crate::fence::close_array(&a);
        }
        crate::fence::release_exports(&leaves);
    })?;
    // RAID LVs on remote PVs: their images are re-added when a PV's server returns.
    for e in &lvs {
        if let Some(lv) = e.lvm() {
            let pvs: Vec<PathBuf> = lv.pvs.iter().flat_map(OpenedExport::leaves).collect();
            crate::remote::supervise_lv(&lv.volume, &pvs, opts);
        }
    }
    Ok(lvs)
}

/// Opens a spec that makes one export (anything but LVM).
pub fn open_one(
    spec: &Spec,
    name: Option<&str>,
    opts: &Options,
    keys: &mut Keys,
) -> Result<OpenedExport> {
    spec.check()?;
    let mut e = open_checked(spec, name, opts, keys)?;
    e.fence_by_leases();
    Ok(e)
}

/// [`open_one`] for a spec already checked.
fn open_checked(
    spec: &Spec,
    name: Option<&str>,
    opts: &Options,
    keys: &mut Keys,
) -> Result<OpenedExport> {
    match spec {
        Spec::File(path) => {
            let name = match name {
                Some(n) => n.to_string(),
                None => export::parse_spec(&path.display().to_string())?.name,
            };
            export::open(
                &ExportSpec {
                    path: path.clone(),
                    name,
                },
                opts,
            )
        }
        Spec::Md(members) => {
            let e = md::open_export(
                &MdSpec {
                    members: members.clone(),
                    name: name.map(str::to_string),
                },
                opts,
            )?;
            Ok(match opts.stripe_cache {
                Some(c) => md::with_stripe_cache(e, c),
                None => e,
            })
        }
        Spec::Luks { on, key_file } => {
            let below = open_checked(on, name, opts, keys)?;
            let shown = on.shown();
            keys.unlock(&below, &shown, key_file.as_deref())
                .inspect_err(|_| below.close())
        }
        Spec::Lv { on, name: lv } => {
            let all = open_lvs(on, opts, keys)?;
            let Some(i) = all.iter().position(|e| e.name == *lv) else {
                let names: Vec<&str> = all.iter().map(|e| e.name.as_str()).collect();
                close_all(&all);
                return Err(StackError::new(format!(
                    "no LV {lv} to open on {}; the LVs there are: {}",
                    spec.shown(),
                    if names.is_empty() {
                        "(none)".to_string()
                    } else {
                        names.join(", ")
                    }
                )));
            };
            let mut e = all.into_iter().nth(i).expect("found");
            if let Some(n) = name.filter(|n| !n.is_empty()) {
                e.name = n.to_string();
            }
            Ok(e)
        }
        Spec::Lvm(_) => Err(StackError::new(format!(
            "{} makes one export per LV, not one export",
            spec.shown()
        ))),
    }
}

/// Closes (marks clean) every md array behind `opened`.
pub fn close_all(opened: &[OpenedExport]) {
    for a in export::all_arrays(opened) {
        let _ = crate::fence::close_array(&a);
    }
    let leaves: Vec<PathBuf> = opened.iter().flat_map(OpenedExport::leaves).collect();
    crate::fence::release_exports(&leaves);
}

/// Opens every `(name, spec)` in order; on a failure the ones opened before are closed
/// and the error names the stack that failed.
pub fn open_all(defs: &[NamedSpec], opts: &Options, keys: &mut Keys) -> Result<Vec<OpenedExport>> {
    let mut out: Vec<OpenedExport> = Vec::new();
    for (name, spec) in defs {
        match open(spec, name.as_deref(), opts, keys) {
            Ok(e) => out.extend(e),
            Err(err) => {
                close_all(&out);
                return Err(err);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn md_and_luks_arguments_become_specs() {
        let (mds, vols) = md_and_luks_args(
            &strings(&["a.img,b.img:data"]),
            &strings(&["", "v.img:vault"]),
        )
        .unwrap();
        assert_eq!(mds.len(), 1);
        assert_eq!(mds[0].0.as_deref(), Some("data"));
        assert!(
            matches!(&mds[0].1, Spec::Luks { on, key_file: None } if **on == Spec::Md(vec!["a.img".into(), "b.img".into()])),
            "{:?}",
            mds[0].1
        );
        assert_eq!(vols.len(), 1);
        assert_eq!(vols[0].0.as_deref(), Some("vault"));
        assert_eq!(vols[0].1.paths(), [PathBuf::from("v.img")]);
        // A bare --luks says the arrays are encrypted: without arrays it is a mistake.
        let err = md_and_luks_args(&[], &strings(&[""])).unwrap_err();
        assert!(err.to_string().contains("no --md was given"), "{err}");
        // Without a bare --luks the arrays are served as they are.
        let (mds, _) = md_and_luks_args(&strings(&["a.img,b.img"]), &[]).unwrap();
        assert_eq!(
            mds[0],
            (None, Spec::Md(vec!["a.img".into(), "b.img".into()]))
        );
    }
}
