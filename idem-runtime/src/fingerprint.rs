//! Payload fingerprints: SHA-256 of a canonical encoding of the payload.
//!
//! Equal payloads must fingerprint equal, whatever order a `HashMap` iterates in and
//! however wide their integers are; different payloads must differ. So the payload is
//! taken through serde's data model (`serde-content`, which keeps 128-bit integers,
//! options, tuples and structs apart) rather than through `serde_json::Value`, and
//! encoded with: map entries and struct fields sorted by name; sequences (`Vec`,
//! slices, tuples, arrays) in order, because the order of a list is part of what it
//! says (payees by priority, the legs of a transfer); integers as exact decimals of any
//! width.
//!
//! serde cannot tell a set from a list: both are sequences. A `BTreeSet` serializes in
//! sorted order and needs nothing; a `HashSet` (or a `Vec` whose order means nothing)
//! is marked with [`Unordered`] or `#[serde(serialize_with = "idem::unordered")]`, and
//! its elements are then compared as a multiset. An unmarked `HashSet` fails closed: two
//! equal sets may fingerprint differently (a false `PayloadMismatch`), never the other
//! way round.

use std::fmt::Write as _;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_content::{Data, Number, Value};

/// The name [`Unordered`] serializes under, as a newtype struct: transparent to every
/// format (JSON writes the inner value), recognised by the fingerprint.
const UNORDERED: &str = "idem::Unordered";

/// A collection whose order means nothing to the payload fingerprint: its elements are
/// compared as a multiset, so `{a, b}` and `{b, a}` fingerprint equal. Serializes and
/// deserializes as the value it wraps.
///
/// Lists are ordered by default (reordered payees are another request); wrap a
/// `HashSet`, or a `Vec` used as a set, in `Unordered`, or mark the field with
/// `#[serde(serialize_with = "idem::unordered")]`:
///
/// ```
/// use std::collections::HashSet;
/// use idem_runtime::Unordered;
///
/// #[derive(serde::Serialize)]
/// struct Refund {
///     order: String,
///     items: Unordered<HashSet<String>>,
///     #[serde(serialize_with = "idem_runtime::unordered")]
///     tags: Vec<String>,
/// }
/// # let _ = Refund { order: "o-7".into(), items: Unordered(HashSet::new()), tags: vec![] };
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Unordered<T>(pub T);

impl<T> std::ops::Deref for Unordered<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Serialize> Serialize for Unordered<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        unordered(&self.0, serializer)
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Unordered<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        T::deserialize(deserializer).map(Unordered)
    }
}

/// Serialize `value` as [`Unordered`] does: for `#[serde(serialize_with =
/// "idem::unordered")]` on a field whose order means nothing to the fingerprint.
pub fn unordered<T: Serialize + ?Sized, S: Serializer>(value: &T, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_newtype_struct(UNORDERED, value)
}

/// The fingerprint of `payload`: lower-case hex SHA-256 of its canonical encoding (see
/// the module docs). Fails only when the payload's own `Serialize` fails.
pub(crate) fn fingerprint<P: Serialize + ?Sized>(payload: &P) -> Result<String, serde_content::Error> {
    let value = serde_content::Serializer::new().human_readable().serialize(payload)?;
    let mut text = String::new();
    canonical(&value, &mut text);
    Ok(crate::digest::sha256_hex(text))
}

