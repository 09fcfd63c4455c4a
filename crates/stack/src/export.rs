//! Turning `FILE[:NAME]` arguments into opened devices with export names.

use std::collections::HashMap;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn_block::{BlockDevice, ErrorKind, FileDisk, OpenOptions};
use serde::Serialize;

use crate::error::{Result, StackError};
use crate::hooks::Options;
use crate::node::LvDetails;

/// One `FILE[:NAME]` argument, split.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSpec {
    pub path: PathBuf,
    pub name: String,
}

/// An opened stack: the device to serve and the layers below it, each owning the one
/// below ([`Layer`]). Any shape a [`crate::Spec`] allows: LUKS over a file, an md array,
/// an LV or another LUKS volume; LVs over PV stacks of any of those.
#[derive(Debug, Clone)]
pub struct OpenedExport {
    pub name: String,
    /// The bottom file or device (for an md array its first member, for an LV its first
    /// PV's): how messages and the announcement name the stack.
    pub path: PathBuf,
    /// What to serve: the top layer's device. For a LUKS volume described but left
    /// locked it is the encrypted bytes below, never served (the export is read-only and
    /// only described; its size is the payload's, [`OpenedExport::geometry`]).
    pub device: Arc<dyn BlockDevice>,
    pub read_only: bool,
    /// The top layer, which owns the rest of the stack.
    pub layer: Layer,
}

/// One layer of an opened stack.
#[derive(Debug, Clone)]
pub enum Layer {
    /// A file or block device: the export's `device` itself.
    File,
    /// An md array; the export's `device` is the array or a stripe cache over it. It is
    /// closed (marked clean) when the stack closes.
    Md(Arc<cairn_md::Array>),
    /// A LUKS volume over the stack `below`: the export's `device` decrypts it.
    Luks {
        info: LuksInfo,
        /// Described from its header and left locked (dry runs): the payload's geometry.
        locked: Option<cairn_block::Geometry>,
        below: Box<OpenedExport>,
    },
    /// An LVM2 logical volume over the PV stacks holding its extents.
    Lv(LvLayer),
}

impl OpenedExport {
    /// Wraps the device in the lease check of every array below it held as an etcd
    /// lease, so client I/O is refused once a lease may be lost (also what a stripe
    /// cache above the array would otherwise acknowledge).
    pub fn fence_by_leases(&mut self) {
        for array in self.arrays() {
            if let Some(g) = crate::fence::lease_of(&array) {
                self.device = Arc::new(cairn_cluster::FencedDevice::new(self.device.clone(), g));
            }
        }
    }

    /// Whether any array below, or any remote export used whole, is held as an etcd
    /// lease.
    pub fn leased(&self) -> bool {
        crate::fence::leased(&self.arrays(), &self.leaves())
    }

    /// Every md array in this export's stack, each once (LVs of one VG share their PVs).
    pub fn arrays(&self) -> Vec<Arc<cairn_md::Array>> {
        let mut out: Vec<Arc<cairn_md::Array>> = Vec::new();
        let mut push = |a: Arc<cairn_md::Array>| {
            if !out.iter().any(|b| Arc::ptr_eq(&a, b)) {
                out.push(a);
            }
        };
        match &self.layer {
            Layer::File => {}
            Layer::Md(a) => push(a.clone()),
            Layer::Luks { below, .. } => below.arrays().into_iter().for_each(&mut push),
            Layer::Lv(lv) => lv
                .pvs
                .iter()
                .flat_map(OpenedExport::arrays)
                .for_each(&mut push),
        }
        out
    }

    /// The md array this stack is, or the one right under its LUKS layers (not through
    /// an LV: an LV's arrays are its PVs').
    pub fn md(&self) -> Option<&Arc<cairn_md::Array>> {
        match &self.layer {
            Layer::Md(a) => Some(a),
            Layer::Luks { below, .. } => below.md(),
            _ => None,
        }
    }

    /// The LUKS volume at the top of this stack.
    pub fn luks(&self) -> Option<&LuksInfo> {
        match &self.layer {
            Layer::Luks { info, .. } => Some(info),
            _ => None,
        }
    }

