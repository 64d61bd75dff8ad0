//! `maquis-bench clients`: the memory of a client-server overlay server as clients join and
//! then push state faster than the server can take it, the situation that killed PARTISAN's
//! server at 256 clients (Fig. 9 of its paper). The server runs in a process of its own, so its
//! resident memory is measured alone; the clients run in a few swarm processes.

use std::fmt::Write as _;
use std::fs::File;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use serde::{Deserialize, Serialize};

use crate::clients_agent::{ServerStats, SwarmStats};
use crate::micro_report::machine;
use crate::ring_proc::Proc;

/// What a lane reads at a time, KiB: a frame that has not fully arrived waits in a buffer at
/// least this large.
const READ_BUFFER_KIB: f64 = (maquis::payload::READ_BUFFER / 1024) as f64;

/// Options of `maquis-bench clients`.
#[derive(Args, Debug, Clone, Serialize, Deserialize)]
pub struct ClientsArgs {
    /// Client nodes in all.
    #[arg(long, default_value_t = 1024)]
    pub clients: usize,
    /// Processes the clients are spread over.
    #[arg(long, default_value_t = 4)]
    pub procs: usize,
    /// Bytes of state each client pushes per period.
    #[arg(long, default_value_t = 16 * 1024)]
    pub state_bytes: usize,
    /// Push period of every client, milliseconds (PARTISAN's counters: 5,000).
    #[arg(long, default_value_t = 1000)]
    pub period_ms: u64,
    /// Time the server's sink takes per state, microseconds (it then takes at most
    /// 1e6 / merge_us states a second: fewer than the clients push).
    #[arg(long, default_value_t = 1000)]
    pub merge_us: u64,
    /// Seconds of load.
    #[arg(long, default_value_t = 30)]
    pub load_s: u64,
    /// Every push also sends the state to a random other client, relayed by the server.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub relay: bool,
    /// The server's bound on all its outbound queues together (`transport.node_queue_bytes`), MiB.
    #[arg(long, default_value_t = 512)]
    pub node_queue_mib: usize,
    /// How often the server sends changed records to every neighbour, milliseconds (the
    /// runtime's default is 100). Every change costs each client a pass over its member list;
    /// with all 1,024 clients on one 2-core machine, a join storm at 100 ms overloads them (see
    /// the report); on their own machines it would not.
    #[arg(long, default_value_t = 1000)]
    pub sync_ms: u64,
    /// Where results.json and report.md go.
    #[arg(long, default_value = "bench/results/clients")]
    pub out: PathBuf,
}

/// The server, sampled.
#[derive(Debug, Serialize, Deserialize)]
struct Sample {
    /// Seconds since the first client was started.
    t_s: f64,
    /// Clients started so far.
    clients: usize,
    /// Whether the load was on.
    load: bool,
    server: ServerStats,
    /// Kernel memory of all TCP sockets on the machine (`/proc/net/sockstat`), KiB: socket
    /// buffers are not in any process's RSS.
    #[serde(default)]
    tcp_kernel_kib: u64,
    /// Resident memory of the client processes together, KiB (sampled under load only).
    #[serde(default)]
    clients_rss_kib: u64,
}

/// `TCP: … mem <pages>` of `/proc/net/sockstat`, in KiB.
fn tcp_kernel_kib() -> u64 {
    std::fs::read_to_string("/proc/net/sockstat")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("TCP:"))?;
            let mut words = line.split_whitespace();
            words.find(|w| *w == "mem")?;
            words.next()?.parse::<u64>().ok()
        })
        .map_or(0, |pages| pages * 4)
}

#[derive(Debug, Serialize, Deserialize)]
struct Outcome {
    args: ClientsArgs,
    machine: String,
    idle: ServerStats,
    joined_s: f64,
    converged_s: f64,
    samples: Vec<Sample>,
    swarms: Vec<SwarmStats>,
    after: ServerStats,
    /// When the states sent before the load stopped had all arrived (or stopped moving).
    drained_s: f64,
    /// How long the load was on (from `load` to `quiet`), seconds.
    load_on_s: f64,
}

/// The plotting script, built into the binary.
const PLOT_PY: &str = include_str!("../../../bench/plot_clients.py");

