//! The transmission phase: requests read, checked, executed on the device and answered.

use super::*;

use std::panic::{catch_unwind, AssertUnwindSafe};

use super::budget::Held;
use super::handshake::{read_exact_or_eof, Handshake};
use super::watch::{SendClock, Timed};

/// Writes every byte of every slice, coping with short writes.
pub(crate) fn write_all_vectored(
    w: &mut dyn Write,
    mut bufs: &mut [IoSlice<'_>],
) -> io::Result<()> {
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The one mapping from block-layer errors to NBD error values.
pub fn nbd_errno(kind: ErrorKind) -> u32 {
    match kind {
        ErrorKind::OutOfRange | ErrorKind::Unaligned | ErrorKind::InvalidArgument => EINVAL,
        ErrorKind::ReadOnly | ErrorKind::Fenced => EPERM,
        ErrorKind::NoSpace => ENOSPC,
        ErrorKind::Unsupported => ENOTSUP,
        ErrorKind::Shutdown => ESHUTDOWN,
        _ => EIO,
    }
}

/// A request's failure: the wire error and a message for structured replies.
struct Failure {
    pub(super) errno: u32,
    pub(super) message: String,
}

impl Failure {
    fn new(errno: u32, message: impl Into<String>) -> Failure {
        Failure {
            errno,
            message: message.into(),
        }
    }
}

impl From<cairn_block::Error> for Failure {
    fn from(e: cairn_block::Error) -> Failure {
        Failure {
            errno: nbd_errno(e.kind()),
            message: e.to_string(),
        }
    }
}

/// Replies with at most this much payload may be gathered (crate::cork) and sent with
/// others; larger ones go out at once.
const CORK_PAYLOAD: usize = 16 << 10;

/// Gathered replies are sent once they reach this many bytes.
const CORK_BYTES: usize = 64 << 10;

/// The connection's writing side: the stream, and replies gathered for it (crate::cork).
struct Out {
    w: Box<dyn Write + Send>,
    pending: Vec<u8>,
}

impl Out {
    fn send_pending(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let r = self.w.write_all(&self.pending);
        self.pending.clear();
        if self.pending.capacity() > 2 * CORK_BYTES {
            self.pending.shrink_to(CORK_BYTES);
        }
        r
    }
}

/// Largest buffer kept between requests.
const KEEP_BUFFER: usize = 4 << 20;

/// Most bytes of buffers one connection keeps between requests: eight 1 MiB requests in
/// flight reuse theirs, and an idle connection pins no more than this.
const SPARE_BYTES: usize = 8 << 20;

/// One connection in its transmission phase, shared by its reader (the connection's
/// thread) and the pool workers running its requests.
struct Transmission {
    /// Replies are written whole under this lock, in the order requests finish (small
    /// ones may wait in `pending` for the end of their thread's burst: crate::cork).
    writer: Mutex<Out>,
    export: Arc<ExportEntry>,
    flags: u16,
    structured: bool,
    base_allocation: bool,
    /// The owner token this connection declared (fence.rs).
    fence: Option<crate::fence::FenceToken>,
    closing: AtomicBool,
    peer: String,
    wrote: AtomicBool,
    shared: Arc<Shared>,
    /// The connection's id in `shared.conns` (0: not listed).
    id: u64,
    /// This connection's share of the bytes in flight.
    in_flight: Arc<Budget>,
    /// Requests of this connection running at once (read and not yet answered).
    running: Arc<Budget>,
    /// Buffers of finished requests, reused by the next ones (a 1 MiB buffer allocated
    /// afresh costs page faults on every request).
    spare: Mutex<Spare>,
    /// The reply being written, watched by the accept thread (watch.rs).
    clock: Arc<SendClock>,
}

/// The server's budget is shared as if at least this many connections were served: the
/// first ones to come (a few clients that stop reading, say) do not take it all before
/// others arrive. With the default budget, a share is one 32 MiB request.
const MIN_SHARES: usize = 8;

/// Counts a connection among those served while it lives (the fair share's divisor).
struct Serving<'a>(&'a AtomicUsize);

impl Drop for Serving<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Buffers of finished requests, and their total capacity.
#[derive(Default)]
struct Spare {
    bufs: Vec<Vec<u8>>,
    bytes: usize,
}

/// What a request holds until its reply is sent: its place among the connection's
/// running requests, and its buffer's bytes in the connection's and the server's budgets.
struct Holds {
    _running: Held,
    _bytes: Option<(Held, Held)>,
}

/// The reply a write completing on another thread still owes: sent once by
/// [`Owed::send`], or as an internal error if the device drops it unsent (a panic), so a
/// client never waits for ever. Its holds are released after the reply.
struct Owed {
    t: Arc<Transmission>,
    req: Request,
    holds: Option<Holds>,
}

impl Owed {
    fn send(mut self, result: Result<(), Failure>) {
        self.finish(result);
    }

    fn finish(&mut self, result: Result<(), Failure>) {
        if let Some(holds) = self.holds.take() {
            self.t.reply(&self.req, result, &[]);
            drop(holds);
        }
    }
}

impl Drop for Owed {
    fn drop(&mut self) {
        self.finish(Err(Failure::new(EIO, "WRITE: internal error")));
    }
}

/// What one read from the stream produced.
enum Incoming {
    /// A request to execute (payload, if any, is in the buffer read with it), or one
    /// already refused while reading.
    Request(Request, Result<(), Failure>, Holds),
    /// The stream ended or broke: stop.
    Stop,
}

pub(super) fn serve_connection(
    shared: &Arc<Shared>,
    reader: Box<dyn Read + Send>,
    mut writer: Box<dyn Write + Send>,
    socket: Option<tls::Socket>,
    peer: &str,
    id: u64,
) {
    let mut reader = BufReader::with_capacity(64 << 10, reader);
    let mut hs = Handshake {
        shared,
        reader: &mut reader,
        writer: &mut writer,
        peer,
        fixed: false,
        no_zeroes: false,
        structured: false,
        meta: None,
        fence: None,
        socket,
        tls_on: false,
    };
    let session = match hs.run() {
        Ok(Some(s)) => s,
        Ok(None) => return,
        Err(e) => {
            tracing::debug!("{peer}: handshake ended: {e}");
            return;
        }
    };
    let flags = hs.transmission_flags(&session.export);
    if let Some(c) = shared.conns.lock().expect("conns lock").get_mut(&id) {
        c.export = Some(session.export.export.name.clone());
        c.handshake_deadline = None;
    }
    // An export removed while this handshake finished: removal did not see this
    // connection as a user, so do not start serving it.
    if shared
        .find(&session.export.export.name)
        .is_none_or(|e| !Arc::ptr_eq(&e, &session.export))
    {
        tracing::info!(
            "{peer}: export {:?} was removed; closing",
            session.export.export.name
        );
        return;
    }
    tracing::info!(
        "{peer}: export {:?} ({} bytes{}{})",
        session.export.export.name,
        session.export.geometry.size,
        if session.structured {
            ", structured replies"
        } else {
            ""
        },
        if session.base_allocation {
            ", base:allocation"
        } else {
            ""
        },
    );
    let clock = Arc::new(SendClock::default());
    if let Some(c) = shared.conns.lock().expect("conns lock").get_mut(&id) {
        c.send = Some(clock.clone());
    }
    shared.transmitting.fetch_add(1, Ordering::AcqRel);
    let _serving = Serving(&shared.transmitting);
    let t = Arc::new(Transmission {
        writer: Mutex::new(Out {
            w: Box::new(Timed {
                w: writer,
                clock: clock.clone(),
            }),
            pending: Vec::new(),
        }),
        export: session.export,
        flags,
        structured: session.structured,
        base_allocation: session.base_allocation,
        fence: session.fence,
        closing: AtomicBool::new(false),
        peer: peer.to_string(),
        wrote: AtomicBool::new(false),
        shared: shared.clone(),
        id,
        in_flight: Budget::new(CONNECTION_IN_FLIGHT),
        running: Budget::new(shared.threads),
        spare: Mutex::new(Spare::default()),
        clock,
    });
    // This thread reads requests and hands each to the pool; a worker executes it and
    // writes its reply, so replies go out in the order requests finish.
    // Replies of requests this thread runs while more are buffered are gathered and sent
    // together before it next waits for input (crate::cork).
    let cork = crate::cork::Scope;
    loop {
        if t.closing.load(Ordering::Acquire) {
            break;
        }
        if reader.buffer().len() < REQUEST_HEADER_LEN {
            crate::cork::release();
        }
        let mut buf = t.spare_buffer();
        let incoming = t.read_request(&mut reader, &mut buf);
        if reader.buffer().len() >= REQUEST_HEADER_LEN {
            crate::cork::hold();
        }
        match incoming {
            Incoming::Stop => break,
            // The reader runs the request itself when the connection runs one request
            // at a time, when the request will be refused anyway, and when requests
            // like it take less than a hand-off to the pool costs (dispatch.rs): that
            // saves a futex wake and a context switch on each side.
            Incoming::Request(req, verdict, holds)
                if shared.threads == 1
                    || verdict.is_err()
                    || t.export.costs.inline(req.kind, req.length) =>
            {
                t.answer(req, verdict, buf, holds);
            }
            Incoming::Request(req, verdict, holds) => {
                let job = t.clone();
                shared
                    .pool
                    .submit(Box::new(move || job.answer(req, verdict, buf, holds)));
            }
        }
    }
    drop(cork);
    t.closing.store(true, Ordering::Release);
    // Every request read is answered (or its reply failed) before the connection ends.
    t.running.wait_empty();
    // A client that disconnects without flushing still gets its writes pushed down.
    if t.wrote.load(Ordering::Relaxed) {
        if let Err(e) = t.export.export.device.flush() {
            tracing::warn!("{peer}: flush at disconnect: {e}");
        }
    }
    if let Ok(mut out) = t.writer.lock() {
        let _ = t.timed(&mut out, |out| {
            out.send_pending()?;
            out.w.flush()
        });
    }
    if let (Some(store), Some(token)) = (&shared.fence, &t.fence) {
        store.connection_ended(&t.export.export.name, token);
    }
    tracing::debug!("{peer}: disconnected");
}

impl Transmission {
    /// Runs one request (on a pool worker or the reader) and sends its reply.
    fn answer(
        self: &Arc<Self>,
        req: Request,
        verdict: Result<(), Failure>,
        mut buf: Vec<u8>,
        holds: Holds,
    ) {
        // A write the device may complete on another thread (a replica's answer): the
        // reply goes out from wherever it completes, and this thread is free at once.
        // Not with the owner gate, whose pass is held while a request runs.
        if verdict.is_ok() && req.kind == CMD_WRITE && self.shared.fence.is_none() {
            self.wrote.store(true, Ordering::Relaxed);
            let owed = Owed {
                t: self.clone(),
                req,
                holds: Some(holds),
            };
            let flags = if req.flags & CMD_FLAG_FUA != 0 {
                WriteFlags::FUA
            } else {
                WriteFlags::NONE
            };
            // What the dispatch estimate counts is how long this thread was held: up to
            // the completion when it comes before the call returns (a device that
            // writes in place), up to the return otherwise (the rest is waiting it does
            // not spend here). Whichever comes first records.
            let start = Instant::now();
            let first = Arc::new(AtomicBool::new(false));
            let on_done = first.clone();
            let dev = &self.export.export.device;
            // A panic below drops `owed` unsent, which answers EIO.
            let _ = catch_unwind(AssertUnwindSafe(|| {
                dev.write_then(
                    &buf,
                    req.offset,
                    flags,
                    Box::new(move |r| {
                        if !on_done.swap(true, Ordering::AcqRel) {
                            owed.t.export.costs.record(
                                owed.req.kind,
                                owed.req.length,
                                start.elapsed(),
                                false,
                            );
                        }
                        owed.send(r.map_err(Failure::from));
                    }),
                );
            }));
            if !first.swap(true, Ordering::AcqRel) {
                self.export
                    .costs
                    .record(req.kind, req.length, start.elapsed(), true);
            }
            self.give_back(buf);
            return;
        }
        let req = &req;
        let result = verdict.and_then(|()| {
            // Held while the request runs: a new owner's admission waits for it.
            let _pass = self.fence_check(req)?;
            let start = Instant::now();
            let r = catch_unwind(AssertUnwindSafe(|| self.execute(req, &mut buf))).unwrap_or_else(
                |_| {
                    Err(Failure::new(
                        EIO,
                        format!("{}: internal error", command_name(req.kind)),
                    ))
                },
            );
            self.export
                .costs
                .record(req.kind, req.length, start.elapsed(), false);
            r
        });
        self.reply(req, result, &buf);
        self.give_back(buf);
        drop(holds);
    }

    /// Runs `f`, which writes a reply (and what is gathered) to the client, under the
    /// accept thread's watch: it cuts the connection if the client takes it too slowly.
    fn timed<R>(&self, out: &mut Out, f: impl FnOnce(&mut Out) -> io::Result<R>) -> io::Result<R> {
        self.clock.begin();
        let r = f(out);
        self.clock.end();
        r
    }

    /// Sends a request's reply; a reply that cannot be sent ends the connection.
    fn reply(self: &Arc<Self>, req: &Request, result: Result<(), Failure>, buf: &[u8]) {
        if let Err(e) = self.send_reply(req, result, buf) {
            self.send_failed(&e);
        }
    }

    fn send_failed(&self, e: &io::Error) {
        if !self.closing.swap(true, Ordering::AcqRel) {
            tracing::debug!("{}: writing reply: {e}; closing", self.peer);
        }
        // A client that does not read (the send timed out): end the connection both
        // ways, so the reader and the other requests, blocked reading or waiting to
        // write, let go of their buffers too.
        if let Some(c) = self.shared.conns.lock().expect("conns lock").get(&self.id) {
            c.ctl.shutdown_both();
        }
    }

    /// Lets the request through the export's owner gate when the server fences.
    fn fence_check(&self, req: &Request) -> Result<super::fence::Pass<'_>, Failure> {
        let Some(store) = &self.shared.fence else {
            return Ok(None);
        };
        self.export
            .gate
            .check(
                &**store,
                &self.export.export,
                self.fence.as_ref(),
                req.kind,
                req.offset,
                u64::from(req.length),
            )
            .map_err(|(errno, message)| Failure::new(errno, message))
    }

    fn spare_buffer(&self) -> Vec<u8> {
        let Ok(mut s) = self.spare.lock() else {
            return Vec::new();
        };
        match s.bufs.pop() {
            Some(b) => {
                s.bytes -= b.capacity();
                b
            }
            None => Vec::new(),
        }
    }

    /// Keeps the common sizes (up to 4 MiB) warm, up to [`SPARE_BYTES`], but does not let
    /// one 32 MiB request pin 32 MiB for the life of the connection.
    fn give_back(&self, buf: Vec<u8>) {
        let cap = buf.capacity();
        if cap == 0 || cap > KEEP_BUFFER {
            return;
        }
        if let Ok(mut s) = self.spare.lock() {
            if s.bytes + cap <= SPARE_BYTES {
                s.bytes += cap;
                s.bufs.push(buf);
            }
        }
    }

    /// Reads one request header and its payload. Validation happens here so a refused
    /// WRITE's payload is still consumed and the stream stays in sync.
    fn read_request(&self, r: &mut BufReader<Box<dyn Read + Send>>, buf: &mut Vec<u8>) -> Incoming {
        let mut h = [0u8; REQUEST_HEADER_LEN];
        match read_exact_or_eof(r, &mut h) {
            Ok(true) => {}
            Ok(false) => return Incoming::Stop,
            Err(e) => {
                tracing::debug!("{}: reading request: {e}", self.peer);
                return Incoming::Stop;
            }
        }
        let req = match Request::parse(&h) {
            Ok(req) => req,
            Err(HeaderError::BadMagic(m)) => {
                tracing::warn!("{}: bad request magic {m:#010x}; closing", self.peer);
                return Incoming::Stop;
            }
        };
        if req.kind == CMD_DISC {
            return Incoming::Stop;
        }
        let verdict = self.validate(&req);
        if req.has_payload() && req.length > MAX_SAFE_PAYLOAD && req.length > self.export.max_block
        {
            // proto.md allows a hard disconnect here: the payload is a denial of service.
            tracing::warn!("{}: {}-byte write payload; closing", self.peer, req.length);
            return Incoming::Stop;
        }
        // A place among the running requests, and the buffer this request fills (its
        // payload, or the data a READ answers), are reserved before it is filled; while
        // either budget is spent, the reader waits here, so the connection reads nothing
        // more.
        let running = self.running.take(1);
        let need = if req.has_payload() || (req.kind == CMD_READ && verdict.is_ok()) {
            usize::try_from(req.length).expect("<= 32 MiB")
        } else {
            0
        };
        // The connection's bytes first, then the server's within this connection's fair
        // share (budget.rs): a connection that holds more waits here, on its own thread.
        let bytes = (need > 0).then(|| {
            let mine = self.in_flight.take(need);
            let share = self.shared.in_flight.limit()
                / self
                    .shared
                    .transmitting
                    .load(Ordering::Acquire)
                    .max(MIN_SHARES);
            let all = self
                .shared
                .in_flight
                .take_share(need, &self.in_flight, share);
            (mine, all)
        });
        let holds = Holds {
            _running: running,
            _bytes: bytes,
        };
        if req.has_payload() {
            buf.resize(need, 0);
            if let Err(e) = r.read_exact(&mut buf[..need]) {
                tracing::debug!("{}: reading write payload: {e}", self.peer);
                return Incoming::Stop;
            }
        }
        Incoming::Request(req, verdict, holds)
    }

    fn validate(&self, req: &Request) -> Result<(), Failure> {
        let e = &self.export;
        let fail = |m: String| Err(Failure::new(EINVAL, m));
        let mut allowed = 0u16;
        if self.flags & FLAG_SEND_FUA != 0 {
            allowed |= CMD_FLAG_FUA;
        }
        match req.kind {
            CMD_READ if self.flags & FLAG_SEND_DF != 0 => allowed |= CMD_FLAG_DF,
            CMD_WRITE_ZEROES => {
                allowed |= CMD_FLAG_NO_HOLE;
                if self.flags & FLAG_SEND_FAST_ZERO != 0 {
                    allowed |= CMD_FLAG_FAST_ZERO;
                }
            }
            CMD_BLOCK_STATUS => allowed |= CMD_FLAG_REQ_ONE,
            _ => {}
        }
        let name = command_name(req.kind);
        if req.flags & !allowed != 0 {
            return fail(format!(
                "{name}: flags {:#x} not allowed",
                req.flags & !allowed
            ));
        }
        let (off, len) = (req.offset, u64::from(req.length));
        let writes = matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        let advertised = match req.kind {
            CMD_READ | CMD_WRITE | CMD_FLUSH => true,
            CMD_TRIM => self.flags & FLAG_SEND_TRIM != 0,
            CMD_WRITE_ZEROES => self.flags & FLAG_SEND_WRITE_ZEROES != 0,
            CMD_CACHE => self.flags & FLAG_SEND_CACHE != 0,
            CMD_BLOCK_STATUS => self.base_allocation,
            _ => false,
        };
        if writes && e.export.read_only {
            return Err(Failure::new(EPERM, format!("{name}: export is read-only")));
        }
        if !advertised {
            return fail(match req.kind {
                CMD_BLOCK_STATUS => "BLOCK_STATUS: no metadata context was negotiated".into(),
                k if command_name(k) == "UNKNOWN" => format!("unknown command {k}"),
                _ => format!("{name}: not supported on this export"),
            });
        }
        if req.kind == CMD_FLUSH {
            if off != 0 || len != 0 {
                return fail("FLUSH: offset and length must be zero".into());
            }
            return Ok(());
        }
        if len == 0 {
            return fail(format!("{name}: zero length"));
        }
        if matches!(req.kind, CMD_READ | CMD_WRITE) && len > u64::from(e.max_block) {
            return fail(format!(
                "{name}: {len} bytes is more than the maximum {}",
                e.max_block
            ));
        }
        let kind = match req.kind {
            CMD_WRITE => IoKind::Write,
            CMD_WRITE_ZEROES => IoKind::WriteZeroes,
            CMD_TRIM => IoKind::Discard,
            CMD_READ => IoKind::Read,
            _ => IoKind::Other,
        };
        check_io(&e.geometry, kind, off, len).map_err(Failure::from)
    }

    fn execute(&self, req: &Request, buf: &mut Vec<u8>) -> Result<(), Failure> {
        let dev = &self.export.export.device;
        let (off, len) = (req.offset, u64::from(req.length));
        let fua = req.flags & CMD_FLAG_FUA != 0;
        let wf = if fua {
            WriteFlags::FUA
        } else {
            WriteFlags::NONE
        };
        match req.kind {
            CMD_READ => {
                let n = usize::try_from(len).expect("<= max block");
                buf.resize(n, 0);
                dev.read_at(&mut buf[..n], off)?;
            }
            CMD_WRITE => {
                self.wrote.store(true, Ordering::Relaxed);
                dev.write_at(&buf[..], off, wf)?;
            }
            CMD_FLUSH => dev.flush()?,
            CMD_TRIM => {
                self.wrote.store(true, Ordering::Relaxed);
                dev.discard(off, len)?;
                if fua {
                    dev.flush()?;
                }
            }
            CMD_WRITE_ZEROES => {
                self.wrote.store(true, Ordering::Relaxed);
                let mut f = wf;
                if req.flags & CMD_FLAG_NO_HOLE != 0 {
                    f = f | WriteFlags::NO_HOLE;
                }
                let fast = req.flags & CMD_FLAG_FAST_ZERO != 0;
                if fast {
                    f = f | WriteFlags::FAST_ZERO;
                }
                match dev.write_zeroes(off, len, f) {
                    Ok(()) => {}
                    Err(e) if e.kind() == ErrorKind::Unsupported && !fast => {
                        return Err(Failure::new(EIO, e.to_string()))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            CMD_CACHE => dev.cache(off, len)?,
            CMD_BLOCK_STATUS => {
                let mut ext = dev.extents(off, len)?;
                if req.flags & CMD_FLAG_REQ_ONE != 0 {
                    ext.truncate(1);
                }
                encode_block_status(&ext, off, len, buf)?;
            }
            _ => unreachable!("validate refuses unknown commands"),
        }
        Ok(())
    }

    /// Writes a reply, or gathers it when this thread holds (crate::cork) and it is
    /// small. A reply written at once takes the bytes gathered before it along.
    fn send_reply(
        self: &Arc<Self>,
        req: &Request,
        result: Result<(), Failure>,
        buf: &[u8],
    ) -> io::Result<()> {
        let payload = match &result {
            Err(_) => MAX_STRING,
            Ok(()) if req.kind == CMD_READ => usize::try_from(req.length).unwrap_or(usize::MAX),
            Ok(()) if req.kind == CMD_BLOCK_STATUS => buf.len(),
            Ok(()) => 0,
        };
        let mut out = self
            .writer
            .lock()
            .map_err(|_| io::Error::other("writer lock poisoned"))?;
        let holding = crate::cork::holding();
        if payload > CORK_PAYLOAD || (!holding && out.pending.is_empty()) {
            // Straight to the stream: nothing to gather it with, so no copy.
            return self.timed(&mut out, |out| {
                out.send_pending()?;
                self.write_reply(&mut *out.w, req, result, buf)
            });
        }
        self.write_reply(&mut out.pending, req, result, buf)?;
        if out.pending.len() < CORK_BYTES && holding {
            drop(out);
            let me: Arc<dyn crate::cork::Corked> = self.clone();
            if crate::cork::defer(&me) {
                return Ok(());
            }
            out = self
                .writer
                .lock()
                .map_err(|_| io::Error::other("writer lock poisoned"))?;
        }
        self.timed(&mut out, Out::send_pending)
    }

    fn write_reply(
        &self,
        w: &mut dyn Write,
        req: &Request,
        result: Result<(), Failure>,
        buf: &[u8],
    ) -> io::Result<()> {
        match result {
            Err(f) => {
                if f.errno == EIO {
                    tracing::warn!("{}: {}: {}", self.peer, command_name(req.kind), f.message);
                } else {
                    tracing::debug!("{}: {}: {}", self.peer, command_name(req.kind), f.message);
                }
                if self.structured {
                    let msg = &f.message.as_bytes()[..f.message.len().min(MAX_STRING)];
                    let msg_len = u16::try_from(msg.len()).expect("<= 4096");
                    let hdr = encode_structured_header(
                        REPLY_FLAG_DONE,
                        REPLY_TYPE_ERROR,
                        req.cookie,
                        6 + u32::from(msg_len),
                    );
                    let mut e = [0u8; 6];
                    e[0..4].copy_from_slice(&f.errno.to_be_bytes());
                    e[4..6].copy_from_slice(&msg_len.to_be_bytes());
                    write_all_vectored(
                        w,
                        &mut [IoSlice::new(&hdr), IoSlice::new(&e), IoSlice::new(msg)],
                    )
                } else {
                    w.write_all(&encode_simple_reply(f.errno, req.cookie))
                }
            }
            Ok(()) if req.kind == CMD_READ => {
                let data = &buf[..usize::try_from(req.length).expect("<= max block")];
                if self.structured {
                    let len = u32::try_from(data.len() + 8).expect("<= 32 MiB + 8");
                    let hdr = encode_structured_header(
                        REPLY_FLAG_DONE,
                        REPLY_TYPE_OFFSET_DATA,
                        req.cookie,
                        len,
                    );
                    let off = req.offset.to_be_bytes();
                    write_all_vectored(
                        w,
                        &mut [IoSlice::new(&hdr), IoSlice::new(&off), IoSlice::new(data)],
                    )
                } else {
                    let hdr = encode_simple_reply(0, req.cookie);
                    write_all_vectored(w, &mut [IoSlice::new(&hdr), IoSlice::new(data)])
                }
            }
            Ok(()) if req.kind == CMD_BLOCK_STATUS => {
                let len = u32::try_from(buf.len()).expect("bounded descriptor list");
                let hdr = encode_structured_header(
                    REPLY_FLAG_DONE,
                    REPLY_TYPE_BLOCK_STATUS,
                    req.cookie,
                    len,
                );
                write_all_vectored(w, &mut [IoSlice::new(&hdr), IoSlice::new(buf)])
            }
            Ok(()) => w.write_all(&encode_simple_reply(0, req.cookie)),
        }
    }
}

/// Encodes `base:allocation` descriptors into `out`: context id, then (length, flags)
/// pairs. Extents are clipped to the request; at least one descriptor is sent.
fn encode_block_status(
    ext: &[Extent],
    off: u64,
    len: u64,
    out: &mut Vec<u8>,
) -> Result<(), Failure> {
    out.clear();
    out.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
    let end = off + len;
    let mut pos = off;
    for e in ext {
        if pos >= end {
            break;
        }
        if e.offset != pos || e.length == 0 {
            return Err(Failure::new(
                EIO,
                format!("device returned a bad extent list at {pos}"),
            ));
        }
        let stop = (e.offset + e.length).min(end);
        let n = u32::try_from(stop - pos).expect("clipped to a u32 request");
        let mut flags = 0;
        if e.hole {
            flags |= STATE_HOLE;
        }
        if e.zero || e.hole {
            flags |= STATE_ZERO;
        }
        out.extend_from_slice(&n.to_be_bytes());
        out.extend_from_slice(&flags.to_be_bytes());
        pos = stop;
    }
    if out.len() == 4 {
        return Err(Failure::new(EIO, "device returned no extents"));
    }
    Ok(())
}

impl crate::cork::Corked for Transmission {
    fn uncork(&self) {
        let r = match self.writer.lock() {
            Ok(mut out) => self.timed(&mut out, Out::send_pending),
            Err(_) => Err(io::Error::other("writer lock poisoned")),
        };
        if let Err(e) = r {
            self.send_failed(&e);
        }
    }
}
