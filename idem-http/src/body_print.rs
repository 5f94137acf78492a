//! What of a request body the fingerprint covers.
//!
//! A client that retries may serialize its JSON again — keys in another order, other
//! spacing — and mean the same request. So by default a JSON body is fingerprinted as
//! data: each leaf (a string, number, boolean, null, empty array or object) by its
//! JSON Pointer path and the kinds of the containers above it, map keys in any order,
//! arrays in order, numbers by their exact decimal value (`1.0` is `1`, and
//! `1.000000000000000001` is not `1.000000000000000002`: no floating point). A route can leave fields
//! out (a client timestamp, a trace id). When the same key comes with other data, the
//! 422 names the paths that differ (never their values). Any other body is
//! fingerprinted by its bytes.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::value::RawValue;

use idem_runtime::digest::{hex, sha256_hex};
use sha2::{Digest, Sha256};

/// How a request body is fingerprinted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum BodyFingerprint {
    /// A JSON body (`content-type` `application/json` or `…+json`) as data: the same
    /// JSON serialized again (keys reordered, spaces) is the same request, and a 422
    /// names the fields that differ. Any other body by its bytes. The default: clients
    /// and SDKs re-serialize on retry, and a false 422 would fail a retry that should
    /// have been answered.
    #[default]
    CanonicalJson,
    /// Every body by its bytes: one byte of difference is another request.
    Bytes,
}

/// The most leaves fingerprinted one by one; a larger document is fingerprinted whole
/// (still as data), and a 422 then cannot name the fields.
const MAX_LEAVES: usize = 256;

/// The fingerprint material of one body, kept with the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum BodyPrint {
    /// SHA-256 of the bytes.
    Sha256(String),
    /// Each leaf's path and a hash of its value.
    Fields(std::collections::BTreeMap<String, String>),
    /// SHA-256 of a document too large to keep field by field, as canonical JSON.
    Json(String),
}

impl BodyPrint {
    /// The print of `body`, sent with `content_type`, leaving out the fields under the
    /// pointers in `ignored`.
    pub(crate) fn of(body: &[u8], content_type: Option<&str>, how: BodyFingerprint, ignored: &[String]) -> Self {
        let json = how == BodyFingerprint::CanonicalJson && content_type.is_some_and(is_json);
        let parsed = json.then(|| std::str::from_utf8(body).ok()).flatten();
        let mut leaves = Vec::new();
        let collected = parsed.is_some_and(|text| {
            serde_json::from_str::<&RawValue>(text).ok().is_some_and(|value| {
                collect(value, &mut String::new(), &mut String::new(), ignored, &mut leaves).is_some()
            })
        });
        if !collected {
            return BodyPrint::Sha256(sha256_hex(body));
        }
        if leaves.len() > MAX_LEAVES {
            let mut whole = String::new();
            for (path, material) in &leaves {
                // Length-prefixed: no two lists of leaves write the same text.
                let _ = write!(whole, "{}:{path}{}:{material}", path.len(), material.len());
            }
            return BodyPrint::Json(sha256_hex(whole));
        }
        BodyPrint::Fields(
            leaves
                .into_iter()
                // The first 8 bytes of the hash, as 16 hex digits.
                .map(|(path, material)| (path, hex(&Sha256::digest(material)[..8])))
                .collect(),
        )
    }

    /// The paths whose values differ between `self` and `other` (at most `most`), when
    /// both were kept field by field.
    pub(crate) fn differing(&self, other: &BodyPrint, most: usize) -> Option<Vec<String>> {
        let (BodyPrint::Fields(a), BodyPrint::Fields(b)) = (self, other) else {
            return None;
        };
        let mut paths: Vec<String> = a
            .iter()
            .filter(|(path, hash)| b.get(*path) != Some(hash))
            .map(|(path, _)| path.clone())
            .chain(b.keys().filter(|path| !a.contains_key(*path)).cloned())
            .collect();
        paths.sort();
        paths.dedup();
        paths.truncate(most);
        Some(paths)
    }
}

fn is_json(content_type: &str) -> bool {
    let essence = content_type.split(';').next().unwrap_or("").trim().to_ascii_lowercase();
    essence == "application/json" || essence.ends_with("+json")
}

