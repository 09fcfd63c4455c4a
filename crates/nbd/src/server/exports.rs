//! The export registry: what each export advertises, computed once, and the handle
//! that adds and removes exports while the server runs.

use super::*;

/// What the server knows about an export, computed once.
#[derive(Debug)]
pub(super) struct ExportEntry {
    pub(super) export: Export,
    pub(super) min_block: u32,
    pub(super) preferred_block: u32,
    pub(super) max_block: u32,
    /// Transmission flags before the per-connection ones (DF).
    pub(super) flags: u16,
    /// What requests are checked against: the size and the advertised minimum block.
    pub(super) geometry: cairn_block::Geometry,
    /// The newest owner generation (fence.rs), when the server enforces them.
    pub(super) gate: super::fence::Gate,
    /// What each class of request costs on the device: decides whether the reader runs
    /// it or the pool does (dispatch.rs).
    pub(super) costs: super::dispatch::Costs,
}

impl ExportEntry {
    pub(super) fn new(export: Export) -> ExportEntry {
        let g = export.device.geometry();
        let caps = export.device.capabilities();
        let read_only = export.read_only || caps.read_only;
        let min_block = g.logical_block_size.max(1);
        let max_block = {
            let m = g.max_io_size.clamp(min_block, MAX_SAFE_PAYLOAD);
            m - m % min_block
        };
        // proto.md: preferred is a power of two, >= min. A full stripe that is not a power
        // of two (three data disks) falls back to the chunk, which still avoids
        // read-modify-write below.
        let preferred_block = [g.optimal_io_size, g.physical_block_size, min_block]
            .into_iter()
            .find(|v| v.is_power_of_two() && *v >= min_block && *v <= max_block)
            .unwrap_or(min_block.next_power_of_two());
        let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_CACHE;
        // All connections share one device and one flush path, so FLUSH and FUA on any
        // connection cover writes completed on every connection.
        flags |= FLAG_CAN_MULTI_CONN;
        if read_only {
            flags |= FLAG_READ_ONLY;
        } else {
            flags |= FLAG_SEND_WRITE_ZEROES;
            if caps.discard != Support::None {
                flags |= FLAG_SEND_TRIM;
            }
            // FAST_ZERO is always offered: where zeroing is not native the request
            // fails quickly with ENOTSUP, which is exactly what the flag asks for.
            flags |= FLAG_SEND_FAST_ZERO;
        }
        let export = Export {
            read_only,
            ..export
        };
        ExportEntry {
            geometry: cairn_block::Geometry {
                logical_block_size: min_block,
                ..g
            },
            min_block,
            preferred_block,
            max_block,
            flags,
            export,
            gate: super::fence::Gate::default(),
            costs: super::dispatch::Costs::default(),
        }
    }
}

/// One connection as [`ExportsHandle::connections`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionInfo {
    pub id: u64,
    /// "unix:fd7", "tcp:127.0.0.1:50122".
    pub peer: String,
    /// The export it uses, once the handshake chose one.
    pub export: Option<String>,
    pub since: SystemTime,
}

/// What [`ExportsHandle::add`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Added {
    Added,
    /// An export of that name with the same device was there already.
    AlreadyPresent,
}

/// What [`ExportsHandle::remove`] did.
#[derive(Debug)]
pub struct Removed {
    pub export: Export,
    /// Connections that were using it and were closed (after their in-flight requests).
    pub connections: usize,
}

/// Adds and removes exports of a running server.
///
/// Removing an export stops new handshakes from finding it, then ends the connections
/// that use it the way shutdown does (reads stop, requests already received are
/// answered, the connection's writes are flushed), waits for them up to the grace
/// period, and flushes the device.
#[derive(Debug, Clone)]
pub struct ExportsHandle(pub(super) Arc<Shared>);

impl ExportsHandle {
    /// The exports now, in the order they were added.
    pub fn list(&self) -> Vec<Export> {
        self.0.exports().iter().map(|e| e.export.clone()).collect()
    }

    /// Adds `export`. The same name with the same device (`Arc::ptr_eq`) is
    /// [`Added::AlreadyPresent`]; the same name with another device is an error.
    pub fn add(&self, export: Export) -> Result<Added, ConfigError> {
        if export.name.is_empty() || export.name.len() > MAX_STRING || export.name.contains('\0') {
            return Err(ConfigError(format!(
                "export name {:?} must be 1 to {MAX_STRING} bytes without NUL",
                export.name
            )));
        }
        let mut list = self.0.exports.write().unwrap_or_else(|p| p.into_inner());
        if let Some(e) = list.iter().find(|e| e.export.name == export.name) {
            if Arc::ptr_eq(&e.export.device, &export.device) {
                return Ok(Added::AlreadyPresent);
            }
            return Err(ConfigError(format!(
                "an export named {:?} is already served",
                export.name
            )));
        }
        list.push(Arc::new(ExportEntry::new(export)));
        Ok(Added::Added)
    }

    /// Removes the export `name`; `None` if there is none.
    pub fn remove(&self, name: &str) -> Option<Removed> {
        let entry = {
            let mut list = self.0.exports.write().unwrap_or_else(|p| p.into_inner());
            let i = list.iter().position(|e| e.export.name == name)?;
            list.remove(i)
        };
        let users: Vec<u64> = {
            let conns = self.0.conns.lock().expect("conns lock");
            conns
                .iter()
                .filter(|(_, c)| c.export.as_deref() == Some(name))
                .map(|(id, c)| {
                    c.ctl.shutdown_read();
                    *id
                })
                .collect()
        };
        let deadline = Instant::now() + self.0.grace;
        loop {
            let left = {
                let conns = self.0.conns.lock().expect("conns lock");
                users.iter().filter(|id| conns.contains_key(id)).count()
            };
            if left == 0 {
                break;
            }
            if Instant::now() > deadline {
                tracing::warn!("export {name:?}: {left} connection(s) still busy; closing them");
                let conns = self.0.conns.lock().expect("conns lock");
                for id in &users {
                    if let Some(c) = conns.get(id) {
                        c.ctl.shutdown_both();
                    }
                }
                break;
            }
            thread::sleep(Duration::from_millis(10));
        }
        if !entry.export.read_only {
            if let Err(e) = entry.export.device.flush() {
                tracing::error!("export {name:?}: flush on removal: {e}");
            }
        }
        Some(Removed {
            export: entry.export.clone(),
            connections: users.len(),
        })
    }

    /// Live connections, oldest first.
    pub fn connections(&self) -> Vec<ConnectionInfo> {
        let conns = self.0.conns.lock().expect("conns lock");
        let mut v: Vec<ConnectionInfo> = conns
            .iter()
            .map(|(id, c)| ConnectionInfo {
                id: *id,
                peer: c.peer.clone(),
                export: c.export.clone(),
                since: c.since,
            })
            .collect();
        v.sort_by_key(|c| c.id);
        v
    }
}
