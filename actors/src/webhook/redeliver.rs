//! `RedeliverActor`: asks GitHub to deliver again what it recorded as failed.
//!
//! GitHub never retries a failed delivery by itself, so every restart, upgrade, network blip or
//! 503 of ours would leave jobs that only the reconcile poll finds (two calls per repo per pass).
//! Instead, at start-up and every `webhook.redeliver_interval`, this actor lists the hook's
//! deliveries newer than where the last pass left off (kept in the store, with a minute of
//! overlap), and for each failed `workflow_job` delivery whose guid the intake has not accepted,
//! no attempt of which succeeded, asks GitHub to redeliver it, once per guid. The delivery then
//! comes back through the normal signed intake. When nothing failed a pass costs one list call.

use std::collections::{BTreeMap, HashMap, HashSet};

use actix::{Actor, ActorContext, ActorFutureExt, AsyncContext, Context, Recipient, WrapFuture};
use serde::{Deserialize, Serialize};

use super::actor::{ExpectRedelivery, Unprocessed};
use crate::{
    github::{
        GithubError,
        actor::{FindHooks, ListHookDeliveries, Redeliver},
        hooks::{HookDelivery, HookRef},
    },
    metrics::Metrics,
    store::{Op, Store},
};

/// The store mark this actor keeps its place under.
pub(crate) const MARK: &str = "redeliver";
/// GitHub keeps a hook's deliveries, and redelivers them, for 3 days ("Redelivering webhooks",
/// docs.github.com).
pub(crate) const RETENTION: std::time::Duration = std::time::Duration::from_secs(3 * 24 * 3600);
/// A pass looks this far behind where the last one stopped: a slow delivery may be listed
/// after newer ones.
const OVERLAP_SECS: u64 = 60;
/// A pass reads at most this many pages (100 deliveries each).
const MAX_PAGES: usize = 30;
/// Guids asked for that are remembered at most.
const ASKED_CAPACITY: usize = 20_000;

/// Where the passes left off: per hook, the newest delivery time seen; and the guids GitHub
/// was asked to redeliver (each at most once), with when.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Place {
    /// Hook key -> unix seconds of the newest delivery listed.
    pub seen: BTreeMap<String, u64>,
    /// Guid -> unix seconds it was asked for.
    pub asked: BTreeMap<String, u64>,
}

impl Place {
    /// Forgets asks older than GitHub's retention, and the oldest past the cap.
    fn prune(&mut self, now: u64) {
        let floor = now.saturating_sub(RETENTION.as_secs());
        self.asked.retain(|_, at| *at >= floor);
        while self.asked.len() > ASKED_CAPACITY {
            let oldest = self
                .asked
                .iter()
                .min_by_key(|(_, at)| **at)
                .map(|(g, _)| g.clone());
            match oldest {
                Some(g) => self.asked.remove(&g),
                None => break,
            };
        }
    }
}

/// The failed `workflow_job` deliveries worth asking for again, as (attempt id, guid): not
/// older than `floor` (unix seconds), not asked for before, no attempt of the guid delivered,
/// and (checked after, against the intake) not accepted. One attempt per guid, the newest.
pub(crate) fn candidates(listed: &[HookDelivery], place: &Place, floor: u64) -> Vec<(u64, String)> {
    let delivered: HashSet<&str> = listed
        .iter()
        .filter(|d| d.delivered())
        .map(|d| d.guid.as_str())
        .collect();
    let mut newest: HashMap<&str, u64> = HashMap::new();
    for d in listed {
        let fresh = d.at_unix().is_some_and(|at| at >= floor);
        if d.event != "workflow_job"
            || d.delivered()
            || !fresh
            || delivered.contains(d.guid.as_str())
            || place.asked.contains_key(&d.guid)
        {
            continue;
        }
        let id = newest.entry(d.guid.as_str()).or_insert(d.id);
        *id = (*id).max(d.id);
    }
    let mut out: Vec<(u64, String)> = newest
        .into_iter()
        .map(|(guid, id)| (id, guid.to_string()))
        .collect();
    // Oldest first: jobs are claimed in the order they were queued.
    out.sort_unstable();
    out
}

/// What the actor talks to.
#[derive(Debug, Clone)]
pub struct RedeliverWiring {
    /// Finds the hooks.
    pub find: Recipient<FindHooks>,
    /// Lists a hook's deliveries.
    pub list: Recipient<ListHookDeliveries>,
    /// Asks for a redelivery.
    pub redeliver: Recipient<Redeliver>,
    /// Which guids the intake has not accepted.
    pub unprocessed: Recipient<Unprocessed>,
    /// Counts what comes back.
    pub expect: Recipient<ExpectRedelivery>,
}

