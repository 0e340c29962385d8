//! A pool's egress allow-list, decided: which names a job may look up, which addresses it may
//! reach because an allowed name resolved to them (pinned for the answer's TTL) or because the
//! list names them, and what an audit records. The namespace's DNS forwarder and its nftables
//! set carry these answers out; nothing here reads a packet or a clock.
//!
//! An entry of `allow` is a name (`github.com`: that name only), a wildcard (`*.github.com`:
//! every name under it, at any depth, not the name itself), or an address or network
//! (`10.1.2.3/32`, `2001:db8::/48`, a bare address is its own /32 or /128). Names are
//! compared lowercased, without a trailing dot.

use core::net::IpAddr;
use std::collections::BTreeMap;

/// What a pool's `egress.mode` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// Every name is answered and every address past the fence reached.
    #[default]
    Open,
    /// As `Open`, and what an allow-list would have refused is recorded.
    Audit,
    /// Only allowed names are answered, only their addresses (and listed ones) reached.
    AllowList,
}

impl Mode {
    /// The mode `s` names (`open`, `audit`, `allow-list`).
    pub fn parse(s: &str) -> Option<Mode> {
        match s {
            "open" => Some(Mode::Open),
            "audit" => Some(Mode::Audit),
            "allow-list" => Some(Mode::AllowList),
            _ => None,
        }
    }

    /// The mode's name in the config.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Open => "open",
            Mode::Audit => "audit",
            Mode::AllowList => "allow-list",
        }
    }
}

/// The names a runner needs to talk to github.com, from GitHub's "Communicating with
/// self-hosted runners" (docs.github.com, actions/concepts/runners): the site and its API,
/// the Actions service's hosts, release and artifact downloads, the container registry, and
/// the Azure blob storage logs, artifacts and caches are kept in. Added to every allow-list;
/// a GHES target adds its own host (from `api_url`) instead of relying on these.
pub const RUNNER_HOSTS: &[&str] = &[
    "github.com",
    "*.github.com",
    "*.githubusercontent.com",
    "ghcr.io",
    "*.blob.core.windows.net",
];

/// An address range: an address and how many of its leading bits count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Net {
    addr: IpAddr,
    prefix: u8,
}

impl Net {
    /// The range `entry` writes (`addr`, or `addr/prefix` with no bit set past the prefix).
    pub fn parse(entry: &str) -> Result<Net, RuleError> {
        parse_net(entry.trim())
    }

    /// Its first address.
    pub fn addr(&self) -> IpAddr {
        self.addr
    }

    /// How many leading bits count.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether the two share an address (one holds the other's first address).
    pub fn overlaps(&self, other: &Net) -> bool {
        self.contains(other.addr) || other.contains(self.addr)
    }

    /// Whether `other` is wholly inside this range.
    pub fn holds(&self, other: &Net) -> bool {
        self.prefix <= other.prefix && self.contains(other.addr)
    }

    /// Whether `ip` is in the range.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                masked(u128::from(net.to_bits()), 32, self.prefix)
                    == masked(u128::from(ip.to_bits()), 32, self.prefix)
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                masked(net.to_bits(), 128, self.prefix) == masked(ip.to_bits(), 128, self.prefix)
            }
            _ => false,
        }
    }
}

impl core::fmt::Display for Net {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// `bits` (an address `width` bits wide) with all but its leading `prefix` bits cleared.
fn masked(bits: u128, width: u8, prefix: u8) -> u128 {
    if prefix == 0 {
        return 0;
    }
    let keep = u128::MAX << (128 - u32::from(prefix));
    (bits << (128 - u32::from(width))) & keep
}

/// One entry of an allow-list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rule {
    /// This name only.
    Name(String),
    /// Every name under this one (`*.github.com` holds `github.com` here).
    Under(String),
    /// An address or a network.
    Net(Net),
}

/// Why an entry is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    /// Empty.
    #[error("an empty entry")]
    Empty,
    /// A name with a character, a label or a length DNS does not allow.
    #[error("`{0}` is not a host name (letters, digits and `-` in labels of 1-63, 253 in all)")]
    BadName(String),
    /// A `*` anywhere but as the whole first label.
    #[error("`{0}`: a wildcard is `*.` followed by a name (`*.example.com`)")]
    BadWildcard(String),
    /// A network whose address or prefix is not one.
    #[error("`{0}` is not a network (an address, or an address and a prefix: 10.1.0.0/16)")]
    BadNet(String),
    /// A network whose address has bits set past its prefix.
    #[error("`{given}` has bits set past its prefix; the network is {net}")]
    HostBits {
        /// What was written.
        given: String,
        /// The network it would be.
        net: String,
    },
}

