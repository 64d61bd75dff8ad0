//! Supervisors: actors that start other actors and restart them when they go down.
//!
//! A supervisor is described by a [`SupervisorSpec`] (a restart [`Strategy`], an intensity and
//! its children's [`ChildSpec`]s) and started with [`Node::supervise`], which starts every
//! child in order and returns the supervisor's ref. A child spec holds a function that spawns
//! the child on the node it is given; the supervisor watches the actor that function spawned
//! (from before its task first runs, so even an instant end is seen) and, when it goes down,
//! decides by the child's [`Restart`] whether to restart it and by the strategy what else to
//! restart:
//!
//! | strategy | a child goes down and is to be restarted |
//! |---|---|
//! | [`Strategy::OneForOne`] | it alone is restarted |
//! | [`Strategy::OneForAll`] | the others are stopped (last started first), then all are started again in order |
//! | [`Strategy::RestForOne`] | the children started after it are stopped (last first), then it and they are started again in order |
//!
//! **Intensity.** At most `max_restarts` restarts within any `within` window
//! ([`SupervisorSpec::intensity`]; default 3 in 5 s). One more and the supervisor gives up:
//! it stops its children (last first) and ends with `DownReason::Failed`, which its own
//! monitors, links and supervisor see — a supervisor can be a child of another
//! ([`ChildSpec::supervisor`]), and the failure climbs the tree until one level's intensity
//! absorbs it.
//!
//! **Stopping.** A child is stopped with `DownReason::Shutdown` and given its
//! [`ChildSpec::shutdown_timeout`] (default 5 s) to end; an actor stuck in blocking code cannot
//! be stopped, and the supervisor goes on without it after the timeout (logged). A supervisor
//! that is itself stopped (by [`Node::stop_actor`], its own supervisor, or a link) stops its
//! children first, last first, then ends with that reason.
//!
//! **Names.** A restarted child is a new actor with a new id: reach children through a name
//! ([`ChildSpec::register_as`] registers each new start under it; a ref by name then reaches
//! whichever start is alive).
//!
//! ```no_run
//! # async fn run(node: maquis::Node) -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use maquis::supervisor::{ChildSpec, Strategy, SupervisorSpec};
//!
//! let spec = SupervisorSpec::new(Strategy::OneForOne)
//!     .intensity(5, Duration::from_secs(10))
//!     .child(
//!         ChildSpec::new("counter", |node: &maquis::Node| {
//!             node.spawn_fn(|mut inbox: maquis::Inbox<u64>| async move {
//!                 let mut total = 0;
//!                 while let Some(n) = inbox.recv().await {
//!                     total += n;
//!                 }
//!                 let _ = total;
//!             })
//!         })
//!         .register_as("counter"),
//!     );
//! let sup = node.supervise(spec)?;
//! let children = maquis::supervisor::children(&sup, Duration::from_secs(1)).await?;
//! assert_eq!(children[0].id, "counter");
//! # Ok(()) }
//! ```

mod intensity;
mod run;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::actor::{ActorRef, Message, ReplyTo};
use crate::error::CallError;
use crate::node::Node;

pub use run::SuperviseError;

/// Which children a supervisor restarts when one goes down (see the [module](self) table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Strategy {
    /// Only the child that went down.
    OneForOne,
    /// Every child.
    OneForAll,
    /// The child that went down and those started after it.
    RestForOne,
}

/// When a child is restarted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restart {
    /// Always, whatever the reason it went down.
    Permanent,
    /// Unless it ended normally (`Stopped`) or was shut down (`Shutdown`).
    Transient,
    /// Never; it stays down.
    Temporary,
}

impl Restart {
    pub(crate) fn restarts_after(self, reason: &crate::DownReason) -> bool {
        use crate::DownReason::{Shutdown, Stopped};
        match self {
            Restart::Permanent => true,
            Restart::Transient => !matches!(reason, Stopped | Shutdown),
            Restart::Temporary => false,
        }
    }
}

type StartFn = Arc<dyn Fn(&Node) -> Result<ActorRef<()>, String> + Send + Sync>;

