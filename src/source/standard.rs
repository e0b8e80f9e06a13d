//! Standard Webhooks (standardwebhooks.com): how hookledger signs its deliveries to the app,
//! so the app can verify them with the official `standardwebhooks` libraries.
//!
//! Headers `webhook-id`, `webhook-timestamp`, `webhook-signature`; the signed content is
//! `"{id}.{timestamp}.{body}"`; the key is the base64-decoded part of the secret after
//! `whsec_`; the signature is `v1,<standard base64 HMAC-SHA256>`, several space-separated.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::{check_timestamp, VerifyError};

pub const ID_HEADER: &str = "webhook-id";
pub const TIMESTAMP_HEADER: &str = "webhook-timestamp";
pub const SIGNATURE_HEADER: &str = "webhook-signature";

/// A Standard Webhooks key, decoded from its `whsec_<base64>` form.
#[derive(Clone)]
pub struct SigningKey(Vec<u8>);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(<redacted>)")
    }
}

impl SigningKey {
    /// Accepts `whsec_<base64>` (and, like the official libraries, bare base64).
    pub fn from_secret(secret: &str) -> Result<Self, String> {
        let encoded = secret.strip_prefix("whsec_").unwrap_or(secret);
        let key = BASE64.decode(encoded).map_err(|_| {
            "the forwarding secret must be whsec_ followed by standard base64 \
             (generate one with: hookledger gen-secret)"
                .to_string()
        })?;
        if key.len() < 16 {
            return Err("the forwarding secret must decode to at least 16 bytes".into());
        }
        Ok(SigningKey(key))
    }

    /// A fresh random key in `whsec_<base64>` form.
    pub fn generate() -> String {
        let key: Vec<u8> = (0..32).map(|_| fastrand::u8(..)).collect();
        format!("whsec_{}", BASE64.encode(key))
    }

    fn mac(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> [u8; 32] {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC accepts keys of any length");
        mac.update(msg_id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        mac.finalize().into_bytes().into()
    }

    /// The `webhook-signature` value for one delivery.
    pub fn sign(&self, msg_id: &str, timestamp: i64, body: &[u8]) -> String {
        format!("v1,{}", BASE64.encode(self.mac(msg_id, timestamp, body)))
    }

    /// Verifies a delivery as the app would: any space-separated `v1,` entry may match.
    pub fn verify(
        &self,
        msg_id: &str,
        timestamp: &str,
        signature: &str,
        body: &[u8],
        now: i64,
        tolerance: u64,
    ) -> Result<(), VerifyError> {
        let timestamp: i64 =
            timestamp
                .trim()
                .parse()
                .map_err(|_| VerifyError::MalformedHeader {
                    header: TIMESTAMP_HEADER,
                    reason: "not a Unix timestamp",
                })?;
        let expected = self.mac(msg_id, timestamp, body);
        let mut saw_v1 = false;
        let mut matched = false;
        for entry in signature.split(' ') {
            let Some(encoded) = entry.strip_prefix("v1,") else {
                continue;
            };
            saw_v1 = true;
            if let Ok(candidate) = BASE64.decode(encoded) {
                matched |= constant_time_eq::constant_time_eq(&candidate, &expected);
            }
        }
        if !saw_v1 {
            return Err(VerifyError::NoV1Signature(SIGNATURE_HEADER));
        }
        if !matched {
            return Err(VerifyError::NoMatch);
        }
        check_timestamp(timestamp, now, tolerance)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signs_official_vector() {
        let key = SigningKey::from_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        assert_eq!(
            hex::encode(&key.0),
            "31f290f6bf06298aab4f08d43c3f082cf648a362da2da4b0"
        );
        assert_eq!(
            key.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1614265330,
                b"{\"test\": 2432232314}"
            ),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn rejects_bad_secret() {
        assert!(SigningKey::from_secret("whsec_not base64!").is_err());
        assert!(SigningKey::from_secret("whsec_c2hvcnQ=").is_err());
        assert!(SigningKey::from_secret(&SigningKey::generate()).is_ok());
    }
}
