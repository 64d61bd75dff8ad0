//! The directory on a small in-memory network: messages delivered in order, instantly, except
//! across a partition (dropped).

use std::collections::{BTreeSet, VecDeque};

use super::*;
use crate::harness::SimId;

const T: Duration = Duration::ZERO;

fn id(i: u32) -> SimId {
    SimId {
        index: i,
        incarnation: 1,
    }
}

type Registered = Result<(), RegisterError<SimId>>;
type Found = Result<Option<Entry<SimId>>, LookupError>;

struct Net {
    dirs: Vec<Directory<SimId>>,
    /// Nodes that are down (their directories take no part).
    down: BTreeSet<u32>,
    /// Partition sides: a message between sides is dropped.
    side: Vec<u8>,
    /// Answers and losses each node got.
    registered: Vec<Vec<(ReqId, Registered)>>,
    found: Vec<Vec<(ReqId, Found)>>,
    lost: Vec<Vec<(String, Entry<SimId>)>>,
    messages: usize,
}

impl Net {
    fn new(n: u32, cfg: DirectoryConfig) -> Net {
        let mut net = Net {
            dirs: (0..n).map(|i| Directory::new(id(i), cfg.clone())).collect(),
            down: BTreeSet::new(),
            side: vec![0; n as usize],
            registered: vec![Vec::new(); n as usize],
            found: vec![Vec::new(); n as usize],
            lost: vec![Vec::new(); n as usize],
            messages: 0,
        };
        net.views();
        net
    }

    /// Every live node sees the live members of its side.
    fn views(&mut self) {
        for i in 0..self.dirs.len() {
            if self.down.contains(&(i as u32)) {
                continue;
            }
            let members: Vec<SimId> = (0..self.dirs.len() as u32)
                .filter(|j| !self.down.contains(j) && self.side[*j as usize] == self.side[i])
                .map(id)
                .collect();
            self.dirs[i].handle_members(T, &members);
        }
        self.run();
        // The resync a change of members leads to.
        let later = DirectoryConfig::default().resync_after;
        for (i, d) in self.dirs.iter_mut().enumerate() {
            if !self.down.contains(&(i as u32)) {
                d.handle_timeout(later);
            }
        }
        self.run();
    }

    fn run(&mut self) {
        let mut queue: VecDeque<(u32, SimId, DirMsg<SimId>)> = VecDeque::new();
        loop {
            for i in 0..self.dirs.len() {
                while let Some(o) = self.dirs[i].poll_output() {
                    match o {
                        DirOutput::Send { to, msg } => queue.push_back((i as u32, to, msg)),
                        DirOutput::Registered { req, result } => {
                            self.registered[i].push((req, result))
                        }
                        DirOutput::Found { req, result } => self.found[i].push((req, result)),
                        DirOutput::Lost { name, winner } => self.lost[i].push((name, winner)),
                    }
                }
            }
            let Some((from, to, msg)) = queue.pop_front() else {
                break;
            };
            self.messages += 1;
            let t = to.index as usize;
            if self.down.contains(&to.index) || self.side[t] != self.side[from as usize] {
                continue;
            }
            self.dirs[t].handle_message(T, id(from), msg);
        }
    }

    fn register(&mut self, node: u32, name: &str, stamp: u64) -> Result<(), RegisterError<SimId>> {
        let target = Bytes::from(format!("{name}@{node}"));
        let req = self.dirs[node as usize].register(T, name, target, stamp);
        self.run();
        self.registered[node as usize]
            .iter()
            .find(|(r, _)| *r == req)
            .map(|(_, res)| res.clone())
            .expect("an answer")
    }

    fn whereis(&mut self, node: u32, name: &str) -> Option<SimId> {
        match self.dirs[node as usize].whereis(T, name) {
            Whereis::Now(e) => e.map(|e| e.owner),
            Whereis::Asked(req) => {
                self.run();
                let (_, r) = self.found[node as usize]
                    .iter()
                    .find(|(r, _)| *r == req)
                    .cloned()
                    .expect("an answer");
                r.unwrap().map(|e| e.owner)
            }
            Whereis::Failed(e) => panic!("{e}"),
        }
    }
}

