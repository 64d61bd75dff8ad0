//! The backend that keeps nothing.

use super::{Storage, StorageError, StorageStats, Ticket};
use crate::vnode::Entry;

/// Keeps nothing: vnodes live in memory only, and a restarted node starts empty.
#[derive(Clone, Copy, Debug, Default)]
pub struct Memory;

impl Storage for Memory {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn is_durable(&self) -> bool {
        false
    }

    fn partitions(&self) -> Result<Vec<u32>, StorageError> {
        Ok(Vec::new())
    }

    fn load(&self, _partition: u32) -> Result<Vec<Entry>, StorageError> {
        Ok(Vec::new())
    }

    fn write(&self, _partition: u32, _entries: Vec<Entry>) -> Ticket {
        Ticket::ready(Ok(()))
    }

    fn clear(&self, _partition: u32) -> Ticket {
        Ticket::ready(Ok(()))
    }

    fn stats(&self) -> StorageStats {
        StorageStats::default()
    }
}
