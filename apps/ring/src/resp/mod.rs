//! The Redis-protocol (RESP2) front: `redis-cli` and `redis-benchmark` against any node.
//!
//! Supported: `PING`, `ECHO`, `GET`, `SET key value` (no options), `DEL`, `EXISTS`, `MGET`,
//! `MSET`, `INFO [section]`, `COMMAND [COUNT|DOCS|INFO]`, `CLIENT
//! SETNAME|GETNAME|ID|SETINFO|INFO|LIST`, `SELECT 0`, `QUIT`, `CONFIG GET save|appendonly`,
//! `HELLO [2]`. Anything else is answered `-ERR unknown command …` and the connection stays
//! open. A request that cannot be framed (bad lengths, garbage, sizes over the [`Limits`]) is
//! answered `-ERR Protocol error: …` and the connection is closed, as Redis does.
//!
//! Requests are pipelined: every complete request in the input is executed, in order, and the
//! replies are written together. Multi-key commands run their keys concurrently (up to
//! `max_batch` at once); `MSET` is not atomic.

mod commands;
mod info;
pub mod parser;
pub mod reply;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub use commands::COMMANDS;
pub use parser::{Limits, ProtocolError, RequestParser};
pub use reply::Reply;

use crate::error::RingError;
use crate::node::RingNode;

/// Settings of the RESP front.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RespConfig {
    /// Request size limits.
    pub limits: Limits,
    /// Connections served at once; further ones are answered
    /// `-ERR max number of clients reached` and closed. Default 10,000.
    pub max_clients: usize,
    /// Keys of one multi-key command (`MGET`, `MSET`, `DEL`, `EXISTS`) in flight at once.
    /// Default 64.
    pub max_batch: usize,
    /// Replies buffered before they are written out mid-pipeline, in bytes. Default 64 KiB.
    pub write_batch: usize,
}

impl Default for RespConfig {
    fn default() -> Self {
        RespConfig {
            limits: Limits::default(),
            max_clients: 10_000,
            max_batch: 64,
            write_batch: 64 * 1024,
        }
    }
}

pub(crate) struct ServerState {
    pub ring: RingNode,
    pub config: RespConfig,
    pub addr: SocketAddr,
    pub clients: AtomicUsize,
    pub connections: AtomicU64,
    pub commands: AtomicU64,
    pub started: Instant,
    pub stop: watch::Sender<bool>,
}

/// A running RESP front. It runs until [`RespServer::stop`] or until its node stops.
pub struct RespServer {
    state: Arc<ServerState>,
}

impl std::fmt::Debug for RespServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RespServer({})", self.state.addr)
    }
}

impl RespServer {
    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.state.addr
    }

    /// Connections open now.
    pub fn clients(&self) -> usize {
        self.state.clients.load(Ordering::Relaxed)
    }

    /// Stops accepting and closes every connection.
    pub fn stop(&self) {
        let _ = self.state.stop.send(true);
    }
}

/// Binds `addr` and serves the Redis protocol for `ring`.
pub async fn serve(
    ring: RingNode,
    addr: SocketAddr,
    config: RespConfig,
) -> Result<RespServer, RingError> {
    let listener = TcpListener::bind(addr).await?;
    let addr = listener.local_addr()?;
    let (stop, stop_rx) = watch::channel(false);
    let state = Arc::new(ServerState {
        stop,
        ring,
        config,
        addr,
        clients: AtomicUsize::new(0),
        connections: AtomicU64::new(0),
        commands: AtomicU64::new(0),
        started: Instant::now(),
    });
    tracing::info!(%addr, node = %state.ring.name(), "RESP front listening");
    tokio::spawn(accept(listener, state.clone(), stop_rx));
    Ok(RespServer { state })
}

async fn accept(listener: TcpListener, state: Arc<ServerState>, mut stop: watch::Receiver<bool>) {
    let mut check = tokio::time::interval(Duration::from_millis(500));
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = check.tick() => {
                if state.ring.node().is_stopped() {
                    let _ = state.stop.send(true);
                    break;
                }
            }
            res = listener.accept() => match res {
                Ok((mut sock, peer)) => {
                    let id = state.connections.fetch_add(1, Ordering::Relaxed) + 1;
                    if state.clients.load(Ordering::Relaxed) >= state.config.max_clients {
                        let _ = sock.write_all(b"-ERR max number of clients reached\r\n").await;
                        continue;
                    }
                    state.clients.fetch_add(1, Ordering::Relaxed);
                    let st = state.clone();
                    let stop = stop.clone();
                    tokio::spawn(async move {
                        if let Err(e) = connection(&st, sock, id, stop).await {
                            tracing::debug!(%peer, error = %e, "RESP connection ended");
                        }
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

async fn connection(
    state: &ServerState,
    mut sock: TcpStream,
    id: u64,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let _ = sock.set_nodelay(true);
    let mut parser = RequestParser::new(state.config.limits.clone());
    let mut input = BytesMut::with_capacity(16 * 1024);
    let mut out = BytesMut::with_capacity(16 * 1024);
    let mut conn = commands::ConnState { id, name: None };
    loop {
        loop {
            match parser.next(&mut input) {
                Ok(Some(args)) => {
                    let (reply, close) = commands::execute(state, &mut conn, args).await;
                    state.commands.fetch_add(1, Ordering::Relaxed);
                    reply.encode(&mut out);
                    if close {
                        sock.write_all(&out).await?;
                        return Ok(());
                    }
                    if out.len() >= state.config.write_batch {
                        sock.write_all(&out).await?;
                        out.clear();
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    Reply::err(e.to_string()).encode(&mut out);
                    sock.write_all(&out).await?;
                    return Ok(());
                }
            }
        }
        if !out.is_empty() {
            sock.write_all(&out).await?;
            out.clear();
        }
        if input.capacity() - input.len() < 4096 {
            input.reserve(16 * 1024);
        }
        tokio::select! {
            r = sock.read_buf(&mut input) => {
                if r? == 0 {
                    return Ok(());
                }
            }
            _ = stop.changed() => return Ok(()),
        }
    }
}
