//! Serving certificate: loaded from PEM files at start (refusing to start on
//! any problem, naming the file), then polled for changes. Secret volumes
//! rotate through a `..data` symlink swap that path watches miss; comparing
//! the bytes catches every rotation.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use prometheus_client::metrics::gauge::Gauge;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// The certificate the webhook presents, swapped in place on rotation.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    bytes: (Vec<u8>, Vec<u8>),
    key: Arc<CertifiedKey>,
    /// Unix seconds of the leaf certificate's notAfter.
    not_after: i64,
}

impl ReloadingCert {
    /// Loads the pair or explains which file is wrong and how. An expired
    /// certificate loads (the API server then fails open and the window task
    /// holds new nodes late) with an error in the log and the metric.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self> {
        let loaded = load_pair(cert_path, key_path)?;
        warn_if_expired(cert_path, loaded.not_after);
        Ok(ReloadingCert {
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            current: RwLock::new(loaded),
        })
    }

    /// Re-reads the files; swaps in a changed, valid pair. Returns whether it
    /// swapped. A broken new pair keeps the old one serving.
    pub fn reload(&self) -> Result<bool> {
        let bytes = read_pair(&self.cert_path, &self.key_path)?;
        if self
            .current
            .read()
            .map_err(|_| anyhow!("certificate lock poisoned"))?
            .bytes
            == bytes
        {
            return Ok(false);
        }
        let loaded = parse_pair(&self.cert_path, &self.key_path, bytes)?;
        warn_if_expired(&self.cert_path, loaded.not_after);
        *self
            .current
            .write()
            .map_err(|_| anyhow!("certificate lock poisoned"))? = loaded;
        Ok(true)
    }

    /// Unix seconds of the current certificate's notAfter.
    pub fn not_after(&self) -> Option<i64> {
        self.current.read().ok().map(|loaded| loaded.not_after)
    }

    /// Polls the files every `interval` until the process ends, keeping
    /// `not_after` (the expiry metric) current.
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration, not_after: Gauge<i64, AtomicI64>) {
        let this = Arc::clone(self);
        if let Some(at) = this.not_after() {
            not_after.set(at);
        }
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                match this.reload() {
                    Ok(true) => {
                        if let Some(at) = this.not_after() {
                            not_after.set(at);
                        }
                        tracing::info!(cert = %this.cert_path.display(), "serving certificate reloaded")
                    }
                    Ok(false) => {}
                    Err(err) => tracing::error!(
                        error = format!("{err:#}"),
                        "serving certificate not reloaded; the previous one stays in use"
                    ),
                }
            }
        });
    }

    /// A rustls server configuration (TLS 1.2 and 1.3, h2 and HTTP/1.1) that
    /// always presents the current certificate.
    pub fn server_config(self: &Arc<Self>) -> Result<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .context("TLS protocol versions")?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .ok()
            .map(|loaded| Arc::clone(&loaded.key))
    }
}

fn read_pair(cert_path: &Path, key_path: &Path) -> Result<(Vec<u8>, Vec<u8>)> {
    let cert = std::fs::read(cert_path)
        .with_context(|| format!("reading certificate file {}", cert_path.display()))?;
    let key = std::fs::read(key_path)
        .with_context(|| format!("reading key file {}", key_path.display()))?;
    Ok((cert, key))
}

fn load_pair(cert_path: &Path, key_path: &Path) -> Result<Loaded> {
    let bytes = read_pair(cert_path, key_path)?;
    parse_pair(cert_path, key_path, bytes)
}

fn parse_pair(cert_path: &Path, key_path: &Path, bytes: (Vec<u8>, Vec<u8>)) -> Result<Loaded> {
    let chain = CertificateDer::pem_slice_iter(&bytes.0)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("certificate file {} is not valid PEM", cert_path.display()))?;
    if chain.is_empty() {
        return Err(anyhow!(
            "certificate file {} holds no certificate",
            cert_path.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&bytes.1)
        .with_context(|| format!("key file {} holds no PEM private key", key_path.display()))?;
    let provider = CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let certified = CertifiedKey::from_der(chain, key, &provider).with_context(|| {
        format!(
            "key file {} does not belong to certificate file {}",
            key_path.display(),
            cert_path.display()
        )
    })?;
    let not_after = x509_parser::parse_x509_certificate(&chain_leaf(&certified))
        .map(|(_, cert)| cert.validity().not_after.timestamp())
        .map_err(|e| {
            anyhow!(
                "certificate file {}: the first certificate does not parse: {e}",
                cert_path.display()
            )
        })?;
    Ok(Loaded {
        bytes,
        key: Arc::new(certified),
        not_after,
    })
}

fn chain_leaf(certified: &CertifiedKey) -> Vec<u8> {
    certified
        .cert
        .first()
        .map(|c| c.as_ref().to_vec())
        .unwrap_or_default()
}

fn warn_if_expired(cert_path: &Path, not_after: i64) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    if not_after <= now {
        tracing::error!(
            cert = %cert_path.display(),
            not_after,
            "the serving certificate has expired: the API server refuses it and fails open \
             (nodes register without the hold; the window task holds them late)"
        );
    }
}
