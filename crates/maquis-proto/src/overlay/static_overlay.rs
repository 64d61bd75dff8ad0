//! Static overlay: connections only to the configured peers and to nodes joined explicitly (in
//! either direction); no gossip. Configured peers that are down are re-dialed periodically.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Effects, Overlay, Route, TimerId};
use crate::id::NodeId;

const REDIAL: TimerId = TimerId(1);

/// Static overlay protocol messages.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Msg {
    /// The sender leaves; do not report it as down, and do not re-dial it.
    Leaving,
}

/// The static overlay.
#[derive(Debug)]
pub struct StaticOverlay {
    me: NodeId,
    configured: Vec<SocketAddr>,
    connected: BTreeMap<Arc<str>, NodeId>,
    redial_every: Duration,
    left: bool,
}

impl StaticOverlay {
    /// A node that keeps connections to `configured`, re-dialing every `redial_every`.
    pub fn new(me: NodeId, configured: Vec<SocketAddr>, redial_every: Duration) -> Self {
        StaticOverlay {
            me,
            configured,
            connected: BTreeMap::new(),
            redial_every,
            left: false,
        }
    }

    fn dial_missing(&self, fx: &mut Effects<Msg>) {
        if self.left {
            return;
        }
        for addr in &self.configured {
            if *addr != self.me.addr && !self.connected.values().any(|n| n.addr == *addr) {
                fx.dial(*addr);
            }
        }
    }
}

impl Overlay for StaticOverlay {
    type Msg = Msg;

    fn name(&self) -> &'static str {
        "static"
    }

    fn on_start(&mut self, fx: &mut Effects<Msg>) {
        self.dial_missing(fx);
        fx.timer(REDIAL, self.redial_every);
    }

    fn on_join(&mut self, contact: &NodeId, _fx: &mut Effects<Msg>) {
        self.left = false;
        self.connected.insert(contact.name.clone(), contact.clone());
    }

    fn on_leave(&mut self, fx: &mut Effects<Msg>) {
        self.left = true;
        for peer in std::mem::take(&mut self.connected).into_values() {
            fx.send(peer.clone(), Msg::Leaving);
            fx.left(peer.clone());
            fx.disconnect(peer);
        }
    }

    fn on_remove(&mut self, node: &Arc<str>, fx: &mut Effects<Msg>) {
        if let Some(peer) = self.connected.remove(node) {
            fx.left(peer.clone());
            fx.disconnect(peer);
        }
    }

    fn on_message(&mut self, from: &NodeId, msg: Msg, fx: &mut Effects<Msg>) {
        match msg {
            Msg::Leaving => {
                if self.connected.get(&from.name) == Some(from) {
                    self.connected.remove(&from.name);
                    self.configured.retain(|a| *a != from.addr);
                    fx.left(from.clone());
                    fx.disconnect(from.clone());
                }
            }
        }
    }

    fn on_connection(&mut self, peer: &NodeId, up: bool, _fx: &mut Effects<Msg>) {
        if up {
            self.left = false;
            self.connected.insert(peer.name.clone(), peer.clone());
        } else if self.connected.get(&peer.name) == Some(peer) {
            self.connected.remove(&peer.name);
        }
    }

    fn on_timer(&mut self, timer: TimerId, fx: &mut Effects<Msg>) {
        if timer == REDIAL {
            self.dial_missing(fx);
            fx.timer(REDIAL, self.redial_every);
        }
    }

    fn members(&self) -> Vec<NodeId> {
        std::iter::once(self.me.clone())
            .chain(self.connected.values().cloned())
            .collect()
    }

    fn route(&self, dst: &NodeId) -> Route {
        if self.connected.get(&dst.name) == Some(dst) {
            Route::Direct
        } else {
            Route::Unreachable
        }
    }
}
