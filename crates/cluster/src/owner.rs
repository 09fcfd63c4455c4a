//! Taking ownership of an array's members by raising the generation.
//!
//! ```text
//!   read every member's record (unfenced connection) ─> generation = max + 1
//!   ─> a record of another owner that did not release it: refused, unless the caller
//!      says that owner is gone (it holds the etcd lease, or the operator forces it)
//!   ─> quorum: the members not reached are too few to run the array elsewhere
//!   ─> connect every member with the token (OPT_CAIRN_FENCE):
//!        cairn member server: it persists the record and fences older owners (Enforced)
//!        nbdkit / qemu-nbd / a local file: write the record ourselves, FUA, read it back
//!   ─> any refusal aborts the whole takeover: a newer owner exists
//!   ─> only now may data be written
//! ```

use std::fmt;
use std::sync::Arc;

use cairn_block::BlockDevice;
use cairn_nbd::client::{Client, ClientOptions};
use cairn_nbd::fence::{FenceAnswer, FenceToken, OwnerId, NODE_LEN};

use crate::ondisk::{now_unix, DecodeError, OwnerRecord};

/// A new owner identity for this process: `node` (the host name when empty) and a random
/// instance, so a restarted owner is a different owner.
pub fn new_owner(node: &str) -> Result<OwnerId, String> {
    let node = if node.is_empty() {
        host_name()
    } else {
        node.to_string()
    };
    OwnerId::new(node, rand::random::<u64>())
}

/// This host's name, cut to the owner field's 32 bytes.
pub fn host_name() -> String {
    let h = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut h = h.trim().to_string();
    if h.is_empty() {
        h = "localhost".into();
    }
    while h.len() > NODE_LEN {
        h.pop();
    }
    h
}

/// The generation a new owner takes: one above every record seen.
pub fn next_generation<'a>(records: impl IntoIterator<Item = &'a OwnerRecord>) -> Option<u64> {
    records
        .into_iter()
        .map(|r| r.token.generation)
        .max()
        .unwrap_or(0)
        .checked_add(1)
}

/// Whether a takeover that reached `reached` of `total` members may go on: the members it
/// did not reach must be fewer than `needed` (the fewest members the array runs on), so no
/// other host can run the array from them alone while this one owns the rest.
pub fn quorum(total: usize, reached: usize, needed: usize) -> bool {
    reached <= total && total - reached < needed.max(1)
}

/// Why a takeover failed.
#[derive(Debug)]
pub enum TakeoverError {
    /// A member holds a newer (or equal, other) owner: someone else took over.
    Fenced { member: String, message: String },
    /// Another owner holds the members and did not release them (it may still run).
    Owned {
        member: String,
        owner: String,
        generation: u64,
        since: u64,
    },
    /// Too few members reachable to take over safely.
    NoQuorum {
        reached: usize,
        total: usize,
        needed: usize,
    },
    /// A member's owner record is damaged (a foreign one takes part unfenced).
    Record { member: String, error: DecodeError },
    /// Generation space exhausted (u64::MAX): cannot happen by counting.
    Exhausted,
    /// A member failed (I/O, protocol).
    Member { member: String, message: String },
    /// A member server answered but refused this host (a failed TLS handshake, no such
    /// export): a mistake to fix, not a missing member.
    Refused { member: String, message: String },
}

impl fmt::Display for TakeoverError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TakeoverError::Fenced { member, message } => {
                write!(f, "{member}: another owner holds this member: {message}")
            }
            TakeoverError::NoQuorum {
                reached,
                total,
                needed,
            } => write!(
                f,
                "only {reached} of {total} members answered; the {} others could run the array \
                 on another host (it runs on {needed}), so ownership is not taken",
                total - reached
            ),
            TakeoverError::Owned {
                member,
                owner,
                generation,
                since,
            } => write!(
                f,
                "{member}: owned by {owner} (generation {generation}, since {since}), which has \
                 not released it; if that host is down for good, take over explicitly"
            ),
            TakeoverError::Record { member, error } => write!(f, "{member}: {error}"),
            TakeoverError::Exhausted => f.write_str("owner generation would overflow"),
            TakeoverError::Member { member, message } => write!(f, "{member}: {message}"),
            TakeoverError::Refused { member, message } => {
                write!(f, "{member}: its server refuses this host: {message}")
            }
        }
    }
}

