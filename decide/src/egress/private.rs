//! Which private ranges a pool may open to its jobs (`egress.allow_private`): IPv4 ranges
//! inside one the fence denies ([`DENIED_V4`](super::DENIED_V4)), never loopback, link-local
//! (the metadata services), "this network", multicast and reserved, Azure's wire server, or the
//! jobs' own range.

use super::{
    DENIED_V4, JOB_NET,
    allow::{Net, RuleError},
};

/// Ranges no allowance opens, whatever the pool says.
const NEVER: [&str; 5] = [
    "0.0.0.0/8",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "224.0.0.0/3",
    "168.63.129.16/32",
];

/// Why an `allow_private` entry is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrivateError {
    /// Not a network.
    #[error(transparent)]
    Net(#[from] RuleError),
    /// An IPv6 range: no IPv6 leaves a job.
    #[error("`{0}`: no IPv6 leaves a job's namespace, so there is no IPv6 range to open")]
    V6(String),
    /// It reaches other jobs.
    #[error("`{0}` reaches other jobs' namespaces ({1}), which no job may")]
    Jobs(String, String),
    /// It reaches what no job may.
    #[error(
        "`{0}` reaches {1} (loopback, link-local with the metadata services, or reserved), which no job may"
    )]
    Never(String, String),
    /// A public range: it needs no allowance.
    #[error(
        "`{0}` is not inside a private range; public addresses need no allowance (allow_private \
         opens parts of 10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, 198.18.0.0/15, \
         192.0.0.0/24)"
    )]
    Public(String),
}

/// `entry` as a private range a pool may open.
pub fn private_range(entry: &str) -> Result<Net, PrivateError> {
    let net = Net::parse(entry)?;
    let entry = entry.trim().to_string();
    if net.addr().is_ipv6() {
        return Err(PrivateError::V6(entry));
    }
    let jobs = Net::parse(&format!("{}/{}", JOB_NET.0, JOB_NET.1))?;
    if jobs.overlaps(&net) {
        return Err(PrivateError::Jobs(entry, jobs.to_string()));
    }
    let never = NEVER.iter().filter_map(|n| Net::parse(n).ok());
    if let Some(n) = never.clone().find(|n| n.overlaps(&net)) {
        return Err(PrivateError::Never(entry, n.to_string()));
    }
    let denied = DENIED_V4.iter().filter_map(|n| Net::parse(n).ok());
    if !denied.clone().any(|d| d.holds(&net)) {
        return Err(PrivateError::Public(entry));
    }
    Ok(net)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_private_range_is_opened_and_nothing_the_fence_always_keeps() {
        for ok in [
            "10.20.0.0/16",
            "192.168.1.5",
            "172.16.0.0/12",
            "100.64.1.0/24",
        ] {
            assert!(private_range(ok).is_ok(), "{ok}");
        }
        let refused = |e: &str| private_range(e).unwrap_err();
        assert!(
            matches!(refused("10.0.0.0/8"), PrivateError::Jobs(..)),
            "holds the jobs' range"
        );
        assert!(matches!(refused("10.213.4.0/24"), PrivateError::Jobs(..)));
        assert!(matches!(
            refused("169.254.169.254"),
            PrivateError::Never(..)
        ));
        assert!(matches!(refused("127.0.0.1"), PrivateError::Never(..)));
        assert!(matches!(
            refused("0.0.0.0/0"),
            PrivateError::Jobs(..) | PrivateError::Never(..)
        ));
        assert!(matches!(refused("8.8.8.0/24"), PrivateError::Public(_)));
        assert!(matches!(refused("fd00::/8"), PrivateError::V6(_)));
        assert!(matches!(
            refused("10.1.0.1/16"),
            PrivateError::Net(RuleError::HostBits { .. })
        ));
        assert!(matches!(refused("registry.internal"), PrivateError::Net(_)));
        assert!(
            refused("8.8.8.0/24")
                .to_string()
                .contains("not inside a private range")
        );
    }
}
