//! The store's journals: [`Store::open_journal`] under a lease, their replays, a retried
//! append looked up ([`Store::find_append`]) and a journal deleted.

use uuid::Uuid;

use super::Store;
use crate::journal::{
    self, Authority, Deleted, Event, Journal, NilLeaseError, OpenJournalError, Record, Replay,
    ReplayOptions, Retention, RetentionError,
};
use crate::lease::Lease;

impl Store {
    /// Opens `session`'s journal for appending under `lease`: appends a fence at the current
    /// tip and returns once it has committed. See the [`journal`](mod@crate::journal) module.
    ///
    /// `None` fails with [`NilLeaseError`]; a lease of another session, or a second open with
    /// the same lease, with typed errors too (one journal per lease, so fence epochs strictly
    /// increase).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use leasehold::{Store, StoreOptions, Uuid};
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = Store::connect(StoreOptions::new(["http://127.0.0.1:2379"])).await?;
    /// let session = Uuid::new_v4();
    /// let lease = store.acquire_lease(session).await?;
    /// // Appends the fence: from here on, no earlier owner's append can commit.
    /// let journal = store.open_journal(session, Some(&lease)).await?;
    /// let appended = journal.append(b"started").await?;
    /// println!("event {} under epoch {}", appended.first_seq, journal.epoch());
    /// // The last append settles before the lease is released.
    /// journal.close().await;
    /// lease.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    #[tracing::instrument(name = "open", skip_all, parent = self.shared.span(), fields(%session, epoch = tracing::field::Empty))]
    pub async fn open_journal(
        &self,
        session: Uuid,
        lease: Option<&Lease>,
    ) -> Result<Journal, OpenJournalError> {
        let lease = lease.ok_or(OpenJournalError::NilLease(NilLeaseError {
            session_id: session,
        }))?;
        if lease.session_id() != session {
            return Err(OpenJournalError::WrongSession {
                session_id: session,
                lease_session: lease.session_id(),
            });
        }
        if lease.store_id() != self.shared.id {
            return Err(OpenJournalError::ForeignLease);
        }
        tracing::Span::current().record("epoch", tracing::field::display(lease.epoch()));
        let state = lease.state().clone();
        if !state.claim_journal() {
            return Err(OpenJournalError::AlreadyOpen {
                epoch: lease.epoch(),
            });
        }
        let opened = journal::open(
            self.shared.journal_context(),
            lease.ownership(),
            // A tip that does not decode is left for the open's read to report.
            state
                .take_seen_tip()
                .and_then(|tip| journal::SeenTip::of(tip.as_ref()).ok()),
        )
        .await;
        // A fence whose outcome is unknown may have committed: never fence again with this
        // epoch.
        state.settle_journal(!matches!(
            opened,
            Err(OpenJournalError::Etcd(_)
                | OpenJournalError::LeaseLost(_)
                | OpenJournalError::Decode(_)
                | OpenJournalError::SequenceExhausted { .. })
        ));
        opened
    }

    /// Deletes `session`'s whole journal (records, tip, base) under `lease`, for a finished
    /// session: one transaction guarded by the owner key's epoch (see the
    /// [retention](mod@crate::journal#retention) protocol). A journal still open under the
    /// lease is fenced by it (its next append fails). Idempotent: no journal, nothing deleted.
    ///
    /// Fails with [`NotOwner`](RetentionError::NotOwner) when `lease` is not (or no longer)
    /// the owner of `session`, and [`LeaseLost`](RetentionError::LeaseLost) once it is invalid.
    pub async fn delete_journal(
        &self,
        session: Uuid,
        lease: &Lease,
    ) -> Result<Deleted, RetentionError> {
        let ownership = lease.ownership();
        if session != lease.session_id() {
            return Err(RetentionError::NotOwner {
                session,
                epoch: lease.epoch(),
                owner: None,
            });
        }
        let context = self.shared.journal_context();
        Retention {
            connection: &context.connection,
            namespace: &context.namespace,
            policy: &context.policy,
            stop: &context.stop,
            session,
            authority: Authority::Owner(&ownership),
        }
        .delete()
        .await
    }