fn canonical(value: &Value<'_>, out: &mut String) {
    match value {
        Value::Unit | Value::Option(None) => out.push_str("null"),
        Value::Option(Some(inner)) => canonical(inner, out),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(number) => number_text(number, out),
        Value::Char(c) => string(c.encode_utf8(&mut [0; 4]), out),
        Value::String(s) => string(s, out),
        Value::Bytes(bytes) => list(bytes.iter().map(|b| Node::Byte(*b)), out),
        Value::Seq(items) | Value::Tuple(items) => list(items.iter().map(Node::Value), out),
        Value::Map(entries) => map(entries.iter().map(|(k, v)| (encoded(k), Node::Value(v))).collect(), out),
        Value::Struct(s) if s.name == UNORDERED => match &s.data {
            Data::NewType {
                value: Value::Seq(items) | Value::Tuple(items),
            } => multiset(items, out),
            other => data(other, out),
        },
        Value::Struct(s) => data(&s.data, out),
        Value::Enum(e) => match &e.data {
            Data::Unit => string(&e.variant, out),
            other => map(vec![(quoted(&e.variant), Node::Data(other))], out),
        },
    }
}

fn data(data: &Data<'_>, out: &mut String) {
    match data {
        Data::Unit => out.push_str("null"),
        Data::NewType { value } => canonical(value, out),
        Data::Tuple { values } => list(values.iter().map(Node::Value), out),
        Data::Struct { fields } => map(
            fields.iter().map(|(name, v)| (quoted(name), Node::Value(v))).collect(),
            out,
        ),
    }
}

/// What a list or a map holds, written in place.
#[derive(Clone, Copy)]
enum Node<'a> {
    Value(&'a Value<'a>),
    Data(&'a Data<'a>),
    Byte(u8),
}

impl Node<'_> {
    fn write(self, out: &mut String) {
        match self {
            Node::Value(value) => canonical(value, out),
            Node::Data(inner) => data(inner, out),
            Node::Byte(b) => {
                let _ = write!(out, "{b}");
            }
        }
    }

    fn encoded(self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }
}

fn encoded(value: &Value<'_>) -> String {
    Node::Value(value).encoded()
}

fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    string(text, &mut out);
    out
}

fn string(text: &str, out: &mut String) {
    // serde_json's escaping: the same text always gives the same bytes. Text with
    // nothing to escape is written as it is, between quotes.
    if text.bytes().all(|b| b >= 0x20 && b != b'"' && b != b'\\') {
        out.push('"');
        out.push_str(text);
        out.push('"');
    } else {
        out.push_str(&serde_json::to_string(text).expect("a string always serializes"));
    }
}

fn number_text(number: &Number, out: &mut String) {
    let _ = match *number {
        Number::I8(n) => write!(out, "{n}"),
        Number::U8(n) => write!(out, "{n}"),
        Number::I16(n) => write!(out, "{n}"),
        Number::U16(n) => write!(out, "{n}"),
        Number::I32(n) => write!(out, "{n}"),
        Number::U32(n) => write!(out, "{n}"),
        Number::I64(n) => write!(out, "{n}"),
        Number::U64(n) => write!(out, "{n}"),
        Number::I128(n) => write!(out, "{n}"),
        Number::U128(n) => write!(out, "{n}"),
        // `{:?}` is the shortest text that reads back as the same float.
        Number::F32(n) => write!(out, "{:?}", f64::from(n)),
        Number::F64(n) => write!(out, "{n:?}"),
        _ => write!(out, "{number:?}"),
    };
}

/// `[a,b,…]`, in order.
fn list<'a>(items: impl Iterator<Item = Node<'a>>, out: &mut String) {
    out.push('[');
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(',');
        }
        item.write(out);
    }
    out.push(']');
}

