//! `providers.*.warm`, `warm_max_age` and `warm_mode`.

use super::{Problems, duration};
use crate::config::{
    WarmConfig, WarmMode,
    raw::{RawWarm, RawWarmWindow},
    warm::{WARM_MAX_AGE, WarmWindow, parse_days, parse_hours},
};

/// A pool's warm keys as read.
pub(super) struct RawWarmKeys {
    pub warm: Option<RawWarm>,
    pub max_age: Option<String>,
    pub mode: Option<String>,
}

/// A pool's warm settings: every count at most the pool's `max_concurrent` (warm environments
/// and running ones share the pool's slots), windows well-formed, the zone known, the mode
/// one of the two.
pub(super) fn build_warm(
    key: &str,
    raw: RawWarmKeys,
    max_concurrent: usize,
    p: &mut Problems,
) -> WarmConfig {
    let RawWarmKeys {
        warm: raw,
        max_age,
        mode,
    } = raw;
    let mode = match mode.as_deref() {
        None | Some("booted") => WarmMode::Booted,
        Some("registered") => WarmMode::Registered,
        Some(other) => {
            p.push(
                format!("{key}.warm_mode"),
                format!("must be \"booted\" or \"registered\", got {other:?}"),
            );
            WarmMode::Booted
        }
    };
    let mut c = WarmConfig {
        mode,
        max_age: duration(&format!("{key}.warm_max_age"), max_age, WARM_MAX_AGE, p),
        ..WarmConfig::default()
    };
    if c.max_age.is_zero() {
        p.push(format!("{key}.warm_max_age"), "must be longer than 0s");
    }
    let counted = |at: String, n: Option<i64>, p: &mut Problems| counted(at, n, max_concurrent, p);
    match raw {
        None => {}
        Some(RawWarm::Count(n)) => c.min = counted(format!("{key}.warm"), Some(n), p),
        Some(RawWarm::Table(t)) => {
            c.min = counted(format!("{key}.warm.min"), t.min, p);
            for (i, w) in t.windows.unwrap_or_default().into_iter().enumerate() {
                let at = format!("{key}.warm.windows[{i}]");
                c.windows.push(window(&at, w, max_concurrent, p));
            }
            // The zone is resolved here, once: the cores read the windows in it.
            match t.time_zone {
                Some(zone) => match jiff::tz::TimeZone::get(&zone) {
                    Ok(tz) => {
                        c.zone = tz;
                        c.time_zone = Some(zone);
                    }
                    Err(_) => p.push(
                        format!("{key}.warm.time_zone"),
                        format!("{zone:?} is not a time zone this host knows (an IANA name, e.g. \"Europe/Berlin\")"),
                    ),
                },
                None => c.zone = jiff::tz::TimeZone::system(),
            }
        }
    }
    c
}

/// A count of environments at `at`: 0 or more, and at most the pool's `max_concurrent`.
fn counted(at: String, n: Option<i64>, max_concurrent: usize, p: &mut Problems) -> usize {
    match n {
        None => 0,
        Some(n) if n < 0 => {
            p.push(at, format!("must be 0 or more, got {n}"));
            0
        }
        Some(n) if n as u64 > max_concurrent as u64 => {
            p.push(
                at,
                format!("{n} is more than the pool's max_concurrent ({max_concurrent}): warm environments take the pool's slots"),
            );
            0
        }
        Some(n) => usize::try_from(n).unwrap_or(0),
    }
}

/// One window at `at`: its days (all when not said), its hours (the whole day when not
/// said) and its count (required).
fn window(at: &str, w: RawWarmWindow, max_concurrent: usize, p: &mut Problems) -> WarmWindow {
    let days = match w.days.as_deref().map(parse_days) {
        Some(Ok(days)) => days,
        Some(Err(e)) => {
            p.push(format!("{at}.days"), e);
            [false; 7]
        }
        None => [true; 7],
    };
    let (from, to) = match w.hours.as_deref().map(parse_hours) {
        Some(Ok(hours)) => hours,
        Some(Err(e)) => {
            p.push(format!("{at}.hours"), e);
            (0, 0)
        }
        None => (0, 24 * 60),
    };
    if w.min.is_none() {
        p.push(
            format!("{at}.min"),
            "required: how many to keep warm in the window",
        );
    }
    let min = counted(format!("{at}.min"), w.min, max_concurrent, p);
    WarmWindow {
        days,
        from,
        to,
        min,
    }
}

/// A registered warm runner is made before its job, so it cannot be registered in the job's
/// repo: a pool that keeps them serves org-level (or enterprise) targets only.
pub(super) fn check_registered(c: &crate::config::Config, p: &mut Problems) {
    let targets = c.targets();
    for pool in c.providers.enabled() {
        if !pool.common.warm.registered() {
            continue;
        }
        let serves = |name: &String| {
            pool.common
                .targets
                .as_ref()
                .is_none_or(|names| names.contains(name))
        };
        let repo_level: Vec<&str> = targets
            .iter()
            .filter(|t| serves(&t.name) && !t.github.repos.is_empty())
            .map(|t| t.name.as_str())
            .collect();
        if !repo_level.is_empty() {
            p.push(
                format!("providers.{}.warm_mode", pool.name),
                format!(
                    "\"registered\" runners are made before their job, so they cannot be \
                     registered in its repo; target(s) {} register runners per repo (use \
                     \"booted\", or serve only org-level targets from this pool)",
                    repo_level.join(", ")
                ),
            );
        }
    }
}
