//! Handoff: moving a vnode's data to another node, in bounded chunks, on the `handoff` channel.
//!
//! The sending side drives it, one chunk in flight at a time:
//! 1. ask the receiving node's manager to start the partition's vnode (`EnsureVnode`); a
//!    receiver whose ring is older than ours gets our ring and is asked again;
//! 2. take a chunk (at most `handoff_chunk_entries` entries and `handoff_chunk_bytes` bytes)
//!    from the local vnode, which from then on remembers every key written to it;
//! 3. send it to the remote vnode and wait for its acknowledgement; repeat until the scan ends;
//! 4. ask the local vnode to finish: it returns the keys written meanwhile (sent as more
//!    chunks), and when there are none it drops its data and forwards every later request to
//!    the new node. That switch happens inside the vnode, between two requests, so no write is
//!    lost: a write either came before (and was sent) or is forwarded.
//!
//! Data leaves a node only after the receiver acknowledged it. A failed handoff puts the vnode
//! back to serving, and the manager tries again later.

use std::sync::Arc;
use std::time::Duration;

use maquis::{ActorRef, CallError, SendError, SendOpts};
use tokio::sync::Semaphore;

use crate::manager::{EnsureReply, ManagerMsg, GOSSIP_CHANNEL, MANAGER_NAME};
use crate::node::Shared;
use crate::vnode::{vnode_name, Chunk, Entry, Finish, HandoffAck, VnodeMsg};

/// The channel carrying handoff traffic.
pub const HANDOFF_CHANNEL: &str = "handoff";

/// Attempts for one step (a stale receiver ring, a vnode not yet started) before giving up.
const ATTEMPTS: usize = 20;

/// One handoff: partition `partition` from this node to `to`.
pub(crate) struct HandoffJob {
    pub shared: Arc<Shared>,
    pub partition: u32,
    pub to: String,
    pub vnode: ActorRef<VnodeMsg>,
    pub manager: ActorRef<ManagerMsg>,
    pub slots: Arc<Semaphore>,
}

/// Runs a handoff (after taking one of the node's handoff slots) and reports to the manager.
pub(crate) async fn run(job: HandoffJob) {
    let ok = match job.slots.clone().acquire_owned().await {
        Ok(_permit) => match transfer(&job).await {
            Ok(chunks) => {
                tracing::info!(
                    node = %job.shared.name,
                    partition = job.partition,
                    to = %job.to,
                    chunks,
                    "handoff complete"
                );
                true
            }
            Err(e) => {
                tracing::warn!(
                    node = %job.shared.name,
                    partition = job.partition,
                    to = %job.to,
                    error = %e,
                    "handoff failed; will retry"
                );
                let _ = job.vnode.try_send(VnodeMsg::Resume {
                    only_to: Some(job.to.clone()),
                });
                false
            }
        },
        Err(_) => false,
    };
    let _ = job
        .manager
        .send(ManagerMsg::HandoffFinished {
            partition: job.partition,
            to: job.to.clone(),
            ok,
        })
        .await;
}

pub(crate) fn handoff_opts(p: u32) -> SendOpts {
    SendOpts::on(HANDOFF_CHANNEL).partition(u64::from(p))
}

fn push_ring(job: &HandoffJob) {
    let manager: Option<ActorRef<ManagerMsg>> = job.shared.node.remote(&job.to, MANAGER_NAME);
    if let Some(m) = manager {
        let ring = (*job.shared.ring()).clone();
        let _ = m.try_send_with(
            ManagerMsg::Gossip {
                from: job.shared.name.clone(),
                claims: job.shared.config.claim,
                ring,
            },
            &SendOpts::on(GOSSIP_CHANNEL),
        );
    }
}

async fn pause(job: &HandoffJob) {
    tokio::time::sleep(
        (job.shared.config.gossip_interval / 4)
            .clamp(Duration::from_millis(5), Duration::from_millis(200)),
    )
    .await;
}

