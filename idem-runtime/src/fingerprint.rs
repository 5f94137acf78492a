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
pub(crate) fn fingerprint<P: Serialize + ?Sized>(payload: &P) -> Result<String, EncodeError> {
    let mut top = Held::new();
    payload.serialize(Canonical::new(&mut top.text))?;
    Ok(crate::digest::sha256_hex(&top.text))
}

/// Why a payload could not be encoded: its own `Serialize` failed.
#[derive(Debug)]
pub(crate) struct EncodeError(String);

impl std::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EncodeError {}

impl serde::ser::Error for EncodeError {
    fn custom<T: std::fmt::Display>(message: T) -> Self {
        EncodeError(message.to_string())
    }
}

/// The canonical encoding, written as serde walks the value: no tree of the value is
/// built. Only what must be sorted is held apart — each map entry and struct field
/// encoded on its own, and the items of an [`Unordered`] collection.
///
/// The encoding is serde's data model as JSON-like text: `null` for a unit, a `None`
/// and a unit struct; an option's value as the value; a newtype struct as its value;
/// sequences, tuples, tuple structs and bytes as `[…]` in order; maps and structs as
/// `{…}` sorted by encoded name, then by encoded value; an enum's unit variant as its
/// name, any other variant as `{"variant":…}`; integers in decimal; floats as the
/// shortest text that reads back as the same `f64`.
struct Canonical<'o> {
    out: &'o mut String,
    /// The value is an [`Unordered`]'s: a sequence or tuple is a multiset.
    unordered: bool,
}

impl<'o> Canonical<'o> {
    fn new(out: &'o mut String) -> Self {
        Canonical { out, unordered: false }
    }

    /// The items of a sequence or tuple, opened.
    fn items(self, close: &'static str) -> Items<'o> {
        let multiset = self.unordered.then(Held::new);
        if multiset.is_none() {
            self.out.push('[');
        }
        Items {
            out: self.out,
            first: true,
            multiset,
            close,
        }
    }

    /// The entries of a map or struct, opened.
    fn entries(self, close: &'static str) -> Entries<'o> {
        Entries {
            out: self.out,
            held: Held::new(),
            name: None,
            close,
        }
    }

    /// `{"variant":` opened before a variant's data.
    fn variant(&mut self, variant: &str) {
        self.out.push('{');
        string(variant, self.out);
        self.out.push(':');
    }
}

fn decimal(out: &mut String, number: impl std::fmt::Display) {
    let _ = write!(out, "{number}");
}

impl<'o> Serializer for Canonical<'o> {
    type Ok = ();
    type Error = EncodeError;
    type SerializeSeq = Items<'o>;
    type SerializeTuple = Items<'o>;
    type SerializeTupleStruct = Items<'o>;
    type SerializeTupleVariant = Items<'o>;
    type SerializeMap = Entries<'o>;
    type SerializeStruct = Entries<'o>;
    type SerializeStructVariant = Entries<'o>;

    fn is_human_readable(&self) -> bool {
        true
    }

    fn serialize_bool(self, v: bool) -> Result<(), EncodeError> {
        self.out.push_str(if v { "true" } else { "false" });
        Ok(())
    }

    fn serialize_i8(self, v: i8) -> Result<(), EncodeError> {
        decimal(self.out, v);
        Ok(())
    }

    fn serialize_i16(self, v: i16) -> Result<(), EncodeError> {
        decimal(self.out, v);
        Ok(())
    }

    fn serialize_i32(self, v: i32) -> Result<(), EncodeError> {
        decimal(self.out, v);
        Ok(())
    }

    fn serialize_i64(self, v: i64) -> Result<(), EncodeError> {
        decimal(self.out, v);
        Ok(())
    }

    fn serialize_i128(self, v: i128) -> Result<(), EncodeError> {
        decimal(self.out, v);
        Ok(())
    }

    fn serialize_u8(self, v: u8) -> Result<(), EncodeError> {
        decimal(self.out, v);
        Ok(())
    }

    fn serialize_u16(self, v: u16) -> Result<(), EncodeError> {
        decimal(self.out, v);
        Ok(())
    }

    fn serialize_u32(self, v: u32) -> Result<(), EncodeError> {
        decimal(self.out, v);
        Ok(())
    }

    fn serialize_u64(self, v: u64) -> Result<(), EncodeError> {
        decimal(self.out, v);
        Ok(())
    }

    fn serialize_u128(self, v: u128) -> Result<(), EncodeError> {
        decimal(self.out, v);
        Ok(())
    }

    fn serialize_f32(self, v: f32) -> Result<(), EncodeError> {
        self.serialize_f64(f64::from(v))
    }

    fn serialize_f64(self, v: f64) -> Result<(), EncodeError> {
        // `{:?}` is the shortest text that reads back as the same float.
        let _ = write!(self.out, "{v:?}");
        Ok(())
    }

    fn serialize_char(self, v: char) -> Result<(), EncodeError> {
        string(v.encode_utf8(&mut [0; 4]), self.out);
        Ok(())
    }

    fn serialize_str(self, v: &str) -> Result<(), EncodeError> {
        string(v, self.out);
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), EncodeError> {
        self.out.push('[');
        for (i, byte) in v.iter().enumerate() {
            if i > 0 {
                self.out.push(',');
            }
            decimal(self.out, byte);
        }
        self.out.push(']');
        Ok(())
    }

    fn serialize_none(self) -> Result<(), EncodeError> {
        self.serialize_unit()
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), EncodeError> {
        value.serialize(Canonical::new(self.out))
    }

    fn serialize_unit(self) -> Result<(), EncodeError> {
        self.out.push_str("null");
        Ok(())
    }

    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), EncodeError> {
        self.serialize_unit()
    }

    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), EncodeError> {
        string(variant, self.out);
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(self, name: &'static str, value: &T) -> Result<(), EncodeError> {
        value.serialize(Canonical {
            out: self.out,
            unordered: name == UNORDERED,
        })
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), EncodeError> {
        self.variant(variant);
        value.serialize(Canonical::new(self.out))?;
        self.out.push('}');
        Ok(())
    }

    fn serialize_seq(self, _len: Option<usize>) -> Result<Items<'o>, EncodeError> {
        Ok(self.items(""))
    }

