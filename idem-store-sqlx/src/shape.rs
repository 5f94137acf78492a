//! The shape of the table the statements rely on, checked against the catalog.
//!
//! A table created by hand (the seed article's DDL, an older migration) may have the
//! columns and still break the guarantees: an `AUTO_INCREMENT` id turns MySQL's
//! `LAST_INSERT_ID` into a refusal of every first claim; `DATETIME` without fractional
//! seconds makes a holder's own writes miss its lease; a `_ci` or `PAD SPACE` collation
//! makes `ORDER-7`, `order-7` and `ORDER-7 ` one record. Each dialect reads its catalog
//! into [`Column`]s and [`UniqueKey`]s and says what each column needs; [`check`] names
//! every mismatch at once: the table, the column, what was found and what is needed.

use idem_runtime::StoreError;

/// One column, as the dialect's catalog describes it.
#[derive(Debug, Clone)]
pub(crate) struct Column {
    pub name: String,
    /// The declared type as the catalog prints it (`datetime(6)`, `character varying(64)`).
    pub declared: String,
    /// Its collation, where the dialect has one per column.
    pub collation: Option<String>,
    pub nullable: bool,
    pub has_default: bool,
    /// MySQL's `AUTO_INCREMENT`: it would answer the claim's `LAST_INSERT_ID`.
    pub auto_increment: bool,
}

/// A unique index (or primary key) without a predicate.
#[derive(Debug, Clone)]
pub(crate) struct UniqueKey {
    pub columns: Vec<String>,
    /// The collation each column is compared with in the index, where the dialect
    /// says (SQLite); `None` where the column's own collation applies.
    pub collations: Vec<Option<String>>,
}

/// What one column must be in a dialect.
pub(crate) struct Need {
    pub column: &'static str,
    /// In words, for the error.
    pub what: &'static str,
    pub fits: fn(&Column) -> bool,
}

impl Need {
    pub const fn new(column: &'static str, what: &'static str, fits: fn(&Column) -> bool) -> Self {
        Self { column, what, fits }
    }
}

/// The columns every dialect writes, in the order `SELECT` lists them.
pub(crate) const WRITTEN: [&str; 16] = [
    "biz_type",
    "idempotent_key",
    "status",
    "fence",
    "fingerprint",
    "request_body",
    "response_body",
    "error_message",
    "lease_until",
    "created_at",
    "completed_at",
    "expires_at",
    "steps",
    "subject",
    "replay_until",
    "tombstone",
];

