//! The GitHub REST client, on awc. One per actor (awc's client is `!Send`).
//!
//! Every answer, success or error, is counted in `ephemerd_github_api_requests_total` and its
//! rate headers are handed to the rate tracker. Errors come back typed ([`GithubError`]) so the
//! retry ladder can classify them. This module never logs a token or a JIT config.

use std::{rc::Rc, time::Duration};

use actix::Recipient;
use actix_web::http::{Method, StatusCode, header::HeaderMap};
use serde::{Deserialize, de::DeserializeOwned};
use serde_json::json;
use std::sync::Arc;

use super::{
    auth::{Credentials, parse_access_token},
    error::{GithubError, HttpFailure},
    rate::{parse_rate_headers, parse_retry_after},
};
use crate::{
    config::{GithubConfig, Secret},
    job::{JobInfo, JobKey},
    metrics::Metrics,
    rate::ObserveRate,
};

/// What every request of the daemon to GitHub (the API, the runner's releases) says it is.
pub const USER_AGENT: &str = concat!("ephemer-actors/", env!("CARGO_PKG_VERSION"));

/// Per-request timeout.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How long a connection (and a proxy's tunnel) may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest answer body read.
pub const BODY_LIMIT: usize = 8 * 1024 * 1024;
/// Fresh runner names tried when GitHub answers 409 (name taken).
pub const NAME_ATTEMPTS: u32 = 3;
/// The REST API version every call pins.
pub const API_VERSION: &str = "2022-11-28";

pub use ephemer_decide::github::JitRunner;

/// A registered runner as `list runners` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, serde::Serialize)]
pub struct RunnerInfo {
    /// Runner id.
    pub id: u64,
    /// Runner name.
    pub name: String,
    /// `online` or `offline`.
    pub status: String,
    /// Running a job right now.
    pub busy: bool,
}

#[derive(Deserialize)]
struct JitAnswer {
    runner: RunnerInfo,
    encoded_jit_config: String,
}

#[derive(Deserialize)]
struct RunnersPage {
    runners: Vec<RunnerInfo>,
}

/// A job as the REST API shows it.
#[derive(Debug, Clone, Deserialize)]
pub struct ApiJob {
    /// Job id.
    pub id: u64,
    /// Run id.
    pub run_id: u64,
    /// Run attempt.
    #[serde(default)]
    pub run_attempt: Option<u32>,
    /// `queued`, `in_progress`, `completed`, ...
    pub status: String,
    /// Set once completed.
    #[serde(default)]
    pub conclusion: Option<String>,
    /// `runs-on` labels.
    #[serde(default)]
    pub labels: Vec<String>,
    /// The runner that took it.
    #[serde(default)]
    pub runner_name: Option<String>,
    /// That runner's id.
    #[serde(default)]
    pub runner_id: Option<u64>,
    /// When it was queued.
    #[serde(default)]
    pub created_at: Option<String>,
    /// When a runner took it.
    #[serde(default)]
    pub started_at: Option<String>,
    /// The job's name.
    #[serde(default)]
    pub name: Option<String>,
    /// Its workflow's name.
    #[serde(default)]
    pub workflow_name: Option<String>,
    /// The branch it runs on.
    #[serde(default)]
    pub head_branch: Option<String>,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    message: String,
    #[serde(default)]
    documentation_url: Option<String>,
}

struct Inner {
    http: awc::Client,
    api_url: String,
    owner: String,
    /// The target's name (its metrics' `target` label; the owner unless named).
    target: String,
    repos: Vec<String>,
    /// The group runners register in; with `runner_group` (a name), 0 until resolved.
    runner_group_id: std::cell::Cell<u64>,
    runner_group: Option<String>,
    enterprise: Option<String>,
    credentials: Credentials,
    /// The key its budget's readings are kept under ([`super::auth::budget_key`]).
    rate_key: String,
    metrics: Metrics,
    rate: Option<Recipient<ObserveRate>>,
    /// The last page of each listing GitHub answered with an `ETag` ([`super::pages`]).
    etags: super::pages::PageCache,
    /// The last `core` reading (remaining, limit, reset) any answer carried.
    core_left: std::cell::Cell<Option<(u64, u64, u64)>>,
}

/// A cheap-to-clone handle on one GitHub target. Not `Send`: keep it on one arbiter.
#[derive(Clone)]
pub struct GithubClient {
    inner: Rc<Inner>,
}

