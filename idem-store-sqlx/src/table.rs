//! The `idempotent_record` table: its name and its columns.

use idem_runtime::StoreError;

/// The table name used when none is given.
pub const DEFAULT_TABLE: &str = "idempotent_record";

#[cfg(any(feature = "sqlite", feature = "postgres", test))]
/// Every column, in the order `SELECT` lists them and rows are decoded.
pub(crate) const COLUMNS: &str = "biz_type, idempotent_key, status, fence, fingerprint, request_body, \
     response_body, error_message, lease_until, created_at, completed_at, expires_at, steps, subject, replay_until, tombstone";

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

/// `table` (or `schema.table`) quoted with the dialect's `quote` character, so that a
/// name that is a reserved word (`order`) is still a name.
pub(crate) fn quoted(table: &str, quote: char) -> String {
    let parts: Vec<String> = table.split('.').map(|part| format!("{quote}{part}{quote}")).collect();
    parts.join(".")
}

/// The name of an index or constraint of `table`, `{table}_{suffix}` (unquoted),
/// kept within the 63 bytes PostgreSQL keeps and the 64 MySQL allows: a long table name
/// is cut and a hash of the whole name added, so two long names never share it.
pub(crate) fn derived_name(table: &str, suffix: &str) -> String {
    let base = table.replace('.', "_");
    let name = format!("{base}_{suffix}");
    if name.len() <= 63 {
        return name;
    }
    // FNV-1a: a stable hash, here only to tell cut names apart.
    let hash = table
        .bytes()
        .fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    let keep = 63 - suffix.len() - 10;
    format!("{}_{hash:08x}_{suffix}", &base[..keep])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_names_fit_and_stay_apart() {
        assert_eq!(derived_name("billing.idem", "expires_at"), "billing_idem_expires_at");
        let a = derived_name(&format!("{}a", "t".repeat(62)), "expires_at");
        let b = derived_name(&format!("{}b", "t".repeat(62)), "expires_at");
        assert!(a.len() <= 63 && b.len() <= 63, "{a} {b}");
        assert_ne!(
            a, b,
            "names that agree on their first 63 bytes get different index names"
        );
        assert_eq!(quoted("order", '`'), "`order`");
        assert_eq!(quoted("s.order", '"'), "\"s\".\"order\"");
    }

    /// Rows are decoded by position: the select list and the written columns agree.
    #[cfg(any(feature = "sqlite", feature = "postgres"))]
    #[test]
    fn the_select_list_is_every_written_column_in_order() {
        assert_eq!(COLUMNS.split(", ").collect::<Vec<_>>(), crate::shape::WRITTEN);
    }

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
