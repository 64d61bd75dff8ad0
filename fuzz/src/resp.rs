//! The RESP2 request parser of the ring's Redis front,
//! [`maquis_ring::resp::parser::RequestParser`].
//!
//! Input: `[limits][chunking][stream…]`. `limits` picks each of the four [`Limits`] from small
//! values (so that every limit is reached by short inputs) or, when it is `0xff`, the
//! defaults; `chunking` is a [`Chunker`] parameter. The stream is parsed twice, in chunks
//! (appended to the buffer as a socket read would) and all at once. Checked:
//!
//! - no panic, and both parses give the same requests, the same error and the same leftover;
//! - no request has more arguments than `max_args` or an argument longer than the longer of
//!   `max_bulk` and `max_inline`;
//! - no call of the parser allocates more than its argument list justifies (at most
//!   `max_args` entries of a few words each) plus a little: a length field claiming up to
//!   `i64::MAX` reserves nothing;
//! - every request, encoded again as an array of bulk strings, parses back to the same
//!   arguments with the default limits.

use bytes::{Bytes, BytesMut};
use maquis_ring::resp::parser::{encode_request, Limits, RequestParser};

use crate::alloc;
use crate::chunks::Chunker;

/// The limits an input's parameter byte stands for.
pub fn limits(param: u8) -> Limits {
    if param == 0xff {
        return Limits::default();
    }
    let pick = |shift: u8, values: [usize; 4]| values[usize::from(param >> shift) & 3];
    Limits {
        max_bulk: pick(0, [0, 3, 16, 512]),
        max_args: pick(2, [1, 3, 8, 64]),
        max_inline: pick(4, [1, 8, 32, 1024]),
        max_request: pick(6, [8, 40, 256, 8192]),
    }
}

/// What one call of the parser may allocate beyond its argument list: shared-buffer
/// bookkeeping and an error message.
const SLACK: usize = 4096;

/// How parsing a stream ended.
#[derive(Debug, PartialEq, Eq)]
struct Parsed {
    requests: Vec<Vec<Bytes>>,
    error: Option<String>,
    rest: BytesMut,
    max_alloc: usize,
}

/// Calls the parser until it needs more bytes or fails; returns whether to go on.
fn drain(parser: &mut RequestParser, buf: &mut BytesMut, parsed: &mut Parsed) -> bool {
    loop {
        let (next, allocated) = alloc::measure(|| parser.next(buf));
        parsed.max_alloc = parsed.max_alloc.max(allocated);
        match next {
            Ok(Some(args)) => parsed.requests.push(args),
            Ok(None) => return true,
            Err(err) => {
                parsed.error = Some(err.to_string());
                return false;
            }
        }
    }
}

fn parse(limits: &Limits, stream: &[u8], chunker: Option<&mut Chunker>) -> Parsed {
    let mut parser = RequestParser::new(limits.clone());
    let mut parsed = Parsed {
        requests: Vec::new(),
        error: None,
        rest: BytesMut::new(),
        max_alloc: 0,
    };
    let mut buf = BytesMut::new();
    match chunker {
        None => {
            buf.extend_from_slice(stream);
            drain(&mut parser, &mut buf, &mut parsed);
        }
        Some(chunker) => {
            let mut data = stream;
            while !data.is_empty() {
                let n = chunker.next_len().min(data.len());
                buf.extend_from_slice(&data[..n]);
                data = &data[n..];
                if !drain(&mut parser, &mut buf, &mut parsed) {
                    break;
                }
            }
        }
    }
    parsed.rest = buf;
    parsed
}

/// Runs one input.
pub fn run(data: &[u8]) {
    let [param, chunking, stream @ ..] = data else {
        return;
    };
    let limits = limits(*param);
    let chunked = parse(&limits, stream, Some(&mut Chunker::new(*chunking)));
    let whole = parse(&limits, stream, None);
    assert_eq!(
        chunked.requests, whole.requests,
        "chunked and whole parses differ"
    );
    assert_eq!(
        chunked.error, whole.error,
        "chunked and whole errors differ"
    );
    if whole.error.is_none() {
        assert_eq!(
            chunked.rest, whole.rest,
            "chunked and whole leave other bytes"
        );
    }

    let bound = 64 * (limits.max_args + 16) + SLACK;
    for allocated in [chunked.max_alloc, whole.max_alloc] {
        assert!(
            allocated <= bound,
            "one call allocated {allocated} bytes with {limits:?}"
        );
    }

    let longest = limits.max_bulk.max(limits.max_inline);
    for args in &whole.requests {
        assert!(!args.is_empty(), "an empty request");
        assert!(args.len() <= limits.max_args, "{} arguments", args.len());
        for arg in args {
            assert!(arg.len() <= longest, "an argument of {} bytes", arg.len());
        }
        let refs: Vec<&[u8]> = args.iter().map(|a| &a[..]).collect();
        let mut wire = BytesMut::new();
        encode_request(&refs, &mut wire);
        let again = RequestParser::new(Limits::default())
            .next(&mut wire)
            .expect("an encoded request parses");
        assert_eq!(again.as_ref(), Some(args), "encoding changed the request");
        assert!(wire.is_empty(), "encoding left bytes over");
    }
}