impl std::fmt::Debug for GithubClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GithubClient")
            .field("api_url", &self.inner.api_url)
            .field("owner", &self.inner.owner)
            .field("credentials", &self.inner.credentials)
            .finish()
    }
}

pub use super::inspect::Inspection;

/// What one HTTP exchange returned.
pub(super) struct Answer {
    pub(super) status: StatusCode,
    pub(super) headers: HeaderMap,
    pub(super) body: actix_web::web::Bytes,
}

/// The client's connector: TLS trusting the bundled, system and `ca_file` roots; TCP direct
/// or through the proxy. The config was validated, so a failure here is a file that changed
/// since: it is logged, and the client goes on with what it has (a call then fails visibly).
pub(crate) fn connector(config: &GithubConfig) -> awc::Connector<super::proxy::ProxyConnector> {
    let tls = crate::tls::client_config(config.ca_file.as_deref()).unwrap_or_else(|e| {
        tracing::error!(error = %e, "github.ca_file: cannot load it; trusting the bundled and system roots only");
        crate::tls::client_config(None).expect("the bundled roots load")
    });
    use super::proxy::ProxyConnector;
    let tcp = match &config.proxy {
        None => ProxyConnector::direct(),
        Some(proxy) => ProxyConnector::new(proxy).unwrap_or_else(|e| {
            tracing::error!(error = %e, "github.proxy: cannot use it; calling GitHub directly");
            ProxyConnector::direct()
        }),
    };
    awc::Connector::new()
        .connector(tcp)
        .rustls_0_23(tls)
        .timeout(CONNECT_TIMEOUT)
}

/// The HTTP stack every call to GitHub goes through (the API's, the Actions service's, the
/// runner's releases and their archives): [`connector`]'s proxy and trusted roots, the
/// connect timeout, the user agent and GitHub's media type; `timeout` for a whole request.
pub(crate) fn http_client(
    config: &GithubConfig,
    timeout: Duration,
) -> awc::ClientBuilder<super::proxy::ProxyConnector> {
    awc::Client::builder()
        .connector(connector(config))
        .timeout(timeout)
        .add_default_header(("User-Agent", USER_AGENT))
}

impl GithubClient {
    /// A client for `config`, counting into `metrics` and reporting rate headers to `rate`.
    pub fn new(
        config: &GithubConfig,
        metrics: Metrics,
        rate: Option<Recipient<ObserveRate>>,
    ) -> Self {
        let http = http_client(config, REQUEST_TIMEOUT)
            .add_default_header(("Accept", "application/vnd.github+json"))
            .add_default_header(("X-GitHub-Api-Version", API_VERSION))
            .finish();
        GithubClient {
            inner: Rc::new(Inner {
                http,
                api_url: config.api_url.clone(),
                owner: config.owner.clone(),
                target: config.owner.clone(),
                repos: config.repos.clone(),
                runner_group_id: std::cell::Cell::new(if config.runner_group.is_some() {
                    0
                } else {
                    config.runner_group_id
                }),
                runner_group: config.runner_group.clone(),
                enterprise: config.enterprise.clone(),
                credentials: Credentials::new(&config.auth),
                rate_key: super::auth::budget_key(&config.api_url, &config.auth),
                metrics,
                rate,
                etags: super::pages::PageCache::default(),
                core_left: std::cell::Cell::default(),
            }),
        }
    }

    /// The `core` budget left, as (remaining, limit), per the last answer that said.
    pub fn core_left(&self) -> Option<(u64, u64)> {
        self.inner.core_left.get().map(|(r, l, _)| (r, l))
    }

    /// The last `core` reading: (remaining, limit, reset as unix seconds).
    pub fn core_reading(&self) -> Option<(u64, u64, u64)> {
        self.inner.core_left.get()
    }

    /// (the group id, 0 until resolved; the group's name, when configured by name)
    pub(super) fn runner_group(&self) -> (u64, Option<String>) {
        (
            self.inner.runner_group_id.get(),
            self.inner.runner_group.clone(),
        )
    }

    pub(super) fn set_runner_group_id(&self, id: u64) {
        self.inner.runner_group_id.set(id);
    }

    /// The owner this client acts for.
    pub fn owner(&self) -> &str {
        &self.inner.owner
    }

    /// The key this client's rate readings are kept under.
    pub fn rate_key(&self) -> String {
        self.inner.rate_key.clone()
    }

