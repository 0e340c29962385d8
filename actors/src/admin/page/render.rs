//! The status page's HTML, server-rendered with maud: every value from GitHub or the config
//! (repo names, labels, job names, pool names, errors) goes through maud's escaping; only the
//! page's own constant markup is not.

use maud::{DOCTYPE, Markup, html};

use super::bar::{Bar, Mark, Span};
use crate::{
    admin::api::{JobAnswer, StatusAnswer},
    scheduler::core::{JobView, Phase},
    vocab::RateBucket,
};

/// "3m 20s", "2h 5m", "45s".
pub(super) fn age(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m {}s", s / 60, s % 60),
        s if s < 86_400 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        s => format!("{}d {}h", s / 86_400, (s % 86_400) / 3600),
    }
}

/// A span of `ms` milliseconds: tenths of a second under ten seconds (a claim, a boot),
/// else as [`age`].
pub(super) fn span_age(ms: u64) -> String {
    if ms < 10_000 {
        format!("{}.{}s", ms / 1000, (ms % 1000) / 100)
    } else {
        age(ms / 1000)
    }
}

/// A unix time as UTC, `2026-12-03 01:02:03`.
fn utc(unix: u64) -> String {
    let secs = unix % 86_400;
    let days = (unix / 86_400) as i64;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        (secs % 3600) / 60,
        secs % 60
    )
}

/// The page around `body`: its title, the stylesheet and the script (both served by the
/// admin listener itself: nothing from elsewhere).
pub(super) fn layout(title: &str, body: Markup) -> Markup {
    page(title, body, false)
}

fn page(title: &str, body: Markup, needs_token: bool) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · ephemer-actors" }
                link rel="stylesheet" href="/assets/page.css";
                script src="/assets/page.js" defer {}
                noscript { meta http-equiv="refresh" content="5"; }
            }
            body {
                header {
                    a href="/" { "ephemer-actors" }
                    nav aria-label="Pages" { a href="/" { "Status" } " · " a href="/jobs" { "Jobs" } " · " a href="/usage" { "Usage" } }
                    span.live aria-live="polite" id="live" { "refreshes every 5 s while shown" }
                }
                // Posted, never sent as a query: with scripts off the browser submits the form itself,
                // and a GET would put the token in the URL, the history and the server's log.
                form #login method="post" hidden[!needs_token] aria-label="Admin token" {
                    label for="token" { "This listener needs the admin token (kept in this page only):" }
                    input #token name="token" type="password" autocomplete="off" required;
                    button type="submit" { "Show" }
                }
                main #main { (body) }
            }
        }
    }
}

/// Shown in place of a page the listener will not show without the token.
pub(super) fn login() -> Markup {
    page(
        "Admin token needed",
        html! {
            h1 { "Admin token needed" }
            p { "Reads on a listener that is not loopback need the admin token (" code { "state.dir/admin.token" } "). Or reach the loopback listener through an SSH tunnel: see docs/operations.md." }
        },
        true,
    )
}

fn meter(label: &str, value: u64, max: u64, text: String) -> Markup {
    html! {
        div.meter {
            span.meter-label { (label) }
            meter min="0" max=(max.max(1)) value=(value) aria-label=(label) {}
            span.meter-text { (text) }
        }
    }
}

/// The queue states the overview counts, in order, with their words.
pub(super) const STATES: [(&str, &str); 6] = [
    ("pending", "waiting for a slot or a claim token"),
    ("claiming", "claim in flight"),
    ("retrying", "on the retry ladder"),
    ("parked", "parked until a look"),
    ("active", "runner booting or running"),
    ("done", "started or finished"),
];

pub(super) fn state_of(phase: &Phase) -> Option<&'static str> {
    Some(match phase {
        Phase::Pending => "pending",
        Phase::Claiming { .. } => "claiming",
        Phase::Retrying => "retrying",
        Phase::Parked { .. } => "parked",
        Phase::Active { .. } => "active",
        Phase::Done => "done",
        Phase::Seen | Phase::Unroutable | Phase::Ignored => return None,
    })
}

