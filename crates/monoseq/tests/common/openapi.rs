//! The OpenAPI document (`docs/openapi.json`) as a checker of answers: which operation a
//! method and path are, whether the status is documented for it, whether the body matches the
//! documented schema of its content type, and whether the documented headers are there and
//! well formed. The end-to-end tests check every answer their servers logged
//! (`MONOSEQ_ANSWER_LOG`) with it.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use serde_json::{Value, json};

/// The document as kept in the repository.
pub const DOCUMENT: &str = include_str!("../../../../docs/openapi.json");

/// One answer as the server logged it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Answer {
    pub method: String,
    pub path: String,
    pub status: u16,
    #[serde(default)]
    pub headers: HashMap<String, String>,
    #[serde(default)]
    pub body: String,
}

/// A document and the schema validators built from it so far.
pub struct Contract {
    doc: Value,
    validators: Mutex<HashMap<String, std::sync::Arc<jsonschema::Validator>>>,
}

/// The repository's document.
pub fn contract() -> &'static Contract {
    static CONTRACT: OnceLock<Contract> = OnceLock::new();
    CONTRACT.get_or_init(|| {
        Contract::new(serde_json::from_str(DOCUMENT).expect("docs/openapi.json is JSON"))
    })
}

/// The operations of named sequences, the last segment of their paths.
const SEQUENCE_OPERATIONS: [&str; 7] = [
    "next",
    "increment",
    "value",
    "data",
    "exists",
    "reset",
    "set",
];

impl Contract {
    pub fn new(doc: Value) -> Contract {
        Contract {
            doc,
            validators: Mutex::default(),
        }
    }

    /// The documented path template `path` is an instance of (a named sequence's address may
    /// have any number of segments; the document names the common `{scope}/{name}`).
    fn template(&self, method: &str, path: &str) -> Option<String> {
        if let Some(rest) = path.strip_prefix("/v1/sequences/") {
            let last = rest.rsplit('/').next().unwrap_or_default();
            // DELETE names an address, whose last segment may spell an operation.
            let operation = method != "DELETE" && SEQUENCE_OPERATIONS.contains(&last);
            return Some(if operation && rest.contains('/') {
                format!("/v1/sequences/{{scope}}/{{name}}/{last}")
            } else {
                "/v1/sequences/{scope}/{name}".to_owned()
            });
        }
        let segments: Vec<&str> = path.split('/').collect();
        self.doc["paths"]
            .as_object()?
            .keys()
            .find(|t| {
                let ts: Vec<&str> = t.split('/').collect();
                ts.len() == segments.len()
                    && ts
                        .iter()
                        .zip(&segments)
                        .all(|(t, s)| (t.starts_with('{') && !s.is_empty()) || t == s)
            })
            .cloned()
    }

    /// `Ok` when the answer is what the document says; else what differs.
    pub fn check(&self, a: &Answer) -> Result<(), String> {
        let method = a.method.to_ascii_lowercase();
        let Some(template) = self.template(&a.method, &a.path) else {
            // An undocumented path: the fallback's JSON error.
            return match a.status {
                404 | 405 | 401 | 403 => self.body_matches("#/components/schemas/Error", a),
                s => Err(format!(
                    "{} {}: {s} on an undocumented path",
                    a.method, a.path
                )),
            };
        };
        let operation = &self.doc["paths"][&template][&method];
        if operation.is_null() {
            // An undocumented method: the method-not-allowed fallback (or, on a named
            // sequence's address, an unknown operation).
            return match a.status {
                404 | 405 | 401 | 403 => self.body_matches("#/components/schemas/Error", a),
                s => Err(format!(
                    "{} {}: {s}, and the method is undocumented",
                    a.method, a.path
                )),
            };
        }
        let status = a.status.to_string();
        let mut response = &operation["responses"][&status];
        if response.is_null() {
            return Err(format!(
                "{} {template}: status {status} is not documented (body {})",
                a.method, a.body
            ));
        }
        let mut pointer = String::new();
        if let Some(r) = response["$ref"].as_str() {
            pointer = r.trim_start_matches('#').to_owned();
            response = self.doc.pointer(&pointer).unwrap_or(&Value::Null);
        }
        let at = format!("/paths/{}/{method}/responses/{status}", escape(&template));
        self.headers_match(response, &at, a)?;
        let Some(content) = response["content"].as_object() else {
            return Ok(());
        };
        let media = a
            .headers
            .get("content-type")
            .map(|c| c.split(';').next().unwrap_or_default().trim().to_owned())
            .unwrap_or_default();
        if media == "text/event-stream" && content.contains_key(&media) {
            // A live tail is logged without its body (it never ends).
            return Ok(());
        }
        let schema_at = match content.get(&media) {
            Some(_) => fragment(&format!(
                "#{}/content/{}/schema",
                response_pointer(&pointer, &at),
                escape(&media)
            )),
            None => {
                return Err(format!(
                    "{} {template} {status}: content type {media:?}, documented {:?}",
                    a.method,
                    content.keys().collect::<Vec<_>>()
                ));
            }
        };
        self.body_matches(&schema_at, a)
    }

