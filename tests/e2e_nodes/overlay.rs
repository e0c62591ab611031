//! Kustomize overlays of openflux's manifests, as a user writes one to pin
//! an image and change a setting.

use std::path::{Path, PathBuf};

/// `to` relative to the directory `from` (kustomize takes no absolute
/// resource paths).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut path = PathBuf::new();
    for _ in common..from.len() {
        path.push("..");
    }
    for part in &to[common..] {
        path.push(part);
    }
    path
}

/// A kustomization in `dir` installing `manifests` with openflux's image
/// `image` (by digest), as the guide's overlay does, then `extra` (YAML
/// of more kustomization fields, such as `patches:`).
pub fn write(dir: &Path, manifests: &Path, image: &str, extra: &str) {
    let (name, digest) = image.split_once('@').expect("an image by digest");
    std::fs::create_dir_all(dir).expect("an overlay dir");
    let dir = dir.canonicalize().expect("the overlay dir");
    let manifests = relative(&dir, &manifests.canonicalize().expect("the manifests dir"));
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources: [{}]\nimages:\n  - {{name: openflux, newName: {name}, digest: {digest}}}\n{extra}",
            manifests.display()
        ),
    )
    .expect("writing the overlay");
}
