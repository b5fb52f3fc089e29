//! The front's accept loop: one task per connection, until the daemon stops.

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::{session, FrontHandle};

/// How long to wait after a failed accept (out of file descriptors, say) before the next:
/// the error would come back at once, and the loop would spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Serves the PostgreSQL protocol on `listener` until `shutdown` resolves, then stops
/// accepting. Connections being relayed go on until they close, or until their server stops
/// with the pools.
pub async fn serve(
    listener: TcpListener,
    front: FrontHandle,
    shutdown: impl std::future::Future<Output = ()>,
) {
    let front = front.front;
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    tokio::spawn(session::run(Arc::clone(&front), stream, peer));
                }
                Err(error) => {
                    tracing::warn!(%error, "the PostgreSQL front cannot accept a connection");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
        }
    }
}