impl Rule {
    /// The rule `entry` writes.
    pub fn parse(entry: &str) -> Result<Rule, RuleError> {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(RuleError::Empty);
        }
        if entry.parse::<IpAddr>().is_ok() || entry.contains('/') || entry.contains(':') {
            return parse_net(entry).map(Rule::Net);
        }
        let name = normal(entry);
        if let Some(under) = name.strip_prefix("*.") {
            if under.contains('*') || !is_host_name(under) {
                return Err(RuleError::BadWildcard(entry.to_string()));
            }
            return Ok(Rule::Under(under.to_string()));
        }
        if name.contains('*') {
            return Err(RuleError::BadWildcard(entry.to_string()));
        }
        if !is_host_name(&name) {
            return Err(RuleError::BadName(entry.to_string()));
        }
        Ok(Rule::Name(name))
    }
}

/// `entry` as a network: `addr` (its own /32 or /128) or `addr/prefix`, with no bit set past
/// the prefix.
fn parse_net(entry: &str) -> Result<Net, RuleError> {
    let bad = || RuleError::BadNet(entry.to_string());
    let (addr, prefix) = match entry.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (entry, None),
    };
    let addr: IpAddr = addr.parse().map_err(|_| bad())?;
    let width = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => width,
        Some(p) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => p
            .parse::<u8>()
            .ok()
            .filter(|p| *p <= width)
            .ok_or_else(bad)?,
        Some(_) => return Err(bad()),
    };
    let raw: u128 = match addr {
        IpAddr::V4(a) => u128::from(a.to_bits()),
        IpAddr::V6(a) => a.to_bits(),
    };
    let kept = masked(raw, width, prefix);
    if kept != raw << (128 - u32::from(width)) {
        let cleared = kept >> (128 - u32::from(width));
        let addr = match addr {
            IpAddr::V4(_) => IpAddr::V4(core::net::Ipv4Addr::from_bits(cleared as u32)),
            IpAddr::V6(_) => IpAddr::V6(core::net::Ipv6Addr::from_bits(cleared)),
        };
        return Err(RuleError::HostBits {
            given: entry.to_string(),
            net: Net { addr, prefix }.to_string(),
        });
    }
    let net = Net { addr, prefix };
    Ok(net)
}

/// A name lowercased, without its trailing dot.
pub fn normal(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether `name` (lowercased, no trailing dot) is a host name DNS can carry.
fn is_host_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        })
}

/// A pool's allow-list: its entries and the runner's own hosts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    names: Vec<String>,
    under: Vec<String>,
    nets: Vec<Net>,
}

impl AllowList {
    /// The list of `entries`, with [`RUNNER_HOSTS`] (github.com) or `ghes_host` (a GHES
    /// target's host, from its `api_url`) added. Every entry that is not one, by its index.
    pub fn new(
        entries: &[String],
        ghes_host: Option<&str>,
    ) -> Result<Self, Vec<(usize, RuleError)>> {
        let mut list = AllowList::default();
        let mut problems = Vec::new();
        for (i, entry) in entries.iter().enumerate() {
            match Rule::parse(entry) {
                Ok(rule) => list.add(rule),
                Err(e) => problems.push((i, e)),
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        match ghes_host {
            Some(host) => list.add(Rule::Name(normal(host))),
            None => {
                for host in RUNNER_HOSTS {
                    if let Ok(rule) = Rule::parse(host) {
                        list.add(rule);
                    }
                }
            }
        }
        Ok(list)
    }

    fn add(&mut self, rule: Rule) {
        match rule {
            Rule::Name(n) => self.names.push(n),
            Rule::Under(n) => self.under.push(n),
            Rule::Net(n) => self.nets.push(n),
        }
    }

    /// Whether a lookup of `name` is answered.
    pub fn allows_name(&self, name: &str) -> bool {
        let name = normal(name);
        self.names.contains(&name)
            || self.under.iter().any(|u| {
                name.len() > u.len() + 1
                    && name.ends_with(u.as_str())
                    && name.as_bytes()[name.len() - u.len() - 1] == b'.'
            })
    }

    /// Whether `ip` is listed (reached by its address, no lookup needed).
    pub fn lists(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|n| n.contains(ip))
    }

    /// The networks listed, for the namespace's set of addresses always allowed.
    pub fn nets(&self) -> &[Net] {
        &self.nets
    }
}

/// What the forwarder does with a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Asked upstream, answered, its addresses pinned (allow-list mode) or not (open).
    Answer,
    /// Answered, and recorded as one an allow-list would refuse (audit mode).
    AnswerAudited,
    /// Refused (`REFUSED`), counted and noted.
    Refuse,
}

