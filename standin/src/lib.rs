//! A GitHub stand-in: a real HTTP server on `127.0.0.1:0` that answers the REST calls the
//! daemon makes (JIT runners, runners, runs, jobs, App tokens, repos) with realistic bodies and
//! `X-RateLimit-*` headers, spends settable rate budgets (per bucket: `core`, `actions_runner_registration`), plays scripted faults (status N for
//! the next k calls, a dropped connection, an exhausted budget until a time), and records every
//! call. Tests, benchmarks and the demo share it. It never touches the network beyond loopback.

#![warn(missing_docs)]

mod app;
mod hook_log;
pub mod org;
mod releases;
mod routes;
mod runner_protocol;
pub mod scaleset;
mod state;
mod webhooks;

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use actix_web::{App, HttpServer, dev::ServerHandle, web};
pub use releases::{Release, Releases};
pub use state::{
    Budget, Call, Delivery, DeliveryFaults, Fault, Job, Runner, RunnerBehavior, State,
    WebhookTarget, unix_now, unix_now_ms,
};

/// How to start a stand-in.
#[derive(Debug, Clone)]
pub struct StandinConfig {
    /// The org or user that owns the repos.
    pub owner: String,
    /// Its repos.
    pub repos: Vec<String>,
    /// The PAT it accepts (empty: none).
    pub token: String,
    /// Requests per rate window.
    pub rate_limit: u64,
    /// Rate window length.
    pub rate_window: Duration,
    /// Lifetime of issued installation tokens.
    pub installation_token_ttl: Duration,
    /// PEM public key to verify App JWTs with (`None`: JWT shape checked only).
    pub app_public_key: Option<String>,
    /// Serve HTTPS with this certificate instead of plain HTTP (a GHES behind a private CA).
    pub tls: Option<TlsIdentity>,
    /// How long a job's lock holds without a renewal from the runner running it; then the job
    /// fails as "lost communication with the server". GitHub's is 10 minutes: the real
    /// runner renews its job every 60 s and each renewal answers a lock 10 minutes ahead
    /// (actions/runner `src/Runner.Listener/JobDispatcher.cs`, `RenewJobRequestAsync`; the
    /// runner's own log, actions/runner#3539: "job is valid till" ten minutes on). A test
    /// that compresses time shortens it.
    pub job_lock: Duration,
}

/// A server certificate (chain) and its key, PEM text.
#[derive(Clone)]
pub struct TlsIdentity {
    /// The certificate chain, leaf first.
    pub cert_pem: String,
    /// Its private key (PKCS#8).
    pub key_pem: String,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsIdentity")
    }
}

impl TlsIdentity {
    fn server_config(&self) -> std::io::Result<rustls::ServerConfig> {
        use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
                .collect::<Result<_, _>>()
                .map_err(std::io::Error::other)?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(std::io::Error::other)?;
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(std::io::Error::other)?
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .map_err(std::io::Error::other)
    }
}

impl Default for StandinConfig {
    fn default() -> Self {
        StandinConfig {
            owner: "acme".into(),
            repos: vec!["app".into()],
            token: "ghp_standin_token".into(),
            rate_limit: 5000,
            rate_window: Duration::from_secs(3600),
            installation_token_ttl: Duration::from_secs(3600),
            app_public_key: None,
            tls: None,
            job_lock: Duration::from_secs(600),
        }
    }
}

/// A running stand-in. Dropping it does not stop the server; call [`Standin::stop`].
#[derive(Debug, Clone)]
pub struct Standin {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    server: ServerHandle,
}

impl Standin {
    /// Binds `127.0.0.1:0` and serves on the current actix System.
    pub fn start(config: StandinConfig) -> std::io::Result<Standin> {
        Self::start_also_on(config, None)
    }

