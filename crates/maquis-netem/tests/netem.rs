//! End-to-end tests: real namespaces, TUN devices and the wire. They need
//! root and /dev/net/tun and are skipped (with a message) without them.
//! Every test uses its own prefix, so they run in parallel; everything is
//! torn down by `Netem`'s drop even when an assertion fails.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use maquis_netem::{
    control_request, list_namespaces, ControlRequest, Netem, NetemConfig, NetemError, Rate,
};

fn skip() -> bool {
    if let Err(e) = maquis_netem::preflight() {
        eprintln!("skipping: {e}");
        return true;
    }
    false
}

fn prefix(tag: &str) -> String {
    format!("nt{}{}", std::process::id() % 100_000, tag)
}

fn config(tag: &str, hosts: usize, delay_ms: u64) -> NetemConfig {
    NetemConfig {
        hosts,
        delay: Duration::from_millis(delay_ms),
        prefix: prefix(tag),
        seed: Some(7),
        ..Default::default()
    }
}

fn ours(prefix: &str) -> Vec<String> {
    list_namespaces()
        .unwrap()
        .into_iter()
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .collect()
}

fn udp(net: &Netem, host: usize, port: u16) -> UdpSocket {
    let addr = SocketAddr::new(net.hosts()[host].addr.into(), port);
    let s = net
        .run_in_host(host, move || UdpSocket::bind(addr))
        .unwrap()
        .unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    s
}

/// Sends a fresh datagram from `a` to `b` and reports whether it arrived
/// within `wait`.
fn delivered(a: &UdpSocket, b: &UdpSocket, wait: Duration) -> bool {
    let token = format!("{:?}", Instant::now());
    a.send_to(token.as_bytes(), b.local_addr().unwrap())
        .unwrap();
    let deadline = Instant::now() + wait;
    let mut buf = [0u8; 256];
    while Instant::now() < deadline {
        if let Ok((n, _)) = b.recv_from(&mut buf) {
            if &buf[..n] == token.as_bytes() {
                return true;
            }
        }
    }
    false
}

