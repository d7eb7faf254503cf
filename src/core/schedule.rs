//! A CronJob's schedule as kube-controller-manager's CronJob controller (with robfig/cron's
//! standard parser) reads it: five fields or a descriptor (`@hourly`, expanded here), in the
//! CronJob's `spec.timeZone` or, without one, in UTC (the zone of kube-controller-manager in
//! practice: its image has no other). croner does the arithmetic, narrowed to the controller's
//! rules: `@every` (a period from the controller's start, not a calendar time) and `TZ=` (the API
//! server wants `timeZone`) are refused by name; when day of month or day of week starts with `*`
//! or `?` a day must match both, else either; `N/step` runs from `N` to the field's end. Pure, no
//! clock of its own.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use jiff::Timestamp;
use jiff::tz::TimeZone;

/// A parsed schedule: when a CronJob's runs are due.
#[derive(Debug, Clone, PartialEq)]
pub struct Schedule {
    cron: Arc<croner::Cron>,
    zone: TimeZone,
}

/// Parses schedules, sharing each parse (about 5 KiB: a byte per possible
/// year) among the schedules of the same five fields while any of them lives.
#[derive(Debug, Default)]
pub struct Schedules {
    parsed: HashMap<String, Weak<croner::Cron>>,
    /// The entries after the last sweep of dead ones.
    swept_to: usize,
}

impl Schedules {
    /// As [`Schedule::parse`], reusing a live parse of the same fields.
    pub fn parse(
        &mut self,
        schedule: &str,
        time_zone: Option<&str>,
    ) -> Result<Schedule, ScheduleError> {
        let zone = match time_zone {
            None => TimeZone::UTC,
            Some(name) => TimeZone::get(name).map_err(|_| ScheduleError::Zone(name.to_string()))?,
        };
        let fields = five_fields(schedule)?.join(" ");
        if let Some(cron) = self.parsed.get(&fields).and_then(Weak::upgrade) {
            return Ok(Schedule { cron, zone });
        }
        let cron = Arc::new(parse_fields(schedule, &fields)?);
        self.forget_the_dead();
        self.parsed.insert(fields, Arc::downgrade(&cron));
        Ok(Schedule { cron, zone })
    }

    /// Drops the entries no schedule uses once the map has doubled since
    /// the last sweep, so that sweeping costs O(1) a parse.
    fn forget_the_dead(&mut self) {
        if self.parsed.len() >= self.swept_to.saturating_mul(2).max(64) {
            self.parsed.retain(|_, cron| cron.strong_count() > 0);
            self.swept_to = self.parsed.len();
        }
    }
}

/// Why a schedule cannot be predicted; each says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedule {0:?}: @every runs from when the controller started, not at calendar times")]
    Every(String),
    #[error("schedule {0:?}: a time zone belongs in spec.timeZone, not in the schedule")]
    ZoneInSchedule(String),
    #[error(
        "schedule {0:?}: unknown descriptor (expected @yearly, @monthly, @weekly, @daily or @hourly)"
    )]
    Descriptor(String),
    #[error("schedule {0:?}: expected five fields (minute hour day-of-month month day-of-week)")]
    Fields(String),
    #[error("schedule {schedule:?}: {reason}")]
    Invalid { schedule: String, reason: String },
    #[error("time zone {0:?} is not in the IANA database")]
    Zone(String),
}

impl Schedule {
    /// `schedule` in `time_zone` (UTC when `None`), as the CronJob controller
    /// would run it, or why it cannot be predicted.
    pub fn parse(schedule: &str, time_zone: Option<&str>) -> Result<Schedule, ScheduleError> {
        Schedules::default().parse(schedule, time_zone)
    }

    /// The first run strictly after `t`; `None` when there is none (a date
    /// that never comes, as the 30th of February).
    pub fn next_after(&self, t: Timestamp) -> Option<Timestamp> {
        let at = t.to_zoned(self.zone.clone());
        let next = self.cron.find_next_occurrence(&at, false).ok()?;
        Some(next.timestamp())
    }
}

/// croner's parse of `fields` (the five of `schedule`, joined by spaces).
fn parse_fields(schedule: &str, fields: &str) -> Result<croner::Cron, ScheduleError> {
    let split: Vec<&str> = fields.split(' ').collect();
    croner::parser::CronParser::builder()
        .seconds(croner::parser::Seconds::Disallowed)
        .year(croner::parser::Year::Disallowed)
        .dom_and_dow(days_must_both_match(&split))
        .sloppy_ranges(true)
        .build()
        .parse(fields)
        .map_err(|err| ScheduleError::Invalid {
            schedule: schedule.to_string(),
            reason: err.to_string(),
        })
}

/// The schedule's five fields, descriptors expanded.
fn five_fields(schedule: &str) -> Result<Vec<&str>, ScheduleError> {
    let text = schedule.trim();
    if text.starts_with("TZ=") || text.starts_with("CRON_TZ=") {
        return Err(ScheduleError::ZoneInSchedule(schedule.to_string()));
    }
    if let Some(descriptor) = text.strip_prefix('@') {
        let fields = match descriptor.to_ascii_lowercase().as_str() {
            "yearly" | "annually" => "0 0 1 1 *",
            "monthly" => "0 0 1 * *",
            "weekly" => "0 0 * * 0",
            "daily" | "midnight" => "0 0 * * *",
            "hourly" => "0 * * * *",
            every if every.starts_with("every") => {
                return Err(ScheduleError::Every(schedule.to_string()));
            }
            _ => return Err(ScheduleError::Descriptor(schedule.to_string())),
        };
        return Ok(fields.split(' ').collect());
    }
    let fields: Vec<&str> = text.split_whitespace().collect();
    if fields.len() != 5 {
        return Err(ScheduleError::Fields(schedule.to_string()));
    }
    Ok(fields)
}

