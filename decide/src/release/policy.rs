//! The release policy, as plain decisions: what a look at the releases leaves known, whether
//! the managed install is due a new release, what a refused archive holds back, why a pool
//! without an install waits, and when an operator's install is read again. `ReleaseActor`
//! (`actor.rs`) does the I/O around them; which old installs may go is `installs.rs`'s.

use std::time::{Duration, Instant, SystemTime};

use super::{Release, Version};

/// What a look at the releases found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Looked {
    /// The same answer as last time (304 to `If-None-Match`): it cost nothing.
    Unchanged,
    /// The release, and the `ETag` to send next time.
    Found(Release, Option<String>),
    /// No such release (none published, or the pinned version does not exist).
    NotFound,
}

/// A release whose archive was refused, with the digest it stated: it is not downloaded again
/// until the release says something else.
pub type Refused = (Version, [u8; 32]);

/// What the releases API answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// An answer (unchanged, found, none).
    Looked(Looked),
    /// No answer: the network, a 5xx, an unreadable body.
    Failed(String),
}

/// What the daemon does with the managed install after a look.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing: no managed install to keep, or no release known.
    Nothing,
    /// Try `release` ([`due`] says whether it is new for new jobs).
    Install(Release),
    /// The release's archive was refused before and the release has not changed since.
    HeldBack,
}

/// What a look leaves known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AfterLook {
    /// The release as now known (the last one when the look said nothing new or failed).
    pub release: Option<Release>,
    /// The `ETag` to send next time.
    pub etag: Option<String>,
    /// What went wrong, for `status` and the log.
    pub problem: Option<String>,
    /// The refusal still standing (one whose release changed is dropped).
    pub refused: Option<Refused>,
    /// The managed install's step.
    pub step: Step,
    /// The look failed (counted as a failed check).
    pub failed: bool,
}

/// The decision after a look: `answer` to the look asked with `etag`, the release `known`
/// before, the `refused` archive, `pinned` (`runner.runner_version`), and `managed`: a
/// managed install is kept current (`runner.auto_update`).
pub fn after_look(
    answer: Answer,
    known: Option<Release>,
    etag: Option<String>,
    refused: Option<Refused>,
    pinned: Option<&Version>,
    managed: bool,
) -> AfterLook {
    let (release, etag, problem, failed) = match answer {
        Answer::Looked(Looked::Unchanged) => (known, etag, None, false),
        Answer::Looked(Looked::Found(release, new_etag)) => (Some(release), new_etag, None, false),
        Answer::Looked(Looked::NotFound) => {
            let why =
                pinned.map(|v| format!("runner release v{v} (runner_version) does not exist"));
            (None, None, why, false)
        }
        Answer::Failed(e) => (known, etag, Some(e), true),
    };
    let stated = release.as_ref().and_then(stated);
    let refused = refused.filter(|r| Some(r) == stated.as_ref());
    let (step, problem) = match (&release, managed) {
        (Some(r), true) if refused.is_some() => (
            Step::HeldBack,
            problem.or_else(|| {
                Some(format!(
                    "runner release {} was refused (its archive does not match its digest); \
                     waiting for the release to change",
                    r.version
                ))
            }),
        ),
        (Some(r), true) => (Step::Install(r.clone()), problem),
        _ => (Step::Nothing, problem),
    };
    AfterLook {
        release,
        etag,
        problem,
        refused,
        step,
        failed,
    }
}

/// What `release` states of its archive: its version and the digest it publishes.
fn stated(release: &Release) -> Option<Refused> {
    Some((release.version.clone(), release.archive.as_ref()?.sha256?))
}

/// Whether `release` is due for new jobs over `current`: there is none yet; or it is the
/// pinned version and not the current; or, unpinned, it is newer (never a downgrade).
pub fn due(release: &Version, current: Option<&Version>, pinned: bool) -> bool {
    match current {
        None => true,
        Some(c) if pinned => c != release,
        Some(c) => c < release,
    }
}

/// What an install attempt of `release` left: the refusal to remember (an archive that cannot
/// be trusted is not tried again until the release changes), and the problem.
pub fn after_install(
    release: &Release,
    outcome: Result<(), InstallError>,
) -> (Option<Refused>, Option<String>) {
    match outcome {
        Ok(()) => (None, None),
        Err(InstallError::Refused(e)) => (stated(release), Some(e)),
        Err(InstallError::Failed(e)) => (None, Some(e)),
    }
}

/// Why an install did not happen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InstallError {
    /// Its archive cannot be trusted (it does not match, or nothing to match against): not
    /// tried again until the release changes.
    #[error("{0}")]
    Refused(String),
    /// Something that may pass (the network, the disk): tried again at the next look.
    #[error("{0}")]
    Failed(String),
}

/// Why a managed pool waits, said to its host check: no install yet (with the look's
/// `problem`, or "no release found"), else the problem, if any.
pub fn settle_reason(has_install: bool, problem: Option<String>) -> Option<String> {
    match (has_install, problem) {
        (false, Some(p)) => Some(format!("no runner install yet: {p}")),
        (false, None) => Some("no runner install yet: no release found".into()),
        (true, p) => p,
    }
}

