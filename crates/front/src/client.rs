//! The client's connection: plain TCP, or TLS over it once the client asked for TLS and
//! the handshake succeeded (`ClientStream::upgrade`). The session speaks to either through
//! one type; the relay splits each its own way, so the plain path stays what it was
//! (`TcpStream::split`, no lock, no copy).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

use crate::backend::ServerStream;
use crate::relay::{relay, Relayed, Side};
use crate::tls::FrontTls;

/// The first byte of a TLS record that carries a handshake message.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// A client's connection.
#[derive(Debug)]
pub(crate) enum ClientStream {
    /// Plain text.
    Plain(TcpStream),
    /// TLS (boxed: rustls' connection state is large, and most connections are plain).
    Tls(Box<TlsStream<TcpStream>>),
    /// Neither any more: a handshake failed or was cut off, and the socket went with it.
    /// Reads end, writes fail: nothing may go to the client in plain text after the front
    /// said yes to TLS.
    Closed,
}

impl ClientStream {
    /// Runs the TLS handshake over the plain connection and goes on over TLS. On failure
    /// the connection is closed (and stays [`ClientStream::Closed`]).
    pub(crate) async fn upgrade(&mut self, tls: &FrontTls) -> std::io::Result<()> {
        let ClientStream::Plain(stream) = std::mem::replace(self, ClientStream::Closed) else {
            return Err(std::io::Error::other(
                "a TLS handshake on a connection that is not plain text",
            ));
        };
        let stream = tls.acceptor().accept(stream).await?;
        *self = ClientStream::Tls(Box::new(stream));
        Ok(())
    }

    /// Whether the client's first byte opens a TLS handshake (a handshake record, 0x16),
    /// as libpq's `sslnegotiation=direct` does instead of an SSLRequest, whose first byte
    /// (a length's) is 0. Reads nothing; waits for the first byte.
    pub(crate) async fn starts_tls(&self) -> bool {
        let ClientStream::Plain(stream) = self else {
            return false;
        };
        let mut first = [0u8; 1];
        matches!(stream.peek(&mut first).await, Ok(1) if first[0] == TLS_HANDSHAKE_RECORD)
    }

    /// Whether the TLS handshake chose ALPN protocol `postgresql`.
    pub(crate) fn speaks_postgresql(&self) -> bool {
        match self {
            ClientStream::Tls(stream) => {
                stream.get_ref().1.alpn_protocol() == Some(crate::tls::ALPN_POSTGRESQL)
            }
            ClientStream::Plain(_) | ClientStream::Closed => false,
        }
    }

    /// Whether the connection is encrypted.
    pub(crate) fn is_tls(&self) -> bool {
        matches!(self, ClientStream::Tls(_))
    }

    /// Relays between this connection and `server` until either side closes
    /// (`relay.rs`). Each side is split its own way: a TCP socket or a unix socket into
    /// borrowed halves, a TLS stream (one state for both directions) behind tokio's lock.
    pub(crate) async fn relay_with(&mut self, server: &mut ServerStream) -> Relayed {
        match (self, server) {
            (ClientStream::Plain(client), ServerStream::Tcp(server)) => {
                relay(client.split(), server.split()).await
            }
            (ClientStream::Plain(client), ServerStream::Unix(server)) => {
                relay(client.split(), server.split()).await
            }
            (ClientStream::Tls(client), ServerStream::Tcp(server)) => {
                relay(tokio::io::split(&mut **client), server.split()).await
            }
            (ClientStream::Tls(client), ServerStream::Unix(server)) => {
                relay(tokio::io::split(&mut **client), server.split()).await
            }
            // Not reached (a closed connection ends its session before the relay), and
            // nothing to relay if it were.
            (ClientStream::Closed, _) => Relayed {
                to_server: 0,
                to_client: 0,
                ended_by: Side::Client,
                error: None,
            },
        }
    }
}

/// The error of writing to a closed connection.
fn closed() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "the client's connection is closed",
    )
}

impl AsyncRead for ClientStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(stream) => Pin::new(stream).poll_read(cx, buf),
            ClientStream::Tls(stream) => Pin::new(stream.as_mut()).poll_read(cx, buf),
            ClientStream::Closed => Poll::Ready(Ok(())),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(stream) => Pin::new(stream).poll_write(cx, buf),
            ClientStream::Tls(stream) => Pin::new(stream.as_mut()).poll_write(cx, buf),
            ClientStream::Closed => Poll::Ready(Err(closed())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(stream) => Pin::new(stream).poll_flush(cx),
            ClientStream::Tls(stream) => Pin::new(stream.as_mut()).poll_flush(cx),
            ClientStream::Closed => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(stream) => Pin::new(stream).poll_shutdown(cx),
            ClientStream::Tls(stream) => Pin::new(stream.as_mut()).poll_shutdown(cx),
            ClientStream::Closed => Poll::Ready(Ok(())),
        }
    }
}
