//! A verified event, as every source and handler sees it: the ledger's key (source and id),
//! its type, its event time when the scheme has one, and the exact verified bytes.
//!
//! What an event *means* is not here: each scheme reads its envelope (`source/`), and each
//! handler decodes the body for itself (`handler/`).

use std::sync::Arc;

/// Longer ids and types than this are not real ones; the bound keeps the ledger key small.
const MAX_ID_LEN: usize = 255;

/// A verified event. `body` is the exact verified bytes, stored as the payload.
#[derive(Debug, Clone, Default)]
pub struct Event {
    /// The source's name: the first half of the ledger key.
    pub source: Arc<str>,
    /// The event id: the second half of the ledger key.
    pub id: String,
    /// The event type (`invoice.paid`).
    pub kind: String,
    /// When the provider says the event happened (Unix seconds), if the scheme says.
    pub created: Option<i64>,
    /// The exact bytes that were verified, as the provider sent them (also what is stored and
    /// forwarded).
    pub body: bytes::Bytes,
}

/// Refuses an `id` or `type` (`field` names it) that is empty or only whitespace, longer than
/// [`MAX_ID_LEN`], or holds a control character (which could forge log lines or reach a
/// terminal as an escape sequence).
pub(crate) fn check_id(field: &'static str, value: &str) -> Result<(), ParseError> {
    if value.trim().is_empty() || value.len() > MAX_ID_LEN || value.chars().any(char::is_control) {
        return Err(ParseError::BadId(field));
    }
    Ok(())
}

/// Why a verified body is not an event hookledger can record. The `Display` text goes to the
/// sender (it may quote their body back to them); [`ParseError::summary`] goes to the log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// The envelope (id, type, time) cannot be read: `what` the source sends, `hint` what it
    /// must hold.
    #[error("body is not {what} ({detail}); {hint}")]
    Envelope {
        what: &'static str,
        hint: &'static str,
        detail: JsonError,
    },
    #[error("`{0}` must be a string of 1 to 255 bytes, not blank, without control characters")]
    BadId(&'static str),
    #[error("{kind} event has an unexpected `data.object` ({detail})")]
    Object { kind: String, detail: JsonError },
    /// Where this source reads the event id or type, the request has nothing.
    #[error("the request has no {0}, where this source reads the event's id or type")]
    Missing(String),
    /// A batch body holds more events than its source takes (`key`); nothing was stored.
    #[error(
        "the body holds more than {limit} events, the most this source takes in one request \
         ({key}); nothing was stored: send fewer per request, or raise {key}"
    )]
    TooManyEvents { limit: usize, key: String },
}

/// A JSON error: serde's message (which can quote the input) and where it happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct JsonError {
    message: String,
    line: usize,
    column: usize,
}

impl From<serde_json::Error> for JsonError {
    fn from(e: serde_json::Error) -> Self {
        JsonError {
            message: e.to_string(),
            line: e.line(),
            column: e.column(),
        }
    }
}

impl JsonError {
    pub(crate) fn other(message: &str) -> Self {
        JsonError {
            message: message.to_string(),
            line: 0,
            column: 0,
        }
    }
}

impl ParseError {
    /// A description that quotes nothing from the body, for the log.
    pub fn summary(&self) -> String {
        match self {
            ParseError::Envelope { what, detail, .. } => format!(
                "body is not {what} (JSON error at line {} column {})",
                detail.line, detail.column
            ),
            ParseError::BadId(field) => {
                format!("`{field}` is blank, too long or holds control characters")
            }
            ParseError::Object { kind, detail } => format!(
                "{kind} event has an unexpected data.object (at line {} column {})",
                detail.line, detail.column
            ),
            ParseError::Missing(what) => format!("the request has no {what}"),
            too_many @ ParseError::TooManyEvents { .. } => too_many.to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_are_blank_overlong_or_hold_control_characters_are_refused() {
        for bad in [
            "",
            " ",
            "\t \n",
            "evt\nINFO fake line",
            "evt\r",
            "evt\u{1b}[31m",
            "evt\u{7f}",
            "evt\u{85}",
        ] {
            assert_eq!(check_id("id", bad), Err(ParseError::BadId("id")), "{bad:?}");
        }
        assert!(check_id("id", &"e".repeat(MAX_ID_LEN + 1)).is_err());
        assert!(check_id("id", &"e".repeat(MAX_ID_LEN)).is_ok());
        assert!(check_id("id", "evt_1Pgc6rB7WZ01zgkW").is_ok());
        assert!(check_id("type", "customer.subscription.updated").is_ok());
        assert!(check_id("id", "évènement ünïcode").is_ok());
    }
}
