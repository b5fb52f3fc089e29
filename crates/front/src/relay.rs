//! Relaying a connection once it is ready for queries: bytes both ways, unread, until either
//! side closes, counting what went each way for the close's log line.
//!
//! Not `tokio::io::copy_bidirectional`: that passes one side's end on to the other and waits
//! for the other to end too, and a server running `pg_sleep(30)` for a client that was killed
//! reads nothing, so it would notice only when the query ends; the lease would be held that
//! long. The protocol has no half-closed state worth keeping: a client that stops sending
//! has left. So the first side to end ends the relay, and the caller drops both connections
//! (the release that follows ends the server's session).

use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What a relay moved, and how it ended.
#[derive(Debug)]
pub(crate) struct Relayed {
    /// Bytes from the client to the server.
    pub(crate) to_server: u64,
    /// Bytes from the server to the client.
    pub(crate) to_client: u64,
    /// Which side ended it.
    pub(crate) ended_by: Side,
    /// The error that ended it, if it was not a side closing.
    pub(crate) error: Option<std::io::Error>,
}

/// One end of a relay.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Side {
    /// The client.
    Client,
    /// The server.
    Server,
}

impl Side {
    /// Its name in the log.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
        }
    }
}

/// Copies both ways, each direction on its own so that neither waits for the other, until
/// either side closes or fails.
pub(crate) async fn relay<CR, CW, SR, SW>(client: (CR, CW), server: (SR, SW)) -> Relayed
where
    CR: AsyncRead + Unpin,
    CW: AsyncWrite + Unpin,
    SR: AsyncRead + Unpin,
    SW: AsyncWrite + Unpin,
{
    let (mut client_read, mut client_write) = (Counted::new(client.0), client.1);
    let (mut server_read, mut server_write) = (Counted::new(server.0), server.1);
    let (ended_by, outcome) = tokio::select! {
        outcome = tokio::io::copy(&mut client_read, &mut server_write) => (Side::Client, outcome),
        outcome = tokio::io::copy(&mut server_read, &mut client_write) => (Side::Server, outcome),
    };
    Relayed {
        to_server: client_read.read,
        to_client: server_read.read,
        ended_by,
        error: outcome.err(),
    }
}

/// A reader that counts the bytes read from it: `tokio::io::copy` tells its count only when
/// it ends without an error, and the direction that did not end tells none.
struct Counted<T> {
    inner: T,
    read: u64,
}

impl<T> Counted<T> {
    fn new(inner: T) -> Self {
        Counted { inner, read: 0 }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        this.read += (buf.filled().len() - before) as u64;
        polled
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn bytes_go_both_ways_until_the_client_leaves_and_are_counted() {
        let (client, mut client_far) = tokio::io::duplex(64);
        let (server, mut server_far) = tokio::io::duplex(64);
        let relaying =
            tokio::spawn(
                async move { relay(tokio::io::split(client), tokio::io::split(server)).await },
            );
        client_far.write_all(b"query").await.expect("write");
        let mut got = [0u8; 5];
        server_far.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"query");
        server_far.write_all(b"answer!").await.expect("write");
        let mut got = [0u8; 7];
        client_far.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"answer!");
        // The client leaves while the server says nothing (a query still running): the
        // relay ends at once, and the server's connection is closed with it.
        drop(client_far);
        let relayed = relaying.await.expect("join");
        assert_eq!((relayed.to_server, relayed.to_client), (5, 7));
        assert_eq!(relayed.ended_by, Side::Client);
        assert!(relayed.error.is_none());
        let mut rest = Vec::new();
        server_far.read_to_end(&mut rest).await.expect("read");
        assert!(rest.is_empty());
    }

    /// A client that reads nothing while its server sends without end (a large result it
    /// does not fetch) holds the server back: the relay reads from the server only as
    /// fast as the client takes, so what sits in the front is bounded by the copy's buffer,
    /// not by what the server has to send. The other direction flows meanwhile, and
    /// nothing is lost once the client reads again.
    #[tokio::test(start_paused = true)]
    async fn a_client_that_reads_nothing_holds_its_server_back_and_the_front_buffers_little() {
        // Each pipe holds this much; `tokio::io::copy` holds at most its 8 KiB buffer.
        const PIPE: usize = 1024;
        const COPY_BUFFER: usize = 8 * 1024;
        let (client, mut client_far) = tokio::io::duplex(PIPE);
        let (server, mut server_far) = tokio::io::duplex(PIPE);
        let relaying =
            tokio::spawn(
                async move { relay(tokio::io::split(client), tokio::io::split(server)).await },
            );
        // The server writes until it cannot: the relay has stopped reading from it. (Paused
        // time: a write still pending when nothing else can run times out at once.)
        let chunk = [7u8; 1024];
        let mut sent = 0;
        while let Ok(written) =
            tokio::time::timeout(Duration::from_secs(1), server_far.write(&chunk)).await
        {
            sent += written.expect("the relay's end is open");
            assert!(
                sent <= 64 * COPY_BUFFER,
                "the relay took {sent} bytes its client never read"
            );
        }
        assert!(
            sent <= 2 * PIPE + COPY_BUFFER,
            "the front holds {sent} bytes for a client that reads nothing"
        );
        // Meanwhile the client's bytes still reach the server.
        client_far.write_all(b"X").await.expect("write");
        let mut got = [0u8; 1];
        server_far.read_exact(&mut got).await.expect("read");
        assert_eq!(&got, b"X");
        // The client reads at last: every byte arrives, and the server may send again.
        let mut got = vec![0u8; sent];
        client_far.read_exact(&mut got).await.expect("read");
        assert!(got.iter().all(|&b| b == 7));
        server_far.write_all(&chunk).await.expect("write");
        let mut got = vec![0u8; chunk.len()];
        client_far.read_exact(&mut got).await.expect("read");
        drop(client_far);
        let relayed = relaying.await.expect("join");
        assert_eq!(relayed.to_client, (sent + chunk.len()) as u64);
        assert_eq!(relayed.to_server, 1);
    }

    #[tokio::test]
    async fn the_server_closing_ends_the_relay_too() {
        let (client, _client_far) = tokio::io::duplex(64);
        let (server, server_far) = tokio::io::duplex(64);
        drop(server_far);
        let relayed = relay(tokio::io::split(client), tokio::io::split(server)).await;
        assert_eq!(relayed.ended_by, Side::Server);
    }
}
