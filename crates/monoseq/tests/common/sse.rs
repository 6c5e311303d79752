//! A reader of Server-Sent Events answers (`text/event-stream`) for the consumer-side tests.

use std::time::{Duration, Instant};

use serde_json::Value;

/// One parsed Server-Sent Events message.
#[derive(Debug, Clone)]
pub struct Message {
    pub event: String,
    pub id: Option<u64>,
    /// The `id:` as sent (a multi-partition stream's is a resume vector, not a number).
    pub raw_id: Option<String>,
    pub data: Value,
}

/// Reads messages of an SSE answer as they come.
pub struct Sse {
    response: reqwest::Response,
    buffer: String,
}

impl Sse {
    /// Opens a tail, or `None` when the node does not answer 200 (down, or refusing now).
    pub async fn try_open(
        client: &reqwest::Client,
        url: &str,
        last_id: Option<u64>,
    ) -> Option<Sse> {
        let mut request = client.get(url);
        if let Some(id) = last_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = request.send().await.ok()?;
        (response.status() == 200).then(|| Sse {
            response,
            buffer: String::new(),
        })
    }

    /// Reads an answer already received (status checked by the caller).
    #[allow(dead_code)]
    pub fn from_response(response: reqwest::Response) -> Sse {
        Sse {
            response,
            buffer: String::new(),
        }
    }

    pub async fn open(client: &reqwest::Client, url: &str, last_id: Option<u64>) -> Sse {
        let mut request = client.get(url);
        if let Some(id) = last_id {
            request = request.header("last-event-id", id.to_string());
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 200, "{url}");
        assert_eq!(
            response.headers()["content-type"].to_str().unwrap(),
            "text/event-stream"
        );
        Sse {
            response,
            buffer: String::new(),
        }
    }

    /// The next message, waiting at most `bound`.
    pub async fn next(&mut self, bound: Duration) -> Option<Message> {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                return Some(parse(&block));
            }
            let left = deadline.checked_duration_since(Instant::now())?;
            match tokio::time::timeout(left, self.response.chunk()).await {
                Ok(Ok(Some(bytes))) => self.buffer.push_str(&String::from_utf8_lossy(&bytes)),
                _ => return None,
            }
        }
    }

    /// The next message that is not a heartbeat.
    pub async fn next_entry(&mut self, bound: Duration) -> Option<Message> {
        loop {
            let m = self.next(bound).await?;
            if m.event != "heartbeat" {
                return Some(m);
            }
        }
    }
}

pub fn parse(block: &str) -> Message {
    let mut m = Message {
        event: "message".into(),
        id: None,
        raw_id: None,
        data: Value::Null,
    };
    for line in block.lines() {
        if let Some(v) = line.strip_prefix("event: ") {
            m.event = v.to_owned();
        } else if let Some(v) = line.strip_prefix("id: ") {
            m.id = v.parse().ok();
            m.raw_id = Some(v.to_owned());
        } else if let Some(v) = line.strip_prefix("data: ") {
            m.data = serde_json::from_str(v).expect("JSON data");
        }
    }
    m
}
