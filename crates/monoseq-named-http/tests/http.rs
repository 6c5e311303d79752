//! The HTTP API over real HTTP: a server on 127.0.0.1:0 serving `router`, driven by the
//! client (`monoseq_client::SequencesClient`), and by raw requests (for status codes and the `{"code", "message"}` errors
//! of bad input).

use std::sync::Arc;

use monoseq_client::SequencesClient as Client;
use monoseq_kv::{Key, KvStore, MemoryStore};
use monoseq_named::{
    Address, Backend, BoxFuture, KV_TAG, KvBackend, NextOptions, Object, Sequences, SetOptions,
    StorageError, Version, WriteFailure,
};
use monoseq_named_http::router;
use serde_json::{Value, json};

struct Server {
    base: String,
    store: Arc<MemoryStore>,
    sequences: Sequences,
}

async fn serve() -> Server {
    let store = Arc::new(MemoryStore::new());
    let sequences = Sequences::new(KvBackend::shared(Arc::clone(&store)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = router(sequences.clone());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Server {
        base,
        store,
        sequences,
    }
}

/// A raw request: (status, JSON body or Null).
async fn raw(method: &str, url: &str, body: Option<&str>) -> (u16, Value) {
    let http = reqwest::Client::new();
    let mut request = http.request(method.parse().unwrap(), url);
    if let Some(body) = body {
        request = request
            .header("content-type", "application/json")
            .body(body.to_owned());
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let bytes = response.bytes().await.unwrap();
    let value = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&bytes)))
    };
    (status, value)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_operation_works_through_the_client() {
    let server = serve().await;
    let client = Client::new(&server.base).unwrap();
    let a = "orders/invoice".parse().unwrap();
    assert!(!client.exists(&a).await.unwrap());
    assert_eq!(client.get(&a).await.unwrap(), None);
    assert!(client.get_data(&a).await.unwrap().is_none());
    let metadata: monoseq_named::Metadata =
        serde_json::from_value(json!({"format": "INV-%04d"})).unwrap();
    let options = NextOptions::new().initial(1000).metadata(metadata.clone());
    assert_eq!(client.next(&a, &options).await.unwrap(), 1000);
    assert_eq!(
        client.increment(&a, &NextOptions::new()).await.unwrap(),
        1002
    );
    assert_eq!(client.get(&a).await.unwrap(), Some(1002));
    assert!(client.exists(&a).await.unwrap());
    let data = client.get_data(&a).await.unwrap().unwrap();
    assert_eq!((data.name.as_str(), data.value), ("invoice", 1002));
    assert_eq!(data.metadata, metadata);
    let data = client.reset(&a, 5, &SetOptions::new()).await.unwrap();
    assert_eq!(data.value, 5);
    let hundred = NextOptions::new().increment(std::num::NonZeroU64::new(100).unwrap());
    assert_eq!(client.next(&a, &hundred).await.unwrap(), 5);
    assert_eq!(server.sequences.get(&a).await.unwrap(), Some(105));
    client.delete(&a).await.unwrap();
    assert!(!client.exists(&a).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raw_requests_follow_the_documented_routes() {
    let server = serve().await;
    let url = |path: &str| format!("{}/v1/sequences/{path}", server.base);
    let (status, body) = raw("POST", &url("resource=orders/plugin=backup/run/next"), None).await;
    assert_eq!((status, body), (200, json!({"value": 1})));
    let (status, body) = raw(
        "POST",
        &url("prefix=tenants/7/counter/next"),
        Some(r#"{"initial": 10, "increment": 5, "timeout_ms": 1000}"#),
    )
    .await;
    assert_eq!((status, body), (200, json!({"value": 10})));
    let (status, body) = raw("GET", &url("prefix=tenants/7/counter/value"), None).await;
    assert_eq!((status, body), (200, json!({"value": 15})));
    let (status, body) = raw("GET", &url("prefix=tenants/7/counter/data"), None).await;
    assert_eq!(status, 200);
    assert_eq!(body["name"], "counter");
    assert_eq!(body["value"], 15);
    assert!(body["created_at_ms"].is_u64() && body["updated_at_ms"].is_u64());
    let (status, body) = raw(
        "POST",
        &url("prefix=tenants/7/counter/set"),
        Some(r#"{"value": 3, "metadata": {"reason": "migration"}}"#),
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["metadata"], json!({"reason": "migration"}));
    let (status, body) = raw("DELETE", &url("prefix=tenants/7/counter"), None).await;
    assert_eq!((status, body), (204, Value::Null));
    let (status, body) = raw("GET", &url("prefix=tenants/7/counter/exists"), None).await;
    assert_eq!((status, body), (200, json!({"exists": false})));
    let (status, body) = raw("GET", &url("prefix=tenants/7/counter/value"), None).await;
    assert_eq!((status, body), (200, json!({"value": null})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_a_stable_code_and_changes_nothing() {
    let server = serve().await;
    let url = |path: &str| format!("{}/v1/sequences/{path}", server.base);
    raw("POST", &url("orders/id/reset"), Some(r#"{"value": 50}"#)).await;
    let long = "n".repeat(129);
    let cases: Vec<(&str, String, Option<&str>, u16, &str)> = vec![
        (
            "POST",
            url("orders/id/next"),
            Some(r#"{"increment": 0}"#),
            400,
            "invalid_increment",
        ),
        (
            "POST",
            url("orders/id/next"),
            Some(r#"{"increment": -2}"#),
            400,
            "invalid_increment",
        ),
        (
            "POST",
            url("orders/id/next"),
            Some(r#"{"increment": 1.5}"#),
            400,
            "invalid_increment",
        ),
        (
            "POST",
            url("orders/id/next"),
            Some(r#"{"initial": -1}"#),
            400,
            "invalid_value",
        ),
        (
            "POST",
            url("orders/id/reset"),
            Some(r#"{"value": -5}"#),
            400,
            "invalid_value",
        ),
        (
            "POST",
            url("orders/id/reset"),
            Some(r#"{"value": 9223372036854775808}"#),
            400,
            "invalid_value",
        ),
        (
            "POST",
            url("orders/id/reset"),
            Some(r#"{"value": 1e30}"#),
            400,
            "invalid_value",
        ),
        (
            "POST",
            url("orders/id/reset"),
            Some(r#"{"value": "7"}"#),
            400,
            "invalid_value",
        ),
        (
            "POST",
            url("orders/id/next"),
            Some(r#"{"timeout_ms": null}"#),
            400,
            "bad_request",
        ),
        (
            "POST",
            url("orders/id/next"),
            Some(r#"{"initial": null}"#),
            400,
            "invalid_value",
        ),
        (
            "POST",
            url("orders/id/reset"),
            Some(r#"{}"#),
            400,
            "invalid_value",
        ),
        (
            "POST",
            url("orders/id/reset"),
            Some(r#"{"value": 1, "metadata": [1]}"#),
            400,
            "invalid_metadata",
        ),
        (
            "POST",
            url("orders/id/next"),
            Some(r#"{"incremnt": 2}"#),
            400,
            "bad_request",
        ),
        (
            "POST",
            url("orders/id/next"),
            Some("not json"),
            400,
            "bad_request",
        ),
        (
            "POST",
            url("orders/id/next"),
            Some("[1]"),
            400,
            "bad_request",
        ),
        // (A bare `..` segment never reaches a server: clients resolve dot segments.)
        (
            "POST",
            url("%2E%2E%2Fid/next"),
            None,
            400,
            "invalid_address",
        ),
        ("POST", url(".hidden/next"), None, 400, "invalid_address"),
        (
            "POST",
            url("orders%2F..%2Fid/next"),
            None,
            400,
            "invalid_address",
        ),
        (
            "POST",
            url(&format!("orders/{long}/next")),
            None,
            400,
            "invalid_address",
        ),
        ("POST", url("a/b/c/next"), None, 400, "invalid_address"),
        ("DELETE", url("orders/%C3%97"), None, 400, "invalid_address"),
        (
            "POST",
            url("orders/id/jump"),
            None,
            404,
            "unknown_operation",
        ),
        (
            "GET",
            url("orders/id/next"),
            None,
            405,
            "method_not_allowed",
        ),
        ("GET", url("orders/missing/data"), None, 404, "not_found"),
    ];
    for (method, url, body, status, code) in cases {
        let (got_status, got) = raw(method, &url, body).await;
        assert_eq!(
            (got_status, got["code"].as_str()),
            (status, Some(code)),
            "{method} {url} {body:?}: {got}"
        );
        assert!(got["message"].as_str().is_some_and(|m| !m.is_empty()));
    }
    let (_, body) = raw("GET", &url("orders/id/value"), None).await;
    assert_eq!(body, json!({"value": 50}), "nothing changed");

    // Overflow and an invalid stored object: 409, nothing written.
    raw(
        "POST",
        &url("orders/id/reset"),
        Some(r#"{"value": 9223372036854775807}"#),
    )
    .await;
    let (status, body) = raw("POST", &url("orders/id/next"), None).await;
    assert_eq!((status, body["code"].as_str()), (409, Some("overflow")));
    let key = "resource=orders/sequence=broken/value";
    let partition = [&[KV_TAG][..], key.as_bytes()].concat();
    server
        .store
        .put(Key::new(&partition, b""), b"{\"value\":1}")
        .unwrap();
    let (status, body) = raw("POST", &url("orders/broken/next"), None).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (409, Some("invalid_stored"))
    );
    let (status, _) = raw("POST", &url("orders/broken/reset"), Some(r#"{"value": 1}"#)).await;
    assert_eq!(status, 409);
    assert_eq!(
        server
            .store
            .get(Key::new(&partition, b""))
            .unwrap()
            .unwrap(),
        b"{\"value\":1}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reserver_takes_its_blocks_through_the_server() {
    use monoseq_named::{ReserveOptions, Reserver};
    let server = serve().await;
    let client = Client::new(&server.base).unwrap();
    let address: monoseq_named::Address = "orders/id".parse().unwrap();
    let block = std::num::NonZeroU64::new(100).unwrap();
    let ids = Reserver::new(client, address.clone(), ReserveOptions::new(block));
    for expected in 1..=60 {
        assert_eq!(ids.next().await.unwrap(), expected);
    }
    // Another caller of the same sequence gets a number the reserver never hands out, before
    // or after (its blocks are the server's, fetched ahead in the background).
    let other = server
        .sequences
        .next(&address, &NextOptions::new())
        .await
        .unwrap();
    assert!(other > 60, "{other}");
    let mut last = 60;
    for _ in 0..200 {
        let n = ids.next().await.unwrap();
        assert!(
            n > last,
            "the reserver's numbers increase: {n} after {last}"
        );
        assert_ne!(n, other, "handed out twice");
        last = n;
    }
}

/// JSON Schema counts `5.0` as the integer 5, and so does the server; a fraction, a negative
/// or a too large number is still refused, each named as such.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_whole_number_written_with_a_fraction_is_that_number() {
    let server = serve().await;
    let seq = |op: &str| format!("{}/v1/sequences/orders/id/{op}", server.base);
    let (status, body) = raw("POST", &seq("reset"), Some(r#"{"value": 5.0}"#)).await;
    assert_eq!((status, &body["value"]), (200, &json!(5)), "{body}");
    let (status, body) = raw(
        "POST",
        &seq("next"),
        Some(r#"{"increment": 2e0, "timeout_ms": 1000.0}"#),
    )
    .await;
    assert_eq!((status, body), (200, json!({"value": 5})));
    for (body, code, says) in [
        (r#"{"value": 5.5}"#, "invalid_value", "not a whole number"),
        (r#"{"value": -3.0}"#, "invalid_value", "negative"),
        (
            r#"{"value": 1e30}"#,
            "invalid_value",
            "over the largest value",
        ),
    ] {
        let (status, answer) = raw("POST", &seq("reset"), Some(body)).await;
        assert_eq!(
            (status, answer["code"].as_str()),
            (400, Some(code)),
            "{body}"
        );
        let message = answer["message"].as_str().unwrap();
        assert!(message.contains(says), "{body}: {message}");
    }
    assert_eq!(
        server
            .sequences
            .get(&"orders/id".parse().unwrap())
            .await
            .unwrap(),
        Some(7)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_body_is_answered_too_large() {
    let server = serve().await;
    let url = format!("{}/v1/sequences/orders/id/next", server.base);
    let metadata = "x".repeat(monoseq_named_http::BODY_BYTES_MAX + 1);
    let body = format!(r#"{{"metadata": {{"note": "{metadata}"}}}}"#);
    let (status, body) = raw("POST", &url, Some(&body)).await;
    assert_eq!(
        (status, body["code"].as_str()),
        (413, Some("too_large")),
        "{body}"
    );
}

#[tokio::test]
async fn a_405_names_the_methods_the_path_takes_in_allow() {
    let server = serve().await;
    let http = reqwest::Client::new();
    let url = |path: &str| format!("{}/v1/sequences/{path}", server.base);
    let cases = [
        ("GET", "orders/id/next", "POST"),
        ("DELETE", "orders/id/value", "GET, HEAD"),
        ("PUT", "orders/id/reset", "POST"),
        ("POST", "orders/id/exists", "GET, HEAD"),
        ("GET", "orders/id", "DELETE"),
        ("PATCH", "resource=orders/plugin=backup/run", "DELETE"),
    ];
    for (method, path, allow) in cases {
        let response = http
            .request(method.parse().unwrap(), url(path))
            .send()
            .await
            .unwrap();
        let got = response
            .headers()
            .get("allow")
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(
            (response.status().as_u16(), got.as_deref()),
            (405, Some(allow)),
            "{method} {path}"
        );
    }
}

/// How long after landing a write of [`SlowAnswers`] answers: longer than the 1 ms timeout the
/// contention test gives its callers.
const WRITE_ANSWER_DELAY: std::time::Duration = std::time::Duration::from_millis(5);

/// A backend whose writes answer [`WRITE_ANSWER_DELAY`] after they landed, as storage with slow
/// acknowledgements does: a caller's short timeout passes while its write is under way.
struct SlowAnswers(Arc<dyn Backend>);

impl SlowAnswers {
    async fn answer<T>(&self, written: BoxFuture<'_, T>) -> T {
        let answer = written.await;
        tokio::time::sleep(WRITE_ANSWER_DELAY).await;
        answer
    }
}

impl Backend for SlowAnswers {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Object>, StorageError>> {
        self.0.load(key)
    }
    fn create<'a>(
        &'a self,
        key: &'a str,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        Box::pin(self.answer(self.0.create(key, bytes)))
    }
    fn replace<'a>(
        &'a self,
        key: &'a str,
        expected: &'a Version,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        Box::pin(self.answer(self.0.replace(key, expected, bytes)))
    }
    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StorageError>> {
        self.0.remove(key)
    }
}

/// Concurrent calls of one operation on one sequence through two servers sharing a store (two
/// processes racing), with timeout `timeout_ms`: each is answered 200 or 503 `busy`, and the
/// stored sequence holds exactly what the 200s say was written, so no 503 changed anything.
/// Some calls succeed, even with a timeout of 0 (one try). Returns how many were busy.
async fn contend(operation: &str, timeout_ms: u64) -> usize {
    const CALLERS: u64 = 24;
    const START: u64 = 100;
    let store = Arc::new(MemoryStore::new());
    let shared: Arc<dyn Backend> = Arc::new(KvBackend::shared(Arc::clone(&store)));
    let mut bases = Vec::new();
    for _ in 0..2 {
        let sequences = Sequences::new(SlowAnswers(Arc::clone(&shared)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        bases.push(format!("http://{}", listener.local_addr().unwrap()));
        let app = router(sequences);
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    }
    let reader = Sequences::new(Arc::clone(&shared));
    let address: Address = "orders/raced".parse().unwrap();
    reader
        .reset(&address, START, &SetOptions::new())
        .await
        .unwrap();
    let calls: Vec<_> = (0..CALLERS)
        .map(|i| {
            let url = format!(
                "{}/v1/sequences/orders/raced/{operation}",
                bases[(i % 2) as usize]
            );
            let body = match operation {
                "reset" | "set" => json!({"value": 1000 + i, "timeout_ms": timeout_ms}),
                _ => json!({"timeout_ms": timeout_ms}),
            };
            tokio::spawn(async move { raw("POST", &url, Some(&body.to_string())).await })
        })
        .collect();
    let mut written = Vec::new();
    let mut busy = 0;
    for call in calls {
        let (status, body) = call.await.unwrap();
        match status {
            200 => written.push(body),
            503 => {
                assert_eq!(body["code"], "busy", "{operation} {timeout_ms}: {body}");
                busy += 1;
            }
            _ => panic!("{operation} with timeout {timeout_ms}: {status} {body}"),
        }
    }
    let case = format!("{operation} with timeout_ms {timeout_ms}: {busy} busy");
    assert!(!written.is_empty(), "{case}, none succeeded");
    let stored = reader.get_data(&address).await.unwrap().unwrap();
    let ok = written.len() as u64;
    match operation {
        "reset" | "set" => {
            // Each 200 wrote one revision, and nothing else did.
            let mut revisions: Vec<u64> = written
                .iter()
                .map(|b| b["revision"].as_u64().unwrap())
                .collect();
            revisions.sort_unstable();
            assert_eq!(revisions, (2..=1 + ok).collect::<Vec<_>>(), "{case}");
            assert_eq!(stored.revision, 1 + ok, "{case}: a busy call wrote");
            let last = written.iter().find(|b| b["revision"] == stored.revision);
            assert_eq!(last.unwrap()["value"], stored.value, "{case}");
        }
        _ => {
            // The numbers handed out are exactly the ones the stored value moved past.
            let after = u64::from(operation == "increment");
            let mut numbers: Vec<u64> = written
                .iter()
                .map(|b| b["value"].as_u64().unwrap())
                .collect();
            numbers.sort_unstable();
            let expected: Vec<u64> = (START + after..START + after + ok).collect();
            assert_eq!(numbers, expected, "{case}");
            assert_eq!(stored.value, START + ok, "{case}: a busy call took numbers");
        }
    }
    busy
}

/// A retry-later answer is never given for a call that changed anything: every operation that
/// writes, with a timeout of 0 (one try) and of 1 ms (shorter than storage takes to answer),
/// under contention.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_answer_under_contention_never_comes_from_a_call_that_wrote() {
    let mut busy = 0;
    for timeout_ms in [0, 1] {
        for operation in ["next", "increment", "reset", "set"] {
            busy += contend(operation, timeout_ms).await;
        }
    }
    assert!(
        busy > 0,
        "no call lost a race: the contention proved nothing"
    );
}

/// Any whole number of milliseconds is a valid `timeout_ms` (the document allows up to
/// 2^64 − 1); one past the longest timeout is cut to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_past_the_longest_is_cut_to_it() {
    let server = serve().await;
    let seq = |op: &str| format!("{}/v1/sequences/orders/id/{op}", server.base);
    let body = format!(r#"{{"timeout_ms": {}}}"#, u64::MAX);
    let (status, answer) = raw("POST", &seq("next"), Some(&body)).await;
    assert_eq!((status, answer), (200, json!({"value": 1})));
    let body = format!(r#"{{"value": 9, "timeout_ms": {}}}"#, u64::MAX - 1);
    let (status, answer) = raw("POST", &seq("set"), Some(&body)).await;
    assert_eq!((status, &answer["value"]), (200, &json!(9)), "{answer}");
}
