//! One row of the `idempotent_record` table.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime};

use crate::retention::{Retention, Tombstone};

/// Where a record is in its life: `Processing → Succeeded | Failed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// Claimed; the body is running (or its holder died and the lease will lapse).
    Processing,
    /// The body returned `Ok`; `response_body` holds its JSON.
    Succeeded,
    /// The body returned `Err` under `on_error = Record`.
    Failed,
}

impl Status {
    /// The value stored in the `status` column: `PROCESSING`, `SUCCESS` or `FAIL`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Status::Processing => "PROCESSING",
            Status::Succeeded => "SUCCESS",
            Status::Failed => "FAIL",
        }
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The `status` column held something other than `PROCESSING`, `SUCCESS` or `FAIL`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown record status {0:?}: expected PROCESSING, SUCCESS or FAIL")]
pub struct UnknownStatus(pub String);

impl FromStr for Status {
    type Err = UnknownStatus;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "PROCESSING" => Ok(Status::Processing),
            "SUCCESS" => Ok(Status::Succeeded),
            "FAIL" => Ok(Status::Failed),
            other => Err(UnknownStatus(other.to_owned())),
        }
    }
}

/// A record as a store keeps it: one row of the `idempotent_record` table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Business namespace (`biz_type`).
    pub biz: String,
    /// Idempotency key (`idempotent_key`).
    pub key: String,
    /// Lifecycle state.
    pub status: Status,
    /// Incremented by every claim or takeover; writes of a holder must match it.
    pub fence: u64,
    /// SHA-256 of the canonical JSON of the payload, when the call declared one.
    pub fingerprint: Option<String>,
    /// Optional copy of the request, for reconciliation.
    pub request_body: Option<String>,
    /// JSON of the first `Ok` value (`Succeeded` only).
    pub response_body: Option<String>,
    /// Description of the failure (`Failed` only).
    pub error_message: Option<String>,
    /// End of the `Processing` lease; for a finished record, the instant it finished.
    /// A `Processing` record without one is treated as held, never as free.
    pub lease_until: Option<SystemTime>,
    /// When this life of the record began (first claim, or re-claim after expiry).
    pub created_at: SystemTime,
    /// When the body's outcome was recorded.
    pub completed_at: Option<SystemTime>,
    /// From this instant on the record counts as absent.
    pub expires_at: SystemTime,
    /// The finished [steps](crate::step) of this life of the record: a JSON object from
    /// step name to the JSON of its `Ok` value. Kept across takeovers and across a
    /// release, cleared when the record starts a new life.
    pub steps: Option<String>,
    /// The keyed hash of the data subject of the call that finished this record
    /// ([`subject`](crate::subject)), for erasure. Written with the outcome.
    pub subject: Option<String>,
    /// For a finished record that keeps a tombstone past its `ttl`
    /// ([`AfterExpiry::Gone`](crate::AfterExpiry::Gone)): the end of its replay. From
    /// then until `expires_at` it is a tombstone. `None`: it replays until it expires.
    pub replay_until: Option<SystemTime>,
    /// Set when a finished record's stored values were removed: by the purge after
    /// `replay_until`, or by an erasure of its subject.
    pub tombstone: Option<Tombstone>,
}

impl Record {
    /// The recorded steps, by name: each a step's JSON value, or a marker of its intent
    /// or unknown outcome. Empty when none are recorded.
    pub(crate) fn steps_map(&self) -> Result<std::collections::BTreeMap<String, String>, serde_json::Error> {
        match self.steps.as_deref() {
            None => Ok(Default::default()),
            Some(json) => serde_json::from_str(json),
        }
    }

    /// What a finished record is at `now` if it no longer answers with its outcome: an
    /// erased record, or one past its replay (stripped by the purge or not yet).
    /// `None` for a `Processing` record: what a finished life left is overwritten by
    /// the next outcome.
    pub fn tombstone_at(&self, now: SystemTime) -> Option<Tombstone> {
        if self.status == Status::Processing {
            return None;
        }
        self.tombstone.or_else(|| {
            self.replay_until
                .filter(|until| *until <= now)
                .map(|_| Tombstone::Expired)
        })
    }

    /// Write the outcome of the holder's call into its record, as every store does:
    /// `status` with its `text` (the response of a success, the message of a failure),
    /// finished at `now`, replayed for `ttl`, then kept as a tombstone for what
    /// `retention` asks, with the subject's hash.
    pub fn finish(&mut self, status: Status, text: &str, now: SystemTime, ttl: Duration, retention: &Retention) {
        match status {
            Status::Failed => self.error_message = Some(text.to_owned()),
            _ => self.response_body = Some(text.to_owned()),
        }
        self.status = status;
        self.lease_until = Some(now);
        self.completed_at = Some(now);
        self.expires_at = now + retention.record_length(ttl);
        self.replay_until = retention.replay_until(now, ttl);
        self.subject = retention.subject.clone();
        self.tombstone = None;
    }

    /// Remove every value stored about the call — the request, the answer, the
    /// failure's text, the steps — and keep the record as a tombstone of `why`: its
    /// status, fence, instants, fingerprint and subject hash stay.
    pub fn strip(&mut self, why: Tombstone) {
        self.request_body = None;
        self.response_body = None;
        self.error_message = None;
        self.steps = None;
        self.tombstone = Some(why);
    }

    /// Whether the purge at `now` strips this record to a tombstone: finished, past its
    /// replay, not stripped yet, not yet expired (an expired one is deleted).
    pub fn strippable(&self, now: SystemTime) -> bool {
        self.status != Status::Processing
            && self.tombstone.is_none()
            && self.replay_until.is_some_and(|until| until <= now)
            && !self.is_expired(now)
    }

    /// Whether an erasure of the data subject `subject` (its keyed hash) strips this
    /// record: finished, of that subject, not erased yet.
    pub fn erasable(&self, subject: &str) -> bool {
        self.status != Status::Processing
            && self.subject.as_deref() == Some(subject)
            && self.tombstone != Some(Tombstone::Erased)
    }

    /// Whether `other` is this record in the same life, fence and status, with the same
    /// values: what a rewrite of the values in place ([`RecordPages::replace_values`](crate::pages::RecordPages::replace_values))
    /// requires of the record it read.
    pub fn same_values(&self, other: &Record) -> bool {
        (self.created_at, self.fence, self.status) == (other.created_at, other.fence, other.status)
            && (
                &self.request_body,
                &self.response_body,
                &self.error_message,
                &self.steps,
            ) == (
                &other.request_body,
                &other.response_body,
                &other.error_message,
                &other.steps,
            )
    }

    /// Whether the record counts as absent at `now`.
    pub fn is_expired(&self, now: SystemTime) -> bool {
        self.expires_at <= now
    }

    /// Whether a `Processing` record's lease has lapsed at `now` (so a retry may take
    /// it over). Always false for finished records and for a missing lease.
    pub fn lease_lapsed(&self, now: SystemTime) -> bool {
        self.status == Status::Processing && self.lease_until.is_some_and(|until| until <= now)
    }
}
