//! The one clock all stores are given instants from.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Now, truncated to whole microseconds: the finest precision every database column
/// keeps, so an instant written and read back compares equal.
pub fn now() -> SystemTime {
    let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    UNIX_EPOCH + Duration::from_micros(u64::try_from(since_epoch.as_micros()).unwrap_or(u64::MAX))
}
