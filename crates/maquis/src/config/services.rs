//! `[services]`: the cluster services above membership: global names, remote spawn, RPC,
//! process groups.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{invalid, ms, ConfigError};
use maquis_proto::groups::GroupsConfig;
use maquis_proto::names::DirectoryConfig;

/// `[services]`: the cluster services: the directory of global names, and the bound on RPCs.
/// The directory's defaults are `DirectoryConfig::default()`'s.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServicesConfig {
    /// Members that keep each global name, its home included.
    pub name_replicas: usize,
    /// Global names a node keeps at most as a name's home or replica, and registers at most
    /// itself; a registration beyond is refused (`Full`).
    pub max_names: usize,
    /// Global-name lookups a node caches at most (the oldest is evicted).
    pub name_cache: usize,
    /// Directory requests (registrations, lookups, assertions, loss notices) a node has waiting
    /// for an answer at most; more fail at once (`Busy`).
    pub max_pending: usize,
    /// How long a directory request waits for its answer (sent again every quarter of it), in
    /// milliseconds.
    pub request_timeout_ms: u64,
    /// How long after a change of the members a node asserts its global names to their new
    /// homes, in milliseconds.
    pub resync_ms: u64,
    /// RPCs a node runs at once at most (each as a task of its own); more fail at once
    /// (`Busy`).
    pub max_rpc_tasks: usize,
    /// Group memberships a node keeps at most, its own actors' and the replicas of the
    /// others' together; a join beyond fails (`Full`), a remote one beyond is dropped and
    /// counted.
    pub max_group_members: usize,
    /// How often a node with group memberships tells the others its version (so that a lost
    /// change is noticed), in milliseconds.
    pub group_digest_ms: u64,
    /// A virtual actor that received nothing for this long deactivates, in milliseconds (0:
    /// never).
    pub virtual_idle_ms: u64,
    /// Virtual actors a node runs at most; a message that would activate one more is refused
    /// (counted in `virtual_refused`, a call answered `NoProc`).
    pub max_activations: usize,
    /// Messages held per virtual actor while it activates or deactivates; more are refused as
    /// above. No more than `node.mailbox_capacity` are held, whatever this says (they are
    /// handed to the new mailbox at once).
    pub activation_buffer: usize,
    /// How often a node offers a peer an exchange of virtual actors (ActOp's pairwise
    /// partitioning), in milliseconds; 0: never (the default).
    pub actop_interval_ms: u64,
    /// Virtual actors a node offers, or sends back, in one exchange at most.
    pub actop_candidates: usize,
    /// Virtual actors two nodes may differ by after an exchange (ActOp's δ).
    pub actop_imbalance: usize,
    /// Edges (sender activation, virtual actor sent to) a node counts at most: the heaviest
    /// are kept (Space-Saving).
    pub actop_edges: usize,
    /// How often a node sizes its stages (receive, execute, send) by ActOp's queueing model,
    /// in milliseconds; 0: never (the default: every stage may use every worker thread).
    pub stage_interval_ms: u64,
    /// The model's cost of a thread (ActOp's η), in microseconds: the higher, the fewer
    /// threads the stages get.
    pub stage_penalty_us: u64,
}

impl Default for ServicesConfig {
    fn default() -> Self {
        let d = DirectoryConfig::default();
        let g = GroupsConfig::default();
        ServicesConfig {
            name_replicas: d.replicas,
            max_names: d.max_names,
            name_cache: d.cache_capacity,
            max_pending: d.max_pending,
            request_timeout_ms: ms(d.request_timeout),
            resync_ms: ms(d.resync_after),
            max_rpc_tasks: 16_384,
            max_group_members: g.max_members,
            group_digest_ms: ms(g.digest_every),
            virtual_idle_ms: 600_000,
            max_activations: 100_000,
            activation_buffer: 256,
            actop_interval_ms: 0,
            actop_candidates: 64,
            actop_imbalance: 10,
            actop_edges: 16_384,
            stage_interval_ms: 0,
            stage_penalty_us: 100,
        }
    }
}

impl ServicesConfig {
    /// Checks this section's ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let at_least_one = [
            ("services.name_replicas", self.name_replicas),
            ("services.max_names", self.max_names),
            ("services.name_cache", self.name_cache),
            ("services.max_pending", self.max_pending),
            ("services.max_rpc_tasks", self.max_rpc_tasks),
            ("services.max_group_members", self.max_group_members),
            ("services.max_activations", self.max_activations),
            ("services.activation_buffer", self.activation_buffer),
            ("services.actop_candidates", self.actop_candidates),
            ("services.actop_edges", self.actop_edges),
        ];
        for (key, v) in at_least_one {
            if v == 0 {
                return Err(invalid(key, "must be at least 1"));
            }
        }
        if self.request_timeout_ms < 4 {
            return Err(invalid("services.request_timeout_ms", "must be at least 4"));
        }
        if self.resync_ms == 0 {
            return Err(invalid("services.resync_ms", "must be at least 1"));
        }
        if self.stage_penalty_us == 0 {
            return Err(invalid("services.stage_penalty_us", "must be at least 1"));
        }
        if self.group_digest_ms == 0 {
            return Err(invalid("services.group_digest_ms", "must be at least 1"));
        }
        Ok(())
    }

    /// The virtual-actor host's limits, with mailboxes of `mailbox_capacity` (held messages
    /// are handed to a new mailbox at once: no more are held than it takes).
    pub(crate) fn virtual_limits(&self, mailbox_capacity: usize) -> crate::virtual_actors::Limits {
        crate::virtual_actors::Limits {
            idle: Duration::from_millis(self.virtual_idle_ms),
            max_activations: self.max_activations,
            buffer: self.activation_buffer.min(mailbox_capacity),
            actop: crate::virtual_actors::ActopSettings {
                interval: Duration::from_millis(self.actop_interval_ms),
                candidates: self.actop_candidates,
                imbalance: self.actop_imbalance,
                edges: self.actop_edges,
            },
        }
    }

    /// The stage-sizing settings, when on.
    pub(crate) fn stages(&self) -> Option<crate::stages::Settings> {
        (self.stage_interval_ms > 0).then(|| crate::stages::Settings {
            interval: Duration::from_millis(self.stage_interval_ms),
            penalty: Duration::from_micros(self.stage_penalty_us),
        })
    }

    /// The groups machine's settings.
    pub(crate) fn groups(&self) -> GroupsConfig {
        GroupsConfig {
            max_members: self.max_group_members,
            digest_every: Duration::from_millis(self.group_digest_ms),
        }
    }

    /// The directory's settings.
    pub(crate) fn directory(&self) -> DirectoryConfig {
        DirectoryConfig {
            replicas: self.name_replicas,
            max_names: self.max_names,
            cache_capacity: self.name_cache,
            max_pending: self.max_pending,
            request_timeout: Duration::from_millis(self.request_timeout_ms),
            resync_after: Duration::from_millis(self.resync_ms),
        }
    }
}
