use super::*;

fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn overlay_kind(c: &Config) -> OverlayKind {
    c.overlay.kind()
}

#[test]
fn toml_env_and_validation() {
    let c = Config::from_toml(
        "[node]\nname = \"n1\"\n[transport]\nparallelism = 4\n[overlay]\nkind = \"static\"\n\
         [[transport.channels]]\nname = \"vnode\"\nparallelism = 16\n",
    )
    .unwrap();
    assert_eq!(&*c.node.name, "n1");
    assert_eq!(overlay_kind(&c), OverlayKind::Static);
    let c = c
        .apply_vars(vars(&[
            ("MAQUIS_TRANSPORT_AFFINITY", "off"),
            ("MAQUIS_TRANSPORT_CHANNELS", "gossip,vnode:8"),
            ("OTHER", "x"),
        ]))
        .unwrap();
    assert!(!c.transport.affinity);
    let specs = c.transport.channel_specs();
    let names: Vec<_> = specs
        .iter()
        .map(|s| (s.name.as_str(), s.parallelism, s.offset))
        .collect();
    assert_eq!(
        names,
        vec![
            ("membership", 1, 0),
            ("default", 4, 1),
            ("gossip", 4, 5),
            ("vnode", 8, 9)
        ]
    );
    c.validate().unwrap();
    assert!(Config::from_toml("bogus = 1").is_err());
    assert!(Config::from_toml("[transport]\nbogus = 1").is_err());
    assert!(Config::new("x").parallelism(0).validate().is_err());
    assert!(Config::new("x")
        .channel("membership", None)
        .validate()
        .is_err());
    let err = Config::default()
        .apply_vars(vars(&[("MAQUIS_TRANSPORT_PARALLELISM", "many")]))
        .unwrap_err();
    assert!(
        err.to_string().starts_with("transport.parallelism:"),
        "{err}"
    );
    let err = Config::default()
        .apply_vars(vars(&[("MAQUIS_TRANSPORT_PARALELISM", "4")]))
        .unwrap_err();
    assert_eq!(
        err,
        ConfigError::UnknownVariable("MAQUIS_TRANSPORT_PARALELISM".into())
    );
    let c = Config::default()
        .apply_vars(vars(&[("MAQUIS_TRANSPORT_NODE_QUEUE_BYTES", "65536")]))
        .unwrap();
    assert_eq!(c.transport.node_queue_bytes, 65536);
    c.validate().unwrap();
    assert_eq!(Config::default().transport.node_queue_bytes, 512 << 20);
    let mut small = Config::default();
    small.transport.node_queue_bytes = 100;
    assert!(small.validate().is_err());
}

#[test]
fn peer_to_peer_selection_and_parameters() {
    for name in ["peer-to-peer", "hyparview"] {
        let c =
            Config::from_toml(&format!("[overlay]\nkind = \"{name}\"\nactive_size = 3\n")).unwrap();
        assert_eq!(overlay_kind(&c), OverlayKind::PeerToPeer);
        assert_eq!(c.overlay.peer_to_peer().unwrap().hyparview().active_size, 3);
        assert_eq!(
            name.parse::<OverlayKind>().unwrap(),
            OverlayKind::PeerToPeer
        );
    }
    assert_eq!(OverlayKind::PeerToPeer.as_str(), "peer-to-peer");
    let err = Config::from_toml("[overlay]\nkind = \"gossip\"").unwrap_err();
    assert!(matches!(err, ConfigError::File(_)), "{err}");
    let err = "gossip".parse::<OverlayKind>().unwrap_err();
    assert!(err.to_string().contains("peer-to-peer"), "{err}");
    let c = Config::default()
        .apply_vars(vars(&[
            ("MAQUIS_OVERLAY_PASSIVE_SIZE", "6"),
            ("MAQUIS_OVERLAY_SHUFFLE_PERIOD_MS", "250"),
            ("MAQUIS_OVERLAY_KIND", "hyparview"),
            ("MAQUIS_BROADCAST_HOP_LIMIT", "8"),
            ("MAQUIS_BROADCAST_MEMBER_TIMEOUT_MS", "3000"),
        ]))
        .unwrap();
    assert_eq!(overlay_kind(&c), OverlayKind::PeerToPeer);
    let hv = c.overlay.peer_to_peer().unwrap().hyparview();
    assert_eq!((hv.active_size, hv.passive_size), (5, 6));
    assert_eq!((hv.arwl, hv.prwl), (6, 3), "the paper's walk lengths");
    assert_eq!(hv.shuffle_period, Duration::from_millis(250));
    assert_eq!(c.broadcast.hop_limit, 8);
    assert_eq!(c.broadcast.plumtree().route_ttl, Duration::from_secs(3));
    c.validate().unwrap();
    assert!(Config::default()
        .apply_vars(vars(&[("MAQUIS_OVERLAY_KIND", "p2p-ish")]))
        .is_err());
    let bad = Config::default().overlay(PeerToPeerOptions {
        prwl: 7,
        ..PeerToPeerOptions::default()
    });
    assert!(bad.validate().is_err());
    let mut bad = Config::default();
    bad.broadcast.member_heartbeat_ms = 2000;
    bad.broadcast.member_timeout_ms = 1000;
    assert!(bad.validate().is_err());
    let mut bad = Config::default();
    bad.broadcast.subscription_capacity = 0;
    assert!(bad.validate().is_err());
}

