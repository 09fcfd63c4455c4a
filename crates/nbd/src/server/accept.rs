//! The accept loop: bound listeners, one thread per accepted connection, the connection
//! limit and the limit of unfinished handshakes per address, handshake deadlines, replies
//! taken too slowly (watch.rs), and the orderly end of a shutdown.

use super::*;

impl Server {
    /// Binds every address. A stale Unix socket file (nobody listening) is replaced; a
    /// live one is an error.
    pub fn bind(&self, listen: &[Listen]) -> io::Result<Listeners> {
        let mut items = Vec::new();
        for l in listen {
            match l {
                Listen::Unix(path) => {
                    // Owner only: the socket gives raw access to the data.
                    let lst =
                        cairn_block::sock::bind_unix(path, 0o600).map_err(|e| match e.kind() {
                            io::ErrorKind::AddrInUse | io::ErrorKind::AlreadyExists => e,
                            _ => io::Error::new(e.kind(), format!("bind {}: {e}", path.display())),
                        })?;
                    lst.set_nonblocking(true)?;
                    items.push((l.clone(), BoundListener::Unix(lst)));
                }
                Listen::Tcp(addr) => {
                    let lst = TcpListener::bind(addr)
                        .map_err(|e| io::Error::new(e.kind(), format!("bind {addr}: {e}")))?;
                    lst.set_nonblocking(true)?;
                    let real = lst.local_addr()?;
                    items.push((Listen::Tcp(real), BoundListener::Tcp(lst)));
                }
            }
        }
        Ok(Listeners { items })
    }