/// `[a,b,…]`, the items' encodings sorted: a multiset.
fn multiset(items: &[Value<'_>], out: &mut String) {
    let mut items: Vec<String> = items.iter().map(encoded).collect();
    items.sort_unstable();
    out.push('[');
    out.push_str(&items.join(","));
    out.push(']');
}

/// `{name:value,…}`, sorted by name, and by value among equal names.
fn map(mut entries: Vec<(String, Node<'_>)>, out: &mut String) {
    entries.sort_unstable_by(|(a, x), (b, y)| a.cmp(b).then_with(|| x.encoded().cmp(&y.encoded())));
    out.push('{');
    for (i, (name, value)) in entries.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&name);
        out.push(':');
        value.write(out);
    }
    out.push('}');
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap, HashSet};

    use super::*;
    use serde_json::json;

    #[test]
    fn field_order_does_not_matter_but_values_do() {
        let a = fingerprint(&json!({"amount": 199, "to": {"bank": "x", "acct": 1}})).unwrap();
        let b = fingerprint(&json!({"to": {"acct": 1, "bank": "x"}, "amount": 199})).unwrap();
        let c = fingerprint(&json!({"to": {"acct": 2, "bank": "x"}, "amount": 199})).unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.len(), 64);
    }

    #[test]
    fn marked_sets_and_maps_fingerprint_the_same_in_any_iteration_order() {
        let items: Vec<String> = (0..64).map(|i| format!("sku-{i}")).collect();
        let reference = fingerprint(&Unordered(items.iter().cloned().collect::<HashSet<_>>())).unwrap();
        let by_id: BTreeMap<u32, &str> = (0..64).map(|i| (i, "x")).collect();
        let map_reference = fingerprint(&by_id).unwrap();
        for _ in 0..20 {
            // Each HashSet / HashMap has its own random iteration order.
            let set: HashSet<String> = items.iter().rev().cloned().collect();
            assert_eq!(fingerprint(&Unordered(set)).unwrap(), reference);
            let map: HashMap<u32, &str> = by_id.iter().map(|(k, v)| (*k, *v)).collect();
            assert_eq!(fingerprint(&map).unwrap(), map_reference);
        }
        let fewer: HashSet<String> = items[1..].iter().cloned().collect();
        assert_ne!(fingerprint(&Unordered(fewer)).unwrap(), reference);
        let reversed: Vec<String> = items.iter().rev().cloned().collect();
        assert_eq!(
            fingerprint(&Unordered(&reversed)).unwrap(),
            reference,
            "a marked Vec is a multiset"
        );
    }

    #[test]
    fn lists_keep_their_order() {
        #[derive(Serialize)]
        struct Transfer {
            legs: Vec<(&'static str, i64)>,
            payees: Vec<&'static str>,
        }
        let first = Transfer {
            legs: vec![("acct-1", -100), ("acct-2", 100)],
            payees: vec!["alice", "bob"],
        };
        let payees_reordered = Transfer {
            legs: first.legs.clone(),
            payees: vec!["bob", "alice"],
        };
        let legs_reordered = Transfer {
            legs: vec![("acct-2", 100), ("acct-1", -100)],
            payees: first.payees.clone(),
        };
        let first = fingerprint(&first).unwrap();
        assert_ne!(first, fingerprint(&payees_reordered).unwrap());
        assert_ne!(first, fingerprint(&legs_reordered).unwrap());
        assert_ne!(
            fingerprint(&vec![1, 2, 3]).unwrap(),
            fingerprint(&vec![3, 2, 1]).unwrap()
        );
    }

    #[test]
    fn a_field_marked_unordered_is_a_multiset_and_serializes_as_itself() {
        #[derive(Serialize)]
        struct Refund {
            #[serde(serialize_with = "unordered")]
            tags: Vec<&'static str>,
        }
        let a = Refund { tags: vec!["x", "y"] };
        let b = Refund { tags: vec!["y", "x"] };
        assert_eq!(fingerprint(&a).unwrap(), fingerprint(&b).unwrap());
        assert_eq!(serde_json::to_string(&a).unwrap(), r#"{"tags":["x","y"]}"#);
        let read: Unordered<Vec<u8>> = serde_json::from_str("[3,1]").unwrap();
        assert_eq!(read.0, vec![3, 1]);
        assert_eq!(serde_json::to_string(&read).unwrap(), "[3,1]");
    }

    #[test]
    fn integers_of_any_width_fingerprint_exactly() {
        let big = u128::from(u64::MAX) + 1;
        let a = fingerprint(&(big,)).unwrap();
        let b = fingerprint(&(big + 1,)).unwrap();
        assert_ne!(a, b, "values past 2^64 are told apart");
        assert_eq!(
            fingerprint(&7u8).unwrap(),
            fingerprint(&7i128).unwrap(),
            "a widened type keeps its fingerprint"
        );
        assert!(fingerprint(&i128::MIN).is_ok());
    }

    #[test]
    fn tuples_keep_their_order() {
        assert_ne!(fingerprint(&(1, 2)).unwrap(), fingerprint(&(2, 1)).unwrap());
        assert_ne!(fingerprint(&[1, 2]).unwrap(), fingerprint(&[2, 1]).unwrap());
    }

    /// A payload of every shape: strings that need escaping (quotes, backslashes,
    /// control characters, a name that sorts differently once quoted) and that do not,
    /// non-ASCII text, nested maps, numbers of every width, floats, options, enums,
    /// tuples, bytes and a multiset.
    fn every_shape() -> impl Serialize {
        #[derive(Serialize)]
        enum Kind {
            Card,
            Wire { iban: &'static str },
            Split(u8, i8),
        }
        #[derive(Serialize)]
        struct Payload {
            plain: &'static str,
            escaped: &'static str,
            #[serde(rename = "a b")]
            spaced: u8,
            a: u8,
            unicode: String,
            kinds: Vec<Kind>,
            amounts: (u128, i128, f64, f32),
            missing: Option<u8>,
            unit: (),
            character: char,
            #[serde(with = "serde_bytes_like")]
            bytes: Vec<u8>,
            tags: Unordered<Vec<&'static str>>,
            by_name: BTreeMap<String, i64>,
        }
        mod serde_bytes_like {
            pub fn serialize<S: serde::Serializer>(bytes: &[u8], serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_bytes(bytes)
            }
        }
        Payload {
            plain: "order-7",
            escaped: "a \"quoted\" \\ back\nline\ttab\u{1}\u{1f}/",
            spaced: 1,
            a: 2,
            unicode: "zürich – 東京 🚀".to_owned(),
            kinds: vec![Kind::Card, Kind::Wire { iban: "DE00" }, Kind::Split(3, -4)],
            amounts: (u128::MAX, i128::MIN, 0.1, 1.5),
            missing: None,
            unit: (),
            character: '"',
            bytes: vec![0, 255],
            tags: Unordered(vec!["y", "x"]),
            by_name: [("z".to_owned(), 1), ("\"q".to_owned(), -1)].into_iter().collect(),
        }
    }

    #[test]
    fn a_fingerprint_stored_by_an_earlier_version_still_matches() {
        // Records keep fingerprints across upgrades: a retry after a deploy must
        // fingerprint as its first try did, or it is refused as another payload.
        assert_eq!(
            fingerprint(&every_shape()).unwrap(),
            "58f156d861233580e322d4a57f14e2645f67d86d22f40ef22c48efcf0fe81700",
            "the canonical encoding changed"
        );
        assert_eq!(
            fingerprint(&json!({"amount": 199, "to": {"bank": "x\ny", "acct": [1, 2.5, null]}})).unwrap(),
            "0dbcd1190767ce8c49b7068fd2191cf1e865a70f91ebf9e3f548475b946f0fed",
            "the canonical encoding changed"
        );
    }

    #[test]
    fn strings_are_written_as_serde_json_writes_them() {
        let odd = ['\u{7f}', '\u{80}', 'ü', '\u{2028}', '東', '🚀'];
        for c in (0u8..0x80).map(char::from).chain(odd) {
            for text in [c.to_string(), format!("a{c}b"), format!("{c}{c}")] {
                let mut written = String::new();
                string(&text, &mut written);
                assert_eq!(written, serde_json::to_string(&text).unwrap(), "{text:?}");
            }
        }
    }
}
