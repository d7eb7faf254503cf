//! Serving certificate and, optionally, the CA that webhook clients must
//! present a certificate from (`--client-ca-file`): loaded from PEM files at
//! start (refusing to start on any problem, naming the file), then polled for
//! changes. Secret volumes rotate through a `..data` symlink swap that path
//! watches miss; comparing the bytes catches every rotation.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicI64;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use arc_swap::ArcSwap;
use prometheus_client::metrics::gauge::Gauge;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

/// How often the certificate files (and the client CA file) are read again
/// to catch a rotation. The kubelet updates a mounted Secret a minute or so
/// after it changes and cert-manager renews days ahead, so this adds little
/// to either; reading two or three small files every 2 s costs nothing
/// measurable. A broken file is reported at each reading while it stays.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// The one crypto provider of the process: ring (the one kube-rs uses, and
/// no C toolchain build), installed as rustls's process default the first
/// time it is asked for, so every TLS configuration here uses the same.
pub fn crypto_provider() -> Arc<CryptoProvider> {
    if let Some(provider) = CryptoProvider::get_default() {
        return Arc::clone(provider);
    }
    // Another thread may install it first; either way one is installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

/// Files whose bytes make a value (a certificate and key, a CA), read at
/// start and swapped in place whenever the bytes change and still make a
/// value; a broken change keeps the previous value in use.
struct Reloading<T> {
    files: Vec<File>,
    parse: fn(&[File], &[Vec<u8>]) -> Result<T>,
    current: ArcSwap<Version<T>>,
}

/// A file a value is read from, and what it is (for messages).
pub struct File {
    pub what: &'static str,
    pub path: PathBuf,
}

/// One value and the bytes it was made from.
struct Version<T> {
    bytes: Vec<Vec<u8>>,
    value: T,
}

/// What the reloader's log lines say.
struct Logged {
    pub reloaded: &'static str,
    pub kept: &'static str,
}

impl<T: Send + Sync + 'static> Reloading<T> {
    /// Reads and parses the files, or says which one is wrong and how.
    fn load(files: Vec<File>, parse: fn(&[File], &[Vec<u8>]) -> Result<T>) -> Result<Self> {
        let bytes = read_all(&files)?;
        let value = parse(&files, &bytes)?;
        Ok(Reloading {
            files,
            parse,
            current: ArcSwap::from_pointee(Version { bytes, value }),
        })
    }

    /// The value in use.
    fn current(&self) -> impl std::ops::Deref<Target = T> + '_ {
        CurrentValue(self.current.load_full())
    }

    /// Re-reads the files; swaps in changed bytes that make a value. Returns
    /// whether it swapped.
    fn reload(&self) -> Result<bool> {
        let bytes = read_all(&self.files)?;
        if self.current.load().bytes == bytes {
            return Ok(false);
        }
        let value = (self.parse)(&self.files, &bytes)?;
        self.current.store(Arc::new(Version { bytes, value }));
        Ok(true)
    }

    /// Polls the files every `interval` until the process ends; `on_swap`
    /// sees each new value.
    fn spawn_reloader(
        self: &Arc<Self>,
        interval: Duration,
        logged: Logged,
        on_swap: impl Fn(&T) + Send + 'static,
    ) {
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                match this.reload() {
                    Ok(true) => {
                        on_swap(&this.current());
                        tracing::info!(file = %this.files[0].path.display(), "{}", logged.reloaded);
                    }
                    Ok(false) => {}
                    Err(err) => tracing::error!(error = format!("{err:#}"), "{}", logged.kept),
                }
            }
        });
    }
}

struct CurrentValue<T>(Arc<Version<T>>);

impl<T> std::ops::Deref for CurrentValue<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0.value
    }
}

fn read_all(files: &[File]) -> Result<Vec<Vec<u8>>> {
    files
        .iter()
        .map(|f| {
            std::fs::read(&f.path)
                .with_context(|| format!("reading {} {}", f.what, f.path.display()))
        })
        .collect()
}

/// The certificate the webhook presents, swapped in place on rotation.
pub struct ReloadingCert(Arc<Reloading<ServingCert>>);

/// A serving certificate with its key, and its leaf's notAfter.
struct ServingCert {
    key: Arc<CertifiedKey>,
    /// Unix seconds of the leaf certificate's notAfter.
    pub not_after: i64,
}

