//! The groups machines on a small in-memory network: messages delivered in order, instantly,
//! except those a test loses and those across a partition.

use std::collections::BTreeSet;

use super::*;
use crate::harness::SimId;

const T: Duration = Duration::ZERO;

fn id(i: u32) -> SimId {
    SimId {
        index: i,
        incarnation: 1,
    }
}

fn actor(id: u64) -> Actor {
    Actor { id, ty: 7 }
}

struct Net {
    nodes: Vec<Groups<SimId>>,
    down: BTreeSet<u32>,
    side: Vec<u8>,
    /// Lose every message from this node while set.
    mute: Option<u32>,
    messages: usize,
}

impl Net {
    fn new(n: u32, cfg: GroupsConfig) -> Net {
        let mut net = Net {
            nodes: (0..n).map(|i| Groups::new(id(i), cfg.clone())).collect(),
            down: BTreeSet::new(),
            side: vec![0; n as usize],
            mute: None,
            messages: 0,
        };
        net.views();
        net
    }

    fn views(&mut self) {
        for i in 0..self.nodes.len() {
            if self.down.contains(&(i as u32)) {
                continue;
            }
            let members: Vec<SimId> = (0..self.nodes.len() as u32)
                .filter(|j| !self.down.contains(j) && self.side[*j as usize] == self.side[i])
                .map(id)
                .collect();
            self.nodes[i].handle_members(T, &members);
        }
        self.run();
    }

    fn run(&mut self) {
        loop {
            let mut sent = Vec::new();
            for i in 0..self.nodes.len() {
                while let Some(GroupOutput::Send { to, msg }) = self.nodes[i].poll_output() {
                    sent.push((i as u32, to, msg));
                }
            }
            if sent.is_empty() {
                return;
            }
            for (from, to, msg) in sent {
                let t = to.index as usize;
                if self.mute == Some(from)
                    || self.down.contains(&to.index)
                    || self.side[t] != self.side[from as usize]
                {
                    continue;
                }
                self.messages += 1;
                self.nodes[t].handle_message(T, id(from), msg);
            }
        }
    }

    /// Who every live node sees in `group`, as (node, actor id), sorted.
    fn seen(&self, group: &str) -> Vec<Vec<(u32, u64)>> {
        (0..self.nodes.len())
            .filter(|i| !self.down.contains(&(*i as u32)))
            .map(|i| {
                let mut v: Vec<(u32, u64)> = self.nodes[i]
                    .members(group)
                    .into_iter()
                    .map(|(p, a)| (p.index, a.id))
                    .collect();
                v.sort();
                v
            })
            .collect()
    }

    fn all_see(&self, group: &str, want: &[(u32, u64)]) {
        for (i, got) in self.seen(group).into_iter().enumerate() {
            assert_eq!(got, want, "node {i} sees {group}");
        }
    }
}

#[test]
fn joins_and_leaves_reach_every_node() {
    let mut net = Net::new(5, GroupsConfig::default());
    net.nodes[1].join(T, "workers", actor(10)).unwrap();
    net.nodes[3].join(T, "workers", actor(30)).unwrap();
    net.nodes[3].join(T, "workers", actor(31)).unwrap();
    net.nodes[3].join(T, "other", actor(31)).unwrap();
    // Joining twice is one membership.
    net.nodes[3].join(T, "workers", actor(31)).unwrap();
    net.run();
    net.all_see("workers", &[(1, 10), (3, 30), (3, 31)]);
    assert!(net.nodes[1].leave(T, "workers", actor(10)));
    assert!(!net.nodes[1].leave(T, "workers", actor(10)));
    net.nodes[3].remove_actor(T, 31);
    net.run();
    net.all_see("workers", &[(3, 30)]);
    net.all_see("other", &[]);
    assert_eq!(net.nodes[3].groups_of(30), vec!["workers".to_string()]);
    assert_eq!(net.nodes[0].stats().remote, 1);
}

