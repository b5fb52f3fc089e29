//! The front's TLS configuration: the operator's files read and checked (each refusal
//! naming the file), the self-signed certificate's names, and handshakes in memory with a
//! rustls client that trusts the certificate.

use std::path::PathBuf;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;

/// A fresh directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pglease-front-tls-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the scratch directory");
    dir
}

/// A certificate for `localhost` and its key, PEM, as an operator would have them.
fn pem_pair() -> (String, String) {
    let key = rcgen::KeyPair::generate().expect("a key");
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
    let cert = params.self_signed(&key).expect("a certificate");
    (cert.pem(), key.serialize_pem())
}

/// Writes `cert` and `key` into `dir`; returns their paths.
fn write_pair(dir: &Path, cert: &str, key: &str) -> (PathBuf, PathBuf) {
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert_path, cert).expect("write the certificate");
    std::fs::write(&key_path, key).expect("write the key");
    (cert_path, key_path)
}

/// Runs a handshake between `tls` and a client that trusts `trusted` and asks for
/// `server_name` (offering ALPN `postgresql`), then one byte each way. Returns the ALPN
/// protocol agreed on.
async fn handshake(
    tls: &FrontTls,
    trusted: CertificateDer<'static>,
    server_name: &str,
) -> std::io::Result<Option<Vec<u8>>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trusted).expect("a trust anchor");
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from(server_name.to_owned()).expect("a server name");
    let (client_end, server_end) = tokio::io::duplex(64 * 1024);
    let server = async {
        let mut stream = tls.acceptor().accept(server_end).await?;
        stream.write_all(b"s").await?;
        stream.flush().await?;
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await?;
        assert_eq!(&byte, b"c");
        Ok::<_, std::io::Error>(())
    };
    let client = async {
        let mut stream = connector.connect(name, client_end).await?;
        let mut byte = [0u8; 1];
        stream.read_exact(&mut byte).await?;
        assert_eq!(&byte, b"s");
        stream.write_all(b"c").await?;
        stream.flush().await?;
        Ok::<_, std::io::Error>(stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec))
    };
    let (served, alpn) = tokio::join!(server, client);
    let alpn = alpn?;
    served?;
    Ok(alpn)
}

#[tokio::test]
async fn the_operators_files_serve_a_handshake_a_client_verifies() {
    let dir = scratch("files");
    let (cert, key) = pem_pair();
    let (cert_path, key_path) = write_pair(&dir, &cert, &key);
    let tls = FrontTls::from_pem_files(&cert_path, &key_path).expect("the pair loads");
    assert_eq!(
        tls.source(),
        &TlsSource::Files {
            cert: cert_path.clone(),
            key: key_path.clone()
        }
    );
    let trusted = CertificateDer::from_pem_slice(cert.as_bytes()).expect("the certificate");
    let alpn = handshake(&tls, trusted, "localhost")
        .await
        .expect("a handshake");
    assert_eq!(alpn.as_deref(), Some(&b"postgresql"[..]), "postgres' ALPN");
    // The debug form shows where the certificate is from, not the key.
    let shown = format!("{tls:?}");
    assert!(
        shown.contains("cert.pem") && !shown.contains("PRIVATE"),
        "{shown}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn the_self_signed_certificate_names_loopback_and_the_listen_address() {
    let listen: IpAddr = "192.0.2.7".parse().expect("an address");
    let (cert, key) = self_signed_certificate(listen).expect("a certificate");
    let provider = provider();
    let signing_key = provider.key_provider.load_private_key(key).expect("a key");
    let tls = FrontTls {
        config: server_config(provider, CertifiedKey::new(vec![cert.clone()], signing_key))
            .expect("a configuration"),
        source: TlsSource::SelfSigned,
    };
    for name in ["localhost", "127.0.0.1", "::1", "192.0.2.7"] {
        handshake(&tls, cert.clone(), name)
            .await
            .unwrap_or_else(|error| panic!("{name}: {error}"));
    }
    let error = handshake(&tls, cert.clone(), "example.com")
        .await
        .expect_err("a name the certificate does not have");
    assert!(error.to_string().contains("certificate"), "{error}");
    // The public one is what the daemon starts with.
    let tls = FrontTls::self_signed("0.0.0.0".parse().expect("an address")).expect("made");
    assert_eq!(tls.source(), &TlsSource::SelfSigned);
}

#[test]
fn a_missing_or_unreadable_file_is_refused_naming_it() {
    let dir = scratch("missing");
    let (cert, key) = pem_pair();
    let (cert_path, _) = write_pair(&dir, &cert, &key);
    let missing = dir.join("nope.pem");
    let error = FrontTls::from_pem_files(&cert_path, &missing).expect_err("no key file");
    assert!(
        matches!(error, TlsError::Read { what: "key", .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(
        message.contains("key") && message.contains(&*missing.to_string_lossy()),
        "{message}"
    );
    assert!(message.contains("No such file"), "{message}");
    // A directory is no certificate either.
    let error = FrontTls::from_pem_files(&dir, &cert_path).expect_err("a directory");
    assert!(
        matches!(
            error,
            TlsError::Read {
                what: "certificate",
                ..
            }
        ),
        "{error:?}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn garbage_and_the_wrong_pem_are_refused_naming_the_file_and_not_its_content() {
    let dir = scratch("garbage");
    let (cert, key) = pem_pair();
    let (cert_path, key_path) = write_pair(&dir, &cert, &key);
    let garbage = dir.join("garbage.pem");
    std::fs::write(&garbage, "not a certificate at all, s3cret\n").expect("write");
    let error = FrontTls::from_pem_files(&garbage, &key_path).expect_err("garbage");
    let message = error.to_string();
    assert!(
        message.contains(&*garbage.to_string_lossy()) && message.contains("no certificate"),
        "{message}"
    );
    assert!(!message.contains("s3cret"), "{message}");
    let error = FrontTls::from_pem_files(&cert_path, &garbage).expect_err("garbage key");
    assert!(error.to_string().contains("no private key"), "{error}");
    // The certificate where the key should be.
    let error = FrontTls::from_pem_files(&cert_path, &cert_path).expect_err("no key in it");
    assert!(
        matches!(error, TlsError::Pem { what: "key", .. }),
        "{error:?}"
    );
    // A PEM section cut short.
    let cut = dir.join("cut.pem");
    std::fs::write(&cut, &cert[..cert.len() / 2]).expect("write");
    let error = FrontTls::from_pem_files(&cut, &key_path).expect_err("cut short");
    assert!(error.to_string().contains("-----END"), "{error}");
    // Too big to be a certificate.
    let big = dir.join("big.pem");
    std::fs::write(&big, vec![b'x'; MAX_PEM_FILE as usize + 1]).expect("write");
    let error = FrontTls::from_pem_files(&big, &key_path).expect_err("too big");
    assert!(matches!(error, TlsError::TooBig { .. }), "{error:?}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_key_that_is_not_the_certificates_is_refused() {
    let dir = scratch("mismatch");
    let (cert, _) = pem_pair();
    let (_, other_key) = pem_pair();
    let (cert_path, key_path) = write_pair(&dir, &cert, &other_key);
    let error = FrontTls::from_pem_files(&cert_path, &key_path).expect_err("another key");
    assert!(matches!(error, TlsError::Mismatch { .. }), "{error:?}");
    let message = error.to_string();
    assert!(
        message.contains("key.pem") && message.contains("cert.pem"),
        "{message}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
