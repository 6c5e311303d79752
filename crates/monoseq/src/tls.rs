//! TLS for the server and the binary's own clients, on rustls with the aws-lc-rs provider:
//! the server configuration loaded from PEM files, a listener that completes handshakes
//! concurrently (bounded in number, each with a deadline) and hands `axum::serve` only
//! finished TLS streams, so the server's graceful shutdown works unchanged over HTTPS, and the
//! client configuration of `monoseq bench` for https URLs.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Longest time a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most TLS handshakes in progress at once; past it, new connections wait in the kernel's
/// accept queue.
pub const HANDSHAKES_MAX: usize = 256;
/// The only application protocol the server speaks.
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// The crypto provider of every configuration here, named rather than taken from the
/// process default, which is ambiguous when more than one provider is compiled in.
fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// The certificates of a PEM file, in order.
///
/// # Errors
///
/// The file cannot be read, is not PEM, or holds no certificate; each names the file.
pub fn load_certificates(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let what = || format!("the certificate file {}", path.display());
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| pem_error(e, &what()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(e, &what()))?;
    if certs.is_empty() {
        bail!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            what()
        );
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1). The error never quotes the file.
fn load_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls::pki_types::pem::Error::Io(e) => {
            anyhow::anyhow!(
                "reading the TLS key file {}: {}",
                path.display(),
                crate::base::chain(&e)
            )
        }
        _ => anyhow::anyhow!(
            "the TLS key file {} holds no PEM private key (PKCS#8, PKCS#1 or SEC1)",
            path.display()
        ),
    })
}

fn pem_error(e: rustls::pki_types::pem::Error, what: &str) -> anyhow::Error {
    match e {
        rustls::pki_types::pem::Error::Io(e) => {
            anyhow::anyhow!("reading {what}: {}", crate::base::chain(&e))
        }
        other => anyhow::anyhow!("{what} is not a valid PEM file: {other}"),
    }
}

/// The TLS side of the server: the certificate chain of `cert` with the key of `key`,
/// TLS 1.2 and 1.3, HTTP/1.1.
///
/// # Errors
///
/// Either file does not load, or the key does not belong to the certificate; each error
/// names the file to fix.
pub fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    let certs = load_certificates(cert)?;
    let key_der = load_key(key)?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("the TLS provider offers no protocol version")?
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .with_context(|| {
            format!(
                "the TLS key {} does not fit the certificate {}: give the key the certificate \
                 was made for",
                key.display(),
                cert.display()
            )
        })?;
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// The TLS side of a client: trusts the CA certificates of `ca_cert`, or the system's trusted
/// CAs without it; HTTP/1.1.
///
/// # Errors
///
/// The CA file does not load, or without it the system has no trusted CA.
pub fn client_config(ca_cert: Option<&Path>) -> anyhow::Result<Arc<ClientConfig>> {
    let mut roots = RootCertStore::empty();
    match ca_cert {
        Some(path) => {
            for cert in load_certificates(path)? {
                roots.add(cert).with_context(|| {
                    format!("{} holds a certificate rustls cannot use", path.display())
                })?;
            }
        }
        None => {
            let (added, _ignored) =
                roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
            if added == 0 {
                bail!("this system has no trusted CA certificates: give --ca-cert FILE");
            }
        }
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("the TLS provider offers no protocol version")?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_HTTP1.to_vec()];
    Ok(Arc::new(config))
}

/// A finished handshake, or `None` for one that failed or timed out.
type Handshake = Option<(TlsStream<TcpStream>, SocketAddr)>;

/// A TCP listener that answers with TLS: each accepted connection's handshake runs in its own
/// task (at most [`HANDSHAKES_MAX`] at once, each bounded by [`HANDSHAKE_TIMEOUT`]), so a slow
/// or silent client never holds up the others. Dropping it (as `axum::serve` does at a
/// graceful shutdown) cancels the handshakes in progress.
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshakes: JoinSet<Handshake>,
}

impl TlsListener {
    /// Serves TLS with `acceptor` on `tcp`.
    pub fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> TlsListener {
        TlsListener {
            tcp,
            acceptor,
            handshakes: JoinSet::new(),
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    /// The next connection whose handshake finished. Cancel-safe: both things it waits for
    /// (`TcpListener::accept`, `JoinSet::join_next`) are.
    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let room = self.handshakes.len() < HANDSHAKES_MAX;
            tokio::select! {
                accepted = self.tcp.accept(), if room => match accepted {
                    Ok((stream, peer)) => {
                        crate::edge::no_delay(&stream);
                        self.handshakes.spawn(handshake(self.acceptor.clone(), stream, peer));
                    }
                    Err(e) => accept_error(e).await,
                },
                Some(done) = self.handshakes.join_next() => {
                    if let Ok(Some(connection)) = done {
                        return connection;
                    }
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// The server side of one handshake, bounded by [`HANDSHAKE_TIMEOUT`]. A failure is the
/// client's (plain HTTP on the TLS port, an untrusted certificate), logged at debug level only.
async fn handshake(acceptor: TlsAcceptor, stream: TcpStream, peer: SocketAddr) -> Handshake {
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Some((tls, peer)),
        Ok(Err(e)) => {
            tracing::debug!(%peer, "TLS handshake failed: {}", crate::base::chain(&e));
            None
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out after {HANDSHAKE_TIMEOUT:?}");
            None
        }
    }
}

/// What axum's own TCP listener does with an accept error: a connection's error is the
/// client's; any other (out of file descriptors) is logged and waited out for a second.
async fn accept_error(e: io::Error) {
    use io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    if matches!(
        e.kind(),
        ConnectionRefused | ConnectionAborted | ConnectionReset
    ) {
        return;
    }
    tracing::error!(
        "accepting a connection failed: {}; retrying in a second",
        crate::base::chain(&e)
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_wrong_file_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.pem");
        let err = acceptor(&missing, &missing)
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("missing.pem"), "{err}");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not pem\n").unwrap();
        let err = load_certificates(&empty).unwrap_err().to_string();
        assert!(
            err.contains("empty.pem") && err.contains("no PEM certificate"),
            "{err}"
        );
        let err = load_key(&empty).unwrap_err().to_string();
        assert!(
            err.contains("empty.pem") && err.contains("no PEM private key"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_silent_client_does_not_hold_up_the_next_handshake() {
        let dir = tempfile::tempdir().unwrap();
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert, made.cert.pem()).unwrap();
        std::fs::write(&key, made.signing_key.serialize_pem()).unwrap();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = tcp.local_addr().unwrap();
        let mut listener = TlsListener::new(tcp, acceptor(&cert, &key).unwrap());
        // Connected, and never says a word.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let client = async {
            let stream = TcpStream::connect(addr).await.unwrap();
            let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
            tokio_rustls::TlsConnector::from(client_config(Some(&cert)).unwrap())
                .connect(name, stream)
                .await
                .expect("the handshake succeeds")
        };
        let accepted = axum::serve::Listener::accept(&mut listener);
        let both = async { tokio::join!(client, accepted) };
        let (_, (_, peer)) = tokio::time::timeout(HANDSHAKE_TIMEOUT / 2, both)
            .await
            .expect("the second client's handshake finished while the first stays silent");
        assert!(peer.ip().is_loopback());
    }
}
