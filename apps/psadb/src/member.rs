//! A group member on a node: the actor that drives a [`Replica`] with Maquis's process groups.
//!
//! A member joins its group `psadb/<g>` at once (from then on it gets the group's requests and
//! applies the writes), waits `settle` (long enough for every node to see it, and for every
//! write published before that to be settled) and until its node has had every other node's
//! groups (`GroupStats::synced`: its view of the ready members is whole), merges a snapshot
//! from every ready member, and
//! only then joins `psadb/<g>/ready`: the members that answer for their share of the keys. So
//! a member that joins late never answers a read before it holds every acknowledged write.
//! The membership is read from the node's replica of the groups whenever
//! [`maquis::Node::group_changes`] says it may have changed.

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use maquis::{ActorRef, Inbox, Node, ReplyTo};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::replica::{Answer, Limits, Out, Replica, ReqId, Request};
use crate::store::Snapshot;

/// A member's identity: its node and its actor.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct MemberId {
    /// The node's name.
    pub node: String,
    /// The actor's id on it.
    pub actor: u64,
}

/// What a member is sent.
#[derive(Debug, Serialize, Deserialize)]
pub enum MemberMsg {
    /// A client's request, published to the group.
    Request(Request, ReplyTo<Answer>),
    /// A client's read, sent to this member alone as the key's responsible member in the
    /// client's view.
    Direct(Request, ReplyTo<Answer>),
    /// A member applied a write this one waits for.
    Confirm(MemberId, ReqId),
    /// A member waits for this one's confirmation of a write.
    Resend(MemberId, Request),
    /// A joining member asks for a page of what this one holds: the keys after the given one
    /// (from the first without it), about [`SNAPSHOT_PAGE_BYTES`] of them.
    Snapshot(Option<Bytes>, ReplyTo<Snapshot>),
}

/// About the bytes of one page of a snapshot: well inside a frame (32 MiB by default), so a
/// member of any size can be copied.
pub const SNAPSHOT_PAGE_BYTES: usize = 4 * 1024 * 1024;

/// The group of every member of group `g`.
pub fn group_name(g: u32) -> String {
    format!("psadb/{g}")
}

/// The group of the members of `g` that answer for their share of the keys.
pub fn ready_name(g: u32) -> String {
    format!("psadb/{g}/ready")
}

/// A member's settings.
#[derive(Clone, Debug)]
pub struct MemberSettings {
    /// The replica's limits and timings.
    pub limits: Limits,
    /// How often the member resends and gives up what is due.
    pub tick: Duration,
    /// How long a joining member waits before it takes its snapshot and answers.
    pub settle: Duration,
    /// How long a joining member waits for each page of a ready member's snapshot.
    pub snapshot_timeout: Duration,
}

impl Default for MemberSettings {
    fn default() -> Self {
        MemberSettings {
            limits: Limits::default(),
            tick: Duration::from_millis(20),
            settle: Duration::from_secs(3),
            snapshot_timeout: Duration::from_secs(10),
        }
    }
}

/// Why a member did not start.
#[derive(Debug, thiserror::Error)]
pub enum MemberError {
    /// The group service refused the join.
    #[error("cannot join group {0}: {1}")]
    Join(String, maquis::groups::GroupError),
}

/// Starts a member of group `g` on `node`; it joins the group at once and answers once it
/// has settled (see the module's documentation).
pub async fn start_member(
    node: &Node,
    g: u32,
    settings: MemberSettings,
) -> Result<ActorRef<MemberMsg>, MemberError> {
    let me_node = node.clone();
    let s = settings.clone();
    let member = node.spawn_fn(move |inbox: Inbox<MemberMsg>| run(me_node, g, s, inbox));
    node.join_group(&group_name(g), &member)
        .await
        .map_err(|e| MemberError::Join(group_name(g), e))?;
    Ok(member)
}

/// The identity of a member's actor (what the replicas order the ready members by).
pub(crate) fn id_of(r: &ActorRef<MemberMsg>) -> MemberId {
    MemberId {
        node: r.node().name.to_string(),
        actor: r.id().unwrap_or_default(),
    }
}

struct Driver {
    node: Node,
    g: u32,
    myself: ActorRef<MemberMsg>,
    me: MemberId,
    replica: Replica<MemberId>,
    refs: HashMap<MemberId, ActorRef<MemberMsg>>,
    /// Where the answer to each write waiting for confirmations goes.
    replies: HashMap<ReqId, ReplyTo<Answer>>,
}

