//! Small frames written by their sender while the lane's writer is idle.
//!
//! Most frames of a lightly loaded lane find its writer waiting with nothing queued: handing
//! such a frame to the writer task costs a wake-up and a turn of that task (often on the other
//! worker thread) for one `writev`. So while its writer waits with nothing queued and nothing
//! held, the writer lends the connection's write half here, and a sender whose frame is small
//! and whole writes it itself, without blocking (`try_write_vectored`), under this table's lock.
//!
//! The order of frames stays the queue's order because every frame that is queued instead is
//! queued under the same lock, and queuing closes the table: from then on frames are queued
//! until the writer has written them all and lends the write half again. A direct write the
//! socket took only in part leaves the rest of its frame here, with the write half, and wakes
//! the writer, which writes that rest before anything else on the same connection (or drops it
//! with the connection, as it drops a frame whose write the connection's end cut). A write that
//! would block, or fails, writes nothing here: the frame is queued as if the table were closed.
//!
//! A sender that finds the table's lock held (another sender writing, or the writer lending
//! or taking back) does not wait for it: a worker thread that slept on the lock while its
//! holder's `writev` ran (or was preempted in it) would stall every task of that worker. It
//! queues its frame without the lock and then raises a flag; whoever takes the lock next
//! closes the table when the flag is up, so no later frame of that sender is written before
//! the one queued. (The writer lends only once everything queued is written, and a frame
//! queued before the flag rose keeps the writer from lending.)
//!
//! Frames that come in bursts are better written together, in one `writev`, by the writer: a
//! frame offered within [`BURST`] of the last direct write is queued (which closes the table),
//! and a writer whose last write carried more than one frame does not lend its write half (see
//! `lane::run_writer`), so a busy lane batches as before and only lanes whose frames come one
//! at a time are written directly.
//!
//! Only plain TCP is lent (a TLS write half keeps records the writer must flush); only frames
//! up to the writer's inline size and its parts' size, whole (not a piece, commit or barrier).
//! A writer whose channel's width policy ([`super::widen`]) is due takes the frames itself
//! again from the moment it is due, so that its looks at the lanes' waits keep their pace.

use std::io::IoSlice;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, TryLockError};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes};
use tokio_util::sync::CancellationToken;

use super::stream::WriteHalf;
use crate::wire::Body;

/// Most buffers of one frame written directly (its head and its payload's pieces).
const MAX_BUFS: usize = 8;
/// A frame offered this soon after the last direct write is queued instead: frames that come
/// in bursts are written together by the writer, in one `writev`, not one each.
const BURST: Duration = Duration::from_micros(50);

/// What the writer lends while it is idle.
#[derive(Default)]
pub(crate) struct Direct {
    state: Mutex<State>,
    /// A frame was queued without the lock (it was held): the next holder closes the table.
    queued_aside: AtomicBool,
}

#[derive(Default)]
struct State {
    /// The write half, while lent.
    sock: Option<WriteHalf>,
    /// Its connection's end and the other end's end of writing: once either fires, nothing
    /// more is written on it (the writer learns of it a moment later, from its flags).
    ends: Option<[CancellationToken; 2]>,
    /// Whether senders may write: lent and nothing queued since.
    open: bool,
    /// The largest frame (head and payload) written directly.
    max: usize,
    /// From then on frames go to the writer (its width policy is due).
    until: Option<Instant>,
    /// The rest of a frame the socket took in part.
    rest: Option<Rest>,
    /// When the last frame was written here.
    last: Option<Instant>,
}

/// The rest of a frame a sender began to write.
pub(crate) struct Rest {
    /// The bytes not written yet, in order.
    pub chunks: Vec<Bytes>,
}

/// What became of a frame offered to the table.
pub(crate) enum Offered<T> {
    /// Written whole (that many bytes).
    Written(usize),
    /// Written in part (that many bytes); the writer is to be woken to write the rest.
    Begun(usize),
    /// Queued: what the queuing returned.
    Queued(T),
}

impl Direct {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Offers a frame (`now` read only when the table is open): written here when the table
    /// is open, the frame whole and small enough, not in a burst, and the socket takes at
    /// least part of it now; else it is given to `queue`, under the table's lock (which it
    /// closes), or without it when another holds it (the next holder closes the table).
    /// `whole`: not a piece, commit or barrier.
    pub(crate) fn offer<T>(
        &self,
        head: Bytes,
        payload: Body,
        whole: bool,
        now: impl FnOnce() -> Instant,
        queue: impl FnOnce(Bytes, Body) -> T,
    ) -> Offered<T> {
        let mut st = match self.state.try_lock() {
            Ok(st) => st,
            Err(TryLockError::Poisoned(e)) => e.into_inner(),
            Err(TryLockError::WouldBlock) => {
                // Queued first, flagged after: a lender that does not see the flag yet sees
                // the frame in the queue and keeps the write half.
                let queued = queue(head, payload);
                self.queued_aside.store(true, Ordering::Release);
                return Offered::Queued(queued);
            }
        };
        if self.queued_aside.swap(false, Ordering::Acquire) {
            st.open = false;
        }
        if st.open && whole {
            match st.try_write(&head, &payload, now()) {
                Tried::Written(n) => return Offered::Written(n),
                Tried::Begun(n, rest) => {
                    st.rest = Some(rest);
                    st.open = false;
                    return Offered::Begun(n);
                }
                Tried::No => {}
            }
        }
        st.open = false;
        Offered::Queued(queue(head, payload))
    }

