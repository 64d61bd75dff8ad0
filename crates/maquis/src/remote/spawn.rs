//! The spawn service: actor kinds by name, and the actor that starts them for other nodes.

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::Refusal;
use crate::actor::{fingerprint, ActorRef, Message, ReplyTo};
use crate::node::{Inbox, Node};

/// The local name of every node's spawn service.
pub(crate) const SPAWN_SERVICE: &str = "$maquis/spawn";

/// Starts an actor of a kind from encoded arguments; answers its id.
type Factory = dyn Fn(&Node, &[u8]) -> Result<ActorRef<()>, Refusal> + Send + Sync;

/// A kind of actor other nodes may spawn here.
pub(crate) struct Kind {
    /// Fingerprints of the argument type and of the actors' message type.
    pub(crate) args: u64,
    pub(crate) msg: u64,
    /// Their Rust names (for the error of a spawn with other types).
    pub(crate) types: String,
    make: Box<Factory>,
}

impl Kind {
    pub(crate) fn new<A, M, F>(factory: F) -> Kind
    where
        A: DeserializeOwned + Send + 'static,
        M: Message,
        F: Fn(&Node, A) -> ActorRef<M> + Send + Sync + 'static,
    {
        Kind {
            args: fingerprint::<A>(),
            msg: fingerprint::<M>(),
            types: format!(
                "arguments {}, messages {}",
                super::short_type_name::<A>(),
                super::short_type_name::<M>()
            ),
            make: Box::new(move |node, bytes| {
                let args: A = node
                    .decode(bytes)
                    .map_err(|e| Refusal::BadArgs(e.to_string()))?;
                Ok(factory(node, args).erase())
            }),
        }
    }
}

/// A request to spawn an actor of `kind`.
#[derive(Serialize, Deserialize)]
pub(crate) struct SpawnReq {
    pub(crate) kind: String,
    pub(crate) args: Bytes,
    /// Fingerprints the caller expects of the arguments and messages.
    pub(crate) ty_args: u64,
    pub(crate) ty_msg: u64,
    /// An actor to link the child with before answering.
    pub(crate) link: Option<ActorRef<()>>,
    pub(crate) reply: ReplyTo<Result<ActorRef<()>, Refusal>>,
}

/// Starts the service on `node`.
pub(crate) fn spawn_service(node: &Node) {
    let me = node.clone();
    let service = node.spawn_fn(move |mut inbox: Inbox<SpawnReq>| async move {
        while let Some(req) = inbox.recv().await {
            let answer = start(&me, &req);
            if let Err(e) = req.reply.send(answer).await {
                tracing::debug!(error = %e, "spawn answer not sent");
            }
        }
    });
    node.register_system(SPAWN_SERVICE, &service);
}

fn start(node: &Node, req: &SpawnReq) -> Result<ActorRef<()>, Refusal> {
    let kind = node.kind(&req.kind).ok_or(Refusal::Unknown)?;
    if !crate::actor::compatible(req.ty_args, kind.args)
        || !crate::actor::compatible(req.ty_msg, kind.msg)
    {
        return Err(Refusal::TypeMismatch(kind.types.clone()));
    }
    let child = (kind.make)(node, &req.args)?;
    if let Some(parent) = &req.link {
        if node.link(&child, parent).is_err() {
            // The child already stopped (or the parent's node is gone): no link can tell.
            let _ = node.stop_actor(&child);
            return Err(Refusal::Exited);
        }
    }
    Ok(child)
}
