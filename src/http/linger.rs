//! A lingering close: when a connection ends, stop writing, then read and discard what the
//! client still sends, for a moment, before closing.
//!
//! Requests refused before their body is read (a missing signature, a full body budget, a
//! body over the limit) leave unread bytes in the socket. Closing a socket with unread bytes
//! makes the kernel send a reset, and a reset can arrive before the client has read our
//! answer: it would see "connection reset" instead of the 400 or 503 that says what to do.
//! Draining a little first lets the answer arrive. The drain is bounded in bytes and time, and
//! reads into one small buffer, so it costs no memory per byte the client sends.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::time::Sleep;

/// At most this long is spent draining one closing connection.
const LINGER_TIME: Duration = Duration::from_secs(1);

/// At most this many bytes are drained from one closing connection.
const LINGER_BYTES: usize = 1024 * 1024;

/// A TCP stream whose shutdown lingers (see the module doc).
pub(crate) struct Lingering {
    stream: TcpStream,
    /// Set once the write side is shut: the deadline of the drain.
    draining: Option<Pin<Box<Sleep>>>,
    drained: usize,
}

impl Lingering {
    pub(crate) fn new(stream: TcpStream) -> Self {
        Lingering {
            stream,
            draining: None,
            drained: 0,
        }
    }
}

impl AsyncRead for Lingering {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Lingering {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.draining.is_none() {
            ready!(Pin::new(&mut this.stream).poll_shutdown(cx))?;
            this.draining = Some(Box::pin(tokio::time::sleep(LINGER_TIME)));
        }
        let deadline = this.draining.as_mut().expect("set above");
        let mut scratch = [0u8; 8 * 1024];
        while this.drained < LINGER_BYTES {
            if deadline.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(&mut scratch);
            match Pin::new(&mut this.stream).poll_read(cx, &mut buf) {
                Poll::Pending => return Poll::Pending,
                // End of stream or an error: the client is done, nothing is left to reset.
                Poll::Ready(Ok(())) if buf.filled().is_empty() => return Poll::Ready(Ok(())),
                Poll::Ready(Err(_)) => return Poll::Ready(Ok(())),
                Poll::Ready(Ok(())) => this.drained += buf.filled().len(),
            }
        }
        Poll::Ready(Ok(()))
    }
}
