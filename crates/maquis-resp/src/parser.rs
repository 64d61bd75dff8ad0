//! An incremental RESP2 request parser with hard limits.
//!
//! Requests are either arrays of bulk strings (`*2\r\n$3\r\nGET\r\n$1\r\nk\r\n`) or inline
//! commands (`PING\r\n`). The parser keeps its place between calls, so a request arriving in
//! many reads is scanned once. It never allocates from a length field: bulk data is sliced
//! out of the input buffer once it has arrived, the argument list grows as arguments arrive,
//! and every length is checked against [`Limits`] before anything waits for it.

use bytes::{Bytes, BytesMut};
use thiserror::Error;

/// Bounds on what a client may send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Largest bulk string (a key or a value), in bytes. Default 16 MiB.
    pub max_bulk: usize,
    /// Most arguments in one request. Default 65,536.
    pub max_args: usize,
    /// Longest inline command or header line, in bytes. Default 64 KiB.
    pub max_inline: usize,
    /// Largest request in all, in bytes. Default 64 MiB.
    pub max_request: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk: 16 * 1024 * 1024,
            max_args: 65_536,
            max_inline: 64 * 1024,
            max_request: 64 * 1024 * 1024,
        }
    }
}

/// A request the parser cannot accept; the connection is answered `-ERR Protocol error: …` and
/// closed, as Redis does (the rest of the stream cannot be framed any more).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("Protocol error: {0}")]
pub struct ProtocolError(pub String);

fn err<T>(what: impl Into<String>) -> Result<T, ProtocolError> {
    Err(ProtocolError(what.into()))
}

#[derive(Debug)]
enum State {
    Idle,
    /// Inside an array of `expected` bulk strings: `args` are (start, end) offsets into the
    /// buffer of those parsed so far, `pos` is where the next one starts.
    Array {
        expected: usize,
        args: Vec<(usize, usize)>,
        pos: usize,
    },
}

/// The parser of one connection.
#[derive(Debug)]
pub struct RequestParser {
    limits: Limits,
    state: State,
    /// In the idle state, how many bytes at the front of the buffer are known to hold no
    /// line end yet: a header or inline line that arrives a byte at a time is scanned once,
    /// not again from its start on every read.
    scanned: usize,
    /// Bytes looked at while searching for line ends (for the tests of linearity).
    #[cfg(test)]
    examined: usize,
}

/// Finds `\r\n` in `buf[from..]`, looking at most `limit` bytes; the index of `\r`.
fn find_crlf(buf: &[u8], from: usize, limit: usize) -> Option<usize> {
    let end = buf.len().min(from.saturating_add(limit));
    if from >= end {
        return None;
    }
    buf[from..end]
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|i| from + i)
}

fn parse_int(digits: &[u8]) -> Option<i64> {
    if digits.is_empty() || digits.len() > 19 {
        return None;
    }
    let (neg, rest) = match digits[0] {
        b'-' => (true, &digits[1..]),
        _ => (false, digits),
    };
    if rest.is_empty() || !rest.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let v: i64 = std::str::from_utf8(rest).ok()?.parse().ok()?;
    Some(if neg { -v } else { v })
}

impl RequestParser {
    /// A parser with the given limits.
    pub fn new(limits: Limits) -> Self {
        RequestParser {
            limits,
            state: State::Idle,
            scanned: 0,
            #[cfg(test)]
            examined: 0,
        }
    }

    /// Where the next line end is in `buf` (the index of `\n`), looking at most `limit`
    /// bytes from the start and never again at bytes already searched.
    fn line_end(&mut self, buf: &[u8], limit: usize) -> Option<usize> {
        let end = buf.len().min(limit);
        let from = self.scanned.min(end);
        #[cfg(test)]
        {
            self.examined += end - from;
        }
        match buf[from..end].iter().position(|&b| b == b'\n') {
            Some(i) => {
                self.scanned = 0;
                Some(from + i)
            }
            None => {
                self.scanned = end;
                None
            }
        }
    }

