//! The export target: which Flux-consumable object a consumer gets for a
//! custom source, chosen for the cluster as it is.
//!
//! Two targets exist:
//!
//! - `ExternalArtifact` (`source.toolkit.fluxcd.io/v1`, Flux 2.7 and later),
//!   where the API is served, the consumer's CRD accepts the kind, and the
//!   consuming controller does not refuse it: kustomize-controller and
//!   helm-controller refuse it unless their `ExternalArtifact` feature gate is
//!   on (it is off by default); source-watcher accepts it without a gate.
//! - a *shadow* `OCIRepository`: a suspended OCIRepository whose status
//!   openflux writes. Every consumer accepts an OCIRepository on every Flux
//!   line from 2.3 without any gate (served as `v1beta2` before Flux 2.6, as
//!   `v1` from 2.6; `v1beta2` is gone in 2.8), so it is the fallback.
//!
//! [`choose`] is a pure function of the `--export` mode, the consumer and what
//! is known about the cluster; every choice carries a reason a person can
//! read (logged, counted in a metric and written into Artifact conditions).

use std::fmt;

/// The `--export` flag.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ExportMode {
    /// ExternalArtifact where it works, a shadow OCIRepository elsewhere.
    #[default]
    Auto,
    /// Always ExternalArtifact (the consumers must accept it).
    ExternalArtifact,
    /// Always a shadow OCIRepository.
    Shadow,
}

impl ExportMode {
    /// The flag's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ExportMode::Auto => "auto",
            ExportMode::ExternalArtifact => "external-artifact",
            ExportMode::Shadow => "shadow",
        }
    }
}

impl std::str::FromStr for ExportMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(ExportMode::Auto),
            "external-artifact" => Ok(ExportMode::ExternalArtifact),
            "shadow" => Ok(ExportMode::Shadow),
            other => Err(format!(
                "unknown export mode {other:?}: use auto, external-artifact or shadow"
            )),
        }
    }
}

/// The ExternalArtifact kind.
pub const EXTERNAL_ARTIFACT: &str = "ExternalArtifact";
/// The kind a shadow is.
pub const OCI_REPOSITORY: &str = "OCIRepository";

/// A served version of the OCIRepository API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OciVersion {
    /// Flux 2.3 to 2.7.
    V1beta2,
    /// Flux 2.6 and later (preferred when both are served).
    V1,
}

impl OciVersion {
    pub fn as_str(self) -> &'static str {
        match self {
            OciVersion::V1beta2 => "v1beta2",
            OciVersion::V1 => "v1",
        }
    }
}

/// What a consumer is exported to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Target {
    ExternalArtifact,
    Shadow(OciVersion),
}

impl Target {
    /// The kind of the exported object.
    pub fn kind(self) -> &'static str {
        match self {
            Target::ExternalArtifact => EXTERNAL_ARTIFACT,
            Target::Shadow(_) => OCI_REPOSITORY,
        }
    }

    /// The `apiVersion` of the exported object.
    pub fn api_version(self) -> &'static str {
        match self {
            Target::ExternalArtifact => "source.toolkit.fluxcd.io/v1",
            Target::Shadow(OciVersion::V1) => "source.toolkit.fluxcd.io/v1",
            Target::Shadow(OciVersion::V1beta2) => "source.toolkit.fluxcd.io/v1beta2",
        }
    }

    /// The plural resource name.
    pub fn plural(self) -> &'static str {
        match self {
            Target::ExternalArtifact => "externalartifacts",
            Target::Shadow(_) => "ocirepositories",
        }
    }

    /// Whether this is a shadow (a suspended stock source whose status openflux writes).
    pub fn is_shadow(self) -> bool {
        matches!(self, Target::Shadow(_))
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind(), self.api_version())
    }
}

/// What is known of a consuming controller's `ExternalArtifact` feature gate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Gate {
    /// The consumer accepts ExternalArtifact without a gate (source-watcher).
    NotGated,
    /// Seen on: every running instance of the controller has the gate on.
    On,
    /// Seen off (the default of every release), or a refusal was observed.
    Off,
    /// The controller's configuration is not visible to openflux.
    Unknown,
}

