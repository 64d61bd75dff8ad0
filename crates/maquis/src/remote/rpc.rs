//! The RPC service: functions by name, and the actor that runs each call as a task of its own.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use futures::future::BoxFuture;
use futures::FutureExt;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use super::Refusal;
use crate::actor::{fingerprint, Message, ReplyTo};
use crate::node::{Inbox, Node};

/// The local name of every node's RPC service.
pub(crate) const RPC_SERVICE: &str = "$maquis/rpc";

/// Runs a function on encoded arguments; answers its encoded result.
type Erased = dyn Fn(Node, Bytes) -> BoxFuture<'static, Result<Bytes, Refusal>> + Send + Sync;

/// A function other nodes may call here.
pub(crate) struct Function {
    /// Fingerprints of the argument and result types.
    pub(crate) args: u64,
    pub(crate) ret: u64,
    /// Their Rust names (for the error of a call with other types).
    pub(crate) types: String,
    run: Box<Erased>,
}

impl Function {
    pub(crate) fn new<A, R, F, Fut>(f: F) -> Function
    where
        A: DeserializeOwned + Send + 'static,
        R: Message,
        F: Fn(A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
    {
        let f = Arc::new(f);
        Function {
            args: fingerprint::<A>(),
            ret: fingerprint::<R>(),
            types: format!(
                "arguments {}, result {}",
                super::short_type_name::<A>(),
                super::short_type_name::<R>()
            ),
            run: Box::new(move |node, bytes| {
                let f = f.clone();
                async move {
                    let args: A = node
                        .decode(&bytes)
                        .map_err(|e| Refusal::BadArgs(e.to_string()))?;
                    let out = std::panic::AssertUnwindSafe(f(args))
                        .catch_unwind()
                        .await
                        .map_err(|p| Refusal::Failed(crate::node::panic_message(p.as_ref())))?;
                    crate::encode(&out)
                        .map(Bytes::from)
                        .map_err(|e| Refusal::Failed(format!("result does not encode: {e}")))
                }
                .boxed()
            }),
        }
    }
}

/// A call of function `name`.
#[derive(Serialize, Deserialize)]
pub(crate) struct RpcReq {
    pub(crate) name: String,
    pub(crate) args: Bytes,
    /// Fingerprints the caller expects of the arguments and result.
    pub(crate) ty_args: u64,
    pub(crate) ty_ret: u64,
    pub(crate) reply: ReplyTo<Result<Bytes, Refusal>>,
}

/// Starts the service on `node`: it checks each call and starts a task for it (at most
/// `services.max_rpc_tasks` at once); it never waits for a function.
pub(crate) fn spawn_service(node: &Node) {
    let me = node.clone();
    let service = node.spawn_fn(move |mut inbox: Inbox<RpcReq>| async move {
        while let Some(req) = inbox.recv().await {
            dispatch(&me, req);
        }
    });
    node.register_system(RPC_SERVICE, &service);
}

fn dispatch(node: &Node, req: RpcReq) {
    let refuse = |reply: ReplyTo<Result<Bytes, Refusal>>, why: Refusal| {
        tokio::spawn(async move {
            let _ = reply.send(Err(why)).await;
        });
    };
    let Some(f) = node.function(&req.name) else {
        return refuse(req.reply, Refusal::Unknown);
    };
    if !crate::actor::compatible(req.ty_args, f.args)
        || !crate::actor::compatible(req.ty_ret, f.ret)
    {
        return refuse(req.reply, Refusal::TypeMismatch(f.types.clone()));
    }
    let Ok(permit) = node.rpc_permits().try_acquire_owned() else {
        return refuse(req.reply, Refusal::Busy);
    };
    let run = (f.run)(node.clone(), req.args);
    let reply = req.reply;
    tokio::spawn(async move {
        let out = run.await;
        drop(permit);
        if let Err(e) = reply.send(out).await {
            tracing::debug!(error = %e, "rpc answer not sent");
        }
    });
}
