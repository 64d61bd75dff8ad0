//! Dispatch: which lane (channel × index) carries a message.
//!
//! With striping (`transport.stripe_bytes` > 0, the default) a channel of several lanes
//! carries every frame smaller than `stripe_bytes` on its first lane, its ordering lane, and
//! stripes larger ones over the others ([`crate::transport::stripe`]): one sender's messages to
//! one receiver, or those of one partition key, stay in order whatever their sizes, and small
//! messages are batched as on a single connection.
//!
//! Without striping, PARTISAN's way: with a partition key the lane index is
//! `hash(key) % parallelism`; with affinity on and no key it is `hash(sender, receiver) %
//! parallelism`, so one sender's messages to one receiver share a lane and stay in order; with
//! affinity off and no key, lanes are taken round robin and no order is promised.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::config::ChannelSpec;
use crate::id::{DEFAULT_CHANNEL, MEMBERSHIP_CHANNEL};

/// Per-message send options.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SendOpts {
    /// The channel to send on; an unknown name falls back to `default`.
    pub channel: Option<String>,
    /// A partition key: the message goes on lane `key mod parallelism` of its channel, so
    /// messages with equal keys share a lane, and keys `0..n` spread evenly over the lanes
    /// (PARTISAN's partition keys). [`SendOpts::partition`] sets an index as is;
    /// [`SendOpts::partition_key`] hashes any value first.
    pub partition_key: Option<u64>,
    /// Acknowledged delivery: the message is resent until the receiving node acknowledges
    /// it, and handled once (see [`Acked`]). `None`: at most once.
    pub acked: Option<Acked>,
}

/// How an acknowledged send ([`SendOpts::acked`]) resends and when it gives up.
///
/// `send_with` then returns once the receiving node has put the message in the actor's
/// mailbox (`Ok`), found no such actor (`NoProc`) or one of another type (`TypeMismatch`), or
/// when `give_up_after` has passed without an acknowledgement (`Unacknowledged`: the message
/// may or may not have been handled). Resends wait `first_retry`, doubling up to `max_retry`.
/// The receiving node handles each message once per sending node's incarnation, so resends
/// never duplicate; acknowledged messages can overtake one another after a loss. Calls ignore
/// it: a call's outcome is its reply or its timeout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acked {
    /// The wait before the first resend (default 200 ms).
    pub first_retry: std::time::Duration,
    /// The longest wait between two resends (default 5 s).
    pub max_retry: std::time::Duration,
    /// How long to keep trying, the wait for room in the window included (default 30 s).
    pub give_up_after: std::time::Duration,
}

impl Default for Acked {
    fn default() -> Self {
        Acked {
            first_retry: std::time::Duration::from_millis(200),
            max_retry: std::time::Duration::from_secs(5),
            give_up_after: std::time::Duration::from_secs(30),
        }
    }
}

impl SendOpts {
    /// Options that pick a channel.
    pub fn on(channel: impl Into<String>) -> Self {
        SendOpts {
            channel: Some(channel.into()),
            ..SendOpts::default()
        }
    }

    /// Sets the channel.
    pub fn channel(mut self, channel: impl Into<String>) -> Self {
        self.channel = Some(channel.into());
        self
    }

    /// Asks for acknowledged delivery with the default resends (see [`Acked`]).
    pub fn acked(mut self) -> Self {
        self.acked = Some(Acked::default());
        self
    }

    /// Asks for acknowledged delivery with these resends.
    pub fn acked_with(mut self, acked: Acked) -> Self {
        self.acked = Some(acked);
        self
    }

    /// Sets the partition key from any hashable value (its hash picks the lane).
    pub fn partition_key<K: Hash + ?Sized>(mut self, key: &K) -> Self {
        self.partition_key = Some(hash_of(key));
        self
    }

    /// Sets the partition key to an index used as is: lane `index mod parallelism`. Indexes
    /// `0..n` (partitions, actor numbers) then share the lanes evenly.
    pub fn partition(mut self, index: u64) -> Self {
        self.partition_key = Some(index);
        self
    }
}

