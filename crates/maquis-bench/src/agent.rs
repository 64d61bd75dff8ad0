//! The Maquis side of `maquis-bench micro`: a server that hosts partner actors and a client
//! whose actors each send messages to their partner, in one of the [`Mode`]s: waiting for the
//! acknowledgement (closed loop), one-way, or closed loop beside bulk transfers.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Args;
use maquis::{ActorRef, Config, Node, ReplyTo};
use serde::{Deserialize, Serialize};

use crate::stats::{
    cpu_seconds, merge_calls, Calls, LaneTally, LaneUse, LoadArgs, Mode, RunResult, Streamed,
    Window, LANE_SAMPLE,
};

/// The name of `micro`'s server node.
const SERVER: &str = "bench-server";

/// What a client actor sends its partner.
#[derive(Debug, Serialize, Deserialize)]
pub enum Micro {
    /// A call: the partner answers with the payload (`echo`) or a small acknowledgement.
    Ping {
        /// The payload (shared with the received frame, not copied).
        #[serde(with = "maquis::payload::shared")]
        payload: Bytes,
        /// Send the payload back.
        echo: bool,
        /// Where the answer goes.
        reply: ReplyTo<maquis::Payload>,
    },
    /// One-way: the partner counts it.
    Data {
        /// The payload.
        #[serde(with = "maquis::payload::shared")]
        payload: Bytes,
    },
    /// The partner answers with how many `Data` it has had (where a pair's messages keep their
    /// order, that counts every `Data` sent before the question).
    Count {
        /// Where the count goes.
        reply: ReplyTo<u64>,
    },
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
    /// `transport.part_bytes` (else the default).
    #[arg(long)]
    pub part_bytes: Option<usize>,
    /// `transport.unsent_bytes` (else the default).
    #[arg(long)]
    pub unsent_bytes: Option<usize>,
    /// `transport.stripe_bytes` (else the default; 0: lanes picked by key for every frame).
    #[arg(long)]
    pub stripe_bytes: Option<usize>,
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
        if let Some(p) = self.part_bytes {
            c.transport.part_bytes = p;
        }
        if let Some(u) = self.unsent_bytes {
            c.transport.unsent_bytes = u;
        }
        if let Some(b) = self.stripe_bytes {
            c.transport.stripe_bytes = b;
        }
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
    let node = Node::start(args.node.config(SERVER)?)
        .await
        .map_err(|e| e.to_string())?;
    for i in 0..args.actors {
        let partner = node.spawn_fn(|mut inbox: maquis::Inbox<Micro>| async move {
            let mut count = 0u64;
            while let Some(m) = inbox.recv().await {
                match m {
                    Micro::Ping {
                        payload,
                        echo,
                        reply,
                    } => {
                        let back = if echo {
                            payload
                        } else {
                            Bytes::from_static(b"ok")
                        };
                        let _ = reply.send(back.into()).await;
                    }
                    Micro::Data { .. } => count += 1,
                    Micro::Count { reply } => {
                        let _ = reply.send(count).await;
                    }
                }
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

/// Runs one measurement in the mode `--mode` asks for and prints its `RunResult` as one JSON
/// line.
pub async fn client(args: ClientArgs) -> Result<(), String> {
    let node = Node::start(args.node.config("bench-client")?)
        .await
        .map_err(|e| e.to_string())?;
    node.join_wait(args.load.server, Duration::from_secs(10))
        .await
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lanes = node.lanes_connected(SERVER);
        if !lanes.is_empty() && lanes.iter().all(|(_, up, want)| up == want) {
            break;
        }
        if Instant::now() > deadline {
            return Err("lanes to the server did not all connect".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let affinity = maquis::config::parse_switch(&args.node.affinity).map_err(|e| e.to_string())?;
    let load = &args.load;
    let bench = Bench {
        node: &node,
        affinity,
    };
    let payload = Bytes::from(vec![0x42u8; load.size]);
    let result = match load.mode {
        Mode::Rtt => bench.calls(0..load.actors, payload, load).await?,
        Mode::Stream => bench.stream(payload, load).await?,
        Mode::Mixed => {
            let cpu0 = cpu_seconds();
            let alone = bench.calls(0..load.actors, payload.clone(), load).await?;
            let window = Window::after_warmup(load);
            let bulk = bench.callers(
                load.actors..load.actors + load.bulk_actors,
                Bytes::from(vec![0x42u8; load.bulk_size]),
                load.echo,
                u64::MAX,
                window,
            )?;
            let calls = bench.callers(0..load.actors, payload, load.echo, load.messages, window)?;
            let (calls, lanes) = bench.sampled(window, gather(calls, window)).await;
            let bulk = gather(bulk, window).await?;
            let mut r = RunResult::mixed(alone, calls?, bulk, window, cpu_seconds() - cpu0);
            r.lanes = lanes;
            r
        }
    };
    println!(
        "{}",
        serde_json::to_string(&result).map_err(|e| e.to_string())?
    );
    node.shutdown().await;
    Ok(())
}

/// A client node and how its actors address their partners.
struct Bench<'a> {
    node: &'a Node,
    affinity: bool,
}

impl Bench<'_> {
    fn partner(&self, i: usize) -> Result<(ActorRef<Micro>, maquis::SendOpts), String> {
        let partner = self
            .node
            .remote(SERVER, &format!("p{i}"))
            .ok_or("the server is not a member")?;
        // With affinity, actor i keys its messages with i (PARTISAN's partition keys): the
        // actors spread evenly over the lanes, and each pair keeps one lane both ways.
        let opts = if self.affinity {
            maquis::SendOpts::default().partition(i as u64)
        } else {
            maquis::SendOpts::default()
        };
        Ok((partner, opts))
    }

    /// One closed-loop measurement of the callers `partners` after a warm-up.
    async fn calls(
        &self,
        partners: std::ops::Range<usize>,
        payload: Bytes,
        load: &LoadArgs,
    ) -> Result<RunResult, String> {
        let window = Window::after_warmup(load);
        let waits = self.callers(partners, payload, load.echo, load.messages, window)?;
        tokio::time::sleep_until(window.from.into()).await;
        let cpu0 = cpu_seconds();
        let (calls, lanes) = self.sampled(window, gather(waits, window)).await;
        let mut r = RunResult::of_calls(calls?, window, cpu_seconds() - cpu0);
        r.lanes = lanes;
        Ok(r)
    }

    /// Runs `work`, looking at what the lanes of the `default` channel to the server carry
    /// every [`LANE_SAMPLE`] from the start of `window` to its end (or until `work` is done).
    async fn sampled<T>(
        &self,
        window: Window,
        work: impl std::future::Future<Output = T>,
    ) -> (T, Option<LaneUse>) {
        let mut tally = LaneTally::default();
        let mut tick = tokio::time::interval_at(window.from.into(), LANE_SAMPLE);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        tokio::pin!(work);
        loop {
            tokio::select! {
                out = &mut work => return (out, tally.finish()),
                _ = tick.tick(), if Instant::now() < window.until => {
                    tally.add(&self.node.status(), SERVER, "default");
                }
            }
        }
    }

    /// Spawns one closed-loop caller per partner in `partners`; each makes at most `messages`
    /// measured calls and starts none after the window.
    fn callers(
        &self,
        partners: std::ops::Range<usize>,
        payload: Bytes,
        echo: bool,
        messages: u64,
        window: Window,
    ) -> Result<Vec<tokio::sync::oneshot::Receiver<Calls>>, String> {
        let mut waits = Vec::new();
        for i in partners {
            let (partner, opts) = self.partner(i)?;
            let payload = payload.clone();
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.node
                .spawn_fn(move |_inbox: maquis::Inbox<()>| async move {
                    let mut lat = Vec::with_capacity(messages.min(1 << 16) as usize);
                    let mut errors = 0;
                    while (lat.len() as u64) < messages {
                        let t = Instant::now();
                        if t >= window.until {
                            break;
                        }
                        let r = partner
                            .call_with(
                                |reply| Micro::Ping {
                                    payload: payload.clone(),
                                    echo,
                                    reply,
                                },
                                Duration::from_secs(60),
                                &opts,
                            )
                            .await;
                        match r {
                            Ok(_) if t >= window.from => lat.push(t.elapsed().as_micros() as u64),
                            Ok(_) => {}
                            Err(_) => errors += 1,
                        }
                    }
                    let _ = tx.send((lat, errors, Instant::now()));
                });
            waits.push(rx);
        }
        Ok(waits)
    }

    /// One-way: every actor sends `Data` to its partner as fast as `send` returns; the
    /// partners' counts, asked for when measuring starts and once everything sent has arrived,
    /// give what was delivered in between.
    async fn stream(&self, payload: Bytes, load: &LoadArgs) -> Result<RunResult, String> {
        let window = Window::after_warmup(load);
        let mut waits = Vec::new();
        for i in 0..load.actors {
            let (partner, opts) = self.partner(i)?;
            let payload = payload.clone();
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.node
                .spawn_fn(move |_inbox: maquis::Inbox<()>| async move {
                    let r = stream_to(&partner, &opts, &payload, window).await;
                    let _ = tx.send(r);
                });
            waits.push(rx);
        }
        tokio::time::sleep_until(window.from.into()).await;
        let cpu0 = cpu_seconds();
        let all = async {
            let mut streams = Vec::new();
            for w in waits {
                streams.push(
                    w.await
                        .map_err(|_| "a client actor died")?
                        .map_err(|e| format!("stream: {e}"))?,
                );
            }
            Ok::<_, String>(streams)
        };
        let (streams, lanes) = self.sampled(window, all).await;
        let mut r = RunResult::of_streams(streams?, cpu_seconds() - cpu0);
        r.lanes = lanes;
        Ok(r)
    }
}

async fn stream_to(
    partner: &ActorRef<Micro>,
    opts: &maquis::SendOpts,
    payload: &Bytes,
    window: Window,
) -> Result<Streamed, String> {
    let data = || Micro::Data {
        payload: payload.clone(),
    };
    let count = || async {
        partner
            .call_with(
                |reply| Micro::Count { reply },
                Duration::from_secs(60),
                opts,
            )
            .await
            .map_err(|e| format!("count: {e}"))
    };
    let mut sent = 0u64;
    while Instant::now() < window.from {
        partner
            .send_with(data(), opts)
            .await
            .map_err(|e| format!("send: {e}"))?;
        sent += 1;
    }
    let before = count().await?;
    let from = Instant::now();
    // The count waits behind what the warm-up queued: measuring lasts the window's length
    // from its answer, not to the window's end (which a deep queue could leave behind).
    let until = from + (window.until - window.from);
    while Instant::now() < until {
        partner
            .send_with(data(), opts)
            .await
            .map_err(|e| format!("send: {e}"))?;
        sent += 1;
    }
    // Without a partition key over several lanes (round robin) the question may overtake data
    // still on its way: ask again until everything sent has arrived, or the time is up (what
    // never arrives counts as not delivered).
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut after = count().await?;
    while after < sent && Instant::now() < give_up {
        after = count().await?;
    }
    Ok(Streamed {
        missing: sent.saturating_sub(after),
        delivered: after.saturating_sub(before),
        from,
        until: Instant::now(),
    })
}

/// Waits for every caller; their latencies, failures, and when the last one stopped.
async fn gather(
    waits: Vec<tokio::sync::oneshot::Receiver<Calls>>,
    window: Window,
) -> Result<Calls, String> {
    let mut all = Vec::new();
    for w in waits {
        all.push(w.await.map_err(|_| "a client actor died")?);
    }
    Ok(merge_calls(all, window))
}
