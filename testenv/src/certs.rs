//! Throw-away certificates for node-holder's webhook in tests and the local
//! demo: a CA and an ECDSA P-256 serving certificate it signed, written with
//! the key names of a `kubernetes.io/tls` Secret. Clusters get theirs from
//! cert-manager, or from their own CA (the chart's `tls.mode=provided`).

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use time::OffsetDateTime;

/// PEM texts of a CA, its key, and a serving certificate it signed.
pub struct DevCertificates {
    pub ca_pem: String,
    pub ca_key_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

/// A new CA and a serving certificate valid for localhost, 127.0.0.1 and
/// `dns_names`, from an hour ago (clock skew) for a year.
pub fn generate(dns_names: &[&str]) -> Result<DevCertificates> {
    let now = SystemTime::now();
    let hour = Duration::from_secs(3600);
    generate_between(dns_names, now - hour, now + 365 * 24 * hour)
}

/// As [`generate`], valid from `not_before` to `not_after` (expired ones
/// too).
pub fn generate_between(
    dns_names: &[&str],
    not_before: SystemTime,
    not_after: SystemTime,
) -> Result<DevCertificates> {
    let (not_before, not_after) = (
        OffsetDateTime::from(not_before),
        OffsetDateTime::from(not_after),
    );
    let (ca, ca_key_pem) = new_ca(
        "node-holder development CA",
        BasicConstraints::Constrained(0),
        Some((not_before, not_after)),
    )?;

    let mut names: Vec<String> = Vec::new();
    for name in ["localhost", "127.0.0.1"].iter().chain(dns_names) {
        if !names.iter().any(|n| n == name) {
            names.push((*name).to_owned());
        }
    }
    let key = KeyPair::generate().context("generating the serving key")?;
    let mut serving = CertificateParams::new(names)?;
    let common_name = dns_names.first().copied().unwrap_or("localhost");
    serving
        .distinguished_name
        .push(DnType::CommonName, common_name);
    serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    serving.not_before = not_before;
    serving.not_after = not_after;
    let cert = serving
        .signed_by(&key, &ca)
        .context("signing the serving certificate")?;
    Ok(DevCertificates {
        ca_pem: ca.pem(),
        ca_key_pem,
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// A new self-signed CA named `common_name`, valid from and to the given
/// times (rcgen's defaults without them), and its key's PEM: the test
/// control plane's CA and the throw-away ones above.
pub(crate) fn new_ca(
    common_name: &str,
    constraints: BasicConstraints,
    validity: Option<(OffsetDateTime, OffsetDateTime)>,
) -> Result<(CertifiedIssuer<'static, KeyPair>, String)> {
    let key = KeyPair::generate().context("generating the CA key")?;
    let key_pem = key.serialize_pem();
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(constraints);
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    if let Some((not_before, not_after)) = validity {
        params.not_before = not_before;
        params.not_after = not_after;
    }
    let ca = CertifiedIssuer::self_signed(params, key).context("signing the CA certificate")?;
    Ok((ca, key_pem))
}

/// Writes `ca.crt`, `ca.key`, `tls.crt` and `tls.key` (keys mode 0600) into
/// `dir`, replacing what is there. Each file is written beside its place and
/// renamed, so a server polling them never reads half a certificate.
pub fn write(certs: &DevCertificates, dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, contents, mode) in [
        ("ca.crt", &certs.ca_pem, 0o644),
        ("ca.key", &certs.ca_key_pem, 0o600),
        ("tls.crt", &certs.cert_pem, 0o644),
        ("tls.key", &certs.key_pem, 0o600),
    ] {
        let path = dir.join(name);
        let partial = path.with_extension("partial");
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&partial)
            .with_context(|| format!("creating {}", partial.display()))?;
        file.write_all(contents.as_bytes())
            .with_context(|| format!("writing {}", partial.display()))?;
        fs::rename(&partial, &path).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// [`generate`] then [`write`] into `dir`.
pub fn make(dir: &Path, dns_names: &[&str]) -> Result<DevCertificates> {
    let certs = generate(dns_names)?;
    write(&certs, dir)?;
    Ok(certs)
}
