//! [`S3Backend`]: named sequences in S3-compatible object storage through `object_store`.
//! Owns the mapping of the backend contract onto conditional requests: `If-None-Match: *` to
//! create, `If-Match: <etag>` to replace, a 412 (or a 409 that outlived `object_store`'s own
//! retries) read as a lost race. Objects are stored at the sequence's key
//! ([`crate::Address::key`]) in the configured bucket.

use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder, S3ConditionalPut};
use object_store::path::Path;
use object_store::{
    BackoffConfig, ClientOptions, Error as OsError, GetOptions, ObjectStore, ObjectStoreExt,
    PutMode, PutOptions, PutPayload, RetryConfig, UpdateVersion,
};

use crate::backend::{Backend, BoxFuture, Object, Version, WriteFailure};
use crate::error::StorageError;

/// Longest wait for one S3 request.
pub const S3_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Retries of a failed S3 request inside `object_store` (server errors, 409 on `If-Match`).
pub const S3_RETRIES_MAX: usize = 3;

/// Where the sequences' bucket is and how to reach it.
///
/// # Example
///
/// ```
/// use monoseq_named::S3Config;
///
/// let config = S3Config::new("sequences")
///     .endpoint("http://127.0.0.1:9000")
///     .credentials("test", "test");
/// # let _ = config;
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct S3Config {
    bucket: String,
    endpoint: Option<String>,
    region: String,
    credentials: Option<(String, String)>,
    from_env: bool,
}

impl std::fmt::Debug for S3Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Config")
            .field("bucket", &self.bucket)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

impl S3Config {
    /// The bucket `bucket` on AWS (region `us-east-1`, credentials from the environment
    /// unless [`S3Config::credentials`] is given).
    pub fn new(bucket: impl Into<String>) -> S3Config {
        S3Config {
            bucket: bucket.into(),
            endpoint: None,
            region: "us-east-1".to_owned(),
            credentials: None,
            from_env: true,
        }
    }

    /// An S3-compatible server at `endpoint` (path-style requests; `http://` allowed).
    #[must_use]
    pub fn endpoint(mut self, endpoint: impl Into<String>) -> S3Config {
        self.endpoint = Some(endpoint.into());
        self
    }

    /// The region (default `us-east-1`).
    #[must_use]
    pub fn region(mut self, region: impl Into<String>) -> S3Config {
        self.region = region.into();
        self
    }

    /// Static credentials instead of the environment's (`AWS_ACCESS_KEY_ID`, …).
    #[must_use]
    pub fn credentials(
        mut self,
        access_key_id: impl Into<String>,
        secret_access_key: impl Into<String>,
    ) -> S3Config {
        self.credentials = Some((access_key_id.into(), secret_access_key.into()));
        self.from_env = false;
        self
    }
}

/// Named sequences in an S3 bucket, with conditional puts (`If-None-Match` / `If-Match`).
/// The server must honour both headers (AWS S3 does since 2024, as do MinIO, R2 and moto).
#[derive(Debug)]
pub struct S3Backend {
    store: AmazonS3,
}

impl S3Backend {
    /// A backend on the bucket of `config`. Does no request.
    ///
    /// # Errors
    ///
    /// A [`StorageError`] when the configuration is incomplete or invalid.
    pub fn new(config: &S3Config) -> Result<S3Backend, StorageError> {
        let mut builder = if config.from_env {
            AmazonS3Builder::from_env()
        } else {
            AmazonS3Builder::new()
        };
        builder = builder
            .with_bucket_name(&config.bucket)
            .with_region(&config.region)
            .with_conditional_put(S3ConditionalPut::ETagMatch)
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(5),
                    max_backoff: Duration::from_millis(200),
                    base: 2.0,
                },
                max_retries: S3_RETRIES_MAX,
                retry_timeout: S3_REQUEST_TIMEOUT,
            })
            .with_client_options(
                ClientOptions::new()
                    .with_timeout(S3_REQUEST_TIMEOUT)
                    .with_connect_timeout(Duration::from_secs(2))
                    .with_allow_http(true),
            );
        if let Some(endpoint) = &config.endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_virtual_hosted_style_request(false);
        }
        if let Some((key, secret)) = &config.credentials {
            builder = builder
                .with_access_key_id(key)
                .with_secret_access_key(secret);
        }
        let store = builder
            .build()
            .map_err(|e| StorageError::new("configuring the S3 backend", e))?;
        Ok(S3Backend { store })
    }
}

fn path(key: &str, context: &'static str) -> Result<Path, StorageError> {
    Path::parse(key).map_err(|e| StorageError::new(context, e))
}

fn written(
    result: object_store::Result<object_store::PutResult>,
    context: &'static str,
) -> Result<Version, WriteFailure> {
    match result {
        Ok(put) => match put.e_tag {
            Some(e_tag) => Ok(Version::new(e_tag)),
            None => Err(StorageError::message(
                context,
                "the server answered without an ETag, so conditional writes cannot work",
            )
            .into()),
        },
        Err(OsError::AlreadyExists { .. } | OsError::Precondition { .. }) => {
            Err(WriteFailure::Conflict)
        }
        Err(e) => Err(StorageError::new(context, e).into()),
    }
}

impl Backend for S3Backend {
    fn load<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<Option<Object>, StorageError>> {
        Box::pin(async move {
            const CONTEXT: &str = "reading the sequence object";
            let path = path(key, CONTEXT)?;
            let result = match self.store.get_opts(&path, GetOptions::default()).await {
                Ok(result) => result,
                Err(OsError::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(StorageError::new(CONTEXT, e)),
            };
            let Some(e_tag) = result.meta.e_tag.clone() else {
                return Err(StorageError::message(
                    CONTEXT,
                    "the server answered without an ETag, so conditional writes cannot work",
                ));
            };
            let bytes = result
                .bytes()
                .await
                .map_err(|e| StorageError::new(CONTEXT, e))?;
            Ok(Some(Object {
                bytes: bytes.to_vec(),
                version: Version::new(e_tag),
            }))
        })
    }

    fn create<'a>(
        &'a self,
        key: &'a str,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        Box::pin(async move {
            const CONTEXT: &str = "creating the sequence object";
            let path = path(key, CONTEXT)?;
            let result = self
                .store
                .put_opts(&path, PutPayload::from(bytes), PutMode::Create.into())
                .await;
            written(result, CONTEXT)
        })
    }

    fn replace<'a>(
        &'a self,
        key: &'a str,
        expected: &'a Version,
        bytes: Vec<u8>,
    ) -> BoxFuture<'a, Result<Version, WriteFailure>> {
        Box::pin(async move {
            const CONTEXT: &str = "updating the sequence object";
            let path = path(key, CONTEXT)?;
            let e_tag = String::from_utf8(expected.as_bytes().to_vec())
                .map_err(|e| StorageError::new(CONTEXT, e))?;
            let mode = PutMode::Update(UpdateVersion {
                e_tag: Some(e_tag),
                version: None,
            });
            let result = self
                .store
                .put_opts(&path, PutPayload::from(bytes), PutOptions::from(mode))
                .await;
            written(result, CONTEXT)
        })
    }

    fn remove<'a>(&'a self, key: &'a str) -> BoxFuture<'a, Result<(), StorageError>> {
        Box::pin(async move {
            const CONTEXT: &str = "deleting the sequence object";
            let path = path(key, CONTEXT)?;
            match self.store.delete(&path).await {
                Ok(()) | Err(OsError::NotFound { .. }) => Ok(()),
                Err(e) => Err(StorageError::new(CONTEXT, e)),
            }
        })
    }
}