    /// The LV this stack is, or the one under its LUKS layers.
    pub fn lvm(&self) -> Option<&LvLayer> {
        match &self.layer {
            Layer::Lv(lv) => Some(lv),
            Layer::Luks { below, .. } => below.lvm(),
            _ => None,
        }
    }

    /// The stack under the top layer (a LUKS volume's), if the top layer has one below.
    pub fn below(&self) -> Option<&OpenedExport> {
        match &self.layer {
            Layer::Luks { below, .. } => Some(below),
            _ => None,
        }
    }

    /// Whether the top is a LUKS volume described but not unlocked.
    pub fn locked(&self) -> bool {
        matches!(
            &self.layer,
            Layer::Luks {
                locked: Some(_),
                ..
            }
        )
    }

    /// The size and geometry this stack offers (a locked LUKS volume: its payload's).
    pub fn geometry(&self) -> cairn_block::Geometry {
        match &self.layer {
            Layer::Luks {
                locked: Some(g), ..
            } => *g,
            _ => self.device.geometry(),
        }
    }

    /// Closes the stack from the top down: md arrays are marked clean, remote exports
    /// used whole are given up. Dropping the last clone closes the files.
    pub fn close(&self) {
        for a in self.arrays() {
            let _ = crate::fence::close_array(&a);
        }
        crate::fence::release_exports(&self.leaves());
    }

    /// The files, devices and remote exports this stack uses whole (not as md members).
    pub fn leaves(&self) -> Vec<PathBuf> {
        match &self.layer {
            Layer::File => vec![self.path.clone()],
            Layer::Md(_) => Vec::new(),
            Layer::Luks { below, .. } => below.leaves(),
            Layer::Lv(lv) => lv.pvs.iter().flat_map(OpenedExport::leaves).collect(),
        }
    }
}

/// The md arrays of the RAID LVs among `exports` (not in [`all_arrays`]: they have no
/// superblocks, UUID or name of their own; the LV is what names them).
pub fn raid_lv_arrays(exports: &[OpenedExport]) -> Vec<Arc<cairn_md::Array>> {
    exports
        .iter()
        .filter_map(|e| e.lvm().and_then(LvLayer::array).cloned())
        .collect()
}

/// Every md array behind `exports`, each once (LVs of one VG share their PVs).
pub fn all_arrays(exports: &[OpenedExport]) -> Vec<Arc<cairn_md::Array>> {
    let mut out: Vec<Arc<cairn_md::Array>> = Vec::new();
    for e in exports {
        for a in e.arrays() {
            if !out.iter().any(|b| Arc::ptr_eq(&a, b)) {
                out.push(a);
            }
        }
    }
    out
}

/// Splits `FILE[:NAME]`. A path that exists as typed wins over splitting, so device paths
/// with colons (`/dev/disk/by-path/pci-0000:00:1f.2-ata-1`) work without a name.
pub fn parse_spec(arg: &str) -> Result<ExportSpec> {
    if arg.is_empty() {
        return Err(StackError::new(
            "an empty FILE argument; give a file or block device path",
        ));
    }
    let whole = Path::new(arg);
    if let (false, Some((path, name))) = (whole.exists(), arg.rsplit_once(':')) {
        // nbd://HOST:PORT is a URI with a port, not HOST with a name.
        let uri_port = crate::leaf::is_remote(whole)
            && !path.split_once("://").is_some_and(|(_, r)| r.contains('/'));
        if !path.is_empty() && !name.contains('/') && !uri_port {
            check_name(name, arg)?;
            return Ok(ExportSpec {
                path: PathBuf::from(path),
                name: name.to_string(),
            });
        }
    }
    if crate::leaf::is_remote(whole) {
        // A remote export keeps its own name ("" becomes "remote").
        let u = crate::leaf::parse_remote(whole)?;
        let name = if u.export.is_empty() {
            "remote".to_string()
        } else {
            u.export.replace('/', "_")
        };
        check_name(&name, arg).map_err(|_| {
            StackError::new(format!(
                "the export name taken from {arg:?} would be {name:?}, which does not fit in \
                 an NBD URI; name it explicitly as {arg}:NAME"
            ))
        })?;
        return Ok(ExportSpec {
            path: whole.to_path_buf(),
            name,
        });
    }
    // Files lose their extension (disk.img -> disk); device names are kept whole
    // (/dev/disk/by-path/pci-0000:00:1f.2-ata-1).
    let is_device = std::fs::metadata(whole).is_ok_and(|m| m.file_type().is_block_device());
    let base = if is_device {
        whole.file_name()
    } else {
        whole.file_stem()
    };
    let name = base
        .and_then(|s| s.to_str())
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            StackError::new(format!(
                "cannot make an export name from {arg:?}; name it explicitly as {arg}:NAME"
            ))
        })?
        .to_string();
    check_name(&name, arg).map_err(|_| {
        StackError::new(format!(
            "the export name taken from {arg:?} would be {name:?}, which does not fit in an \
             NBD URI; name it explicitly as {arg}:NAME using letters, digits, '.', '_' or '-'"
        ))
    })?;
    Ok(ExportSpec {
        path: whole.to_path_buf(),
        name,
    })
}

