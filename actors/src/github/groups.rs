//! Runner groups: `github.runner_group` names one, and runners register in it by id.

use serde::Deserialize;

use super::{GithubClient, GithubError};

#[derive(Deserialize)]
struct GroupsPage {
    runner_groups: Vec<Group>,
}

#[derive(Deserialize)]
struct Group {
    id: u64,
    name: String,
}

impl GithubClient {
    /// The runner group runners register in: `runner_group_id`, or the group named
    /// `runner_group`, looked up once among the org's (or the enterprise's) groups (`GET /orgs/{org}/actions/
    /// runner-groups`, docs.github.com "Self-hosted runner groups") and kept. A name no group
    /// has is [`GithubError::NoRunnerGroup`], naming the groups there are.
    pub async fn runner_group_id(&self) -> Result<u64, GithubError> {
        let (id, name) = self.runner_group();
        let Some(name) = name.filter(|_| id == 0) else {
            return Ok(id);
        };
        let path = format!("{}/actions/runner-groups", self.runners_level(None));
        let pages: Vec<GroupsPage> = self.paginate("list_runner_groups", &path, &[]).await?;
        let groups: Vec<Group> = pages.into_iter().flat_map(|p| p.runner_groups).collect();
        // GitHub keeps group names unique regardless of case.
        let found = groups
            .iter()
            .find(|g| g.name == name)
            .or_else(|| groups.iter().find(|g| g.name.eq_ignore_ascii_case(&name)));
        match found {
            Some(g) => {
                self.set_runner_group_id(g.id);
                Ok(g.id)
            }
            None => Err(GithubError::NoRunnerGroup {
                name,
                known: groups
                    .iter()
                    .map(|g| g.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }
}
