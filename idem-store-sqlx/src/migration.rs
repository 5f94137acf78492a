//! The DDL of the table, as the stores' `migration_sql()` give it: statements each
//! ending with `;` at the end of a line, run one by one by `migrate()`.

/// A dialect's types for the table's columns.
pub(crate) struct ColumnTypes<'a> {
    pub biz: &'a str,
    pub key: &'a str,
    pub status: &'a str,
    pub fence: &'a str,
    pub fingerprint: &'a str,
    /// The request and response bodies and the steps.
    pub long_text: &'a str,
    pub error_message: &'a str,
    pub instant: &'a str,
    /// What a nullable column says of itself: nothing, or ` NULL`.
    pub nullable: &'a str,
    /// The type of `watched` (whether a waiter asked to be told of the record's end),
    /// where the dialect notifies waiters.
    pub watched: Option<&'a str>,
}

/// The table's status check, inline (SQLite) or as a named constraint (MySQL and
/// MariaDB), where it costs next to nothing. Written as comparisons joined by `OR`, not
/// as `status IN (…)`: SQLite builds a temporary index of an `IN` list of more than two
/// values again for every statement that checks it, 9–13 µs a claim and its completion. Not on
/// PostgreSQL, which builds a table's checks again for every statement that writes a
/// row, about 4 µs each (a first execution writes twice), and idem never writes another
/// status: a row of another status (written by hand) is read as an unreadable record,
/// which fails its calls.
pub(crate) const STATUS_CHECK: &str = "CHECK (status = 'PROCESSING' OR status = 'SUCCESS' OR status = 'FAIL')";

/// `CREATE TABLE IF NOT EXISTS` of the table written `table` (quoted), in the
/// dialect's `types`: the status check inline when `inline_check`, the `extra` lines
/// after the primary key, the table's `options` after it; ends with `;` and a new line.
pub(crate) fn create_table(
    table: &str,
    types: &ColumnTypes<'_>,
    inline_check: bool,
    extra: &[String],
    options: &str,
) -> String {
    let ColumnTypes {
        biz,
        key,
        status,
        fence,
        fingerprint,
        long_text,
        error_message,
        instant,
        nullable: null,
        watched,
    } = types;
    let watched = watched.map_or(String::new(), |ty| format!("  watched {ty}{null},\n"));
    let check = if inline_check {
        format!(" {STATUS_CHECK}")
    } else {
        String::new()
    };
    let extra: String = extra.iter().map(|line| format!(",\n  {line}")).collect();
    format!(
        "CREATE TABLE IF NOT EXISTS {table} (\n\
         \x20 biz_type {biz} NOT NULL,\n\
         \x20 idempotent_key {key} NOT NULL,\n\
         \x20 status {status} NOT NULL{check},\n\
         \x20 fence {fence} NOT NULL,\n\
         \x20 fingerprint {fingerprint}{null},\n\
         \x20 request_body {long_text}{null},\n\
         \x20 response_body {long_text}{null},\n\
         \x20 error_message {error_message}{null},\n\
         \x20 lease_until {instant}{null},\n\
         \x20 created_at {instant} NOT NULL,\n\
         \x20 completed_at {instant}{null},\n\
         \x20 expires_at {instant} NOT NULL,\n\
         \x20 steps {long_text}{null},\n\
         \x20 subject {fingerprint}{null},\n\
         \x20 replay_until {instant}{null},\n\
         \x20 tombstone {status}{null},\n\
         {watched}\
         \x20 PRIMARY KEY (biz_type, idempotent_key){extra}\n\
         ){options};\n"
    )
}

/// The indexes of the table written `table` where a dialect has partial indexes
/// (SQLite, PostgreSQL), named `expires_at` and `subject`: the expiry's, which purges
/// follow, and the subject's, which erasures follow. A record without a subject (most)
/// has no entry in the subject's index, so its writes do not touch it.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) fn partial_indexes(table: &str, expires_at: &str, subject: &str) -> String {
    format!(
        "CREATE INDEX IF NOT EXISTS {expires_at} ON {table} (expires_at);\n\
         CREATE INDEX IF NOT EXISTS {subject} ON {table} (subject) WHERE subject IS NOT NULL;\n"
    )
}

/// The statements of `ddl`, without their `;`.
pub(crate) fn statements(ddl: &str) -> impl Iterator<Item = &str> {
    ddl.split(";\n")
        .map(str::trim)
        .filter(|statement| !statement.is_empty())
}

#[cfg(test)]
mod tests {
    #[test]
    fn statements_are_split_at_their_ends() {
        let ddl = "CREATE TABLE t (a TEXT);\nCREATE INDEX i ON t (a);\n";
        assert_eq!(
            super::statements(ddl).collect::<Vec<_>>(),
            ["CREATE TABLE t (a TEXT)", "CREATE INDEX i ON t (a)"]
        );
    }
}
