//! The SQL of one table in one dialect, written once when a store is built.
//!
//! Every holder write names its lease the same way — `fence` and `created_at` of the
//! record's life, while it is `PROCESSING` — so a fenced-out holder matches no row.

use crate::dialect::Dialect;
#[cfg(any(feature = "sqlite", feature = "postgres", test))]
use crate::table::COLUMNS;

/// A database server's clock in SQL: the statement's instant, read once per statement,
/// and instants a bound number of microseconds from it. Only durations come from the
/// caller, so hosts whose clocks disagree still agree on every lease.
#[derive(Clone, Copy)]
pub(crate) struct ServerClock {
    /// The statement's instant.
    pub now: &'static str,
    /// The statement's instant plus `?` microseconds (an `i64` bound there).
    pub after: &'static str,
    /// The statement's instant in microseconds since the epoch: a new record's fence.
    pub epoch_micros: &'static str,
}

/// The clock a store's statements judge leases and expiry by: the dialect's
/// [`SERVER_CLOCK`](crate::dialect::Dialect::SERVER_CLOCK), or none where the caller's
/// instants are bound.
#[derive(Clone, Copy)]
pub(crate) struct StatementClock(pub Option<ServerClock>);

impl StatementClock {
    /// The clock of dialect `D`'s statements when leases are judged by `clock`.
    pub(crate) fn of<D: Dialect>(clock: idem_runtime::LeaseClock) -> StatementClock {
        match clock {
            idem_runtime::LeaseClock::Store => StatementClock(D::SERVER_CLOCK),
            idem_runtime::LeaseClock::Caller => StatementClock(None),
        }
    }

    /// "Now" in a statement: the server's instant, or a bound one.
    pub(crate) fn now(&self) -> &'static str {
        self.0.as_ref().map_or("?", |clock| clock.now)
    }

    /// An instant some time from now: the server's instant plus bound microseconds, or
    /// a bound instant. `placeholder` is where the bind goes (`?`, or `?5`).
    pub(crate) fn after(&self, placeholder: &str) -> String {
        match &self.0 {
            Some(clock) => clock.after.replace('?', placeholder),
            None => placeholder.to_owned(),
        }
    }
}

/// Statements shared by all dialects, with `?` turned into the dialect's placeholders.
/// Each placeholder appears once, in bind order, so one bind sequence fits them all.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    /// The table's name as given, for messages and catalog lookups.
    pub table: String,
    /// The table's name quoted for the dialect, as every statement writes it.
    pub quoted: String,
    /// Whether the statements read the server's clock (and bind lengths, not instants).
    pub server_clock: bool,
    /// Whether statements are prepared under a name and kept on the connection (not
    /// behind a pooler in transaction mode: [`Pooler`](crate::Pooler)).
    pub prepared: bool,
    pub renew: String,
    pub complete: String,
    pub fail: String,
    /// Deletes a record without steps.
    pub release: String,
    /// Lets the lease of a record with steps lapse, keeping them for the next claim.
    /// Never a record without steps: the release's delete found none under the lease,
    /// and a record without steps that stands there by the time the park runs is
    /// another claim's.
    pub park: String,
    pub record_steps: String,
    /// The read of one record (and, on a server's clock, the server's instant after
    /// its columns).
    pub get: String,
    /// `get` inside the caller's transaction, reading the latest commit.
    pub get_in_transaction: String,
    /// `PROCESSING` records created before an instant whose lease lapsed (or that have
    /// none) — never a running claim, never a form token. Binds: created before (on a
    /// server's clock, microseconds from now, negative), now (none on a server's
    /// clock), biz, biz (`''` for every biz), limit.
    pub stuck: String,
    pub unsettled: String,
    /// The oldest `PROCESSING` record that is not a form token, running or not. Binds:
    /// biz, biz.
    pub oldest_processing: String,
    /// Live `FAIL` records. Binds: now (none on a server's clock), biz, biz, limit.
    pub failed: String,
    /// Records by biz and status, how many of them expired, and how many are
    /// tombstones. Binds: now (none on a server's clock), biz, biz.
    pub stats: String,
    /// Deletes a `FAIL` record, so the next call runs.
    pub forget_failed: String,
    /// Strips the finished records of a subject to erased tombstones. Binds: subject.
    pub erase_subject: String,
    /// Records after a `(biz, key)`, in that order. Binds: biz, biz, key, limit.
    pub page: String,
    /// A record's values rewritten if it is as it was read. Binds: the four new values
    /// (request, response, error, steps), biz, key, fence, created at, status, the four
    /// values read.
    pub replace_values: String,
}