    fn serialize_tuple(self, _len: usize) -> Result<Items<'o>, EncodeError> {
        Ok(self.items(""))
    }

    fn serialize_tuple_struct(self, _name: &'static str, _len: usize) -> Result<Items<'o>, EncodeError> {
        // A tuple struct is a struct, not a sequence: in order even when unordered.
        Ok(Canonical::new(self.out).items(""))
    }

    fn serialize_tuple_variant(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Items<'o>, EncodeError> {
        self.variant(variant);
        Ok(Canonical::new(self.out).items("}"))
    }

    fn serialize_map(self, _len: Option<usize>) -> Result<Entries<'o>, EncodeError> {
        Ok(self.entries(""))
    }

    fn serialize_struct(self, _name: &'static str, _len: usize) -> Result<Entries<'o>, EncodeError> {
        Ok(self.entries(""))
    }

    fn serialize_struct_variant(
        mut self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Entries<'o>, EncodeError> {
        self.variant(variant);
        Ok(self.entries("}"))
    }
}

/// A sequence, tuple or tuple struct being written: `[a,b,…]` in order, or, for an
/// [`Unordered`] one, its items' encodings sorted (a multiset).
struct Items<'o> {
    out: &'o mut String,
    first: bool,
    /// An unordered collection's items, each encoded into one buffer.
    multiset: Option<Held>,
    /// Written after the closing `]`: the `}` of a tuple variant.
    close: &'static str,
}

impl Items<'_> {
    fn item<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        if let Some(held) = &mut self.multiset {
            let item = held.encode(value)?;
            held.spans.push((item, 0..0));
            return Ok(());
        }
        if !std::mem::take(&mut self.first) {
            self.out.push(',');
        }
        value.serialize(Canonical::new(self.out))
    }

    fn close(self) -> Result<(), EncodeError> {
        if let Some(mut held) = self.multiset {
            held.write_sorted(self.out, '[', ']');
        } else {
            self.out.push(']');
        }
        self.out.push_str(self.close);
        Ok(())
    }
}

/// Encodings held apart to be sorted before they are written: one buffer, and the spans
/// of each entry's name and value in it (an item of a multiset has only a name).
///
/// Its buffers come from, and go back to, a few this thread keeps: a fingerprint
/// allocates nothing once they have grown.
struct Held {
    text: String,
    spans: Vec<Spans>,
}

/// An entry's name and value in [`Held`]'s buffer.
type Spans = (std::ops::Range<usize>, std::ops::Range<usize>);

