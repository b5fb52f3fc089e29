//! The client's side of the start-up, up to the moment the front knows what it wants: its
//! opening packets (an SSLRequest answered `S` when the front has TLS, `N` otherwise; a
//! GSSENCRequest always `N`; a CancelRequest; or a StartupMessage), the protocol version,
//! and the password when a token guards the front. The TLS handshake itself is the
//! session's (`ClientStream::upgrade`), after which the opening packets are read again.
//!
//! Every read is bounded by the codec's [`MAX_STARTUP_PACKET`]; the caller bounds the time.
//! Leasing and postgres are the session's business.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::codec::{self, AuthMessage, CancelKey, CodecError, Startup, StartupPacket};
use crate::error::{Refusal, SessionError};
use crate::Token;

/// The newest minor version of protocol 3 the front speaks: 3.0, which every driver speaks
/// and whose cancel keys are the 4-byte ones BackendKeyData carries here.
const NEWEST_MINOR: u16 = 0;

/// What the client opened the connection for.
#[derive(Debug)]
pub(crate) enum Opening {
    /// To cancel the query of another connection.
    Cancel(CancelKey),
    /// To be served: its StartupMessage.
    Startup(Startup),
    /// To speak TLS: the front said `S`, and the handshake comes next.
    Tls,
}

/// Where the connection stands with encryption while its opening packets are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encryption {
    /// Plain text, and the front has no TLS: an SSLRequest is refused with `N`.
    Refused,
    /// Plain text, and the front has TLS: an SSLRequest gets `S` ([`Opening::Tls`]).
    Offered,
    /// Already TLS: another encryption request breaks the protocol.
    Established,
}

/// Reads the client's opening packets. An SSLRequest is answered `S` when TLS is
/// offered, else refused once with `N`, as a server without TLS does; a GSSENCRequest is
/// refused once with `N`, as a server without GSSAPI does. A second refused request, or
/// any request once the connection is encrypted, is a protocol error.
pub(crate) async fn read_opening<S>(
    stream: &mut S,
    buf: &mut BytesMut,
    encryption: Encryption,
) -> Result<Opening, SessionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let (mut ssl_refused, mut gss_refused) = (false, false);
    loop {
        let packet = read_packet(stream, buf, codec::decode_startup_packet).await?;
        let already = match packet {
            StartupPacket::Cancel(key) => return Ok(Opening::Cancel(key)),
            StartupPacket::Startup(startup) => return Ok(Opening::Startup(startup)),
            StartupPacket::SslRequest | StartupPacket::GssEncRequest
                if encryption == Encryption::Established =>
            {
                return Err(SessionError::Refused(Refusal::protocol(
                    "an encryption request on a connection already encrypted",
                )));
            }
            StartupPacket::SslRequest if encryption == Encryption::Offered => {
                // What the client sent after its request would be taken as the start of
                // the handshake, or worse, as sent under TLS by the client (postgres'
                // CVE-2021-23214): the request is the last plain-text byte it may send.
                if !buf.is_empty() {
                    return Err(SessionError::Refused(Refusal::protocol(
                        "received unencrypted data after SSL request",
                    )));
                }
                stream
                    .write_all(&[codec::ENCRYPTION_ACCEPTED])
                    .await
                    .map_err(|source| {
                        SessionError::io("answering an encryption request", source)
                    })?;
                return Ok(Opening::Tls);
            }
            StartupPacket::SslRequest => std::mem::replace(&mut ssl_refused, true),
            StartupPacket::GssEncRequest => std::mem::replace(&mut gss_refused, true),
        };
        if already {
            return Err(SessionError::Refused(Refusal::protocol(
                "an encryption request was repeated after it was refused",
            )));
        }
        stream
            .write_all(&[codec::NO_ENCRYPTION])
            .await
            .map_err(|source| SessionError::io("answering an encryption request", source))?;
    }
}

/// Answers a StartupMessage of protocol 3.1 or later, or one with protocol options, with
/// the version and options the front speaks (3.0, none): postgres does the same, and the
/// client goes on in 3.0 or gives up.
pub(crate) fn negotiate(startup: &Startup, out: &mut BytesMut) {
    let options = startup.protocol_options();
    if startup.minor_version > NEWEST_MINOR || !options.is_empty() {
        codec::negotiate_protocol_version(NEWEST_MINOR, &options, out);
    }
}

/// Lets the client in: at once without a token, else when its password is the token. Ends
/// with AuthenticationOk written to the client.
pub(crate) async fn authenticate<S>(
    stream: &mut S,
    buf: &mut BytesMut,
    mut out: BytesMut,
    user: &str,
    token: Option<&Token>,
) -> Result<(), SessionError>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    if let Some(token) = token {
        codec::authentication_cleartext_password(&mut out);
        write(stream, &mut out).await?;
        match read_packet(stream, buf, codec::decode_auth_message).await? {
            AuthMessage::Password(given) if token.matches(&given) => {}
            AuthMessage::Password(_) => {
                return Err(SessionError::Refused(Refusal::new(
                    "28P01",
                    format!(
                        "password authentication failed for user \"{user}\": the pglease front \
                         takes the daemon's token (--token) as the password"
                    ),
                )))
            }
            AuthMessage::Terminate => return Err(SessionError::ClientLeft),
        }
    }
    codec::authentication_ok(&mut out);
    write(stream, &mut out).await
}

/// Writes and empties `out`.
async fn write<S: AsyncWrite + Unpin>(
    stream: &mut S,
    out: &mut BytesMut,
) -> Result<(), SessionError> {
    stream
        .write_all(out)
        .await
        .map_err(|source| SessionError::io("writing to the client", source))?;
    out.clear();
    Ok(())
}

/// Reads until `decode` has a whole packet. The decoders refuse a length over the limit as
/// soon as it has arrived, so `buf` grows to one packet and one read at most.
async fn read_packet<S, T>(
    stream: &mut S,
    buf: &mut BytesMut,
    decode: fn(&mut BytesMut) -> Result<Option<T>, CodecError>,
) -> Result<T, SessionError>
where
    S: AsyncRead + Unpin,
{
    loop {
        if let Some(packet) = decode(buf).map_err(SessionError::Codec)? {
            return Ok(packet);
        }
        buf.reserve(4096);
        let read = stream
            .read_buf(buf)
            .await
            .map_err(|source| SessionError::io("reading the start-up", source))?;
        if read == 0 {
            return Err(if buf.is_empty() {
                SessionError::ClientLeft
            } else {
                SessionError::Incomplete {
                    received: buf.len(),
                }
            });
        }
    }
}

#[cfg(test)]
mod tests;
