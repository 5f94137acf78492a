//! A value as serde's data model sees it, written out as tagged bytes: every call of
//! the `Serializer` (which kind of value, its names, its contents) in one buffer, with
//! nothing built per value.
//!
//! Two values whose bytes are equal are equal as serde's data model sees them: the same
//! calls with the same contents, in the same order. So the check that an answer replays
//! equal ([`replay`](crate::replay)) compares these bytes first, and builds the two
//! values' trees (to compare maps in any order) only when they differ. Unlike JSON, the
//! bytes tell `Some(None)` from `None`, a NaN from a unit, `1` from `1.0`, and one enum
//! variant from another that would be written alike.

use std::cell::RefCell;

use serde::ser::{self, Serialize};

/// Whether `a` and `b` make the same calls of a `Serializer` with the same contents (as
/// a human-readable format sees them, as the replay check's trees do). `false` also
/// when either fails to serialize. The bytes of `a` are written to a buffer this thread
/// keeps, and `b`'s are compared with them as they are made: nothing is allocated once
/// the buffer has grown.
pub(crate) fn same<T: Serialize + ?Sized>(a: &T, b: &T) -> bool {
    thread_local! {
        static WRITTEN: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    }
    let compare = |written: &mut Vec<u8>| {
        written.clear();
        let wrote = a.serialize(&mut Writer(&mut *written)).is_ok();
        let mut second = Writer(Against {
            expected: written,
            at: 0,
            differs: false,
        });
        wrote && b.serialize(&mut second).is_ok() && !second.0.differs && second.0.at == written.len()
    };
    WRITTEN.with(|written| match written.try_borrow_mut() {
        Ok(mut written) => {
            let same = compare(&mut written);
            if written.capacity() > KEPT_CAPACITY {
                *written = Vec::new();
            }
            same
        }
        // A `Serialize` that compares answers of its own, within this one.
        Err(_) => compare(&mut Vec::new()),
    })
}

/// The most the thread's buffer keeps between comparisons: a large answer's bytes are
/// let go.
const KEPT_CAPACITY: usize = 64 * 1024;

/// The tagged bytes of `value`.
#[cfg(test)]
fn bytes<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, serde_json::Error> {
    let mut written = Vec::new();
    value.serialize(&mut Writer(&mut written))?;
    Ok(written)
}

/// Where the bytes go.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for &mut Vec<u8> {
    // Inlined, a put of a tag or a number copies a known number of bytes in place
    // rather than calling `memcpy` for each.
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Bytes compared, as they come, with those `expected`.
struct Against<'a> {
    expected: &'a [u8],
    at: usize,
    differs: bool,
}

impl Sink for Against<'_> {
    #[inline]
    fn put(&mut self, bytes: &[u8]) {
        let end = self.at + bytes.len();
        if !self.differs && self.expected.get(self.at..end) == Some(bytes) {
            self.at = end;
        } else {
            self.differs = true;
        }
    }
}

/// What each call of the `Serializer` is written as, before its contents.
#[repr(u8)]
enum Tag {
    Bool,
    I8,
    I16,
    I32,
    I64,
    I128,
    U8,
    U16,
    U32,
    U64,
    U128,
    F32,
    F64,
    Char,
    Str,
    Bytes,
    None,
    Some,
    Unit,
    UnitStruct,
    UnitVariant,
    NewtypeStruct,
    NewtypeVariant,
    Seq,
    Tuple,
    TupleStruct,
    TupleVariant,
    Map,
    Struct,
    StructVariant,
    /// The end of a sequence, tuple, map or struct.
    End,
    /// A struct's field: its name, then its value.
    Field,
    /// A struct's field that is skipped: its name.
    Skipped,
}

/// The `Serializer` that writes the bytes to its sink.
struct Writer<S>(S);

impl<S: Sink> Writer<S> {
    fn tag(&mut self, tag: Tag) {
        self.0.put(&[tag as u8]);
    }

    /// A length-prefixed run of bytes: a string, bytes, a name.
    fn text(&mut self, text: &[u8]) {
        self.0.put(&(text.len() as u64).to_le_bytes());
        self.0.put(text);
    }

    fn variant(&mut self, tag: Tag, name: &str, index: u32, variant: &str) {
        self.tag(tag);
        self.text(name.as_bytes());
        self.0.put(&index.to_le_bytes());
        self.text(variant.as_bytes());
    }

    fn length(&mut self, len: Option<usize>) {
        match len {
            Some(len) => {
                self.0.put(&[1]);
                self.0.put(&(len as u64).to_le_bytes());
            }
            None => self.0.put(&[0]),
        }
    }
}

/// Each scalar: its tag, then its bytes.
macro_rules! scalars {
    ($($method:ident($type:ty) => $tag:ident),* $(,)?) => {
        $(fn $method(self, v: $type) -> Result<(), serde_json::Error> {
            self.tag(Tag::$tag);
            self.0.put(&v.to_le_bytes());
            Ok(())
        })*
    };
}

