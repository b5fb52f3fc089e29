//! One client connection at the front, in its own task: the start-up (`startup.rs`), over
//! TLS from the handshake on when the client asks for it and the front has it
//! (`client.rs`), the lease (or the key's shared lease, `keys.rs`), the lease's connection
//! to postgres (`backend.rs`), the relay (`relay.rs`) while the lease is renewed (its own
//! lease by the session, a key's by the key's one renewal task), and the release when
//! either side closes (for a key: when its last connection has, and the grace
//! passed). A CancelRequest is sent on (`cancel.rs`) instead. Its row in `held.rs` says
//! where it is.
//!
//! Whatever the client sends, the session ends with an ErrorResponse or a closed connection,
//! never a panic. A lease it took alone is held by a guard (`release.rs`) from the grant on:
//! the normal close releases it, and any other end — a panic, the task aborted — drops the
//! guard, which releases it all the same. A key's lease is the key's (`keys.rs`); the session
//! holds its membership, whose drop is the key's guard.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use pglease_pool::{Lease, LeaseRequest};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::backend::{self, Address, Login};
use crate::cancel::{self, CancelTarget};
use crate::client::ClientStream;
use crate::codec::{self, CancelKey, Startup};
use crate::error::{Refusal, SessionError};
use crate::held::{Stage, Tracked};
use crate::keys::{KeyName, Member};
use crate::relay::Relayed;
use crate::release::LeaseGuard;
use crate::startup::{self, Encryption, Opening};
use crate::Front;

/// How long a client may take from connecting to being authenticated: its packets are a
/// few hundred bytes, sent at once.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(10);
/// How long postgres may take to log the lease in (a SCRAM exchange takes milliseconds).
const BACKEND_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a CancelRequest may take to reach its server.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long writing an ErrorResponse to a client that reads nothing may take.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);
/// The most a client may send while its lease is made, before its connection is ready for
/// queries (drivers send nothing then).
const MAX_EARLY_BYTES: usize = 64 * 1024;
/// The shortest wait between two renewals of a connection's lease.
const MIN_RENEW_INTERVAL: Duration = Duration::from_secs(1);
/// Longest lease label, in characters (as over HTTP).
const MAX_LABEL_CHARS: usize = 256;

/// Serves one client connection to its end.
pub(crate) async fn run(front: Arc<Front>, stream: TcpStream, peer: SocketAddr) {
    // Queries are small and answered one at a time: no waiting to fill a segment.
    let _ = stream.set_nodelay(true);
    let mut client = ClientStream::Plain(stream);
    let mut buf = BytesMut::new();
    let tracked = front.connections.open(peer);
    let outcome = serve(&front, &mut client, &mut buf, peer, &tracked).await;
    if let Err(error) = &outcome {
        let mut out = BytesMut::new();
        error.answer(&mut out);
        if !out.is_empty() {
            let _ = tokio::time::timeout(ANSWER_TIMEOUT, client.write_all(&out)).await;
        }
        match error {
            // Rare from a real client, and the only trace of one that cannot connect.
            SessionError::TlsHandshake(_) | SessionError::DirectTlsRefused => {
                tracing::info!(%peer, %error, "a connection at the PostgreSQL front ended");
            }
            error if error.is_clients() => {
                tracing::debug!(%peer, %error, "a connection at the PostgreSQL front ended");
            }
            error => tracing::warn!(%peer, %error, "a connection at the PostgreSQL front failed"),
        }
    }
    // TLS ends with its close_notify, which tells the client that nothing was cut off
    // (libpq reports a bare end as an "SSL SYSCALL error"); a plain socket just closes.
    if client.is_tls() {
        let _ = tokio::time::timeout(ANSWER_TIMEOUT, client.shutdown()).await;
    }
}

