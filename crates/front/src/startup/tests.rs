//! The client's side of the start-up over an in-memory connection, as postgres-protocol (a
//! driver) writes it.

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;

/// The front's end and the client's end of a connection.
fn connection() -> (DuplexStream, DuplexStream) {
    tokio::io::duplex(64 * 1024)
}

fn startup(parameters: &[(&str, &str)]) -> BytesMut {
    let mut buf = BytesMut::new();
    frontend::startup_message(parameters.iter().copied(), &mut buf).expect("encodable");
    buf
}

#[tokio::test]
async fn encryption_requests_are_refused_once_each_then_the_startup_is_read() {
    let (mut front, mut client) = connection();
    let mut ssl = BytesMut::new();
    frontend::ssl_request(&mut ssl);
    let mut gss = BytesMut::new();
    gss.extend_from_slice(&8u32.to_be_bytes());
    gss.extend_from_slice(&((1234u32 << 16) | 5680).to_be_bytes());
    client.write_all(&gss).await.expect("write");
    client.write_all(&ssl).await.expect("write");
    client
        .write_all(&startup(&[("user", "u"), ("database", "app")]))
        .await
        .expect("write");
    let mut buf = BytesMut::new();
    let opening = read_opening(&mut front, &mut buf, Encryption::Refused)
        .await
        .expect("read");
    let Opening::Startup(startup) = opening else {
        panic!("not a startup: {opening:?}");
    };
    assert_eq!(startup.get("database"), Some("app"));
    let mut answers = [0u8; 2];
    client.read_exact(&mut answers).await.expect("two answers");
    assert_eq!(&answers, b"NN");
}

#[tokio::test]
async fn with_tls_an_ssl_request_gets_s_after_a_refused_gss_request() {
    let (mut front, mut client) = connection();
    let mut gss = BytesMut::new();
    gss.extend_from_slice(&8u32.to_be_bytes());
    gss.extend_from_slice(&((1234u32 << 16) | 5680).to_be_bytes());
    client.write_all(&gss).await.expect("write");
    let mut buf = BytesMut::new();
    let reading = tokio::spawn(async move {
        let opening = read_opening(&mut front, &mut buf, Encryption::Offered).await;
        (opening, buf)
    });
    // The client waits for each answer before it goes on, as libpq does.
    let mut answer = [0u8; 1];
    client.read_exact(&mut answer).await.expect("an answer");
    assert_eq!(&answer, b"N", "GSSAPI is never offered");
    let mut ssl = BytesMut::new();
    frontend::ssl_request(&mut ssl);
    client.write_all(&ssl).await.expect("write");
    client.read_exact(&mut answer).await.expect("an answer");
    assert_eq!(&answer, b"S");
    let (opening, buf) = reading.await.expect("join");
    assert!(matches!(opening, Ok(Opening::Tls)), "{opening:?}");
    assert!(buf.is_empty());
}

#[tokio::test]
async fn bytes_sent_after_an_ssl_request_before_the_answer_are_refused() {
    // What a man in the middle would inject for the server to read as sent under TLS.
    let (mut front, mut client) = connection();
    let mut bytes = BytesMut::new();
    frontend::ssl_request(&mut bytes);
    bytes.extend_from_slice(&startup(&[("user", "u"), ("database", "app")]));
    client.write_all(&bytes).await.expect("write");
    let error = read_opening(&mut front, &mut BytesMut::new(), Encryption::Offered)
        .await
        .expect_err("refused");
    assert!(
        matches!(&error, SessionError::Refused(refusal)
            if refusal.code == "08P01" && refusal.message.contains("unencrypted data")),
        "{error:?}"
    );
    drop(front);
    assert!(answers(client).await.is_empty(), "no S was sent");
}

#[tokio::test]
async fn an_encryption_request_inside_tls_is_a_protocol_error() {
    for gss in [false, true] {
        let (mut front, mut client) = connection();
        let mut request = BytesMut::new();
        if gss {
            request.extend_from_slice(&8u32.to_be_bytes());
            request.extend_from_slice(&((1234u32 << 16) | 5680).to_be_bytes());
        } else {
            frontend::ssl_request(&mut request);
        }
        client.write_all(&request).await.expect("write");
        let error = read_opening(&mut front, &mut BytesMut::new(), Encryption::Established)
            .await
            .expect_err("refused");
        assert!(
            matches!(&error, SessionError::Refused(refusal) if refusal.code == "08P01"),
            "gss {gss}: {error:?}"
        );
    }
}