/// The openers of a named compound (a tuple struct, a struct) and of its enum variant:
/// the tag, the names, the length; then its fields.
macro_rules! compounds {
    ($($named:ident, $variant:ident => $tag:ident, $variant_tag:ident);* $(;)?) => {
        $(fn $named(self, name: &'static str, len: usize) -> Result<Self, serde_json::Error> {
            self.tag(Tag::$tag);
            self.text(name.as_bytes());
            self.length(Some(len));
            Ok(self)
        }

        fn $variant(
            self,
            name: &'static str,
            index: u32,
            variant: &'static str,
            len: usize,
        ) -> Result<Self, serde_json::Error> {
            self.variant(Tag::$variant_tag, name, index, variant);
            self.length(Some(len));
            Ok(self)
        })*
    };
}

impl<S: Sink> ser::Serializer for &mut Writer<S> {
    type Ok = ();
    type Error = serde_json::Error;
    type SerializeSeq = Self;
    type SerializeTuple = Self;
    type SerializeTupleStruct = Self;
    type SerializeTupleVariant = Self;
    type SerializeMap = Self;
    type SerializeStruct = Self;
    type SerializeStructVariant = Self;

    scalars! {
        serialize_i8(i8) => I8,
        serialize_i16(i16) => I16,
        serialize_i32(i32) => I32,
        serialize_i64(i64) => I64,
        serialize_i128(i128) => I128,
        serialize_u8(u8) => U8,
        serialize_u16(u16) => U16,
        serialize_u32(u32) => U32,
        serialize_u64(u64) => U64,
        serialize_u128(u128) => U128,
    }

    fn serialize_bool(self, v: bool) -> Result<(), serde_json::Error> {
        self.tag(Tag::Bool);
        self.0.put(&[u8::from(v)]);
        Ok(())
    }

    fn serialize_f32(self, v: f32) -> Result<(), serde_json::Error> {
        self.tag(Tag::F32);
        self.0.put(&v.to_bits().to_le_bytes());
        Ok(())
    }

    fn serialize_f64(self, v: f64) -> Result<(), serde_json::Error> {
        self.tag(Tag::F64);
        self.0.put(&v.to_bits().to_le_bytes());
        Ok(())
    }

    fn serialize_char(self, v: char) -> Result<(), serde_json::Error> {
        self.tag(Tag::Char);
        self.0.put(&u32::from(v).to_le_bytes());
        Ok(())
    }

    fn serialize_str(self, v: &str) -> Result<(), serde_json::Error> {
        self.tag(Tag::Str);
        self.text(v.as_bytes());
        Ok(())
    }

    fn serialize_bytes(self, v: &[u8]) -> Result<(), serde_json::Error> {
        self.tag(Tag::Bytes);
        self.text(v);
        Ok(())
    }

    fn serialize_none(self) -> Result<(), serde_json::Error> {
        self.tag(Tag::None);
        Ok(())
    }

    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), serde_json::Error> {
        self.tag(Tag::Some);
        value.serialize(self)
    }

    fn serialize_unit(self) -> Result<(), serde_json::Error> {
        self.tag(Tag::Unit);
        Ok(())
    }

    fn serialize_unit_struct(self, name: &'static str) -> Result<(), serde_json::Error> {
        self.tag(Tag::UnitStruct);
        self.text(name.as_bytes());
        Ok(())
    }

    fn serialize_unit_variant(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
    ) -> Result<(), serde_json::Error> {
        self.variant(Tag::UnitVariant, name, index, variant);
        Ok(())
    }

    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        self.tag(Tag::NewtypeStruct);
        self.text(name.as_bytes());
        value.serialize(self)
    }

    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), serde_json::Error> {
        self.variant(Tag::NewtypeVariant, name, index, variant);
        value.serialize(self)
    }

    fn serialize_seq(self, len: Option<usize>) -> Result<Self, serde_json::Error> {
        self.tag(Tag::Seq);
        self.length(len);
        Ok(self)
    }

    fn serialize_tuple(self, len: usize) -> Result<Self, serde_json::Error> {
        self.tag(Tag::Tuple);
        self.length(Some(len));
        Ok(self)
    }

    fn serialize_map(self, len: Option<usize>) -> Result<Self, serde_json::Error> {
        self.tag(Tag::Map);
        self.length(len);
        Ok(self)
    }

    compounds! {
        serialize_tuple_struct, serialize_tuple_variant => TupleStruct, TupleVariant;
        serialize_struct, serialize_struct_variant => Struct, StructVariant;
    }
}

