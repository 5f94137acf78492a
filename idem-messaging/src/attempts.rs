//! How often a message's body has failed: past a bound, a poison message meets the
//! failure policy instead of coming back for ever.

use std::collections::HashMap;
use std::sync::Mutex;

use idem_runtime::observe::shown_key;
use tracing::warn;

use crate::disposition::Disposition;

/// The default bound on a message's failed runs.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 10;

/// The most keys counted at once; past it the count starts afresh (a bound on memory:
/// a message then gets a few more attempts, never fewer).
const COUNTED_KEYS: usize = 100_000;

/// The failed runs of the messages a consumer has seen, by key.
#[derive(Debug)]
pub struct Attempts {
    max: u32,
    failed: Mutex<HashMap<String, u32>>,
}

impl Attempts {
    /// A count that makes a message final after `max` failed runs (at least 1).
    pub fn new(max: u32) -> Self {
        Attempts {
            max: max.max(1),
            failed: Mutex::default(),
        }
    }

    /// The bound.
    pub fn max(&self) -> u32 {
        self.max
    }

    /// `disposition` of the message `key`, once this run is counted: a body that failed
    /// (`body_failed`) for the `max`th time makes it final. `delivered_before` is the
    /// broker's count of the message's earlier deliveries to any consumer (a quorum
    /// queue's `x-delivery-count`, JetStream's delivery count less one; 0 where the
    /// broker keeps none): this run is at least the next one, so a fleet of consumers,
    /// or one restarted, stops at the bound too.
    pub fn count(&self, key: &str, disposition: Disposition, body_failed: bool, delivered_before: u32) -> Disposition {
        let mut failed = self.failed.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if disposition != Disposition::Redeliver {
            failed.remove(key);
            return disposition;
        }
        if !body_failed {
            return disposition;
        }
        if failed.len() >= COUNTED_KEYS && !failed.contains_key(key) {
            failed.clear();
        }
        let runs = failed.entry(key.to_owned()).or_default();
        *runs += 1;
        if (*runs).max(delivered_before.saturating_add(1)) < self.max {
            return disposition;
        }
        failed.remove(key);
        warn!(key = %shown_key(key), attempts = self.max, "the message's body failed every attempt; failed for good");
        Disposition::Final
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_that_keeps_failing_is_final_at_the_bound_counted_here_or_by_the_broker() {
        let attempts = Attempts::new(3);
        let run = |delivered_before| attempts.count("k", Disposition::Redeliver, true, delivered_before);
        assert_eq!(run(0), Disposition::Redeliver);
        assert_eq!(run(0), Disposition::Redeliver);
        assert_eq!(run(0), Disposition::Final, "the third failure here");
        // Another consumer's runs, as the broker counted them.
        assert_eq!(run(2), Disposition::Final, "the message's third delivery");
        // Redeliveries that are not the body's failure (running elsewhere, the store
        // down) do not count, and a recorded outcome forgets the count.
        assert_eq!(
            attempts.count("j", Disposition::Redeliver, false, 0),
            Disposition::Redeliver
        );
        assert_eq!(
            attempts.count("j", Disposition::Redeliver, true, 0),
            Disposition::Redeliver
        );
        assert_eq!(attempts.count("j", Disposition::Ack, false, 0), Disposition::Ack);
        assert_eq!(
            attempts.count("j", Disposition::Redeliver, true, 0),
            Disposition::Redeliver
        );
    }
}
