//! What ends a lane's use of its connection, as flags its writer reads without taking a lock.
//!
//! A writer waits for frames and, at the same time, for its connection to be cancelled
//! (replaced, failed, its peer dropped), for the other end to finish writing, and for its peer
//! to be closed. Waiting on those cancellation tokens directly registers with each of them (a
//! mutex apiece) every time the writer waits for a batch: a lane with one frame per wake-up
//! paid that for every frame. Instead a small task per connection ([`Watch::start`]) waits on the
//! tokens once and raises a flag; the writer's wait is an atomic load and a waker registration.
//! A flag is raised a moment after its token fires, so before taking a batch the writer still
//! looks at its connection's two tokens themselves (`run_writer`): two locks per batch, where
//! the waits cost a dozen.

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::task::Poll;

use futures::task::AtomicWaker;
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

/// The connection was cancelled, or its peer aborted.
pub(crate) const CANCELLED: u8 = 1;
/// The other end finished writing on the connection.
pub(crate) const ENDED: u8 = 2;
/// The peer is being closed gracefully.
pub(crate) const CLOSING: u8 = 4;

struct Flags {
    raised: AtomicU8,
    waker: AtomicWaker,
}

impl Flags {
    fn raise(&self, flag: u8) {
        self.raised.fetch_or(flag, Ordering::AcqRel);
        self.waker.wake();
    }
}

/// The flags of one connection while a writer uses it; dropping it stops the task that
/// raises them.
pub(crate) struct Watch {
    flags: Arc<Flags>,
    task: AbortHandle,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The tokens a [`Watch`] turns into flags.
pub(crate) struct Tokens {
    /// Raises [`CANCELLED`].
    pub cancel: CancellationToken,
    /// The peer's abort: raises [`CANCELLED`] too.
    pub abort: CancellationToken,
    /// Raises [`ENDED`].
    pub ended: CancellationToken,
    /// The peer's graceful close: raises [`CLOSING`].
    pub close: CancellationToken,
}

impl Watch {
    /// Starts watching (in a task of its own; call it inside the runtime).
    pub(crate) fn start(t: Tokens) -> Watch {
        let flags = Arc::new(Flags {
            raised: AtomicU8::new(0),
            waker: AtomicWaker::new(),
        });
        let f = flags.clone();
        let task = tokio::spawn(async move {
            let (mut ended, mut closing) = (false, false);
            loop {
                tokio::select! {
                    _ = t.cancel.cancelled() => break,
                    _ = t.abort.cancelled() => break,
                    _ = t.ended.cancelled(), if !ended => { ended = true; f.raise(ENDED) }
                    _ = t.close.cancelled(), if !closing => { closing = true; f.raise(CLOSING) }
                }
            }
            f.raise(CANCELLED);
        })
        .abort_handle();
        Watch { flags, task }
    }

    /// The flags of `mask` raised now (0 if none), without waiting.
    pub(crate) fn now(&self, mask: u8) -> u8 {
        self.flags.raised.load(Ordering::Acquire) & mask
    }

    /// Waits until a flag of `mask` is raised; returns those of `mask` that are.
    pub(crate) fn raised(&self, mask: u8) -> impl Future<Output = u8> + '_ {
        std::future::poll_fn(move |cx| {
            let now = self.flags.raised.load(Ordering::Acquire) & mask;
            if now != 0 {
                return Poll::Ready(now);
            }
            self.flags.waker.register(cx.waker());
            // A flag raised before the registration woke nobody: look again.
            match self.flags.raised.load(Ordering::Acquire) & mask {
                0 => Poll::Pending,
                now => Poll::Ready(now),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn tokens() -> Tokens {
        Tokens {
            cancel: CancellationToken::new(),
            abort: CancellationToken::new(),
            ended: CancellationToken::new(),
            close: CancellationToken::new(),
        }
    }

    async fn soon(w: &Watch, mask: u8) -> Option<u8> {
        tokio::time::timeout(Duration::from_secs(5), w.raised(mask))
            .await
            .ok()
    }

    #[tokio::test]
    async fn each_token_raises_its_flag() {
        let t = tokens();
        let (ended, close, cancel) = (t.ended.clone(), t.close.clone(), t.cancel.clone());
        let w = Watch::start(t);
        let quiet = tokio::time::timeout(Duration::from_millis(20), w.raised(0xff)).await;
        assert!(quiet.is_err(), "nothing raised yet");
        ended.cancel();
        assert_eq!(soon(&w, ENDED | CANCELLED).await, Some(ENDED));
        close.cancel();
        assert_eq!(soon(&w, CLOSING).await, Some(CLOSING));
        // A mask without the raised flags still waits.
        cancel.cancel();
        assert_eq!(soon(&w, CANCELLED).await, Some(CANCELLED));
        assert_eq!(soon(&w, 0xff).await, Some(CANCELLED | ENDED | CLOSING));
    }

    #[tokio::test]
    async fn the_peers_abort_cancels() {
        let t = tokens();
        let abort = t.abort.clone();
        let w = Watch::start(t);
        abort.cancel();
        assert_eq!(soon(&w, CANCELLED).await, Some(CANCELLED));
    }

    #[tokio::test]
    async fn dropping_the_watch_ends_its_task() {
        let t = tokens();
        let cancel = t.cancel.clone();
        let w = Watch::start(t);
        let task = w.task.clone();
        drop(w);
        for _ in 0..100 {
            if task.is_finished() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(task.is_finished(), "the watcher outlived its watch");
        drop(cancel);
    }
}
