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
        "the secret must be whsec_ followed by standard base64 \
         (generate one with: hookledger gen-secret)"
            .to_string()
    })?;
    if key.len() < 16 {
        return Err("the secret must decode to at least 16 bytes".into());
    }
    Ok(key)
}

/// A key of a `standard` source, decoded from its text (checked for form and length only; the
/// source checks that an ed25519 key is a valid one).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum StandardKey {
    /// `whsec_<base64>` (or bare base64): the shared HMAC key of `v1,` signatures.
    Hmac(Vec<u8>),
    /// `whpk_<base64>`: the sender's ed25519 public key (32 bytes), for `v1a,` signatures.
    Public([u8; 32]),
    /// `whsk_<base64>`: an ed25519 private key, 32 bytes (the seed) or 64 (seed and public
    /// key, as libsodium keeps it); for signing in tests and `hookledger send`.
    Private(Vec<u8>),
}

/// Decodes a `standard` source's secret: `whpk_`, `whsk_`, or else as
/// [`decode_standard_secret`]. The error says why, never what the secret is.
pub(crate) fn decode_standard_key(secret: &str) -> Result<StandardKey, String> {
    if let Some(encoded) = secret.strip_prefix("whpk_") {
        let key = BASE64.decode(encoded).ok().and_then(|k| k.try_into().ok());
        return key.map(StandardKey::Public).ok_or_else(|| {
            "a whpk_ key must be whpk_ followed by the standard base64 of a 32-byte ed25519 \
             public key"
                .to_string()
        });
    }
    if let Some(encoded) = secret.strip_prefix("whsk_") {
        return match BASE64.decode(encoded) {
            Ok(key) if key.len() == 32 || key.len() == 64 => Ok(StandardKey::Private(key)),
            _ => Err(
                "a whsk_ key must be whsk_ followed by the standard base64 of a 32- or \
                      64-byte ed25519 private key"
                    .into(),
            ),
        };
    }
    decode_standard_secret(secret).map(StandardKey::Hmac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn standard_keys_are_told_apart_by_their_prefix() {
        assert!(matches!(
            decode_standard_key("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"),
            Ok(StandardKey::Hmac(k)) if k.len() == 24
        ));
        let public = format!("whpk_{}", BASE64.encode([1u8; 32]));
        assert_eq!(
            decode_standard_key(&public),
            Ok(StandardKey::Public([1; 32]))
        );
        for len in [32, 64] {
            let private = format!("whsk_{}", BASE64.encode(vec![2u8; len]));
            assert_eq!(
                decode_standard_key(&private),
                Ok(StandardKey::Private(vec![2; len]))
            );
        }
        for bad in [
            format!("whpk_{}", BASE64.encode([1u8; 31])),
            "whpk_not base64!".to_string(),
            format!("whsk_{}", BASE64.encode([1u8; 48])),
            "whsk_".to_string(),
        ] {
            let err = decode_standard_key(&bad).unwrap_err();
            let value = &bad[5..];
            assert!(err.contains("ed25519"), "{err}");
            assert!(value.is_empty() || !err.contains(value), "{err}");
        }
    }

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
