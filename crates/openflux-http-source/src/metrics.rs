//! The metrics of HttpSource itself, beside Flux's (`openflux_api::runtime::
//! metrics`), under the prefix `openflux_http_source_`:
//!
//! - `fetches_total{result}`: fetches by result, `downloaded` (a full body
//!   was read), `not_modified` (a 304 kept the artifact) and `failed`; an
//!   unchanged remote shows as `not_modified`;
//! - `downloaded_bytes_total`: bytes of response bodies;
//! - `artifacts_stored_total`: new artifact revisions stored.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// The prefix of HttpSource's own metrics.
pub const PREFIX: &str = "openflux_http_source";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

/// Fetch results.
pub const DOWNLOADED: &str = "downloaded";
pub const NOT_MODIFIED: &str = "not_modified";
pub const FAILED: &str = "failed";

/// Names (without prefix and `_total`) and help texts.
const NAMES: [(&str, &str); 3] = [
    (
        "fetches",
        "Fetches of HttpSource URLs by result (downloaded, not_modified, failed)",
    ),
    ("artifacts_stored", "New artifact revisions stored"),
    ("downloaded_bytes", "Bytes of response bodies downloaded"),
];

#[derive(Clone)]
pub struct SourceMetrics {
    pub fetches: Family<ResultLabels, Counter>,
    pub artifacts_stored: Counter,
    pub downloaded_bytes: Counter,
}

impl SourceMetrics {
    /// Registers the metrics in `registry` under [`PREFIX`].
    pub fn register(registry: &mut Registry) -> Self {
        let registry = registry.sub_registry_with_prefix(PREFIX);
        let metrics = SourceMetrics {
            fetches: Family::default(),
            artifacts_stored: Counter::default(),
            downloaded_bytes: Counter::default(),
        };
        let [fetches, stored, downloaded] = NAMES;
        registry.register(fetches.0, fetches.1, metrics.fetches.clone());
        registry.register(stored.0, stored.1, metrics.artifacts_stored.clone());
        registry.register(downloaded.0, downloaded.1, metrics.downloaded_bytes.clone());
        metrics
    }

    pub fn fetch(&self, result: &'static str) {
        self.fetches.get_or_create(&ResultLabels { result }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openflux_api::runtime::metrics::encode;

    #[test]
    fn exposes_fetch_counters_by_result_beside_fluxs() {
        let mut registry = Registry::default();
        let flux = openflux_api::runtime::Metrics::register(&mut registry);
        let m = SourceMetrics::register(&mut registry);
        let id = openflux_api::runtime::ControllerId::of::<crate::api::HttpSource>();
        let _controller = flux.controller(&id, 2);
        m.fetch(DOWNLOADED);
        m.fetch(NOT_MODIFIED);
        m.fetch(NOT_MODIFIED);
        let text = encode(&registry);
        assert!(
            text.contains("openflux_http_source_fetches_total{result=\"not_modified\"} 2"),
            "{text}"
        );
        assert!(text.contains("openflux_http_source_fetches_total{result=\"downloaded\"} 1"));
        assert!(text
            .contains("controller_runtime_max_concurrent_reconciles{controller=\"httpsource\"} 2"));
    }
}
