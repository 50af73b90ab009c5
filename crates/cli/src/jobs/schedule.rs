//! When a job runs: `hourly`, `daily`, `daily 02:30`, `weekly`, `monthly`, `every 6h`,
//! `every 30s`, or a cron expression (5 fields, or 6 with seconds first), and how often
//! prune and check are due (`daily`, `weekly`, `monthly`, `always`, or a time like `7d`).
//!
//! Calendar schedules are cron expressions underneath (croner), in the local time zone.
//! `every` counts from the start of the previous run, so runs do not drift by their
//! own duration but do not pile up either.

use std::time::Duration;

use chrono::{Local, TimeZone};
use serde::Deserialize;

/// A job's `schedule`.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "String")]
pub struct Schedule {
    pub text: String,
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Every(Duration),
    Cron(Box<croner::Cron>),
}

impl TryFrom<String> for Schedule {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let t = text.trim();
        let bad = |why: &str| {
            format!(
                "{text:?} is not a schedule{why}: use hourly, daily, daily HH:MM, weekly, \
                 monthly, every 6h (s, m, h, d), or a cron expression like \"30 2 * * *\""
            )
        };
        let cron = match t {
            "hourly" => "0 * * * *".to_string(),
            "daily" => "0 0 * * *".to_string(),
            "weekly" => "0 0 * * 1".to_string(),
            "monthly" => "0 0 1 * *".to_string(),
            _ => {
                if let Some(every) = t.strip_prefix("every ") {
                    let d =
                        crate::args::parse_duration(every).map_err(|e| bad(&format!(" ({e})")))?;
                    if d.is_zero() {
                        return Err(bad(" (an interval of zero)"));
                    }
                    return Ok(Schedule {
                        text,
                        kind: Kind::Every(d),
                    });
                }
                if let Some(at) = t.strip_prefix("daily ") {
                    let (h, m) = at
                        .trim()
                        .split_once(':')
                        .and_then(|(h, m)| Some((h.parse::<u8>().ok()?, m.parse::<u8>().ok()?)))
                        .filter(|(h, m)| *h < 24 && *m < 60)
                        .ok_or_else(|| bad(" (the time is not HH:MM)"))?;
                    format!("{m} {h} * * *")
                } else if t.split_whitespace().count() >= 5 {
                    t.to_string()
                } else {
                    return Err(bad(""));
                }
            }
        };
        let parsed = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Optional)
            .build()
            .parse(&cron)
            .map_err(|e| bad(&format!(" ({e})")))?;
        Ok(Schedule {
            text,
            kind: Kind::Cron(Box::new(parsed)),
        })
    }
}

impl Schedule {
    /// The first run time (unix milliseconds) after a run that started at `after_ms`.
    pub fn next_after(&self, after_ms: i64) -> Option<i64> {
        match &self.kind {
            Kind::Every(d) => Some(after_ms.saturating_add(d.as_millis() as i64)),
            Kind::Cron(cron) => {
                let start = Local.timestamp_millis_opt(after_ms).single()?;
                let next = cron.find_next_occurrence(&start, false).ok()?;
                Some(next.timestamp_millis())
            }
        }
    }

    /// The first run time after `now_ms` for a job that never ran: an `every` schedule
    /// waits one interval, a calendar one its next slot.
    pub fn first(&self, now_ms: i64) -> Option<i64> {
        self.next_after(now_ms)
    }
}

/// How often something is due: `jitter`, `prune`, `check.every`.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(try_from = "String")]
pub struct Every(pub Duration);

impl TryFrom<String> for Every {
    type Error = String;

    fn try_from(text: String) -> Result<Self, String> {
        let day = 86_400;
        Ok(Every(Duration::from_secs(match text.trim() {
            "always" => 0,
            "hourly" => 3600,
            "daily" => day,
            "weekly" => 7 * day,
            "monthly" => 30 * day,
            other => {
                return crate::args::parse_duration(other).map(Every).map_err(|_| {
                    format!(
                        "{text:?} is not an interval: use always, hourly, daily, weekly, \
                         monthly, or a time like 30s, 10m, 12h, 7d"
                    )
                })
            }
        })))
    }
}

impl Every {
    /// Whether something last done at `last_ms` (None: never) is due at `now_ms`.
    pub fn due(&self, last_ms: Option<i64>, now_ms: i64) -> bool {
        last_ms.is_none_or(|last| now_ms.saturating_sub(last) >= self.0.as_millis() as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schedule(s: &str) -> Result<Schedule, String> {
        Schedule::try_from(s.to_string())
    }

    #[test]
    fn every_counts_from_the_last_start() {
        let s = schedule("every 30s").unwrap();
        assert_eq!(s.next_after(1_000), Some(31_000));
        assert_eq!(
            schedule("every 6h").unwrap().next_after(0),
            Some(6 * 3_600_000)
        );
    }

    #[test]
    fn calendar_schedules_fall_on_their_slot() {
        let s = schedule("daily 02:30").unwrap();
        let now = Local::now().timestamp_millis();
        let next = s.next_after(now).unwrap();
        assert!(next > now && next <= now + 86_400_000 + 3_600_000);
        let t = Local.timestamp_millis_opt(next).unwrap();
        assert_eq!(t.format("%H:%M:%S").to_string(), "02:30:00");
        let hourly = schedule("hourly").unwrap().next_after(now).unwrap();
        assert!(hourly - now <= 3_600_000);
        assert!(schedule("*/5 * * * *").is_ok());
        assert!(schedule("*/10 * * * * *").is_ok());
    }

    #[test]
    fn bad_schedules_say_what_is_accepted() {
        for bad in [
            "dayly",
            "every",
            "every 0s",
            "every 5x",
            "daily 25:00",
            "61 * * * *",
        ] {
            let e = schedule(bad).expect_err(bad);
            assert!(e.contains("hourly, daily"), "{e}");
        }
    }

    #[test]
    fn intervals_are_due_after_their_length() {
        let weekly = Every::try_from("weekly".to_string()).unwrap();
        assert!(weekly.due(None, 0));
        assert!(!weekly.due(Some(0), 86_400_000));
        assert!(weekly.due(Some(0), 7 * 86_400_000));
        assert!(Every::try_from("always".to_string())
            .unwrap()
            .due(Some(5), 5));
        assert!(Every::try_from("fortnightly".to_string()).is_err());
    }
}