    /// [`Standin::start`], serving `extra` too (a listener a test bound inside a network
    /// namespace of its own, where runners reach the stand-in as they would reach GitHub).
    pub fn start_also_on(
        config: StandinConfig,
        extra: Option<std::net::TcpListener>,
    ) -> std::io::Result<Standin> {
        let now = unix_now();
        let (outbox, inbox) = tokio::sync::mpsc::unbounded_channel();
        let state = Arc::new(Mutex::new(State {
            releases: Default::default(),
            token_scopes: None,
            hooks: Vec::new(),
            behavior: RunnerBehavior::default(),
            webhook: None,
            faults_webhook: DeliveryFaults::default(),
            deliveries: Vec::new(),
            runner_pids: Default::default(),
            held: Default::default(),
            outbox: Some(outbox),
            app_hook: None,
            runner_groups: vec![(1, "Default".into())],
            registrations: Vec::new(),
            enterprise: None,
            public_url: None,
            owner: config.owner.clone(),
            repos: config.repos.clone(),
            token: config.token.clone(),
            installation_tokens: Default::default(),
            installation_token_ttl: config.installation_token_ttl,
            job_lock: config.job_lock,
            runners: Default::default(),
            jobs: Default::default(),
            budget: Budget {
                limit: config.rate_limit,
                remaining: config.rate_limit,
                reset: now + config.rate_window.as_secs(),
                window: config.rate_window,
            },
            registration: Budget {
                limit: config.rate_limit,
                remaining: config.rate_limit,
                reset: now + config.rate_window.as_secs(),
                window: config.rate_window,
            },
            faults: Default::default(),
            fault_shares: Default::default(),
            rename_next_runner: None,
            rng: rand::SeedableRng::seed_from_u64(0),
            archived: Vec::new(),
            repo_faults: Default::default(),
            calls: Vec::new(),
            next_runner_id: 1,
            secrets_issued: Vec::new(),
            next_job_id: 1000,
            base_url: String::new(),
            runner_url: None,
            scalesets: Default::default(),
        }));
        let shared = web::Data::new(routes::Shared {
            state: state.clone(),
            app_public_key: config.app_public_key.clone(),
        });
        let server = HttpServer::new(move || {
            App::new()
                .app_data(shared.clone())
                .app_data(web::PayloadConfig::new(4 * 1024 * 1024))
                .route(
                    "/_services/queue/{set}/{session}",
                    web::get().to(scaleset::poll),
                )
                .default_service(web::to(routes::dispatch))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1);
        let server = match &config.tls {
            None => server.bind(("127.0.0.1", 0))?,
            Some(tls) => server.bind_rustls_0_23(("127.0.0.1", 0), tls.server_config()?)?,
        };
        let addr = server.addrs()[0];
        let server = match extra {
            Some(listener) => server.listen(listener)?,
            None => server,
        };
        let scheme = if config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let server = server.run();
        let handle = server.handle();
        actix_rt::spawn(server);
        actix_rt::spawn(webhooks::sender(state.clone(), inbox));
        actix_rt::spawn(scaleset::ticker(Arc::downgrade(&state)));
        actix_rt::spawn(runner_protocol::lock_ticker(Arc::downgrade(&state)));
        lock(&state).base_url = format!("{scheme}://{addr}");
        Ok(Standin {
            addr,
            state,
            server: handle,
        })
    }

    /// `http://127.0.0.1:PORT` (`https://` when served over TLS): the `github.api_url` to
    /// point a daemon at.
    pub fn url(&self) -> String {
        lock(&self.state).base_url.clone()
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server.
    pub async fn stop(&self) {
        self.server.stop(false).await;
    }

    /// Locks the state for direct inspection or changes.
    pub fn state(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Every call so far.
    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    /// Every call to one endpoint so far.
    pub fn calls_to(&self, endpoint: &str) -> Vec<Call> {
        self.state()
            .calls
            .iter()
            .filter(|c| c.endpoint == endpoint)
            .cloned()
            .collect()
    }

    /// Calls to one endpoint so far.
    pub fn count(&self, endpoint: &str) -> usize {
        self.state().count(endpoint)
    }

    /// Registered runners.
    pub fn runners(&self) -> Vec<Runner> {
        self.state().runners.values().cloned().collect()
    }

    /// Jobs.
    pub fn jobs(&self) -> Vec<Job> {
        self.state().jobs.values().cloned().collect()
    }

    /// Gives the PAT these classic scopes: answers then carry `X-OAuth-Scopes`, and endpoints
    /// that need a scope it lacks answer 403.
    pub fn set_token_scopes(&self, scopes: &[&str]) {
        lock(&self.state).token_scopes = Some(scopes.iter().map(|s| s.to_string()).collect());
    }

    /// Adds a webhook (`repo`: `None` for an org hook).
    pub fn add_hook(&self, hook: org::Hook) {
        lock(&self.state).hooks.push(hook);
    }

    /// Sends `workflow_job` webhooks to `url`, signed with `secret`.
    pub fn send_webhooks_to(&self, url: &str, secret: &str) {
        self.state().webhook = Some(WebhookTarget {
            url: url.to_string(),
            secret: secret.to_string(),
            form: false,
            fleet: Vec::new(),
            duplicate_share: 0.0,
        });
    }

    /// Makes `url` the GitHub App's own webhook (`/app/hook`): deliveries go there, signed with
    /// `secret`, and its delivery log is read with the App's JWT.
    pub fn set_app_hook(&self, url: &str, secret: &str) {
        self.send_webhooks_to(url, secret);
        self.state().app_hook = Some(url.to_string());
    }

    /// Puts the org in the enterprise `slug`, whose runner endpoints
    /// (`/enterprises/{slug}/actions/runners...`) then answer.
    pub fn set_enterprise(&self, slug: &str) {
        self.state().enterprise = Some(slug.to_string());
    }

    /// Adds a runner group to the org; its id.
    pub fn add_runner_group(&self, name: &str) -> u64 {
        let mut s = self.state();
        let id = s.runner_groups.iter().map(|(id, _)| *id).max().unwrap_or(0) + 1;
        s.runner_groups.push((id, name.to_string()));
        id
    }

    /// The `ServerUrl` runners are handed in their JIT configs, when they reach the stand-in
    /// elsewhere than the daemon does (a VM's guest: `http://10.0.2.2:PORT`, QEMU's gateway to
    /// the host's loopback).
    pub fn set_runner_url(&self, url: &str) {
        self.state().runner_url = Some(url.trim_end_matches('/').to_string());
    }

    /// Puts the webhook target behind a proxy whose public URL is `url`: the hook's
    /// `config.url`, under which its deliveries are logged.
    pub fn set_public_url(&self, url: &str) {
        self.state().public_url = Some(url.to_string());
    }

    /// Sends `workflow_job` webhooks to a fleet: each delivery to one of `urls` at random, and
    /// `duplicate_share` of them to every one of them too.
    pub fn send_webhooks_to_fleet(&self, urls: &[String], secret: &str, duplicate_share: f64) {
        self.state().webhook = Some(WebhookTarget {
            url: urls.first().cloned().unwrap_or_default(),
            secret: secret.to_string(),
            form: false,
            fleet: urls.to_vec(),
            duplicate_share,
        });
    }

    /// Like [`Standin::send_webhooks_to`], form-encoded (`payload=<url-encoded JSON>`), as a
    /// hook created with content type `form` delivers.
    pub fn send_form_webhooks_to(&self, url: &str, secret: &str) {
        self.state().webhook = Some(WebhookTarget {
            url: url.to_string(),
            secret: secret.to_string(),
            form: true,
            fleet: Vec::new(),
            duplicate_share: 0.0,
        });
    }

    /// Sets how stand-in runners behave.
    pub fn set_behavior(&self, behavior: RunnerBehavior) {
        self.state().behavior = behavior;
    }

    /// Sets webhook misbehaviour.
    pub fn set_delivery_faults(&self, faults: DeliveryFaults) {
        self.state().faults_webhook = faults;
    }

    /// Every webhook delivery sent so far.
    pub fn deliveries(&self) -> Vec<Delivery> {
        self.state().deliveries.clone()
    }

    /// Completes a job as a cancelled run does, and tells the daemon. A runner that took it is
    /// ephemeral: the service removes its registration once the job is done, whether or not
    /// the runner is still there to say so (GitHub's docs, "Autoscaling with self-hosted
    /// runners", ephemeral runners: "automatically unregistered ... after one job"; actions/runner
    /// `--jitconfig` runners are ephemeral).
    pub fn cancel_job(&self, job_id: u64) {
        let mut s = self.state();
        let mut runner = None;
        if let Some(job) = s.jobs.get_mut(&job_id) {
            job.status = "completed".into();
            job.conclusion = Some("cancelled".into());
            runner = job.runner_id;
        }
        if let Some(id) = runner {
            s.runners.remove(&id);
        }
        s.emit("completed", job_id);
    }

    /// The scale sets: (id, name, labels, the owner of its open session).
    pub fn scale_sets(&self) -> Vec<(u64, String, Vec<String>, Option<String>)> {
        self.state()
            .scalesets
            .sets
            .values()
            .map(|x| {
                let owner = x.session.as_ref().map(|s| s.owner.clone());
                (x.id, x.name.clone(), x.labels.clone(), owner)
            })
            .collect()
    }

    /// Sets the Actions service's timings (long poll, session lapse, token lifetimes).
    pub fn set_scaleset_timings(&self, t: scaleset::ServiceTimings) {
        self.state().scalesets.set_timings(t);
    }

    /// Every runner token and encoded JIT config handed out so far.
    pub fn secrets_issued(&self) -> Vec<String> {
        self.state().secrets_issued.clone()
    }

    /// How many jobs are in `status`.
    pub fn jobs_in(&self, status: &str) -> usize {
        self.state()
            .jobs
            .values()
            .filter(|j| j.status == status)
            .count()
    }

    /// Queues `count` jobs with `labels` in one new run of `repo`, sends their `queued`
    /// webhooks (if a target is set), and returns their ids.
    pub fn queue_jobs(&self, repo: &str, labels: &[&str], count: usize) -> Vec<u64> {
        let ids = self.add_jobs(repo, labels, count);
        let mut s = self.state();
        for id in &ids {
            s.emit("queued", *id);
        }
        ids
    }

    /// Delivers a signed `queued` webhook for a job of another account, repo or App
    /// installation (an org hook or an org-wide App sees those too). The stand-in keeps no such
    /// job, so no runner of ours could take it. Returns its id.
    pub fn deliver_foreign_job(
        &self,
        owner: &str,
        repo: &str,
        installation_id: Option<u64>,
        labels: &[&str],
    ) -> u64 {
        let mut s = self.state();
        let id = s.next_job_id;
        s.next_job_id += 1;
        let info = ephemer_actors_core::job::JobInfo {
            key: ephemer_actors_core::job::JobKey::new(owner, id),
            repo: repo.into(),
            run_id: id,
            run_attempt: 1,
            labels: labels.iter().map(|l| l.to_string()).collect(),
            installation_id,
            ..Default::default()
        };
        let body = ephemer_actors_core::github::event::render_workflow_job("queued", &info);
        s.post("queued", id, body);
        id
    }

    /// Queues one job of this account whose `queued` delivery names App installation
    /// `installation_id`, not this account's (GitHub did so in June 2026, runs-on#509): the
    /// job is real, so a listing finds it. Returns its id.
    pub fn queue_job_mislabelled(&self, repo: &str, labels: &[&str], installation_id: u64) -> u64 {
        let id = self.add_jobs(repo, labels, 1)[0];
        let s = self.state();
        let info = ephemer_actors_core::job::JobInfo {
            key: ephemer_actors_core::job::JobKey::new(&s.owner, id),
            repo: repo.into(),
            run_id: s.jobs[&id].run_id,
            run_attempt: 1,
            labels: labels.iter().map(|l| l.to_string()).collect(),
            installation_id: Some(installation_id),
            ..Default::default()
        };
        let body = ephemer_actors_core::github::event::render_workflow_job("queued", &info);
        s.post("queued", id, body);
        id
    }

    /// Queues one job whose deliveries name it `about` (its name, workflow, branch and
    /// trigger); delivers its `queued` webhook. Returns its id.
    pub fn queue_job_about(
        &self,
        repo: &str,
        labels: &[&str],
        about: ephemer_actors_core::job::JobAbout,
    ) -> u64 {
        let id = self.add_jobs(repo, labels, 1)[0];
        let mut s = self.state();
        if let Some(job) = s.jobs.get_mut(&id) {
            job.about = Some(about.into());
        }
        s.emit("queued", id);
        id
    }

    /// Adds queued jobs without sending any webhook (a delivery that never arrived).
    pub fn add_jobs(&self, repo: &str, labels: &[&str], count: usize) -> Vec<u64> {
        let mut s = self.state();
        let run_id = s.next_job_id;
        s.next_job_id += 1;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        (0..count)
            .map(|_| {
                let id = s.next_job_id;
                s.next_job_id += 1;
                s.jobs.insert(
                    id,
                    Job {
                        id,
                        run_id,
                        repo: repo.to_string(),
                        labels: labels.iter().map(|l| l.to_string()).collect(),
                        status: "queued".into(),
                        conclusion: None,
                        runner_name: None,
                        runner_id: None,
                        queued_at_ms: now_ms,
                        picked_at_ms: None,
                        runner_up_at_ms: None,
                        about: None,
                        locked_until_ms: None,
                        abandoned: false,
                    },
                );
                id
            })
            .collect()
    }

    /// Sets every bucket's budget: `remaining` of `limit`, resetting at `reset` (unix seconds).
    pub fn set_budget(&self, remaining: u64, limit: u64, reset: u64) {
        let mut s = self.state();
        for bucket in ["core", "actions_runner_registration"] {
            let b = s.budget_mut(bucket);
            b.remaining = remaining;
            b.limit = limit;
            b.reset = reset;
        }
    }

    /// Empties every bucket until `for_` from now; every rated call answers 403 until then.
    /// Returns the reset time (unix seconds).
    pub fn exhaust_for(&self, for_: Duration) -> u64 {
        let reset = self.exhaust_bucket_for("core", for_);
        self.exhaust_bucket_for("actions_runner_registration", for_);
        reset
    }

    /// Empties one bucket (`core` or `actions_runner_registration`) until `for_` from now;
    /// calls spending it answer 403 until then, the other bucket is untouched. Returns the
    /// reset time (unix seconds).
    pub fn exhaust_bucket_for(&self, bucket: &str, for_: Duration) -> u64 {
        let mut s = self.state();
        let reset = unix_now() + for_.as_secs().max(1);
        let b = s.budget_mut(bucket);
        b.remaining = 0;
        b.reset = reset;
        reset
    }

    /// Answers the next `times` calls of `endpoint` with `fault`.
    pub fn fail_next(&self, endpoint: &str, times: usize, fault: Fault) {
        let mut s = self.state();
        let queue = s.faults.entry(endpoint.to_string()).or_default();
        queue.extend(std::iter::repeat_n(fault, times));
    }

    /// Answers `share` (0.0 to 1.0) of the calls of `endpoint` with `fault`, at random, once
    /// its scripted faults are used up (several shares of one endpoint add up).
    pub fn fail_share(&self, endpoint: &str, share: f64, fault: Fault) {
        self.state()
            .fault_shares
            .entry(endpoint.to_string())
            .or_default()
            .push((share.clamp(0.0, 1.0), fault));
    }

    /// Publishes release `version` of the runner (`archive` as built by
    /// `standin_runner::release_archive`), with the archive's own SHA-256 as its digest.
    pub fn publish_release(&self, version: &str, archive: Vec<u8>) {
        use sha2::Digest;
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&archive)));
        self.publish_release_with_digest(version, archive, &digest);
    }

