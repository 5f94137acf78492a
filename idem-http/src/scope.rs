//! What a client's key is scoped by: the request's method and route, and the tenant the
//! application names. The same key from two tenants, or on two routes, is two requests.

use serde::Serialize;
use sha2::{Digest, Sha256};

use idem_runtime::MAX_KEY_BYTES;

/// One request's key in its scope, and the fingerprint material of its body.
///
/// Serialized, it is the payload idem fingerprints (a retry with another body is a
/// mismatch) and keeps with the record for reconciliation.
#[derive(Debug, Serialize)]
pub(crate) struct Scope {
    pub(crate) method: String,
    pub(crate) route: String,
    /// The request's path and query: `/orders/7?notify=1` under the route
    /// `/orders/{id}`. Fingerprinted, not scoped by: the same key on another order is
    /// a key reused for another request.
    pub(crate) target: String,
    pub(crate) tenant: String,
    pub(crate) key: String,
    /// SHA-256 of the body bytes, hex.
    pub(crate) body_sha256: String,
}

impl Scope {
    pub(crate) fn new(method: &str, route: &str, target: &str, tenant: String, key: String, body: &[u8]) -> Self {
        Scope {
            method: method.to_owned(),
            route: route.to_owned(),
            target: target.to_owned(),
            tenant,
            key,
            body_sha256: hex(&Sha256::digest(body)),
        }
    }

    /// The record's key: `POST /payments 4:acme order-7` (the tenant length-prefixed,
    /// so no tenant and key can be read two ways), or, when that is too long for the
    /// `idempotent_key` column or holds a control character, `sha256:` and its hash.
    pub(crate) fn record_key(&self) -> String {
        let readable = format!(
            "{} {} {}:{} {}",
            self.method,
            self.route,
            self.tenant.len(),
            self.tenant,
            self.key
        );
        if readable.len() <= MAX_KEY_BYTES && !readable.chars().any(char::is_control) {
            readable
        } else {
            format!("sha256:{}", hex(&Sha256::digest(readable.as_bytes())))
        }
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_scoped_and_unambiguous() {
        let key = |tenant: &str, key: &str| {
            Scope::new("POST", "/payments", "/payments", tenant.into(), key.into(), b"{}").record_key()
        };
        assert_eq!(key("acme", "order-7"), "POST /payments 4:acme order-7");
        assert_ne!(key("a b", "c"), key("a", "b c"));
        assert_ne!(key("acme", "k"), key("globex", "k"));
        let long = key("acme", &"k".repeat(255));
        assert!(long.starts_with("sha256:") && long.len() == 71, "{long}");
        assert!(key("line\nbreak", "k").starts_with("sha256:"));
    }
}
