//! The replicas of one group over a network that drops, reorders and delays, with a member
//! killed on the way: every acknowledged write survives on every member left.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::Bytes;
use proptest::prelude::*;

use crate::replica::{Answer, Limits, Op, Out, Read, Replica, ReqId, Request};
use crate::store::{Version, Write};

#[derive(Debug)]
enum Msg {
    /// A published request, and the member on its client's node (if any).
    Req(Request, Option<u8>),
    Confirm(u8, ReqId),
    Resend(u8, Request),
}

struct Net {
    replicas: BTreeMap<u8, Replica<u8>>,
    /// Messages in flight: (to, message).
    flight: Vec<(u8, Msg)>,
    /// First answer to each request.
    answers: BTreeMap<ReqId, Answer>,
    /// Who sent that first answer.
    answered_by: BTreeMap<ReqId, u8>,
    /// Answers sent, all requests together.
    replies: usize,
    now: Instant,
}

impl Net {
    fn new(n: u8) -> Net {
        let limits = Limits {
            resend_after: Duration::from_millis(100),
            give_up_after: Duration::from_millis(1000),
            ..Limits::default()
        };
        let all: Vec<u8> = (0..n).collect();
        let mut replicas = BTreeMap::new();
        for m in 0..n {
            let mut r = Replica::new(m, limits.clone());
            r.set_members(all.clone(), all.clone());
            replicas.insert(m, r);
        }
        Net {
            replicas,
            flight: Vec::new(),
            answers: BTreeMap::new(),
            answered_by: BTreeMap::new(),
            replies: 0,
            now: Instant::now(),
        }
    }

    fn collect(&mut self, from: u8) {
        let Some(r) = self.replicas.get_mut(&from) else {
            return;
        };
        for o in r.drain_out() {
            match o {
                Out::Reply { id, answer } => {
                    self.replies += 1;
                    if let std::collections::btree_map::Entry::Vacant(e) = self.answers.entry(id) {
                        e.insert(answer);
                        self.answered_by.insert(id, from);
                    }
                }
                Out::Confirm { to, id } => self.flight.push((to, Msg::Confirm(from, id))),
                Out::Resend { to, req } => self.flight.push((to, Msg::Resend(from, req))),
            }
        }
    }

    fn deliver(&mut self, i: usize) {
        let (to, msg) = self.flight.swap_remove(i);
        let now = self.now;
        let Some(r) = self.replicas.get_mut(&to) else {
            return;
        };
        match msg {
            Msg::Req(req, near) => r.handle_request(req, |m| Some(*m) == near, now),
            Msg::Confirm(from, id) => r.handle_confirm(from, id, now),
            Msg::Resend(from, req) => r.handle_resend(from, req),
        }
        self.collect(to);
    }

    fn tick(&mut self, by: Duration) {
        self.now += by;
        let ids: Vec<u8> = self.replicas.keys().copied().collect();
        for m in ids {
            self.replicas.get_mut(&m).unwrap().handle_timeout(self.now);
            self.collect(m);
        }
    }

    fn kill(&mut self, m: u8) {
        self.replicas.remove(&m);
        let left: Vec<u8> = self.replicas.keys().copied().collect();
        for r in self.replicas.values_mut() {
            r.set_members(left.clone(), left.clone());
        }
        for id in left {
            self.collect(id);
        }
    }
}

