//! `RetryQueue`: the jobs on the claim retry ladder, as a min-heap by next attempt with an
//! index by job. Pure: time is passed in.
//!
//! An item keeps its identity across fires: [`RetryQueue::pop_due`] takes it out of the heap
//! but leaves it indexed ("in flight") until its attempt resolves. A failure finds the same item,
//! so `attempts` grows and `first_failure` is kept (the original's first ladder bug reset both);
//! a success or an abandon removes it; a retry that fails again is scheduled again (the
//! original's second bug dropped it). Stale heap entries are skipped lazily.

use std::{
    cmp::Reverse,
    collections::{BinaryHeap, HashMap},
    time::Duration,
};

use crate::clock::Instant;
use rand::Rng;
use serde::Serialize;

use super::backoff::{Backoff, DelayReason};
use crate::{
    durable::RetryRow,
    job::{JobInfo, JobKey},
    vocab::{ErrorClass, RateSnapshot},
};

/// No retry waits longer than this, whatever the config or an answer says: a bound that keeps
/// every time sum far from overflowing.
pub const MAX_WAIT: Duration = Duration::from_secs(30 * 24 * 3600);

/// One failed claim, as the ladder needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// The failure's class.
    pub class: ErrorClass,
    /// `Retry-After` of the failed answer.
    pub retry_after: Option<Duration>,
    /// The rate-limit bucket the failed call spent (its reading decides a rate snap).
    pub bucket: Option<crate::vocab::RateBucket>,
    /// The failed answer's own reading of that bucket, when it carried one: it decides the
    /// delay before any other reading.
    pub reading: Option<RateSnapshot>,
    /// What went wrong, for the timeline (never a secret).
    pub message: String,
}

/// A job on the ladder (the job itself is the caller's: the ladder keeps its key alone).
#[derive(Debug, Clone)]
pub struct RetryItem {
    /// Failures so far.
    pub attempts: u32,
    /// When the first failure happened (the `max_age` clock).
    pub first_failure: Instant,
    /// When the next attempt is due; `None` while an attempt is in flight.
    pub next_attempt: Option<Instant>,
    /// Class of the latest failure (each failure's own class decides its delay).
    pub class: ErrorClass,
    /// The latest failure's message.
    pub last_error: String,
    /// Why the latest delay was chosen.
    pub reason: DelayReason,
    seq: u64,
}

/// What became of a failure.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scheduled {
    /// Another attempt is due at `at`.
    Retry {
        /// Due time.
        at: Instant,
        /// Delay from now.
        delay: Duration,
        /// Failures so far.
        attempts: u32,
        /// Why this delay.
        reason: DelayReason,
        /// This failure's class.
        class: ErrorClass,
    },
    /// The first failure is older than `max_age`: dropped.
    GaveUp {
        /// Failures in all.
        attempts: u32,
        /// Age of the first failure.
        age: Duration,
        /// The last failure's class.
        class: ErrorClass,
    },
    /// The failure cannot be helped by retrying: dropped.
    NotRetryable {
        /// Its class.
        class: ErrorClass,
    },
}

/// The ladder's queue.
#[derive(Debug)]
pub struct RetryQueue {
    backoff: Backoff,
    items: HashMap<JobKey, RetryItem>,
    heap: BinaryHeap<Reverse<(Instant, u64, JobKey)>>,
    seq: u64,
    waiting: usize,
}

/// A point-in-time view of one item, for status pages.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct RetryView {
    /// Job.
    pub key: JobKey,
    /// Failures so far.
    pub attempts: u32,
    /// Class of the latest failure.
    pub class: ErrorClass,
    /// Seconds until the next attempt (`None` while in flight).
    pub next_attempt_in_secs: Option<f64>,
    /// Seconds since the first failure.
    pub first_failure_secs_ago: f64,
    /// Latest failure.
    pub last_error: String,
    /// Why the latest delay.
    pub reason: DelayReason,
}

impl RetryQueue {
    /// An empty queue climbing `backoff`.
    pub fn new(backoff: Backoff) -> Self {
        RetryQueue {
            backoff,
            items: HashMap::new(),
            heap: BinaryHeap::new(),
            seq: 0,
            waiting: 0,
        }
    }