/// What openflux knows of one consumer kind in this cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsumerFacts {
    /// The consumer's kind, for messages.
    pub kind: &'static str,
    /// The kinds the consumer's CRD accepts in the reference (the schema's
    /// `enum`), or `None` when the schema lists none (any kind).
    pub accepted_kinds: Option<Vec<String>>,
    /// The feature gate of the consuming controller.
    pub gate: Gate,
    /// Why the consumer may not read an ExternalArtifact even though the
    /// schema allows it (for example the default RBAC of the Pulumi operator
    /// reads only Buckets, GitRepositories and OCIRepositories).
    pub external_artifact_unreadable: Option<&'static str>,
}

impl ConsumerFacts {
    fn accepts(&self, kind: &str) -> bool {
        self.accepted_kinds
            .as_ref()
            .is_none_or(|kinds| kinds.iter().any(|k| k == kind))
    }
}

/// What openflux knows of the cluster's source API.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterFacts {
    /// Whether `source.toolkit.fluxcd.io/v1` ExternalArtifact is served.
    pub external_artifact_served: bool,
    /// The OCIRepository version openflux writes shadows as (the newest served).
    pub oci_repository: Option<OciVersion>,
    /// Whether the served ExternalArtifact API has `status.exportedInputs`
    /// (source-controller v1.10 and later), read from its CRD's schema.
    pub exported_inputs: bool,
}

/// A choice and its reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    pub target: Target,
    /// Why, in a sentence a person can act on.
    pub reason: String,
}

/// No target works for a consumer; the message says what to change.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct NoTarget(pub String);

/// Chooses the export target for one consumer kind. Pure.
pub fn choose(
    mode: ExportMode,
    cluster: &ClusterFacts,
    consumer: &ConsumerFacts,
) -> Result<Choice, NoTarget> {
    let kind = consumer.kind;
    let external = || -> Result<Choice, String> {
        if !cluster.external_artifact_served {
            return Err("ExternalArtifact (source.toolkit.fluxcd.io/v1) is not served: Flux 2.7 or later has it".into());
        }
        if !consumer.accepts(EXTERNAL_ARTIFACT) {
            return Err(format!(
                "the {kind} CRD does not accept ExternalArtifact references (a Flux release before 2.7)"
            ));
        }
        if let Some(why) = consumer.external_artifact_unreadable {
            return Err(format!("{kind}: {why}"));
        }
        let reason = match consumer.gate {
            Gate::NotGated => format!("{kind} accepts ExternalArtifact without a feature gate"),
            Gate::On => format!("the ExternalArtifact feature gate of {kind}'s controller is on"),
            Gate::Off => {
                return Err(format!(
                "the ExternalArtifact feature gate of {kind}'s controller is off (Flux's default)"
            ))
            }
            Gate::Unknown => {
                return Err(format!(
                    "the ExternalArtifact feature gate of {kind}'s controller cannot be seen"
                ))
            }
        };
        Ok(Choice {
            target: Target::ExternalArtifact,
            reason,
        })
    };
    let shadow = || -> Result<Choice, String> {
        let Some(version) = cluster.oci_repository else {
            return Err(
                "OCIRepository (source.toolkit.fluxcd.io) is not served: is Flux installed?".into(),
            );
        };
        if !consumer.accepts(OCI_REPOSITORY) {
            return Err(format!(
                "the {kind} CRD does not accept OCIRepository references"
            ));
        }
        Ok(Choice {
            target: Target::Shadow(version),
            reason: String::new(),
        })
    };
    match mode {
        ExportMode::ExternalArtifact => {
            external().map_err(|why| NoTarget(format!("--export=external-artifact: {why}")))
        }
        ExportMode::Shadow => shadow()
            .map(|c| Choice {
                reason: "--export=shadow".into(),
                ..c
            })
            .map_err(|why| NoTarget(format!("--export=shadow: {why}"))),
        ExportMode::Auto => match external() {
            Ok(choice) => Ok(choice),
            Err(why_not) => shadow()
                .map(|c| Choice {
                    reason: format!("shadow OCIRepository: {why_not}"),
                    ..c
                })
                .map_err(|why| NoTarget(format!("no export target for {kind}: {why_not}; {why}"))),
        },
    }
}

