//! `DeliveryDedup`: the delivery ids the intake accepted within its window, bounded in time
//! and count, checked by every delivery before it is handed over.

use std::{collections::VecDeque, hash::BuildHasher as _, sync::Arc, time::Duration};

use crate::clock::Instant;

/// A delivery id as it is held. GitHub's are GUIDs (lowercase hex, `8-4-4-4-12`): held as their
/// 128 bits, with no allocation and no second cache line to compare; anything else as its text.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Id {
    Guid(u128),
    Text(Arc<str>),
}

impl Id {
    fn of(id: &str) -> Id {
        Self::guid(id.as_bytes()).map_or_else(|| Id::Text(Arc::from(id)), Id::Guid)
    }

    /// The GUID's bits, when `id` is one as GitHub writes it (so the text is got back exactly).
    fn guid(id: &[u8]) -> Option<u128> {
        if id.len() != 36 {
            return None;
        }
        let mut bits: u128 = 0;
        for (i, &b) in id.iter().enumerate() {
            let digit = match b {
                b'-' if matches!(i, 8 | 13 | 18 | 23) => continue,
                b'0'..=b'9' => b - b'0',
                b'a'..=b'f' => b - b'a' + 10,
                _ => return None,
            };
            if matches!(i, 8 | 13 | 18 | 23) {
                return None;
            }
            bits = bits << 4 | u128::from(digit);
        }
        Some(bits)
    }
}

/// Remembers recent delivery ids, bounded in time and count. Pure: `now` is passed in.
///
/// The ids live in a ring, oldest first; the hash table holds only each one's place in it
/// (a `u32`), so the table a delivery probes stays small enough for the core's cache
/// (about 0.6 MB at 65,536 ids) where a map of the ids themselves (3 MB) missed it on
/// almost every probe. An absent id, the common case, is refused by the table's tags
/// alone; the ring is read for a tag that matches, and is otherwise touched only at its ends.
///
/// An id that leaves the ring (the oldest, at the capacity or past the window) leaves its
/// place in the table behind, stale: removing it there was a probe at a random place for
/// every delivery once the set is full. A stale place names nothing (it is before the
/// ring's first). When the table has no room left, it is emptied and the ring's places put
/// back in one pass, before it would grow: the table never holds more room than the live ids
/// need, and the pass costs a hash per id per table's worth of deliveries.
#[derive(Debug)]
pub struct DeliveryDedup {
    window: Duration,
    capacity: usize,
    hasher: foldhash::fast::RandomState,
    /// Places in `ring`, as sequence numbers: `ring[seq - first]` (wrapping); a place before
    /// `first` is stale.
    table: hashbrown::HashTable<u32>,
    ring: VecDeque<(Id, Instant)>,
    /// The sequence number of `ring[0]`.
    first: u32,
}

/// An id looked up and not found: [`DeliveryDedup::insert_absent`] records it without a
/// second look-up (under the same borrow, so nothing came in between).
#[derive(Debug)]
pub struct Absent {
    id: Id,
    hash: u64,
}

impl DeliveryDedup {
    /// Remembers ids for `window`, at most `capacity` of them.
    pub fn new(window: Duration, capacity: usize) -> Self {
        DeliveryDedup {
            window,
            // Stale places must stay far from wrapping round to live ones.
            capacity: capacity.clamp(1, u32::MAX as usize / 8),
            hasher: foldhash::fast::RandomState::default(),
            table: hashbrown::HashTable::new(),
            ring: VecDeque::new(),
            first: 0,
        }
    }

    /// True if `id` was recorded within the window.
    pub fn contains(&mut self, id: &str, now: Instant) -> bool {
        self.probe(id, now).is_none()
    }

    /// `None` if `id` was recorded within the window; else what records it.
    pub fn probe(&mut self, id: &str, now: Instant) -> Option<Absent> {
        self.expire(now);
        let id = Id::of(id);
        let hash = self.hash(&id);
        self.find(hash, &id)
            .is_none()
            .then_some(Absent { id, hash })
    }

