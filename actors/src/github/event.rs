//! The `workflow_job` webhook payload, typed: only the fields the daemon acts on.
//!
//! Parsing distinguishes bytes that are not JSON (400) from JSON of the wrong shape (422).

use serde::{Deserialize, Deserializer};

use std::{borrow::Cow, sync::Arc};

use crate::job::{JobAbout, JobAction, JobInfo, JobKey};

/// Why a body was not a usable `workflow_job` payload.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PayloadError {
    /// Not JSON at all (HTTP 400).
    #[error("malformed JSON: {0}")]
    Malformed(String),
    /// JSON, but not a `workflow_job` payload (HTTP 422).
    #[error("not a workflow_job payload: {0}")]
    WrongShape(String),
}

// The strings borrow from the body where they can (one with an escape is copied): the intake
// parses every delivery, and keeps only what `JobInfo` holds.
#[derive(Debug, Deserialize)]
struct Payload<'a> {
    #[serde(borrow)]
    action: Cow<'a, str>,
    #[serde(borrow)]
    workflow_job: WorkflowJob<'a>,
    #[serde(borrow)]
    repository: Repository<'a>,
    #[serde(default)]
    installation: Option<Installation>,
    #[serde(default, borrow)]
    sender: Option<Owner<'a>>,
}

#[derive(Debug, Deserialize)]
struct WorkflowJob<'a> {
    id: u64,
    #[serde(deserialize_with = "whole_number")]
    run_id: u64,
    #[serde(default = "first_attempt")]
    run_attempt: u32,
    labels: Vec<String>,
    #[serde(default)]
    runner_id: Option<u64>,
    #[serde(default, borrow)]
    runner_name: Option<Text<'a>>,
    #[serde(default, borrow)]
    conclusion: Option<Text<'a>>,
    #[serde(default, borrow)]
    created_at: Option<Text<'a>>,
    #[serde(default, borrow)]
    started_at: Option<Text<'a>>,
    #[serde(default, borrow)]
    name: Option<Text<'a>>,
    #[serde(default, borrow)]
    workflow_name: Option<Text<'a>>,
    #[serde(default, borrow)]
    head_branch: Option<Text<'a>>,
}

/// A string that borrows from the body even inside an `Option`: serde borrows a `Cow` field
/// marked `borrow` only when it is the field itself, and copies one inside an `Option` into a
/// `String` (one allocation per optional field per delivery).
#[derive(Debug, Deserialize)]
struct Text<'a>(#[serde(borrow)] Cow<'a, str>);

impl Text<'_> {
    fn as_str(&self) -> &str {
        &self.0
    }
}

#[derive(Debug, Deserialize)]
struct Repository<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
    #[serde(borrow)]
    owner: Owner<'a>,
}

#[derive(Debug, Deserialize)]
struct Owner<'a> {
    #[serde(borrow)]
    login: Cow<'a, str>,
}

#[derive(Debug, Deserialize)]
struct Installation {
    id: u64,
}

fn first_attempt() -> u32 {
    1
}

/// The webhook schema types `run_id` as a JSON number; accept `123` and `123.0`.
fn whole_number<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    let n = serde_json::Number::deserialize(d)?;
    n.as_u64()
        .or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                .map(|f| f as u64)
        })
        .ok_or_else(|| serde::de::Error::custom("run_id must be a non-negative whole number"))
}

/// A parsed delivery: the action (`None` for actions the daemon does not know) and the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkflowJobDelivery {
    /// Known action, or `None` (ignored, still answered 202).
    pub action: Option<JobAction>,
    /// What the delivery says about the job.
    pub job: JobInfo,
}

