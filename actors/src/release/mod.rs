//! Keeping the runner current: which `actions/runner` release is out, which one each pool runs,
//! and (for process pools without `runner_dir` or `command`) an install the daemon downloads,
//! verifies and switches to by itself.
//!
//! GitHub runs jobs only on self-hosted runners that keep up (an update within 30 days of a
//! release when automatic updates are off; registrations below its minimum are refused). A JIT
//! runner that may update itself downloads the release and restarts inside every job's fresh
//! copy, on every job; so where the daemon keeps the install current it turns the runner's own
//! updates off (`DisableUpdate` in the `.runner` settings of its JIT config, as
//! `config.sh --disableupdate` would) and does the update once, outside any job.
//!
//! - [`check`]: the releases API (conditional requests: an unchanged answer costs nothing) and
//!   the archive download, hashed while it streams to disk.
//! - [`installs`]: the versioned installs under `<state.dir>-work/runners/<version>`, which
//!   one new jobs use, leases held by running jobs, and the removal of unused old versions.
//! - [`policy`]: the decisions, pure: what a look leaves known, whether an install is due,
//!   what a refused archive holds back, why a pool waits, when an install is read again.
//! - [`probe`]: an operator install's version, read from its files (run unprivileged only
//!   when they do not say).
//! - [`actor`]: `ReleaseActor`, which looks every `release_check_interval`, installs what is
//!   new, and reports versions to `/metrics`, `status` and `doctor`.

pub mod actor;
pub mod check;
pub mod installs;
pub(crate) mod probe;

pub use ephemer_decide::release::*;
