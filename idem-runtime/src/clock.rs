//! The one clock all stores are given instants from.
//!
//! It is the system's clock, moved by tokio's test clock: in a test that pauses time
//! (`#[tokio::test(start_paused = true)]` or `tokio::time::pause()`, tokio's feature
//! `test-util`) and advances it, idem's instants advance with it. A test of "expired
//! after 24 hours" then takes no 24 hours:
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use idem_runtime::{Idempotent, MemoryStore};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), idem_runtime::Error> {
//! tokio::time::pause();
//! let op = Idempotent::new("pay").store(Arc::new(MemoryStore::new())).ttl(Duration::from_secs(24 * 3600));
//! let first: u32 = op.execute("order-7", async { Ok::<_, idem_runtime::Error>(1) }).await?;
//! tokio::time::advance(Duration::from_secs(23 * 3600)).await;
//! let replayed: u32 = op.execute("order-7", async { Ok::<_, idem_runtime::Error>(2) }).await?;
//! tokio::time::advance(Duration::from_secs(2 * 3600)).await; // past the 24 h ttl
//! let again: u32 = op.execute("order-7", async { Ok::<_, idem_runtime::Error>(3) }).await?;
//! assert_eq!((first, replayed, again), (1, 1, 3));
//! # Ok(()) }
//! ```
//!
//! A database server judges leases and expiry by its own clock ([`LeaseClock::Store`]):
//! a test that moves time against one builds its store with [`LeaseClock::Caller`].
//!
//! Outside such a test tokio's clock is the system's monotonic clock, read a moment
//! apart from the system clock: the two agree within [`TEST_CLOCK_THRESHOLD`], and the
//! system clock is used as it is.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How far tokio's clock must be from the system's before it is taken for a test clock
/// that was paused or advanced.
const TEST_CLOCK_THRESHOLD: Duration = Duration::from_millis(1);

/// Now, truncated to whole microseconds: the finest precision every database column
/// keeps, so an instant written and read back compares equal. Moved by tokio's test
/// clock (see the module docs).
pub fn now() -> SystemTime {
    Reading::take().at
}

/// An instant of [`now`], with the moment on tokio's clock it was read at: a call's
/// later instants (its outcome's) are counted from it on that clock, one read of the
/// monotonic clock where [`now`] takes three. A paused test clock moves them as it
/// moves [`now`]; a step of the system clock after the reading does not.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Reading {
    at: SystemTime,
    read: tokio::time::Instant,
}

impl Reading {
    /// [`now`], and when it was read.
    pub(crate) fn take() -> Self {
        let read = tokio::time::Instant::now();
        let system = SystemTime::now();
        let monotonic = std::time::Instant::now();
        Reading {
            at: whole_micros(moved_by_tokio(system, read, monotonic)),
            read,
        }
    }

    /// The instant read.
    pub(crate) fn at(&self) -> SystemTime {
        self.at
    }

    /// When it was read, on tokio's clock: where a store's steady clock, a call's
    /// admission and its waits count from instead of reading the clock again.
    pub(crate) fn read(&self) -> tokio::time::Instant {
        self.read
    }

    /// Now: the instant read, moved on by the time since, in whole microseconds.
    pub(crate) fn later(&self) -> SystemTime {
        whole_micros(self.at + self.read.elapsed())
    }
}

/// `instant`, truncated to whole microseconds (the epoch for an instant before it).
fn whole_micros(instant: SystemTime) -> SystemTime {
    match instant.duration_since(UNIX_EPOCH) {
        // The nanoseconds past the last whole microsecond taken off: no division of the
        // whole count, no second sum.
        Ok(since_epoch) => instant - Duration::from_nanos(u64::from(since_epoch.subsec_nanos() % 1_000)),
        Err(_) => UNIX_EPOCH,
    }
}

/// A clock that reads [`now`] once, when it starts, and from then on moves only with the
/// monotonic clock (tokio's, so a paused test clock moves it too): a step of the system
/// clock — an NTP step, a VM resumed from suspend, an operator's `date -s` — does not
/// move it. What a store in one process judges leases by.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SteadyClock {
    started: SystemTime,
    at: tokio::time::Instant,
}