#[test]
fn client_server_selection_and_parameters() {
    let d = ClientServerOptions::default();
    assert_eq!(d.role, Role::Server);
    let cs = d.client_server();
    assert_eq!(cs.servers_per_client, 1);
    assert_eq!(cs.sync_interval, Duration::from_millis(100));
    assert_eq!(cs.gossip_interval, Duration::from_millis(1000));
    let c = Config::from_toml(
        "[overlay]\nkind = \"client-server\"\nrole = \"client\"\n\
         servers_per_client = 2\nsync_interval_ms = 50\ngossip_interval_ms = 500\n",
    )
    .unwrap();
    assert_eq!(overlay_kind(&c), OverlayKind::ClientServer);
    assert_eq!(OverlayKind::ClientServer.as_str(), "client-server");
    let cs = c.overlay.client_server().unwrap().client_server();
    assert_eq!(cs.role, Role::Client);
    assert_eq!(cs.servers_per_client, 2);
    assert_eq!(cs.sync_interval, Duration::from_millis(50));
    assert_eq!(cs.gossip_interval, Duration::from_millis(500));
    c.validate().unwrap();
    // The config round-trips through TOML with the role spelled in lower case.
    let text = c.to_toml();
    assert!(text.contains("role = \"client\""), "{text}");
    assert!(text.contains("kind = \"client-server\""), "{text}");
    assert_eq!(Config::from_toml(&text).unwrap(), c);

    let c = Config::default()
        .apply_vars(vars(&[
            ("MAQUIS_OVERLAY_KIND", "client-server"),
            ("MAQUIS_OVERLAY_ROLE", "Client"),
            ("MAQUIS_OVERLAY_SERVERS_PER_CLIENT", "3"),
            ("MAQUIS_OVERLAY_SYNC_INTERVAL_MS", "20"),
            ("MAQUIS_OVERLAY_GOSSIP_INTERVAL_MS", "200"),
        ]))
        .unwrap();
    let o = c.overlay.client_server().unwrap();
    assert_eq!(o.role, Role::Client);
    assert_eq!(o.servers_per_client, 3);
    assert_eq!(o.sync_interval_ms, 20);
    assert_eq!(o.gossip_interval_ms, 200);
    c.validate().unwrap();

    let b = Config::new("b").overlay(ClientServerOptions {
        role: Role::Client,
        servers_per_client: 2,
        sync_interval_ms: 10,
        gossip_interval_ms: 300,
    });
    let cs = b.overlay.client_server().unwrap().client_server();
    assert_eq!(cs.servers_per_client, 2);
    assert_eq!(cs.sync_interval, Duration::from_millis(10));
    assert_eq!(cs.gossip_interval, Duration::from_millis(300));

    // Errors name the option.
    let client_server = ("MAQUIS_OVERLAY_KIND", "client-server");
    let err = Config::default()
        .apply_vars(vars(&[client_server, ("MAQUIS_OVERLAY_ROLE", "peer")]))
        .unwrap_err();
    assert!(err.to_string().starts_with("overlay.role:"), "{err}");
    assert!(err.to_string().contains("server or client"), "{err}");
    let err = Config::default()
        .apply_vars(vars(&[
            client_server,
            ("MAQUIS_OVERLAY_SERVERS_PER_CLIENT", "two"),
        ]))
        .unwrap_err();
    assert!(
        err.to_string().starts_with("overlay.servers_per_client:"),
        "{err}"
    );
    assert!(Config::from_toml("[overlay]\nkind = \"client-server\"\nrole = \"peer\"").is_err());
    let with = |o: ClientServerOptions| Config::default().overlay(o);
    let err = with(ClientServerOptions {
        servers_per_client: 0,
        ..Default::default()
    })
    .validate()
    .unwrap_err();
    assert!(err.to_string().contains("1 to 16"), "{err}");
    assert!(with(ClientServerOptions {
        servers_per_client: 17,
        ..Default::default()
    })
    .validate()
    .is_err());
    assert!(with(ClientServerOptions {
        servers_per_client: 16,
        ..Default::default()
    })
    .validate()
    .is_ok());
    let err = with(ClientServerOptions {
        sync_interval_ms: 0,
        ..Default::default()
    })
    .validate()
    .unwrap_err();
    assert!(
        err.to_string().starts_with("overlay.sync_interval_ms"),
        "{err}"
    );
    assert!(with(ClientServerOptions {
        sync_interval_ms: 1,
        gossip_interval_ms: 0,
        ..Default::default()
    })
    .validate()
    .is_err());
    let err = "client/server".parse::<OverlayKind>().unwrap_err();
    assert!(err.to_string().contains("client-server"), "{err}");
}

