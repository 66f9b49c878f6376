//! Unit tests of `connection.rs`.

use super::*;
use crate::deadline::{FOREVER, any_duration};

proptest::proptest! {
    /// Any retry policy and timeouts: the options build, and the retry loop's deadline,
    /// backoffs and decisions are computed without overflow. A deadline of
    /// `Duration::MAX` retries for as long as any pause lasts (forever).
    #[test]
    fn any_retry_policy_computes_its_deadline_without_panic(
        deadline in any_duration(),
        initial in any_duration(),
        max in any_duration(),
        connect in any_duration(),
        request in any_duration(),
    ) {
        let retry = RetryPolicy::default()
            .with_deadline(deadline)
            .with_backoff(initial, max);
        let options = ConnectOptions::new(["http://127.0.0.1:1"])
            .with_retry(retry.clone())
            .with_connect_timeout(connect)
            .with_request_timeout(request);
        let _ = format!("{options:?}");
        let now = Instant::now();
        let until = crate::deadline::deadline(now, options.retry.deadline);
        let mut backoff =
            Backoff::new(options.retry.initial_backoff, options.retry.max_backoff);
        for _ in 0..80 {
            let pause = backoff.next();
            let fits = pause_fits(pause, now, until);
            proptest::prop_assert_eq!(fits, until - now > pause);
            if retry.deadline == Duration::MAX && pause < FOREVER {
                proptest::prop_assert!(fits, "wait forever retries");
            }
            proptest::prop_assert!(pause <= max.max(initial));
        }
    }
}

/// Requests over a member's window wait their turn, and their attempt's timeout starts
/// only once they are in: four requests of 300 ms through a window of two all succeed with
/// a 500 ms timeout, the last two after 600 ms, and never more than two are in flight.
#[tokio::test(start_paused = true)]
async fn a_full_window_queues_requests_before_their_timeouts_start() {
    let connection = Connection::unconnected("http://127.0.0.1:1")
        .await
        .with_max_in_flight(2);
    let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let request = |lasts: u64| {
        let (now, most) = (&now, &most);
        async move {
            let in_flight = now.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(in_flight, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(lasts)).await;
            now.fetch_sub(1, Ordering::SeqCst);
            Ok::<_, etcd_client::Error>(())
        }
    };
    let timeout = Duration::from_millis(500);
    let started = Instant::now();
    let attempts = (0..3).map(|_| connection.attempt("test", timeout, |_| request(300)));
    let read = {
        let connection = connection.clone().with_request_timeout(timeout);
        async move { connection.read("test", |_: KvClient, _| request(300)).await }
    };
    let (attempts, read) = tokio::join!(futures_util::future::join_all(attempts), read);
    for answered in attempts.into_iter().chain([read]) {
        answered.expect("no request timed out while it waited for the window");
    }
    assert_eq!(most.load(Ordering::SeqCst), 2, "the window's width");
    assert_eq!(started.elapsed(), Duration::from_millis(600), "two turns");

    // A window made wider lets more in.
    let connection = connection.with_max_in_flight(5);
    most.store(0, Ordering::SeqCst);
    let attempts = (0..5).map(|_| connection.attempt("test", timeout, |_| request(300)));
    for answered in futures_util::future::join_all(attempts).await {
        answered.unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 5);
}

/// A request that waits for the window longer than its attempt's timeout is not sent: it
/// fails as certainly not applied, for the next endpoint or a later attempt.
#[tokio::test(start_paused = true)]
async fn a_request_the_window_keeps_out_too_long_fails_unsent() {
    let connection = Connection::unconnected("http://127.0.0.1:1")
        .await
        .with_max_in_flight(1);
    let sent = AtomicUsize::new(0);
    let request = |lasts: u64| {
        let sent = &sent;
        async move {
            sent.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(lasts)).await;
            Ok::<_, etcd_client::Error>(())
        }
    };
    let (first, second) = tokio::join!(
        connection.attempt("first", Duration::from_millis(500), |_| request(400)),
        connection.attempt("second", Duration::from_millis(300), |_| request(10)),
    );
    first.unwrap();
    let error = second.expect_err("kept out of the window for 300 ms");
    assert_eq!(error.class(), FailureClass::NotSent, "{error:?}");
    assert_eq!(sent.load(Ordering::SeqCst), 1, "the second was never sent");
}

#[test]
fn a_zero_deadline_retries_nothing() {
    let now = Instant::now();
    assert!(!pause_fits(
        Duration::ZERO,
        now,
        deadline(now, Duration::ZERO)
    ));
}
