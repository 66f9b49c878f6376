//! The metrics leasehold records, through the [`metrics`](https://docs.rs/metrics) facade:
//! install any exporter (the `leasehold` tool serves Prometheus text with
//! `leasehold node --metrics-addr`), and call [`describe`] once to give them help texts.
//!
//! Every metric carries the labels `node` and `namespace` of the [`Store`](crate::Store) that
//! recorded it, so that a process with several stores can be read.
//!
//! | metric | kind | labels | what |
//! | --- | --- | --- | --- |
//! | `leasehold_sessions_held` | gauge | | leases handed out and not yet lost |
//! | `leasehold_acquisitions_total` | counter | `outcome`: `acquired`, `held`, `failed` | acquisition attempts |
//! | `leasehold_losses_total` | counter | `reason`: `released`, `revoked`, `overtaken`, `expired`, `keepalive_failed`, `store_closed`, `permission_denied` | leases lost, by the first reason |
//! | `leasehold_keepalive_round_trip_seconds` | histogram | | from a keepalive's send to its reply |
//! | `leasehold_validity_slack_seconds` | gauge | | the node lease's deadline minus now, at each renewal |
//! | `leasehold_appends_total` | counter | `outcome`: `ok`, `fenced`, `unknown_resolved`, `unknown`, `failed` | append calls |
//! | `leasehold_append_records_total` | counter | `outcome` | records in those calls |
//! | `leasehold_append_seconds` | histogram | | an append call, from its start to its answer |
//! | `leasehold_append_batch_records` | histogram | | records per append transaction (group commit) |
//! | `leasehold_append_txn_journals` | histogram | | journals per etcd transaction a store sends for appends (1: alone; more: shared across sessions), re-sends of the same transaction not counted; the fences of journals being opened, which share these transactions too, are not counted |
//! | `leasehold_watch_restarts_total` | counter | | restarts of the node's owner watch |
//! | `leasehold_sessions_quarantined` | gauge | | sessions a `SessionHost` of the store keeps failing to open (quarantined: retried with backoff) |
//! | `leasehold_nospace` | gauge | | 1 while etcd refuses the store's writes for space (its NOSPACE alarm), else 0 |
//! | `leasehold_nospace_alarms_total` | counter | | times etcd's NOSPACE alarm stopped the store's writes: a write refused for space after one accepted (or none yet) |
//! | `leasehold_sidecar_streams` | gauge | | `Attach` streams open on a sidecar (`leasehold serve`) of the store |
//! | `leasehold_sidecar_sessions` | gauge | | sessions owned through those streams |
//! | `leasehold_sidecar_calls_total` | counter | `rpc`: `attach`, `append`, `replay`, `validate`, `owner`, `watch_owners`; `code`: the gRPC code answered (`OK`, `FAILED_PRECONDITION`, …) | the sidecar's calls, by how they were answered (a stream's at its start) |
//! | `leasehold_sidecar_retries_total` | counter | `answer`: `waited`, `journal`, `not_appended`, `unknown` | appends with a request id seen before (or not the live holder's to write): told what the first call, under way, came to; answered from the journal's records; refused, the journal proving it is not there and never will be; or unknown (still owned elsewhere, trimmed) |
//!
//! The NOSPACE pair follows what etcd answers the store's appends and acquisitions (see
//! [`Store::nospace_alarm`](crate::Store::nospace_alarm)): a write refused with etcd's
//! `mvcc: database space exceeded` raises it, the next write etcd accepts clears it, and other
//! failures say nothing about space.
//!
//! An append call counts once, under one `outcome`, when it is answered
//! (`leasehold_appends_total`, with its records in `leasehold_append_records_total` and its
//! time in `leasehold_append_seconds`). Not counted: a call refused at once, before it is
//! queued (`JournalWriteError::Empty`, `TooManyRecords`, `TooLarge`), and a call whose future
//! is dropped before its answer.
//!
//! | `outcome` | the call got |
//! | --- | --- |
//! | `ok` | its sequence numbers, from etcd's reply to one of the sends |
//! | `fenced` | `JournalWriteError::Fenced`, from a reply (a failed compare), or because the journal was fenced already |
//! | `unknown_resolved` | the sends' outcome stayed unknown until the lease stopped being valid, and the resolving read settled it: its sequence numbers (committed) or `Fenced` (not committed) |
//! | `unknown` | `JournalWriteError::OutcomeUnknown`: not even the resolving read could settle it |
//! | `failed` | any other error: refused before sending (a lost lease, a closed journal, the sequence at its end), an etcd failure that certainly did not apply, or `JournalWriteError::Indeterminate`. The last is not always "not applied": a call queued in a transaction whose sender's future was dropped mid-send is told `Indeterminate`, and that transaction may have committed |