thread_local! {
    /// The buffers of `Held`s that ended, emptied, for the next ones on this thread.
    static SPARE: std::cell::RefCell<Vec<(String, Vec<Spans>)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The most buffers a thread keeps (one per level of nesting), and the largest it keeps.
const SPARE_BUFFERS: usize = 16;
const SPARE_CAPACITY: usize = 16 * 1024;

impl Drop for Held {
    fn drop(&mut self) {
        if self.text.capacity() > SPARE_CAPACITY || self.spans.capacity() > SPARE_CAPACITY / 16 {
            return;
        }
        let (mut text, mut spans) = (std::mem::take(&mut self.text), std::mem::take(&mut self.spans));
        text.clear();
        spans.clear();
        // Not kept while the thread ends, or with the spare buffers full.
        let _ = SPARE.try_with(|spare| {
            if let Ok(mut spare) = spare.try_borrow_mut() {
                if spare.len() < SPARE_BUFFERS {
                    spare.push((text, spans));
                }
            }
        });
    }
}

impl Held {
    /// Empty buffers: spare ones of this thread's, or new.
    fn new() -> Held {
        let spare = SPARE
            .try_with(|spare| spare.try_borrow_mut().ok()?.pop())
            .ok()
            .flatten();
        let (text, spans) = spare.unwrap_or_default();
        Held { text, spans }
    }

    /// Encode `value` at the end of the buffer; its span.
    fn encode<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<std::ops::Range<usize>, EncodeError> {
        let start = self.text.len();
        value.serialize(Canonical::new(&mut self.text))?;
        Ok(start..self.text.len())
    }

    /// `open`, the entries sorted by name then value (`name:value`, or `name` alone
    /// for an item), `close`.
    fn write_sorted(&mut self, out: &mut String, open: char, close: char) {
        let text = &self.text;
        self.spans.sort_unstable_by(|(a, x), (b, y)| {
            text[a.clone()]
                .cmp(&text[b.clone()])
                .then_with(|| text[x.clone()].cmp(&text[y.clone()]))
        });
        out.push(open);
        for (i, (name, value)) in self.spans.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&text[name.clone()]);
            if !value.is_empty() {
                out.push(':');
                out.push_str(&text[value.clone()]);
            }
        }
        out.push(close);
    }
}

/// serde's four traits for a sequence-like value, each handing its items to [`Items`].
macro_rules! items {
    ($($serialize:ident :: $item:ident),+) => {$(
        impl serde::ser::$serialize for Items<'_> {
            type Ok = ();
            type Error = EncodeError;

            fn $item<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
                self.item(value)
            }

            fn end(self) -> Result<(), EncodeError> {
                self.close()
            }
        }
    )+};
}

items!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field
);

/// A map, struct or struct variant being written: `{name:value,…}`, sorted by encoded
/// name, and by encoded value among equal names.
struct Entries<'o> {
    out: &'o mut String,
    held: Held,
    /// A map key waiting for its value: its span.
    name: Option<std::ops::Range<usize>>,
    /// Written after the closing `}`: the `}` of a struct variant.
    close: &'static str,
}

impl Entries<'_> {
    fn close(mut self) -> Result<(), EncodeError> {
        self.held.write_sorted(self.out, '{', '}');
        self.out.push_str(self.close);
        Ok(())
    }

    fn field<T: Serialize + ?Sized>(&mut self, name: &str, value: &T) -> Result<(), EncodeError> {
        let start = self.held.text.len();
        string(name, &mut self.held.text);
        let name = start..self.held.text.len();
        let value = self.held.encode(value)?;
        self.held.spans.push((name, value));
        Ok(())
    }
}

impl serde::ser::SerializeMap for Entries<'_> {
    type Ok = ();
    type Error = EncodeError;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), EncodeError> {
        self.name = Some(self.held.encode(key)?);
        Ok(())
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), EncodeError> {
        let name = self
            .name
            .take()
            .ok_or_else(|| EncodeError("a map value without its key".to_owned()))?;
        let value = self.held.encode(value)?;
        self.held.spans.push((name, value));
        Ok(())
    }

    fn end(self) -> Result<(), EncodeError> {
        self.close()
    }
}

/// serde's two traits for a struct-like value, each handing its fields to [`Entries`].
macro_rules! fields {
    ($($serialize:ident),+) => {$(
        impl serde::ser::$serialize for Entries<'_> {
            type Ok = ();
            type Error = EncodeError;

            fn serialize_field<T: Serialize + ?Sized>(&mut self, name: &'static str, value: &T) -> Result<(), EncodeError> {
                self.field(name, value)
            }

            fn end(self) -> Result<(), EncodeError> {
                self.close()
            }
        }
    )+};
}

fields!(SerializeStruct, SerializeStructVariant);

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

#[cfg(test)]
mod tests {
    /// The encoding as it was computed before: through a tree of the value.
    mod reference {
        use std::fmt::Write as _;

        use serde::Serialize;
        use serde_content::{Data, Number, Value};

        use super::super::{string, UNORDERED};

        fn quoted(text: &str) -> String {
            let mut out = String::with_capacity(text.len() + 2);
            string(text, &mut out);
            out
        }

