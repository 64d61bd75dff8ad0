//! Acknowledged delivery, without I/O and without a clock: the sender's [`Outbox`] of
//! unacknowledged messages to one node, and the receiver's [`Seen`] record of what it has
//! handled from one sender.
//!
//! # The rules
//!
//! - Each message to a node gets a sequence number from its sender's outbox, from 1, per
//!   (sender incarnation, receiver). The sender keeps it until it is acknowledged, resends it
//!   when its retry time passes (the wait doubling from `first_retry` up to `max_retry`), and
//!   gives up at its deadline (`give_up_after` after it was opened); the driver then tells the
//!   application that the message may or may not have been handled.
//! - Every message carries the sender's **floor**: the oldest number it still waits on (the
//!   next number when it waits on none). The sender opens a number only below
//!   `floor + window`, so every number in flight lies in `[floor, floor + window)`.
//! - The receiver raises its floor to the highest floor it has been sent, forgets the numbers
//!   below it, and judges a number ([`Verdict`]): below the floor it was handled already or
//!   given up on (a duplicate: acknowledged again, not handled); at or above `floor + window`
//!   no correct sender sent it (invalid: dropped); otherwise new once, a duplicate after.
//!   So a receiver keeps at most `window` numbers per sender, whatever a sender sends.
//!
//! While both nodes stay up and a message is acknowledged before its deadline, it is handled
//! exactly once: resends make it at least once, the record makes it at most once. Resent
//! messages can overtake later ones: acknowledged delivery does not keep order.

use std::collections::{BTreeMap, BTreeSet};

/// How an outbox resends and when it gives up. Times in microseconds, as every input's `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryConfig {
    /// The wait before the first resend.
    pub first_retry_us: u64,
    /// The longest wait between two resends (the wait doubles up to it).
    pub max_retry_us: u64,
    /// How long after it was opened a message is given up.
    pub give_up_after_us: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            first_retry_us: 200_000,
            max_retry_us: 5_000_000,
            give_up_after_us: 30_000_000,
        }
    }
}

/// An outbox's limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutboxLimits {
    /// Numbers in flight span less than this (the receiver's state per sender).
    pub window: u64,
    /// The bytes of unacknowledged messages kept for resending (one message larger than this
    /// goes alone).
    pub max_bytes: usize,
}

impl Default for OutboxLimits {
    fn default() -> Self {
        OutboxLimits {
            window: 1024,
            max_bytes: 64 << 20,
        }
    }
}

/// What an outbox asks of its driver when time passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// Send message `seq` again (with the current floor).
    Resend(u64),
    /// Message `seq` reached its deadline unacknowledged: it is forgotten.
    GiveUp(u64),
}

#[derive(Debug)]
struct Pending {
    bytes: usize,
    wait: u64,
    max_wait: u64,
    deadline: u64,
    /// The time it is next due (a resend or its deadline), as keyed in `timers`.
    due: u64,
}

/// The unacknowledged messages to one node.
#[derive(Debug)]
pub struct Outbox {
    limits: OutboxLimits,
    next: u64,
    pending: BTreeMap<u64, Pending>,
    /// (due time, seq) of every pending message.
    timers: BTreeSet<(u64, u64)>,
    bytes: usize,
}

impl Outbox {
    /// An empty outbox; the first number is 1.
    pub fn new(limits: OutboxLimits) -> Self {
        Outbox {
            limits,
            next: 1,
            pending: BTreeMap::new(),
            timers: BTreeSet::new(),
            bytes: 0,
        }
    }

    /// The oldest number still waiting for its acknowledgement, or the next number.
    pub fn floor(&self) -> u64 {
        self.pending.keys().next().copied().unwrap_or(self.next)
    }

    /// Whether a message of `bytes` can be opened now (else wait for an acknowledgement or a
    /// give-up).
    pub fn has_room(&self, bytes: usize) -> bool {
        self.next - self.floor() < self.limits.window
            && (self.pending.is_empty()
                || self.bytes.saturating_add(bytes) <= self.limits.max_bytes)
    }

    /// Opens a message of `bytes` at `now`, resent and given up as `retry` says: its number,
    /// or `None` without room.
    pub fn open(&mut self, now: u64, bytes: usize, retry: &RetryConfig) -> Option<u64> {
        if !self.has_room(bytes) {
            return None;
        }
        let seq = self.next;
        self.next += 1;
        let deadline = now.saturating_add(retry.give_up_after_us);
        let due = now.saturating_add(retry.first_retry_us).min(deadline);
        self.pending.insert(
            seq,
            Pending {
                bytes,
                wait: retry.first_retry_us.max(1),
                max_wait: retry.max_retry_us.max(1),
                deadline,
                due,
            },
        );
        self.timers.insert((due, seq));
        self.bytes += bytes;
        Some(seq)
    }

