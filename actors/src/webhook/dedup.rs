//! `DeliveryDedup`: the delivery ids the intake accepted within its window, bounded in time
//! and count, checked by every delivery before it is handed over.

use std::{collections::HashMap, collections::VecDeque, sync::Arc, time::Duration};

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
#[derive(Debug)]
pub struct DeliveryDedup {
    window: Duration,
    capacity: usize,
    seen: HashMap<Id, Instant, foldhash::fast::RandomState>,
    order: VecDeque<(Instant, Id)>,
}

impl DeliveryDedup {
    /// Remembers ids for `window`, at most `capacity` of them.
    pub fn new(window: Duration, capacity: usize) -> Self {
        DeliveryDedup {
            window,
            capacity,
            seen: HashMap::default(),
            order: VecDeque::new(),
        }
    }

    /// True if `id` was recorded within the window.
    pub fn contains(&mut self, id: &str, now: Instant) -> bool {
        self.expire(now);
        self.seen.contains_key(&Id::of(id))
    }

    /// Records `id`. Returns false if it was already there.
    pub fn insert(&mut self, id: &str, now: Instant) -> bool {
        self.expire(now);
        let id = Id::of(id);
        if self.seen.contains_key(&id) {
            return false;
        }
        while self.seen.len() >= self.capacity {
            match self.order.pop_front() {
                Some((_, old)) => {
                    self.seen.remove(&old);
                }
                None => break,
            }
        }
        self.seen.insert(id.clone(), now);
        self.order.push_back((now, id));
        true
    }

    /// Ids remembered now.
    pub fn len(&self) -> usize {
        self.seen.len()
    }

    /// True when nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }

    /// How long ids are remembered.
    pub(super) fn window(&self) -> Duration {
        self.window
    }

    /// Remembers ids for `window` from now on.
    pub(super) fn set_window(&mut self, window: Duration) {
        self.window = window;
    }

    fn expire(&mut self, now: Instant) {
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) < self.window {
                break;
            }
            if let Some((at, id)) = self.order.pop_front()
                && self.seen.get(&id) == Some(&at)
            {
                self.seen.remove(&id);
            }
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
}