    /// Replays `session`'s events (fences hidden) at one snapshot revision. Needs no lease.
    ///
    /// # Examples
    ///
    /// The stream is read with `futures_util::StreamExt` (its `next`), once pinned:
    ///
    /// ```no_run
    /// use std::pin::pin;
    ///
    /// use futures_util::StreamExt as _;
    /// use leasehold::{Store, StoreOptions, Uuid};
    ///
    /// # async fn example() -> Result<(), Box<dyn std::error::Error>> {
    /// let store = Store::connect(StoreOptions::new(["http://127.0.0.1:2379"])).await?;
    /// let session = Uuid::from_u128(7);
    /// let mut events = pin!(store.replay(session));
    /// while let Some(event) = events.next().await {
    ///     let event = event?;
    ///     println!("{} (epoch {}): {} bytes", event.seq, event.epoch, event.payload.len());
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn replay(
        &self,
        session: Uuid,
    ) -> impl futures_util::Stream<Item = Result<Event, journal::ReplayError>> + Send + 'static
    {
        use futures_util::StreamExt as _;
        self.replay_records(session)
            .filter_map(|record| async move {
                match record {
                    Ok(Record::Event(event)) => Some(Ok(event)),
                    Ok(Record::Fence(_)) => None,
                    Err(error) => Some(Err(error)),
                }
            })
    }

    /// Replays all of `session`'s records, fences included (for maintenance and index
    /// hydration), at one snapshot revision. Needs no lease.
    pub fn replay_records(&self, session: Uuid) -> Replay {
        self.replay_with(session, self.shared.replay.clone())
    }

    /// What became of an append to `session`'s journal under `epoch` made with `key`
    /// ([`Journal::append_with_key`](crate::Journal::append_with_key)), from the journal's own
    /// records, with `payloads` to compare: for a retry that comes after the journal that made
    /// it is gone (its process restarted, the session moved on). Needs no lease, and appends
    /// nothing.
    ///
    /// One linearizable read of the owner key, tip and base, then the records back from the tip
    /// a page at a time (1,000 records, fewer when large) to the key's append or to `epoch`'s
    /// fence: see [`Found`](crate::Found) for what it can say, and the
    /// [`journal`](mod@crate::journal) module for the protocol.
    ///
    /// ```no_run
    /// # async fn example(store: leasehold::Store, session: leasehold::Uuid, epoch: leasehold::Epoch)
    /// # -> Result<(), leasehold::ReplayError> {
    /// use leasehold::{Found, IdempotencyKey};
    ///
    /// let key = IdempotencyKey::new("order-7/step-3");
    /// match store.find_append(session, epoch, key, &[b"charged card"]).await? {
    ///     Found::Appended(appended) => println!("committed at {}", appended.first_seq),
    ///     Found::NotAppended => println!("not in the journal, and never will be"),
    ///     Found::Unknown(why) => println!("cannot tell: {why}"),
    ///     other => println!("{other:?}"),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub async fn find_append<P: AsRef<[u8]>>(
        &self,
        session: Uuid,
        epoch: crate::lease::Epoch,
        key: journal::IdempotencyKey,
        payloads: &[P],
    ) -> Result<journal::Found, journal::ReplayError> {
        journal::find(
            &self.shared.connection,
            &self.shared.namespace,
            session,
            epoch,
            key,
            payloads,
        )
        .await
    }

    /// [`replay_records`](Self::replay_records) with other paging.
    pub fn replay_with(&self, session: Uuid, options: ReplayOptions) -> Replay {
        Replay::new(
            self.shared.connection.clone(),
            self.shared.namespace.records_prefix(session),
            self.shared.namespace.base_key(session),
            options,
        )
    }
}
