//! `[providers.NAME.egress]`: the mode, the allow-list's entries and the private ranges, each
//! problem named by its key.

use ephemer_decide::egress::{
    allow::{AllowList, Mode},
    private::private_range,
};

use super::{EgressConfig, Problems, ProviderKind, RawEgress};

/// The pool `key`'s egress settings, of a pool of `kind`.
pub(super) fn build_egress(
    key: &str,
    kind: ProviderKind,
    raw: Option<RawEgress>,
    p: &mut Problems,
) -> EgressConfig {
    let Some(raw) = raw else {
        return EgressConfig::default();
    };
    let key = format!("{key}.egress");
    let mode_written = raw.mode.is_some();
    let mode = match raw.mode.as_deref() {
        None => Mode::Open,
        Some(m) => Mode::parse(m).unwrap_or_else(|| {
            p.push(
                format!("{key}.mode"),
                format!("`{m}` is not a mode: \"open\", \"audit\" or \"allow-list\""),
            );
            Mode::Open
        }),
    };
    let entries = raw.allow.unwrap_or_default();
    let allow = AllowList::new(&entries, None).unwrap_or_else(|problems| {
        for (i, e) in problems {
            p.push(format!("{key}.allow[{i}]"), e);
        }
        AllowList::default()
    });
    if !mode_written && !entries.is_empty() {
        p.push(
            format!("{key}.allow"),
            "an allow-list is read only in mode \"allow-list\" (enforced) or \"audit\" (reported); \
             set `mode`",
        );
    }
    let allow_private = raw
        .allow_private
        .unwrap_or_default()
        .iter()
        .enumerate()
        .filter_map(|(i, entry)| match private_range(entry) {
            Ok(net) => Some(net),
            Err(why) => {
                p.push(format!("{key}.allow_private[{i}]"), why);
                None
            }
        })
        .collect::<Vec<_>>();
    let asks = mode != Mode::Open || !allow_private.is_empty();
    match kind {
        ProviderKind::VmMacos | ProviderKind::NativeMacos if asks => p.push(
            key.clone(),
            "a macOS pool's jobs have no network namespace (macOS has none), so its egress stays \
             \"open\": nothing here would be enforced (docs/security.md, \"The network\")",
        ),
        ProviderKind::Local | ProviderKind::Linux if asks => p.push(
            key.clone(),
            format!(
                "a {kind} pool's jobs are not in a network namespace yet (a local runner has the \
                 host's network, a container the engine's), so its egress stays \"open\": only \
                 linux_vm pools enforce it (docs/security.md, \"The network\")"
            ),
        ),
        _ => {}
    }
    EgressConfig {
        mode,
        entries,
        allow,
        allow_private,
    }
}

/// Each pool serving a GHES target allows that target's host instead of github.com's.
pub(super) fn for_ghes(
    providers: &mut super::ProvidersConfig,
    github: &super::GithubConfig,
    targets: &[super::super::Target],
) {
    let host_of = |api: &str| {
        let rest = api.split_once("://").map_or(api, |(_, r)| r);
        let host = rest
            .split(['/', ':'])
            .next()
            .unwrap_or(rest)
            .to_ascii_lowercase();
        (host != "api.github.com").then_some(host)
    };
    for pool in &mut providers.pools {
        let serves = |name: &str| {
            pool.common
                .targets
                .as_ref()
                .is_none_or(|t| t.iter().any(|n| n == name))
        };
        let ghes = if targets.is_empty() {
            host_of(&github.api_url)
        } else {
            targets
                .iter()
                .filter(|t| serves(&t.name))
                .find_map(|t| host_of(&t.github.api_url))
        };
        if let Some(host) = ghes {
            pool.common.egress.for_ghes(&host);
        }
    }
}