/// When a job arrived (its first note), unix seconds.
fn arrived(job: &JobView) -> Option<u64> {
    job.arrived_unix
}

/// `GET /`: targets and their budgets, pools, the queue by state, fleet hosts, and the jobs
/// not done, oldest first.
pub(super) fn overview(status: &StatusAnswer, jobs: &[JobView], now: u64) -> Markup {
    let s = &status.scheduler;
    let mut open: Vec<&JobView> = jobs
        .iter()
        .filter(|j| matches!(state_of(&j.phase), Some(st) if st != "done"))
        .collect();
    open.sort_by_key(|j| arrived(j).unwrap_or(now));
    let body = html! {
        h1 { "Status" }
        p {
            "Version " (status.version) ", up " (age(status.uptime_seconds)) ". "
            @if s.shutting_down { strong.bad { "Shutting down (draining)." } }
            @else if s.draining { strong.bad { "Cordoned: no new job is admitted." } }
            @else { "Admitting jobs." }
            " Slots " (s.capacity.used) " of " (s.capacity.max_concurrent) " in use."
        }
        (budgets(s, now))
        (pools(s))
        @if let Some(r) = &status.runner { (runner(r, now)) }
        (last_hour(s))
        (queue(s, jobs, now))
        @if let Some(fleet) = &status.fleet { (fleet_hosts(fleet)) }
        (open_jobs(&open, now))
    };
    layout("Status", body)
}

/// Each target's rate budgets.
fn budgets(s: &crate::scheduler::core::StatusView, now: u64) -> Markup {
    html! {
    section aria-labelledby="h-targets" {
        h2 #h-targets { "GitHub budgets" }
        @for t in &s.targets {
            article.card {
                h3 { (t.name) " (" (t.owner) ")" }
                p { (t.held) " slots held, " (t.pending) " jobs waiting" }
                @for (bucket, r) in &t.rate {
                    @let limit = r.limit.unwrap_or(0);
                    @let left = r.remaining.unwrap_or(0);
                    @let reset = r.reset.map(|at| format!(", resets in {} ({})", age(at.saturating_sub(now)), utc(at))).unwrap_or_default();
                    (meter(bucket_name(*bucket), left, limit, format!("{left} of {limit} left{reset}")))
                }
                @if t.rate.is_empty() { p.muted { "No rate reading yet." } }
            }
        }
    }
    }
}

/// The pools: state, slots, warm environments, labels.
fn pools(s: &crate::scheduler::core::StatusView) -> Markup {
    html! {
    section aria-labelledby="h-pools" {
        h2 #h-pools { "Pools" }
        div.scroll { table {
            thead { tr { th scope="col" { "Pool" } th scope="col" { "State" } th scope="col" { "Slots" } th scope="col" { "Warm" } th scope="col" { "Labels" } } }
            tbody {
                @for p in &s.providers {
                    tr {
                        th scope="row" {
                            (p.provider.as_str()) br; small { (p.provisioner) }
                            @if let Some(accel) = &p.accel { br; small { "accel " (accel) } }
                        }
                        td {
                            @if p.up { span.good { "up" } } @else { span.bad { "down" } }
                            @if let Some(cause) = &p.down_cause { br; small { (cause) } }
                            @if let Some(refusal) = &p.refusal { br; small.bad { (refusal) } }
                            @if p.environment_failures > 0 { br; small { (p.environment_failures) " environments failed" } }
                        }
                        td { (meter("slots", p.used as u64, p.max as u64, format!("{} of {}", p.used, p.max))) }
                        td { @if let Some(w) = &p.warm { (w.available) " ready, " (w.booting) " booting, of " (w.target) } @else { "none" } }
                        td { @for l in &p.labels { code.label { (l) } " " } }
                    }
                }
            }
        } }
    }
    }
}

