//! An object's `metadata.uid` as openflux keeps it in memory.
//!
//! The API server gives every object a UUID, written as 36 characters of
//! lower-case hex and dashes; its 16 bytes are kept inline instead of the
//! text on the heap (a pointer and a length beside an allocation of 40 to
//! 56 bytes). The owner index keeps two uids of each Artifact (its own and
//! its owner's) and the mirror one of each source, so at 100,000 sources
//! that is about 12 MiB. Any other text (a uid written by a test, or by an
//! API server that does not write UUIDs) is kept as it came, and every uid
//! reads back exactly as it was written.

use std::fmt;
use std::sync::Arc;

/// A uid, compared and printed as its text.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Uid(Kept);

#[derive(Clone, PartialEq, Eq, Hash)]
enum Kept {
    /// A UUID in its canonical text: the 16 bytes it spells.
    Uuid([u8; 16]),
    /// Anything else, as written.
    Text(Arc<str>),
}

/// Where the dashes of a canonical UUID stand.
const DASHES: [usize; 4] = [8, 13, 18, 23];
const TEXT_LEN: usize = 36;
const HEX: &[u8; 16] = b"0123456789abcdef";

impl Uid {
    pub fn new(text: &str) -> Self {
        Uid(match uuid_bytes(text) {
            Some(bytes) => Kept::Uuid(bytes),
            None => Kept::Text(text.into()),
        })
    }

    pub fn is_empty(&self) -> bool {
        matches!(&self.0, Kept::Text(t) if t.is_empty())
    }

    /// The text, written into `buf` when it is a UUID's.
    pub fn as_text<'a>(&'a self, buf: &'a mut [u8; TEXT_LEN]) -> &'a str {
        match &self.0 {
            Kept::Text(t) => t,
            Kept::Uuid(bytes) => {
                let mut digits = bytes.iter().flat_map(|b| [b >> 4, b & 0xf]);
                for (i, out) in buf.iter_mut().enumerate() {
                    *out = match DASHES.contains(&i) {
                        true => b'-',
                        false => HEX[usize::from(digits.next().unwrap_or_default())],
                    };
                }
                // Every byte written is an ASCII hex digit or a dash.
                std::str::from_utf8(buf).unwrap_or_default()
            }
        }
    }
}

/// The 16 bytes of `text` when it is a UUID written as the API server
/// writes one (lower-case): only then does printing them give `text` back.
fn uuid_bytes(text: &str) -> Option<[u8; 16]> {
    let text = text.as_bytes();
    if text.len() != TEXT_LEN || DASHES.iter().any(|&i| text[i] != b'-') {
        return None;
    }
    let mut nibbles = text
        .iter()
        .enumerate()
        .filter(|(i, _)| !DASHES.contains(i))
        .map(|(_, c)| match c {
            b'0'..=b'9' => Some(c - b'0'),
            b'a'..=b'f' => Some(c - b'a' + 10),
            _ => None,
        });
    let mut bytes = [0u8; 16];
    for byte in &mut bytes {
        *byte = nibbles.next()?? << 4 | nibbles.next()??;
    }
    Some(bytes)
}

impl From<&str> for Uid {
    fn from(text: &str) -> Self {
        Uid::new(text)
    }
}

impl PartialEq<str> for Uid {
    fn eq(&self, other: &str) -> bool {
        match &self.0 {
            Kept::Text(t) => **t == *other,
            Kept::Uuid(bytes) => uuid_bytes(other).as_ref() == Some(bytes),
        }
    }
}

impl PartialEq<&str> for Uid {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl fmt::Display for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_text(&mut [0; TEXT_LEN]))
    }
}

impl fmt::Debug for Uid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_text(&mut [0; TEXT_LEN]), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "0f8e5b1c-3a2d-4e6f-9a7b-c1d2e3f4a5b6";

    #[test]
    fn a_uuid_is_kept_in_sixteen_bytes_and_reads_back_as_written() {
        let uid = Uid::new(UUID);
        assert!(matches!(uid.0, Kept::Uuid(_)));
        assert_eq!(uid.to_string(), UUID);
        assert_eq!(format!("{uid:?}"), format!("{UUID:?}"));
        assert_eq!(uid, *UUID);
        assert_eq!(uid, Uid::from(UUID));
        assert!(!uid.is_empty());
    }

    #[test]
    fn every_hex_digit_reads_back() {
        for d in HEX.iter().map(|&c| c as char) {
            let text: String = (0..TEXT_LEN)
                .map(|i| if DASHES.contains(&i) { '-' } else { d })
                .collect();
            let uid = Uid::new(&text);
            assert!(matches!(uid.0, Kept::Uuid(_)), "{text}");
            assert_eq!(uid.to_string(), text);
        }
    }

    #[test]
    fn other_text_is_kept_as_written() {
        let upper = UUID.to_uppercase();
        let braced = format!("{{{UUID}}}");
        let misplaced = format!("{}-{}", &UUID[..7], &UUID[8..]);
        let not_hex = UUID.replace('f', "g");
        for text in [
            "",
            "u-1",
            upper.as_str(),
            &braced,
            &misplaced,
            &not_hex,
            "é",
        ] {
            let uid = Uid::new(text);
            assert!(matches!(uid.0, Kept::Text(_)), "{text}");
            assert_eq!(uid.to_string(), text);
            assert_eq!(uid, *text);
            assert_eq!(uid.is_empty(), text.is_empty());
        }
    }

    #[test]
    fn uids_differ_when_their_text_does() {
        let uid = Uid::new(UUID);
        let other = UUID.replace('0', "1");
        assert_ne!(uid, *other.as_str());
        assert_ne!(uid, Uid::new(&other));
        // The same letters in upper case are another uid, as text they
        // differ too.
        assert_ne!(uid, *UUID.to_uppercase().as_str());
        assert_ne!(uid, Uid::new(&UUID.to_uppercase()));
        assert_ne!(Uid::new("u-1"), *UUID);
    }
}