    /// Publishes a release whose stated digest is `digest` (a wrong one: a tampered archive).
    pub fn publish_release_with_digest(&self, version: &str, archive: Vec<u8>, digest: &str) {
        self.state().releases.published.push(Release {
            version: version.into(),
            published_at: unix_now(),
            archive,
            digest: digest.into(),
        });
    }

    /// Makes the releases API answer 503 (github.com out of reach), or answer again.
    pub fn set_releases_unreachable(&self, unreachable: bool) {
        self.state().releases.unreachable = unreachable;
    }

    /// (API requests, of which 304, archive downloads) of the releases API.
    pub fn release_requests(&self) -> (usize, usize, usize) {
        let s = self.state();
        (
            s.releases.api_requests,
            s.releases.not_modified,
            s.releases.downloads,
        )
    }

    /// Registers the next JIT runner under `name` instead of the name asked for, as a hostile
    /// server would.
    pub fn rename_next_runner(&self, name: &str) {
        self.state().rename_next_runner = Some(name.to_string());
    }

    /// Stops every random fault of `fail_share`.
    pub fn clear_fail_shares(&self) {
        self.state().fault_shares.clear();
    }

    /// Seeds the random faults (`fail_share`, `DeliveryFaults::duplicate_share` and
    /// `replay_old_queued`), so a run can be played again.
    pub fn seed_faults(&self, seed: u64) {
        self.state().rng = rand::SeedableRng::seed_from_u64(seed);
    }

    /// Answers the next `times` calls about `repo` (any path under `/repos/<owner>/<repo>`)
    /// with `status`.
    pub fn fail_repo(&self, repo: &str, status: u16, times: usize) {
        self.state()
            .repo_faults
            .insert(repo.to_string(), (status, times));
    }

    /// Adds repos to the org (listed, with no runs yet).
    pub fn add_repos(&self, names: &[&str]) {
        let mut s = self.state();
        for name in names {
            if !s.repos.iter().any(|r| r == name) {
                s.repos.push(name.to_string());
            }
        }
    }

    /// Adds an archived repo to the org.
    pub fn add_archived_repo(&self, name: &str) {
        let mut s = self.state();
        s.repos.push(name.to_string());
        s.archived.push(name.to_string());
    }

    /// Answers the next `times` calls of `endpoint` with a bare `status` (with rate headers).
    pub fn fail_status(&self, endpoint: &str, status: u16, times: usize) {
        self.fail_next(endpoint, times, Fault::http(status, true));
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}
