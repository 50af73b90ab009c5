//! `forget`: decide which snapshots a retention policy keeps, and remove the others'
//! snapshot files. Data they alone used is freed later by `prune`.
//!
//! The rules are restic's, so policies carry over: snapshots are grouped (by host and
//! paths by default), sorted newest first, and each `keep-*` rule keeps the newest
//! snapshot of each of its last N periods (hours, days, ISO weeks, months, years) in the
//! local time zone. A snapshot kept by any rule is kept.

use std::collections::BTreeMap;

use jiff::tz::TimeZone;
use jiff::{Span, Timestamp, Zoned};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::id::SnapshotId;
use crate::repo::Repository;
use crate::snapshot::{Snapshot, SnapshotFilter};

#[derive(Debug, Clone, Default)]
pub struct KeepPolicy {
    pub last: Option<u32>,
    pub hourly: Option<u32>,
    pub daily: Option<u32>,
    pub weekly: Option<u32>,
    pub monthly: Option<u32>,
    pub yearly: Option<u32>,
    /// Keep snapshots taken within this span before the group's newest one.
    pub within: Option<Span>,
    /// Keep the newest snapshot of each hour, day, week, month or year that lies within
    /// this span before the group's newest one (restic's `--keep-within-hourly` ...).
    pub within_hourly: Option<Span>,
    pub within_daily: Option<Span>,
    pub within_weekly: Option<Span>,
    pub within_monthly: Option<Span>,
    pub within_yearly: Option<Span>,
    /// Keep snapshots that carry any of these tags.
    pub tags: Vec<String>,
}

impl KeepPolicy {
    pub fn is_empty(&self) -> bool {
        self.last.is_none()
            && self.hourly.is_none()
            && self.daily.is_none()
            && self.weekly.is_none()
            && self.monthly.is_none()
            && self.yearly.is_none()
            && self.within.is_none()
            && self.within_hourly.is_none()
            && self.within_daily.is_none()
            && self.within_weekly.is_none()
            && self.within_monthly.is_none()
            && self.within_yearly.is_none()
            && self.tags.is_empty()
    }
}

/// Which snapshot fields make up a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupBy {
    pub host: bool,
    pub paths: bool,
    pub tags: bool,
}

impl Default for GroupBy {
    fn default() -> Self {
        GroupBy {
            host: true,
            paths: true,
            tags: false,
        }
    }
}

impl std::str::FromStr for GroupBy {
    type Err = String;

    /// A comma-separated list of `host`, `paths`, `tags`, or empty for one group.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut g = GroupBy {
            host: false,
            paths: false,
            tags: false,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "host" => g.host = true,
                "paths" => g.paths = true,
                "tags" => g.tags = true,
                other => {
                    return Err(format!(
                        "Unknown group {other:?}: use host, paths and/or tags"
                    ))
                }
            }
        }
        Ok(g)
    }
}

/// The fields a group shares: those of [`GroupBy`], the others `None`.
pub type GroupKey = (Option<String>, Option<Vec<String>>, Option<Vec<String>>);

impl GroupBy {
    /// `snapshots` grouped by these fields, groups in key order, each in the given order.
    pub fn group(
        self,
        snapshots: &[(SnapshotId, Snapshot)],
    ) -> Vec<(GroupKey, Vec<&(SnapshotId, Snapshot)>)> {
        let mut groups: BTreeMap<GroupKey, Vec<&(SnapshotId, Snapshot)>> = BTreeMap::new();
        for item in snapshots {
            let s = &item.1;
            let sorted = |v: &Vec<String>| {
                let mut v = v.clone();
                v.sort();
                v
            };
            let key = (
                self.host.then(|| s.host.clone()),
                self.paths.then(|| sorted(&s.paths)),
                self.tags.then(|| sorted(&s.tags)),
            );
            groups.entry(key).or_default().push(item);
        }
        groups.into_iter().collect()
    }
}