/// The session's steps, up to the relay's end.
async fn serve(
    front: &Front,
    client: &mut ClientStream,
    buf: &mut BytesMut,
    peer: SocketAddr,
    tracked: &Tracked<'_>,
) -> Result<(), SessionError> {
    let opening = tokio::time::timeout(STARTUP_TIMEOUT, start(front, client, buf, tracked))
        .await
        .map_err(|_| SessionError::StartupTimeout {
            secs: STARTUP_TIMEOUT.as_secs(),
        })??;
    let startup = match opening {
        Opening::Cancel(key) => {
            send_cancel(front, key, peer).await;
            return Ok(());
        }
        Opening::Startup(startup) => startup,
        // `start` answers the one TLS negotiation there may be.
        Opening::Tls => {
            return Err(SessionError::Refused(Refusal::protocol(
                "encryption negotiated twice",
            )))
        }
    };
    let (request, key) = lease_request(front, &startup)?;
    let template = request.template.clone();
    let key_name = key.as_ref().map(ToString::to_string);
    tracked.update(|row| {
        row.stage = Stage::Leasing;
        row.template = Some(template.clone());
        row.key = key_name.clone();
    });
    // A connection to a key shares the key's lease; it is released a grace after the last
    // of the key's connections closes (`keys.rs`), not with this one.
    let member = key.map(|key| front.keys.join(key));
    // Who releases the lease: the guard, made with no await between the grant and it, so
    // that no end of the task leaves the lease behind; or the key, through the membership.
    let (lease, holder) = match member {
        None => {
            let lease = wait_for_lease(front, client, buf, request).await?;
            let guard = LeaseGuard::new(front.servers.clone(), lease.id.clone());
            (lease, Holder::Alone(guard))
        }
        Some(member) => {
            let lease = member
                .lease(wait_for_lease(front, client, buf, request))
                .await?;
            (lease, Holder::Key(member))
        }
    };
    tracked.update(|row| {
        row.stage = Stage::Relaying;
        row.lease_id = Some(lease.id.clone());
        row.database = Some(lease.connect.database.clone());
    });
    tracing::info!(
        %peer,
        %template,
        key = key_name.as_deref(),
        lease_id = %lease.id,
        database = %lease.connect.database,
        tls = client.is_tls(),
        "leased at the PostgreSQL front"
    );
    let started = Instant::now();
    // A lease of its own is renewed by the session's relay; a key's by the key's one
    // renewal task (`keys/shared.rs`), however many connections use it.
    let renew = matches!(holder, Holder::Alone(_));
    let relayed = connect_and_relay(front, client, buf, &lease, &startup, renew).await;
    let released = match holder {
        // Released as an HTTP release without `reuse` is: dropped, or back to the pool when
        // the server proves it unchanged.
        Holder::Alone(guard) => {
            guard.release().await;
            "its lease is released"
        }
        Holder::Key(member) => {
            drop(member);
            "the key's lease stays while another connection uses it"
        }
    };
    let relayed = relayed?;
    tracing::info!(
        lease_id = %lease.id,
        bytes_to_server = relayed.to_server,
        bytes_to_client = relayed.to_client,
        elapsed_ms = started.elapsed().as_millis() as u64,
        ended_by = relayed.ended_by.name(),
        error = relayed.error.as_ref().map(tracing::field::display),
        "a connection at the PostgreSQL front closed; {released}"
    );
    Ok(())
}

/// What releases a session's lease when the session ends, however it ends.
#[derive(Debug)]
enum Holder {
    /// A lease of its own, released by the guard.
    Alone(LeaseGuard),
    /// The key's lease: leaving the key is the session's part, the release the key's.
    Key(Member),
}