/// What `mode` and `list` make of a lookup of `name`.
pub fn on_lookup(mode: Mode, list: &AllowList, name: &str) -> Lookup {
    match mode {
        Mode::Open => Lookup::Answer,
        Mode::Audit if list.allows_name(name) => Lookup::Answer,
        Mode::Audit => Lookup::AnswerAudited,
        Mode::AllowList if list.allows_name(name) => Lookup::Answer,
        Mode::AllowList => Lookup::Refuse,
    }
}

/// The shortest an answer's addresses stay pinned, whatever its TTL: a client may connect a
/// moment after a TTL-0 answer.
pub const PIN_MIN_SECS: u64 = 30;
/// The longest an answer's addresses stay pinned: a day-long TTL does not open an address for
/// a day after the job stopped asking.
pub const PIN_MAX_SECS: u64 = 3600;

/// At most this many addresses of one answer are pinned (the first ones): a name whose server
/// answers thousands of A records opens no more than this, and a client uses the first few.
pub const ANSWER_PINS_MAX: usize = 16;
/// At most this many addresses are pinned for one job at a time: a job looping lookups of
/// names that answer many addresses each cannot grow the daemon's memory or the job's set
/// without bound. Past it, an answer whose addresses do not fit is withheld.
pub const JOB_PINS_MAX: usize = 4096;

/// The addresses allowed names resolved to, each until its answer's TTL ran out (within
/// [`PIN_MIN_SECS`] and [`PIN_MAX_SECS`]): what the namespace's nftables set holds. Bounded:
/// [`ANSWER_PINS_MAX`] per answer, [`JOB_PINS_MAX`] in all. An answer is planned first and kept
/// only once its set entries were written ([`Pins::plan`], then [`Pins::commit`]), so an
/// address `nft` refused is not remembered as reachable.
#[derive(Debug, Clone, Default)]
pub struct Pins {
    until: BTreeMap<IpAddr, u64>,
}

/// An answer's addresses to pin: each with the timeout to give its set entry (seconds) and
/// the unix second it holds until.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Planned {
    /// (address, timeout in seconds, until).
    pub entries: Vec<(IpAddr, u64, u64)>,
}

impl Planned {
    /// Each address with its set entry's timeout.
    pub fn timeouts(&self) -> Vec<(IpAddr, u64)> {
        self.entries.iter().map(|(ip, t, _)| (*ip, *t)).collect()
    }
}

/// Why an answer's addresses were not pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinsFull {
    /// The job holds [`JOB_PINS_MAX`] addresses already and none of this answer's is among them.
    Job,
}

impl Pins {
    /// An answer at `now` (unix seconds) gave `answer`'s addresses, each with its TTL: the
    /// first [`ANSWER_PINS_MAX`] of them, each to be pinned until then, or longer if an earlier
    /// answer pinned it longer (a set entry added again takes the new timeout, so a shorter
    /// later answer must not shorten it). What ran out is forgotten first. New addresses take
    /// only the room left under [`JOB_PINS_MAX`]; an answer none of whose addresses fits is
    /// [`PinsFull`]. Nothing is kept until [`Pins::commit`].
    pub fn plan(&mut self, answer: &[(IpAddr, u32)], now: u64) -> Result<Planned, PinsFull> {
        self.expire(now);
        let mut room = JOB_PINS_MAX.saturating_sub(self.until.len());
        let mut entries: Vec<(IpAddr, u64, u64)> = Vec::new();
        for (addr, ttl) in answer.iter().take(ANSWER_PINS_MAX) {
            if entries.iter().any(|(ip, _, _)| ip == addr) {
                continue;
            }
            let held = self.until.get(addr).copied();
            if held.is_none() {
                if room == 0 {
                    continue;
                }
                room -= 1;
            }
            let secs = u64::from(*ttl).clamp(PIN_MIN_SECS, PIN_MAX_SECS);
            let until = held.unwrap_or(0).max(now + secs);
            entries.push((*addr, until - now, until));
        }
        if entries.is_empty() && !answer.is_empty() {
            return Err(PinsFull::Job);
        }
        Ok(Planned { entries })
    }

