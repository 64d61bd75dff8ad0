//! The Redis-protocol (RESP2) front of Maquis's stores: `redis-cli`, `redis-benchmark` and
//! Redis client libraries against any node. A store implements the small [`Store`] trait
//! (its keys, and what `INFO` shows of it); [`serve`] does the rest.
//!
//! Supported: `PING`, `ECHO`, `GET`, `SET key value` (no options), `DEL`, `EXISTS`, `MGET`,
//! `MSET`, `HSET`/`HMSET`, `HGET`, `HMGET`, `HGETALL`, `HDEL` (when the store keeps hashes),
//! `KEYSFROM start count` (Maquis's own: the keys from `start` on in byte order, at most
//! `count`, for range scans; when the store keeps key order), `INFO [section]`, `COMMAND [COUNT|DOCS|INFO]`, `CLIENT
//! SETNAME|GETNAME|ID|SETINFO|INFO|LIST`, `SELECT 0`, `QUIT`, `CONFIG GET save|appendonly`,
//! `HELLO [2]`. Anything else is answered `-ERR unknown command …` and the connection stays
//! open. A request that cannot be framed (bad lengths, garbage, sizes over the [`Limits`]) is
//! answered `-ERR Protocol error: …` and the connection is closed, as Redis does.
//!
//! Requests are pipelined: every complete request in the input is executed, in order, and the
//! replies are written together, in order. Consecutive reads of a pipeline (`GET`, `EXISTS`,
//! `MGET`, `HGET`, `HMGET`, `HGETALL`, `KEYSFROM`, `PING`, `ECHO`; up to `max_batch` of them)
//! run at once, so a client that pipelines the reads of a range scan waits for about one
//! round trip to the store's nodes, not one per key; any other request waits for the reads
//! before it and runs alone. Multi-key commands run their keys concurrently (up to
//! `max_batch` at once); `MSET` is not atomic. `CLIENT REPLY ON|OFF|SKIP` works as in Redis.
//!
//! No client can starve the others:
//! - **Memory.** What every connection holds (its unparsed input and its unsent replies) counts
//!   against `max_buffered` for the whole server. When the total is over it, a connection
//!   that holds more than its share (`max_buffered` divided by the connections, at least
//!   1 MiB) is answered `-ERR client buffer limit reached` and closed, as Redis's
//!   `client-output-buffer-limit` and `client-query-buffer-limit` do.
//! - **Time.** A connection that sends nothing for `idle_timeout`, or does not read its replies
//!   within it, is closed.
//! - **Slots.** At `max_clients` connections, a new one takes the slot of the connection idle
//!   the longest (idle for at least one second, and not running a command); if there is
//!   none, it is answered `-ERR max number of clients reached` and closed.
//! - **CPU.** Header and inline lines are scanned once however slowly they arrive.

mod commands;
mod info;
pub mod parser;
pub mod reply;
mod store;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Notify};

pub use commands::COMMANDS;

/// The most keys one `KEYSFROM` may ask for.
pub const MAX_KEYSFROM: usize = 10_000;
pub use info::REDIS_VERSION;
pub use parser::{Limits, ProtocolError, RequestParser};
pub use reply::Reply;
pub use store::{Store, StoreError};

/// Settings of the RESP front.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RespConfig {
    /// Request size limits.
    pub limits: Limits,
    /// Connections served at once; further ones are answered
    /// `-ERR max number of clients reached` and closed. Default 10,000.
    pub max_clients: usize,
    /// Keys of one multi-key command (`MGET`, `MSET`, `DEL`, `EXISTS`) in flight at once, and
    /// consecutive pipelined reads of one connection run at once. Default 64.
    pub max_batch: usize,
    /// Replies buffered before they are written out mid-pipeline, in bytes. Default 64 KiB.
    pub write_batch: usize,
    /// Input and reply bytes held by all connections together before the largest holders are
    /// closed (see the module docs). Default 256 MiB.
    pub max_buffered: usize,
    /// A connection that sends nothing for this long, or leaves its replies unread this long,
    /// is closed. `None`: never. Default 300 s.
    pub idle_timeout: Option<Duration>,
}

