//! Rows to records, and instants to the column types of each dialect.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, NaiveDateTime, Utc};
#[cfg(any(feature = "sqlite", feature = "postgres"))]
use idem_runtime::{Claim, Lease};
use idem_runtime::{Record, Status, StoreError, Tombstone};
use sqlx::{ColumnIndex, Decode, Row, Type};

use crate::error::driver_error;

/// `SystemTime` as UTC, truncated to the microseconds every column keeps.
pub(crate) fn utc(at: SystemTime) -> DateTime<Utc> {
    let micros = at.duration_since(UNIX_EPOCH).unwrap_or_default().as_micros();
    let truncated = UNIX_EPOCH + Duration::from_micros(u64::try_from(micros).unwrap_or(u64::MAX));
    DateTime::<Utc>::from(truncated)
}

/// How SQLite stores an instant: fixed-width UTC text, so that text order is time
/// order and an operator reads it as it is.
pub(crate) fn sqlite_text(at: SystemTime) -> String {
    utc(at).format(SQLITE_FORMAT).to_string()
}

const SQLITE_FORMAT: &str = "%Y-%m-%d %H:%M:%S%.6f";

/// A timestamp column value of some dialect.
pub(crate) trait Stamp: Sized {
    /// `at`, to the microsecond, as the dialect writes it.
    fn of(at: SystemTime) -> Self;
    fn into_system_time(self) -> Result<SystemTime, String>;
}

impl Stamp for DateTime<Utc> {
    fn of(at: SystemTime) -> Self {
        utc(at)
    }

    fn into_system_time(self) -> Result<SystemTime, String> {
        Ok(self.into())
    }
}

impl Stamp for NaiveDateTime {
    fn of(at: SystemTime) -> Self {
        utc(at).naive_utc()
    }

    fn into_system_time(self) -> Result<SystemTime, String> {
        Ok(self.and_utc().into())
    }
}

impl Stamp for String {
    fn of(at: SystemTime) -> Self {
        sqlite_text(at)
    }

    fn into_system_time(self) -> Result<SystemTime, String> {
        NaiveDateTime::parse_from_str(&self, SQLITE_FORMAT)
            .map(|at| at.and_utc().into())
            .map_err(|e| format!("timestamp {self:?} is not `YYYY-MM-DD HH:MM:SS.ffffff`: {e}"))
    }
}

/// A length in whole microseconds, as a server adds it to its clock.
pub(crate) fn micros(length: Duration) -> i64 {
    i64::try_from(length.as_micros()).unwrap_or(i64::MAX)
}

/// An instant's distance from "now", one way or the other.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Offset {
    After(Duration),
    Before(Duration),
}

impl From<Duration> for Offset {
    fn from(length: Duration) -> Self {
        Offset::After(length)
    }
}

impl Offset {
    /// Signed microseconds: negative before now.
    pub(crate) fn micros(self) -> i64 {
        match self {
            Offset::After(length) => micros(length),
            Offset::Before(length) => -micros(length),
        }
    }

    /// The instant this far from `now`.
    pub(crate) fn from(self, now: SystemTime) -> SystemTime {
        match self {
            Offset::After(length) => now + length,
            Offset::Before(length) => now - length,
        }
    }
}

/// The server's instant of a read, in the column after the record's (`get` on a
/// server's clock).
pub(crate) fn read_at<'r, R, Ts>(row: &'r R) -> Result<SystemTime, StoreError>
where
    R: Row,
    usize: ColumnIndex<R>,
    Ts: Stamp + Decode<'r, R::Database> + Type<R::Database>,
{
    let at: Ts = row
        .try_get(crate::shape::WRITTEN.len())
        .map_err(|e| driver_error("get (the server's instant)", e))?;
    at.into_system_time().map_err(StoreError::new)
}

/// The record a claim's insert read in its way (its row selected with
/// [`COLUMNS`](crate::table::COLUMNS), then the server's instant), with that instant
/// where the statements judge by the server's clock.
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) fn read_in_insert<'r, R, Ts>(row: &'r R, server_clock: bool) -> Result<crate::claim::Inserted, StoreError>
where
    R: Row,
    usize: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    Option<String>: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    Ts: Stamp + Decode<'r, R::Database> + Type<R::Database>,
    Option<Ts>: Decode<'r, R::Database> + Type<R::Database>,
{
    let read_at = server_clock.then(|| read_at::<_, Ts>(row)).transpose()?;
    Ok(crate::claim::Inserted::Read(record_from_row::<_, Ts>(row)?, read_at))
}