impl std::error::Error for TakeoverError {}

/// One member of the array, as the takeover sees it.
#[derive(Debug)]
pub struct OwnedMember {
    pub name: String,
    pub device: Arc<Client>,
    /// Whether its server enforces the generation or only carries the record.
    pub enforced: bool,
    /// Its first 4 KiB hold other data: no record is written to it (not fenced).
    pub foreign: bool,
}

/// The result of a takeover: the generation and the connected members (unreached ones
/// are left out: the caller treats them as failed).
#[derive(Debug)]
pub struct Owned {
    pub token: FenceToken,
    pub members: Vec<OwnedMember>,
    /// Names of members that could not be reached.
    pub missing: Vec<String>,
    /// One export used whole ([`take_over_whole`]): its record is kept beside it.
    pub whole: bool,
}

/// How a takeover may proceed.
#[derive(Debug, Clone, Copy, Default)]
pub struct Rules {
    /// The fewest members the array runs on (RAID1: 1, RAID5: n-1, RAID6: n-2).
    pub needed: usize,
    /// Go on although members are missing (the operator knows they are gone for good).
    pub force_quorum: bool,
    /// Fence an owner that did not release the members: the caller knows it is gone
    /// (it holds the array's etcd lease, or the operator said so).
    pub replace_owner: bool,
}

/// Why a member that took the connection is gone: "did not answer within N s" when a
/// request timed out, else what happened to the connection.
pub fn unanswered(e: &cairn_block::Error, opts: &ClientOptions) -> String {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(c) = cause {
        let io = c.downcast_ref::<std::io::Error>().or_else(|| {
            match c.downcast_ref::<cairn_nbd::client::Error>() {
                Some(cairn_nbd::client::Error::Io(io)) => Some(io),
                _ => None,
            }
        });
        if io.is_some_and(|io| {
            matches!(
                io.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            )
        }) {
            return match opts.timeout {
                Some(t) => format!(
                    "its server took the connection but did not answer within {} s",
                    t.as_secs_f64()
                ),
                None => "its server took the connection but did not answer".to_string(),
            };
        }
        cause = c.source();
    }
    format!("its server took the connection, then: {e}")
}