    /// Message `seq` was acknowledged; false if it was not waiting (a late or repeated
    /// acknowledgement, or one for a number never opened).
    pub fn ack(&mut self, seq: u64) -> bool {
        match self.pending.remove(&seq) {
            Some(p) => {
                self.timers.remove(&(p.due, seq));
                self.bytes -= p.bytes;
                true
            }
            None => false,
        }
    }

    /// When the driver must next call [`Outbox::poll`], if anything is pending.
    pub fn next_due(&self) -> Option<u64> {
        self.timers.first().map(|(t, _)| *t)
    }

    /// The next thing due at `now`, if any; call until `None`.
    pub fn poll(&mut self, now: u64) -> Option<Due> {
        let &(due, seq) = self.timers.first()?;
        if due > now {
            return None;
        }
        self.timers.remove(&(due, seq));
        let p = self.pending.get_mut(&seq)?;
        if now >= p.deadline {
            let bytes = p.bytes;
            self.pending.remove(&seq);
            self.bytes -= bytes;
            return Some(Due::GiveUp(seq));
        }
        p.wait = p.wait.saturating_mul(2).min(p.max_wait);
        p.due = now.saturating_add(p.wait).min(p.deadline);
        self.timers.insert((p.due, seq));
        Some(Due::Resend(seq))
    }

    /// Forgets every pending message (the receiver is gone for good); their numbers.
    pub fn clear(&mut self) -> Vec<u64> {
        self.timers.clear();
        self.bytes = 0;
        let seqs = self.pending.keys().copied().collect();
        self.pending.clear();
        seqs
    }

    /// How many messages wait for their acknowledgement.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// Whether none does.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}

/// How a receiver judges an arriving number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Not seen before: handle it, then acknowledge it.
    New,
    /// Handled before (or given up on by its sender): acknowledge it again, do not handle it.
    Duplicate,
    /// Outside what a correct sender can send: drop it.
    Invalid,
}

/// What a receiver has handled from one sender.
#[derive(Clone, Debug)]
pub struct Seen {
    window: u64,
    floor: u64,
    seen: BTreeSet<u64>,
}

impl Seen {
    /// Nothing handled yet; `window` as the sender's.
    pub fn new(window: u64) -> Self {
        Seen {
            window,
            floor: 1,
            seen: BTreeSet::new(),
        }
    }

    /// Judges number `seq`, sent with the sender's `floor`, and records it if new.
    pub fn check(&mut self, seq: u64, floor: u64) -> Verdict {
        if floor > self.floor {
            self.floor = floor;
            self.seen = self.seen.split_off(&floor);
        }
        if seq < self.floor {
            return Verdict::Duplicate;
        }
        if seq >= self.floor.saturating_add(self.window) {
            return Verdict::Invalid;
        }
        if self.seen.insert(seq) {
            Verdict::New
        } else {
            Verdict::Duplicate
        }
    }

    /// Forgets number `seq` (judged new, but not handled after all): it is judged new again.
    pub fn forget(&mut self, seq: u64) {
        self.seen.remove(&seq);
    }

