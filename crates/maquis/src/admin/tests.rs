//! Tests of the admin server, client and renderers.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::metrics::{counter_family, escape_label_value};
use super::server::{parse_ping_query, percent_decode, PingParams};
use super::*;

fn sample_status() -> Status {
    Status {
        name: "n1".into(),
        incarnation: 7,
        overlay: "full-mesh".into(),
        listen: "127.0.0.1:7100".into(),
        members: vec!["n1".into(), "n2".into(), "n3".into()],
        peers: vec![
            PeerStatus {
                name: "n2".into(),
                addr: "127.0.0.1:7101".into(),
                incarnation: 3,
                up: true,
                rtt_us: Some(1_250),
                stripe_window_bytes: Some(256 << 20),
                lanes: vec![
                    LaneStatus {
                        channel: "vnode".into(),
                        index: 0,
                        connected: true,
                        msgs_out: 10,
                        direct_out: 8,
                        bytes_out: 123,
                        msgs_in: 11,
                        bytes_in: 456,
                        queued_bytes: 7,
                        dropped: 1,
                        small: true,
                        striped: false,
                    },
                    LaneStatus {
                        channel: "default".into(),
                        index: 1,
                        connected: false,
                        msgs_out: 0,
                        direct_out: 0,
                        bytes_out: 0,
                        msgs_in: 0,
                        bytes_in: 0,
                        queued_bytes: 0,
                        dropped: 0,
                        small: false,
                        striped: true,
                    },
                ],
            },
            PeerStatus {
                name: "n3".into(),
                addr: "127.0.0.1:7102".into(),
                incarnation: 1,
                up: false,
                rtt_us: None,
                stripe_window_bytes: None,
                lanes: vec![],
            },
        ],
        counters: BTreeMap::from([
            ("actor.spawned".to_owned(), 5),
            ("messages_routed".to_owned(), 42),
        ]),
        gauges: BTreeMap::from([("actors".to_owned(), 3)]),
        refusals: vec![RefusalStatus {
            addr: "10.0.0.9:7000".into(),
            by_us: true,
            count: 12,
            reason: "authentication failed: stranger does not know the cookie".into(),
            ago_ms: 40,
        }],
    }
}

struct Fake {
    status: Status,
}

impl AdminSource for Fake {
    fn status(&self) -> Status {
        self.status.clone()
    }

    fn ping(
        &self,
        to: String,
        count: u32,
        size: usize,
    ) -> Pin<Box<dyn Future<Output = PingReport> + Send>> {
        Box::pin(async move {
            PingReport {
                errors: if to == "nobody" {
                    vec!["unknown node".into()]
                } else {
                    vec![]
                },
                ok: if to == "nobody" { 0 } else { count },
                failed: if to == "nobody" { count } else { 0 },
                p50_us: size as u64,
                p99_us: size as u64 * 2,
                max_us: size as u64 * 3,
                to,
                count,
                size,
            }
        })
    }
}

struct Server {
    addr: String,
    stop: Option<oneshot::Sender<()>>,
    handle: JoinHandle<std::io::Result<()>>,
}

async fn start() -> Server {
    start_with(Arc::new(Fake {
        status: sample_status(),
    }))
    .await
}

async fn start_with(source: Arc<dyn AdminSource>) -> Server {
    start_guarded(source, None).await
}

async fn start_guarded(source: Arc<dyn AdminSource>, token: Option<&str>) -> Server {
    let token = token.map(str::to_owned);
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local_addr").to_string();
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(serve(listener, source, token, async move {
        let _ = stopped.await;
    }));
    Server {
        addr,
        stop: Some(stop),
        handle,
    }
}

/// Sends raw bytes, then reads until the server closes the connection.
async fn raw(addr: &str, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut answer))
        .await
        .expect("server answers and closes in time")
        .expect("read");
    String::from_utf8_lossy(&answer).into_owned()
}

