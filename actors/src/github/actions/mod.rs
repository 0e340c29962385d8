//! The Actions service's runner scale-set API, as `actions/scaleset`'s Go client calls it:
//! a registration token (GitHub REST) is traded at `POST {api}/actions/runner-registration`
//! (`RemoteAuth`) for the service's URL and an admin token (a JWT, refreshed a minute before
//! its `exp`, and once more on a 401); scale sets, message sessions, the message queue,
//! `acquirejobs` and `generatejitconfig` are calls on that service. The connection is the
//! target's own (its proxy, its trusted roots, its credential).

pub(crate) mod reach;
pub use ephemer_decide::github::actions::types;

use std::{cell::RefCell, rc::Rc, time::Duration};

use awc::http::{Method, StatusCode};
use base64::{Engine as _, engine::general_purpose::URL_SAFE_NO_PAD};
use serde::Deserialize;
use serde_json::{Value, json};

use self::types::{JitAnswer, List, QueueMessage, RunnerGroup, ScaleSet, Session, WireMessage};
use super::{
    GithubClient, GithubError,
    client::{Answer, JitRunner, check, decode},
};
use crate::config::Secret;

/// The service's API version, as the Go client sends it.
const API_VERSION: &str = "6.0-preview";
/// Every call's `Accept`, as the Go client sends it on the queue's calls (the service reads
/// the version from here where a call carries no `api-version` query).
const ACCEPT: &str = "application/json; api-version=6.0-preview";
/// Where scale sets live on the service.
const SCALE_SETS: &str = "_apis/runtime/runnerscalesets";
/// Where runners are registered on the service.
const AGENTS: &str = "_apis/distributedtask/pools/0/agents";
/// A message poll waits up to ~50 s for a message; the request's own timeout is above that.
pub const POLL_TIMEOUT: Duration = Duration::from_secs(75);
/// Calls other than the poll.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The admin token is refreshed this long before it expires.
const REFRESH_BEFORE: u64 = 60;
/// An admin token whose `exp` cannot be read is used this long.
const UNKNOWN_EXPIRY: u64 = 10 * 60;

/// The service's address and admin token.
#[derive(Clone)]
struct Connection {
    url: String,
    token: Secret,
    expires_unix: u64,
}

/// A client of the Actions service for one GitHub target. Cheap to clone (the connection is
/// shared); not `Send`: keep it on one arbiter, as the `GithubClient`.
#[derive(Clone)]
pub struct ActionsClient {
    github: GithubClient,
    connection: Rc<RefCell<Option<Connection>>>,
}

impl std::fmt::Debug for ActionsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ActionsClient")
            .field("owner", &self.github.owner())
            .field("connected", &self.connection.borrow().is_some())
            .finish()
    }
}

#[derive(Deserialize)]
struct RegistrationToken {
    token: String,
}

#[derive(Deserialize)]
struct AdminConnection {
    #[serde(default)]
    url: String,
    #[serde(default)]
    token: String,
}

/// The web URL runners register against (`https://github.com/{org}`, a GHES host's
/// `https://host/{org}`, or an enterprise's), from the API's URL.
pub fn config_url(api_url: &str, owner: &str, enterprise: Option<&str>) -> String {
    let api = api_url.trim_end_matches('/');
    let web = if api == "https://api.github.com" {
        "https://github.com"
    } else {
        api.strip_suffix("/api/v3").unwrap_or(api)
    };
    match enterprise {
        Some(slug) => format!("{web}/enterprises/{slug}"),
        None => format!("{web}/{owner}"),
    }
}

/// The `exp` of a JWT, read without verifying it (the service checks its own token).
fn jwt_expiry(token: &str) -> Option<u64> {
    let payload = token.split('.').nth(1)?;
    let bytes = URL_SAFE_NO_PAD.decode(payload.trim_end_matches('=')).ok()?;
    serde_json::from_slice::<Value>(&bytes).ok()?["exp"].as_u64()
}

/// A deletion's answer: what is already gone (404) counts as deleted.
fn gone_is_done(answer: Result<Answer, GithubError>) -> Result<(), GithubError> {
    match answer {
        Ok(_) => Ok(()),
        Err(GithubError::Http(f)) if f.status == 404 => Ok(()),
        Err(e) => Err(e),
    }
}

