//! Opening a lease's connection to postgres: a StartupMessage with the lease's user and
//! database and the client's other parameters, the lease role's password exchange (SCRAM,
//! md5 or cleartext, whichever the server asks for), then the server's ParameterStatus,
//! notices, BackendKeyData and ReadyForQuery, collected for the client. All of it is
//! postgres-protocol's client side; after ReadyForQuery the session relays bytes unread.
//!
//! It does not speak to the client, and knows nothing of leases but their `ConnectInfo`.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use fallible_iterator::FallibleIterator;
use postgres_protocol::authentication::{md5_hash, sasl};
use postgres_protocol::message::{backend, frontend};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::codec::CancelKey;

/// Longest message the server may send during the start-up (its ParameterStatus and notices
/// are a few dozen bytes; an error with its detail a few hundred).
const MAX_SERVER_MESSAGE: usize = 1 << 20;

/// Where a server listens: a host name or address and a TCP port, or a unix socket
/// directory (a host that starts with `/`) and the port that names its socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Address {
    /// Host, IP address, or socket directory.
    pub(crate) host: String,
    /// The port.
    pub(crate) port: u16,
}

impl std::fmt::Display for Address {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.starts_with('/') {
            write!(f, "{}", self.socket_path())
        } else if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl Address {
    /// The socket file postgres makes in a socket directory.
    fn socket_path(&self) -> String {
        format!("{}/.s.PGSQL.{}", self.host, self.port)
    }
}

/// A connection to a server, over TCP or a unix socket.
#[derive(Debug)]
pub(crate) enum ServerStream {
    /// TCP.
    Tcp(TcpStream),
    /// A unix socket.
    Unix(UnixStream),
}

/// Connects to the server at `address`.
pub(crate) async fn open(address: &Address) -> std::io::Result<ServerStream> {
    if address.host.starts_with('/') {
        return Ok(ServerStream::Unix(
            UnixStream::connect(address.socket_path()).await?,
        ));
    }
    let stream = TcpStream::connect((address.host.as_str(), address.port)).await?;
    // Queries are small and answered one at a time: no waiting to fill a segment.
    stream.set_nodelay(true)?;
    Ok(ServerStream::Tcp(stream))
}

impl AsyncRead for ServerStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Tcp(stream) => Pin::new(stream).poll_read(cx, buf),
            ServerStream::Unix(stream) => Pin::new(stream).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ServerStream::Tcp(stream) => Pin::new(stream).poll_write(cx, buf),
            ServerStream::Unix(stream) => Pin::new(stream).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Tcp(stream) => Pin::new(stream).poll_flush(cx),
            ServerStream::Unix(stream) => Pin::new(stream).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ServerStream::Tcp(stream) => Pin::new(stream).poll_shutdown(cx),
            ServerStream::Unix(stream) => Pin::new(stream).poll_shutdown(cx),
        }
    }
}

/// Who to log in as, and where.
#[derive(Debug, Clone)]
pub(crate) struct Login<'a> {
    /// The server.
    pub(crate) address: Address,
    /// The lease's role.
    pub(crate) user: &'a str,
    /// Its password.
    pub(crate) password: &'a str,
    /// The lease's database.
    pub(crate) database: &'a str,
    /// The client's other startup parameters (application_name, options, client_encoding…).
    pub(crate) parameters: Vec<(&'a str, &'a str)>,
}

/// A logged-in connection, ready for queries, with what the server said after the login.
#[derive(Debug)]
pub(crate) struct Connected {
    /// The connection.
    pub(crate) stream: ServerStream,
    /// The backend's own cancel key.
    pub(crate) key: CancelKey,
    /// The server's ParameterStatus and NoticeResponse messages, as sent, in order.
    pub(crate) greeting: Vec<Bytes>,
    /// Its ReadyForQuery, as sent.
    pub(crate) ready: Bytes,
    /// Bytes the server sent after ReadyForQuery, for the client.
    pub(crate) leftover: BytesMut,
}

/// Why a lease's connection could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BackendError {
    /// The server could not be reached, or the connection broke.
    #[error("postgres at {address}: {source}")]
    Io {
        /// The server.
        address: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The server answered with an ErrorResponse, which the client is given as it is.
    #[error("postgres refused the lease's login: {message} (SQLSTATE {code})")]
    Refused {
        /// The SQLSTATE.
        code: String,
        /// Its message.
        message: String,
        /// The ErrorResponse, as sent.
        raw: Bytes,
    },
    /// The server said something the front cannot follow.
    #[error("postgres at {address}: {what}")]
    Protocol {
        /// The server.
        address: String,
        /// What went wrong.
        what: String,
    },
}

