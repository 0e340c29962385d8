//! `doctor`'s look at scale-set mode: per pool, does its scale set exist with the pool's labels
//! in the configured runner group, and can a message session be had (or who holds it).

use ephemer_actors_core::{
    config::Config,
    github::{GithubClient, actions::ActionsClient},
};

use super::Check;

/// One check per pool: the scale set, its labels and group, and its session.
pub async fn checks(client: &GithubClient, config: &Config) -> Vec<Check> {
    let actions = ActionsClient::new(client.clone());
    let gh = &config.github;
    let group = match actions
        .runner_group_id(gh.runner_group.as_deref(), gh.runner_group_id)
        .await
    {
        Ok(id) => id,
        Err(e) => {
            return vec![Check::fail(
                "scale sets",
                format!("cannot reach the Actions service or its runner group: {e}"),
                "check the credential (it needs to mint registration tokens: administration: write on the org) and github.runner_group; a GHES needs 3.9 or later for scale sets",
            )];
        }
    };
    let mut out = Vec::new();
    for pool in config.providers.enabled() {
        let name = format!("scale set {}", pool.name);
        let set = match actions.find_scale_set(group, pool.name.as_str()).await {
            Ok(Some(set)) => set,
            Ok(None) => {
                out.push(Check::ok(
                    name,
                    format!("none yet in runner group {group}: serve creates it"),
                ));
                continue;
            }
            Err(e) => {
                out.push(Check::fail(
                    name,
                    format!("cannot look it up: {e}"),
                    "see docs/operations.md, scale sets",
                ));
                continue;
            }
        };
        let mut wanted = pool.common.labels.clone();
        wanted.sort();
        wanted.dedup();
        if set.label_names() != wanted {
            out.push(Check::warn(
                &name,
                format!("labels {:?}, the pool has {wanted:?}", set.label_names()),
                "serve updates them at start",
            ));
        }
        // Ask for the session as serve would, and give it back at once.
        match actions
            .create_session(set.id, "ephemer-actors-doctor")
            .await
        {
            Ok(session) => {
                let _ = actions.delete_session(set.id, &session.session_id).await;
                out.push(Check::ok(
                    name,
                    format!(
                        "id {}, runner group {group}, session obtainable (no daemon listens)",
                        set.id
                    ),
                ));
            }
            Err(ephemer_actors_core::github::GithubError::Http(f)) if f.status == 409 => {
                out.push(Check::ok(
                    name,
                    format!(
                        "id {}, runner group {group}, listened to: {}",
                        set.id, f.message
                    ),
                ));
            }
            Err(e) => out.push(Check::fail(
                name,
                format!("id {}: cannot open a message session: {e}", set.id),
                "see docs/operations.md, scale sets",
            )),
        }
    }
    out
}
