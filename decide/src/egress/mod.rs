//! A job's network boundary, decided: where each job's network namespace sits, and the
//! nftables rules that keep it off the host, the metadata services, the private ranges and
//! every other job. The daemon's shell runs `ip` and `nft` with what is decided here.
//!
//! The shape (docs/security.md, "The network"):
//! - each job gets a network namespace of its own, `ephemer-<slot>`, joined to the host by a
//!   veth pair (`ejh<slot>` on the host, `ejn<slot>` inside) on a /30 of [`JOB_NET`], and a
//!   default route through the host, which masquerades what leaves;
//! - on the host, one table ([`host_table`]) drops everything a job's interface sends to the
//!   host itself (every address of the host, loopback and link-local included: it never leaves
//!   the input hook), and of what it sends through: anything to another job, all IPv6, and
//!   every address in [`DENIED_V4`] (private, shared, link-local with the metadata services,
//!   loopback, multicast, reserved) unless the job's pool allows that range;
//! - inside the namespace, one table ([`job_table`]) sends every DNS query, to whatever server
//!   it was addressed, to the daemon's forwarder bound at `127.0.0.1:53` in that namespace
//!   (a guest behind QEMU's user network asks through QEMU, whose resolver is the host's: it
//!   lands there too).
//!
//! A slot is taken host-wide by creating its namespace (`ip netns add` fails when it exists),
//! so daemons on one host never share one.

pub mod allow;
pub mod audit;
pub mod dns;
pub mod fence;
pub mod private;
pub mod seen;

use core::net::Ipv4Addr;

/// The range job namespaces are numbered in: a /30 a slot.
pub const JOB_NET: (Ipv4Addr, u8) = (Ipv4Addr::new(10, 213, 0, 0), 16);
/// How many slots the range holds.
pub const SLOTS: u16 = 1 << 14;
/// The host's table.
pub const HOST_TABLE: &str = "ephemer";
/// The table inside each job's namespace.
pub const JOB_TABLE: &str = "ephemer_job";
/// The prefix of the host side of every job's veth pair (`iifname "ejh*"` in the rules).
pub const HOST_IF_PREFIX: &str = "ejh";

/// IPv4 ranges no job reaches whatever its pool says, but a private range its pool allows:
/// "this network", RFC 1918, shared address space (CGNAT), loopback, link-local (the metadata
/// services at 169.254.169.254 and AWS's 169.254.169.253 among them), IETF protocol
/// assignments, benchmarking, multicast and the reserved range, and Azure's wire server.
pub const DENIED_V4: [&str; 11] = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.0.0.0/24",
    "192.168.0.0/16",
    "198.18.0.0/15",
    "224.0.0.0/3",
    "168.63.129.16/32",
];

/// Which job namespace, host-wide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Slot(pub u16);

impl Slot {
    /// The namespace's name (`/run/netns/<name>`).
    pub fn netns(self) -> String {
        format!("ephemer-{}", self.0)
    }

    /// The host side of its veth pair.
    pub fn host_if(self) -> String {
        format!("{HOST_IF_PREFIX}{}", self.0)
    }

    /// The namespace's side of its veth pair.
    pub fn ns_if(self) -> String {
        format!("ejn{}", self.0)
    }

    /// The host side's address (the namespace's gateway).
    pub fn host_addr(self) -> Ipv4Addr {
        self.nth(1)
    }

    /// The namespace's address.
    pub fn ns_addr(self) -> Ipv4Addr {
        self.nth(2)
    }

    fn nth(self, n: u32) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(JOB_NET.0) + u32::from(self.0) * 4 + n)
    }

    /// The slots to try for a job named `name`, in order: from a place its name picks (so
    /// concurrent starts rarely meet), round the whole range.
    pub fn candidates(name: &str) -> impl Iterator<Item = Slot> {
        // FNV-1a: stable, and no hashing crate needed.
        let start = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        }) % u64::from(SLOTS);
        (0..SLOTS).map(move |i| Slot(((start + u64::from(i)) % u64::from(SLOTS)) as u16))
    }

    /// The slot a namespace name stands for.
    pub fn of_netns(name: &str) -> Option<Slot> {
        name.strip_prefix("ephemer-")?
            .parse()
            .ok()
            .filter(|n| *n < SLOTS)
            .map(Slot)
    }
}

/// The `ip -batch` commands, run on the host, that join slot `slot`'s namespace (already made)
/// to it.
pub fn host_link_commands(slot: Slot) -> String {
    let (h, n, ns) = (slot.host_if(), slot.ns_if(), slot.netns());
    format!(
        "link add {h} type veth peer name {n} netns {ns}\n\
         addr add {}/30 dev {h}\n\
         link set {h} up\n",
        slot.host_addr(),
    )
}

/// The `ip -n <netns> -batch` commands, run for the namespace, that give it its address and
/// its way out.
pub fn ns_link_commands(slot: Slot) -> String {
    let n = slot.ns_if();
    format!(
        "link set lo up\n\
         addr add {}/30 dev {n}\n\
         link set {n} up\n\
         route add default via {}\n",
        slot.ns_addr(),
        slot.host_addr()
    )
}

