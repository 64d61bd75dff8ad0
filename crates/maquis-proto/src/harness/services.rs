//! The service machines a simulated node may run beside its membership machine — the directory
//! of global names and the process groups — and what the network needs of them: the members,
//! their routed messages (encoded as the runtime encodes them), their timers, their outputs.

use std::time::Duration;

use bytes::Bytes;

use super::{SimId, SimNode};
use crate::groups::{GroupMsg, GroupOutput};
use crate::names::{DirMsg, DirOutput};

/// Which service a routed message is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Which {
    /// The directory of global names.
    Names,
    /// The process groups.
    Groups,
}

/// What a node's service asks of the network.
pub(super) enum ServiceOut {
    /// A message for the same service on node `to` (`None`: it did not encode).
    Send {
        /// The service.
        which: Which,
        /// The destination.
        to: SimId,
        /// The encoded message.
        payload: Option<Bytes>,
    },
    /// An answer of the directory, for the observer.
    Names(DirOutput<SimId>),
}

impl SimNode {
    /// The membership machine published new members: every service hears them.
    pub(super) fn services_hear_members(&mut self, now: Duration, members: &[SimId]) {
        if let Some(d) = self.names.as_mut() {
            d.handle_members(now, members);
        }
        if let Some(g) = self.groups.as_mut() {
            g.handle_members(now, members);
        }
    }

    /// The services' timers that are due.
    pub(super) fn services_timeout(&mut self, now: Duration) {
        if let Some(d) = self.names.as_mut() {
            d.handle_timeout(now);
        }
        if let Some(g) = self.groups.as_mut() {
            g.handle_timeout(now);
        }
    }

    /// The services' earliest deadline.
    pub(super) fn services_deadline(&self) -> Option<Duration> {
        let names = self.names.as_ref().and_then(|d| d.poll_timeout());
        let groups = self.groups.as_ref().and_then(|g| g.poll_timeout());
        match (names, groups) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A message for service `which` from `from`: `Ok(true)` if it ran it, `Ok(false)` if the
    /// node does not run that service, `Err` if it did not decode.
    pub(super) fn services_deliver(
        &mut self,
        which: Which,
        now: Duration,
        from: SimId,
        payload: &[u8],
    ) -> Result<bool, ()> {
        match which {
            Which::Names => {
                let msg: DirMsg<SimId> = postcard::from_bytes(payload).map_err(|_| ())?;
                let Some(d) = self.names.as_mut() else {
                    return Ok(false);
                };
                d.handle_message(now, from, msg);
            }
            Which::Groups => {
                let msg: GroupMsg = postcard::from_bytes(payload).map_err(|_| ())?;
                let Some(g) = self.groups.as_mut() else {
                    return Ok(false);
                };
                g.handle_message(now, from, msg);
            }
        }
        Ok(true)
    }

    /// The next output of one of the services.
    pub(super) fn services_poll(&mut self) -> Option<ServiceOut> {
        if let Some(out) = self.names.as_mut().and_then(|d| d.poll_output()) {
            return Some(match out {
                DirOutput::Send { to, msg } => ServiceOut::Send {
                    which: Which::Names,
                    to,
                    payload: encoded(&msg),
                },
                other => ServiceOut::Names(other),
            });
        }
        let out = self.groups.as_mut().and_then(|g| g.poll_output())?;
        let GroupOutput::Send { to, msg } = out;
        Some(ServiceOut::Send {
            which: Which::Groups,
            to,
            payload: encoded(&msg),
        })
    }
}

/// A service's message encoded as the runtime encodes it (`None` if it does not encode).
fn encoded<T: serde::Serialize>(msg: &T) -> Option<Bytes> {
    crate::encode(msg).ok().map(Bytes::from)
}