/// Takes ownership of `array` on remote members for `owner`.
pub fn take_over(
    array: [u8; 16],
    owner: &OwnerId,
    members: &[(String, ClientOptions)],
    rules: Rules,
) -> Result<Owned, TakeoverError> {
    let needed = rules.needed;
    // 1. Read every reachable member's record over an unfenced connection (reads are
    //    never refused to those).
    let mut seen = Vec::new();
    let mut missing = Vec::new();
    let mut foreign: Vec<String> = Vec::new();
    for (name, opts) in members {
        let mut probe = opts.clone();
        probe.fence = None;
        probe.connections = 1;
        let client = match Client::connect(&probe) {
            Ok(c) => c,
            Err(e) if e.is_unreachable() => {
                tracing::warn!("{name}: not reached: {e}");
                missing.push(name.clone());
                continue;
            }
            // It answered and said no: counting it missing would start the array
            // degraded over a wrong key or export name, and retry it forever.
            Err(e) => {
                return Err(TakeoverError::Refused {
                    member: name.clone(),
                    message: e.to_string(),
                })
            }
        };
        let rec = match OwnerRecord::read(&client) {
            Ok(rec) => rec,
            // It took the connection but does not answer (a hung server, a silent
            // disk): a member that is not there, as a refused connection is.
            Err(e) if e.kind() == cairn_block::ErrorKind::Gone => {
                tracing::warn!("{name}: not reached: {}", unanswered(&e, opts));
                missing.push(name.clone());
                continue;
            }
            Err(e) => {
                return Err(TakeoverError::Member {
                    member: name.clone(),
                    message: e.to_string(),
                })
            }
        };
        let _ = client.disconnect();
        match rec {
            Ok(r) => seen.push((name.clone(), opts.clone(), r)),
            // The first 4 KiB hold something else (a partition table, a boot sector,
            // old data mdadm left there): the member cannot carry a record, and it must
            // not be overwritten. It takes part unfenced, with a warning.
            Err(DecodeError::NotARecord(what)) => {
                tracing::warn!(
                    "{name}: its first 4 KiB hold other data ({what}); no owner record is \
                     kept on it, so it is not fenced"
                );
                foreign.push(name.clone());
                seen.push((name.clone(), opts.clone(), None));
            }
            Err(error) => {
                return Err(TakeoverError::Record {
                    member: name.clone(),
                    error,
                })
            }
        }
    }
    if !rules.replace_owner {
        for (name, _, r) in &seen {
            if let Some(r) = r {
                if !r.released && &r.token.owner != owner {
                    return Err(TakeoverError::Owned {
                        member: name.clone(),
                        owner: r.token.owner.to_string(),
                        generation: r.token.generation,
                        since: r.since,
                    });
                }
            }
        }
    }
    if !rules.force_quorum && !quorum(members.len(), seen.len(), needed) {
        return Err(TakeoverError::NoQuorum {
            reached: seen.len(),
            total: members.len(),
            needed,
        });
    }
    // 2. One above everything seen.
    let generation = next_generation(seen.iter().filter_map(|(_, _, r)| r.as_ref()))
        .ok_or(TakeoverError::Exhausted)?;
    let token = FenceToken {
        array,
        generation,
        owner: owner.clone(),
    };
    let record = OwnerRecord {
        token: token.clone(),
        since: now_unix(),
        released: false,
    };
    // 3. Declare it everywhere; any refusal aborts (dropping the clients closes them).
    let mut owned = Vec::new();
    for (name, opts, _) in seen {
        let foreign = foreign.contains(&name);
        let mut o = opts.clone();
        // A member server refuses a token on a foreign member (it cannot keep a record
        // there without overwriting the other data): such a member runs unfenced.
        o.fence = (!foreign).then(|| token.clone());
        let client = Client::connect(&o).map_err(|e| {
            if e.is_fenced() {
                TakeoverError::Fenced {
                    member: name.clone(),
                    message: e.to_string(),
                }
            } else {
                TakeoverError::Member {
                    member: name.clone(),
                    message: e.to_string(),
                }
            }
        })?;
        let enforced = client.fence() == Some(FenceAnswer::Enforced);
        if !enforced && !foreign {
            // The server only stores bytes: the record is ours to write, then checked.
            claim_device(&client, &record).map_err(|e| match e {
                ClaimError::Taken(message) => TakeoverError::Fenced {
                    member: name.clone(),
                    message,
                },
                ClaimError::Io(message) => TakeoverError::Member {
                    member: name.clone(),
                    message,
                },
            })?;
        }
        owned.push(OwnedMember {
            name,
            device: Arc::new(client),
            enforced,
            foreign,
        });
    }
    tracing::info!(
        "owner {} took generation {generation} on {} members",
        owner,
        owned.len()
    );
    Ok(Owned {
        token,
        members: owned,
        missing,
        whole: false,
    })
}