/// The host's table, as one `nft -f` transaction: the chains are rebuilt whole (every daemon
/// on the host writes the same), the per-job allowances in `allowed` and the per-job chains
/// `jobs` sends a job's interface to ([`fence`]) are kept. A connection the rules let start
/// goes on when an address's pin runs out.
pub fn host_table() -> String {
    let t = HOST_TABLE;
    let p = HOST_IF_PREFIX;
    let denied = DENIED_V4.join(", ");
    format!(
        "add table inet {t}\n\
         add set inet {t} denied4 {{ type ipv4_addr; flags interval; }}\n\
         add set inet {t} allowed {{ type ifname . ipv4_addr; flags interval; }}\n\
         add map inet {t} jobs {{ type ifname : verdict; }}\n\
         add chain inet {t} input {{ type filter hook input priority filter - 5; policy accept; }}\n\
         add chain inet {t} forward {{ type filter hook forward priority filter - 5; policy accept; }}\n\
         add chain inet {t} from_job\n\
         add chain inet {t} postrouting {{ type nat hook postrouting priority srcnat; policy accept; }}\n\
         flush set inet {t} denied4\n\
         add element inet {t} denied4 {{ {denied} }}\n\
         flush chain inet {t} input\n\
         flush chain inet {t} forward\n\
         flush chain inet {t} from_job\n\
         flush chain inet {t} postrouting\n\
         add rule inet {t} input iifname \"{p}*\" counter drop comment \"a job reaches nothing of the host\"\n\
         add rule inet {t} forward iifname \"{p}*\" jump from_job\n\
         add rule inet {t} forward oifname \"{p}*\" ct state established,related accept\n\
         add rule inet {t} forward oifname \"{p}*\" counter drop comment \"nothing starts a connection into a job\"\n\
         add rule inet {t} from_job ct state established,related accept comment \"what the rules below let start\"\n\
         add rule inet {t} from_job oifname \"{p}*\" counter drop comment \"another job\"\n\
         add rule inet {t} from_job meta nfproto ipv6 counter drop comment \"no IPv6 out of a job\"\n\
         add rule inet {t} from_job iifname . ip daddr @allowed accept\n\
         add rule inet {t} from_job ip daddr @denied4 counter drop comment \"private, link-local, metadata\"\n\
         add rule inet {t} from_job iifname vmap @jobs comment \"a job's allow-list or audit (fence.rs)\"\n\
         add rule inet {t} postrouting iifname \"{p}*\" oifname != \"{p}*\" masquerade\n"
    )
}

/// The `nft` commands that let slot `slot` reach the private ranges its pool allows.
pub fn allow_commands(slot: Slot, ranges: &[String]) -> String {
    allowance("add", slot, ranges)
}

/// The `nft` commands that take slot `slot`'s allowances away (its interface is gone).
pub fn forget_commands(slot: Slot, ranges: &[String]) -> String {
    allowance("delete", slot, ranges)
}

/// The `nft` arguments that list the host's allowances (as JSON), every slot's.
pub const LIST_ALLOWED_ARGS: [&str; 6] = ["-j", "list", "set", "inet", HOST_TABLE, "allowed"];

/// Slot `slot`'s allowances in `nft -j list set`'s answer for the `allowed` set, as `nft`
/// writes them (`10.20.0.0/16`, `10.0.0.1`, `10.0.0.1-10.0.0.9`): whatever put them there, a
/// job now gone or a daemon that crashed, so a reused or reaped slot takes them all away.
pub fn allowances_in(json: &str, slot: Slot) -> Vec<String> {
    let Ok(doc) = serde_json::from_str::<serde_json::Value>(json) else {
        return Vec::new();
    };
    let host_if = slot.host_if();
    let addr = |v: &serde_json::Value| -> Option<String> {
        if let Some(a) = v.as_str() {
            return Some(a.to_string());
        }
        if let Some(p) = v.get("prefix") {
            return Some(format!(
                "{}/{}",
                p.get("addr")?.as_str()?,
                p.get("len")?.as_u64()?
            ));
        }
        let r = v.get("range")?.as_array()?;
        Some(format!("{}-{}", r.first()?.as_str()?, r.get(1)?.as_str()?))
    };
    doc.get("nftables")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|item| item.get("set")?.get("elem")?.as_array())
        .flatten()
        .filter_map(|elem| {
            // A bare element, or one wrapped with its counters (`{"elem": {"val": ...}}`).
            let concat = elem
                .get("concat")
                .or_else(|| elem.get("elem")?.get("val")?.get("concat"))?
                .as_array()?;
            (concat.first()?.as_str()? == host_if)
                .then(|| addr(concat.get(1)?))
                .flatten()
        })
        .collect()
}

fn allowance(verb: &str, slot: Slot, ranges: &[String]) -> String {
    if ranges.is_empty() {
        return String::new();
    }
    let h = slot.host_if();
    let elements: Vec<String> = ranges.iter().map(|r| format!("\"{h}\" . {r}")).collect();
    format!(
        "{verb} element inet {HOST_TABLE} allowed {{ {} }}\n",
        elements.join(", ")
    )
}

/// The table inside a job's namespace: every DNS query goes to the daemon's forwarder.
pub fn job_table() -> String {
    let t = JOB_TABLE;
    format!(
        "add table ip {t}\n\
         add chain ip {t} output {{ type nat hook output priority -100; policy accept; }}\n\
         add rule ip {t} output udp dport 53 dnat to 127.0.0.1:53\n\
         add rule ip {t} output tcp dport 53 dnat to 127.0.0.1:53\n"
    )
}

/// The name servers a `resolv.conf` names, in order (IPv4 and IPv6; a scope suffix dropped).
pub fn nameservers(resolv_conf: &str) -> Vec<core::net::IpAddr> {
    resolv_conf
        .lines()
        .filter_map(|l| l.trim().strip_prefix("nameserver"))
        .filter_map(|rest| rest.split_whitespace().next())
        .filter_map(|a| a.split('%').next()?.parse().ok())
        .collect()
}

#[cfg(test)]
mod tests;
