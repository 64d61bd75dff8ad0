//! The Redis-protocol front: a real Redis client, `redis-cli` when installed, pipelines, and
//! malformed input.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use common::*;
use maquis_ring::{RespConfig, RespServer, RingNode};

async fn cluster_with_resp(prefix: &str) -> (Vec<RingNode>, Vec<RespServer>) {
    let nodes = cluster(prefix, 3, ring_config()).await;
    let mut servers = Vec::new();
    for n in &nodes {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        servers.push(n.serve_resp(addr, RespConfig::default()).await.unwrap());
    }
    (nodes, servers)
}

fn client(addr: SocketAddr) -> redis::Connection {
    let c = redis::Client::open(format!("redis://{addr}/")).unwrap();
    c.get_connection_with_timeout(Duration::from_secs(5))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_client_speaks_to_every_node() {
    let (nodes, servers) = cluster_with_resp("rc").await;
    let addrs: Vec<SocketAddr> = servers.iter().map(|s| s.local_addr()).collect();
    tokio::task::spawn_blocking(move || {
        let mut a = client(addrs[0]);
        let mut b = client(addrs[1]);
        let mut c = client(addrs[2]);
        let pong: String = redis::cmd("PING").query(&mut a).unwrap();
        assert_eq!(pong, "PONG");
        let hello: String = redis::cmd("PING").arg("hello").query(&mut b).unwrap();
        assert_eq!(hello, "hello");

        let () = redis::cmd("SET").arg("k1").arg("v1").query(&mut a).unwrap();
        let v: Option<String> = redis::cmd("GET").arg("k1").query(&mut b).unwrap();
        assert_eq!(v.as_deref(), Some("v1"));
        let binary: Vec<u8> = (0..=255u8).collect();
        let () = redis::cmd("SET")
            .arg("bin")
            .arg(&binary)
            .query(&mut c)
            .unwrap();
        let back: Vec<u8> = redis::cmd("GET").arg("bin").query(&mut a).unwrap();
        assert_eq!(back, binary);
        let missing: Option<String> = redis::cmd("GET").arg("nope").query(&mut c).unwrap();
        assert_eq!(missing, None);

        let () = redis::cmd("MSET")
            .arg("m1")
            .arg("a")
            .arg("m2")
            .arg("b")
            .arg("m3")
            .arg("c")
            .query(&mut c)
            .unwrap();
        let got: Vec<Option<String>> = redis::cmd("MGET")
            .arg("m1")
            .arg("nope")
            .arg("m3")
            .arg("m2")
            .query(&mut a)
            .unwrap();
        assert_eq!(
            got,
            vec![Some("a".into()), None, Some("c".into()), Some("b".into())]
        );
        let n: i64 = redis::cmd("EXISTS")
            .arg("m1")
            .arg("m2")
            .arg("nope")
            .arg("m1")
            .query(&mut b)
            .unwrap();
        assert_eq!(n, 3);
        let n: i64 = redis::cmd("DEL")
            .arg("m1")
            .arg("m2")
            .arg("nope")
            .query(&mut b)
            .unwrap();
        assert_eq!(n, 2);
        let n: i64 = redis::cmd("EXISTS")
            .arg("m1")
            .arg("m2")
            .query(&mut c)
            .unwrap();
        assert_eq!(n, 0);

        let info: String = redis::cmd("INFO").query(&mut a).unwrap();
        assert!(info.contains("redis_version:"), "{info}");
        assert!(info.contains("ring_partitions:64"), "{info}");
        let ring: String = redis::cmd("INFO").arg("ring").query(&mut a).unwrap();
        assert!(ring.contains("ring_nodes:rc1,rc2,rc3"), "{ring}");
        assert!(!ring.contains("# Server"));

        let () = redis::cmd("SELECT").arg(0).query(&mut a).unwrap();
        assert!(redis::cmd("SELECT").arg(3).query::<()>(&mut a).is_err());
        let () = redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg("tester")
            .query(&mut a)
            .unwrap();
        let name: String = redis::cmd("CLIENT").arg("GETNAME").query(&mut a).unwrap();
        assert_eq!(name, "tester");
        let count: i64 = redis::cmd("COMMAND").arg("COUNT").query(&mut a).unwrap();
        assert!(count >= 12);

        // Errors keep the connection usable.
        let e = redis::cmd("FLUSHALL").query::<()>(&mut a).unwrap_err();
        assert!(e.to_string().contains("unknown command"), "{e}");
        let e = redis::cmd("GET").query::<()>(&mut a).unwrap_err();
        assert!(e.to_string().contains("wrong number of arguments"), "{e}");
        let e = redis::cmd("SET")
            .arg("k")
            .arg("v")
            .arg("NX")
            .query::<()>(&mut a)
            .unwrap_err();
        assert!(e.to_string().contains("syntax error"), "{e}");
        let pong: String = redis::cmd("PING").query(&mut a).unwrap();
        assert_eq!(pong, "PONG");

        // A pipeline: many requests in one write, replies in order.
        let mut pipe = redis::pipe();
        for i in 0..200 {
            pipe.cmd("SET").arg(format!("p{i}")).arg(i).ignore();
        }
        for i in 0..200 {
            pipe.cmd("GET").arg(format!("p{i}"));
        }
        let values: Vec<i64> = pipe.query(&mut b).unwrap();
        assert_eq!(values, (0..200).collect::<Vec<i64>>());
    })
    .await
    .unwrap();
    for s in &servers {
        s.stop();
    }
    stop(&nodes).await;
}

fn redis_cli(port: u16, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new("redis-cli")
        .arg("-p")
        .arg(port.to_string())
        .args(args)
        .output()
        .ok()?;
    assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_and_benchmark_when_installed() {
    if std::process::Command::new("redis-cli")
        .arg("--version")
        .output()
        .is_err()
    {
        println!("NOTE: redis-cli is not installed; skipping the redis-cli checks");
        return;
    }
    let (nodes, servers) = cluster_with_resp("cli").await;
    let ports: Vec<u16> = servers.iter().map(|s| s.local_addr().port()).collect();
    tokio::task::spawn_blocking(move || {
        assert_eq!(redis_cli(ports[0], &["PING"]).unwrap(), "PONG");
        assert_eq!(
            redis_cli(ports[0], &["SET", "cli-key", "hello world"]).unwrap(),
            "OK"
        );
        assert_eq!(
            redis_cli(ports[1], &["GET", "cli-key"]).unwrap(),
            "hello world"
        );
        assert_eq!(redis_cli(ports[2], &["EXISTS", "cli-key"]).unwrap(), "1");
        assert_eq!(redis_cli(ports[2], &["DEL", "cli-key"]).unwrap(), "1");
        assert_eq!(redis_cli(ports[0], &["GET", "cli-key"]).unwrap(), "");
        let err = redis_cli(ports[0], &["NOSUCH", "x"]).unwrap();
        assert!(err.contains("unknown command"), "{err}");
        let info = redis_cli(ports[1], &["INFO", "ring"]).unwrap();
        assert!(info.contains("ring_version:"), "{info}");
        let bench = std::process::Command::new("redis-benchmark")
            .args([
                "-p",
                &ports[0].to_string(),
                "-t",
                "set,get",
                "-n",
                "300",
                "-c",
                "4",
                "-q",
            ])
            .output();
        match bench {
            Ok(out) => {
                let text = String::from_utf8_lossy(&out.stdout).to_string();
                println!("redis-benchmark: {text}");
                assert!(out.status.success(), "{out:?}");
                assert!(text.contains("SET") && text.contains("GET"), "{text}");
            }
            Err(_) => println!("NOTE: redis-benchmark is not installed; skipping it"),
        }
    })
    .await
    .unwrap();
    for s in &servers {
        s.stop();
    }
    stop(&nodes).await;
}

/// Sends raw bytes and reads what comes back until the server closes or `wait` passes.
fn exchange(addr: SocketAddr, input: &[u8], half_close: bool, wait: Duration) -> (Vec<u8>, bool) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    s.write_all(input).unwrap();
    if half_close {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(_) => return (out, false),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_input_gets_errors_and_the_server_keeps_serving() {
    with_front("bad1", RespConfig::default(), move |addr| {
        // A connection that stays open through everything below.
        let mut keep = TcpStream::connect(addr).unwrap();
        keep.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let wait = Duration::from_secs(5);
        let cases: &[(&[u8], &str)] = &[
            (b"*abc\r\n", "-ERR Protocol error: invalid multibulk length"),
            (
                b"*99999999999\r\n",
                "-ERR Protocol error: invalid multibulk length",
            ),
            (
                b"*1\r\n$99999999999\r\n",
                "-ERR Protocol error: invalid bulk length",
            ),
            (b"*1\r\n$-7\r\n", "-ERR Protocol error: invalid bulk length"),
            (b"*2\r\n:1\r\n", "-ERR Protocol error: expected '$'"),
            (b"*1\r\n$3\r\nGETXX\r\n", "-ERR Protocol error"),
            (
                b"*1\r\n$1000000000\r\nabc",
                "-ERR Protocol error: invalid bulk length",
            ),
        ];
        for (input, want) in cases {
            let (out, closed) = exchange(addr, input, false, wait);
            let text = String::from_utf8_lossy(&out);
            assert!(
                text.starts_with(want),
                "{:?} -> {text:?}",
                String::from_utf8_lossy(input)
            );
            assert!(closed, "closed after a protocol error");
        }
        // Over the inline limit without a newline.
        let (out, closed) = exchange(addr, &vec![b'x'; 70 * 1024], false, wait);
        assert!(String::from_utf8_lossy(&out).starts_with("-ERR Protocol error: too big inline"));
        assert!(closed);
        // Truncated frames, then the client closes: the server closes too, silently.
        for input in [
            &b"*2\r\n$3\r\nGET\r\n$10\r\nabc"[..],
            b"*3\r\n",
            b"*1\r\n$4\r\nPI",
        ] {
            let (out, closed) = exchange(addr, input, true, wait);
            assert!(out.is_empty() && closed, "{out:?}");
        }
        // Garbage as inline commands: error replies, the connection stays.
        let (out, _) = exchange(
            addr,
            b"\x00\x01\x02 garbage\r\nFOO bar\r\n$5\r\nPING\r\n",
            true,
            wait,
        );
        let text = String::from_utf8_lossy(&out);
        assert_eq!(text.matches("-ERR unknown command").count(), 3, "{text:?}");
        assert!(text.ends_with("+PONG\r\n"), "{text:?}");
        // Random bytes.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..20 {
            let junk: Vec<u8> = (0..512)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    (seed >> 24) as u8
                })
                .collect();
            let _ = exchange(addr, &junk, true, wait);
        }
        // Still serving, on the old connection and on new ones.
        keep.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
        let mut buf = [0u8; 7];
        keep.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"+PONG\r\n");
        let (out, _) = exchange(addr, b"PING\r\nQUIT\r\n", false, wait);
        assert_eq!(out, b"+PONG\r\n+OK\r\n");
        let mut c = client(addr);
        let () = redis::cmd("SET")
            .arg("after")
            .arg("ok")
            .query(&mut c)
            .unwrap();
        let v: String = redis::cmd("GET").arg("after").query(&mut c).unwrap();
        assert_eq!(v, "ok");
    })
    .await;
}

