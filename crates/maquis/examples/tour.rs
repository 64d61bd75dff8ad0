//! A five-minute tour of the Maquis API: two nodes in one process, typed actors, names, calls,
//! refs inside messages, channels with partition keys, membership events and monitors.
//!
//! Run it with `cargo run -p maquis --example tour`; it finishes by itself in a second or two.

use std::time::Duration;

use maquis::{
    Actor, ActorRef, Config, Context, DownReason, Inbox, MembershipEvent, Node, ReplyTo, SendOpts,
};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc};

type Error = Box<dyn std::error::Error + Send + Sync>;

/// What the counter actor takes. Any serde type is a message; `ReplyTo` and `ActorRef` may be
/// fields, and they keep working on the node that decodes them.
#[derive(Debug, Serialize, Deserialize)]
enum CounterMsg {
    /// Add to the total.
    Add(u64),
    /// Request/response: answer with the total.
    Get(ReplyTo<u64>),
    /// Send a `Report` to `to` (a ref that travelled inside this message).
    ReportTo { to: ActorRef<Report> },
    /// Stop the actor.
    Stop,
}

/// What the counter sends to the ref it was given.
#[derive(Debug, Serialize, Deserialize)]
struct Report {
    total: u64,
    /// The counter itself, by id: refs by id can be monitored from another node.
    counter: ActorRef<CounterMsg>,
}

/// A typed actor: state plus a handler, spawned with `Node::spawn`.
#[derive(Default)]
struct Counter {
    total: u64,
}

impl Actor for Counter {
    type Msg = CounterMsg;

    async fn handle(&mut self, msg: CounterMsg, ctx: &mut Context<CounterMsg>) {
        match msg {
            CounterMsg::Add(n) => self.total += n,
            CounterMsg::Get(reply) => {
                let _ = reply.send(self.total).await;
            }
            CounterMsg::ReportTo { to } => {
                let report = Report {
                    total: self.total,
                    counter: ctx.myself(),
                };
                if let Err(e) = to.send(report).await {
                    eprintln!("report not sent: {e}");
                }
            }
            CounterMsg::Stop => ctx.stop(),
        }
    }
}

/// Waits for the first membership event that matches.
async fn wait_event(
    events: &mut broadcast::Receiver<MembershipEvent>,
    want: impl Fn(&MembershipEvent) -> bool,
) -> Result<MembershipEvent, Error> {
    let found = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let ev = events.recv().await?;
            if want(&ev) {
                return Ok::<_, broadcast::error::RecvError>(ev);
            }
        }
    })
    .await??;
    Ok(found)
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    // 1. Two nodes on free ports of 127.0.0.1 (the default listen address), same cookie, one
    //    extra channel `vnode` with 8 lanes per peer (`default` has `parallelism`, here 1).
    let config = |name: &str| {
        Config::new(name)
            .cookie("tour-secret")
            .channel("vnode", Some(8))
    };
    let a = Node::start(config("a")).await?;
    let b = Node::start(config("b")).await?;
    println!("started {} and {}", a.id(), b.id());

    // 2. Membership events: subscribe before joining so that no event is missed.
    let mut a_events = a.subscribe();
    let mut b_events = b.subscribe();
    let contact = a.join_wait(b.addr(), Duration::from_secs(5)).await?;
    println!("a joined through {contact}");
    wait_event(
        &mut a_events,
        |e| matches!(e, MembershipEvent::Up(n) if &*n.name == "b"),
    )
    .await?;
    wait_event(
        &mut b_events,
        |e| matches!(e, MembershipEvent::Up(n) if &*n.name == "a"),
    )
    .await?;
    let names = |n: &Node| n.members().into_iter().map(|m| m.name).collect::<Vec<_>>();
    println!("members seen by a: {:?}, by b: {:?}", names(&a), names(&b));

    // 3. A typed actor on b, registered under a name.
    let counter = b.spawn(Counter::default());
    b.register("counter", &counter)?;

    // 4. From a, a ref by (node, name); `send` waits only while the lane's queue is full.
    let remote: ActorRef<CounterMsg> = a.remote("b", "counter").expect("b is a member");
    remote.send(CounterMsg::Add(1)).await?;

    // 5. A call: the request carries a fresh `ReplyTo`; the call gives up after the timeout.
    //    Same sender, same receiver, same channel: the Get is handled after the Add.
    let total = remote.call(CounterMsg::Get, Duration::from_secs(2)).await?;
    println!("total after Add(1): {total}");

    // 6. Channels and partition keys: messages with the same key take the same one of the
    //    8 `vnode` lanes, so they stay in order with each other (not with other lanes).
    let user = SendOpts::on("vnode").partition_key(&"user-42");
    remote.send_with(CounterMsg::Add(41), &user).await?;
    let total = remote
        .call_with(CounterMsg::Get, Duration::from_secs(2), &user)
        .await?;
    println!("total after Add(41) on vnode: {total}");
    println!("lanes a -> b: {:?}", a.lanes_connected("b"));

    // 7. An actor written as a receive loop (`spawn_fn`) whose ref travels inside a message:
    //    the counter on b replies through it.
    let (got_tx, mut got_rx) = mpsc::channel(1);
    let listener = a.spawn_fn(move |mut inbox: Inbox<Report>| async move {
        while let Some(report) = inbox.recv().await {
            if got_tx.send(report).await.is_err() {
                break;
            }
        }
    });
    remote.send(CounterMsg::ReportTo { to: listener }).await?;
    let report = tokio::time::timeout(Duration::from_secs(2), got_rx.recv())
        .await?
        .ok_or("listener stopped")?;
    println!("report from {:?}: total {}", report.counter, report.total);

    // 8. Monitors: a future that resolves when the actor stops or its node goes away.
    //    The watch request takes the lane this task's messages to the actor take, so it is
    //    in place before the Stop sent after it arrives.
    let counter_by_id = report.counter;
    let watch = a.monitor(&counter_by_id);
    counter_by_id.send(CounterMsg::Stop).await?;
    let reason = tokio::time::timeout(Duration::from_secs(2), watch).await?;
    println!("counter monitor fired: {reason:?}");
    assert_eq!(reason, DownReason::Stopped);

    // 9. b leaves on purpose: a reports `Left` (a shutdown without leaving, or a crash, is
    //    reported as `Down`), and a node monitor fires.
    let node_watch = a.monitor_node(b.id());
    b.leave().await;
    let ev = wait_event(&mut a_events, |e| !matches!(e, MembershipEvent::Up(_))).await?;
    println!("a saw: {ev:?}");
    let reason = tokio::time::timeout(Duration::from_secs(2), node_watch).await?;
    println!("node monitor fired: {reason:?}");

    // 10. Stop both nodes: connections close, actors stop, waiting calls fail.
    b.shutdown().await;
    a.shutdown().await;
    println!("done");
    Ok(())
}
