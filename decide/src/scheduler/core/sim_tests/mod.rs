//! The core against a simulated GitHub, in virtual time: random interleavings of deliveries
//! (duplicated, replayed, late, out of order, lost), claim answers (ok, 502, dropped), runner
//! assignment (oldest first, as GitHub does, newest first, at random), runners that crash at
//! boot, failed deletions, restarts from the durable state, and reconcile passes.
//!
//! GitHub assigns a queued job to a covering runner as soon as one is idle (no job is a
//! zombie here), so the invariant the README states must hold: while GitHub lists a job as
//! queued, the daemon has a runner claimed for it, a claim or a slot it waits for, or a retry
//! due; never parked, never held idle past the next reconcile pass. Unbound runners never
//! outnumber the queued jobs for longer than the sweep's grace, no runner running a job is
//! torn down, a runner that ran a job is never deleted, and once the faults stop every job
//! runs and nothing is left registered.
//!
//! `sim.rs` is the simulated world (GitHub's jobs and runners, the store, time, faults) and
//! `sim/github.rs` what GitHub answers to the daemon's effects and the checks; here are the
//! plans and the tests.

mod sim;

use proptest::prelude::*;

use sim::{Plan, Policy, Sim};

fn plan() -> impl Strategy<Value = Plan> {
    (
        any::<u64>(),
        prop_oneof![
            Just(Policy::OldestFirst),
            Just(Policy::NewestFirst),
            Just(Policy::Random)
        ],
        20usize..100,
        2usize..17,
        10u64..400,
        (0.0f64..0.35, 0.0f64..0.2, 0.0f64..0.2),
        (0.0f64..0.4, 0.0f64..0.3, 0usize..3),
    )
        .prop_map(
            |(
                seed,
                policy,
                jobs,
                slots,
                gap,
                (claim_faults, crashes, lost_queued),
                (duplicates, failed_deletes, restarts),
            )| Plan {
                seed,
                policy,
                jobs,
                slots,
                gap,
                claim_faults,
                crashes,
                lost_queued,
                duplicates,
                failed_deletes,
                restarts,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn no_queued_job_is_ever_abandoned(plan in plan()) {
        let mut sim = Sim::new(plan.clone());
        sim.run();
        let claims = sim.claims;
        let violations = sim.verdict();
        prop_assert!(violations.is_empty(), "{plan:?} ({claims} claims):\n{}", violations.join("\n"));
    }
}

/// The backlog, fixed: oldest-first assignment, one pool over two label sets, jobs
/// 50 ms apart, a fifth of the claims failing, runners that take seconds to boot.
#[test]
fn a_backlog_with_oldest_first_assignment_loses_nothing() {
    for seed in 0..20 {
        let plan = Plan {
            seed,
            policy: Policy::OldestFirst,
            jobs: 100,
            slots: 16,
            gap: 50,
            claim_faults: 0.2,
            crashes: 0.05,
            lost_queued: 0.05,
            duplicates: 0.3,
            failed_deletes: 0.2,
            restarts: 1,
        };
        let mut sim = Sim::new(plan.clone());
        sim.run();
        let violations = sim.verdict();
        assert!(
            violations.is_empty(),
            "{plan:?}:\n{}",
            violations.join("\n")
        );
    }
}