/// The `ExternalArtifact` gate as the arguments of a controller set it:
/// `--feature-gates=A=true,B=false` (or the value as the next argument); the
/// last occurrence wins, as with Go's flag package. Absent means off, Flux's
/// default.
pub fn gate_from_args<S: AsRef<str>>(args: &[S]) -> bool {
    let mut on = false;
    let mut iter = args.iter().map(AsRef::as_ref);
    while let Some(arg) = iter.next() {
        let value = match arg
            .strip_prefix("--feature-gates")
            .or_else(|| arg.strip_prefix("-feature-gates"))
        {
            Some(rest) if rest.starts_with('=') => Some(rest[1..].to_string()),
            Some("") => iter.next().map(str::to_string),
            _ => None,
        };
        let Some(value) = value else { continue };
        for gate in value.split(',') {
            let (name, enabled) = gate.split_once('=').unwrap_or((gate, "true"));
            if name.trim() == EXTERNAL_ARTIFACT {
                on = matches!(
                    enabled.trim().to_ascii_lowercase().as_str(),
                    "true" | "1" | "t"
                );
            }
        }
    }
    on
}

#[cfg(test)]
mod tests {
    use super::*;

    fn consumer(kind: &'static str, accepted: Option<&[&str]>, gate: Gate) -> ConsumerFacts {
        ConsumerFacts {
            kind,
            accepted_kinds: accepted.map(|k| k.iter().map(|s| s.to_string()).collect()),
            gate,
            external_artifact_unreadable: None,
        }
    }

    const KS_29: &[&str] = &[
        "OCIRepository",
        "GitRepository",
        "Bucket",
        "ExternalArtifact",
    ];
    const KS_23: &[&str] = &["OCIRepository", "GitRepository", "Bucket"];
    const HR_29: &[&str] = &["OCIRepository", "HelmChart", "ExternalArtifact"];
    const AG_21: &[&str] = &[
        "Bucket",
        "GitRepository",
        "OCIRepository",
        "HelmChart",
        "ExternalArtifact",
    ];
    const AG_20: &[&str] = &["Bucket", "GitRepository", "OCIRepository"];

    fn flux(ea: bool, oci: Option<OciVersion>) -> ClusterFacts {
        ClusterFacts {
            external_artifact_served: ea,
            oci_repository: oci,
            exported_inputs: false,
        }
    }

