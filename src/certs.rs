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
    Issuer, KeyPair, KeyUsagePurpose,
};
use time::OffsetDateTime;

use crate::cli::CertsArgs;
use crate::core::names::is_dns_subdomain;

/// PEM texts of a development CA, its key, and a serving certificate it
/// signed.
pub struct DevCertificates {
    pub ca_pem: String,
    pub ca_key_pem: String,
    cert_pem: String,
    key_pem: String,
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
    let (not_before, not_after) = valid_for(validity);
    generate_between(dns_names, not_before, not_after)
}

/// As [`generate`], valid from `not_before` to `not_after` (tests make expired
/// certificates with it).
pub fn generate_between(
    dns_names: &[String],
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> Result<DevCertificates> {
    let names = serving_names(dns_names)?;
    let ca_key = KeyPair::generate().context("generating the CA key")?;
    let ca_key_pem = ca_key.serialize_pem();
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.distinguished_name
        .push(DnType::CommonName, "node-holder development CA");
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca.not_before = not_before;
    ca.not_after = not_after;
    let ca = CertifiedIssuer::self_signed(ca, ca_key).context("signing the CA certificate")?;
    let (cert_pem, key_pem) = serving(&ca, &names, not_before, not_after)?;
    Ok(DevCertificates {
        ca_pem: ca.pem(),
        ca_key_pem,
        cert_pem,
        key_pem,
    })
}

/// A new serving certificate from the CA already in `dir` (its `ca.crt` and
/// `ca.key`), valid from an hour ago for `validity`: the caBundle registered
/// for that CA keeps matching.
pub fn renew(dir: &Path, dns_names: &[String], validity: Duration) -> Result<DevCertificates> {
    let names = serving_names(dns_names)?;
    let ca_pem = read(&dir.join(CA_CERT))?;
    let ca_key_pem = read(&dir.join(CA_KEY)).context(
        "--renew needs the CA's key; certificates written before node-holder kept ca.key have none \
         (use --force for a new CA)",
    )?;
    let ca_key = KeyPair::from_pem(&ca_key_pem)
        .with_context(|| format!("reading the CA key in {}", dir.display()))?;
    let ca = Issuer::from_ca_cert_pem(&ca_pem, ca_key)
        .with_context(|| format!("reading the CA certificate in {}", dir.display()))?;
    let (not_before, not_after) = valid_for(validity);
    let (cert_pem, key_pem) = serving(&ca, &names, not_before, not_after)?;
    Ok(DevCertificates {
        ca_pem,
        ca_key_pem,
        cert_pem,
        key_pem,
    })
}

fn valid_for(validity: Duration) -> (OffsetDateTime, OffsetDateTime) {
    let now = OffsetDateTime::now_utc();
    (now - time::Duration::hours(1), now + validity)
}

/// localhost, 127.0.0.1 and each of `dns_names` once, or an error naming an
/// invalid one.
fn serving_names(dns_names: &[String]) -> Result<Vec<String>> {
    let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string()];
    for name in dns_names {
        if !is_dns_subdomain(name) {
            bail!(
                "invalid DNS name {name:?}: expected lower-case letters, digits, '-' and '.' (RFC 1123)"
            );
        }
        if !names.contains(name) {
            names.push(name.clone());
        }
    }
    Ok(names)
}

/// A serving certificate for `names` signed by `ca`, and its new key (PEM).
fn serving(
    ca: &Issuer<'_, KeyPair>,
    names: &[String],
    not_before: OffsetDateTime,
    not_after: OffsetDateTime,
) -> Result<(String, String)> {
    // The first name after localhost and 127.0.0.1, if any.
    let common_name = names.get(2).map_or("localhost", String::as_str);
    let key = KeyPair::generate().context("generating the serving key")?;
    let mut serving = CertificateParams::new(names.to_vec())?;
    serving
        .distinguished_name
        .push(DnType::CommonName, common_name);
    serving.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    serving.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    serving.not_before = not_before;
    serving.not_after = not_after;
    let cert = serving
        .signed_by(&key, ca)
        .context("signing the serving certificate")?;
    Ok((cert.pem(), key.serialize_pem()))
}

const CA_CERT: &str = "ca.crt";
const CA_KEY: &str = "ca.key";
const TLS_CERT: &str = "tls.crt";
const TLS_KEY: &str = "tls.key";
/// Every file `certs` writes, in the order it lists them.
const ALL_FILES: [&str; 4] = [CA_CERT, CA_KEY, TLS_CERT, TLS_KEY];
/// The files `--renew` writes: the serving pair only.
const SERVING_FILES: [&str; 2] = [TLS_CERT, TLS_KEY];

fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
}

/// Writes `ca.crt`, `ca.key` (mode 0600), `tls.crt` and `tls.key` (mode
/// 0600) into `dir`, replacing what is there: `tls.crt` and `tls.key` are
/// the names of a `kubernetes.io/tls` Secret's keys.
pub fn write(certs: &DevCertificates, dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    write_file(&dir.join(CA_CERT), &certs.ca_pem, 0o644)?;
    write_file(&dir.join(CA_KEY), &certs.ca_key_pem, 0o600)?;
    write_serving(certs, dir)
}

/// Writes `tls.crt` and `tls.key` (mode 0600) into `dir`.
fn write_serving(certs: &DevCertificates, dir: &Path) -> Result<()> {
    let [cert, key] = SERVING_FILES;
    write_file(&dir.join(cert), &certs.cert_pem, 0o644)?;
    write_file(&dir.join(key), &certs.key_pem, 0o600)
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

/// The `certs` subcommand: a new CA and serving pair into an empty place
/// (or over an old one with `--force`), or a new serving pair from the CA
/// already there (`--renew`); says which files it wrote and prints the
/// caBundle.
pub fn run(args: &CertsArgs) -> Result<()> {
    let dir = &args.out_dir;
    let (certs, written) = if args.renew {
        let certs = renew(dir, &args.dns_names, args.validity)?;
        write_serving(&certs, dir)?;
        (certs, &SERVING_FILES[..])
    } else {
        refuse_to_replace(dir, args.force)?;
        let certs = generate(&args.dns_names, args.validity)?;
        write(&certs, dir)?;
        (certs, &ALL_FILES[..])
    };
    eprintln!(
        "wrote {} to {}; caBundle for the webhook configuration:",
        written.join(", "),
        dir.display()
    );
    println!("{}", certs.ca_bundle());
    Ok(())
}

/// Refuses to write a new CA where certificates already are, unless
/// `force`: every caBundle registered for the old CA would stop matching
/// and the webhook would fail (or fail open) until someone noticed.
fn refuse_to_replace(dir: &Path, force: bool) -> Result<()> {
    let present: Vec<&str> = ALL_FILES
        .into_iter()
        .filter(|f| dir.join(f).exists())
        .collect();
    if present.is_empty() || force {
        return Ok(());
    }
    bail!(
        "{} already holds {}; nothing was written. A new CA would make every caBundle \
         registered for the old one stop matching: --renew issues a new serving certificate \
         from the existing CA, --force replaces everything",
        dir.display(),
        present.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use crate::core::names::is_dns_subdomain;

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
