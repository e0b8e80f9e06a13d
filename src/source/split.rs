//! Batches: a sender that posts a JSON array of events (SendGrid, HubSpot). The verified body
//! is cut into its elements, each an event of its own whose body is the element's exact bytes
//! (a slice of the verified body, nothing re-encoded).

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::value::RawValue;

use crate::event::{check_id, JsonError, ParseError};
use crate::source::Envelope;

/// Where the array is, and where each element's id and type are.
pub(crate) struct Split {
    /// A JSON pointer to the array; empty (or `/`) for the body itself.
    array: String,
    id: String,
    kind: String,
    /// The most elements a body may hold, and the key that says so (for the refusal).
    max: usize,
    max_key: String,
}

impl Split {
    /// The array at JSON pointer `array` (`/` or empty: the body), each element's id and type
    /// at the JSON pointers `id` and `kind` inside it.
    pub(crate) fn new(array: &str, id: &str, kind: &str) -> Split {
        let array = if array == "/" { "" } else { array };
        Split {
            array: array.to_string(),
            id: id.to_string(),
            kind: kind.to_string(),
            max: crate::config::DEFAULT_MAX_EVENTS,
            max_key: "max_events".into(),
        }
    }

    /// At most `max` elements in a body, the limit set by the config key `key`.
    pub(crate) fn with_max(mut self, max: usize, key: String) -> Split {
        self.max = max;
        self.max_key = key;
        self
    }

    /// Each element of the verified `body`'s array, with its envelope and its own bytes, in
    /// order. No array there, an empty one, or an element without its id or type: the whole
    /// request is refused.
    pub(crate) fn elements(&self, body: &Bytes) -> Result<Vec<(Envelope, Bytes)>, ParseError> {
        let text =
            std::str::from_utf8(body).map_err(|_| not_json(JsonError::other("not UTF-8")))?;
        let mut value: &RawValue = serde_json::from_str(text).map_err(|e| not_json(e.into()))?;
        for token in self.array.split('/').skip(1) {
            let token = token.replace("~1", "/").replace("~0", "~");
            value = step(value, &token).ok_or_else(|| self.no_array())?;
        }
        let elements: Vec<&RawValue> =
            serde_json::from_str(value.get()).map_err(|_| self.no_array())?;
        if elements.len() > self.max {
            return Err(ParseError::TooManyEvents {
                limit: self.max,
                key: self.max_key.clone(),
            });
        }
        if elements.is_empty() {
            return Err(ParseError::Missing(format!(
                "event in the array at `{}` (it is empty)",
                self.pointer()
            )));
        }
        elements
            .into_iter()
            .enumerate()
            .map(|(i, raw)| {
                let element: serde_json::Value =
                    serde_json::from_str(raw.get()).map_err(|e| not_json(e.into()))?;
                let read = |pointer: &str| match element.pointer(pointer) {
                    Some(serde_json::Value::String(s)) => Ok(s.clone()),
                    Some(serde_json::Value::Number(n)) => Ok(n.to_string()),
                    _ => Err(ParseError::Missing(format!(
                        "`{pointer}` in element {i} of the array at `{}`",
                        self.pointer()
                    ))),
                };
                let id = read(&self.id)?;
                check_id("id", &id)?;
                let kind = read(&self.kind)?;
                check_id("type", &kind)?;
                let envelope = Envelope {
                    id,
                    kind,
                    created: None,
                };
                Ok((envelope, body.slice_ref(raw.get().as_bytes())))
            })
            .collect()
    }

    fn pointer(&self) -> &str {
        if self.array.is_empty() {
            "/"
        } else {
            &self.array
        }
    }

    fn no_array(&self) -> ParseError {
        ParseError::Missing(format!("array of events at `{}`", self.pointer()))
    }
}