    /// How many numbers it keeps (at most the window).
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// Whether it keeps none.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RETRY: RetryConfig = RetryConfig {
        first_retry_us: 100,
        max_retry_us: 800,
        give_up_after_us: 10_000,
    };

    fn outbox(window: u64) -> Outbox {
        Outbox::new(OutboxLimits {
            window,
            max_bytes: 1000,
        })
    }

    #[test]
    fn resends_back_off_and_give_up_at_the_deadline() {
        let mut o = outbox(8);
        let s = o.open(0, 10, &RETRY).unwrap();
        let mut resends = Vec::new();
        let mut now;
        loop {
            now = o.next_due().unwrap();
            match o.poll(now).unwrap() {
                Due::Resend(x) => {
                    assert_eq!(x, s);
                    resends.push(now);
                }
                Due::GiveUp(x) => {
                    assert_eq!(x, s);
                    break;
                }
            }
        }
        assert_eq!(
            &resends[..5],
            &[100, 300, 700, 1500, 2300],
            "doubling up to 800"
        );
        assert_eq!(now, 10_000);
        assert!(o.is_empty() && o.next_due().is_none());
        assert!(!o.ack(s), "a late ack finds nothing");
    }

    #[test]
    fn the_window_and_the_bytes_bound_what_is_open() {
        let mut o = outbox(4);
        for _ in 0..4 {
            o.open(0, 1, &RETRY).unwrap();
        }
        assert_eq!(o.open(0, 1, &RETRY), None, "window full");
        assert!(o.ack(2) && o.ack(3) && o.ack(4));
        assert_eq!(
            o.open(0, 1, &RETRY),
            None,
            "1 still pending: 5 - 1 is the whole window"
        );
        assert!(o.ack(1));
        assert_eq!(o.floor(), 5);
        assert_eq!(o.open(0, 900, &RETRY), Some(5));
        assert_eq!(o.open(0, 200, &RETRY), None, "over the bytes");
        assert!(o.ack(5));
        assert_eq!(
            o.open(0, 5000, &RETRY),
            Some(6),
            "a message larger than the bound goes alone"
        );
    }

    #[test]
    fn the_receiver_keeps_at_most_a_window_whatever_it_is_sent() {
        let mut s = Seen::new(4);
        assert_eq!(s.check(1, 1), Verdict::New);
        assert_eq!(s.check(1, 1), Verdict::Duplicate);
        assert_eq!(s.check(5, 1), Verdict::Invalid);
        assert_eq!(s.check(u64::MAX, 1), Verdict::Invalid);
        assert_eq!(s.check(4, 1), Verdict::New);
        assert_eq!(s.check(5, 2), Verdict::New, "the floor moved");
        assert_eq!(s.check(1, 2), Verdict::Duplicate, "below the floor");
        assert_eq!(s.len(), 2);
        assert_eq!(s.check(9, u64::MAX), Verdict::Duplicate);
        assert!(s.is_empty());
    }

    /// A message or an acknowledgement on the way.
    #[derive(Clone, Debug)]
    enum Wire {
        Msg { seq: u64, floor: u64 },
        Ack(u64),
    }

    proptest! {
        /// Over a channel that loses, duplicates and reorders both ways, every message is
        /// handled exactly once and acknowledged, as long as nothing reaches its deadline.
        #[test]
        fn exactly_once_over_a_bad_channel(
            n in 1u64..60,
            window in 1u64..16,
            fate in proptest::collection::vec(0u8..10, 400..2000),
        ) {
            let retry = RetryConfig { first_retry_us: 10, max_retry_us: 40, give_up_after_us: u64::MAX / 2 };
            let mut o = Outbox::new(OutboxLimits { window, max_bytes: usize::MAX });
            let mut r = Seen::new(window);
            let mut wire: Vec<Wire> = Vec::new();
            let mut handled = vec![0u32; n as usize + 1];
            let mut acked = 0u64;
            let mut opened = 0u64;
            let mut now = 0u64;
            let mut fate = fate.into_iter().cycle();
            let mut steps = 0;
            while acked < n {
                steps += 1;
                prop_assert!(steps < 200_000, "no progress");
                now += 5;
                while opened < n {
                    match o.open(now, 1, &retry) {
                        Some(seq) => { opened += 1; wire.push(Wire::Msg { seq, floor: o.floor() }); }
                        None => break,
                    }
                }
                while let Some(d) = o.poll(now) {
                    match d {
                        Due::Resend(seq) => wire.push(Wire::Msg { seq, floor: o.floor() }),
                        Due::GiveUp(_) => prop_assert!(false, "no deadline in this test"),
                    }
                }
                if wire.is_empty() { continue; }
                let f = fate.next().unwrap();
                // Pick one in flight (reordering), and lose (0-2), duplicate (3) or deliver it.
                let i = (f as usize * 7 + steps) % wire.len();
                let w = if f == 3 { wire[i].clone() } else { wire.swap_remove(i) };
                if f <= 2 { continue; }
                match w {
                    Wire::Msg { seq, floor } => match r.check(seq, floor) {
                        Verdict::New => { handled[seq as usize] += 1; wire.push(Wire::Ack(seq)); }
                        Verdict::Duplicate => wire.push(Wire::Ack(seq)),
                        Verdict::Invalid => prop_assert!(false, "a correct sender sent {seq}"),
                    },
                    Wire::Ack(seq) => { if o.ack(seq) { acked += 1; } }
                }
                prop_assert!(r.len() as u64 <= window);
            }
            prop_assert!(handled[1..].iter().all(|&h| h == 1), "{handled:?}");
        }
    }
}
