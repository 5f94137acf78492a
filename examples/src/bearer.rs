//! The examples' stand-in for an application's token verification: a bearer token
//! `SUBJECT.SERIAL` names its subject (`ada.1` and `ada.2`, a refreshed token, are both
//! ada). A real service verifies the token's signature and reads its `sub` claim; what
//! the idempotency layer is then told is that subject, never the token's bytes.

/// The subject of the request's bearer token, when it has one.
pub fn subject(headers: &http::HeaderMap) -> Option<String> {
    let token = headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")?;
    let subject = token.split('.').next()?;
    (!subject.is_empty()).then(|| subject.to_owned())
}
