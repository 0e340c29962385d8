//! The job table's own rules (the timeline's cap, which jobs wait, which records are
//! forgotten), a test per refused transition, and a property test that drives the whole core
//! through random events and checks every record's history is a path of the state diagram.

use std::collections::HashSet;

use proptest::prelude::*;

use super::*;
use crate::scheduler::core::{
    driver::Driver,
    tests::{at, core},
};

fn key(id: u64) -> JobKey {
    JobKey::new("acme", id)
}

fn record(id: u64, phase: Phase, at: Instant) -> Box<JobRecord> {
    let info = JobInfo {
        key: key(id),
        ..JobInfo::default()
    };
    JobRecord::in_phase(info, phase, at)
}

/// Jobs 1-4 pending, retrying, seen and done; job 1 arrived last.
fn table(now: Instant) -> JobTable {
    let mut t = JobTable::default();
    for (id, phase) in [
        (1, Phase::Pending),
        (2, Phase::Retrying),
        (3, Phase::Seen),
        (4, Phase::Done),
    ] {
        t.insert(
            key(id),
            record(id, phase, now + Duration::from_secs(10 - id)),
        );
    }
    t
}

fn active(runner: &str) -> Phase {
    Phase::Active {
        provider: PoolName::from("local"),
        runner: Arc::from(runner),
    }
}

fn parked() -> Phase {
    Phase::Parked {
        reason: ParkReason::Zombie,
        look_unix: 0,
    }
}

#[test]
fn a_timeline_keeps_its_first_note_and_the_latest_at_the_cap() {
    let t0 = Instant::now();
    let mut t = table(t0);
    for i in 0..(TIMELINE_CAP as u64 + 5) {
        let now = Now::whole_seconds(t0, 1_000 + i);
        t.note(&key(1), now, Note::RetryDue { attempt: 1 });
    }
    let timeline = t.get(&key(1)).unwrap().timeline();
    assert_eq!(timeline.len(), TIMELINE_CAP);
    assert_eq!(timeline[0].at(), 1_000, "the first note stays");
    assert_eq!(
        timeline.last().unwrap().at(),
        1_000 + TIMELINE_CAP as u64 + 4
    );
    assert_eq!(t.notes_taken(), TIMELINE_CAP as u64 + 5);
}

#[test]
fn a_job_needs_a_runner_while_pending_or_retrying_and_never_started() {
    let t0 = Instant::now();
    let mut t = table(t0);
    assert!(t.needs_runner(&key(1)) && t.needs_runner(&key(2)));
    assert!(!t.needs_runner(&key(3)), "at rest");
    assert!(t.started(&key(2), t0), "the first start is news");
    assert!(!t.started(&key(2), t0), "a second one is not");
    assert!(!t.needs_runner(&key(2)), "started elsewhere");
}

#[test]
fn only_records_at_rest_past_their_windows_and_unreferenced_are_forgotten() {
    let t0 = Instant::now();
    let mut t = table(t0);
    let later = Now::whole_seconds(t0 + Duration::from_secs(700), 0);
    let done = key(4);
    let referenced: HashSet<&JobKey> = [&done].into_iter().collect();
    let d = Duration::from_secs(600);
    let ttl = Ttl {
        seen: d,
        started: d,
        done: d,
    };
    let gone = t.prune(later, ttl, &referenced);
    assert_eq!(
        gone,
        vec![key(3)],
        "pending, retrying and a runner's job stay"
    );
    t.seen_now(&done, later.mono);
    assert!(
        t.prune(later, ttl, &HashSet::new()).is_empty(),
        "seen a moment ago"
    );
}

#[test]
fn a_finished_job_is_kept_for_its_retention_and_a_started_one_at_rest_for_longer() {
    let t0 = Instant::now();
    let mut t = table(t0);
    t.started(&key(3), t0);
    t.started(&key(4), t0);
    let ttl = Ttl {
        seen: Duration::from_secs(60),
        started: Duration::from_secs(7200),
        done: Duration::from_secs(120),
    };
    let at = |secs| Now::whole_seconds(t0 + Duration::from_secs(secs), 0);
    assert!(t.prune(at(119), ttl, &HashSet::new()).is_empty());
    assert_eq!(t.prune(at(120), ttl, &HashSet::new()), vec![key(4)]);
    assert_eq!(t.prune(at(7200), ttl, &HashSet::new()), vec![key(3)]);
}

