//! Whose request it is: the scope that keeps one caller's keys apart from another's.
//!
//! Keys are chosen by clients, and clients choose alike (`order-7`, a key read from a
//! log, a buggy generator). Two callers who send the same key and body to the same
//! route must never share a record, or the second gets the first's response. And one
//! caller must stay one caller between a click and its retry, or the retry runs the
//! handler again: the bytes of its credentials change (an analytics cookie refreshes, a
//! CSRF cookie rotates, a bearer token is refreshed), who it is does not. So the layer
//! scopes keys by the *principal* the application has authenticated — the user its auth
//! middleware put in the request's extensions
//! ([`IdempotencyLayer::principal`](crate::IdempotencyLayer::principal)), or whatever a
//! function of the request names ([`caller`](crate::IdempotencyLayer::caller)) — and a
//! layer cannot be used before it is told which. A request the layer cannot attribute to
//! a caller is refused (401), never treated as anonymous.

use std::sync::Arc;

use http::header::COOKIE;
use http::request::Parts;
use http::HeaderName;
use sha2::{Digest, Sha256};

use idem_runtime::digest::hex;

/// The application's name for something of a request (its caller, its data subject);
/// `None` when it cannot tell.
pub(crate) type CallerFn = Arc<dyn Fn(&Parts) -> Option<String> + Send + Sync>;

/// How the layer tells callers apart.
#[derive(Clone)]
pub(crate) enum Callers {
    /// Not said yet: a layer in this state is not a `tower::Layer`, so no request meets it.
    Unnamed,
    /// By the application's principal of the request (`None` or an empty name: refused).
    Principal(CallerFn),
    /// By the value of one session cookie, hashed.
    SessionCookie(String),
    /// Not at all: every caller of these routes shares one record per key.
    Shared,
}

impl std::fmt::Debug for Callers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Callers::Unnamed => f.write_str("Unnamed"),
            Callers::Principal(_) => f.write_str("Principal(fn)"),
            Callers::SessionCookie(name) => f.debug_tuple("SessionCookie").field(name).finish(),
            Callers::Shared => f.write_str("Shared"),
        }
    }
}

/// Why a request's caller cannot be told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Unknown {
    /// The application names no principal for the request (not signed in).
    NoPrincipal,
    /// No session cookie of that name.
    NoSession(String),
}

impl Unknown {
    /// What the client should do, for the problem document.
    pub(crate) fn detail(&self) -> String {
        match self {
            Unknown::NoPrincipal => "this route keeps each caller's idempotency keys apart by who is signed in, \
                 and the request is not signed in as anyone: sign in first"
                .to_owned(),
            Unknown::NoSession(name) => format!(
                "this route keeps each caller's idempotency keys apart by the `{name}` cookie, and the request has \
                 none: sign in first"
            ),
        }
    }
}

impl Callers {
    /// The scope of `request`'s keys: `""` when shared without a tenant, else a non-empty
    /// name. `tenant_header`, when named, narrows the scope by that header's value; it
    /// never stands in for a caller.
    pub(crate) fn of(&self, request: &Parts, tenant_header: Option<&HeaderName>) -> Result<String, Unknown> {
        let caller = match self {
            Callers::Shared => String::new(),
            Callers::Principal(principal) => match principal(request) {
                Some(name) if !name.is_empty() => name,
                _ => return Err(Unknown::NoPrincipal),
            },
            Callers::SessionCookie(name) => match named_cookie(request, name) {
                // The first 16 bytes of the hash, as 32 hex digits.
                Some(value) => format!("session:{}", hex(&Sha256::digest(value)[..16])),
                None => return Err(Unknown::NoSession(name.clone())),
            },
            Callers::Unnamed => return Err(Unknown::NoPrincipal),
        };
        Ok(match tenant_header {
            None => caller,
            Some(name) => idem_runtime::scoped_key::caller_scope(&caller, Some(&tenant(request, name))),
        })
    }
}

