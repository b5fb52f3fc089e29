//! The PostgreSQL protocol as the front speaks it to clients, on `bytes`: parsing the packets a
//! client opens with (SSLRequest, GSSENCRequest, CancelRequest, StartupMessage) and its
//! PasswordMessage, and writing the few messages the front says itself (AuthenticationOk,
//! AuthenticationCleartextPassword, BackendKeyData, ErrorResponse, NegotiateProtocolVersion).
//!
//! Pure: no I/O, no state. Every decoder takes what has arrived so far and answers `Ok(None)`
//! until a whole packet is there; it checks a packet's length before waiting for its body, so
//! a client cannot make the front buffer more than [`MAX_STARTUP_PACKET`] bytes. What the
//! front says to postgres, and what postgres answers, is `postgres-protocol`'s business
//! (`backend.rs`); after the start-up nothing is parsed at all.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// Longest startup packet or password message accepted, in bytes (postgres' own limit is
/// the same: `MAX_STARTUP_PACKET_LENGTH`).
pub const MAX_STARTUP_PACKET: usize = 10_000;

/// The request codes a startup packet carries in place of a protocol version
/// (`1234.5678`, `1234.5679`, `1234.5680`).
const CANCEL_REQUEST_CODE: u32 = (1234 << 16) | 5678;
const SSL_REQUEST_CODE: u32 = (1234 << 16) | 5679;
const GSSENC_REQUEST_CODE: u32 = (1234 << 16) | 5680;

/// The byte that refuses an SSLRequest or a GSSENCRequest: the client goes on unencrypted
/// (or gives up, if it requires encryption).
pub const NO_ENCRYPTION: u8 = b'N';

/// The byte that accepts an SSLRequest: the TLS handshake follows.
pub const ENCRYPTION_ACCEPTED: u8 = b'S';

/// What a client's first packets may be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupPacket {
    /// The client asks for TLS.
    SslRequest,
    /// The client asks for GSSAPI encryption.
    GssEncRequest,
    /// The client asks to cancel the query running on another connection.
    Cancel(CancelKey),
    /// A StartupMessage of protocol 3.x.
    Startup(Startup),
}

/// A connection's cancel key: what BackendKeyData hands out and CancelRequest names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CancelKey {
    /// The process id (for the front, a random number of its own).
    pub process_id: i32,
    /// The secret that proves the request comes from the connection's client.
    pub secret_key: i32,
}

/// A StartupMessage: the minor protocol version asked for and the parameters, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Startup {
    /// The minor version of protocol 3 the client asks for (0 for 3.0).
    pub minor_version: u16,
    /// Name and value of every parameter, in the order the client sent them.
    pub parameters: Vec<(String, String)>,
}

impl Startup {
    /// The value of the parameter `name`; the last one when the client sent it twice, as
    /// postgres reads it.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.parameters
            .iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// The protocol options (`_pq_.NAME`) the client asked for, none of which the front
    /// supports.
    pub fn protocol_options(&self) -> Vec<String> {
        self.parameters
            .iter()
            .filter(|(key, _)| key.starts_with("_pq_."))
            .map(|(key, _)| key.clone())
            .collect()
    }
}

