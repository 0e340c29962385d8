//! The scale set's record on the service: found by name in the runner group, created, or
//! updated when the pool's labels or settings changed; its labels are the pool's name first,
//! then the pool's (as actions-runner-controller registers a scale set). A service that drops
//! custom labels (a GHES without them) is said once and remembered, never asked again in a
//! loop. A scale set made again (GitHub deleted the old one) starts its queue over, and the
//! jobs still waiting in the old one are withdrawn: the service assigns them anew.

use super::link::Link;
use ephemer_decide::scaleset::{Resolved, dropped_after, found_will_do, same_labels};
use crate::github::{
    GithubError,
    actions::types::{Label, RunnerSetting, ScaleSet},
};

/// The scale set's labels: its name first (the label `runs-on: <pool>` routes by, as ARC
/// registers it), then the pool's, without repeats (case-insensitive).
pub fn scale_set_labels(name: &str, labels: &[String]) -> Vec<String> {
    let mut out = vec![name.to_string()];
    for l in labels {
        if !out.iter().any(|o| o.eq_ignore_ascii_case(l)) {
            out.push(l.clone());
        }
    }
    out
}

/// The scale set's id: found by name in the runner group (its labels and settings made the
/// pool's if they differ, unless the service dropped those labels before), else created.
pub(super) async fn ensure_scale_set(link: &mut Link) -> Result<u64, GithubError> {
    let s = &link.settings;
    let group = link
        .client
        .runner_group_id(s.runner_group.as_deref(), s.runner_group_id)
        .await?;
    let wanted_labels = scale_set_labels(s.pool.as_str(), &s.labels);
    let dropped = link.mark.dropped_labels.clone();
    let dropped_before = same_labels(&dropped, &wanted_labels);
    let (kept, asked) = find_or_make(link, group, &wanted_labels, &dropped).await?;
    let id = kept.id;
    settle_mark(link, id).await;
    note_dropped(link, &wanted_labels, &kept, asked, dropped_before);
    link.save_mark().await;
    Ok(id)
}

/// The pool's scale set in runner group `group`, as the service keeps it: the one found by
/// name when its labels and settings are the pool's (or its labels were dropped before), else
/// it updated or created and read back; and whether the service was asked to change it.
async fn find_or_make(
    link: &Link,
    group: u64,
    wanted_labels: &[String],
    dropped_before: &[String],
) -> Result<(ScaleSet, bool), GithubError> {
    let s = &link.settings;
    let client = &link.client;
    let wanted = ScaleSet {
        name: s.pool.to_string(),
        runner_group_id: group,
        labels: wanted_labels
            .iter()
            .map(|l| Label {
                kind: "System".into(),
                name: l.clone(),
            })
            .collect(),
        runner_setting: RunnerSetting {
            disable_update: s.disable_update,
        },
        ..ScaleSet::default()
    };
    Ok(match client.find_scale_set(group, s.pool.as_str()).await? {
        Some(found)
            if found_will_do(
                &found.label_names(),
                found.runner_setting == wanted.runner_setting,
                wanted_labels,
                dropped_before,
            ) =>
        {
            (found, false)
        }
        Some(found) => {
            tracing::info!(pool = s.pool.as_str(), was = %found.label_names().join(", "), now = %wanted_labels.join(", "), disable_update = s.disable_update, "scale set: the pool's labels or settings changed; updating the scale set");
            let updated = client.update_scale_set(found.id, &wanted).await?;
            let id = updated.id.max(found.id);
            (read_back(link, id, updated).await, true)
        }
        None => {
            let made = client.create_scale_set(&wanted).await?;
            tracing::info!(
                pool = s.pool.as_str(),
                scale_set = made.id,
                labels = ?wanted_labels,
                "scale set: created"
            );
            let id = made.id;
            (read_back(link, id, made).await, true)
        }
    })
}

/// Scale set `id` as the service keeps it, read back after it was made or changed: an answer
/// can name labels the service then does not keep (github.com has been seen to drop a new
/// scale set's labels so; the actions/scaleset README says it keeps them), and the kept ones
/// are what routes jobs. When the read fails, the answer stands.
async fn read_back(link: &Link, id: u64, answer: ScaleSet) -> ScaleSet {
    match link.client.scale_set(id).await {
        Ok(Some(kept)) => {
            if !same_labels(&kept.label_names(), &answer.label_names()) {
                tracing::warn!(pool = link.pool(), answered = %answer.label_names().join(", "), kept = %kept.label_names().join(", "), "scale set: the service's answer named other labels than it kept; the kept ones route jobs");
            }
            ScaleSet { id, ..kept }
        }
        Ok(None) => ScaleSet { id, ..answer },
        Err(e) => {
            tracing::info!(pool = link.pool(), error = %e, "scale set: its labels could not be read back; the service's answer stands");
            ScaleSet { id, ..answer }
        }
    }
}

