//! A GitHub App's JSON Web Token: what the App's own webhook deliveries (`/app/hook/…`) are
//! read with. RS256 (RSASSA-PKCS1-v1_5 with SHA-256, by `ring`) over the header
//! `{"alg":"RS256","typ":"JWT"}` and the claims GitHub asks for: `iat` 60 s in the past (clock
//! drift), `exp` 9 minutes on (GitHub refuses more than 10), `iss` the App's id. The private
//! key is the PEM GitHub issues (PKCS#1, `BEGIN RSA PRIVATE KEY`); PKCS#8 (`BEGIN PRIVATE
//! KEY`) is taken too. No message carries the key.

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine;
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};

/// The App's id and private key, ready to sign.
pub(crate) struct AppKey {
    app_id: u64,
    key: RsaKeyPair,
}

impl std::fmt::Debug for AppKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppKey")
            .field("app_id", &self.app_id)
            .finish_non_exhaustive()
    }
}

impl AppKey {
    /// App `app_id`'s key from its PEM text; why not, never the key.
    pub(crate) fn new(app_id: u64, pem: &str) -> Result<AppKey, String> {
        let (label, der) = pem_body(pem).ok_or(
            "not a PEM private key (the .pem file GitHub gives when a private key is generated \
             for the App: -----BEGIN RSA PRIVATE KEY-----)",
        )?;
        let key = match label.as_str() {
            "RSA PRIVATE KEY" => RsaKeyPair::from_der(&der),
            "PRIVATE KEY" => RsaKeyPair::from_pkcs8(&der),
            _ => return Err(format!("a PEM of {label}, not an RSA private key")),
        }
        .map_err(|e| format!("not an RSA private key GitHub could have issued ({e})"))?;
        Ok(AppKey { app_id, key })
    }

    /// The JWT for `now` (Unix seconds).
    pub(crate) fn jwt(&self, now: i64) -> String {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
        let claims =
            serde_json::json!({"iat": now - 60, "exp": now + 540, "iss": self.app_id.to_string()});
        let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
        let signed = format!("{header}.{claims}");
        let mut signature = vec![0; self.key.public().modulus_len()];
        // Signing fails only for a buffer of the wrong length or a broken RNG.
        self.key
            .sign(
                &RSA_PKCS1_SHA256,
                &SystemRandom::new(),
                signed.as_bytes(),
                &mut signature,
            )
            .expect("RSA signing with a buffer of the modulus' length");
        format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature))
    }
}

/// The label and bytes of the first PEM block of `text`.
fn pem_body(text: &str) -> Option<(String, Vec<u8>)> {
    let start = text.find("-----BEGIN ")?;
    let rest = &text[start + "-----BEGIN ".len()..];
    let (label, rest) = rest.split_once("-----")?;
    let end = rest.find(&format!("-----END {label}-----"))?;
    let base64: String = rest[..end].split_whitespace().collect();
    Some((label.to_string(), STANDARD.decode(base64).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::{UnparsedPublicKey, RSA_PKCS1_2048_8192_SHA256};

    /// The tests' App key (`tests/fixtures/github/app-private-key.pem`: PKCS#1, 2048 bits).
    fn pem() -> String {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/github/app-private-key.pem"
        );
        std::fs::read_to_string(path).unwrap()
    }

    #[test]
    fn the_jwt_carries_github_s_claims_and_verifies_with_the_app_s_public_key() {
        let Ok(key) = AppKey::new(4242, &pem()) else {
            panic!("the PKCS#1 key is read")
        };
        let jwt = key.jwt(1_700_000_000);
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let header: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
        assert_eq!(header, serde_json::json!({"alg": "RS256", "typ": "JWT"}));
        let claims: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(
            claims,
            serde_json::json!({"iat": 1_699_999_940, "exp": 1_700_000_540, "iss": "4242"})
        );
        let public = UnparsedPublicKey::new(
            &RSA_PKCS1_2048_8192_SHA256,
            key.key.public().as_ref().to_vec(),
        );
        let signed = format!("{}.{}", parts[0], parts[1]);
        let signature = URL_SAFE_NO_PAD.decode(parts[2]).unwrap();
        assert!(public.verify(signed.as_bytes(), &signature).is_ok());
        assert!(public.verify(b"other", &signature).is_err());
    }

    #[test]
    fn a_key_that_is_not_an_rsa_private_key_pem_is_refused_without_its_text() {
        for (text, says) in [
            ("", "not a PEM private key"),
            ("ghp_not_a_key_at_all", "not a PEM private key"),
            (
                "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
                "a PEM of CERTIFICATE",
            ),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nAAAAsecretish\n-----END RSA PRIVATE KEY-----\n",
                "not a PEM private key",
            ),
            (
                "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n",
                "not an RSA private key GitHub could have issued",
            ),
        ] {
            let err = AppKey::new(1, text).unwrap_err();
            assert!(err.contains(says), "{text}: {err}");
            assert!(!err.contains("AAAA"), "{err}");
        }
    }
}