/// `value`'s leaves under `path`, as (JSON Pointer, what is hashed), leaving out those
/// under an ignored pointer. What is hashed is the kinds of the containers on the way
/// (`{` an object, `[` an array: `{"legs":[1]}` is not `{"legs":{"0":1}}`) and the
/// leaf's canonical text: a string by its value (escapes decoded), a number by its
/// exact decimal value (never through floating point), `true`, `false`, `null`, `[]`,
/// `{}`. `None` when a part is not JSON after all.
fn collect(
    value: &RawValue,
    path: &mut String,
    shape: &mut String,
    ignored: &[String],
    leaves: &mut Vec<(String, String)>,
) -> Option<()> {
    if ignored.iter().any(|pointer| under(path, pointer)) {
        return Some(());
    }
    let text = value.get().trim_ascii();
    let mut descend = |kind: char, step: &str, child: &RawValue, path: &mut String, shape: &mut String| {
        let (at, kinds) = (path.len(), shape.len());
        path.push('/');
        if step.contains(['~', '/']) {
            path.push_str(&step.replace('~', "~0").replace('/', "~1"));
        } else {
            path.push_str(step);
        }
        shape.push(kind);
        let collected = collect(child, path, shape, ignored, leaves);
        path.truncate(at);
        shape.truncate(kinds);
        collected
    };
    let leaf = match text.as_bytes().first()? {
        b'{' => {
            // Sorted by name; a name given twice keeps its last value, as parsers do.
            let map: BTreeMap<String, &RawValue> = serde_json::from_str(text).ok()?;
            if !map.is_empty() {
                for (name, child) in map {
                    descend('{', &name, child, path, shape)?;
                }
                return Some(());
            }
            "{}".to_owned()
        }
        b'[' => {
            let items: Vec<&RawValue> = serde_json::from_str(text).ok()?;
            if !items.is_empty() {
                for (i, child) in items.into_iter().enumerate() {
                    descend('[', &i.to_string(), child, path, shape)?;
                }
                return Some(());
            }
            "[]".to_owned()
        }
        b'"' => serde_json::to_string(&serde_json::from_str::<String>(text).ok()?).ok()?,
        b't' | b'f' | b'n' => text.to_owned(),
        _ => number(text)?,
    };
    let mut material = String::with_capacity(shape.len() + 1 + leaf.len());
    material.push_str(shape);
    material.push('|');
    material.push_str(&leaf);
    leaves.push((if path.is_empty() { "/".to_owned() } else { path.clone() }, material));
    Some(())
}

/// A JSON number's exact value as text, the same for every way of writing it (`1`,
/// `1.0`, `10e-1`, `0.1E1`; `-0` and `0`): its significant digits and the power of ten
/// after them, `d…de±n`, worked out on the digits, never through floating point.
fn number(text: &str) -> Option<String> {
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(at) => (&unsigned[..at], &unsigned[at + 1..]),
        None => (unsigned, "0"),
    };
    let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits: String = [whole, fraction].concat();
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let significant = digits.trim_start_matches('0');
    let trimmed = significant.trim_end_matches('0');
    if trimmed.is_empty() {
        return Some("0".to_owned());
    }
    // Exponents past i128 are kept as written (and so compare by their text).
    let power = exponent
        .strip_prefix('+')
        .unwrap_or(exponent)
        .parse::<i128>()
        .ok()
        .and_then(|power| power.checked_sub(fraction.len() as i128))
        .and_then(|power| power.checked_add((significant.len() - trimmed.len()) as i128));
    let sign = if negative { "-" } else { "" };
    Some(match power {
        Some(power) => format!("{sign}{trimmed}e{power}"),
        None => format!(
            "{sign}{trimmed}e{exponent}-{}+{}",
            fraction.len(),
            significant.len() - trimmed.len()
        ),
    })
}

