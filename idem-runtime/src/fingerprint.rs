//! Payload fingerprints: SHA-256 of canonical JSON.

use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// The fingerprint of `payload`: lower-case hex SHA-256 of its JSON with object keys
/// sorted at every depth, so neither field order nor serde_json's `preserve_order`
/// feature changes it.
pub fn fingerprint<P: Serialize + ?Sized>(payload: &P) -> Result<String, serde_json::Error> {
    let value = serde_json::to_value(payload)?;
    let mut hasher = Sha256::new();
    write_canonical(&value, &mut hasher);
    Ok(hasher.finalize().iter().map(|byte| format!("{byte:02x}")).collect())
}

fn write_canonical(value: &Value, hasher: &mut Sha256) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<_> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            hasher.update(b"{");
            for (i, (name, field)) in entries.into_iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                hasher.update(Value::String(name.clone()).to_string().as_bytes());
                hasher.update(b":");
                write_canonical(field, hasher);
            }
            hasher.update(b"}");
        }
        Value::Array(items) => {
            hasher.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                write_canonical(item, hasher);
            }
            hasher.update(b"]");
        }
        scalar => hasher.update(scalar.to_string().as_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn field_order_does_not_matter_but_values_do() {
        let a = fingerprint(&json!({"amount": 199, "to": {"bank": "x", "acct": 1}})).unwrap();
        let b = fingerprint(&json!({"to": {"acct": 1, "bank": "x"}, "amount": 199})).unwrap();
        let c = fingerprint(&json!({"to": {"acct": 2, "bank": "x"}, "amount": 199})).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.len(), 64);
    }
}