/// Whether an operator's install is read again: its listener's modification time is unknown
/// or not the one its version was read at.
pub fn read_again(stamp: Option<SystemTime>, seen: Option<&(SystemTime, Version)>) -> bool {
    !matches!((stamp, seen), (Some(t), Some((at, _))) if *at == t)
}

/// What GitHub's refusal of a pool's runner as too old ("deprecated", exit code 7) calls for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Look at the releases: no look since this run of refusals began (a refusal is news
    /// that a release may have come out), or nothing known to compare.
    Look,
    /// The install is older than the newest release known: update it.
    Update,
    /// The install is the newest release, and a look since the refusals began said so:
    /// GitHub refuses what it publishes, as during its 2026-08-06 outage (and its runner
    /// reports any 403 so). Nothing more is fetched; the jobs wait for the service.
    Outage(Version),
}

/// What a refusal of a runner of `install` calls for, given the `newest` release known and
/// whether it was looked at since this run of refusals began (`looked_since`).
pub fn refusal(install: Option<&Version>, newest: Option<&Version>, looked_since: bool) -> Refusal {
    match (install, newest) {
        (Some(i), Some(n)) if i < n => Refusal::Update,
        (Some(i), Some(_)) if looked_since => Refusal::Outage(i.clone()),
        _ => Refusal::Look,
    }
}

/// A pool's refusals further apart than this start a new run: its first refusal looks at the
/// releases again.
pub const REFUSAL_RUN_GAP: Duration = Duration::from_secs(600);

/// A pool's run of refusals: refusals less than [`REFUSAL_RUN_GAP`] apart are one run, and a
/// look at the releases that ended after its first counts for all of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RefusalRun {
    first: Instant,
    last: Instant,
}

impl RefusalRun {
    /// A run begun by a refusal at `at`.
    pub fn new(at: Instant) -> Self {
        RefusalRun {
            first: at,
            last: at,
        }
    }

    /// Notes a refusal at `at`: it begins a new run when the last one came over the gap ago.
    pub fn refused(&mut self, at: Instant) {
        if at.saturating_duration_since(self.last) > REFUSAL_RUN_GAP {
            self.first = at;
        }
        self.last = at;
    }

    /// Whether the last look, ended at `looked`, came after this run began.
    pub fn looked_since(&self, looked: Option<Instant>) -> bool {
        looked.is_some_and(|at| at > self.first)
    }
}

