//! TLS for the lanes (`transport.tls`): the node's certificate, key and CA read from PEM files
//! and checked, the rustls configurations of both roles, and the check that binds a certificate
//! to a node's name.
//!
//! # What is verified
//!
//! Mutual TLS 1.3 (rustls with the *ring* provider, set explicitly; no process-wide default is
//! used). Each side presents its certificate chain; the other requires it to chain to a CA of
//! `transport.tls_ca` (the acceptor with rustls' `WebPkiClientVerifier`, the dialer with
//! [`ChainVerifier`]). Nodes are dialed by address, and a join does not know the name of the
//! node it dials, so the TLS layer checks only the chain; the name is checked by the transport
//! as soon as the cookie handshake says which node is at the other end ([`check_name`]): the
//! acceptor's `Challenge` for the dialer, the dialer's `Hello` for the acceptor. A node's
//! certificate must carry the node's name (`node.name`) as a DNS name among its subject
//! alternative names, and each side refuses a peer whose certificate names another node. So a
//! certificate issued for one node cannot be used to act as another, in either role.
//!
//! Sessions are never resumed (no tickets, no session cache): lanes live long, and every
//! connection shows its certificate afresh.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, DnsName, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::{NoServerSessionStorage, ParsedCertificate, WebPkiClientVerifier};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use thiserror::Error;

/// The largest PEM file read (a CA bundle of a few hundred certificates fits).
pub(crate) const MAX_PEM_BYTES: u64 = 4 * 1024 * 1024;

/// What is wrong with one of the TLS files.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum TlsFileError {
    /// The file cannot be read (missing, not permitted, a directory, too large).
    #[error("cannot be read: {0}")]
    Unreadable(String),
    /// The file is not valid PEM.
    #[error("is not valid PEM: {0}")]
    NotPem(String),
    /// The file holds no PEM block of the kind needed.
    #[error("holds no {0}")]
    Empty(&'static str),
    /// The private key does not belong to the certificate.
    #[error("does not match the certificate of transport.tls_cert")]
    KeyMismatch,
    /// The node's own certificate does not chain to a CA of `transport.tls_ca` (or has
    /// expired): every other node would refuse it.
    #[error("is not accepted by transport.tls_ca: {0}")]
    NotTrusted(String),
    /// The node's own certificate does not carry its name: every other node would refuse it.
    #[error(
        "does not name this node: {0:?} (node.name) is not a DNS name among its subject \
         alternative names"
    )]
    WrongName(String),
    /// The contents cannot be used (an unsupported key type, a CA certificate that cannot be
    /// a trust anchor).
    #[error("cannot be used: {0}")]
    Unusable(String),
}

/// Which of the three files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TlsFile {
    /// The node's certificate chain.
    Cert,
    /// The node's private key.
    Key,
    /// The CAs peers must chain to.
    Ca,
}

/// A file that failed, and why.
#[derive(Debug)]
pub(crate) struct LoadError {
    /// Which file.
    pub(crate) file: TlsFile,
    /// Its path.
    pub(crate) path: PathBuf,
    /// What is wrong.
    pub(crate) problem: TlsFileError,
}

/// The TLS configurations of a node, both roles.
#[derive(Clone)]
pub(crate) struct Tls {
    /// For the connections this node dials.
    pub(crate) client: Arc<ClientConfig>,
    /// For the connections it accepts.
    pub(crate) server: Arc<ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tls")
    }
}

/// The files of a node's TLS: certificate chain, private key, CA bundle.
pub(crate) struct TlsPaths<'a> {
    /// `transport.tls_cert`.
    pub(crate) cert: &'a Path,
    /// `transport.tls_key`.
    pub(crate) key: &'a Path,
    /// `transport.tls_ca`.
    pub(crate) ca: &'a Path,
}

fn read_pem(path: &Path) -> Result<Vec<u8>, TlsFileError> {
    let file = std::fs::File::open(path).map_err(|e| TlsFileError::Unreadable(e.to_string()))?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| TlsFileError::Unreadable(e.to_string()))?;
    if bytes.len() as u64 > MAX_PEM_BYTES {
        return Err(TlsFileError::Unreadable(format!(
            "larger than {} MiB",
            MAX_PEM_BYTES >> 20
        )));
    }
    Ok(bytes)
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let bytes = read_pem(path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsFileError::NotPem(e.to_string()))?;
    if certs.is_empty() {
        return Err(TlsFileError::Empty("CERTIFICATE block"));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    let bytes = read_pem(path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsFileError::Empty(
            "private key (PRIVATE KEY, RSA PRIVATE KEY or EC PRIVATE KEY block)",
        ),
        e => TlsFileError::NotPem(e.to_string()),
    })
}