use std::sync::Arc;
use std::time::Duration;

use metrics::{Label, SharedString, counter, gauge, histogram};
use tokio::sync::watch;

use crate::keys::Namespace;

const SESSIONS_HELD: &str = "leasehold_sessions_held";
const ACQUISITIONS: &str = "leasehold_acquisitions_total";
const LOSSES: &str = "leasehold_losses_total";
const KEEPALIVE_ROUND_TRIP: &str = "leasehold_keepalive_round_trip_seconds";
const VALIDITY_SLACK: &str = "leasehold_validity_slack_seconds";
const APPENDS: &str = "leasehold_appends_total";
const APPEND_RECORDS: &str = "leasehold_append_records_total";
const APPEND_SECONDS: &str = "leasehold_append_seconds";
const APPEND_BATCH: &str = "leasehold_append_batch_records";
const APPEND_TXN_JOURNALS: &str = "leasehold_append_txn_journals";
const WATCH_RESTARTS: &str = "leasehold_watch_restarts_total";
const SESSIONS_QUARANTINED: &str = "leasehold_sessions_quarantined";
const NOSPACE: &str = "leasehold_nospace";
const NOSPACE_ALARMS: &str = "leasehold_nospace_alarms_total";
const SIDECAR_STREAMS: &str = "leasehold_sidecar_streams";
const SIDECAR_SESSIONS: &str = "leasehold_sidecar_sessions";
const SIDECAR_CALLS: &str = "leasehold_sidecar_calls_total";
const SIDECAR_RETRIES: &str = "leasehold_sidecar_retries_total";

/// Gives every leasehold metric its unit and help text in the installed recorder.
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(SESSIONS_HELD, "Session leases handed out and not yet lost");
    describe_counter!(ACQUISITIONS, "Acquisition attempts, by outcome");
    describe_counter!(LOSSES, "Session leases lost, by the first reason");
    describe_histogram!(
        KEEPALIVE_ROUND_TRIP,
        Unit::Seconds,
        "From a node lease keepalive's send to its reply"
    );
    describe_gauge!(
        VALIDITY_SLACK,
        Unit::Seconds,
        "The node lease's validity deadline minus now, at each renewal"
    );
    describe_counter!(APPENDS, "Journal append calls, by outcome");
    describe_counter!(
        APPEND_RECORDS,
        "Records in journal append calls, by outcome"
    );
    describe_histogram!(
        APPEND_SECONDS,
        Unit::Seconds,
        "A journal append call, from its start to its answer"
    );
    describe_histogram!(APPEND_BATCH, "Records per journal append transaction");
    describe_histogram!(
        APPEND_TXN_JOURNALS,
        "Journals per etcd transaction sent for appends (shared across sessions)"
    );
    describe_counter!(WATCH_RESTARTS, "Restarts of the node's owner watch");
    describe_gauge!(
        SESSIONS_QUARANTINED,
        "Sessions a session host keeps failing to open, retried with backoff"
    );
    describe_gauge!(
        NOSPACE,
        "1 while etcd refuses this store's writes for space (its NOSPACE alarm)"
    );
    describe_counter!(
        NOSPACE_ALARMS,
        "Times etcd's NOSPACE alarm stopped this store's writes"
    );
    describe_gauge!(SIDECAR_STREAMS, "Attach streams open on the sidecar");
    describe_gauge!(
        SIDECAR_SESSIONS,
        "Sessions owned through the sidecar's streams"
    );
    describe_counter!(
        SIDECAR_CALLS,
        "Sidecar calls, by RPC and the gRPC code answered"
    );
    describe_counter!(
        SIDECAR_RETRIES,
        "Sidecar appends with a request id seen before, by how they were answered"
    );
}

