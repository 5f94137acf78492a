//! The SQL of one table in one dialect, written once when a store is built.
//!
//! Every holder write names its lease the same way — `fence` and `created_at` of the
//! record's life, while it is `PROCESSING` — so a fenced-out holder matches no row.

/// What differs between dialects in the statements that are otherwise shared.
pub(crate) struct Flavor {
    /// `$1, $2, …` placeholders (PostgreSQL) instead of `?`.
    pub numbered: bool,
    /// The larger of two values: `GREATEST` or SQLite's scalar `MAX`.
    pub greatest: &'static str,
    /// The select list: [`COLUMNS`](crate::table::COLUMNS), or the dialect's way of reading them as text.
    pub columns: &'static str,
}

/// Statements shared by all dialects, with `?` turned into the dialect's placeholders.
/// Each placeholder appears once, in bind order, so one bind sequence fits them all.
#[derive(Debug, Clone)]
pub(crate) struct Statements {
    pub table: String,
    pub renew: String,
    pub complete: String,
    pub fail: String,
    pub release: String,
    pub get: String,
    pub stuck: String,
    pub failed: String,
    pub probe: String,
}

const HELD: &str = "biz_type = ? AND idempotent_key = ? AND fence = ? AND created_at = ? AND status = 'PROCESSING'";

impl Statements {
    pub(crate) fn new(table: &str, flavor: &Flavor) -> Self {
        let sql = |text: String| {
            if flavor.numbered {
                numbered(&text)
            } else {
                text
            }
        };
        let greatest = flavor.greatest;
        let columns = flavor.columns;
        let finish = |status: &str, column: &str| {
            sql(format!(
                "UPDATE {table} SET status = '{status}', {column} = ?, lease_until = ?, completed_at = ?, expires_at = ? \
                 WHERE {HELD}"
            ))
        };
        Self {
            table: table.to_owned(),
            renew: sql(format!(
                "UPDATE {table} SET lease_until = ?, expires_at = {greatest}(expires_at, ?) WHERE {HELD}"
            )),
            complete: finish("SUCCESS", "response_body"),
            fail: finish("FAIL", "error_message"),
            release: sql(format!("DELETE FROM {table} WHERE {HELD}")),
            get: sql(format!(
                "SELECT {columns} FROM {table} WHERE biz_type = ? AND idempotent_key = ?"
            )),
            stuck: sql(format!(
                "SELECT {columns} FROM {table} WHERE status = 'PROCESSING' AND created_at <= ? \
                 ORDER BY created_at LIMIT ?"
            )),
            failed: sql(format!(
                "SELECT {columns} FROM {table} WHERE status = 'FAIL' AND expires_at > ? ORDER BY completed_at LIMIT ?"
            )),
            probe: format!("SELECT {columns} FROM {table} WHERE 1 = 0"),
        }
    }
}

/// `?, ?` → `$1, $2`.
pub(crate) fn numbered(text: &str) -> String {
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
    use crate::table::COLUMNS;

    #[test]
    fn numbers_placeholders_for_postgres() {
        let flavor = Flavor {
            numbered: true,
            greatest: "GREATEST",
            columns: COLUMNS,
        };
        let statements = Statements::new("t", &flavor);
        assert!(statements
            .renew
            .starts_with("UPDATE t SET lease_until = $1, expires_at = GREATEST(expires_at, $2)"));
        assert!(statements.renew.ends_with("created_at = $6 AND status = 'PROCESSING'"));
    }
}
