//! Whose request it is: the scope that keeps one caller's keys apart from another's.
//!
//! Keys are chosen by clients, and clients choose alike (`order-7`, a key read from a
//! log, a buggy generator). Two callers who send the same key and body to the same
//! route must never share a record, or the second gets the first's response. So by
//! default the layer scopes keys by the credentials the request carries — its
//! `Authorization` header, else its `Cookie` header — hashed (never stored in clear),
//! and refuses a request that carries neither. An application that knows its callers
//! better names them ([`IdempotencyLayer::tenant`](crate::IdempotencyLayer::tenant), or
//! [`tenant_cookie`](crate::IdempotencyLayer::tenant_cookie) for one session cookie); a
//! route meant to be shared by every caller says so
//! ([`shared`](crate::IdempotencyLayer::shared)).

use std::sync::Arc;

use http::header::{AUTHORIZATION, COOKIE};
use http::request::Parts;
use sha2::{Digest, Sha256};

use idem_runtime::digest::hex;

/// The application's tenant of a request; `None` when it cannot tell.
pub(crate) type TenantFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// How the layer tells callers apart.
#[derive(Clone)]
pub(crate) enum Callers {
    /// By the request's credentials — `Authorization`, else `Cookie` (or only the named
    /// cookie) — and the tenant header, when one is named, all hashed together.
    Credentials {
        cookie: Option<String>,
        tenant_header: Option<http::HeaderName>,
    },
    /// By the application's tenant function (`None` or an empty name: refused).
    Tenant(TenantFn),
    /// Not at all: every caller of these routes shares one record per key.
    Shared,
}

impl Default for Callers {
    fn default() -> Self {
        Callers::Credentials {
            cookie: None,
            tenant_header: None,
        }
    }
}

impl std::fmt::Debug for Callers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Callers::Credentials { cookie, tenant_header } => f
                .debug_struct("Credentials")
                .field("cookie", cookie)
                .field("tenant_header", tenant_header)
                .finish(),
            Callers::Tenant(_) => f.write_str("Tenant(fn)"),
            Callers::Shared => f.write_str("Shared"),
        }
    }
}

/// Why a request's caller cannot be told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unknown {
    /// No `Authorization` header and no cookie (or not the named one).
    NoCredentials { cookie: Option<String> },
    /// The tenant function answered `None`.
    NoTenant,
}

impl Unknown {
    /// What the client should do, for the problem document.
    pub(crate) fn detail(&self) -> String {
        match self {
            Unknown::NoCredentials { cookie: None } => "this route keeps each caller's idempotency keys apart by the \
                 request's credentials, and the request has none: send an `Authorization` header or a session cookie"
                .to_owned(),
            Unknown::NoCredentials { cookie: Some(name) } => format!(
                "this route keeps each caller's idempotency keys apart by the `{name}` cookie, and the request has \
                 none: sign in first"
            ),
            Unknown::NoTenant => "this route keeps each caller's idempotency keys apart by its tenant, and the \
                 request names none it can use"
                .to_owned(),
        }
    }
}

impl Callers {
    /// The scope of `request`'s keys: `""` when shared, else a non-empty name.
    pub(crate) fn of(&self, request: &Parts) -> Result<String, Unknown> {
        match self {
            Callers::Shared => Ok(String::new()),
            // One layer scopes one way, so a tenant's name needs no prefix to stay apart
            // from credentials' hashes; an empty name names nobody.
            Callers::Tenant(tenant) => match tenant(request) {
                Some(tenant) if !tenant.is_empty() => Ok(tenant),
                _ => Err(Unknown::NoTenant),
            },
            Callers::Credentials { cookie, tenant_header } => {
                let credential = match cookie {
                    None => joined(request, AUTHORIZATION.as_str()).or_else(|| joined(request, COOKIE.as_str())),
                    Some(name) => named_cookie(request, name),
                };
                let tenant = tenant_header.as_ref().and_then(|name| joined(request, name.as_str()));
                if credential.is_none() && tenant.is_none() {
                    return Err(Unknown::NoCredentials { cookie: cookie.clone() });
                }
                let mut hash = Sha256::new();
                for part in [tenant, credential] {
                    // Length-prefixed: no two pairs hash alike.
                    let part = part.unwrap_or_default();
                    hash.update((part.len() as u64).to_be_bytes());
                    hash.update(part);
                }
                Ok(format!("caller:{}", &hex(&hash.finalize())[..32]))
            }
        }
    }
}