/// The runner's latest release and each pool's version, with how long it has been behind:
/// GitHub refuses a runner 30 days after a newer release, so past three weeks it is marked.
fn runner(r: &crate::release::actor::RunnerReleaseView, now: u64) -> Markup {
    html! {
    section aria-labelledby="h-runner" {
        h2 #h-runner { "Runner" }
        p {
            "Latest release "
            @match &r.latest { Some(v) => code { (v.to_string()) }, None => "unknown" }
            @if let Some(at) = r.latest_published_unix.filter(|at| *at > 0) {
                ", published " (age(now.saturating_sub(at))) " ago"
            }
            "; auto_update " @if r.auto_update { "on" } @else { "off" } "."
            @if let Some(problem) = &r.problem { br; span.bad { (problem) } }
        }
        @if !r.pools.is_empty() {
            div.scroll { table {
                thead { tr { th scope="col" { "Pool" } th scope="col" { "Version" } th scope="col" { "Age" } th scope="col" { "Kept by" } } }
                tbody {
                    @for p in &r.pools {
                        tr {
                            th scope="row" { (p.pool) }
                            td { @match &p.version { Some(v) => code { (v.to_string()) }, None => "none yet" } }
                            td {
                                @match p.behind_seconds {
                                    Some(0) => span.good { "current" },
                                    Some(s) if s > crate::release::BEHIND_CUTOFF_WARN => {
                                        span.bad { "behind by " (age(s)) } br;
                                        small { "GitHub refuses it 30 days after the newer release: update it now" }
                                    },
                                    Some(s) => { "behind by " (age(s)) },
                                    None => span.muted { "latest unknown" },
                                }
                            }
                            td { @if p.managed { "the daemon" } @else { "the operator" } }
                        }
                    }
                }
            } }
        }
    }
    }
}

/// Each pool's last hour, as a chart.
fn last_hour(s: &crate::scheduler::core::StatusView) -> Markup {
    html! {
    section aria-labelledby="h-hour" {
        h2 #h-hour { "The last hour" }
        div.hours { @for h in &s.last_hour { (super::chart::pool_hour(h)) } }
    }
    }
}

/// The jobs by state, with the oldest of each.
fn queue(s: &crate::scheduler::core::StatusView, jobs: &[JobView], now: u64) -> Markup {
    html! {
    section aria-labelledby="h-queue" {
        h2 #h-queue { "Queue" }
        div.scroll { table {
            thead { tr { th scope="col" { "State" } th scope="col" { "Jobs" } th scope="col" { "Oldest" } } }
            tbody {
                @for (state, words) in STATES {
                    @let these: Vec<&JobView> = jobs.iter().filter(|j| state_of(&j.phase) == Some(state)).collect();
                    @let oldest = these.iter().filter_map(|j| arrived(j)).min();
                    tr class={ "q-" (state) } {
                        th scope="row" { (state) br; small { (words) } }
                        td { (these.len()) }
                        td { @if let Some(at) = oldest { (age(now.saturating_sub(at))) } @else { "-" } }
                    }
                }
            }
        } }
        p { (s.retry_queue_depth) " on the ladder; " (s.runners) " runners alive." }
    }
    }
}

/// Fleet mode: the hosts and their leases.
fn fleet_hosts(fleet: &crate::cluster::FleetView) -> Markup {
    html! {
    section aria-labelledby="h-fleet" {
        h2 #h-fleet { "Fleet" }
        p { "This host: " (fleet.me) ". " (fleet.queued) " jobs recorded and not claimed by any host." }
        div.scroll { table {
            thead { tr { th scope="col" { "Host" } th scope="col" { "Lease" } th scope="col" { "Slots" } th scope="col" { "Holding" } } }
            tbody {
                @for h in &fleet.hosts {
                    tr {
                        th scope="row" { (h.host) }
                        td { @if h.alive { span.good { "current, " (h.lease_secs) " s left" } } @else { span.bad { "expired " (-h.lease_secs) " s ago" } } }
                        td { (h.used) " of " (h.capacity) }
                        td { (h.holding) }
                    }
                }
            }
        } }
    }
    }
}