#[test]
fn register_whereis_unregister_across_five_nodes() {
    let mut net = Net::new(5, DirectoryConfig::default());
    assert_eq!(net.register(1, "svc", 10), Ok(()));
    for n in 0..5 {
        assert_eq!(net.whereis(n, "svc"), Some(id(1)), "through n{n}");
    }
    // The second lookup of a node that asked is served from its cache.
    let asker = (0..5)
        .find(|&n| net.dirs[n as usize].stats().remote_lookups > 0)
        .expect("some node asked the home");
    let before = net.dirs[asker as usize].stats();
    assert_eq!(net.whereis(asker, "svc"), Some(id(1)));
    let after = net.dirs[asker as usize].stats();
    assert_eq!(after.remote_lookups, before.remote_lookups);
    assert_eq!(after.local_lookups, before.local_lookups + 1);
    // Taken for anyone else; the owner may register it again.
    assert!(matches!(net.register(2, "svc", 5), Err(RegisterError::Taken(e)) if e.owner == id(1)));
    assert_eq!(net.register(1, "svc", 11), Ok(()));
    assert!(net.dirs[1].unregister("svc"));
    assert!(!net.dirs[1].unregister("svc"));
    net.run();
    for n in 0..5 {
        net.dirs[n as usize].invalidate("svc");
        assert_eq!(net.whereis(n, "svc"), None, "through n{n}");
    }
    assert_eq!(net.register(2, "svc", 12), Ok(()));

    // An owner that is neither home nor replica: its release, relayed by the home, removes
    // the replicas' copies too (a deletion names the owner, not the home that relays it).
    let reps = net.dirs[0].replicas("svc2");
    let owner = (0..5)
        .find(|n| !reps.contains(&id(*n)))
        .expect("5 nodes, 3 replicas");
    assert_eq!(net.register(owner, "svc2", 20), Ok(()));
    assert!(reps
        .iter()
        .all(|r| net.dirs[r.index as usize].stored("svc2").is_some()));
    assert!(net.dirs[owner as usize].unregister("svc2"));
    net.run();
    for n in 0..5 {
        assert_eq!(net.dirs[n as usize].stored("svc2"), None, "copy on n{n}");
    }
}

#[test]
fn of_concurrent_registrations_of_one_name_exactly_one_wins() {
    let mut net = Net::new(7, DirectoryConfig::default());
    let reqs: Vec<(u32, ReqId)> = (0..7)
        .map(|n| {
            let r = net.dirs[n as usize].register(T, "leader", Bytes::new(), 100 - u64::from(n));
            (n, r)
        })
        .collect();
    net.run();
    let winners: Vec<u32> = reqs
        .iter()
        .filter(|(n, r)| {
            net.registered[*n as usize]
                .iter()
                .any(|(q, res)| q == r && res.is_ok())
        })
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(winners.len(), 1, "{winners:?}");
    for n in 0..7 {
        assert_eq!(net.whereis(n, "leader"), Some(id(winners[0])));
    }
}

#[test]
fn a_dead_owners_names_vanish_and_a_dead_home_loses_nothing() {
    let mut net = Net::new(6, DirectoryConfig::default());
    for k in 0..60 {
        assert_eq!(net.register(k % 6, &format!("n{k}"), k.into()), Ok(()));
    }
    // Warm every cache.
    for n in 0..6 {
        for k in 0..60 {
            net.whereis(n, &format!("n{k}"));
        }
    }
    net.down.insert(2);
    net.views();
    for n in (0..6).filter(|&n| n != 2) {
        for k in 0..60u32 {
            let want = (k % 6 != 2).then(|| id(k % 6));
            assert_eq!(net.whereis(n, &format!("n{k}")), want, "n{k} through n{n}");
        }
    }
    // Node 2 was the home of some names; their replicas took over.
    assert!((0..60).any(|k: u32| net.dirs[0].replicas(&format!("n{k}")).len() == 3));
}