    /// Parses the next request at the front of `buf`. `Ok(Some(args))` removes it from
    /// `buf`; `Ok(None)` means more bytes are needed (keep `buf` and call again after
    /// reading). After an `Err` the connection must be closed.
    pub fn next(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        loop {
            match &mut self.state {
                State::Idle => {
                    if buf.is_empty() {
                        return Ok(None);
                    }
                    if buf[0] != b'*' {
                        match self.inline(buf)? {
                            None => return Ok(None),
                            Some(args) if args.is_empty() => continue,
                            Some(args) => return Ok(Some(args)),
                        }
                    }
                    let limit = self.limits.max_inline.saturating_add(2);
                    let Some(nl) = self.line_end(buf, limit) else {
                        if buf.len() > self.limits.max_inline {
                            return err("too big mbulk count string");
                        }
                        return Ok(None);
                    };
                    if nl < 2 || buf[nl - 1] != b'\r' {
                        return err("invalid multibulk length");
                    }
                    let cr = nl - 1;
                    let Some(n) = parse_int(&buf[1..cr]) else {
                        return err("invalid multibulk length");
                    };
                    if n > self.limits.max_args as i64 {
                        return err("invalid multibulk length");
                    }
                    if n <= 0 {
                        // An empty or null array is no command; Redis skips it too.
                        let _ = buf.split_to(cr + 2);
                        continue;
                    }
                    self.state = State::Array {
                        expected: n as usize,
                        args: Vec::with_capacity((n as usize).min(16)),
                        pos: cr + 2,
                    };
                }
                State::Array {
                    expected,
                    args,
                    pos,
                } => {
                    while args.len() < *expected {
                        if buf.len() <= *pos {
                            return Ok(None);
                        }
                        if buf[*pos] != b'$' {
                            return err(format!(
                                "expected '$', got '{}'",
                                (buf[*pos] as char).escape_default()
                            ));
                        }
                        let Some(cr) = find_crlf(buf, *pos + 1, 32) else {
                            if buf.len() - *pos > 32 {
                                return err("invalid bulk length");
                            }
                            return Ok(None);
                        };
                        let len = match parse_int(&buf[*pos + 1..cr]) {
                            Some(l) if l >= 0 && l as u64 <= self.limits.max_bulk as u64 => {
                                l as usize
                            }
                            _ => return err("invalid bulk length"),
                        };
                        let start = cr + 2;
                        let end = start + len;
                        if end + 2 > self.limits.max_request {
                            return err("request too large");
                        }
                        if buf.len() < end + 2 {
                            return Ok(None);
                        }
                        if &buf[end..end + 2] != b"\r\n" {
                            return err("bulk string not terminated by CRLF");
                        }
                        args.push((start, end));
                        *pos = end + 2;
                    }
                    let frame = buf.split_to(*pos).freeze();
                    let out = args.iter().map(|&(s, e)| frame.slice(s..e)).collect();
                    self.state = State::Idle;
                    return Ok(Some(out));
                }
            }
        }
    }

    /// An inline command: one line, arguments separated by spaces. `Some(empty)` for a blank
    /// line (skipped).
    fn inline(&mut self, buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
        let Some(nl) = self.line_end(buf, self.limits.max_inline + 1) else {
            if buf.len() > self.limits.max_inline {
                return err("too big inline request");
            }
            return Ok(None);
        };
        let line = buf.split_to(nl + 1).freeze();
        let mut body = line.slice(..nl);
        if body.last() == Some(&b'\r') {
            body = body.slice(..body.len() - 1);
        }
        let mut args = Vec::new();
        let mut i = 0;
        while i < body.len() {
            while i < body.len() && body[i].is_ascii_whitespace() {
                i += 1;
            }
            let start = i;
            while i < body.len() && !body[i].is_ascii_whitespace() {
                i += 1;
            }
            if i > start {
                if args.len() >= self.limits.max_args {
                    return err("too many arguments");
                }
                args.push(body.slice(start..i));
            }
        }
        Ok(Some(args))
    }
}