/// A packet from the client that the front cannot accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// A startup packet's length is below the smallest packet or above [`MAX_STARTUP_PACKET`].
    #[error("invalid length of startup packet: {length} bytes (8 to {MAX_STARTUP_PACKET})")]
    StartupLength {
        /// The length the packet claims.
        length: u32,
    },
    /// An SSLRequest, GSSENCRequest or CancelRequest of the wrong length.
    #[error("invalid length of {what}: {length} bytes (it has {expected})")]
    RequestLength {
        /// Which request.
        what: &'static str,
        /// The length the packet claims.
        length: u32,
        /// The length it must have.
        expected: u32,
    },
    /// A protocol version other than 3.x.
    #[error("unsupported frontend protocol {major}.{minor}: the pglease front supports 3.0")]
    UnsupportedProtocol {
        /// The major version asked for.
        major: u16,
        /// The minor version asked for.
        minor: u16,
    },
    /// The parameters of a StartupMessage are not nul-terminated pairs ending in a nul.
    #[error("invalid startup packet layout: {0}")]
    StartupLayout(&'static str),
    /// A parameter's name or value is not UTF-8.
    #[error("invalid startup packet: the parameter {index} is not UTF-8")]
    NotUtf8 {
        /// The parameter's position (0 for the first).
        index: usize,
    },
    /// A message's length is below 4 or above [`MAX_STARTUP_PACKET`].
    #[error("invalid length of message {tag:?}: {length} bytes (4 to {MAX_STARTUP_PACKET})")]
    MessageLength {
        /// The message type.
        tag: char,
        /// The length the message claims.
        length: u32,
    },
    /// A message other than the one the front waits for.
    #[error("expected a password message, got a message of type {tag:?}")]
    UnexpectedMessage {
        /// The message type.
        tag: char,
    },
    /// A PasswordMessage whose password is not nul-terminated.
    #[error("invalid password message: the password is not nul-terminated")]
    PasswordLayout,
}

/// Takes one startup packet off the front of `buf`, once it has all arrived.
pub fn decode_startup_packet(buf: &mut BytesMut) -> Result<Option<StartupPacket>, CodecError> {
    let Some(length) = peek_u32(buf, 0) else {
        return Ok(None);
    };
    // The length counts itself and the code: 8 is a packet with no body.
    if !(8..=MAX_STARTUP_PACKET as u32).contains(&length) {
        return Err(CodecError::StartupLength { length });
    }
    if buf.len() < length as usize {
        return Ok(None);
    }
    let mut packet = buf.split_to(length as usize).freeze();
    packet.advance(4);
    let code = packet.get_u32();
    let request_length = |what, expected| {
        if length == expected {
            Ok(())
        } else {
            Err(CodecError::RequestLength {
                what,
                length,
                expected,
            })
        }
    };
    let decoded = match code {
        SSL_REQUEST_CODE => {
            request_length("SSLRequest", 8)?;
            StartupPacket::SslRequest
        }
        GSSENC_REQUEST_CODE => {
            request_length("GSSENCRequest", 8)?;
            StartupPacket::GssEncRequest
        }
        CANCEL_REQUEST_CODE => {
            request_length("CancelRequest", 16)?;
            StartupPacket::Cancel(CancelKey {
                process_id: packet.get_i32(),
                secret_key: packet.get_i32(),
            })
        }
        version => {
            let (major, minor) = ((version >> 16) as u16, (version & 0xffff) as u16);
            if major != 3 {
                return Err(CodecError::UnsupportedProtocol { major, minor });
            }
            StartupPacket::Startup(Startup {
                minor_version: minor,
                parameters: parameters(&packet)?,
            })
        }
    };
    Ok(Some(decoded))
}

/// The parameters of a StartupMessage: name, nul, value, nul, … and a last nul.
fn parameters(mut body: &[u8]) -> Result<Vec<(String, String)>, CodecError> {
    let mut parameters = Vec::new();
    loop {
        let name = cstr(&mut body).ok_or(CodecError::StartupLayout(
            "expected a terminator as last byte",
        ))?;
        if name.is_empty() {
            if !body.is_empty() {
                return Err(CodecError::StartupLayout("bytes after the terminator"));
            }
            return Ok(parameters);
        }
        let value = cstr(&mut body).ok_or(CodecError::StartupLayout(
            "a parameter name without a value",
        ))?;
        let index = parameters.len();
        let text = |bytes: &[u8]| {
            std::str::from_utf8(bytes)
                .map(str::to_owned)
                .map_err(|_| CodecError::NotUtf8 { index })
        };
        parameters.push((text(name)?, text(value)?));
    }
}

/// The bytes up to the next nul, taken off `body` with the nul; None when there is no nul.
fn cstr<'a>(body: &mut &'a [u8]) -> Option<&'a [u8]> {
    let end = body.iter().position(|&byte| byte == 0)?;
    let (text, rest) = body.split_at(end);
    *body = &rest[1..];
    Some(text)
}