/// The controller's day rule: a field starting with `*` or `?` makes a day match both fields, else
/// either (croner alone would read `*/2` as a restriction).
fn days_must_both_match(fields: &[&str]) -> bool {
    let star = |field: Option<&&str>| field.is_some_and(|f| f.starts_with(['*', '?']));
    star(fields.get(2)) || star(fields.get(4))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    fn next(schedule: &str, zone: Option<&str>, after: &str) -> Timestamp {
        Schedule::parse(schedule, zone)
            .unwrap()
            .next_after(at(after))
            .unwrap()
    }

    #[test]
    fn five_fields_run_at_the_next_matching_minute_strictly_after() {
        let s = "*/5 * * * *";
        assert_eq!(
            next(s, None, "2026-11-27T10:02:30Z"),
            at("2026-11-27T10:05:00Z")
        );
        assert_eq!(
            next(s, None, "2026-11-27T10:05:00Z"),
            at("2026-11-27T10:10:00Z"),
            "strictly after"
        );
        assert_eq!(
            next("30 9 * * MON-FRI", None, "2026-11-27T10:00:00Z"),
            at("2026-11-30T09:30:00Z"),
            "Friday 10:00 -> Monday 09:30"
        );
    }

    #[test]
    fn descriptors_are_the_controllers_and_every_is_refused() {
        for (descriptor, expected) in [
            ("@hourly", "2026-11-27T11:00:00Z"),
            ("@daily", "2026-11-28T00:00:00Z"),
            ("@midnight", "2026-11-28T00:00:00Z"),
            ("@weekly", "2026-11-29T00:00:00Z"),
            ("@monthly", "2026-12-01T00:00:00Z"),
            ("@yearly", "2027-01-01T00:00:00Z"),
            ("@Annually", "2027-01-01T00:00:00Z"),
        ] {
            assert_eq!(
                next(descriptor, None, "2026-11-27T10:02:00Z"),
                at(expected),
                "{descriptor}"
            );
        }
        assert!(matches!(
            Schedule::parse("@every 5m", None),
            Err(ScheduleError::Every(_))
        ));
        assert!(matches!(
            Schedule::parse("@often", None),
            Err(ScheduleError::Descriptor(_))
        ));
    }

    #[test]
    fn the_time_zone_is_the_cronjobs() {
        // 09:00 in Berlin is 08:00 UTC in winter.
        assert_eq!(
            next("0 9 * * *", Some("Europe/Berlin"), "2026-11-27T10:00:00Z"),
            at("2026-11-28T08:00:00Z")
        );
        assert_eq!(
            Schedule::parse("0 9 * * *", Some("Mars/Olympus")).unwrap_err(),
            ScheduleError::Zone("Mars/Olympus".into())
        );
        assert!(matches!(
            Schedule::parse("TZ=Europe/Berlin 0 9 * * *", None),
            Err(ScheduleError::ZoneInSchedule(_))
        ));
    }

    /// robfig/cron's rule: `*/2` in the day of month still makes it a
    /// "star" field, so both must match; two restricted fields match either.
    #[test]
    fn day_of_month_and_week_follow_the_controllers_rule() {
        // Both restricted: the 1st or any Monday.
        assert_eq!(
            next("0 0 1 * 1", None, "2026-11-27T00:00:00Z"),
            at("2026-11-30T00:00:00Z"),
            "Monday the 30th comes before the 1st"
        );
        // A star day of month: odd days that are Mondays.
        assert_eq!(
            next("0 0 */2 * 1", None, "2026-11-27T00:00:00Z"),
            at("2026-12-07T00:00:00Z"),
            "Monday the 30th is an even day; Monday the 7th is odd"
        );
    }

    #[test]
    fn a_start_with_a_step_runs_to_the_end_of_the_field() {
        assert_eq!(
            next("50/5 * * * *", None, "2026-11-27T10:51:00Z"),
            at("2026-11-27T10:55:00Z")
        );
        assert_eq!(
            next("50/5 * * * *", None, "2026-11-27T10:56:00Z"),
            at("2026-11-27T11:50:00Z")
        );
    }

    #[test]
    fn schedules_of_the_same_fields_share_one_parse_while_one_lives() {
        let mut schedules = Schedules::default();
        let hourly = schedules.parse("@hourly", None).unwrap();
        let berlin = schedules
            .parse("0  * * * *", Some("Europe/Berlin"))
            .unwrap();
        assert!(Arc::ptr_eq(&hourly.cron, &berlin.cron));
        assert_ne!(hourly.zone, berlin.zone);
        let daily = schedules.parse("0 0 * * *", None).unwrap();
        assert!(!Arc::ptr_eq(&hourly.cron, &daily.cron));
        drop((hourly, berlin));
        for minute in 0..200 {
            let _ = schedules.parse(&format!("{} {} * * *", minute % 60, minute / 60), None);
        }
        assert!(
            schedules.parsed.len() < 100,
            "dead parses are swept: {}",
            schedules.parsed.len()
        );
        assert!(
            schedules.parsed.contains_key("0 0 * * *"),
            "a live one stays"
        );
    }

    #[test]
    fn malformed_schedules_say_what_is_wrong() {
        for bad in ["", "* * * *", "* * * * * *", "61 * * * *", "a b c d e"] {
            let err = Schedule::parse(bad, None).unwrap_err();
            assert!(err.to_string().starts_with("schedule "), "{bad:?}: {err}");
        }
        assert_eq!(
            Schedule::parse("0 0 30 2 *", None)
                .unwrap()
                .next_after(at("2026-11-27T00:00:00Z")),
            None
        );
    }
}
