//! A lane's connection as bytes: plain TCP, or TLS over TCP, and its two halves.
//!
//! The handshake runs on the whole [`Stream`]; [`Stream::into_split`] then gives the reader its
//! [`ReadHalf`] and the lane's writer its [`WriteHalf`]. A plain connection splits into tokio's
//! own TCP halves (no lock, the same types as without TLS support), a TLS connection into the
//! halves of `tokio::io::split`, which share the TLS state behind a lock. Either way the
//! halves are one enum each, so the reader, the writer and their vectored writes have one code
//! path and the plain path pays one branch per call.

use std::io::IoSlice;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// A TLS connection over TCP (either role).
pub(crate) type TlsTcp = tokio_rustls::TlsStream<TcpStream>;

/// A connection, during its handshake.
pub(crate) enum Stream {
    /// Plain TCP.
    Plain(TcpStream),
    /// TLS over TCP (boxed: the TLS state is large, and the plain variant should not carry it).
    Tls(Box<TlsTcp>),
}

impl Stream {
    /// With TLS, checks that the other end's certificate names the node `name` (see
    /// [`crate::tls`]); a plain connection has no certificate to check.
    pub(crate) fn check_peer_name(&self, name: &str) -> Result<(), String> {
        match self {
            Stream::Plain(_) => Ok(()),
            Stream::Tls(s) => crate::tls::check_name(s.get_ref().1.peer_certificates(), name),
        }
    }

    /// The connection's round trip as the kernel measured it (Linux `TCP_INFO`): the smallest
    /// of its samples so far (`tcpi_min_rtt`; after a handshake, those of the handshake's
    /// messages), which a busy machine's delays in answering do not raise, or the smoothed
    /// estimate where the kernel does not give that; `None` where it says neither.
    pub(crate) fn round_trip(&self) -> Option<std::time::Duration> {
        let tcp = match self {
            Stream::Plain(s) => s,
            Stream::Tls(s) => s.get_ref().0,
        };
        round_trip(tcp)
    }

    /// The read and write halves.
    pub(crate) fn into_split(self) -> (ReadHalf, WriteHalf) {
        match self {
            Stream::Plain(s) => {
                let (r, w) = s.into_split();
                (ReadHalf::Plain(r), WriteHalf::Plain(w))
            }
            Stream::Tls(s) => {
                let (r, w) = tokio::io::split(*s);
                (ReadHalf::Tls(r), WriteHalf::Tls(w))
            }
        }
    }
}

#[cfg(all(target_os = "linux", any(target_env = "gnu", target_env = "musl")))]
fn round_trip(tcp: &TcpStream) -> Option<std::time::Duration> {
    let (info, filled) = tcp_info(tcp)?;
    // `tcpi_rtt` (µs) sits well inside what every kernel with `TCP_INFO` fills in;
    // `tcpi_min_rtt` (since Linux 4.6) only where the kernel filled that far, and `u32::MAX`
    // before a first sample.
    let min_end = std::mem::offset_of!(libc::tcp_info, tcpi_min_rtt) + 4;
    let us = Some(info.tcpi_min_rtt)
        .filter(|&m| filled >= min_end && m > 0 && m != u32::MAX)
        .unwrap_or(info.tcpi_rtt);
    (us > 0).then(|| std::time::Duration::from_micros(us.into()))
}

/// The kernel's `TCP_INFO` for the connection, and how many of its bytes the kernel filled in.
#[cfg(all(target_os = "linux", any(target_env = "gnu", target_env = "musl")))]
fn tcp_info(tcp: &TcpStream) -> Option<(libc::tcp_info, usize)> {
    use std::os::fd::AsRawFd;
    // SAFETY: `tcp_info` is plain integers, for which all zeroes is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the descriptor is an open TCP socket for the duration of the call, and the
    // kernel writes at most `len` bytes into `info`, which is that large.
    let r = unsafe {
        libc::getsockopt(
            tcp.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (r == 0).then(|| (info, usize::try_from(len).unwrap_or(0)))
}

#[cfg(not(all(target_os = "linux", any(target_env = "gnu", target_env = "musl"))))]
fn round_trip(_: &TcpStream) -> Option<std::time::Duration> {
    None
}

/// The read half of a connection.
pub(crate) enum ReadHalf {
    /// Of plain TCP.
    Plain(OwnedReadHalf),
    /// Of TLS.
    Tls(tokio::io::ReadHalf<TlsTcp>),
}

/// The write half of a connection.
pub(crate) enum WriteHalf {
    /// Of plain TCP.
    Plain(OwnedWriteHalf),
    /// Of TLS.
    Tls(tokio::io::WriteHalf<TlsTcp>),
}

impl From<OwnedWriteHalf> for WriteHalf {
    fn from(w: OwnedWriteHalf) -> Self {
        WriteHalf::Plain(w)
    }
}

/// Forwards a call to whichever variant `$self` is.
macro_rules! either {
    ($self:expr, $s:ident => $call:expr) => {
        match $self.get_mut() {
            Self::Plain($s) => {
                let $s = Pin::new($s);
                $call
            }
            Self::Tls($s) => {
                let $s = Pin::new($s);
                $call
            }
        }
    };
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        either!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        either!(self, s => s.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        either!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        either!(self, s => s.poll_shutdown(cx))
    }
}

impl AsyncRead for ReadHalf {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        either!(self, s => s.poll_read(cx, buf))
    }
}

impl AsyncWrite for WriteHalf {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        either!(self, s => s.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        either!(self, s => s.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            WriteHalf::Plain(s) => s.is_write_vectored(),
            WriteHalf::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        either!(self, s => s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        either!(self, s => s.poll_shutdown(cx))
    }
}

#[cfg(all(
    test,
    target_os = "linux",
    any(target_env = "gnu", target_env = "musl")
))]
mod tests {
    use super::*;

    /// After a connection's first bytes went and came back, the kernel has a round trip for it.
    #[tokio::test]
    async fn a_connection_that_exchanged_bytes_has_a_round_trip() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (dialed, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        let (mut a, mut b) = (dialed.unwrap(), accepted.unwrap().0);
        a.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        b.read_exact(&mut buf).await.unwrap();
        b.write_all(b"pong").await.unwrap();
        a.read_exact(&mut buf).await.unwrap();
        for s in [Stream::Plain(a), Stream::Plain(b)] {
            let rtt = s.round_trip().expect("a round trip");
            assert!(rtt < std::time::Duration::from_secs(1), "{rtt:?}");
            // The smallest sample, never above the smoothed estimate.
            let Stream::Plain(tcp) = &s else {
                unreachable!()
            };
            let (info, _) = tcp_info(tcp).expect("TCP_INFO");
            assert_eq!(rtt.as_micros(), u128::from(info.tcpi_min_rtt));
            assert!(
                info.tcpi_min_rtt <= info.tcpi_rtt,
                "{rtt:?} against {} µs",
                info.tcpi_rtt
            );
        }
    }
}