/// Export names appear in URIs (`nbd://host/NAME`), so keep them to characters that need
/// no escaping there or in a shell: 1 to 255 letters, digits, '.', '_', '-', '+' or ':',
/// not starting with '.'. (LV exports, `VG/LV`, are named by the LVM layer.)
pub fn export_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 255
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '+' | ':'))
        && !name.starts_with('.')
}

fn check_name(name: &str, arg: &str) -> Result<()> {
    if export_name_ok(name) {
        Ok(())
    } else {
        Err(StackError::new(format!(
            "export name {name:?} (from {arg:?}) must be 1 to 255 letters, digits, '.', '_', \
             '-', '+' or ':', not starting with '.'"
        )))
    }
}

/// Refuses two exports with one name, naming both files.
pub fn check_unique(specs: &[ExportSpec]) -> Result<()> {
    let mut seen: HashMap<&str, &Path> = HashMap::new();
    for s in specs {
        if let Some(first) = seen.insert(&s.name, &s.path) {
            return Err(StackError::new(format!(
                "two exports would be named {:?} ({} and {}); give one another name with \
                 FILE:NAME, e.g. {}:{}2",
                s.name,
                first.display(),
                s.path.display(),
                s.path.display(),
                s.name
            )));
        }
    }
    Ok(())
}

/// Opens one file or block device, explaining failures in the user's terms.
pub fn open(spec: &ExportSpec, o: &Options) -> Result<OpenedExport> {
    let (read_only, direct) = (o.read_only, o.direct);
    let dev = if let Some(c) = crate::fence::claim_export(&spec.path, o)? {
        // Writable and remote: taken over first (lease, generation); the connection
        // that declared the generation is the one served, behind the lease check.
        c.claim.fence_device(c.device)
    } else if crate::leaf::is_remote(&spec.path) {
        crate::leaf::open(&spec.path, read_only, direct, o.remote_timeout())?
    } else {
        open_local(spec, read_only, direct)?
    };
    // Counted as the stack node "file:PATH" (cairn top, metrics).
    let device = o.hooks.wrap(&format!("file:{}", spec.path.display()), dev);
    Ok(OpenedExport {
        name: spec.name.clone(),
        path: spec.path.clone(),
        device,
        read_only,
        layer: Layer::File,
    })
}