    /// Accepts connections until shutdown, then waits (up to the grace period) for
    /// connections to finish, and flushes every writable export. A failed final flush is
    /// an error.
    pub fn serve(&self, listeners: Listeners) -> io::Result<()> {
        let mut handles: Vec<thread::JoinHandle<()>> = Vec::new();
        let mut fds: Vec<libc::pollfd> = listeners
            .items
            .iter()
            .map(|(_, l)| libc::pollfd {
                fd: match l {
                    BoundListener::Unix(u) => u.as_raw_fd(),
                    BoundListener::Tcp(t) => t.as_raw_fd(),
                },
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // Conditions logged once when they start and once when they end, not per event.
        let mut starved = false;
        let mut full = false;
        let mut crowded = false;
        while !self.shared.shutdown.load(Ordering::SeqCst) {
            handles.retain(|h| !h.is_finished());
            self.cut_slow_clients();
            let nfds = libc::nfds_t::try_from(fds.len()).unwrap_or(0);
            // SAFETY: fds is a live, correctly sized array of pollfd for the call.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), nfds, 200) };
            if n <= 0 {
                continue;
            }
            for (i, (_, l)) in listeners.items.iter().enumerate() {
                if fds[i].revents == 0 {
                    continue;
                }
                fds[i].revents = 0;
                loop {
                    let accepted = match l {
                        BoundListener::Unix(u) => u.accept().map(|(s, _)| Conn::unix(s)),
                        BoundListener::Tcp(t) => t.accept().map(|(s, a)| Conn::tcp(s, a)),
                    };
                    let e = match accepted {
                        Ok(Ok(conn)) => {
                            if starved {
                                starved = false;
                                tracing::info!("accepting connections again");
                            }
                            if handles.len() >= self.shared.max_connections {
                                if !full {
                                    full = true;
                                    tracing::warn!(
                                        "{} connections, the most allowed (--max-connections): \
                                         closing new ones until some end",
                                        handles.len()
                                    );
                                }
                                continue;
                            }
                            if full {
                                full = false;
                                tracing::info!("below the connection limit again");
                            }
                            if let Some(ip) = self.handshakes_crowd(&conn) {
                                if !crowded {
                                    crowded = true;
                                    tracing::warn!(
                                        "{ip} has {HANDSHAKES_PER_PEER} handshakes unfinished, \
                                         the most one address may: closing its new \
                                         connections until some finish"
                                    );
                                }
                                continue;
                            }
                            crowded = false;
                            if let Some(h) = self.spawn_connection(conn) {
                                handles.push(h);
                            }
                            continue;
                        }
                        Ok(Err(e)) => e,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => e,
                    };
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
                    ) {
                        // The connection waits in the backlog (or was closed); poll would
                        // report it again at once, so pause instead of spinning.
                        if !starved {
                            starved = true;
                            tracing::warn!(
                                "accepting a connection: {e}; new connections wait until \
                                 some close (raise the limit with `ulimit -n`)"
                            );
                        }
                        thread::sleep(ACCEPT_BACKOFF);
                    } else {
                        tracing::debug!("accepting a connection: {e}");
                    }
                    break;
                }
            }
        }
        tracing::info!("shutting down: finishing in-flight requests");
        let deadline = Instant::now() + self.shared.grace;
        while handles.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(20));
        }
        let stuck = self.shared.conns.lock().expect("conns lock").len();
        if stuck > 0 {
            tracing::warn!("{stuck} connection(s) still busy after the grace period; closing them");
            for c in self.shared.conns.lock().expect("conns lock").values() {
                c.ctl.shutdown_both();
            }
            let deadline = Instant::now() + Duration::from_secs(1);
            while handles.iter().any(|h| !h.is_finished()) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
        }
        let mut failed = Vec::new();
        let exports = self.shared.exports().clone();
        for e in &exports {
            if !e.export.read_only {
                if let Err(err) = e.export.device.flush() {
                    tracing::error!("flushing export {}: {err}", e.export.name);
                    failed.push(format!("export {}: {err}", e.export.name));
                }
            }
        }
        drop(listeners);
        if !failed.is_empty() {
            // Data acknowledged to clients may not be durable: the caller must know.
            return Err(io::Error::other(format!(
                "final flush failed: {}",
                failed.join("; ")
            )));
        }
        Ok(())
    }

    /// Cuts connections whose handshake outlived its deadline, and those whose client
    /// takes a reply too slowly (watch.rs): their threads, blocked reading or writing, see
    /// the end of the stream.
    fn cut_slow_clients(&self) {
        let now = Instant::now();
        let conns = self.shared.conns.lock().expect("conns lock");
        for c in conns.values() {
            if c.handshake_deadline.is_some_and(|d| now >= d) {
                tracing::debug!(
                    "{}: no handshake within the client timeout; closing",
                    c.peer
                );
                c.ctl.shutdown_both();
            }
            if let Some(why) = c
                .send
                .as_ref()
                .and_then(|s| s.overdue(self.shared.client_timeout))
            {
                tracing::info!("{}: the client {why}; closing", c.peer);
                c.ctl.abort();
            }
        }
    }

    /// The address of a new connection whose address already has
    /// [`HANDSHAKES_PER_PEER`] handshakes unfinished.
    fn handshakes_crowd(&self, conn: &Conn) -> Option<IpAddr> {
        let ip = conn.ip?;
        let conns = self.shared.conns.lock().expect("conns lock");
        let open = conns
            .values()
            .filter(|c| c.peer_ip == Some(ip) && c.handshake_deadline.is_some())
            .count();
        (open >= HANDSHAKES_PER_PEER).then_some(ip)
    }

    fn spawn_connection(&self, conn: Conn) -> Option<thread::JoinHandle<()>> {
        // A client that stops reading makes reply writes fail after this instead of
        // blocking a worker, and the memory of its reply, for ever.
        if let Err(e) = conn.ctl.set_write_timeout(self.shared.client_timeout) {
            tracing::warn!("{}: setting a send timeout: {e}", conn.peer);
            return None;
        }
        if let Some(idle) = self.shared.keepalive {
            if let Err(e) = conn.ctl.set_keepalive(idle) {
                tracing::warn!("{}: setting TCP keepalive: {e}", conn.peer);
            }
        }
        let shared = self.shared.clone();
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        // Listed here, before its thread runs: the next accept counts its handshake.
        shared.conns.lock().expect("conns lock").insert(
            id,
            ConnEntry {
                ctl: conn.ctl,
                peer: conn.peer.clone(),
                export: None,
                since: SystemTime::now(),
                handshake_deadline: Some(Instant::now() + shared.client_timeout),
                peer_ip: conn.ip,
                send: None,
            },
        );
        let builder = thread::Builder::new().name(format!("nbd-conn-{id}"));
        let in_thread = shared.clone();
        let res = builder.spawn(move || {
            let shared = in_thread;
            // A shutdown that raced with the insert would miss this connection.
            if shared.shutdown.load(Ordering::SeqCst) {
                if let Some(c) = shared.conns.lock().expect("conns lock").get(&id) {
                    c.ctl.shutdown_read();
                }
            }
            tracing::debug!("{}: connected", conn.peer);
            serve_connection(
                &shared,
                conn.reader,
                conn.writer,
                Some(conn.socket),
                &conn.peer,
                id,
            );
            shared.conns.lock().expect("conns lock").remove(&id);
        });
        match res {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::error!("cannot start a connection thread: {e}");
                shared.conns.lock().expect("conns lock").remove(&id);
                None
            }
        }
    }
}

