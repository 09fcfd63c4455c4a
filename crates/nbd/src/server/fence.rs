//! The member server's side of fencing: one gate per export holding the newest owner.
//!
//! ```text
//!   handshake: OPT_CAIRN_FENCE ─> Gate::admit   (write lock: waits for running requests,
//!                                                 persists a higher generation, FUA)
//!   transmission: every request ─> Gate::check  (read lock held while the request runs)
//! ```
//!
//! Because a request holds the read lock while it runs and admission takes the write lock,
//! a request of an old owner either finished before the new generation was stored or runs
//! after it and is refused: no write of an old owner lands after the new owner's first.

use std::sync::{RwLock, RwLockReadGuard};

use cairn_block::BlockDevice;

use crate::fence::{FenceStore, FenceToken, Stored};
use crate::proto::*;

/// The owner state of one export.
#[derive(Debug, Default)]
pub(super) struct Gate {
    state: RwLock<GateState>,
}

#[derive(Debug, Default)]
pub(super) struct GateState {
    /// The owner area has been read.
    loaded: bool,
    /// The area holds another format: this export cannot be fenced and nothing is checked
    /// (unless its record is kept beside it).
    foreign: bool,
    /// The record is kept beside the export (its owner uses the whole export,
    /// `FENCE_FLAG_WHOLE`): no area of the export is reserved, whatever its first bytes.
    beside: bool,
    /// The newest owner admitted or persisted.
    current: Option<FenceToken>,
    /// `current` released an export it used whole (`beside`): nobody owns it, so plain
    /// clients may write it again (an `md create` over a former PV, say), as before it
    /// was ever owned. A record in the export's first bytes (an md member) keeps its
    /// owner's claim on them whatever it says.
    released: bool,
    /// The record is damaged (what is wrong): nobody may write until an operator looks,
    /// but plain clients may still read (to inspect it, among others).
    damaged: Option<String>,
}

/// Why an admission was refused: the option error reply and its message.
pub(super) struct Refusal {
    pub(super) reply: u32,
    pub(super) message: String,
}

/// A request the gate let through; the lock is held until it is dropped.
pub(super) type Pass<'a> = Option<RwLockReadGuard<'a, GateState>>;

impl Gate {
    fn read(&self) -> RwLockReadGuard<'_, GateState> {
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn load(
        state: &mut GateState,
        store: &dyn FenceStore,
        export: &str,
        dev: &dyn BlockDevice,
    ) -> Result<(), String> {
        if state.loaded {
            return Ok(());
        }
        let beside = match store.load_beside(export) {
            Ok(b) => b,
            Err(e) if e.kind() == cairn_block::ErrorKind::Corrupt => {
                tracing::error!("export's owner record is damaged: {e}; writes are refused");
                state.damaged = Some(e.to_string());
                state.loaded = true;
                return Ok(());
            }
            Err(e) => return Err(format!("reading the owner record: {e}")),
        };
        if let Some(b) = beside {
            state.beside = true;
            if let Stored::Owner(t) = b {
                state.current = Some(t);
                state.released = store.released_beside(export).unwrap_or(false);
            }
            state.loaded = true;
            return Ok(());
        }
        let stored = match store.load(dev) {
            Ok(s) => s,
            Err(e) if e.kind() == cairn_block::ErrorKind::Corrupt => {
                tracing::error!("export's owner record is damaged: {e}; writes are refused");
                state.damaged = Some(e.to_string());
                state.loaded = true;
                return Ok(());
            }
            // Transient (an I/O error): tried again by the next request.
            Err(e) => return Err(format!("reading the owner record: {e}")),
        };
        match stored {
            Stored::Blank => {}
            Stored::Owner(t) => state.current = Some(t),
            Stored::Foreign(what) => {
                tracing::info!("export holds {what} where the owner record goes: not fenced");
                state.foreign = true;
            }
        }
        state.loaded = true;
        Ok(())
    }

    /// A connection declares `token`. A higher generation is persisted before this returns
    /// and fences every older owner at once.
    pub(super) fn admit(
        &self,
        store: &dyn FenceStore,
        export: &str,
        dev: &dyn BlockDevice,
        read_only: bool,
        token: &FenceToken,
        flags: u16,
    ) -> Result<(), Refusal> {
        let release = flags & crate::fence::FENCE_FLAG_RELEASE != 0;
        let whole = flags & crate::fence::FENCE_FLAG_WHOLE != 0;
        let policy = |message: String| Refusal {
            reply: REP_ERR_POLICY,
            message,
        };
        let mut s = self.state.write().unwrap_or_else(|p| p.into_inner());
        // While nobody owns the export, plain clients may have written its first bytes
        // (nothing in flight now: this lock waited for them), so read them again.
        if s.current.is_none() {
            s.loaded = false;
            s.foreign = false;
            s.beside = false;
            s.damaged = None;
        }
        Gate::load(&mut s, store, export, dev).map_err(policy)?;
        if let Some(d) = &s.damaged {
            return Err(policy(format!(
                "the owner record is damaged ({d}); `cairn md owner` shows it"
            )));
        }
        if s.foreign && !whole && !s.beside {
            return Err(policy(
                "this export's first bytes hold another format, so it cannot carry an owner \
                 record"
                    .into(),
            ));
        }
        match &s.current {
            Some(c) if token.generation < c.generation => Err(policy(format!(
                "fenced: generation {} is older than generation {} of owner {}",
                token.generation, c.generation, c.owner
            ))),
            Some(c) if token.generation == c.generation && !token.same_owner(c) => {
                Err(policy(format!(
                    "fenced: generation {} already belongs to owner {}",
                    c.generation, c.owner
                )))
            }
            Some(c) if token.same_owner(c) && !release => Ok(()),
            Some(c) if token.same_owner(c) => {
                let beside = s.beside;
                Gate::persist(store, export, dev, beside, token, true).map_err(|e| Refusal {
                    reply: REP_ERR_POLICY,
                    message: format!(
                        "recording the release of generation {}: {e}",
                        token.generation
                    ),
                })?;
                s.released = beside;
                tracing::info!(
                    "owner {} releases generation {}",
                    token.owner,
                    token.generation
                );
                Ok(())
            }
            _ if release => Err(policy(
                "only the current owner can release an export".into(),
            )),
            _ if read_only => Err(policy(
                "the export is read-only: a new owner generation cannot be recorded".into(),
            )),
            _ => {
                let beside = whole || s.beside;
                Gate::persist(store, export, dev, beside, token, false).map_err(|e| Refusal {
                    reply: REP_ERR_POLICY,
                    message: format!("recording generation {}: {e}", token.generation),
                })?;
                if let Some(c) = &s.current {
                    tracing::info!(
                        "owner {} (generation {}) fences owner {} (generation {})",
                        token.owner,
                        token.generation,
                        c.owner,
                        c.generation
                    );
                } else {
                    tracing::info!(
                        "owner {} takes generation {}",
                        token.owner,
                        token.generation
                    );
                }
                s.current = Some(token.clone());
                s.released = false;
                if beside {
                    s.beside = true;
                    s.foreign = false;
                }
                Ok(())
            }
        }
    }

