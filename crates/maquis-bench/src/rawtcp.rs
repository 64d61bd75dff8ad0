//! The `raw-tcp` ceiling of `maquis-bench micro`: the same workloads over plain TCP
//! connections, no runtime. Frame: `[u32 length][u32 actor][u8 kind][payload]`, kind 0 a call
//! answered with "ok", 1 a call answered with the payload, 2 one-way data (counted), 3 a
//! request for that count; the answer is `[u32 length][u32 actor][body]` (the count as a
//! big-endian u64).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::Buf;
use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Mutex};
use tokio::task::JoinHandle;

use crate::stats::{cpu_seconds, merge_calls, Calls, LoadArgs, Mode, RunResult, Streamed, Window};

/// Largest frame either side accepts.
const MAX_FRAME: usize = 64 * 1024 * 1024;

/// Options of the raw TCP server.
#[derive(Args, Debug)]
pub struct RawServerArgs {
    /// Listen address.
    #[arg(long)]
    listen: SocketAddr,
}

/// Options of the raw TCP client.
#[derive(Args, Debug)]
pub struct RawClientArgs {
    /// Connections (actor i uses connection i % conns).
    #[arg(long, default_value_t = 16)]
    conns: usize,
    #[command(flatten)]
    load: crate::stats::LoadArgs,
}

async fn read_frame(r: &mut (impl AsyncReadExt + Unpin), buf: &mut Vec<u8>) -> std::io::Result<()> {
    let len = r.read_u32().await? as usize;
    if len > MAX_FRAME {
        return Err(std::io::Error::other(format!("frame of {len} bytes")));
    }
    buf.resize(len, 0);
    r.read_exact(buf).await?;
    Ok(())
}

/// Serves connections until stdin closes; prints `ready`, and `cpu <seconds>` for every line on
/// stdin.
pub async fn server(args: RawServerArgs) -> Result<(), String> {
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    println!("ready {addr}");
    let accept = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(serve_conn(s));
        }
    });
    crate::agent::serve_stdin().await;
    accept.abort();
    Ok(())
}

/// The kind byte of a client frame.
const CALL: u8 = 0;
const CALL_ECHO: u8 = 1;
/// One-way, counted.
const DATA: u8 = 2;
/// Asks for the count of `DATA` frames of this actor on this connection.
const COUNT: u8 = 3;

async fn serve_conn(s: TcpStream) {
    let (mut r, mut w) = s.into_split();
    let mut buf = Vec::new();
    // `DATA` frames per actor; actors past the partners a server has are not counted.
    let mut counts = vec![0u64; crate::micro::PARTNERS];
    while read_frame(&mut r, &mut buf).await.is_ok() {
        if buf.len() < 5 {
            return;
        }
        let actor = &buf[0..4];
        let index = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let count;
        let body: &[u8] = match buf[4] {
            CALL => b"ok",
            CALL_ECHO => &buf[5..],
            DATA => {
                if let Some(c) = counts.get_mut(index) {
                    *c += 1;
                }
                continue;
            }
            COUNT => {
                count = counts.get(index).copied().unwrap_or(0).to_be_bytes();
                &count
            }
            _ => return,
        };
        let mut head = Vec::with_capacity(8);
        head.extend_from_slice(&((4 + body.len()) as u32).to_be_bytes());
        head.extend_from_slice(actor);
        if w.write_all_buf(&mut Buf::chain(&head[..], body))
            .await
            .is_err()
        {
            return;
        }
    }
}