async fn raw_get(addr: &str, method: &str, target: &str) -> String {
    let request = format!("{method} {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    raw(addr, request.as_bytes()).await
}

fn expect_http(result: Result<impl std::fmt::Debug, AdminError>, want: u16) -> String {
    match result {
        Err(AdminError::Http { status, body }) if status == want => body,
        other => panic!("expected HTTP {want}, got {other:?}"),
    }
}

#[tokio::test]
async fn status_round_trips() {
    let server = start().await;
    let status = client::get_status(&server.addr, None)
        .await
        .expect("status");
    assert_eq!(status, sample_status());
    // With an http:// prefix and a trailing slash too.
    let again = client::get_status(&format!("http://{}/", server.addr), None)
        .await
        .expect("status");
    assert_eq!(again, sample_status());
    let answer = raw_get(&server.addr, "GET", "/status").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer
        .to_ascii_lowercase()
        .contains("content-type: application/json\r\n"));
}

#[tokio::test]
async fn metrics_over_http() {
    let server = start().await;
    let metrics = client::get_metrics(&server.addr, None)
        .await
        .expect("metrics");
    assert_eq!(metrics, render_metrics(&sample_status()));
    let answer = raw_get(&server.addr, "GET", "/metrics").await;
    assert!(answer
        .to_ascii_lowercase()
        .contains("content-type: text/plain; version=0.0.4\r\n"));
}

