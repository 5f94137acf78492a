//! The stored response, and the rule that a replay equals the first answer.
//!
//! A response is kept as JSON. Not every value survives JSON: a NaN or an infinity is
//! written as `null`; `Some(None)` of an `Option<Option<T>>` reads back as `None`; an
//! `untagged` enum may read back as another variant. So before a response is recorded
//! it is read back into its type and compared with the original through serde's data
//! model (`serde-content`, which tells `Some(None)` from `None` and compares floats
//! exactly). A value that would not replay equal is refused: the caller gets
//! `Error::Encode` and nothing is recorded as `SUCCESS`. Floats themselves round-trip
//! exactly: serde_json is built with `float_roundtrip`. The entries of a map and the
//! items of a sequence are compared in any order: a `HashMap` or a `HashSet` read back
//! iterates in an order of its own, and is still the same value.

use std::cmp::Ordering;

use serde::de::{DeserializeOwned, Error as _};
use serde::Serialize;
use serde_content::{Data, Value};

/// The JSON of `value`, once it is known to read back as the same value.
pub(crate) fn encode<T: Serialize + DeserializeOwned>(value: &T) -> Result<String, serde_json::Error> {
    let json = serde_json::to_string(value)?;
    let again: T = serde_json::from_str(&json)
        .map_err(|e| serde_json::Error::custom(format!("the response would not read back from `{json}`: {e}")))?;
    // The same calls with the same contents: equal, with no tree built. Otherwise (a
    // map read back in another order, or a value that changed) the trees tell.
    if crate::model::same(value, &again) {
        return Ok(json);
    }
    let model = |v: &T| serde_content::Serializer::new().human_readable().serialize(v);
    match (model(value), model(&again)) {
        (Ok(first), Ok(replayed)) if first == replayed => Ok(json),
        (Ok(first), Ok(replayed)) if in_one_order(first.clone()) == in_one_order(replayed.clone()) => Ok(json),
        (Ok(first), Ok(replayed)) => Err(serde_json::Error::custom(format!(
            "the response would replay as a different value: {first:?} is stored as `{json}`, \
             which reads back as {replayed:?} (NaN, infinities, `Some(None)` and some untagged \
             enums cannot be told apart in JSON)"
        ))),
        (Err(e), _) | (_, Err(e)) => Err(serde_json::Error::custom(format!(
            "the response could not be compared with its replay: {e}"
        ))),
    }
}