    /// Lends `writer`'s plain write half when `queue_empty` says nothing is queued (asked
    /// under the lock, so that nothing is queued in between) and its connection has not ended
    /// (`ends`: the connection's end, the other end's end of writing): frames up to `max`
    /// bytes are then written by their senders, until `until` when given. Returns whether it
    /// was lent.
    pub(crate) fn lend(
        &self,
        writer: &mut Option<WriteHalf>,
        ends: [&CancellationToken; 2],
        max: usize,
        until: Option<Instant>,
        queue_empty: impl FnOnce() -> bool,
    ) -> bool {
        if !matches!(writer, Some(WriteHalf::Plain(_))) {
            return false;
        }
        let mut st = self.lock();
        if ends.iter().any(|t| t.is_cancelled()) || !queue_empty() {
            return false;
        }
        st.ends = Some(ends.map(CancellationToken::clone));
        st.sock = writer.take();
        st.open = true;
        st.max = max;
        st.until = until;
        true
    }

    /// Takes the write half back into `writer` (closing the table), with the rest of a frame
    /// a sender began, if any.
    pub(crate) fn reclaim(&self, writer: &mut Option<WriteHalf>) -> Option<Rest> {
        let mut st = self.lock();
        st.open = false;
        st.ends = None;
        if let Some(w) = st.sock.take() {
            *writer = Some(w);
        }
        st.rest.take()
    }
}

enum Tried {
    Written(usize),
    Begun(usize, Rest),
    No,
}

impl State {
    fn try_write(&mut self, head: &Bytes, payload: &Body, now: Instant) -> Tried {
        let len = head.len() + payload.len();
        if len > self.max {
            return Tried::No;
        }
        if self.until.is_some_and(|t| now >= t)
            || self
                .last
                .is_some_and(|t| now.saturating_duration_since(t) < BURST)
            || self.ends.iter().flatten().any(|t| t.is_cancelled())
        {
            return Tried::No;
        }
        self.last = Some(now);
        let Some(WriteHalf::Plain(sock)) = &self.sock else {
            return Tried::No;
        };
        let mut slices = [IoSlice::new(&[]); MAX_BUFS];
        let mut n = 0;
        for b in std::iter::once(head).chain(payload.bufs()) {
            if b.is_empty() {
                continue;
            }
            let Some(slot) = slices.get_mut(n) else {
                return Tried::No;
            };
            *slot = IoSlice::new(b);
            n += 1;
        }
        match sock.try_write_vectored(&slices[..n]) {
            Ok(w) if w == len => Tried::Written(w),
            Ok(0) | Err(_) => {
                // Would block, or the connection failed: the writer deals with it (its
                // connection's end reaches it through its flags).
                Tried::No
            }
            Ok(w) => Tried::Begun(
                w,
                rest_after(std::iter::once(head).chain(payload.bufs()), w),
            ),
        }
    }
}