    /// Records a failed claim of job `key` and decides its next attempt.
    pub fn record_failure(
        &mut self,
        key: &JobKey,
        failure: &Failure,
        now: Instant,
        now_unix: u64,
        rate: Option<&RateSnapshot>,
        rng: &mut impl Rng,
    ) -> Scheduled {
        let key = key.clone();
        if !failure.class.is_retryable() {
            self.remove(&key);
            return Scheduled::NotRetryable {
                class: failure.class,
            };
        }
        let item = self.items.entry(key.clone()).or_insert_with(|| RetryItem {
            attempts: 0,
            first_failure: now,
            next_attempt: None,
            class: failure.class,
            last_error: String::new(),
            reason: DelayReason::Ladder { rung: 0 },
            seq: 0,
        });
        item.attempts += 1;
        item.class = failure.class;
        item.last_error = failure.message.clone();
        let (attempts, class, first_failure) = (item.attempts, item.class, item.first_failure);
        let age = now.saturating_duration_since(first_failure);
        let max_age = self.backoff.max_age();
        if age > max_age {
            self.remove(&key);
            return Scheduled::GaveUp {
                attempts,
                age,
                class,
            };
        }
        // This failure's class and its bucket's reading decide (a 502 after a rate limit climbs
        // the plain ladder; a rate limit after a 502 snaps to the reset). The attempt after it
        // never lands past `first_failure + max_age` by more than one rung.
        let (delay, reason) =
            self.backoff
                .delay(attempts, class, failure.retry_after, rate, now_unix, rng);
        let latest = (max_age - age).saturating_add(self.backoff.rung(attempts));
        let delay = delay.min(latest).min(MAX_WAIT);
        let at = now + delay;
        self.seq += 1;
        let seq = self.seq;
        let item = self
            .items
            .get_mut(&key)
            .unwrap_or_else(|| unreachable!("inserted above"));
        if item.next_attempt.is_none() {
            self.waiting += 1;
        }
        item.next_attempt = Some(at);
        item.reason = reason;
        item.seq = seq;
        self.heap.push(Reverse((at, seq, key)));
        Scheduled::Retry {
            at,
            delay,
            attempts,
            reason,
            class,
        }
    }

    /// The jobs with an item, in no order.
    pub fn keys(&self) -> impl Iterator<Item = &JobKey> {
        self.items.keys()
    }

    /// Keeps `key`'s item (its attempts and first failure) but takes it off the timer: its job
    /// has an attempt in flight (a claimed runner), which either starts the job or fails again.
    pub fn hold(&mut self, key: &JobKey) {
        if let Some(item) = self.items.get_mut(key)
            && item.next_attempt.take().is_some()
        {
            self.waiting -= 1;
        }
    }

    /// Puts back the ladder a previous run left, with its original times.
    pub fn restore(&mut self, rows: &[RetryRow], now: Instant, now_unix: u64) {
        for r in rows {
            let first_failure = now
                .checked_sub(Duration::from_secs(
                    now_unix.saturating_sub(r.first_failure_unix),
                ))
                .unwrap_or(now);
            let wait = Duration::from_secs(r.next_attempt_unix.saturating_sub(now_unix));
            let at = now + wait.min(MAX_WAIT);
            self.seq += 1;
            self.items.insert(
                r.job.key.clone(),
                RetryItem {
                    attempts: r.attempts,
                    first_failure,
                    next_attempt: Some(at),
                    class: r.class,
                    last_error: r.last_error.clone(),
                    reason: DelayReason::Ladder { rung: 0 },
                    seq: self.seq,
                },
            );
            self.waiting += 1;
            self.heap.push(Reverse((at, self.seq, r.job.key.clone())));
        }
    }

