//! The Maquis side of `maquis-bench micro`: a server that hosts partner actors and a client
//! whose actors each send messages to their partner and wait for the acknowledgement (closed
//! loop).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use maquis::{ActorRef, Config, Node, ReplyTo};
use serde::{Deserialize, Serialize};

use crate::stats::{cpu_seconds, RunResult};

/// One benchmark message: the payload, whether to echo it, where to answer.
#[derive(Debug, Serialize, Deserialize)]
pub struct Ping {
    /// The payload (shared with the received frame, not copied).
    #[serde(with = "maquis::payload::shared")]
    pub payload: Bytes,
    /// Send the payload back (else a small acknowledgement).
    pub echo: bool,
    /// Where the answer goes.
    pub reply: ReplyTo<maquis::Payload>,
}

/// Node options shared by both roles.
#[derive(Args, Debug, Clone)]
pub struct NodeOpts {
    /// Listen address.
    #[arg(long)]
    pub listen: SocketAddr,
    /// Lanes per peer.
    #[arg(long, default_value_t = 1)]
    pub parallelism: u16,
    /// on or off.
    #[arg(long, default_value = "off")]
    pub affinity: String,
    /// Cluster secret.
    #[arg(long, default_value = "maquis-bench")]
    pub cookie: String,
    /// TLS on every lane, with the certificates of this directory: `ca.crt`, and
    /// `<node name>.crt` and `.key` (`crate::certs` writes them).
    #[arg(long)]
    pub tls_dir: Option<std::path::PathBuf>,
}

impl NodeOpts {
    fn config(&self, name: &str) -> Result<Config, String> {
        let affinity = maquis::config::parse_switch(&self.affinity).map_err(|e| e.to_string())?;
        let mut c = Config::new(name)
            .listen(self.listen)
            .cookie(self.cookie.clone())
            .parallelism(self.parallelism)
            .affinity(affinity);
        c.transport.lane_queue_bytes = 64 * 1024 * 1024;
        c.node.mailbox_capacity = 256;
        if let Some(dir) = &self.tls_dir {
            c.transport.tls = true;
            c.transport.tls_cert = Some(dir.join(format!("{name}.crt")));
            c.transport.tls_key = Some(dir.join(format!("{name}.key")));
            c.transport.tls_ca = Some(dir.join("ca.crt"));
        }
        Ok(c)
    }
}

/// Options of the server role.
#[derive(Args, Debug)]
pub struct ServerArgs {
    #[command(flatten)]
    node: NodeOpts,
    /// Partner actors to host (named p0, p1, …).
    #[arg(long, default_value_t = 128)]
    actors: usize,
}

/// Options of the client role.
#[derive(Args, Debug)]
pub struct ClientArgs {
    #[command(flatten)]
    node: NodeOpts,
    #[command(flatten)]
    load: crate::stats::LoadArgs,
}

/// Runs the server until stdin closes; prints `ready` once it serves, and `cpu <seconds>` (its
/// CPU time so far) for every line it reads on stdin.
pub async fn server(args: ServerArgs) -> Result<(), String> {
    let node = Node::start(args.node.config("bench-server")?)
        .await
        .map_err(|e| e.to_string())?;
    for i in 0..args.actors {
        let partner = node.spawn_fn(|mut inbox: maquis::Inbox<Ping>| async move {
            while let Some(Ping {
                payload,
                echo,
                reply,
            }) = inbox.recv().await
            {
                let back = if echo {
                    payload
                } else {
                    Bytes::from_static(b"ok")
                };
                let _ = reply.send(back.into()).await;
            }
        });
        node.register(&format!("p{i}"), &partner)
            .map_err(|e| e.to_string())?;
    }
    println!("ready {}", node.addr());
    serve_stdin().await;
    node.shutdown().await;
    Ok(())
}

/// Answers every line on stdin with `cpu <seconds>`; returns when stdin closes.
pub async fn serve_stdin() {
    use std::io::Write;
    use tokio::io::AsyncBufReadExt;
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Ok(Some(_)) = lines.next_line().await {
        println!("cpu {:.6}", cpu_seconds());
        let _ = std::io::stdout().flush();
    }
}

/// Runs one closed-loop measurement and prints its `RunResult` as one JSON line.
pub async fn client(args: ClientArgs) -> Result<(), String> {
    let node = Node::start(args.node.config("bench-client")?)
        .await
        .map_err(|e| e.to_string())?;
    node.join_wait(args.load.server, Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lanes = node.lanes_connected("bench-server");
        if !lanes.is_empty() && lanes.iter().all(|(_, up, want)| up == want) {
            break;
        }
        if Instant::now() > deadline {
            return Err("lanes to the server did not all connect".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let payload = Bytes::from(vec![0x42u8; args.load.size]);
    let affinity = maquis::config::parse_switch(&args.node.affinity).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let measure_from = start + Duration::from_secs_f64(args.load.warmup_s);
    let stop_at = measure_from + Duration::from_secs_f64(args.load.limit_s);
    let mut waits = Vec::new();
    for i in 0..args.load.actors {
        let partner: ActorRef<Ping> = node
            .remote("bench-server", &format!("p{i}"))
            .ok_or("the server is not a member")?;
        let payload = payload.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let (messages, echo) = (args.load.messages, args.load.echo);
        // With affinity, actor i keys its messages with i (PARTISAN's partition keys): the
        // actors spread evenly over the lanes, and each pair keeps one lane both ways.
        let opts = if affinity {
            maquis::SendOpts::default().partition(i as u64)
        } else {
            maquis::SendOpts::default()
        };
        node.spawn_fn(move |_inbox: maquis::Inbox<()>| async move {
            let mut lat = Vec::with_capacity(messages as usize);
            let mut errors = 0;
            while (lat.len() as u64) < messages {
                let t = Instant::now();
                if t >= stop_at {
                    break;
                }
                let r = partner
                    .call_with(
                        |reply| Ping {
                            payload: payload.clone(),
                            echo,
                            reply,
                        },
                        Duration::from_secs(60),
                        &opts,
                    )
                    .await;
                match r {
                    Ok(_) if t >= measure_from => lat.push(t.elapsed().as_micros() as u64),
                    Ok(_) => {}
                    Err(_) => errors += 1,
                }
            }
            let _ = tx.send((lat, errors, Instant::now()));
        });
        waits.push(rx);
    }
    tokio::time::sleep_until(measure_from.into()).await;
    let cpu0 = cpu_seconds();
    let mut all = Vec::new();
    let mut errors = 0;
    let mut end = measure_from;
    for w in waits {
        let (lat, e, done) = w.await.map_err(|_| "a client actor died")?;
        all.extend(lat);
        errors += e;
        end = end.max(done);
    }
    let seconds = end.duration_since(measure_from).as_secs_f64();
    let cpu = cpu_seconds() - cpu0;
    let result = RunResult::from_latencies(all, errors, seconds, cpu);
    println!(
        "{}",
        serde_json::to_string(&result).map_err(|e| e.to_string())?
    );
    node.shutdown().await;
    Ok(())
}