/// The longest the benchmark waits, after the load, for what was sent to arrive.
const DRAIN_MAX_S: u64 = 300;

/// Routed frames the server dropped, by any counted reason.
fn routed_drops(s: &ServerStats) -> u64 {
    [
        "routed_queue_full",
        "routed_no_route",
        "routed_hop_limit",
        "routed_invalid",
    ]
    .iter()
    .filter_map(|k| s.counters.get(*k))
    .sum()
}

/// Runs the benchmark and writes results.json and report.md.
pub fn run(args: &ClientsArgs) -> Result<(), String> {
    if args.clients == 0 || args.procs == 0 {
        return Err("--clients and --procs must be at least 1".into());
    }
    std::fs::create_dir_all(&args.out).map_err(|e| format!("{}: {e}", args.out.display()))?;
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let log = File::create(args.out.join("agents.log")).map_err(|e| e.to_string())?;
    let stdio = || log.try_clone().map(Stdio::from).map_err(|e| e.to_string());

    let mut cmd = Command::new(&exe);
    cmd.env("RUST_LOG", crate::stats::agent_log_filter())
        .args(["agent", "cs-server"])
        .args(["--merge-us", &args.merge_us.to_string()])
        .args(["--node-queue-mib", &args.node_queue_mib.to_string()])
        .args(["--sync-ms", &args.sync_ms.to_string()]);
    let mut server = Proc::start("server", cmd, stdio()?)?;
    let ready = server.expect(&["ready "], Duration::from_secs(30))?;
    let addr = ready["ready ".len()..].trim().to_string();
    let idle = stats::<ServerStats>(&mut server)?;
    println!(
        "server at {addr}: {} KiB resident with no client",
        idle.rss_kib
    );

    let t0 = Instant::now();
    let mut samples = Vec::new();
    let mut swarms = Vec::new();
    let per = args.clients.div_ceil(args.procs);
    let mut started = 0;
    while started < args.clients {
        let count = per.min(args.clients - started);
        let mut cmd = Command::new(&exe);
        cmd.env("RUST_LOG", crate::stats::agent_log_filter())
            .args(["agent", "cs-clients", "--server", &addr])
            .args([
                "--first",
                &started.to_string(),
                "--count",
                &count.to_string(),
            ])
            .args(["--state-bytes", &args.state_bytes.to_string()])
            .args(["--period-ms", &args.period_ms.to_string()]);
        if args.relay {
            cmd.args(["--relay-total", &args.clients.to_string()]);
        }
        let mut swarm = Proc::start(&format!("clients {started}.."), cmd, stdio()?)?;
        loop {
            let line = swarm.expect(&["joined ", "ready"], Duration::from_secs(120))?;
            let done = line == "ready";
            let n = if done {
                count
            } else {
                line["joined ".len()..].trim().parse().unwrap_or(0)
            };
            if done
                && samples
                    .last()
                    .is_some_and(|s: &Sample| s.clients == started + n)
            {
                break;
            }
            let s = stats::<ServerStats>(&mut server)?;
            println!(
                "{:>5} clients started, {:6.1} s: server {} KiB resident, {} members",
                started + n,
                t0.elapsed().as_secs_f64(),
                s.rss_kib,
                s.members
            );
            samples.push(Sample {
                t_s: t0.elapsed().as_secs_f64(),
                clients: started + n,
                load: false,
                server: s,
                tcp_kernel_kib: tcp_kernel_kib(),
                clients_rss_kib: 0,
            });
            if done {
                break;
            }
        }
        started += count;
        swarms.push(swarm);
    }
    let joined_s = t0.elapsed().as_secs_f64();

    // Converged: the server sees every client as a member and as attached, and every client
    // sees every member. The nodes are other processes, so this is polled.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = stats::<ServerStats>(&mut server)?;
        let fewest = swarms
            .iter_mut()
            .map(|p| stats::<SwarmStats>(p).map(|s| s.min_members))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .min()
            .unwrap_or(0);
        if s.members == args.clients + 1 && s.neighbors == args.clients && fewest == s.members {
            break;
        }
        if Instant::now() > deadline {
            let why = diagnose(&mut server, &mut swarms, args, per, &args.out);
            return Err(format!(
                "not converged within 120 s: the server sees {} clients, {} attached; a \
                 client sees {fewest} members. {why}",
                s.members.saturating_sub(1),
                s.neighbors
            ));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let converged_s = t0.elapsed().as_secs_f64();
    println!(
        "converged after {converged_s:.1} s; load for {} s",
        args.load_s
    );

    let load_start = Instant::now();
    for s in &mut swarms {
        s.send("load")?;
    }
    let load_end = Instant::now() + Duration::from_secs(args.load_s);
    while Instant::now() < load_end {
        std::thread::sleep(Duration::from_secs(1));
        let s = stats::<ServerStats>(&mut server)?;
        let clients_rss_kib = swarms
            .iter_mut()
            .map(|p| stats::<SwarmStats>(p).map(|s| s.rss_kib))
            .sum::<Result<u64, _>>()?;
        let tcp = tcp_kernel_kib();
        println!(
            "  load {:5.1} s: server {} KiB resident, {} KiB queued, {} merged; clients {} KiB; \
             TCP buffers {} KiB",
            t0.elapsed().as_secs_f64() - converged_s,
            s.rss_kib,
            s.queued_bytes / 1024,
            s.merged,
            clients_rss_kib,
            tcp
        );
        samples.push(Sample {
            t_s: t0.elapsed().as_secs_f64(),
            clients: args.clients,
            load: true,
            server: s,
            tcp_kernel_kib: tcp,
            clients_rss_kib,
        });
    }
    for s in &mut swarms {
        s.send("quiet")?;
    }
    let load_on_s = load_start.elapsed().as_secs_f64();
    // Drain: what was sent before `quiet` is still on its way (waiting in TCP while the sink
    // is full). Done when every state sent to the server is merged and every relayed state
    // arrived or was dropped and counted, or when nothing moved for 10 s.
    let mut last = (u64::MAX, u64::MAX);
    let mut still_since = Instant::now();
    let drain_end = Instant::now() + Duration::from_secs(DRAIN_MAX_S);
    let (swarm_stats, after, drained_s) = loop {
        let sw = swarms
            .iter_mut()
            .map(stats::<SwarmStats>)
            .collect::<Result<Vec<_>, _>>()?;
        let srv = stats::<ServerStats>(&mut server)?;
        let sent: u64 = sw.iter().map(|s| s.sent).sum();
        let relayed: u64 = sw.iter().map(|s| s.relayed).sum();
        let received: u64 = sw.iter().map(|s| s.received).sum();
        let dropped = routed_drops(&srv);
        let now = (srv.merged, received);
        if now != last {
            last = now;
            still_since = Instant::now();
        }
        if (srv.merged >= sent && received + dropped >= relayed)
            || still_since.elapsed() > Duration::from_secs(10)
            || Instant::now() > drain_end
        {
            break (sw, srv, t0.elapsed().as_secs_f64());
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    println!("drained after {:.1} s", drained_s - converged_s - load_on_s);
    for s in swarms {
        s.stop(Duration::from_secs(30));
    }
    server.stop(Duration::from_secs(10));

    let o = Outcome {
        args: args.clone(),
        machine: machine(),
        idle,
        joined_s,
        converged_s,
        samples,
        swarms: swarm_stats,
        after,
        drained_s,
        load_on_s,
    };
    let json = serde_json::to_string_pretty(&o).map_err(|e| e.to_string())?;
    std::fs::write(args.out.join("results.json"), json).map_err(|e| e.to_string())?;
    let (mut report, held) = report(&o);
    match crate::plot::run(&args.out, "plot_clients.py", PLOT_PY, &[]) {
        Ok(pngs) => {
            for p in pngs {
                report.push_str(&format!("\n\n![{p}]({p})"));
            }
            report.push('\n');
        }
        Err(e) => eprintln!("plots not drawn: {e}"),
    }
    std::fs::write(args.out.join("report.md"), &report).map_err(|e| e.to_string())?;
    println!("{report}");
    println!("wrote {}", args.out.display());
    if held {
        Ok(())
    } else {
        Err("the server's memory did not stay within its bound".into())
    }
}

/// For a run that did not converge: the clients the server lacks, and the view of a few of
/// them, written to `diagnosis.json` in the output directory.
fn diagnose(
    server: &mut Proc,
    swarms: &mut [Proc],
    args: &ClientsArgs,
    per: usize,
    out: &std::path::Path,
) -> String {
    let view = |p: &mut Proc, cmd: &str| -> serde_json::Value {
        p.send(cmd)
            .and_then(|()| p.answer::<serde_json::Value>(Duration::from_secs(60)))
            .unwrap_or_else(serde_json::Value::String)
    };
    let at_server = view(server, "who");
    let known: std::collections::BTreeSet<&str> = at_server["members"]
        .as_array()
        .map(|m| m.iter().filter_map(|v| v.as_str()).collect())
        .unwrap_or_default();
    let missing: Vec<String> = (0..args.clients)
        .map(|i| format!("c{i:04}"))
        .filter(|n| !known.contains(n.as_str()))
        .collect();
    let samples: Vec<serde_json::Value> = missing
        .iter()
        .take(3)
        .filter_map(|n| {
            let i: usize = n[1..].parse().ok()?;
            let p = swarms.get_mut(i / per.max(1))?;
            Some(view(p, &format!("who {n}")))
        })
        .collect();
    let doc = serde_json::json!({ "server": at_server, "missing": missing, "samples": samples });
    let path = out.join("diagnosis.json");
    let _ = std::fs::write(&path, doc.to_string());
    format!(
        "The server lacks {} clients (first: {:?}); their views are in {}",
        missing.len(),
        &missing[..missing.len().min(5)],
        path.display()
    )
}

fn stats<T: for<'de> Deserialize<'de>>(p: &mut Proc) -> Result<T, String> {
    p.send("stats")?;
    p.answer(Duration::from_secs(60))
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// The report, and whether the bound held.
fn report(o: &Outcome) -> (String, bool) {
    let a = &o.args;
    let mut r = String::new();
    let _ = writeln!(
        r,
        "# Client-server overlay: server memory (PARTISAN Fig. 9)\n"
    );
    let _ = writeln!(
        r,
        "Command: `maquis-bench clients --clients {} --procs {} --state-bytes {} --period-ms {} \
         --merge-us {} --load-s {} --relay {} --node-queue-mib {} --sync-ms {}`  ",
        a.clients,
        a.procs,
        a.state_bytes,
        a.period_ms,
        a.merge_us,
        a.load_s,
        a.relay,
        a.node_queue_mib,
        a.sync_ms
    );
    let _ = writeln!(r, "Machine: {}  ", o.machine);
    let _ = writeln!(r, "Commit: {}\n", crate::micro_report::build_commit());
    let pushed_per_s = a.clients as f64 * 1000.0 / a.period_ms.max(1) as f64;
    let merged_per_s = 1e6 / a.merge_us.max(1) as f64;
    let _ = writeln!(
        r,
        "One server process (the `client-server` overlay, role `server`, default configuration \
         except `transport.node_queue_bytes` and a sync interval of {} ms) and {} client nodes in {} processes on this machine's \
         loopback, each client attached to the server only. The clients join one after another. \
         Then every client pushes a {} B state to the server's `sink` actor every {} ms ({:.0} \
         states/s in all){}; the sink spends {} µs (a timer) on each state, so it merges at most {:.0} \
         states/s (fewer in practice: the timer rounds up), and the rest must wait somewhere. In PARTISAN the wait was an unbounded Erlang mailbox \
         and the server was killed for lack of memory at 256 clients. Here the sink's mailbox \
         is bounded, a full mailbox stops reading from the connection, TCP stops the client, \
         and the client's `send` waits; relayed frames go into bounded lane queues (all of them \
         together within `transport.node_queue_bytes`) and are dropped and counted when full. The sync \
         interval (the runtime's default is 100 ms) is longer because every membership change \
         costs each client a pass over its member list, and here all clients share this \
         machine's two cores: at 100 ms the join storm of 1,024 clients can overload them until \
         the server misses their heartbeats.\n",
        a.sync_ms,
        a.clients,
        a.procs,
        a.state_bytes,
        a.period_ms,
        pushed_per_s,
        if a.relay {
            ", and the same state to a random other client through the server"
        } else {
            ""
        },
        a.merge_us,
        merged_per_s
    );

    let _ = writeln!(r, "## Joining\n");
    let _ = writeln!(
        r,
        "Server alone: {:.1} MiB resident. All clients started after {:.1} s; the server \
         saw all of them as members and attached after {:.1} s.\n",
        mib(o.idle.rss_kib),
        o.joined_s,
        o.converged_s
    );
    let _ = writeln!(
        r,
        "| clients | seconds | server RSS MiB | members | open fds |\n|---|---|---|---|---|"
    );
    for s in o.samples.iter().filter(|s| !s.load) {
        let _ = writeln!(
            r,
            "| {} | {:.1} | {:.1} | {} | {} |",
            s.clients,
            s.t_s,
            mib(s.server.rss_kib),
            s.server.members,
            s.server.fds
        );
    }
    let joined = o.samples.iter().rfind(|s| !s.load);
    let per_client_kib = joined.map_or(0.0, |s| {
        s.server.rss_kib.saturating_sub(o.idle.rss_kib) as f64 / a.clients as f64
    });
    let _ = writeln!(
        r,
        "\nThe server's memory per client after the joins: {per_client_kib:.1} KiB \
         (RSS growth over the clients).\n"
    );

    let _ = writeln!(r, "## Under load\n");
    let _ = writeln!(
        r,
        "| second | server RSS MiB | server queued MiB | states merged | routed frames dropped \
         (queue full) | client processes RSS MiB | kernel TCP buffers MiB (machine) \
         |\n|---|---|---|---|---|---|---|"
    );
    let load: Vec<&Sample> = o.samples.iter().filter(|s| s.load).collect();
    let start_s = load.first().map_or(0.0, |s| s.t_s - 1.0);
    for s in &load {
        let _ = writeln!(
            r,
            "| {:.0} | {:.1} | {:.1} | {} | {} | {:.1} | {:.1} |",
            s.t_s - start_s,
            mib(s.server.rss_kib),
            s.server.queued_bytes as f64 / (1 << 20) as f64,
            s.server.merged,
            s.server
                .counters
                .get("routed_queue_full")
                .copied()
                .unwrap_or(0),
            mib(s.clients_rss_kib),
            mib(s.tcp_kernel_kib)
        );
    }
    let _ = writeln!(
        r,
        "\nThe backlog (states pushed but not yet merged) waits in the clients' lane queues \
         (`transport.lane_queue_bytes` each, where `send` waits when full) and in TCP socket buffers, \
         which are kernel memory, bounded by the kernel's `tcp_rmem`/`tcp_wmem` per socket and \
         `tcp_mem` for the machine, and not part of any RSS; the last column is that kernel \
         memory for all sockets on the machine, the clients' included."
    );
    let sent: u64 = o.swarms.iter().map(|s| s.sent).sum();
    let relayed: u64 = o.swarms.iter().map(|s| s.relayed).sum();
    let received: u64 = o.swarms.iter().map(|s| s.received).sum();
    let errors: u64 = o.swarms.iter().map(|s| s.errors).sum();
    let max_wait = o.swarms.iter().map(|s| s.max_wait_ms).max().unwrap_or(0);
    let first_error = o.swarms.iter().find_map(|s| s.first_error.clone());
    // A client's first push goes out at once, then one per period.
    let offered =
        a.clients as f64 * (1.0 + (o.load_on_s * 1000.0 / a.period_ms.max(1) as f64).floor());
    let dropped = routed_drops(&o.after);
    let lost = relayed.saturating_sub(received + dropped);
    let _ = writeln!(
        r,
        "\nClients: {sent} states sent to the server, {:.0}% of the {offered:.0} that the \
         {:.1} s of load offer (a send waited for room at most {max_wait} ms); {errors} sends failed{}. The sink merged {} states, {:.0}/s over the load \
         and the {:.1} s after it until everything sent had arrived. Relayed: {relayed} \
         states sent, {received} arrived, {dropped} dropped by the server and counted \
         (`routed_*` counters), {lost} unaccounted for.\n",
        100.0 * sent as f64 / offered.max(1.0),
        o.load_on_s,
        first_error
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default(),
        o.after.merged,
        o.after.merged as f64 / (o.drained_s - o.converged_s).max(1.0),
        o.drained_s - o.converged_s - o.load_on_s
    );

    // The bound of docs/client-server-memory.md, with the
    // per-client state measured above: idle + clients × per-client + transport.node_queue_bytes +
    // a frame in assembly on each client's two connections (in a buffer of at least a lane's
    // 64 KiB of reads) + a full sink mailbox.
    let frame_kib = (a.state_bytes as f64 + 64.0) / 1024.0;
    let mailbox_kib = maquis::Config::new("x").node.mailbox_capacity as f64 * frame_kib;
    let bound_kib = o.idle.rss_kib as f64
        + a.clients as f64 * (per_client_kib + 2.0 * frame_kib.max(READ_BUFFER_KIB))
        + (a.node_queue_mib * 1024) as f64
        + mailbox_kib;
    let peak_kib = load.iter().map(|s| s.server.rss_kib).max().unwrap_or(0);
    let hwm_kib = o.after.hwm_kib;
    let half = load.len() / 2;
    let first_half = load[..half]
        .iter()
        .map(|s| s.server.rss_kib)
        .max()
        .unwrap_or(0);
    let second_half = load[half..]
        .iter()
        .map(|s| s.server.rss_kib)
        .max()
        .unwrap_or(0);
    let within = (hwm_kib as f64) <= bound_kib;
    let flat = second_half as f64 <= first_half as f64 * 1.10 + 1024.0;
    let _ = writeln!(r, "## Bound\n");
    let _ = writeln!(
        r,
        "Bound (docs/client-server-memory.md): the server alone \
         ({:.1} MiB) + {} clients × ({per_client_kib:.1} KiB measured per client + 2 frames \
         in assembly of {frame_kib:.1} KiB, each in a read buffer of at least {READ_BUFFER_KIB} \
         KiB: {:.1} KiB) + `transport.node_queue_bytes` ({} MiB) + a full sink mailbox \
         ({:.1} MiB) = **{:.1} MiB**.\n",
        mib(o.idle.rss_kib),
        a.clients,
        2.0 * frame_kib.max(READ_BUFFER_KIB),
        a.node_queue_mib,
        mailbox_kib / 1024.0,
        bound_kib / 1024.0
    );
    let _ = writeln!(
        r,
        "| measure | value | ratio |\n|---|---|---|\n\
         | server RSS, idle (baseline) | {:.1} MiB | 1.00× |\n\
         | server RSS, {} clients joined | {:.1} MiB | {:.2}× |\n\
         | server RSS, peak sample under load | {:.1} MiB | {:.2}× |\n\
         | server peak RSS (VmHWM), whole run | {:.1} MiB | {:.2}× of the bound |\n\
         | max RSS, first / second half of the load | {:.1} / {:.1} MiB | {:.2}× |\n",
        mib(o.idle.rss_kib),
        a.clients,
        mib(joined.map_or(0, |s| s.server.rss_kib)),
        joined.map_or(0, |s| s.server.rss_kib) as f64 / o.idle.rss_kib.max(1) as f64,
        mib(peak_kib),
        peak_kib as f64 / o.idle.rss_kib.max(1) as f64,
        mib(hwm_kib),
        hwm_kib as f64 / bound_kib.max(1.0),
        mib(first_half),
        mib(second_half),
        second_half as f64 / first_half.max(1) as f64
    );
    let held = within && flat && o.after.members == a.clients + 1 && lost == 0;
    let _ = writeln!(
        r,
        "Verdict: peak within the bound: **{}**; no growth in the second half of the load \
         (at most 10% over the first half): **{}**; every client still a member after the \
         load ({} of {}): **{}**; every relayed state arrived or was counted as dropped: \
         **{}**.",
        yes(within),
        yes(flat),
        o.after.members.saturating_sub(1),
        a.clients,
        yes(o.after.members == a.clients + 1),
        yes(lost == 0)
    );
    (r, held)
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}
