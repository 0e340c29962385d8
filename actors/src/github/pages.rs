//! Listings: every page of a GitHub listing (`Link: rel="next"`, capped), asked with
//! `If-None-Match` when a page was seen before, so an unchanged page is a 304 that GitHub
//! does not count against the rate limit.

use std::{cell::RefCell, collections::HashMap};

use actix_web::http::{Method, StatusCode, header::HeaderMap};
use serde::de::DeserializeOwned;

use super::{
    client::{GithubClient, decode},
    error::GithubError,
};

/// `per_page` for every listing (GitHub's maximum).
const PER_PAGE: usize = 100;
/// A listing stops after this many pages, whatever the Link header says.
const MAX_PAGES: usize = 50;
/// Conditional pages kept at most; past this the cache starts over (old runs' pages go).
const ETAG_CACHE_CAP: usize = 4096;

/// A page kept for conditional requests.
#[derive(Debug, Clone)]
pub(super) struct CachedPage {
    etag: String,
    body: actix_web::web::Bytes,
    next: bool,
}

/// The last page of each listing GitHub answered with an `ETag`, by URL.
#[derive(Debug, Default)]
pub(super) struct PageCache(RefCell<HashMap<String, CachedPage>>);

impl PageCache {
    fn get(&self, url: &str) -> Option<CachedPage> {
        self.0.borrow().get(url).cloned()
    }

    fn put(&self, url: String, page: CachedPage) {
        let mut pages = self.0.borrow_mut();
        if pages.len() >= ETAG_CACHE_CAP {
            pages.clear();
        }
        pages.insert(url, page);
    }
}

impl GithubClient {
    /// GETs every page of a listing, following `Link: rel="next"`.
    pub(super) async fn paginate<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<Vec<T>, GithubError> {
        Ok(self.paginate_counted(endpoint, path, query).await?.0)
    }

    /// Like [`GithubClient::paginate`], also saying how many pages came with a body (which
    /// GitHub counts against the rate limit) and how many were an unchanged 304 (free).
    pub(super) async fn paginate_counted<T: DeserializeOwned>(
        &self,
        endpoint: &'static str,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<(Vec<T>, u32, u32), GithubError> {
        let mut pages = Vec::new();
        let (mut changed, mut unchanged) = (0, 0);
        for page in 1..=MAX_PAGES {
            let mut q: Vec<String> = query.iter().map(|(k, v)| format!("{k}={v}")).collect();
            q.push(format!("per_page={PER_PAGE}"));
            q.push(format!("page={page}"));
            let url = format!("{path}?{}", q.join("&"));
            let cached = self.pages().get(&url);
            let condition = cached.as_ref().map(|c| ("If-None-Match", c.etag.as_str()));
            let answer = self
                .call_with(endpoint, Method::GET, &url, None, condition)
                .await?;
            let (body, next) = match cached {
                Some(c) if answer.status == StatusCode::NOT_MODIFIED => {
                    unchanged += 1;
                    (c.body, c.next)
                }
                _ => {
                    changed += 1;
                    let next = has_next_page(&answer.headers);
                    if let Some(etag) = answer.headers.get("etag").and_then(|v| v.to_str().ok()) {
                        self.pages().put(
                            url,
                            CachedPage {
                                etag: etag.to_string(),
                                body: answer.body.clone(),
                                next,
                            },
                        );
                    }
                    (answer.body, next)
                }
            };
            pages.push(decode(endpoint, &body)?);
            if !next {
                break;
            }
        }
        Ok((pages, changed, unchanged))
    }
}

fn has_next_page(headers: &HeaderMap) -> bool {
    headers
        .get_all("link")
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.split(',').any(|part| part.contains("rel=\"next\"")))
}