#[test]
fn nested_toml_reads_every_section() {
    let c = Config::from_toml(
        r#"
        [node]
        name = "n1"
        listen = "127.0.0.1:7001"
        admin = "127.0.0.1:9001"
        cookie = "s3cret"
        peers = ["10.0.0.2:7001", "10.0.0.3:7001"]
        mailbox_capacity = 64
        event_buffer = 32

        [transport]
        parallelism = 4
        affinity = false
        channels = [{ name = "vnode", parallelism = 16 }, "gossip", "handoff:2"]
        lane_queue_bytes = 1048576
        heartbeat_interval_ms = 100
        heartbeat_timeout_ms = 900

        [overlay]
        kind = "peer-to-peer"
        active_size = 4
        passive_size = 24

        [broadcast]
        member_heartbeat_ms = 500
        hop_limit = 32
        "#,
    )
    .unwrap();
    assert_eq!(&*c.node.name, "n1");
    assert_eq!(c.node.admin, Some("127.0.0.1:9001".parse().unwrap()));
    assert_eq!(c.node.peers.len(), 2);
    assert_eq!((c.node.mailbox_capacity, c.node.event_buffer), (64, 32));
    assert_eq!(c.transport.parallelism, 4);
    assert!(!c.transport.affinity);
    assert_eq!(
        c.transport.channels,
        vec![
            ChannelConfig {
                name: "vnode".into(),
                parallelism: Some(16)
            },
            ChannelConfig {
                name: "gossip".into(),
                parallelism: None
            },
            ChannelConfig {
                name: "handoff".into(),
                parallelism: Some(2)
            },
        ]
    );
    assert_eq!(c.transport.lane_queue_bytes, 1 << 20);
    assert_eq!(c.transport.heartbeat_interval(), Duration::from_millis(100));
    assert_eq!(c.transport.heartbeat_timeout(), Duration::from_millis(900));
    let p2p = c.overlay.peer_to_peer().unwrap();
    assert_eq!((p2p.active_size, p2p.passive_size), (4, 24));
    assert_eq!(p2p.arwl, PeerToPeerOptions::default().arwl);
    assert_eq!(c.broadcast.member_heartbeat_ms, 500);
    assert_eq!(c.broadcast.hop_limit, 32);
    assert_eq!(
        c.broadcast.member_timeout_ms,
        BroadcastConfig::default().member_timeout_ms
    );
    c.validate().unwrap();
    // What is not written keeps its default; an `[overlay]` without `kind` is the full mesh.
    assert_eq!(Config::from_toml("").unwrap(), Config::default());
    let c = Config::from_toml("[overlay]\ngossip_interval_ms = 500").unwrap();
    assert_eq!(c.overlay.full_mesh().unwrap().gossip_interval_ms, 500);
    let c = Config::from_toml("[overlay]\nkind = \"static\"").unwrap();
    assert_eq!(c.overlay, OverlayConfig::Static);
    // Every configuration round-trips through its TOML.
    for kind in OverlayKind::ALL {
        let c = Config::new("rt").overlay(kind).channel("vnode", Some(2));
        assert_eq!(Config::from_toml(&c.to_toml()).unwrap(), c, "{kind}");
    }
    // Validation errors name the dotted key.
    let err = Config::new("").validate().unwrap_err();
    assert!(err.to_string().starts_with("node.name:"), "{err}");
    let mut c = Config::default();
    c.transport.heartbeat_timeout_ms = c.transport.heartbeat_interval_ms * 3 - 1;
    let err = c.validate().unwrap_err();
    assert!(
        matches!(&err, ConfigError::Invalid { key, .. } if key == "transport.heartbeat_timeout_ms"),
        "{err}"
    );
    c.transport.heartbeat_timeout_ms = c.transport.heartbeat_interval_ms * 3;
    c.validate().unwrap();
    let err = Config::default()
        .overlay(FullMeshOptions {
            gossip_interval_ms: 0,
        })
        .validate()
        .unwrap_err();
    assert!(
        err.to_string().starts_with("overlay.gossip_interval_ms:"),
        "{err}"
    );
}

