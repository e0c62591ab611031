use super::*;

fn setup() -> (Registry, ControllerMetrics) {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let id = ControllerId {
        name: "httpsource".into(),
        group: "sources.openflux.dev".into(),
        kind: "HttpSource".into(),
    };
    let controller = metrics.controller(&id, 4);
    (registry, controller)
}

fn object(name: &str) -> ObjectLabels {
    ObjectLabels {
        kind: "HttpSource".into(),
        name: name.into(),
        namespace: "apps".into(),
    }
}

/// The value of the sample `name{labels}` in the exposition, if present.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn series_start_at_zero_like_controller_runtime() {
    let (registry, _controller) = setup();
    let text = encode(&registry);
    for result in ["success", "error", "requeue", "requeue_after"] {
        let series = format!(
            "controller_runtime_reconcile_total{{controller=\"httpsource\",result=\"{result}\"}}"
        );
        assert_eq!(sample(&text, &series), Some(0.0), "{series}\n{text}");
    }
    assert_eq!(
        sample(
            &text,
            "controller_runtime_reconcile_errors_total{controller=\"httpsource\"}"
        ),
        Some(0.0)
    );
    assert_eq!(
        sample(
            &text,
            "controller_runtime_max_concurrent_reconciles{controller=\"httpsource\"}"
        ),
        Some(4.0)
    );
    assert_eq!(
        sample(
            &text,
            "controller_runtime_active_workers{controller=\"httpsource\"}"
        ),
        Some(0.0)
    );
}

#[test]
fn every_metric_is_exposed_under_its_flux_type() {
    let (registry, controller) = setup();
    drop(controller.reconcile(object("a")));
    controller.record_suspend(&object("a"), false);
    controller.record_condition(&object("a"), "Ready", "True");
    let text = encode(&registry);
    for kind in [
        "# TYPE controller_runtime_reconcile counter",
        "# TYPE controller_runtime_reconcile_errors counter",
        "# TYPE controller_runtime_reconcile_time_seconds histogram",
        "# TYPE controller_runtime_max_concurrent_reconciles gauge",
        "# TYPE controller_runtime_active_workers gauge",
        "# TYPE gotk_reconcile_duration_seconds histogram",
        "# TYPE gotk_suspend_status gauge",
        "# TYPE gotk_reconcile_condition gauge",
    ] {
        assert!(text.contains(kind), "{kind}\n{text}");
    }
}

#[test]
fn a_guard_records_each_reconcile_once() {
    let (registry, controller) = setup();
    {
        let mut guard = controller.reconcile(object("a"));
        let text = encode(&registry);
        assert_eq!(
            sample(
                &text,
                "controller_runtime_active_workers{controller=\"httpsource\"}"
            ),
            Some(1.0),
            "a running reconcile occupies a worker"
        );
        guard.set_result(ReconcileResult::RequeueAfter);
    }
    {
        let mut guard = controller.reconcile(object("a"));
        guard.set_result(ReconcileResult::Success);
    }
    // Dropped without a result: an early return or a panic is an error.
    drop(controller.reconcile(object("b")));
    let in_panic = controller.clone();
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _guard = in_panic.reconcile(object("c"));
        panic!("reconcile panicked");
    }));
    assert!(result.is_err());

    let text = encode(&registry);
    let total = |result: &str| {
        sample(
            &text,
            &format!(
                "controller_runtime_reconcile_total{{controller=\"httpsource\",result=\"{result}\"}}"
            ),
        )
    };
    assert_eq!(total("requeue_after"), Some(1.0));
    assert_eq!(total("success"), Some(1.0));
    assert_eq!(total("error"), Some(2.0));
    assert_eq!(total("requeue"), Some(0.0));
    assert_eq!(
        sample(
            &text,
            "controller_runtime_reconcile_errors_total{controller=\"httpsource\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            "controller_runtime_reconcile_time_seconds_count{controller=\"httpsource\"}"
        ),
        Some(4.0)
    );
    assert_eq!(
        sample(
            &text,
            "gotk_reconcile_duration_seconds_count{kind=\"HttpSource\",name=\"a\",namespace=\"apps\"}"
        ),
        Some(2.0)
    );
    assert_eq!(
        sample(
            &text,
            "controller_runtime_active_workers{controller=\"httpsource\"}"
        ),
        Some(0.0)
    );
}

#[test]
fn buckets_are_fluxs() {
    let (registry, controller) = setup();
    drop(controller.reconcile(object("a")));
    let text = encode(&registry);
    let bounds = |metric: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{metric}_bucket")))
            .filter_map(|l| {
                let le = l.split("le=\"").nth(1)?;
                Some(le.split('"').next()?.to_string())
            })
            .collect()
    };
    let cr = bounds("controller_runtime_reconcile_time_seconds");
    assert_eq!(cr.len(), 41, "{cr:?}");
    assert_eq!(cr.first().map(String::as_str), Some("0.005"));
    assert_eq!(cr[39], "60.0");
    assert_eq!(cr[40], "+Inf");
    let gotk: Vec<f64> = bounds("gotk_reconcile_duration_seconds")
        .iter()
        .filter_map(|b| b.parse().ok())
        .filter(|b: &f64| b.is_finite())
        .collect();
    assert_eq!(gotk.len(), 10, "{gotk:?}");
    assert!((gotk[0] - 0.01).abs() < 1e-9);
    assert!((gotk[9] - 1800.0).abs() < 1e-6);
}

#[test]
fn suspend_and_conditions_are_recorded_and_removed_with_the_object() {
    let (registry, controller) = setup();
    let a = object("a");
    controller.record_suspend(&a, true);
    controller.record_condition(&a, "Ready", "False");
    let text = encode(&registry);
    let labels = "kind=\"HttpSource\",name=\"a\",namespace=\"apps\"";
    assert_eq!(
        sample(&text, &format!("gotk_suspend_status{{{labels}}}")),
        Some(1.0)
    );
    let condition = |text: &str, status: &str| {
        sample(
            text,
            &format!("gotk_reconcile_condition{{{labels},type=\"Ready\",status=\"{status}\"}}"),
        )
    };
    assert_eq!(condition(&text, "False"), Some(1.0));
    assert_eq!(condition(&text, "True"), Some(0.0));
    assert_eq!(condition(&text, "Unknown"), Some(0.0));

    controller.record_condition(&a, "Ready", "True");
    controller.record_suspend(&a, false);
    let text = encode(&registry);
    assert_eq!(condition(&text, "True"), Some(1.0));
    assert_eq!(condition(&text, "False"), Some(0.0));
    assert_eq!(
        sample(&text, &format!("gotk_suspend_status{{{labels}}}")),
        Some(0.0)
    );

    let mut guard = controller.reconcile(a.clone());
    guard.object_deleted();
    guard.set_result(ReconcileResult::Success);
    drop(guard);
    let text = encode(&registry);
    assert!(!text.contains("name=\"a\""), "{text}");
}