/// `[webhook]` settings of the redelivery.
#[derive(Debug, Clone)]
pub struct RedeliverSettings {
    /// Between passes.
    pub interval: std::time::Duration,
    /// `webhook.hook_id`
    pub hook_id: Option<u64>,
    /// `webhook.public_url`
    pub public_url: Option<String>,
    /// `webhook.redeliver = true` was written: a hook that cannot be read is an error.
    pub insisted: bool,
    /// Deliveries older than this are not asked for (`runner.claim_retry.max_age`: a job that
    /// waited longer would be given up anyway).
    pub max_age: std::time::Duration,
    /// Fleet mode: every host watches the same hook and the ledger decides which host asks
    /// for each guid; passes wait while it is down (the intake would refuse the redelivery
    /// too, and each guid is asked for once).
    pub ledger: Option<crate::cluster::Ledger>,
    /// The store mark its place is kept under ([`MARK`] for the first target, [`mark_of`]
    /// for the others).
    pub mark: String,
    /// Where the ids of the hooks found are told to the intake, which then checks this
    /// target's deliveries with its secret alone ([`super::keys`]).
    pub learned: Option<std::sync::Arc<super::keys::HookIds>>,
}

/// The store mark of target `target`'s redelivery place (the first target keeps [`MARK`], as
/// a single target always did).
pub(crate) fn mark_of(index: usize, target: &str) -> String {
    if index == 0 {
        MARK.to_string()
    } else {
        format!("{MARK}:{target}")
    }
}

/// The actor.
#[derive(Debug)]
pub struct RedeliverActor {
    settings: RedeliverSettings,
    wiring: RedeliverWiring,
    store: Option<Store>,
    metrics: Metrics,
    place: Place,
    /// Found once; found again after a pass fails to list one.
    hooks: Option<Vec<HookRef>>,
    running: bool,
}

impl RedeliverActor {
    /// An actor starting from `place` (the store's mark).
    pub fn new(
        settings: RedeliverSettings,
        wiring: RedeliverWiring,
        store: Option<Store>,
        metrics: Metrics,
        place: Option<serde_json::Value>,
    ) -> Self {
        RedeliverActor {
            settings,
            wiring,
            store,
            metrics,
            place: place
                .and_then(|v| serde_json::from_value(v).ok())
                .unwrap_or_default(),
            hooks: None,
            running: false,
        }
    }

    fn pass(&mut self, ctx: &mut Context<Self>) {
        let ledger_down = self
            .settings
            .ledger
            .as_ref()
            .is_some_and(|l| !l.health().is_up());
        if self.running || ledger_down {
            return;
        }
        self.running = true;
        let work = one_pass(
            self.hooks.clone(),
            self.place.clone(),
            self.wiring.clone(),
            self.settings.clone(),
        );
        ctx.spawn(work.into_actor(self).map(|outcome, act, ctx| {
            act.running = false;
            act.settle(outcome, ctx);
        }));
    }

    fn settle(&mut self, outcome: Result<Outcome, PassError>, ctx: &mut Context<Self>) {
        let outcome = match outcome {
            Ok(o) => o,
            Err(PassError::NoHook) => {
                let how = "set webhook.public_url (the URL GitHub posts to) or webhook.hook_id";
                if self.settings.insisted || self.settings.public_url.is_some() {
                    tracing::error!(hook_id = %self.settings.hook_id.map_or_else(|| "unset".to_string(), |h| h.to_string()), public_url = self.settings.public_url.as_deref().unwrap_or("unset"), "webhook.redeliver: no hook matches; failed deliveries are left to the reconcile poll ({how})");
                } else {
                    tracing::info!(
                        "webhook.redeliver: no hook to watch, so failed deliveries are left to the reconcile poll ({how})"
                    );
                }
                ctx.stop();
                return;
            }
            Err(PassError::Ledger(e)) => {
                tracing::warn!(error = %e, "webhook.redeliver: the cluster ledger did not answer; trying again next interval");
                return;
            }
            Err(PassError::Github(e)) => {
                let denied = e.status().is_some_and(|s| s == 403 || s == 404);
                if denied && !self.settings.insisted {
                    tracing::info!(error = %e, "webhook.redeliver: the credential cannot read the hook's deliveries; failed deliveries are left to the reconcile poll");
                    ctx.stop();
                } else {
                    tracing::warn!(error = %e, "webhook.redeliver: this pass failed; trying again next interval");
                    self.hooks = None;
                }
                return;
            }
        };
        if self.hooks.is_none() {
            for hook in &outcome.hooks {
                tracing::info!(%hook, "webhook.redeliver: watching this hook's failed deliveries");
            }
            if let Some(book) = &self.settings.learned {
                book.learn(outcome.hooks.iter().filter_map(|hook| match hook {
                    HookRef::Org(id) | HookRef::Repo { id, .. } => Some(*id),
                    HookRef::App => None,
                }));
            }
        }
        self.hooks = Some(outcome.hooks);
        let count = |what: &str, n: usize| {
            self.metrics
                .webhook_redeliveries
                .with_label_values(&[what])
                .inc_by(n as u64);
        };
        count("requested", outcome.asked.len());
        count("failed", outcome.refused);
        if !outcome.asked.is_empty() {
            tracing::info!(
                count = outcome.asked.len(),
                "asked GitHub to redeliver failed workflow_job deliveries"
            );
        }
        let now = crate::clock::unix_now();
        for guid in outcome.asked {
            self.place.asked.insert(guid, now);
        }
        self.place.seen.extend(outcome.seen);
        self.place.prune(now);
        if let (Some(store), Ok(value)) = (&self.store, serde_json::to_value(&self.place)) {
            store.send(vec![Op::PutMark(self.settings.mark.clone(), value)]);
        }
    }
}

