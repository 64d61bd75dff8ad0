//! `Node`'s remote spawn and RPC (see [`crate::remote`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;

use super::Node;
use crate::actor::{fingerprint, ActorRef, Message, Monitor, ReplyTo};
use crate::remote::{
    CallFailure, Function, Kind, Refusal, RpcError, RpcReq, SpawnError, SpawnReq, RPC_SERVICE,
    SPAWN_SERVICE,
};

impl Node {
    /// Offers a kind of actor that other nodes can start here with [`Node::spawn_remote`]:
    /// `factory` gets this node and the decoded arguments and spawns the actor. Registering a
    /// kind again replaces it.
    pub fn register_kind<A, M, F>(&self, kind: &str, factory: F)
    where
        A: DeserializeOwned + Send + 'static,
        M: Message,
        F: Fn(&Node, A) -> ActorRef<M> + Send + Sync + 'static,
    {
        self.inner
            .remote
            .kinds
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(kind.to_string(), Arc::new(Kind::new(factory)));
    }

    /// Offers a function that other nodes can call here with [`Node::rpc`]. Each call runs as
    /// a task of its own. Registering a name again replaces the function.
    pub fn register_fn<A, R, F, Fut>(&self, name: &str, f: F)
    where
        A: DeserializeOwned + Send + 'static,
        R: Message,
        F: Fn(A) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = R> + Send + 'static,
    {
        self.inner
            .remote
            .functions
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(name.to_string(), Arc::new(Function::new(f)));
    }

    /// Starts an actor of `kind` on member `on` (this node included) with `args`, and returns
    /// its ref. Errors: [`SpawnError::NodeDown`], `UnknownKind`, `TypeMismatch` (the kind takes
    /// other arguments or messages), `BadArgs`, `Timeout`, `Failed`.
    pub async fn spawn_remote<A: Message, M: Message>(
        &self,
        on: &str,
        kind: &str,
        args: &A,
        timeout: Duration,
    ) -> Result<ActorRef<M>, SpawnError> {
        self.spawn_request(on, kind, args, None, timeout).await
    }

    /// [`Node::spawn_remote`], the child linked with `parent` (an actor of this node) before
    /// the answer leaves the child's node: if either stops abnormally, the other is stopped
    /// (see [`Node::link`]). A child that stopped before it could be linked is
    /// [`SpawnError::Exited`].
    pub async fn spawn_remote_link<A: Message, M: Message, P: Message>(
        &self,
        parent: &ActorRef<P>,
        on: &str,
        kind: &str,
        args: &A,
        timeout: Duration,
    ) -> Result<ActorRef<M>, SpawnError> {
        let parent = parent.clone().erase();
        self.spawn_request(on, kind, args, Some(parent), timeout)
            .await
    }

    /// [`Node::spawn_remote`] and a monitor of the child: the spawner learns when it stops
    /// (with `NoProc` if it stopped before the monitor was set up).
    pub async fn spawn_remote_monitor<A: Message, M: Message>(
        &self,
        on: &str,
        kind: &str,
        args: &A,
        timeout: Duration,
    ) -> Result<(ActorRef<M>, Monitor), SpawnError> {
        let child: ActorRef<M> = self.spawn_request(on, kind, args, None, timeout).await?;
        let monitor = self.monitor(&child);
        Ok((child, monitor))
    }

    async fn spawn_request<A: Message, M: Message>(
        &self,
        on: &str,
        kind: &str,
        args: &A,
        link: Option<ActorRef<()>>,
        timeout: Duration,
    ) -> Result<ActorRef<M>, SpawnError> {
        let args = crate::encode(args)
            .map(Bytes::from)
            .map_err(|e| SpawnError::BadArgs(e.to_string()))?;
        let make = |reply| SpawnReq {
            kind: kind.to_string(),
            args,
            ty_args: fingerprint::<A>(),
            ty_msg: fingerprint::<M>(),
            link,
            reply,
        };
        let answer = self
            .call_service(on, SPAWN_SERVICE, make, timeout)
            .await
            .map_err(|e| match e {
                CallFailure::NodeDown => SpawnError::NodeDown(on.to_string()),
                CallFailure::Timeout => SpawnError::Timeout,
                CallFailure::Other(e) => SpawnError::Failed(e),
            })?;
        match answer {
            Ok(child) => Ok(ActorRef::new(
                child.node,
                child.to,
                Arc::downgrade(&self.inner.actors),
            )),
            Err(Refusal::Unknown) => Err(SpawnError::UnknownKind(kind.to_string())),
            Err(Refusal::TypeMismatch(registered)) => Err(SpawnError::TypeMismatch {
                kind: kind.to_string(),
                registered,
            }),
            Err(Refusal::BadArgs(e)) => Err(SpawnError::BadArgs(e)),
            Err(Refusal::Exited) => Err(SpawnError::Exited),
            Err(Refusal::Busy) => Err(SpawnError::Failed("busy".into())),
            Err(Refusal::Failed(e)) => Err(SpawnError::Failed(e)),
        }
    }

