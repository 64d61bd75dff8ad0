//! The key-value store's coordinators: quorum reads and writes over the preference list.
//!
//! Each request gets a coordinator, a task spawned on the node that received the request. It
//! computes the key's preference list from its ring (N entries), replaces each primary that is
//! not a live member by a fallback (the next live node clockwise that is not in the list: a
//! sloppy quorum, the fallback keeps the data in its own vnode of that partition and hands it
//! back when the primary returns), sends the request to every target at once on the `vnode`
//! channel, and answers as soon as R reads or W writes succeeded. A read then keeps listening
//! for the remaining replies for a moment and repairs replicas that were missing the newest
//! object or had an older one (read repair); a write keeps delivering to the remaining
//! replicas until they acknowledge or the request deadline passes. Both only while one of
//! `max_background` slots is free.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use maquis::{ActorRef, CallError, ReplyTo, SendError};
use tokio::sync::{oneshot, OwnedSemaphorePermit};

use crate::error::RingError;
use crate::manager::{EnsureReply, ManagerMsg, MANAGER_NAME};
use crate::node::Shared;
use crate::object::{newest, Object};
use crate::vnode::{vnode_name, vnode_opts, VnodeMsg, VnodeReply};

/// One replica a request goes to: a partition's vnode on a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    /// The partition.
    pub partition: u32,
    /// The node.
    pub node: String,
    /// Whether it stands in for an unreachable primary.
    pub fallback: bool,
}

/// The targets of a key: its preference list, with fallbacks for primaries that are not live.
pub(crate) fn targets(shared: &Shared, key: &[u8]) -> Vec<Target> {
    let ring = shared.ring();
    let p0 = ring.partition_of(key);
    let primaries = ring.preflist(p0, shared.config.n_val);
    let live: BTreeSet<String> = shared
        .node
        .members()
        .into_iter()
        .map(|m| m.name.to_string())
        .collect();
    let mut used: BTreeSet<String> = primaries.iter().map(|(_, o)| o.clone()).collect();
    let mut spare = ring
        .owners_clockwise(p0)
        .into_iter()
        .filter(|n| live.contains(n));
    let mut out = Vec::with_capacity(primaries.len());
    for (p, owner) in primaries {
        if live.contains(&owner) {
            out.push(Target {
                partition: p,
                node: owner,
                fallback: false,
            });
            continue;
        }
        for n in spare.by_ref() {
            if used.insert(n.clone()) {
                out.push(Target {
                    partition: p,
                    node: n,
                    fallback: true,
                });
                break;
            }
        }
    }
    out
}

/// Sends one request to a target's vnode; starts the vnode first if it does not run there
/// (a fallback, or a vnode the target has not started yet).
async fn call_vnode(
    shared: &Shared,
    t: &Target,
    make: impl Fn(ReplyTo<VnodeReply>) -> VnodeMsg,
    deadline: Instant,
) -> Result<VnodeReply, String> {
    let name = vnode_name(t.partition);
    for attempt in 0..2 {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err("timed out".into());
        }
        let vnode: ActorRef<VnodeMsg> = shared
            .node
            .remote(&t.node, &name)
            .ok_or_else(|| format!("{} is not a member", t.node))?;
        match vnode
            .call_with(&make, remaining, &vnode_opts(t.partition))
            .await
        {
            Ok(r) => return Ok(r),
            // No such vnode there (remote: a NoProc reply; this node: a NoProc send).
            Err(CallError::NoProc | CallError::Send(SendError::NoProc)) if attempt == 0 => {
                let manager: ActorRef<ManagerMsg> = shared
                    .node
                    .remote(&t.node, MANAGER_NAME)
                    .ok_or_else(|| format!("{} is not a member", t.node))?;
                let ring_version = 0;
                let partition = t.partition;
                let answer = manager
                    .call_with(
                        |reply| ManagerMsg::EnsureVnode {
                            partition,
                            ring_version,
                            reply,
                        },
                        remaining,
                        &vnode_opts(t.partition),
                    )
                    .await
                    .map_err(|e| format!("{}: {e}", t.node))?;
                if answer != EnsureReply::Ready {
                    return Err(format!("{}: vnode not available", t.node));
                }
            }
            Err(e) => return Err(format!("{}: {e}", t.node)),
        }
    }
    Err(format!("{}: no vnode {name}", t.node))
}

