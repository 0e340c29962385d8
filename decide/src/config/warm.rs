//! `providers.*.warm`: how many environments a pool keeps booted and waiting for a claim, by
//! time of week, and how old one may grow. Plain data with the one rule that reads it
//! ([`WarmConfig::target_at`]); the clock's reading into a local time is the caller's.

use std::time::Duration;

/// One time window: on `days`, between `from` and `to` (minutes of the day, local time),
/// the pool keeps at least `min` warm.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmWindow {
    /// Monday first.
    pub days: [bool; 7],
    /// Start, in minutes after midnight.
    pub from: u16,
    /// End (exclusive), in minutes after midnight; at most 24:00.
    pub to: u16,
    /// Environments kept warm inside the window.
    pub min: usize,
}

/// `warm_mode`: what a warm environment is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WarmMode {
    /// `booted` (the default): booted and waiting, with no GitHub registration; the claim's
    /// JIT config is handed to it.
    #[default]
    Booted,
    /// `registered`: a JIT runner claimed ahead of any job and idle, so GitHub hands a queued
    /// job to it at once (a registration and an environment held per warm runner).
    Registered,
}

/// A pool's warm settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WarmConfig {
    /// `warm_mode`.
    pub mode: WarmMode,
    /// Environments kept warm outside every window.
    pub min: usize,
    /// Windows raising the count.
    pub windows: Vec<WarmWindow>,
    /// `time_zone`: the IANA zone the windows are in; `None`: the host's.
    pub time_zone: Option<String>,
    /// That zone, resolved when the config was read (UTC until then): the windows are
    /// read in it without touching the host's zone files here.
    pub zone: jiff::tz::TimeZone,
    /// `warm_max_age`: a warm environment older than this is replaced.
    pub max_age: Duration,
}

/// `warm_max_age`'s default.
pub const WARM_MAX_AGE: Duration = Duration::from_secs(3600);

impl Default for WarmConfig {
    fn default() -> Self {
        WarmConfig {
            mode: WarmMode::Booted,
            min: 0,
            windows: Vec::new(),
            time_zone: None,
            zone: jiff::tz::TimeZone::UTC,
            max_age: WARM_MAX_AGE,
        }
    }
}

/// A local time of the week: the day (0 = Monday) and the minute of the day.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WeekTime {
    /// 0 = Monday ... 6 = Sunday.
    pub day: usize,
    /// Minutes after midnight.
    pub minute: u16,
}

impl WarmConfig {
    /// Whether the pool keeps anything warm at any time.
    pub fn any(&self) -> bool {
        self.min > 0 || self.windows.iter().any(|w| w.min > 0)
    }

    /// Whether the pool keeps booted environments (the supervisor's part).
    pub fn booted(&self) -> bool {
        self.mode == WarmMode::Booted && self.any()
    }

    /// Whether the pool keeps registered idle runners (the scheduler's part).
    pub fn registered(&self) -> bool {
        self.mode == WarmMode::Registered && self.any()
    }

    /// How many environments to keep warm at `t`: the most any window covering `t` asks
    /// for, and never fewer than `min`.
    pub fn target_at(&self, t: WeekTime) -> usize {
        self.windows
            .iter()
            .filter(|w| w.days[t.day % 7] && w.from <= t.minute && t.minute < w.to)
            .map(|w| w.min)
            .fold(self.min, usize::max)
    }

    /// The local time of the week at unix second `unix`, in the resolved [`WarmConfig::zone`].
    pub fn week_time(&self, unix: u64) -> WeekTime {
        let at = jiff::Timestamp::from_second(i64::try_from(unix).unwrap_or(i64::MAX))
            .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
            .to_zoned(self.zone.clone());
        WeekTime {
            day: usize::from(at.weekday().to_monday_zero_offset().unsigned_abs()),
            minute: u16::try_from(i32::from(at.hour()) * 60 + i32::from(at.minute())).unwrap_or(0),
        }
    }
}