#[test]
fn a_restored_record_is_done_when_it_was_seen_started_and_says_it_was_restored() {
    let t0 = Instant::now();
    let now = at(t0, 100);
    let held = JobRecord::restored(JobInfo::default(), t0, None, now);
    assert_eq!(*held.phase(), Phase::Seen);
    assert_eq!(held.seen_at(), Some(now.mono));
    let ran = JobRecord::restored(JobInfo::default(), t0, Some(t0), now);
    assert_eq!(*ran.phase(), Phase::Done);
    assert_eq!(
        ran.seen_at(),
        Some(t0),
        "its windows run from what happened"
    );
    assert!(matches!(ran.timeline()[0].note, Note::Restored));
}

#[test]
fn a_new_account_keeps_the_sender_an_earlier_one_named() {
    let t0 = Instant::now();
    let mut t = table(t0);
    let with_sender = JobInfo {
        key: key(3),
        about: Some(Arc::new(crate::job::JobAbout {
            sender: "octocat".into(),
            ..Default::default()
        })),
        ..JobInfo::default()
    };
    t.learn(with_sender, t0).unwrap();
    let without = JobInfo {
        key: key(3),
        about: Some(Arc::new(crate::job::JobAbout::default())),
        ..JobInfo::default()
    };
    t.learn(without, t0).unwrap();
    let about = t.get(&key(3)).unwrap().info().about.clone().unwrap();
    assert_eq!(about.sender, "octocat");
    assert_eq!(t.learn(JobInfo::default(), t0), Err(Refused::Unknown));
}

/// The table refuses `to` from `from`, leaves the record as it was, and counts it.
fn refuses(from: Phase, to: impl FnOnce(&mut JobTable, &JobKey) -> Result<(), Refused>) {
    let mut t = JobTable::default();
    t.insert(key(9), record(9, from.clone(), Instant::now()));
    let answer = to(&mut t, &key(9));
    assert!(
        matches!(answer, Err(Refused::Edge { from: f, .. }) if f == from.name()),
        "from {}: {answer:?}",
        from.name()
    );
    assert_eq!(*t.get(&key(9)).unwrap().phase(), from, "left as it was");
    assert_eq!(t.refused(), 1);
}

#[test]
fn a_done_job_never_moves_again() {
    refuses(Phase::Done, |t, k| t.admit(k));
    refuses(Phase::Done, |t, k| t.retry(k));
    refuses(Phase::Done, |t, k| t.rest(k, Rest::Seen));
    refuses(Phase::Done, |t, k| t.park(k, ParkReason::GaveUp, 1));
    refuses(Phase::Done, |t, k| t.ignore(k));
    refuses(Phase::Done, |t, k| t.claimed(k, "local".into(), "r".into()));
}

#[test]
fn a_claim_starts_only_from_pending() {
    for from in [
        Phase::Seen,
        Phase::Retrying,
        parked(),
        Phase::Unroutable,
        Phase::Ignored,
        active("r"),
        Phase::Claiming {
            provider: "local".into(),
        },
    ] {
        refuses(from, |t, k| t.claim(k, "local".into()));
    }
}

#[test]
fn a_runner_is_never_bound_to_a_parked_uncovered_or_ignored_job() {
    for from in [parked(), Phase::Unroutable, Phase::Ignored] {
        refuses(from, |t, k| t.claimed(k, "local".into(), "r".into()));
    }
}

#[test]
fn a_job_with_something_in_flight_stops_before_it_is_found_uncovered_or_out_of_scope() {
    let claiming = || Phase::Claiming {
        provider: "local".into(),
    };
    refuses(claiming(), |t, k| t.ignore(k));
    refuses(claiming(), |t, k| t.rest(k, Rest::Unroutable));
    refuses(active("r"), |t, k| t.ignore(k));
    refuses(active("r"), |t, k| t.rest(k, Rest::Unroutable));
}

#[test]
fn only_a_parked_job_has_its_look_moved() {
    refuses(Phase::Pending, |t, k| t.look_later(k, 5));
    let mut t = JobTable::default();
    t.insert(key(9), record(9, parked(), Instant::now()));
    t.look_later(&key(9), 5).unwrap();
    assert!(matches!(
        t.get(&key(9)).unwrap().phase(),
        Phase::Parked { look_unix: 5, .. }
    ));
}