/// Parses a `workflow_job` body.
pub fn parse_workflow_job(body: &[u8]) -> Result<WorkflowJobDelivery, PayloadError> {
    let payload: Payload<'_> = serde_json::from_slice(body).map_err(|e| {
        use serde_json::error::Category;
        match e.classify() {
            Category::Syntax | Category::Eof | Category::Io => {
                PayloadError::Malformed(e.to_string())
            }
            Category::Data => PayloadError::WrongShape(e.to_string()),
        }
    })?;
    // Names from the payload go into URLs (and runner names); refuse what GitHub would not
    // allow before they reach one.
    if !valid_repo_name(&payload.repository.name) {
        return Err(PayloadError::WrongShape(format!(
            "repository name {:?} has characters GitHub does not allow",
            payload.repository.name
        )));
    }
    if !valid_login(&payload.repository.owner.login) {
        return Err(PayloadError::WrongShape(format!(
            "owner login {:?} has characters GitHub does not allow",
            payload.repository.owner.login
        )));
    }
    let about = about(&payload.workflow_job, payload.sender.as_ref());
    let runner_name = payload
        .workflow_job
        .runner_name
        .filter(|n| !n.as_str().is_empty())
        .map(|n| n.0.into_owned());
    Ok(WorkflowJobDelivery {
        action: JobAction::parse(&payload.action),
        job: JobInfo {
            key: JobKey::new(&payload.repository.owner.login, payload.workflow_job.id),
            repo: Arc::from(payload.repository.name.as_ref()),
            run_id: payload.workflow_job.run_id,
            run_attempt: payload.workflow_job.run_attempt,
            labels: payload.workflow_job.labels.into(),
            runner_name,
            runner_id: payload.workflow_job.runner_id.filter(|id| *id != 0),
            conclusion: payload
                .workflow_job
                .conclusion
                .as_ref()
                .map(|c| Arc::from(c.as_str())),
            installation_id: payload.installation.map(|i| i.id),
            github_wait_secs: crate::clock::github_wait(
                payload.workflow_job.created_at.as_ref().map(Text::as_str),
                payload.workflow_job.started_at.as_ref().map(Text::as_str),
            ),
            github_created_unix: crate::clock::github_unix(
                payload.workflow_job.created_at.as_ref().map(Text::as_str),
            ),
            withdrawn: false,
            about,
        },
    })
}

/// What a person reads about the job: its name, workflow, branch and who triggered it.
fn about(job: &WorkflowJob<'_>, sender: Option<&Owner<'_>>) -> Option<Arc<JobAbout>> {
    JobAbout::new(
        text(&job.name),
        text(&job.workflow_name),
        text(&job.head_branch),
        sender.map_or("", |s| s.login.as_ref()),
    )
    .map(Arc::new)
}

fn text<'s>(s: &'s Option<Text<'_>>) -> &'s str {
    s.as_ref().map_or("", Text::as_str)
}

/// A repository name GitHub allows: ASCII letters, digits, `.`, `-`, `_`; at most 100; not `.`
/// or `..`.
pub fn valid_repo_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 100
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// An account login GitHub allows: ASCII letters, digits, `-` (and `_` for enterprise managed
/// users); at most 100.
pub fn valid_login(login: &str) -> bool {
    !login.is_empty()
        && login.len() <= 100
        && login
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
}

/// Builds a realistic `workflow_job` body (used by the stand-in GitHub and tests).
pub fn render_workflow_job(action: &str, job: &JobInfo) -> String {
    render_workflow_job_at(action, job, None, None)
}