#[test]
fn env_overrides_every_section() {
    let c = Config::default()
        .apply_vars(vars(&[
            ("MAQUIS_NODE_NAME", "n7"),
            ("MAQUIS_NODE_ADMIN", "127.0.0.1:9007"),
            ("MAQUIS_NODE_PEERS", "10.0.0.2:7001, 10.0.0.3:7001"),
            ("MAQUIS_NODE_MAILBOX_CAPACITY", "16"),
            ("MAQUIS_TRANSPORT_MAX_FRAME_BYTES", "1048576"),
            ("MAQUIS_TRANSPORT_AFFINITY", "no"),
            ("MAQUIS_OVERLAY_GOSSIP_INTERVAL_MS", "700"),
            ("MAQUIS_BROADCAST_SUBSCRIPTION_CAPACITY", "8"),
        ]))
        .unwrap();
    assert_eq!(&*c.node.name, "n7");
    assert_eq!(c.node.admin, Some("127.0.0.1:9007".parse().unwrap()));
    assert_eq!(
        c.node.peers,
        vec![
            "10.0.0.2:7001".parse().unwrap(),
            "10.0.0.3:7001".parse().unwrap()
        ]
    );
    assert_eq!(c.node.mailbox_capacity, 16);
    assert_eq!(c.transport.max_frame_bytes, 1 << 20);
    assert!(!c.transport.affinity);
    assert_eq!(c.overlay.full_mesh().unwrap().gossip_interval_ms, 700);
    assert_eq!(c.broadcast.subscription_capacity, 8);
    c.validate().unwrap();

    // Text that reads as another TOML type is taken as a string where a string is wanted.
    let c = Config::default()
        .apply_vars(vars(&[
            ("MAQUIS_NODE_NAME", "123"),
            ("MAQUIS_NODE_COOKIE", "true"),
        ]))
        .unwrap();
    assert_eq!(
        (c.node.name.as_str(), c.node.cookie.as_str()),
        ("123", "true")
    );
    // Every switch word, and lists as TOML.
    for (word, on) in [
        ("on", true),
        ("off", false),
        ("yes", true),
        ("0", false),
        ("1", true),
    ] {
        let c = Config::default()
            .apply_vars(vars(&[("MAQUIS_TRANSPORT_AFFINITY", word)]))
            .unwrap();
        assert_eq!(c.transport.affinity, on, "{word}");
    }
    let c = Config::default()
        .apply_vars(vars(&[(
            "MAQUIS_TRANSPORT_CHANNELS",
            "[{ name = \"vnode\", parallelism = 16 }, \"gossip\"]",
        )]))
        .unwrap();
    assert_eq!(c.transport.channels.len(), 2);
    assert_eq!(c.transport.channels[0].parallelism, Some(16));
    let err = Config::default()
        .apply_vars(vars(&[("MAQUIS_TRANSPORT_CHANNELS", "vnode:lots")]))
        .unwrap_err();
    assert!(err.to_string().starts_with("transport.channels:"), "{err}");
    let err = Config::default()
        .apply_vars(vars(&[("MAQUIS_TRANSPORT_AFFINITY", "maybe")]))
        .unwrap_err();
    assert!(err.to_string().contains("on or off"), "{err}");
    assert!(matches!(
        Config::default().apply_vars(vars(&[("MAQUIS_NOSECTION_X", "1")])),
        Err(ConfigError::UnknownVariable(_))
    ));
}