/// One child of a supervisor: how to start it and when to restart it.
#[derive(Clone)]
pub struct ChildSpec {
    pub(crate) id: String,
    pub(crate) start: StartFn,
    pub(crate) restart: Restart,
    pub(crate) shutdown: Duration,
    pub(crate) register_as: Option<String>,
}

impl std::fmt::Debug for ChildSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChildSpec")
            .field("id", &self.id)
            .field("restart", &self.restart)
            .field("shutdown", &self.shutdown)
            .field("register_as", &self.register_as)
            .finish_non_exhaustive()
    }
}

impl ChildSpec {
    /// A child called `id` (unique within its supervisor), started by `start`, which must spawn
    /// the actor it returns on the node it is given (with [`Node::spawn`] or
    /// [`Node::spawn_fn`]); permanent, with a 5 s shutdown timeout.
    pub fn new<M: Message>(
        id: impl Into<String>,
        start: impl Fn(&Node) -> ActorRef<M> + Send + Sync + 'static,
    ) -> Self {
        ChildSpec {
            id: id.into(),
            start: Arc::new(move |node| Ok(start(node).erase())),
            restart: Restart::Permanent,
            shutdown: Duration::from_secs(5),
            register_as: None,
        }
    }

    /// A child that is itself a supervisor (a subtree).
    pub fn supervisor(id: impl Into<String>, spec: SupervisorSpec) -> Self {
        ChildSpec {
            id: id.into(),
            start: Arc::new(move |node| {
                node.supervise(spec.clone())
                    .map(|r| r.erase())
                    .map_err(|e| e.to_string())
            }),
            restart: Restart::Permanent,
            shutdown: Duration::from_secs(30),
            register_as: None,
        }
    }

    /// When to restart it (default [`Restart::Permanent`]).
    pub fn restart(mut self, restart: Restart) -> Self {
        self.restart = restart;
        self
    }

    /// How long it gets to end once told to stop (default 5 s; 30 s for a supervisor).
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown = timeout;
        self
    }

    /// Registers each start of the child under `name` (a start whose name is still taken
    /// counts as a failed start).
    pub fn register_as(mut self, name: impl Into<String>) -> Self {
        self.register_as = Some(name.into());
        self
    }
}

/// A supervisor: its strategy, its intensity and its children, started in order.
#[derive(Clone, Debug)]
pub struct SupervisorSpec {
    pub(crate) strategy: Strategy,
    pub(crate) max_restarts: u32,
    pub(crate) within: Duration,
    pub(crate) children: Vec<ChildSpec>,
}

impl SupervisorSpec {
    /// No children yet; at most 3 restarts within 5 s.
    pub fn new(strategy: Strategy) -> Self {
        SupervisorSpec {
            strategy,
            max_restarts: 3,
            within: Duration::from_secs(5),
            children: Vec::new(),
        }
    }

    /// At most `max_restarts` restarts within any `within`; one more and the supervisor gives
    /// up (`DownReason::Failed`). `0` gives up at the first child that goes down.
    pub fn intensity(mut self, max_restarts: u32, within: Duration) -> Self {
        self.max_restarts = max_restarts;
        self.within = within;
        self
    }

    /// Adds a child, started after those added before.
    pub fn child(mut self, child: ChildSpec) -> Self {
        self.children.push(child);
        self
    }
}

/// What a supervisor takes.
#[derive(Debug, Serialize, Deserialize)]
pub enum SupervisorMsg {
    /// Asks for its children, in start order.
    Children(ReplyTo<Vec<ChildInfo>>),
}

/// One child as its supervisor sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChildInfo {
    /// The child's id in its spec.
    pub id: String,
    /// The running start's actor id on the supervisor's node; `None` while it is down.
    pub actor: Option<u64>,
    /// How many times it was restarted.
    pub restarts: u32,
}

/// A supervisor's children, in start order (a call to the supervisor).
pub async fn children(
    supervisor: &ActorRef<SupervisorMsg>,
    timeout: Duration,
) -> Result<Vec<ChildInfo>, CallError> {
    supervisor.call(SupervisorMsg::Children, timeout).await
}
