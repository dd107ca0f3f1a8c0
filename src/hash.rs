//! Keyed hashing. residue never keeps raw API keys, tenant ids (unless told
//! to) or text: it keeps BLAKE3 keyed hashes, with a key from the config or one
//! generated at start.

use std::fmt;

/// A 32-byte key for BLAKE3's keyed mode.
#[derive(Clone)]
pub struct HashKey([u8; 32]);

impl HashKey {
    pub fn new(key: [u8; 32]) -> Self {
        HashKey(key)
    }

    /// A fresh random key: hashes are then comparable only within this process.
    pub fn generate() -> Self {
        HashKey(rand::random())
    }

    /// Parses 64 hex characters.
    pub fn from_hex(s: &str) -> Result<Self, String> {
        let bytes = hex::decode(s.trim()).map_err(|e| format!("not hex: {e}"))?;
        let key: [u8; 32] = bytes.try_into().map_err(|v: Vec<u8>| {
            format!("expected 32 bytes (64 hex characters), got {}", v.len())
        })?;
        Ok(HashKey(key))
    }

    /// The keyed hash of `data` in a domain (`"api-key"`, `"tenant"`, …), so
    /// the same bytes hash differently for different uses.
    pub fn hash(&self, domain: &str, data: &[u8]) -> [u8; 32] {
        let mut h = blake3::Hasher::new_keyed(&self.0);
        h.update(domain.as_bytes());
        h.update(&[0]);
        h.update(data);
        *h.finalize().as_bytes()
    }

    /// A sub-key for another keyed function (SipHash for shingles), derived
    /// so that it reveals nothing of this key.
    pub fn derive_key(&self, purpose: &str) -> [u8; 32] {
        self.hash("derive", purpose.as_bytes())
    }

    /// The first 8 bytes of [`HashKey::hash`] as 16 hex characters: short
    /// enough to read in an incident, long enough not to collide in practice.
    pub fn short_hex(&self, domain: &str, data: &[u8]) -> String {
        hex::encode(&self.hash(domain, data)[..8])
    }
}

impl fmt::Debug for HashKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HashKey(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn domains_separate_and_keys_matter() {
        let k = HashKey::new([7; 32]);
        assert_ne!(k.hash("a", b"x"), k.hash("b", b"x"));
        assert_eq!(k.hash("a", b"x"), k.hash("a", b"x"));
        assert_ne!(k.hash("a", b"x"), HashKey::new([8; 32]).hash("a", b"x"));
        assert_eq!(k.short_hex("a", b"x").len(), 16);
    }

    #[test]
    fn from_hex_rejects_bad_keys() {
        assert!(HashKey::from_hex(&"ab".repeat(32)).is_ok());
        assert!(HashKey::from_hex("abc").is_err());
        assert!(HashKey::from_hex(&"zz".repeat(32)).is_err());
        assert!(HashKey::from_hex(&"ab".repeat(31)).is_err());
    }
}
