//! One exchange between two replicas of a primary partition (see the module docs).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use maquis::{ActorRef, ReplyTo};

use super::{diff, Pair, MAX_ROUNDS, MAX_SEGMENTS};
use crate::handoff::handoff_opts;
use crate::node::Shared;
use crate::object::Version;
use crate::vnode::{vnode_name, Entry, HandoffAck, TreeSummary, VnodeMsg};

/// What an exchange did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// The trees were equal at the end.
    pub in_sync: bool,
    /// Objects the local vnode got from its peer.
    pub pulled: u64,
    /// Objects the peer got from the local vnode.
    pub pushed: u64,
    /// Rounds run.
    pub rounds: usize,
}

struct Side {
    vnode: ActorRef<VnodeMsg>,
    partition: u32,
    node: String,
}

impl Side {
    async fn ask<R: maquis::Message>(
        &self,
        shared: &Shared,
        make: impl FnOnce(ReplyTo<R>) -> VnodeMsg,
    ) -> Result<R, String> {
        self.vnode
            .call_with(
                make,
                shared.config.request_timeout,
                &handoff_opts(self.partition),
            )
            .await
            .map_err(|e| format!("{} vnode {}: {e}", self.node, self.partition))
    }

    async fn tree(&self, shared: &Shared, q: u32) -> Result<TreeSummary, String> {
        self.ask(shared, |reply| VnodeMsg::AaeTree { q, reply })
            .await
    }

    async fn keys(
        &self,
        shared: &Shared,
        q: u32,
        segments: &[u32],
    ) -> Result<HashMap<Bytes, Version>, String> {
        let segments = segments.to_vec();
        let keys: Vec<(Bytes, Version)> = self
            .ask(shared, |reply| VnodeMsg::AaeKeys { q, segments, reply })
            .await?;
        Ok(keys.into_iter().collect())
    }

    /// Copies `keys` from `self` to `to`, in chunks; returns the objects stored there.
    async fn copy(&self, to: &Side, shared: &Shared, keys: Vec<Bytes>) -> Result<u64, String> {
        let mut moved = 0u64;
        for chunk in keys.chunks(shared.config.handoff_chunk_entries.max(1)) {
            let chunk = chunk.to_vec();
            let entries: Vec<Entry> = self
                .ask(shared, |reply| VnodeMsg::AaeFetch { keys: chunk, reply })
                .await?;
            if entries.is_empty() {
                continue;
            }
            let n = entries.len() as u64;
            let ack = to
                .ask(shared, |reply| VnodeMsg::AaeMerge { entries, reply })
                .await?;
            match ack {
                HandoffAck::Stored => moved += n,
                other => return Err(format!("{} vnode {}: {other:?}", to.node, to.partition)),
            }
        }
        Ok(moved)
    }
}

/// Runs one exchange of `pair`, the local vnode being `local`.
pub(crate) async fn exchange(
    shared: Arc<Shared>,
    pair: Pair,
    local: ActorRef<VnodeMsg>,
) -> Result<Outcome, String> {
    let remote: ActorRef<VnodeMsg> = shared
        .node
        .remote(&pair.peer, &vnode_name(pair.peer_partition))
        .ok_or_else(|| format!("{} is not a member", pair.peer))?;
    let mine = Side {
        vnode: local,
        partition: pair.local,
        node: shared.name.clone(),
    };
    let theirs = Side {
        vnode: remote,
        partition: pair.peer_partition,
        node: pair.peer.clone(),
    };
    let q = pair.q;
    let budget = shared.config.aae_max_objects as u64;
    let mut out = Outcome::default();
    while out.rounds < MAX_ROUNDS && out.pulled + out.pushed < budget {
        out.rounds += 1;
        let (a, b) = (mine.tree(&shared, q).await?, theirs.tree(&shared, q).await?);
        if !a.serving || !b.serving {
            return Err("a vnode of the pair has handed its data off".into());
        }
        let mut segments = diff(&a.segments, &b.segments);
        if segments.is_empty() {
            out.in_sync = true;
            return Ok(out);
        }
        segments.truncate(MAX_SEGMENTS);
        let ours = mine.keys(&shared, q, &segments).await?;
        let their = theirs.keys(&shared, q, &segments).await?;
        let newer = |x: &HashMap<Bytes, Version>, y: &HashMap<Bytes, Version>| -> Vec<Bytes> {
            x.iter()
                .filter(|(k, v)| y.get(*k).is_none_or(|w| w < *v))
                .map(|(k, _)| k.clone())
                .collect()
        };
        let (pull, push) = (newer(&their, &ours), newer(&ours, &their));
        if pull.is_empty() && push.is_empty() {
            // The segments differ but the keys listed do not (a key list cut at its limit,
            // or a hash collision): nothing this exchange can do.
            return Ok(out);
        }
        out.pulled += theirs.copy(&mine, &shared, pull).await?;
        out.pushed += mine.copy(&theirs, &shared, push).await?;
    }
    Ok(out)
}
