//! What a job's egress met, gathered while it runs and told once when its runner is gone: each
//! refused (or, in `audit` mode, would-be refused) name or address with how often, bounded.

use std::fmt;

/// Where a refusal happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A lookup of a name the list does not allow.
    Dns,
    /// A connection to an address no allowed name resolved to (and the list does not name).
    Connect,
}

impl Kind {
    /// The `kind` label of `ephemerd_egress_refused_total`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Dns => "dns",
            Kind::Connect => "connect",
        }
    }
}

/// One name or address a job was refused (or, audited, would have been).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// Lookup or connection.
    pub kind: Kind,
    /// The name, or the address.
    pub what: String,
    /// How often.
    pub times: u32,
    /// Only recorded (`audit` mode): it went through.
    pub audited: bool,
}

/// Distinct names and addresses kept per job; more are counted, not named.
pub const SEEN_MAX: usize = 32;

/// A job's refusals so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    rows: Vec<Refusal>,
    more: u32,
}

impl Seen {
    /// `what` was refused (or audited) once more.
    pub fn add(&mut self, kind: Kind, what: &str, audited: bool) {
        if let Some(r) = self
            .rows
            .iter_mut()
            .find(|r| r.kind == kind && r.what == what && r.audited == audited)
        {
            r.times = r.times.saturating_add(1);
        } else if self.rows.len() < SEEN_MAX {
            self.rows.push(Refusal {
                kind,
                what: what.to_string(),
                times: 1,
                audited,
            });
        } else {
            self.more = self.more.saturating_add(1);
        }
    }

    /// Whether nothing was refused.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.more == 0
    }

    /// The names and addresses kept, in the order first met.
    pub fn rows(&self) -> &[Refusal] {
        &self.rows
    }

    /// Refusals past [`SEEN_MAX`] distinct ones.
    pub fn more(&self) -> u32 {
        self.more
    }
}

impl fmt::Display for Seen {
    /// `refused dns pastebin.com (3 times), connect 198.51.100.7; an allow-list would refuse
    /// dns example.org; 4 more`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts = Vec::new();
        for (audited, head) in [(false, "refused"), (true, "an allow-list would refuse")] {
            let rows: Vec<String> = self
                .rows
                .iter()
                .filter(|r| r.audited == audited)
                .map(|r| match r.times {
                    1 => format!("{} {}", r.kind.as_str(), r.what),
                    n => format!("{} {} ({n} times)", r.kind.as_str(), r.what),
                })
                .collect();
            if !rows.is_empty() {
                parts.push(format!("{head} {}", rows.join(", ")));
            }
        }
        if self.more > 0 {
            parts.push(format!("{} more", self.more));
        }
        f.write_str(&parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_counted_once_each_bounded_and_said_in_words() {
        let mut s = Seen::default();
        assert!(s.is_empty());
        s.add(Kind::Dns, "pastebin.com", false);
        s.add(Kind::Dns, "pastebin.com", false);
        s.add(Kind::Connect, "198.51.100.7", false);
        s.add(Kind::Dns, "example.org", true);
        assert_eq!(
            s.to_string(),
            "refused dns pastebin.com (2 times), connect 198.51.100.7; an allow-list would refuse dns example.org"
        );
        for i in 0..100 {
            s.add(Kind::Connect, &format!("192.0.2.{i}"), false);
        }
        assert_eq!(s.rows().len(), SEEN_MAX);
        assert_eq!(s.more(), 100 - (SEEN_MAX as u32 - 3));
        assert!(s.to_string().ends_with("; 71 more"), "{s}");
    }
}