/// The start-up up to an authenticated client (or a CancelRequest), over TLS from the
/// handshake on when the client asks for it and the front has it.
async fn start(
    front: &Front,
    client: &mut ClientStream,
    buf: &mut BytesMut,
    tracked: &Tracked<'_>,
) -> Result<Opening, SessionError> {
    let tls = front.config.tls.as_ref();
    let encryption = match tls {
        Some(_) => Encryption::Offered,
        None => Encryption::Refused,
    };
    // libpq 17's `sslnegotiation=direct`: the handshake at once, without an SSLRequest.
    let direct = client.starts_tls().await;
    let mut opening = match (direct, tls) {
        (false, _) => startup::read_opening(client, buf, encryption).await?,
        (true, None) => return Err(SessionError::DirectTlsRefused),
        (true, Some(_)) => Opening::Tls,
    };
    if let (Opening::Tls, Some(tls)) = (&opening, tls) {
        client
            .upgrade(tls)
            .await
            .map_err(SessionError::TlsHandshake)?;
        tracked.update(|row| row.tls = true);
        // Postgres' rule: a direct handshake must name the protocol (ALPN `postgresql`),
        // so that no other TLS client's bytes are taken for a start-up.
        if direct && !client.speaks_postgresql() {
            return Err(SessionError::Refused(Refusal::protocol(
                "received direct SSL connection request without ALPN protocol negotiation \
                 extension",
            )));
        }
        // The client starts over, encrypted: a StartupMessage or a CancelRequest.
        opening = startup::read_opening(client, buf, Encryption::Established).await?;
    }
    let startup = match opening {
        Opening::Startup(startup) => startup,
        other @ (Opening::Cancel(_) | Opening::Tls) => return Ok(other),
    };
    // Refused before the password is asked for, so that the token never crosses in plain
    // text; postgres words it so for a client no `hostssl` line lets in.
    if front.config.requires_tls() && !client.is_tls() {
        return Err(SessionError::Refused(Refusal::new(
            "28000",
            "the PostgreSQL front accepts TLS connections only (--front-require-tls): \
             connect with sslmode=require",
        )));
    }
    let Some(user) = startup.get("user") else {
        // What postgres says too; drivers always send one.
        return Err(SessionError::Refused(Refusal::new(
            "28000",
            "no PostgreSQL user name specified in startup packet",
        )));
    };
    let mut out = BytesMut::new();
    startup::negotiate(&startup, &mut out);
    startup::authenticate(client, buf, out, user, front.config.token.as_ref()).await?;
    Ok(Opening::Startup(startup))
}

/// The lease request a StartupMessage makes: the template is the database's name (the user
/// name when there is none, as postgres defaults it) up to a `@` and key, the label its
/// application_name (else the key); the rest is `POST /lease`'s defaults.
fn lease_request(
    front: &Front,
    startup: &Startup,
) -> Result<(LeaseRequest, Option<KeyName>), SessionError> {
    let database = startup
        .get("database")
        .filter(|name| !name.is_empty())
        .or_else(|| startup.get("user"))
        .unwrap_or_default();
    let (template, key) = KeyName::parse(database).map_err(|error| {
        SessionError::Refused(Refusal::new(
            "3D000",
            format!("database \"{database}\" does not name a template: {error}"),
        ))
    })?;
    // A label that would not do over HTTP is left out rather than refused: the connection
    // matters more than its name in /status.
    let label = startup
        .get("application_name")
        .filter(|name| {
            !name.is_empty()
                && name.chars().count() <= MAX_LABEL_CHARS
                && !name.chars().any(char::is_control)
        })
        .map(str::to_owned)
        .or_else(|| key.as_ref().map(ToString::to_string));
    let request = LeaseRequest {
        template,
        ttl: None,
        wait: front.config.default_wait,
        connections: None,
        reclaimable: false,
        postgres_version: None,
        label,
    };
    Ok((request, key))
}

/// Leases, watching the client meanwhile: if it leaves, the request is dropped and the pool
/// takes the database back, as when an HTTP client goes away.
async fn wait_for_lease(
    front: &Front,
    client: &mut ClientStream,
    buf: &mut BytesMut,
    request: LeaseRequest,
) -> Result<Lease, SessionError> {
    let lease = front.servers.lease(request);
    tokio::pin!(lease);
    loop {
        buf.reserve(4096);
        tokio::select! {
            leased = &mut lease => {
                return leased.map_err(|error| SessionError::Refused(Refusal::from(error)));
            }
            read = client.read_buf(buf) => match read {
                Ok(0) => return Err(SessionError::ClientLeft),
                Ok(_) if buf.len() > MAX_EARLY_BYTES => {
                    return Err(SessionError::Refused(Refusal::protocol(
                        "too many bytes before the connection was ready for queries",
                    )))
                }
                // Kept for the server, as the relay would have passed them on.
                Ok(_) => {}
                Err(source) => return Err(SessionError::io("waiting for a lease", source)),
            },
        }
    }
}

