//! The front's accept loop: one task per connection, until the daemon stops, and no more
//! connections at once than `FrontConfig::max_connections`.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::{codec, session, FrontHandle};

/// How long to wait after a failed accept (out of file descriptors, say) before the next:
/// the error would come back at once, and the loop would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);
/// How long writing the refusal to a connection beyond the cap may take.
const REFUSE_TIMEOUT: Duration = Duration::from_secs(1);

/// Serves the PostgreSQL protocol on `listener` until `shutdown` resolves, then stops
/// accepting. Connections being relayed go on until they close, or until their server stops
/// with the pools.
pub async fn serve(
    listener: TcpListener,
    front: FrontHandle,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let front = front.front;
    let slots = Arc::new(Semaphore::new(front.config.max_connections));
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => match Arc::clone(&slots).try_acquire_owned() {
                    Ok(slot) => {
                        let front = Arc::clone(&front);
                        tokio::spawn(async move {
                            session::run(front, stream, peer).await;
                            drop(slot);
                        });
                    }
                    Err(_) => {
                        let max = front.config.max_connections;
                        tracing::warn!(%peer, max, "the PostgreSQL front is full; a connection is refused");
                        tokio::spawn(refuse_full(stream, max));
                    }
                },
                Err(error) => {
                    tracing::warn!(%error, "the PostgreSQL front cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
}

/// Tells a connection beyond the cap what postgres tells one beyond `max_connections`, and
/// closes it, without reading what it sent.
async fn refuse_full(mut stream: TcpStream, max: usize) {
    let mut out = BytesMut::new();
    codec::fatal_error(
        "53300",
        &format!(
            "sorry, too many clients already: the PostgreSQL front has {max} connections \
             open (--front-max-connections)"
        ),
        &mut out,
    );
    let _ = tokio::time::timeout(REFUSE_TIMEOUT, stream.write_all(&out)).await;
}
