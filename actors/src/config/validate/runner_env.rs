//! `providers.NAME.env`: extra variables for a pool's runners, `${NAME}` expanded from the
//! daemon's environment, with the names the daemon sets itself (or keeps to itself) refused.

use super::{Environment, Problems, Secret};

/// The daemon's own secrets: neither a name in `env` nor a `${NAME}` reference may reach them,
/// or every job would hold the daemon's GitHub credential. Besides its fixed names, every
/// variable a target's secret references (`secrets`) is its own.
fn daemons_own(name: &str, secrets: &std::collections::BTreeSet<String>) -> bool {
    name == "GITHUB_TOKEN" || name.starts_with("EPHEMER_") || secrets.contains(name)
}

pub(super) fn build_env(
    key: &str,
    raw: Option<std::collections::BTreeMap<String, String>>,
    env: &Environment,
    secrets: &std::collections::BTreeSet<String>,
    p: &mut Problems,
) -> Vec<(String, Secret)> {
    let mut out = Vec::new();
    for (name, value) in raw.unwrap_or_default() {
        let k = format!("{key}.{name}");
        let valid_name = name
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid_name {
            p.push(
                &k,
                "not a variable name (letters, digits and '_', not starting with a digit)",
            );
            continue;
        }
        if crate::vocab::runner_vars::set_by_daemon(&name) {
            p.push(
                &k,
                "the daemon sets this for every runner (its JIT config, its own directories, \
                 or the proxy and CA from github.proxy and github.ca_file); it cannot be \
                 overridden",
            );
            continue;
        }
        if daemons_own(&name, secrets) {
            p.push(
                &k,
                "is one of the daemon's own variables; a runner never gets them",
            );
            continue;
        }
        match expand(&value, env, secrets) {
            Ok(v) => out.push((name, Secret::new(v))),
            Err(reason) => p.push(&k, reason),
        }
    }
    out
}

/// `${NAME}` becomes the daemon's `NAME`; any other `$` is kept as written.
fn expand(
    value: &str,
    env: &Environment,
    secrets: &std::collections::BTreeSet<String>,
) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let Some(end) = after.find('}') else {
            return Err("has a ${ without its closing }".into());
        };
        let name = &after[..end];
        if name.is_empty() {
            return Err("has an empty ${}".into());
        }
        if daemons_own(name, secrets) {
            return Err(format!(
                "references ${{{name}}}, one of the daemon's own secrets; a runner never gets them"
            ));
        }
        match env.vars.get(name) {
            Some(v) => out.push_str(v.expose()),
            None => {
                return Err(format!(
                    "references ${{{name}}}, which the daemon's environment does not set"
                ));
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}
