//! The webhook port's TLS: the serving certificate and key and, with `--client-ca-file`, the CA of
//! client certificates, read from PEM files at start (refusing to start on any problem, naming the
//! file), then polled: Secret volumes rotate by a `..data` symlink swap that path watches miss.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use arc_swap::ArcSwap;
use prometheus_client::metrics::gauge::Gauge;
use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ServerConfig, WebPkiClientVerifier};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

/// How often the files are read again to catch a rotation (why 2 s:
/// docs/comparison.md). A broken file is reported at each reading.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// The process's one crypto provider, ring (kube-rs's, and no C toolchain
/// to build), installed as rustls's default the first time it is asked for.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    // Refused once one is installed (by another thread, maybe): either way one is.
    let _ = rustls::crypto::ring::default_provider().install_default();
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// The webhook port's TLS configuration, swapped when its files' bytes change
/// and still make one. Open connections keep their handshake's verdict.
pub struct ReloadingTls {
    /// The certificate, the key and, with `--client-ca-file`, the client CA: what, and where.
    files: Vec<(&'static str, PathBuf)>,
    current: ArcSwap<Version>,
}

/// A configuration, its files' bytes and its leaf's notAfter (Unix seconds).
struct Version {
    bytes: Vec<Vec<u8>>,
    config: Arc<ServerConfig>,
    not_after: i64,
}

/// The parts that reload, by their files' indices, and the log's lines when they do or not.
const PARTS: [(Range<usize>, &str, &str); 2] = [
    (
        0..2,
        "serving certificate reloaded",
        "serving certificate not reloaded; the previous one stays in use",
    ),
    (
        2..3,
        "client CA reloaded",
        "client CA not reloaded; the previous one stays in force",
    ),
];

impl ReloadingTls {
    /// Loads the files or explains which one is wrong and how. An expired
    /// certificate loads, with an error in the log and the metric.
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Self> {
        let file = |what, path: &Path| (what, path.to_path_buf());
        let mut files = vec![file("certificate file", cert), file("key file", key)];
        files.extend(client_ca.map(|ca| file("client CA file", ca)));
        let bytes = files.iter().map(read).collect::<Result<_>>()?;
        let current = ArcSwap::from_pointee(configure(&files, bytes)?);
        Ok(ReloadingTls { files, current })
    }

    /// An acceptor with the configuration in use.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.current.load().config))
    }

    /// Polls the files every `interval`, keeping `not_after` current.
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration, not_after: Gauge<i64, AtomicI64>) {
        not_after.set(self.current.load().not_after);
        let this = Arc::clone(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                this.reload(&not_after);
            }
        });
    }

    /// Swaps in the configuration changed bytes make, or logs why the changed parts stay.
    fn reload(&self, not_after: &Gauge<i64, AtomicI64>) {
        let read: Vec<Result<Vec<u8>>> = self.files.iter().map(read).collect();
        let current = self.current.load_full();
        let differs = |i: usize| match read.get(i) {
            Some(new) => new.as_ref().ok() != current.bytes.get(i),
            None => false,
        };
        let changed = PARTS.iter().filter(|(part, ..)| part.clone().any(differs));
        let changed: Vec<_> = changed.collect();
        if changed.is_empty() {
            return;
        }
        let made = read
            .into_iter()
            .collect::<Result<_>>()
            .and_then(|bytes| configure(&self.files, bytes));
        match made {
            Ok(version) => {
                not_after.set(version.not_after);
                self.current.store(Arc::new(version));
                for (files, reloaded, _) in changed {
                    tracing::info!(file = %self.files[files.start].1.display(), "{reloaded}");
                }
            }
            Err(err) => {
                for (_, _, kept) in changed {
                    tracing::error!(error = format!("{err:#}"), "{kept}");
                }
            }
        }
    }
}

fn read((what, path): &(&str, PathBuf)) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading {what} {}", path.display()))
}

/// The server configuration (TLS 1.2 and 1.3, h2 and HTTP/1.1) the bytes of
/// `files` make, requiring a client certificate with a client CA.
fn configure(files: &[(&str, PathBuf)], bytes: Vec<Vec<u8>>) -> Result<Version> {
    let (certified, not_after) = parse_pair(files, &bytes)?;
    let builder = ServerConfig::builder_with_provider(crypto_provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .context("TLS protocol versions")?;
    let client_ca = files.get(2);
    let mut config = match client_ca {
        Some(file) => builder.with_client_cert_verifier(parse_client_ca(file, &bytes[2])?),
        None => builder.with_no_client_auth(),
    }
    .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));
    if client_ca.is_some() {
        // A resumed session keeps its first handshake's verdict: a client of a CA rotated out would
        // still get in. Full handshakes cost little: the API server keeps its connections open.
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
    }
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Version {
        bytes,
        config: Arc::new(config),
        not_after,
    })
}

/// A verifier of client certificates chaining to the CA certificates of `file` (one or more:
/// the old and new CA during a rotation). It sends no hints, so the client sends the one
/// certificate it has (the API server has one per webhook) and one of another CA is refused.
fn parse_client_ca(file: &(&str, PathBuf), bytes: &[u8]) -> Result<Arc<dyn ClientCertVerifier>> {
    let certs = pem_certs(file, bytes)?;
    let path = file.1.display();
    let mut roots = RootCertStore::empty();
    for (n, cert) in (1..).zip(certs) {
        roots.add(cert).map_err(|e| {
            anyhow!("client CA file {path}: certificate {n} is not a usable CA certificate: {e}")
        })?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), crypto_provider())
        .clear_root_hint_subjects()
        .build()
        .with_context(|| format!("client CA file {path}"))
}

/// The serving pair from the certificate and key files, and its notAfter.
fn parse_pair(files: &[(&str, PathBuf)], bytes: &[Vec<u8>]) -> Result<(CertifiedKey, i64)> {
    let chain = pem_certs(&files[0], &bytes[0])?;
    let (cert, key) = (files[0].1.display(), files[1].1.display());
    let private = PrivateKeyDer::from_pem_slice(&bytes[1])
        .with_context(|| format!("key file {key} holds no PEM private key"))?;
    let certified = CertifiedKey::from_der(chain, private, &crypto_provider())
        .with_context(|| format!("key file {key} does not belong to certificate file {cert}"))?;
    let not_after = x509_parser::parse_x509_certificate(&certified.cert[0])
        .map(|(_, parsed)| parsed.validity().not_after.timestamp())
        .map_err(|e| {
            anyhow!("certificate file {cert}: the first certificate does not parse: {e}")
        })?;
    let now = jiff::Timestamp::now().as_second();
    if not_after <= now {
        tracing::error!(
            %cert,
            not_after,
            "the serving certificate has expired: the API server refuses it and fails open \
             (nodes register without the hold; the window task holds them late)"
        );
    }
    Ok((certified, not_after))
}

/// The PEM certificates of `file` (what it is, its path): one at least.
fn pem_certs((what, path): &(&str, PathBuf), bytes: &[u8]) -> Result<Vec<CertificateDer<'static>>> {
    let path = path.display();
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("{what} {path} is not valid PEM"))?;
    if certs.is_empty() {
        bail!("{what} {path} holds no certificate");
    }
    Ok(certs)
}