/// The header `name`'s lines, joined (any bytes; not UTF-8 is kept as hex).
fn tenant(request: &Parts, name: &HeaderName) -> String {
    let mut joined = Vec::new();
    for (i, line) in request.headers.get_all(name).iter().enumerate() {
        if i > 0 {
            joined.push(b',');
        }
        joined.extend_from_slice(line.as_bytes());
    }
    String::from_utf8(joined).unwrap_or_else(|bytes| format!("hex:{}", hex(bytes.as_bytes())))
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
            (key == name.as_bytes() && value.len() > 1).then(|| value[1..].to_vec())
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

    #[derive(Clone)]
    struct User(&'static str);

    fn by_user() -> Callers {
        Callers::Principal(Arc::new(|request: &Parts| {
            request.extensions.get::<User>().map(|user| user.0.to_owned())
        }))
    }

    fn signed_in(user: &'static str, headers: &[(&str, &[u8])]) -> Parts {
        let mut parts = parts(headers);
        parts.extensions.insert(User(user));
        parts
    }

    #[test]
    fn a_caller_is_its_principal_whatever_its_credentials_bytes() {
        let callers = by_user();
        let click = callers
            .of(
                &signed_in(
                    "ada",
                    &[("cookie", b"session=s1; _ga=GA1.1.1"), ("authorization", b"Bearer t1")],
                ),
                None,
            )
            .unwrap();
        let retry = callers
            .of(
                &signed_in(
                    "ada",
                    &[("cookie", b"_ga=GA1.1.2; session=s2"), ("authorization", b"Bearer t2")],
                ),
                None,
            )
            .unwrap();
        assert_eq!(click, retry, "cookies and tokens that changed are the same caller");
        let bob = callers
            .of(&signed_in("bob", &[("cookie", b"session=s1")]), None)
            .unwrap();
        assert_ne!(
            click, bob,
            "the same cookie bytes signed in as another user are another caller"
        );
        assert_eq!(
            callers.of(
                &parts(&[("authorization", b"Bearer t1"), ("cookie", b"session=s1")]),
                None
            ),
            Err(Unknown::NoPrincipal),
            "credentials the application did not authenticate name nobody"
        );
    }

    #[test]
    fn a_session_cookie_alone_scopes() {
        let callers = Callers::SessionCookie("session".to_owned());
        let first = callers
            .of(&parts(&[("cookie", b"theme=dark; session=s1")]), None)
            .unwrap();
        let again = callers
            .of(&parts(&[("cookie", b"session=s1; theme=light; seen=3")]), None)
            .unwrap();
        assert_eq!(first, again, "other cookies do not change the scope");
        // Records are keyed by it: it stays what earlier versions wrote.
        assert_eq!(first, "session:e8bc163c82eee18733288c7d4ac636db");
        assert!(!first.contains("s1"), "hashed, never in clear: {first}");
        assert_ne!(first, callers.of(&parts(&[("cookie", b"session=s2")]), None).unwrap());
        assert!(callers.of(&parts(&[("cookie", b"theme=dark")]), None).is_err());
        assert!(callers.of(&parts(&[("authorization", b"Bearer x")]), None).is_err());
    }

    #[test]
    fn a_tenant_header_narrows_a_caller_and_never_stands_in_for_one() {
        let tenant = HeaderName::from_static("x-tenant");
        let callers = by_user();
        let grosse = callers
            .of(&signed_in("ada", &[("x-tenant", "größe-ag".as_bytes())]), Some(&tenant))
            .unwrap();
        let mueller = callers
            .of(
                &signed_in("ada", &[("x-tenant", "müller-gmbh".as_bytes())]),
                Some(&tenant),
            )
            .unwrap();
        assert_ne!(grosse, mueller, "non-ASCII tenants stay apart");
        assert_eq!(
            callers.of(&parts(&[("x-tenant", b"acme")]), Some(&tenant)),
            Err(Unknown::NoPrincipal),
            "two anonymous clients naming one tenant are nobody"
        );
        let shared = Callers::Shared;
        assert_ne!(
            shared.of(&parts(&[("x-tenant", b"acme")]), Some(&tenant)).unwrap(),
            shared.of(&parts(&[("x-tenant", b"globex")]), Some(&tenant)).unwrap()
        );
    }

    #[test]
    fn a_principal_that_cannot_answer_refuses() {
        let callers = Callers::Principal(Arc::new(|request: &Parts| {
            String::from_utf8(request.headers.get("x-account")?.as_bytes().to_vec()).ok()
        }));
        assert_eq!(callers.of(&parts(&[]), None), Err(Unknown::NoPrincipal));
        assert_eq!(
            callers.of(&parts(&[("x-account", b"")]), None),
            Err(Unknown::NoPrincipal),
            "an empty name names nobody"
        );
        assert_eq!(Callers::Shared.of(&parts(&[]), None), Ok(String::new()));
        assert_eq!(Callers::Unnamed.of(&parts(&[]), None), Err(Unknown::NoPrincipal));
    }
}