#[test]
fn metrics_lines() {
    let metrics = render_metrics(&sample_status());
    let lines: Vec<&str> = metrics.lines().collect();
    for expected in [
        "# HELP maquis_lane_bytes_out_total Bytes sent on the lane.",
        "# TYPE maquis_lane_bytes_out_total counter",
        r#"maquis_lane_bytes_out_total{peer="n2",channel="vnode",index="0"} 123"#,
        r#"maquis_lane_bytes_out_total{peer="n2",channel="default",index="1"} 0"#,
        r#"maquis_lane_messages_in_total{peer="n2",channel="vnode",index="0"} 11"#,
        "# TYPE maquis_lane_messages_direct_out_total counter",
        r#"maquis_lane_messages_direct_out_total{peer="n2",channel="vnode",index="0"} 8"#,
        "# TYPE maquis_lane_queued_bytes gauge",
        r#"maquis_lane_queued_bytes{peer="n2",channel="vnode",index="0"} 7"#,
        r#"maquis_lane_dropped_total{peer="n2",channel="vnode",index="0"} 1"#,
        r#"maquis_lane_connected{peer="n2",channel="vnode",index="0"} 1"#,
        r#"maquis_lane_connected{peer="n2",channel="default",index="1"} 0"#,
        "# TYPE maquis_lane_striped gauge",
        r#"maquis_lane_small{peer="n2",channel="vnode",index="0"} 1"#,
        r#"maquis_lane_striped{peer="n2",channel="default",index="1"} 1"#,
        "# TYPE maquis_peer_up gauge",
        r#"maquis_peer_up{peer="n2"} 1"#,
        r#"maquis_peer_up{peer="n3"} 0"#,
        "# TYPE maquis_peer_heartbeat_rtt_seconds gauge",
        r#"maquis_peer_heartbeat_rtt_seconds{peer="n2"} 0.001250"#,
        "# TYPE maquis_members gauge",
        "maquis_members 3",
        "# TYPE maquis_actor_spawned_total counter",
        "maquis_actor_spawned_total 5",
        "maquis_messages_routed_total 42",
    ] {
        assert!(
            lines.contains(&expected),
            "missing {expected:?} in\n{metrics}"
        );
    }
    assert!(!metrics.contains(r#"maquis_peer_heartbeat_rtt_seconds{peer="n3"}"#));
    // HELP and TYPE once per family, and every sample's family declared before it.
    let mut declared = Vec::new();
    for line in &lines {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let name = rest.split(' ').next().expect("name");
            assert!(!declared.contains(&name), "TYPE twice for {name}");
            declared.push(name);
        } else if !line.starts_with('#') {
            let name = line.split(['{', ' ']).next().expect("name");
            assert_eq!(
                declared.last(),
                Some(&name),
                "sample outside its family: {line}"
            );
        }
    }
    assert_eq!(
        metrics.matches("# HELP ").count(),
        declared.len(),
        "one HELP per family"
    );
}

#[test]
fn metrics_without_peers_and_odd_counter_names() {
    let mut status = sample_status();
    status.peers.clear();
    status.counters = BTreeMap::from([
        ("a.b".to_owned(), 1),
        ("a-b".to_owned(), 2),
        ("requests_total".to_owned(), 3),
        ("lane.dropped".to_owned(), 4),
        (String::new(), 5),
    ]);
    let metrics = render_metrics(&status);
    assert!(!metrics.contains("maquis_lane_"), "{metrics}");
    assert!(!metrics.contains("maquis_peer_"), "{metrics}");
    assert!(metrics.contains("\nmaquis_a_b_total 3\n"), "{metrics}");
    assert_eq!(metrics.matches("# TYPE maquis_a_b_total ").count(), 1);
    assert!(metrics.contains("\nmaquis_requests_total 3\n"), "{metrics}");
    assert!(metrics.contains("\nmaquis_unnamed_total 5\n"), "{metrics}");
    assert_eq!(counter_family("x/y z"), "maquis_x_y_z_total");
}

#[test]
fn label_values_are_escaped() {
    assert_eq!(escape_label_value("plain"), "plain");
    assert_eq!(escape_label_value(r#"a"b"#), r#"a\"b"#);
    assert_eq!(escape_label_value(r"a\b"), r"a\\b");
    assert_eq!(escape_label_value("a\nb"), r"a\nb");
    assert_eq!(escape_label_value("\\\"\n"), r#"\\\"\n"#);

    let mut status = sample_status();
    status.peers[0].name = "we\"ird\\\nname".into();
    let metrics = render_metrics(&status);
    assert!(
        metrics.contains(r#"maquis_peer_up{peer="we\"ird\\\nname"} 1"#),
        "{metrics}"
    );
}

#[tokio::test]
async fn ping_round_trips() {
    let server = start().await;
    let report = client::ping(&server.addr, None, "n2", 5, 100)
        .await
        .expect("ping");
    assert_eq!(
        report,
        PingReport {
            to: "n2".into(),
            count: 5,
            size: 100,
            ok: 5,
            failed: 0,
            p50_us: 100,
            p99_us: 200,
            max_us: 300,
            errors: vec![],
        }
    );
    // Names are percent-encoded by the client and decoded by the server.
    let odd = client::ping(&server.addr, None, "n 2&x=é", 1, 0)
        .await
        .expect("ping");
    assert_eq!(odd.to, "n 2&x=é");
    let failed = client::ping(&server.addr, None, "nobody", MAX_PING_COUNT, MAX_PING_SIZE)
        .await
        .expect("ping");
    assert_eq!((failed.ok, failed.failed), (0, MAX_PING_COUNT));
    // GET works too.
    let answer = raw_get(&server.addr, "GET", "/ping?to=n2&count=2&size=3").await;
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
    assert!(answer.contains(r#""count":2"#), "{answer}");
}

#[tokio::test]
async fn ping_with_bad_parameters_is_400() {
    let server = start().await;
    let body = expect_http(client::ping(&server.addr, None, "n2", 0, 10).await, 400);
    assert!(body.contains("count"), "{body}");
    expect_http(
        client::ping(&server.addr, None, "n2", MAX_PING_COUNT + 1, 10).await,
        400,
    );
    let body = expect_http(
        client::ping(&server.addr, None, "n2", 1, MAX_PING_SIZE + 1).await,
        400,
    );
    assert!(body.contains("size"), "{body}");
    expect_http(client::ping(&server.addr, None, "", 1, 1).await, 400);

    for target in [
        "/ping",
        "/ping?count=1&size=1",
        "/ping?to=n2&size=1",
        "/ping?to=n2&count=1",
        "/ping?to=n2&count=abc&size=1",
        "/ping?to=n2&count=-1&size=1",
        "/ping?to=n2&count=1&size=1.5",
        "/ping?to=n2&count=99999999999999999999&size=1",
        "/ping?to=n2&to=n3&count=1&size=1",
        "/ping?to=%ZZ&count=1&size=1",
    ] {
        let answer = raw_get(&server.addr, "POST", target).await;
        assert!(
            answer.starts_with("HTTP/1.1 400 Bad Request\r\n"),
            "{target}: {answer}"
        );
        assert!(answer
            .to_ascii_lowercase()
            .contains("content-type: text/plain"));
    }
}

#[tokio::test]
async fn unknown_path_is_404_and_other_methods_405() {
    let server = start().await;
    for target in ["/", "/nope", "/status/extra", "/pingx"] {
        let answer = raw_get(&server.addr, "GET", target).await;
        assert!(
            answer.starts_with("HTTP/1.1 404 Not Found\r\n"),
            "{target}: {answer}"
        );
    }
    let answer = raw_get(&server.addr, "DELETE", "/status").await;
    assert!(answer.starts_with("HTTP/1.1 405 "), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("allow: get, post\r\n"));
    let answer = raw_get(&server.addr, "PUT", "/nope").await;
    assert!(answer.starts_with("HTTP/1.1 405 "), "{answer}");
    let answer = raw_get(&server.addr, "POST", "/status").await;
    assert!(answer.starts_with("HTTP/1.1 405 "), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("allow: get\r\n"));
}

#[tokio::test]
async fn request_body_is_not_needed() {
    let server = start().await;
    // Announces a body it never sends: the answer comes anyway.
    let mut stream = TcpStream::connect(&server.addr).await.expect("connect");
    stream
        .write_all(b"POST /ping?to=n2&count=1&size=8 HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n")
        .await
        .expect("write");
    let mut answer = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut answer))
        .await
        .expect("answer in time")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..n]);
    assert!(answer.starts_with("HTTP/1.1 200 OK\r\n"), "{answer}");
}

#[tokio::test]
async fn garbage_does_not_stop_the_server() {
    let server = start().await;
    // Pure garbage.
    let answer = raw(&server.addr, b"\x00\x01\x02garbage\xff\xfe\r\n\r\n").await;
    assert!(!answer.contains("200 OK"), "{answer}");
    // A request line that is not HTTP.
    raw(&server.addr, b"HELLO THERE\r\n\r\n").await;
    // A connection that closes at once, and one that closes mid-request.
    drop(TcpStream::connect(&server.addr).await.expect("connect"));
    let mut half = TcpStream::connect(&server.addr).await.expect("connect");
    half.write_all(b"GET /sta").await.expect("write");
    drop(half);

    let status = client::get_status(&server.addr, None)
        .await
        .expect("status");
    assert_eq!(&*status.name, "n1");
    assert!(!server.handle.is_finished());
}

#[tokio::test]
async fn extra_connections_wait_for_a_permit() {
    let server = start().await;
    let mut idle = Vec::new();
    // From several addresses (each may hold only its share), all the server serves at once.
    for i in 0..MAX_ADMIN_CONNECTIONS {
        let source = format!("127.0.0.{}", 2 + i / MAX_ADMIN_CONNECTIONS_PER_SOURCE);
        idle.push(connect_from(&source, &server.addr).await);
    }
    // Let the server accept them all.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let addr = server.addr.clone();
    let mut waiting = tokio::spawn(async move { client::get_status(&addr, None).await });
    let early = tokio::time::timeout(Duration::from_millis(300), &mut waiting).await;
    assert!(early.is_err(), "served although all permits were taken");
    drop(idle.pop());
    let status = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("served once a permit is free")
        .expect("task")
        .expect("status");
    assert_eq!(status, sample_status());
}

#[tokio::test]
async fn shutdown_makes_serve_return() {
    let mut server = start().await;
    // An idle keep-alive connection must not hold the shutdown up.
    let mut idle = TcpStream::connect(&server.addr).await.expect("connect");
    idle.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .expect("write");
    let mut buf = vec![0; 4096];
    let n = idle.read(&mut buf).await.expect("read");
    assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK\r\n"));

    server.stop.take().expect("stop").send(()).expect("send");
    let result = tokio::time::timeout(Duration::from_secs(3), server.handle)
        .await
        .expect("serve returns promptly")
        .expect("task");
    assert!(result.is_ok());
    assert!(client::get_status(&server.addr, None).await.is_err());
}

#[tokio::test]
async fn client_errors() {
    assert!(matches!(
        client::get_status("", None).await,
        Err(AdminError::InvalidAddress(_))
    ));
    assert!(matches!(
        client::get_status("127.0.0.1:1/x", None).await,
        Err(AdminError::InvalidAddress(_))
    ));
    // Nothing listens there any more.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    drop(listener);
    assert!(matches!(
        client::get_metrics(&addr, None).await,
        Err(AdminError::Io(_))
    ));
}

#[test]
fn ping_query_parsing() {
    assert_eq!(
        parse_ping_query(Some("to=n%202&count=3&size=0&extra=1")),
        Ok(PingParams {
            to: "n 2".into(),
            count: 3,
            size: 0
        })
    );
    assert_eq!(
        parse_ping_query(Some("size=16777216&count=100000&&to=a+b")),
        Ok(PingParams {
            to: "a b".into(),
            count: MAX_PING_COUNT,
            size: MAX_PING_SIZE
        })
    );
    assert!(parse_ping_query(None).is_err());
    assert!(parse_ping_query(Some("to&count=1&size=1")).is_err());
    assert_eq!(percent_decode("%41%c3%A9"), Some("Aé".into()));
    assert_eq!(percent_decode("%4"), None);
    assert_eq!(percent_decode("%ff"), None);
    assert_eq!(client::percent_encode("a b&é"), "a%20b%26%C3%A9");
}

#[test]
fn table_for_people() {
    let table = sample_status().render_table();
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0],
        "node n1  incarnation 7  overlay full-mesh  listen 127.0.0.1:7100"
    );
    assert_eq!(lines[1], "members (3): n1, n2, n3");
    assert!(lines[2].starts_with("PEER"), "{table}");
    assert!(lines[2].contains("BYTES OUT"), "{table}");
    assert!(lines[3].starts_with("n2 "), "{table}");
    assert!(lines[3].contains("vnode"), "{table}");
    assert!(lines[3].contains("123 B"), "{table}");
    assert!(lines[4].contains("default"), "{table}");
    let carries = lines[2].find("CARRIES").expect("column");
    assert_eq!(lines[3].find("small"), Some(carries), "{table}");
    assert_eq!(lines[4].find("striped"), Some(carries), "{table}");
    assert!(
        lines[5].starts_with("n3 ") && lines[5].contains("down"),
        "{table}"
    );
    assert!(table.contains("messages_routed  42"), "{table}");
    assert!(
        table.contains(
            "refused handshakes:\n  10.0.0.9:7000  by us  x12  40 ms ago  authentication failed"
        ),
        "{table}"
    );
    // Columns line up: every row of the table part has "CHANNEL"'s column at the same place.
    let col = lines[2].find("CHANNEL").expect("column");
    assert_eq!(lines[3].find("vnode"), Some(col), "{table}");
    assert_eq!(lines[4].find("default"), Some(col), "{table}");
}

/// A connection to `addr` from the local address `source` (any of 127.0.0.0/8 on Linux).
async fn connect_from(source: &str, addr: &str) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.bind(format!("{source}:0").parse().unwrap())
        .expect("bind");
    sock.connect(addr.parse().unwrap()).await.expect("connect")
}