    /// The durable form of `job`'s item.
    pub fn row(&self, job: &JobInfo, now: Instant, now_unix: u64) -> Option<RetryRow> {
        let i = self.items.get(&job.key)?;
        let unix = |t: Instant| {
            if t >= now {
                now_unix.saturating_add(t.duration_since(now).as_secs())
            } else {
                now_unix.saturating_sub(now.duration_since(t).as_secs())
            }
        };
        Some(RetryRow {
            job: job.clone(),
            attempts: i.attempts,
            first_failure_unix: unix(i.first_failure),
            next_attempt_unix: i.next_attempt.map_or(now_unix, unix),
            class: i.class,
            last_error: i.last_error.clone(),
        })
    }

    /// Takes every item due at `now` out of the heap; they stay indexed, in flight, until
    /// [`RetryQueue::remove`] (success, abandon) or another `record_failure`.
    pub fn pop_due(&mut self, now: Instant) -> Vec<(JobKey, u32)> {
        let mut due = Vec::new();
        while let Some(Reverse((at, _, _))) = self.heap.peek() {
            if *at > now {
                break;
            }
            let Some(Reverse((at, seq, key))) = self.heap.pop() else {
                break;
            };
            if let Some(item) = self.items.get_mut(&key)
                && item.seq == seq
                && item.next_attempt == Some(at)
            {
                item.next_attempt = None;
                self.waiting -= 1;
                due.push((key, item.attempts));
            }
        }
        due
    }

    /// The earliest due time among waiting items.
    pub fn next_due(&mut self) -> Option<Instant> {
        while let Some(Reverse((at, seq, key))) = self.heap.peek() {
            let live = self
                .items
                .get(key)
                .is_some_and(|i| i.seq == *seq && i.next_attempt == Some(*at));
            if live {
                return Some(*at);
            }
            self.heap.pop();
        }
        None
    }

    /// Drops `key` (success, picked up elsewhere, cancelled), handing back its item.
    pub fn remove(&mut self, key: &JobKey) -> Option<RetryItem> {
        let item = self.items.remove(key)?;
        if item.next_attempt.is_some() {
            self.waiting -= 1;
        }
        Some(item)
    }

    /// The item for `key`, waiting or in flight.
    pub fn get(&self, key: &JobKey) -> Option<&RetryItem> {
        self.items.get(key)
    }

    /// Entries held: every item (waiting or in flight) and the due-time heap (which may hold
    /// entries of items since rescheduled, until they reach its top).
    pub fn census(&self) -> [(&'static str, usize); 2] {
        [
            ("ladder.items", self.items.len()),
            ("ladder.heap", self.heap.len()),
        ]
    }

    /// Items waiting for their next attempt (in-flight ones are not counted).
    pub fn len(&self) -> usize {
        self.waiting
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.waiting == 0
    }

    /// Every item, waiting or in flight.
    pub fn views(&self, now: Instant) -> Vec<RetryView> {
        let mut v: Vec<RetryView> = self
            .items
            .iter()
            .map(|(key, i)| RetryView {
                key: key.clone(),
                attempts: i.attempts,
                class: i.class,
                next_attempt_in_secs: i
                    .next_attempt
                    .map(|at| at.saturating_duration_since(now).as_secs_f64()),
                first_failure_secs_ago: now
                    .saturating_duration_since(i.first_failure)
                    .as_secs_f64(),
                last_error: i.last_error.clone(),
                reason: i.reason,
            })
            .collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }
}

#[cfg(test)]
mod tests {
    use rand::{SeedableRng, rngs::SmallRng};

    use super::*;
    use crate::config::ClaimRetryConfig;

    fn queue(schedule: &[u64], max_age: u64) -> RetryQueue {
        RetryQueue::new(
            Backoff::try_new(&ClaimRetryConfig {
                schedule: schedule.iter().map(|s| Duration::from_secs(*s)).collect(),
                jitter: 0.0,
                max_age: Duration::from_secs(max_age),
                ..ClaimRetryConfig::default()
            })
            .unwrap(),
        )
    }

    fn job(id: u64) -> JobInfo {
        crate::scheduler::fixtures::job(id, &["self-hosted"])
    }

