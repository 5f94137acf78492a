//! What makes a key and a business namespace acceptable.

/// Longest key, in bytes (the `idempotent_key` column is `VARCHAR(255)`).
pub const MAX_KEY_BYTES: usize = 255;

/// Longest business namespace, in characters (the `biz_type` column is `VARCHAR(64)`).
pub const MAX_BIZ_CHARS: usize = 64;

/// Why `key` cannot be used, or `None` when it can.
pub(crate) fn key_problem(key: &str) -> Option<String> {
    if key.is_empty() {
        return Some("the key is empty".to_owned());
    }
    if key.len() > MAX_KEY_BYTES {
        return Some(format!(
            "the key is {} bytes long, the limit is {MAX_KEY_BYTES}",
            key.len()
        ));
    }
    control_char_problem(key)
}

/// Why `biz` cannot be used, or `None` when it can.
pub(crate) fn biz_problem(biz: &str) -> Option<String> {
    let chars = biz.chars().count();
    if chars == 0 {
        return Some("the biz is empty".to_owned());
    }
    if chars > MAX_BIZ_CHARS {
        return Some(format!(
            "the biz is {chars} characters long, the limit is {MAX_BIZ_CHARS}"
        ));
    }
    control_char_problem(biz)
}

/// The namespaces of form tokens begin with this: `token.<biz>` (see [`token`](crate::token)).
pub const TOKEN_NAMESPACE: &str = "token.";

/// Why an operation (not a form token) cannot use `biz`, or `None` when it can: what
/// [`biz_problem`] says, and the tokens' namespace, which operations keep out of.
pub(crate) fn operation_biz_problem(biz: &str) -> Option<String> {
    biz_problem(biz).or_else(|| {
        biz.starts_with(TOKEN_NAMESPACE).then(|| {
            format!(
                "a biz beginning with `{TOKEN_NAMESPACE}` belongs to form tokens (`idem::token`), whose records \
                 it would share; name the operation otherwise, e.g. {:?}",
                biz.trim_start_matches(TOKEN_NAMESPACE)
            )
        })
    })
}

fn control_char_problem(text: &str) -> Option<String> {
    // Printable ASCII holds no control character: the common key is checked a byte at
    // a time, with no characters decoded.
    if text.bytes().all(|byte| (b' '..=b'~').contains(&byte)) {
        return None;
    }
    text.char_indices()
        .find(|(_, c)| c.is_control())
        .map(|(at, c)| format!("control character {c:?} at byte {at}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_and_falsy_looking_keys() {
        for key in ["0", "false", "order-42", "用户:7", &"k".repeat(255)] {
            assert_eq!(key_problem(key), None, "{key}");
        }
    }

    #[test]
    fn refuses_empty_long_and_control_keys() {
        assert_eq!(key_problem("").as_deref(), Some("the key is empty"));
        assert!(key_problem(&"k".repeat(256)).unwrap().contains("256 bytes"));
        assert!(key_problem("a\nb").unwrap().contains("at byte 1"));
        // The ends of printable ASCII, and the control characters past it.
        for control in ["a\u{7f}b", "a\u{1f}b", "a\u{85}b", "a\u{9f}b"] {
            assert!(key_problem(control).unwrap().contains("at byte 1"), "{control:?}");
        }
        for printable in ["a b", "a~b", "a\u{a0}b"] {
            assert_eq!(key_problem(printable), None, "{printable:?}");
        }
        assert!(biz_problem(&"b".repeat(65)).unwrap().contains("65 characters"));
        assert!(operation_biz_problem("token.order.submit")
            .unwrap()
            .contains("form tokens"));
        assert_eq!(operation_biz_problem("tokens"), None);
    }
}