/// Encodes a request as a RESP array of bulk strings (what clients send).
pub fn encode_request(args: &[&[u8]], out: &mut BytesMut) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_all(input: &[u8]) -> (Vec<Vec<Bytes>>, Option<ProtocolError>, usize) {
        let mut p = RequestParser::new(Limits::default());
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        loop {
            match p.next(&mut buf) {
                Ok(Some(a)) => out.push(a),
                Ok(None) => return (out, None, buf.len()),
                Err(e) => return (out, Some(e), buf.len()),
            }
        }
    }

    #[test]
    fn arrays_inline_and_pipelines() {
        let (reqs, e, rest) =
            parse_all(b"*1\r\n$4\r\nPING\r\nPING\r\n\r\n*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*0\r\n");
        assert!(e.is_none());
        assert_eq!(rest, 0);
        assert_eq!(reqs.len(), 3);
        assert_eq!(reqs[2], vec![Bytes::from("GET"), Bytes::from("k")]);
        let (reqs, _, rest) = parse_all(b"*2\r\n$3\r\nGET\r\n$5\r\nab");
        assert!(reqs.is_empty());
        assert_eq!(rest, 19);
    }

    #[test]
    fn limits_and_garbage() {
        for bad in [
            &b"*99999999999\r\n"[..],
            b"*2\r\n$999999999999\r\n",
            b"*1\r\n$-5\r\n",
            b"*1\r\n:12\r\n",
            b"*x\r\n",
            b"*1\r\n$3\r\nabcd\r\n",
        ] {
            let (_, e, _) = parse_all(bad);
            assert!(e.is_some(), "{:?}", String::from_utf8_lossy(bad));
        }
        let mut long = vec![b'a'; 70 * 1024];
        long.push(b'\n');
        assert!(parse_all(&long).1.is_some());
    }

    #[test]
    fn a_line_arriving_a_byte_at_a_time_is_scanned_once() {
        for head in [&b"SET k "[..], b"*"] {
            let mut p = RequestParser::new(Limits::default());
            let mut buf = BytesMut::new();
            buf.extend_from_slice(head);
            let n = 60 * 1024;
            for _ in 0..n {
                buf.extend_from_slice(b"1");
                assert_eq!(p.next(&mut buf), Ok(None));
            }
            // Linear: each byte looked at about once, not n²/2 times.
            assert!(
                p.examined < 2 * (n + head.len()),
                "{} bytes looked at",
                p.examined
            );
        }
        // The line ends: the request is there.
        let mut p = RequestParser::new(Limits::default());
        let mut buf = BytesMut::from(&b"PIN"[..]);
        assert_eq!(p.next(&mut buf), Ok(None));
        buf.extend_from_slice(b"G\r\n*1\r");
        assert_eq!(p.next(&mut buf), Ok(Some(vec![Bytes::from("PING")])));
        assert_eq!(p.next(&mut buf), Ok(None));
        buf.extend_from_slice(b"\n$4\r\nPING\r\n");
        assert_eq!(p.next(&mut buf), Ok(Some(vec![Bytes::from("PING")])));
    }

    #[test]
    fn byte_by_byte_is_the_same() {
        let mut wire = BytesMut::new();
        encode_request(&[b"SET", b"key", b"va\r\nlue"], &mut wire);
        encode_request(&[b"GET", b""], &mut wire);
        let mut p = RequestParser::new(Limits::default());
        let mut buf = BytesMut::new();
        let mut got = Vec::new();
        for b in wire.iter() {
            buf.extend_from_slice(&[*b]);
            while let Some(a) = p.next(&mut buf).unwrap() {
                got.push(a);
            }
        }
        assert_eq!(got.len(), 2);
        assert_eq!(got[0][2], Bytes::from_static(b"va\r\nlue"));
        assert_eq!(got[1][1], Bytes::new());
    }
}
