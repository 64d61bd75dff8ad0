//! The cluster the service tests start from.

use std::time::Duration;

use maquis_proto::harness::{NetConfig, Network, Observer};
use maquis_proto::membership::MembershipConfig;
use maquis_proto::overlay::{Erased, HyParView, HyParViewConfig};

/// `n` peer-to-peer nodes (active views of 4: most pairs are not neighbours), each started
/// with `start` (the services it runs) and joined one every 20 ms, settled for 10 s; every node
/// lists every other.
pub fn p2p_cluster<O: Observer>(
    n: u32,
    observer: O,
    start: impl Fn(&mut Network<O>, u32),
) -> Network<O> {
    let mut net = Network::new(NetConfig::default(), observer);
    for i in 0..n {
        let id = net.next_id();
        let cfg = HyParViewConfig {
            active_size: 4,
            passive_size: 12,
            seed: Some(u64::from(i) + 7),
            ..HyParViewConfig::default()
        };
        let node = net.spawn(
            Box::new(Erased(HyParView::new(id, cfg))),
            MembershipConfig::default(),
        );
        start(&mut net, node);
        if i > 0 {
            net.join(node, (i * 7 + 3) % i);
        }
        net.run_for(Duration::from_millis(20));
    }
    net.run_for(Duration::from_secs(10));
    for i in 0..n {
        assert_eq!(net.node(i).machine.members().len(), n as usize, "node {i}");
    }
    net
}