#[tokio::test]
async fn a_repeated_ssl_request_is_a_protocol_error() {
    let (mut front, mut client) = connection();
    let mut ssl = BytesMut::new();
    frontend::ssl_request(&mut ssl);
    frontend::ssl_request(&mut ssl);
    client.write_all(&ssl).await.expect("write");
    let error = read_opening(&mut front, &mut BytesMut::new(), Encryption::Refused)
        .await
        .expect_err("refused");
    assert!(
        matches!(&error, SessionError::Refused(refusal) if refusal.code == "08P01"),
        "{error:?}"
    );
}

#[tokio::test]
async fn a_connection_closed_mid_packet_is_incomplete_and_between_packets_left() {
    let (mut front, mut client) = connection();
    client
        .write_all(&startup(&[("user", "u")])[..6])
        .await
        .expect("write");
    drop(client);
    let error = read_opening(&mut front, &mut BytesMut::new(), Encryption::Refused)
        .await
        .expect_err("closed");
    assert!(
        matches!(error, SessionError::Incomplete { received: 6 }),
        "{error:?}"
    );

    let (mut front, client) = connection();
    drop(client);
    let error = read_opening(&mut front, &mut BytesMut::new(), Encryption::Refused)
        .await
        .expect_err("closed");
    assert!(matches!(error, SessionError::ClientLeft), "{error:?}");
}

#[tokio::test]
async fn a_cancel_request_is_returned_with_its_key() {
    let (mut front, mut client) = connection();
    let mut cancel = BytesMut::new();
    frontend::cancel_request(12, 34, &mut cancel);
    client.write_all(&cancel).await.expect("write");
    let opening = read_opening(&mut front, &mut BytesMut::new(), Encryption::Refused)
        .await
        .expect("read");
    assert!(
        matches!(
            opening,
            Opening::Cancel(CancelKey {
                process_id: 12,
                secret_key: 34
            })
        ),
        "{opening:?}"
    );
}

#[test]
fn protocol_3_2_and_options_are_negotiated_down_to_3_0() {
    let plain = Startup {
        minor_version: 0,
        parameters: vec![("user".into(), "u".into())],
    };
    let mut out = BytesMut::new();
    negotiate(&plain, &mut out);
    assert!(out.is_empty(), "3.0 without options needs no answer");
    let newer = Startup {
        minor_version: 2,
        parameters: vec![("_pq_.x".into(), "1".into())],
    };
    negotiate(&newer, &mut out);
    assert_eq!(out[0], b'v');
    assert!(out.ends_with(b"_pq_.x\0"));
}

/// Reads the whole of what the front wrote until it closed its end.
async fn answers(mut client: DuplexStream) -> Vec<u8> {
    let mut all = Vec::new();
    client.read_to_end(&mut all).await.expect("read");
    all
}

#[tokio::test]
async fn without_a_token_the_client_is_in_at_once() {
    let (mut front, client) = connection();
    authenticate(&mut front, &mut BytesMut::new(), BytesMut::new(), "u", None)
        .await
        .expect("in");
    drop(front);
    let mut ok = BytesMut::new();
    codec::authentication_ok(&mut ok);
    assert_eq!(answers(client).await, ok.to_vec());
}

#[tokio::test]
async fn with_a_token_the_password_must_be_it() {
    let token = Token::new("s3cret".into());
    for (password, accepted) in [("s3cret", true), ("wrong", false), ("", false)] {
        let (mut front, mut client) = connection();
        let mut message = BytesMut::new();
        frontend::password_message(password.as_bytes(), &mut message).expect("encodable");
        client.write_all(&message).await.expect("write");
        let outcome = authenticate(
            &mut front,
            &mut BytesMut::new(),
            BytesMut::new(),
            "u",
            Some(&token),
        )
        .await;
        match (outcome, accepted) {
            (Ok(()), true) => {}
            (Err(SessionError::Refused(refusal)), false) => assert_eq!(refusal.code, "28P01"),
            (outcome, _) => panic!("password {password:?}: {outcome:?}"),
        }
        drop(front);
        let written = answers(client).await;
        let mut expected = BytesMut::new();
        codec::authentication_cleartext_password(&mut expected);
        if accepted {
            codec::authentication_ok(&mut expected);
        }
        assert_eq!(written, expected.to_vec(), "password {password:?}");
    }
}