/// The status line of a refusal taken for an outage.
pub fn outage_line(version: &dyn std::fmt::Display) -> String {
    format!("GitHub refuses runner {version}, the newest release: likely an outage")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::release::Archive;

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap()
    }

    fn release(version: &str, digest: Option<u8>) -> Release {
        Release {
            version: v(version),
            published_unix: 100,
            archive: Some(Archive {
                name: format!("actions-runner-linux-x64-{version}.tar.gz"),
                url: "https://example/a.tar.gz".into(),
                sha256: digest.map(|d| [d; 32]),
            }),
        }
    }

    #[test]
    fn an_unchanged_or_failed_look_keeps_what_was_known_and_its_etag() {
        let known = Some(release("2.330.0", Some(1)));
        let etag = Some("\"e1\"".to_string());
        let same = after_look(
            Answer::Looked(Looked::Unchanged),
            known.clone(),
            etag.clone(),
            None,
            None,
            true,
        );
        assert_eq!(
            (same.release.clone(), same.etag.clone(), same.failed),
            (known.clone(), etag.clone(), false)
        );
        assert_eq!(same.step, Step::Install(release("2.330.0", Some(1))));
        let failed = after_look(
            Answer::Failed("503".into()),
            known.clone(),
            etag.clone(),
            None,
            None,
            true,
        );
        assert_eq!(
            (failed.release, failed.etag, failed.problem, failed.failed),
            (known, etag, Some("503".into()), true)
        );
    }

    #[test]
    fn a_pinned_version_that_does_not_exist_is_the_problem_said() {
        let pin = v("2.999.0");
        let none = after_look(
            Answer::Looked(Looked::NotFound),
            None,
            Some("e".into()),
            None,
            Some(&pin),
            true,
        );
        assert_eq!(
            none.problem.as_deref(),
            Some("runner release v2.999.0 (runner_version) does not exist")
        );
        assert_eq!((none.etag, none.step), (None, Step::Nothing));
        let unpinned = after_look(
            Answer::Looked(Looked::NotFound),
            None,
            None,
            None,
            None,
            true,
        );
        assert_eq!(unpinned.problem, None);
    }

    #[test]
    fn a_refused_archive_is_held_back_until_the_release_changes() {
        let refused = Some((v("2.331.0"), [7; 32]));
        let same = Answer::Looked(Looked::Found(release("2.331.0", Some(7)), None));
        let held = after_look(same, None, None, refused.clone(), None, true);
        assert_eq!(held.step, Step::HeldBack);
        assert_eq!(held.refused, refused);
        assert!(
            held.problem
                .unwrap()
                .contains("waiting for the release to change")
        );
        // The release states another digest (fixed upstream): tried again.
        let changed = Answer::Looked(Looked::Found(release("2.331.0", Some(8)), None));
        let again = after_look(changed, None, None, refused, None, true);
        assert_eq!(
            (again.step.clone(), again.refused),
            (Step::Install(release("2.331.0", Some(8))), None)
        );
    }

    #[test]
    fn without_a_managed_install_a_look_only_informs() {
        let found = Answer::Looked(Looked::Found(release("2.331.0", Some(1)), Some("e".into())));
        let look = after_look(found, None, None, None, None, false);
        assert_eq!(look.step, Step::Nothing);
        assert_eq!(look.etag.as_deref(), Some("e"));
    }

    #[test]
    fn a_new_release_is_due_never_a_downgrade_unless_pinned() {
        assert!(due(&v("2.330.0"), None, false));
        assert!(due(&v("2.331.0"), Some(&v("2.330.0")), false));
        assert!(!due(&v("2.330.0"), Some(&v("2.331.0")), false));
        assert!(!due(&v("2.330.0"), Some(&v("2.330.0")), false));
        assert!(
            due(&v("2.330.0"), Some(&v("2.331.0")), true),
            "a pin goes back"
        );
        assert!(!due(&v("2.330.0"), Some(&v("2.330.0")), true));
    }

    #[test]
    fn only_a_refused_archive_is_remembered_and_why_a_pool_waits_is_said() {
        let r = release("2.331.0", Some(3));
        assert_eq!(after_install(&r, Ok(())), (None, None));
        let (refused, why) = after_install(&r, Err(InstallError::Refused("digest".into())));
        assert_eq!(
            (refused, why.as_deref()),
            (Some((v("2.331.0"), [3; 32])), Some("digest"))
        );
        let (refused, _) = after_install(&r, Err(InstallError::Failed("disk".into())));
        assert_eq!(refused, None);
        assert_eq!(
            settle_reason(false, None).unwrap(),
            "no runner install yet: no release found"
        );
        assert_eq!(
            settle_reason(false, Some("offline".into())).unwrap(),
            "no runner install yet: offline"
        );
        assert_eq!(
            settle_reason(true, Some("offline".into())).as_deref(),
            Some("offline")
        );
        assert_eq!(settle_reason(true, None), None);
    }

    #[test]
    fn an_install_is_read_again_only_when_its_listener_changed() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(10);
        let seen = (t, v("2.330.0"));
        assert!(!read_again(Some(t), Some(&seen)));
        assert!(read_again(Some(t + Duration::from_secs(1)), Some(&seen)));
        assert!(read_again(None, Some(&seen)));
        assert!(read_again(Some(t), None));
    }

    /// An install behind the newest release is updated; the newest release refused is an
    /// outage once a look since the refusals began said it is the newest (the first refusal
    /// looks: a release may have come out since the last look); nothing known looks.
    #[test]
    fn a_refusal_of_the_newest_release_is_an_outage_and_an_older_one_an_update() {
        let (old, newest) = (v("2.329.0"), v("2.330.0"));
        assert_eq!(refusal(Some(&old), Some(&newest), true), Refusal::Update);
        assert_eq!(refusal(Some(&old), Some(&newest), false), Refusal::Update);
        assert_eq!(refusal(Some(&newest), Some(&newest), false), Refusal::Look);
        assert_eq!(
            refusal(Some(&newest), Some(&newest), true),
            Refusal::Outage(newest.clone())
        );
        assert_eq!(refusal(Some(&newest), None, true), Refusal::Look);
        assert_eq!(refusal(None, Some(&newest), true), Refusal::Look);
        // An install newer than the release known (a pinned preview) is not behind.
        assert_eq!(
            refusal(Some(&v("2.331.0")), Some(&newest), true),
            Refusal::Outage(v("2.331.0"))
        );
        assert_eq!(
            outage_line(&newest),
            "GitHub refuses runner 2.330.0, the newest release: likely an outage"
        );
    }

    /// A look counts for the run it ended in; refusals over the gap apart begin a new run,
    /// which the old look no longer covers.
    #[test]
    fn a_look_covers_the_run_of_refusals_it_ended_in() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut run = RefusalRun::new(at(0));
        assert!(!run.looked_since(None));
        assert!(
            !run.looked_since(Some(t0)),
            "a look before the first refusal"
        );
        assert!(run.looked_since(Some(at(1))));
        run.refused(at(15));
        run.refused(at(15 + 600));
        assert!(
            run.looked_since(Some(at(1))),
            "refusals under the gap apart: one run"
        );
        run.refused(at(15 + 600 + 601));
        assert!(!run.looked_since(Some(at(1))), "a new run looks again");
        assert!(run.looked_since(Some(at(15 + 600 + 602))));
    }
}