/// The items of a sequence or a tuple of any kind: each in turn, then [`Tag::End`].
macro_rules! items {
    ($($trait:ident::$method:ident),* $(,)?) => {
        $(impl<S: Sink> ser::$trait for &mut Writer<S> {
            type Ok = ();
            type Error = serde_json::Error;

            fn $method<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), serde_json::Error> {
                value.serialize(&mut **self)
            }

            fn end(self) -> Result<(), serde_json::Error> {
                self.tag(Tag::End);
                Ok(())
            }
        })*
    };
}

items! {
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
}

impl<S: Sink> ser::SerializeMap for &mut Writer<S> {
    type Ok = ();
    type Error = serde_json::Error;

    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), serde_json::Error> {
        key.serialize(&mut **self)
    }

    fn serialize_value<T: Serialize + ?Sized>(&mut self, value: &T) -> Result<(), serde_json::Error> {
        value.serialize(&mut **self)
    }

    fn end(self) -> Result<(), serde_json::Error> {
        self.tag(Tag::End);
        Ok(())
    }
}

/// The fields of a struct of either kind: each name and value, a skipped field's name,
/// then [`Tag::End`].
macro_rules! fields {
    ($($trait:ident),* $(,)?) => {
        $(impl<S: Sink> ser::$trait for &mut Writer<S> {
            type Ok = ();
            type Error = serde_json::Error;

            fn serialize_field<T: Serialize + ?Sized>(&mut self, key: &'static str, value: &T) -> Result<(), serde_json::Error> {
                self.tag(Tag::Field);
                self.text(key.as_bytes());
                value.serialize(&mut **self)
            }

            fn skip_field(&mut self, key: &'static str) -> Result<(), serde_json::Error> {
                self.tag(Tag::Skipped);
                self.text(key.as_bytes());
                Ok(())
            }

            fn end(self) -> Result<(), serde_json::Error> {
                self.tag(Tag::End);
                Ok(())
            }
        })*
    };
}

fields!(SerializeStruct, SerializeStructVariant);

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Serialize;

    use super::{bytes, same};

    #[derive(Serialize)]
    #[serde(untagged)]
    enum Untagged {
        Number(u32),
        Other(u32),
    }

    #[derive(Serialize)]
    enum Tagged {
        A(u8),
        B(u8),
    }

    /// Values JSON writes alike are told apart.
    #[test]
    fn values_json_writes_alike_differ() {
        let differ = |a: Vec<u8>, b: Vec<u8>| assert_ne!(a, b);
        differ(bytes(&Some(None::<u8>)).unwrap(), bytes(&None::<Option<u8>>).unwrap());
        differ(bytes(&f64::NAN).unwrap(), bytes(&()).unwrap());
        differ(bytes(&1u32).unwrap(), bytes(&1.0f64).unwrap());
        differ(bytes(&1u32).unwrap(), bytes(&1u64).unwrap());
        differ(bytes(&0.0f64).unwrap(), bytes(&-0.0f64).unwrap());
        differ(bytes(&Tagged::A(1)).unwrap(), bytes(&Tagged::B(1)).unwrap());
        differ(bytes(&"ab").unwrap(), bytes(&Bytes(b"ab")).unwrap());
        differ(bytes(&("a", "bc")).unwrap(), bytes(&("ab", "c")).unwrap());
        differ(
            bytes(&vec![vec![1u8], vec![]]).unwrap(),
            bytes(&vec![vec![], vec![1u8]]).unwrap(),
        );
        let map = |entries: &[(&'static str, u8)]| entries.iter().copied().collect::<BTreeMap<_, _>>();
        differ(bytes(&map(&[("a", 1)])).unwrap(), bytes(&map(&[("a", 2)])).unwrap());
        // An untagged enum's variants serialize alike: so do their bytes; what tells
        // them apart is the value read back (the replay check compares both sides).
        assert_eq!(
            bytes(&Untagged::Number(3)).unwrap(),
            bytes(&Untagged::Other(3)).unwrap()
        );
    }

    /// The comparison as the bytes are made agrees with the bytes compared whole, also
    /// where one value's bytes are a prefix of the other's.
    #[test]
    fn the_comparison_agrees_with_the_bytes() {
        let values: Vec<Vec<Option<String>>> = vec![
            vec![],
            vec![None],
            vec![Some(String::new())],
            vec![Some("a".into())],
            vec![Some("a".into()), None],
            vec![Some("ab".into())],
        ];
        for a in &values {
            for b in &values {
                assert_eq!(same(a, b), bytes(a).unwrap() == bytes(b).unwrap(), "{a:?} {b:?}");
                assert_eq!(same(a, b), a == b, "{a:?} {b:?}");
            }
        }
    }

    /// A slice that serializes as bytes, not as a sequence.
    struct Bytes<'a>(&'a [u8]);

    impl Serialize for Bytes<'_> {
        fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
            serializer.serialize_bytes(self.0)
        }
    }
}
