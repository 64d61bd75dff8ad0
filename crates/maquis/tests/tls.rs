//! TLS on the lanes (`transport.tls`): nodes with certificates of the cluster's CA join and
//! talk; a node without TLS, with a certificate of another CA, or with a certificate of another
//! name never gets a message through, in either role; a silent TLS connection holds no
//! handshake slot for long; bad TLS files are refused at start, naming the key and the file.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::tls::{member, with_tls, Ca, Dir, NodeCert};
use common::*;
use maquis::config::TlsFileError;
use maquis::{Config, ConfigError, Node, NodeId, ReplyTo, StartError};
use maquis_proto::wire::handshake::{self, HandshakeMsg, RejectCode};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Serialize, Deserialize)]
enum Ask {
    Add(u64, ReplyTo<u64>),
}

/// A node of `name` with TLS, a certificate of `ca` naming it, trusting `ca`.
async fn tls_node(name: &str, dir: &Dir, ca: &Ca) -> maquis::Node {
    start_with(member(config(name), dir, ca)).await
}

fn refused_with(node: &maquis::Node, by_us: bool, words: &str) -> bool {
    node.status()
        .refusals
        .iter()
        .any(|r| r.by_us == by_us && r.reason.contains(words))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_of_one_ca_join_send_and_call() {
    let dir = Dir::new();
    let ca = Ca::new("cluster");
    let mut cfg = member(config("tls-a"), &dir, &ca);
    cfg.transport.parallelism = 4;
    let a = start_with(cfg).await;
    let mut cfg = member(config("tls-b"), &dir, &ca);
    cfg.transport.parallelism = 4;
    let b = start_with(cfg).await;
    b.join_wait(a.addr(), Duration::from_secs(5)).await.unwrap();
    until("both see each other", Duration::from_secs(5), || {
        let ok = a.member("tls-b").is_some() && b.member("tls-a").is_some();
        async move { ok }
    })
    .await;
    until("every lane is up", Duration::from_secs(5), || {
        let lanes = b.lanes_connected("tls-a");
        let ok = !lanes.is_empty() && lanes.iter().all(|(_, up, want)| up == want);
        async move { ok }
    })
    .await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let sink = a.spawn_fn(move |mut inbox: maquis::Inbox<String>| async move {
        while let Some(m) = inbox.recv().await {
            let _ = tx.send(m);
        }
    });
    a.register("sink", &sink).unwrap();
    let adder = a.spawn_fn(|mut inbox: maquis::Inbox<Ask>| async move {
        while let Some(Ask::Add(n, reply)) = inbox.recv().await {
            let _ = reply.send(n + 1).await;
        }
    });
    a.register("adder", &adder).unwrap();
    let to_sink = b.remote::<String>("tls-a", "sink").unwrap();
    for i in 0..100 {
        to_sink.send(format!("m{i}")).await.unwrap();
    }
    for i in 0..100 {
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("the message arrives");
        assert_eq!(got, Some(format!("m{i}")));
    }
    let to_adder = b.remote::<Ask>("tls-a", "adder").unwrap();
    let n = to_adder
        .call(|r| Ask::Add(41, r), Duration::from_secs(5))
        .await
        .unwrap();
    assert_eq!(n, 42);
    // Large messages cross many TLS records, more than the socket takes at once; each
    // arrives without a later write to push it out.
    let (big_tx, mut big_rx) = tokio::sync::mpsc::unbounded_channel();
    let big_sink = a.spawn_fn(move |mut inbox: maquis::Inbox<Vec<u8>>| async move {
        while let Some(m) = inbox.recv().await {
            let _ = big_tx.send(m);
        }
    });
    a.register("big", &big_sink).unwrap();
    let to_big = b.remote::<Vec<u8>>("tls-a", "big").unwrap();
    for i in 0..4u8 {
        to_big.send(vec![i; 4 << 20]).await.unwrap();
        let got = tokio::time::timeout(Duration::from_secs(10), big_rx.recv())
            .await
            .expect("the large message arrives")
            .unwrap();
        assert!(got.len() == 4 << 20 && got.iter().all(|&x| x == i));
    }
    assert_eq!(a.counters().handshake_failures.get(), 0);
    assert_eq!(b.counters().handshake_failures.get(), 0);
    a.shutdown().await;
    b.shutdown().await;
}

/// A hand-made TLS client with a certificate of `ca` naming `san`, connected to `to` (whose
/// certificate must name `server`).
async fn tls_client(
    to: std::net::SocketAddr,
    ca: &Ca,
    san: &str,
    server: &str,
) -> tokio_rustls::client::TlsStream<TcpStream> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca.pem.as_bytes()).unwrap())
        .unwrap();
    let c = ca.node(san);
    let certs = vec![CertificateDer::from_pem_slice(c.cert.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(c.key.as_bytes()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .unwrap();
    let tcp = TcpStream::connect(to).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from(server.to_string()).unwrap(), tcp)
        .await
        .expect("the TLS handshake completes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cookie_handshake_runs_inside_tls() {
    let dir = Dir::new();
    let ca = Ca::new("cluster");
    let a = tls_node("in-a", &dir, &ca).await;
    // A certificate of the cluster's CA gets a TLS connection, then the cookie handshake as
    // without TLS: a wrong cookie is still refused.
    let s = tls_client(a.addr(), &ca, "in-b", "in-a").await;
    let me = NodeId::new("in-b", "127.0.0.1:9".parse().unwrap(), 1);
    let (mut s, transcript) = raw::hello_on(s, me, "membership").await;
    assert_eq!(transcript.acceptor, *a.id());
    let proof = transcript.dialer_proof(b"not-the-cookie");
    raw::write_msg(&mut s, &HandshakeMsg::Response { proof }).await;
    assert!(matches!(
        raw::read_msg(&mut s).await,
        HandshakeMsg::Rejected {
            code: RejectCode::Auth,
            ..
        }
    ));
    // With the cookie, the same certificate is accepted.
    let s = tls_client(a.addr(), &ca, "in-b", "in-a").await;
    let me = NodeId::new("in-b", "127.0.0.1:9".parse().unwrap(), 1);
    let (mut s, transcript) = raw::hello_on(s, me, "membership").await;
    let proof = transcript.dialer_proof(b"test-cookie");
    raw::write_msg(&mut s, &HandshakeMsg::Response { proof }).await;
    assert!(matches!(
        raw::read_msg(&mut s).await,
        HandshakeMsg::Accepted { .. }
    ));
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_without_tls_gets_nothing_through_either_way() {
    let dir = Dir::new();
    let ca = Ca::new("cluster");
    let a = tls_node("plain-a", &dir, &ca).await;
    let p = start("plain-p").await;
    // The plain node dials the TLS node.
    let err = p
        .join_wait(a.addr(), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("speaks TLS"), "{err}");
    until(
        "the TLS node counts and lists the refusal",
        Duration::from_secs(5),
        || {
            let ok = a.counters().handshake_failures.get() >= 1
                && refused_with(&a, true, "not a TLS handshake");
            async move { ok }
        },
    )
    .await;
    // The TLS node dials the plain node (the connection closes during the TLS handshake,
    // which the join takes for a failure that may pass, until its time is up).
    let err = a
        .join_wait(p.addr(), Duration::from_secs(1))
        .await
        .unwrap_err();
    assert!(!err.to_string().is_empty());
    until(
        "the plain node counts and lists the refusal",
        Duration::from_secs(5),
        || {
            let ok =
                p.counters().handshake_failures.get() >= 1 && refused_with(&p, true, "speaks TLS");
            async move { ok }
        },
    )
    .await;
    assert_eq!(a.members().len(), 1);
    assert_eq!(p.members().len(), 1);
    assert!(p.remote::<String>("plain-a", "echo").is_none());
    a.shutdown().await;
    p.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_another_ca_is_refused_in_both_roles() {
    let dir = Dir::new();
    let ca = Ca::new("cluster");
    let other = Ca::new("elsewhere");
    let a = tls_node("ca-a", &dir, &ca).await;
    // The stranger trusts both CAs, so only the cluster node's own checks stand in its way.
    let both = format!("{}{}", ca.pem, other.pem);
    let x = start_with(with_tls(config("ca-x"), &dir, &other, "ca-x", &both)).await;
    let mut events = a.subscribe();

    // As dialer: the cluster node refuses the stranger's client certificate.
    let err = x
        .join_wait(a.addr(), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("certificate"), "{err}");
    until(
        "the cluster node counts and lists the refusal",
        Duration::from_secs(5),
        || {
            let ok = a.counters().handshake_failures.get() >= 1
                && refused_with(&a, true, "not signed by a CA of transport.tls_ca");
            async move { ok }
        },
    )
    .await;

    // As acceptor: the cluster node refuses the stranger's server certificate.
    let err = a
        .join_wait(x.addr(), Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("not signed by a CA of transport.tls_ca"),
        "{err}"
    );
    assert!(refused_with(
        &a,
        true,
        "not signed by a CA of transport.tls_ca"
    ));
    assert_eq!(a.members().len(), 1);
    assert_eq!(x.members().len(), 1);
    assert!(
        events.try_recv().is_err(),
        "the cluster node never saw the stranger up"
    );
    a.shutdown().await;
    x.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_another_name_is_refused_from_a_dialer() {
    let dir = Dir::new();
    let ca = Ca::new("cluster");
    let a = tls_node("nm-a", &dir, &ca).await;
    let b = tls_node("nm-b", &dir, &ca).await;
    b.join_wait(a.addr(), Duration::from_secs(5)).await.unwrap();
    let b_id = b.id().clone();
    // Someone with a certificate of the cluster's CA for "nm-m", and the cookie, claims to be
    // a new incarnation of nm-b; and someone with nm-b's own name in its certificate claims
    // to be NM-B (certificates compare names ignoring case, node names do not).
    for (san, claims, words) in [
        ("nm-m", "nm-b", "does not name nm-b"),
        ("nm-b", "NM-B", "not a DNS name in lower case"),
    ] {
        let impostor = NodeId::new(claims, "127.0.0.1:9".parse().unwrap(), u64::MAX);
        let mut s = tls_client(a.addr(), &ca, san, "nm-a").await;
        let hello = HandshakeMsg::Hello {
            magic: handshake::MAGIC,
            version: handshake::VERSION,
            node: impostor,
            lane: maquis::LaneId::new("membership", 0),
            nonce: handshake::new_nonce(),
            channels: vec![("membership".into(), 1), ("default".into(), 1)],
            max_frame: raw::MAX_FRAME,
        };
        raw::write_msg(&mut s, &hello).await;
        match raw::read_msg(&mut s).await {
            HandshakeMsg::Rejected { code, detail, .. } => {
                assert_eq!(code, RejectCode::Refused);
                assert!(detail.contains(words), "{detail}");
            }
            other => panic!("{claims}: expected a refusal, got {other:?}"),
        }
        until("the refusal is counted", Duration::from_secs(5), || {
            let ok = refused_with(&a, true, words);
            async move { ok }
        })
        .await;
    }
    assert!(a.counters().handshake_failures.get() >= 2);
    assert!(a.member("NM-B").is_none());
    assert_eq!(a.member("nm-b"), Some(b_id), "nm-b keeps its place");
    a.shutdown().await;
    b.shutdown().await;
}

/// A hand-made TLS acceptor on `listener` with the certificate `c` (trusting `ca_pem` for
/// client certificates): it answers one connection's `Hello` with a `Challenge` as `claims`,
/// then reports the next message it reads (`None` if the connection closes first).
async fn tls_impostor(
    listener: TcpListener,
    ca_pem: String,
    c: NodeCert,
    claims: NodeId,
) -> Option<HandshakeMsg> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).unwrap())
        .unwrap();
    let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .build()
    .unwrap();
    let certs = vec![CertificateDer::from_pem_slice(c.cert.as_bytes()).unwrap()];
    let key = PrivateKeyDer::from_pem_slice(c.key.as_bytes()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_client_cert_verifier(clients)
        .with_single_cert(certs, key)
        .unwrap();
    let (tcp, _) = listener.accept().await.unwrap();
    let mut s = tokio_rustls::TlsAcceptor::from(Arc::new(config))
        .accept(tcp)
        .await
        .expect("the dialer completes TLS");
    let HandshakeMsg::Hello { .. } = raw::read_msg(&mut s).await else {
        panic!("expected a Hello");
    };
    let challenge = HandshakeMsg::Challenge {
        node: claims,
        nonce: handshake::new_nonce(),
        max_frame: raw::MAX_FRAME,
    };
    raw::write_msg(&mut s, &challenge).await;
    let mut len = [0u8; 4];
    match s.read_exact(&mut len).await {
        Ok(_) => {
            let n = u32::from_be_bytes(len) as usize;
            let mut rest = vec![0u8; n];
            s.read_exact(&mut rest).await.ok()?;
            let mut buf = bytes::BytesMut::from(&len[..]);
            buf.extend_from_slice(&rest);
            use maquis_proto::wire::StreamDecoder;
            handshake::HandshakeDecoder.decode(&mut buf).ok().flatten()
        }
        Err(_) => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_of_another_name_is_refused_from_an_acceptor() {
    let dir = Dir::new();
    let ca = Ca::new("cluster");
    let a = tls_node("an-a", &dir, &ca).await;
    // A certificate of the cluster's CA for "an-m", presented by a node that says it is an-c.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let claims = NodeId::new("an-c", addr, 1);
    let impostor = tokio::spawn(tls_impostor(
        listener,
        ca.pem.clone(),
        ca.node("an-m"),
        claims,
    ));
    let err = a.join_wait(addr, Duration::from_secs(5)).await.unwrap_err();
    assert!(err.to_string().contains("does not name an-c"), "{err}");
    let next = impostor.await.unwrap();
    assert!(
        !matches!(next, Some(HandshakeMsg::Response { .. })),
        "the node answered the impostor's challenge: {next:?}"
    );
    assert!(refused_with(&a, true, "does not name an-c"));
    assert_eq!(a.members().len(), 1);
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_to_a_tls_node_is_closed_at_the_unauthenticated_deadline() {
    let dir = Dir::new();
    let ca = Ca::new("cluster");
    let mut cfg = member(config("slow-a"), &dir, &ca);
    cfg.transport.unauthenticated_timeout_ms = 300;
    // Far beyond the test's own limit: only the unauthenticated deadline can close them in
    // time.
    cfg.transport.handshake_timeout_ms = 60_000;
    let a = start_with(cfg).await;
    // One never starts TLS; the other starts it and stops halfway (a ClientHello's record
    // header, no body).
    let mut silent = TcpStream::connect(a.addr()).await.unwrap();
    let mut halfway = TcpStream::connect(a.addr()).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut halfway, &[0x16, 0x03, 0x01, 0x02, 0x00])
        .await
        .unwrap();
    for s in [&mut silent, &mut halfway] {
        let mut buf = [0u8; 64];
        let closed = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        })
        .await;
        assert!(closed.is_ok(), "the connection was held open");
    }
    until("both are counted", Duration::from_secs(5), || {
        let ok = a.counters().handshake_failures.get() >= 2
            && refused_with(&a, true, "no TLS handshake in time");
        async move { ok }
    })
    .await;
    a.shutdown().await;
}

/// The configuration error `Node::start` and `Config::validate` return for `cfg`.
async fn config_error(cfg: Config) -> ConfigError {
    let err = cfg.validate().unwrap_err();
    match Node::start(cfg).await {
        Err(StartError::Config(e)) => assert_eq!(e, err, "start and validate agree"),
        other => panic!("expected a configuration error, got {other:?}"),
    }
    err
}

#[tokio::test]
async fn bad_tls_files_are_refused_naming_the_key_and_the_file() {
    let dir = Dir::new();
    let ca = Ca::new("cluster");
    let good = member(config("cfg-a"), &dir, &ca);
    good.validate().expect("the good configuration");

    // TLS on, nothing set.
    let mut cfg = config("cfg-a");
    cfg.transport.tls = true;
    let err = config_error(cfg).await;
    assert!(
        matches!(&err, ConfigError::TlsMissing { key, .. } if key == "transport.tls_cert"),
        "{err:?}"
    );
    assert!(err.to_string().contains("transport.tls_cert"), "{err}");
    let mut cfg = good.clone();
    cfg.transport.tls_ca = None;
    let err = config_error(cfg).await;
    assert!(
        matches!(&err, ConfigError::TlsMissing { key, .. } if key == "transport.tls_ca"),
        "{err:?}"
    );

    let file_error = |err: &ConfigError, want_key: &str, want_path: &std::path::Path| match err {
        ConfigError::TlsFile { key, path, problem } => {
            assert_eq!(key, want_key);
            assert_eq!(path, want_path);
            let text = err.to_string();
            assert!(text.contains(want_key), "{text}");
            assert!(text.contains(&want_path.display().to_string()), "{text}");
            problem.clone()
        }
        other => panic!("expected a TLS file error, got {other:?}"),
    };

    // A file that is not there.
    let missing = dir.path().join("missing.crt");
    let mut cfg = good.clone();
    cfg.transport.tls_cert = Some(missing.clone());
    let err = config_error(cfg).await;
    assert!(matches!(
        file_error(&err, "transport.tls_cert", &missing),
        TlsFileError::Unreadable(_)
    ));

    // Not PEM at all, and PEM cut short.
    let junk = dir.write("junk.pem", "not a certificate\n");
    let mut cfg = good.clone();
    cfg.transport.tls_ca = Some(junk.clone());
    let err = config_error(cfg).await;
    assert_eq!(
        file_error(&err, "transport.tls_ca", &junk),
        TlsFileError::Empty("CERTIFICATE block")
    );
    let cut = dir.write("cut.pem", &ca.pem[..ca.pem.len() / 2]);
    let mut cfg = good.clone();
    cfg.transport.tls_cert = Some(cut.clone());
    let err = config_error(cfg).await;
    assert!(matches!(
        file_error(&err, "transport.tls_cert", &cut),
        TlsFileError::NotPem(_)
    ));

    // A certificate where the key should be, and the key of another certificate.
    let mut cfg = good.clone();
    let cert_as_key = cfg.transport.tls_cert.clone().unwrap();
    cfg.transport.tls_key = Some(cert_as_key.clone());
    let err = config_error(cfg).await;
    assert!(matches!(
        file_error(&err, "transport.tls_key", &cert_as_key),
        TlsFileError::Empty(_)
    ));
    let other_key = dir.write("other.key", ca.node("cfg-a").key);
    let mut cfg = good.clone();
    cfg.transport.tls_key = Some(other_key.clone());
    let err = config_error(cfg).await;
    assert_eq!(
        file_error(&err, "transport.tls_key", &other_key),
        TlsFileError::KeyMismatch
    );

    // A certificate the others would refuse: of another CA, or naming another node.
    let other = Ca::new("elsewhere");
    let cfg = with_tls(config("cfg-a"), &dir, &other, "cfg-a", &ca.pem);
    let cert = cfg.transport.tls_cert.clone().unwrap();
    let err = config_error(cfg).await;
    assert!(matches!(
        file_error(&err, "transport.tls_cert", &cert),
        TlsFileError::NotTrusted(_)
    ));
    let cfg = with_tls(config("cfg-a"), &dir, &ca, "cfg-z", &ca.pem);
    let cert = cfg.transport.tls_cert.clone().unwrap();
    let err = config_error(cfg).await;
    assert_eq!(
        file_error(&err, "transport.tls_cert", &cert),
        TlsFileError::WrongName("cfg-a".into())
    );

    // Names no certificate can carry: not a DNS name, or not in lower case (certificates
    // compare names ignoring case).
    for name in ["not a dns name", "Cfg-A"] {
        let cfg = with_tls(config(name), &dir, &ca, name, &ca.pem);
        let err = config_error(cfg).await;
        assert!(
            matches!(&err, ConfigError::Invalid { key, .. } if key == "node.name"),
            "{name}: {err:?}"
        );
    }

    // The files come from the environment as every option does; with TLS off they are not
    // read.
    let cfg = config("cfg-a")
        .apply_vars([
            ("MAQUIS_TRANSPORT_TLS".to_string(), "on".to_string()),
            (
                "MAQUIS_TRANSPORT_TLS_CERT".to_string(),
                good.transport
                    .tls_cert
                    .as_ref()
                    .unwrap()
                    .display()
                    .to_string(),
            ),
            (
                "MAQUIS_TRANSPORT_TLS_KEY".to_string(),
                good.transport
                    .tls_key
                    .as_ref()
                    .unwrap()
                    .display()
                    .to_string(),
            ),
            (
                "MAQUIS_TRANSPORT_TLS_CA".to_string(),
                good.transport
                    .tls_ca
                    .as_ref()
                    .unwrap()
                    .display()
                    .to_string(),
            ),
        ])
        .unwrap();
    assert_eq!(cfg.transport, good.transport);
    cfg.validate().unwrap();
    let mut off = config("cfg-a");
    off.transport.tls_cert = Some(missing);
    off.validate().expect("TLS off: the files are not read");
}