/// The crypto provider every TLS configuration of the node uses.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl Tls {
    /// Reads and checks the files, and builds both configurations. `name` is the node's name,
    /// which its certificate must carry.
    pub(crate) fn load(paths: &TlsPaths<'_>, name: &str) -> Result<Tls, LoadError> {
        let fail = |file, path: &Path| {
            let path = path.to_path_buf();
            move |problem| LoadError {
                file,
                path: path.clone(),
                problem,
            }
        };
        let cert_err = fail(TlsFile::Cert, paths.cert);
        let key_err = fail(TlsFile::Key, paths.key);
        let ca_err = fail(TlsFile::Ca, paths.ca);
        let certs = certificates(paths.cert).map_err(&cert_err)?;
        let key = private_key(paths.key).map_err(&key_err)?;
        let cas = certificates(paths.ca).map_err(&ca_err)?;
        let mut roots = RootCertStore::empty();
        for ca in cas {
            roots
                .add(ca)
                .map_err(|e| ca_err(TlsFileError::Unusable(e.to_string())))?;
        }
        let roots = Arc::new(roots);
        let provider = provider();

        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .map_err(|e| ca_err(TlsFileError::Unusable(e.to_string())))?;

        // The node's own certificate: would the others take it, in both roles?
        let parsed = ParsedCertificate::try_from(&certs[0])
            .map_err(|e| cert_err(TlsFileError::Unusable(e.to_string())))?;
        let now = UnixTime::now();
        let not_trusted =
            |e: rustls::Error| cert_err(TlsFileError::NotTrusted(plain_certificate_error(&e)));
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &roots,
            &certs[1..],
            now,
            provider.signature_verification_algorithms.all,
        )
        .map_err(not_trusted)?;
        client_verifier
            .verify_client_cert(&certs[0], &certs[1..], now)
            .map_err(not_trusted)?;
        if check_name(Some(&certs), name).is_err() {
            return Err(cert_err(TlsFileError::WrongName(name.to_string())));
        }

        let key_problem = |e: rustls::Error| match e {
            rustls::Error::InconsistentKeys(_) => key_err(TlsFileError::KeyMismatch),
            e => key_err(TlsFileError::Unusable(e.to_string())),
        };
        let versions = [&rustls::version::TLS13];
        let mut server = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions)
            .map_err(|e| key_err(TlsFileError::Unusable(e.to_string())))?
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(key_problem)?;
        server.session_storage = Arc::new(NoServerSessionStorage {});
        server.send_tls13_tickets = 0;
        let verifier = Arc::new(ChainVerifier {
            roots,
            provider: provider.clone(),
        });
        let mut client = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&versions)
            .map_err(|e| key_err(TlsFileError::Unusable(e.to_string())))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_auth_cert(certs, key)
            .map_err(key_problem)?;
        client.resumption = rustls::client::Resumption::disabled();
        client.enable_sni = false;
        Ok(Tls {
            client: Arc::new(client),
            server: Arc::new(server),
        })
    }
}

/// Checks that the end-entity certificate of `certs` (a peer's chain, already verified against
/// the CAs) names the node `name`: `name` is a DNS name in lower case, among its subject
/// alternative names.
pub(crate) fn check_name(certs: Option<&[CertificateDer<'_>]>, name: &str) -> Result<(), String> {
    let Some(end_entity) = certs.and_then(|c| c.first()) else {
        return Err("it presented no certificate".into());
    };
    if !is_certificate_name(name) {
        return Err(format!(
            "{name:?} is not a DNS name in lower case, so no certificate names it"
        ));
    }
    let dns = DnsName::try_from(name).map_err(|_| format!("{name:?} is not a DNS name"))?;
    let parsed = ParsedCertificate::try_from(end_entity)
        .map_err(|e| format!("its certificate cannot be parsed: {e}"))?;
    rustls::client::verify_server_name(&parsed, &ServerName::DnsName(dns))
        .map_err(|_| format!("its TLS certificate does not name {name}"))
}

/// Whether a certificate can name the node `name`: a DNS name (letters, digits, `-` and `_` in
/// labels of at most 63 bytes, separated by dots) in lower case. Certificates' names compare
/// ignoring case, so a node named `A` could otherwise act with the certificate of a node `a`.
pub(crate) fn is_certificate_name(name: &str) -> bool {
    DnsName::try_from(name).is_ok() && !name.bytes().any(|b| b.is_ascii_uppercase())
}

/// A certificate error in the words of this configuration.
fn plain_certificate_error(e: &rustls::Error) -> String {
    use rustls::CertificateError as C;
    match e {
        rustls::Error::InvalidCertificate(C::UnknownIssuer) => {
            "not signed by a CA of transport.tls_ca".into()
        }
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => {
            "expired".into()
        }
        rustls::Error::InvalidCertificate(C::NotValidYet | C::NotValidYetContext { .. }) => {
            "not valid yet".into()
        }
        other => other.to_string(),
    }
}

/// A TLS failure in the words of this runtime: what the other node did or lacks.
pub(crate) fn describe(e: &rustls::Error) -> String {
    use rustls::AlertDescription as A;
    match e {
        rustls::Error::InvalidCertificate(_) => {
            format!(
                "the other node's certificate was refused: {}",
                plain_certificate_error(e)
            )
        }
        rustls::Error::NoCertificatesPresented => "the other node presented no certificate".into(),
        rustls::Error::AlertReceived(
            alert @ (A::BadCertificate
            | A::UnknownCA
            | A::CertificateRequired
            | A::CertificateExpired
            | A::CertificateUnknown
            | A::UnsupportedCertificate
            | A::CertificateRevoked
            | A::AccessDenied),
        ) => format!(
            "the other node refused this node's certificate ({alert:?}): does its \
             transport.tls_ca hold the CA that signed it?"
        ),
        rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
            format!("not a TLS handshake ({e}): is transport.tls off on the other node?")
        }
        other => other.to_string(),
    }
}

/// The dialer's verifier: the acceptor's chain must lead to a CA of `transport.tls_ca`, valid
/// now, for server authentication. The name is not checked here (a join dials an address
/// without knowing whose it is): the transport checks it against the node the cookie handshake
/// names ([`check_name`]) before the connection is used.
#[derive(Debug)]
struct ChainVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for ChainVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
