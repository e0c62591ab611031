//! The committed CRD manifests are the output of `openflux crds`.

#[test]
fn committed_artifact_crd_matches_the_rust_types() {
    let generated = openflux::api::crd_yaml().expect("the CRD serializes");
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/manifests/crds/artifacts.yaml");
    let committed =
        std::fs::read_to_string(path).expect("manifests/crds/artifacts.yaml is readable");
    assert!(
        committed == generated,
        "manifests/crds/artifacts.yaml is out of date; regenerate it with `cargo run -- crds > manifests/crds/artifacts.yaml`"
    );
}

#[test]
fn committed_source_policy_crd_matches_the_rust_types() {
    let generated = openflux::api::policy::source_policy_crd_yaml().expect("the CRD serializes");
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/manifests/crds/sourcepolicies.yaml"
    );
    let committed =
        std::fs::read_to_string(path).expect("manifests/crds/sourcepolicies.yaml is readable");
    assert!(
        committed == generated,
        "manifests/crds/sourcepolicies.yaml is out of date; regenerate it with \
         `cargo run --bin openflux -- crds --source-policy > manifests/crds/sourcepolicies.yaml`"
    );
}
