//! Certificates made at test time: a CA per test cluster, a certificate per node naming it, all
//! written as PEM files into a directory that is removed when the test ends.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use maquis::Config;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A directory of PEM files, removed on drop.
pub struct Dir(PathBuf);

impl Dir {
    /// A fresh, empty directory under the system's temporary directory.
    pub fn new() -> Dir {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let path = std::env::temp_dir().join(format!(
            "maquis-tls-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).expect("temporary directory");
        Dir(path)
    }

    /// Writes `contents` to `name` in the directory; returns its path.
    pub fn write(&self, name: &str, contents: impl AsRef<[u8]>) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).expect("write a PEM file");
        path
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A certificate authority.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    /// Its certificate, PEM.
    pub pem: String,
}

/// A node's certificate and key, PEM.
pub struct NodeCert {
    /// The certificate.
    pub cert: String,
    /// Its private key.
    pub key: String,
}

impl Ca {
    /// A new self-signed CA.
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        Ca {
            pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A certificate for a node, naming `san` (a DNS subject alternative name), good for both
    /// server and client authentication.
    pub fn node(&self, san: &str) -> NodeCert {
        let mut params = CertificateParams::new(vec![san.to_string()]).expect("node parameters");
        params.distinguished_name.push(DnType::CommonName, san);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().expect("node key");
        let cert = params
            .signed_by(&key, &self.issuer)
            .expect("node certificate");
        NodeCert {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }
}

/// `cfg` with TLS on: a certificate from `issuer` naming `san`, and `trusted` (PEM, one or
/// more CA certificates) as the CAs peers must chain to; the files go into `dir`.
pub fn with_tls(mut cfg: Config, dir: &Dir, issuer: &Ca, san: &str, trusted: &str) -> Config {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let id = format!("{}-{}", cfg.node.name, NEXT.fetch_add(1, Ordering::Relaxed));
    let c = issuer.node(san);
    cfg.transport.tls = true;
    cfg.transport.tls_cert = Some(dir.write(&format!("{id}.crt"), &c.cert));
    cfg.transport.tls_key = Some(dir.write(&format!("{id}.key"), &c.key));
    cfg.transport.tls_ca = Some(dir.write(&format!("{id}-ca.crt"), trusted));
    cfg
}

/// `cfg` with TLS on, a certificate from `ca` that names the node, trusting `ca` only.
pub fn member(cfg: Config, dir: &Dir, ca: &Ca) -> Config {
    let name = cfg.node.name.clone();
    with_tls(cfg, dir, ca, &name, &ca.pem)
}