impl Actor for RedeliverActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.pass(ctx);
        ctx.run_interval(self.settings.interval, |act, ctx| act.pass(ctx));
    }
}

crate::stop_on_request!(RedeliverActor);

/// What one pass did.
struct Outcome {
    hooks: Vec<HookRef>,
    /// Guids GitHub accepted to redeliver.
    asked: Vec<String>,
    /// Asks GitHub refused (tried again next pass).
    refused: usize,
    /// Hook key -> where the next pass may start.
    seen: BTreeMap<String, u64>,
}

enum PassError {
    NoHook,
    Github(GithubError),
    Ledger(String),
}

impl From<GithubError> for PassError {
    fn from(e: GithubError) -> Self {
        PassError::Github(e)
    }
}

fn mailbox(e: actix::MailboxError) -> PassError {
    PassError::Github(GithubError::Network {
        endpoint: "list_hook_deliveries",
        detail: format!("the GitHub actor is gone: {e}"),
    })
}

async fn one_pass(
    hooks: Option<Vec<HookRef>>,
    place: Place,
    to: RedeliverWiring,
    settings: RedeliverSettings,
) -> Result<Outcome, PassError> {
    let hooks = match hooks {
        Some(h) => h,
        None => {
            let find = FindHooks {
                hook_id: settings.hook_id,
                public_url: settings.public_url.clone(),
            };
            to.find.send(find).await.map_err(mailbox)??
        }
    };
    if hooks.is_empty() {
        return Err(PassError::NoHook);
    }
    let now = crate::clock::unix_now();
    let oldest = now.saturating_sub(settings.max_age.min(RETENTION).as_secs());
    let mut out = Outcome {
        hooks: hooks.clone(),
        asked: Vec::new(),
        refused: 0,
        seen: BTreeMap::new(),
    };
    for hook in hooks {
        let key = hook.key();
        let since = place
            .seen
            .get(&key)
            .map_or(oldest, |at| at.saturating_sub(OVERLAP_SECS).max(oldest));
        let listed = list_since(&to, &hook, since).await?;
        let newest = listed.iter().filter_map(HookDelivery::at_unix).max();
        let wanted = narrow(&to, &settings, candidates(&listed, &place, since)).await?;
        let hold = ask(&to, &settings, &hook, wanted, &listed, &mut out).await?;
        if let Some(at) = hold.or(newest) {
            out.seen.insert(key, at.max(since));
        }
    }
    Ok(out)
}

/// `hook`'s deliveries back to `since` (the page that reaches it is the last read, and
/// [`MAX_PAGES`] at most).
async fn list_since(
    to: &RedeliverWiring,
    hook: &HookRef,
    since: u64,
) -> Result<Vec<HookDelivery>, PassError> {
    let mut listed: Vec<HookDelivery> = Vec::new();
    let mut cursor = None;
    for _ in 0..MAX_PAGES {
        let ask = ListHookDeliveries {
            hook: hook.clone(),
            cursor: cursor.take(),
        };
        let (page, next) = to.list.send(ask).await.map_err(mailbox)??;
        let reached = page
            .iter()
            .any(|d| d.at_unix().is_some_and(|at| at < since));
        listed.extend(page);
        match next {
            Some(n) if !reached => cursor = Some(n),
            _ => break,
        }
    }
    Ok(listed)
}

