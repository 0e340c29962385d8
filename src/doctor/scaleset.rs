//! `doctor`'s look at scale-set mode: per pool, does its scale set exist with the pool's labels
//! in the configured runner group, and can a message session be had (or who holds it).

use ephemer_actors_core::{
    config::Config,
    github::{GithubClient, actions::ActionsClient},
    scaleset::record::scale_set_labels,
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
        let wanted = scale_set_labels(pool.name.as_str(), &pool.common.labels);
        let norm = |v: &[String]| {
            let mut v: Vec<String> = v.iter().map(|l| l.to_ascii_lowercase()).collect();
            v.sort();
            v.dedup();
            v
        };
        let has = set.label_names();
        if norm(&has) != norm(&wanted) {
            let only_name = has.len() == 1 && has[0].eq_ignore_ascii_case(pool.name.as_str());
            if only_name && wanted.len() > 1 {
                out.push(Check::warn(
                    &name,
                    format!(
                        "the scale set has only its name as a label, the pool wants {wanted:?}: the service drops custom labels (a GHES without custom scale-set labels), so only `runs-on: {}` reaches this pool",
                        pool.name
                    ),
                    "route jobs with `runs-on: <pool name>`, or turn custom scale-set labels on (GHES 3.18+, see docs/operations.md, scale sets)",
                ));
            } else {
                out.push(Check::warn(
                    &name,
                    format!("labels {has:?}, the pool wants {wanted:?}"),
                    "serve updates them at start",
                ));
            }
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
