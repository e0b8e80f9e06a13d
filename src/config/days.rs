//! Retention ages in days: a number, or `never`.

/// `never` as a number of days: kept for ever.
pub(crate) const NEVER: u64 = u64::MAX;

/// `--retention-days` / `--payload-days`: a number of days, or `never`.
pub(crate) fn parse_days(text: &str) -> Result<u64, String> {
    match text.trim() {
        "never" => Ok(NEVER),
        days => days
            .parse()
            .map_err(|_| format!("`{days}` is neither a number of days nor `never`")),
    }
}

/// `claim_days` / `payload_days` in a config file: an integer, or `"never"`.
pub(crate) fn deserialize_days<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    #[derive(serde::Deserialize)]
    #[serde(untagged)]
    enum Days {
        Number(u64),
        Text(String),
    }
    match <Days as serde::Deserialize>::deserialize(d)? {
        Days::Number(days) => Ok(days),
        Days::Text(text) if text == "never" => Ok(NEVER),
        // The file's value is not repeated (config errors quote none).
        Days::Text(_) => Err(serde::de::Error::custom(
            "must be a number of days or never",
        )),
    }
}

/// `400 days`, or `ever` for [`NEVER`]: "kept 400 days", "kept for ever".
pub(crate) fn describe_days(days: u64) -> String {
    if days == NEVER {
        "for ever".to_string()
    } else {
        format!("{days} days")
    }
}
