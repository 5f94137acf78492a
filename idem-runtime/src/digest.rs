//! SHA-256 as idem writes it: lower-case hex, and keys that stand in for keys too long
//! (or holding characters) their carrier cannot take.

use sha2::{Digest, Sha256};

use crate::key::MAX_KEY_BYTES;

/// Lower-case hex of the SHA-256 of `bytes`: 64 digits.
pub fn sha256_hex(bytes: impl AsRef<[u8]>) -> String {
    hex(&Sha256::digest(bytes.as_ref()))
}

/// Lower-case hex of `bytes`, written into one string.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &byte in bytes {
        out.push(char::from(DIGITS[usize::from(byte >> 4)]));
        out.push(char::from(DIGITS[usize::from(byte & 0x0f)]));
    }
    out
}

/// `key` as it is when it is at most [`MAX_KEY_BYTES`] long and every character is
/// `carried`; else `sha256:<64 hex digits>` of it — a key of its own, one for one,
/// that any store and header takes.
pub fn key_or_digest(key: String, carried: impl Fn(char) -> bool) -> String {
    if key.len() <= MAX_KEY_BYTES && key.chars().all(carried) {
        key
    } else {
        format!("sha256:{}", sha256_hex(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_and_stand_in_keys() {
        assert_eq!(
            sha256_hex("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(key_or_digest("order-7".into(), |c| !c.is_control()), "order-7");
        let long = key_or_digest("k".repeat(MAX_KEY_BYTES + 1), |_| true);
        assert!(long.starts_with("sha256:") && long.len() == 71, "{long}");
        assert!(key_or_digest("a\nb".into(), |c| !c.is_control()).starts_with("sha256:"));
        assert_eq!(hex(&[0x00, 0x9f, 0xff, 0x10]), "009fff10");
    }
}
