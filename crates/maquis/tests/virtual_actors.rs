//! Virtual actors in running nodes: activation by the first message from any node, one
//! activation under concurrent first messages placed on different nodes, deactivation when
//! idle and activation again (in order, nothing lost), a node that leaves and its keys
//! activated elsewhere, refused kinds and addresses.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use maquis::virtual_actors::{
    MemoryStore, MigrateError, Persistent, Placement, RedbStore, StateStore, VirtualError,
};
use maquis::{Actor, CallError, Context, Node, ReplyTo};
use serde::{Deserialize, Serialize};

const T: Duration = Duration::from_secs(10);

#[derive(Debug, Serialize, Deserialize)]
enum Count {
    /// Adds one; `seq` is the sender's number for it.
    Add { from: String, seq: u64 },
    /// The node the activation runs on, its total, and whether every sender's numbers came in
    /// order with none missing.
    Get(ReplyTo<(String, u64, bool)>),
}

/// Every `Add` handled by any activation of any key, in order: (key, sender, seq).
type Log = std::sync::Arc<std::sync::Mutex<Vec<(String, String, u64)>>>;

struct Counter {
    key: String,
    log: Log,
    node: String,
    total: u64,
    last: std::collections::HashMap<String, u64>,
    in_order: bool,
}

impl Actor for Counter {
    type Msg = Count;
    async fn handle(&mut self, msg: Count, _ctx: &mut Context<Count>) {
        match msg {
            Count::Add { from, seq } => {
                self.log
                    .lock()
                    .unwrap()
                    .push((self.key.clone(), from.clone(), seq));
                self.total += 1;
                let last = self.last.entry(from).or_insert(0);
                if seq != *last + 1 {
                    self.in_order = false;
                }
                *last = seq;
            }
            Count::Get(reply) => {
                let _ = reply
                    .send((self.node.clone(), self.total, self.in_order))
                    .await;
            }
        }
    }
}

fn offer(nodes: &[Node]) -> Log {
    let log = Log::default();
    for n in nodes {
        let name = n.id().name.to_string();
        let log = log.clone();
        n.register_virtual("counter", move |key: &str| Counter {
            key: key.to_string(),
            log: log.clone(),
            node: name.to_string(),
            total: 0,
            last: Default::default(),
            in_order: true,
        })
        .expect("kind registered");
    }
    log
}

async fn get(n: &Node, key: &str) -> (String, u64, bool) {
    n.virtual_ref::<Count>("counter", key)
        .expect("address")
        .call(Count::Get, T)
        .await
        .expect("the counter answers")
}

