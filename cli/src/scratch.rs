//! The namespace `demo` and `bench` write in: one of the run's own, beside the user's
//! `--namespace` rather than inside it (namespaces in use at the same time must not nest:
//! docs/production.md, "Namespaces per tenant"), and removed however the run ends.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use leasehold::{Connection, Namespace};
use uuid::Uuid;

use super::node::Timeline;
use super::{Common, Failure};

/// How long the removal may go without deleting a page of keys, connecting included: a
/// cluster that does not answer must not keep the command from exiting.
const REMOVE_WITHIN: Duration = Duration::from_secs(10);

/// How often a long removal says how far it is.
const SAY_EVERY: Duration = Duration::from_secs(2);

/// Set by a run once it has connected to the cluster, before its first write: a run that never
/// reached the cluster wrote nothing, and has nothing to remove.
#[derive(Default)]
pub(crate) struct Reached(AtomicBool);

impl Reached {
    pub(crate) fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// `{--namespace}-{what}-{8 hex digits}`: a sibling of `--namespace`, never under its prefix.
pub(crate) fn namespace(common: &Common, what: &str) -> Result<Namespace, Failure> {
    let name = format!(
        "{}-{what}-{}",
        common.namespace,
        &Uuid::new_v4().simple().to_string()[..8]
    );
    Namespace::new(name).map_err(|error| {
        Failure::message(
            format!(
                "{what}'s own namespace beside --namespace, {}-{what}-XXXXXXXX, is invalid: {}",
                common.namespace, error.reason
            ),
            2,
        )
    })
}

/// Runs `work`, the run of `who` in `namespace`. On SIGINT or SIGTERM it stops `work` (drops
/// it, and with it its stores, tasks and throwaway etcd) and fails with exit code 130. Then,
/// on a cluster of the user's (`--endpoints`) that `work` reached, it deletes every key under
/// the namespace's prefix, however `work` ended, a page at a time, giving up when a page takes
/// longer than [`REMOVE_WITHIN`]; it says on `timeline` how far a long removal is, then what it
/// removed or why it could not. A run that succeeded but whose keys could not be removed fails
/// with exit code 1.
pub(crate) async fn run_then_remove(
    common: &Common,
    namespace: &Namespace,
    timeline: &Timeline,
    who: &str,
    reached: &Reached,
    work: impl Future<Output = Result<(), Failure>>,
) -> Result<(), Failure> {
    let result = tokio::select! {
        result = work => result,
        () = super::node::wait_for_signal() => Err(Failure::message("interrupted", 130)),
    };
    let Some(endpoints) = &common.endpoints else {
        // A throwaway etcd: gone, with its data, once `work` dropped it.
        return result;
    };
    if !reached.get() {
        return result;
    }
    // How many keys are gone so far: each page deleted starts the bound again.
    let (gone, mut progress) = tokio::sync::watch::channel(0u64);
    let remove = async {
        let options = common
            .connect_options(endpoints.clone())
            .map_err(|failure| super::chain(failure.error.as_ref()))?;
        let connection = Connection::connect(options)
            .await
            .map_err(|error| super::chain(&error))?;
        connection
            .delete_prefix(&namespace.prefix(), |keys| {
                gone.send_replace(keys);
            })
            .await
            .map_err(|error| super::chain(&error))
    };
    tokio::pin!(remove);
    let mut said = Instant::now();
    let removed = loop {
        tokio::select! {
            biased;
            removed = &mut remove => break removed,
            moved = tokio::time::timeout(REMOVE_WITHIN, progress.changed()) => {
                if moved.is_err() {
                    break Err(format!("no answer within {} s", REMOVE_WITHIN.as_secs()));
                }
                if said.elapsed() >= SAY_EVERY {
                    said = Instant::now();
                    let keys = *progress.borrow_and_update();
                    let so_far = format_args!("removing namespace {namespace}: {keys} keys so far");
                    timeline.say(who, so_far);
                }
            }
        }
    };
    match removed {
        Ok(keys) => {
            timeline.say(
                who,
                format_args!("removed namespace {namespace} ({keys} keys)"),
            );
            result
        }
        Err(why) => {
            timeline.say(
                who,
                format_args!("could not remove namespace {namespace}: {why}"),
            );
            result.and(Err(Failure::message(
                format!(
                    "keys are left under {}: etcdctl del --prefix {} removes them",
                    namespace.prefix(),
                    namespace.prefix()
                ),
                1,
            )))
        }
    }
}