/// [`render_workflow_job`] with the job's `created_at` and `started_at` (unix seconds), as
/// GitHub sends them.
pub fn render_workflow_job_at(
    action: &str,
    job: &JobInfo,
    created_at: Option<u64>,
    started_at: Option<u64>,
) -> String {
    let status = JobAction::parse(action).map_or("queued", JobAction::as_str);
    let name = format!("job-{}", job.key.job_id);
    let about = job.about.as_deref();
    let say = |pick: fn(&JobAbout) -> &str, or: &'static str| -> String {
        about.map(pick).filter(|s| !s.is_empty()).unwrap_or(or).to_owned()
    };
    serde_json::json!({
        "action": action,
        "workflow_job": {
            "id": job.key.job_id,
            "run_id": job.run_id,
            "run_attempt": job.run_attempt,
            "status": status,
            "conclusion": job.conclusion,
            "labels": job.labels,
            "runner_id": job.runner_id,
            "runner_name": job.runner_name,
            "runner_group_id": job.runner_name.as_ref().map(|_| 1),
            "name": about.map(|a| a.name.clone()).filter(|s| !s.is_empty()).unwrap_or(name),
            "workflow_name": say(|a| &a.workflow, "ci"),
            "head_branch": say(|a| &a.branch, "main"),
            "created_at": created_at.map(crate::clock::rfc3339),
            "started_at": started_at.map(crate::clock::rfc3339),
        },
        "repository": {
            "name": job.repo,
            "full_name": format!("{}/{}", job.key.owner, job.repo),
            "owner": { "login": job.key.owner },
        },
        "installation": job.installation_id.map(|id| serde_json::json!({ "id": id })),
        "sender": { "login": say(|a| &a.sender, "octocat") },
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const QUEUED: &str = r#"{
      "action": "queued",
      "workflow_job": {"id": 29679449, "run_id": 10000000001.0, "run_attempt": 1,
        "status": "queued", "conclusion": null, "labels": ["self-hosted", "linux"],
        "runner_id": null, "runner_name": null, "runner_group_id": null},
      "repository": {"name": "hello", "full_name": "Acme/hello", "owner": {"login": "Acme"}},
      "installation": {"id": 42}
    }"#;

    /// A repository or owner name GitHub would not allow never gets past the parser (it would
    /// otherwise reach a URL): 422.
    #[test]
    fn names_github_does_not_allow_are_the_wrong_shape() {
        for repo in ["..", ".", "a/b", "../../etc", "a b", "", "ä"] {
            let body = QUEUED.replace("\"name\": \"hello\"", &format!("\"name\": {repo:?}"));
            assert!(
                matches!(
                    parse_workflow_job(body.as_bytes()),
                    Err(PayloadError::WrongShape(_))
                ),
                "{repo:?}"
            );
        }
        let body = QUEUED.replace("\"login\": \"Acme\"", "\"login\": \"ac/me\"");
        assert!(matches!(
            parse_workflow_job(body.as_bytes()),
            Err(PayloadError::WrongShape(_))
        ));
        assert!(valid_repo_name("my.repo-name_2") && valid_login("octo-cat_emu"));
    }

    #[test]
    fn parses_a_queued_delivery() {
        let d = parse_workflow_job(QUEUED.as_bytes()).unwrap();
        assert_eq!(d.action, Some(JobAction::Queued));
        assert_eq!(d.job.key, JobKey::new("acme", 29679449));
        assert_eq!(d.job.run_id, 10_000_000_001);
        assert_eq!(*d.job.labels, ["self-hosted", "linux"]);
        assert_eq!(d.job.installation_id, Some(42));
        assert_eq!(d.job.runner_name, None);
    }

    /// GitHub's `created_at` and `started_at` give the job's wait by GitHub's clock; a queued
    /// delivery (no `started_at`) and a start before the creation give none.
    #[test]
    fn an_in_progress_delivery_carries_github_s_wait() {
        let info = JobInfo {
            key: JobKey::new("acme", 7),
            repo: "app".into(),
            labels: vec!["linux".to_string()].into(),
            runner_name: Some("r".into()),
            ..JobInfo::default()
        };
        let at = |created, started| {
            let body = render_workflow_job_at("in_progress", &info, created, started);
            parse_workflow_job(body.as_bytes())
                .unwrap()
                .job
                .github_wait_secs
        };
        assert_eq!(at(Some(1_800_000_000), Some(1_800_000_007)), Some(7));
        assert_eq!(at(Some(1_800_000_000), None), None);
        assert_eq!(at(Some(1_800_000_009), Some(1_800_000_007)), None);
        let created = |created| {
            let body = render_workflow_job_at("queued", &info, created, None);
            parse_workflow_job(body.as_bytes())
                .unwrap()
                .job
                .github_created_unix
        };
        assert_eq!(created(Some(1_800_000_000)), Some(1_800_000_000));
        assert_eq!(created(None), None);
        assert_eq!(
            crate::clock::github_wait(
                Some("2026-12-02T08:00:00.250Z"),
                Some("0001-01-01T00:00:00Z")
            ),
            None,
            "Go's zero time is no time"
        );
    }

    #[test]
    fn malformed_vs_wrong_shape() {
        assert!(matches!(
            parse_workflow_job(b"{not json"),
            Err(PayloadError::Malformed(_))
        ));
        assert!(matches!(
            parse_workflow_job(b""),
            Err(PayloadError::Malformed(_))
        ));
        assert!(matches!(
            parse_workflow_job(b"{\"action\":\"queued\"}"),
            Err(PayloadError::WrongShape(_))
        ));
        assert!(matches!(
            parse_workflow_job(b"[1,2]"),
            Err(PayloadError::WrongShape(_))
        ));
    }

    #[test]
    fn render_round_trips() {
        let d = parse_workflow_job(QUEUED.as_bytes()).unwrap();
        let mut job = d.job.clone();
        job.runner_name = Some("ephemer-local-abc".into());
        job.runner_id = Some(7);
        job.about = JobAbout::new("build (x64)", "ci", "feature/a", "octocat").map(Arc::new);
        let back = parse_workflow_job(render_workflow_job("in_progress", &job).as_bytes()).unwrap();
        assert_eq!(back.action, Some(JobAction::InProgress));
        assert_eq!(back.job, job);
    }

    /// A delivery's name, workflow, branch and sender are kept as they came (a `null` branch,
    /// as a tag's run sends, is no branch); a delivery naming none of them keeps nothing.
    #[test]
    fn what_a_person_reads_comes_from_the_delivery() {
        let body = QUEUED.replace(
            r#""runner_group_id": null}"#,
            r#""runner_group_id": null, "name": "test <b>", "workflow_name": "CI",
               "head_branch": null}, "sender": {"login": "octocat"}"#,
        );
        let about = parse_workflow_job(body.as_bytes()).unwrap().job.about.unwrap();
        assert_eq!(
            *about,
            JobAbout {
                name: "test <b>".into(),
                workflow: "CI".into(),
                branch: String::new(),
                sender: "octocat".into(),
            }
        );
        assert_eq!(parse_workflow_job(QUEUED.as_bytes()).unwrap().job.about, None);
    }

    /// The optional strings borrow from the body (no allocation for each on every delivery),
    /// and one with an escape is decoded, as the required ones are.
    #[test]
    fn optional_strings_borrow_from_the_body_and_escapes_are_decoded() {
        let body = QUEUED.replace(
            r#""runner_group_id": null}"#,
            r#""runner_group_id": null, "name": "build", "workflow_name": "caf\u00e9 \"ci\"",
               "head_branch": "main", "created_at": "2026-12-04T10:00:00Z"}"#,
        );
        let payload: Payload<'_> = serde_json::from_str(&body).unwrap();
        let job = &payload.workflow_job;
        for borrowed in [&job.name, &job.head_branch, &job.created_at] {
            assert!(matches!(borrowed, Some(Text(Cow::Borrowed(_)))), "{borrowed:?}");
        }
        assert_eq!(text(&job.workflow_name), "café \"ci\"");
        let about = parse_workflow_job(body.as_bytes()).unwrap().job.about.unwrap();
        assert_eq!((about.name.as_str(), about.workflow.as_str()), ("build", "café \"ci\""));
    }
}