/// Every line of the header `name`, with the header's name in front (so a cookie and an
/// `Authorization` value of the same bytes are two callers).
fn joined(request: &Parts, name: &str) -> Option<Vec<u8>> {
    let mut lines = request.headers.get_all(name).iter().peekable();
    lines.peek()?;
    let mut credential = format!("{name}\n").into_bytes();
    for line in lines {
        credential.extend_from_slice(line.as_bytes());
        credential.push(b'\n');
    }
    Some(credential)
}

/// The value of the cookie `name`, from every `Cookie` line.
fn named_cookie(request: &Parts, name: &str) -> Option<Vec<u8>> {
    request
        .headers
        .get_all(COOKIE)
        .iter()
        .flat_map(|line| line.as_bytes().split(|&b| b == b';'))
        .map(|pair| pair.trim_ascii())
        .find_map(|pair| {
            let (key, value) = pair.split_at(pair.iter().position(|&b| b == b'=')?);
            (key == name.as_bytes() && value.len() > 1).then(|| [b"cookie\n".as_slice(), &value[1..]].concat())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(headers: &[(&str, &[u8])]) -> Parts {
        let mut request = http::Request::builder();
        for (name, value) in headers {
            request = request.header(*name, http::HeaderValue::from_bytes(value).unwrap());
        }
        request.body(()).unwrap().into_parts().0
    }

    #[test]
    fn callers_are_told_apart_by_their_credentials() {
        let callers = Callers::default();
        let alice = callers.of(&parts(&[("authorization", b"Bearer alice")])).unwrap();
        let bob = callers.of(&parts(&[("authorization", b"Bearer bob")])).unwrap();
        assert_ne!(alice, bob);
        assert!(!alice.contains("alice"), "hashed, never in clear: {alice}");
        assert_eq!(
            alice,
            callers.of(&parts(&[("authorization", b"Bearer alice")])).unwrap()
        );
        let session = callers.of(&parts(&[("cookie", b"session=s1")])).unwrap();
        assert_ne!(session, callers.of(&parts(&[("cookie", b"session=s2")])).unwrap());
        assert_eq!(
            callers.of(&parts(&[])),
            Err(Unknown::NoCredentials { cookie: None }),
            "no credentials: refused, never anonymous"
        );
    }

    #[test]
    fn a_named_cookie_alone_scopes() {
        let callers = Callers::Credentials {
            cookie: Some("session".to_owned()),
            tenant_header: None,
        };
        let first = callers.of(&parts(&[("cookie", b"theme=dark; session=s1")])).unwrap();
        let again = callers
            .of(&parts(&[("cookie", b"session=s1; theme=light; seen=3")]))
            .unwrap();
        assert_eq!(first, again, "other cookies do not change the scope");
        assert!(callers.of(&parts(&[("cookie", b"theme=dark")])).is_err());
        assert!(callers.of(&parts(&[("authorization", b"Bearer x")])).is_err());
    }

    #[test]
    fn a_tenant_header_scopes_with_the_credentials() {
        let callers = Callers::Credentials {
            cookie: None,
            tenant_header: Some(http::HeaderName::from_static("x-tenant")),
        };
        let grosse = callers.of(&parts(&[("x-tenant", "größe-ag".as_bytes())])).unwrap();
        let mueller = callers.of(&parts(&[("x-tenant", "müller-gmbh".as_bytes())])).unwrap();
        assert_ne!(grosse, mueller, "non-ASCII tenants stay apart");
        let with_token = callers
            .of(&parts(&[
                ("x-tenant", "größe-ag".as_bytes()),
                ("authorization", b"Bearer a"),
            ]))
            .unwrap();
        assert_ne!(grosse, with_token);
        let other_token = callers
            .of(&parts(&[
                ("x-tenant", "größe-ag".as_bytes()),
                ("authorization", b"Bearer b"),
            ]))
            .unwrap();
        assert_ne!(with_token, other_token);
        assert!(callers.of(&parts(&[])).is_err(), "neither: refused");
    }

    #[test]
    fn a_tenant_function_that_cannot_answer_refuses() {
        let callers = Callers::Tenant(Arc::new(|request: &Parts| {
            String::from_utf8(request.headers.get("x-tenant")?.as_bytes().to_vec()).ok()
        }));
        let grosse = callers.of(&parts(&[("x-tenant", "größe-ag".as_bytes())])).unwrap();
        let mueller = callers.of(&parts(&[("x-tenant", "müller-gmbh".as_bytes())])).unwrap();
        assert_ne!(grosse, mueller, "non-ASCII tenants stay apart");
        assert_eq!(callers.of(&parts(&[])), Err(Unknown::NoTenant));
        assert_eq!(
            callers.of(&parts(&[("x-tenant", b"")])),
            Err(Unknown::NoTenant),
            "an empty name names nobody"
        );
        assert_eq!(Callers::Shared.of(&parts(&[])), Ok(String::new()));
    }
}
