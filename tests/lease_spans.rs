//! The `acquire` and `open` spans carry the session and, once it is known, the epoch, so that
//! every event under them (and every `--log-format json` line) names both; an acquisition
//! that finds the session held records none.

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use uuid::Uuid;

/// A span's name and its fields as recorded (`Debug` of each value).
type Span = (String, HashMap<String, String>);

/// The spans still open, by id, and those closed, in order.
#[derive(Default)]
struct Seen {
    open: HashMap<Id, Span>,
    closed: Vec<Span>,
}

/// Keeps every span's fields, as created and as recorded later, until it closes.
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Seen>>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Spans {
    fn on_new_span(&self, attributes: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = HashMap::new();
        attributes.record(&mut Fields(&mut fields));
        let name = attributes.metadata().name().to_owned();
        self.0
            .lock()
            .unwrap()
            .open
            .insert(id.clone(), (name, fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        if let Some((_, fields)) = self.0.lock().unwrap().open.get_mut(id) {
            values.record(&mut Fields(fields));
        }
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        let mut seen = self.0.lock().unwrap();
        if let Some(span) = seen.open.remove(&id) {
            seen.closed.push(span);
        }
    }
}

impl Spans {
    /// The closed spans named `name` of `session`.
    fn closed(&self, name: &str, session: Uuid) -> Vec<HashMap<String, String>> {
        let session = session.to_string();
        self.0
            .lock()
            .unwrap()
            .closed
            .iter()
            .filter(|(n, fields)| n == name && fields.get("session") == Some(&session))
            .map(|(_, fields)| fields.clone())
            .collect()
    }
}

// One thread: the subscriber set for this test sees every task of its runtime.
#[tokio::test(flavor = "current_thread")]
async fn acquire_and_open_spans_carry_the_epoch() {
    let etcd = common::Etcd::start().await;
    let spans = Spans::default();
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(spans.clone()));
    let (a, b) = (etcd.store("a", 10).await, etcd.store("b", 10).await);
    let session = Uuid::new_v4();

    let lease = a.acquire_lease(session).await.expect("free session");
    let journal = a.open_journal(session, Some(&lease)).await.expect("opens");
    assert!(b.acquire_lease(session).await.is_err(), "held by a");
    let epoch = lease.epoch().to_string();

    let acquires = spans.closed("acquire", session);
    assert_eq!(acquires.len(), 2, "{acquires:?}");
    assert_eq!(acquires[0].get("epoch"), Some(&epoch), "{acquires:?}");
    assert_eq!(
        acquires[1].get("epoch"),
        None,
        "a held session has no epoch of ours"
    );
    let opens = spans.closed("open", session);
    assert_eq!(opens.len(), 1, "{opens:?}");
    assert_eq!(opens[0].get("epoch"), Some(&epoch), "{opens:?}");

    drop(journal);
    lease.release().await.unwrap();
}
