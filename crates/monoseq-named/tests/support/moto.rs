//! The S3-compatible server the S3 tests and benches run against: the endpoint in
//! `MONOSEQ_S3_ENDPOINT` if set, otherwise a `moto_server` started on a free local port for
//! the life of this process (it stops when the process exits, even on SIGKILL: a shell
//! wrapper kills it when its standard input, held by this process, closes). With neither, the
//! tests fail with a message saying what to install.

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Environment variable naming an S3-compatible endpoint to use instead of starting moto.
pub const ENDPOINT_VAR: &str = "MONOSEQ_S3_ENDPOINT";
const START_TIMEOUT: Duration = Duration::from_secs(60);

struct Server {
    endpoint: String,
    /// Holds the wrapper's standard input open; closing it stops the server.
    _child: Option<Mutex<Child>>,
}

static SERVER: OnceLock<Server> = OnceLock::new();

/// The endpoint of the S3 server (`http://127.0.0.1:PORT`), starting moto on first use.
///
/// # Panics
///
/// When no endpoint is configured and `moto_server` is not on PATH, or it does not start.
pub fn endpoint() -> &'static str {
    &SERVER.get_or_init(start).endpoint
}

fn start() -> Server {
    if let Ok(endpoint) = std::env::var(ENDPOINT_VAR) {
        return Server {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            _child: None,
        };
    }
    let found = Command::new("sh")
        .args(["-c", "command -v moto_server"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "the S3 tests need an S3-compatible server with conditional writes: set {ENDPOINT_VAR}=http://HOST:PORT, \
         or install moto so that `moto_server` is on PATH (pip install 'moto[server]')"
    );
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("a free local port")
        .port();
    let log = std::env::temp_dir().join(format!("monoseq-moto-{port}.log"));
    let script = format!(
        "moto_server -H 127.0.0.1 -p {port} >{log} 2>&1 & pid=$!; read _; kill $pid; rm -f {log}",
        log = log.display()
    );
    let child = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("sh starts");
    let started = Instant::now();
    while TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_err() {
        assert!(
            started.elapsed() < START_TIMEOUT,
            "moto_server did not listen on port {port} within {START_TIMEOUT:?}; its output:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Server {
        endpoint: format!("http://127.0.0.1:{port}"),
        _child: Some(Mutex::new(child)),
    }
}

/// Creates bucket `name` (path-style `PUT /name`, unsigned: moto accepts it; a real server
/// needs the bucket made beforehand, and answers this with an error the caller ignores).
pub fn create_bucket(name: &str) {
    let endpoint = endpoint();
    let host = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).expect("the S3 server accepts connections");
    write!(
        stream,
        "PUT /{name} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut answer = String::new();
    std::io::Read::read_to_string(&mut stream, &mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.1 200") || answer.contains("BucketAlreadyOwnedByYou"),
        "creating bucket {name}: {answer}"
    );
}

/// A bucket name unique to this process and call.
pub fn unique_bucket(stem: &str) -> String {
    static COUNTER: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{stem}-{}-{nanos}-{n}", std::process::id())
}

/// A fresh bucket and a backend on it.
pub fn backend(stem: &str) -> monoseq_named::S3Backend {
    let bucket = unique_bucket(stem);
    create_bucket(&bucket);
    let config = monoseq_named::S3Config::new(bucket)
        .endpoint(endpoint())
        .credentials("testing", "testing");
    monoseq_named::S3Backend::new(&config).expect("the S3 backend builds")
}