        /// The canonical encoding through a tree of the value (`serde-content`), as it was
        /// computed before it was written while serde walks the value: the reference the
        /// streaming encoder is checked against.
        pub(super) fn by_tree<P: Serialize + ?Sized>(payload: &P) -> String {
            let value = serde_content::Serializer::new()
                .human_readable()
                .serialize(payload)
                .unwrap();
            let mut text = String::new();
            canonical(&value, &mut text);
            text
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
    }

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

    /// The streaming encoding of `payload`.
    fn streamed<P: Serialize + ?Sized>(payload: &P) -> String {
        let mut out = String::new();
        payload.serialize(Canonical::new(&mut out)).unwrap();
        out
    }

    #[test]
    fn the_streaming_encoding_is_the_tree_encoding_for_every_shape() {
        #[derive(Serialize, Clone)]
        struct Wrapper(Vec<u8>);
        #[derive(Serialize)]
        struct Unit;
        #[derive(Serialize)]
        struct Empty {}
        #[derive(Serialize)]
        struct Pair(u8, &'static str);
        #[derive(Serialize)]
        enum Kind {
            Card,
            Wire { iban: &'static str, at: Option<u8> },
            Split(u8, i8),
            Note(String),
        }
        /// A map that writes one key twice, as a multimap's `Serialize` may.
        struct Twice;
        impl Serialize for Twice {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                use serde::ser::SerializeMap;
                let mut map = serializer.serialize_map(None)?;
                map.serialize_entry("k", &2)?;
                map.serialize_entry("k", &1)?;
                map.serialize_entry("a", &[3, 1])?;
                map.end()
            }
        }
        let set: HashSet<&str> = ["x", "y", "z"].into_iter().collect();
        let by_number: HashMap<i64, &str> = [(10, "ten"), (-2, "minus two"), (3, "three")].into_iter().collect();
        let check = |what: &str, text: String, reference: String| assert_eq!(text, reference, "{what}");
        macro_rules! same {
            ($($value:expr),+ $(,)?) => {$(
                check(stringify!($value), streamed(&$value), reference::by_tree(&$value));
            )+};
        }
        same!(
            every_shape(),
            json!({"amount": 199, "to": {"bank": "x\ny", "acct": [1, 2.5, null, true, {}, []]}}),
            (),
            Unit,
            Empty {},
            Pair(1, "a"),
            Wrapper(vec![3, 1, 2]),
            [Kind::Card, Kind::Note("n".into()), Kind::Split(1, -1)],
            Kind::Wire {
                iban: "DE",
                at: Some(3)
            },
            Some(Some(7u8)),
            None::<u8>,
            'x',
            "\u{0}\u{1f}\"\\é",
            f32::MIN_POSITIVE,
            -0.0f64,
            1e300f64,
            u128::MAX,
            i128::MIN,
            Unordered(set.clone()),
            Unordered(Unordered(vec![3, 1, 2])),
            Unordered(Some(vec![3, 1, 2])),
            Unordered(Wrapper(vec![3, 1, 2])),
            Unordered(Pair(2, "b")),
            Unordered([[2, 1], [1, 2]]),
            Unordered((3, "c", 1)),
            Unordered(vec![Kind::Split(2, 1), Kind::Card, Kind::Wire { iban: "A", at: None }]),
            Unordered(json!({"b": [2, 1], "a": 1})),
            Unordered(vec![json!({"b": 1}), json!([2, 1])]),
            vec![Unordered(vec![2, 1]), Unordered(vec![1, 2])],
            by_number,
            Twice,
            BTreeMap::from([(vec![2, 1], "list key"), (vec![1], "short")]),
            BTreeMap::from([((1, 2), Unordered(vec!["b", "a"]))]),
        );
    }

    proptest::proptest! {
        #[test]
        fn the_streaming_encoding_is_the_tree_encoding_for_any_json(value in json_value()) {
            proptest::prop_assert_eq!(streamed(&value), reference::by_tree(&value));
            proptest::prop_assert_eq!(streamed(&Unordered(&value)), reference::by_tree(&Unordered(&value)));
        }
    }

    /// Any JSON document of a few levels: every kind of value, keys that need escaping.
    fn json_value() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::Bool),
            any::<i64>().prop_map(|n| json!(n)),
            any::<u64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("finite", |f| f.is_finite())
                .prop_map(|f| json!(f)),
            "\\PC{0,8}".prop_map(serde_json::Value::String),
            "[\\x00-\\x7f]{0,6}".prop_map(serde_json::Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::Array),
                proptest::collection::btree_map("[a-c\"\\\\ ]{0,3}", inner, 0..6)
                    .prop_map(|map| serde_json::Value::Object(map.into_iter().collect())),
            ]
        })
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