    fn persist(
        store: &dyn FenceStore,
        export: &str,
        dev: &dyn BlockDevice,
        beside: bool,
        token: &FenceToken,
        released: bool,
    ) -> cairn_block::Result<()> {
        if beside {
            store.store_beside(export, token, released)
        } else {
            store.store(dev, token, released)
        }
    }

    /// Checks one request of a connection that declared `token` (or none). On success the
    /// returned guard must be held while the request runs.
    pub(super) fn check<'a>(
        &'a self,
        store: &dyn FenceStore,
        export: &super::Export,
        token: Option<&FenceToken>,
        kind: u16,
        offset: u64,
        length: u64,
    ) -> Result<Pass<'a>, (u32, String)> {
        let (dev, export) = (&*export.device, export.name.as_str());
        let mut s = self.read();
        if !s.loaded {
            drop(s);
            {
                let mut w = self.state.write().unwrap_or_else(|p| p.into_inner());
                Gate::load(&mut w, store, export, dev).map_err(|m| (EIO, m))?;
            }
            s = self.read();
        }
        if s.foreign && !s.beside {
            return Ok(Some(s));
        }
        let writes = matches!(kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        if let Some(d) = &s.damaged {
            if writes || token.is_some() {
                return Err((EPERM, format!("the owner record is damaged: {d}")));
            }
            return Ok(Some(s));
        }
        match (token, &s.current) {
            (Some(t), Some(c)) if t.same_owner(c) => {}
            (Some(t), c) => {
                let now = c.as_ref().map_or(0, |c| c.generation);
                return Err((
                    EPERM,
                    format!(
                        "fenced: this connection's owner generation {} was replaced by {now}",
                        t.generation
                    ),
                ));
            }
            (None, Some(c)) if writes && !(s.beside && s.released) => {
                return Err((
                    EPERM,
                    format!(
                        "export is owned by {} (generation {}): writes need the owner's fence \
                         token",
                        c.owner, c.generation
                    ),
                ))
            }
            (None, _) => {}
        }
        if writes && s.current.is_some() && !s.beside && offset < store.reserved() && length > 0 {
            return Err((
                EPERM,
                "the owner record at the start of the export is kept by the member server".into(),
            ));
        }
        Ok(Some(s))
    }
}

impl super::handshake::Handshake<'_> {
    /// `OPT_CAIRN_FENCE`: admits the declared owner on the named export, or refuses it.
    pub(super) fn fence_option(&mut self, data: &[u8]) -> std::io::Result<()> {
        const OPT: u32 = crate::fence::OPT_CAIRN_FENCE;
        let (name, token, flags) = match FenceToken::decode_option(data) {
            Ok(v) => v,
            Err(m) => return self.error(OPT, REP_ERR_INVALID, &m),
        };
        let Some(store) = self.shared.fence.clone() else {
            return self.error(OPT, REP_ERR_UNSUP, "this server does not enforce owners");
        };
        let Some(e) = self.shared.find(&name) else {
            return self.error(OPT, REP_ERR_UNKNOWN, &format!("no export named {name:?}"));
        };
        if flags & crate::fence::FENCE_FLAG_QUERY != 0 {
            return match store.record_bytes(&e.export.name, &*e.export.device) {
                Ok(bytes) => {
                    self.reply(OPT, crate::fence::REP_CAIRN_OWNER, &bytes)?;
                    self.reply(OPT, REP_ACK, &[])
                }
                Err(err) => self.error(
                    OPT,
                    REP_ERR_POLICY,
                    &format!("reading the owner record: {err}"),
                ),
            };
        }
        match e.gate.admit(
            &*store,
            &e.export.name,
            &*e.export.device,
            e.export.read_only,
            &token,
            flags,
        ) {
            Ok(()) => {
                tracing::info!(
                    "{}: owner {} generation {} on export {:?}",
                    self.peer,
                    token.owner,
                    token.generation,
                    e.export.name
                );
                self.fence = Some((e.export.name.clone(), token));
                self.reply(OPT, REP_ACK, &[])
            }
            Err(r) => {
                tracing::warn!("{}: export {:?}: {}", self.peer, e.export.name, r.message);
                self.error(OPT, r.reply, &r.message)
            }
        }
    }
}
