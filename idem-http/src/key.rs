//! The `Idempotency-Key` request header, as real clients send it: the draft's RFC 8941
//! sf-string (`"8e03978e-40d5"`), or the bare value Stripe's SDKs and browsers send
//! (`8e03978e-40d5-…`, a UUID that may start with a digit): printable ASCII without
//! spaces, quotes, commas or semicolons. At most [`MAX_KEY_BYTES`] bytes.

use http::header::GetAll;
use http::HeaderValue;
use sfv::{BareItem, Parser};

/// Longest key a client may send, in bytes, as the draft and Stripe allow.
pub use idem_runtime::MAX_KEY_BYTES;

/// Why the header cannot be used as a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyProblem {
    /// More than one header line carries the key.
    Repeated,
    /// A quoted value that is not one sf-string.
    Malformed(String),
    /// A bare value with a character a key cannot hold.
    Unusable(char),
    /// Longer than [`MAX_KEY_BYTES`].
    TooLong(usize),
    /// An empty string.
    Empty,
}

impl KeyProblem {
    /// What is wrong, in words, and what to send instead, for the problem document.
    pub(crate) fn detail(&self, header: &str) -> String {
        let send = format!(
            "send one key per request as a bare value of printable ASCII without spaces, such as a UUID \
             (`{header}: 8e03978e-40d5-43e8-bc93-6894a57f9324`), or as a quoted string (`{header}: \"order-7\"`)"
        );
        match self {
            KeyProblem::Repeated => format!("the `{header}` header is sent more than once: {send}"),
            KeyProblem::Malformed(why) => format!("the quoted `{header}` is not a string ({why}): {send}"),
            KeyProblem::Unusable(c) => format!("the `{header}` key holds {c:?}, which a key cannot: {send}"),
            KeyProblem::TooLong(bytes) => {
                format!("the `{header}` key is {bytes} bytes long; the limit is {MAX_KEY_BYTES}: {send}")
            }
            KeyProblem::Empty => format!("the `{header}` key is empty: {send}"),
        }
    }
}

/// The key in the header's lines: `Ok(None)` when there is none.
pub(crate) fn parse(lines: GetAll<'_, HeaderValue>) -> Result<Option<String>, KeyProblem> {
    let mut values = lines.iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyProblem::Repeated);
    }
    let bytes = value.as_bytes();
    let key = if bytes.first() == Some(&b'"') {
        quoted(bytes)?
    } else {
        bare(bytes)?
    };
    match key.len() {
        0 => Err(KeyProblem::Empty),
        n if n > MAX_KEY_BYTES => Err(KeyProblem::TooLong(n)),
        _ => Ok(Some(key)),
    }
}

/// The draft's form: one RFC 8941 sf-string, no parameters.
fn quoted(bytes: &[u8]) -> Result<String, KeyProblem> {
    let item = Parser::new(bytes)
        .parse_item()
        .map_err(|error| KeyProblem::Malformed(error.to_string()))?;
    if !item.params.is_empty() {
        return Err(KeyProblem::Malformed("parameters after the key".to_owned()));
    }
    match &item.bare_item {
        BareItem::String(text) => Ok(text.as_str().to_owned()),
        other => Err(KeyProblem::Malformed(format!("{other:?} is not a string"))),
    }
}

/// A bare value: printable ASCII, no space, quote, comma or semicolon (which would make
/// it a list or parameters to a structured-field parser, and ambiguous to a proxy).
fn bare(bytes: &[u8]) -> Result<String, KeyProblem> {
    let text = String::from_utf8_lossy(bytes);
    match text
        .chars()
        .find(|&c| !c.is_ascii_graphic() || matches!(c, '"' | ',' | ';' | '\\'))
    {
        Some(c) => Err(KeyProblem::Unusable(c)),
        None => Ok(text.into_owned()),
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;

    use super::*;

    fn key_of(lines: &[&str]) -> Result<Option<String>, KeyProblem> {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append("idempotency-key", HeaderValue::from_str(line).unwrap());
        }
        parse(headers.get_all("idempotency-key"))
    }

    #[test]
    fn quoted_strings_and_bare_values_are_keys() {
        assert_eq!(key_of(&[r#""8e03978e-40d5""#]), Ok(Some("8e03978e-40d5".into())));
        assert_eq!(key_of(&[r#""a \"quoted\" one""#]), Ok(Some(r#"a "quoted" one"#.into())));
        assert_eq!(key_of(&["order-7"]), Ok(Some("order-7".into())));
        assert_eq!(key_of(&[]), Ok(None));
        let longest = format!("\"{}\"", "k".repeat(MAX_KEY_BYTES));
        assert_eq!(key_of(&[&longest]), Ok(Some("k".repeat(MAX_KEY_BYTES))));
        // Bare UUIDs, whatever their first character (a digit is not an sf-token's).
        for uuid in [
            "0f8fad5b-d9cb-469f-a165-70867728950e",
            "7c9e6679-7425-40de-944b-e07fc1f90ae7",
            "e02fd0e4-00fd-090a-ca30-0d00a0038ba0",
        ] {
            assert_eq!(key_of(&[uuid]), Ok(Some(uuid.to_owned())), "{uuid}");
        }
        for other in ["42", "?1", ":Ymx1Yg==:", "a/b+c=d", "K3y_With.Dots~"] {
            assert_eq!(key_of(&[other]), Ok(Some(other.to_owned())), "{other}");
        }
    }

    #[test]
    fn other_shapes_are_refused() {
        assert_eq!(key_of(&["\"a\"", "\"b\""]), Err(KeyProblem::Repeated));
        assert_eq!(key_of(&["\"\""]), Err(KeyProblem::Empty));
        let too_long = format!("\"{}\"", "k".repeat(MAX_KEY_BYTES + 1));
        assert_eq!(key_of(&[&too_long]), Err(KeyProblem::TooLong(MAX_KEY_BYTES + 1)));
        assert_eq!(
            key_of(&[&"k".repeat(MAX_KEY_BYTES + 1)]),
            Err(KeyProblem::TooLong(MAX_KEY_BYTES + 1))
        );
        for malformed in ["\"unterminated", "\"a\";p=1"] {
            assert!(
                matches!(key_of(&[malformed]), Err(KeyProblem::Malformed(_))),
                "{malformed}"
            );
        }
        for unusable in ["a b", "a,b", "a;p=1"] {
            assert!(
                matches!(key_of(&[unusable]), Err(KeyProblem::Unusable(_))),
                "{unusable}"
            );
        }
    }
}
