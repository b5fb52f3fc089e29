//! TLS at the front (`--front-tls`): the rustls server configuration a connection's
//! handshake runs with, made once at start from the operator's certificate and key files
//! (PEM) or from a self-signed certificate made in memory. rustls with ring, the provider
//! the rest of the daemon's TLS (reqwest's) already uses.
//!
//! It reads the two files once, with the daemon's rights: they are the operator's own
//! configuration, never a client's. The handshake itself and what runs over it are the
//! session's (`session.rs`, `client.rs`).

use std::io::Read;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::{self, PemObject};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::ServerConfig;
use rustls::sign::{CertifiedKey, SingleCertAndKey};

/// The most a certificate or key file may hold: a chain of a few certificates is a few
/// KiB; anything this big is not one (a device, a log file named by mistake).
const MAX_PEM_FILE: u64 = 1 << 20;

/// The protocol name PostgreSQL 17 servers and clients agree on in TLS's ALPN: libpq 17
/// and later offer it, and postgres answers with it.
pub(crate) const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// Where the front's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsSource {
    /// Made in memory at start, for `localhost`, `127.0.0.1`, `::1` and the listen
    /// address: encrypts, proves nothing (clients cannot verify it).
    SelfSigned,
    /// The operator's files (PEM).
    Files {
        /// The certificate chain, the server's own first.
        cert: PathBuf,
        /// Its private key.
        key: PathBuf,
    },
}

/// The front's TLS: what a client's handshake runs with, and where its certificate came
/// from. Cheap to clone.
#[derive(Clone)]
pub struct FrontTls {
    config: Arc<ServerConfig>,
    source: TlsSource,
}

impl std::fmt::Debug for FrontTls {
    // The source only: the configuration holds the private key.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrontTls")
            .field("source", &self.source)
            .finish_non_exhaustive()
    }
}

/// Why the front's TLS cannot be set up; each names the file and the reason, never what
/// the file holds.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file cannot be read.
    #[error("the PostgreSQL front's TLS {what} {}: cannot read it: {source}", .path.display())]
    Read {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file is too big to be a certificate or a key.
    #[error("the PostgreSQL front's TLS {what} {}: more than {MAX_PEM_FILE} bytes, too big for a PEM {what}", .path.display())]
    TooBig {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// A file holds no PEM item of the kind expected, or a broken one.
    #[error("the PostgreSQL front's TLS {what} {}: {reason}", .path.display())]
    Pem {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The key does not belong to the certificate.
    #[error(
        "the PostgreSQL front's TLS key {} is not the key of the certificate {}",
        .key.display(), .cert.display()
    )]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
    },
    /// rustls refused the configuration (no safe protocol version, say).
    #[error("the PostgreSQL front's TLS: {0}")]
    Rustls(#[from] rustls::Error),
    /// The self-signed certificate could not be made.
    #[error("the PostgreSQL front's self-signed TLS certificate: {0}")]
    SelfSigned(#[from] rcgen::Error),
}

impl FrontTls {
    /// A certificate made now, in memory, for `localhost`, `127.0.0.1`, `::1` and
    /// `listen` (unless it is 0.0.0.0 or ::, which no client connects to), with a new
    /// ECDSA P-256 key. Nothing is written to disk.
    pub fn self_signed(listen: IpAddr) -> Result<Self, TlsError> {
        let (cert, key) = self_signed_certificate(listen)?;
        let provider = provider();
        let signing_key = provider.key_provider.load_private_key(key)?;
        let certified = CertifiedKey::new(vec![cert], signing_key);
        Ok(FrontTls {
            config: server_config(provider, certified)?,
            source: TlsSource::SelfSigned,
        })
    }

    /// The certificate chain in `cert` and the private key in `key`, both PEM (PKCS#8,
    /// PKCS#1 or SEC1 for the key, RSA, ECDSA or Ed25519), read now, once. The key must be
    /// the certificate's.
    pub fn from_pem_files(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let pem_error = |what, path: &Path, error| TlsError::Pem {
            what,
            path: path.to_owned(),
            reason: pem_reason(what, &error),
        };
        // The certificate first, then the key: of two broken files, the same is named first
        // each time.
        let chain = CertificateDer::pem_slice_iter(&read_pem_file("certificate", cert)?)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|error| pem_error("certificate", cert, error))?;
        if chain.is_empty() {
            return Err(pem_error("certificate", cert, pem::Error::NoItemsFound));
        }
        let private_key = PrivateKeyDer::from_pem_slice(&read_pem_file("key", key)?)
            .map_err(|error| pem_error("key", key, error))?;
        let provider = provider();
        let signing_key = provider
            .key_provider
            .load_private_key(private_key)
            .map_err(|error| TlsError::Pem {
                what: "key",
                path: key.to_owned(),
                reason: format!("not a key rustls can use: {error}"),
            })?;
        let certified = CertifiedKey::new(chain, signing_key);
        match certified.keys_match() {
            // A key whose public half rustls cannot tell (none of ring's) is not refused
            // here; the handshake would be.
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
            Err(rustls::Error::InconsistentKeys(_)) => {
                return Err(TlsError::Mismatch {
                    cert: cert.to_owned(),
                    key: key.to_owned(),
                })
            }
            Err(error) => {
                return Err(TlsError::Pem {
                    what: "certificate",
                    path: cert.to_owned(),
                    reason: format!("its first certificate cannot be read: {error}"),
                })
            }
        }
        Ok(FrontTls {
            config: server_config(provider, certified)?,
            source: TlsSource::Files {
                cert: cert.to_owned(),
                key: key.to_owned(),
            },
        })
    }

    /// Where its certificate comes from.
    pub fn source(&self) -> &TlsSource {
        &self.source
    }

    /// The acceptor a connection's handshake runs with.
    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(Arc::clone(&self.config))
    }
}

