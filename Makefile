# openflux: `make demo` runs the demo, `make test` runs every test.
# The local control plane (etcd, kube-apiserver, kube-controller-manager and
# stock Flux, all on loopback) is managed by e2e/cluster; see CONTRIBUTING.md.

CARGO ?= cargo
CLUSTER := e2e/cluster
# End-to-end test binaries share one control plane: keep concurrency modest.
TEST_THREADS ?= 2

.PHONY: demo demo-down test test-nodes lint chaos cluster-up cluster-down cluster-status

# The demo: a custom source flowing into an unchanged Kustomization, with
# openflux and the HttpSource controller, on a control plane of its own
# (${TMPDIR:-/tmp}/openflux-demo, ports 17xxx; see e2e/demo). Running it
# again refreshes it; the tests never see it.
demo:
	e2e/demo

# Stops the demo: openflux, the HttpSource controller and its control plane.
demo-down:
	e2e/demo stop

# Every test (e2e/test-all): the end-to-end tests of the Flux matrix
# (tests/e2e/e2e_matrix.rs) start the matrix cells, more control planes with
# other Flux lines or gates (ports 18xxx and 19xxx; the lockdown cell of
# tests/e2e/e2e_lockdown.rs 21xxx; see e2e/lib/cells.sh), one at a time; the
# nodes cell's tests (ports 20xxx) run in a process of their own beside the
# others. Builds run beside the tests: the images' release build for both
# platforms (what the image tests and the nodes cell install, which the
# nodes cell's tests wait for), cosign and oras, then, niced, the producer
# kit's check (`make crate-check`), whose failure fails `make test` at the
# end; and, niced, what the other tests would build on first use
# (e2e/test-all says which). Every cell is stopped at the end, whether the
# tests passed or not.
test: lint cluster-up chart-check
	CARGO="$(CARGO)" TEST_THREADS=$(TEST_THREADS) e2e/test-all

# The nodes cell's tests alone (tests/e2e_nodes/; `make test` runs them
# beside the rest): two real nodes (kubelet, containerd, runc) on a control
# plane of their own, Flux as Pods laid out as `flux install` lays it out,
# openflux installed by the "Install from a clone" and "Install with Flux
# from a clone" blocks (CONTRIBUTING.md, "Real nodes"). Needs root. The cell is
# stopped at the end.
test-nodes:
	$(CARGO) test --test e2e_nodes -- --test-threads=1 --nocapture; \
	  rc=$$?; $(CLUSTER) cell nodes down; exit $$rc

# The chaos suite (docs/reliability.md): a million generated AdmissionReviews
# through the decision path and a sample over HTTPS, certificate rotation
# under load, the webhook's peak memory under maximum-size reviews, the
# leader killed during Artifact updates on the local control plane, and etcd
# and kube-apiserver killed and restarted during them. Prints a table; the
# figures also go to target/chaos.json.
chaos: cluster-up
	$(CARGO) bench -p openflux --bench chaos -- --json $(CURDIR)/target/chaos.json

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy --workspace --test e2e_nodes -- -D warnings

# The tests' control plane (${TMPDIR:-/tmp}/openflux-e2e, ports 16xxx):
# builds what is missing (the build log is shown) and starts it.
# cluster-down stops it and the matrix cells.
cluster-up:
	$(CLUSTER) up

cluster-down:
	$(CLUSTER) down
	$(CLUSTER) cells down

cluster-status:
	$(CLUSTER) status

# Container images without a container engine: release binaries for this
# machine, packed with the libraries they need as OCI image archives in
# target/images/ (CONTRIBUTING.md, "Images"; the Dockerfile builds the same images
# with a container engine).
.PHONY: images
images:
	CARGO="$(CARGO)" images/build

# openflux's manifests as an OCI artifact in the format `flux push artifact`
# writes, pinning the images given (CONTRIBUTING.md, "Install with Flux from a clone"):
# target/images/openflux-manifests.oci.tar.
.PHONY: manifests-artifact
manifests-artifact:
	@[ -n "$(OPENFLUX_IMAGE)" ] && [ -n "$(HTTP_SOURCE_IMAGE)" ] || \
	  { echo "make manifests-artifact OPENFLUX_IMAGE=<registry>/openflux@sha256:... HTTP_SOURCE_IMAGE=<registry>/openflux-http-source@sha256:..." >&2; exit 2; }
	images/manifests "$(OPENFLUX_IMAGE)" "$(HTTP_SOURCE_IMAGE)"

# A release (docs/release.md): `make release VERSION=X.Y.Z
# REGISTRY=<host>[:port]/<owner>` writes target/dist/X.Y.Z/: both images as
# linux/amd64 + linux/arm64 indexes with SBOMs, install.yaml, the Helm
# chart, the Flux manifests artifact and SHA256SUMS. `make publish` (same
# VERSION and REGISTRY) pushes that bundle by digest. The release workflow
# runs exactly these two targets on a version tag.
.PHONY: release publish chart-check crate-check
release:
	@[ -n "$(VERSION)" ] && [ -n "$(REGISTRY)" ] || \
	  { echo "make release VERSION=X.Y.Z REGISTRY=<host>[:port]/<owner>" >&2; exit 2; }
	CARGO="$(CARGO)" release/release "$(VERSION)" "$(REGISTRY)"

publish:
	@[ -n "$(VERSION)" ] && [ -n "$(REGISTRY)" ] || \
	  { echo "make publish VERSION=X.Y.Z REGISTRY=<host>[:port]/<owner>" >&2; exit 2; }
	release/publish "$(VERSION)" "$(REGISTRY)"

# The chart's render against kustomize's (release/check-chart), with
# placeholder digests and no image build: part of `make test`. Builds helm
# once (from its Go module, into the control plane's cache).
chart-check:
	release/check

# The producer kit (crates/openflux-api) as the crate registry would take
# it: packaged alone and built from the package (`cargo publish --dry-run`,
# nothing uploaded); docs/http-source.md tells producers to depend on it.
# Part of `make test`.
crate-check:
	$(CARGO) publish --dry-run -p openflux-api
