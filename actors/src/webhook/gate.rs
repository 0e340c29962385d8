//! What unverified deliveries may cost before their signature is checked.
//!
//! A body is buffered before its `X-Hub-Signature-256` can be checked, so a peer with no secret
//! can still make the daemon hold bytes and hash them. Three bounds keep that from delaying
//! GitHub's deliveries:
//! - **per peer**: at most [`PER_PEER`] of a peer's deliveries are read at once;
//! - **in all**: the bytes held by bodies not yet verified stay under a budget (32 bodies of
//!   `webhook.max_body`, at least 32 MiB);
//! - **a peer that sent bad signatures** ([`STRIKES`] within [`STRIKE_WINDOW`]) has its next
//!   deliveries refused unread for [`PENALTY`]. GitHub signs every delivery; a hook whose
//!   secret is wrong is refused either way. A loopback peer never strikes out: it is this
//!   host (a reverse proxy in front of the daemon, whose one address is every delivery's, or
//!   a local user, who can do worse).
//!
//! Refused deliveries are answered 429 with `Retry-After` (`ephemerd_webhook_refused_total`
//! `{reason="overloaded"}`), before their body is read (or the rest of it), after [`TARPIT`],
//! which costs the daemon a sleeping connection and the flood most of its rate.

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{
        Mutex,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

/// A body this size or smaller is verified at once; a larger one waits its turn (GitHub's
/// `workflow_job` payloads are a few KB).
pub(crate) const SMALL: usize = 64 * 1024;
/// Deliveries of one peer read at once.
pub(crate) const PER_PEER: usize = 64;
/// Bad signatures after which a peer is refused unread.
pub(crate) const STRIKES: u32 = 3;
/// The window the strikes count in.
pub(crate) const STRIKE_WINDOW: Duration = Duration::from_secs(10);
/// How long a peer that struck out is refused.
pub(crate) const PENALTY: Duration = Duration::from_secs(10);
/// How long a refused delivery waits for its answer.
pub(crate) const TARPIT: Duration = Duration::from_secs(1);
/// Peers remembered at most (the oldest are forgotten first; an attacker rotating addresses
/// gets no more than the budget).
const MAX_PEERS: usize = 4096;

#[derive(Debug, Default, Clone, Copy)]
struct Peer {
    in_flight: usize,
    strikes: u32,
    first_strike: Option<Instant>,
    refused_until: Option<Instant>,
}

/// Each peer's deliveries being read and strikes (a fast seeded hash: every delivery looks).
type Peers = HashMap<IpAddr, Peer, foldhash::fast::RandomState>;

/// The bounds, shared by every worker of the intake.
#[derive(Debug)]
pub(crate) struct Gate {
    budget: usize,
    held: AtomicUsize,
    peers: Mutex<Peers>,
}

/// Why a delivery was not let in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The peer sent bad signatures just now.
    StruckOut,
    /// The peer has [`PER_PEER`] deliveries being read.
    Busy,
}

/// A delivery let in: what it holds is given back when it is dropped.
#[derive(Debug)]
pub(crate) struct Pass<'a> {
    gate: &'a Gate,
    peer: Option<IpAddr>,
    held: usize,
}

