//! The replication handshake: one NBD option of cairn's own, carrying a JSON request and
//! answered with a JSON reply (or raw bitmap words), before the data connection's
//! `NBD_OPT_GO`.
//!
//! ```text
//!   primary (peer.rs)                          secondary (target.rs)
//!   Hello {resource, node, view, epoch} ──>    checks resource and size, decides too
//!                                       <──    Welcome {node, view, changes, decision}
//!   Bitmap {first_word, words}          ──>    the secondary's bits towards the primary
//!   SyncStart {full}                    ──>    marks its data inconsistent (persisted)
//!   SyncDone {gens, in_sync}            ──>    takes the primary's generation, consistent;
//!                                              empties its bits towards `in_sync` peers
//!   Adopt {gens}                        ──>    (in sync, connected) takes a new current
//!   Digest {offset, len}                ──>    (online verify) one 8-byte digest per
//!                                       <──    bitmap block of the range (verify.rs)
//! ```
//!
//! Every message is small (bounded by the NBD option limits, 64 KiB each way); the data
//! itself (application writes and resync copies) goes over ordinary NBD WRITEs on a
//! connection that declared the primary's fencing epoch (cairn-nbd's fence option).

use serde::{Deserialize, Serialize};

use crate::gen::{Decision, Generations, NodeView};

/// `NBD_OPT_CAIRN_REPL`: "CRNR", far above the options proto.md assigns, beside
/// cairn-nbd's fence option ("CRNF").
pub const OPT_CAIRN_REPL: u32 = 0x4352_4E52;

/// Bitmap words one `Bitmap` answer carries at most (32 KiB of the 64 KiB limit).
pub const BITMAP_WORDS_PER_REPLY: usize = 4096;

/// Digests one `Digest` answer carries at most: 8 bytes each, 32 KiB of the 64 KiB limit.
pub const DIGESTS_PER_REPLY: u64 = 4096;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "op", rename_all = "kebab-case")]
pub enum Request {
    Hello(Hello),
    /// The secondary's out-of-sync bits towards the sender, words `[first_word, +words)`.
    Bitmap {
        node: String,
        first_word: usize,
        words: usize,
    },
    SyncStart {
        node: String,
        full: bool,
    },
    SyncDone {
        node: String,
        gens: Generations,
        /// The source's other peers known to hold its data: connected and in sync, an
        /// empty bitmap without a base, no verify after a failover owed. The target,
        /// which now holds the source's data too, empties its bitmap towards each
        /// (secondary.rs `sync_done`). Absent (an older source): none.
        #[serde(default)]
        in_sync: Vec<String>,
    },
    Adopt {
        node: String,
        gens: Generations,
    },
    /// Online verify: the digest of each bitmap block of `[offset, offset + len)` of the
    /// receiver's data area, 8 bytes little-endian each (verify.rs `block_digests`). The
    /// range starts on a bitmap block and ends on one or at the end of the data, and
    /// holds at most [`DIGESTS_PER_REPLY`] blocks.
    Digest {
        node: String,
        offset: u64,
        len: u64,
    },
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Hello {
    /// The resource's name: both sides must serve the same one.
    pub resource: String,
    /// The sender's node name (the receiver knows it as one of its peers).
    pub node: String,
    /// The sender's generations towards the receiver, and its flags.
    pub view: NodeView,
    /// The sender's fencing epoch.
    pub epoch: u64,
    /// Bytes of replicated data.
    pub data_size: u64,
    /// Bytes per bitmap bit.
    pub bm_block: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Welcome {
    pub node: String,
    pub view: NodeView,
    pub epoch: u64,
    /// Bits set in the receiver's bitmap towards the sender: its changes the sender lacks
    /// (the split-brain policies compare these).
    pub changes: u64,
    /// What the receiver decided, from its side.
    pub decision: Decision,
    /// The receiver's operator said `connect --discard-my-data`: it will be a target.
    pub discard_my_data: bool,
    /// The node whose epoch the receiver admitted last ("" for none).
    #[serde(default)]
    pub fenced_by: String,
}

/// Parses a request, bounded: the server has already bounded its length.
pub fn parse_request(data: &[u8]) -> Result<Request, String> {
    serde_json::from_slice(data).map_err(|e| format!("malformed replication request: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for bytes in [&b""[..], b"{", b"{\"op\":\"nope\"}", b"\xff\xfe", b"[]"] {
            assert!(parse_request(bytes).is_err());
        }
        let r = Request::SyncStart {
            node: "a".into(),
            full: true,
        };
        let text = serde_json::to_vec(&r).unwrap();
        assert_eq!(parse_request(&text).unwrap(), r);
        let d = Request::Digest {
            node: "a".into(),
            offset: 1 << 20,
            len: 4096,
        };
        let text = serde_json::to_vec(&d).unwrap();
        assert_eq!(parse_request(&text).unwrap(), d);
    }
}
