//! The record key of a client's key scoped by its request line and its caller, as the
//! HTTP layer (`idem-http`) forms it, and as an operator forms it again to find that
//! record (`idem show --http`).

use std::fmt::Write as _;

use crate::digest::key_or_digest;

/// A caller's scope: `caller` alone, or narrowed by `tenant` (the layer's
/// `tenant_header`), length-prefixed so that no tenant and caller read two ways. `""`
/// with neither is a shared route.
pub fn caller_scope(caller: &str, tenant: Option<&str>) -> String {
    match tenant {
        None => caller.to_owned(),
        Some(tenant) => format!("{}:{tenant}{caller}", tenant.len()),
    }
}

/// The record key of the client's `key` sent as `method` to `route` by the caller
/// whose scope is `scope` ([`caller_scope`]): `POST /payments 5:alice order-7`, or, when
/// that is longer than a key may be or holds a control character, `sha256:` and its
/// hash.
///
/// ```
/// use idem_runtime::scoped_key::{caller_scope, http_record_key};
///
/// assert_eq!(http_record_key("POST", "/payments", &caller_scope("alice", None), "order-7"), "POST /payments 5:alice order-7");
/// assert_eq!(caller_scope("alice", Some("acme")), "4:acmealice");
/// ```
pub fn http_record_key(method: &str, route: &str, scope: &str, key: &str) -> String {
    // Written into a string of the right size at once: `format!` grows it several times.
    let mut readable = String::with_capacity(method.len() + route.len() + scope.len() + key.len() + 24);
    let _ = write!(readable, "{method} {route} {}:{scope} {key}", scope.len());
    key_or_digest(readable, |c| !c.is_control())
}
