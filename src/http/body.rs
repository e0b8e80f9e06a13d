//! Request bodies: their declared size, the global budget of bytes being read, and reading
//! one within its limit and timeout.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap};
use bytes::Bytes;
use http_body_util::{BodyExt, LengthLimitError, Limited};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::http::error::IngestError;

/// The most bytes the body can have: its `Content-Length`, refused at once over `limit`; a
/// body without one (chunked) may have up to `limit`.
pub(crate) fn declared_size(headers: &HeaderMap, limit: usize) -> Result<usize, IngestError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    match declared {
        Some(len) if len > limit as u64 => Err(IngestError::TooLarge { limit }),
        Some(len) => Ok(len as usize),
        None => Ok(limit),
    }
}

/// The bytes of request bodies that may be held in memory at once, across all requests. A
/// request reserves its body's size before reading it; when the budget is spent it is refused
/// (503) without reading, so memory stays bounded however many senders stream bodies at once.
pub(crate) struct BodyBudget {
    /// One permit per KiB.
    kib: Arc<Semaphore>,
}

impl BodyBudget {
    pub(crate) fn new(bytes: usize) -> Self {
        BodyBudget {
            kib: Arc::new(Semaphore::new(bytes.div_ceil(1024))),
        }
    }

    /// Room for `bytes` until the returned permit is dropped, or `BodyBudget` if there is none.
    pub(crate) fn reserve(&self, bytes: usize) -> Result<OwnedSemaphorePermit, IngestError> {
        let kib = u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX);
        self.kib
            .clone()
            .try_acquire_many_owned(kib)
            .map_err(|_| IngestError::BodyBudget)
    }
}

/// Reads the whole body, refusing more than `limit` bytes (a chunked body is cut off when it
/// goes over) and a body that takes longer than `timeout`.
pub(crate) async fn read_body(
    body: Body,
    limit: usize,
    timeout: Duration,
) -> Result<Bytes, IngestError> {
    match tokio::time::timeout(timeout, Limited::new(body, limit).collect()).await {
        Err(_) => Err(IngestError::BodyTimeout(timeout)),
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<LengthLimitError>().is_some() => {
            Err(IngestError::TooLarge { limit })
        }
        Ok(Err(e)) => Err(IngestError::BodyRead(e.to_string())),
    }
}
