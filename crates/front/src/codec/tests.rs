//! The codec against postgres-protocol's client side (what tokio-postgres sends and parses),
//! hand-made hostile packets, and generated input: whatever arrives, the decoders never
//! panic, never take more than a packet's bytes, and fail with a typed error.

use bytes::{BufMut, BytesMut};
use postgres_protocol::message::{backend, frontend};
use proptest::prelude::*;

use super::*;

/// A StartupMessage as postgres-protocol (tokio-postgres) writes it.
fn startup_bytes(parameters: &[(&str, &str)]) -> BytesMut {
    let mut buf = BytesMut::new();
    frontend::startup_message(parameters.iter().copied(), &mut buf).expect("encodable");
    buf
}

/// A packet of `length` (as claimed) with `code` and `body`.
fn packet(length: u32, code: u32, body: &[u8]) -> BytesMut {
    let mut buf = BytesMut::new();
    buf.put_u32(length);
    buf.put_u32(code);
    buf.put_slice(body);
    buf
}

fn decode_all(bytes: &[u8]) -> Result<Option<StartupPacket>, CodecError> {
    decode_startup_packet(&mut BytesMut::from(bytes))
}

#[test]
fn a_startup_message_is_read_with_its_parameters_in_order() {
    let mut buf = startup_bytes(&[
        ("user", "alice"),
        ("database", "app"),
        ("application_name", "tests"),
        ("user", "bob"),
    ]);
    buf.put_slice(b"next");
    let Some(StartupPacket::Startup(startup)) = decode_startup_packet(&mut buf).expect("valid")
    else {
        panic!("not a startup message");
    };
    assert_eq!(startup.minor_version, 0);
    assert_eq!(startup.parameters.len(), 4);
    assert_eq!(startup.get("database"), Some("app"));
    // The last of two wins, as in postgres.
    assert_eq!(startup.get("user"), Some("bob"));
    assert_eq!(startup.get("options"), None);
    assert_eq!(&buf[..], b"next", "only the packet is taken");
}

#[test]
fn a_packet_is_read_only_once_all_of_it_arrived() {
    let whole = startup_bytes(&[("user", "alice"), ("database", "app")]);
    for cut in 0..whole.len() {
        let mut buf = BytesMut::from(&whole[..cut]);
        assert_eq!(decode_startup_packet(&mut buf), Ok(None), "cut at {cut}");
        assert_eq!(buf.len(), cut, "nothing taken before the packet is whole");
    }
    assert!(matches!(
        decode_all(&whole),
        Ok(Some(StartupPacket::Startup(_)))
    ));
}

#[test]
fn ssl_gssenc_and_cancel_requests_are_recognized() {
    let mut ssl = BytesMut::new();
    frontend::ssl_request(&mut ssl);
    assert_eq!(decode_all(&ssl), Ok(Some(StartupPacket::SslRequest)));
    assert_eq!(
        decode_all(&packet(8, GSSENC_REQUEST_CODE, &[])),
        Ok(Some(StartupPacket::GssEncRequest))
    );
    let mut cancel = BytesMut::new();
    frontend::cancel_request(4242, -7, &mut cancel);
    assert_eq!(
        decode_all(&cancel),
        Ok(Some(StartupPacket::Cancel(CancelKey {
            process_id: 4242,
            secret_key: -7
        })))
    );
}

#[test]
fn requests_of_the_wrong_length_are_refused() {
    assert_eq!(
        decode_all(&packet(12, SSL_REQUEST_CODE, &[0; 4])),
        Err(CodecError::RequestLength {
            what: "SSLRequest",
            length: 12,
            expected: 8
        })
    );
    // A protocol 3.2 cancel key (longer than 4 bytes) is not one the front handed out.
    assert!(matches!(
        decode_all(&packet(20, CANCEL_REQUEST_CODE, &[0; 12])),
        Err(CodecError::RequestLength {
            what: "CancelRequest",
            ..
        })
    ));
    assert!(matches!(
        decode_all(&packet(12, CANCEL_REQUEST_CODE, &[0; 4])),
        Err(CodecError::RequestLength { .. })
    ));
}

#[test]
fn lengths_out_of_bounds_are_refused_before_waiting_for_the_body() {
    for length in [0, 4, 7, MAX_STARTUP_PACKET as u32 + 1, u32::MAX] {
        // Only the length has arrived: it is judged at once.
        assert_eq!(
            decode_all(&length.to_be_bytes()),
            Err(CodecError::StartupLength { length }),
            "length {length}"
        );
    }
    let longest = packet(MAX_STARTUP_PACKET as u32, 3 << 16, &[0]);
    assert_eq!(
        decode_all(&longest[..9]),
        Ok(None),
        "the longest packet is waited for"
    );
}