/// Parses restic's duration form for `--keep-within`: `1y2m3d4h` (years, months, days, hours).
pub fn parse_within(s: &str) -> Result<Span, String> {
    let bad = || format!("{s:?} is not a duration like 1y2m3d4h (years, months, days, hours)");
    let mut span = Span::new();
    let mut number = String::new();
    for c in s.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: i64 = number.parse().map_err(|_| bad())?;
        number.clear();
        span = match c {
            'y' => span.try_years(n),
            'm' => span.try_months(n),
            'd' => span.try_days(n),
            'h' => span.try_hours(n),
            _ => return Err(bad()),
        }
        .map_err(|_| bad())?;
    }
    if !number.is_empty() || s.is_empty() {
        return Err(bad());
    }
    Ok(span)
}

#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    pub id: SnapshotId,
    pub time: Timestamp,
    pub keep: bool,
    /// Why it is kept (the rules that keep it); empty when it goes.
    pub reasons: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Group {
    pub host: Option<String>,
    pub paths: Option<Vec<String>>,
    pub tags: Option<Vec<String>>,
    /// Newest first.
    pub snapshots: Vec<Decision>,
}

/// Applies `policy` to `snapshots`; pure, no I/O.
pub fn plan(
    snapshots: &[(SnapshotId, Snapshot)],
    policy: &KeepPolicy,
    group_by: GroupBy,
    tz: &TimeZone,
) -> Vec<Group> {
    group_by
        .group(snapshots)
        .into_iter()
        .map(|((host, paths, tags), mut items)| {
            items.sort_by(|a, b| b.1.time.cmp(&a.1.time).then(b.0.cmp(&a.0)));
            Group {
                host,
                paths,
                tags,
                snapshots: decide(&items, policy, tz),
            }
        })
        .collect()
}

/// The period a time falls in, as comparable numbers.
type BucketOf = fn(&Zoned) -> (i32, i32, i32, i32);

fn decide(items: &[&(SnapshotId, Snapshot)], policy: &KeepPolicy, tz: &TimeZone) -> Vec<Decision> {
    let zoned: Vec<Zoned> = items
        .iter()
        .map(|(_, s)| s.time.to_zoned(tz.clone()))
        .collect();
    let hour: BucketOf = |z| {
        (
            z.year() as i32,
            z.month() as i32,
            z.day() as i32,
            z.hour() as i32,
        )
    };
    let day: BucketOf = |z| (z.year() as i32, z.month() as i32, z.day() as i32, 0);
    let week: BucketOf = |z| {
        let w = z.date().iso_week_date();
        (w.year() as i32, w.week() as i32, 0, 0)
    };
    let month: BucketOf = |z| (z.year() as i32, z.month() as i32, 0, 0);
    let year: BucketOf = |z| (z.year() as i32, 0, 0, 0);
    let buckets: [(&str, Option<u32>, BucketOf); 5] = [
        ("hourly", policy.hourly, hour),
        ("daily", policy.daily, day),
        ("weekly", policy.weekly, week),
        ("monthly", policy.monthly, month),
        ("yearly", policy.yearly, year),
    ];
    let within_buckets: [(&str, Option<Span>, BucketOf); 5] = [
        ("within-hourly", policy.within_hourly, hour),
        ("within-daily", policy.within_daily, day),
        ("within-weekly", policy.within_weekly, week),
        ("within-monthly", policy.within_monthly, month),
        ("within-yearly", policy.within_yearly, year),
    ];
    let mut reasons: Vec<Vec<String>> = vec![Vec::new(); items.len()];
    if let Some(n) = policy.last {
        for r in reasons.iter_mut().take(n as usize) {
            r.push("last".into());
        }
    }
    for (name, count, bucket_of) in buckets {
        let Some(n) = count else { continue };
        let mut last_bucket = None;
        let mut kept = 0;
        for (i, z) in zoned.iter().enumerate() {
            if kept >= n {
                break;
            }
            let b = bucket_of(z);
            if last_bucket != Some(b) {
                last_bucket = Some(b);
                kept += 1;
                reasons[i].push(name.into());
            }
        }
    }
    // As restic: the newest snapshot of each period, for the periods from the group's
    // newest snapshot back by the span.
    for (name, span, bucket_of) in within_buckets {
        let Some(cutoff) = span.and_then(|span| zoned.first()?.checked_sub(span).ok()) else {
            continue;
        };
        let mut last_bucket = None;
        for (i, z) in zoned.iter().enumerate() {
            if *z < cutoff {
                break;
            }
            let b = bucket_of(z);
            if last_bucket != Some(b) {
                last_bucket = Some(b);
                reasons[i].push(name.into());
            }
        }
    }
    if let (Some(span), Some(newest)) = (policy.within, zoned.first()) {
        if let Ok(cutoff) = newest.checked_sub(span) {
            for (i, z) in zoned.iter().enumerate() {
                if *z >= cutoff {
                    reasons[i].push("within".into());
                }
            }
        }
    }
    for (i, (_, s)) in items.iter().enumerate() {
        if s.tags.iter().any(|t| policy.tags.contains(t)) {
            reasons[i].push("tag".into());
        }
    }
    items
        .iter()
        .zip(reasons)
        .map(|((id, s), reasons)| Decision {
            id: *id,
            time: s.time,
            keep: !reasons.is_empty(),
            reasons,
        })
        .collect()
}