/// Whether `path` is `pointer` or below it.
fn under(path: &str, pointer: &str) -> bool {
    path == pointer || (path.starts_with(pointer) && path.as_bytes().get(pointer.len()) == Some(&b'/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn print(body: &str, ignored: &[&str]) -> BodyPrint {
        let ignored: Vec<String> = ignored.iter().map(|p| (*p).to_owned()).collect();
        BodyPrint::of(
            body.as_bytes(),
            Some("application/json"),
            BodyFingerprint::CanonicalJson,
            &ignored,
        )
    }

    #[test]
    fn the_same_json_serialized_again_is_the_same_request() {
        let first = print(r#"{"user":"ada","cents":1990,"items":[1,2]}"#, &[]);
        let again = print("{ \"items\": [1, 2],\n  \"cents\": 1990, \"user\": \"ada\" }", &[]);
        assert_eq!(first, again);
        let reordered_list = print(r#"{"user":"ada","cents":1990,"items":[2,1]}"#, &[]);
        assert_ne!(first, reordered_list, "arrays keep their order");
    }

    #[test]
    fn differing_fields_are_named_and_ignored_ones_are_not_compared() {
        let first = print(
            r#"{"user":"ada","cents":1990,"meta":{"sent_at":1,"trace":"a"}}"#,
            &["/meta/sent_at"],
        );
        let retry = print(
            r#"{"user":"ada","cents":1990,"meta":{"sent_at":2,"trace":"a"}}"#,
            &["/meta/sent_at"],
        );
        assert_eq!(first, retry, "an ignored field may change");
        let other = print(
            r#"{"user":"bob","cents":2000,"meta":{"sent_at":2,"trace":"a"}}"#,
            &["/meta/sent_at"],
        );
        assert_eq!(
            first.differing(&other, 10),
            Some(vec!["/cents".to_owned(), "/user".to_owned()])
        );
        let added = print(
            r#"{"user":"ada","cents":1990,"meta":{"trace":"a"},"coupon":"x"}"#,
            &["/meta/sent_at"],
        );
        assert_eq!(first.differing(&added, 10), Some(vec!["/coupon".to_owned()]));
    }

    #[test]
    fn other_bodies_and_the_bytes_option_fingerprint_bytes() {
        let form = BodyPrint::of(
            b"a=1&b=2",
            Some("application/x-www-form-urlencoded"),
            BodyFingerprint::default(),
            &[],
        );
        assert!(matches!(form, BodyPrint::Sha256(_)));
        let a = BodyPrint::of(
            br#"{"a":1,"b":2}"#,
            Some("application/json"),
            BodyFingerprint::Bytes,
            &[],
        );
        let b = BodyPrint::of(
            br#"{"b":2,"a":1}"#,
            Some("application/json"),
            BodyFingerprint::Bytes,
            &[],
        );
        assert_ne!(a, b);
        let broken = BodyPrint::of(b"{not json", Some("application/json"), BodyFingerprint::default(), &[]);
        assert!(matches!(broken, BodyPrint::Sha256(_)));
    }

    /// A record keeps its body's print, and a retry's print is compared with it: the
    /// print of a body must stay what earlier versions wrote.
    #[test]
    fn a_print_kept_by_an_earlier_version_still_matches() {
        let kept = |leaves: &[(&str, &str)]| {
            let leaves = leaves
                .iter()
                .map(|(path, hash)| ((*path).to_owned(), (*hash).to_owned()));
            BodyPrint::Fields(leaves.collect())
        };
        assert_eq!(
            print(r#"{"a/b":{"~x":[1]},"c":"x"}"#, &[]),
            kept(&[("/a~1b/~0x/0", "1d78707e1fd341fa"), ("/c", "47b416c7f8a7ccdd")])
        );
    }

    #[test]
    fn numbers_are_their_exact_value() {
        for (a, b) in [
            ("1.000000000000000001", "1.000000000000000002"),
            ("18446744073709551616", "18446744073709551617"),
            ("123456789012345678901234567890", "123456789012345678901234567891"),
            ("1e400", "1e401"),
            ("0.1", "0.10000000000000001"),
            ("1", "-1"),
        ] {
            let first = print(&format!(r#"{{"cents":{a}}}"#), &[]);
            let other = print(&format!(r#"{{"cents":{b}}}"#), &[]);
            assert_ne!(first, other, "{a} and {b} are two amounts");
            assert_eq!(first.differing(&other, 10), Some(vec!["/cents".to_owned()]));
        }
        for (a, b) in [
            ("1", "1.0"),
            ("100", "1e2"),
            ("0.5", "5E-1"),
            ("-0", "0"),
            ("12.340", "1234e-2"),
            ("0", "0.000e5"),
        ] {
            assert_eq!(
                print(&format!("[{a}]"), &[]),
                print(&format!("[{b}]"), &[]),
                "{a} and {b} are one number written two ways"
            );
        }
        assert_eq!(
            number("1e99999999999999999999999999999999999999999"),
            number("1e99999999999999999999999999999999999999999")
        );
        assert_ne!(
            number("1e99999999999999999999999999999999999999999"),
            number("1e99999999999999999999999999999999999999998")
        );
    }

    #[test]
    fn arrays_are_not_objects_and_strings_are_not_numbers() {
        let array = print(r#"{"legs":[{"to":"a"},{"to":"b"}]}"#, &[]);
        let object = print(r#"{"legs":{"0":{"to":"a"},"1":{"to":"b"}}}"#, &[]);
        assert_ne!(array, object);
        assert_eq!(
            array.differing(&object, 10),
            Some(vec!["/legs/0/to".to_owned(), "/legs/1/to".to_owned()])
        );
        assert_ne!(print(r#"{"a":"1"}"#, &[]), print(r#"{"a":1}"#, &[]));
        assert_ne!(print(r#"{"a":[]}"#, &[]), print(r#"{"a":{}}"#, &[]));
        assert_eq!(
            print(r#"{"a":"\u0041"}"#, &[]),
            print(r#"{"a":"A"}"#, &[]),
            "escapes are decoded"
        );
        let big = |legs: &str| {
            print(
                &format!(r#"{{"items":[{}],"legs":{legs}}}"#, vec!["1"; 300].join(",")),
                &[],
            )
        };
        assert_ne!(
            big(r#"[1]"#),
            big(r#"{"0":1}"#),
            "whole documents tell containers apart too"
        );
        let cents = |value: &str| {
            print(
                &format!(r#"{{"items":[{}],"cents":{value}}}"#, vec!["1"; 300].join(",")),
                &[],
            )
        };
        assert_ne!(cents("1.000000000000000001"), cents("1.000000000000000002"));
    }

    #[test]
    fn large_documents_are_fingerprinted_whole() {
        let items: Vec<u32> = (0..1000).collect();
        let body = serde_json::json!({"items": items, "at": 1}).to_string();
        let again = serde_json::json!({"at": 2, "items": items}).to_string();
        let a = print(&body, &["/at"]);
        assert!(matches!(a, BodyPrint::Json(_)));
        assert_eq!(a, print(&again, &["/at"]));
        assert_eq!(a.differing(&print(&again, &["/at"]), 10), None);
    }
}