#[test]
fn env_overlay_kind_switch_resets_the_options() {
    // From a file's peer-to-peer options to client-server: the new kind's defaults, then the
    // variables, whatever their order.
    let file = Config::from_toml("[overlay]\nkind = \"peer-to-peer\"\nactive_size = 9").unwrap();
    let c = file
        .clone()
        .apply_vars(vars(&[
            ("MAQUIS_OVERLAY_SYNC_INTERVAL_MS", "40"),
            ("MAQUIS_OVERLAY_KIND", "client-server"),
        ]))
        .unwrap();
    assert_eq!(
        c.overlay,
        OverlayConfig::ClientServer(ClientServerOptions {
            sync_interval_ms: 40,
            ..Default::default()
        })
    );
    // The same kind again keeps the file's options.
    let c = file
        .clone()
        .apply_vars(vars(&[
            ("MAQUIS_OVERLAY_KIND", "peer-to-peer"),
            ("MAQUIS_OVERLAY_PASSIVE_SIZE", "20"),
        ]))
        .unwrap();
    let p2p = c.overlay.peer_to_peer().unwrap();
    assert_eq!((p2p.active_size, p2p.passive_size), (9, 20));
    for kind in ["static", "\"static\""] {
        let c = file
            .clone()
            .apply_vars(vars(&[("MAQUIS_OVERLAY_KIND", kind)]))
            .unwrap();
        assert_eq!(c.overlay, OverlayConfig::Static, "{kind}");
    }
    let mut c = Config::default().overlay(OverlayKind::ClientServer);
    c.overlay.switch_to(OverlayKind::ClientServer);
    assert!(c.overlay.client_server().is_some());
}

#[test]
fn options_of_another_overlay_are_refused() {
    let err = Config::from_toml("[overlay]\nkind = \"full-mesh\"\nactive_size = 3").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("active_size"), "{text}");
    assert!(text.contains("peer-to-peer"), "{text}");
    assert!(text.contains("full-mesh"), "{text}");
    // Without `kind`, the default overlay's options.
    let err = Config::from_toml("[overlay]\nrole = \"client\"").unwrap_err();
    assert!(err.to_string().contains("client-server"), "{err}");
    let err =
        Config::from_toml("[overlay]\nkind = \"static\"\ngossip_interval_ms = 5").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("full-mesh and client-server"), "{text}");
    assert!(text.contains("static"), "{text}");
    let err = Config::from_toml("[overlay]\nkind = \"full-mesh\"\nbogus = 1").unwrap_err();
    assert!(err.to_string().contains("unknown option `bogus`"), "{err}");
    // In the environment the error names the key.
    let err = Config::default()
        .apply_vars(vars(&[("MAQUIS_OVERLAY_ACTIVE_SIZE", "3")]))
        .unwrap_err();
    match &err {
        ConfigError::Invalid { key, reason } => {
            assert_eq!(key, "overlay.active_size");
            assert!(reason.contains("peer-to-peer"), "{err}");
            assert!(reason.contains("full-mesh"), "{err}");
        }
        other => panic!("{other}"),
    }
}

