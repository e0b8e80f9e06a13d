//! [`Secret`]: a secret's value, never shown.

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;

/// A signing secret. Its `Debug` and `Display` never show the value, so a secret cannot
/// reach a log line through a `{:?}` of a config struct.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
#[non_exhaustive]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret's bytes, for the HMAC key only.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// The key of a Standard Webhooks secret, decoded from its `whsec_<base64>` form (like the
/// official libraries, bare base64 too), of at least 16 bytes. The forwarding signer and the
/// `standard` scheme decode their secrets with it; validation calls it so that a bad one stops
/// start-up. The error says why, never what the secret is.
pub(crate) fn decode_standard_secret(secret: &str) -> Result<Vec<u8>, String> {
    let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
    let key = BASE64.decode(encoded).map_err(|_| {
        "the forwarding secret must be whsec_ followed by standard base64 \
         (generate one with: hookledger gen-secret)"
            .to_string()
    })?;
    if key.len() < 16 {
        return Err("the forwarding secret must decode to at least 16 bytes".into());
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_secrets_are_whsec_base64_of_at_least_16_bytes() {
        let key = decode_standard_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(key.len(), 24);
        assert_eq!(
            decode_standard_secret("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            Ok(key)
        );
        let err = decode_standard_secret("whsec_not base64!").unwrap_err();
        assert!(
            err.contains("standard base64") && !err.contains("not base64!"),
            "{err}"
        );
        let err = decode_standard_secret("whsec_c2hvcnQ=").unwrap_err();
        assert!(err.contains("at least 16 bytes"), "{err}");
    }
}
