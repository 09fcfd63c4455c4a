//! The handshake: fixed newstyle negotiation up to NBD_OPT_GO (or EXPORT_NAME).

use super::*;

use crate::fence::{FenceToken, OPT_CAIRN_FENCE};

/// What the handshake settled on.
pub(super) struct Session {
    pub(super) export: Arc<ExportEntry>,
    pub(super) structured: bool,
    pub(super) base_allocation: bool,
    /// The owner token the client declared for this export (fence.rs), if admitted.
    pub(super) fence: Option<FenceToken>,
}

enum Next {
    Continue,
    Transmit(Session),
    Close,
}

pub(super) struct Handshake<'a> {
    pub(super) shared: &'a Shared,
    pub(super) reader: &'a mut BufReader<Box<dyn Read + Send>>,
    pub(super) writer: &'a mut Box<dyn Write + Send>,
    pub(super) peer: &'a str,
    pub(super) fixed: bool,
    pub(super) no_zeroes: bool,
    pub(super) structured: bool,
    /// Export name the meta contexts were set for, and whether base:allocation is on.
    pub(super) meta: Option<(String, bool)>,
    /// The export and owner token an `OPT_CAIRN_FENCE` admitted.
    pub(super) fence: Option<(String, FenceToken)>,
    /// The connection's socket, which a TLS session takes over at STARTTLS (`None` for
    /// a stream handed to [`Server::serve_stream`]).
    pub(super) socket: Option<tls::Socket>,
    /// Whether STARTTLS succeeded: the reader and writer are the TLS session's.
    pub(super) tls_on: bool,
}

