//! The client side: psaDB's "single, local actor that forwards all requests transparently to
//! the corresponding groups", here a handle any task on a node may clone and use.
//!
//! A key belongs to group `group_of(key) mod groups`; each request is published to that group
//! with [`maquis::Node::publish_call`] and the first answer taken. A request with no answer
//! within `attempt_timeout` (the member that answers it died, or a copy was lost) is published
//! again with the same id and version, up to `attempts` times: requests are idempotent. When
//! the groups' membership changes while a request waits, it is published again at once (a
//! few times at most): the member that answers for its key may have changed.
//!
//! Reads take a shorter way first: the client keeps each group's ready members (read again
//! whenever [`maquis::Node::group_changes`] moves), picks the key's responsible member as the
//! members do, and sends the read to it alone. A member that does not see itself as
//! responsible answers so, and a read without an answer is published as above: the shortcut
//! saves the copies to the other members, never changes who answers.
//!
//! Writes carry a version from a hybrid clock: the larger of the client's last version plus
//! one and the wall clock in microseconds, so a write made after another completed wins as
//! long as the clients' clocks differ by less than the time between them (the clients of one
//! machine share a clock).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use maquis::groups::GroupError;
use maquis::{ActorRef, Node};

use crate::member::{group_name, id_of, ready_name, MemberMsg};
use crate::replica::{Answer, Op, Read, ReqId, Request};
use crate::store::{Version, Write};

/// Which of `groups` groups holds `key` (independent of the member a group picks for it).
pub fn group_of(key: &[u8], groups: u32) -> u32 {
    let h = crate::replica::hash(key) >> 32;
    (h % u64::from(groups.max(1))) as u32
}

/// How many times one request is published again early because the membership changed.
const EARLY_REPUBLISH: u32 = 3;

/// A client's settings.
#[derive(Clone, Debug)]
pub struct ClientSettings {
    /// Groups the keys are split among (the same for every client and member).
    pub groups: u32,
    /// How long one attempt waits for an answer.
    pub attempt_timeout: Duration,
    /// Attempts at most.
    pub attempts: u32,
}

impl Default for ClientSettings {
    fn default() -> Self {
        ClientSettings {
            groups: 3,
            attempt_timeout: Duration::from_millis(500),
            attempts: 10,
        }
    }
}

/// Why a request failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PsadbError {
    /// No member answered any attempt.
    #[error("no member of {group} answered in {attempts} attempts")]
    Unavailable {
        /// The group.
        group: String,
        /// Attempts made.
        attempts: u32,
    },
    /// The key holds a value of the other kind.
    #[error("WRONGTYPE Operation against a key holding the wrong kind of value")]
    WrongType,
    /// The group's members hold as many keys as they may.
    #[error("the store is full")]
    Full,
    /// The coordinating member waits for as many writes as it may.
    #[error("the member is busy")]
    Busy,
    /// Not every member confirmed the write in time: it is not acknowledged.
    #[error("the write was not acknowledged by every member")]
    NotReplicated,
    /// The group service failed.
    #[error(transparent)]
    Group(#[from] GroupError),
    /// An answer of another kind than the request asks.
    #[error("unexpected answer {0:?}")]
    Unexpected(String),
}

/// A handle to the store (cheap to clone).
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    node: Node,
    settings: ClientSettings,
    id: u64,
    clock: AtomicU64,
    seq: AtomicU64,
    /// The groups' membership version (moves on every change).
    changes: tokio::sync::watch::Receiver<u64>,
    routes: Mutex<Routes>,
}

/// Each group's ready members in the members' order, as of membership version `seen` (at
/// most one entry a group: bounded by `groups`).
#[derive(Default)]
struct Routes {
    seen: u64,
    ready: HashMap<u32, Vec<ActorRef<MemberMsg>>>,
}

impl Client {
    /// A client on `node`.
    pub fn new(node: &Node, settings: ClientSettings) -> Client {
        Client {
            inner: Arc::new(Inner {
                node: node.clone(),
                settings,
                id: rand::random(),
                clock: AtomicU64::new(0),
                seq: AtomicU64::new(0),
                changes: node.group_changes(),
                routes: Mutex::new(Routes::default()),
            }),
        }
    }