    /// Records `id` at `now`; false if it was already recorded within the window.
    pub fn insert(&mut self, id: &str, now: Instant) -> bool {
        match self.probe(id, now) {
            Some(absent) => {
                self.insert_absent(absent, now);
                true
            }
            None => false,
        }
    }

    /// Records an id [`DeliveryDedup::probe`] found absent a moment ago.
    pub fn insert_absent(&mut self, absent: Absent, now: Instant) {
        while self.ring.len() >= self.capacity {
            self.forget_oldest();
        }
        if self.table.len() == self.table.capacity() {
            self.sweep_stale();
        }
        let seq = self.first.wrapping_add(self.ring.len() as u32);
        self.ring.push_back((absent.id, now));
        // Only a table with no room grows and rehashes, and it was swept just before: every
        // place the hasher is asked about is live.
        let (ring, first, hasher) = (&self.ring, self.first, &self.hasher);
        self.table.insert_unique(absent.hash, seq, |&s| {
            hasher.hash_one(&ring[s.wrapping_sub(first) as usize].0)
        });
    }

    /// Ids remembered.
    pub fn len(&self) -> usize {
        self.ring.len()
    }

    /// True when no id is remembered.
    pub fn is_empty(&self) -> bool {
        self.ring.is_empty()
    }

    /// Places the table holds, live and stale (for tests).
    #[cfg(test)]
    fn places(&self) -> usize {
        self.table.len()
    }

    /// How long an id is remembered.
    pub(super) fn window(&self) -> Duration {
        self.window
    }

    /// Remember ids this long from now on.
    pub(super) fn set_window(&mut self, window: Duration) {
        self.window = window;
    }

    fn hash(&self, id: &Id) -> u64 {
        self.hasher.hash_one(id)
    }

    /// Whether place `seq` names an id in the ring.
    fn live(ring: &VecDeque<(Id, Instant)>, first: u32, seq: u32) -> bool {
        (seq.wrapping_sub(first) as usize) < ring.len()
    }

    /// `id`'s sequence number, if it is remembered.
    fn find(&self, hash: u64, id: &Id) -> Option<u32> {
        let (ring, first) = (&self.ring, self.first);
        self.table
            .find(hash, |&s| {
                Self::live(ring, first, s) && ring[s.wrapping_sub(first) as usize].0 == *id
            })
            .copied()
    }

    /// Drops the oldest id from the ring; its place in the table goes stale.
    fn forget_oldest(&mut self) {
        if self.ring.pop_front().is_some() {
            self.first = self.first.wrapping_add(1);
        }
    }

    /// Empties the table (keeping its room) and puts back the places of the ids in the ring:
    /// a pass over the ring, with no tombstones left behind (removing the stale places one
    /// by one would leave tombstones, and a table short of room for them grows).
    fn sweep_stale(&mut self) {
        let (ring, first, hasher, table) = (&self.ring, self.first, &self.hasher, &mut self.table);
        table.clear();
        for (i, (id, _)) in ring.iter().enumerate() {
            table.insert_unique(hasher.hash_one(id), first.wrapping_add(i as u32), |&s| {
                hasher.hash_one(&ring[s.wrapping_sub(first) as usize].0)
            });
        }
    }

