//! The `idempotent_record` table: its name and its columns.

use idem_runtime::StoreError;

/// The table name used when none is given.
pub const DEFAULT_TABLE: &str = "idempotent_record";

/// Every column, in the order `SELECT` lists them and rows are decoded.
pub(crate) const COLUMNS: &str = "biz_type, idempotent_key, status, fence, fingerprint, request_body, \
     response_body, error_message, lease_until, created_at, completed_at, expires_at";

/// Check `name` as an SQL identifier (optionally `schema.table`): it is spliced into
/// statements, so only letters, digits and `_` are accepted, 63 bytes at most a part.
pub(crate) fn checked_table_name(name: &str) -> Result<String, StoreError> {
    let valid_part = |part: &str| {
        !part.is_empty()
            && part.len() <= 63
            && part.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() <= 2 && parts.iter().all(|part| valid_part(part)) {
        Ok(name.to_owned())
    } else {
        Err(StoreError::new(format!(
            "invalid table name {name:?}: use letters, digits and `_` (not starting with a digit), \
             at most 63 characters, optionally as `schema.table`"
        )))
    }
}

/// Prefix for index and lock names derived from the table name.
pub(crate) fn index_prefix(table: &str) -> String {
    table.replace('.', "_")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_identifiers_and_refuses_injection() {
        assert!(checked_table_name("idempotent_record").is_ok());
        assert!(checked_table_name("billing.idem_v2").is_ok());
        for bad in ["", "1table", "t; DROP TABLE x", "a.b.c", "t-x", &"t".repeat(64)] {
            let error = checked_table_name(bad).unwrap_err();
            assert!(error.to_string().contains("invalid table name"), "{bad}");
        }
    }
}