impl Default for RespConfig {
    fn default() -> Self {
        RespConfig {
            limits: Limits::default(),
            max_clients: 10_000,
            max_batch: 64,
            write_batch: 64 * 1024,
            max_buffered: 256 << 20,
            idle_timeout: Some(Duration::from_secs(300)),
        }
    }
}

/// The smallest share of `max_buffered` a connection may hold before it can be closed.
const MIN_SHARE: usize = 1 << 20;

/// A connection idle for less than this is not closed to make room for a new one.
const MIN_IDLE_TO_EVICT: Duration = Duration::from_secs(1);

/// What the server knows of one connection.
pub(crate) struct Slot {
    /// Milliseconds (since the server started) of its last read.
    last_read_ms: AtomicU64,
    /// Whether it is running a command or writing replies.
    busy: AtomicBool,
    /// Closes it.
    evict: Notify,
}

/// Why connections were closed by the server.
#[derive(Debug, Default)]
pub(crate) struct Closed {
    pub idle: AtomicU64,
    pub evicted: AtomicU64,
    pub buffer: AtomicU64,
    pub refused: AtomicU64,
}

pub(crate) struct ServerState<S> {
    pub store: Arc<S>,
    pub config: RespConfig,
    pub addr: SocketAddr,
    pub clients: AtomicUsize,
    pub connections: AtomicU64,
    pub commands: AtomicU64,
    pub started: Instant,
    pub stop: watch::Sender<bool>,
    /// Input and reply bytes held by every connection.
    pub buffered: AtomicUsize,
    pub slots: Mutex<HashMap<u64, Arc<Slot>>>,
    pub closed: Closed,
}

impl<S: Store> ServerState<S> {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// At `max_clients`: closes the connection idle the longest, if one may go.
    fn evict_idle(&self) -> bool {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let cutoff = self
            .now_ms()
            .saturating_sub(MIN_IDLE_TO_EVICT.as_millis() as u64);
        let oldest = slots
            .values()
            .filter(|s| !s.busy.load(Ordering::Relaxed))
            .map(|s| (s.last_read_ms.load(Ordering::Relaxed), s))
            .filter(|(t, _)| *t <= cutoff)
            .min_by_key(|(t, _)| *t);
        match oldest {
            Some((_, s)) => {
                s.evict.notify_one();
                self.closed.evicted.fetch_add(1, Ordering::Relaxed);
                true
            }
            None => false,
        }
    }
}

/// What a [`RespServer`] handle reaches of its server, whatever its store.
trait Control: Send + Sync {
    fn addr(&self) -> SocketAddr;
    fn clients(&self) -> usize;
    fn stop(&self);
}

impl<S: Store> Control for ServerState<S> {
    fn addr(&self) -> SocketAddr {
        self.addr
    }

    fn clients(&self) -> usize {
        self.clients.load(Ordering::Relaxed)
    }

    fn stop(&self) {
        let _ = self.stop.send(true);
    }
}

/// A running RESP front. It runs until [`RespServer::stop`] or until its store's node stops.
pub struct RespServer {
    state: Arc<dyn Control>,
}

impl std::fmt::Debug for RespServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RespServer({})", self.state.addr())
    }
}

impl RespServer {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.state.addr()
    }

    /// Connections open now.
    pub fn clients(&self) -> usize {
        self.state.clients()
    }

    /// Stops accepting and closes every connection.
    pub fn stop(&self) {
        self.state.stop();
    }
}