    /// Job `id`'s claim failed with `class` at `at` (no rate reading).
    fn failed(
        q: &mut RetryQueue,
        id: u64,
        class: ErrorClass,
        at: Instant,
        rng: &mut SmallRng,
    ) -> Scheduled {
        q.record_failure(&job(id).key, &fail(class), at, 0, None, rng)
    }

    fn fail(class: ErrorClass) -> Failure {
        Failure {
            class,
            retry_after: None,
            bucket: None,
            reading: None,
            message: "boom".into(),
        }
    }

    /// The seed's ladder regression, driven through pop (fire) and re-record (handler fails):
    /// delays grow 30s, 1m, 2m, 2m; first_failure is kept; the item is dropped at max_age.
    #[test]
    fn ladder_advances_through_the_fire_path() {
        let mut q = queue(&[30, 60, 120], 300);
        let mut rng = SmallRng::seed_from_u64(0);
        let t0 = Instant::now();
        let mut now = t0;
        let mut delays = Vec::new();
        let mut outcome = failed(&mut q, 1, ErrorClass::ServerSide, now, &mut rng);
        // Bounded: a queue that forgot items on fire would retry every 30 s forever.
        for _ in 0..10 {
            let Scheduled::Retry { at, delay, .. } = outcome else {
                break;
            };
            delays.push(delay.as_secs());
            now = at;
            let due = q.pop_due(now);
            assert_eq!(due.len(), 1);
            assert_eq!(
                q.get(&job(1).key).unwrap().first_failure,
                t0,
                "first failure kept"
            );
            outcome = q.record_failure(
                &due[0].0,
                &fail(ErrorClass::ServerSide),
                now,
                0,
                None,
                &mut rng,
            );
        }
        assert_eq!(delays, vec![30, 60, 120, 120]);
        assert!(
            matches!(outcome, Scheduled::GaveUp { attempts: 5, .. }),
            "{outcome:?}"
        );
        assert!(q.get(&job(1).key).is_none());
        assert!(q.is_empty());
    }

    #[test]
    fn success_drops_and_a_repeated_failure_stays() {
        let mut q = queue(&[30], 5400);
        let mut rng = SmallRng::seed_from_u64(0);
        let now = Instant::now();
        failed(&mut q, 1, ErrorClass::Network, now, &mut rng);
        failed(&mut q, 2, ErrorClass::Network, now, &mut rng);
        let due = q.pop_due(now + Duration::from_secs(30));
        assert_eq!(due.len(), 2);
        assert_eq!(q.len(), 0, "in flight items are not waiting");
        assert!(q.remove(&job(1).key).is_some(), "success drops");
        let again = failed(
            &mut q,
            2,
            ErrorClass::Network,
            now + Duration::from_secs(30),
            &mut rng,
        );
        assert!(matches!(again, Scheduled::Retry { attempts: 2, .. }));
        assert_eq!(q.len(), 1, "a retry that fails again stays enqueued");
        assert_eq!(q.next_due(), Some(now + Duration::from_secs(60)));
    }

    #[test]
    fn non_retryable_is_not_enqueued_and_each_failure_keeps_its_own_class() {
        let mut q = queue(&[30], 5400);
        let mut rng = SmallRng::seed_from_u64(0);
        let now = Instant::now();
        assert_eq!(
            q.record_failure(
                &job(1).key,
                &fail(ErrorClass::NonRetryable),
                now,
                0,
                None,
                &mut rng
            ),
            Scheduled::NotRetryable {
                class: ErrorClass::NonRetryable
            }
        );
        assert!(q.is_empty());
        failed(&mut q, 2, ErrorClass::RateLimit, now, &mut rng);
        q.pop_due(now + Duration::from_secs(30));
        let out = failed(&mut q, 2, ErrorClass::ServerSide, now, &mut rng);
        assert!(matches!(
            out,
            Scheduled::Retry {
                class: ErrorClass::ServerSide,
                attempts: 2,
                ..
            }
        ));
        assert_eq!(q.get(&job(2).key).unwrap().class, ErrorClass::ServerSide);
    }

