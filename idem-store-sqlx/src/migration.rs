//! The DDL of the table, as the stores' `migration_sql()` give it: statements each
//! ending with `;` at the end of a line, run one by one by `migrate()`.

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
