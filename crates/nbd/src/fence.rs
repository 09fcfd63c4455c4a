//! Fencing on the wire: a client declares which array owner it writes for, and a cairn
//! member server refuses writes from any owner but the newest.
//!
//! ```text
//!   client (array owner)                      cairn serve (disk host)
//!   OPT_CAIRN_FENCE {export, array, gen, owner} ──> Gate::admit: gen > stored? persist it
//!                                                   (FenceStore, FUA) and fence older
//!                                               <── ACK | ERR_POLICY (fenced) | ERR_UNSUP
//!   OPT_GO {export} ... WRITE ──────────────────> Gate::check before every request
//! ```
//!
//! The option is cairn's own: proto.md assigns option numbers 1..=11 and keeps no private
//! range, so cairn takes a value far above them (`OPT_CAIRN_FENCE`, "CRNF"). A fixed-newstyle
//! server that does not know it answers `NBD_REP_ERR_UNSUP` (nbdkit, qemu-nbd, nbd-server
//! do), so the client learns that the member cannot enforce and goes on; other clients
//! (libnbd, qemu) never send it and see no change. The byte layout is in docs/fencing.md.
//!
//! The record the server persists the generation in belongs to cairn-cluster; this crate
//! only knows it through [`FenceStore`]. This module is the wire format and nothing
//! else: the client sends the option with [`crate::client::Handshake::declare_fence`]
//! and [`crate::client::Handshake::query_owner`], the server answers it in
//! `server::fence`.

use std::fmt;

use cairn_block::BlockDevice;

/// The option a client sends before `NBD_OPT_GO` to declare its owner token.
pub const OPT_CAIRN_FENCE: u32 = 0x4352_4E46; // "CRNF"

/// Version of the option payload.
pub const FENCE_VERSION: u16 = 1;

/// Bytes of an owner's node name on the wire and on disk (NUL padded UTF-8).
pub const NODE_LEN: usize = 32;

/// Bytes of the option payload before the export name.
pub const FENCE_HEADER_LEN: usize = 72;

/// Option flag: the owner gives the export up (a clean stop). The record stays, marked
/// released, so the next owner may take over without being told to force it.
pub const FENCE_FLAG_RELEASE: u16 = 1;

/// Option flag: the owner uses the whole export (a LUKS volume, an LVM PV, an export
/// served as it is), not an md member's data area: the server keeps the record beside
/// the export ([`FenceStore::store_beside`]), never in its first bytes, and reserves no
/// area of it. An export whose record is kept beside it stays that way, whoever declares.
pub const FENCE_FLAG_WHOLE: u16 = 2;

/// Option flag: admit nothing, answer with the export's owner record
/// ([`REP_CAIRN_OWNER`], then `NBD_REP_ACK`). How an owner of a whole export, whose
/// record it cannot read in the export's bytes, learns the generation to beat.
pub const FENCE_FLAG_QUERY: u16 = 4;

/// The reply to [`FENCE_FLAG_QUERY`] before its ACK: the record's bytes (the format is
/// cairn-cluster's), empty when the export was never owned. A private reply type, like
/// the option, far above the ones proto.md assigns (and without the error bit).
pub const REP_CAIRN_OWNER: u32 = 0x4352_4E4F; // "CRNO"

const FENCE_FLAGS: u16 = FENCE_FLAG_RELEASE | FENCE_FLAG_WHOLE | FENCE_FLAG_QUERY;

/// Who owns an array: a node (host) name and a random number drawn when the owning
/// process started, so a restarted owner on the same host is a new owner.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct OwnerId {
    /// At most [`NODE_LEN`] bytes of UTF-8, no NUL.
    pub node: String,
    pub instance: u64,
}

impl OwnerId {
    /// Checks the node name fits the wire and disk field.
    pub fn new(node: impl Into<String>, instance: u64) -> Result<OwnerId, String> {
        let node = node.into();
        if node.is_empty() || node.len() > NODE_LEN || node.contains('\0') {
            return Err(format!(
                "owner id {node:?} must be 1 to {NODE_LEN} bytes without NUL"
            ));
        }
        Ok(OwnerId { node, instance })
    }

    /// The node name NUL padded to [`NODE_LEN`] bytes.
    pub fn node_bytes(&self) -> [u8; NODE_LEN] {
        let mut b = [0u8; NODE_LEN];
        let n = self.node.len().min(NODE_LEN);
        b[..n].copy_from_slice(&self.node.as_bytes()[..n]);
        b
    }

    /// The node name from its padded field.
    pub fn node_from_bytes(b: &[u8; NODE_LEN]) -> Result<String, String> {
        let end = b.iter().position(|&c| c == 0).unwrap_or(NODE_LEN);
        if b[end..].iter().any(|&c| c != 0) {
            return Err("owner node name has bytes after its NUL padding".into());
        }
        if end == 0 {
            return Err("owner node name is empty".into());
        }
        String::from_utf8(b[..end].to_vec()).map_err(|_| "owner node name is not UTF-8".to_string())
    }
}

