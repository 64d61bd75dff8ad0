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
    Req(Request),
    Confirm(u8, ReqId),
    Resend(u8, Request),
}

struct Net {
    replicas: BTreeMap<u8, Replica<u8>>,
    /// Messages in flight: (to, message).
    flight: Vec<(u8, Msg)>,
    /// First answer to each request.
    answers: BTreeMap<ReqId, Answer>,
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
                    self.answers.entry(id).or_insert(answer);
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
            Msg::Req(req) => r.handle_request(req, now),
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
        writes in prop::collection::vec((0..4u8, 0..3u8), 1..20),
        drops in prop::collection::vec(any::<bool>(), 60),
        picks in prop::collection::vec(any::<prop::sample::Index>(), 400),
        kill_at in 0..400usize,
        victim in 0..3u8,
    ) {
        let mut net = Net::new(3);
        let mut written: BTreeMap<ReqId, (Bytes, Version)> = BTreeMap::new();
        let mut drop = drops.iter().cycle();
        // Publish every write: each member's copy may be lost.
        for (seq, (key, val)) in writes.iter().enumerate() {
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
                    net.flight.push((m, Msg::Req(req.clone())));
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
            Msg::Req(Request {
                id,
                key: key.clone(),
                op: Op::Read(Read::Get),
            }),
        ));
    }
    while !net.flight.is_empty() {
        net.deliver(0);
    }
    assert_eq!(net.answers.get(&id), Some(&Answer::Value(None)));
    assert_eq!(net.replies, 1, "one member answers");
}

#[test]
fn confirmations_that_come_before_their_request_count() {
    let mut net = Net::new(3);
    let key = b("some key".into());
    let resp = *net.replicas[&0].responsible(&key).unwrap();
    let id = ReqId { client: 1, seq: 0 };
    let req = Request {
        id,
        key,
        op: Op::Write(
            Write::Set(b("v".into())),
            Version {
                clock: 1,
                writer: 1,
            },
        ),
    };
    // The others apply the write and confirm; their confirmations reach the responsible
    // member before the request does.
    for m in (0..3u8).filter(|m| *m != resp) {
        net.flight.push((m, Msg::Req(req.clone())));
    }
    while !net.flight.is_empty() {
        net.deliver(0);
    }
    assert!(net.answers.is_empty());
    net.flight.push((resp, Msg::Req(req)));
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
    let id = ReqId { client: 1, seq: 9 };
    r.handle_direct(Request {
        id,
        key: key.clone(),
        op: Op::Write(
            Write::Set(b("v".into())),
            Version {
                clock: 1,
                writer: 1,
            },
        ),
    });
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