/// Of the failed deliveries `wanted`, those still unprocessed here and (fleet mode) this
/// host's to ask for; the intake is told of them before the ask.
async fn narrow(
    to: &RedeliverWiring,
    settings: &RedeliverSettings,
    mut wanted: Vec<(u64, String)>,
) -> Result<Vec<(u64, String)>, PassError> {
    if !wanted.is_empty() {
        let guids = wanted.iter().map(|(_, g)| g.clone()).collect();
        let open: HashSet<String> = to
            .unprocessed
            .send(Unprocessed(guids))
            .await
            .map_err(mailbox)?
            .into_iter()
            .collect();
        wanted.retain(|(_, g)| open.contains(g));
    }
    // Fleet mode: one host asks for each guid.
    if let Some(ledger) = settings.ledger.as_ref().filter(|_| !wanted.is_empty()) {
        let guids: Vec<String> = wanted.iter().map(|(_, g)| g.clone()).collect();
        let mine: HashSet<String> = ledger
            .take_redeliveries(&guids)
            .await
            .map_err(|e| PassError::Ledger(e.to_string()))?
            .into_iter()
            .collect();
        wanted.retain(|(_, g)| mine.contains(g));
    }
    // Told before asking: GitHub may redeliver before the ask is even answered.
    if !wanted.is_empty() {
        let guids = wanted.iter().map(|(_, g)| g.clone()).collect();
        let _ = to.expect.send(ExpectRedelivery(guids)).await;
    }
    Ok(wanted)
}

/// Asks GitHub to redeliver each of `wanted`; answers how far the place may move: before
/// the oldest refused ask (tried again next pass), if any.
async fn ask(
    to: &RedeliverWiring,
    settings: &RedeliverSettings,
    hook: &HookRef,
    wanted: Vec<(u64, String)>,
    listed: &[HookDelivery],
    out: &mut Outcome,
) -> Result<Option<u64>, PassError> {
    // A refused ask is tried again: the place stays before it.
    let mut hold: Option<u64> = None;
    for (id, guid) in wanted {
        let ask = Redeliver {
            hook: hook.clone(),
            delivery_id: id,
        };
        match to.redeliver.send(ask).await.map_err(mailbox)? {
            Ok(()) => out.asked.push(guid),
            Err(e) => {
                tracing::warn!(%hook, delivery = id, error = %e, "GitHub refused to redeliver a failed delivery; asking again next pass");
                out.refused += 1;
                if let Some(ledger) = &settings.ledger
                    && let Err(e) = ledger.give_back_redelivery(&guid).await
                {
                    tracing::warn!(error = %e, "cannot give the redelivery back to the fleet");
                }
                let at = listed
                    .iter()
                    .find(|d| d.id == id)
                    .and_then(HookDelivery::at_unix);
                if let Some(at) = at {
                    hold = Some(hold.map_or(at, |h| h.min(at)));
                }
            }
        }
    }
    Ok(hold)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn d(id: u64, guid: &str, at: &str, status: &str, event: &str) -> HookDelivery {
        HookDelivery {
            id,
            guid: guid.into(),
            delivered_at: at.into(),
            redelivery: false,
            status: status.into(),
            status_code: if status == "OK" { 202 } else { 0 },
            event: event.into(),
            action: Some("queued".into()),
        }
    }

    const T0: u64 = 1_796_090_400; // 2026-12-01T02:00:00Z

    #[test]
    fn only_failed_workflow_jobs_never_delivered_nor_asked_are_chosen() {
        let listed = vec![
            d(
                9,
                "a",
                "2026-12-01T02:05:00Z",
                "failed to connect to host",
                "workflow_job",
            ),
            d(8, "b", "2026-12-01T02:04:00Z", "OK", "workflow_job"),
            // A failed attempt of a guid another attempt delivered: done.
            d(
                7,
                "b",
                "2026-12-01T02:03:00Z",
                "Invalid HTTP Response: 503",
                "workflow_job",
            ),
            d(
                6,
                "c",
                "2026-12-01T02:03:00Z",
                "Invalid HTTP Response: 503",
                "ping",
            ),
            d(
                5,
                "d",
                "2026-12-01T02:02:00Z",
                "Invalid HTTP Response: 503",
                "workflow_job",
            ),
            // Older than the floor.
            d(
                4,
                "e",
                "2026-12-01T01:00:00Z",
                "Invalid HTTP Response: 503",
                "workflow_job",
            ),
            d(
                3,
                "f",
                "2026-12-01T02:01:00Z",
                "Invalid HTTP Response: 503",
                "workflow_job",
            ),
            d(
                2,
                "a",
                "2026-12-01T02:00:30Z",
                "failed to connect to host",
                "workflow_job",
            ),
        ];
        let mut place = Place::default();
        place.asked.insert("f".into(), T0);
        let chosen = candidates(&listed, &place, T0);
        assert_eq!(chosen, vec![(5, "d".to_string()), (9, "a".to_string())]);
    }

    #[test]
    fn asks_older_than_github_s_retention_are_forgotten() {
        let mut place = Place::default();
        place
            .asked
            .insert("old".into(), T0 - RETENTION.as_secs() - 1);
        place.asked.insert("new".into(), T0 - 10);
        place.prune(T0);
        assert_eq!(place.asked.keys().collect::<Vec<_>>(), vec!["new"]);
    }
}