#[test]
fn a_lost_delta_is_repaired_by_the_next_one_or_the_digest() {
    let mut net = Net::new(3, GroupsConfig::default());
    // Node 0's first change is lost; its second reveals the gap.
    net.mute = Some(0);
    net.nodes[0].join(T, "g", actor(1)).unwrap();
    net.run();
    net.mute = None;
    net.nodes[0].join(T, "g", actor(2)).unwrap();
    net.run();
    net.all_see("g", &[(0, 1), (0, 2)]);
    assert!(net.nodes[1].stats().resyncs >= 1);
    // Its last change is lost: the digest repairs it.
    net.mute = Some(0);
    net.nodes[0].leave(T, "g", actor(1));
    net.run();
    net.mute = None;
    assert_eq!(net.seen("g")[1], vec![(0, 1), (0, 2)], "not yet");
    let later = GroupsConfig::default().digest_every;
    net.nodes[0].handle_timeout(later);
    net.run();
    net.all_see("g", &[(0, 2)]);
}

#[test]
fn a_gone_nodes_members_leave_and_a_healed_partition_merges() {
    let mut net = Net::new(4, GroupsConfig::default());
    for i in 0..4u32 {
        net.nodes[i as usize]
            .join(T, "g", actor(u64::from(i)))
            .unwrap();
    }
    net.run();
    net.down.insert(2);
    net.views();
    net.all_see("g", &[(0, 0), (1, 1), (3, 3)]);
    // A partition: each side sees its own; joins on both sides; the heal merges them.
    net.side = vec![0, 0, 0, 1];
    net.views();
    net.nodes[0].join(T, "g", actor(100)).unwrap();
    net.nodes[3].join(T, "g", actor(300)).unwrap();
    net.run();
    assert_eq!(net.seen("g")[2], vec![(3, 3), (3, 300)], "node 3 alone");
    net.side = vec![0; 4];
    net.views();
    net.all_see("g", &[(0, 0), (0, 100), (1, 1), (3, 3), (3, 300)]);
}

#[test]
fn bounds_refuse_or_count() {
    let small = GroupsConfig {
        max_members: 3,
        ..GroupsConfig::default()
    };
    let mut net = Net::new(2, small.clone());
    // Node 1 may keep more.
    net.nodes[1] = Groups::new(id(1), GroupsConfig::default());
    net.views();
    assert_eq!(net.nodes[0].join(T, "", actor(1)), Err(JoinError::BadName));
    assert_eq!(
        net.nodes[0].join(T, &"x".repeat(256), actor(1)),
        Err(JoinError::BadName)
    );
    for k in 0..3 {
        net.nodes[0].join(T, "g", actor(k)).unwrap();
    }
    assert_eq!(net.nodes[0].join(T, "g", actor(9)), Err(JoinError::Full));
    net.run();
    // Node 0 is full: node 1's join is dropped there, and counted.
    net.nodes[1].join(T, "h", actor(5)).unwrap();
    net.run();
    assert_eq!(net.nodes[0].stats().dropped, 1);
    assert!(net.nodes[0].members("h").is_empty());
    let s = net.nodes[1].stats();
    assert_eq!((s.local, s.remote), (1, 3));
    // Room again: the next change (or digest) brings it in.
    net.nodes[0].leave(T, "g", actor(0));
    net.run();
    net.nodes[1].handle_timeout(GroupsConfig::default().digest_every);
    net.run();
    assert_eq!(net.nodes[0].members("h").len(), 1);
    assert_eq!(small.max_members, 3);
}

#[test]
fn a_node_is_synced_once_it_has_had_every_members_state() {
    let mut a = Groups::new(id(0), GroupsConfig::default());
    let mut b = Groups::new(id(1), GroupsConfig::default());
    assert!(a.stats().synced, "alone, it knows everything");
    b.join(T, "g", actor(1)).unwrap();
    a.handle_members(T, &[id(0), id(1)]);
    b.handle_members(T, &[id(0), id(1)]);
    assert!(!a.stats().synced, "nothing heard from node 1 yet");
    assert!(a.members("g").is_empty());
    while let Some(GroupOutput::Send { msg, .. }) = b.poll_output() {
        a.handle_message(T, id(1), msg);
    }
    assert!(a.stats().synced);
    assert_eq!(a.members("g").len(), 1);
}
