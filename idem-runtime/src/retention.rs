//! What a finished record keeps once its answer is no longer replayed: a tombstone.
//!
//! A record answers duplicates for its `ttl`. What a retry that comes later gets is the
//! operation's choice ([`AfterExpiry`]): by default the key is free again and the retry
//! runs as a new request; with [`AfterExpiry::Gone`] the record stays, body-less, for a
//! window past the `ttl`, and a retry in that window gets [`Error::Expired`](crate::Error::Expired)
//! instead of a second run. A record whose data subject was [erased](crate::subject)
//! is a tombstone too: its retries get [`Error::Erased`](crate::Error::Erased).
//!
//! The rule for both lives here and in [`Record`], in plain Rust, so every store applies
//! the same one: a finished record is written by [`Record::finish`] (or a statement
//! doing what it does), emptied by [`Record::strip`].

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use crate::bounds::MAX_DURATION;

/// What a retry that arrives after a record's `ttl` gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AfterExpiry {
    /// The key is free: the retry runs as a new request (the IETF draft's reading of
    /// an expired key). The default.
    #[default]
    NewRequest,
    /// For this long past the `ttl` the record stays as a body-less tombstone and a
    /// retry gets [`Error::Expired`](crate::Error::Expired) (HTTP 410) instead of a
    /// second run; the purge removes the tombstone at the end of the window.
    Gone(Duration),
}

/// Why a finished record no longer holds its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tombstone {
    /// Its `ttl` ended and its operation keeps tombstones ([`AfterExpiry::Gone`]).
    Expired,
    /// Its data subject was erased.
    Erased,
}

impl Tombstone {
    /// The value stored in the `tombstone` column: `EXPIRED` or `ERASED`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Tombstone::Expired => "EXPIRED",
            Tombstone::Erased => "ERASED",
        }
    }
}

impl fmt::Display for Tombstone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `tombstone` column held something other than `EXPIRED` or `ERASED`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tombstone {0:?}: expected EXPIRED or ERASED")]
pub struct UnknownTombstone(pub String);

impl FromStr for Tombstone {
    type Err = UnknownTombstone;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "EXPIRED" => Ok(Tombstone::Expired),
            "ERASED" => Ok(Tombstone::Erased),
            other => Err(UnknownTombstone(other.to_owned())),
        }
    }
}

/// What the holder of a claim asks its finished record to keep beyond its answer: the
/// keyed hash of the call's data subject, and how long a tombstone stays past the
/// `ttl`. The runtime sets it on the [`Lease`](crate::Lease) it writes through; a store
/// writes it with the outcome ([`Record::finish`](crate::Record::finish)).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Retention {
    /// The keyed hash of the call's data subject ([`subject`](crate::subject)), never
    /// the subject itself.
    pub subject: Option<String>,
    /// How long the record stays as a tombstone past its `ttl`; zero for none.
    pub gone_for: Duration,
}

impl Retention {
    /// A retention for the subject hash `subject` and the choice `after`.
    pub fn new(subject: Option<String>, after: AfterExpiry) -> Self {
        let gone_for = match after {
            AfterExpiry::NewRequest => Duration::ZERO,
            AfterExpiry::Gone(window) => window,
        };
        Self { subject, gone_for }
    }

    /// How long a record finished now lives in the store: its `ttl`, and the
    /// tombstone's window after it (at most [`MAX_DURATION`]).
    pub fn record_length(&self, ttl: Duration) -> Duration {
        ttl.saturating_add(self.gone_for).min(MAX_DURATION)
    }

    /// Until when a record finished at `now` replays its answer, when it keeps a
    /// tombstone after that; `None` when it replays until it expires.
    pub fn replay_until(&self, now: SystemTime, ttl: Duration) -> Option<SystemTime> {
        (!self.gone_for.is_zero()).then(|| now + ttl)
    }
}