/// A source whose pings wait until the test lets them finish.
struct Held {
    go: Arc<tokio::sync::Semaphore>,
    started: Arc<tokio::sync::Semaphore>,
}

impl AdminSource for Held {
    fn status(&self) -> Status {
        sample_status()
    }

    fn ping(
        &self,
        to: String,
        count: u32,
        size: usize,
    ) -> Pin<Box<dyn Future<Output = PingReport> + Send>> {
        let (go, started) = (self.go.clone(), self.started.clone());
        Box::pin(async move {
            started.add_permits(1);
            go.acquire().await.expect("open").forget();
            PingReport {
                to,
                count,
                size,
                ok: count,
                failed: 0,
                p50_us: 1,
                p99_us: 1,
                max_us: 1,
                errors: vec![],
            }
        })
    }
}

#[tokio::test]
async fn pings_in_progress_hold_at_most_their_budget() {
    let go = Arc::new(tokio::sync::Semaphore::new(0));
    let started = Arc::new(tokio::sync::Semaphore::new(0));
    let server = start_with(Arc::new(Held {
        go: go.clone(),
        started: started.clone(),
    }))
    .await;
    let full = MAX_PING_BYTES_IN_FLIGHT / MAX_PING_SIZE;
    let mut running = Vec::new();
    for _ in 0..full {
        let addr = server.addr.clone();
        running.push(tokio::spawn(async move {
            client::ping(&addr, None, "n2", 1, MAX_PING_SIZE).await
        }));
    }
    // Every one of them is inside the source, holding its bytes.
    started
        .acquire_many(full as u32)
        .await
        .expect("open")
        .forget();
    let body = expect_http(
        client::ping(&server.addr, None, "n2", 1, MAX_PING_SIZE).await,
        503,
    );
    assert!(body.contains("too many pings"), "{body}");
    go.add_permits(full);
    for r in running {
        assert_eq!(r.await.expect("task").expect("ping").ok, 1);
    }
    // The budget is back.
    go.add_permits(1);
    assert_eq!(
        client::ping(&server.addr, None, "n2", 1, MAX_PING_SIZE)
            .await
            .expect("ping")
            .ok,
        1
    );
}