    fn version(&self) -> Version {
        let wall = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        let mut cur = self.inner.clock.load(Ordering::Relaxed);
        loop {
            let next = wall.max(cur + 1);
            match self.inner.clock.compare_exchange_weak(
                cur,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    return Version {
                        clock: next,
                        writer: self.inner.id,
                    }
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Sends `op` on `key` to its group; the answer.
    pub async fn request(&self, key: &Bytes, op: Op) -> Result<Answer, PsadbError> {
        self.request_group(group_of(key, self.inner.settings.groups), key, op)
            .await
    }

    /// Group `g`'s member responsible for `key` in this client's view, if any is ready.
    async fn responsible(&self, g: u32, key: &[u8]) -> Option<ActorRef<MemberMsg>> {
        let version = *self.inner.changes.borrow();
        let pick = |ready: &[ActorRef<MemberMsg>]| {
            ready
                .get(crate::replica::share_of(key, ready.len()))
                .cloned()
        };
        {
            let mut routes = self.inner.routes.lock().unwrap_or_else(|e| e.into_inner());
            if routes.seen != version {
                routes.ready.clear();
                routes.seen = version;
            }
            if let Some(ready) = routes.ready.get(&g) {
                return pick(ready);
            }
        }
        let mut ready = self
            .inner
            .node
            .group_members::<MemberMsg>(&ready_name(g))
            .await
            .ok()?;
        ready.sort_by_key(id_of);
        let chosen = pick(&ready);
        let mut routes = self.inner.routes.lock().unwrap_or_else(|e| e.into_inner());
        if routes.seen == version {
            routes.ready.insert(g, ready);
        }
        chosen
    }

    /// Sends `op` on `key` to group `g`; the answer.
    async fn request_group(&self, g: u32, key: &Bytes, op: Op) -> Result<Answer, PsadbError> {
        let s = &self.inner.settings;
        let group = group_name(g);
        let id = ReqId {
            client: self.inner.id,
            seq: self.inner.seq.fetch_add(1, Ordering::Relaxed),
        };
        if let Op::Read(_) = op {
            if let Some(member) = self.responsible(g, key).await {
                let req = Request {
                    id,
                    key: key.clone(),
                    op: op.clone(),
                };
                match member
                    .call(|reply| MemberMsg::Direct(req, reply), s.attempt_timeout)
                    .await
                {
                    Ok(Answer::NotResponsible) | Err(_) => {}
                    Ok(answer) => return check(answer),
                }
            }
        }
        // A change of membership (a member died, one became ready) moves who answers: a
        // request waiting then is published again at once instead of at its attempt's end,
        // a few times at most (requests are idempotent).
        let mut changes = self.inner.changes.clone();
        changes.borrow_and_update();
        let mut early = 0;
        for _ in 0..s.attempts {
            let req = Request {
                id,
                key: key.clone(),
                op: op.clone(),
            };
            let call = self.inner.node.publish_call(
                &group,
                |reply| MemberMsg::Request(req, reply),
                s.attempt_timeout,
            );
            let got = if early < EARLY_REPUBLISH {
                tokio::select! {
                    got = call => got,
                    Ok(()) = changes.changed() => {
                        early += 1;
                        continue;
                    }
                }
            } else {
                call.await
            };
            match got {
                Ok(answer) => return check(answer),
                Err(GroupError::Timeout) => continue,
                Err(GroupError::NoMembers(_)) => {
                    // The group is being formed or re-formed: until its membership moves,
                    // or an attempt's time.
                    let _ = tokio::time::timeout(s.attempt_timeout, changes.changed()).await;
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(PsadbError::Unavailable {
            group,
            attempts: s.attempts,
        })
    }

    /// Sends a write; what it removed (see [`Answer::Written`]).
    async fn write(&self, key: &Bytes, w: Write) -> Result<u64, PsadbError> {
        let v = self.version();
        match self.request(key, Op::Write(w, v)).await? {
            Answer::Written(removed) => Ok(removed),
            other => Err(PsadbError::Unexpected(format!("{other:?}"))),
        }
    }

    /// `GET`.
    pub async fn get(&self, key: &Bytes) -> Result<Option<Bytes>, PsadbError> {
        match self.request(key, Op::Read(Read::Get)).await? {
            Answer::Value(v) => Ok(v),
            other => Err(PsadbError::Unexpected(format!("{other:?}"))),
        }
    }

    /// `EXISTS` of one key.
    pub async fn exists(&self, key: &Bytes) -> Result<bool, PsadbError> {
        match self.request(key, Op::Read(Read::Exists)).await? {
            Answer::Exists(e) => Ok(e),
            other => Err(PsadbError::Unexpected(format!("{other:?}"))),
        }
    }

    /// `HGETALL`.
    pub async fn hgetall(&self, key: &Bytes) -> Result<Vec<(Bytes, Bytes)>, PsadbError> {
        match self.request(key, Op::Read(Read::HGetAll)).await? {
            Answer::Hash(h) => Ok(h),
            other => Err(PsadbError::Unexpected(format!("{other:?}"))),
        }
    }

    /// `HMGET`.
    pub async fn hmget(
        &self,
        key: &Bytes,
        fields: Vec<Bytes>,
    ) -> Result<Vec<Option<Bytes>>, PsadbError> {
        match self.request(key, Op::Read(Read::HMGet(fields))).await? {
            Answer::Fields(f) => Ok(f),
            other => Err(PsadbError::Unexpected(format!("{other:?}"))),
        }
    }

    /// The keys showing a value from `start` on, in byte order, at most `count`: every group
    /// is asked (concurrently) for its first `count` keys and the answers merged, as psaDB
    /// scans without a coordinator.
    pub async fn keys_from(&self, start: &Bytes, count: u32) -> Result<Vec<Bytes>, PsadbError> {
        let groups = self.inner.settings.groups;
        let asks =
            (0..groups).map(|g| self.request_group(g, start, Op::Read(Read::KeysFrom(count))));
        let mut keys = Vec::new();
        for answer in futures::future::join_all(asks).await {
            match answer? {
                Answer::Keys(k) => keys.extend(k),
                other => return Err(PsadbError::Unexpected(format!("{other:?}"))),
            }
        }
        keys.sort_unstable();
        keys.truncate(count as usize);
        Ok(keys)
    }

    /// `SET` (acknowledged once every member of the key's group has it).
    pub async fn set(&self, key: &Bytes, value: Bytes) -> Result<(), PsadbError> {
        self.write(key, Write::Set(value)).await.map(drop)
    }

    /// `DEL` of one key: whether it showed a value just before (in the copy of the member
    /// that coordinates the write; one request).
    pub async fn del(&self, key: &Bytes) -> Result<bool, PsadbError> {
        self.write(key, Write::Del).await.map(|n| n > 0)
    }

    /// `HSET` / `HMSET`.
    pub async fn hset(&self, key: &Bytes, fields: Vec<(Bytes, Bytes)>) -> Result<(), PsadbError> {
        self.write(key, Write::HSet(fields)).await.map(drop)
    }

    /// `HDEL`: how many of the fields the key held just before (in the copy of the member
    /// that coordinates the write; one request).
    pub async fn hdel(&self, key: &Bytes, fields: Vec<Bytes>) -> Result<u64, PsadbError> {
        self.write(key, Write::HDel(fields)).await
    }
}

/// The answers that are errors, as errors.
fn check(a: Answer) -> Result<Answer, PsadbError> {
    match a {
        Answer::WrongType => Err(PsadbError::WrongType),
        Answer::Full => Err(PsadbError::Full),
        Answer::Busy => Err(PsadbError::Busy),
        Answer::NotReplicated => Err(PsadbError::NotReplicated),
        a => Ok(a),
    }
}
