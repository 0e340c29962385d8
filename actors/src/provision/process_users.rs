//! A process pool's `run_as` users: taken host-wide ([`super::users`]) for each runner
//! directory, waited for when another pool's jobs hold them all, and looked at again at a warm
//! directory's claim.

use std::time::Duration;

use super::{
    ProvisionError,
    process::ProcessBackend,
    users,
};

/// How long a claimed job's runner waits for a `run_as` user another pool's job holds.
const USER_WAIT: Duration = Duration::from_secs(300);
/// How often it looks meanwhile.
const USER_POLL: Duration = Duration::from_millis(200);

impl ProcessBackend {
    /// The user runner directory `name` runs as: one that nothing on the host has
    /// ([`super::users`]), held from here to the end of the runner's teardown. A pool with a
    /// single user shares it among its own runners only. A runner of a claimed job waits (up
    /// to [`USER_WAIT`]) for a user another pool's job holds, and says so host-wide
    /// ([`users::Want`]): warm directories then leave those users to it and give up the one
    /// they hold at their next check. A warm directory (`wait` false) does not wait.
    pub(super) async fn take_user(
        &self,
        name: &str,
        wait: bool,
    ) -> Result<Option<String>, ProvisionError> {
        let deadline = tokio::time::Instant::now() + if wait { USER_WAIT } else { Duration::ZERO };
        let mut want = None;
        loop {
            match self.try_take_user(name, !wait) {
                Err(ProvisionError::HostUnavailable(why))
                    if tokio::time::Instant::now() < deadline =>
                {
                    if want.is_none() {
                        tracing::info!(provider = self.s.pool.as_str(), runner = name, %why, "waiting for a run_as user to come free");
                        want = Some(users::Want::new(name, &self.candidates()?));
                    }
                    tokio::time::sleep(USER_POLL).await;
                }
                taken => return taken,
            }
        }
    }

    fn try_take_user(&self, name: &str, warm: bool) -> Result<Option<String>, ProvisionError> {
        if self.s.run_as.is_empty() {
            return Ok(None);
        }
        users::take(&self.s.pool, name, &self.candidates()?, &self.s.peers, warm)
            .map(Some)
            .map_err(|e| ProvisionError::HostUnavailable(e.to_string()))
    }

    /// The pool's `run_as` users with their uids.
    fn candidates(&self) -> Result<Vec<users::Candidate>, ProvisionError> {
        self
            .s
            .run_as
            .iter()
            .map(|user| {
                Ok(users::Candidate {
                    name: user.clone(),
                    uid: self.user_named(user)?.uid.as_raw(),
                })
            })
            .collect()
    }

    /// Whether warm directory `name`'s user is waited for by a claimed job's runner: the warm
    /// directory then goes, so that its user serves the job.
    pub(super) fn user_wanted(&self, user: Option<&str>) -> bool {
        user.and_then(|u| self.user_named(u).ok())
            .is_some_and(|u| users::wanted(u.uid.as_raw()))
    }

    /// At the claim, before the runner starts: the directory's user is still its alone (a
    /// warm directory was given its user long before). Not for a pool's single shared user.
    pub(super) fn recheck_user(
        &self,
        name: &str,
        user: Option<&str>,
    ) -> Result<(), ProvisionError> {
        let Some(user) = user.filter(|_| self.s.run_as.len() > 1) else {
            return Ok(());
        };
        let uid = self.user_named(user)?.uid.as_raw();
        users::still_alone(name, uid, &self.s.peers).map_err(|e| {
            ProvisionError::EnvironmentFailed(format!("run_as user {user} is not free: {e}"))
        })
    }
}
