//! The webhook that delivers to us, its recent deliveries, and asking GitHub to deliver one
//! again.
//!
//! GitHub does not redeliver a failed delivery by itself ("Handling failed webhook
//! deliveries", docs.github.com): it records it, lists it under the hook's deliveries (newest
//! first, `per_page` up to 100, a `cursor` taken from the `Link` header's `rel="next"`), and
//! delivers it again, with the same `X-GitHub-Delivery` guid, on
//! `POST .../deliveries/{delivery_id}/attempts` (202). Org hooks live under `/orgs/{org}/hooks`,
//! repo hooks under `/repos/{owner}/{repo}/hooks`, and a GitHub App's own hook under
//! `/app/hook`, which takes the App's JWT rather than an installation token. A delivery whose
//! `status` is not `"OK"` failed.

use actix_web::http::Method;
use serde::Deserialize;

use super::{GithubClient, GithubError, auth::Credentials, client};
use crate::config::Secret;

/// Which hook.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HookRef {
    /// An organization webhook.
    Org(u64),
    /// A repository webhook.
    Repo {
        /// Its repo.
        repo: String,
        /// Its id.
        id: u64,
    },
    /// The GitHub App's own webhook.
    App,
}

impl std::fmt::Display for HookRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HookRef::Org(id) => write!(f, "org hook {id}"),
            HookRef::Repo { repo, id } => write!(f, "repo hook {id} of {repo}"),
            HookRef::App => f.write_str("the App's webhook"),
        }
    }
}

impl HookRef {
    /// A stable name (the store keeps where each hook's pass left off under it).
    pub fn key(&self) -> String {
        match self {
            HookRef::Org(id) => format!("org/{id}"),
            HookRef::Repo { repo, id } => format!("repo/{repo}/{id}"),
            HookRef::App => "app".into(),
        }
    }
}

/// One delivery as GitHub lists it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct HookDelivery {
    /// This attempt's id (what a redelivery names); a redelivery is a new attempt with a new id.
    pub id: u64,
    /// The delivery's guid (`X-GitHub-Delivery`), shared by its redeliveries.
    pub guid: String,
    /// RFC 3339.
    #[serde(default)]
    pub delivered_at: String,
    /// True for a redelivered attempt.
    #[serde(default)]
    pub redelivery: bool,
    /// `"OK"` when it was delivered, else why not.
    #[serde(default)]
    pub status: String,
    /// What our side answered (0: no answer).
    #[serde(default)]
    pub status_code: u16,
    /// The event.
    #[serde(default)]
    pub event: String,
    /// The event's action.
    #[serde(default)]
    pub action: Option<String>,
}

impl HookDelivery {
    /// True when this attempt was delivered.
    pub fn delivered(&self) -> bool {
        self.status.eq_ignore_ascii_case("ok")
    }

    /// When it was attempted, in unix seconds (`None` when GitHub's timestamp is unreadable).
    pub fn at_unix(&self) -> Option<u64> {
        crate::clock::unix_of_rfc3339(&self.delivered_at)
    }
}

#[derive(Deserialize)]
struct HookItem {
    id: u64,
    #[serde(default)]
    active: bool,
    #[serde(default)]
    config: HookConfigItem,
}

#[derive(Default, Deserialize)]
struct HookConfigItem {
    #[serde(default)]
    url: Option<String>,
}

/// URLs compared as GitHub posts to them: a trailing slash does not count.
fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// The `cursor` of a `Link: <...>; rel="next"` header.
fn next_cursor(headers: &actix_web::http::header::HeaderMap) -> Option<String> {
    headers
        .get_all("link")
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find(|part| part.contains("rel=\"next\""))
        .and_then(|part| {
            let url = part.split(['<', '>']).nth(1)?;
            let query = url.split_once('?')?.1;
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix("cursor="))
                .map(str::to_string)
        })
}