#[test]
fn other_protocol_versions_are_refused() {
    assert_eq!(
        decode_all(&packet(9, 2 << 16, &[0])),
        Err(CodecError::UnsupportedProtocol { major: 2, minor: 0 })
    );
    assert_eq!(
        decode_all(&packet(8, (1234 << 16) | 5681, &[])),
        Err(CodecError::UnsupportedProtocol {
            major: 1234,
            minor: 5681
        })
    );
    let body = b"_pq_.opt\0on\0user\0u\0\0";
    let Ok(Some(StartupPacket::Startup(startup))) =
        decode_all(&packet(8 + body.len() as u32, (3 << 16) | 2, body))
    else {
        panic!("3.2 is protocol 3");
    };
    assert_eq!(startup.minor_version, 2);
    assert_eq!(startup.protocol_options(), vec!["_pq_.opt".to_owned()]);
}

#[test]
fn malformed_parameters_are_refused() {
    let cases: [(&[u8], CodecError); 5] = [
        (
            b"",
            CodecError::StartupLayout("expected a terminator as last byte"),
        ),
        (
            b"user\0alice\0",
            CodecError::StartupLayout("expected a terminator as last byte"),
        ),
        (
            b"user\0",
            CodecError::StartupLayout("a parameter name without a value"),
        ),
        (
            b"user\0alice\0\0junk",
            CodecError::StartupLayout("bytes after the terminator"),
        ),
        (b"user\0\xff\xfe\0\0", CodecError::NotUtf8 { index: 0 }),
    ];
    for (body, error) in cases {
        let length = 8 + body.len() as u32;
        assert_eq!(
            decode_all(&packet(length, 3 << 16, body)),
            Err(error),
            "{body:?}"
        );
    }
}

#[test]
fn a_password_message_is_read_as_postgres_protocol_writes_it() {
    let mut buf = BytesMut::new();
    frontend::password_message(b"s3cret", &mut buf).expect("encodable");
    for cut in 0..buf.len() {
        assert_eq!(
            decode_auth_message(&mut BytesMut::from(&buf[..cut])),
            Ok(None)
        );
    }
    assert_eq!(
        decode_auth_message(&mut buf),
        Ok(Some(AuthMessage::Password(Bytes::from_static(b"s3cret"))))
    );
    assert!(buf.is_empty());
    let mut terminate = BytesMut::new();
    frontend::terminate(&mut terminate);
    assert_eq!(
        decode_auth_message(&mut terminate),
        Ok(Some(AuthMessage::Terminate))
    );
}

#[test]
fn hostile_password_messages_are_refused() {
    let mut query = BytesMut::new();
    frontend::query("SELECT 1", &mut query).expect("encodable");
    assert_eq!(
        decode_auth_message(&mut query),
        Err(CodecError::UnexpectedMessage { tag: 'Q' })
    );
    assert_eq!(
        decode_auth_message(&mut BytesMut::from(&b"p\0\0\0\x03"[..])),
        Err(CodecError::MessageLength {
            tag: 'p',
            length: 3
        })
    );
    assert_eq!(
        decode_auth_message(&mut BytesMut::from(&b"p\x7f\xff\xff\xff"[..])),
        Err(CodecError::MessageLength {
            tag: 'p',
            length: 0x7fff_ffff
        })
    );
    assert_eq!(
        decode_auth_message(&mut BytesMut::from(&b"p\0\0\0\x06ab"[..])),
        Err(CodecError::PasswordLayout)
    );
}

/// Parses what the front wrote as tokio-postgres would.
fn parse_backend(buf: &mut BytesMut) -> backend::Message {
    backend::Message::parse(buf)
        .expect("a valid message")
        .expect("a whole message")
}