async fn run(node: Node, g: u32, s: MemberSettings, mut inbox: Inbox<MemberMsg>) {
    let myself = inbox.myself();
    let me = id_of(&myself);
    let mut d = Driver {
        node,
        g,
        replica: Replica::new(me.clone(), s.limits.clone()),
        myself,
        me,
        refs: HashMap::new(),
        replies: HashMap::new(),
    };
    let settled_at = Instant::now() + s.settle;
    let mut ready = false;
    let mut changes = d.node.group_changes();
    d.refresh().await;
    let mut tick = tokio::time::interval(s.tick);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            msg = inbox.recv() => {
                let Some(msg) = msg else { return };
                d.handle(msg).await;
            }
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
                d.refresh().await;
                d.flush().await;
            }
            _ = tick.tick() => {
                if !ready && Instant::now() >= settled_at && d.synced().await {
                    d.catch_up(s.snapshot_timeout).await;
                    ready = d.node.join_group(&ready_name(g), &d.myself).await.is_ok();
                    d.refresh().await;
                }
                d.replica.handle_timeout(std::time::Instant::now());
                d.flush().await;
            }
        }
    }
}

impl Driver {
    async fn handle(&mut self, msg: MemberMsg) {
        match msg {
            MemberMsg::Request(req, reply) => {
                let id = req.id;
                // The members on the client's node: one of them coordinates a write, so its
                // answer does not cross to another node.
                let client = &reply.caller_node().name;
                let near = |m: &MemberId| m.node.as_str() == &**client;
                self.replica
                    .handle_request(req, near, std::time::Instant::now());
                self.replies.insert(id, reply);
                self.flush().await;
                if !self.replica.is_pending(id) {
                    // Answered, or not this member's to answer: a copy dropped unanswered
                    // fails nothing (`Node::publish_call`).
                    self.replies.remove(&id);
                }
                return;
            }
            MemberMsg::Direct(req, reply) => {
                self.replies.insert(req.id, reply);
                self.replica.handle_direct(req);
            }
            MemberMsg::Confirm(from, id) => {
                self.replica
                    .handle_confirm(from, id, std::time::Instant::now())
            }
            MemberMsg::Resend(from, req) => self.replica.handle_resend(from, req),
            MemberMsg::Snapshot(after, reply) => {
                let page = self
                    .replica
                    .store()
                    .snapshot_page(after.as_deref(), SNAPSHOT_PAGE_BYTES);
                let _ = reply.send(page).await;
            }
        }
        self.flush().await;
    }

    /// Sends what the replica says: answers, confirmations, resends (best effort: a resend
    /// repairs a lost confirmation or write).
    async fn flush(&mut self) {
        let out: Vec<Out<MemberId>> = self.replica.drain_out().collect();
        for o in out {
            match o {
                Out::Reply { id, answer } => {
                    if let Some(r) = self.replies.remove(&id) {
                        let _ = r.send(answer).await;
                    }
                }
                Out::Confirm { to, id } => {
                    if let Some(r) = self.refs.get(&to) {
                        let _ = r.try_send(MemberMsg::Confirm(self.me.clone(), id));
                    }
                }
                Out::Resend { to, req } => {
                    if let Some(r) = self.refs.get(&to) {
                        let _ = r.try_send(MemberMsg::Resend(self.me.clone(), req));
                    }
                }
            }
        }
    }

    /// Reads the group's membership from the node's replica of the groups.
    async fn refresh(&mut self) {
        let Ok(all) = self
            .node
            .group_members::<MemberMsg>(&group_name(self.g))
            .await
        else {
            return;
        };
        let ready = self
            .node
            .group_members::<MemberMsg>(&ready_name(self.g))
            .await
            .unwrap_or_default();
        self.refs = all.iter().map(|r| (id_of(r), r.clone())).collect();
        let members = all.iter().map(id_of).collect();
        let ready = ready.iter().map(id_of).collect();
        self.replica.set_members(members, ready);
    }

    /// Whether the node has had every other node's groups: until then its view of the ready
    /// members may miss some, and a snapshot taken from that view would miss their keys.
    async fn synced(&self) -> bool {
        self.node.group_stats().await.is_ok_and(|s| s.synced)
    }

    /// Merges every ready member's snapshot.
    async fn catch_up(&mut self, timeout: Duration) {
        let ready = self
            .node
            .group_members::<MemberMsg>(&ready_name(self.g))
            .await
            .unwrap_or_default();
        for r in ready {
            if id_of(&r) == self.me {
                continue;
            }
            let mut after: Option<Bytes> = None;
            loop {
                let ask = after.clone();
                match r
                    .call(|reply| MemberMsg::Snapshot(ask, reply), timeout)
                    .await
                {
                    Ok(page) => {
                        let left_out = self.replica.merge(&page);
                        if left_out > 0 {
                            tracing::warn!(
                                left_out,
                                "a snapshot's keys left out: the store is full"
                            );
                        }
                        match page.next_after() {
                            Some(k) => after = Some(k.clone()),
                            None => break,
                        }
                    }
                    Err(e) => {
                        tracing::warn!(from = %r.node(), error = %e, "no snapshot");
                        break;
                    }
                }
            }
        }
    }
}
