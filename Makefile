# openflux: `make demo` runs the demo, `make test` runs every test.
# The local control plane (etcd, kube-apiserver, kube-controller-manager and
# stock Flux, all on loopback) is managed by e2e/cluster; see README.md.

CARGO ?= cargo
CLUSTER := e2e/cluster
# End-to-end test binaries share one control plane: keep concurrency modest.
TEST_THREADS ?= 2

.PHONY: demo test lint cluster-up cluster-down cluster-status

# The demo: local control plane, openflux and the HttpSource controller, a
# custom source flowing into an unchanged Kustomization (see e2e/demo).
demo:
	e2e/demo

test: lint cluster-up
	$(CARGO) test --workspace --all-targets -- --test-threads=$(TEST_THREADS)

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# Builds what is missing (the build log is shown) and starts the control plane.
cluster-up:
	$(CLUSTER) up

cluster-down:
	$(CLUSTER) down

cluster-status:
	$(CLUSTER) status

# Container images without a container engine: release binaries for this
# machine, packed with the libraries they need as OCI image archives in
# target/images/ (README.md, "Images"; the Dockerfile builds the same images
# with a container engine).
.PHONY: images
images:
	CARGO="$(CARGO)" images/build