/// What a client may send while the front asks for its password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuthMessage {
    /// A PasswordMessage: the password, without its nul.
    Password(Bytes),
    /// Terminate: the client gives up (libpq does when it has no password to give).
    Terminate,
}

/// Takes one PasswordMessage (or Terminate) off the front of `buf`, once it has all arrived.
pub fn decode_auth_message(buf: &mut BytesMut) -> Result<Option<AuthMessage>, CodecError> {
    let (Some(&tag), Some(length)) = (buf.first(), peek_u32(buf, 1)) else {
        return Ok(None);
    };
    let tag_char = char::from(tag);
    if !matches!(tag, b'p' | b'X') {
        return Err(CodecError::UnexpectedMessage { tag: tag_char });
    }
    if !(4..=MAX_STARTUP_PACKET as u32).contains(&length) {
        return Err(CodecError::MessageLength {
            tag: tag_char,
            length,
        });
    }
    let total = 1 + length as usize;
    if buf.len() < total {
        return Ok(None);
    }
    let mut message = buf.split_to(total).freeze();
    message.advance(5);
    if tag == b'X' {
        return Ok(Some(AuthMessage::Terminate));
    }
    if message.last() != Some(&0) {
        return Err(CodecError::PasswordLayout);
    }
    message.truncate(message.len() - 1);
    Ok(Some(AuthMessage::Password(message)))
}

/// The big-endian u32 at `at` in `buf`, if that much has arrived.
fn peek_u32(buf: &[u8], at: usize) -> Option<u32> {
    let bytes = buf.get(at..at + 4)?;
    Some(u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
}

/// Writes a message: its type, then its length (which counts itself) and `body`.
fn message(tag: u8, buf: &mut BytesMut, body: impl FnOnce(&mut BytesMut)) {
    buf.put_u8(tag);
    let at = buf.len();
    buf.put_u32(0);
    body(buf);
    let length = (buf.len() - at) as u32;
    buf[at..at + 4].copy_from_slice(&length.to_be_bytes());
}

/// Writes `text` nul-terminated; a nul inside it (which the protocol cannot carry) becomes a
/// space.
fn put_cstr(buf: &mut BytesMut, text: &str) {
    buf.extend(text.bytes().map(|byte| if byte == 0 { b' ' } else { byte }));
    buf.put_u8(0);
}

/// AuthenticationOk: the client is in.
pub fn authentication_ok(buf: &mut BytesMut) {
    message(b'R', buf, |buf| buf.put_i32(0));
}

/// AuthenticationCleartextPassword: the client must send its password.
pub fn authentication_cleartext_password(buf: &mut BytesMut) {
    message(b'R', buf, |buf| buf.put_i32(3));
}

/// BackendKeyData: the key a CancelRequest for this connection must name.
pub fn backend_key_data(key: CancelKey, buf: &mut BytesMut) {
    message(b'K', buf, |buf| {
        buf.put_i32(key.process_id);
        buf.put_i32(key.secret_key);
    });
}

/// NegotiateProtocolVersion: the newest minor version of protocol 3 the front speaks, and
/// the protocol options it does not know.
pub fn negotiate_protocol_version(newest_minor: u16, unknown: &[String], buf: &mut BytesMut) {
    message(b'v', buf, |buf| {
        buf.put_i32(i32::from(newest_minor));
        buf.put_i32(i32::try_from(unknown.len()).unwrap_or(i32::MAX));
        for option in unknown {
            put_cstr(buf, option);
        }
    });
}

/// An ErrorResponse of severity FATAL (the front closes the connection after it) with a
/// SQLSTATE and a message.
pub fn fatal_error(code: &str, text: &str, buf: &mut BytesMut) {
    message(b'E', buf, |buf| {
        for (field, value) in [(b'S', "FATAL"), (b'V', "FATAL"), (b'C', code), (b'M', text)] {
            buf.put_u8(field);
            put_cstr(buf, value);
        }
        buf.put_u8(0);
    });
}

#[cfg(test)]
mod tests;