/// The labels of one store, and the recording of its metrics.
#[derive(Clone, Debug)]
pub(crate) struct Metrics {
    labels: Arc<[Label]>,
    /// Whether etcd's last answer to a write of this store was a refusal for space: kept to
    /// count each alarm once, and shown by [`Store::nospace_alarm`](crate::Store::nospace_alarm).
    nospace: Arc<watch::Sender<bool>>,
}

impl Metrics {
    pub(crate) fn new(node: &str, namespace: &Namespace) -> Self {
        let metrics = Self {
            // Shared, so that each recording clones the labels without copying the strings.
            labels: Arc::from(vec![
                Label::new("node", SharedString::from_shared(Arc::from(node))),
                Label::new(
                    "namespace",
                    SharedString::from_shared(Arc::from(namespace.as_str())),
                ),
            ]),
            nospace: Arc::new(watch::Sender::new(false)),
        };
        gauge!(NOSPACE, metrics.labels()).set(0.0);
        metrics
    }

    fn labels(&self) -> Vec<Label> {
        self.labels.to_vec()
    }

    fn with(&self, key: &'static str, value: &'static str) -> Vec<Label> {
        let mut labels = self.labels();
        labels.push(Label::new(key, value));
        labels
    }

    pub(crate) fn acquisition(&self, outcome: &'static str) {
        counter!(ACQUISITIONS, self.with("outcome", outcome)).increment(1);
    }

    pub(crate) fn held(&self) {
        gauge!(SESSIONS_HELD, self.labels()).increment(1.0);
    }

    /// A held lease was lost, for the reason labelled `reason` (`LossReason::label`).
    pub(crate) fn lost(&self, reason: &'static str) {
        gauge!(SESSIONS_HELD, self.labels()).decrement(1.0);
        counter!(LOSSES, self.with("reason", reason)).increment(1);
    }

    pub(crate) fn keepalive(&self, round_trip: Duration, slack: Duration) {
        histogram!(KEEPALIVE_ROUND_TRIP, self.labels()).record(round_trip.as_secs_f64());
        gauge!(VALIDITY_SLACK, self.labels()).set(slack.as_secs_f64());
    }

    /// One append call: its answer, and whether its transaction's outcome was unknown until
    /// the resolving read settled it.
    /// One append call of `records` records, answered with `outcome` after `took`.
    pub(crate) fn append(&self, outcome: AppendOutcome, records: usize, took: Duration) {
        let outcome = outcome.label();
        counter!(APPENDS, self.with("outcome", outcome)).increment(1);
        counter!(APPEND_RECORDS, self.with("outcome", outcome)).increment(records as u64);
        histogram!(APPEND_SECONDS, self.labels()).record(took.as_secs_f64());
    }

    pub(crate) fn batch(&self, records: usize) {
        histogram!(APPEND_BATCH, self.labels()).record(records as f64);
    }

    /// One etcd transaction for appends, carrying `journals` journals' appends.
    pub(crate) fn append_txn(&self, journals: usize) {
        histogram!(APPEND_TXN_JOURNALS, self.labels()).record(journals as f64);
    }

    pub(crate) fn watch_restart(&self) {
        counter!(WATCH_RESTARTS, self.labels()).increment(1);
    }

