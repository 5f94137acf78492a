//! What a client's key is scoped by: the request's method and route, and its caller
//! (see `caller.rs`). The same key from two callers, or on two routes, is two requests.

use serde::{Deserialize, Serialize};

use crate::body_print::BodyPrint;

/// One request's key in its scope, and the fingerprint material of its body.
///
/// Serialized, it is the payload idem fingerprints (a retry with another body is a
/// mismatch) and keeps with the record for reconciliation.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Scope {
    pub(crate) method: String,
    pub(crate) route: String,
    /// The request's path and query: `/orders/7?notify=1` under the route
    /// `/orders/{id}`. Fingerprinted, not scoped by: the same key on another order is
    /// a key reused for another request.
    pub(crate) target: String,
    /// The caller's scope: `caller:<hash of its credentials>`, the tenant's name, or
    /// empty on a shared route.
    pub(crate) tenant: String,
    pub(crate) key: String,
    /// What of the body the fingerprint covers.
    pub(crate) body: BodyPrint,
}

impl Scope {
    pub(crate) fn new(method: &str, route: &str, target: &str, tenant: String, key: String, body: BodyPrint) -> Self {
        Scope {
            method: method.to_owned(),
            route: route.to_owned(),
            target: target.to_owned(),
            tenant,
            key,
            body,
        }
    }

    /// What differs between this request and `first`, the one the key was first used
    /// for, in words for the client: the request line, or the body's field paths (never
    /// their values).
    pub(crate) fn differences(&self, first: &Scope) -> String {
        if self.method != first.method || self.target != first.target {
            return "its method, path or query differs".to_owned();
        }
        match first.body.differing(&self.body, 10) {
            Some(paths) if !paths.is_empty() => format!("the body fields {} differ", paths.join(", ")),
            _ => "its body differs".to_owned(),
        }
    }

    /// The record's key: `POST /payments 4:acme order-7` (the tenant length-prefixed,
    /// so no tenant and key can be read two ways), or, when that is too long for the
    /// `idempotent_key` column or holds a control character, `sha256:` and its hash.
    pub(crate) fn record_key(&self) -> String {
        idem_runtime::scoped_key::http_record_key(&self.method, &self.route, &self.tenant, &self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_scoped_and_unambiguous() {
        let key = |tenant: &str, key: &str| {
            let body = BodyPrint::Sha256(String::new());
            Scope::new("POST", "/payments", "/payments", tenant.into(), key.into(), body).record_key()
        };
        assert_eq!(key("acme", "order-7"), "POST /payments 4:acme order-7");
        assert_ne!(key("a b", "c"), key("a", "b c"));
        assert_ne!(key("acme", "k"), key("globex", "k"));
        let long = key("acme", &"k".repeat(255));
        assert!(long.starts_with("sha256:") && long.len() == 71, "{long}");
        assert!(key("line\nbreak", "k").starts_with("sha256:"));
    }
}
