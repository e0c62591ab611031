//! What every `openflux run` process sets up for itself: the handler that
//! turns SIGTERM or SIGINT into a shutdown, and its Event recorder.

use kube::runtime::events::Reporter;
use kube::Client;
use tokio_util::sync::CancellationToken;

use crate::api::runtime::events::{Notifier, RetryPolicy};
use crate::api::runtime::{EventRecorder, RuntimeArgs};

/// Cancels `shutdown` at the first SIGTERM or SIGINT.
pub fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{signal, SignalKind};
            match signal(SignalKind::terminate()) {
                Ok(mut term) => {
                    tokio::select! {
                        _ = term.recv() => {}
                        _ = tokio::signal::ctrl_c() => {}
                    }
                }
                Err(_) => {
                    let _ = tokio::signal::ctrl_c().await;
                }
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("shutdown signal received; stopping");
        shutdown.cancel();
    });
}

/// Kubernetes Events as `openflux`, and with `--events-addr` the same posted
/// to notification-controller.
pub fn event_recorder(client: &Client, runtime: &RuntimeArgs) -> anyhow::Result<EventRecorder> {
    let notifier = match runtime.events_url() {
        Some(url) => {
            // The events receiver is plain HTTP in Flux's installs; HTTPS
            // needs a TLS provider and the system's CA roots.
            let _ = rustls::crypto::ring::default_provider().install_default();
            let mut http = reqwest::Client::builder();
            if url.scheme() == "http" {
                // No CA roots needed: openflux's image carries none, and
                // the platform verifier refuses to start without them.
                http = http.tls_certs_only([]);
            }
            let http = http
                .build()
                .map_err(|e| anyhow::anyhow!("cannot build the events client for {url}: {e}"))?;
            Some(Notifier::spawn(url, http, RetryPolicy::default()))
        }
        None => None,
    };
    let reporter = Reporter {
        controller: "openflux".into(),
        instance: std::env::var("POD_NAME")
            .or_else(|_| std::env::var("HOSTNAME"))
            .ok(),
    };
    Ok(EventRecorder::new(client.clone(), reporter, notifier))
}