impl fmt::Display for OwnerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{:016x}", self.node, self.instance)
    }
}

/// What an owner proves on every connection: the array it owns, at which generation.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct FenceToken {
    /// The md array UUID (or any 16-byte id of the thing owned).
    pub array: [u8; 16],
    pub generation: u64,
    pub owner: OwnerId,
}

impl FenceToken {
    /// Same generation and same owner: the holder of `self` is the owner `other` records.
    pub fn same_owner(&self, other: &FenceToken) -> bool {
        self.generation == other.generation && self.owner == other.owner
    }

    /// The option payload for export `name` (big-endian, as all of NBD).
    pub fn encode_option(&self, name: &str) -> Vec<u8> {
        self.encode_option_flags(name, 0)
    }

    /// The option payload with `flags` ([`FENCE_FLAG_RELEASE`]).
    pub fn encode_option_flags(&self, name: &str, flags: u16) -> Vec<u8> {
        let mut v = Vec::with_capacity(FENCE_HEADER_LEN + name.len());
        v.extend_from_slice(&FENCE_VERSION.to_be_bytes());
        v.extend_from_slice(&flags.to_be_bytes());
        v.extend_from_slice(&self.array);
        v.extend_from_slice(&self.generation.to_be_bytes());
        v.extend_from_slice(&self.owner.instance.to_be_bytes());
        v.extend_from_slice(&self.owner.node_bytes());
        let len = u32::try_from(name.len()).unwrap_or(u32::MAX);
        v.extend_from_slice(&len.to_be_bytes());
        v.extend_from_slice(name.as_bytes());
        debug_assert_eq!(v.len(), FENCE_HEADER_LEN + name.len());
        v
    }

    /// Parses an option payload into (export name, token, flags). Every malformed input is
    /// an error message, never a panic.
    pub fn decode_option(data: &[u8]) -> Result<(String, FenceToken, u16), String> {
        if data.len() < FENCE_HEADER_LEN {
            return Err(format!(
                "fence option is {} bytes, shorter than its {FENCE_HEADER_LEN}-byte header",
                data.len()
            ));
        }
        let be16 = |o: usize| u16::from_be_bytes([data[o], data[o + 1]]);
        let be64 = |o: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&data[o..o + 8]);
            u64::from_be_bytes(b)
        };
        let version = be16(0);
        if version != FENCE_VERSION {
            return Err(format!(
                "fence option version {version} is not {FENCE_VERSION}"
            ));
        }
        let flags = be16(2);
        if flags & !FENCE_FLAGS != 0 {
            return Err(format!("fence option flags {flags:#x} are unknown"));
        }
        let mut array = [0u8; 16];
        array.copy_from_slice(&data[4..20]);
        let generation = be64(20);
        let instance = be64(28);
        let mut node = [0u8; NODE_LEN];
        node.copy_from_slice(&data[36..68]);
        let node = OwnerId::node_from_bytes(&node)?;
        let len = u32::from_be_bytes([data[68], data[69], data[70], data[71]]);
        let rest = &data[FENCE_HEADER_LEN..];
        if u64::from(len) != rest.len() as u64 {
            return Err(format!(
                "fence option says the export name is {len} bytes but {} follow",
                rest.len()
            ));
        }
        let name = std::str::from_utf8(rest)
            .map_err(|_| "fence option export name is not UTF-8".to_string())?
            .to_string();
        if generation == 0 {
            return Err("fence option generation 0 is reserved for \"never owned\"".into());
        }
        Ok((
            name,
            FenceToken {
                array,
                generation,
                owner: OwnerId { node, instance },
            },
            flags,
        ))
    }
}

/// What a member's owner area holds.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum Stored {
    /// Never owned (all zero).
    Blank,
    /// The owner last persisted.
    Owner(FenceToken),
    /// Something that is not an owner record: the area is in use by another format, so the
    /// export cannot be fenced (the text says what was found).
    Foreign(String),
}