/// Logs the lease in at postgres, hands the client the server's greeting with a cancel key
/// of the front's own, and relays until either side closes, renewing the lease meanwhile
/// when `renew` says the session is the one to.
async fn connect_and_relay(
    front: &Front,
    client: &mut ClientStream,
    buf: &mut BytesMut,
    lease: &Lease,
    startup: &Startup,
    renew: bool,
) -> Result<Relayed, SessionError> {
    // The server's private socket where pglease runs it: no TCP stack on every round trip,
    // and no SCRAM exchange at login (the socket is the daemon's alone, and trusted). An
    // external server is reached as the lease's holder would reach it.
    let address = Address {
        host: match &lease.local_socket {
            Some(dir) => dir.to_string_lossy().into_owned(),
            None => lease.connect.host.clone(),
        },
        port: lease.connect.port,
    };
    // The client's parameters go on, but for those the lease decides and the protocol
    // options the front declined.
    let parameters = startup
        .parameters
        .iter()
        .filter(|(name, _)| !matches!(name.as_str(), "user" | "database"))
        .filter(|(name, _)| !name.starts_with("_pq_."))
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    let login = Login {
        address: address.clone(),
        user: &lease.connect.user,
        password: &lease.connect.password,
        database: lease.connect.database.as_str(),
        parameters,
    };
    let connected = tokio::time::timeout(BACKEND_TIMEOUT, backend::connect(&login))
        .await
        .map_err(|_| SessionError::BackendTimeout {
            secs: BACKEND_TIMEOUT.as_secs(),
        })?
        .map_err(SessionError::Backend)?;
    let registration = front.cancels.register(CancelTarget {
        address,
        key: connected.key,
    });
    let mut out = BytesMut::new();
    for message in &connected.greeting {
        out.extend_from_slice(message);
    }
    codec::backend_key_data(registration.key(), &mut out);
    out.extend_from_slice(&connected.ready);
    out.extend_from_slice(&connected.leftover);
    client
        .write_all(&out)
        .await
        .map_err(|source| SessionError::io("greeting the client", source))?;
    let mut server = connected.stream;
    if !buf.is_empty() {
        server
            .write_all(buf)
            .await
            .map_err(|source| SessionError::io("passing on what the client sent early", source))?;
    }
    #[cfg(test)]
    if front.panic_when_relaying {
        panic!("a test's panic as the relay begins");
    }
    // The lease lasts as long as its connection: renewed while the bytes flow.
    let relayed = match renew {
        true => tokio::select! {
            relayed = client.relay_with(&mut server) => relayed,
            never = keep_renewing(front, lease) => match never {},
        },
        false => client.relay_with(&mut server).await,
    };
    // The key is forgotten before the release: no cancel reaches the next holder.
    drop(registration);
    Ok(relayed)
}

/// Renews a session's own `lease` whenever half of its time to live has passed, for as long
/// as it is awaited (the relay's length); a lease that cannot be renewed (released over HTTP, say) is
/// left to end, and its connection with it.
async fn keep_renewing(front: &Front, lease: &Lease) -> std::convert::Infallible {
    let mut expires_at = lease.expires_at;
    loop {
        let left = expires_at
            .duration_since(std::time::SystemTime::now())
            .unwrap_or_default();
        tokio::time::sleep((left / 2).max(MIN_RENEW_INTERVAL)).await;
        match front.servers.renew(lease.id.clone(), None).await {
            Ok(renewed) => expires_at = renewed,
            Err(error) => {
                tracing::debug!(lease_id = %lease.id, %error, "the lease of a connection at the PostgreSQL front cannot be renewed");
                return std::future::pending().await;
            }
        }
    }
}

/// Sends a CancelRequest on to the backend whose front key it names; an unknown key is
/// ignored, as postgres ignores one.
async fn send_cancel(front: &Front, key: CancelKey, peer: SocketAddr) {
    let Some(target) = front.cancels.lookup(key) else {
        tracing::debug!(%peer, "a cancel request at the PostgreSQL front names no connection");
        return;
    };
    match tokio::time::timeout(CANCEL_TIMEOUT, cancel::forward(&target)).await {
        Ok(Ok(())) => tracing::debug!(%peer, server = %target.address, "sent a cancel request on"),
        Ok(Err(error)) => {
            tracing::warn!(%peer, server = %target.address, %error, "cannot send a cancel request on")
        }
        Err(_) => {
            tracing::warn!(%peer, server = %target.address, "sending a cancel request on timed out")
        }
    }
}

#[cfg(test)]
mod tests;
