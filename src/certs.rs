//! `node-holder certs`: a development CA and an ECDSA P-256 serving certificate
//! for the webhook. Production installs get theirs from cert-manager.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use base64::Engine;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use time::OffsetDateTime;

use crate::cli::CertsArgs;
use crate::core::holds::is_dns_subdomain;

/// PEM texts of a development CA and a serving certificate it signed.
pub struct DevCertificates {
    pub ca_pem: String,
    pub cert_pem: String,
    pub key_pem: String,
}

impl DevCertificates {
    /// The `caBundle` of a webhook configuration: the CA's PEM, base64-encoded.
    pub fn ca_bundle(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(&self.ca_pem)
    }
}

/// Makes a new CA and a serving certificate valid for localhost, 127.0.0.1 and
/// `dns_names`, both valid from an hour ago (clock skew) for `validity`.
pub fn generate(dns_names: &[String], validity: Duration) -> Result<DevCertificates> {
    generate_between(
        dns_names,
        OffsetDateTime::now_utc() - time::Duration::hours(1),
        OffsetDateTime::now_utc() + validity,
    )
}

/// As [`generate`], valid from `not_before` to `not_after` (tests make expired
/// certificates with it).
pub fn generate_between(
    dns_names: &[String],
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> Result<DevCertificates> {
    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "node-holder development CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca = CertifiedIssuer::self_signed(ca, ca_key).context("signing the CA certificate")?;

    for name in dns_names {
        if !is_dns_subdomain(name) {
            bail!(
                "invalid DNS name {name:?}: expected lower-case letters, digits, '-' and '.' (RFC 1123)"
            );
        }
    }
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    for name in dns_names {
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    let common_name = dns_names.first().map_or("localhost", String::as_str);
    let key = KeyPair::generate().context("generating the serving key")?;
    let mut serving = CertificateParams::new(names)?;
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
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Writes `ca.crt`, `tls.crt` and `tls.key` (mode 0600) into `dir`, the names
/// of a `kubernetes.io/tls` Secret's keys.
pub fn write(certs: &DevCertificates, dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_file(&dir.join("ca.crt"), &certs.ca_pem, 0o644)?;
    write_file(&dir.join("tls.crt"), &certs.cert_pem, 0o644)?;
    write_file(&dir.join("tls.key"), &certs.key_pem, 0o600)
}

fn write_file(path: &Path, contents: &str, mode: u32) -> Result<()> {
    // Write next to the target and rename, so a server polling the files never
    // reads half a certificate.
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
    fs::rename(&partial, path).with_context(|| format!("writing {}", path.display()))
}

/// The `certs` subcommand: writes the files and prints the caBundle.
pub fn run(args: &CertsArgs) -> Result<()> {
    let certs = generate(&args.dns_names, args.validity)?;
    write(&certs, &args.out_dir)?;
    eprintln!(
        "wrote ca.crt, tls.crt and tls.key to {}; caBundle for the webhook configuration:",
        args.out_dir.display()
    );
    println!("{}", certs.ca_bundle());
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::core::holds::is_dns_subdomain;

    #[test]
    fn service_dns_names_are_valid_and_odd_ones_are_not() {
        for ok in [
            "node-holder.node-holder.svc",
            "a",
            "x1.example.com",
            "node-holder.ns.svc.cluster.local",
        ] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in [
            "",
            "bad name!",
            "Upper.case",
            "-lead.x",
            "trail-.x",
            "a..b",
            &"a".repeat(64),
        ] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }
}
