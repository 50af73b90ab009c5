//! Writer keys wrapped to the repository's recovery key: what lets a key that writes
//! (format 3's write-only keys) seal objects that only full keys can open.
//!
//! Every full key derives the repository's X25519 **recovery key pair** from its data key;
//! a write-only key holds only the public half (its [`Recipient`]). Each writer process
//! draws a random data key of its own and stores it wrapped to the recipient with HPKE
//! (RFC 9180, base mode, DHKEM(X25519, HKDF-SHA256), HKDF-SHA256, ChaCha20-Poly1305) in an
//! 80-byte [`Envelope`] beside what it seals. The writer forgets its key when it ends,
//! so nothing it wrote, nor anything another writer wrote, opens with what it keeps.
//!
//! ```
//! use cairn_core::envelope::RecoveryKey;
//!
//! let recovery = RecoveryKey::from_data_key(&[7; 32]);
//! let writer_key = [9; 32];
//! let envelope = recovery.recipient().wrap("repository id", &writer_key);
//! assert_eq!(*recovery.open("repository id", &envelope).unwrap(), writer_key);
//! assert!(recovery.open("another repository", &envelope).is_err());
//! ```

use hpke::aead::ChaCha20Poly1305;
use hpke::kdf::HkdfSha256;
use hpke::kem::X25519HkdfSha256;
use hpke::{Deserializable, Kem as _, OpModeR, OpModeS, Serializable};
use zeroize::Zeroizing;

type Kem = X25519HkdfSha256;

/// Input of RFC 9180's DeriveKeyPair for the recovery key pair, from the data key.
const RECOVERY_CONTEXT: &str = "cairn format 3 writer recovery key (X25519)";
/// HPKE `info`, followed by the repository id, so an envelope opens only in its own
/// repository.
const INFO_PREFIX: &[u8] = b"cairn format 3 writer key";

/// Bytes of an envelope: the encapsulated key (32) and the sealed data key (32 + 16).
pub const ENVELOPE_LEN: usize = 80;

/// A writer's data key, wrapped to the repository's recipient.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Envelope(pub [u8; ENVELOPE_LEN]);

impl std::fmt::Debug for Envelope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Envelope({})", hex::encode(&self.0[..8]))
    }
}

/// The public half of the recovery key pair: what a write-only key wraps its keys to.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Recipient(pub [u8; 32]);

/// An envelope that does not open: damaged, forged, or of another repository.
#[derive(Debug, thiserror::Error)]
#[error("a writer's key envelope does not open with this repository's key: it is damaged, forged, or from another repository")]
pub struct EnvelopeError;

fn info(repository_id: &str) -> Vec<u8> {
    [INFO_PREFIX, b" ", repository_id.as_bytes()].concat()
}

impl Recipient {
    /// Wraps `data_key` so that only the holders of the repository's full keys open it.
    pub fn wrap(&self, repository_id: &str, data_key: &[u8; 32]) -> Envelope {
        use rand_core_09::TryRngCore;
        let public = <Kem as hpke::Kem>::PublicKey::from_bytes(&self.0)
            .expect("every 32 bytes are an X25519 public key");
        let (enc, sealed) = hpke::single_shot_seal::<ChaCha20Poly1305, HkdfSha256, Kem, _>(
            &OpModeS::Base,
            &public,
            &info(repository_id),
            data_key,
            b"",
            &mut rand_core_09::OsRng.unwrap_err(),
        )
        .expect("sealing 32 bytes to a valid public key cannot fail");
        let mut out = [0; ENVELOPE_LEN];
        out[..32].copy_from_slice(&enc.to_bytes());
        out[32..].copy_from_slice(&sealed);
        Envelope(out)
    }
}

/// The repository's recovery key pair, which every full key derives from its data key.
pub struct RecoveryKey {
    secret: <Kem as hpke::Kem>::PrivateKey,
    recipient: Recipient,
}

impl RecoveryKey {
    /// The pair of the repository whose data key is `data_key`.
    pub fn from_data_key(data_key: &[u8; 32]) -> Self {
        let ikm = Zeroizing::new(blake3::derive_key(RECOVERY_CONTEXT, data_key));
        let (secret, public) = Kem::derive_keypair(ikm.as_slice());
        let mut recipient = [0; 32];
        recipient.copy_from_slice(&public.to_bytes());
        RecoveryKey {
            secret,
            recipient: Recipient(recipient),
        }
    }

    pub fn recipient(&self) -> Recipient {
        self.recipient
    }

    /// The data key in `envelope`, if it was wrapped to this pair for this repository.
    pub fn open(
        &self,
        repository_id: &str,
        envelope: &Envelope,
    ) -> Result<Zeroizing<[u8; 32]>, EnvelopeError> {
        let enc = <Kem as hpke::Kem>::EncappedKey::from_bytes(&envelope.0[..32])
            .map_err(|_| EnvelopeError)?;
        let opened = Zeroizing::new(
            hpke::single_shot_open::<ChaCha20Poly1305, HkdfSha256, Kem>(
                &OpModeR::Base,
                &self.secret,
                &enc,
                &info(repository_id),
                &envelope.0[32..],
                b"",
            )
            .map_err(|_| EnvelopeError)?,
        );
        let key: [u8; 32] = opened.as_slice().try_into().map_err(|_| EnvelopeError)?;
        Ok(Zeroizing::new(key))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pair_is_a_function_of_the_data_key_alone() {
        let a = RecoveryKey::from_data_key(&[1; 32]);
        let b = RecoveryKey::from_data_key(&[1; 32]);
        let c = RecoveryKey::from_data_key(&[2; 32]);
        assert!(a.recipient() == b.recipient());
        assert!(a.recipient() != c.recipient());
        let envelope = a.recipient().wrap("r", &[5; 32]);
        assert_eq!(*b.open("r", &envelope).unwrap(), [5; 32]);
        assert!(c.open("r", &envelope).is_err(), "another repository's key");
    }

    #[test]
    fn each_wrap_is_fresh_and_every_flipped_bit_is_refused() {
        let key = RecoveryKey::from_data_key(&[3; 32]);
        let one = key.recipient().wrap("r", &[8; 32]);
        let two = key.recipient().wrap("r", &[8; 32]);
        assert_ne!(one, two, "a fresh ephemeral key each time");
        for bit in 0..ENVELOPE_LEN * 8 {
            let mut bad = one;
            bad.0[bit / 8] ^= 1 << (bit % 8);
            assert!(key.open("r", &bad).is_err(), "bit {bit}");
        }
    }

    /// RFC 9180's test vector A.2.1 (DHKEM(X25519, HKDF-SHA256), HKDF-SHA256,
    /// ChaCha20-Poly1305, base mode): the crate implements the standard, so other
    /// implementations can open cairn's envelopes.
    #[test]
    fn derive_keypair_matches_rfc_9180() {
        let ikm = hex::decode("909a9b35d3dc4713a5e72a4da274b55d3d3821a37e5d099e74a647db583a904b")
            .unwrap();
        let (_, public) = Kem::derive_keypair(&ikm);
        assert_eq!(
            hex::encode(public.to_bytes()),
            "1afa08d3dec047a643885163f1180476fa7ddb54c6a8029ea33f95796bf2ac4a"
        );
    }
}