    /// The planned answer's set entries were written: its addresses are pinned (still within
    /// [`JOB_PINS_MAX`], whatever else was committed since it was planned).
    pub fn commit(&mut self, planned: &Planned) {
        for (ip, _, until) in &planned.entries {
            if let Some(held) = self.until.get_mut(ip) {
                *held = (*held).max(*until);
            } else if self.until.len() < JOB_PINS_MAX {
                self.until.insert(*ip, *until);
            }
        }
    }

    /// [`Pins::plan`] and [`Pins::commit`] at once, every address with one TTL (the tests'
    /// shorthand; the forwarder plans, writes the set, then commits): each address with its
    /// set entry's timeout.
    #[cfg(test)]
    pub fn pin(&mut self, addrs: &[IpAddr], ttl: u32, now: u64) -> Vec<(IpAddr, u64)> {
        let answer: Vec<(IpAddr, u32)> = addrs.iter().map(|a| (*a, ttl)).collect();
        match self.plan(&answer, now) {
            Ok(planned) => {
                self.commit(&planned);
                planned.timeouts()
            }
            Err(PinsFull::Job) => Vec::new(),
        }
    }

    /// Whether `ip` is pinned at `now`.
    pub fn holds(&self, ip: IpAddr, now: u64) -> bool {
        self.until.get(&ip).is_some_and(|until| now < *until)
    }

    /// Forgets what ran out by `now`; the addresses forgotten.
    pub fn expire(&mut self, now: u64) -> Vec<IpAddr> {
        let gone: Vec<IpAddr> = self
            .until
            .iter()
            .filter(|(_, until)| **until <= now)
            .map(|(ip, _)| *ip)
            .collect();
        for ip in &gone {
            self.until.remove(ip);
        }
        gone
    }

    /// Addresses pinned.
    pub fn len(&self) -> usize {
        self.until.len()
    }

    /// Whether nothing is pinned.
    pub fn is_empty(&self) -> bool {
        self.until.is_empty()
    }
}

/// What a connection to `ip` at `now` meets in `mode`: whether it goes through, and whether
/// an allow-list would have refused it (audit).
pub fn on_connect(mode: Mode, list: &AllowList, pins: &Pins, ip: IpAddr, now: u64) -> Lookup {
    let allowed = list.lists(ip) || pins.holds(ip, now);
    match mode {
        Mode::Open => Lookup::Answer,
        _ if allowed => Lookup::Answer,
        Mode::Audit => Lookup::AnswerAudited,
        Mode::AllowList => Lookup::Refuse,
    }
}

/// One name in an audit report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
    /// The name.
    pub name: String,
    /// How often jobs looked it up.
    pub lookups: u64,
    /// Whether the pool's allow-list would refuse it.
    pub refused: bool,
}

/// The names a pool's jobs looked up, with how often and which the list would refuse: most
/// asked first, then by name. `lookups` are (name, refused by the list) as the forwarder
/// recorded them.
pub fn report<'a>(lookups: impl IntoIterator<Item = (&'a str, bool)>) -> Vec<Asked> {
    let mut by_name: BTreeMap<String, (u64, bool)> = BTreeMap::new();
    for (name, refused) in lookups {
        let entry = by_name.entry(normal(name)).or_insert((0, false));
        entry.0 += 1;
        entry.1 |= refused;
    }
    let mut rows: Vec<Asked> = by_name
        .into_iter()
        .map(|(name, (lookups, refused))| Asked {
            name,
            lookups,
            refused,
        })
        .collect();
    rows.sort_by(|a, b| b.lookups.cmp(&a.lookups).then_with(|| a.name.cmp(&b.name)));
    rows
}

#[cfg(test)]
#[path = "allow_tests.rs"]
mod tests;
