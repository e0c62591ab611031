//! A fake API server for unit tests of watches.

use std::collections::HashMap;
use std::sync::Mutex;

use axum::http::{Request, Response, StatusCode};
use kube::Client;
use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;

/// How the fake answers one list.
pub enum List {
    /// An empty list.
    Empty,
    /// 403 Forbidden.
    Refused,
    /// An empty list, once the receiver turns true.
    After(tokio::sync::watch::Receiver<bool>),
}

/// Serves lists and watches of any resource: the last path segment of
/// each list request (a paged list, or a watch that streams its list)
/// goes to the returned channel; `serves(path, n)` says how the `n`th
/// list of `path` (from 0) is answered. A watch of a path in `gone` is
/// answered with 410 Gone (its client must list again); any other
/// watch never ends.
pub fn lists_server(
    serves: impl Fn(&str, usize) -> List + Send + Sync + 'static,
    gone: &'static [&'static str],
) -> (Client, UnboundedReceiver<String>) {
    let (seen, lists) = tokio::sync::mpsc::unbounded_channel();
    let counts = std::sync::Arc::new(Mutex::new(HashMap::<String, usize>::new()));
    let serves = std::sync::Arc::new(serves);
    let service = tower::service_fn(move |request: Request<kube::client::Body>| {
        let (seen, counts, serves) = (seen.clone(), counts.clone(), serves.clone());
        async move {
            let path = request.uri().path().rsplit('/').next().unwrap_or("");
            let query = request.uri().query().unwrap_or("");
            let streams = query.contains("sendInitialEvents=true");
            if query.contains("watch=true") && !streams {
                if !gone.contains(&path) {
                    std::future::pending::<()>().await;
                }
                let event = json!({"type": "ERROR", "object": {"kind": "Status",
                    "apiVersion": "v1", "status": "Failure", "reason": "Expired",
                    "message": "too old resource version", "code": 410}});
                return Ok(answer_with(StatusCode::OK, event.to_string()));
            }
            let _ = seen.send(path.to_string());
            let n = {
                let mut counts = counts.lock().unwrap_or_else(|e| e.into_inner());
                let n = counts.entry(path.to_string()).or_default();
                *n += 1;
                *n - 1
            };
            let answer = serves(path, n);
            if let List::After(mut release) = answer {
                let _ = release.wait_for(|go| *go).await;
            } else if let List::Refused = answer {
                let status = json!({"kind": "Status", "apiVersion": "v1",
                    "status": "Failure", "reason": "Forbidden", "code": 403});
                return Ok(answer_with(StatusCode::FORBIDDEN, status.to_string()));
            }
            let body = if streams {
                json!({"type": "BOOKMARK", "object": {"kind": "Thing", "apiVersion": "v1",
                    "metadata": {"resourceVersion": "1", "annotations":
                        {super::streaming::INITIAL_EVENTS_END: "true"}}}})
            } else {
                json!({"apiVersion": "v1", "kind": "List",
                    "metadata": {"resourceVersion": "1"}, "items": []})
            };
            Ok::<_, std::convert::Infallible>(answer_with(StatusCode::OK, body.to_string()))
        }
    });
    (Client::new(service, "default"), lists)
}

fn answer_with(status: StatusCode, body: String) -> Response<kube::client::Body> {
    let mut response = Response::new(kube::client::Body::from(body.into_bytes()));
    *response.status_mut() = status;
    response
}