/// Whether a failed answer names the service's exception `name`: its `typeName` is assembly
/// qualified (`GitHub.Actions...SessionExpiredException, GitHub.Actions...`), so it is matched
/// as a part of the message or of the body, as both Go clients do.
pub fn names_exception(e: &GithubError, name: &str) -> bool {
    match e {
        GithubError::Http(f) => f.message.contains(name),
        _ => false,
    }
}

/// The body without the byte-order mark the service may put before it.
fn without_bom(body: &[u8]) -> &[u8] {
    body.strip_prefix(b"\xef\xbb\xbf").unwrap_or(body)
}

/// A failed answer with the exception's `typeName` kept in its message, so callers can tell
/// the service's exceptions apart.
fn check_service(endpoint: &'static str, answer: Answer) -> Result<Answer, GithubError> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct ServiceError {
        #[serde(default)]
        type_name: Option<String>,
    }
    let kind = (!answer.status.is_success())
        .then(|| serde_json::from_slice::<ServiceError>(without_bom(&answer.body)).ok())
        .flatten()
        .and_then(|e| e.type_name);
    check(endpoint, answer).map_err(|e| match (e, kind) {
        (GithubError::Http(mut f), Some(kind)) => {
            f.message = format!("{kind}: {}", f.message);
            GithubError::Http(f)
        }
        (e, _) => e,
    })
}

impl ActionsClient {
    /// A client that reaches the service through `github`'s connection and credential.
    pub fn new(github: GithubClient) -> Self {
        ActionsClient {
            github,
            connection: Rc::default(),
        }
    }

    /// The owner of the target.
    pub fn owner(&self) -> &str {
        self.github.owner()
    }

    /// The service's URL and a live admin token, fetched again when it is about to expire.
    async fn connect(&self) -> Result<Connection, GithubError> {
        let now = crate::clock::unix_now();
        if let Some(c) = self.connection.borrow().as_ref()
            && c.expires_unix > now + REFRESH_BEFORE
        {
            return Ok(c.clone());
        }
        let level = self.github.runners_level(None);
        let answer = self
            .github
            .call(
                "registration_token",
                Method::POST,
                &format!("{level}/actions/runners/registration-token"),
                None,
            )
            .await?;
        let registration: RegistrationToken = decode("registration_token", &answer.body)?;
        let body = json!({
            "url": config_url(self.github.api_url(), self.github.owner(), self.github.enterprise()),
            "runner_event": "register",
        });
        let url = format!("{}/actions/runner-registration", self.github.api_url());
        let answer = self
            .send(
                "actions_admin_connection",
                Method::POST,
                &url,
                format!("RemoteAuth {}", registration.token),
                Some(body),
                None,
                CALL_TIMEOUT,
            )
            .await?;
        let admin: AdminConnection = decode(
            "actions_admin_connection",
            &check("actions_admin_connection", answer)?.body,
        )?;
        if admin.url.is_empty() || admin.token.is_empty() {
            return Err(GithubError::Decode {
                endpoint: "actions_admin_connection",
                detail: "the answer has no service url or no token".into(),
            });
        }
        self.may_follow("actions_admin_connection", &admin.url)?;
        let connection = Connection {
            expires_unix: jwt_expiry(&admin.token).unwrap_or(now + UNKNOWN_EXPIRY),
            url: admin.url,
            token: Secret::new(admin.token),
        };
        *self.connection.borrow_mut() = Some(connection.clone());
        Ok(connection)
    }

    /// Whether `url`, which GitHub handed out, may be followed with a token ([`reach`]):
    /// a refusal is logged and is the call's error.
    fn may_follow(&self, endpoint: &'static str, url: &str) -> Result<(), GithubError> {
        reach::check_service_url(url, self.github.api_url()).map_err(|refused| {
            tracing::error!(endpoint, %refused, "refused to follow the Actions service");
            GithubError::Decode {
                endpoint,
                detail: refused.to_string(),
            }
        })
    }

