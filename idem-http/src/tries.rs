//! How many times, and how far apart, a keyed outgoing request is tried: the one
//! schedule of [`KeyedClient`](crate::KeyedClient) and
//! [`GrpcRetryLayer`](crate::GrpcRetryLayer).

use std::time::Duration;

use backon::ExponentialBuilder;

/// At most `attempts` tries, pausing `first_pause` and doubling up to `longest_pause`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tries {
    attempts: usize,
    first_pause: Duration,
    longest_pause: Duration,
}

impl Default for Tries {
    /// 4 tries, pausing 100 ms and doubling up to 2 s between them.
    fn default() -> Self {
        Self {
            attempts: 4,
            first_pause: Duration::from_millis(100),
            longest_pause: Duration::from_secs(2),
        }
    }
}

impl Tries {
    /// At most `attempts` tries (at least 1).
    pub(crate) fn attempts(self, attempts: usize) -> Self {
        Self {
            attempts: attempts.max(1),
            ..self
        }
    }

    /// The first pause between tries and the longest.
    pub(crate) fn pauses(self, first: Duration, longest: Duration) -> Self {
        Self {
            first_pause: first,
            longest_pause: longest.max(first),
            ..self
        }
    }

    /// The pauses between the tries, or none when `repeatable` is false (a request that
    /// cannot be sent twice is tried once).
    pub(crate) fn backoff(&self, repeatable: bool) -> ExponentialBuilder {
        let retries = if repeatable { self.attempts - 1 } else { 0 };
        ExponentialBuilder::default()
            .with_min_delay(self.first_pause)
            .with_max_delay(self.longest_pause)
            .with_max_times(retries)
    }
}

/// The builder methods `attempts` and `pauses` of a client with a field `tries`.
macro_rules! schedule_setters {
    () => {
        /// How many tries at most (at least 1).
        pub fn attempts(mut self, attempts: usize) -> Self {
            self.tries = self.tries.attempts(attempts);
            self
        }

        /// The first pause between tries and the longest.
        pub fn pauses(mut self, first: std::time::Duration, longest: std::time::Duration) -> Self {
            self.tries = self.tries.pauses(first, longest);
            self
        }
    };
}
pub(crate) use schedule_setters;
