//! Webhook signature verification: HMAC-SHA256 of the raw body, compared in constant time.
//!
//! Runs before any parsing. Only `sha256=<hex>` is accepted; the legacy SHA-1 header is ignored.

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Why a delivery's signature was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SignatureError {
    /// No `X-Hub-Signature-256` header.
    #[error("missing X-Hub-Signature-256")]
    Missing,
    /// The header is not `sha256=<64 hex digits>`.
    #[error("malformed X-Hub-Signature-256 (only sha256=<hex> is accepted)")]
    Malformed,
    /// The HMAC does not match.
    #[error("signature mismatch")]
    Mismatch,
    /// No secret is configured: refuse everything.
    #[error("no webhook secret configured")]
    NoSecret,
}

/// The digest a well-formed `X-Hub-Signature-256` (`sha256=` and 64 hex digits) carries: what
/// can be checked before reading a body.
pub fn well_formed(header: Option<&[u8]>) -> Result<[u8; 32], SignatureError> {
    let header = header.ok_or(SignatureError::Missing)?;
    let hex_part = header
        .strip_prefix(b"sha256=")
        .ok_or(SignatureError::Malformed)?;
    if hex_part.len() != 64 {
        return Err(SignatureError::Malformed);
    }
    let mut expected = [0u8; 32];
    hex::decode_to_slice(hex_part, &mut expected).map_err(|_| SignatureError::Malformed)?;
    Ok(expected)
}

/// Checks `header` (the value of `X-Hub-Signature-256`) against `body` under `secret`.
pub fn verify(secret: &[u8], body: &[u8], header: Option<&[u8]>) -> Result<(), SignatureError> {
    if secret.is_empty() {
        return Err(SignatureError::NoSecret);
    }
    let expected = well_formed(header)?;
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).map_err(|_| SignatureError::NoSecret)?;
    mac.update(body);
    mac.verify_slice(&expected)
        .map_err(|_| SignatureError::Mismatch)
}

/// `sha256=<hex>` for `body` under `secret`: what GitHub sends, and what the stand-in signs with.
pub fn sign(secret: &[u8], body: &[u8]) -> String {
    // HMAC accepts keys of any length, so this cannot fail.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).unwrap_or_else(|_| unreachable!());
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vector from GitHub's "Validating webhook deliveries" page.
    #[test]
    fn githubs_documented_vector() {
        let secret = b"It's a Secret to Everybody";
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(sign(secret, b"Hello, World!"), sig);
        assert_eq!(
            verify(secret, b"Hello, World!", Some(sig.as_bytes())),
            Ok(())
        );
        assert_eq!(
            verify(secret, b"Hello, World?", Some(sig.as_bytes())),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn refusals() {
        let s = b"secret";
        assert_eq!(verify(s, b"x", None), Err(SignatureError::Missing));
        assert_eq!(
            verify(s, b"x", Some(b"sha1=abcd")),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            verify(s, b"x", Some(b"sha256=zz")),
            Err(SignatureError::Malformed)
        );
        let upper = sign(s, b"x").to_uppercase().replace("SHA256=", "sha256=");
        assert_eq!(
            verify(s, b"x", Some(upper.as_bytes())),
            Ok(()),
            "hex case does not matter"
        );
        assert_eq!(
            verify(b"", b"x", Some(sign(b"", b"x").as_bytes())),
            Err(SignatureError::NoSecret)
        );
    }
}
