//! A job's own part of the host's fence, for a pool in `audit` or `allow-list` mode: a chain
//! `job_<slot>` the host table's `jobs` map sends the job's interface to (after the fence every
//! job has), with three sets of its own:
//! - `pins_<slot>`: the addresses its allowed lookups resolved to, each for its answer's TTL
//!   ([`Pins`](super::allow::Pins) says how long), put there by the forwarder before the answer
//!   reaches the job;
//! - `listed_<slot>`: the public addresses and networks its pool's `allow` names;
//! - `refused_<slot>`: every other address the job tried (bounded, an hour each), which the
//!   daemon reads when the job ends: refused in `allow-list` mode, reported in `audit` mode.
//!
//! An open pool's job has no chain: the fence alone.

use core::net::Ipv4Addr;

use super::{HOST_TABLE, Slot, allow::Mode, allow::Net};

/// Addresses one job may have pinned at once.
pub const PINS_MAX: u32 = 65_536;
/// Refused addresses kept per job (a job trying more is still refused; they go unrecorded).
pub const REFUSED_MAX: u32 = 1024;

/// The `nft -f` transaction that gives slot `slot`'s job its chain for `mode` (nothing for
/// `open`), with `listed` (the pool's public `allow` networks) always reachable.
pub fn job_commands(slot: Slot, mode: Mode, listed: &[Net]) -> String {
    if mode == Mode::Open {
        return String::new();
    }
    let t = HOST_TABLE;
    let n = slot.0;
    let mut s = format!(
        "add set inet {t} pins_{n} {{ type ipv4_addr; flags timeout; size {PINS_MAX}; }}\n\
         add set inet {t} listed_{n} {{ type ipv4_addr; flags interval; }}\n\
         add set inet {t} refused_{n} {{ type ipv4_addr; flags dynamic,timeout; timeout 1h; size {REFUSED_MAX}; }}\n\
         add chain inet {t} job_{n}\n\
         add rule inet {t} job_{n} ip daddr @pins_{n} accept\n\
         add rule inet {t} job_{n} ip daddr @listed_{n} accept\n\
         add rule inet {t} job_{n} update @refused_{n} {{ ip daddr }}\n"
    );
    let v4: Vec<String> = listed
        .iter()
        .filter(|net| net.addr().is_ipv4())
        .map(Net::to_string)
        .collect();
    if !v4.is_empty() {
        s.push_str(&format!(
            "add element inet {t} listed_{n} {{ {} }}\n",
            v4.join(", ")
        ));
    }
    if mode == Mode::AllowList {
        s.push_str(&format!(
            "add rule inet {t} job_{n} meta l4proto tcp counter reject with tcp reset comment \"not on the pool's allow-list\"\n\
             add rule inet {t} job_{n} counter reject with icmpx admin-prohibited comment \"not on the pool's allow-list\"\n"
        ));
    }
    s.push_str(&format!(
        "add element inet {t} jobs {{ \"{}\" : jump job_{n} }}\n",
        slot.host_if()
    ));
    s
}

/// The commands that take slot `slot`'s chain and sets away, one per line: each is tried on its
/// own (a slot whose job was open has none of them, a crashed daemon's may have some).
pub fn forget_job_commands(slot: Slot) -> Vec<String> {
    let (t, n) = (HOST_TABLE, slot.0);
    vec![
        format!("delete element inet {t} jobs {{ \"{}\" }}", slot.host_if()),
        format!("flush chain inet {t} job_{n}"),
        format!("delete chain inet {t} job_{n}"),
        format!("delete set inet {t} pins_{n}"),
        format!("delete set inet {t} listed_{n}"),
        format!("delete set inet {t} refused_{n}"),
    ]
}

/// The command that pins `addrs`, each for its timeout in seconds (from
/// [`Pins::pin`](super::allow::Pins::pin)); nothing when there is no IPv4 address.
pub fn pin_command(slot: Slot, addrs: &[(core::net::IpAddr, u64)]) -> Option<String> {
    let v4: Vec<String> = addrs
        .iter()
        .filter_map(|(ip, secs)| match ip {
            core::net::IpAddr::V4(a) => Some(format!("{a} timeout {secs}s")),
            core::net::IpAddr::V6(_) => None,
        })
        .collect();
    (!v4.is_empty()).then(|| {
        format!(
            "add element inet {HOST_TABLE} pins_{} {{ {} }}\n",
            slot.0,
            v4.join(", ")
        )
    })
}