    /// One row: mode, cluster, consumer, expected target (None: no target).
    #[test]
    fn choices_follow_the_cluster() {
        use ExportMode::*;
        use OciVersion::*;
        let v1 = Some(V1);
        #[rustfmt::skip]
        let rows: Vec<(ExportMode, ClusterFacts, ConsumerFacts, Option<Target>)> = vec![
            // Flux 2.9 with the defaults: gate off, shadow v1.
            (Auto, flux(true, v1), consumer("Kustomization", Some(KS_29), Gate::Off), Some(Target::Shadow(V1))),
            (Auto, flux(true, v1), consumer("HelmRelease", Some(HR_29), Gate::Off), Some(Target::Shadow(V1))),
            // Gate on: ExternalArtifact.
            (Auto, flux(true, v1), consumer("Kustomization", Some(KS_29), Gate::On), Some(Target::ExternalArtifact)),
            (Auto, flux(true, v1), consumer("HelmRelease", Some(HR_29), Gate::On), Some(Target::ExternalArtifact)),
            // A gate openflux cannot see is treated as off.
            (Auto, flux(true, v1), consumer("Kustomization", Some(KS_29), Gate::Unknown), Some(Target::Shadow(V1))),
            // source-watcher v2.1+: no gate.
            (Auto, flux(true, v1), consumer("ArtifactGenerator", Some(AG_21), Gate::NotGated), Some(Target::ExternalArtifact)),
            // source-watcher v2.0 (Flux 2.7) does not list ExternalArtifact.
            (Auto, flux(true, v1), consumer("ArtifactGenerator", Some(AG_20), Gate::NotGated), Some(Target::Shadow(V1))),
            // Flux 2.3 to 2.5: no ExternalArtifact, OCIRepository v1beta2 only.
            (Auto, flux(false, Some(V1beta2)), consumer("Kustomization", Some(KS_23), Gate::Off), Some(Target::Shadow(V1beta2))),
            (Auto, flux(false, Some(V1beta2)), consumer("Kustomization", Some(KS_23), Gate::On), Some(Target::Shadow(V1beta2))),
            // A schema without an enum accepts any kind.
            (Auto, flux(true, v1), consumer("Stack", None, Gate::NotGated), Some(Target::ExternalArtifact)),
            // Forced modes.
            (Shadow, flux(true, v1), consumer("Kustomization", Some(KS_29), Gate::On), Some(Target::Shadow(V1))),
            (ExternalArtifact, flux(true, v1), consumer("Kustomization", Some(KS_29), Gate::On), Some(Target::ExternalArtifact)),
            (ExternalArtifact, flux(true, v1), consumer("Kustomization", Some(KS_29), Gate::Off), None),
            (ExternalArtifact, flux(false, Some(V1beta2)), consumer("Kustomization", Some(KS_23), Gate::On), None),
            (Shadow, flux(true, None), consumer("Kustomization", Some(KS_29), Gate::On), None),
            // No Flux at all.
            (Auto, flux(false, None), consumer("Kustomization", Some(KS_29), Gate::Off), None),
        ];
        for (i, (mode, cluster, consumer, want)) in rows.into_iter().enumerate() {
            let got = choose(mode, &cluster, &consumer);
            match (&got, want) {
                (Ok(choice), Some(want)) => {
                    assert_eq!(choice.target, want, "row {i}: {choice:?}");
                    assert!(
                        !choice.reason.is_empty(),
                        "row {i}: a choice always has a reason"
                    );
                }
                (Err(NoTarget(message)), None) => {
                    assert!(
                        message.contains(consumer.kind) || message.starts_with("--export"),
                        "row {i}: {message}"
                    );
                }
                _ => panic!("row {i}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn an_unreadable_external_artifact_falls_back_to_a_shadow() {
        let mut stack = consumer("Stack", None, Gate::NotGated);
        stack.external_artifact_unreadable =
            Some("the Pulumi operator's default role reads Buckets, GitRepositories and OCIRepositories only");
        let choice = choose(ExportMode::Auto, &flux(true, Some(OciVersion::V1)), &stack).unwrap();
        assert_eq!(choice.target, Target::Shadow(OciVersion::V1));
        assert!(choice.reason.contains("Pulumi"), "{}", choice.reason);
    }

    #[test]
    fn the_reason_names_the_gate() {
        let choice = choose(
            ExportMode::Auto,
            &flux(true, Some(OciVersion::V1)),
            &consumer("Kustomization", Some(KS_29), Gate::Off),
        )
        .unwrap();
        assert!(choice.reason.contains("feature gate"), "{}", choice.reason);
    }

    #[test]
    fn feature_gates_are_read_like_the_go_flag_package() {
        let cases: &[(&[&str], bool)] = &[
            (&[], false),
            (&["--watch-all-namespaces=true"], false),
            (&["--feature-gates=ExternalArtifact=true"], true),
            (
                &["--feature-gates=OOMWatch=true,ExternalArtifact=true"],
                true,
            ),
            (&["--feature-gates", "ExternalArtifact=true"], true),
            (&["-feature-gates=ExternalArtifact=true"], true),
            (&["--feature-gates=ExternalArtifact=false"], false),
            (
                &[
                    "--feature-gates=ExternalArtifact=true",
                    "--feature-gates=ExternalArtifact=false",
                ],
                false,
            ),
            (&["--feature-gates=ExternalArtifact"], true),
            (&["--feature-gates=CacheSecretsAndConfigMaps=true"], false),
            (&["--feature-gates-extra=ExternalArtifact=true"], false),
            (&["--feature-gates"], false),
        ];
        for (args, want) in cases {
            assert_eq!(gate_from_args(args), *want, "{args:?}");
        }
    }

    #[test]
    fn modes_parse_and_print() {
        for mode in [
            ExportMode::Auto,
            ExportMode::ExternalArtifact,
            ExportMode::Shadow,
        ] {
            assert_eq!(mode.as_str().parse::<ExportMode>(), Ok(mode));
        }
        assert!("externalartifact"
            .parse::<ExportMode>()
            .unwrap_err()
            .contains("auto"));
    }
}