#[test]
fn flat_keys_name_their_new_place() {
    let err = Config::from_toml("parallelism = 4").unwrap_err();
    assert_eq!(
        err.to_string(),
        "`parallelism` has moved: write `[transport] parallelism = 4` (env \
         MAQUIS_TRANSPORT_PARALLELISM)"
    );
    assert!(matches!(&err, ConfigError::Moved { key, .. } if key == "transport.parallelism"));
    let err = Config::from_toml("hyparview_active_size = 3").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("kind = \"peer-to-peer\""), "{text}");
    assert!(text.contains("active_size = 3"), "{text}");
    assert!(text.contains("MAQUIS_OVERLAY_ACTIVE_SIZE"), "{text}");
    let err = Config::from_toml("client_server_role = \"client\"").unwrap_err();
    assert!(matches!(&err, ConfigError::Moved { key, .. } if key == "overlay.role"));
    let err = Config::from_toml("overlay = \"static\"").unwrap_err();
    assert_eq!(
        err.to_string(),
        "`overlay = \"static\"` has moved: write `[overlay] kind = \"static\"` (env \
         MAQUIS_OVERLAY_KIND)"
    );
    // Every old key of a file is named at once.
    let err = Config::from_toml("name = \"x\"\nparallelism = 4\nhop_limit = 9").unwrap_err();
    let text = err.to_string();
    assert!(text.starts_with("`hop_limit` has moved"), "{text}");
    assert!(
        text.ends_with(
            "also moved: `name` is `node.name`, `parallelism` is `transport.parallelism`"
        ),
        "{text}"
    );
    // The secret is not repeated.
    let err = Config::from_toml("cookie = \"s3cret\"").unwrap_err();
    assert!(!err.to_string().contains("s3cret"), "{err}");
    assert!(err.to_string().contains("[node] cookie"), "{err}");

    let err = Config::default()
        .apply_vars(vars(&[("MAQUIS_PARALLELISM", "4")]))
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "MAQUIS_PARALLELISM has moved: write MAQUIS_TRANSPORT_PARALLELISM=4 (TOML `[transport] \
         parallelism`)"
    );
    let err = Config::default()
        .apply_vars(vars(&[("MAQUIS_HYPARVIEW_ACTIVE_SIZE", "6")]))
        .unwrap_err();
    assert!(matches!(&err, ConfigError::Moved { key, .. } if key == "overlay.active_size"));
    let text = err.to_string();
    assert!(text.contains("MAQUIS_OVERLAY_KIND=peer-to-peer"), "{text}");
    assert!(text.contains("MAQUIS_OVERLAY_ACTIVE_SIZE=6"), "{text}");
    let err = Config::default()
        .apply_vars(vars(&[("MAQUIS_OVERLAY", "client-server")]))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("MAQUIS_OVERLAY_KIND=client-server"),
        "{err}"
    );
    // `MAQUIS_NODE_QUEUE_BYTES` was `node_queue_bytes`, not a key of `[node]`.
    let err = Config::default()
        .apply_vars(vars(&[("MAQUIS_NODE_QUEUE_BYTES", "65536")]))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("MAQUIS_TRANSPORT_NODE_QUEUE_BYTES=65536"),
        "{err}"
    );
    // Every old name has a place now, with the environment variable made by the same rule.
    for (old, key, kind) in moved::MOVED {
        assert!(
            keys::all().contains(&(key.to_string(), *kind)),
            "{old} -> {key} ({kind:?}) is not an option"
        );
    }
}

#[test]
fn channel_short_form() {
    let c = Config::from_toml("[transport]\nchannels = [\"vnode:16\", \"gossip\"]").unwrap();
    assert_eq!(
        c.transport.channels,
        parse_channels("vnode:16,gossip").unwrap()
    );
    assert_eq!(c.transport.channels[0].parallelism, Some(16));
    assert_eq!(c.transport.channels[1].parallelism, None);
    let err = Config::from_toml("[transport]\nchannels = [\"vnode:x\"]").unwrap_err();
    assert!(err.to_string().contains("vnode:x"), "{err}");
    let err = Config::from_toml("[transport]\nchannels = [{ name = \"a\", lanes = 2 }]");
    assert!(err.is_err());
    let err = parse_channels("a,b:-1").unwrap_err();
    assert!(err.to_string().starts_with("transport.channels:"), "{err}");
}

