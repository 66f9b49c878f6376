//! Unit tests of `admin.rs`.

use super::*;

fn info(base: u64, tip: Option<u64>) -> JournalInfo {
    JournalInfo {
        session: Uuid::nil(),
        revision: 1,
        base,
        tip: tip.map(|seq| Tip {
            seq,
            epoch: Epoch(1),
            nonce: Uuid::nil(),
        }),
        owner: None,
    }
}

proptest::proptest! {
    /// Any base and tip, as the bytes under the namespace say: a length, never a panic.
    #[test]
    fn any_base_and_tip_have_a_length(
        base in proptest::prelude::any::<u64>(),
        seq in proptest::prelude::any::<u64>(),
    ) {
        let expected = (u128::from(seq) + 1).saturating_sub(u128::from(base));
        let len = info(base, Some(seq)).len();
        proptest::prop_assert_eq!(u128::from(len), expected.min(u128::from(u64::MAX)));
    }
}

#[test]
fn lengths_at_the_ends_of_the_sequence() {
    assert_eq!(info(1, None).len(), 0);
    assert!(info(1, None).is_empty());
    assert_eq!(info(1, Some(1)).len(), 1);
    assert_eq!(info(5, Some(4)).len(), 0);
    assert_eq!(info(1, Some(u64::MAX)).len(), u64::MAX);
    assert_eq!(info(0, Some(u64::MAX)).len(), u64::MAX);
    assert_eq!(info(u64::MAX, Some(u64::MAX)).len(), 1);
}