/// The `nft` arguments that list slot `slot`'s refused addresses (as JSON).
pub fn list_refused_args(slot: Slot) -> Vec<String> {
    ["-j", "list", "set", "inet", HOST_TABLE]
        .iter()
        .map(|s| s.to_string())
        .chain([format!("refused_{}", slot.0)])
        .collect()
}

/// The addresses in `nft -j list set`'s answer: every string of the JSON that is an IPv4
/// address, once each, in order (the element's shape differs between nftables versions: a
/// bare string, or `{"elem": {"val": ...}}`). Bounded by the answer, which the shell reads
/// bounded.
pub fn refused_in(json: &str) -> Vec<Ipv4Addr> {
    let mut found: Vec<Ipv4Addr> = Vec::new();
    for piece in json.split('"') {
        if let Ok(a) = piece.parse::<Ipv4Addr>()
            && !found.contains(&a)
        {
            found.push(a);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allow_list_job_reaches_its_pins_and_listed_networks_and_is_refused_the_rest() {
        let listed = [
            Net::parse("203.0.113.0/24").unwrap(),
            Net::parse("2001:db8::/32").unwrap(),
        ];
        let s = job_commands(Slot(7), Mode::AllowList, &listed);
        let at = |needle: &str| s.find(needle).unwrap_or_else(|| panic!("{needle} in {s}"));
        // Pins and the listed networks first, then the record, then the refusal.
        assert!(at("@pins_7 accept") < at("@listed_7 accept"));
        assert!(at("@listed_7 accept") < at("update @refused_7"));
        assert!(at("update @refused_7") < at("reject with tcp reset"));
        assert!(at("reject with tcp reset") < at("reject with icmpx"));
        assert!(
            s.contains("add element inet ephemer listed_7 { 203.0.113.0/24 }\n"),
            "IPv6 leaves no job: {s}"
        );
        assert!(s.contains("size 1024"), "the record is bounded");
        // The map entry comes last: the chain is whole before any packet is sent to it.
        assert!(
            s.trim_end()
                .ends_with("add element inet ephemer jobs { \"ejh7\" : jump job_7 }")
        );
    }

    #[test]
    fn an_audit_job_is_recorded_never_refused_and_an_open_one_has_no_chain() {
        let s = job_commands(Slot(2), Mode::Audit, &[]);
        assert!(s.contains("update @refused_2 { ip daddr }"), "{s}");
        assert!(!s.contains("reject"), "{s}");
        assert!(!s.contains("add element inet ephemer listed_2"), "{s}");
        assert_eq!(job_commands(Slot(2), Mode::Open, &[]), "");
        let forget = forget_job_commands(Slot(2));
        assert_eq!(forget[0], "delete element inet ephemer jobs { \"ejh2\" }");
        assert!(
            forget.iter().position(|c| c.starts_with("delete chain"))
                > forget.iter().position(|c| c.starts_with("flush chain"))
        );
    }

    #[test]
    fn pins_carry_their_timeouts_and_the_refused_are_read_from_any_json_shape() {
        let addrs = [
            ("192.0.2.1".parse().unwrap(), 30),
            ("2001:db8::1".parse().unwrap(), 60),
            ("192.0.2.2".parse().unwrap(), 3600),
        ];
        assert_eq!(
            pin_command(Slot(4), &addrs).unwrap(),
            "add element inet ephemer pins_4 { 192.0.2.1 timeout 30s, 192.0.2.2 timeout 3600s }\n"
        );
        assert_eq!(pin_command(Slot(4), &addrs[1..2]), None);
        let old = r#"{"nftables":[{"set":{"name":"refused_4","elem":["10.8.1.1","10.8.1.2"]}}]}"#;
        let new = r#"{"nftables":[{"set":{"elem":[{"elem":{"val":"10.8.1.1","expires":3599}},{"elem":{"val":"10.8.1.1"}}]}}]}"#;
        assert_eq!(refused_in(old).len(), 2);
        assert_eq!(refused_in(new), ["10.8.1.1".parse::<Ipv4Addr>().unwrap()]);
        assert!(refused_in("{\"version\":\"1.0.6\"}").is_empty());
        assert_eq!(list_refused_args(Slot(4)).last().unwrap(), "refused_4");
    }
}
