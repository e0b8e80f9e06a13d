//! `[[alert]]` incidents, the same SQL on every store: an incident is opened with the outbox
//! row of its message in one transaction, and cleared with the other. The partial unique index
//! on the open incidents (`alert_incidents_open`) makes the insert of a second one a no-op, so
//! several instances that see the same incident queue one message; a restart finds the
//! incident and sends nothing again.

use crate::sql::{Session, StoreError};

/// The `source` of the outbox rows of alerts: hookledger itself.
pub(crate) const ALERT_SOURCE: &str = "hookledger";

/// What to do to the incident of `alert`'s `cause` on `subject`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Incident {
    /// The `[[alert]]`'s name.
    pub(crate) alert: String,
    /// `dead`, `refused` or `backlog`.
    pub(crate) cause: &'static str,
    /// The kind (dead), the source (refused), or empty (backlog).
    pub(crate) subject: String,
    pub(crate) change: Change,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Change {
    /// Opens it unless it is open, queueing `payload` as a row of `kind`.
    Open { kind: String, payload: Vec<u8> },
    /// Notes that the cause is still there (refusals: each instance counts its own).
    Seen,
    /// Clears it if it is open and nobody saw its cause since `quiet_since`, queueing
    /// `payload` as a row of `kind`.
    Clear {
        kind: String,
        payload: Vec<u8>,
        quiet_since: i64,
    },
}

/// Runs `incident` in the caller's transaction; 1 when it opened or cleared the incident (and
/// queued its message), 0 when another write (or instance) did so first.
pub(crate) fn write(tx: &dyn Session, incident: &Incident, now: i64) -> Result<u64, StoreError> {
    let Incident {
        alert,
        cause,
        subject,
        change,
    } = incident;
    match change {
        Change::Open { kind, payload } => {
            // Already open (here, or on another instance): nothing, and no second message.
            let opened = tx.execute(
                "INSERT INTO alert_incidents (alert, cause, subject, opened_at, seen_at)
                 VALUES ($1, $2, $3, $4, $4)
                 ON CONFLICT (alert, cause, subject) WHERE cleared_at IS NULL DO NOTHING",
                &[alert, cause, subject, &now],
            )?;
            if opened == 0 {
                return Ok(0);
            }
            let id = open_id(tx, incident)?.unwrap_or_default();
            queue(
                tx,
                kind,
                &format!("incident-{id}-opened"),
                "alert.opened",
                payload,
                now,
            )?;
            Ok(1)
        }
        Change::Seen => tx.execute(
            "UPDATE alert_incidents SET seen_at = $4
             WHERE alert = $1 AND cause = $2 AND subject = $3 AND cleared_at IS NULL",
            &[alert, cause, subject, &now],
        ),
        Change::Clear {
            kind,
            payload,
            quiet_since,
        } => {
            let Some(id) = open_id(tx, incident)? else {
                return Ok(0);
            };
            // Cleared meanwhile by another instance (it waited for our row lock, or we for
            // its), or seen again since: nothing.
            let cleared = tx.execute(
                "UPDATE alert_incidents SET cleared_at = $2
                 WHERE id = $1 AND cleared_at IS NULL AND seen_at <= $3",
                &[&id, &now, quiet_since],
            )?;
            if cleared == 0 {
                return Ok(0);
            }
            queue(
                tx,
                kind,
                &format!("incident-{id}-cleared"),
                "alert.cleared",
                payload,
                now,
            )?;
            Ok(1)
        }
    }
}

fn open_id(tx: &dyn Session, incident: &Incident) -> Result<Option<i64>, StoreError> {
    tx.query(
        "SELECT id FROM alert_incidents
         WHERE alert = $1 AND cause = $2 AND subject = $3 AND cleared_at IS NULL",
        &[&incident.alert, &incident.cause, &incident.subject],
    )?
    .first()
    .map(|row| row.get::<i64>(0))
    .transpose()
}

fn queue(
    tx: &dyn Session,
    kind: &str,
    key: &str,
    event_type: &str,
    payload: &[u8],
    now: i64,
) -> Result<u64, StoreError> {
    tx.execute(
        "INSERT INTO outbox
             (kind, source, key, event_type, payload, status, next_attempt_at, created_at)
         VALUES ($1, $2, $3, $4, $5, 'pending', $6, $6)
         ON CONFLICT (kind, source, key) DO NOTHING",
        &[&kind, &ALERT_SOURCE, &key, &event_type, &payload, &now],
    )
}

/// The open incidents of `alert`: (cause, subject).
pub(crate) fn open(tx: &dyn Session, alert: &str) -> Result<Vec<(String, String)>, StoreError> {
    tx.query(
        "SELECT cause, subject FROM alert_incidents WHERE alert = $1 AND cleared_at IS NULL",
        &[&alert],
    )?
    .iter()
    .map(|row| Ok((row.get::<String>(0)?, row.get::<String>(1)?)))
    .collect()
}

/// The oldest pending row not of an alert (kinds `alert:…`): its id, kind and when it was
/// queued.
pub(crate) fn oldest_pending(tx: &dyn Session) -> Result<Option<(i64, String, i64)>, StoreError> {
    tx.query(
        "SELECT id, kind, created_at FROM outbox
         WHERE status = 'pending' AND kind NOT LIKE 'alert:%'
         ORDER BY created_at, id LIMIT 1",
        &[],
    )?
    .first()
    .map(|row| {
        Ok((
            row.get::<i64>(0)?,
            row.get::<String>(1)?,
            row.get::<i64>(2)?,
        ))
    })
    .transpose()
}