/// Runs one measurement in the mode `--mode` asks for and prints its `RunResult` as one JSON
/// line.
pub async fn client(args: RawClientArgs) -> Result<(), String> {
    let load = &args.load;
    if args.conns == 0 || load.actors == 0 {
        return Err("--conns and --actors must be positive".into());
    }
    let bulk = if load.mode == Mode::Mixed {
        load.bulk_actors
    } else {
        0
    };
    // Per actor, the channel its replies (a count, or 0) arrive on.
    let mut reply_txs = Vec::new();
    let mut reply_rxs = Vec::new();
    for _ in 0..load.actors + bulk {
        let (tx, rx) = mpsc::channel::<u64>(1);
        reply_txs.push(tx);
        reply_rxs.push(Some(rx));
    }
    let reply_txs = Arc::new(reply_txs);
    let mut writers = Vec::new();
    for _ in 0..args.conns {
        let s = TcpStream::connect(load.server)
            .await
            .map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        let (r, w) = s.into_split();
        tokio::spawn(read_replies(r, reply_txs.clone()));
        writers.push(Arc::new(Mutex::new(w)));
    }
    let mut raw = Raw {
        writers,
        replies: reply_rxs,
    };
    let payload = Arc::new(vec![0x42u8; load.size]);
    let result = match load.mode {
        Mode::Rtt => raw.calls(0..load.actors, payload, load).await?,
        Mode::Stream => raw.stream(payload, load).await?,
        Mode::Mixed => {
            let cpu0 = cpu_seconds();
            let alone = raw.calls(0..load.actors, payload.clone(), load).await?;
            let window = Window::after_warmup(load);
            let bulk_payload = Arc::new(vec![0x42u8; load.bulk_size]);
            let bulk = raw.callers(
                load.actors..load.actors + bulk,
                bulk_payload,
                load.echo,
                u64::MAX,
                window,
            )?;
            let calls = raw.callers(0..load.actors, payload, load.echo, load.messages, window)?;
            let calls = raw.gather(calls, window).await?;
            let bulk = raw.gather(bulk, window).await?;
            RunResult::mixed(alone, calls, bulk, window, cpu_seconds() - cpu0)
        }
    };
    println!(
        "{}",
        serde_json::to_string(&result).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// A running caller: it hands back its actor index and reply channel with what it measured.
type Caller = JoinHandle<(usize, mpsc::Receiver<u64>, Calls)>;

/// The client's connections and each actor's reply channel (lent to its task, given back).
struct Raw {
    writers: Vec<Arc<Mutex<OwnedWriteHalf>>>,
    replies: Vec<Option<mpsc::Receiver<u64>>>,
}

/// Writes one frame: length, actor, kind, payload (one vectored write).
async fn write_frame(
    w: &Mutex<OwnedWriteHalf>,
    actor: usize,
    kind: u8,
    payload: &[u8],
) -> std::io::Result<()> {
    let mut head = [0u8; 9];
    head[0..4].copy_from_slice(&((5 + payload.len()) as u32).to_be_bytes());
    head[4..8].copy_from_slice(&(actor as u32).to_be_bytes());
    head[8] = kind;
    w.lock()
        .await
        .write_all_buf(&mut Buf::chain(&head[..], payload))
        .await
}

impl Raw {
    /// Actor `i`'s connection and reply channel.
    fn lend(
        &mut self,
        i: usize,
    ) -> Result<(Arc<Mutex<OwnedWriteHalf>>, mpsc::Receiver<u64>), String> {
        let rx = self
            .replies
            .get_mut(i)
            .and_then(Option::take)
            .ok_or("an actor's replies are already taken")?;
        Ok((self.writers[i % self.writers.len()].clone(), rx))
    }

    /// One closed-loop measurement of the actors `actors` after a warm-up.
    async fn calls(
        &mut self,
        actors: std::ops::Range<usize>,
        payload: Arc<Vec<u8>>,
        load: &LoadArgs,
    ) -> Result<RunResult, String> {
        let window = Window::after_warmup(load);
        let tasks = self.callers(actors, payload, load.echo, load.messages, window)?;
        tokio::time::sleep_until(window.from.into()).await;
        let cpu0 = cpu_seconds();
        let calls = self.gather(tasks, window).await?;
        Ok(RunResult::of_calls(calls, window, cpu_seconds() - cpu0))
    }

    /// Starts one closed-loop caller per actor in `actors`.
    fn callers(
        &mut self,
        actors: std::ops::Range<usize>,
        payload: Arc<Vec<u8>>,
        echo: bool,
        messages: u64,
        window: Window,
    ) -> Result<Vec<Caller>, String> {
        let mut tasks = Vec::new();
        for i in actors {
            let (w, mut rx) = self.lend(i)?;
            let payload = payload.clone();
            let kind = if echo { CALL_ECHO } else { CALL };
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(messages.min(1 << 16) as usize);
                let mut failed = 0u64;
                while (lat.len() as u64) < messages {
                    let t = Instant::now();
                    if t >= window.until {
                        break;
                    }
                    if write_frame(&w, i, kind, &payload).await.is_err()
                        || rx.recv().await.is_none()
                    {
                        failed += 1;
                        break;
                    }
                    if t >= window.from {
                        lat.push(t.elapsed().as_micros() as u64);
                    }
                }
                (i, rx, (lat, failed, Instant::now()))
            }));
        }
        Ok(tasks)
    }

    /// Waits for callers and takes their reply channels back.
    async fn gather(&mut self, tasks: Vec<Caller>, window: Window) -> Result<Calls, String> {
        let mut all = Vec::new();
        for t in tasks {
            let (i, rx, calls) = t.await.map_err(|e| e.to_string())?;
            self.replies[i] = Some(rx);
            all.push(calls);
        }
        Ok(merge_calls(all, window))
    }

    /// One-way: every actor writes `DATA` frames as fast as its connection takes them; the
    /// server's counts, asked for when measuring starts and after the window, give what was
    /// delivered in between (a connection is in order).
    async fn stream(
        &mut self,
        payload: Arc<Vec<u8>>,
        load: &LoadArgs,
    ) -> Result<RunResult, String> {
        let window = Window::after_warmup(load);
        let mut tasks = Vec::new();
        for i in 0..load.actors {
            let (w, mut rx) = self.lend(i)?;
            let payload = payload.clone();
            tasks.push(tokio::spawn(async move {
                let io = |e: std::io::Error| e.to_string();
                while Instant::now() < window.from {
                    write_frame(&w, i, DATA, &payload).await.map_err(io)?;
                }
                write_frame(&w, i, COUNT, &[]).await.map_err(io)?;
                let before = rx.recv().await.ok_or("connection lost")?;
                let from = Instant::now();
                let mut sent = 0u64;
                while Instant::now() < window.until {
                    write_frame(&w, i, DATA, &payload).await.map_err(io)?;
                    sent += 1;
                }
                write_frame(&w, i, COUNT, &[]).await.map_err(io)?;
                let after = rx.recv().await.ok_or("connection lost")?;
                Ok::<_, String>(Streamed {
                    delivered: after.saturating_sub(before),
                    missing: sent.saturating_sub(after.saturating_sub(before)),
                    from,
                    until: Instant::now(),
                })
            }));
        }
        tokio::time::sleep_until(window.from.into()).await;
        let cpu0 = cpu_seconds();
        let mut streams = Vec::new();
        for t in tasks {
            streams.push(t.await.map_err(|e| e.to_string())??);
        }
        Ok(RunResult::of_streams(streams, cpu_seconds() - cpu0))
    }
}

async fn read_replies(mut r: OwnedReadHalf, replies: Arc<Vec<mpsc::Sender<u64>>>) {
    let mut buf = Vec::new();
    while read_frame(&mut r, &mut buf).await.is_ok() {
        if buf.len() < 4 {
            return;
        }
        let actor = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        let count = match buf[4..].try_into() {
            Ok(c) => u64::from_be_bytes(c),
            Err(_) => 0,
        };
        if let Some(tx) = replies.get(actor) {
            let _ = tx.send(count).await;
        }
    }
}