impl ReloadingCert {
    /// Loads the pair or explains which file is wrong and how. An expired
    /// certificate loads (the API server then fails open and the window task
    /// holds new nodes late) with an error in the log and the metric.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Self> {
        let files = vec![
            File {
                what: "certificate file",
                path: cert_path.to_path_buf(),
            },
            File {
                what: "key file",
                path: key_path.to_path_buf(),
            },
        ];
        Ok(ReloadingCert(Arc::new(Reloading::load(files, parse_pair)?)))
    }

    /// Unix seconds of the current certificate's notAfter.
    fn not_after(&self) -> i64 {
        self.0.current().not_after
    }

    /// Polls the files every `interval` until the process ends, keeping
    /// `not_after` (the expiry metric) current.
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration, not_after: Gauge<i64, AtomicI64>) {
        not_after.set(self.not_after());
        let logged = Logged {
            reloaded: "serving certificate reloaded",
            kept: "serving certificate not reloaded; the previous one stays in use",
        };
        self.0.spawn_reloader(interval, logged, move |cert| {
            not_after.set(cert.not_after);
        });
    }

    /// A rustls server configuration (TLS 1.2 and 1.3, h2 and HTTP/1.1) that
    /// always presents the current certificate and, with `client_ca`,
    /// requires a client certificate that chains to the current client CA.
    pub fn server_config(
        self: &Arc<Self>,
        client_ca: Option<&Arc<ReloadingClientCa>>,
    ) -> Result<rustls::ServerConfig> {
        let builder = rustls::ServerConfig::builder_with_provider(crypto_provider())
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

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("file", &self.0.files[0].path)
            .finish_non_exhaustive()
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.0.current().key))
    }
}

/// The CA of `--client-ca-file`: every webhook connection must present a
/// client certificate chaining to it (the API server's, configured in its
/// AdmissionConfiguration). Swapped in place when the file's bytes change, so
/// a CA rotation needs no restart; connections already open keep the
/// verdict of their handshake.
pub struct ReloadingClientCa(Arc<Reloading<Arc<dyn ClientCertVerifier>>>);

impl std::fmt::Debug for ReloadingClientCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingClientCa")
            .field("file", &self.0.files[0].path)
            .finish_non_exhaustive()
    }
}

impl ReloadingClientCa {
    /// Loads the CA file or explains what is wrong with it, naming it.
    pub fn load(path: &Path) -> Result<Self> {
        let file = File {
            what: "client CA file",
            path: path.to_path_buf(),
        };
        Ok(ReloadingClientCa(Arc::new(Reloading::load(
            vec![file],
            parse_client_ca,
        )?)))
    }

    /// Polls the file every `interval` until the process ends.
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration) {
        let logged = Logged {
            reloaded: "client CA reloaded",
            kept: "client CA not reloaded; the previous one stays in force",
        };
        self.0.spawn_reloader(interval, logged, |_| {});
    }

    /// The verifier of the CA in force.
    fn verifier(&self) -> Arc<dyn ClientCertVerifier> {
        Arc::clone(&*self.0.current())
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

/// A verifier that accepts client certificates chaining to the CA
/// certificates in `bytes` (PEM, one or more: during a rotation the old and
/// the new CA).
fn parse_client_ca(files: &[File], bytes: &[Vec<u8>]) -> Result<Arc<dyn ClientCertVerifier>> {
    let (path, bytes) = (&files[0].path, &bytes[0]);
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
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), crypto_provider())
        .build()
        .with_context(|| format!("client CA file {}", path.display()))
}

/// The serving pair from the bytes of `[certificate file, key file]`.
fn parse_pair(files: &[File], bytes: &[Vec<u8>]) -> Result<ServingCert> {
    let (cert_path, key_path) = (&files[0].path, &files[1].path);
    let chain = CertificateDer::pem_slice_iter(&bytes[0])
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("certificate file {} is not valid PEM", cert_path.display()))?;
    if chain.is_empty() {
        return Err(anyhow!(
            "certificate file {} holds no certificate",
            cert_path.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_slice(&bytes[1])
        .with_context(|| format!("key file {} holds no PEM private key", key_path.display()))?;
    let certified = CertifiedKey::from_der(chain, key, &crypto_provider()).with_context(|| {
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
    warn_if_expired(cert_path, not_after);
    Ok(ServingCert {
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
