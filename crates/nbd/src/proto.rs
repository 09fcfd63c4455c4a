//! NBD wire format: constants and pure parsers, shared by the server, the client and the
//! fuzz targets. Nothing here does I/O; every length read from the wire is checked
//! against the bytes actually present before it is used.
//!
//! Reference: the NBD protocol (proto.md of the reference NBD project), fixed newstyle.

use cairn_block::codec::{
    self, be16_at, be32_at, be64_at, put_be16_at, put_be32_at, put_be64_at, Writer,
};

/// `"NBDMAGIC"`, first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `"IHAVEOPT"`: newstyle magic, also the prefix of every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;
pub const OPT_EXTENDED_HEADERS: u32 = 11;

// Option replies.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_POLICY: u32 = 0x8000_0002;
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
pub const REP_ERR_PLATFORM: u32 = 0x8000_0004;
pub const REP_ERR_TLS_REQD: u32 = 0x8000_0005;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
pub const REP_ERR_SHUTDOWN: u32 = 0x8000_0007;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = 0x8000_0008;
pub const REP_ERR_TOO_BIG: u32 = 0x8000_0009;

// NBD_INFO types.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands.
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

// Structured reply flags and types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

// base:allocation flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// The one metadata context cairn offers, and the id it gets when selected.
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const BASE_ALLOCATION_ID: u32 = 1;

// Error values on the wire.
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Longest string (export name, description, message) the protocol allows.
pub const MAX_STRING: usize = 4096;
/// Largest option payload cairn reads into memory; longer ones are drained and refused.
pub const MAX_OPTION_DATA: u32 = 64 << 10;
/// Payloads up to this size must not be treated as an attack (proto.md, size constraints).
pub const MAX_SAFE_PAYLOAD: u32 = 32 << 20;

pub const REQUEST_HEADER_LEN: usize = 28;
pub const SIMPLE_REPLY_LEN: usize = 16;
pub const STRUCTURED_HEADER_LEN: usize = 20;

/// A parsed transmission request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub flags: u16,
    pub kind: u16,
    pub cookie: u64,
    pub offset: u64,
    pub length: u32,
}

/// Why a request header could not be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderError {
    /// The magic is wrong: the stream is out of sync and the connection must close.
    BadMagic(u32),
}

// Big-endian reads for client.rs, which checks each reply's length before it reads the
// fields; they stay infallible (a short slice is a bug there) until client.rs moves to
// `codec` itself, when the client is split.
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    codec::be16(b, at).unwrap_or_else(|e| panic!("{e}"))
}
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    codec::be32(b, at).unwrap_or_else(|e| panic!("{e}"))
}
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    codec::be64(b, at).unwrap_or_else(|e| panic!("{e}"))
}