/// The jobs not done, oldest first (200 at most).
fn open_jobs(open: &[&JobView], now: u64) -> Markup {
    html! {
    section aria-labelledby="h-jobs" {
        h2 #h-jobs { "Jobs not started (" (open.len()) ")" }
        @if open.is_empty() { p.muted { "None." } } @else {
            div.scroll { table {
                thead { tr { th scope="col" { "Job" } th scope="col" { "Repo" } th scope="col" { "Workflow, branch" } th scope="col" { "Labels" } th scope="col" { "State" } th scope="col" { "Waiting" } th scope="col" { "Next" } } }
                tbody {
                    @for j in open.iter().take(200) {
                        tr class={ "q-" (state_of(&j.phase).unwrap_or("")) } {
                            th scope="row" { (job_link(j)) }
                            td { (j.key.owner) "/" (j.repo) }
                            td { (workflow_branch(j)) }
                            td { @for l in &j.labels { code.label { (l) } " " } }
                            td { (state_of(&j.phase).unwrap_or("")) @if j.retry_attempts > 0 { " (" (j.retry_attempts) " failed)" } }
                            td { @if let Some(at) = arrived(j) { (age(now.saturating_sub(at))) } }
                            td { @if let Some(next) = j.next_attempt_unix { "retry in " (age(next.saturating_sub(now))) } }
                        }
                    }
                }
            } }
        }
    }
    }
}

/// A job's link: its name where known, with its id.
pub(super) fn job_link(j: &JobView) -> Markup {
    let name = j
        .about
        .as_ref()
        .map(|a| a.name.as_str())
        .filter(|n| !n.is_empty());
    html! {
        a href={ "/jobs/" (j.key.job_id) } {
            @if let Some(name) = name { (name) " " small { "(" (j.key.job_id) ")" } } @else { (j.key.job_id) }
        }
    }
}

/// "ci · main", or what of it is known.
pub(super) fn workflow_branch(j: &JobView) -> Markup {
    let Some(a) = j.about.as_deref() else {
        return html! {};
    };
    html! {
        (a.workflow)
        @if !a.workflow.is_empty() && !a.branch.is_empty() { " · " }
        @if !a.branch.is_empty() { code { (a.branch) } }
    }
}

fn bucket_name(bucket: RateBucket) -> &'static str {
    match bucket {
        RateBucket::Core => "core (REST calls)",
        RateBucket::ActionsRunnerRegistration => "runner registrations",
        RateBucket::Other => "other",
    }
}

/// The bar as SVG, 1000 units wide: a rectangle per span, a line per moment, each with its
/// words as a tooltip; the text timeline under it says the same for a screen reader.
fn bar_svg(b: &Bar) -> Markup {
    let width = (b.to.saturating_sub(b.from)).max(1) as f64;
    let x = |t: u64| (t.saturating_sub(b.from)) as f64 / width * 1000.0;
    let mut seen: Vec<Span> = Vec::new();
    for (span, _, _) in &b.spans {
        if !seen.contains(span) {
            seen.push(*span);
        }
    }
    html! {
        figure.bar {
            svg viewBox="0 0 1000 40" preserveAspectRatio="none" role="img" aria-label={ "Timeline over " (span_age(b.to - b.from)) ", in " (b.spans.len()) " spans" } {
                @for (span, from, to) in &b.spans {
                    @let (class, words) = span.class();
                    rect class=(class) x=(format!("{:.1}", x(*from))) y="4" width=(format!("{:.1}", (x(*to) - x(*from)).max(4.0))) height="32" {
                        title { (words) ", " (span_age(to - from)) }
                    }
                }
                @for (mark, at) in &b.marks {
                    @let (class, words) = match mark { Mark::ClaimFailed => ("m-fail", "claim failed"), Mark::Swap => ("m-swap", "runners swapped"), Mark::End => ("m-end", "end") };
                    line class=(class) x1=(format!("{:.1}", x(*at))) x2=(format!("{:.1}", x(*at))) y1="0" y2="40" {
                        title { (words) }
                    }
                }
            }
            figcaption {
                @for span in &seen {
                    @let (class, words) = span.class();
                    span.legend { span class={ "swatch " (class) } aria-hidden="true" {} (words) }
                }
                " Lines: red, a failed claim; violet, a swap; black, the end."
            }
        }
    }
}

