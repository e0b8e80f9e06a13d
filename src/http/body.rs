//! Request bodies: their declared size, the global budget of bytes being read, and reading
//! one within its limit and timeout.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, HeaderMap};
use bytes::Bytes;
use http_body_util::BodyExt;
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

/// What a body may take from the budget before it has sent anything: room for a whole real
/// event (Stripe's are a few KB). Beyond it a body takes room as it arrives, doubling, so a
/// sender holds at most twice what it has sent (and 1024 connections that send nothing hold
/// 16 MiB at most).
const UPFRONT: usize = 16 * 1024;

/// The bytes of request bodies that may be held in memory at once, across all requests. A
/// request takes room for its first bytes before reading and more as they arrive; when the
/// budget is spent it is refused (503), before reading or part way, so memory stays bounded
/// however many senders stream bodies at once, and however slowly.
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

    /// Room for the first bytes of a body of `declared` bytes at most, until the returned
    /// [`Room`] is dropped; `BodyBudget` if there is none.
    pub(crate) fn reserve(&self, declared: usize) -> Result<Room, IngestError> {
        let bytes = declared.min(UPFRONT);
        let permit = self
            .kib
            .clone()
            .try_acquire_many_owned(kib(bytes))
            .map_err(|_| IngestError::BodyBudget)?;
        Ok(Room {
            budget: self.kib.clone(),
            permit,
        })
    }
}

/// Permits for `bytes` (at least one).
fn kib(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(1024).max(1)).unwrap_or(u32::MAX)
}

/// One request's share of the [`BodyBudget`].
pub(crate) struct Room {
    budget: Arc<Semaphore>,
    permit: OwnedSemaphorePermit,
}

impl Room {
    /// The bytes this room holds.
    fn bytes(&self) -> usize {
        self.permit.num_permits() * 1024
    }

    /// Grows the room to hold `bytes`, or `BodyBudget` if the budget has no more.
    fn grow_to(&mut self, bytes: usize) -> Result<(), IngestError> {
        let held = u32::try_from(self.permit.num_permits()).unwrap_or(u32::MAX);
        let more = kib(bytes).saturating_sub(held);
        if more > 0 {
            let permit = self
                .budget
                .clone()
                .try_acquire_many_owned(more)
                .map_err(|_| IngestError::BodyBudget)?;
            self.permit.merge(permit);
        }
        Ok(())
    }
}

/// Reads the whole body into one buffer that never outgrows `room`, refusing more than
/// `limit` bytes and a body that takes longer than `timeout`. Each frame is copied and
/// dropped: a frame holds on to hyper's whole read buffer, so keeping frames would let a
/// sender that sends a byte at a time cost kilobytes per byte.
pub(crate) async fn read_body(
    body: Body,
    limit: usize,
    timeout: Duration,
    room: &mut Room,
) -> Result<Bytes, IngestError> {
    tokio::time::timeout(timeout, read(body, limit, room))
        .await
        .unwrap_or(Err(IngestError::BodyTimeout(timeout)))
}

async fn read(mut body: Body, limit: usize, room: &mut Room) -> Result<Bytes, IngestError> {
    let mut buf = Vec::with_capacity(room.bytes().min(limit));
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| IngestError::BodyRead(e.to_string()))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        let len = buf.len() + data.len();
        if len > limit {
            return Err(IngestError::TooLarge { limit });
        }
        if len > buf.capacity() {
            let capacity = (buf.capacity() * 2).max(len).min(limit);
            room.grow_to(capacity)?;
            buf.reserve_exact(capacity - buf.len());
        }
        buf.extend_from_slice(&data);
    }
    Ok(Bytes::from(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_now(body: &[u8], limit: usize, room: &mut Room) -> Result<Bytes, IngestError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let body = Body::from(body.to_vec());
        runtime.block_on(read_body(body, limit, Duration::from_secs(5), room))
    }

    #[test]
    fn a_body_takes_room_up_front_only_for_its_first_bytes() {
        let budget = BodyBudget::new(40 * 1024);
        // A 1 MiB declaration takes 16 KiB, not 1 MiB; a 2 KB one takes 2 KiB.
        let big = budget.reserve(1024 * 1024).unwrap();
        let small = budget.reserve(2000).unwrap();
        assert_eq!((big.bytes(), small.bytes()), (16 * 1024, 2 * 1024));
        let _second_big = budget.reserve(1024 * 1024).unwrap();
        assert!(matches!(
            budget.reserve(8 * 1024),
            Err(IngestError::BodyBudget)
        ));
        drop(big);
        assert!(budget.reserve(8 * 1024).is_ok(), "room comes back");
    }

    #[test]
    fn reading_grows_the_room_and_stops_at_the_budget_or_the_limit() {
        let body = vec![b'x'; 100 * 1024];
        let roomy = BodyBudget::new(256 * 1024);
        let mut room = roomy.reserve(body.len()).unwrap();
        assert_eq!(
            read_now(&body, 1024 * 1024, &mut room).unwrap().len(),
            body.len()
        );
        assert!(room.bytes() >= body.len() && room.bytes() <= 2 * body.len());

        let tight = BodyBudget::new(64 * 1024);
        let mut room = tight.reserve(body.len()).unwrap();
        assert!(matches!(
            read_now(&body, 1024 * 1024, &mut room),
            Err(IngestError::BodyBudget)
        ));
        let mut room = roomy.reserve(body.len()).unwrap();
        assert!(matches!(
            read_now(&body, 50 * 1024, &mut room),
            Err(IngestError::TooLarge { .. })
        ));
    }
}