const HELD: &str = "biz_type = ? AND idempotent_key = ? AND fence = ? AND created_at = ? AND status = 'PROCESSING'";

/// One biz, or every biz when the bound text is empty. Binds: biz, biz.
const OF_BIZ: &str = "(biz_type = ? OR ? = '')";

/// What a tombstone no longer holds: every value stored about the call.
pub(crate) const STRIPPED: &str = "request_body = NULL, response_body = NULL, error_message = NULL, steps = NULL";

/// A finished record past its replay and not stripped yet, nor expired, by `now`
/// (written twice).
pub(crate) fn strippable(now: &str) -> String {
    format!(
        "status <> 'PROCESSING' AND tombstone IS NULL AND replay_until <= {now} AND expires_at > {now}"
    )
}

/// Not a form token's record (`idem::token` keeps them under `token.<biz>`).
const NOT_A_TOKEN: &str = "biz_type NOT LIKE 'token.%'";

impl Statements {
    /// `sql` with its values to bind: prepared under a name and kept on the connection,
    /// unless the store is behind a pooler in transaction mode.
    pub(crate) fn query<'q, DB: sqlx::Database + sqlx::database::HasStatementCache>(&self, sql: &'q str) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>> {
        sqlx::query(sql).persistent(self.prepared)
    }

    /// The statements of dialect `D` on the table `name` (written `table`, quoted),
    /// judged by `clock`.
    pub(crate) fn new<D: Dialect>(name: &str, table: &str, clock: StatementClock) -> Self {
        let sql = |text: String| {
            if D::NUMBERED {
                numbered(&text)
            } else {
                text
            }
        };
        let greatest = D::GREATEST;
        let columns = D::COLUMNS;
        let (now, after) = (clock.now(), clock.after("?"));
        // On a server's clock a read also says when it read, by that clock: a claim
        // judges what it read by that instant.
        let read_at = clock.0.map_or(String::new(), |clock| format!(", {}", clock.now));
        // The outcome, and what it keeps beyond its answer: the end of its replay (NULL
        // where it replays until it expires; a NULL length makes a NULL instant) and
        // its subject's hash. What an earlier life left (a tombstone) is cleared.
        // The holder writes that end a wait: each tells the key's waiters where the
        // dialect can.
        let announced = |text: String| sql(D::announced(text, name));
        let finish = |status: &str, column: &str| {
            announced(format!(
                "UPDATE {table} SET status = '{status}', {column} = ?, lease_until = {now}, completed_at = {now}, \
                 expires_at = {after}, replay_until = {after}, subject = ?, tombstone = NULL WHERE {HELD}"
            ))
        };
        Self {
            table: name.to_owned(),
            quoted: table.to_owned(),
            server_clock: clock.0.is_some(),
            prepared: true,
            renew: sql(format!(
                "UPDATE {table} SET lease_until = {after}, expires_at = {greatest}(expires_at, {after}) WHERE {HELD}"
            )),
            complete: finish("SUCCESS", "response_body"),
            fail: finish("FAIL", "error_message"),
            release: announced(format!("DELETE FROM {table} WHERE {HELD} AND steps IS NULL")),
            park: announced(format!(
                "UPDATE {table} SET lease_until = created_at WHERE {HELD} AND steps IS NOT NULL"
            )),
            record_steps: sql(format!("UPDATE {table} SET steps = ? WHERE {HELD}")),
            get: sql(format!(
                "SELECT {columns}{read_at} FROM {table} WHERE biz_type = ? AND idempotent_key = ?"
            )),
            get_in_transaction: sql(format!(
                "SELECT {columns}{read_at} FROM {table} WHERE biz_type = ? AND idempotent_key = ?{}",
                D::LOCKING_READ
            )),
            stuck: sql(format!(
                "SELECT {columns} FROM {table} WHERE status = 'PROCESSING' AND created_at <= {after} \
                 AND (lease_until IS NULL OR lease_until <= {now}) AND {NOT_A_TOKEN} AND {OF_BIZ} \
                 ORDER BY created_at LIMIT ?"
            )),
            // The pattern only narrows the scan; `unknown::unsettled` decides.
            unsettled: sql(format!(
                "SELECT {columns} FROM {table} WHERE status = 'PROCESSING' AND steps LIKE '%!unknown: %' \
                 AND {OF_BIZ} ORDER BY created_at LIMIT ?"
            )),
            oldest_processing: sql(format!(
                "SELECT {columns} FROM {table} WHERE status = 'PROCESSING' AND {NOT_A_TOKEN} AND {OF_BIZ} \
                 ORDER BY created_at LIMIT 1"
            )),
            failed: sql(format!(
                "SELECT {columns} FROM {table} WHERE status = 'FAIL' AND expires_at > {now} AND {OF_BIZ} \
                 ORDER BY completed_at LIMIT ?"
            )),
            stats: sql(format!(
                "SELECT {biz_text}, status, COUNT(*), COUNT(CASE WHEN expires_at <= {now} THEN 1 END), \
                 COUNT(CASE WHEN tombstone IS NOT NULL THEN 1 END) FROM {table} \
                 WHERE {OF_BIZ} GROUP BY biz_type, status ORDER BY biz_type, status",
                biz_text = D::BIZ_TEXT
            )),
            forget_failed: sql(format!(
                "DELETE FROM {table} WHERE biz_type = ? AND idempotent_key = ? AND status = 'FAIL'"
            )),
            page: sql(format!(
                "SELECT {columns} FROM {table} WHERE biz_type > ? OR (biz_type = ? AND idempotent_key > ?) \
                 ORDER BY biz_type, idempotent_key LIMIT ?"
            )),
            replace_values: sql(format!(
                "UPDATE {table} SET request_body = ?, response_body = ?, error_message = ?, steps = ? \
                 WHERE biz_type = ? AND idempotent_key = ? AND fence = ? AND created_at = ? AND status = ? \
                 AND COALESCE(request_body, '') = COALESCE(?, '') AND COALESCE(response_body, '') = COALESCE(?, '') \
                 AND COALESCE(error_message, '') = COALESCE(?, '') AND COALESCE(steps, '') = COALESCE(?, '')"
            )),
            erase_subject: sql(format!(
                "UPDATE {table} SET {STRIPPED}, tombstone = 'ERASED' WHERE subject = ? AND status <> 'PROCESSING' \
                 AND (tombstone IS NULL OR tombstone <> 'ERASED')"
            )),
        }
    }
}