    /// Where runners of `repo` live: `/repos/{owner}/{repo}`, `/orgs/{owner}`, or with
    /// `github.enterprise`, `/enterprises/{slug}` ("Self-hosted runners" REST endpoints exist
    /// at each of the three levels, the enterprise's needing `manage_runners:enterprise`).
    fn runners_base(&self, repo: Option<&str>) -> String {
        format!("{}/actions/runners", self.runners_level(repo))
    }

    /// `/repos/{owner}/{repo}`, `/orgs/{owner}` or `/enterprises/{slug}`.
    pub fn runners_level(&self, repo: Option<&str>) -> String {
        match (repo, &self.inner.enterprise) {
            (Some(repo), _) => format!("/repos/{}/{}", self.inner.owner, repo),
            (None, Some(slug)) => format!("/enterprises/{slug}"),
            (None, None) => format!("/orgs/{}", self.inner.owner),
        }
    }

    /// Registers a JIT runner named `<name_base><random>` with `labels` (`name_base` ends with
    /// `-` or with a tag the random part continues). A 409 (name taken)
    /// is retried with a fresh name, up to [`NAME_ATTEMPTS`] names.
    pub async fn generate_jitconfig(
        &self,
        repo: Option<&str>,
        name_base: &str,
        labels: &[String],
    ) -> Result<JitRunner, GithubError> {
        let path = format!("{}/generate-jitconfig", self.runners_base(repo));
        let runner_group_id = self.runner_group_id().await?;
        let (path, labels) = (&path, labels);
        with_fresh_names(name_base, |name| async move {
            let body = json!({
                "name": name,
                "runner_group_id": runner_group_id,
                "labels": labels,
                "work_folder": "_work",
            });
            let answer = self
                .call("generate_jitconfig", Method::POST, path, Some(body))
                .await?;
            let jit: JitAnswer = decode("generate_jitconfig", &answer.body)?;
            if jit.runner.name != name {
                // A hostile or broken server (or a proxy trusted through ca_file): the name it
                // gave would become a path for root. Not followed.
                let _ = self.delete_runner(repo, jit.runner.id).await;
                return Err(GithubError::RenamedRunner {
                    asked: name,
                    answered: jit.runner.name,
                });
            }
            Ok(JitRunner {
                id: jit.runner.id,
                name: jit.runner.name,
                encoded_jit_config: Secret::new(jit.encoded_jit_config),
            })
        })
        .await
    }