#[test]
fn a_partition_heals_to_one_winner_and_the_loser_is_told() {
    let mut net = Net::new(5, DirectoryConfig::default());
    net.side = vec![0, 0, 0, 1, 1];
    net.views();
    // Both sides register the name; the minority's is older (smaller stamp) and wins.
    assert_eq!(net.register(0, "x", 200), Ok(()));
    assert_eq!(net.register(4, "x", 100), Ok(()));
    assert_eq!(net.whereis(1, "x"), Some(id(0)));
    assert_eq!(net.whereis(3, "x"), Some(id(4)));
    net.side = vec![0; 5];
    net.views();
    for n in 0..5 {
        net.dirs[n as usize].invalidate("x");
        assert_eq!(net.whereis(n, "x"), Some(id(4)), "through n{n}");
    }
    assert_eq!(net.lost[0].len(), 1);
    assert_eq!(net.lost[0][0].0, "x");
    assert!(net.lost[4].is_empty());
    // The loser no longer counts it as its own.
    assert!(!net.dirs[0].unregister("x"));
}

#[test]
fn a_registration_costs_the_same_messages_at_ten_and_at_a_hundred_nodes() {
    let per_registration = |n: u32| {
        let mut net = Net::new(n, DirectoryConfig::default());
        let before = net.messages;
        for k in 0..100u32 {
            assert_eq!(net.register(k % n, &format!("u{k}"), k.into()), Ok(()));
        }
        (net.messages - before) as f64 / 100.0
    };
    let (ten, hundred) = (per_registration(10), per_registration(100));
    // A claim, its answer and two copies at most.
    assert!(ten <= 4.0 && hundred <= 4.0, "{ten} {hundred}");
}