    fn headers_match(&self, response: &Value, at: &str, a: &Answer) -> Result<(), String> {
        let Some(headers) = response["headers"].as_object() else {
            return Ok(());
        };
        for (name, header) in headers {
            let header = match header["$ref"].as_str() {
                Some(r) => self
                    .doc
                    .pointer(r.trim_start_matches('#'))
                    .unwrap_or(&Value::Null),
                None => header,
            };
            match a.headers.get(&name.to_ascii_lowercase()) {
                None if header["required"] == json!(true) => {
                    return Err(format!(
                        "{} {} {}: no {name} header ({at})",
                        a.method, a.path, a.status
                    ));
                }
                None => {}
                Some(value) => {
                    let validator = self.validator_for_value(&header["schema"])?;
                    if !validator.is_valid(&json!(value)) {
                        return Err(format!(
                            "{} {} {}: header {name}: {value:?} is not as documented",
                            a.method, a.path, a.status
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    fn body_matches(&self, schema_ref: &str, a: &Answer) -> Result<(), String> {
        let media = a.headers.get("content-type").cloned().unwrap_or_default();
        let instance = if media.starts_with("application/json") {
            serde_json::from_str(&a.body).map_err(|e| {
                format!(
                    "{} {} {}: body not JSON ({e}): {}",
                    a.method, a.path, a.status, a.body
                )
            })?
        } else {
            Value::String(a.body.clone())
        };
        let validator = self.validator(schema_ref)?;
        let errors: Vec<String> = validator
            .iter_errors(&instance)
            .map(|e| format!("{e} at {}", e.instance_path()))
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "{} {} {}: the body breaks {schema_ref}: {}; body: {}",
                a.method,
                a.path,
                a.status,
                errors.join("; "),
                a.body
            ))
        }
    }

    /// A validator of the schema at `schema_ref` (`#/json/pointer`) with the document's
    /// components in reach of its references.
    fn validator(&self, schema_ref: &str) -> Result<std::sync::Arc<jsonschema::Validator>, String> {
        if let Some(v) = self.validators.lock().unwrap().get(schema_ref) {
            return Ok(v.clone());
        }
        let root = json!({"$ref": schema_ref, "components": self.doc["components"], "paths": self.doc["paths"]});
        let validator = jsonschema::draft202012::new(&root)
            .map_err(|e| format!("the schema at {schema_ref} does not compile: {e}"))?;
        let validator = std::sync::Arc::new(validator);
        self.validators
            .lock()
            .unwrap()
            .insert(schema_ref.to_owned(), validator.clone());
        Ok(validator)
    }

    fn validator_for_value(&self, schema: &Value) -> Result<jsonschema::Validator, String> {
        jsonschema::draft202012::new(schema)
            .map_err(|e| format!("a header schema does not compile: {e}"))
    }

    /// Every logged answer in `log` (one JSON object a line) checked; the violations.
    pub fn check_log(&self, log: &str) -> Vec<String> {
        // A last line without its newline was cut by a kill of the server: not an answer.
        let whole = match log.rfind('\n') {
            Some(end) => &log[..end],
            None => "",
        };
        whole
            .lines()
            .filter(|l| !l.trim().is_empty())
            .filter_map(|line| match serde_json::from_str::<Answer>(line) {
                Ok(a) => self.check(&a).err(),
                Err(e) => Some(format!("an unreadable log line ({e}): {line}")),
            })
            .collect()
    }
}

/// The JSON pointer of a response: the component's when it was a `$ref`, else its own place.
fn response_pointer(component: &str, own: &str) -> String {
    if component.is_empty() {
        own.to_owned()
    } else {
        component.to_owned()
    }
}

/// A JSON pointer as a URI fragment (the braces of path templates percent-encoded).
fn fragment(pointer: &str) -> String {
    pointer.replace('{', "%7B").replace('}', "%7D")
}

/// A JSON-pointer segment for `s` (`~` and `/` escaped).
fn escape(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// Checks the answers logged in `path` (if it exists); panics naming each violation.
pub fn assert_log_conforms(path: &std::path::Path) {
    let Ok(log) = std::fs::read_to_string(path) else {
        return;
    };
    let violations = contract().check_log(&log);
    assert!(
        violations.is_empty(),
        "{} answers break docs/openapi.json:\n{}",
        violations.len(),
        violations.join("\n")
    );
}