    /// Deletes a runner registration. Already gone (404) counts as done.
    pub async fn delete_runner(
        &self,
        repo: Option<&str>,
        runner_id: u64,
    ) -> Result<(), GithubError> {
        let path = format!("{}/{runner_id}", self.runners_base(repo));
        match self
            .call("delete_runner", Method::DELETE, &path, None)
            .await
        {
            Ok(_) => Ok(()),
            Err(GithubError::Http(f)) if f.status == 404 => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One runner registration; `None` when GitHub no longer has it.
    pub async fn get_runner(
        &self,
        repo: Option<&str>,
        runner_id: u64,
    ) -> Result<Option<RunnerInfo>, GithubError> {
        let path = format!("{}/{runner_id}", self.runners_base(repo));
        match self.call("get_runner", Method::GET, &path, None).await {
            Ok(answer) => decode("get_runner", &answer.body).map(Some),
            Err(GithubError::Http(f)) if f.status == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every runner registered at `repo` (or the org), all pages, whose name starts with
    /// `name_prefix`.
    pub async fn list_runners(
        &self,
        repo: Option<&str>,
        name_prefix: &str,
    ) -> Result<Vec<RunnerInfo>, GithubError> {
        let base = self.runners_base(repo);
        let pages: Vec<RunnersPage> = self.paginate("list_runners", &base, &[]).await?;
        Ok(pages
            .into_iter()
            .flat_map(|p| p.runners)
            .filter(|r| r.name.starts_with(name_prefix))
            .collect())
    }

    /// One job, with its status.
    pub async fn get_job(&self, repo: &str, job_id: u64) -> Result<(JobInfo, String), GithubError> {
        let path = format!("/repos/{}/{repo}/actions/jobs/{job_id}", self.inner.owner);
        let answer = self.call("get_job", Method::GET, &path, None).await?;
        let job: ApiJob = decode("get_job", &answer.body)?;
        let status = job.status.clone();
        Ok((self.job_info(repo, job), status))
    }

    /// The owner, configured repos and credentials, for the reconcile's listing.
    pub(super) fn target(&self) -> (&str, &[String], &Credentials) {
        (
            &self.inner.owner,
            &self.inner.repos,
            &self.inner.credentials,
        )
    }

    pub(super) fn job_info(&self, repo: &str, j: ApiJob) -> JobInfo {
        JobInfo {
            key: JobKey::new(&self.inner.owner, j.id),
            repo: repo.into(),
            run_id: j.run_id,
            run_attempt: j.run_attempt.unwrap_or(1),
            labels: j.labels.into(),
            runner_name: j.runner_name.filter(|n| !n.is_empty()),
            runner_id: j.runner_id.filter(|id| *id != 0),
            conclusion: j.conclusion.map(Arc::from),
            installation_id: None,
            github_wait_secs: crate::clock::github_wait(
                j.created_at.as_deref(),
                j.started_at.as_deref(),
            ),
            github_created_unix: crate::clock::github_unix(j.created_at.as_deref()),
            withdrawn: false,
            // The REST job names no sender; a delivery's account of the job is kept over this.
            about: ephemer_decide::job::JobAbout::new(
                j.name.as_deref().unwrap_or(""),
                j.workflow_name.as_deref().unwrap_or(""),
                j.head_branch.as_deref().unwrap_or(""),
                "",
            )
            .map(Arc::new),
        }
    }

    /// The pages kept for conditional listings.
    pub(super) fn pages(&self) -> &super::pages::PageCache {
        &self.inner.etags
    }

    /// One authenticated request; counts it, reports its rate headers, types its failure.
    pub(super) async fn call(
        &self,
        endpoint: &'static str,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<Answer, GithubError> {
        self.call_with(endpoint, method, path, body, None).await
    }

    /// Like `call`, with one more request header; a 304 (to a conditional request) is an
    /// answer, not a failure.
    pub(super) async fn call_with(
        &self,
        endpoint: &'static str,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
        header: Option<(&'static str, &str)>,
    ) -> Result<Answer, GithubError> {
        let token = self.bearer().await?;
        let answer = self
            .send(endpoint, (method, path), &token, body, header, true)
            .await?;
        if answer.status == StatusCode::UNAUTHORIZED {
            self.inner.credentials.invalidate();
        }
        if answer.status == StatusCode::NOT_MODIFIED && header.is_some() {
            return Ok(answer);
        }
        check(endpoint, answer)
    }

    pub(super) async fn bearer(&self) -> Result<Secret, GithubError> {
        let this = self.clone();
        self.inner
            .credentials
            .bearer(move |jwt, installation_id| async move {
                let path = format!("/app/installations/{installation_id}/access_tokens");
                let answer = this
                    .send(
                        "access_tokens",
                        (Method::POST, &path),
                        &Secret::new(jwt),
                        None,
                        None,
                        false,
                    )
                    .await
                    .and_then(|answer| check("access_tokens", answer))
                    .map_err(|e| GithubError::TokenExchange(Box::new(e)))?;
                parse_access_token(&answer.body)
            })
            .await
    }

    pub(super) async fn send(
        &self,
        endpoint: &'static str,
        (method, path): (Method, &str),
        token: &Secret,
        body: Option<serde_json::Value>,
        header: Option<(&'static str, &str)>,
        track_rate: bool,
    ) -> Result<Answer, GithubError> {
        let url = format!("{}{path}", self.inner.api_url);
        let mut request = self
            .inner
            .http
            .request(method, url)
            .insert_header(("Authorization", format!("Bearer {}", token.expose())));
        if let Some(h) = header {
            request = request.insert_header(h);
        }
        self.exchange(endpoint, request, body, |headers, status| {
            if track_rate {
                self.observe_rate(headers, status);
            }
        })
        .await
    }

    /// Sends `request` (with `body` as JSON, if any), counts the answer under `endpoint`,
    /// shows its headers to `on_headers`, and reads its body.
    pub(super) async fn exchange(
        &self,
        endpoint: &'static str,
        request: awc::ClientRequest,
        body: Option<serde_json::Value>,
        on_headers: impl FnOnce(&HeaderMap, StatusCode),
    ) -> Result<Answer, GithubError> {
        let sent = match body {
            Some(b) => request.send_json(&b).await,
            None => request.send().await,
        };
        let mut response = match sent {
            Ok(r) => r,
            Err(e) => {
                self.count(endpoint, "error");
                return Err(GithubError::Network {
                    endpoint,
                    detail: e.to_string(),
                });
            }
        };
        let status = response.status();
        self.count(endpoint, status.as_str());
        let headers = response.headers().clone();
        on_headers(&headers, status);
        let body = response
            .body()
            .limit(BODY_LIMIT)
            .await
            .map_err(|e| GithubError::Network {
                endpoint,
                detail: format!("reading the answer: {e}"),
            })?;
        Ok(Answer {
            status,
            headers,
            body,
        })
    }

    /// The HTTP client (its connector carries the proxy and the trusted roots).
    pub(super) fn http(&self) -> &awc::Client {
        &self.inner.http
    }

    /// The API's base URL.
    pub(super) fn api_url(&self) -> &str {
        &self.inner.api_url
    }

    /// The enterprise slug, when runners register at the enterprise.
    pub(super) fn enterprise(&self) -> Option<&str> {
        self.inner.enterprise.as_deref()
    }

    pub(super) fn count(&self, endpoint: &str, code: &str) {
        let metrics = &self.inner.metrics;
        metrics
            .api_requests
            .with_label_values(&metrics.target_labels(&[endpoint, code], &self.inner.target))
            .inc();
    }

    /// Names the target this client acts for (the `target` label of its metrics, when they
    /// carry one). Call it on a client just made.
    pub fn for_target(mut self, name: &str) -> Self {
        if let Some(inner) = Rc::get_mut(&mut self.inner) {
            inner.target = name.to_string();
        }
        self
    }

    fn observe_rate(&self, headers: &HeaderMap, status: StatusCode) {
        let reading = parse_rate_headers(headers);
        if let Some(r) = reading
            && r.resource == crate::vocab::RateBucket::Core
            && let (Some(remaining), Some(limit)) = (r.remaining, r.limit)
        {
            let reset = r.reset.unwrap_or(0);
            self.inner.core_left.set(Some((remaining, limit, reset)));
        }
        let Some(rate) = &self.inner.rate else { return };
        let retry_after = parse_retry_after(headers);
        if reading.is_none() && retry_after.is_none() {
            return;
        }
        let observation = ObserveRate {
            credential: self.rate_key(),
            target: self.inner.target.clone(),
            // Which bucket: the answer says so; a bare `Retry-After` is core's.
            bucket: reading.map_or(crate::vocab::RateBucket::Core, |r| r.resource),
            headers: reading,
            retry_after,
            status: status.as_u16(),
            at_unix: crate::clock::unix_now(),
        };
        // Readings are best effort: a full mailbox drops one, the next answer brings another.
        let _ = rate.try_send(observation);
    }
}

/// Turns a non-2xx answer into a typed failure.
pub(super) fn check(endpoint: &'static str, answer: Answer) -> Result<Answer, GithubError> {
    if answer.status.is_success() {
        return Ok(answer);
    }
    let (message, documentation_url) = match serde_json::from_slice::<ErrorBody>(&answer.body) {
        Ok(b) => (b.message, b.documentation_url),
        Err(_) => (
            String::from_utf8_lossy(&answer.body)
                .chars()
                .take(200)
                .collect(),
            None,
        ),
    };
    let rate = parse_rate_headers(&answer.headers);
    Err(GithubError::Http(HttpFailure {
        endpoint,
        status: answer.status.as_u16(),
        message,
        documentation_url,
        rate_remaining: rate.and_then(|r| r.remaining),
        rate_bucket: rate.map(|r| r.resource),
        rate_reset: rate.and_then(|r| r.reset),
        retry_after: parse_retry_after(&answer.headers),
    }))
}

pub(super) fn decode<T: DeserializeOwned>(
    endpoint: &'static str,
    body: &[u8],
) -> Result<T, GithubError> {
    serde_json::from_slice(body).map_err(|e| GithubError::Decode {
        endpoint,
        detail: e.to_string(),
    })
}

pub use crate::vocab::random_suffix;

/// Registers a runner named `<name_base><random>` through `register`, with a fresh name on
/// each 409 (the name is taken), up to [`NAME_ATTEMPTS`] names: the one name retry of the REST
/// API's and the scale-set service's registrations.
pub async fn with_fresh_names<F, Fut>(
    name_base: &str,
    mut register: F,
) -> Result<JitRunner, GithubError>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<JitRunner, GithubError>>,
{
    for _ in 0..NAME_ATTEMPTS {
        match register(format!("{name_base}{}", random_suffix())).await {
            Err(GithubError::Http(f)) if f.status == 409 => continue,
            other => return other,
        }
    }
    Err(GithubError::NameConflict {
        attempts: NAME_ATTEMPTS,
    })
}