    /// Calls function `name` on member `on` (this node included) with `args` and waits at most
    /// `timeout` for its result. Errors: [`RpcError::NodeDown`], `UnknownFunction`,
    /// `TypeMismatch`, `BadArgs`, `Busy`, `Failed` (it panicked), `Timeout`, `Transport`.
    pub async fn rpc<A, R>(
        &self,
        on: &str,
        name: &str,
        args: &A,
        timeout: Duration,
    ) -> Result<R, RpcError>
    where
        A: Message,
        R: Message,
    {
        let args = crate::encode(args)
            .map(Bytes::from)
            .map_err(|e| RpcError::BadArgs(e.to_string()))?;
        let make = |reply| RpcReq {
            name: name.to_string(),
            args,
            ty_args: fingerprint::<A>(),
            ty_ret: fingerprint::<R>(),
            reply,
        };
        let answer = self
            .call_service(on, RPC_SERVICE, make, timeout)
            .await
            .map_err(|e| match e {
                CallFailure::NodeDown => RpcError::NodeDown(on.to_string()),
                CallFailure::Timeout => RpcError::Timeout,
                CallFailure::Other(e) => RpcError::Transport(e),
            })?;
        match answer {
            Ok(bytes) => self
                .decode(&bytes)
                .map_err(|e| RpcError::Transport(format!("result does not decode: {e}"))),
            Err(Refusal::Unknown) => Err(RpcError::UnknownFunction(name.to_string())),
            Err(Refusal::TypeMismatch(registered)) => Err(RpcError::TypeMismatch {
                function: name.to_string(),
                registered,
            }),
            Err(Refusal::BadArgs(e)) => Err(RpcError::BadArgs(e)),
            Err(Refusal::Busy) => Err(RpcError::Busy),
            Err(Refusal::Exited) => Err(RpcError::Failed("exited".into())),
            Err(Refusal::Failed(e)) => Err(RpcError::Failed(e)),
        }
    }

    /// Calls the runtime service `service` on member `on`; a node that is not a member is
    /// `NodeDown`, as one that goes down before it answers.
    async fn call_service<Q: Message, T: Message>(
        &self,
        on: &str,
        service: &str,
        make: impl FnOnce(ReplyTo<T>) -> Q,
        timeout: Duration,
    ) -> Result<T, CallFailure> {
        let target: ActorRef<Q> = self.remote(on, service).ok_or(CallFailure::NodeDown)?;
        target.call(make, timeout).await.map_err(CallFailure::from)
    }

    pub(crate) fn kind(&self, name: &str) -> Option<Arc<Kind>> {
        let kinds = self.inner.remote.kinds.read();
        kinds.unwrap_or_else(|e| e.into_inner()).get(name).cloned()
    }

    pub(crate) fn function(&self, name: &str) -> Option<Arc<Function>> {
        let functions = self.inner.remote.functions.read();
        functions
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    pub(crate) fn rpc_permits(&self) -> Arc<Semaphore> {
        self.inner.remote.rpc_permits.clone()
    }

    /// Registers a runtime service under its reserved local name.
    pub(crate) fn register_system<M: Message>(&self, name: &str, actor: &ActorRef<M>) {
        if let Some(id) = actor.id() {
            if let Err(e) = self.inner.actors.registry.register(name, id) {
                tracing::error!(error = %e, name, "cannot register a runtime service");
            }
        }
    }
}
