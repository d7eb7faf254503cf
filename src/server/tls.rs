//! Serving certificate and, optionally, the CA that webhook clients must
//! present a certificate from (`--client-ca-file`): loaded from PEM files at
//! start (refusing to start on any problem, naming the file), then polled for
//! changes. Secret volumes rotate through a `..data` symlink swap that path
//! watches miss; comparing the bytes catches every rotation.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use prometheus_client::metrics::gauge::Gauge;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

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
        poll_every(interval, move || match this.reload() {
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
        });
    }

    /// A rustls server configuration (TLS 1.2 and 1.3, h2 and HTTP/1.1) that
    /// always presents the current certificate and, with `client_ca`,
    /// requires a client certificate that chains to the current client CA.
    pub fn server_config(
        self: &Arc<Self>,
        client_ca: Option<&Arc<ReloadingClientCa>>,
    ) -> Result<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .context("TLS protocol versions")?;
        let builder = match client_ca {
            Some(ca) => {
                builder.with_client_cert_verifier(Arc::clone(ca) as Arc<dyn ClientCertVerifier>)
            }
            None => builder.with_no_client_auth(),
        };
        let mut config =
            builder.with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        if client_ca.is_some() {
            // A resumed session skips the client certificate check and keeps
            // the verdict of its first handshake: a client of a CA rotated
            // out would still get in. Every connection does a full handshake
            // instead; the API server keeps its connections open, so this
            // costs little.
            config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
            config.send_tls13_tickets = 0;
        }
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

/// Runs `tick` every `interval` (not at once) until the process ends.
fn poll_every(interval: Duration, mut tick: impl FnMut() + Send + 'static) {
    tokio::spawn(async move {
        let mut ticker = tokio::time::interval(interval);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            tick();
        }
    });
}

/// The CA of `--client-ca-file`: every webhook connection must present a
/// client certificate chaining to it (the API server's, configured in its
/// AdmissionConfiguration). Swapped in place when the file's bytes change, so
/// a CA rotation needs no restart; connections already open keep the
/// verdict of their handshake.
#[derive(Debug)]
pub struct ReloadingClientCa {
    path: PathBuf,
    current: RwLock<LoadedCa>,
}

#[derive(Debug)]
struct LoadedCa {
    bytes: Vec<u8>,
    verifier: Arc<dyn ClientCertVerifier>,
}

impl ReloadingClientCa {
    /// Loads the CA file or explains what is wrong with it, naming it.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = read_client_ca(path)?;
        let verifier = parse_client_ca(path, &bytes)?;
        Ok(ReloadingClientCa {
            path: path.to_path_buf(),
            current: RwLock::new(LoadedCa { bytes, verifier }),
        })
    }

    /// Re-reads the file; swaps in a changed, valid CA. Returns whether it
    /// swapped. A broken new file keeps the old CA in force.
    pub fn reload(&self) -> Result<bool> {
        let bytes = read_client_ca(&self.path)?;
        if self
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
            == bytes
        {
            return Ok(false);
        }
        let verifier = parse_client_ca(&self.path, &bytes)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) =
            LoadedCa { bytes, verifier };
        Ok(true)
    }

    /// Polls the file every `interval` until the process ends.
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration) {
        let this = Arc::clone(self);
        poll_every(interval, move || match this.reload() {
            Ok(true) => {
                tracing::info!(client_ca = %this.path.display(), "client CA reloaded")
            }
            Ok(false) => {}
            Err(err) => tracing::error!(
                error = format!("{err:#}"),
                "client CA not reloaded; the previous one stays in force"
            ),
        });
    }

    /// The verifier of the CA in force. The lock only ever guards a whole,
    /// already-built value, so a poisoned lock still holds a usable one.
    fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        Arc::clone(
            &self
                .current
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .verifier,
        )
    }
}

impl ClientCertVerifier for ReloadingClientCa {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints. The hints would have to borrow from the CA in force, which a
    /// reload replaces; an empty list is allowed and tells the client to send
    /// any certificate it has. The API server has exactly one per webhook.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.verifier()
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier().verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier().verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.verifier().supported_verify_schemes()
    }
}

fn read_client_ca(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("reading client CA file {}", path.display()))
}

/// A verifier that accepts client certificates chaining to the CA
/// certificates in `bytes` (PEM, one or more: during a rotation the old and
/// the new CA).
fn parse_client_ca(path: &Path, bytes: &[u8]) -> Result<Arc<dyn ClientCertVerifier>> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("client CA file {} is not valid PEM", path.display()))?;
    if certs.is_empty() {
        return Err(anyhow!(
            "client CA file {} holds no certificate",
            path.display()
        ));
    }
    let mut roots = RootCertStore::empty();
    for (n, cert) in certs.into_iter().enumerate() {
        roots.add(cert).map_err(|e| {
            anyhow!(
                "client CA file {}: certificate {} is not a usable CA certificate: {e}",
                path.display(),
                n + 1
            )
        })?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .with_context(|| format!("client CA file {}", path.display()))
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