    fn expire(&mut self, now: Instant) {
        while let Some((_, at)) = self.ring.front() {
            if now.saturating_duration_since(*at) < self.window {
                break;
            }
            self.forget_oldest();
        }
        // A table that grew for a burst is given back once the ids have gone.
        if self.ring.is_empty() && self.table.capacity() > 1024 {
            self.table = hashbrown::HashTable::new();
            self.ring.shrink_to_fit();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guid_is_held_as_its_bits_and_anything_else_as_its_text() {
        let guid = "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9";
        assert_eq!(
            Id::of(guid),
            Id::Guid(0x0a1b2c3d_4e5f_6071_8293_a4b5c6d7e8f9)
        );
        for other in [
            "0A1B2C3D-4E5F-6071-8293-A4B5C6D7E8F9",
            "0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f",
            "0a1b2c3d4e5f-6071-8293-a4b5c6d7e8f9-",
            "d-1",
        ] {
            assert_eq!(Id::of(other), Id::Text(Arc::from(other)), "{other}");
        }
        let mut d = DeliveryDedup::new(Duration::from_secs(60), 8);
        let now = Instant::now();
        assert!(d.insert(guid, now));
        assert!(d.contains(guid, now));
        assert!(
            !d.contains(&guid.to_uppercase(), now),
            "another id, as text"
        );
    }

    /// The room a table that grew for `n` ids has.
    fn room_for(n: usize) -> usize {
        hashbrown::HashTable::<u32>::with_capacity(n).capacity()
    }

    /// At its capacity every delivery evicts the oldest id: its place goes stale and no
    /// probe removes it, yet the table stays the size the live ids need, through many times
    /// its capacity of deliveries.
    #[test]
    fn a_full_set_keeps_its_table_at_the_room_its_ids_need() {
        let mut d = DeliveryDedup::new(Duration::from_secs(3600), 1000);
        let now = Instant::now();
        for n in 0..100_000u32 {
            assert!(d.insert(&format!("{n:08x}-0000-4000-8000-000000000000"), now));
            assert!(d.table.capacity() <= room_for(1000), "after {n}");
        }
        assert_eq!(d.len(), 1000);
        for n in 99_000..100_000u32 {
            assert!(d.contains(&format!("{n:08x}-0000-4000-8000-000000000000"), now));
        }
        assert!(
            !d.contains("00000000-0000-4000-8000-000000000000", now),
            "evicted"
        );
    }

    /// Against a plain model (a list of ids with their times), over many random operations:
    /// GUIDs and other ids, repeats, the capacity's evictions, the window's expiry, and the
    /// ring's sequence numbers wrapping past `u32::MAX`.
    #[test]
    fn the_ring_and_its_table_agree_with_a_plain_list_through_evictions_and_expiry() {
        use rand::{RngExt as _, SeedableRng as _};
        for seed in 0..20 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let (window, capacity) = (Duration::from_secs(50), 1 + (seed as usize % 7) * 9);
            let mut d = DeliveryDedup::new(window, capacity);
            d.first = u32::MAX - 40;
            let mut model: VecDeque<(String, Instant)> = VecDeque::new();
            let t0 = Instant::now();
            let mut secs = 0;
            for _ in 0..3000 {
                secs += rng.random_range(0..3);
                let now = t0 + Duration::from_secs(secs);
                let n: u32 = rng.random_range(0..120);
                let id = if n.is_multiple_of(2) {
                    format!("{n:08x}-0000-4000-8000-000000000000")
                } else {
                    format!("d-{n}")
                };
                model.retain(|(_, at)| now.saturating_duration_since(*at) < window);
                let known = model.iter().any(|(m, _)| *m == id);
                if rng.random_bool(0.3) {
                    assert_eq!(d.contains(&id, now), known, "seed {seed}: contains {id}");
                } else {
                    assert_eq!(d.insert(&id, now), !known, "seed {seed}: insert {id}");
                    if !known {
                        while model.len() >= capacity {
                            model.pop_front();
                        }
                        model.push_back((id, now));
                    }
                }
                assert_eq!(d.len(), model.len(), "seed {seed}");
                // Stale places are swept before the table would grow: it never holds more
                // room than the live ids need.
                assert!(
                    d.places() >= d.len(),
                    "seed {seed}: a live id without a place"
                );
                assert!(
                    d.table.capacity() <= room_for(capacity),
                    "seed {seed}: the table grew past the room for {capacity} ids: {}",
                    d.table.capacity()
                );
            }
        }
    }
}
