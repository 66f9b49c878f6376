//! The writes: `Append` and `Trim` (the holder's, with its token) and `Delete` (a journal
//! nobody owns); and how an append with a request id is answered when it is not the holder's
//! to write.
//!
//! An append under `(session, epoch)` with token `t` and request id `r`:
//!
//! | the ownership here | `t` its token | answered by |
//! |---|---|---|
//! | owned at `epoch` | yes | the journal: appended, or (a key sent already) the first call's answer |
//! | owned at `epoch` | no | the journal's answer for `r` if it has one; else `NOT_HOLDER`, nothing written |
//! | ended, being released | either | the journal's answer for `r` if it has one; else refused (closed: never) |
//! | not owned here | either | the journal's records for `r` ([`Store::find_append`](crate::Store::find_append)) |
//!
//! The records' answer: appended (the first call's sequence numbers), not appended and never
//! will be (refused, `FAILED_PRECONDITION`), or unknown (`OUTCOME_UNKNOWN`, saying why).

use tonic::{Response, Status};
use uuid::Uuid;

use super::proto::{
    AppendRequest, AppendResponse, DeleteRequest, DeleteResponse, TrimRequest, TrimResponse,
};
use super::refusal::Refusal;
use super::{Owned, Sidecar, Standing, hold, parse_session};
use crate::journal::{Appended, Found, IdempotencyKey, Repeat};
use crate::lease::Epoch;

fn response(appended: Appended) -> AppendResponse {
    AppendResponse {
        first_seq: appended.first_seq,
        last_seq: appended.last_seq,
        revision: appended.revision,
    }
}

impl Sidecar {
    pub(super) async fn append_call(
        &self,
        request: AppendRequest,
    ) -> Result<Response<AppendResponse>, Status> {
        let session = parse_session(&request.session).map_err(|r| r.status())?;
        let key = self.request_key(&request.request_id)?;
        let bytes = request.payloads.iter().map(Vec::len).sum();
        let _held = hold(
            &self.inner.bounds.bytes,
            bytes,
            "TOO_MANY_BYTES_IN_FLIGHT",
            &format!(
                "appends of {} payload bytes are under way (--max-bytes-in-flight)",
                self.inner.options.max_bytes_in_flight
            ),
        )?;
        let epoch = Epoch(request.epoch);
        let payloads = &request.payloads;
        let answered = match self.standing(session, epoch) {
            Standing::Owned(owned) if owned.token.is(&request.token) => {
                self.write(&owned, key, payloads).await
            }
            Standing::Owned(owned) => {
                let not_holder = Refusal::not_holder(session, epoch);
                self.answer_live(&owned, key, payloads, not_holder).await
            }
            Standing::Releasing(owned, refusal) => {
                self.answer_live(&owned, key, payloads, refusal).await
            }
            Standing::Refused(refusal) => match key {
                Some(key) => {
                    self.answer_from_records(session, epoch, key, payloads, refusal)
                        .await
                }
                None => Err(refusal),
            },
        };
        answered
            .map(Response::new)
            .map_err(|refusal| refusal.status())
    }

    /// The idempotency key of `request_id` (`None` if it is empty), or INVALID_ARGUMENT past
    /// the bound.
    fn request_key(&self, request_id: &str) -> Result<Option<IdempotencyKey>, Status> {
        let max = self.inner.options.max_request_id;
        if request_id.len() > max {
            return Err(Refusal::request_id_too_long(request_id.len(), max).status());
        }
        Ok((!request_id.is_empty()).then(|| IdempotencyKey::new(request_id)))
    }

    /// The holder's append.
    async fn write(
        &self,
        owned: &Owned,
        key: Option<IdempotencyKey>,
        payloads: &[Vec<u8>],
    ) -> Result<AppendResponse, Refusal> {
        let journal = &owned.journal;
        let result = match key {
            None => journal.append_batch(payloads).await,
            Some(key) => {
                let (result, repeat) = journal.append_keyed(key, payloads).await;
                match repeat {
                    Repeat::First => {}
                    Repeat::Waited => self.count_retry("waited"),
                    Repeat::Read => self.count_retry("journal"),
                }
                result
            }
        };
        result
            .map(response)
            .map_err(|error| Refusal::of_append(owned.session(), owned.epoch(), &error))
    }

    /// An append that `owned`'s journal takes no write for: its answer for `key` if it made an
    /// append with it (waiting for one under way), else `refusal`.
    async fn answer_live(
        &self,
        owned: &Owned,
        key: Option<IdempotencyKey>,
        payloads: &[Vec<u8>],
        refusal: Refusal,
    ) -> Result<AppendResponse, Refusal> {
        let Some(key) = key else {
            return Err(refusal);
        };
        let Some(answer) = owned.journal.appended_with_key(key, payloads).await else {
            return Err(refusal);
        };
        self.count_retry("journal");
        answer
            .map(response)
            .map_err(|error| Refusal::of_append(owned.session(), owned.epoch(), &error))
    }

    /// An append under an ownership not live here: the journal's records say what became of
    /// the append with `key`; not appended is `refusal`.
    async fn answer_from_records(
        &self,
        session: Uuid,
        epoch: Epoch,
        key: IdempotencyKey,
        payloads: &[Vec<u8>],
        refusal: Refusal,
    ) -> Result<AppendResponse, Refusal> {
        let found = self
            .inner
            .store
            .find_append(session, epoch, key, payloads)
            .await
            .map_err(|error| Refusal::of_read(&error))?;
        let (answer, counted) = match found {
            Found::Appended(appended) => (Ok(response(appended)), "journal"),
            Found::NotAppended => (Err(refusal), "not_appended"),
            Found::Reused { .. } => (Err(Refusal::reused()), "journal"),
            Found::Unknown(why) => (Err(Refusal::unknowable(session, epoch, why)), "unknown"),
        };
        self.count_retry(counted);
        answer
    }

    fn count_retry(&self, answer: &'static str) {
        self.inner.store.metrics().sidecar_retry(answer);
    }

    pub(super) async fn trim_call(
        &self,
        request: TrimRequest,
    ) -> Result<Response<TrimResponse>, Status> {
        let session = parse_session(&request.session).map_err(|r| r.status())?;
        let epoch = Epoch(request.epoch);
        let owned = match self.standing(session, epoch) {
            Standing::Owned(owned) if owned.token.is(&request.token) => owned,
            Standing::Owned(_) => return Err(Refusal::not_holder(session, epoch).status()),
            Standing::Releasing(_, refusal) | Standing::Refused(refusal) => {
                return Err(refusal.status());
            }
        };
        let trimmed = owned
            .journal
            .trim(request.before)
            .await
            .map_err(|error| Refusal::of_retention(session, epoch, &error).status())?;
        Ok(Response::new(TrimResponse {
            base: trimmed.base,
            removed: trimmed.removed,
        }))
    }

    pub(super) async fn delete_call(
        &self,
        request: DeleteRequest,
    ) -> Result<Response<DeleteResponse>, Status> {
        let session = parse_session(&request.session).map_err(|r| r.status())?;
        let store = &self.inner.store;
        let admin = crate::admin::Admin::new(store.connection().clone(), store.namespace().clone());
        let deleted = admin
            .delete_journal(session)
            .await
            .map_err(|error| Refusal::of_retention(session, Epoch(0), &error).status())?;
        Ok(Response::new(DeleteResponse { keys: deleted.keys }))
    }
}
