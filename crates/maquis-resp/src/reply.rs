//! RESP2 replies.

use bytes::{Bytes, BytesMut};

/// A reply to a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`-style status.
    Simple(&'static str),
    /// `-ERR …`-style error; the text starts with the error code (`ERR`, `NOPROTO`, …).
    Error(String),
    /// `:n`.
    Int(i64),
    /// `$len` bulk string, or the null bulk string.
    Bulk(Option<Bytes>),
    /// `*n` array.
    Array(Vec<Reply>),
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Reply {
        Reply::Simple("OK")
    }

    /// An `ERR` error.
    pub fn err(msg: impl AsRef<str>) -> Reply {
        Reply::Error(format!("ERR {}", msg.as_ref()))
    }

    /// A bulk string from text.
    pub fn text(s: impl Into<String>) -> Reply {
        Reply::Bulk(Some(Bytes::from(s.into())))
    }

    /// Appends the encoding.
    pub fn encode(&self, out: &mut BytesMut) {
        match self {
            Reply::Simple(s) => {
                out.extend_from_slice(b"+");
                out.extend_from_slice(s.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
            Reply::Error(e) => {
                out.extend_from_slice(b"-");
                // An error line cannot contain line breaks.
                for b in e.bytes() {
                    out.extend_from_slice(&[if b == b'\r' || b == b'\n' { b' ' } else { b }]);
                }
                out.extend_from_slice(b"\r\n");
            }
            Reply::Int(n) => {
                out.extend_from_slice(format!(":{n}\r\n").as_bytes());
            }
            Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
            Reply::Bulk(Some(b)) => {
                out.extend_from_slice(format!("${}\r\n", b.len()).as_bytes());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Array(items) => {
                out.extend_from_slice(format!("*{}\r\n", items.len()).as_bytes());
                for i in items {
                    i.encode(out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes() {
        let mut out = BytesMut::new();
        Reply::Array(vec![
            Reply::ok(),
            Reply::err("bad\r\nthing"),
            Reply::Int(-3),
            Reply::Bulk(None),
            Reply::text("hi"),
        ])
        .encode(&mut out);
        assert_eq!(
            &out[..],
            b"*5\r\n+OK\r\n-ERR bad  thing\r\n:-3\r\n$-1\r\n$2\r\nhi\r\n"
        );
    }
}
