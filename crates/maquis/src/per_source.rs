//! Counts of what each source address holds at once (handshakes in progress, admin
//! connections), so that one source cannot take every slot from the others.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Slots in use by source address. An entry lives while its source holds a slot, so the table
/// never has more entries than there are slots in use (which a global limit bounds).
#[derive(Debug, Default)]
pub(crate) struct PerSource(Mutex<HashMap<IpAddr, usize>>);

/// One slot of a source; given back when dropped.
#[derive(Debug)]
pub(crate) struct SourceSlot {
    table: Arc<PerSource>,
    ip: IpAddr,
}

impl PerSource {
    /// A slot for `ip` if it holds fewer than `limit`.
    pub(crate) fn take(self: &Arc<Self>, ip: IpAddr, limit: usize) -> Option<SourceSlot> {
        let mut t = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = t.entry(ip).or_insert(0);
        if *n >= limit {
            if *n == 0 {
                t.remove(&ip);
            }
            return None;
        }
        *n += 1;
        Some(SourceSlot {
            table: self.clone(),
            ip,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut t = self.table.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = t.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                t.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_holds_at_most_its_share_and_gives_it_back() {
        let t = Arc::new(PerSource::default());
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let held: Vec<_> = (0..3).map(|_| t.take(a, 3).expect("room")).collect();
        assert!(t.take(a, 3).is_none(), "a is at its limit");
        let other = t.take(b, 3).expect("b has its own share");
        drop(held);
        assert!(t.take(a, 3).is_some(), "given back");
        drop(other);
        assert!(t.take(a, 0).is_none());
        assert!(
            t.0.lock().unwrap().is_empty(),
            "no entry outlives its slots"
        );
    }
}
