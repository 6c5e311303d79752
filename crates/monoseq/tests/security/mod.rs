//! What the authentication and TLS tests share: a `monoseq serve` started with the flags and
//! environment of the test's choosing (standard error kept in a file), requests with a bearer
//! token, and certificates made with rcgen.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A write token of the test servers.
pub const WRITE: &str = "write-token-0123456789abcdef-W1";
/// A read token of the test servers.
pub const READ: &str = "read-token-0123456789abcdef-R1";
/// A token no test server accepts.
pub const WRONG: &str = "wrong-token-0123456789abcdef-X1";

/// A running `monoseq serve` whose standard error goes to `log`.
pub struct Launched {
    pub child: Child,
    pub url: String,
    pub log: PathBuf,
    /// Kept open: the server may write to standard output again.
    _stdout: BufReader<ChildStdout>,
}

/// Starts `monoseq serve` on data directory `dir`, listening on `listen`, with `args` and the
/// environment `env` (`RUST_LOG=debug` unless given); answers the server once it listens, or
/// its log when it exits first (a refused start).
pub fn launch(
    dir: &Path,
    listen: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> Result<Launched, String> {
    let log = dir.with_extension("log");
    let mut command = Command::new(env!("CARGO_BIN_EXE_monoseq"));
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(dir)
        .args(["--listen", listen])
        .args(args)
        .env("RUST_LOG", "debug")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("create the log file"));
    for (name, value) in env {
        command.env(name, value);
    }
    let mut child = command.spawn().expect("spawn monoseq serve");
    let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut line = String::new();
    stdout
        .read_line(&mut line)
        .expect("read the listening line");
    match line.trim().strip_prefix("monoseq listening on ") {
        Some(url) => Ok(Launched {
            child,
            url: url.to_owned(),
            log,
            _stdout: stdout,
        }),
        None => {
            let status = child.wait().expect("reap");
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            assert!(
                !status.success(),
                "a server that never listened exited 0: {text}"
            );
            Err(text)
        }
    }
}

impl Launched {
    /// Waits until `/readyz` answers 200 to a request with `token`.
    pub async fn ready(&self, client: &reqwest::Client, token: Option<&str>) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let mut request = client.get(format!("{}/readyz", self.url));
            if let Some(token) = token {
                request = request.bearer_auth(token);
            }
            if let Ok(r) = request.send().await
                && r.status().is_success()
            {
                return;
            }
            assert!(Instant::now() < deadline, "server never became ready");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// What the server wrote to standard error so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).expect("read the server log")
    }

    /// Sends SIGTERM and waits for the exit, at most `bound`.
    pub fn terminate(mut self, bound: Duration) -> ExitStatus {
        let pid = self.child.id().to_string();
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .expect("kill -TERM");
        let deadline = Instant::now() + bound;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "server did not stop within {bound:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Launched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes a tokens file with `lines` into `dir` and answers its path.
pub fn tokens_file(dir: &Path, lines: &str) -> PathBuf {
    let path = dir.join("tokens");
    std::fs::write(&path, lines).expect("write the tokens file");
    path
}

/// A tokens file with [`WRITE`] and [`READ`].
pub fn both_tokens(dir: &Path) -> PathBuf {
    tokens_file(
        dir,
        &format!("# test tokens\nwrite {WRITE}\n\nread {READ}\n"),
    )
}

/// A command that creates one CDoc in workspace `ws`.
pub fn order(ws: u64) -> serde_json::Value {
    serde_json::json!({
        "ws": ws, "ws_kind": 1, "command": "app.CreateOrder",
        "create": [{"raw_id": 1, "kind": "CDoc", "name": "app.Order", "fields": {"total": 10}}],
    })
}

/// Sends `method` to `url` with `token` (and `body` as JSON); answers the status, the
/// `WWW-Authenticate` header and the JSON body (`Null` when the body is not JSON).
pub async fn send(
    client: &reqwest::Client,
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<&serde_json::Value>,
) -> (u16, Option<String>, serde_json::Value) {
    let mut request = client.request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let r = request.send().await.expect("the server answers");
    let status = r.status().as_u16();
    let challenge = r
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().expect("ASCII").to_owned());
    let body = r.json().await.unwrap_or(serde_json::Value::Null);
    (status, challenge, body)
}

/// A test CA and a server certificate it signed for `localhost` and `127.0.0.1`, written as
/// PEM files `ca.pem`, `server.pem` and `server.key` into `dir`.
pub struct Pki {
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    pub fn new(dir: &Path) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "monoseq test CA");
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().expect("CA key"))
            .expect("CA certificate");
        let key = KeyPair::generate().expect("server key");
        let mut params =
            CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "monoseq test server");
        let cert = params.signed_by(&key, &ca).expect("server certificate");
        let pki = Pki {
            ca: dir.join("ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
        };
        std::fs::write(&pki.ca, ca.pem()).expect("write ca.pem");
        std::fs::write(&pki.cert, cert.pem()).expect("write server.pem");
        std::fs::write(&pki.key, key.serialize_pem()).expect("write server.key");
        pki
    }

    /// A client that trusts only the test CA.
    pub fn client(&self) -> reqwest::Client {
        let pem = std::fs::read(&self.ca).expect("read ca.pem");
        let ca = reqwest::Certificate::from_pem(&pem).expect("a PEM certificate");
        reqwest::Client::builder()
            .tls_certs_only([ca])
            .build()
            .expect("an https client")
    }
}
