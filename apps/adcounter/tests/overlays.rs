//! The advertisement counter on running nodes, over each overlay: every node counts
//! impressions of three ads; the replicas' states spread through the overlay's neighbours
//! until every replica holds the exact total; an ad's limit disables it everywhere.

use std::time::{Duration, Instant};

use maquis::config::{ClientServerOptions, PeerToPeerOptions};
use maquis::overlay::Role;
use maquis::{ActorRef, Config, Node};
use maquis_adcounter::{start, AdMsg, Settings, Snapshot};

const T: Duration = Duration::from_secs(10);

fn settings() -> Settings {
    Settings {
        limit: 1_000_000,
        max_ads: 16,
        sync_every: Duration::from_millis(50),
        resend_every: 0,
        deltas: true,
    }
}

fn base(name: &str) -> Config {
    let mut c = Config::new(name).cookie("adcounter-test");
    c.transport.heartbeat_interval_ms = 200;
    c.transport.heartbeat_timeout_ms = 1500;
    c
}

async fn cluster(configs: Vec<Config>) -> Vec<Node> {
    let mut nodes = Vec::new();
    for c in configs {
        let n = Node::start(c).await.expect("node starts");
        if let Some(first) = nodes.first() {
            let first: &Node = first;
            n.join_wait(first.addr(), T).await.expect("joins");
        }
        nodes.push(n);
    }
    let deadline = Instant::now() + T;
    while nodes.iter().any(|n| n.members().len() < nodes.len()) {
        assert!(Instant::now() < deadline, "the cluster did not form");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    nodes
}

async fn read(r: &ActorRef<AdMsg>) -> Snapshot {
    r.call(AdMsg::Read, T).await.expect("the replica answers")
}

/// Reports an impression of `ad`: the replica's answer (the ad's count, or why not counted).
async fn impression(r: &ActorRef<AdMsg>, ad: &str) -> Result<u64, String> {
    let ad = ad.to_string();
    r.call(|reply| AdMsg::Impression { ad, reply }, T)
        .await
        .expect("answered")
}

/// Every node counts `per_node` impressions spread over three ads; every replica ends with
/// the exact total.
async fn counts_converge(nodes: Vec<Node>, per_node: u64, settings: Settings) {
    let replicas: Vec<ActorRef<AdMsg>> = nodes
        .iter()
        .map(|n| start(n, settings).expect("replica starts"))
        .collect();
    for (i, r) in replicas.iter().enumerate() {
        for k in 0..per_node {
            impression(r, &format!("ad{}", (i as u64 + k) % 3))
                .await
                .expect("counted");
        }
    }
    let want = per_node * nodes.len() as u64;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut totals = Vec::new();
        for r in &replicas {
            totals.push(read(r).await.total);
        }
        if totals.iter().all(|t| *t == want) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "replicas did not converge to {want}: {totals:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for r in &replicas {
        let s = read(r).await;
        assert_eq!((s.total, s.ads, s.left_out), (want, 3, 0));
        // Every replica counted, so every one sent states, each of a few bytes at least.
        assert!(
            s.syncs_sent > 0 && s.state_bytes >= 4 * s.syncs_sent,
            "{s:?}"
        );
    }
    for n in nodes {
        n.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_mesh_replicas_converge_to_the_exact_count() {
    let nodes = cluster((1..=4).map(|i| base(&format!("fm{i}"))).collect()).await;
    // Whole states here; deltas on the other overlays.
    let whole = Settings {
        deltas: false,
        ..settings()
    };
    counts_converge(nodes, 25, whole).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_to_peer_replicas_converge_through_their_neighbours() {
    let configs = (1..=8)
        .map(|i| {
            base(&format!("pp{i}")).overlay(PeerToPeerOptions {
                active_size: 3,
                passive_size: 6,
                ..PeerToPeerOptions::default()
            })
        })
        .collect();
    let nodes = cluster(configs).await;
    // Not everyone's neighbour: the states go on hop by hop.
    assert!(nodes.iter().any(|n| n.neighbors().len() < nodes.len() - 1));
    counts_converge(nodes, 20, settings()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_server_replicas_converge_through_the_server() {
    let cs = |name: &str, role| {
        base(name).overlay(ClientServerOptions {
            role,
            servers_per_client: 1,
            sync_interval_ms: 50,
            gossip_interval_ms: 250,
        })
    };
    let mut configs = vec![cs("cs-server", Role::Server)];
    configs.extend((1..=5).map(|i| cs(&format!("cs-client{i}"), Role::Client)));
    let nodes = cluster(configs).await;
    counts_converge(nodes, 20, settings()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ad_at_its_limit_is_disabled_on_every_replica() {
    let nodes = cluster((1..=3).map(|i| base(&format!("lim{i}"))).collect()).await;
    let replicas: Vec<ActorRef<AdMsg>> = nodes
        .iter()
        .map(|n| {
            start(
                n,
                Settings {
                    limit: 10,
                    ..settings()
                },
            )
            .expect("replica starts")
        })
        .collect();
    for _ in 0..10 {
        impression(&replicas[0], "promo").await.expect("counted");
    }
    let deadline = Instant::now() + T;
    for r in &replicas[1..] {
        loop {
            match impression(r, "promo").await {
                Err(why) if why.contains("disabled") => break,
                // Counted before the state arrived: a replica may show an ad a few more
                // times than its limit (state-based replication), never fewer.
                _ => {}
            }
            assert!(Instant::now() < deadline, "never disabled on a replica");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(read(r).await.disabled, 1);
    }
    for n in nodes {
        n.shutdown().await;
    }
}

/// A change made while the node had no neighbour is not forgotten: the neighbour that comes
/// later gets it (the replica sends each neighbour the state it has not had).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_made_alone_reaches_a_later_neighbour() {
    let a = Node::start(base("alone-a")).await.expect("node starts");
    let ra = start(&a, settings()).expect("replica starts");
    impression(&ra, "early").await.expect("counted");
    // The scenario: several sync intervals go by while the node has no neighbour.
    tokio::time::sleep(settings().sync_every * 5).await;
    assert_eq!(read(&ra).await.syncs_sent, 0, "nobody to send to");
    let b = Node::start(base("alone-b")).await.expect("node starts");
    let rb = start(&b, settings()).expect("replica starts");
    b.join_wait(a.addr(), T).await.expect("joins");
    let deadline = Instant::now() + T;
    while read(&rb).await.total != 1 {
        assert!(
            Instant::now() < deadline,
            "the change made alone never arrived"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    a.shutdown().await;
    b.shutdown().await;
}

/// A state that reached a node before its replica started is lost there; the sender's
/// periodic resend repairs it although the sender's state never changes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_state_lost_on_the_way_is_sent_again() {
    let nodes = cluster(vec![base("lost-a"), base("lost-b")]).await;
    let (a, b) = (&nodes[0], &nodes[1]);
    let ra = start(
        a,
        Settings {
            resend_every: 4,
            ..settings()
        },
    )
    .expect("replica starts");
    impression(&ra, "early").await.expect("counted");
    // The state goes to b, where no replica is registered yet: b drops it.
    let deadline = Instant::now() + T;
    while b.counters().unknown_actor.get() == 0 {
        assert!(Instant::now() < deadline, "the state never reached b");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let sent = read(&ra).await.syncs_sent;
    let rb = start(b, settings()).expect("replica starts");
    while read(&rb).await.total != 1 {
        assert!(
            Instant::now() < deadline,
            "the lost state was never sent again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let after = read(&ra).await;
    assert!(after.resends >= 1 && after.syncs_sent > sent, "{after:?}");
    for n in nodes {
        n.shutdown().await;
    }
}