/// Where a member server keeps the highest generation it admitted, on the export itself
/// so it survives a restart. Implemented by cairn-cluster's owner record.
pub trait FenceStore: Send + Sync + fmt::Debug {
    /// Bytes at the start of the export the record occupies. While an export is owned,
    /// client writes there are refused: the server keeps the record.
    fn reserved(&self) -> u64;
    /// Reads the owner area of `dev`.
    fn load(&self, dev: &dyn BlockDevice) -> cairn_block::Result<Stored>;
    /// Persists `token` as the owner of `dev` (`released`: the owner gave it up), durable
    /// before it returns.
    fn store(
        &self,
        dev: &dyn BlockDevice,
        token: &FenceToken,
        released: bool,
    ) -> cairn_block::Result<()>;
    /// The record kept beside export `export` (its owner uses the whole export), when
    /// one is: `Stored::Owner`. `None`: none is kept beside it, the record (if any) is in
    /// its first bytes.
    fn load_beside(&self, _export: &str) -> cairn_block::Result<Option<Stored>> {
        Ok(None)
    }
    /// Whether the record kept beside export `export` says its owner released it (a
    /// released export used whole is nobody's: plain clients may write it again).
    fn released_beside(&self, _export: &str) -> cairn_block::Result<bool> {
        Ok(false)
    }
    /// Persists `token` beside export `export`, durable before it returns.
    fn store_beside(
        &self,
        export: &str,
        _token: &FenceToken,
        _released: bool,
    ) -> cairn_block::Result<()> {
        Err(cairn_block::Error::new(
            cairn_block::ErrorKind::Unsupported,
            format!("this server keeps no owner records beside export {export:?}"),
        ))
    }
    /// The bytes of the export's owner record (beside it, else in its first bytes),
    /// answered to [`FENCE_FLAG_QUERY`]; empty: never owned.
    fn record_bytes(&self, _export: &str, _dev: &dyn BlockDevice) -> cairn_block::Result<Vec<u8>> {
        Ok(Vec::new())
    }
    /// A connection that declared `token` for `export` and was admitted has ended (the
    /// client closed it, it broke, or the server cut it): a store that follows its
    /// owner's presence (replication's secondary) learns of it here. Called once per
    /// such connection, after its last reply.
    fn connection_ended(&self, _export: &str, _token: &FenceToken) {}
}

/// What a server said to a declared token.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum FenceAnswer {
    /// A cairn member server admitted the token and refuses older owners from now on.
    Enforced,
    /// The server does not know the option (nbdkit, qemu-nbd, a cairn serve with
    /// `--fence off`): only the etcd lease and the record check at assembly protect it.
    NotEnforced,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> FenceToken {
        FenceToken {
            array: [7; 16],
            generation: 42,
            owner: OwnerId::new("host-a", 0x1234_5678_9abc_def0).unwrap(),
        }
    }

    #[test]
    fn option_round_trips() {
        let t = token();
        let data = t.encode_option("disk0");
        assert_eq!(data.len(), FENCE_HEADER_LEN + 5);
        assert_eq!(
            FenceToken::decode_option(&data).unwrap(),
            ("disk0".into(), t.clone(), 0)
        );
        let data = t.encode_option_flags("d", FENCE_FLAG_RELEASE);
        assert_eq!(
            FenceToken::decode_option(&data).unwrap().2,
            FENCE_FLAG_RELEASE
        );
        let data = t.encode_option_flags("d", FENCE_FLAG_WHOLE | FENCE_FLAG_QUERY);
        assert_eq!(FenceToken::decode_option(&data).unwrap().2, 6);
        let data = t.encode_option_flags("d", 8);
        assert!(FenceToken::decode_option(&data)
            .unwrap_err()
            .contains("flags"));
    }

    #[test]
    fn malformed_options_are_errors() {
        let good = token().encode_option("d");
        for n in 0..good.len() {
            assert!(
                FenceToken::decode_option(&good[..n]).is_err(),
                "truncated at {n}"
            );
        }
        let mut bad = good.clone();
        bad[0] = 9;
        assert!(FenceToken::decode_option(&bad)
            .unwrap_err()
            .contains("version"));
        let mut bad = good.clone();
        bad[68..72].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(FenceToken::decode_option(&bad).is_err());
        let mut bad = good.clone();
        bad[20..28].fill(0);
        assert!(FenceToken::decode_option(&bad)
            .unwrap_err()
            .contains("generation 0"));
        let mut bad = good.clone();
        bad[36..68].fill(0);
        assert!(FenceToken::decode_option(&bad).is_err());
        let mut bad = good;
        bad[40] = 0;
        bad[41] = b'x';
        assert!(FenceToken::decode_option(&bad)
            .unwrap_err()
            .contains("padding"));
        // Random bytes: never a panic.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for len in 0..300 {
            let v: Vec<u8> = (0..len)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x.to_le_bytes()[0]
                })
                .collect();
            let _ = FenceToken::decode_option(&v);
        }
    }

    #[test]
    fn owner_ids_are_checked() {
        assert!(OwnerId::new("", 1).is_err());
        assert!(OwnerId::new("a".repeat(33), 1).is_err());
        assert!(OwnerId::new("a\0b", 1).is_err());
        let id = OwnerId::new("a".repeat(32), 1).unwrap();
        assert_eq!(OwnerId::node_from_bytes(&id.node_bytes()).unwrap(), id.node);
    }
}