impl Request {
    pub fn parse(h: &[u8; REQUEST_HEADER_LEN]) -> Result<Request, HeaderError> {
        let magic = be32_at::<0, _>(h);
        if magic != REQUEST_MAGIC {
            return Err(HeaderError::BadMagic(magic));
        }
        Ok(Request {
            flags: be16_at::<4, _>(h),
            kind: be16_at::<6, _>(h),
            cookie: be64_at::<8, _>(h),
            offset: be64_at::<16, _>(h),
            length: be32_at::<24, _>(h),
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_HEADER_LEN] {
        let mut h = [0u8; REQUEST_HEADER_LEN];
        put_be32_at::<0, _>(&mut h, REQUEST_MAGIC);
        put_be16_at::<4, _>(&mut h, self.flags);
        put_be16_at::<6, _>(&mut h, self.kind);
        put_be64_at::<8, _>(&mut h, self.cookie);
        put_be64_at::<16, _>(&mut h, self.offset);
        put_be32_at::<24, _>(&mut h, self.length);
        h
    }

    /// Whether the request carries `length` bytes of payload after the header.
    pub fn has_payload(&self) -> bool {
        self.kind == CMD_WRITE
    }
}

pub fn command_name(kind: u16) -> &'static str {
    match kind {
        CMD_READ => "READ",
        CMD_WRITE => "WRITE",
        CMD_DISC => "DISC",
        CMD_FLUSH => "FLUSH",
        CMD_TRIM => "TRIM",
        CMD_CACHE => "CACHE",
        CMD_WRITE_ZEROES => "WRITE_ZEROES",
        CMD_BLOCK_STATUS => "BLOCK_STATUS",
        _ => "UNKNOWN",
    }
}

pub fn encode_simple_reply(error: u32, cookie: u64) -> [u8; SIMPLE_REPLY_LEN] {
    let mut r = [0u8; SIMPLE_REPLY_LEN];
    put_be32_at::<0, _>(&mut r, SIMPLE_REPLY_MAGIC);
    put_be32_at::<4, _>(&mut r, error);
    put_be64_at::<8, _>(&mut r, cookie);
    r
}

pub fn encode_structured_header(
    flags: u16,
    kind: u16,
    cookie: u64,
    length: u32,
) -> [u8; STRUCTURED_HEADER_LEN] {
    let mut r = [0u8; STRUCTURED_HEADER_LEN];
    put_be32_at::<0, _>(&mut r, STRUCTURED_REPLY_MAGIC);
    put_be16_at::<4, _>(&mut r, flags);
    put_be16_at::<6, _>(&mut r, kind);
    put_be64_at::<8, _>(&mut r, cookie);
    put_be32_at::<16, _>(&mut r, length);
    r
}

/// Option reply header: magic, option, reply type, payload length.
pub fn encode_option_reply_header(option: u32, reply: u32, length: u32) -> [u8; 20] {
    let mut r = [0u8; 20];
    put_be64_at::<0, _>(&mut r, REPLY_MAGIC);
    put_be32_at::<8, _>(&mut r, option);
    put_be32_at::<12, _>(&mut r, reply);
    put_be32_at::<16, _>(&mut r, length);
    r
}

/// Why an option payload is malformed: the server answers `NBD_REP_ERR_INVALID`
/// with this message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OptionError(pub String);

/// A cursor over option data that never reads past the end.
struct Cursor<'a> {
    data: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], OptionError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.data.len())
            .ok_or_else(|| {
                OptionError(format!(
                    "{what}: needs {n} bytes, {} left",
                    self.data.len() - self.at
                ))
            })?;
        let s = &self.data[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u16(&mut self, what: &str) -> Result<u16, OptionError> {
        codec::be16(self.take(2, what)?, 0).map_err(|e| OptionError(format!("{what}: {e}")))
    }
    fn u32(&mut self, what: &str) -> Result<u32, OptionError> {
        codec::be32(self.take(4, what)?, 0).map_err(|e| OptionError(format!("{what}: {e}")))
    }
    fn string(&mut self, what: &str) -> Result<String, OptionError> {
        let len = self.u32(what)?;
        let len = usize::try_from(len).map_err(|_| OptionError(format!("{what}: too long")))?;
        if len > MAX_STRING {
            return Err(OptionError(format!(
                "{what}: {len} bytes, more than {MAX_STRING}"
            )));
        }
        let bytes = self.take(len, what)?;
        let s =
            std::str::from_utf8(bytes).map_err(|_| OptionError(format!("{what}: not UTF-8")))?;
        if s.contains('\0') {
            return Err(OptionError(format!("{what}: contains NUL")));
        }
        Ok(s.to_string())
    }
    fn done(&self, what: &str) -> Result<(), OptionError> {
        if self.at != self.data.len() {
            return Err(OptionError(format!(
                "{what}: {} trailing bytes",
                self.data.len() - self.at
            )));
        }
        Ok(())
    }
}

/// The payload of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InfoRequest {
    pub name: String,
    pub requests: Vec<u16>,
}

