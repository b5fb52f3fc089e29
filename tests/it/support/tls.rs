//! TLS for tokio-postgres in the tests: a connector on tokio-rustls (ring) that either
//! trusts one certificate (and checks the server's name against it, as `verify-full` does)
//! or trusts any (as libpq's `sslmode=require` does), and counts its handshakes, so that a
//! test can tell a TLS connection from a plain one on the client's side.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect, TlsStream};

/// A tokio-postgres TLS connector; clones share the handshake count.
#[derive(Clone)]
pub struct TestTls {
    config: Arc<ClientConfig>,
    handshakes: Arc<AtomicUsize>,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TestTls {
    /// Trusts any certificate, as `sslmode=require` does.
    pub fn trusting_any() -> Self {
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider())))
            .with_no_client_auth();
        Self::with(config)
    }

    /// Trusts `cert` only, for the host name or address connected to.
    pub fn trusting(cert: CertificateDer<'static>) -> Self {
        let mut roots = RootCertStore::empty();
        roots.add(cert).expect("a trust anchor");
        let config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        Self::with(config)
    }

    /// Offers ALPN `alpn` in its handshakes, as libpq 17 offers `postgresql`.
    pub fn offering_alpn(self, alpn: &[u8]) -> Self {
        let mut config = (*self.config).clone();
        config.alpn_protocols = vec![alpn.to_vec()];
        Self::with(config)
    }

    fn with(config: ClientConfig) -> Self {
        TestTls {
            config: Arc::new(config),
            handshakes: Arc::default(),
        }
    }

    /// How many TLS handshakes succeeded through it (and its clones).
    pub fn handshakes(&self) -> usize {
        self.handshakes.load(Ordering::SeqCst)
    }
}

impl<S> MakeTlsConnect<S> for TestTls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TestTlsStream<S>;
    type TlsConnect = TestTlsConnect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, domain: &str) -> Result<TestTlsConnect, Self::Error> {
        Ok(TestTlsConnect {
            tls: self.clone(),
            name: ServerName::try_from(domain.to_owned())?,
        })
    }
}

/// One connection's handshake.
pub struct TestTlsConnect {
    tls: TestTls,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for TestTlsConnect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TestTlsStream<S>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<TestTlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let connector = tokio_rustls::TlsConnector::from(Arc::clone(&self.tls.config));
            let stream = connector.connect(self.name, stream).await?;
            self.tls.handshakes.fetch_add(1, Ordering::SeqCst);
            Ok(TestTlsStream(stream))
        })
    }
}

/// A TLS connection to the server.
pub struct TestTlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream for TestTlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        // The front asks for a clear-text password at most, never SCRAM with binding.
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TestTlsStream<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TestTlsStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().0).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().0).poll_shutdown(cx)
    }
}

/// A verifier that takes any certificate, but still checks the handshake's signatures.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