/// Runs a coordinator task and waits for its answer. The task holds one of the node's
/// `max_inflight` permits until it has answered (it may keep running for read repair).
async fn coordinate<T: Send + 'static, F>(
    shared: &Arc<Shared>,
    f: impl FnOnce(Answer<T>) -> F,
) -> Result<T, RingError>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if !shared.ready.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(RingError::NotReady);
    }
    let permit = shared
        .inflight
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| RingError::Overloaded)?;
    let (tx, rx) = oneshot::channel();
    tokio::spawn(f(Answer {
        tx,
        _permit: permit,
    }));
    rx.await.map_err(|_| RingError::Overloaded)?
}

/// Where a coordinator sends its answer; sending it frees the in-flight permit.
struct Answer<T> {
    tx: oneshot::Sender<Result<T, RingError>>,
    _permit: OwnedSemaphorePermit,
}

impl<T> Answer<T> {
    fn send(self, res: Result<T, RingError>) {
        let _ = self.tx.send(res);
    }
}

/// A quorum read.
pub(crate) async fn get(shared: &Arc<Shared>, key: Bytes) -> Result<Option<Bytes>, RingError> {
    let s = shared.clone();
    coordinate(shared, move |tx| read(s, key, tx)).await
}

async fn read(shared: Arc<Shared>, key: Bytes, tx: Answer<Option<Bytes>>) {
    let cfg = &shared.config;
    let started = Instant::now();
    let deadline = started + cfg.request_timeout;
    let targets = targets(&shared, &key);
    let mut calls = FuturesUnordered::new();
    for (i, t) in targets.iter().cloned().enumerate() {
        let s = shared.clone();
        let k = key.clone();
        calls.push(async move {
            let make = |reply| VnodeMsg::Get {
                key: k.clone(),
                hops: 0,
                reply,
            };
            (i, call_vnode(&s, &t, make, deadline).await)
        });
    }
    let mut replies: Vec<Option<Option<Object>>> = vec![None; targets.len()];
    // Recovering replicas that do not have the key: no answer for the quorum, but repaired.
    let mut behind = vec![false; targets.len()];
    let (mut ok, mut failed) = (0usize, 0usize);
    let mut first_err: Option<String> = None;
    while ok < cfg.r && ok + (targets.len() - ok - failed) >= cfg.r {
        let Some((i, res)) = calls.next().await else {
            break;
        };
        match res {
            Ok(VnodeReply::Value(v)) => {
                replies[i] = Some(v);
                ok += 1;
            }
            Ok(VnodeReply::NotAuthoritative) => {
                behind[i] = true;
                failed += 1;
                first_err.get_or_insert(format!("{}: recovering", targets[i].node));
            }
            Ok(other) => {
                failed += 1;
                first_err.get_or_insert(format!("{}: {other:?}", targets[i].node));
            }
            Err(e) => {
                failed += 1;
                first_err.get_or_insert(e);
            }
        }
    }
    let best = replies
        .iter()
        .flatten()
        .fold(None, |acc, v| newest(acc, v.clone()));
    if ok < cfg.r {
        tx.send(Err(RingError::Quorum {
            needed: cfg.r,
            got: ok,
            detail: first_err.unwrap_or_else(|| format!("{} targets", targets.len())),
        }));
        return;
    }
    if let Some(b) = &best {
        shared.clock.observe(b.version.ts);
    }
    tx.send(Ok(best.as_ref().and_then(|o| o.value.clone())));
    shared.stats.reads.inc();

    // Read repair: wait a little for the stragglers (if a repair slot is free), then bring
    // every replica that answered up to the newest object.
    if !calls.is_empty() {
        if let Ok(_slot) = shared.background.clone().try_acquire_owned() {
            let wait = cfg.read_repair_wait.max(started.elapsed());
            let _ = tokio::time::timeout(wait.min(cfg.request_timeout), async {
                while let Some((i, res)) = calls.next().await {
                    match res {
                        Ok(VnodeReply::Value(v)) => replies[i] = Some(v),
                        Ok(VnodeReply::NotAuthoritative) => behind[i] = true,
                        _ => {}
                    }
                }
            })
            .await;
        }
    }
    drop(calls);
    let best = replies
        .iter()
        .flatten()
        .fold(None, |acc, v| newest(acc, v.clone()));
    let Some(best) = best else { return };
    for (i, t) in targets.iter().enumerate() {
        let have = match &replies[i] {
            Some(have) => have.as_ref().map(|o| o.version),
            None if behind[i] => None,
            None => continue,
        };
        if have == Some(best.version) {
            continue;
        }
        let vnode: Option<ActorRef<VnodeMsg>> =
            shared.node.remote(&t.node, &vnode_name(t.partition));
        if let Some(v) = vnode {
            let msg = VnodeMsg::Repair {
                key: key.clone(),
                object: best.clone(),
                hops: 0,
            };
            if v.try_send_with(msg, &vnode_opts(t.partition)).is_ok() {
                shared.stats.read_repairs.inc();
            }
        }
    }
}

