//! Which target's secret a delivery is checked with: one, never each in turn.
//!
//! With several targets, an unverified body costs one HMAC at most. GitHub names the hook in
//! `X-GitHub-Hook-ID` and what it belongs to in `X-GitHub-Hook-Installation-Target-Type` and
//! `-ID` (`integration` and the App's id for an App's webhook). So the key is, in order: the
//! target whose hook that is (the configured `webhook.hook_id`, and the hooks found at start
//! by the redelivery pass), the target whose App it is, the target whose owner the body names
//! (`repository.owner.login`, or `organization.login` for an org hook's ping). A body none of
//! them claims is refused without any HMAC: no target serves it.

use std::sync::{Arc, RwLock};

use crate::config::Secret;

/// The hook ids one target's deliveries come from, learned as they are found. Shared between
/// the intake and the target's redelivery pass.
#[derive(Debug, Default)]
pub struct HookIds(RwLock<Vec<u64>>);

impl HookIds {
    /// A book knowing `ids` already.
    pub fn with(ids: impl IntoIterator<Item = u64>) -> Arc<HookIds> {
        let book = Arc::new(HookIds::default());
        book.learn(ids);
        book
    }

    /// Adds `ids`.
    pub fn learn(&self, ids: impl IntoIterator<Item = u64>) {
        let mut known = self.0.write().unwrap_or_else(|p| p.into_inner());
        for id in ids {
            if !known.contains(&id) {
                known.push(id);
            }
        }
    }

    fn has(&self, id: u64) -> bool {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&id)
    }
}

/// One target's secret and what tells its deliveries apart.
#[derive(Debug)]
pub struct TargetKey {
    /// The webhook secret.
    pub secret: Secret,
    /// The target's owner (`None`: the single-target intake, any owner's).
    pub owner: Option<String>,
    /// Its hooks' ids.
    pub hooks: Arc<HookIds>,
    /// Its GitHub App's id, for the App's own webhook.
    pub app_id: Option<u64>,
}

impl TargetKey {
    /// A key for `owner`'s deliveries signed with `secret`, nothing else known.
    pub fn new(owner: Option<String>, secret: Secret) -> TargetKey {
        TargetKey {
            secret,
            owner: owner.map(|o| o.to_ascii_lowercase()),
            hooks: Arc::default(),
            app_id: None,
        }
    }
}

/// What a delivery says of where it comes from, before it is verified.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Claimed {
    /// `X-GitHub-Hook-ID`.
    pub hook_id: Option<u64>,
    /// `X-GitHub-Hook-Installation-Target-ID` when its type is `integration` (an App's id).
    pub app_id: Option<u64>,
    /// The owner the body names.
    pub owner: Option<String>,
}

/// The one key to check a delivery claiming `claimed` with, if any.
pub(crate) fn pick(keys: &[TargetKey], claimed: &Claimed) -> Option<usize> {
    if keys.len() == 1 {
        return Some(0);
    }
    let by_hook = claimed
        .hook_id
        .and_then(|id| keys.iter().position(|k| k.hooks.has(id)));
    let by_app = || {
        claimed
            .app_id
            .and_then(|id| keys.iter().position(|k| k.app_id == Some(id)))
    };
    let by_owner = || {
        claimed.owner.as_deref().and_then(|owner| {
            keys.iter().position(|k| {
                k.owner
                    .as_deref()
                    .is_some_and(|o| o.eq_ignore_ascii_case(owner))
            })
        })
    };
    by_hook.or_else(by_app).or_else(by_owner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Vec<TargetKey> {
        let mut a = TargetKey::new(Some("Acme".into()), Secret::new("a"));
        a.hooks = HookIds::with([11]);
        let mut b = TargetKey::new(Some("beta".into()), Secret::new("b"));
        b.app_id = Some(4242);
        vec![a, b, TargetKey::new(Some("gamma".into()), Secret::new("c"))]
    }

    fn claimed(hook_id: Option<u64>, app_id: Option<u64>, owner: Option<&str>) -> Claimed {
        Claimed {
            hook_id,
            app_id,
            owner: owner.map(str::to_string),
        }
    }

    #[test]
    fn the_hook_then_the_app_then_the_owner_picks_one_key() {
        let keys = keys();
        assert_eq!(
            pick(&keys, &claimed(Some(11), None, Some("gamma"))),
            Some(0)
        );
        assert_eq!(
            pick(&keys, &claimed(Some(99), Some(4242), Some("acme"))),
            Some(1)
        );
        assert_eq!(pick(&keys, &claimed(Some(99), None, Some("ACME"))), Some(0));
        assert_eq!(pick(&keys, &claimed(None, None, Some("gamma"))), Some(2));
        assert_eq!(
            pick(&keys, &claimed(Some(99), Some(1), Some("nobody"))),
            None
        );
        assert_eq!(pick(&keys, &Claimed::default()), None);
    }

    #[test]
    fn hooks_found_later_are_learned_and_one_target_is_always_its_own_key() {
        let keys = keys();
        assert_eq!(pick(&keys, &claimed(Some(77), None, None)), None);
        keys[2].hooks.learn([77]);
        assert_eq!(pick(&keys, &claimed(Some(77), None, None)), Some(2));
        let one = [TargetKey::new(None, Secret::new("s"))];
        assert_eq!(pick(&one, &Claimed::default()), Some(0));
    }
}