/// Connects and logs in as the lease; returns once the server is ready for queries.
pub(crate) async fn connect(login: &Login<'_>) -> Result<Connected, BackendError> {
    let address = login.address.to_string();
    let io = |source| BackendError::Io {
        address: address.clone(),
        source,
    };
    let protocol = |what: String| BackendError::Protocol {
        address: address.clone(),
        what,
    };
    let mut stream = open(&login.address).await.map_err(io)?;
    let mut out = BytesMut::new();
    let parameters = [("user", login.user), ("database", login.database)]
        .into_iter()
        .chain(login.parameters.iter().copied());
    frontend::startup_message(parameters, &mut out).map_err(io)?;
    stream.write_all(&out).await.map_err(io)?;

    let mut buf = BytesMut::new();
    let mut scram: Option<sasl::ScramSha256> = None;
    let mut key = None;
    let mut greeting = Vec::new();
    loop {
        let (raw, message) =
            read_message(&mut stream, &mut buf)
                .await
                .map_err(|error| match error {
                    ReadError::Io(source) => io(source),
                    ReadError::Protocol(what) => protocol(what),
                })?;
        out.clear();
        match message {
            backend::Message::AuthenticationOk => {}
            backend::Message::AuthenticationSasl(body) => {
                let mechanisms: Vec<String> = body
                    .mechanisms()
                    .map(|mechanism| Ok(mechanism.to_owned()))
                    .collect()
                    .map_err(|e| protocol(format!("SASL mechanisms: {e}")))?;
                if !mechanisms.iter().any(|m| m == sasl::SCRAM_SHA_256) {
                    return Err(protocol(format!(
                        "the server offers SASL {mechanisms:?}, not {}",
                        sasl::SCRAM_SHA_256
                    )));
                }
                // No TLS to the server: channel binding cannot be had.
                let exchange = sasl::ScramSha256::new(
                    login.password.as_bytes(),
                    sasl::ChannelBinding::unsupported(),
                );
                frontend::sasl_initial_response(sasl::SCRAM_SHA_256, exchange.message(), &mut out)
                    .map_err(io)?;
                scram = Some(exchange);
            }
            backend::Message::AuthenticationSaslContinue(body) => {
                let exchange = scram
                    .as_mut()
                    .ok_or_else(|| protocol("SASL continue before SASL start".into()))?;
                exchange
                    .update(body.data())
                    .map_err(|e| protocol(format!("SCRAM: {e}")))?;
                frontend::sasl_response(exchange.message(), &mut out).map_err(io)?;
            }
            backend::Message::AuthenticationSaslFinal(body) => {
                scram
                    .take()
                    .ok_or_else(|| protocol("SASL final before SASL start".into()))?
                    .finish(body.data())
                    .map_err(|e| protocol(format!("SCRAM: {e}")))?;
            }
            backend::Message::AuthenticationMd5Password(body) => {
                let hash = md5_hash(
                    login.user.as_bytes(),
                    login.password.as_bytes(),
                    body.salt(),
                );
                frontend::password_message(hash.as_bytes(), &mut out).map_err(io)?;
            }
            backend::Message::AuthenticationCleartextPassword => {
                frontend::password_message(login.password.as_bytes(), &mut out).map_err(io)?;
            }
            backend::Message::ParameterStatus(_) | backend::Message::NoticeResponse(_) => {
                greeting.push(raw);
            }
            backend::Message::BackendKeyData(body) => {
                key = Some(CancelKey {
                    process_id: body.process_id(),
                    secret_key: body.secret_key(),
                });
            }
            backend::Message::ReadyForQuery(_) => {
                let key = key.ok_or_else(|| protocol("no BackendKeyData".into()))?;
                return Ok(Connected {
                    stream,
                    key,
                    greeting,
                    ready: raw,
                    leftover: buf,
                });
            }
            backend::Message::ErrorResponse(body) => {
                let (code, message) = error_fields(&body);
                return Err(BackendError::Refused { code, message, raw });
            }
            _ => {
                return Err(protocol(format!(
                    "unexpected message {:?} during the start-up",
                    char::from(raw[0])
                )))
            }
        }
        if !out.is_empty() {
            stream.write_all(&out).await.map_err(io)?;
        }
    }
}

/// The SQLSTATE and message of an ErrorResponse.
fn error_fields(body: &backend::ErrorResponseBody) -> (String, String) {
    let (mut code, mut message) = (String::new(), String::new());
    let mut fields = body.fields();
    while let Ok(Some(field)) = fields.next() {
        match field.type_() {
            b'C' => code = String::from_utf8_lossy(field.value_bytes()).into_owned(),
            b'M' => message = String::from_utf8_lossy(field.value_bytes()).into_owned(),
            _ => {}
        }
    }
    (code, message)
}

/// Why no message could be read.
enum ReadError {
    Io(std::io::Error),
    Protocol(String),
}

/// Reads one whole message: as sent, and parsed.
async fn read_message(
    stream: &mut ServerStream,
    buf: &mut BytesMut,
) -> Result<(Bytes, backend::Message), ReadError> {
    loop {
        if let Some(header) =
            backend::Header::parse(buf).map_err(|e| ReadError::Protocol(e.to_string()))?
        {
            // The length counts itself, not the type byte; parse checked it is at least 4.
            let total = usize::try_from(header.len())
                .unwrap_or(usize::MAX)
                .saturating_add(1);
            if total > MAX_SERVER_MESSAGE {
                return Err(ReadError::Protocol(format!(
                    "a message of {total} bytes during the start-up"
                )));
            }
            if buf.len() >= total {
                let raw = buf.split_to(total).freeze();
                let message = backend::Message::parse(&mut BytesMut::from(&raw[..]))
                    .map_err(|e| ReadError::Protocol(e.to_string()))?
                    .ok_or_else(|| ReadError::Protocol("a truncated message".into()))?;
                return Ok((raw, message));
            }
        }
        buf.reserve(4096);
        if stream.read_buf(buf).await.map_err(ReadError::Io)? == 0 {
            return Err(ReadError::Io(std::io::ErrorKind::UnexpectedEof.into()));
        }
    }
}
