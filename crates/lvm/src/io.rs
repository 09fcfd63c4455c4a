//! Byte-granular access to a device whose logical block may be bigger than the 512-byte
//! structures LVM writes (a LUKS2 volume with 4096-byte sectors): reads widen to whole
//! blocks, writes read-modify-write the blocks they touch.

use cairn_block::{BlockDevice, Error, ErrorKind, Result, WriteFlags};

pub(crate) fn usize_of(v: u64) -> Result<usize> {
    usize::try_from(v).map_err(|_| {
        Error::new(
            ErrorKind::OutOfRange,
            format!("{v} bytes do not fit memory"),
        )
    })
}

fn span(dev: &dyn BlockDevice, off: u64, len: u64, what: &str) -> Result<(u64, u64)> {
    let g = dev.geometry();
    let lbs = u64::from(g.logical_block_size.max(1));
    let end = off
        .checked_add(len)
        .filter(|&e| e <= g.size)
        .ok_or_else(|| {
            Error::new(
                ErrorKind::OutOfRange,
                format!(
                    "{what}: {len} bytes at {off} lie past the end of the {}-byte device",
                    g.size
                ),
            )
        })?;
    let start = off - off % lbs;
    let end = end.div_ceil(lbs) * lbs;
    Ok((start, end))
}

/// Reads `len` bytes at `off`.
pub(crate) fn read_bytes(dev: &dyn BlockDevice, off: u64, len: u64, what: &str) -> Result<Vec<u8>> {
    let (start, end) = span(dev, off, len, what)?;
    let mut buf = vec![0u8; usize_of(end - start)?];
    dev.read_at(&mut buf, start)
        .map_err(|e| e.context(format!("reading {what}")))?;
    let skip = usize_of(off - start)?;
    buf.drain(..skip);
    buf.truncate(usize_of(len)?);
    Ok(buf)
}

/// Writes `data` at `off`, merging with the blocks' other bytes when unaligned.
pub(crate) fn write_bytes(
    dev: &dyn BlockDevice,
    off: u64,
    data: &[u8],
    flags: WriteFlags,
    what: &str,
) -> Result<()> {
    let len = data.len() as u64;
    let (start, end) = span(dev, off, len, what)?;
    let result = if start == off && end == off + len {
        dev.write_at(data, off, flags)
    } else {
        let mut buf = vec![0u8; usize_of(end - start)?];
        dev.read_at(&mut buf, start)
            .map_err(|e| e.context(format!("reading around {what}")))?;
        let skip = usize_of(off - start)?;
        buf[skip..skip + data.len()].copy_from_slice(data);
        dev.write_at(&buf, start, flags)
    };
    result.map_err(|e| e.context(format!("writing {what}")))
}
