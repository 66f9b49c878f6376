//! An ownership's token: the holder's authority to write.
//!
//! Each ownership a stream acquires gets 128 bits from the operating system's CSPRNG, sent
//! only in that stream's `Acquired` event. Every write for the holder (`Append`, `Trim`)
//! carries it; a write without the live ownership's token writes nothing. The epoch is public
//! (`Owner`, `WatchOwners`, `Validate` hand it to anyone) and is never a credential. A token is
//! never logged, and compared in constant time.

use subtle::ConstantTimeEq as _;

/// The token's length.
const LEN: usize = 16;

/// An ownership's token (see the module docs).
pub(crate) struct Token([u8; LEN]);

impl Token {
    /// A fresh token from the system's CSPRNG.
    pub(crate) fn new() -> Self {
        let mut bytes = [0; LEN];
        ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
            .expect("the operating system's random number generator works");
        Self(bytes)
    }

    /// Whether `given` is this token, in time independent of where they differ.
    pub(crate) fn is(&self, given: &[u8]) -> bool {
        given.len() == LEN && bool::from(self.0.ct_eq(given))
    }

    /// The token as sent to its holder.
    pub(crate) fn to_vec(&self) -> Vec<u8> {
        self.0.to_vec()
    }
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(…)")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_only_itself_and_never_shown() {
        let (one, two) = (Token::new(), Token::new());
        assert!(one.is(&one.to_vec()));
        assert!(!one.is(&two.to_vec()));
        assert!(!one.is(&[]));
        assert!(!one.is(&one.to_vec()[..LEN - 1]));
        assert_eq!(format!("{one:?}"), "Token(…)");
    }
}