#[test]
fn a_gone_runner_moves_only_the_job_it_is_active_on() {
    let mut t = JobTable::default();
    t.insert(key(1), record(1, active("r1"), Instant::now()));
    assert!(!t.runner_gone(&key(1), "r2"), "another runner");
    assert!(t.runner_gone(&key(1), "r1"));
    assert_eq!(*t.get(&key(1)).unwrap().phase(), Phase::Seen);
    t.insert(key(2), record(2, active("r2"), Instant::now()));
    t.started(&key(2), Instant::now());
    assert!(t.runner_gone(&key(2), "r2"));
    assert_eq!(*t.get(&key(2)).unwrap().phase(), Phase::Done, "it ran");
}

#[test]
fn a_transition_of_an_unknown_job_is_no_edge_refused() {
    let mut t = JobTable::default();
    assert_eq!(t.admit(&key(1)), Err(Refused::Unknown));
    assert_eq!(t.refused(), 0);
}

/// The edges ARCHITECTURE.md draws ("A job's life"), written out by name: the property test
/// checks the core's moves against this list, not against [`edge`] itself.
const DIAGRAM: &[(&str, &str)] = &[
    ("new", "seen ignored done"),
    (
        "seen",
        "pending active retrying parked seen unroutable ignored done",
    ),
    (
        "unroutable",
        "pending retrying parked seen unroutable ignored done",
    ),
    (
        "ignored",
        "pending retrying parked seen unroutable ignored done",
    ),
    (
        "pending",
        "claiming active pending retrying parked seen unroutable ignored done",
    ),
    ("claiming", "active pending retrying parked seen done"),
    (
        "retrying",
        "pending active retrying parked seen unroutable ignored done",
    ),
    ("active", "active pending retrying parked seen done"),
    (
        "parked",
        "pending retrying parked seen unroutable ignored done",
    ),
    ("done", "done"),
];

fn in_diagram(from: &str, to: &str) -> bool {
    DIAGRAM
        .iter()
        .any(|(f, tos)| *f == from && tos.split_whitespace().any(|t| t == to))
}

#[test]
fn the_written_diagram_is_the_tables_edge_rule() {
    let provider = || PoolName::from("local");
    let phases = [
        Phase::Seen,
        Phase::Unroutable,
        Phase::Ignored,
        Phase::Pending,
        Phase::Claiming {
            provider: provider(),
        },
        Phase::Retrying,
        active("r"),
        Phase::Done,
        parked(),
    ];
    for from in &phases {
        for to in &phases {
            assert_eq!(
                edge(from, to),
                in_diagram(from.name(), to.name()),
                "{} to {}",
                from.name(),
                to.name()
            );
        }
    }
}

