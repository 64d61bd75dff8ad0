//! The event queue: events ordered by time, then by insertion (so runs are reproducible).

use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Simulated time, in microseconds.
pub type Micros = u64;

/// A priority queue of events; the heap holds only small keys, the events wait in slots.
pub(crate) struct Queue<E> {
    heap: BinaryHeap<Reverse<(Micros, u64, u32)>>,
    slots: Vec<Option<E>>,
    free: Vec<u32>,
    seq: u64,
    /// The current time: that of the last event taken out.
    pub now: Micros,
}

impl<E> Queue<E> {
    pub fn new() -> Self {
        Queue {
            heap: BinaryHeap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            seq: 0,
            now: 0,
        }
    }

    /// Schedules an event at `at` (not before now).
    pub fn push(&mut self, at: Micros, e: E) {
        let slot = match self.free.pop() {
            Some(s) => {
                self.slots[s as usize] = Some(e);
                s
            }
            None => {
                self.slots.push(Some(e));
                (self.slots.len() - 1) as u32
            }
        };
        self.seq += 1;
        self.heap.push(Reverse((at.max(self.now), self.seq, slot)));
    }

    /// Takes out the next event due at or before `until`, advancing the clock to it.
    pub fn pop_until(&mut self, until: Micros) -> Option<E> {
        let Reverse((at, _, slot)) = *self.heap.peek()?;
        if at > until {
            return None;
        }
        self.heap.pop();
        self.now = at;
        self.free.push(slot);
        self.slots[slot as usize].take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn time_then_insertion_order() {
        let mut q = Queue::new();
        q.push(5, 'a');
        q.push(1, 'b');
        q.push(5, 'c');
        assert_eq!(q.pop_until(0), None);
        let all: Vec<char> = std::iter::from_fn(|| q.pop_until(10)).collect();
        assert_eq!(all, vec!['b', 'a', 'c']);
        assert_eq!(q.now, 5);
        q.push(2, 'd');
        assert_eq!(
            (q.pop_until(10), q.now),
            (Some('d'), 5),
            "never back in time"
        );
    }
}