/// Takes ownership of one export its owner uses whole (a LUKS volume, an LVM PV, an
/// export served as it is), whose first bytes are the owner's data: the record is kept
/// beside the export by its member server (`FENCE_FLAG_WHOLE`), which answers what it
/// holds to a query. `id` names what is owned in the record. A record of another owner
/// that is not released refuses the takeover unless `replace_owner`. A server that does
/// not enforce (nbdkit, qemu-nbd) has nowhere to keep a record that would not overwrite
/// data: the export is used unfenced (`foreign`), with a warning.
pub fn take_over_whole(
    id: [u8; 16],
    owner: &OwnerId,
    name: &str,
    opts: &ClientOptions,
    replace_owner: bool,
) -> Result<Owned, TakeoverError> {
    let member = |message: String| TakeoverError::Member {
        member: name.to_string(),
        message,
    };
    let probe = FenceToken {
        array: id,
        generation: 1,
        owner: owner.clone(),
    };
    // 1. What the server holds (a plain connection: TLS first when asked for).
    let answer = (|| {
        let mut hs = cairn_nbd::client::Handshake::connect(&opts.addr, opts.timeout)?;
        if let Some(tls) = &opts.tls {
            hs.starttls(tls)?;
        }
        let a = hs.query_owner(&opts.export, &probe)?;
        let _ = hs.abort();
        Ok::<_, cairn_nbd::client::Error>(a)
    })()
    .map_err(|e| {
        if e.is_unreachable() {
            member(format!("not reached: {e}"))
        } else {
            TakeoverError::Refused {
                member: name.to_string(),
                message: e.to_string(),
            }
        }
    })?;
    let Some(bytes) = answer else {
        tracing::warn!(
            "{name}: its server does not enforce owner generations (not a cairn member \
             server) and the export's first bytes are its owner's data, so no owner record \
             is kept: it is not fenced"
        );
        let mut o = opts.clone();
        o.fence = None;
        let client = Client::connect(&o).map_err(|e| member(e.to_string()))?;
        return Ok(Owned {
            token: probe,
            members: vec![OwnedMember {
                name: name.to_string(),
                device: Arc::new(client),
                enforced: false,
                foreign: true,
            }],
            missing: Vec::new(),
            whole: true,
        });
    };
    let record = if bytes.is_empty() {
        None
    } else {
        OwnerRecord::decode(&bytes).map_err(|error| TakeoverError::Record {
            member: name.to_string(),
            error,
        })?
    };
    // 2. Another owner that has not released it.
    if let Some(r) = record
        .as_ref()
        .filter(|r| !r.released && &r.token.owner != owner)
    {
        if !replace_owner {
            return Err(TakeoverError::Owned {
                member: name.to_string(),
                owner: r.token.owner.to_string(),
                generation: r.token.generation,
                since: r.since,
            });
        }
    }
    // 3. One above it, declared (the server keeps it beside the export).
    let generation = next_generation(record.as_ref()).ok_or(TakeoverError::Exhausted)?;
    let token = FenceToken {
        array: id,
        generation,
        owner: owner.clone(),
    };
    let mut o = opts.clone();
    o.fence = Some(token.clone());
    o.fence_whole = true;
    let client = Client::connect(&o).map_err(|e| {
        if e.is_fenced() {
            TakeoverError::Fenced {
                member: name.to_string(),
                message: e.to_string(),
            }
        } else {
            member(e.to_string())
        }
    })?;
    // Asked a moment ago, so it enforces; a server swapped in between does not.
    let enforced = client.fence() == Some(FenceAnswer::Enforced);
    tracing::info!("owner {owner} took generation {generation} on {name} (the whole export)");
    Ok(Owned {
        token,
        members: vec![OwnedMember {
            name: name.to_string(),
            device: Arc::new(client),
            enforced,
            foreign: !enforced,
        }],
        missing: Vec::new(),
        whole: true,
    })
}

/// Gives the members up at a clean stop: each record stays, marked released, so the next
/// owner takes over without forcing. Members that cannot be reached keep an unreleased
/// record (the next owner then has to be told the old one is gone). Returns the members
/// that could not be released, with why.
pub fn release(owned: &Owned, members: &[(String, ClientOptions)]) -> Vec<(String, String)> {
    let mut failed = Vec::new();
    for m in owned.members.iter().filter(|m| !m.foreign) {
        let r = if m.enforced {
            match members.iter().find(|(n, _)| n == &m.name) {
                Some((_, opts)) => release_enforced(opts, &owned.token, owned.whole),
                None => Err("not among the members given".to_string()),
            }
        } else {
            let record = OwnerRecord {
                token: owned.token.clone(),
                since: now_unix(),
                released: true,
            };
            // The takeover's connection may have broken since (a member server that
            // restarted was reconnected by the caller): write over a fresh one then.
            record.write(&*m.device).or_else(|first| {
                let Some((_, opts)) = members.iter().find(|(n, _)| n == &m.name) else {
                    return Err(first.to_string());
                };
                let mut o = opts.clone();
                o.fence = Some(owned.token.clone());
                o.connections = 1;
                let c = Client::connect(&o).map_err(|e| format!("{first}; reconnecting: {e}"))?;
                let r = record.write(&c).map_err(|e| e.to_string());
                let _ = c.disconnect();
                r
            })
        };
        if let Err(e) = r {
            tracing::warn!(
                "{}: releasing generation {}: {e}",
                m.name,
                owned.token.generation
            );
            failed.push((m.name.clone(), e));
        }
    }
    failed
}

