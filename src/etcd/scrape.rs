//! [`etcd_metric`]: one Prometheus metric an etcd member serves.

use std::time::Duration;

/// How long [`etcd_metric`] waits for a member's metrics page.
const METRICS_TIMEOUT: Duration = Duration::from_secs(5);

/// The value of one Prometheus metric that an etcd member serves at `{endpoint}/metrics`
/// (plain `http://` endpoints), summed over every series whose name is `name` and whose labels
/// include all of `labels` (`key="value"` strings). `None` when no series matches.
///
/// etcd counts what it serves, e.g. `grpc_server_msg_received_total` with
/// `grpc_method="LeaseKeepAlive"`: how a client's load looks from the server.
///
/// The scrape, connecting included, is given up after 5 s (an `io::ErrorKind::TimedOut`).
pub async fn etcd_metric(
    endpoint: &str,
    name: &str,
    labels: &[&str],
) -> std::io::Result<Option<f64>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = endpoint
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let scrape = async {
        let mut stream = tokio::net::TcpStream::connect(&address).await?;
        stream
            .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
            .await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        Ok::<_, std::io::Error>(body)
    };
    let body = tokio::time::timeout(METRICS_TIMEOUT, scrape)
        .await
        .map_err(|_| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("{address}/metrics: no answer within {METRICS_TIMEOUT:?}"),
            )
        })??;
    let mut total = None;
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let (metric, series_labels) = series.split_once('{').unwrap_or((series, ""));
        if metric == name
            && labels.iter().all(|label| series_labels.contains(label))
            && let Ok(value) = value.parse::<f64>()
        {
            *total.get_or_insert(0.0) += value;
        }
    }
    Ok(total)
}