/// A self-signed certificate for `localhost`, `127.0.0.1`, `::1` and `listen` (unless it
/// is 0.0.0.0 or ::), and its new ECDSA P-256 key.
fn self_signed_certificate(
    listen: IpAddr,
) -> Result<(CertificateDer<'static>, PrivateKeyDer<'static>), rcgen::Error> {
    let mut names = vec!["localhost".to_owned(), "127.0.0.1".into(), "::1".into()];
    let listen_name = listen.to_string();
    if !listen.is_unspecified() && !names.contains(&listen_name) {
        names.push(listen_name);
    }
    let key = rcgen::KeyPair::generate()?;
    let mut params = rcgen::CertificateParams::new(names)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "pglease PostgreSQL front");
    let cert = params.self_signed(&key)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    Ok((cert.der().clone(), key))
}

/// ring, as reqwest uses it: one provider in the binary.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A server configuration with rustls' safe defaults (TLS 1.2 and 1.3, no client
/// certificates) serving `certified`.
fn server_config(
    provider: Arc<CryptoProvider>,
    certified: CertifiedKey,
) -> Result<Arc<ServerConfig>, TlsError> {
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    config.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    Ok(Arc::new(config))
}

/// The bytes of `path`, at most [`MAX_PEM_FILE`].
fn read_pem_file(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    let read_error = |source| TlsError::Read {
        what,
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > MAX_PEM_FILE {
        return Err(TlsError::TooBig {
            what,
            path: path.to_owned(),
        });
    }
    Ok(bytes)
}

/// What is wrong with a PEM file, in words that quote none of it.
fn pem_reason(what: &str, error: &pem::Error) -> String {
    match error {
        pem::Error::NoItemsFound => match what {
            "key" => "no private key in it (PEM: -----BEGIN PRIVATE KEY-----, or RSA / EC)".into(),
            _ => "no certificate in it (PEM: -----BEGIN CERTIFICATE-----)".into(),
        },
        pem::Error::MissingSectionEnd { .. } => "a PEM section has no -----END line".into(),
        pem::Error::IllegalSectionStart { .. } => "a malformed -----BEGIN line".into(),
        pem::Error::Base64Decode(_) => "a PEM section is not valid base64".into(),
        pem::Error::SectionTooLarge => "a PEM section is too large".into(),
        error => format!("not PEM: {error}"),
    }
}

#[cfg(test)]
mod tests;
