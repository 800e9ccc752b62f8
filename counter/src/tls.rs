//! gRPC over TLS, and mutual TLS: the server's certificate and key, and
//! optionally a client CA (then every client shows a certificate that CA
//! signed) and the client names allowed (a SAN of the client's
//! certificate). rustls, with ring as its crypto provider.
//!
//! The files are read again every `--reload-interval-ms` and a new
//! configuration built when their contents changed; each connection takes
//! the configuration current when it arrives (an `Arc` cloned, no file
//! read). A rotation (cert-manager, a mounted Secret) needs no restart, and
//! connections already open go on with the configuration they started
//! with. A set of files that does not load (a key that is not the
//! certificate's, half of a rotation written) keeps the last good one.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

use crate::metrics::Metrics;

/// A client has this long to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What the flags name.
#[derive(Clone, Debug)]
pub struct Files {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
    /// The client names allowed (DNS names or IP addresses); empty: any
    /// certificate the client CA signed.
    pub client_sans: Vec<String>,
}

impl Files {
    /// The paths read, in the order their contents are compared.
    fn paths(&self) -> impl Iterator<Item = &PathBuf> {
        [&self.cert, &self.key].into_iter().chain(&self.client_ca)
    }
}

/// The TLS side of the gRPC listener: the configuration now, and the
/// contents it was built from.
pub struct Tls {
    files: Files,
    sans: Vec<ServerName<'static>>,
    current: RwLock<Arc<ServerConfig>>,
    /// The contents of the files last tried (loaded or refused), so that
    /// an unchanged set is neither built nor reported again.
    tried: Mutex<Vec<Vec<u8>>>,
    metrics: Arc<Metrics>,
}

/// ring: aws-lc-rs (rustls's default) needs cmake and nasm to build. rustls
/// 0.23.48 marks it deprecated for want of post-quantum key exchange; the
/// classical suites it offers are what Envoy's gRPC client negotiates.
#[allow(deprecated)]
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(path: &PathBuf) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))
}

/// One configuration from the files' contents (cert, key, client CA).
fn build(
    files: &Files,
    sans: &[ServerName<'static>],
    contents: &[Vec<u8>],
) -> Result<ServerConfig, String> {
    let (cert_pem, key_pem, ca_pem) = match contents {
        [c, k] => (c, k, None),
        [c, k, ca] => (c, k, Some(ca)),
        _ => return Err("internal: the files read do not match the flags".to_string()),
    };
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", files.cert.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate (PEM)", files.cert.display()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| format!("{}: no private key (PEM): {e}", files.key.display()))?;
    let provider = provider();
    let builder = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(rustls::DEFAULT_VERSIONS)
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match (ca_pem, &files.client_ca) {
        (Some(ca_pem), Some(ca_path)) => {
            let mut roots = RootCertStore::empty();
            for c in CertificateDer::pem_slice_iter(ca_pem) {
                let c = c.map_err(|e| format!("{}: {e}", ca_path.display()))?;
                roots
                    .add(c)
                    .map_err(|e| format!("{}: {e}", ca_path.display()))?;
            }
            if roots.is_empty() {
                return Err(format!("{}: no certificate (PEM)", ca_path.display()));
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{}: {e}", ca_path.display()))?;
            builder.with_client_cert_verifier(Arc::new(AllowedNames {
                inner: verifier,
                sans: sans.to_vec(),
            }))
        }
        _ => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs, key)
        .map_err(|e| format!("{} and {}: {e}", files.cert.display(), files.key.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

impl Tls {
    /// Reads and checks the files at start: an error, saying why, is fatal.
    pub fn load(files: Files, metrics: Arc<Metrics>) -> Result<Tls, String> {
        let sans = files
            .client_sans
            .iter()
            .map(|n| {
                ServerName::try_from(n.clone()).map_err(|e| {
                    format!("--tls-client-san {n:?}: not a DNS name or an IP address: {e}")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let contents = files.paths().map(read).collect::<Result<Vec<_>, _>>()?;
        let config = build(&files, &sans, &contents)?;
        Ok(Tls {
            files,
            sans,
            current: RwLock::new(Arc::new(config)),
            tried: Mutex::new(contents),
            metrics,
        })
    }

    /// Reads the files again; a new configuration for the connections to
    /// come when they changed and load, else the last good one kept (said
    /// once per set of contents).
    pub fn reload(&self) {
        let contents = match self.files.paths().map(read).collect::<Result<Vec<_>, _>>() {
            Ok(c) => c,
            // Between the removal and the creation of a file: the next
            // check sees the new one.
            Err(_) => return,
        };
        let mut tried = self
            .tried
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *tried == contents {
            return;
        }
        match build(&self.files, &self.sans, &contents) {
            Ok(config) => {
                *self
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(config);
                eprintln!(
                    "ratelimit-counter: TLS: loaded {} again",
                    self.files
                        .paths()
                        .map(|p| p.display().to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            Err(e) => eprintln!("ratelimit-counter: TLS: {e}; keeping the last good certificate"),
        }
        *tried = contents;
    }

    fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(
            self.current
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        )
    }

    fn handshake_failed(&self, peer: std::net::SocketAddr, why: &str) {
        let n = self
            .metrics
            .tls_handshakes_failed
            .fetch_add(1, Ordering::Relaxed)
            + 1;
        // The first few, then one in a thousand: a client that retries in
        // a loop does not flood the log.
        if n <= 10 || n % 1000 == 0 {
            eprintln!("ratelimit-counter: TLS handshake from {peer} refused: {why} ({n} so far)");
        }
    }
}

/// The gRPC server's connections: each accepted, its handshake done in a
/// task of its own (a slow client holds no other), then handed to tonic.
/// Ends, closing the listener, when tonic stops taking connections.
pub fn incoming(
    listener: TcpListener,
    tls: Arc<Tls>,
    limits: &crate::limits::Limits,
) -> impl futures_util::Stream<Item = Result<crate::limits::Conn<TlsStream<TcpStream>>, std::io::Error>>
{
    crate::limits::accept(
        listener,
        limits.grpc_max_connections,
        limits,
        move |tcp, peer| {
            let tls = tls.clone();
            async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.acceptor().accept(tcp)).await {
                    Ok(Ok(stream)) => Some(stream),
                    Ok(Err(e)) => {
                        tls.handshake_failed(peer, &e.to_string());
                        None
                    }
                    Err(_) => {
                        tls.handshake_failed(peer, "no handshake within 10 s");
                        None
                    }
                }
            }
        },
    )
}

/// The client CA's verifier, and then the names allowed: a certificate the
/// CA signed whose SANs name none of them is refused.
#[derive(Debug)]
struct AllowedNames {
    inner: Arc<dyn ClientCertVerifier>,
    sans: Vec<ServerName<'static>>,
}

impl ClientCertVerifier for AllowedNames {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if self.sans.is_empty() {
            return Ok(verified);
        }
        let cert = webpki::EndEntityCert::try_from(end_entity).map_err(|_| {
            rustls::Error::InvalidCertificate(rustls::CertificateError::BadEncoding)
        })?;
        if self
            .sans
            .iter()
            .any(|name| cert.verify_is_valid_for_subject_name(name).is_ok())
        {
            Ok(verified)
        } else {
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