fn release_enforced(opts: &ClientOptions, token: &FenceToken, whole: bool) -> Result<(), String> {
    let mut hs = cairn_nbd::client::Handshake::connect(&opts.addr, opts.timeout)
        .map_err(|e| e.to_string())?;
    // A member server with --tls require answers nothing but STARTTLS before TLS.
    if let Some(tls) = &opts.tls {
        hs.starttls(tls).map_err(|e| e.to_string())?;
    }
    hs.declare_fence(
        &opts.export,
        token,
        cairn_nbd::fence::FENCE_FLAG_RELEASE
            | if whole {
                cairn_nbd::fence::FENCE_FLAG_WHOLE
            } else {
                0
            },
    )
    .map_err(|e| e.to_string())?;
    let _ = hs.abort();
    Ok(())
}

/// Why a record could not be claimed.
#[derive(Debug)]
pub enum ClaimError {
    /// A newer owner's record is (or appeared) there.
    Taken(String),
    Io(String),
}

/// Writes `record` on a member that does not enforce (a local file, an nbdkit or qemu-nbd
/// export), unless a newer owner's record is already there, and reads it back. This is
/// the record check at assembly: it cannot stop an old owner that never reads again, which
/// is why such members need the etcd lease.
pub fn claim_device(dev: &dyn BlockDevice, record: &OwnerRecord) -> Result<(), ClaimError> {
    let io = |e: cairn_block::Error| ClaimError::Io(e.to_string());
    match OwnerRecord::read(dev).map_err(io)? {
        Ok(Some(r))
            if r.token.generation >= record.token.generation
                && !r.token.same_owner(&record.token) =>
        {
            return Err(ClaimError::Taken(format!(
                "generation {} of owner {} is already recorded",
                r.token.generation, r.token.owner
            )))
        }
        Ok(_) => {}
        Err(e) => return Err(ClaimError::Taken(e.to_string())),
    }
    record.write(dev).map_err(io)?;
    match OwnerRecord::read(dev).map_err(io)? {
        Ok(Some(r)) if r.token.same_owner(&record.token) => Ok(()),
        Ok(other) => Err(ClaimError::Taken(format!(
            "the record changed under us: {:?}",
            other.map(|r| (r.token.generation, r.token.owner.to_string()))
        ))),
        Err(e) => Err(ClaimError::Taken(e.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(g: u64) -> OwnerRecord {
        OwnerRecord {
            token: FenceToken {
                array: [1; 16],
                generation: g,
                owner: OwnerId::new("n", g).unwrap(),
            },
            since: 0,
            released: false,
        }
    }

    #[test]
    fn generation_rules() {
        assert_eq!(next_generation([]), Some(1));
        assert_eq!(next_generation([&rec(3), &rec(9), &rec(1)]), Some(10));
        assert_eq!(next_generation([&rec(u64::MAX)]), None);
        // RAID1 over 2: both needed reachable (1 missing could run alone).
        assert!(quorum(2, 2, 1));
        assert!(!quorum(2, 1, 1));
        // RAID6 over 6 runs on 4: up to 3 missing is safe.
        assert!(quorum(6, 3, 4));
        assert!(!quorum(6, 2, 4));
        // RAID5 over 4 runs on 3: 2 missing is safe, 3 not.
        assert!(quorum(4, 2, 3));
        assert!(!quorum(4, 1, 3));
        assert!(!quorum(2, 3, 1));
    }

    #[test]
    fn claim_refuses_newer_and_damaged_records() {
        let dev = cairn_block::MemDisk::new(1 << 20);
        claim_device(&dev, &rec(5)).unwrap();
        assert!(matches!(
            claim_device(&dev, &rec(4)),
            Err(ClaimError::Taken(_))
        ));
        assert!(matches!(
            claim_device(&dev, &rec(5).clone_with_owner("other")),
            Err(ClaimError::Taken(_))
        ));
        claim_device(&dev, &rec(6)).unwrap();
        claim_device(&dev, &rec(6)).unwrap();
        dev.write_at(&[9u8; 4096], 0, cairn_block::WriteFlags::NONE)
            .unwrap();
        assert!(matches!(
            claim_device(&dev, &rec(7)),
            Err(ClaimError::Taken(_))
        ));
    }

    impl OwnerRecord {
        fn clone_with_owner(&self, node: &str) -> OwnerRecord {
            let mut r = self.clone();
            r.token.owner = OwnerId::new(node, 0).unwrap();
            r
        }
    }
}
