//! The refresh on ties: when two subscription events share their `created` second (or a source
//! sets `refresh = "always"`), the billing handler queues a [`REFRESH`](billing::REFRESH) row; after commit the
//! outbox worker fetches the current subscription from Stripe's API ([`Fetch`], an outbox
//! [`Target`]) and hands the answer back to billing ([`StoreFetched`]), which stores it as the
//! newest snapshot when the row is marked done.

use std::sync::Arc;

use crate::config::Config;
use crate::outbox::{Failure, FollowUp, PendingRow, Target};
use crate::sql::{StoreError, Tx};
use crate::stripe::api::{ApiError, StripeApi};
use crate::stripe::billing::{self, RefreshJob, SubscriptionChange};
use crate::time::unix_now;

/// Fetches the subscription a [`REFRESH`](billing::REFRESH) row names, from the API of the row's source. A
/// failed fetch is tried again on the outbox's schedule, not inside the attempt.
pub(crate) struct Fetch(Vec<(String, StripeApi)>);

impl Fetch {
    /// The fetches of the sources of `config` that refresh subscriptions, if any does.
    pub(crate) fn of(config: &Config) -> Option<Fetch> {
        let apis: Vec<(String, StripeApi)> = config
            .sources
            .iter()
            .filter(|s| s.refreshes())
            .filter_map(|s| Some((s.name.clone(), StripeApi::of(s)?.with_backoff(Vec::new()))))
            .collect();
        (!apis.is_empty()).then_some(Fetch(apis))
    }
}

impl Target for Fetch {
    fn attempt(
        &self,
        row: &PendingRow,
        payload: &[u8],
    ) -> Result<Option<Arc<dyn FollowUp>>, Failure> {
        let job: RefreshJob = serde_json::from_slice(payload)
            .map_err(|e| Failure::Refused(format!("not a refresh job: {e}")))?;
        let Some((_, api)) = self.0.iter().find(|(name, _)| *name == row.source) else {
            return Err(Failure::Refused(format!(
                "source {} has no api_key to fetch with",
                row.source
            )));
        };
        let started = unix_now();
        let json = api.subscription(&job.subscription).map_err(|e| match e {
            ApiError::Failed(why) => Failure::Transport(why),
            refused => Failure::Refused(refused.to_string()),
        })?;
        let snapshot = billing::decode_subscription(&job.subscription, &json)
            .map_err(|e| Failure::Refused(format!("Stripe's subscription: {}", e.summary())))?;
        Ok(Some(Arc::new(StoreFetched {
            snapshot,
            at: job.at,
            started,
        })))
    }
}

/// A fetched `snapshot` of the subscription, by a request begun at second `started`, for a tie
/// at second `at`: stored as its row is marked done.
#[derive(Debug)]
pub(crate) struct StoreFetched {
    snapshot: SubscriptionChange,
    at: i64,
    started: i64,
}

impl FollowUp for StoreFetched {
    fn apply(&self, tx: &Tx<'_>) -> Result<(), StoreError> {
        billing::store_fetched(tx, &self.snapshot, self.at, self.started).map(drop)
    }
}
