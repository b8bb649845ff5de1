//! Authenticated datagrams (docs/PROTOCOL.md, "Authentication"): the
//! algorithms a cluster key can be used with and the per-direction key.
//!
//! The management layer of Li et al. [CI] section 3 required authenticated
//! messages; the construction is QUIC's and WireGuard's: an AEAD from a
//! well-kept crate (`aws-lc-rs`), a fresh packet number as its nonce, the
//! header and packet number authenticated, the body authenticated and,
//! unless the endpoint chose authentication alone, encrypted.
//!
//! Why three algorithms: AES-256-GMAC authenticates without encrypting
//! (the body stays readable, a capture shows the traffic) and is the
//! cheapest, GHASH with carry-less multiplies running at several bytes a
//! cycle; AES-256-GCM adds encryption; ChaCha20-Poly1305 is the encrypting
//! one for machines without AES instructions. Why aws-lc-rs and not ring:
//! ring hashes associated data at under 2 GB/s whatever its length, so
//! its GMAC was slower than its AES-GCM; aws-lc-rs's runs at 6 to 20 GB/s
//! here (docs/PROTOCOL.md, "Authentication", has the figures and the
//! command that prints them).

/// How an authenticated datagram is protected, as named on the wire
/// (header byte 4 when the `AUTHENTICATED` flag is set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum AuthKind {
    /// AES-256-GCM: the body encrypted, everything authenticated.
    Aes256Gcm = 1,
    /// ChaCha20-Poly1305 (RFC 8439): the same, for machines without AES
    /// instructions.
    ChaCha20Poly1305 = 2,
    /// AES-256-GMAC: AES-GCM with nothing to encrypt, the whole datagram
    /// authenticated and its body left in clear. The default: a MAC on
    /// every datagram, encryption when the endpoint asks for it.
    #[default]
    Aes256Gmac = 3,
}

impl AuthKind {
    pub const ALL: [AuthKind; 3] = [AuthKind::Aes256Gcm, AuthKind::ChaCha20Poly1305, AuthKind::Aes256Gmac];

    pub fn from_u8(v: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|k| *k as u8 == v)
    }

    pub fn name(self) -> &'static str {
        match self {
            AuthKind::Aes256Gcm => "aes-256-gcm",
            AuthKind::ChaCha20Poly1305 => "chacha20-poly1305",
            AuthKind::Aes256Gmac => "aes-256-gmac",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// Is the body encrypted?
    pub fn encrypts(self) -> bool {
        self != AuthKind::Aes256Gmac
    }

    fn algorithm(self) -> &'static aws_lc_rs::aead::Algorithm {
        match self {
            AuthKind::Aes256Gcm | AuthKind::Aes256Gmac => &aws_lc_rs::aead::AES_256_GCM,
            AuthKind::ChaCha20Poly1305 => &aws_lc_rs::aead::CHACHA20_POLY1305,
        }
    }
}

/// Bytes of the authentication tag (16 for every [`AuthKind`]).
pub const TAG_LEN: usize = 16;

/// A key for authenticated datagrams in one direction of one session, its
/// key schedule computed once and shared: a clone is a reference count, so
/// a writer or a receive path may hold one per datagram for nothing. Never
/// printed: `Debug` says nothing of it.
#[derive(Clone)]
pub struct MacKey {
    kind: AuthKind,
    key: std::sync::Arc<aws_lc_rs::aead::LessSafeKey>,
}

impl core::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "MacKey({}, ..)", self.kind.name())
    }
}

impl MacKey {
    /// A key from 32 bytes (already derived: see [`MacKey::derive`]).
    pub fn from_bytes(kind: AuthKind, bytes: [u8; 32]) -> Self {
        let key =
            aws_lc_rs::aead::UnboundKey::new(kind.algorithm(), &bytes).expect("32 bytes is a 256-bit key");
        MacKey { kind, key: std::sync::Arc::new(aws_lc_rs::aead::LessSafeKey::new(key)) }
    }

    /// The key for one purpose, derived from `secret` and a list of
    /// numbers (node ids, incarnations) under a context string: BLAKE3's
    /// key derivation, so keys for different purposes are independent.
    /// The algorithm is derived into the key too: one key is never used
    /// with two algorithms.
    pub fn derive(kind: AuthKind, secret: &[u8; 32], context: &str, words: &[u64]) -> Self {
        let mut material = [0u8; 32 + 8 + 8 * 8];
        material[..32].copy_from_slice(secret);
        material[32..40].copy_from_slice(&(kind as u64).to_le_bytes());
        let n = words.len().min(8);
        for (i, w) in words[..n].iter().enumerate() {
            material[40 + 8 * i..48 + 8 * i].copy_from_slice(&w.to_le_bytes());
        }
        Self::from_bytes(kind, blake3::derive_key(context, &material[..40 + 8 * n]))
    }

    pub fn kind(&self) -> AuthKind {
        self.kind
    }

    /// Protect `body` in place (encrypt it, unless the algorithm leaves it
    /// in clear) and return the tag over it and `aad`, under packet number
    /// `pn` (the nonce: never used twice under one key). For
    /// [`AuthKind::Aes256Gmac`] the caller passes the body inside `aad`
    /// and an empty `body`.
    pub(crate) fn seal(&self, pn: u64, aad: &[u8], body: &mut [u8]) -> [u8; TAG_LEN] {
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce(pn), aws_lc_rs::aead::Aad::from(aad), body)
            .expect("a datagram is far below the algorithm's length limit");
        let mut out = [0u8; TAG_LEN];
        out.copy_from_slice(tag.as_ref());
        out
    }

    /// Check `tag` over `aad` and the ciphertext `body`, decrypting it
    /// into `out` (as long) in the same pass; false (and `out` garbage) if
    /// they do not check. The tag is compared in constant time (the
    /// library's own comparison).
    pub(crate) fn open(&self, pn: u64, aad: &[u8], tag: &[u8], body: &[u8], out: &mut [u8]) -> bool {
        let aad = aws_lc_rs::aead::Aad::from(aad);
        self.key.open_separate_gather(nonce(pn), aad, body, tag, out).is_ok()
    }
}

/// The 96-bit nonce of packet number `pn`.
fn nonce(pn: u64) -> aws_lc_rs::aead::Nonce {
    let mut n = [0u8; 12];
    n[4..].copy_from_slice(&pn.to_le_bytes());
    aws_lc_rs::aead::Nonce::assume_unique_for_key(n)
}