#[cfg(feature = "postgres")]
/// The claim of a key nobody holds: the record inserted, `RETURNING` its fence and life;
/// no row when a record stands (it is then read, and taken over by
/// [`upsert_on_conflict`] only if it is claimable). It writes nothing over a record
/// that stands, so a duplicate's claim locks no row and commits no write. Binds as
/// [`upsert_on_conflict`]'s.
pub(crate) fn insert_if_absent<D: Dialect>(table: &str, clock: StatementClock) -> String {
    let upsert = upsert_on_conflict::<D>(table, clock);
    let (insert, _) = upsert
        .split_once(" ON CONFLICT")
        .expect("the claim's insert has a conflict clause");
    format!("{insert} ON CONFLICT (biz_type, idempotent_key) DO NOTHING RETURNING fence, created_at")
}

#[cfg(any(feature = "sqlite", feature = "postgres"))]
/// The claim on PostgreSQL and SQLite: insert, or take over an expired record or a
/// lapsed lease whose fingerprint agrees, in one statement; `RETURNING` says whether
/// (and with which fence and life) it granted. A new life's fence is its first
/// instant in microseconds, or one above the last life's when that is higher. Binds:
/// biz, key, fingerprint, request body, then on the caller's clock lease end, now,
/// expiry, first fence — on a server's clock the lease's and the record's lengths in
/// microseconds.
pub(crate) fn upsert_on_conflict<D: Dialect>(table: &str, clock: StatementClock) -> String {
    let (lease_until, now, expires_at, first_fence) = match &clock.0 {
        Some(server) => (clock.after("?5"), server.now, clock.after("?6"), server.epoch_micros),
        None => ("?5".to_owned(), "?6", "?7".to_owned(), "?8"),
    };
    let greatest = D::GREATEST;
    let text = format!(
        "INSERT INTO {table} AS cur ({COLUMNS}) \
         VALUES (?1, ?2, 'PROCESSING', {first_fence}, ?3, ?4, NULL, NULL, {lease_until}, {now}, NULL, {expires_at}, NULL, \
                 NULL, NULL, NULL) \
         ON CONFLICT (biz_type, idempotent_key) DO UPDATE SET \
           status = 'PROCESSING', \
           fence = CASE WHEN cur.expires_at <= excluded.created_at THEN {greatest}(cur.fence + 1, excluded.fence) \
                   ELSE cur.fence + 1 END, \
           fingerprint = CASE WHEN cur.expires_at <= excluded.created_at THEN excluded.fingerprint \
                         ELSE COALESCE(excluded.fingerprint, cur.fingerprint) END, \
           request_body = excluded.request_body, \
           response_body = NULL, \
           error_message = NULL, \
           lease_until = excluded.lease_until, \
           created_at = CASE WHEN cur.expires_at <= excluded.created_at THEN excluded.created_at \
                        ELSE cur.created_at END, \
           completed_at = NULL, \
           steps = CASE WHEN cur.expires_at <= excluded.created_at THEN NULL ELSE cur.steps END, \
           expires_at = excluded.expires_at \
         WHERE cur.expires_at <= excluded.created_at \
            OR (cur.status = 'PROCESSING' AND cur.lease_until <= excluded.created_at \
                AND (cur.fingerprint IS NULL OR excluded.fingerprint IS NULL \
                     OR cur.fingerprint = excluded.fingerprint)) \
         RETURNING fence, created_at"
    );
    // SQLite numbers placeholders `?N`; PostgreSQL `$N`.
    if D::NUMBERED {
        text.replace('?', "$")
    } else {
        text
    }
}