impl Gate {
    /// Bounds for bodies of at most `max_body` bytes.
    pub(crate) fn new(max_body: usize) -> Self {
        Gate {
            budget: max_body.saturating_mul(32).max(32 << 20),
            held: AtomicUsize::new(0),
            peers: Mutex::new(Peers::default()),
        }
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, Peers> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lets a delivery of `peer` be read, or not (the peer struck out, or has [`PER_PEER`]
    /// being read).
    pub(crate) fn enter(&self, peer: Option<IpAddr>, now: Instant) -> Result<Pass<'_>, Refusal> {
        if let Some(ip) = peer {
            let mut peers = self.peers();
            if peers.len() >= MAX_PEERS && !peers.contains_key(&ip) {
                peers.retain(|_, p| p.in_flight > 0);
            }
            let p = peers.entry(ip).or_default();
            if p.refused_until.is_some_and(|until| now < until) {
                return Err(Refusal::StruckOut);
            }
            if p.in_flight >= PER_PEER {
                return Err(Refusal::Busy);
            }
            p.in_flight += 1;
        }
        Ok(Pass {
            gate: self,
            peer,
            held: 0,
        })
    }

    /// A bad signature from `peer`: the third within the window refuses it for a while.
    pub(crate) fn strike(&self, peer: Option<IpAddr>, now: Instant) {
        let Some(ip) = peer.filter(|ip| !ip.is_loopback()) else {
            return;
        };
        let mut peers = self.peers();
        let p = peers.entry(ip).or_default();
        if p.first_strike
            .is_none_or(|first| now.duration_since(first) > STRIKE_WINDOW)
        {
            p.first_strike = Some(now);
            p.strikes = 0;
        }
        p.strikes += 1;
        if p.strikes >= STRIKES {
            p.refused_until = Some(now + PENALTY);
            p.strikes = 0;
            p.first_strike = None;
        }
    }

    /// Bytes held by bodies not yet verified.
    #[cfg(test)]
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

impl Pass<'_> {
    /// Holds `n` more bytes of this body; `false` (and nothing held) when that would pass the
    /// budget.
    pub(crate) fn hold(&mut self, n: usize) -> bool {
        let before = self.gate.held.fetch_add(n, Ordering::AcqRel);
        if before + n > self.gate.budget {
            self.gate.held.fetch_sub(n, Ordering::AcqRel);
            return false;
        }
        self.held += n;
        true
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        self.gate.held.fetch_sub(self.held, Ordering::AcqRel);
        if let Some(ip) = self.peer {
            let mut peers = self.gate.peers();
            if let Some(p) = peers.get_mut(&ip) {
                p.in_flight = p.in_flight.saturating_sub(1);
                if p.in_flight == 0 && p.strikes == 0 && p.refused_until.is_none() {
                    peers.remove(&ip);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 1)));
    const B: Option<IpAddr> = Some(IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 2)));

    #[test]
    fn a_peer_reads_at_most_its_share_at_once_and_gets_it_back() {
        let gate = Gate::new(1 << 20);
        let now = Instant::now();
        let passes: Vec<Pass<'_>> = (0..PER_PEER).map(|_| gate.enter(A, now).unwrap()).collect();
        assert_eq!(
            gate.enter(A, now).err(),
            Some(Refusal::Busy),
            "the peer's share is taken"
        );
        assert!(gate.enter(B, now).is_ok(), "another peer is not held back");
        drop(passes);
        assert!(gate.enter(A, now).is_ok());
    }

    #[test]
    fn unverified_bytes_stay_under_the_budget() {
        let gate = Gate::new(1 << 20);
        let now = Instant::now();
        let mut passes = Vec::new();
        for _ in 0..32 {
            let mut p = gate.enter(A, now).unwrap();
            assert!(p.hold(1 << 20));
            passes.push(p);
        }
        let mut more = gate.enter(B, now).unwrap();
        assert!(!more.hold(1), "over the budget");
        assert_eq!(gate.held(), 32 << 20);
        passes.clear();
        assert!(more.hold(1 << 20));
        drop(more);
        assert_eq!(gate.held(), 0);
    }

    #[test]
    fn a_peer_that_sends_bad_signatures_is_refused_for_a_while() {
        let gate = Gate::new(1 << 20);
        let t0 = Instant::now();
        for i in 0..STRIKES - 1 {
            gate.strike(A, t0 + Duration::from_secs(u64::from(i)));
        }
        assert!(gate.enter(A, t0 + Duration::from_secs(3)).is_ok());
        gate.strike(A, t0 + Duration::from_secs(3));
        assert!(gate.enter(A, t0 + Duration::from_secs(4)).is_err());
        assert!(gate.enter(B, t0 + Duration::from_secs(4)).is_ok());
        assert!(
            gate.enter(A, t0 + Duration::from_secs(14)).is_ok(),
            "after the penalty"
        );
        // This host (a proxy in front of the daemon) never strikes out.
        let local = Some(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        for _ in 0..10 {
            gate.strike(local, t0);
        }
        assert!(gate.enter(local, t0).is_ok());
        // Strikes far apart never add up.
        for i in 0..10 {
            gate.strike(B, t0 + STRIKE_WINDOW * (2 * i + 1));
        }
        assert!(gate.enter(B, t0 + STRIKE_WINDOW * 21).is_ok());
    }
}