    /// [`ActionsClient::send`] to a URL GitHub handed out (the service's, the queue's), only
    /// where it may lead.
    #[allow(clippy::too_many_arguments)]
    async fn follow(
        &self,
        endpoint: &'static str,
        method: Method,
        url: &str,
        authorization: String,
        body: Option<Value>,
        header: Option<(&'static str, String)>,
        timeout: Duration,
    ) -> Result<Answer, GithubError> {
        self.may_follow(endpoint, url)?;
        self.send(endpoint, method, url, authorization, body, header, timeout)
            .await
    }

    /// One exchange with any URL, counted under `endpoint`.
    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        endpoint: &'static str,
        method: Method,
        url: &str,
        authorization: String,
        body: Option<Value>,
        header: Option<(&'static str, String)>,
        timeout: Duration,
    ) -> Result<Answer, GithubError> {
        let mut request = self
            .github
            .http()
            .request(method, url)
            .timeout(timeout)
            .insert_header(("Authorization", authorization))
            .insert_header(("Accept", ACCEPT));
        if let Some((name, value)) = header {
            request = request.insert_header((name, value));
        }
        self.github
            .exchange(endpoint, request, body, |_, _| {})
            .await
    }

    /// A call on the service with the admin token (fetched again once on a 401).
    async fn admin(
        &self,
        endpoint: &'static str,
        method: Method,
        path: &str,
        query: &[(&str, String)],
        body: Option<Value>,
    ) -> Result<Answer, GithubError> {
        for attempt in 0..2 {
            let c = self.connect().await?;
            let mut q: Vec<(&str, String)> = query.to_vec();
            q.push(("api-version", API_VERSION.to_string()));
            let query = serde_urlencoded::to_string(&q).unwrap_or_default();
            let url = format!("{}/{path}?{query}", c.url.trim_end_matches('/'));
            let answer = self
                .follow(
                    endpoint,
                    method.clone(),
                    &url,
                    format!("Bearer {}", c.token.expose()),
                    body.clone(),
                    None,
                    CALL_TIMEOUT,
                )
                .await?;
            if answer.status == StatusCode::UNAUTHORIZED && attempt == 0 {
                // Revoked or expired early: a new admin token, once.
                self.connection.borrow_mut().take();
                continue;
            }
            return check_service(endpoint, answer);
        }
        unreachable!("the loop returns on its second attempt")
    }

    /// The id of the runner group named `name` (`None`: `id`, the default group when 0).
    pub async fn runner_group_id(&self, name: Option<&str>, id: u64) -> Result<u64, GithubError> {
        let Some(name) = name else {
            return Ok(id.max(1));
        };
        let answer = self
            .admin(
                "actions_get_runner_group",
                Method::GET,
                "_apis/runtime/runnergroups/",
                &[("groupName", name.to_string())],
                None,
            )
            .await?;
        let list: List<RunnerGroup> =
            decode("actions_get_runner_group", without_bom(&answer.body))?;
        list.value
            .first()
            .map(|g| g.id)
            .ok_or_else(|| GithubError::NoRunnerGroup {
                name: name.to_string(),
                known: "(the Actions service lists none by that name)".into(),
            })
    }

    /// The scale set named `name` in group `group`, if there is one.
    pub async fn find_scale_set(
        &self,
        group: u64,
        name: &str,
    ) -> Result<Option<ScaleSet>, GithubError> {
        let answer = self
            .admin(
                "actions_get_scale_set",
                Method::GET,
                SCALE_SETS,
                &[
                    ("runnerGroupId", group.to_string()),
                    ("name", name.to_string()),
                ],
                None,
            )
            .await?;
        let list: List<ScaleSet> = decode("actions_get_scale_set", without_bom(&answer.body))?;
        Ok(list.value.into_iter().next())
    }

    /// The scale set `id` (`None`: deleted).
    pub async fn scale_set(&self, id: u64) -> Result<Option<ScaleSet>, GithubError> {
        match self
            .admin(
                "actions_get_scale_set_by_id",
                Method::GET,
                &format!("{SCALE_SETS}/{id}"),
                &[],
                None,
            )
            .await
        {
            Ok(a) => decode("actions_get_scale_set_by_id", without_bom(&a.body)).map(Some),
            Err(GithubError::Http(f)) if f.status == 404 => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates a scale set.
    pub async fn create_scale_set(&self, set: &ScaleSet) -> Result<ScaleSet, GithubError> {
        let body = serde_json::to_value(set).unwrap_or(Value::Null);
        let a = self
            .admin(
                "actions_create_scale_set",
                Method::POST,
                SCALE_SETS,
                &[],
                Some(body),
            )
            .await?;
        decode("actions_create_scale_set", without_bom(&a.body))
    }

    /// Updates scale set `id` (its labels).
    pub async fn update_scale_set(&self, id: u64, set: &ScaleSet) -> Result<ScaleSet, GithubError> {
        let body = serde_json::to_value(set).unwrap_or(Value::Null);
        let a = self
            .admin(
                "actions_update_scale_set",
                Method::PATCH,
                &format!("{SCALE_SETS}/{id}"),
                &[],
                Some(body),
            )
            .await?;
        decode("actions_update_scale_set", without_bom(&a.body))
    }

    /// Deletes scale set `id`; already gone counts as done.
    pub async fn delete_scale_set(&self, id: u64) -> Result<(), GithubError> {
        gone_is_done(
            self.admin(
                "actions_delete_scale_set",
                Method::DELETE,
                &format!("{SCALE_SETS}/{id}"),
                &[],
                None,
            )
            .await,
        )
    }

    /// Opens the message session of scale set `set` as `owner` (a 409: another owner holds it).
    pub async fn create_session(&self, set: u64, owner: &str) -> Result<Session, GithubError> {
        let a = self
            .admin(
                "actions_create_session",
                Method::POST,
                &format!("{SCALE_SETS}/{set}/sessions"),
                &[],
                Some(json!({ "ownerName": owner })),
            )
            .await?;
        decode("actions_create_session", without_bom(&a.body))
    }

    /// Refreshes a session's queue token (a 404: the session was evicted).
    pub async fn refresh_session(&self, set: u64, session: &str) -> Result<Session, GithubError> {
        let a = self
            .admin(
                "actions_refresh_session",
                Method::PATCH,
                &format!("{SCALE_SETS}/{set}/sessions/{session}"),
                &[],
                None,
            )
            .await?;
        decode("actions_refresh_session", without_bom(&a.body))
    }

    /// Closes a session; already gone counts as done: a 404, and the 400
    /// `RunnerScaleSetSessionExpiredException` the service answers for a session that lapsed.
    pub async fn delete_session(&self, set: u64, session: &str) -> Result<(), GithubError> {
        match self
            .admin(
                "actions_delete_session",
                Method::DELETE,
                &format!("{SCALE_SETS}/{set}/sessions/{session}"),
                &[],
                None,
            )
            .await
        {
            Err(e) if names_exception(&e, "SessionExpiredException") => Ok(()),
            other => gone_is_done(other),
        }
    }

    /// Deletes runner `id`'s registration (`DELETE .../agents/{id}`); already gone counts as
    /// done.
    pub async fn delete_runner(&self, id: u64) -> Result<(), GithubError> {
        gone_is_done(
            self.admin(
                "actions_delete_runner",
                Method::DELETE,
                &format!("{AGENTS}/{id}"),
                &[],
                None,
            )
            .await,
        )
    }

    /// The next message after `last` (`None`: none came within the long poll). A 401 means the
    /// queue token expired (refresh the session), a 404 that the session is gone.
    pub async fn get_message(
        &self,
        session: &Session,
        last: u64,
        capacity: usize,
    ) -> Result<Option<QueueMessage>, GithubError> {
        let endpoint = "actions_get_message";
        let mut url = session.message_queue_url.clone();
        if last > 0 {
            url.push(if url.contains('?') { '&' } else { '?' });
            url.push_str(&format!("lastMessageId={last}"));
        }
        let answer = self
            .follow(
                endpoint,
                Method::GET,
                &url,
                format!("Bearer {}", session.message_queue_access_token),
                None,
                Some(("X-ScaleSetMaxCapacity", capacity.to_string())),
                POLL_TIMEOUT,
            )
            .await?;
        if answer.status == StatusCode::ACCEPTED {
            return Ok(None);
        }
        let answer = check_service(endpoint, answer)?;
        let body = without_bom(&answer.body);
        // A 200 with nothing in it has been seen in the wild: no message, as a 202.
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let wire: WireMessage = decode(endpoint, body)?;
        Ok(Some(wire.parse()))
    }

    /// Acknowledges message `id`: the queue forgets it.
    pub async fn delete_message(&self, session: &Session, id: u64) -> Result<(), GithubError> {
        let endpoint = "actions_delete_message";
        let (base, query) = match session.message_queue_url.split_once('?') {
            Some((b, q)) => (b.to_string(), format!("?{q}")),
            None => (session.message_queue_url.clone(), String::new()),
        };
        let url = format!("{}/{id}{query}", base.trim_end_matches('/'));
        let answer = self
            .follow(
                endpoint,
                Method::DELETE,
                &url,
                format!("Bearer {}", session.message_queue_access_token),
                None,
                None,
                CALL_TIMEOUT,
            )
            .await?;
        check_service(endpoint, answer).map(|_| ())
    }

    /// Acquires the jobs of these runner requests for scale set `set`; answers the ones
    /// acquired (others were taken or cancelled meanwhile).
    pub async fn acquire_jobs(
        &self,
        set: u64,
        session: &Session,
        ids: &[u64],
    ) -> Result<Vec<u64>, GithubError> {
        let endpoint = "actions_acquire_jobs";
        let c = self.connect().await?;
        let url = format!(
            "{}/{SCALE_SETS}/{set}/acquirejobs?api-version={API_VERSION}",
            c.url.trim_end_matches('/')
        );
        let answer = self
            .follow(
                endpoint,
                Method::POST,
                &url,
                format!("Bearer {}", session.message_queue_access_token),
                Some(json!(ids)),
                None,
                CALL_TIMEOUT,
            )
            .await?;
        let answer = check_service(endpoint, answer)?;
        let list: List<u64> = decode(endpoint, without_bom(&answer.body))?;
        Ok(list.value)
    }

    /// Registers a JIT runner named `name` in scale set `set`.
    pub async fn generate_jitconfig(&self, set: u64, name: &str) -> Result<JitRunner, GithubError> {
        let endpoint = "actions_generate_jitconfig";
        let a = self
            .admin(
                endpoint,
                Method::POST,
                &format!("{SCALE_SETS}/{set}/generatejitconfig"),
                &[],
                Some(json!({ "name": name, "workFolder": "_work" })),
            )
            .await?;
        let jit: JitAnswer = decode(endpoint, without_bom(&a.body))?;
        if jit.runner.name != name {
            // Registered under a name not asked for: it is not ours to run, and not to be
            // left registered either.
            if let Err(e) = self.delete_runner(jit.runner.id).await {
                tracing::warn!(runner_id = jit.runner.id, error = %e, "scale set: cannot delete a runner registered under another name");
            }
            return Err(GithubError::RenamedRunner {
                asked: name.to_string(),
                answered: jit.runner.name,
            });
        }
        Ok(JitRunner {
            id: jit.runner.id,
            name: jit.runner.name,
            encoded_jit_config: Secret::new(jit.encoded_jit_config),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_url_is_the_web_url_of_the_owner() {
        assert_eq!(
            config_url("https://api.github.com", "acme", None),
            "https://github.com/acme"
        );
        assert_eq!(
            config_url("https://ghe.example.com/api/v3/", "acme", None),
            "https://ghe.example.com/acme"
        );
        assert_eq!(
            config_url("https://api.github.com", "acme", Some("big")),
            "https://github.com/enterprises/big"
        );
    }

    #[test]
    fn a_jwt_s_expiry_is_read_without_its_key() {
        let payload = URL_SAFE_NO_PAD.encode(r#"{"exp":1700000000,"iss":"x"}"#);
        assert_eq!(jwt_expiry(&format!("h.{payload}.sig")), Some(1_700_000_000));
        assert_eq!(jwt_expiry("not a jwt"), None);
    }
}
