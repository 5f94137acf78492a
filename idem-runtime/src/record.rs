//! One row of the `idempotent_record` table.

use std::fmt;
use std::str::FromStr;
use std::time::SystemTime;

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