pub fn parse_info_request(data: &[u8]) -> Result<InfoRequest, OptionError> {
    let mut c = Cursor { data, at: 0 };
    let name = c.string("export name")?;
    let n = c.u16("number of info requests")?;
    let mut requests = Vec::with_capacity(usize::from(n).min(16));
    for _ in 0..n {
        requests.push(c.u16("info request")?);
    }
    c.done("NBD_OPT_GO")?;
    Ok(InfoRequest { name, requests })
}

pub fn encode_info_request(name: &str, requests: &[u16]) -> Vec<u8> {
    let mut w = Writer::new()
        .be32(u32::try_from(name.len()).unwrap_or(u32::MAX))
        .bytes(name.as_bytes())
        .be16(u16::try_from(requests.len()).unwrap_or(u16::MAX));
    for &r in requests {
        w = w.be16(r);
    }
    w.into_vec()
}

/// The payload of `NBD_OPT_LIST_META_CONTEXT` / `NBD_OPT_SET_META_CONTEXT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaContextRequest {
    pub name: String,
    pub queries: Vec<String>,
}

pub fn parse_meta_context_request(data: &[u8]) -> Result<MetaContextRequest, OptionError> {
    let mut c = Cursor { data, at: 0 };
    let name = c.string("export name")?;
    let n = c.u32("number of queries")?;
    let mut queries = Vec::new();
    for _ in 0..n {
        // Each query takes at least 4 bytes, so a huge count fails on the data, not
        // on memory.
        queries.push(c.string("query")?);
    }
    c.done("meta context request")?;
    Ok(MetaContextRequest { name, queries })
}

pub fn encode_meta_context_request(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut w = Writer::new()
        .be32(u32::try_from(name.len()).unwrap_or(u32::MAX))
        .bytes(name.as_bytes())
        .be32(u32::try_from(queries.len()).unwrap_or(u32::MAX));
    for q in queries {
        w = w
            .be32(u32::try_from(q.len()).unwrap_or(u32::MAX))
            .bytes(q.as_bytes());
    }
    w.into_vec()
}

/// Which contexts a query selects: `base:allocation` for `base:allocation` or `base:`;
/// nothing for other namespaces. A query without a namespace is invalid.
pub fn query_selects_base_allocation(query: &str) -> Result<bool, OptionError> {
    if !query.contains(':') {
        return Err(OptionError(format!("query {query:?} has no namespace")));
    }
    Ok(query == BASE_ALLOCATION || query == "base:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let r = Request {
            flags: 3,
            kind: CMD_WRITE,
            cookie: 0xdead,
            offset: 1 << 40,
            length: 4096,
        };
        assert_eq!(Request::parse(&r.encode()), Ok(r));
        let mut bad = r.encode();
        bad[0] ^= 1;
        assert!(matches!(
            Request::parse(&bad),
            Err(HeaderError::BadMagic(_))
        ));
    }

    #[test]
    fn info_request_parses_and_rejects_truncation() {
        let data = encode_info_request("vol0", &[INFO_BLOCK_SIZE, INFO_NAME]);
        let r = parse_info_request(&data).unwrap();
        assert_eq!(r.name, "vol0");
        assert_eq!(r.requests, vec![INFO_BLOCK_SIZE, INFO_NAME]);
        for cut in 0..data.len() {
            assert!(parse_info_request(&data[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = data.clone();
        long.push(0);
        assert!(parse_info_request(&long).is_err());
        // A name length far beyond the data must fail without allocating it.
        let mut huge = data;
        huge[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_info_request(&huge).is_err());
    }

    #[test]
    fn meta_context_request_parses() {
        let data = encode_meta_context_request("", &["base:allocation", "qemu:dirty-bitmap:x"]);
        let r = parse_meta_context_request(&data).unwrap();
        assert_eq!(r.queries.len(), 2);
        assert!(query_selects_base_allocation(&r.queries[0]).unwrap());
        assert!(!query_selects_base_allocation(&r.queries[1]).unwrap());
        assert!(query_selects_base_allocation("nonamespace").is_err());
        let mut huge = encode_meta_context_request("", &[]);
        huge[4..8].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(parse_meta_context_request(&huge).is_err());
    }
}