/// Binds `addr` and serves the Redis protocol for `store`.
pub async fn serve<S: Store>(
    store: Arc<S>,
    addr: SocketAddr,
    config: RespConfig,
) -> std::io::Result<RespServer> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let (stop, stop_rx) = watch::channel(false);
    let state = Arc::new(ServerState {
        stop,
        store,
        config,
        addr,
        clients: AtomicUsize::new(0),
        connections: AtomicU64::new(0),
        commands: AtomicU64::new(0),
        started: Instant::now(),
        buffered: AtomicUsize::new(0),
        slots: Mutex::new(HashMap::new()),
        closed: Closed::default(),
    });
    tracing::info!(%addr, node = %state.store.node_name(), "RESP front listening");
    tokio::spawn(accept(listener, state.clone(), stop_rx));
    Ok(RespServer { state })
}

async fn accept<S: Store>(
    listener: TcpListener,
    state: Arc<ServerState<S>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut check = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = check.tick() => {
                if state.store.stopped() {
                    let _ = state.stop.send(true);
                    break;
                }
            }
            res = listener.accept() => match res {
                Ok((mut sock, peer)) => {
                    let id = state.connections.fetch_add(1, Ordering::Relaxed) + 1;
                    if state.clients.load(Ordering::Relaxed) >= state.config.max_clients
                        && !state.evict_idle()
                    {
                        state.closed.refused.fetch_add(1, Ordering::Relaxed);
                        let _ = sock.write_all(b"-ERR max number of clients reached\r\n").await;
                        continue;
                    }
                    state.clients.fetch_add(1, Ordering::Relaxed);
                    let slot = Arc::new(Slot {
                        last_read_ms: AtomicU64::new(state.now_ms()),
                        busy: AtomicBool::new(false),
                        evict: Notify::new(),
                    });
                    state
                        .slots
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(id, slot.clone());
                    let st = state.clone();
                    let stop = stop.clone();
                    tokio::spawn(async move {
                        let mut held = Held { state: &st, bytes: 0 };
                        if let Err(e) = connection(&st, sock, id, &slot, &mut held, stop).await {
                            tracing::debug!(%peer, error = %e, "RESP connection ended");
                        }
                        drop(held);
                        st.slots.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
                        st.clients.fetch_sub(1, Ordering::Relaxed);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// The bytes a connection holds, counted in the server's total (given back on drop).
struct Held<'a, S> {
    state: &'a ServerState<S>,
    bytes: usize,
}

impl<S: Store> Held<'_, S> {
    /// Sets what the connection holds; `false` if it must be closed (the server is over
    /// `max_buffered` and this connection holds more than its share).
    fn set(&mut self, bytes: usize) -> bool {
        let total = if bytes >= self.bytes {
            self.state
                .buffered
                .fetch_add(bytes - self.bytes, Ordering::Relaxed)
                + (bytes - self.bytes)
        } else {
            self.state
                .buffered
                .fetch_sub(self.bytes - bytes, Ordering::Relaxed)
                - (self.bytes - bytes)
        };
        self.bytes = bytes;
        let max = self.state.config.max_buffered;
        if total <= max {
            return true;
        }
        let clients = self.state.clients.load(Ordering::Relaxed).max(1);
        bytes <= (max / clients).max(MIN_SHARE)
    }
}

impl<S> Drop for Held<'_, S> {
    fn drop(&mut self) {
        self.state.buffered.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// Writes `out` within the idle timeout.
async fn flush<S: Store>(
    state: &ServerState<S>,
    sock: &mut TcpStream,
    out: &mut BytesMut,
) -> std::io::Result<()> {
    let write = sock.write_all(out);
    let r = match state.config.idle_timeout {
        Some(t) => match tokio::time::timeout(t, write).await {
            Ok(r) => r,
            Err(_) => {
                state.closed.idle.fetch_add(1, Ordering::Relaxed);
                Err(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "replies not read within the idle timeout",
                ))
            }
        },
        None => write.await,
    };
    out.clear();
    r
}

const BUFFER_LIMIT: &[u8] = b"-ERR client buffer limit reached\r\n";

/// Encodes `replies` in order (those `CLIENT REPLY` silences left out) and answers whether
/// the connection is done: a reply asked it to close (flushed), or the client holds more than
/// its buffer limit (told so).
async fn emit<S: Store>(
    state: &ServerState<S>,
    sock: &mut TcpStream,
    out: &mut BytesMut,
    conn: &mut commands::ConnState,
    held: &mut Held<'_, S>,
    input: &BytesMut,
    replies: impl IntoIterator<Item = (Reply, bool)>,
) -> std::io::Result<bool> {
    for (reply, close) in replies {
        state.commands.fetch_add(1, Ordering::Relaxed);
        if conn.take_reply() {
            reply.encode(out);
        }
        if !held.set(input.len() + out.len()) {
            state.closed.buffer.fetch_add(1, Ordering::Relaxed);
            let _ = sock.write_all(BUFFER_LIMIT).await;
            return Ok(true);
        }
        if close {
            flush(state, sock, out).await?;
            return Ok(true);
        }
    }
    Ok(false)
}

async fn connection<S: Store>(
    state: &ServerState<S>,
    mut sock: TcpStream,
    id: u64,
    slot: &Slot,
    held: &mut Held<'_, S>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let _ = sock.set_nodelay(true);
    let mut parser = RequestParser::new(state.config.limits.clone());
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut out = BytesMut::with_capacity(16 * 1024);
    let mut conn = commands::ConnState {
        id,
        ..Default::default()
    };
    let max_reads = state.config.max_batch.max(1);
    let mut reads: Vec<Vec<Bytes>> = Vec::new();
    loop {
        slot.busy.store(true, Ordering::Relaxed);
        loop {
            let next = match parser.next(&mut input) {
                Ok(Some(args)) if commands::is_read(&args) && reads.len() < max_reads => {
                    reads.push(args);
                    continue;
                }
                other => other,
            };
            // Anything else waits for the reads before it, and their replies are taken before
            // it runs: a `CLIENT REPLY` after them must not change whether they are answered.
            let replies: Vec<(Reply, bool)> = futures::stream::iter(reads.drain(..))
                .map(|args| async { (commands::execute_read(state, args).await, false) })
                .buffered(max_reads)
                .collect()
                .await;
            if emit(state, &mut sock, &mut out, &mut conn, held, &input, replies).await? {
                return Ok(());
            }
            let (mut end, mut failed) = (false, None);
            match next {
                Ok(Some(args)) if commands::is_read(&args) => reads.push(args),
                Ok(Some(args)) => {
                    let reply = commands::execute(state, &mut conn, args).await;
                    if emit(state, &mut sock, &mut out, &mut conn, held, &input, [reply]).await? {
                        return Ok(());
                    }
                }
                Ok(None) => end = true,
                Err(e) => failed = Some(e),
            }
            if let Some(e) = failed {
                Reply::err(e.to_string()).encode(&mut out);
                return flush(state, &mut sock, &mut out).await;
            }
            if out.len() >= state.config.write_batch {
                flush(state, &mut sock, &mut out).await?;
            }
            if end {
                break;
            }
        }
        if !out.is_empty() {
            flush(state, &mut sock, &mut out).await?;
        }
        if input.is_empty() && input.capacity() > 64 * 1024 {
            // A large request went through: do not keep its buffer for an idle connection.
            input = BytesMut::with_capacity(16 * 1024);
        } else if input.capacity() - input.len() < 4096 {
            input.reserve(16 * 1024);
        }
        held.set(input.len());
        slot.busy.store(false, Ordering::Relaxed);
        let idle = async {
            match state.config.idle_timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            r = sock.read_buf(&mut input) => {
                if r? == 0 {
                    return Ok(());
                }
                slot.last_read_ms.store(state.now_ms(), Ordering::Relaxed);
                if !held.set(input.len()) {
                    state.closed.buffer.fetch_add(1, Ordering::Relaxed);
                    let _ = sock.write_all(BUFFER_LIMIT).await;
                    return Ok(());
                }
            }
            _ = idle => {
                state.closed.idle.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            _ = slot.evict.notified() => return Ok(()),
            _ = stop.changed() => return Ok(()),
        }
    }
}
