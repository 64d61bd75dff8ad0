//! [`Body`]: a frame's payload as one or several buffers, written one after the other.
//!
//! An encoded message is usually one buffer. A message carrying a large byte string (a
//! `Payload`) is instead encoded around it: the bytes before it, the byte string itself (the
//! sender's own buffer, not a copy) and the bytes after it. The writer hands the buffers to
//! one vectored write; on the wire they are one payload, and the receiver cannot tell.

use std::ops::Range;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

/// A payload made of buffers that go out back to back. Cloning shares the buffers.
#[derive(Clone, Debug, Default)]
pub struct Body(Repr);

#[derive(Clone, Debug)]
enum Repr {
    One(Bytes),
    Many(Arc<[Bytes]>),
}

impl Default for Repr {
    fn default() -> Self {
        Repr::One(Bytes::new())
    }
}

impl Body {
    /// A body of the buffers `bufs`, in order (empty ones are left out).
    pub fn from_bufs(bufs: Vec<Bytes>) -> Self {
        let mut bufs: Vec<Bytes> = bufs.into_iter().filter(|b| !b.is_empty()).collect();
        match bufs.len() {
            0 => Body::default(),
            1 => Body(Repr::One(bufs.remove(0))),
            _ => Body(Repr::Many(bufs.into())),
        }
    }

    /// Its buffers, in order.
    pub fn bufs(&self) -> &[Bytes] {
        match &self.0 {
            Repr::One(b) => std::slice::from_ref(b),
            Repr::Many(v) => v,
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.bufs().iter().map(Bytes::len).sum()
    }

    /// Whether it holds no byte.
    pub fn is_empty(&self) -> bool {
        self.bufs().iter().all(Bytes::is_empty)
    }

    /// The bytes in `range` (offsets into the whole body), sharing its buffers.
    ///
    /// # Panics
    ///
    /// When `range` is not within the body, as [`Bytes::slice`] does.
    pub fn slice(&self, range: Range<usize>) -> Body {
        assert!(
            range.start <= range.end && range.end <= self.len(),
            "range {range:?} out of a body of {} bytes",
            self.len()
        );
        if let Repr::One(b) = &self.0 {
            return Body(Repr::One(b.slice(range)));
        }
        let mut out = Vec::new();
        let mut at = 0;
        for b in self.bufs() {
            let (start, end) = (at, at + b.len());
            at = end;
            let (from, to) = (range.start.max(start), range.end.min(end));
            if from < to {
                out.push(b.slice(from - start..to - start));
            }
        }
        Body::from_bufs(out)
    }

    /// The bytes as one buffer: shared when the body is one buffer, else copied.
    pub fn to_bytes(&self) -> Bytes {
        match &self.0 {
            Repr::One(b) => b.clone(),
            Repr::Many(v) => {
                let mut out = BytesMut::with_capacity(self.len());
                v.iter().for_each(|b| out.extend_from_slice(b));
                out.freeze()
            }
        }
    }
}

impl From<Bytes> for Body {
    fn from(b: Bytes) -> Self {
        Body(Repr::One(b))
    }
}

impl PartialEq for Body {
    /// Bodies are equal when their bytes are, however they are cut into buffers.
    fn eq(&self, other: &Body) -> bool {
        self.len() == other.len()
            && self
                .bufs()
                .iter()
                .flat_map(|b| b.iter())
                .eq(other.bufs().iter().flat_map(|b| b.iter()))
    }
}

impl Eq for Body {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn body_of(cuts: &[usize], data: &[u8]) -> Body {
        let mut bufs = Vec::new();
        let mut at = 0;
        for &c in cuts {
            let end = (at + c).min(data.len());
            bufs.push(Bytes::copy_from_slice(&data[at..end]));
            at = end;
        }
        bufs.push(Bytes::copy_from_slice(&data[at..]));
        Body::from_bufs(bufs)
    }

    proptest! {
        #[test]
        fn slices_are_the_bytes_of_the_range(
            data in proptest::collection::vec(any::<u8>(), 0..300),
            cuts in proptest::collection::vec(0usize..80, 0..6),
            a in 0usize..300,
            b in 0usize..300,
        ) {
            let body = body_of(&cuts, &data);
            prop_assert_eq!(body.len(), data.len());
            prop_assert_eq!(&body.to_bytes()[..], &data[..]);
            let (from, to) = (a.min(b).min(data.len()), a.max(b).min(data.len()));
            let s = body.slice(from..to);
            prop_assert_eq!(s.len(), to - from);
            prop_assert_eq!(&s.to_bytes()[..], &data[from..to]);
            prop_assert!(s.bufs().iter().all(|b| !b.is_empty()) || s.bufs().len() == 1);
        }
    }

    #[test]
    fn one_buffer_is_shared_and_empty_buffers_vanish() {
        let b = Bytes::from(vec![1u8, 2, 3]);
        let body = Body::from_bufs(vec![Bytes::new(), b.clone(), Bytes::new()]);
        assert_eq!(body.bufs().len(), 1);
        assert_eq!(body.to_bytes().as_ptr(), b.as_ptr());
        assert!(Body::from_bufs(vec![]).is_empty());
        assert_eq!(Body::from_bufs(vec![]).bufs().len(), 1);
    }

    #[test]
    #[should_panic(expected = "out of a body")]
    fn a_range_past_the_end_panics() {
        let _ = Body::from(Bytes::from_static(b"abc")).slice(1..4);
    }
}