/// `value` with the entries of every map and the items of every sequence sorted: the
/// same for a `HashMap` or `HashSet` whatever order it iterates in. (Tuples, structs
/// and enums keep their order: it is their shape.)
fn in_one_order(value: Value<'_>) -> Value<'_> {
    match value {
        Value::Seq(items) => {
            let mut items: Vec<_> = items.into_iter().map(in_one_order).collect();
            items.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
            Value::Seq(items)
        }
        Value::Map(entries) => {
            let mut entries: Vec<_> = entries
                .into_iter()
                .map(|(key, value)| (in_one_order(key), in_one_order(value)))
                .collect();
            entries.sort_by(|a, b| a.partial_cmp(b).unwrap_or(Ordering::Equal));
            Value::Map(entries)
        }
        Value::Tuple(items) => Value::Tuple(items.into_iter().map(in_one_order).collect()),
        Value::Option(Some(inner)) => Value::Option(Some(Box::new(in_one_order(*inner)))),
        Value::Struct(mut inner) => {
            inner.data = data_in_one_order(inner.data);
            Value::Struct(inner)
        }
        Value::Enum(mut inner) => {
            inner.data = data_in_one_order(inner.data);
            Value::Enum(inner)
        }
        other => other,
    }
}

fn data_in_one_order(data: Data<'_>) -> Data<'_> {
    match data {
        Data::Unit => Data::Unit,
        Data::NewType { value } => Data::NewType {
            value: in_one_order(value),
        },
        Data::Tuple { values } => Data::Tuple {
            values: values.into_iter().map(in_one_order).collect(),
        },
        Data::Struct { fields } => Data::Struct {
            fields: fields
                .into_iter()
                .map(|(name, value)| (name, in_one_order(value)))
                .collect(),
        },
    }
}

/// What a stored answer begins with when only its digest is kept.
pub const DIGEST_PREFIX: &str = "idem:digest:sha256:";

/// What a redacted value is recorded as.
pub const REDACTED: &str = "[redacted]";

/// What of an answer (and of a kept request) is recorded: all of it, its fields at
/// some JSON pointers replaced by [`REDACTED`], or only a digest of the answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Kept {
    /// Only a digest of the answer.
    pub(crate) digest_only: bool,
    /// JSON pointers (RFC 6901) of the fields recorded as [`REDACTED`].
    pub(crate) redacted: Vec<String>,
}

impl Kept {
    /// What of `json` (an answer, or a request) is recorded: redacted where asked.
    pub(crate) fn redact(&self, json: String) -> String {
        if self.redacted.is_empty() {
            return json;
        }
        let Ok(mut value) = serde_json::from_str::<serde_json::Value>(&json) else {
            return json;
        };
        for pointer in &self.redacted {
            if let Some(field) = value.pointer_mut(pointer) {
                *field = serde_json::Value::String(REDACTED.to_owned());
            }
        }
        value.to_string()
    }

    /// What of the answer `json` is recorded: its digest, or the answer redacted.
    pub(crate) fn answer(&self, json: String) -> String {
        if !self.digest_only {
            return self.redact(json);
        }
        format!("{DIGEST_PREFIX}{}", crate::digest::sha256_hex(json))
    }
}

/// Why a pointer cannot name a field to redact.
pub(crate) fn pointer_problem(pointer: &str) -> Option<String> {
    (!pointer.starts_with('/'))
        .then(|| format!("`{pointer}` is not a JSON pointer to a field: write it as `/card/number` (RFC 6901)"))
}

/// The value of a stored response.
pub(crate) fn decode<T: DeserializeOwned>(response: Option<&str>) -> Result<T, serde_json::Error> {
    match response {
        Some(json) => serde_json::from_str(json),
        None => Err(serde_json::Error::custom("the SUCCESS record has no response_body")),
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    use super::*;

    #[test]
    fn a_kept_answer_is_redacted_or_only_digested() {
        let json = r#"{"card":{"number":"4242","brand":"visa"},"cents":199}"#.to_owned();
        let whole = Kept::default();
        assert_eq!(whole.answer(json.clone()), json);
        let redacted = Kept {
            redacted: vec!["/card/number".into(), "/absent".into()],
            ..Kept::default()
        };
        let kept: serde_json::Value = serde_json::from_str(&redacted.answer(json.clone())).unwrap();
        assert_eq!(
            kept,
            serde_json::json!({"card": {"brand": "visa", "number": "[redacted]"}, "cents": 199})
        );
        let digest = Kept {
            digest_only: true,
            ..Kept::default()
        }
        .answer(json.clone());
        assert!(digest.starts_with(DIGEST_PREFIX) && digest.len() == DIGEST_PREFIX.len() + 64);
        assert!(!digest.contains("4242"));
        assert!(pointer_problem("card").is_some() && pointer_problem("/card").is_none());
    }

    #[test]
    fn values_that_replay_equal_are_encoded() {
        assert_eq!(encode(&Some(Some(3u8))).unwrap(), "3");
        assert_eq!(encode(&0.1f64).unwrap(), "0.1");
        assert_eq!(encode(&(u128::MAX,)).unwrap(), format!("[{}]", u128::MAX));
        let x = 0.30000000000000004f64;
        let back: f64 = decode(Some(&encode(&x).unwrap())).unwrap();
        assert_eq!(back.to_bits(), x.to_bits());
    }

    #[test]
    fn maps_and_sets_in_any_iteration_order_are_encoded() {
        use std::collections::{HashMap, HashSet};
        // Each map read back iterates in its own random order.
        let balances: HashMap<String, u64> = (0..32).map(|i| (format!("acct-{i}"), i)).collect();
        let tags: HashSet<String> = (0..32).map(|i| format!("tag-{i}")).collect();
        for _ in 0..20 {
            let json = encode(&balances).expect("a HashMap answer is encoded");
            let back: HashMap<String, u64> = decode(Some(&json)).unwrap();
            assert_eq!(back, balances);
            let json = encode(&tags).expect("a HashSet answer is encoded");
            let back: HashSet<String> = decode(Some(&json)).unwrap();
            assert_eq!(back, tags);
        }
    }

    #[test]
    fn values_that_would_replay_differently_are_refused() {
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let error = encode(&bad).unwrap_err().to_string();
            assert!(error.contains("would not read back"), "{error}");
            let error = encode(&Some(bad)).unwrap_err().to_string();
            assert!(error.contains("different value"), "{error}");
        }
        let error = encode(&Some(None::<u8>)).unwrap_err().to_string();
        assert!(error.contains("different value"), "{error}");

        #[derive(Debug, Serialize, Deserialize)]
        #[serde(untagged)]
        enum Reply {
            Short { id: u32 },
            Long { id: u32, note: Option<String> },
        }
        assert!(encode(&Reply::Short { id: 1 }).is_ok());
        let error = encode(&Reply::Long { id: 1, note: None }).unwrap_err().to_string();
        assert!(error.contains("different value"), "{error}");
    }
}