#[test]
fn what_the_front_writes_parses_as_postgres_protocol_reads_it() {
    let mut buf = BytesMut::new();
    authentication_ok(&mut buf);
    authentication_cleartext_password(&mut buf);
    backend_key_data(
        CancelKey {
            process_id: 77,
            secret_key: -1,
        },
        &mut buf,
    );
    fatal_error("3D000", "no such \0 template", &mut buf);
    assert!(matches!(
        parse_backend(&mut buf),
        backend::Message::AuthenticationOk
    ));
    assert!(matches!(
        parse_backend(&mut buf),
        backend::Message::AuthenticationCleartextPassword
    ));
    let backend::Message::BackendKeyData(key) = parse_backend(&mut buf) else {
        panic!("not BackendKeyData");
    };
    assert_eq!((key.process_id(), key.secret_key()), (77, -1));
    let backend::Message::ErrorResponse(error) = parse_backend(&mut buf) else {
        panic!("not an ErrorResponse");
    };
    use fallible_iterator::FallibleIterator;
    let fields: Vec<(u8, String)> = error
        .fields()
        .map(|field| {
            Ok((
                field.type_(),
                String::from_utf8_lossy(field.value_bytes()).into_owned(),
            ))
        })
        .collect()
        .expect("fields");
    assert_eq!(
        fields,
        vec![
            (b'S', "FATAL".to_owned()),
            (b'V', "FATAL".to_owned()),
            (b'C', "3D000".to_owned()),
            (b'M', "no such   template".to_owned()),
        ]
    );
    assert!(buf.is_empty());
}

#[test]
fn negotiate_protocol_version_lists_the_unknown_options() {
    let mut buf = BytesMut::new();
    negotiate_protocol_version(0, &["_pq_.a".to_owned(), "_pq_.bc".to_owned()], &mut buf);
    let mut expected = BytesMut::new();
    expected.put_u8(b'v');
    expected.put_u32(4 + 4 + 4 + 7 + 8);
    expected.put_i32(0);
    expected.put_i32(2);
    expected.put_slice(b"_pq_.a\0_pq_.bc\0");
    assert_eq!(buf, expected);
}

/// Parameters as a driver may send them: no nul inside, names not empty.
fn parameter() -> impl Strategy<Value = (String, String)> {
    ("[^\0]{1,12}", "[^\0]{0,24}")
}

proptest! {
    #![proptest_config(pglease_pool::testing::proptest_config(
        "PGLEASE_FRONT_CODEC_CASES",
        2_000,
        proptest::test_runner::Config::default().max_shrink_iters
    ))]

    #[test]
    fn any_bytes_decode_to_packets_or_a_typed_error_without_panicking(
        bytes in prop::collection::vec(any::<u8>(), 0..256),
        length_prefix in prop::option::of(0u32..(MAX_STARTUP_PACKET as u32 + 16)),
    ) {
        // Half the inputs start with a plausible length, so that bodies get parsed too.
        let mut buf = BytesMut::new();
        if let Some(length) = length_prefix {
            buf.put_u32(length.min(8 + bytes.len() as u32));
        }
        buf.put_slice(&bytes);
        let mut left = buf.len();
        loop {
            match decode_startup_packet(&mut buf) {
                Ok(Some(_)) => {
                    prop_assert!(buf.len() < left, "a packet takes bytes");
                    prop_assert!(left - buf.len() <= MAX_STARTUP_PACKET);
                    left = buf.len();
                }
                Ok(None) => {
                    prop_assert_eq!(buf.len(), left, "waiting takes nothing");
                    break;
                }
                Err(error) => {
                    prop_assert!(!error.to_string().is_empty());
                    break;
                }
            }
        }
        let mut buf = BytesMut::from(&bytes[..]);
        let before = buf.len();
        match decode_auth_message(&mut buf) {
            Ok(Some(_)) => prop_assert!(buf.len() < before),
            Ok(None) => prop_assert_eq!(buf.len(), before),
            Err(_) => {}
        }
    }

    #[test]
    fn a_startup_message_arriving_in_any_pieces_decodes_to_its_parameters(
        parameters in prop::collection::vec(parameter(), 0..8),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..6),
    ) {
        let pairs: Vec<(&str, &str)> =
            parameters.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let whole = startup_bytes(&pairs);
        prop_assume!(whole.len() <= MAX_STARTUP_PACKET);
        let mut cuts: Vec<usize> = cuts.iter().map(|cut| cut.index(whole.len())).collect();
        cuts.sort_unstable();
        let mut buf = BytesMut::new();
        let mut from = 0;
        for cut in cuts {
            buf.put_slice(&whole[from..cut]);
            from = cut;
            prop_assert_eq!(decode_startup_packet(&mut buf), Ok(None));
        }
        buf.put_slice(&whole[from..]);
        let decoded = decode_startup_packet(&mut buf);
        prop_assert_eq!(
            decoded,
            Ok(Some(StartupPacket::Startup(Startup { minor_version: 0, parameters })))
        );
        prop_assert!(buf.is_empty());
    }
}