/// The job's workflow, branch, run and trigger, where known.
fn about(j: &JobView) -> Markup {
    let a = j.about.as_deref();
    let given = |s: &str| (!s.is_empty()).then(|| s.to_owned());
    html! {
        dl.about {
            @if let Some(w) = a.and_then(|a| given(&a.workflow)) { dt { "Workflow" } dd { (w) } }
            @if let Some(b) = a.and_then(|a| given(&a.branch)) { dt { "Branch" } dd { code { (b) } } }
            @if j.run_id != 0 { dt { "Run" } dd { (j.run_id) ", attempt " (j.run_attempt) } }
            @if let Some(s) = a.and_then(|a| given(&a.sender)) { dt { "Triggered by" } dd { (s) } }
        }
    }
}

/// `GET /jobs/ID`: the job's bar, its facts and its timeline in words (`now_ms`: unix
/// milliseconds).
pub(super) fn job(detail: &JobAnswer, web: Option<&str>, now_ms: u64) -> Markup {
    let now = now_ms / 1000;
    let j = &detail.job;
    let link = web.filter(|_| j.run_id != 0).map(|w| {
        format!(
            "{w}/{}/{}/actions/runs/{}/job/{}",
            j.key.owner, j.repo, j.run_id, j.key.job_id
        )
    });
    let body = html! {
        h1 {
            @if let Some(name) = j.about.as_ref().map(|a| a.name.as_str()).filter(|n| !n.is_empty()) { (name) " " small.muted { "job " (j.key.job_id) } }
            @else { "Job " (j.key.job_id) }
        }
        p {
            (j.key.owner) "/" (j.repo) " · "
            @for l in &j.labels { code.label { (l) } " " }
            @if let Some(link) = &link { " · " a href=(link) rel="noreferrer" { "the job on GitHub" } }
        }
        (about(j))
        @if let Some(b) = super::bar::bar(&j.timeline, now_ms) { (bar_svg(&b)) }
        dl {
            dt { "State" } dd { (state_of(&j.phase).unwrap_or("not dispatched")) }
            dt { "Dispatches" } dd { (j.admissions) }
            dt { "Failed claims" } dd { (j.retry_attempts) @if let Some(c) = j.error_class { " (" (c.as_str()) ")" } }
            @if let Some(next) = j.next_attempt_unix { dt { "Next attempt" } dd { "in " (age(next.saturating_sub(now))) " (" (utc(next)) ")" } }
            @if let Some(r) = &j.runner_name { dt { "Taken by" } dd { code { (r) } } }
            @if let Some(l) = &detail.ledger { dt { "Cluster ledger" } dd { (l.phase) @if let Some(h) = &l.holder { ", held by " (h) } ": " (l.why) } }
        }
        h2 { "Timeline" }
        ol.timeline {
            @for e in &j.timeline {
                li { time { (utc(e.at())) } " " (e.note.to_string()) }
            }
        }
    };
    layout(&format!("Job {}", j.key.job_id), body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_read_as_people_write_them() {
        assert_eq!(age(45), "45s");
        assert_eq!(age(200), "3m 20s");
        assert_eq!(age(7500), "2h 5m");
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(1_796_259_723), "2026-12-03 01:02:03 UTC");
    }
}