/// What is left of `bufs`, written back to back, once `written` bytes of them are out.
fn rest_after<'a>(bufs: impl Iterator<Item = &'a Bytes>, written: usize) -> Rest {
    let mut skip = written;
    let mut chunks = Vec::new();
    for b in bufs {
        if skip >= b.len() {
            skip -= b.len();
            continue;
        }
        let mut b = b.clone();
        b.advance(skip);
        skip = 0;
        chunks.push(b);
    }
    Rest { chunks }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpStream};

    /// A connected pair: the write half to lend and the other end's stream.
    async fn pair() -> (Option<WriteHalf>, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        let (_read, write) = client.into_split();
        // The read half is dropped: the write half alone keeps the connection open.
        (Some(WriteHalf::Plain(write)), server)
    }

    fn frame(byte: u8, len: usize) -> (Bytes, Body) {
        (
            Bytes::from(vec![byte; 2]),
            Bytes::from(vec![byte; len]).into(),
        )
    }

    /// The table is open only while lent and until something is queued; frames in a burst,
    /// pieces and frames above the size are queued (under the lock, which closes the table);
    /// what the sender wrote arrives, and the writer gets its write half back.
    /// A sender that finds the lock held queues its frame without waiting, and the table is
    /// closed from then on: its next frame is queued behind it, not written before it.
    #[tokio::test]
    async fn a_frame_queued_while_the_lock_is_held_closes_the_table() {
        let (mut writer, _server) = pair().await;
        let direct = Direct::default();
        let (cancel, ended) = (CancellationToken::new(), CancellationToken::new());
        assert!(direct.lend(&mut writer, [&cancel, &ended], 100, None, || true));
        let t0 = Instant::now();
        let queued = |h: Bytes, _| h[0];
        let held = direct.lock();
        let (h, p) = frame(1, 10);
        assert!(
            matches!(direct.offer(h, p, true, || t0, queued), Offered::Queued(1)),
            "queued while the lock is held"
        );
        drop(held);
        let (h, p) = frame(2, 10);
        let later = t0 + BURST * 4;
        assert!(
            matches!(
                direct.offer(h, p, true, || later, queued),
                Offered::Queued(2)
            ),
            "behind the frame queued aside"
        );
        assert!(direct.reclaim(&mut writer).is_none());
        assert!(writer.is_some());
    }

    #[tokio::test]
    async fn senders_write_while_the_table_is_open_and_queue_once_it_closes() {
        let (mut writer, mut server) = pair().await;
        let direct = Direct::default();
        let (cancel, ended) = (CancellationToken::new(), CancellationToken::new());
        let ends = [&cancel, &ended];
        let t0 = Instant::now();
        let queued = |h: Bytes, _| h[0];
        let (h, p) = frame(1, 10);
        assert!(
            matches!(direct.offer(h, p, true, || t0, queued), Offered::Queued(1)),
            "not lent"
        );

        assert!(
            !direct.lend(&mut writer, ends, 100, None, || false),
            "frames queued"
        );
        assert!(writer.is_some());
        assert!(direct.lend(&mut writer, ends, 100, None, || true));
        assert!(writer.is_none(), "lent");
        let (h, p) = frame(2, 10);
        assert!(matches!(
            direct.offer(h, p, true, || t0, queued),
            Offered::Written(12)
        ));
        let (h, p) = frame(3, 10);
        let soon = t0 + BURST / 2;
        assert!(
            matches!(
                direct.offer(h, p, true, || soon, queued),
                Offered::Queued(3)
            ),
            "in a burst"
        );
        let (h, p) = frame(4, 10);
        let later = t0 + BURST * 4;
        assert!(
            matches!(
                direct.offer(h, p, true, || later, queued),
                Offered::Queued(4)
            ),
            "closed by the frame queued"
        );
        assert!(direct.reclaim(&mut writer).is_none());
        assert!(writer.is_some(), "given back");
        let mut got = [0u8; 12];
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [2u8; 12]);

        // Lent again each time: a piece, a frame too large, a frame past the width policy's
        // time, then a frame before it.
        let mut once = |byte, len, whole, until| {
            assert!(direct.lend(&mut writer, ends, 100, Some(until), || true));
            let (h, p) = frame(byte, len);
            let offered = direct.offer(h, p, whole, || later, queued);
            direct.reclaim(&mut writer);
            offered
        };
        assert!(matches!(once(5, 10, false, later), Offered::Queued(5)));
        assert!(matches!(once(6, 99, true, later), Offered::Queued(6)));
        assert!(matches!(once(7, 10, true, later), Offered::Queued(7)));
        assert!(matches!(
            once(8, 10, true, later + BURST),
            Offered::Written(12)
        ));
        assert!(direct.lend(&mut writer, ends, 100, None, || true));
        // The connection ends: nothing more is written on it, and it is not lent again.
        cancel.cancel();
        let much_later = later + BURST * 4;
        let (h, p) = frame(9, 10);
        let offered = direct.offer(h, p, true, || much_later, queued);
        assert!(matches!(offered, Offered::Queued(9)));
        direct.reclaim(&mut writer);
        assert!(!direct.lend(&mut writer, ends, 100, None, || true));
        server.read_exact(&mut got).await.unwrap();
        assert_eq!(got, [8u8; 12]);
    }

    /// A write half that cannot take a byte now (the other end does not read) writes
    /// nothing: the frame is queued whole.
    #[tokio::test]
    async fn a_full_socket_queues_the_frame() {
        let (mut writer, _server) = pair().await;
        let Some(WriteHalf::Plain(w)) = &writer else {
            unreachable!()
        };
        let block = vec![0u8; 1 << 16];
        while w.try_write(&block).is_ok() {}
        let direct = Direct::default();
        let tokens = [CancellationToken::new(), CancellationToken::new()];
        let ends = [&tokens[0], &tokens[1]];
        assert!(direct.lend(&mut writer, ends, 100, None, || true));
        let (h, p) = frame(1, 10);
        let queued = |h: Bytes, _| h[0];
        let offered = direct.offer(h, p, true, Instant::now, queued);
        assert!(matches!(offered, Offered::Queued(1)));
        assert!(direct.reclaim(&mut writer).is_none());
    }

    #[test]
    fn the_rest_starts_where_the_write_stopped() {
        let bufs = [
            Bytes::from_static(b"abc"),
            Bytes::from_static(b"de"),
            Bytes::from_static(b"fgh"),
        ];
        let rest = |n| -> Vec<u8> {
            rest_after(bufs.iter(), n)
                .chunks
                .iter()
                .flat_map(|c| c.to_vec())
                .collect()
        };
        for n in 0..=8 {
            assert_eq!(rest(n), b"abcdefgh"[n..].to_vec(), "after {n} bytes");
        }
        assert_eq!(rest_after(bufs.iter(), 4).chunks.len(), 2);
    }
}
