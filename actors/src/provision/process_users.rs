//! A process pool's `run_as` users: taken host-wide ([`super::users`]) for each runner
//! directory, waited for when another pool's jobs hold them all, and looked at again at a warm
//! directory's claim.

use std::time::Duration;

use super::{
    ProvisionError,
    process::{ProcessBackend, user_named},
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
    /// to [`USER_WAIT`]) for a user another pool's job holds; a warm directory does not.
    pub(super) async fn take_user(
        &self,
        name: &str,
        wait: bool,
    ) -> Result<Option<String>, ProvisionError> {
        let deadline = tokio::time::Instant::now() + if wait { USER_WAIT } else { Duration::ZERO };
        let mut said = false;
        loop {
            match self.try_take_user(name) {
                Err(ProvisionError::HostUnavailable(why))
                    if tokio::time::Instant::now() < deadline =>
                {
                    if !said {
                        said = true;
                        tracing::info!(provider = self.s.pool.as_str(), runner = name, %why, "waiting for a run_as user to come free");
                    }
                    tokio::time::sleep(USER_POLL).await;
                }
                taken => return taken,
            }
        }
    }

    fn try_take_user(&self, name: &str) -> Result<Option<String>, ProvisionError> {
        if self.s.run_as.is_empty() {
            return Ok(None);
        }
        let candidates = self
            .s
            .run_as
            .iter()
            .map(|user| {
                Ok(users::Candidate {
                    name: user.clone(),
                    uid: user_named(user)?.uid.as_raw(),
                })
            })
            .collect::<Result<Vec<_>, ProvisionError>>()?;
        users::take(&self.s.pool, name, &candidates, &self.s.peers)
            .map(Some)
            .map_err(|e| ProvisionError::HostUnavailable(e.to_string()))
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
        let uid = user_named(user)?.uid.as_raw();
        users::still_alone(name, uid, &self.s.peers).map_err(|e| {
            ProvisionError::EnvironmentFailed(format!("run_as user {user} is not free: {e}"))
        })
    }
}
