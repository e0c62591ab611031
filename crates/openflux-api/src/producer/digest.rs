//! Artifact digests, `<algorithm>:<hex>`, as Flux writes them in
//! `.status.artifact.digest` and as its consumers verify them.
//!
//! Flux's canonical algorithm is sha256; sha384 and sha512 are accepted too.
//! (Flux also registers blake3, which this crate does not compute: such a
//! digest parses as [`DigestError::Unsupported`].)

use std::fmt;
use std::str::FromStr;

use sha2::{Digest as _, Sha256, Sha384, Sha512};

/// A digest algorithm this crate computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    Sha256,
    Sha384,
    Sha512,
}

impl Algorithm {
    /// The name in a digest string.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::Sha256 => "sha256",
            Algorithm::Sha384 => "sha384",
            Algorithm::Sha512 => "sha512",
        }
    }

    /// Length of the hex encoding.
    pub fn hex_len(self) -> usize {
        match self {
            Algorithm::Sha256 => 64,
            Algorithm::Sha384 => 96,
            Algorithm::Sha512 => 128,
        }
    }

    fn hash(self, bytes: &[u8]) -> String {
        match self {
            Algorithm::Sha256 => hex::encode(Sha256::digest(bytes)),
            Algorithm::Sha384 => hex::encode(Sha384::digest(bytes)),
            Algorithm::Sha512 => hex::encode(Sha512::digest(bytes)),
        }
    }
}

/// Why a digest string is not usable, or does not match.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DigestError {
    #[error("digest {0:?} is not <algorithm>:<lowercase hex>")]
    Malformed(String),
    #[error("digest {0:?} uses an unsupported algorithm (use sha256, sha384 or sha512)")]
    Unsupported(String),
    #[error("artifact digest {actual} does not match the expected {expected}")]
    Mismatch { expected: String, actual: String },
}

/// A parsed digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Digest {
    algorithm: Algorithm,
    hex: String,
}

impl Digest {
    /// The digest of `bytes` with `algorithm`.
    pub fn of(algorithm: Algorithm, bytes: &[u8]) -> Self {
        Digest {
            algorithm,
            hex: algorithm.hash(bytes),
        }
    }

    /// The sha256 digest of `bytes` (Flux's canonical algorithm).
    pub fn sha256(bytes: &[u8]) -> Self {
        Digest::of(Algorithm::Sha256, bytes)
    }

    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The lowercase hex encoding.
    pub fn hex(&self) -> &str {
        &self.hex
    }

    /// Checks that `bytes` have this digest (computed with its algorithm).
    pub fn verify(&self, bytes: &[u8]) -> Result<(), DigestError> {
        let actual = Digest::of(self.algorithm, bytes);
        if actual == *self {
            Ok(())
        } else {
            Err(DigestError::Mismatch {
                expected: self.to_string(),
                actual: actual.to_string(),
            })
        }
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algorithm.name(), self.hex)
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let malformed = || DigestError::Malformed(s.to_string());
        let (name, hex) = s.split_once(':').ok_or_else(malformed)?;
        let name_ok = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"+._-".contains(&b));
        if !name_ok || hex.is_empty() {
            return Err(malformed());
        }
        let algorithm = match name {
            "sha256" => Algorithm::Sha256,
            "sha384" => Algorithm::Sha384,
            "sha512" => Algorithm::Sha512,
            _ => return Err(DigestError::Unsupported(s.to_string())),
        };
        let lower_hex = hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        if hex.len() != algorithm.hex_len() || !lower_hex {
            return Err(malformed());
        }
        Ok(Digest {
            algorithm,
            hex: hex.to_string(),
        })
    }
}

/// Checks `bytes` against an expected digest string.
pub fn verify(expected: &str, bytes: &[u8]) -> Result<(), DigestError> {
    expected.parse::<Digest>()?.verify(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY_SHA256: &str =
        "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn computes_and_prints_flux_digests() {
        assert_eq!(Digest::sha256(b"").to_string(), EMPTY_SHA256);
        let d = Digest::of(Algorithm::Sha512, b"abc");
        assert!(d.to_string().starts_with("sha512:ddaf35a193617aba"));
        assert_eq!(d.hex().len(), 128);
        assert_eq!(Digest::of(Algorithm::Sha384, b"").hex().len(), 96);
    }

    #[test]
    fn parses_and_round_trips() {
        let d: Digest = EMPTY_SHA256.parse().unwrap();
        assert_eq!(d.algorithm(), Algorithm::Sha256);
        assert_eq!(d.to_string(), EMPTY_SHA256);
        assert!(d
            .to_string()
            .parse::<Digest>()
            .is_ok_and(|again| again == d));
    }

    #[test]
    fn rejects_malformed_and_unsupported_digests() {
        for bad in [
            "",
            "sha256",
            "sha256:",
            ":abc",
            "sha256:XY",
            "sha256:abc",
            &EMPTY_SHA256.to_uppercase(),
            &format!("{EMPTY_SHA256}0"),
            "SHA256:e3b0",
        ] {
            assert!(
                matches!(bad.parse::<Digest>(), Err(DigestError::Malformed(_))),
                "{bad:?}"
            );
        }
        assert!(matches!(
            "blake3:af13".parse::<Digest>(),
            Err(DigestError::Unsupported(_))
        ));
    }

    #[test]
    fn verifies_bytes() {
        assert_eq!(verify(EMPTY_SHA256, b""), Ok(()));
        let err = verify(EMPTY_SHA256, b"x").unwrap_err();
        let actual = Digest::sha256(b"x").to_string();
        assert_eq!(
            err,
            DigestError::Mismatch {
                expected: EMPTY_SHA256.into(),
                actual: actual.clone()
            }
        );
        assert!(err.to_string().contains(&actual));
        let sha512 = Digest::of(Algorithm::Sha512, b"x").to_string();
        assert_eq!(verify(&sha512, b"x"), Ok(()));
        assert!(verify("sha256:nothex", b"x").is_err());
    }
}