#[tokio::test]
async fn one_address_cannot_take_every_admin_connection() {
    let server = start().await;
    // Idle connections from one address, up to its share, then one more.
    let mut idle = Vec::new();
    for _ in 0..MAX_ADMIN_CONNECTIONS_PER_SOURCE {
        idle.push(TcpStream::connect(&server.addr).await.expect("connect"));
    }
    let mut extra = TcpStream::connect(&server.addr).await.expect("connect");
    let mut buf = [0u8; 1];
    let n = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut buf))
        .await
        .expect("the extra connection is closed at once")
        .unwrap_or(0);
    assert_eq!(n, 0);
    // Another address is served.
    let mut other = connect_from("127.0.0.2", &server.addr).await;
    other
        .write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), other.read_to_end(&mut answer))
        .await
        .expect("answered")
        .expect("read");
    assert!(answer.starts_with(b"HTTP/1.1 200 OK"));
    drop(idle);
}

#[tokio::test]
async fn a_token_guards_every_route() {
    let server = start_guarded(
        Arc::new(Fake {
            status: sample_status(),
        }),
        Some("s3cret"),
    )
    .await;
    let body = expect_http(client::get_status(&server.addr, None).await, 401);
    assert!(body.contains("needs its token"), "{body}");
    let body = expect_http(client::get_status(&server.addr, Some("s3cres")).await, 401);
    assert!(body.contains("wrong token"), "{body}");
    // The scheme's case does not matter.
    let answer = raw(
        &server.addr,
        b"GET /status HTTP/1.1\r\nHost: x\r\nauthorization: bearer s3cret\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer}");
    expect_http(client::get_metrics(&server.addr, Some("")).await, 401);
    expect_http(client::ping(&server.addr, None, "n2", 1, 1).await, 401);
    let answer = raw_get(&server.addr, "GET", "/status").await;
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{answer}"
    );
    assert_eq!(
        client::get_status(&server.addr, Some("s3cret"))
            .await
            .expect("status"),
        sample_status()
    );
    assert_eq!(
        client::ping(&server.addr, Some("s3cret"), "n2", 2, 8)
            .await
            .expect("ping")
            .ok,
        2
    );
}