impl SteadyClock {
    /// A clock that reads [`now`] at this moment.
    pub(crate) fn start() -> Self {
        SteadyClock {
            started: now(),
            at: tokio::time::Instant::now(),
        }
    }

    /// The instant it reads, in whole microseconds.
    pub(crate) fn now(&self) -> SystemTime {
        self.at(tokio::time::Instant::now())
    }

    /// The instant it read at `read` (tokio's clock, read since it started), in whole
    /// microseconds.
    pub(crate) fn at(&self, read: tokio::time::Instant) -> SystemTime {
        whole_micros(self.started + read.saturating_duration_since(self.at))
    }
}

/// `system`, moved by how far tokio's clock (read as `tokio`, a moment before the
/// system's monotonic clock was read as `monotonic`) is from the monotonic clock when
/// that is more than [`TEST_CLOCK_THRESHOLD`] (a paused or advanced test clock).
fn moved_by_tokio(system: SystemTime, tokio: tokio::time::Instant, monotonic: std::time::Instant) -> SystemTime {
    let tokio = tokio.into_std();
    // Read first, tokio's clock is behind by a moment outside a test: one comparison.
    if let Some(behind) = monotonic.checked_duration_since(tokio) {
        if behind > TEST_CLOCK_THRESHOLD {
            return system - behind;
        }
    } else if let Some(ahead) = tokio.checked_duration_since(monotonic) {
        if ahead > TEST_CLOCK_THRESHOLD {
            return system + ahead;
        }
    }
    system
}

/// Whose clock a store with a clock of its own (a database server) judges leases,
/// expiry and grants by.
///
/// [`Store`](Self::Store), the default, is what production needs: application hosts'
/// clocks disagree (a VM resumed from suspend, a broken NTP), and a host whose clock
/// runs minutes ahead would otherwise see every other host's lease as lapsed and take
/// over running bodies. [`Caller`](Self::Caller) judges by the instants the caller
/// passes ([`now`], which follows tokio's paused clock): for tests that move time
/// against a real database, never for more than one host.
///
/// `MemoryStore` lives in one process: its own clock is a steady one, started from the
/// system clock and moved by the monotonic clock only, so a step of the system clock
/// mid-body neither ends a running lease early nor lets a duplicate take it over.
/// SQLite is shared by the processes of one host, which have no steady clock in common:
/// it always judges by the caller's instants, the host's system clock (the bound a step
/// of that clock opens is in docs/RELIABILITY.md, "Clocks").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LeaseClock {
    /// The store's own clock; only lengths (lease, TTL) come from the caller.
    #[default]
    Store,
    /// The caller's instants, as given.
    Caller,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// An instant is cut to the microsecond at or below it, and so compares equal to
        /// itself written as whole microseconds and read back.
        #[test]
        fn whole_micros_cuts_to_the_microsecond_below(nanos in 0_u64..(1 << 62)) {
            let instant = UNIX_EPOCH + Duration::from_nanos(nanos);
            prop_assert_eq!(whole_micros(instant), UNIX_EPOCH + Duration::from_micros(nanos / 1_000));
        }
    }

    #[test]
    fn an_instant_before_the_epoch_is_the_epoch() {
        assert_eq!(whole_micros(UNIX_EPOCH - Duration::from_nanos(1_500)), UNIX_EPOCH);
    }

    /// The steady clock at a reading taken after it started counts the time between.
    #[tokio::test(start_paused = true)]
    async fn the_steady_clock_at_a_reading_counts_from_its_start() {
        let steady = SteadyClock::start();
        tokio::time::advance(Duration::from_secs(90)).await;
        let reading = Reading::take();
        assert_eq!(steady.at(reading.read()), steady.now());
        assert_eq!(
            steady.at(reading.read()).duration_since(steady.started).unwrap(),
            Duration::from_secs(90)
        );
    }
}