    #[test]
    fn a_dropped_item_leaves_only_a_stale_heap_entry() {
        let mut q = queue(&[30], 5400);
        let mut rng = SmallRng::seed_from_u64(0);
        let now = Instant::now();
        failed(&mut q, 1, ErrorClass::Network, now, &mut rng);
        failed(
            &mut q,
            2,
            ErrorClass::Network,
            now + Duration::from_secs(5),
            &mut rng,
        );
        assert!(q.remove(&job(1).key).is_some());
        assert_eq!(q.next_due(), Some(now + Duration::from_secs(35)));
        assert_eq!(q.pop_due(now + Duration::from_secs(31)).len(), 0);
        assert_eq!(q.len(), 1);
    }

    /// A rate limit, then a 502 while a reading proves the budget empty: the 502 takes the
    /// next plain rung (its own class decides), not the reset.
    #[test]
    fn a_502_after_a_rate_limit_takes_the_next_rung() {
        let mut q = queue(&[30, 60, 120], 5400);
        let mut rng = SmallRng::seed_from_u64(0);
        let (now, unix) = (Instant::now(), 1_800_000_000);
        q.record_failure(
            &job(1).key,
            &fail(ErrorClass::RateLimit),
            now,
            unix,
            None,
            &mut rng,
        );
        let later = now + Duration::from_secs(30);
        q.pop_due(later);
        let empty = RateSnapshot {
            remaining: Some(0),
            reset: Some(unix + 3600),
            updated: unix + 30,
            ..RateSnapshot::default()
        };
        let out = q.record_failure(
            &job(1).key,
            &fail(ErrorClass::ServerSide),
            later,
            unix + 30,
            Some(&empty),
            &mut rng,
        );
        assert!(
            matches!(out, Scheduled::Retry { delay, attempts: 2, .. } if delay == Duration::from_secs(60)),
            "{out:?}"
        );
    }

    proptest::proptest! {
        /// Whatever the answers say (any class, any `Retry-After`, any reset, jitter), nothing
        /// panics and no attempt is parked past `first_failure + max_age` by more than a rung.
        #[test]
        fn no_answer_parks_a_job_past_max_age_by_more_than_a_rung(
            steps in proptest::collection::vec(
                (0usize..4, proptest::option::of(proptest::num::u64::ANY), proptest::num::u64::ANY, 0u64..900),
                1..16,
            ),
            jitter in 0.0f64..=1.0,
        ) {
            let backoff = Backoff::try_new(&ClaimRetryConfig { jitter, ..ClaimRetryConfig::default() }).unwrap();
            let mut q = RetryQueue::new(backoff.clone());
            let mut rng = SmallRng::seed_from_u64(1);
            let classes = [
                ErrorClass::RateLimit,
                ErrorClass::ServerSide,
                ErrorClass::Network,
                ErrorClass::UnknownRetryable,
            ];
            let (t0, unix0) = (Instant::now(), 1_800_000_000u64);
            let mut now = t0;
            for (class, after, reset, late) in steps {
                let now_unix = unix0 + now.duration_since(t0).as_secs();
                let reading = RateSnapshot {
                    remaining: Some(0),
                    reset: Some(reset),
                    updated: now_unix,
                    ..RateSnapshot::default()
                };
                let failure = Failure {
                    class: classes[class],
                    retry_after: after.map(Duration::from_secs),
                    bucket: None,
                    reading: None,
                    message: "x".into(),
                };
                match q.record_failure(&job(1).key, &failure, now, now_unix, Some(&reading), &mut rng) {
                    Scheduled::Retry { at, attempts, .. } => {
                        let first = q.get(&job(1).key).unwrap().first_failure;
                        proptest::prop_assert!(
                            at <= first + backoff.max_age() + backoff.rung(attempts),
                            "attempt {attempts} parked {:?} after the first failure",
                            at.duration_since(first)
                        );
                        now = at + Duration::from_secs(late);
                        q.pop_due(now);
                    }
                    Scheduled::GaveUp { age, .. } => {
                        proptest::prop_assert!(age > backoff.max_age());
                        break;
                    }
                    Scheduled::NotRetryable { .. } => proptest::prop_assert!(false),
                }
            }
        }
    }
}