/// A local file or block device, its failures in the user's terms.
fn open_local(spec: &ExportSpec, read_only: bool, direct: bool) -> Result<Arc<dyn BlockDevice>> {
    let shown = spec.path.display();
    let meta = std::fs::metadata(&spec.path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => StackError::new(format!(
            "{shown} does not exist; create a sparse disk file with `truncate -s 1G {shown}`, \
             or try `cairn quickstart`"
        )),
        _ => StackError::new(format!("cannot open {shown}: {e}")),
    })?;
    if meta.is_dir() {
        return Err(StackError::new(format!(
            "{shown} is a directory; give a disk image file or a block device"
        )));
    }
    if meta.is_file() && meta.len() == 0 {
        return Err(StackError::new(format!(
            "{shown} is empty; give it a size first, e.g. `truncate -s 1G {shown}`"
        )));
    }
    let opts = OpenOptions {
        read_only,
        direct,
        create_size: None,
    };
    let disk = FileDisk::open(&spec.path, &opts).map_err(|e| match e.kind() {
        ErrorKind::ReadOnly if !read_only => StackError::new(format!(
            "cannot open {shown} for writing ({e}); serve it with --read-only or fix its \
             permissions"
        )),
        ErrorKind::InvalidArgument if direct => StackError::new(format!(
            "cannot open {shown} with --direct ({e}); some filesystems (tmpfs) refuse \
             O_DIRECT, so try without --direct"
        )),
        ErrorKind::Busy => crate::owner::busy(&shown.to_string(), &e),
        _ => StackError::new(format!("cannot export {shown}: {e}")),
    })?;
    crate::owner::note_reader(&shown.to_string(), &disk);
    Ok(Arc::new(disk))
}

/// What the announcement says about a LUKS export.
#[derive(Debug, Clone, Serialize)]
pub struct LuksInfo {
    pub version: u16,
    pub uuid: String,
    /// The keyslot the passphrase opened.
    pub keyslot: u32,
    /// Byte offset of the encrypted payload on the device below.
    pub data_offset: u64,
    pub sector_size: u32,
    /// "LUKS2 aes-xts-plain64 512-bit, 4096-byte sectors, data at 16777216".
    pub description: String,
}

/// What an LV export has below it: one stack per PV the VG holds.
#[derive(Debug, Clone)]
pub struct LvLayer {
    pub details: LvDetails,
    /// The PV stacks holding the LV's extents, in the order its extents reach them.
    pub pvs: Vec<OpenedExport>,
    /// Byte offset of the LV's first byte on its first PV.
    pub first_byte: u64,
    /// The LV as opened: a RAID LV's md array (its rebuilds, resync and progress) is
    /// reached through it.
    pub volume: Arc<cairn_lvm::LogicalVolume>,
}

impl LvLayer {
    /// The md array of a RAID LV.
    pub fn array(&self) -> Option<&Arc<cairn_md::Array>> {
        self.volume.array()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(arg: &str) -> ExportSpec {
        parse_spec(arg).unwrap()
    }

    #[test]
    fn names_come_from_the_file_or_after_the_colon() {
        assert_eq!(spec("disk.img").name, "disk");
        assert_eq!(spec("/dev/sdb").name, "sdb");
        assert_eq!(spec("/srv/vm.disk.raw").name, "vm.disk");
        let s = spec("/srv/a.img:data");
        assert_eq!(
            (s.path, s.name),
            (PathBuf::from("/srv/a.img"), "data".to_string())
        );
    }

    #[test]
    fn bad_names_are_refused_with_advice() {
        let err = parse_spec("/srv/my disk.img").unwrap_err().to_string();
        assert!(err.contains(":NAME"), "{err}");
        assert!(parse_spec("a.img:bad name").is_err());
        assert!(parse_spec("a.img:").is_err());
        assert!(parse_spec("").is_err());
    }

    #[test]
    fn an_existing_path_with_a_colon_is_not_split() {
        let dir = std::env::temp_dir().join(format!("cairn-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let odd = dir.join("pci-0000:00:1f.2");
        std::fs::write(&odd, [0u8; 512]).unwrap();
        let s = spec(odd.to_str().unwrap());
        assert_eq!(s.path, odd);
        assert_eq!(s.name, "pci-0000:00:1f");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn duplicate_names_name_both_files() {
        let specs = [spec("a/disk.img"), spec("b/disk.raw")];
        let err = check_unique(&specs).unwrap_err().to_string();
        assert!(
            err.contains("a/disk.img") && err.contains("b/disk.raw"),
            "{err}"
        );
        assert!(check_unique(&[spec("a/disk.img"), spec("b/disk.raw:other")]).is_ok());
    }

    #[test]
    fn missing_file_says_so() {
        let err = open(&spec("/nonexistent/cairn/x.img"), &Options::default())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("/nonexistent/cairn/x.img does not exist"),
            "{err}"
        );
    }
}