    /// A session entered quarantine (`1.0`) or left it (`-1.0`).
    pub(crate) fn quarantined(&self, change: f64) {
        gauge!(SESSIONS_QUARANTINED, self.labels()).increment(change);
    }

    /// etcd answered a write that puts keys as `put` says. Follows etcd's NOSPACE alarm (see
    /// the [module docs](self)).
    pub(crate) fn written(&self, put: Put) {
        let raised = put == Put::RefusedForSpace;
        let mut was = raised;
        // Receivers wake only on a change.
        self.nospace.send_if_modified(|state| {
            was = std::mem::replace(state, raised);
            was != raised
        });
        if raised != was {
            gauge!(NOSPACE, self.labels()).set(if raised { 1.0 } else { 0.0 });
        }
        if raised && !was {
            counter!(NOSPACE_ALARMS, self.labels()).increment(1);
        }
    }

    /// An `Attach` stream of a sidecar opened (`1.0`) or ended (`-1.0`).
    #[cfg(feature = "grpc")]
    pub(crate) fn sidecar_stream(&self, change: f64) {
        gauge!(SIDECAR_STREAMS, self.labels()).increment(change);
    }

    /// A session came to be owned through a sidecar's stream (`1.0`), or stopped (`-1.0`).
    #[cfg(feature = "grpc")]
    pub(crate) fn sidecar_session(&self, change: f64) {
        gauge!(SIDECAR_SESSIONS, self.labels()).increment(change);
    }

    /// A sidecar call of `rpc`, answered with the gRPC code named `code`.
    #[cfg(feature = "grpc")]
    pub(crate) fn sidecar_call(&self, rpc: &'static str, code: &'static str) {
        let mut labels = self.with("rpc", rpc);
        labels.push(Label::new("code", code));
        counter!(SIDECAR_CALLS, labels).increment(1);
    }

    /// A retry of a sidecar append (its request id seen before), answered as `answer` says.
    #[cfg(feature = "grpc")]
    pub(crate) fn sidecar_retry(&self, answer: &'static str) {
        counter!(SIDECAR_RETRIES, self.with("answer", answer)).increment(1);
    }

    /// Whether etcd refuses this store's writes for space, as its last answer said.
    pub(crate) fn nospace(&self) -> watch::Receiver<bool> {
        self.nospace.subscribe()
    }
}

/// What etcd answered a write that puts keys, as far as its NOSPACE alarm goes (other refusals
/// say nothing about space, and are not told).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Put {
    /// Accepted, a failed compare included: etcd refuses such a transaction for space before
    /// it looks at its compares.
    Accepted,
    /// Refused with `mvcc: database space exceeded`.
    RefusedForSpace,
}

/// What an append call got, as the `outcome` label counts it (the table in the
/// [module docs](self)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AppendOutcome {
    /// `ok`: its sequence numbers, from a reply.
    Committed,
    /// `fenced`: the hard fence, from a reply or a journal fenced already.
    Fenced,
    /// `unknown_resolved`: committed or fenced, as only the resolving read could tell.
    Resolved,
    /// `unknown`: not even the resolving read could settle it.
    Unknown,
    /// `failed`: any other error.
    Failed,
}

impl AppendOutcome {
    fn label(self) -> &'static str {
        match self {
            AppendOutcome::Committed => "ok",
            AppendOutcome::Fenced => "fenced",
            AppendOutcome::Resolved => "unknown_resolved",
            AppendOutcome::Unknown => "unknown",
            AppendOutcome::Failed => "failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_for_space_raises_the_nospace_alarm_and_an_accepted_write_clears_it() {
        let metrics = Metrics::new("n", &Namespace::default());
        let nospace = metrics.nospace();
        assert!(!*nospace.borrow());
        metrics.written(Put::RefusedForSpace);
        assert!(*nospace.borrow());
        metrics.written(Put::RefusedForSpace);
        assert!(*nospace.borrow());
        metrics.written(Put::Accepted);
        assert!(!*nospace.borrow());
    }
}
