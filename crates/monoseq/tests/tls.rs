//! HTTPS end to end, against the real binary with a certificate made by rcgen: a client that
//! trusts the test CA writes and reads back over TLS, plain HTTP on the TLS port gets nothing,
//! a bad certificate refuses the start, and `monoseq bench` loads the server over HTTPS.

mod security;

use std::time::Duration;

use reqwest::Method;
use security::{Pki, READ, WRITE, both_tokens, launch, order, send};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_the_ca_writes_and_reads_back_over_https() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let tokens = both_tokens(dir.path());
    let server = launch(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[
            "--tls-cert",
            pki.cert.to_str().unwrap(),
            "--tls-key",
            pki.key.to_str().unwrap(),
            "--tokens-file",
            tokens.to_str().unwrap(),
        ],
        &[],
    )
    .expect("server starts");
    assert!(
        server.url.starts_with("https://127.0.0.1:"),
        "{}",
        server.url
    );
    let client = pki.client();
    server.ready(&client, Some(READ)).await;
    let url = &server.url;
    let (status, _, out) = send(
        &client,
        Method::POST,
        &format!("{url}/v1/commands"),
        Some(WRITE),
        Some(&order(9)),
    )
    .await;
    assert_eq!(status, 200, "{out}");
    let (partition, offset) = (&out["partition"], &out["plog_offset"]);
    let event = format!("{url}/v1/partitions/{partition}/events/{offset}");
    let (status, _, event) = send(&client, Method::GET, &event, Some(READ), None).await;
    assert_eq!(status, 200, "{event}");
    assert_eq!(event["ws"], 9, "{event}");
    // The same name the certificate carries, as a host name.
    let by_name = url.replace("127.0.0.1", "localhost");
    let (status, _, _) = send(
        &client,
        Method::GET,
        &format!("{by_name}/v1/info"),
        Some(READ),
        None,
    )
    .await;
    assert_eq!(status, 200);
    // A client that does not trust the CA gets no answer.
    let untrusting = reqwest::Client::builder()
        .tls_certs_only([])
        .build()
        .unwrap();
    assert!(
        untrusting
            .get(format!("{url}/healthz"))
            .send()
            .await
            .is_err()
    );
    assert!(
        server.terminate(Duration::from_secs(20)).success(),
        "a graceful shutdown over TLS"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_to_the_tls_port_gets_no_answer_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let server = launch(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[
            "--tls-cert",
            pki.cert.to_str().unwrap(),
            "--tls-key",
            pki.key.to_str().unwrap(),
        ],
        &[],
    )
    .expect("server starts");
    let client = pki.client();
    server.ready(&client, None).await;
    let plain_url = server.url.replace("https://", "http://");
    let plain = reqwest::Client::new()
        .post(format!("{plain_url}/v1/commands"))
        .json(&order(1))
        .send()
        .await;
    assert!(plain.is_err(), "plain HTTP got an answer: {plain:?}");
    // Nothing was written, and the server still serves TLS.
    let event = format!("{}/v1/partitions/1/events/1", server.url);
    let (status, _, body) = send(&client, Method::GET, &event, None, None).await;
    assert_eq!(status, 404, "{body}");
}

#[test]
fn a_bad_certificate_or_key_file_refuses_the_start_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "this is no certificate\n").unwrap();
    let missing = dir.path().join("missing.key");
    for (cert, key, named) in [
        (&garbage, &pki.key, "garbage.pem"),
        (&pki.cert, &missing, "missing.key"),
        (&pki.cert, &garbage, "garbage.pem"),
        // The CA's certificate with the server's key: they do not belong together.
        (&pki.ca, &pki.key, "server.key"),
    ] {
        let log = launch(
            &dir.path().join("data"),
            "127.0.0.1:0",
            &[
                "--tls-cert",
                cert.to_str().unwrap(),
                "--tls-key",
                key.to_str().unwrap(),
            ],
            &[],
        )
        .err()
        .expect("the start is refused");
        assert!(log.contains(named), "the error names {named}: {log}");
    }
    let log = launch(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &["--tls-cert", pki.cert.to_str().unwrap()],
        &[],
    )
    .err()
    .expect("a certificate without a key is refused");
    assert!(log.contains("--tls-key"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_loads_the_server_over_https_with_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let tokens = both_tokens(dir.path());
    let server = launch(
        &dir.path().join("data"),
        "127.0.0.1:0",
        &[
            "--tls-cert",
            pki.cert.to_str().unwrap(),
            "--tls-key",
            pki.key.to_str().unwrap(),
            "--tokens-file",
            tokens.to_str().unwrap(),
        ],
        &[],
    )
    .expect("server starts");
    server.ready(&pki.client(), Some(WRITE)).await;
    let bench = |token: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_monoseq"))
            .args([
                "bench",
                "--url",
                &server.url,
                "--seconds",
                "1",
                "--clients",
                "2",
            ])
            .args(["--ca-cert", pki.ca.to_str().unwrap()])
            .env("MONOSEQ_TOKEN", token)
            .output()
            .expect("run monoseq bench");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("server: version=") && stdout.contains(" partitions=8 "),
            "bench names the server it measured (GET /v1/info): {stdout}"
        );
        let field = |name: &str| -> u64 {
            stdout
                .split_whitespace()
                .find_map(|w| w.strip_prefix(&format!("{name}=")))
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {name}= in {stdout}"))
        };
        (field("ok"), field("failed"))
    };
    let (ok, failed) = bench(WRITE);
    assert!(
        ok > 0 && failed == 0,
        "with the write token: ok={ok} failed={failed}"
    );
    let (ok, failed) = bench(READ);
    assert!(
        ok == 0 && failed > 0,
        "with a read token: ok={ok} failed={failed}"
    );
}