pub(super) fn read_exact_or_eof(r: &mut impl Read, buf: &mut [u8]) -> io::Result<bool> {
    let mut done = 0;
    while done < buf.len() {
        match r.read(&mut buf[done..]) {
            Ok(0) if done == 0 => return Ok(false),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Reads and throws away `n` bytes in bounded chunks.
fn drain(r: &mut impl Read, mut n: u64) -> io::Result<()> {
    let mut scratch = [0u8; 8192];
    while n > 0 {
        let k = usize::try_from(n.min(scratch.len() as u64)).unwrap_or(scratch.len());
        r.read_exact(&mut scratch[..k])?;
        n -= k as u64;
    }
    Ok(())
}

impl Handshake<'_> {
    pub(super) fn reply(&mut self, option: u32, kind: u32, data: &[u8]) -> io::Result<()> {
        let len = u32::try_from(data.len()).map_err(|_| io::ErrorKind::InvalidData)?;
        let h = encode_option_reply_header(option, kind, len);
        write_all_vectored(self.writer, &mut [IoSlice::new(&h), IoSlice::new(data)])
    }

    pub(super) fn error(&mut self, option: u32, kind: u32, msg: &str) -> io::Result<()> {
        tracing::debug!("{}: option {option}: {msg}", self.peer);
        let msg = &msg.as_bytes()[..msg.len().min(MAX_STRING)];
        self.reply(option, kind, msg)
    }

    pub(super) fn run(&mut self) -> io::Result<Option<Session>> {
        let mut hello = [0u8; 18];
        hello[0..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
        hello[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
        hello[16..18].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        self.writer.write_all(&hello)?;
        self.writer.flush()?;
        let mut cf = [0u8; 4];
        if !read_exact_or_eof(self.reader, &mut cf)? {
            return Ok(None);
        }
        let client_flags = u32::from_be_bytes(cf);
        if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
            tracing::debug!("{}: unknown client flags {client_flags:#x}", self.peer);
            return Ok(None);
        }
        self.fixed = client_flags & FLAG_C_FIXED_NEWSTYLE != 0;
        self.no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
        loop {
            let mut h = [0u8; 16];
            if !read_exact_or_eof(self.reader, &mut h)? {
                return Ok(None);
            }
            let magic = u64::from_be_bytes(h[0..8].try_into().expect("8 bytes"));
            if magic != IHAVEOPT {
                tracing::debug!("{}: bad option magic {magic:#x}", self.peer);
                return Ok(None);
            }
            let option = u32::from_be_bytes(h[8..12].try_into().expect("4 bytes"));
            let length = u32::from_be_bytes(h[12..16].try_into().expect("4 bytes"));
            if length > MAX_OPTION_DATA {
                drain(self.reader, u64::from(length))?;
                if option == OPT_EXPORT_NAME || !self.fixed {
                    return Ok(None);
                }
                self.error(option, REP_ERR_TOO_BIG, "option data too large")?;
                continue;
            }
            let mut data = vec![0u8; usize::try_from(length).expect("<= MAX_OPTION_DATA")];
            self.reader.read_exact(&mut data)?;
            if self.shared.shutdown.load(Ordering::SeqCst) {
                if option != OPT_EXPORT_NAME && self.fixed {
                    self.error(option, REP_ERR_SHUTDOWN, "server is shutting down")?;
                }
                return Ok(None);
            }
            if !self.fixed && option != OPT_EXPORT_NAME {
                return Ok(None);
            }
            // Forced TLS: before the handshake, nothing about the exports (not their
            // names, not their sizes) and no transmission.
            if self.shared.tls.as_ref().is_some_and(ServerTls::required)
                && !self.tls_on
                && option != OPT_STARTTLS
                && option != OPT_ABORT
            {
                if option == OPT_EXPORT_NAME {
                    tracing::info!("{}: NBD_OPT_EXPORT_NAME without TLS; closing", self.peer);
                    return Ok(None);
                }
                self.error(
                    option,
                    REP_ERR_TLS_REQD,
                    "TLS is required: send NBD_OPT_STARTTLS first",
                )?;
                continue;
            }
            match self.option(option, &data)? {
                Next::Continue => {}
                Next::Transmit(s) => return Ok(Some(s)),
                Next::Close => return Ok(None),
            }
        }
    }

    pub(super) fn transmission_flags(&self, e: &ExportEntry) -> u16 {
        if self.structured {
            e.flags | FLAG_SEND_DF
        } else {
            e.flags
        }
    }

    fn session(&self, export: Arc<ExportEntry>) -> Session {
        let base_allocation = match &self.meta {
            Some((name, on)) => {
                *on && self
                    .shared
                    .find(name)
                    .is_some_and(|e| Arc::ptr_eq(&e, &export))
            }
            None => false,
        };
        let fence = self.fence.as_ref().and_then(|(name, token)| {
            self.shared
                .find(name)
                .is_some_and(|e| Arc::ptr_eq(&e, &export))
                .then(|| token.clone())
        });
        Session {
            export,
            structured: self.structured,
            base_allocation,
            fence,
        }
    }

    fn option(&mut self, option: u32, data: &[u8]) -> io::Result<Next> {
        match option {
            OPT_EXPORT_NAME => {
                let Ok(name) = std::str::from_utf8(data) else {
                    return Ok(Next::Close);
                };
                let Some(e) = self.shared.find(name) else {
                    tracing::info!("{}: unknown export {name:?}; closing", self.peer);
                    return Ok(Next::Close);
                };
                let mut r = Vec::with_capacity(134);
                r.extend_from_slice(&e.geometry.size.to_be_bytes());
                r.extend_from_slice(&self.transmission_flags(&e).to_be_bytes());
                if !self.no_zeroes {
                    r.extend_from_slice(&[0u8; 124]);
                }
                self.writer.write_all(&r)?;
                self.writer.flush()?;
                Ok(Next::Transmit(self.session(e)))
            }
            OPT_ABORT => {
                let _ = self.reply(option, REP_ACK, &[]);
                Ok(Next::Close)
            }
            OPT_LIST => {
                if !data.is_empty() {
                    self.error(option, REP_ERR_INVALID, "NBD_OPT_LIST takes no data")?;
                    return Ok(Next::Continue);
                }
                let exports = self.shared.exports().clone();
                for e in exports {
                    let name = e.export.name.as_bytes();
                    let mut r = Vec::with_capacity(4 + name.len() + e.export.description.len());
                    r.extend_from_slice(&u32::try_from(name.len()).expect("<= 4096").to_be_bytes());
                    r.extend_from_slice(name);
                    let d = e.export.description.as_bytes();
                    r.extend_from_slice(&d[..d.len().min(MAX_STRING)]);
                    self.reply(option, REP_SERVER, &r)?;
                }
                self.reply(option, REP_ACK, &[])?;
                Ok(Next::Continue)
            }
            OPT_STARTTLS => self.starttls(option, data),
            OPT_INFO | OPT_GO => {
                let req = match parse_info_request(data) {
                    Ok(r) => r,
                    Err(OptionError(m)) => {
                        self.error(option, REP_ERR_INVALID, &m)?;
                        return Ok(Next::Continue);
                    }
                };
                let Some(e) = self.shared.find(&req.name) else {
                    let msg = if req.name.is_empty() {
                        "no default export: this server has several; name one".to_string()
                    } else {
                        format!("no export named {:?}", req.name)
                    };
                    self.error(option, REP_ERR_UNKNOWN, &msg)?;
                    return Ok(Next::Continue);
                };
                for &what in &req.requests {
                    let mut r = Vec::new();
                    match what {
                        INFO_NAME => {
                            r.extend_from_slice(&INFO_NAME.to_be_bytes());
                            r.extend_from_slice(e.export.name.as_bytes());
                        }
                        INFO_DESCRIPTION => {
                            r.extend_from_slice(&INFO_DESCRIPTION.to_be_bytes());
                            let d = e.export.description.as_bytes();
                            r.extend_from_slice(&d[..d.len().min(MAX_STRING)]);
                        }
                        _ => continue, // block size and export go out unasked, below
                    }
                    self.reply(option, REP_INFO, &r)?;
                }
                let mut bs = Vec::with_capacity(14);
                bs.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                bs.extend_from_slice(&e.min_block.to_be_bytes());
                bs.extend_from_slice(&e.preferred_block.to_be_bytes());
                bs.extend_from_slice(&e.max_block.to_be_bytes());
                self.reply(option, REP_INFO, &bs)?;
                let mut ex = Vec::with_capacity(12);
                ex.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                ex.extend_from_slice(&e.geometry.size.to_be_bytes());
                ex.extend_from_slice(&self.transmission_flags(&e).to_be_bytes());
                self.reply(option, REP_INFO, &ex)?;
                self.reply(option, REP_ACK, &[])?;
                if option == OPT_GO {
                    return Ok(Next::Transmit(self.session(e)));
                }
                Ok(Next::Continue)
            }
            OPT_STRUCTURED_REPLY => {
                if !data.is_empty() {
                    self.error(
                        option,
                        REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    )?;
                } else if self.structured {
                    self.error(
                        option,
                        REP_ERR_INVALID,
                        "structured replies already negotiated",
                    )?;
                } else {
                    self.structured = true;
                    self.reply(option, REP_ACK, &[])?;
                }
                Ok(Next::Continue)
            }
            OPT_CAIRN_FENCE if self.shared.fence.is_some() => {
                self.fence_option(data)?;
                Ok(Next::Continue)
            }
            o if self.shared.extension.as_ref().is_some_and(|x| x.handles(o)) => {
                let ext = self.shared.extension.clone().expect("checked above");
                let (reply, answer) = ext.answer(o, data);
                if answer.len() > MAX_OPTION_DATA as usize {
                    self.error(o, REP_ERR_TOO_BIG, "the answer is too large for one reply")?;
                } else {
                    self.reply(o, reply, &answer)?;
                }
                Ok(Next::Continue)
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.meta_context(option, data)?;
                Ok(Next::Continue)
            }
            _ => {
                self.error(
                    option,
                    REP_ERR_UNSUP,
                    &format!("option {option} is not supported"),
                )?;
                Ok(Next::Continue)
            }
        }
    }

    /// `NBD_OPT_STARTTLS`: ACK in plaintext, the TLS handshake, and from then on the
    /// reader and writer are the TLS session's. What was negotiated before is forgotten
    /// (structured replies, meta contexts), so nothing said in plaintext carries over.
    fn starttls(&mut self, option: u32, data: &[u8]) -> io::Result<Next> {
        let (Some(tls), Some(socket)) = (self.shared.tls.clone(), self.socket.clone()) else {
            self.error(option, REP_ERR_UNSUP, "TLS is not enabled on this server")?;
            return Ok(Next::Continue);
        };
        if !data.is_empty() {
            self.error(option, REP_ERR_INVALID, "NBD_OPT_STARTTLS takes no data")?;
            return Ok(Next::Continue);
        }
        if self.tls_on {
            self.error(option, REP_ERR_INVALID, "TLS is already on")?;
            return Ok(Next::Continue);
        }
        // The client must wait for the ACK before its TLS hello: plaintext read beyond
        // the option would otherwise be taken for the start of TLS.
        if !self.reader.buffer().is_empty() {
            tracing::info!(
                "{}: data after NBD_OPT_STARTTLS before its reply; closing",
                self.peer
            );
            return Ok(Next::Close);
        }
        self.reply(option, REP_ACK, &[])?;
        self.writer.flush()?;
        match tls::TlsConn::accept(&tls, socket, self.shared.client_timeout) {
            Ok(conn) => {
                tracing::info!(
                    "{}: TLS ({}, {}) established",
                    self.peer,
                    tls.kind(),
                    conn.describe()
                );
                *self.reader = BufReader::with_capacity(
                    64 << 10,
                    Box::new(tls::TlsReader(conn.clone())) as Box<dyn Read + Send>,
                );
                *self.writer = Box::new(tls::TlsWriter(conn));
                self.tls_on = true;
                self.structured = false;
                self.meta = None;
                Ok(Next::Continue)
            }
            // A client that failed to authenticate (wrong key, unknown CA) is worth a
            // line by default: the operator's only trace of it.
            Err(e) => {
                tracing::warn!("{}: {e}; closing", self.peer);
                Ok(Next::Close)
            }
        }
    }

    fn meta_context(&mut self, option: u32, data: &[u8]) -> io::Result<()> {
        let set = option == OPT_SET_META_CONTEXT;
        if !self.structured {
            return self.error(
                option,
                REP_ERR_INVALID,
                "negotiate structured replies first",
            );
        }
        let req = match parse_meta_context_request(data) {
            Ok(r) => r,
            Err(OptionError(m)) => return self.error(option, REP_ERR_INVALID, &m),
        };
        if self.shared.find(&req.name).is_none() {
            return self.error(
                option,
                REP_ERR_UNKNOWN,
                &format!("no export named {:?}", req.name),
            );
        }
        let mut selected = !set && req.queries.is_empty();
        for q in &req.queries {
            match query_selects_base_allocation(q) {
                Ok(s) => selected |= s,
                Err(OptionError(m)) => return self.error(option, REP_ERR_INVALID, &m),
            }
        }
        if selected {
            let id = if set { BASE_ALLOCATION_ID } else { 0 };
            let mut r = Vec::with_capacity(4 + BASE_ALLOCATION.len());
            r.extend_from_slice(&id.to_be_bytes());
            r.extend_from_slice(BASE_ALLOCATION.as_bytes());
            self.reply(option, REP_META_CONTEXT, &r)?;
        }
        if set {
            self.meta = Some((req.name, selected));
        }
        self.reply(option, REP_ACK, &[])
    }
}
