//! Recognising what a device already holds before `create` overwrites it
//! (ondisk-formats.md §5 "Signatures and probing", plus the filesystems users most often
//! point a tool at by mistake). The probe is `cairn_block::probe`, shared with LUKS, LVM
//! and scan; this adds md's own reading of an md 1.2 member it finds.
//!
//! ```text
//!   byte 0        md 1.1, LUKS1/2, XFS "XFSB"        byte 510/512   MBR / GPT
//!   sectors 0-3   LVM2 "LABELONE"                    byte 1080      ext2/3/4 0xEF53
//!   byte 4096     md 1.2                             byte 4086      swap
//!   16K .. 4M     LUKS2 secondary "SKUL\xba\xbe"      byte 65600     btrfs
//!   end - 8..12K  md 1.0            end - 64..128K   md 0.90
//! ```
//!
//! Only magic numbers are checked, so a hit means "looks like", which is what a refusal
//! to overwrite needs.

use std::fmt;

use cairn_block::{probe, BlockDevice, Result};

use crate::ondisk::{Superblock, SUPERBLOCK_AREA};

/// A signature found on a device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Signature {
    /// What it looks like: "md superblock 1.2", "ext4 filesystem", ...
    pub kind: String,
    /// Byte offset of the magic.
    pub offset: u64,
    /// More about it, when known (an md member's array UUID and name).
    pub detail: Option<String>,
}

impl fmt::Display for Signature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "has a signature at byte {}: {}", self.offset, self.kind)?;
        if let Some(d) = &self.detail {
            write!(f, ": {d}")?;
        }
        Ok(())
    }
}

/// Every signature found on `dev` (`cairn_block::probe`), an md 1.2 member's described
/// from its superblock when md would accept it.
pub fn probe_signatures(dev: &dyn BlockDevice) -> Result<Vec<Signature>> {
    let found = probe::probe(dev)?;
    let mut out = Vec::with_capacity(found.signatures.len());
    for sig in found.signatures {
        let detail = if sig.kind == probe::Kind::Md(probe::MdVersion::V1_2) {
            let mut head = vec![0u8; SUPERBLOCK_AREA];
            dev.read_at(&mut head, sig.offset)?;
            Superblock::parse_with(&head, "", crate::ondisk::FeaturePolicy::KnownToMd)
                .ok()
                .map(|sb| format!("member of array {} ({})", sb.set_uuid, sb.set_name))
        } else {
            // A filesystem's label and UUID, a partition table's partitions.
            sig.detail.clone()
        };
        out.push(Signature {
            kind: sig.what(),
            offset: sig.offset,
            detail,
        });
    }
    Ok(out)
}
