//! The `Secret` newtype: a token, webhook secret or private key that must never be shown.
//!
//! `Debug` and `Display` print `***`; the only way to the value is [`Secret::expose`], so a
//! secret cannot reach a log line, an error message or a metric by accident.

use std::fmt;

/// A secret string. Its `Debug` and `Display` never show the value.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value itself, for the one place that must send it (an HTTP header, an HMAC key).
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// True when no value is set.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_shows_the_value() {
        let s = Secret::new("ghp_supersecret");
        assert_eq!(format!("{s}"), "***");
        assert_eq!(format!("{s:?}"), "Secret(***)");
        assert_eq!(format!("{:#?}", Some(&s)), "Some(\n    Secret(***),\n)");
        assert_eq!(s.expose(), "ghp_supersecret");
    }
}