/// Makes sure the receiving vnode runs; returns a ref to it.
async fn ensure_remote(job: &HandoffJob) -> Result<ActorRef<VnodeMsg>, String> {
    let timeout = job.shared.config.request_timeout;
    for _ in 0..ATTEMPTS {
        let manager: ActorRef<ManagerMsg> = job
            .shared
            .node
            .remote(&job.to, MANAGER_NAME)
            .ok_or_else(|| format!("{} is not a member", job.to))?;
        let ring_version = job.shared.ring().version;
        let partition = job.partition;
        let answer = manager
            .call_with(
                |reply| ManagerMsg::EnsureVnode {
                    partition,
                    ring_version,
                    reply,
                },
                timeout,
                &handoff_opts(partition),
            )
            .await
            .map_err(|e| format!("ensure vnode: {e}"))?;
        match answer {
            EnsureReply::Ready => {
                return job
                    .shared
                    .node
                    .remote(&job.to, &vnode_name(partition))
                    .ok_or_else(|| format!("{} is not a member", job.to));
            }
            EnsureReply::StaleRing(_) => {
                push_ring(job);
                pause(job).await;
            }
        }
    }
    Err("the receiver's ring stays older than ours".into())
}

async fn send_chunk(
    job: &HandoffJob,
    target: &mut ActorRef<VnodeMsg>,
    entries: Vec<Entry>,
) -> Result<(), String> {
    let timeout = job.shared.config.request_timeout;
    for _ in 0..ATTEMPTS {
        let ring_version = job.shared.ring().version;
        let batch = entries.clone();
        let res = target
            .call_with(
                |reply| VnodeMsg::Handoff {
                    ring_version,
                    entries: batch,
                    reply,
                },
                timeout,
                &handoff_opts(job.partition),
            )
            .await;
        match res {
            Ok(HandoffAck::Stored) => return Ok(()),
            Ok(HandoffAck::StaleRing(_)) => {
                push_ring(job);
                pause(job).await;
            }
            Ok(HandoffAck::Failed(e)) => return Err(format!("{} could not store: {e}", job.to)),
            Ok(HandoffAck::Redirect(other)) => {
                return Err(format!(
                    "{} handed the partition off to {other} already",
                    job.to
                ))
            }
            Err(CallError::NoProc | CallError::Send(SendError::NoProc)) => {
                *target = ensure_remote(job).await?;
            }
            Err(e) => return Err(format!("chunk: {e}")),
        }
    }
    Err("the receiver kept refusing the chunk".into())
}

async fn local<R: maquis::Message>(
    job: &HandoffJob,
    make: impl FnOnce(maquis::ReplyTo<R>) -> VnodeMsg,
) -> Result<R, String> {
    job.vnode
        .call(make, job.shared.config.request_timeout)
        .await
        .map_err(|e| format!("local vnode: {e}"))
}

/// Moves the data; returns the number of chunks sent.
async fn transfer(job: &HandoffJob) -> Result<usize, String> {
    let mut target = ensure_remote(job).await?;
    let mut after = None;
    let mut chunks = 0usize;
    loop {
        let to = job.to.clone();
        let a = after.clone();
        let chunk: Chunk = local(job, |reply| VnodeMsg::TakeChunk {
            to,
            after: a,
            reply,
        })
        .await?;
        if chunk.aborted {
            return Err("the vnode stopped handing off".into());
        }
        let last = chunk.entries.last().map(|(k, _)| k.clone());
        if !chunk.entries.is_empty() {
            send_chunk(job, &mut target, chunk.entries).await?;
            chunks += 1;
        }
        if !chunk.more {
            break;
        }
        after = last;
    }
    loop {
        let to = job.to.clone();
        let finish: Finish = local(job, |reply| VnodeMsg::FinishHandoff { to, reply }).await?;
        match finish {
            Finish::More(entries) => {
                send_chunk(job, &mut target, entries).await?;
                chunks += 1;
            }
            Finish::Done => return Ok(chunks),
            Finish::Aborted => return Err("the vnode stopped handing off".into()),
        }
    }
}