/// Check a table against the needs of its dialect; every problem is named in one error.
pub(crate) fn check(table: &str, columns: &[Column], keys: &[UniqueKey], needs: &[Need]) -> Result<(), StoreError> {
    if columns.is_empty() {
        return Err(StoreError::new(format!(
            "the table `{table}` does not exist; run `migrate()` to create it"
        )));
    }
    let mut problems = Vec::new();
    for need in needs {
        match columns.iter().find(|c| c.name.eq_ignore_ascii_case(need.column)) {
            None => problems.push(format!("column `{}` is missing (needed: {})", need.column, need.what)),
            Some(column) if !(need.fits)(column) => problems.push(format!(
                "column `{}` is {}, idem needs {}",
                column.name,
                found(column),
                need.what
            )),
            Some(_) => {}
        }
    }
    for column in columns {
        if column.auto_increment {
            problems.push(format!(
                "column `{}` is AUTO_INCREMENT: the claim reads LAST_INSERT_ID to learn its fence, which an \
                 auto-increment id would answer instead; drop the column (the primary key is (biz_type, \
                 idempotent_key))",
                column.name
            ));
        } else if !WRITTEN.iter().any(|w| column.name.eq_ignore_ascii_case(w))
            && !column.nullable
            && !column.has_default
        {
            problems.push(format!(
                "column `{}` is NOT NULL without a default, and idem does not write it; make it nullable or give \
                 it a default",
                column.name
            ));
        }
    }
    let is_identity = |key: &UniqueKey| {
        key.columns.len() == 2
            && ["biz_type", "idempotent_key"]
                .iter()
                .all(|name| key.columns.iter().any(|c| c.eq_ignore_ascii_case(name)))
    };
    match keys.iter().find(|key| is_identity(key)) {
        None => problems.push(
            "no primary key or unique index on exactly (biz_type, idempotent_key): the claim needs it to be \
             atomic"
                .to_owned(),
        ),
        Some(key) => {
            for (column, collation) in key.columns.iter().zip(&key.collations) {
                if let Some(collation) = collation.as_deref().filter(|c| !c.eq_ignore_ascii_case("BINARY")) {
                    problems.push(format!(
                        "the unique key compares `{column}` with the collation {collation}, idem needs BINARY \
                         (keys that differ in case or trailing spaces are different keys)"
                    ));
                }
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(StoreError::new(format!(
            "the table `{table}` does not have the shape idem needs: {}. Alter it, or let `migrate()` create \
             one under a name not yet taken (`with_table_name`)",
            problems.join("; ")
        )))
    }
}

fn found(column: &Column) -> String {
    match &column.collation {
        Some(collation) => format!("{} with collation {collation}", column.declared),
        None => column.declared.clone(),
    }
}

/// The length in `varchar(64)`, if any.
#[cfg(any(feature = "mysql", feature = "postgres"))]
pub(crate) fn length(declared: &str) -> Option<u64> {
    let open = declared.find('(')?;
    let close = declared[open..].find(')')? + open;
    declared[open + 1..close].trim().parse().ok()
}

/// A `schema.table` name split into its parts.
#[cfg(feature = "mysql")]
pub(crate) fn split_table(table: &str) -> (Option<&str>, &str) {
    match table.split_once('.') {
        Some((schema, name)) => (Some(schema), name),
        None => (None, table),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(name: &str, declared: &str) -> Column {
        Column {
            name: name.into(),
            declared: declared.into(),
            collation: None,
            nullable: true,
            has_default: false,
            auto_increment: false,
        }
    }

    const NEEDS: [Need; 1] = [Need::new("fence", "BIGINT", |c| c.declared == "bigint")];

    fn key() -> UniqueKey {
        UniqueKey {
            columns: vec!["idempotent_key".into(), "biz_type".into()],
            collations: vec![None, None],
        }
    }

    #[test]
    fn names_every_problem_with_table_column_found_and_needed() {
        let mut id = column("id", "bigint");
        id.auto_increment = true;
        let mut owner = column("owner", "text");
        owner.nullable = false;
        let error = check("t", &[column("fence", "int"), id, owner], &[], &NEEDS)
            .unwrap_err()
            .to_string();
        for part in [
            "`t`",
            "column `fence` is int, idem needs BIGINT",
            "`id` is AUTO_INCREMENT",
            "`owner` is NOT NULL without a default",
            "no primary key or unique index on exactly (biz_type, idempotent_key)",
        ] {
            assert!(error.contains(part), "{part} in {error}");
        }
        assert!(check("t", &[column("fence", "bigint")], &[key()], &NEEDS).is_ok());
        let missing = check("t", &[column("x", "text")], &[key()], &NEEDS)
            .unwrap_err()
            .to_string();
        assert!(missing.contains("column `fence` is missing"), "{missing}");
        let none = check("t", &[], &[], &NEEDS).unwrap_err().to_string();
        assert!(none.contains("does not exist"), "{none}");
    }

    #[test]
    fn the_unique_key_compares_bytes() {
        let mut nocase = key();
        nocase.collations = vec![Some("NOCASE".into()), Some("BINARY".into())];
        let error = check("t", &[column("fence", "bigint")], &[nocase], &NEEDS)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("compares `idempotent_key` with the collation NOCASE"),
            "{error}"
        );
    }

    #[cfg(feature = "mysql")]
    #[test]
    fn reads_lengths_and_schemas() {
        assert_eq!(length("varchar(64)"), Some(64));
        assert_eq!(length("text"), None);
        assert_eq!(split_table("s.t"), (Some("s"), "t"));
    }
}