/// A statement written with `?` placeholders (SQLite's and MySQL's), numbered as
/// PostgreSQL wants them: `?, ?` → `$1, $2`. For statements of your own beside the
/// store's, written once for every database.
///
/// ```
/// assert_eq!(idem_store_sqlx::numbered("UPDATE t SET a = ? WHERE b = ?"), "UPDATE t SET a = $1 WHERE b = $2");
/// ```
pub fn numbered(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 8);
    let mut n = 0;
    for c in text.chars() {
        if c == '?' {
            n += 1;
            out.push('$');
            out.push_str(&n.to_string());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(feature = "postgres")]
    #[test]
    fn numbers_placeholders_for_postgres() {
        let clock = StatementClock::of::<crate::PostgresStore>(idem_runtime::LeaseClock::Caller);
        let statements = Statements::new::<crate::PostgresStore>("t", "t", clock);
        assert!(statements
            .renew
            .starts_with("UPDATE t SET lease_until = $1, expires_at = GREATEST(expires_at, $2)"));
        assert!(statements.renew.ends_with("created_at = $6 AND status = 'PROCESSING'"));
    }

    /// On the server's clock the statements read its instant and bind lengths.
    #[cfg(feature = "postgres")]
    #[test]
    fn statements_on_the_servers_clock_bind_lengths() {
        let clock = StatementClock::of::<crate::PostgresStore>(idem_runtime::LeaseClock::Store);
        let statements = Statements::new::<crate::PostgresStore>("t", "t", clock);
        assert!(statements.server_clock);
        assert!(
            statements.renew.starts_with(
                "UPDATE t SET lease_until = (statement_timestamp() + $1 * INTERVAL '1 microsecond'), \
                 expires_at = GREATEST(expires_at, (statement_timestamp() + $2 * INTERVAL '1 microsecond'))"
            ),
            "{}",
            statements.renew
        );
        assert!(statements.complete.contains("completed_at = statement_timestamp()"));
        assert!(statements.get.contains(", statement_timestamp() FROM t"));
    }
}
