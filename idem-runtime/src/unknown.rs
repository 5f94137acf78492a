//! Unknown outcomes: an effect that may have happened.
//!
//! A step's effect is a call to someone else — a bank, an SMS gateway, another service.
//! When its holder dies after sending the request and before recording the answer, or
//! when the request leaves and no answer comes back (a timeout, a reset connection),
//! nobody knows whether the effect happened. Running it again charges twice unless the
//! other side deduplicates by the effect key; many do not, or only for minutes.
//!
//! A step that declares what to do then ([`Step::reconcile`](crate::Step::reconcile) or
//! [`Step::fail_closed`](crate::Step::fail_closed)) first records its [`Intent`] with the
//! record — one fenced write — and only then starts the effect. A later attempt (a
//! takeover, a retry) that finds the intent without a value knows the effect may have
//! happened: it asks the user's lookup ([`Lookup`]) or fails closed
//! ([`Error::OutcomeUnknown`](crate::Error::OutcomeUnknown)), and never runs the effect
//! blindly. A step that fails closed leaves its record *unsettled*: held under a lease
//! that never lapses ([`UNSETTLED_LEASE`]), so that every duplicate gets the same error,
//! until an operator settles it ([`repair::settle`](crate::repair::settle),
//! `idem settle`).
//!
//! The entries of [`Record::steps`] hold a step's JSON value once it finished, or one of
//! these, each starting with a character no JSON text starts with: `?intent: {…}` (the
//! effect is about to start, or may have), `!unknown: {…}` (the outcome is unknown and
//! the record waits to be settled), `!unrecordable: …` (the effect ran, its value could
//! not be kept).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::bounds::MAX_DURATION;
use crate::record::{Record, Status};

/// The lease an unsettled record is held under: it never lapses in practice (100
/// years), so no call takes the record over while its outcome is unknown.
pub const UNSETTLED_LEASE: Duration = MAX_DURATION;

/// The name the whole body's entry goes by in [`Record::steps`]: no step may use it.
pub(crate) const BODY: &str = "";

const INTENT: &str = "?intent: ";
const UNKNOWN: &str = "!unknown: ";
pub(crate) const UNRECORDABLE: &str = "!unrecordable: ";

/// A step's effect, recorded before it started: what a lookup gets to find out whether
/// it happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Intent {
    /// The step's name (empty for a whole body).
    pub step: String,
    /// The key the effect was (or was about to be) sent with:
    /// [`Context::effect_key`](crate::Context::effect_key) of the step's name.
    pub effect_key: String,
    /// Which start of the effect this is in the record's life: 1 for the first, one
    /// more each time a lookup answered [`Lookup::NotDone`] and the effect ran again.
    pub attempt: u32,
    /// When the intent was recorded (the holder's clock), in microseconds since the
    /// Unix epoch.
    #[serde(rename = "at")]
    pub since_micros: u64,
}

impl Intent {
    /// When the intent was recorded, by the clock of the holder that recorded it.
    pub fn since(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_micros(self.since_micros)
    }

    pub(crate) fn new(step: &str, effect_key: String, attempt: u32, at: SystemTime) -> Self {
        let micros = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros();
        Self {
            step: step.to_owned(),
            effect_key,
            attempt,
            since_micros: u64::try_from(micros).unwrap_or(u64::MAX),
        }
    }
}

/// What a lookup found out about an effect whose outcome was unknown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<T> {
    /// It happened, with this value: the value is recorded and returned, the effect not
    /// run again.
    Done(T),
    /// It did not happen: the effect runs (again).
    NotDone,
    /// Nobody can tell: the step fails closed
    /// ([`Error::OutcomeUnknown`](crate::Error::OutcomeUnknown)).
    CannotTell,
}

/// One entry of [`Record::steps`], read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Entry {
    /// The step finished: the JSON of its value.
    Value(String),
    /// The effect ran and its value could not be recorded: why.
    Unrecordable(String),
    /// The effect was about to start (or may have).
    Intended(Intent),
    /// The outcome is unknown; the record waits to be settled.
    Unknown(Intent),
}

impl Entry {
    pub(crate) fn read(entry: &str) -> Entry {
        let intent = |json: &str| serde_json::from_str::<Intent>(json).ok();
        match split_marker(entry) {
            (INTENT, json) => intent(json).map(Entry::Intended),
            (UNKNOWN, json) => intent(json).map(Entry::Unknown),
            (UNRECORDABLE, reason) => Some(Entry::Unrecordable(reason.to_owned())),
            _ => None,
        }
        // An entry that starts with `?` or `!` and does not parse is no JSON either: it
        // is kept as it is and fails to decode as a value, loudly.
        .unwrap_or_else(|| Entry::Value(entry.to_owned()))
    }

    pub(crate) fn intended(intent: &Intent) -> String {
        format!("{INTENT}{}", Self::json(intent))
    }

    pub(crate) fn unknown(intent: &Intent) -> String {
        format!("{UNKNOWN}{}", Self::json(intent))
    }

    fn json(intent: &Intent) -> String {
        serde_json::to_string(intent).expect("an intent is strings and numbers")
    }
}

/// `entry` split into its marker (an intent, an outcome unknown, a value that could
/// not be recorded; empty for a value) and what follows it.
pub(crate) fn split_marker(entry: &str) -> (&str, &str) {
    [INTENT, UNKNOWN, UNRECORDABLE]
        .into_iter()
        .find_map(|marker| entry.strip_prefix(marker).map(|rest| (marker, rest)))
        .unwrap_or(("", entry))
}

/// Whether `record` is marked as waiting to be settled: a `PROCESSING` record with an
/// entry of unknown outcome among its steps, read or not (a sealed record's intent
/// opens only with its key ring; [`unsettled`] reads it).
pub fn awaits_settling(record: &Record) -> bool {
    record.status == Status::Processing
        && record
            .steps_map()
            .is_ok_and(|steps| steps.values().any(|entry| entry.starts_with(UNKNOWN)))
}

/// The outcome `record` waits to have settled, if it is unsettled: a `PROCESSING`
/// record with an entry of unknown outcome among its steps.
pub fn unsettled(record: &Record) -> Option<Intent> {
    if record.status != Status::Processing {
        return None;
    }
    record
        .steps_map()
        .ok()?
        .values()
        .find_map(|entry| match Entry::read(entry) {
            Entry::Unknown(intent) => Some(intent),
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_read_back_as_written() {
        let intent = Intent::new(
            "charge",
            "pay:k:1:charge".into(),
            2,
            UNIX_EPOCH + Duration::from_micros(7),
        );
        assert_eq!(Entry::read(&Entry::intended(&intent)), Entry::Intended(intent.clone()));
        assert_eq!(Entry::read(&Entry::unknown(&intent)), Entry::Unknown(intent.clone()));
        assert_eq!(Entry::read("{\"a\":1}"), Entry::Value("{\"a\":1}".into()));
        assert_eq!(Entry::read("!unrecordable: NaN"), Entry::Unrecordable("NaN".into()));
        assert_eq!(intent.since(), UNIX_EPOCH + Duration::from_micros(7));
    }
}