fn b(s: String) -> Bytes {
    Bytes::from(s)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn acknowledged_writes_survive_loss_reordering_and_a_dead_member(
        // Key, value, and the member on the writing client's node (3: none, so the key's
        // responsible member coordinates).
        writes in prop::collection::vec((0..4u8, 0..3u8, 0..4u8), 1..20),
        drops in prop::collection::vec(any::<bool>(), 60),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 400),
        kill_at in 0..400usize,
        victim in 0..3u8,
    ) {
        let mut net = Net::new(3);
        let mut written: BTreeMap<ReqId, (Bytes, Version)> = BTreeMap::new();
        let mut drop = drops.iter().cycle();
        // Publish every write: each member's copy may be lost.
        for (seq, (key, val, near)) in writes.iter().enumerate() {
            let near = (*near < 3).then_some(*near);
            let id = ReqId { client: 1, seq: seq as u64 };
            let key = b(format!("k{key}"));
            let v = Version { clock: seq as u64 + 1, writer: 1 };
            let req = Request {
                id,
                key: key.clone(),
                op: Op::Write(Write::Set(b(format!("v{val}"))), v),
            };
            written.insert(id, (key, v));
            for m in 0..3u8 {
                if !*drop.next().unwrap() {
                    net.flight.push((m, Msg::Req(req.clone(), near)));
                }
            }
        }
        let mut step = 0;
        let mut killed = false;
        while step < 10_000 {
            if step == kill_at && !killed {
                net.kill(victim);
                killed = true;
            }
            if net.flight.is_empty() {
                if net.replicas.values().all(|r| r.pending() == 0) {
                    break;
                }
                net.tick(Duration::from_millis(50));
            } else {
                let i = picks[step % picks.len()].index(net.flight.len());
                net.deliver(i);
                if step % 7 == 0 {
                    net.tick(Duration::from_millis(10));
                }
            }
            step += 1;
        }
        prop_assert!(net.replicas.values().all(|r| r.pending() == 0), "every write settled");
        for (id, (key, v)) in &written {
            if net.answers.get(id) == Some(&Answer::Written(0)) {
                for (m, r) in &net.replicas {
                    prop_assert!(
                        r.store().version(key) >= *v,
                        "member {m} lost acknowledged write {id:?} on {key:?}"
                    );
                }
            }
        }
        // A write whose every copy arrived and no member died is acknowledged.
        if !killed || kill_at >= step {
            let every = writes.len() * 3;
            let dropped = drops.iter().cycle().take(every).filter(|d| **d).count();
            if dropped == 0 {
                prop_assert!(written.keys().all(|id| net.answers.get(id) == Some(&Answer::Written(0))));
            }
        }
    }
}

#[test]
fn reads_go_to_the_responsible_member_only() {
    let mut net = Net::new(3);
    let key = b("k".into());
    let id = ReqId { client: 1, seq: 0 };
    for m in 0..3u8 {
        net.flight.push((
            m,
            Msg::Req(
                Request {
                    id,
                    key: key.clone(),
                    op: Op::Read(Read::Get),
                },
                // Reads stay with the responsible member, whoever is near the client.
                Some((m + 1) % 3),
            ),
        ));
    }
    while !net.flight.is_empty() {
        net.deliver(0);
    }
    assert_eq!(net.answers.get(&id), Some(&Answer::Value(None)));
    assert_eq!(net.replies, 1, "one member answers");
    let resp = *net.replicas[&0].responsible(&key).unwrap();
    assert_eq!(net.answered_by.get(&id), Some(&resp));
}

fn set(seq: u64, key: &Bytes) -> Request {
    Request {
        id: ReqId { client: 1, seq },
        key: key.clone(),
        op: Op::Write(
            Write::Set(b("v".into())),
            Version {
                clock: seq + 1,
                writer: 1,
            },
        ),
    }
}

#[test]
fn the_member_on_the_clients_node_coordinates_its_writes() {
    let mut net = Net::new(3);
    let key = b("near".into());
    let resp = *net.replicas[&0].responsible(&key).unwrap();
    // Every member as the client's node's: the responsible one and the two others.
    for (seq, near) in (0..3u8).enumerate() {
        let req = set(seq as u64, &key);
        for m in 0..3u8 {
            net.flight.push((m, Msg::Req(req.clone(), Some(near))));
        }
        while !net.flight.is_empty() {
            net.deliver(0);
        }
        assert_eq!(net.answers.get(&req.id), Some(&Answer::Written(0)));
        assert_eq!(net.answered_by.get(&req.id), Some(&near), "near {near}");
    }
    assert_eq!(net.replies, 3, "one answer a write");
    // No member on the client's node: the responsible member coordinates.
    let req = set(3, &key);
    for m in 0..3u8 {
        net.flight.push((m, Msg::Req(req.clone(), None)));
    }
    while !net.flight.is_empty() {
        net.deliver(0);
    }
    assert_eq!(net.answered_by.get(&req.id), Some(&resp));
    // A member near the client that is not ready (still joining) does not coordinate.
    let joining = (resp + 1) % 3;
    let ready: Vec<u8> = (0..3u8).filter(|m| *m != joining).collect();
    for r in net.replicas.values_mut() {
        r.set_members((0..3).collect(), ready.clone());
    }
    let req = set(4, &key);
    for m in 0..3u8 {
        net.flight.push((m, Msg::Req(req.clone(), Some(joining))));
    }
    while !net.flight.is_empty() {
        net.deliver(0);
    }
    assert_eq!(net.answers.get(&req.id), Some(&Answer::Written(0)));
    assert_ne!(net.answered_by.get(&req.id), Some(&joining));
    for (m, r) in &net.replicas {
        assert_eq!(r.store().version(&key), req_version(&req), "member {m}");
    }
}

