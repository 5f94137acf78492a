//! The one rule for durations, shared by the attribute (at compile time) and the
//! builder (at run time): positive, and no longer than every store can hold.

use std::time::Duration;

/// The longest `ttl`, `lease` or `wait`: 100 years (of 365.25 days). Every store holds
/// an instant this far ahead in the column types it uses, and it keeps clear of the
/// ranges where databases and date libraries change format or overflow (SQLite's text
/// instants past year 9999 would sort before today's).
pub const MAX_DURATION: Duration = Duration::from_secs(MAX_DURATION_MS / 1000);

/// [`MAX_DURATION`] in milliseconds, as the attribute checks it.
pub const MAX_DURATION_MS: u64 = 100 * 36_525 * 864_000;

/// What is wrong with `duration` as a value of `option`, if anything.
pub(crate) fn duration_problem(option: &str, duration: Duration) -> Option<String> {
    if duration.is_zero() {
        Some(format!("`{option}` must be positive, not zero"))
    } else if duration > MAX_DURATION {
        Some(format!(
            "`{option}` of {duration:?} is longer than 100 years, the longest duration every store can hold"
        ))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positive_and_at_most_a_century() {
        assert_eq!(MAX_DURATION.as_secs(), 3_155_760_000);
        assert!(duration_problem("ttl", Duration::from_millis(1)).is_none());
        assert!(duration_problem("ttl", MAX_DURATION).is_none());
        let zero = duration_problem("lease", Duration::ZERO).unwrap();
        assert!(zero.contains("`lease` must be positive"), "{zero}");
        let long = duration_problem("ttl", MAX_DURATION + Duration::from_millis(1)).unwrap();
        assert!(long.contains("longer than 100 years"), "{long}");
        assert!(duration_problem("wait", Duration::MAX).is_some());
    }
}