#[test]
fn rtt_is_twice_the_one_way_delay() {
    if skip() {
        return;
    }
    let net = Netem::up(config("rtt", 2, 10)).unwrap();
    let addr = SocketAddr::new(net.hosts()[1].addr.into(), 7001);
    let listener = net
        .run_in_host(1, move || TcpListener::bind(addr))
        .unwrap()
        .unwrap();
    let echo = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut buf = [0u8; 64];
        loop {
            match s.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if s.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut c = net
        .run_in_host(0, move || TcpStream::connect(addr))
        .unwrap()
        .unwrap();
    c.set_nodelay(true).unwrap();
    // Up to three rounds of ten round trips: the average must be within
    // 10% of 20 ms in one of them (the endpoints are ordinary threads, so a
    // CPU-saturated CI machine can add scheduling delay to a round), and no
    // round trip may ever be shorter than the emulated 20 ms.
    let mut buf = [0u8; 64];
    let one_round_trip = |c: &mut TcpStream, buf: &mut [u8; 64], i: u8| {
        let t = Instant::now();
        c.write_all(&[i; 64]).unwrap();
        c.read_exact(buf).unwrap();
        t.elapsed().as_secs_f64() * 1e3
    };
    one_round_trip(&mut c, &mut buf, 0);
    let mut averages = Vec::new();
    for round in 0..3 {
        let rtts: Vec<f64> = (1..=10)
            .map(|i| one_round_trip(&mut c, &mut buf, i))
            .collect();
        let avg = rtts.iter().sum::<f64>() / rtts.len() as f64;
        eprintln!(
            "TCP echo RTT over 10ms one-way, round {round}: avg {avg:.3} ms, samples {rtts:.2?}"
        );
        let min = rtts.iter().copied().fold(f64::MAX, f64::min);
        assert!(
            min >= 19.9,
            "a round trip took {min:.3} ms, less than 2 x 10 ms"
        );
        averages.push(avg);
        if (avg - 20.0).abs() <= 2.0 {
            break;
        }
    }
    drop(c);
    echo.join().unwrap();
    assert!(
        averages.iter().any(|avg| (avg - 20.0).abs() <= 2.0),
        "avg RTTs {averages:.3?} ms: none within 10% of 20 ms"
    );

    // ping, when iputils is installed.
    let has_ping = Command::new("sh")
        .args(["-c", "command -v ping"])
        .output()
        .is_ok_and(|o| o.status.success());
    if has_ping {
        let out = net
            .command(0, "ping")
            .args(["-c", "5", "-i", "0.2", &net.hosts()[1].addr.to_string()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let avg: f64 = text
            .lines()
            .find(|l| l.contains("min/avg/max"))
            .and_then(|l| l.split('=').nth(1))
            .and_then(|v| v.trim().split('/').nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("cannot parse ping output: {text}"));
        eprintln!("ping RTT avg {avg:.3} ms");
        assert!((avg - 20.0).abs() <= 2.0, "ping avg {avg} ms");
    } else {
        eprintln!("ping not installed; TCP echo timing used instead");
    }

    let stats = net.shutdown().unwrap();
    assert!(stats.total.packets >= 22, "{stats:?}");
    assert!(stats.lateness.count >= 22);
    assert!(stats.sysctls.len() >= 3, "{:?}", stats.sysctls);
}

#[test]
fn partition_blocks_and_heal_restores() {
    if skip() {
        return;
    }
    let net = Netem::up(config("part", 3, 1)).unwrap();
    let (a, b, c) = (udp(&net, 0, 7002), udp(&net, 1, 7002), udp(&net, 2, 7002));
    let wait = Duration::from_millis(300);
    assert!(delivered(&a, &b, wait), "1->2 before partition");
    assert!(delivered(&b, &a, wait), "2->1 before partition");

    net.partition(&[0]).unwrap();
    assert_eq!(net.partitioned(), vec![0]);
    assert!(!delivered(&a, &b, wait), "1->2 crossed the partition");
    assert!(!delivered(&b, &a, wait), "2->1 crossed the partition");
    assert!(!delivered(&c, &a, wait), "3->1 crossed the partition");
    assert!(delivered(&b, &c, wait), "2->3 is on one side and must work");

    net.heal();
    assert!(delivered(&a, &b, wait), "1->2 after heal");
    assert!(delivered(&c, &a, wait), "3->1 after heal");

    let stats = net.stats();
    assert!(stats.total.dropped_partition >= 3, "{:?}", stats.total);
    assert!(net.partition(&[5]).is_err());
}

#[test]
fn loss_drops_and_counts() {
    if skip() {
        return;
    }
    let net = Netem::up(config("loss", 2, 0)).unwrap();
    let (a, b) = (udp(&net, 0, 7003), udp(&net, 1, 7003));
    let wait = Duration::from_millis(200);
    assert!(delivered(&a, &b, wait));
    net.set_loss(1.0).unwrap();
    assert!(!delivered(&a, &b, wait));
    assert!(net.stats().total.dropped_loss >= 1);
    net.set_loss(0.0).unwrap();
    assert!(delivered(&a, &b, wait));
    assert!(net.set_loss(1.5).is_err());
}

#[test]
fn rate_limit_caps_throughput() {
    if skip() {
        return;
    }
    let rate = 40_000_000u64;
    let net = Netem::up(NetemConfig {
        rate: Some(Rate::from_bits_per_sec(rate)),
        ..config("rate", 2, 1)
    })
    .unwrap();
    let addr = SocketAddr::new(net.hosts()[1].addr.into(), 7004);
    let listener = net
        .run_in_host(1, move || TcpListener::bind(addr))
        .unwrap()
        .unwrap();
    let total = 2_000_000usize;
    let rx = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0;
        let mut first = None;
        while got < total {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0, "connection closed early");
            first.get_or_insert_with(Instant::now);
            got += n;
        }
        first.map(|f| f.elapsed()).unwrap_or_default()
    });
    let mut tx = net
        .run_in_host(0, move || TcpStream::connect(addr))
        .unwrap()
        .unwrap();
    tx.write_all(&vec![1u8; total]).unwrap();
    let took = rx.join().unwrap();
    let mbit = total as f64 * 8.0 / took.as_secs_f64() / 1e6;
    eprintln!("rate-limited goodput {mbit:.1} Mbit/s (limit 40)");
    // Headers add ~3%; the bucket adds a 128 KiB head start.
    assert!(mbit < 40.0 * 1.15, "{mbit} Mbit/s exceeds the limit");
    assert!(mbit > 40.0 * 0.5, "{mbit} Mbit/s is far below the limit");
    assert_eq!(net.rate(), Some(Rate::from_bits_per_sec(rate)));
}

#[test]
fn commands_run_inside_hosts_with_exit_codes() {
    if skip() {
        return;
    }
    let net = Netem::up(config("cmd", 2, 0)).unwrap();
    let out = net
        .command(0, "ip")
        .args(["-4", "addr", "show", "dev", "netem0"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("10.77.0.1/24"));
    let status = net
        .command(1, "sh")
        .args(["-c", "exit 7"])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(7));
    assert!(net.try_command(2, "true").is_err());
}