fn req_version(r: &Request) -> crate::store::Version {
    match &r.op {
        Op::Write(_, v) => *v,
        Op::Read(_) => unreachable!("a write"),
    }
}

#[test]
fn members_that_disagree_on_the_coordinator_still_settle_the_write() {
    let mut net = Net::new(3);
    let key = b("split".into());
    let resp = *net.replicas[&0].responsible(&key).unwrap();
    let near = (resp + 1) % 3;
    let other = (resp + 2) % 3;
    // `other` does not see `near` as ready yet: it confirms to the responsible member.
    net.replicas
        .get_mut(&other)
        .unwrap()
        .set_members((0..3).collect(), vec![resp, other]);
    let req = set(0, &key);
    for m in 0..3u8 {
        net.flight.push((m, Msg::Req(req.clone(), Some(near))));
    }
    while !net.flight.is_empty() {
        net.deliver(0);
    }
    assert!(
        net.answers.is_empty(),
        "the coordinator still waits for `other`"
    );
    // The coordinator's resend reaches `other`, which confirms to the member that asked.
    for _ in 0..3 {
        net.tick(Duration::from_millis(100));
        while !net.flight.is_empty() {
            net.deliver(0);
        }
    }
    assert_eq!(net.answers.get(&req.id), Some(&Answer::Written(0)));
    assert_eq!(net.answered_by.get(&req.id), Some(&near));
}

#[test]
fn confirmations_that_come_before_their_request_count() {
    let mut net = Net::new(3);
    let key = b("some key".into());
    let resp = *net.replicas[&0].responsible(&key).unwrap();
    let req = set(0, &key);
    let id = req.id;
    // The others apply the write and confirm; their confirmations reach the responsible
    // member before the request does.
    for m in (0..3u8).filter(|m| *m != resp) {
        net.flight.push((m, Msg::Req(req.clone(), None)));
    }
    while !net.flight.is_empty() {
        net.deliver(0);
    }
    assert!(net.answers.is_empty());
    net.flight.push((resp, Msg::Req(req, None)));
    net.deliver(0);
    assert_eq!(
        net.answers.get(&id),
        Some(&Answer::Written(0)),
        "answered at once, without waiting for a resend"
    );
}

#[test]
fn a_direct_read_is_answered_by_the_responsible_member_only() {
    let mut net = Net::new(3);
    let key = b("direct".into());
    let resp = *net.replicas[&0].responsible(&key).unwrap();
    let read = |seq| Request {
        id: ReqId { client: 1, seq },
        key: key.clone(),
        op: Op::Read(Read::Exists),
    };
    for m in 0..3u8 {
        let r = net.replicas.get_mut(&m).unwrap();
        r.handle_direct(read(u64::from(m)));
        let outs: Vec<_> = r.drain_out().collect();
        let want = if m == resp {
            Answer::Exists(false)
        } else {
            Answer::NotResponsible
        };
        assert_eq!(
            outs,
            [Out::Reply {
                id: ReqId {
                    client: 1,
                    seq: u64::from(m)
                },
                answer: want
            }],
            "member {m}"
        );
    }
    // A write sent to one member alone is refused: writes are published to every member.
    let r = net.replicas.get_mut(&resp).unwrap();
    let write = set(9, &key);
    let id = write.id;
    r.handle_direct(write);
    let outs: Vec<_> = r.drain_out().collect();
    assert_eq!(
        outs,
        [Out::Reply {
            id,
            answer: Answer::NotResponsible
        }]
    );
    assert_eq!(
        r.store().scan(b"", 10),
        Vec::<Bytes>::new(),
        "nothing applied"
    );
}