#[test]
fn the_default_cookie_only_on_loopback_and_handshake_limits_in_range() {
    let mut c = Config::new("n");
    c.validate().unwrap();
    c.node.listen = "0.0.0.0:7000".parse().unwrap();
    let err = c.validate().unwrap_err().to_string();
    assert!(err.starts_with("node.cookie:"), "{err}");
    assert!(
        err.contains("0.0.0.0:7000") && err.contains("MAQUIS_NODE_COOKIE"),
        "{err}"
    );
    c.node.cookie = "s3cret-shared".into();
    c.validate().unwrap();
    c.node.listen = "[::1]:7000".parse().unwrap();
    c.node.cookie = DEFAULT_COOKIE.into();
    c.validate().unwrap();

    let mut c = Config::new("n");
    c.transport.max_pending_handshakes_per_source = c.transport.max_pending_handshakes + 1;
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.starts_with("transport.max_pending_handshakes_per_source:"),
        "{err}"
    );
    c.transport.max_pending_handshakes_per_source = 0;
    assert!(c.validate().is_err());
    let mut c = Config::new("n");
    c.transport.unauthenticated_timeout_ms = c.transport.handshake_timeout_ms + 1;
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.starts_with("transport.unauthenticated_timeout_ms:"),
        "{err}"
    );
    c.transport.unauthenticated_timeout_ms = 0;
    assert!(c.validate().is_err());
}

#[test]
fn an_admin_endpoint_beyond_loopback_needs_a_token() {
    let mut c = Config::new("n");
    c.node.admin = Some("127.0.0.1:9000".parse().unwrap());
    c.validate().unwrap();
    c.node.admin = Some("0.0.0.0:9000".parse().unwrap());
    let err = c.validate().unwrap_err().to_string();
    assert!(err.starts_with("node.admin_token:"), "{err}");
    assert!(err.contains("MAQUIS_NODE_ADMIN_TOKEN"), "{err}");
    c.node.admin_token = Some("t0ken".into());
    c.validate().unwrap();
    c.node.admin_token = Some(String::new());
    assert!(c.validate().is_err(), "an empty token is no token");
    let c = Config::from_toml("[node]\nadmin = \"10.0.0.1:9000\"\nadmin_token = \"x\"\n").unwrap();
    assert_eq!(c.node.admin_token.as_deref(), Some("x"));
    c.validate().unwrap();
}

#[test]
fn part_and_unsent_sizes_are_read_and_checked() {
    let c = Config::default()
        .apply_vars(vars(&[
            ("MAQUIS_TRANSPORT_PART_BYTES", "65536"),
            ("MAQUIS_TRANSPORT_UNSENT_BYTES", "0"),
        ]))
        .unwrap();
    assert_eq!(c.transport.part_bytes, 65536);
    assert_eq!(c.transport.unsent_bytes, 0, "0 leaves the kernel's default");
    c.validate().unwrap();

    let mut c = Config::new("n");
    c.transport.part_bytes = 4095;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.starts_with("transport.part_bytes:"), "{err}");
    c.transport.part_bytes = 4096;
    c.validate().unwrap();
    c.transport.unsent_bytes = i32::MAX as usize + 1;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.starts_with("transport.unsent_bytes:"), "{err}");
}

#[test]
fn stripe_size_is_read_and_checked() {
    let c = Config::default()
        .apply_vars(vars(&[("MAQUIS_TRANSPORT_STRIPE_BYTES", "0")]))
        .unwrap();
    assert_eq!(c.transport.stripe_bytes, 0, "0: no striping");
    c.validate().unwrap();
    let mut c = Config::new("n");
    assert_eq!(c.transport.stripe_bytes, 256 * 1024);
    c.transport.stripe_bytes = 100;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.starts_with("transport.stripe_bytes:"), "{err}");
}

#[test]
fn stripe_window_is_read_and_checked() {
    let c = Config::default()
        .apply_vars(vars(&[(
            "MAQUIS_TRANSPORT_STRIPE_WINDOW_BYTES",
            "67108864",
        )]))
        .unwrap();
    assert_eq!(c.transport.stripe_window_bytes, 64 << 20);
    c.validate().unwrap();
    let mut c = Config::new("n");
    assert_eq!(c.transport.stripe_window_bytes, 256 << 20);
    // Less than twice the largest frame: a frame might not fit.
    c.transport.stripe_window_bytes = 2 * c.transport.max_frame_bytes - 1;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.starts_with("transport.stripe_window_bytes:"), "{err}");
    c.transport.max_frame_bytes = 1 << 20;
    c.transport.stripe_window_bytes = 2 << 20;
    c.validate().unwrap();
    c.transport.stripe_window_bytes = (8 << 30) + 1;
    let err = c.validate().unwrap_err().to_string();
    assert!(err.starts_with("transport.stripe_window_bytes:"), "{err}");
}