/// One node with a Redis front of `config`; runs `client` (blocking) against its address,
/// then stops both.
async fn with_front(
    name: &str,
    config: RespConfig,
    client: impl FnOnce(SocketAddr) + Send + 'static,
) {
    let node = start(name, ring_config()).await;
    let server = node
        .serve_resp("127.0.0.1:0".parse().unwrap(), config)
        .await
        .unwrap();
    let addr = server.local_addr();
    tokio::task::spawn_blocking(move || client(addr))
        .await
        .unwrap();
    server.stop();
    node.shutdown().await;
}

/// Reads one line (up to `\n`) from a blocking socket.
fn read_line(s: &mut TcpStream) -> String {
    let mut line = Vec::new();
    let mut b = [0u8; 1];
    while s.read(&mut b).unwrap_or(0) == 1 {
        line.push(b[0]);
        if b[0] == b'\n' {
            break;
        }
    }
    String::from_utf8_lossy(&line).to_string()
}

/// Whether the server closes `s` (it reads the end of the stream) within `wait`.
fn closed_within(s: &mut TcpStream, wait: Duration) -> bool {
    s.set_read_timeout(Some(wait)).unwrap();
    let mut buf = [0u8; 256];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reply_off_skip_and_on() {
    with_front("cr1", RespConfig::default(), move |addr| {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        // SKIP: neither it nor the next command answers; OFF: nothing until ON, which answers.
        s.write_all(
            b"CLIENT REPLY SKIP\r\nECHO one\r\nECHO two\r\nCLIENT REPLY OFF\r\nECHO three\r\n\
              SET k v\r\nCLIENT REPLY ON\r\nECHO four\r\nGET k\r\n",
        )
        .unwrap();
        let got: Vec<String> = (0..6).map(|_| read_line(&mut s)).collect();
        assert_eq!(
            got,
            ["$3\r\n", "two\r\n", "+OK\r\n", "$4\r\n", "four\r\n", "$1\r\n"],
            "replies"
        );
        assert_eq!(
            read_line(&mut s),
            "v\r\n",
            "the SET without a reply was done"
        );
        s.write_all(b"CLIENT REPLY MAYBE\r\n").unwrap();
        assert!(read_line(&mut s).starts_with("-ERR"));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_clients_are_closed_and_make_room_for_new_ones() {
    let config = RespConfig {
        max_clients: 2,
        idle_timeout: Some(Duration::from_millis(1500)),
        ..RespConfig::default()
    };
    with_front("idle1", config, move |addr| {
        let ping = |s: &mut TcpStream| {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            s.write_all(b"PING\r\n").unwrap();
            read_line(s)
        };
        let mut first = TcpStream::connect(addr).unwrap();
        assert_eq!(ping(&mut first), "+PONG\r\n");
        std::thread::sleep(Duration::from_millis(1100));
        let mut second = TcpStream::connect(addr).unwrap();
        assert_eq!(ping(&mut second), "+PONG\r\n");
        // Full: the third takes the slot of the first (idle for over a second).
        let mut third = TcpStream::connect(addr).unwrap();
        assert_eq!(ping(&mut third), "+PONG\r\n");
        assert!(
            closed_within(&mut first, Duration::from_secs(5)),
            "the oldest idle one goes"
        );
        // Full again, and nobody idle for a second: a fourth is refused.
        let mut fourth = TcpStream::connect(addr).unwrap();
        assert_eq!(
            read_line(&mut fourth),
            "-ERR max number of clients reached\r\n"
        );
        // Left alone, the others are closed at the idle timeout.
        assert!(closed_within(&mut second, Duration::from_secs(5)));
        assert!(closed_within(&mut third, Duration::from_secs(5)));
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_holding_too_much_are_closed_and_the_rest_is_served() {
    let config = RespConfig {
        max_buffered: 4 << 20,
        ..RespConfig::default()
    };
    with_front("buf1", config, move |addr| {
        // Eight clients each start a 3 MiB value and never finish it: 24 MiB against 4 MiB.
        let mut hogs: Vec<TcpStream> = (0..8)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$8388608\r\n")
                    .unwrap();
                let _ = s.write_all(&vec![b'x'; 3 << 20]);
                s
            })
            .collect();
        let mut cut = 0;
        for h in &mut hogs {
            h.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let line = read_line(h);
            if line == "-ERR client buffer limit reached\r\n" {
                cut += 1;
            }
        }
        assert!(cut >= 6, "{cut} of 8 closed");
        // A normal client is still served.
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(b"SET small v\r\nGET small\r\n").unwrap();
        assert_eq!(read_line(&mut s), "+OK\r\n");
    })
    .await;
}
