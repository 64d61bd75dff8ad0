//! The context the runtime sets up around an actor's task and around a decode: which actor
//! is running (for lane affinity), and which node's actors the refs decoded right now bind to.

use std::cell::RefCell;
use std::sync::Weak;

use super::actors::Actors;
use super::ActorId;

tokio::task_local! {
    static CURRENT_ACTOR: ActorId;
}

thread_local! {
    static DECODE_NODE: RefCell<Option<Weak<Actors>>> = const { RefCell::new(None) };
}

/// The id of the actor running the current task; outside an actor, a per-task value so that
/// affinity still separates independent tasks.
pub(crate) fn current_actor() -> u64 {
    CURRENT_ACTOR
        .try_with(|id| *id)
        .unwrap_or_else(|_| match tokio::task::try_id() {
            Some(id) => crate::dispatch::hash_of(&id) | (1 << 63),
            None => 0,
        })
}

/// Runs `f` as actor `id` (a step of its task).
pub(crate) fn in_actor<R>(id: ActorId, f: impl FnOnce() -> R) -> R {
    CURRENT_ACTOR.sync_scope(id, f)
}

/// Decodes `bytes` so that refs inside bind to `node`.
pub(crate) fn decode_in<T: serde::de::DeserializeOwned>(
    node: &Weak<Actors>,
    bytes: &[u8],
) -> Result<T, postcard::Error> {
    let prev = DECODE_NODE.with(|c| c.replace(Some(node.clone())));
    let out = postcard::from_bytes(bytes);
    DECODE_NODE.with(|c| *c.borrow_mut() = prev);
    out
}

/// Decodes a received frame's payload so that refs inside bind to `node` and
/// [`crate::Payload`] fields borrow from the frame instead of copying.
pub(crate) fn decode_frame_in<T: serde::de::DeserializeOwned>(
    node: &Weak<Actors>,
    frame: &bytes::Bytes,
) -> Result<T, postcard::Error> {
    crate::payload::with_source(frame, || decode_in(node, frame))
}

/// The node that refs decoded right now bind to.
pub(crate) fn decode_node() -> Weak<Actors> {
    DECODE_NODE.with(|c| c.borrow().clone()).unwrap_or_default()
}

thread_local! {
    static ADOPTING: RefCell<Option<Vec<Adopted>>> = const { RefCell::new(None) };
}

/// An actor spawned while a supervisor started a child, with the watch that tells when it
/// ends (set before its task could run, so not even an instant end is missed).
pub(crate) struct Adopted {
    pub(crate) id: ActorId,
    pub(crate) watch: u64,
    pub(crate) down: tokio::sync::oneshot::Receiver<crate::wire::frame::DownReason>,
}

/// Runs `start` and returns, with its result, every actor spawned on this thread meanwhile
/// (`start` is synchronous, so they are the ones it spawned).
pub(crate) fn adopting<R>(start: impl FnOnce() -> R) -> (R, Vec<Adopted>) {
    let prev = ADOPTING.with(|c| c.replace(Some(Vec::new())));
    let out = start();
    let adopted = ADOPTING.with(|c| std::mem::replace(&mut *c.borrow_mut(), prev));
    (out, adopted.unwrap_or_default())
}

/// Called for each new actor before its task is spawned: under [`adopting`], watches it.
pub(crate) fn note_spawn(actors: &Actors, id: ActorId) {
    ADOPTING.with(|c| {
        if let Some(list) = c.borrow_mut().as_mut() {
            let (tx, down) = tokio::sync::oneshot::channel();
            let watch = actors.monitors.next_id();
            let w = super::registry::Watcher::Local { watch, tx };
            if actors.registry.watch(id, w).is_ok() {
                list.push(Adopted { id, watch, down });
            }
        }
    });
}
