//! The `raw-tcp` ceiling of `maquis-bench micro`: the same closed-loop workload over plain TCP
//! connections, no runtime. Frame: `[u32 length][u32 actor][u8 echo][payload]`; the reply is
//! `[u32 length][u32 actor][payload or "ok"]`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedReadHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Mutex};

use crate::stats::{cpu_seconds, RunResult};

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
    println!("ready {}", args.listen);
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

async fn serve_conn(s: TcpStream) {
    let (mut r, mut w) = s.into_split();
    let mut buf = Vec::new();
    while read_frame(&mut r, &mut buf).await.is_ok() {
        if buf.len() < 5 {
            return;
        }
        let actor = &buf[0..4];
        let echo = buf[4] != 0;
        let body: &[u8] = if echo { &buf[5..] } else { b"ok" };
        let mut head = Vec::with_capacity(8);
        head.extend_from_slice(&((4 + body.len()) as u32).to_be_bytes());
        head.extend_from_slice(actor);
        if w.write_all(&head).await.is_err() || w.write_all(body).await.is_err() {
            return;
        }
    }
}

/// Runs one closed-loop measurement and prints its `RunResult` as one JSON line.
pub async fn client(args: RawClientArgs) -> Result<(), String> {
    if args.conns == 0 || args.load.actors == 0 {
        return Err("--conns and --actors must be positive".into());
    }
    // Per actor, the channel its replies arrive on.
    let mut reply_txs = Vec::new();
    let mut reply_rxs = Vec::new();
    for _ in 0..args.load.actors {
        let (tx, rx) = mpsc::channel::<()>(1);
        reply_txs.push(tx);
        reply_rxs.push(rx);
    }
    let reply_txs = Arc::new(reply_txs);
    let mut writers = Vec::new();
    for _ in 0..args.conns {
        let s = TcpStream::connect(args.load.server)
            .await
            .map_err(|e| e.to_string())?;
        s.set_nodelay(true).map_err(|e| e.to_string())?;
        let (r, w) = s.into_split();
        tokio::spawn(read_replies(r, reply_txs.clone()));
        writers.push(Arc::new(Mutex::new(w)));
    }
    let payload = Arc::new(vec![0x42u8; args.load.size]);
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.load.warmup_s);
    let stop_at = measure_from + Duration::from_secs_f64(args.load.limit_s);
    let mut tasks = Vec::new();
    for (i, mut rx) in reply_rxs.into_iter().enumerate() {
        let w = writers[i % args.conns].clone();
        let payload = payload.clone();
        let (messages, echo) = (args.load.messages, args.load.echo);
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(messages as usize);
            let mut failed = 0u64;
            let mut head = Vec::with_capacity(9);
            head.extend_from_slice(&((5 + payload.len()) as u32).to_be_bytes());
            head.extend_from_slice(&(i as u32).to_be_bytes());
            head.push(echo as u8);
            while (lat.len() as u64) < messages {
                let t = Instant::now();
                if t >= stop_at {
                    break;
                }
                {
                    let mut w = w.lock().await;
                    if w.write_all(&head).await.is_err() || w.write_all(&payload).await.is_err() {
                        failed += 1;
                        break;
                    }
                }
                if rx.recv().await.is_none() {
                    failed += 1;
                    break;
                }
                if t >= measure_from {
                    lat.push(t.elapsed().as_micros() as u64);
                }
            }
            (lat, failed, Instant::now())
        }));
    }
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu0 = cpu_seconds();
    let mut all = Vec::new();
    let mut errors = 0;
    let mut end = measure_from;
    for t in tasks {
        let (lat, failed, done) = t.await.map_err(|e| e.to_string())?;
        all.extend(lat);
        errors += failed;
        end = end.max(done);
    }
    let seconds = end.duration_since(measure_from).as_secs_f64();
    let result = RunResult::from_latencies(all, errors, seconds, cpu_seconds() - cpu0);
    println!(
        "{}",
        serde_json::to_string(&result).map_err(|e| e.to_string())?
    );
    Ok(())
}

async fn read_replies(mut r: OwnedReadHalf, replies: Arc<Vec<mpsc::Sender<()>>>) {
    let mut buf = Vec::new();
    while read_frame(&mut r, &mut buf).await.is_ok() {
        if buf.len() < 4 {
            return;
        }
        let actor = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if let Some(tx) = replies.get(actor) {
            let _ = tx.send(()).await;
        }
    }
}