const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// Parses `"mon-fri"`, `"sat,sun"`, `"mon-wed,fri"` (a range may wrap: `"fri-mon"`).
pub fn parse_days(text: &str) -> Result<[bool; 7], String> {
    let day = |s: &str| {
        let s = s.trim().to_ascii_lowercase();
        DAYS.iter()
            .position(|d| *d == s)
            .ok_or_else(|| format!("{s:?} is not a day (mon, tue, wed, thu, fri, sat, sun)"))
    };
    let mut days = [false; 7];
    if text.trim().is_empty() {
        return Err("no days (write e.g. \"mon-fri\")".into());
    }
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (day(a)?, day(b)?);
                let mut d = a;
                loop {
                    days[d] = true;
                    if d == b {
                        break;
                    }
                    d = (d + 1) % 7;
                }
            }
            None => days[day(part)?] = true,
        }
    }
    Ok(days)
}

/// Parses `"08:00-19:00"` into minutes of the day (`to` may be `24:00`; `to` after `from`).
pub fn parse_hours(text: &str) -> Result<(u16, u16), String> {
    let minute = |s: &str| -> Result<u16, String> {
        let (h, m) = s
            .trim()
            .split_once(':')
            .ok_or_else(|| format!("{s:?} is not HH:MM"))?;
        let (h, m): (u16, u16) = (
            h.parse().map_err(|_| format!("{s:?} is not HH:MM"))?,
            m.parse().map_err(|_| format!("{s:?} is not HH:MM"))?,
        );
        if m >= 60 || h > 24 || (h == 24 && m > 0) {
            return Err(format!("{s:?} is not a time of day"));
        }
        Ok(h * 60 + m)
    };
    let (a, b) = text
        .split_once('-')
        .ok_or_else(|| format!("{text:?} is not HH:MM-HH:MM"))?;
    let (from, to) = (minute(a)?, minute(b)?);
    if to <= from {
        return Err(format!(
            "{text:?} ends before it starts (a window past midnight is two windows)"
        ));
    }
    Ok((from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn days_and_hours_parse_and_refuse_what_is_not_a_time() {
        assert_eq!(
            parse_days("mon-fri").unwrap(),
            [true, true, true, true, true, false, false]
        );
        assert_eq!(
            parse_days("sat,sun").unwrap(),
            [false, false, false, false, false, true, true]
        );
        assert_eq!(
            parse_days("fri-mon").unwrap(),
            [true, false, false, false, true, true, true]
        );
        assert!(parse_days("weekdays").is_err());
        assert!(parse_days("").is_err());
        assert_eq!(parse_hours("08:00-19:30").unwrap(), (480, 1170));
        assert_eq!(parse_hours("00:00-24:00").unwrap(), (0, 1440));
        assert!(parse_hours("19:00-08:00").is_err());
        assert!(parse_hours("8-19").is_err());
        assert!(parse_hours("08:61-09:00").is_err());
    }

    #[test]
    fn the_target_is_the_largest_covering_window_and_never_below_min() {
        let c = WarmConfig {
            min: 1,
            windows: vec![
                WarmWindow {
                    days: parse_days("mon-fri").unwrap(),
                    from: 8 * 60,
                    to: 19 * 60,
                    min: 6,
                },
                WarmWindow {
                    days: parse_days("mon").unwrap(),
                    from: 9 * 60,
                    to: 10 * 60,
                    min: 8,
                },
            ],
            ..WarmConfig::default()
        };
        let at = |day, h: u16, m: u16| {
            c.target_at(WeekTime {
                day,
                minute: h * 60 + m,
            })
        };
        assert_eq!(at(0, 7, 59), 1);
        assert_eq!(at(0, 8, 0), 6);
        assert_eq!(at(0, 9, 30), 8);
        assert_eq!(at(4, 18, 59), 6);
        assert_eq!(at(4, 19, 0), 1);
        assert_eq!(at(5, 12, 0), 1, "saturday");
        assert!(c.any());
        assert!(!WarmConfig::default().any());
    }

    #[test]
    fn the_week_time_is_read_in_the_configured_zone() {
        // 2026-12-07 is a Monday; 07:30 UTC is 08:30 in Berlin (CET, UTC+1).
        let unix = 1_796_628_600;
        let utc = WarmConfig::default();
        assert_eq!(
            utc.week_time(unix),
            WeekTime {
                day: 0,
                minute: 450
            }
        );
        let berlin = WarmConfig {
            time_zone: Some("Europe/Berlin".into()),
            zone: jiff::tz::TimeZone::fixed(jiff::tz::offset(1)),
            ..WarmConfig::default()
        };
        assert_eq!(
            berlin.week_time(unix),
            WeekTime {
                day: 0,
                minute: 510
            }
        );
    }
}