/// One thing that happens to the core.
#[derive(Debug, Clone)]
enum Step {
    Queued(u64),
    InProgress(u64),
    Completed(u64),
    /// The runner made for the job exits with this code.
    Exited(u64, i32),
    /// The next claim fails with this status.
    ClaimFails(u16),
    Advance(u64),
    Cordon(bool),
    Reconcile(Vec<u64>),
    Looked(u64, &'static str),
}

fn step() -> impl Strategy<Value = Step> {
    let id = 1u64..6;
    prop_oneof![
        4 => id.clone().prop_map(Step::Queued),
        2 => id.clone().prop_map(Step::InProgress),
        2 => id.clone().prop_map(Step::Completed),
        2 => (id.clone(), prop_oneof![Just(0), Just(1), Just(7)]).prop_map(|(i, c)| Step::Exited(i, c)),
        1 => prop_oneof![Just(500u16), Just(422), Just(403)].prop_map(Step::ClaimFails),
        3 => (1u64..900).prop_map(Step::Advance),
        1 => any::<bool>().prop_map(Step::Cordon),
        1 => proptest::collection::vec(id.clone(), 0..4).prop_map(Step::Reconcile),
        1 => (id, prop_oneof![Just("queued"), Just("in_progress"), Just("completed")])
            .prop_map(|(i, s)| Step::Looked(i, s)),
    ]
}

const LABELS: &[&str] = &["self-hosted", "linux", "x64"];

fn run(d: &mut Driver, s: &Step) {
    use crate::job::JobAction;
    let with_runner = |d: &Driver, id: u64| {
        let mut job = crate::scheduler::fixtures::job(id, LABELS);
        if let Some(r) = d.s.view().runners().find(|r| r.intent.job_id == id) {
            job.runner_name = Some(r.name.clone());
            job.runner_id = Some(r.id);
        }
        job
    };
    match s {
        Step::Queued(id) => d.queued(*id, LABELS),
        Step::InProgress(id) => {
            let job = with_runner(d, *id);
            d.send(JobAction::InProgress, job);
        }
        Step::Completed(id) => {
            let mut job = with_runner(d, *id);
            job.conclusion = Some("success".into());
            d.send(JobAction::Completed, job);
        }
        Step::Exited(id, code) => {
            let name =
                d.s.view()
                    .runners()
                    .find(|r| r.intent.job_id == *id)
                    .map(|r| r.name.clone());
            if let Some(name) = name {
                d.exited(&name, *code);
            }
        }
        Step::ClaimFails(status) => d
            .script
            .push_back(crate::scheduler::fixtures::http(*status, None, None)),
        Step::Advance(secs) => d.advance(*secs),
        Step::Cordon(on) => d.cordon(*on),
        Step::Reconcile(ids) => {
            let queued = ids
                .iter()
                .map(|id| crate::scheduler::fixtures::job(*id, LABELS))
                .collect();
            d.reconcile(queued);
        }
        Step::Looked(id, status) => {
            if d.s.view().job(&key(*id)).is_some() {
                d.looked(*id, status);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Whatever happens, in whatever order, the core asks the table for no move the diagram
    /// does not have, and each record's history is one path through it from its making.
    #[test]
    fn every_history_is_a_path_of_the_diagram(steps in proptest::collection::vec(step(), 1..60)) {
        let mut d = Driver::new();
        for s in &steps {
            run(&mut d, s);
        }
        let table = &d.s.state.jobs;
        prop_assert_eq!(table.refused(), 0, "a refused move");
        let mut at: std::collections::HashMap<u64, &str> = Default::default();
        for (id, from, to) in table.moves() {
            if *from != "new" {
                // (A record made again after it was forgotten starts a new path.)
                prop_assert_eq!(at.get(id).copied(), Some(*from), "job {}: a move from {} it was not in", id, from);
            }
            prop_assert!(in_diagram(from, to), "job {}: {} to {} is no edge", id, from, to);
            at.insert(*id, to);
        }
        for (k, rec) in table.iter() {
            prop_assert_eq!(at.get(&k.job_id).copied(), Some(rec.phase().name()), "job {}'s history ends where it is", k.job_id);
            if let Phase::Active { runner, .. } = rec.phase() {
                prop_assert!(d.has_runner(runner), "job {} is active on runner {} the book does not hold", k.job_id, runner);
            }
            if let Phase::Claiming { .. } = rec.phase() {
                prop_assert!(d.s.state.capacity.claiming().contains_key(k), "job {} is claiming with no claim in flight", k.job_id);
            }
            if *rec.phase() == Phase::Pending {
                prop_assert!(
                    d.s.state.admission.pending().iter().any(|p| p == k),
                    "job {} is pending in no queue", k.job_id
                );
            }
        }
    }
}

#[test]
fn the_driver_reaches_every_phase_but_the_out_of_scope_ones() {
    // The property test above is only as good as the phases its steps reach.
    let mut seen: HashSet<&'static str> = HashSet::new();
    let mut d = Driver::new();
    let script = [
        Step::Queued(1),
        Step::Queued(2),
        Step::InProgress(1),
        Step::Completed(1),
        Step::ClaimFails(500),
        Step::Queued(3),
        Step::Advance(40),
        Step::Exited(2, 1),
        Step::Advance(900),
        Step::ClaimFails(422),
        Step::Queued(4),
        Step::Advance(60),
    ];
    for s in &script {
        run(&mut d, s);
        for (_, _, to) in d.s.state.jobs.moves() {
            seen.insert(*to);
        }
    }
    let _ = core;
    for phase in [
        "pending", "claiming", "active", "done", "retrying", "seen", "parked",
    ] {
        assert!(seen.contains(phase), "{phase} never reached: {seen:?}");
    }
}