impl GithubClient {
    /// The hooks that deliver to us: `hook_id` when set, else the one whose `config.url` is
    /// `public_url`; with neither and an App credential, the App's own hook. The org's hooks
    /// are looked at first (an org hook delivers for every repo); with `repos` configured,
    /// each repo's hooks too, unless the org's matched. Empty when none matches.
    pub async fn find_hooks(
        &self,
        hook_id: Option<u64>,
        public_url: Option<&str>,
    ) -> Result<Vec<HookRef>, GithubError> {
        let (owner, repos, credentials) = self.target();
        if hook_id.is_none() && public_url.is_none() {
            return Ok(match credentials {
                Credentials::App(_) => vec![HookRef::App],
                Credentials::Token(_) => Vec::new(),
            });
        }
        let matches = |h: &HookItem| {
            h.active
                && match hook_id {
                    Some(id) => h.id == id,
                    None => h
                        .config
                        .url
                        .as_deref()
                        .zip(public_url)
                        .is_some_and(|(a, b)| same_url(a, b)),
                }
        };
        let owner = owner.to_string();
        let repos = repos.to_vec();
        let org: Result<Vec<Vec<HookItem>>, GithubError> = self
            .paginate("list_hooks", &format!("/orgs/{owner}/hooks"), &[])
            .await;
        match org {
            Ok(pages) => {
                if let Some(h) = pages.into_iter().flatten().find(|h| matches(h)) {
                    return Ok(vec![HookRef::Org(h.id)]);
                }
            }
            // Repo-level setups often cannot read the org's hooks; their repos' hooks decide.
            Err(e) if !repos.is_empty() && e.status().is_some_and(|s| s == 403 || s == 404) => {}
            Err(e) => return Err(e),
        }
        let mut found = Vec::new();
        for repo in repos {
            let path = format!("/repos/{owner}/{repo}/hooks");
            let pages: Vec<Vec<HookItem>> = self.paginate("list_hooks", &path, &[]).await?;
            found.extend(pages.into_iter().flatten().filter(|h| matches(h)).map(|h| {
                HookRef::Repo {
                    repo: repo.clone(),
                    id: h.id,
                }
            }));
        }
        Ok(found)
    }

    fn hook_base(&self, hook: &HookRef) -> String {
        let owner = self.owner();
        match hook {
            HookRef::Org(id) => format!("/orgs/{owner}/hooks/{id}"),
            HookRef::Repo { repo, id } => format!("/repos/{owner}/{repo}/hooks/{id}"),
            HookRef::App => "/app/hook".into(),
        }
    }

    /// One request about `hook`: with the App's JWT for the App's hook, else as every call.
    async fn hook_call(
        &self,
        endpoint: &'static str,
        method: Method,
        hook: &HookRef,
        path: &str,
    ) -> Result<client::Answer, GithubError> {
        if *hook != HookRef::App {
            return self.call(endpoint, method, path, None).await;
        }
        let (_, _, credentials) = self.target();
        let jwt: Secret = credentials
            .app_jwt()
            .ok_or_else(|| GithubError::Auth("the App's webhook needs App credentials".into()))??;
        let answer = self
            .send(endpoint, (method, path), &jwt, None, None, false)
            .await?;
        client::check(endpoint, answer)
    }

    /// One page of `hook`'s deliveries, newest first, from `cursor` (`None`: the newest), and
    /// the cursor of the next page.
    pub async fn hook_deliveries(
        &self,
        hook: &HookRef,
        cursor: Option<&str>,
    ) -> Result<(Vec<HookDelivery>, Option<String>), GithubError> {
        let mut path = format!("{}/deliveries?per_page=100", self.hook_base(hook));
        if let Some(cursor) = cursor {
            path.push_str("&cursor=");
            path.push_str(cursor);
        }
        let answer = self
            .hook_call("list_hook_deliveries", Method::GET, hook, &path)
            .await?;
        let next = next_cursor(&answer.headers);
        let page = client::decode("list_hook_deliveries", &answer.body)?;
        Ok((page, next))
    }

    /// Asks GitHub to deliver attempt `delivery_id` of `hook` again.
    pub async fn redeliver(&self, hook: &HookRef, delivery_id: u64) -> Result<(), GithubError> {
        let path = format!("{}/deliveries/{delivery_id}/attempts", self.hook_base(hook));
        self.hook_call("redeliver_hook_delivery", Method::POST, hook, &path)
            .await
            .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_cursor_is_read_from_the_link_header() {
        let mut h = actix_web::http::header::HeaderMap::new();
        h.insert(
            actix_web::http::header::LINK,
            "<https://api.github.com/orgs/acme/hooks/7/deliveries?per_page=100&cursor=v1_41>; rel=\"next\""
                .parse()
                .unwrap(),
        );
        assert_eq!(next_cursor(&h).as_deref(), Some("v1_41"));
        assert_eq!(
            next_cursor(&actix_web::http::header::HeaderMap::new()),
            None
        );
    }

    #[test]
    fn a_delivery_s_time_and_outcome_are_read() {
        let d: HookDelivery = serde_json::from_value(serde_json::json!({
            "id": 3, "guid": "g", "delivered_at": "2026-12-01T02:00:00Z",
            "redelivery": false, "status": "Invalid HTTP Response: 503", "status_code": 503,
            "event": "workflow_job", "action": "queued"
        }))
        .unwrap();
        assert!(!d.delivered());
        assert_eq!(d.at_unix(), Some(1_796_090_400));
        assert!(same_url(
            "https://ci.example/hook/",
            "https://ci.example/hook"
        ));
    }
}