#[test]
fn bounds_refuse_clearly() {
    let small = DirectoryConfig {
        replicas: 1,
        max_names: 2,
        max_pending: 1,
        cache_capacity: 1,
        request_timeout: Duration::from_secs(1),
        resync_after: Duration::from_secs(1),
    };
    // Alone: this node is every name's home.
    let mut d = Directory::new(id(0), small.clone());
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        d.register(T, name, Bytes::new(), i as u64);
    }
    let results: Vec<_> = std::iter::from_fn(|| d.poll_output())
        .map(|o| match o {
            DirOutput::Registered { result, .. } => result,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(results, vec![Ok(()), Ok(()), Err(RegisterError::Full)]);

    // A home that never answers: one request in flight at most, and it times out.
    let mut d = Directory::new(id(0), small);
    d.handle_members(T, &[id(0), id(1)]);
    let far = (0..100)
        .map(|k| format!("k{k}"))
        .find(|k| d.replicas(k)[0] == id(1))
        .unwrap();
    let req = match d.whereis(T, &far) {
        Whereis::Asked(r) => r,
        other => panic!("{other:?}"),
    };
    assert_eq!(d.whereis(T, &far), Whereis::Failed(LookupError::Busy));
    while d.poll_output().is_some() {}
    d.handle_timeout(Duration::from_secs(2));
    assert_eq!(
        d.poll_output(),
        Some(DirOutput::Found {
            req,
            result: Err(LookupError::Timeout)
        })
    );
    assert_eq!(d.stats().timeouts, 1);
}

#[test]
fn a_join_copies_only_the_names_that_move() {
    let mut net = Net::new(11, DirectoryConfig::default());
    // Node 10 is not a member yet.
    net.down.insert(10);
    net.views();
    for k in 0..500u32 {
        assert_eq!(net.register(k % 10, &format!("j{k}"), k.into()), Ok(()));
    }
    let before = net.messages;
    net.down.remove(&10);
    net.views();
    let moved: usize = (0..500u32)
        .filter(|k| net.dirs[0].replicas(&format!("j{k}")).contains(&id(10)))
        .count();
    // About 3/11 of the names gain node 10 as a replica; each is copied there by the
    // replicas that keep it (at most two), in one batch per sender, and the owners of the
    // names whose home it became assert them there, one batch (and its answer) per owner.
    // Nothing else moves.
    assert!((80..200).contains(&moved), "{moved}");
    assert!(net.messages - before <= 30, "{}", net.messages - before);
    assert_eq!(net.dirs[10].stats().stored, moved);
    for k in 0..500u32 {
        assert_eq!(net.whereis(10, &format!("j{k}")), Some(id(k % 10)));
    }
}

impl Net {
    fn register_replacing(
        &mut self,
        node: u32,
        name: &str,
        stamp: u64,
        from: u32,
    ) -> Result<(), RegisterError<SimId>> {
        let target = Bytes::from(format!("{name}@{node}"));
        let req = self.dirs[node as usize].register_replacing(T, name, target, stamp, id(from));
        self.run();
        self.registered[node as usize]
            .iter()
            .find(|(r, _)| *r == req)
            .map(|(_, res)| res.clone())
            .expect("an answer")
    }
}

#[test]
fn a_handed_over_name_is_never_free_and_only_the_next_holder_takes_it() {
    // For names homed on every kind of node (the owner, the next holder, a third node).
    for name in ["k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"] {
        let mut net = Net::new(5, DirectoryConfig::default());
        assert_eq!(net.register(1, name, 10), Ok(()));
        // n1 hands the name to n2: it no longer holds it, but lookups still find it.
        assert!(net.dirs[1].hand_over(name));
        assert!(!net.dirs[1].hand_over(name));
        net.run();
        for n in 0..5 {
            net.dirs[n as usize].invalidate(name);
            assert_eq!(net.whereis(n, name), Some(id(1)), "{name} through n{n}");
        }
        // No one else may take it meanwhile, not even by claiming to replace another node.
        assert!(
            matches!(net.register(3, name, 1), Err(RegisterError::Taken(e)) if e.owner == id(1)),
            "{name}"
        );
        assert!(matches!(
            net.register_replacing(3, name, 1, 4),
            Err(RegisterError::Taken(_))
        ));
        // The next holder replaces it, on the home and on the replicas, without a conflict.
        assert_eq!(net.register_replacing(2, name, 20, 1), Ok(()), "{name}");
        for n in 0..5 {
            net.dirs[n as usize].invalidate(name);
            assert_eq!(net.whereis(n, name), Some(id(2)), "{name} through n{n}");
        }
        for r in net.dirs[0].replicas(name) {
            let stored = net.dirs[r.index as usize].stored(name).expect("a copy");
            assert_eq!(stored.owner, id(2), "{name}: copy on {r:?}");
        }
        assert!(net.lost.iter().all(Vec::is_empty), "{name}: {:?}", net.lost);
        // The old holder's late clean-up leaves the new holder's registration alone.
        net.dirs[1].release_if_left(name);
        net.run();
        net.dirs[0].invalidate(name);
        assert_eq!(net.whereis(0, name), Some(id(2)), "{name}");
        // A hand-over no one took is cleared by it.
        assert!(net.dirs[2].hand_over(name));
        net.dirs[2].release_if_left(name);
        net.run();
        for n in 0..5 {
            net.dirs[n as usize].invalidate(name);
            assert_eq!(net.whereis(n, name), None, "{name} through n{n}");
        }
        // Nor does it release a name its node holds again.
        assert_eq!(net.register(2, name, 30), Ok(()));
        net.dirs[2].release_if_left(name);
        net.run();
        net.dirs[4].invalidate(name);
        assert_eq!(net.whereis(4, name), Some(id(2)), "{name}");
    }
}