/// A quorum write of a value, or of a tombstone (`None`); returns whether any replica that
/// acknowledged held a live value before.
pub(crate) async fn put(
    shared: &Arc<Shared>,
    key: Bytes,
    value: Option<Bytes>,
) -> Result<bool, RingError> {
    let s = shared.clone();
    coordinate(shared, move |tx| write(s, key, value, tx)).await
}

/// Attempts of one write. A replica that keeps a newer version than the write's (stamped by a
/// coordinator whose clock runs ahead, or within the same instant of the hybrid clocks) says
/// so, and the write goes again with a later version: a write acknowledged after another one
/// returned wins over it.
const WRITE_ATTEMPTS: usize = 3;

async fn write(shared: Arc<Shared>, key: Bytes, value: Option<Bytes>, tx: Answer<bool>) {
    let cfg = &shared.config;
    let deadline = Instant::now() + cfg.request_timeout;
    let targets = targets(&shared, &key);
    let mut attempt = 0;
    let (mut calls, ok, had_live, first_err) = loop {
        attempt += 1;
        let object = Object {
            value: value.clone(),
            version: shared.clock.tick(),
        };
        let mut calls = FuturesUnordered::new();
        for t in targets.iter().cloned() {
            let s = shared.clone();
            let k = key.clone();
            let o = object.clone();
            calls.push(async move {
                let make = |reply| VnodeMsg::Put {
                    key: k.clone(),
                    object: o.clone(),
                    hops: 0,
                    reply,
                };
                (t.node.clone(), call_vnode(&s, &t, make, deadline).await)
            });
        }
        let (mut ok, mut failed) = (0usize, 0usize);
        let mut had_live = false;
        let mut newest: Option<u64> = None;
        let mut first_err: Option<String> = None;
        while ok < cfg.w && ok + (targets.len() - ok - failed) >= cfg.w {
            let Some((node, res)) = calls.next().await else {
                break;
            };
            match res {
                Ok(VnodeReply::Stored { had_live: h, newer }) => {
                    ok += 1;
                    had_live |= h;
                    newest = newest.max(newer);
                }
                Ok(other) => {
                    failed += 1;
                    first_err.get_or_insert(format!("{node}: {other:?}"));
                }
                Err(e) => {
                    failed += 1;
                    first_err.get_or_insert(e);
                }
            }
        }
        match newest {
            Some(ts) if ok >= cfg.w && attempt < WRITE_ATTEMPTS && Instant::now() < deadline => {
                shared.clock.observe(ts);
                shared.stats.write_retries.inc();
            }
            _ => break (calls, ok, had_live, first_err),
        }
    };
    let res = if ok >= cfg.w {
        shared.stats.writes.inc();
        Ok(had_live)
    } else {
        Err(RingError::Quorum {
            needed: cfg.w,
            got: ok,
            detail: first_err.unwrap_or_else(|| format!("{} targets", targets.len())),
        })
    };
    tx.send(res);
    // Keep delivering to the replicas beyond the quorum (a fallback's vnode may have needed
    // starting, which takes a second round trip), if a background slot is free.
    if !calls.is_empty() {
        if let Ok(_slot) = shared.background.clone().try_acquire_owned() {
            let left = deadline.saturating_duration_since(Instant::now());
            let _ =
                tokio::time::timeout(left, async { while calls.next().await.is_some() {} }).await;
        }
    }
}
