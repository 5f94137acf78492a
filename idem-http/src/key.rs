//! The `Idempotency-Key` request header: one RFC 8941 sf-string (`"8e03978e-40d5"`), a
//! bare token (`8e03978e-40d5`) accepted too, at most [`MAX_KEY_BYTES`] bytes.

use http::header::GetAll;
use http::HeaderValue;
use sfv::{BareItem, Parser};

/// Longest key a client may send, in bytes, as the draft and Stripe allow.
pub const MAX_KEY_BYTES: usize = 255;

/// Why the header cannot be used as a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum KeyProblem {
    /// More than one header line carries the key.
    Repeated,
    /// Not an sf-string or a token, or parameters after it.
    Malformed(String),
    /// Longer than [`MAX_KEY_BYTES`].
    TooLong(usize),
    /// An empty string.
    Empty,
}

impl KeyProblem {
    /// What is wrong, in words, for the problem document.
    pub(crate) fn detail(&self, header: &str) -> String {
        match self {
            KeyProblem::Repeated => format!("the `{header}` header is sent more than once"),
            KeyProblem::Malformed(why) => {
                format!("the `{header}` header is not a structured-field string (\"...\") or token: {why}")
            }
            KeyProblem::TooLong(bytes) => {
                format!("the `{header}` key is {bytes} bytes long; the limit is {MAX_KEY_BYTES}")
            }
            KeyProblem::Empty => format!("the `{header}` key is empty"),
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
    let item = Parser::new(value.as_bytes())
        .parse_item()
        .map_err(|error| KeyProblem::Malformed(error.to_string()))?;
    if !item.params.is_empty() {
        return Err(KeyProblem::Malformed("parameters after the key".to_owned()));
    }
    let key = match &item.bare_item {
        BareItem::String(text) => text.as_str().to_owned(),
        BareItem::Token(token) => token.as_str().to_owned(),
        other => return Err(KeyProblem::Malformed(format!("{other:?} is neither"))),
    };
    match key.len() {
        0 => Err(KeyProblem::Empty),
        n if n > MAX_KEY_BYTES => Err(KeyProblem::TooLong(n)),
        _ => Ok(Some(key)),
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
    fn strings_and_tokens_are_keys() {
        assert_eq!(key_of(&[r#""8e03978e-40d5""#]), Ok(Some("8e03978e-40d5".into())));
        assert_eq!(key_of(&[r#""a \"quoted\" one""#]), Ok(Some(r#"a "quoted" one"#.into())));
        assert_eq!(key_of(&["order-7"]), Ok(Some("order-7".into())));
        assert_eq!(key_of(&[]), Ok(None));
        let longest = format!("\"{}\"", "k".repeat(MAX_KEY_BYTES));
        assert_eq!(key_of(&[&longest]), Ok(Some("k".repeat(MAX_KEY_BYTES))));
    }

    #[test]
    fn other_shapes_are_refused() {
        assert_eq!(key_of(&["\"a\"", "\"b\""]), Err(KeyProblem::Repeated));
        assert_eq!(key_of(&["\"\""]), Err(KeyProblem::Empty));
        let too_long = format!("\"{}\"", "k".repeat(MAX_KEY_BYTES + 1));
        assert_eq!(key_of(&[&too_long]), Err(KeyProblem::TooLong(MAX_KEY_BYTES + 1)));
        for malformed in ["\"unterminated", "42", "?1", "\"a\";p=1", "a b", ":Ymx1Yg==:"] {
            assert!(
                matches!(key_of(&[malformed]), Err(KeyProblem::Malformed(_))),
                "{malformed}"
            );
        }
    }
}
