//! Transaction pieces every layer above builds with: the guarded delete ([`Delete`]), and
//! reading the gets out of a reply ([`gets`]).

use etcd_client::{Compare, CompareOp, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse};

/// One guarded delete: `if <guard> then delete(key)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Delete {
    pub(crate) key: String,
    pub(crate) guard: Guard,
}

/// What must still hold for a [`Delete`] to go ahead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Guard {
    /// The key still has this create_revision: exactly the key created then (an owner key at
    /// its epoch, a workspace root), never a successor's.
    CreateRevision(i64),
    /// The key still holds this value (unique to its writer: an owner value with its nonce, a
    /// workspace root's session and epoch).
    Value(Vec<u8>),
}

impl Delete {
    pub(crate) fn created_at(key: impl Into<String>, create_revision: i64) -> Self {
        Self {
            key: key.into(),
            guard: Guard::CreateRevision(create_revision),
        }
    }

    pub(crate) fn holding(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            key: key.into(),
            guard: Guard::Value(value.into()),
        }
    }

    pub(crate) fn txn(&self) -> Txn {
        let key = self.key.as_str();
        let compare = match &self.guard {
            Guard::CreateRevision(revision) => {
                Compare::create_revision(key, CompareOp::Equal, *revision)
            }
            Guard::Value(value) => Compare::value(key, CompareOp::Equal, value.clone()),
        };
        Txn::new()
            .when([compare])
            .and_then([TxnOp::delete(key, None)])
    }

    pub(crate) fn name(&self) -> String {
        match &self.guard {
            Guard::CreateRevision(revision) => format!("{}@{revision}", self.key),
            Guard::Value(value) => format!("{}={}", self.key, String::from_utf8_lossy(value)),
        }
    }
}

/// The first key-value of each get in a transaction's reply, in order.
pub(crate) fn gets(response: &TxnResponse) -> impl Iterator<Item = Option<KeyValue>> + '_ {
    response
        .op_responses()
        .into_iter()
        .filter_map(|op| match op {
            TxnOpResponse::Get(get) => Some(get.kvs().first().cloned()),
            _ => None,
        })
}