/// The mark after the scale set's id is known: a scale set made again starts over, and the
/// first start after the upgrade to `jobId` keys withdraws the jobs keyed the old way once.
async fn settle_mark(link: &mut Link, id: u64) {
    match link.mark.on_resolved(id) {
        Resolved::Same => {}
        Resolved::Remade { withdraw_waiting } => {
            // Another scale set (this one was made again): its queue starts over, and the jobs
            // still waiting from the old one are GitHub's to assign anew in the new one, as new
            // assignments (their keys name the scale set): the old ones are withdrawn at once,
            // and the runners made for them, registered in a scale set that is gone, go with
            // them.
            let orphans = if withdraw_waiting {
                withdraw_waiting_jobs(
                    link,
                    |_| true,
                    "scale set: made again; its old jobs still waiting are withdrawn, the service assigns them anew",
                )
                .await
            } else {
                Vec::new()
            };
            link.mark.remade(id, orphans);
        }
        Resolved::Upgraded => {
            // The first start after an upgrade from a daemon that keyed scale-set jobs by
            // runner request id: the messages of the jobs it left waiting now name other keys,
            // so those records would hold runners for jobs no message ends. They are withdrawn
            // once; the service still counts the jobs as assigned, and the reckoning claims
            // runners for them.
            let left = withdraw_waiting_jobs(
                link,
                super::inbox::keyed_by_request,
                "scale set: jobs recorded by runner request id (before the upgrade) are withdrawn once; the reckoning claims runners for them",
            )
            .await;
            link.mark.upgraded(left);
        }
    }
}

/// What the service kept of the labels (`kept`, the scale set as found or read back; `asked`:
/// it was just made or changed): the labels it lacks go to the gauge and `status`. A service
/// that keeps only the name (a GHES without custom scale-set labels; github.com at times) drops
/// the rest silently: said once, remembered so no restart asks again in vain.
fn note_dropped(
    link: &mut Link,
    wanted_labels: &[String],
    kept: &ScaleSet,
    asked: bool,
    dropped_before: bool,
) {
    let kept = kept.label_names();
    let lost: Vec<String> = super::dropped_labels(wanted_labels, &kept)
        .into_iter()
        .cloned()
        .collect();
    let pool = link.settings.pool.clone();
    link.metrics
        .scaleset
        .labels_dropped
        .with_label_values(&[pool.as_str()])
        .set(i64::try_from(lost.len()).unwrap_or(i64::MAX));
    if asked {
        link.mark.dropped_labels = dropped_after(wanted_labels, &kept);
        if !lost.is_empty() && !link.said_dropped {
            link.said_dropped = true;
            tracing::warn!(pool = pool.as_str(), dropped = %lost.join(", "), "scale set: the Actions service dropped its custom labels (a GHES without custom scale-set labels does, and github.com has been seen to); only `runs-on: {}` reaches this pool (docs/operations.md, scale sets)", pool);
        }
    } else if dropped_before && !link.said_dropped {
        link.said_dropped = true;
        tracing::warn!(
            pool = pool.as_str(),
            "scale set: the Actions service dropped its custom labels before; only `runs-on: {}` reaches this pool, and they are not asked for again until the pool's labels change",
            pool
        );
    }
    link.dropped_now = lost;
}

/// Withdraws the pool's waiting jobs that `which` picks, saying `why` when there are any;
/// answers the ids whose withdrawal the intake did not take (left to the reckoning).
async fn withdraw_waiting_jobs(
    link: &Link,
    which: impl Fn(&crate::job::JobKey) -> bool,
    why: &str,
) -> Vec<u64> {
    let jobs: Vec<_> = super::reckon::demand(link)
        .await
        .map(|d| d.waiting)
        .unwrap_or_default()
        .into_iter()
        .filter(|k| which(k))
        .collect();
    if !jobs.is_empty() {
        tracing::info!(
            pool = link.pool(),
            jobs = jobs.len(),
            "{why}"
        );
    }
    super::reckon::withdraw(link, &jobs).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_set_is_registered_with_its_name_first_then_the_pool_s_labels() {
        let labels = vec![
            "self-hosted".into(),
            "Linux".into(),
            "alpha".into(),
            "linux".into(),
        ];
        assert_eq!(
            scale_set_labels("alpha", &labels),
            ["alpha", "self-hosted", "Linux"]
        );
    }
}