/// The member `token` of an object, or the element at index `token` of an array.
fn step<'a>(value: &'a RawValue, token: &str) -> Option<&'a RawValue> {
    match value.get().as_bytes().first()? {
        b'{' => {
            let mut members: HashMap<String, &RawValue> = serde_json::from_str(value.get()).ok()?;
            members.remove(token)
        }
        b'[' => {
            let index: usize = token.parse().ok()?;
            let elements: Vec<&RawValue> = serde_json::from_str(value.get()).ok()?;
            elements.get(index).copied()
        }
        _ => None,
    }
}

fn not_json(detail: JsonError) -> ParseError {
    ParseError::Envelope {
        what: "JSON",
        hint: "this source's body is a JSON array of events",
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(split: &Split, body: &str) -> Result<Vec<(String, String, String)>, ParseError> {
        let body = Bytes::copy_from_slice(body.as_bytes());
        Ok(split
            .elements(&body)?
            .into_iter()
            .map(|(e, b)| (e.id, e.kind, String::from_utf8(b.to_vec()).unwrap()))
            .collect())
    }

    #[test]
    fn each_element_keeps_its_own_bytes_and_reads_its_id_and_type() {
        let split = Split::new("/", "/sg_event_id", "/event");
        let body = r#"[ {"sg_event_id":"a", "event":"delivered"},
            {"event":"open","sg_event_id":"b","n":  1.50} ]"#;
        assert_eq!(
            ids(&split, body).unwrap(),
            [
                (
                    "a".into(),
                    "delivered".into(),
                    r#"{"sg_event_id":"a", "event":"delivered"}"#.into()
                ),
                (
                    "b".into(),
                    "open".into(),
                    r#"{"event":"open","sg_event_id":"b","n":  1.50}"#.into()
                ),
            ]
        );
        let nested = Split::new("/data/events", "/id", "/type");
        let body = r#"{"data":{"events":[{"id":7,"type":"contact.creation"}]}}"#;
        assert_eq!(
            ids(&nested, body).unwrap(),
            [(
                "7".into(),
                "contact.creation".into(),
                r#"{"id":7,"type":"contact.creation"}"#.into()
            )]
        );
        let in_array = Split::new("/1", "/id", "/type");
        assert_eq!(
            ids(&in_array, r#"[0,[{"id":"x","type":"t"}]]"#)
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn more_elements_than_the_limit_are_refused_naming_the_key() {
        let split = Split::new("/", "/id", "/t").with_max(2, "source `s`.max_events".into());
        assert_eq!(
            ids(&split, r#"[{"id":"a","t":"x"},{"id":"b","t":"x"}]"#)
                .unwrap()
                .len(),
            2
        );
        let three = r#"[{"id":"a","t":"x"},{"id":"b","t":"x"},{"id":"c","t":"x"}]"#;
        assert_eq!(
            ids(&split, three),
            Err(ParseError::TooManyEvents {
                limit: 2,
                key: "source `s`.max_events".into()
            })
        );
    }

    #[test]
    fn no_array_an_empty_one_or_an_element_without_its_id_is_refused_by_name() {
        let split = Split::new("", "/sg_event_id", "/event");
        let missing = |body: &str| match ids(&split, body) {
            Err(ParseError::Missing(what)) => what,
            other => panic!("{other:?}"),
        };
        assert_eq!(missing(r#"{"sg_event_id":"a"}"#), "array of events at `/`");
        assert!(missing("[]").contains("empty"));
        assert_eq!(
            missing(r#"[{"sg_event_id":"a","event":"open"},{"event":"open"}]"#),
            "`/sg_event_id` in element 1 of the array at `/`"
        );
        assert!(missing(r#"[{"sg_event_id":"a"}]"#).starts_with("`/event`"));
        let nested = Split::new("/events", "/id", "/type");
        assert!(matches!(
            ids(&nested, r#"{"other":[]}"#),
            Err(ParseError::Missing(_))
        ));
        assert!(matches!(
            ids(&split, "[{"),
            Err(ParseError::Envelope { .. })
        ));
        assert_eq!(
            ids(&split, r#"[{"sg_event_id":"","event":"open"}]"#),
            Err(ParseError::BadId("id"))
        );
    }
}
