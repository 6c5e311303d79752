//! `scripts/cluster`: three nodes and PostgreSQL with a synchronous standby on one command,
//! each node serving the console; SIGTERM stops everything it started and leaves no process,
//! port or directory behind.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_monoseq");

/// Processes whose command line mentions `needle`.
fn processes_naming(needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(needle) {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

/// The status line of `GET url` (`http://127.0.0.1:PORT/PATH`).
fn status_line(url: &str) -> String {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").expect("an http URL");
    let (addr, path) = rest.split_at(rest.find('/').expect("a path"));
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    answer.lines().next().unwrap_or_default().to_owned()
}

#[test]
fn the_cluster_script_serves_three_consoles_and_sigterm_leaves_nothing_running() {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/cluster");
    let mut child = Command::new(script)
        .env("MONOSEQ_BIN", BIN)
        .env("MONOSEQ_CLUSTER_PARTITIONS", "4")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start scripts/cluster");
    let (mut urls, mut dir) = (Vec::new(), String::new());
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(url) = line.split_whitespace().find(|w| w.ends_with("/ui/")) {
            urls.push(url.to_owned());
        }
        if let Some(d) = line.strip_prefix("Logs and data: ") {
            dir = d.trim().to_owned();
        }
        if line.starts_with("Ctrl-C stops everything") {
            break;
        }
    }
    assert_eq!(urls.len(), 3, "three consoles printed: {urls:?}");
    assert!(!dir.is_empty() && Path::new(&dir).exists(), "{dir}");
    for url in &urls {
        assert!(
            status_line(url).contains(" 200 "),
            "{url}: {}",
            status_line(url)
        );
    }
    assert!(
        processes_naming(&dir).len() >= 5,
        "three nodes and two PostgreSQL servers run under {dir}: {:?}",
        processes_naming(&dir)
    );

    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "scripts/cluster did not stop");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!status.success(), "stopped by SIGTERM: {status}");
    assert_eq!(processes_naming(&dir), Vec::<String>::new(), "left running");
    assert!(!Path::new(&dir).exists(), "{dir} removed");
    for url in &urls {
        let port = url.trim_end_matches("/ui/").rsplit(':').next().unwrap();
        let addr = format!("127.0.0.1:{port}");
        assert!(
            std::net::TcpStream::connect(&addr).is_err(),
            "{addr} still listens"
        );
    }
}
