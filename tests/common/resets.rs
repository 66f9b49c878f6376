//! Counting the connections the client's HTTP/2 layer closes for too many reset streams.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tracing::Level;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt as _};

/// Counts h2's warnings that a connection reached its limit of locally reset streams (each
/// followed by the connection's `GOAWAY(ENHANCE_YOUR_CALM, too_many_internal_resets)`).
#[derive(Clone, Default)]
pub(crate) struct ResetLimits(Arc<AtomicUsize>);

impl ResetLimits {
    /// The process's subscriber from now on: h2's warnings alone (anything more would slow
    /// the node under test down), counted. Once per test binary.
    pub(crate) fn install() -> Self {
        let limits = Self::default();
        let h2_warnings = tracing_subscriber::filter::Targets::new().with_target("h2", Level::WARN);
        tracing::subscriber::set_global_default(
            tracing_subscriber::registry().with(limits.clone().with_filter(h2_warnings)),
        )
        .expect("the only subscriber of this binary");
        limits
    }

    /// The connections closed so far.
    pub(crate) fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl<S: tracing::Subscriber> Layer<S> for ResetLimits {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        struct Message(bool);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, _: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                self.0 |= format!("{value:?}").contains("locally-reset streams reached limit");
            }
        }
        let mut message = Message(false);
        event.record(&mut message);
        if message.0 {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
}
