//! Certificates for the benchmarks' TLS cells: a CA made for the run and a certificate per node,
//! written as PEM files into the run's output directory (`ca.crt`, `<name>.crt`, `<name>.key`),
//! where the agents' `--tls-dir` finds them.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

fn fail(what: &str) -> impl Fn(rcgen::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

/// Writes a fresh CA and a certificate naming each of `nodes` into `dir` (created if needed);
/// returns the directory as an absolute path.
pub fn write(dir: &Path, nodes: &[&str]) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(fail("CA"))?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "maquis-bench CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().map_err(fail("CA key"))?;
    write(
        "ca.crt",
        &ca.self_signed(&ca_key).map_err(fail("CA"))?.pem(),
    )?;
    let issuer = Issuer::new(ca, ca_key);
    for node in nodes {
        let mut params =
            CertificateParams::new(vec![node.to_string()]).map_err(fail("certificate"))?;
        params.distinguished_name.push(DnType::CommonName, *node);
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let key = KeyPair::generate().map_err(fail("key"))?;
        let cert = params
            .signed_by(&key, &issuer)
            .map_err(fail("certificate"))?;
        write(&format!("{node}.crt"), &cert.pem())?;
        write(&format!("{node}.key"), &key.serialize_pem())?;
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_certificates_start_a_node() {
        let dir = std::env::temp_dir().join(format!("maquis-bench-certs-{}", std::process::id()));
        let dir = write(&dir, &["bench-server"]).unwrap();
        let mut cfg = maquis::Config::new("bench-server");
        cfg.transport.tls = true;
        cfg.transport.tls_cert = Some(dir.join("bench-server.crt"));
        cfg.transport.tls_key = Some(dir.join("bench-server.key"));
        cfg.transport.tls_ca = Some(dir.join("ca.crt"));
        let checked = cfg.validate();
        let _ = std::fs::remove_dir_all(&dir);
        checked.unwrap();
    }
}