#[test]
fn control_socket_commands() {
    if skip() {
        return;
    }
    let path = PathBuf::from(format!("/tmp/maquis-netem-{}.sock", prefix("ctl")));
    let net = Netem::up(NetemConfig {
        control: Some(path.clone()),
        ..config("ctl", 3, 2)
    })
    .unwrap();
    control_request(
        &path,
        &ControlRequest::SetDelay {
            delay_ns: 3_000_000,
        },
    )
    .unwrap();
    assert_eq!(net.delay(), Duration::from_millis(3));
    control_request(&path, &ControlRequest::SetLoss { loss: 0.25 }).unwrap();
    assert_eq!(net.loss(), 0.25);
    control_request(
        &path,
        &ControlRequest::Partition {
            hosts: vec![format!("{}-h1", prefix("ctl")), "3".into()],
        },
    )
    .unwrap();
    assert_eq!(net.partitioned(), vec![0, 2]);
    let reply = control_request(&path, &ControlRequest::Stats).unwrap();
    let stats = reply.stats.unwrap();
    assert_eq!(stats.partition.len(), 2);
    assert_eq!(stats.delay_us, 3000.0);
    control_request(&path, &ControlRequest::Heal).unwrap();
    assert!(net.partitioned().is_empty());
    control_request(
        &path,
        &ControlRequest::SetRate {
            rate_bit_s: Some(1_000_000),
        },
    )
    .unwrap();
    assert_eq!(net.rate(), Some(Rate::from_bits_per_sec(1_000_000)));
    control_request(&path, &ControlRequest::ResetStats).unwrap();

    let err = control_request(&path, &ControlRequest::SetLoss { loss: 2.0 }).unwrap_err();
    assert!(matches!(err, NetemError::Control(_)), "{err}");
    let err = control_request(
        &path,
        &ControlRequest::Partition {
            hosts: vec!["nope".into()],
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("unknown host"), "{err}");

    // A second network on the same socket is refused.
    let second = Netem::up(NetemConfig {
        control: Some(path.clone()),
        ..config("ctl2", 1, 0)
    });
    assert!(matches!(second, Err(NetemError::AlreadyRunning { .. })));
    assert!(ours(&prefix("ctl2")).is_empty());

    net.shutdown().unwrap();
    assert!(!path.exists(), "control socket left behind");
}

#[test]
fn teardown_leaves_nothing_behind() {
    if skip() {
        return;
    }
    let p = prefix("down");
    // A stale namespace from a "killed" run is removed at start.
    Command::new("ip")
        .args(["netns", "add", &format!("{p}-h9")])
        .status()
        .unwrap();
    let net = Netem::up(config("down", 3, 0)).unwrap();
    let names: Vec<String> = net.hosts().iter().map(|h| h.name.clone()).collect();
    assert_eq!(ours(&p), names, "stale namespace not cleaned up");
    for h in net.hosts() {
        let out = net
            .command(h.index, "ip")
            .args(["link", "show", "netem0"])
            .output()
            .unwrap();
        assert!(out.status.success());
    }
    net.shutdown().unwrap();
    assert!(ours(&p).is_empty(), "namespaces left: {:?}", ours(&p));
    let root_dev = Command::new("ip")
        .args(["link", "show", "netem0"])
        .output()
        .unwrap();
    assert!(
        !root_dev.status.success(),
        "a netem0 device exists in the root namespace"
    );

    // Drop during a panic tears down too.
    let cfg = config("down", 2, 0);
    let result = std::panic::catch_unwind(move || {
        let _net = Netem::up(cfg).unwrap();
        // Unwinds like a failing assertion, without printing a panic message.
        std::panic::resume_unwind(Box::new("simulated test failure"));
    });
    assert!(result.is_err());
    assert!(
        ours(&p).is_empty(),
        "namespaces left after panic: {:?}",
        ours(&p)
    );
}

#[test]
fn bad_configs_are_rejected_before_touching_anything() {
    let mut c = config("bad", 0, 0);
    assert!(matches!(
        Netem::up(c.clone()),
        Err(NetemError::InvalidConfig(_))
    ));
    c.hosts = 2;
    c.prefix = "../evil".into();
    assert!(Netem::up(c.clone()).is_err());
    c.prefix = prefix("bad");
    c.network = Ipv4Addr::new(10, 0, 0, 1);
    assert!(matches!(Netem::up(c), Err(NetemError::InvalidConfig(_))));
}