/// Stops a connection's reads from another thread.
pub(super) trait SocketCtl: Send + fmt::Debug {
    fn shutdown_read(&self);
    /// Ends the connection both ways, unblocking a worker stuck writing to a client that
    /// stopped reading.
    fn shutdown_both(&self);
    /// Ends the connection both ways and drops what its socket still holds to send: a
    /// client that does not read would otherwise keep it queued in the kernel, and its
    /// end of the stream (queued behind it) from the client.
    fn abort(&self) {
        self.shutdown_both();
    }
    fn set_write_timeout(&self, t: Duration) -> io::Result<()>;
    /// TCP keepalive probes after `idle` without traffic (three, `idle / 4` apart, at
    /// least a second): a peer gone without a word (a partition, a host powered off)
    /// breaks the connection's read instead of leaving it open for ever. Nothing on
    /// other sockets. (No default: a wrapper that forgot to forward it would turn it off
    /// without a word.)
    fn set_keepalive(&self, idle: Duration) -> io::Result<()>;
}

impl SocketCtl for UnixStream {
    fn shutdown_read(&self) {
        let _ = self.shutdown(std::net::Shutdown::Read);
    }
    fn shutdown_both(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
    fn set_write_timeout(&self, t: Duration) -> io::Result<()> {
        UnixStream::set_write_timeout(self, Some(t))
    }
    fn set_keepalive(&self, _idle: Duration) -> io::Result<()> {
        Ok(())
    }
}
impl SocketCtl for TcpStream {
    fn shutdown_read(&self) {
        let _ = self.shutdown(std::net::Shutdown::Read);
    }
    fn shutdown_both(&self) {
        let _ = self.shutdown(std::net::Shutdown::Both);
    }
    fn abort(&self) {
        // A zero linger: the close that follows the shutdown resets the connection
        // instead of keeping the unsent bytes (and the FIN behind them) queued.
        let linger = libc::linger {
            l_onoff: 1,
            l_linger: 0,
        };
        let len = libc::socklen_t::try_from(std::mem::size_of::<libc::linger>())
            .expect("linger fits socklen_t");
        // SAFETY: the descriptor is this live socket's; linger is a valid SO_LINGER value
        // of `len` bytes.
        unsafe {
            libc::setsockopt(
                self.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_LINGER,
                (&raw const linger).cast(),
                len,
            );
        }
        self.shutdown_both();
    }
    fn set_write_timeout(&self, t: Duration) -> io::Result<()> {
        TcpStream::set_write_timeout(self, Some(t))
    }
    fn set_keepalive(&self, idle: Duration) -> io::Result<()> {
        // A c_int is 4 bytes: the length fits a socklen_t.
        #[allow(clippy::cast_possible_truncation)]
        const INT_LEN: libc::socklen_t = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        let secs =
            |d: Duration| libc::c_int::try_from(d.as_secs().max(1)).unwrap_or(libc::c_int::MAX);
        let fd = self.as_raw_fd();
        for (level, name, value) in [
            (libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1),
            (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, secs(idle)),
            (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, secs(idle / 4)),
            (libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3),
        ] {
            // SAFETY: `fd` is this open socket; the option value is a c_int that lives
            // across the call, and its size is passed with it.
            let r =
                unsafe { libc::setsockopt(fd, level, name, (&raw const value).cast(), INT_LEN) };
            if r != 0 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    }
}

/// Bound listening sockets, ready for [`Server::serve`].
#[derive(Debug)]
pub struct Listeners {
    items: Vec<(Listen, BoundListener)>,
}

#[derive(Debug)]
enum BoundListener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

impl Listeners {
    /// The addresses actually bound (a `tcp:…:0` request shows its real port).
    pub fn addresses(&self) -> Vec<Listen> {
        self.items.iter().map(|(l, _)| l.clone()).collect()
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        for (l, _) in &self.items {
            if let Listen::Unix(p) = l {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// An accepted socket split into independent read and write handles.
struct Conn {
    pub(super) reader: Box<dyn Read + Send>,
    pub(super) writer: Box<dyn Write + Send>,
    pub(super) ctl: Box<dyn SocketCtl>,
    /// The socket itself, for a TLS session to take over after STARTTLS.
    pub(super) socket: tls::Socket,
    pub(super) peer: String,
    /// The client's address (TCP).
    pub(super) ip: Option<IpAddr>,
}

impl Conn {
    // One descriptor per connection, shared by the reader, the writer and the control
    // handle: where descriptors are scarce, three per connection would run out three
    // times sooner, and an accepted connection would be lost to a failed dup.
    fn unix(s: UnixStream) -> io::Result<Conn> {
        s.set_nonblocking(false)?;
        let peer = format!("unix:fd{}", s.as_raw_fd());
        let s = Arc::new(s);
        Ok(Conn {
            reader: Box::new(SharedSocket(s.clone())),
            writer: Box::new(SharedSocket(s.clone())),
            ctl: Box::new(SharedSocket(s.clone())),
            socket: s,
            peer,
            ip: None,
        })
    }
    fn tcp(s: TcpStream, addr: SocketAddr) -> io::Result<Conn> {
        s.set_nonblocking(false)?;
        s.set_nodelay(true)?;
        let s = Arc::new(s);
        Ok(Conn {
            reader: Box::new(SharedSocket(s.clone())),
            writer: Box::new(SharedSocket(s.clone())),
            ctl: Box::new(SharedSocket(s.clone())),
            socket: s,
            peer: format!("tcp:{addr}"),
            ip: Some(addr.ip().to_canonical()),
        })
    }
}

/// A socket used from several places at once (reads and writes are independent on a
/// socket, as with `try_clone`, without another descriptor).
#[derive(Debug)]
struct SharedSocket<S>(Arc<S>);

impl<S> Read for SharedSocket<S>
where
    for<'a> &'a S: Read,
{
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self.0).read(buf)
    }
}

impl<S> Write for SharedSocket<S>
where
    for<'a> &'a S: Write,
{
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self.0).write(buf)
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&*self.0).write_vectored(bufs)
    }
    fn flush(&mut self) -> io::Result<()> {
        (&*self.0).flush()
    }
}

impl<S: SocketCtl + Sync> SocketCtl for SharedSocket<S> {
    fn shutdown_read(&self) {
        self.0.shutdown_read();
    }
    fn shutdown_both(&self) {
        self.0.shutdown_both();
    }
    fn abort(&self) {
        self.0.abort();
    }
    fn set_write_timeout(&self, t: Duration) -> io::Result<()> {
        self.0.set_write_timeout(t)
    }
    fn set_keepalive(&self, idle: Duration) -> io::Result<()> {
        self.0.set_keepalive(idle)
    }
}
