//! What of a request body the fingerprint covers.
//!
//! A client that retries may serialize its JSON again — keys in another order, other
//! spacing — and mean the same request. So by default a JSON body is fingerprinted as
//! data: each leaf (a string, number, boolean, null, empty array or object) by its
//! JSON Pointer path, map keys in any order, arrays in order. A route can leave fields
//! out (a client timestamp, a trace id). When the same key comes with other data, the
//! 422 names the paths that differ (never their values). Any other body is
//! fingerprinted by its bytes.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use idem_runtime::digest::sha256_hex;

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
        let parsed = json.then(|| serde_json::from_slice::<Value>(body).ok()).flatten();
        let Some(value) = parsed else {
            return BodyPrint::Sha256(sha256_hex(body));
        };
        let mut leaves = Vec::new();
        collect(&value, &mut String::new(), ignored, &mut leaves);
        if leaves.len() > MAX_LEAVES {
            // serde_json's maps are sorted (no `preserve_order`): its text is canonical.
            let mut kept = value;
            for pointer in ignored {
                remove(&mut kept, pointer);
            }
            return BodyPrint::Json(sha256_hex(kept.to_string()));
        }
        BodyPrint::Fields(
            leaves
                .into_iter()
                .map(|(path, text)| (path, sha256_hex(text)[..16].to_owned()))
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

/// `value`'s leaves under `path`, as (JSON Pointer, canonical text), leaving out those
/// under an ignored pointer.
fn collect(value: &Value, path: &mut String, ignored: &[String], leaves: &mut Vec<(String, String)>) {
    if ignored.iter().any(|pointer| under(path, pointer)) {
        return;
    }
    let mut descend = |step: &str, child: &Value, path: &mut String| {
        let at = path.len();
        path.push('/');
        path.push_str(&step.replace('~', "~0").replace('/', "~1"));
        collect(child, path, ignored, leaves);
        path.truncate(at);
    };
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (name, child) in map {
                descend(name, child, path);
            }
        }
        Value::Array(items) if !items.is_empty() => {
            for (i, child) in items.iter().enumerate() {
                descend(&i.to_string(), child, path);
            }
        }
        leaf => leaves.push((
            if path.is_empty() { "/".to_owned() } else { path.clone() },
            leaf.to_string(),
        )),
    }
}

/// Whether `path` is `pointer` or below it.
fn under(path: &str, pointer: &str) -> bool {
    path == pointer || (path.starts_with(pointer) && path.as_bytes().get(pointer.len()) == Some(&b'/'))
}

/// Remove what `pointer` points at from `value`.
fn remove(value: &mut Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    match value.pointer_mut(parent) {
        Some(Value::Object(map)) => {
            map.remove(&last);
        }
        Some(Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>() {
                if i < items.len() {
                    items.remove(i);
                }
            }
        }
        _ => {}
    }
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