fn activations(nodes: &[Node]) -> usize {
    nodes.iter().map(|n| n.activations()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_first_message_from_any_node_activates_the_actor_once() {
    let nodes = cluster("va", 5, |c| c).await;
    offer(&nodes);
    for n in &nodes {
        let r = n.virtual_ref::<Count>("counter", "k").expect("address");
        r.send(Count::Add {
            from: n.id().name.to_string(),
            seq: 1,
        })
        .await
        .expect("sent");
    }
    // Messages from different nodes race the lookup below: wait for all five.
    until("five counted", T, || async {
        get(&nodes[0], "k").await.1 == 5
    })
    .await;
    let (host, total, in_order) = get(&nodes[0], "k").await;
    assert_eq!(total, 5, "every node's message reached the one activation");
    assert!(in_order);
    for n in &nodes {
        assert_eq!(
            get(n, "k").await.0,
            host,
            "every node finds the same activation"
        );
    }
    assert_eq!(activations(&nodes), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_first_messages_placed_on_different_nodes_meet_at_one_activation() {
    let nodes = cluster("vc", 5, |c| c).await;
    offer(&nodes);
    const KEYS: usize = 20;
    const EACH: u64 = 10;
    // Every node sends to every key at once; each node places a key at random, so most keys
    // are activated on several nodes at once and all but one activation give way.
    let mut tasks = Vec::new();
    for n in &nodes {
        for k in 0..KEYS {
            let n = n.clone();
            tasks.push(tokio::spawn(async move {
                let r = n
                    .virtual_ref::<Count>("counter", &format!("key{k}"))
                    .expect("address")
                    .placement(Placement::Random);
                for seq in 1..=EACH {
                    r.send(Count::Add {
                        from: n.id().name.to_string(),
                        seq,
                    })
                    .await
                    .expect("sent");
                }
            }));
        }
    }
    for t in tasks {
        t.await.expect("sender");
    }
    for k in 0..KEYS {
        let key = format!("key{k}");
        let want = EACH * nodes.len() as u64;
        until(&format!("{key} counted {want}"), T, || async {
            get(&nodes[k % nodes.len()], &key).await.1 == want
        })
        .await;
        let (_, total, in_order) = get(&nodes[0], &key).await;
        assert_eq!(total, want, "nothing counted twice");
        assert!(in_order, "{key}: every sender's messages in order");
    }
    until("one activation per key", T, || async {
        activations(&nodes) == KEYS
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_actor_deactivates_and_the_next_message_activates_it_again() {
    let nodes = cluster("vi", 3, |mut c| {
        c.services.virtual_idle_ms = 100;
        c
    })
    .await;
    offer(&nodes);
    let r = nodes[0]
        .virtual_ref::<Count>("counter", "idle")
        .expect("address");
    let me = nodes[0].id().name.to_string();
    let mut seq = 0;
    for round in 0..5 {
        // A burst, then silence until the activation is gone.
        for _ in 0..50 {
            seq += 1;
            r.send(Count::Add {
                from: me.to_string(),
                seq,
            })
            .await
            .expect("sent");
        }
        let (_, total, in_order) = r.call(Count::Get, T).await.expect("answer");
        assert_eq!(
            total, 50,
            "round {round}: a fresh activation counted the burst"
        );
        assert!(in_order);
        until("the idle activation is gone", T, || async {
            activations(&nodes) == 0
        })
        .await;
        // The next burst starts a fresh count: sequence numbers restart per activation.
        seq = 0;
    }
    let deactivated: u64 = nodes
        .iter()
        .map(|n| n.counters().snapshot()["virtual_deactivations"])
        .sum();
    assert_eq!(deactivated, 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn messages_during_deactivation_are_held_and_activate_the_key_again() {
    init_tracing();
    let nodes = cluster("vd", 2, |mut c| {
        c.services.virtual_idle_ms = 1;
        c
    })
    .await;
    let log = offer(&nodes);
    // An activation idle after every message: most messages meet one deactivating, or none
    // at all; each must still be handled once, in order.
    let r = nodes[1]
        .virtual_ref::<Count>("counter", "flappy")
        .expect("address")
        .placement(Placement::Hash);
    let me = nodes[1].id().name.to_string();
    const N: u64 = 300;
    for seq in 1..=N {
        r.send(Count::Add {
            from: me.to_string(),
            seq,
        })
        .await
        .expect("sent");
        if seq % 25 == 0 {
            // Now and then a pause long enough for the activation to go.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let count = |k: &str| -> u64 { nodes.iter().map(|n| n.counters().snapshot()[k]).sum() };
    let t0 = std::time::Instant::now();
    while (log.lock().unwrap().len() as u64) < N && t0.elapsed() < T {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seqs: Vec<u64> = log.lock().unwrap().iter().map(|e| e.2).collect();
    let missing: Vec<u64> = (1..=N).filter(|s| !seqs.contains(s)).collect();
    assert!(
        missing.is_empty(),
        "missing {missing:?}; refused {} unknown {} activations {} deactivations {} forwarded {} type {} decode {}",
        count("virtual_refused"),
        count("unknown_actor"),
        count("virtual_activations"),
        count("virtual_deactivations"),
        count("virtual_forwarded"),
        count("type_mismatch"),
        count("decode_errors"),
    );
    let first_wrong = seqs.iter().zip(1..).position(|(s, want)| *s != want);
    assert_eq!(
        (seqs.len() as u64, first_wrong),
        (N, None),
        "each once, in order"
    );
    assert!(
        count("virtual_deactivations") > 1,
        "the key went and came back"
    );
    assert_eq!(count("virtual_refused"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_whose_node_left_is_activated_elsewhere() {
    let nodes = cluster("vn", 3, |c| c).await;
    offer(&nodes);
    let on_c = nodes[2]
        .virtual_ref::<Count>("counter", "mobile")
        .expect("address")
        .placement(Placement::Local);
    on_c.send(Count::Add {
        from: "c".into(),
        seq: 1,
    })
    .await
    .expect("sent");
    let (host, total, _) = on_c.call(Count::Get, T).await.expect("answer");
    assert_eq!((host.as_str(), total), (&*nodes[2].id().name, 1));
    let from_a = nodes[0]
        .virtual_ref::<Count>("counter", "mobile")
        .expect("address");
    assert_eq!(from_a.call(Count::Get, T).await.expect("answer").0, host);
    nodes[2].shutdown().await;
    let survivors = &nodes[..2];
    until("the others see c gone", T, || async {
        survivors.iter().all(|n| n.members().len() == 2)
    })
    .await;
    // The next message activates the key on a survivor (its state was c's alone).
    let (host, total, _) = from_a.call(Count::Get, T).await.expect("answer");
    assert_ne!(host.as_str(), &*nodes[2].id().name);
    assert_eq!(total, 0);
    assert_eq!(activations(survivors), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn unknown_kinds_and_bad_addresses_are_errors() {
    let nodes = cluster("vu", 2, |c| c).await;
    offer(&nodes[..1]);
    // The kind is offered on the first node only; the second refuses to activate it.
    let r = nodes[0]
        .virtual_ref::<Count>("nobody-offers-this", "k")
        .expect("address")
        .placement(Placement::Local);
    match r.call(Count::Get, T).await {
        Err(VirtualError::Call(CallError::NoProc)) => {}
        other => panic!("expected NoProc, got {other:?}"),
    }
    let remote = nodes[0]
        .virtual_ref::<Count>("counter", "k")
        .expect("address")
        .placement(Placement::Hash);
    // Placed on a node without the kind, or on this one: either way an answer, not a hang.
    let placed_remote = remote.call(Count::Get, T).await;
    assert!(
        matches!(
            placed_remote,
            Ok(_) | Err(VirtualError::Call(CallError::NoProc))
        ),
        "{placed_remote:?}"
    );
    assert!(
        nodes[1].counters().snapshot()["virtual_refused"]
            + nodes[0].counters().snapshot()["virtual_refused"]
            >= 1
    );
    for (kind, key) in [("", "k"), ("a/b", "k"), ("counter", "")] {
        assert!(matches!(
            nodes[0].virtual_ref::<Count>(kind, key),
            Err(VirtualError::BadAddress(_))
        ));
    }
    let long = "x".repeat(300);
    assert!(nodes[0].virtual_ref::<Count>("counter", &long).is_err());
    assert!(nodes[0]
        .register_virtual("counter", |_: &str| Counter {
            key: String::new(),
            log: Log::default(),
            node: String::new(),
            total: 0,
            last: Default::default(),
            in_order: true,
        })
        .is_err());
}

/// A counter whose total is kept in a store between activations.
struct Kept {
    node: String,
    total: u64,
}

impl Actor for Kept {
    type Msg = Count;
    async fn handle(&mut self, msg: Count, _ctx: &mut Context<Count>) {
        match msg {
            Count::Add { .. } => self.total += 1,
            Count::Get(reply) => {
                let _ = reply.send((self.node.clone(), self.total, true)).await;
            }
        }
    }
}

impl Persistent for Kept {
    type State = u64;
    fn state(&self) -> u64 {
        self.total
    }
}

fn offer_kept(nodes: &[Node], store: std::sync::Arc<dyn StateStore>) {
    for n in nodes {
        let name = n.id().name.to_string();
        n.register_persistent("kept", store.clone(), move |_key: &str, total| Kept {
            node: name.to_string(),
            total: total.unwrap_or(0),
        })
        .expect("kind registered");
    }
}

async fn add(r: &maquis::virtual_actors::VirtualRef<Count>, n: u64) {
    for seq in 1..=n {
        r.send(Count::Add {
            from: "t".into(),
            seq,
        })
        .await
        .expect("sent");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deactivated_actor_comes_back_with_its_state() {
    let nodes = cluster("vs", 3, |mut c| {
        c.services.virtual_idle_ms = 100;
        c
    })
    .await;
    let store = MemoryStore::new(100);
    offer_kept(&nodes, store.clone());
    let r = nodes[0].virtual_ref::<Count>("kept", "k").expect("address");
    for round in 1..=3u64 {
        add(&r, 10).await;
        let (_, total, _) = r.call(Count::Get, T).await.expect("answer");
        assert_eq!(total, 10 * round, "loaded, then counted on");
        until("the idle activation is gone", T, || async {
            activations(&nodes) == 0
        })
        .await;
    }
    assert_eq!(store.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_key_whose_node_left_comes_back_elsewhere_with_its_state() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = RedbStore::open(dir.path().join("states.redb")).expect("store");
    let nodes = cluster("vr", 3, |c| c).await;
    offer_kept(&nodes, store.clone());
    let on_c = nodes[2]
        .virtual_ref::<Count>("kept", "mobile")
        .expect("address")
        .placement(Placement::Local);
    add(&on_c, 5).await;
    let (host, total, _) = on_c.call(Count::Get, T).await.expect("answer");
    assert_eq!((host.as_str(), total), (&*nodes[2].id().name, 5));
    nodes[2].shutdown().await;
    let survivors = &nodes[..2];
    until("the others see c gone", T, || async {
        survivors.iter().all(|n| n.members().len() == 2)
    })
    .await;
    let from_a = nodes[0]
        .virtual_ref::<Count>("kept", "mobile")
        .expect("address");
    add(&from_a, 1).await;
    let (host, total, _) = from_a.call(Count::Get, T).await.expect("answer");
    assert_ne!(host.as_str(), &*nodes[2].id().name);
    assert_eq!(total, 6, "the state followed the key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_state_that_does_not_decode_fails_the_activation() {
    let nodes = cluster("vx", 1, |c| c).await;
    let store = MemoryStore::new(10);
    store.save("kept/bad", vec![0xff; 12]).await.expect("saved");
    offer_kept(&nodes, store.clone());
    let r = nodes[0]
        .virtual_ref::<Count>("kept", "bad")
        .expect("address");
    match r.call(Count::Get, T).await {
        Err(VirtualError::Call(CallError::NoProc)) => {}
        other => panic!("expected NoProc, got {other:?}"),
    }
    assert_eq!(nodes[0].activations(), 0);
    assert!(nodes[0].counters().snapshot()["virtual_refused"] >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_actor_moved_under_a_stream_of_messages_loses_and_reorders_none() {
    let nodes = cluster("vm", 4, |c| c).await;
    let log = offer(&nodes);
    // The key starts on a; d streams to it, and calls it now and then.
    let first = nodes[0]
        .virtual_ref::<Count>("counter", "m")
        .expect("address")
        .placement(Placement::Local);
    first
        .send(Count::Add {
            from: "d".into(),
            seq: 1,
        })
        .await
        .expect("sent");
    first.call(Count::Get, T).await.expect("active on a");
    assert_eq!(nodes[0].activations(), 1);
    // At least N messages, and on until every move is done (a stream that ended first would
    // test nothing).
    const N: u64 = 3000;
    let d = nodes[3].clone();
    let moved = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let moves_done = moved.clone();
    // The stream's ref finds the key on a before it moves (a first lookup while the key is
    // between two nodes may place it on a third: see the module doc).
    let (found, found_rx) = tokio::sync::oneshot::channel();
    let stream = tokio::spawn(async move {
        let r = d.virtual_ref::<Count>("counter", "m").expect("address");
        r.call(Count::Get, T).await.expect("found");
        let _ = found.send(());
        let mut calls = 0;
        let mut seq = 1;
        while seq < N || !moves_done.load(std::sync::atomic::Ordering::Acquire) {
            seq += 1;
            r.send(Count::Add {
                from: "d".into(),
                seq,
            })
            .await
            .expect("sent");
            if seq % 100 == 0 {
                r.call(Count::Get, T).await.expect("every call answered");
                calls += 1;
            }
        }
        (seq, calls)
    });
    // Meanwhile the key moves a → b → a → c → b → a, each time once it is active where it
    // went: onward, and back to nodes that passed its messages on.
    found_rx.await.expect("the stream started");
    let mut moves = 0;
    for (from, to) in [(0, 1), (1, 0), (0, 2), (2, 1), (1, 0)] {
        // `NotHere` until the key is active there (and named: a key handed back waits for
        // what was passed on to come back first).
        until("the key moved on from where it went", T, || async {
            nodes[from]
                .migrate("counter", "m", &nodes[to].id().name)
                .is_ok()
        })
        .await;
        assert!(!stream.is_finished(), "moved while the stream runs");
        moves += 1;
    }
    moved.store(true, std::sync::atomic::Ordering::Release);
    let (sent, calls) = stream.await.expect("the stream ran");
    assert_eq!(calls, sent / 100);
    until("every message handled", T, || async {
        log.lock().unwrap().len() as u64 >= sent
    })
    .await;
    let seqs: Vec<u64> = log.lock().unwrap().iter().map(|e| e.2).collect();
    let first_wrong = seqs.iter().zip(1..).position(|(s, want)| *s != want);
    assert_eq!(
        (seqs.len() as u64, first_wrong),
        (sent, None),
        "each once, in order (around the first one out of place: {:?})",
        first_wrong.map(|i| &seqs[i.saturating_sub(3)..(i + 3).min(seqs.len())])
    );
    let count = |k: &str| -> u64 { nodes.iter().map(|n| n.counters().snapshot()[k]).sum() };
    until("on a at the end, every move counted", T, || async {
        nodes[0].activations() == 1 && count("virtual_migrations") == moves
    })
    .await;
    assert_eq!(count("virtual_refused"), 0);
    assert_eq!(activations(&nodes), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_moved_actor_keeps_its_state_and_migrate_refuses_what_it_cannot_do() {
    let nodes = cluster("vk", 2, |c| c).await;
    let store = MemoryStore::new(10);
    offer_kept(&nodes, store.clone());
    let r = nodes[1]
        .virtual_ref::<Count>("kept", "k")
        .expect("address")
        .placement(Placement::Local);
    add(&r, 7).await;
    assert_eq!(r.call(Count::Get, T).await.expect("answer").1, 7);
    assert!(matches!(
        nodes[0].migrate("kept", "k", &nodes[1].id().name),
        Err(MigrateError::NotHere(_))
    ));
    assert!(matches!(
        nodes[1].migrate("kept", "k", "nobody"),
        Err(MigrateError::NotMember(_))
    ));
    nodes[1]
        .migrate("kept", "k", &nodes[0].id().name)
        .expect("moved");
    until("active on the other node", T, || async {
        nodes[0].activations() == 1 && nodes[1].activations() == 0
    })
    .await;
    add(&r, 1).await;
    let (host, total, _) = r.call(Count::Get, T).await.expect("answer");
    assert_eq!((host.as_str(), total), (&*nodes[0].id().name, 8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_sides_that_meet_keep_one_activation_of_a_key() {
    // Two clusters, as the two sides of a partition: each activates the key, then they meet.
    let a = cluster("vpa", 2, |c| c).await;
    let b = cluster("vpb", 2, |c| c).await;
    let log = offer(&a);
    offer(&b);
    let on = |n: &Node| {
        n.virtual_ref::<Count>("counter", "split")
            .expect("address")
            .placement(Placement::Local)
    };
    let (left, right) = (on(&a[0]), on(&b[0]));
    let add = |from: &str| Count::Add {
        from: from.into(),
        seq: 1,
    };
    left.send(add("left")).await.expect("sent");
    assert_eq!(left.call(Count::Get, T).await.expect("left answers").1, 1);
    // A later registration on the other side.
    tokio::time::sleep(Duration::from_millis(5)).await;
    right.send(add("right")).await.expect("sent");
    assert_eq!(right.call(Count::Get, T).await.expect("right answers").1, 1);
    assert_eq!((a[0].activations(), b[0].activations()), (1, 1));

    b[0].join_wait(a[0].addr(), Duration::from_secs(5))
        .await
        .expect("the sides meet");
    let all: Vec<Node> = a.iter().chain(b.iter()).cloned().collect();
    until("one cluster", T, || async {
        all.iter().all(|n| n.members().len() == 4)
    })
    .await;
    // The directory keeps the older registration; the other activation stops.
    until("one activation left", T, || async {
        a[0].activations() == 1 && b[0].activations() == 0
    })
    .await;
    // Both sides reach the survivor (a fresh ref asks the directory).
    let (host, total, _) = on(&b[1]).call(Count::Get, T).await.expect("answer");
    assert_eq!((host.as_str(), total), (&*a[0].id().name, 1));
    assert_eq!(log.lock().unwrap().len(), 1, "the left side's one message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn first_lookups_while_a_key_moves_always_find_it() {
    let nodes = cluster("vh", 3, |c| c).await;
    offer(&nodes);
    let count = |k: &str| -> u64 { nodes.iter().map(|n| n.counters().snapshot()[k]).sum() };
    let on_a = nodes[0]
        .virtual_ref::<Count>("counter", "h")
        .expect("address")
        .placement(Placement::Local);
    on_a.call(Count::Get, T).await.expect("active on a");
    let activated = count("virtual_activations");
    // c looks the key up afresh (no cached holder) again and again while the key moves
    // between a and b: every lookup finds it held, by the node it is leaving until the next
    // one takes it over; never free, so never placed afresh by a first message.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (a, b) = (
        nodes[0].id().name.to_string(),
        nodes[1].id().name.to_string(),
    );
    let lookers: Vec<_> = (0..8)
        .map(|_| {
            let (stop, c, a, b) = (stop.clone(), nodes[2].clone(), a.clone(), b.clone());
            tokio::spawn(async move {
                let mut looks = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    c.invalidate_global("$maquis/v/counter/h").await;
                    let holder = c
                        .whereis_global::<Count>("$maquis/v/counter/h")
                        .await
                        .expect("looked up")
                        .expect("some node holds the key");
                    let host = &holder.node().name;
                    assert!(**host == *a || **host == *b, "held on {host}");
                    looks += 1;
                }
                looks
            })
        })
        .collect();
    let mut moves = 0;
    for i in 0..40 {
        let (from, to) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
        until("the key moved on from where it went", T, || async {
            nodes[from]
                .migrate("counter", "h", &nodes[to].id().name)
                .is_ok()
        })
        .await;
        moves += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut looks = 0;
    for l in lookers {
        looks += l.await.expect("every lookup found the key where it was");
    }
    assert!(looks >= 40, "{looks} lookups");
    until("on a at the end, every move counted", T, || async {
        nodes[0].activations() == 1 && count("virtual_migrations") == moves
    })
    .await;
    assert_eq!(
        count("virtual_activations") - activated,
        moves,
        "no activation but the moves' own"
    );
    assert_eq!(activations(&nodes), 1);
    assert_eq!(count("virtual_refused"), 0);
}