/// A stable 64-bit hash (the same in every process of one build).
pub(crate) fn hash_of<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

/// Where one message goes: its lane slot, and its order key on that lane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Pick {
    /// The lane slot in the peer's lane table.
    pub slot: usize,
    /// Frames with the same key on a lane stay in order (see `transport::schedule`).
    pub order: u64,
    /// With striping: the slots a large frame's parts go on (the channel's other lanes).
    pub stripe: Option<std::ops::Range<usize>>,
}

/// Maps channels and keys to lane slots in a peer's lane table.
#[derive(Debug)]
pub(crate) struct Dispatcher {
    specs: Vec<ChannelSpec>,
    by_name: HashMap<String, usize>,
    round_robin: Vec<AtomicUsize>,
    affinity: bool,
    striping: bool,
    default_channel: usize,
}

impl Dispatcher {
    /// Builds the dispatcher for a channel table (as made by `TransportConfig::channel_specs`),
    /// with affinity and striping on or off.
    pub(crate) fn new(specs: Vec<ChannelSpec>, affinity: bool, striping: bool) -> Self {
        let by_name: HashMap<String, usize> = specs
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.clone(), i))
            .collect();
        let default_channel = by_name.get(DEFAULT_CHANNEL).copied().unwrap_or(0);
        let round_robin = specs.iter().map(|_| AtomicUsize::new(0)).collect();
        Dispatcher {
            specs,
            by_name,
            round_robin,
            affinity,
            striping,
            default_channel,
        }
    }

    /// The channel table.
    pub(crate) fn specs(&self) -> &[ChannelSpec] {
        &self.specs
    }

    /// The channel table as (name, parallelism) in lane order; two nodes must agree on it.
    pub(crate) fn table(&self) -> Vec<(String, u16)> {
        self.specs
            .iter()
            .map(|s| (s.name.clone(), s.parallelism))
            .collect()
    }

    /// Lanes per peer in all.
    pub(crate) fn total_lanes(&self) -> usize {
        self.specs
            .last()
            .map(|s| s.offset + s.parallelism as usize)
            .unwrap_or(0)
    }

    /// The slot of the membership channel's only lane.
    pub(crate) fn membership_slot(&self) -> usize {
        self.by_name
            .get(MEMBERSHIP_CHANNEL)
            .map(|&i| self.specs[i].offset)
            .unwrap_or(0)
    }

    /// Which channel a name denotes (unknown → `default`; `membership` is reserved for
    /// protocol traffic, so application sends naming it also go to `default`).
    pub(crate) fn channel_index(&self, name: Option<&str>) -> usize {
        name.filter(|n| *n != MEMBERSHIP_CHANNEL)
            .and_then(|n| self.by_name.get(n).copied())
            .unwrap_or(self.default_channel)
    }

    /// Picks the lane slot for one message, and its order key (see `transport::schedule`):
    /// the partition key, or else the hash of its sender and receiver (the one affinity picks
    /// the lane by). Messages with the same key on one lane keep their order when a large one
    /// among them goes in parts.
    pub(crate) fn pick(&self, opts: &SendOpts, sender: u64, receiver: u64) -> Pick {
        let ch = self.channel_index(opts.channel.as_deref());
        let spec = &self.specs[ch];
        let p = spec.parallelism.max(1) as u64;
        let order = opts
            .partition_key
            .unwrap_or_else(|| hash_of(&(sender, receiver)));
        if self.striping && p > 1 {
            return Pick {
                slot: spec.offset,
                order,
                stripe: Some(spec.offset + 1..spec.offset + p as usize),
            };
        }
        let index = if opts.partition_key.is_some() || self.affinity {
            order % p
        } else {
            (self.round_robin[ch].fetch_add(1, Ordering::Relaxed) as u64) % p
        };
        Pick {
            slot: spec.offset + index as usize,
            order,
            stripe: None,
        }
    }

    /// The (channel, index) of a slot.
    #[cfg(test)]
    pub(crate) fn lane_of(&self, slot: usize) -> Option<(&str, u16)> {
        self.specs.iter().find_map(|s| {
            (slot >= s.offset && slot < s.offset + s.parallelism as usize)
                .then(|| (s.name.as_str(), (slot - s.offset) as u16))
        })
    }

    /// The slot of (channel, index), if that lane exists.
    pub(crate) fn slot_of(&self, channel: &str, index: u16) -> Option<usize> {
        let s = &self.specs[*self.by_name.get(channel)?];
        (index < s.parallelism).then_some(s.offset + index as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn dispatcher(affinity: bool) -> Dispatcher {
        let c = Config::new("x").parallelism(16).channel("vnode", Some(4));
        Dispatcher::new(c.transport.channel_specs(), affinity, false)
    }

    #[test]
    fn striping_keeps_small_frames_on_the_first_lane() {
        let c = Config::new("x").parallelism(16).channel("vnode", Some(4));
        let d = Dispatcher::new(c.transport.channel_specs(), true, true);
        for s in 0..50 {
            let p = d.pick(&SendOpts::default(), s, 2);
            assert_eq!(p.slot, 1, "the default channel's first lane");
            assert_eq!(p.stripe, Some(2..17));
            let v = d.pick(&SendOpts::on("vnode").partition(s), 1, 2);
            assert_eq!((v.slot, v.order), (17, s));
            assert_eq!(v.stripe, Some(18..21));
        }
        // One lane: nothing to stripe over.
        let c = Config::new("x").channel("one", Some(1));
        let d = Dispatcher::new(c.transport.channel_specs(), true, true);
        let p = d.pick(&SendOpts::on("one"), 1, 2);
        assert_eq!(p.stripe, None);
    }

    #[test]
    fn affinity_is_stable_and_spreads() {
        let d = dispatcher(true);
        let opts = SendOpts::default();
        let a = d.pick(&opts, 1, 2).slot;
        assert!((0..100).all(|_| d.pick(&opts, 1, 2).slot == a));
        let slots: std::collections::HashSet<_> =
            (0..200).map(|s| d.pick(&opts, s, 2).slot).collect();
        assert!(
            slots.len() > 8,
            "affinity should spread senders over lanes: {slots:?}"
        );
        assert!(slots.iter().all(|&s| (1..17).contains(&s)));
    }

    #[test]
    fn round_robin_channels_and_keys() {
        let d = dispatcher(false);
        let opts = SendOpts::default();
        let picks: Vec<_> = (0..16).map(|_| d.pick(&opts, 1, 2).slot).collect();
        let distinct: std::collections::HashSet<_> = picks.iter().collect();
        assert_eq!(distinct.len(), 16);
        let spread: std::collections::HashSet<_> = (0..4u64)
            .map(|i| d.pick(&SendOpts::on("vnode").partition(i), 1, 2).slot)
            .collect();
        assert_eq!(spread.len(), 4, "indexes 0..4 take the 4 vnode lanes");
        let v = SendOpts::on("vnode").partition_key("key-7");
        let s = d.pick(&v, 1, 2).slot;
        assert_eq!(d.lane_of(s).map(|(c, _)| c), Some("vnode"));
        assert!((0..10).all(|i| d.pick(&v, i, i + 1).slot == s));
        let reserved = SendOpts::on("membership");
        assert_eq!(
            d.lane_of(d.pick(&reserved, 1, 2).slot).map(|(c, _)| c),
            Some("default")
        );
        let unknown = SendOpts::on("nope");
        assert_eq!(
            d.lane_of(d.pick(&unknown, 1, 2).slot).map(|(c, _)| c),
            Some("default")
        );
        assert_eq!(d.slot_of("vnode", 3), Some(20));
        assert_eq!(d.slot_of("vnode", 4), None);
        assert_eq!(d.total_lanes(), 21);
        assert_eq!(d.membership_slot(), 0);
    }
}