#[derive(Debug, Clone, Serialize)]
pub struct ForgetReport {
    pub groups: Vec<Group>,
    pub removed: Vec<SnapshotId>,
    pub dry_run: bool,
}

/// Removes the snapshots among those `filter` selects that `policy` does not keep (none when `dry_run`).
pub fn forget(
    repo: &Repository,
    policy: &KeepPolicy,
    group_by: GroupBy,
    filter: &SnapshotFilter,
    dry_run: bool,
) -> Result<ForgetReport> {
    if policy.is_empty() {
        return Err(Error::InvalidInput(
            "No policy given, so nothing would be kept: pass --keep-last, --keep-daily, ... or snapshot ids".into(),
        ));
    }
    let list = crate::ops::select::snapshots(repo, filter)?;
    let groups = plan(&list.snapshots, policy, group_by, &TimeZone::system());
    let doomed: Vec<SnapshotId> = groups
        .iter()
        .flat_map(|g| g.snapshots.iter().filter(|d| !d.keep).map(|d| d.id))
        .collect();
    if !dry_run {
        remove(repo, &doomed)?;
    }
    Ok(ForgetReport {
        groups,
        removed: doomed,
        dry_run,
    })
}

/// Removes these snapshots' files.
pub fn remove(repo: &Repository, ids: &[SnapshotId]) -> Result<()> {
    for id in ids {
        match repo.storage().delete(&id.storage_name()) {
            Ok(()) | Err(cairn_storage::StorageError::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        repo.access().removed_snapshots(&[*id]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::id::BlobId;
    use crate::snapshot::SnapshotSummary;

    fn snap(i: u8, time: &str, host: &str, tags: &[&str]) -> (SnapshotId, Snapshot) {
        (
            SnapshotId([i; 32]),
            Snapshot {
                time: time.parse().unwrap(),
                host: host.into(),
                username: String::new(),
                paths: vec!["/data".into()],
                tags: tags.iter().map(|t| t.to_string()).collect(),
                tree: BlobId([0; 32]),
                parent: None,
                original: None,
                program_version: String::new(),
                summary: SnapshotSummary::default(),
            },
        )
    }

    fn kept(groups: &[Group]) -> Vec<u8> {
        let mut v: Vec<u8> = groups
            .iter()
            .flat_map(|g| g.snapshots.iter().filter(|d| d.keep).map(|d| d.id.0[0]))
            .collect();
        v.sort();
        v
    }

    fn days() -> Vec<(SnapshotId, Snapshot)> {
        vec![
            snap(1, "2026-01-01T10:00:00Z", "a", &[]),
            snap(2, "2026-01-01T20:00:00Z", "a", &[]),
            snap(3, "2026-01-02T10:00:00Z", "a", &[]),
            snap(4, "2026-01-09T10:00:00Z", "a", &["keep"]),
            snap(5, "2026-02-01T10:00:00Z", "a", &[]),
            snap(6, "2026-02-01T11:00:00Z", "b", &[]),
        ]
    }

    #[test]
    fn keep_last_keeps_the_newest_of_each_group() {
        let p = KeepPolicy {
            last: Some(1),
            ..Default::default()
        };
        assert_eq!(
            kept(&plan(&days(), &p, GroupBy::default(), &TimeZone::UTC)),
            vec![5, 6]
        );
    }

    #[test]
    fn keep_daily_keeps_the_newest_snapshot_of_each_day() {
        let p = KeepPolicy {
            daily: Some(3),
            ..Default::default()
        };
        // Host a: days Feb 1, Jan 9, Jan 2 (the newest three); host b: Feb 1.
        assert_eq!(
            kept(&plan(&days(), &p, GroupBy::default(), &TimeZone::UTC)),
            vec![3, 4, 5, 6]
        );
    }

    #[test]
    fn keep_monthly_weekly_and_tags_combine() {
        let p = KeepPolicy {
            monthly: Some(5),
            tags: vec!["keep".into()],
            ..Default::default()
        };
        // Months: Feb (5), Jan (newest in Jan is 4); 4 is also tagged.
        assert_eq!(
            kept(&plan(&days(), &p, GroupBy::default(), &TimeZone::UTC)),
            vec![4, 5, 6]
        );
        let p = KeepPolicy {
            weekly: Some(2),
            ..Default::default()
        };
        assert_eq!(
            kept(&plan(&days(), &p, GroupBy::default(), &TimeZone::UTC)),
            vec![4, 5, 6]
        );
    }

    #[test]
    fn keep_within_counts_back_from_the_newest_snapshot() {
        let p = KeepPolicy {
            within: Some(parse_within("1m").unwrap()),
            ..Default::default()
        };
        // Newest of host a is Feb 1 10:00; a month back is Jan 1 10:00, inclusive.
        assert_eq!(
            kept(&plan(&days(), &p, GroupBy::default(), &TimeZone::UTC)),
            vec![1, 2, 3, 4, 5, 6]
        );
        let p = KeepPolicy {
            within: Some(parse_within("2d").unwrap()),
            ..Default::default()
        };
        assert_eq!(
            kept(&plan(&days(), &p, GroupBy::default(), &TimeZone::UTC)),
            vec![5, 6]
        );
    }

    #[test]
    fn keep_within_periods_keep_the_newest_of_each_period_inside_the_span() {
        let plan_with =
            |p: KeepPolicy| kept(&plan(&days(), &p, GroupBy::default(), &TimeZone::UTC));
        // Host a's newest is Feb 1 10:00: a month back is Jan 1 10:00, so Jan 1 is in
        // the span, and its newest snapshot (2, at 20:00) is kept, not 1.
        let p = KeepPolicy {
            within_daily: Some(parse_within("1m").unwrap()),
            ..Default::default()
        };
        assert_eq!(plan_with(p), vec![2, 3, 4, 5, 6]);
        let p = KeepPolicy {
            within_weekly: Some(parse_within("7d").unwrap()),
            ..Default::default()
        };
        assert_eq!(plan_with(p), vec![5, 6]);
        let p = KeepPolicy {
            within_monthly: Some(parse_within("1y").unwrap()),
            ..Default::default()
        };
        assert_eq!(plan_with(p), vec![4, 5, 6]);
        let p = KeepPolicy {
            within_hourly: Some(parse_within("1h").unwrap()),
            within_yearly: Some(parse_within("2y").unwrap()),
            ..Default::default()
        };
        // Only the newest of a (its hour and its year) and of b.
        assert_eq!(plan_with(p), vec![5, 6]);
    }

    #[test]
    fn grouping_by_nothing_puts_all_hosts_together() {
        let p = KeepPolicy {
            last: Some(1),
            ..Default::default()
        };
        let g: GroupBy = "".parse().unwrap();
        assert_eq!(kept(&plan(&days(), &p, g, &TimeZone::UTC)), vec![6]);
    }

    #[test]
    fn durations_parse_like_restic() {
        assert!(parse_within("1y2m3d4h").is_ok());
        assert!(parse_within("3w").is_err());
        assert!(parse_within("12").is_err());
        assert!(parse_within("").is_err());
        assert!("host,nope".parse::<GroupBy>().is_err());
    }
}