/// Decode a row selected with [`COLUMNS`](crate::table::COLUMNS) into a [`Record`].
/// A row that does not decode is an error naming its biz and key; nothing is guessed.
pub(crate) fn record_from_row<'r, R, Ts>(row: &'r R) -> Result<Record, StoreError>
where
    R: Row,
    usize: ColumnIndex<R>,
    String: Decode<'r, R::Database> + Type<R::Database>,
    Option<String>: Decode<'r, R::Database> + Type<R::Database>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    Ts: Stamp + Decode<'r, R::Database> + Type<R::Database>,
    Option<Ts>: Decode<'r, R::Database> + Type<R::Database>,
{
    let identity = |e: sqlx::Error| StoreError::with_source("a record's biz_type or idempotent_key is unreadable", e);
    let biz: String = row.try_get(0).map_err(identity)?;
    let key: String = row.try_get(1).map_err(identity)?;
    let unreadable =
        |what: String| StoreError::new(format!("the record of biz `{biz}` key `{key}` is unreadable: {what}"));
    let column = |e: sqlx::Error| unreadable(e.to_string());
    let stamp = |value: Ts| value.into_system_time().map_err(&unreadable);
    let optional_stamp = |value: Option<Ts>| value.map(stamp).transpose();

    let status: String = row.try_get(2).map_err(column)?;
    let fence: i64 = row.try_get(3).map_err(column)?;
    Ok(Record {
        status: status.parse::<Status>().map_err(|e| unreadable(e.to_string()))?,
        fence: u64::try_from(fence).map_err(|_| unreadable(format!("negative fence {fence}")))?,
        fingerprint: row.try_get(4).map_err(column)?,
        request_body: row.try_get(5).map_err(column)?,
        response_body: row.try_get(6).map_err(column)?,
        error_message: row.try_get(7).map_err(column)?,
        lease_until: optional_stamp(row.try_get(8).map_err(column)?)?,
        created_at: stamp(row.try_get(9).map_err(column)?)?,
        completed_at: optional_stamp(row.try_get(10).map_err(column)?)?,
        expires_at: stamp(row.try_get(11).map_err(column)?)?,
        steps: row.try_get(12).map_err(column)?,
        subject: row.try_get(13).map_err(column)?,
        replay_until: optional_stamp(row.try_get(14).map_err(column)?)?,
        tombstone: row
            .try_get::<Option<String>, _>(15)
            .map_err(column)?
            .map(|text| text.parse::<Tombstone>().map_err(|e| unreadable(e.to_string())))
            .transpose()?,
        biz: biz.clone(),
        key: key.clone(),
    })
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
/// The lease a claim statement granted, from its `fence` and `created_at` columns at
/// `at` and `at + 1` (both NULL when it granted nothing).
pub(crate) fn granted_lease<'r, R, Ts>(claim: &Claim<'_>, row: &'r R, at: usize) -> Result<Option<Lease>, StoreError>
where
    R: Row,
    usize: ColumnIndex<R>,
    Option<i64>: Decode<'r, R::Database> + Type<R::Database>,
    Option<Ts>: Decode<'r, R::Database> + Type<R::Database>,
    Ts: Stamp,
{
    let fence: Option<i64> = row.try_get(at).map_err(|e| driver_error("claim", e))?;
    let created_at: Option<Ts> = row.try_get(at + 1).map_err(|e| driver_error("claim", e))?;
    match (fence, created_at) {
        (Some(fence), Some(created_at)) => Ok(Some(Lease::new(
            claim.biz,
            claim.key,
            u64::try_from(fence).map_err(|_| StoreError::new(format!("claim granted a negative fence {fence}")))?,
            created_at.into_system_time().map_err(StoreError::new)?,
        ))),
        _ => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "sqlite")]
    #[test]
    fn sqlite_text_round_trips_and_sorts_as_time() {
        let at = UNIX_EPOCH + Duration::from_micros(1_764_432_000_123_456);
        let text = sqlite_text(at);
        assert_eq!(text, "2025-11-29 16:00:00.123456");
        assert_eq!(text.clone().into_system_time().unwrap(), at);
        assert!(sqlite_text(at + Duration::from_micros(1)) > text);
        assert!(sqlite_text(UNIX_EPOCH + Duration::from_secs(5)) < sqlite_text(UNIX_EPOCH + Duration::from_secs(40)));
    }
}
