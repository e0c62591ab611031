//! `openflux certs`: writes a CA and a serving certificate to files, for a
//! Secret the webhook mounts.

use std::fs;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::keeper::{CA_FILE, CERT_FILE, KEY_FILE};
use super::material::{Authority, CertError};

/// The `openflux certs` command: writes a CA and a serving certificate.
#[derive(clap::Args, Debug, Clone)]
pub struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key to (created if missing).
    #[arg(long)]
    pub out_dir: PathBuf,
    /// DNS name the serving certificate is valid for (repeatable), e.g.
    /// openflux-webhook.openflux-system.svc.
    #[arg(long = "dns-name", value_name = "NAME")]
    pub dns_names: Vec<String>,
    /// IP address the serving certificate is valid for (repeatable).
    #[arg(long = "ip", value_name = "IP")]
    pub ips: Vec<IpAddr>,
    /// Days the serving certificate is valid.
    #[arg(long, default_value_t = 365)]
    pub validity_days: u64,
    /// Days the CA is valid.
    #[arg(long, default_value_t = 3650)]
    pub ca_validity_days: u64,
}

/// Runs `openflux certs`.
pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    if args.dns_names.is_empty() && args.ips.is_empty() {
        anyhow::bail!("give at least one --dns-name or --ip for the serving certificate");
    }
    let ca = Authority::generate(days(args.ca_validity_days))?;
    let issued = ca.issue(&args.dns_names, &args.ips, days(args.validity_days))?;
    fs::create_dir_all(&args.out_dir).map_err(|source| CertError::Io {
        path: args.out_dir.clone(),
        source,
    })?;
    write_file(&args.out_dir.join(CA_FILE), ca.cert_pem.as_bytes(), 0o644)?;
    write_file(
        &args.out_dir.join(CERT_FILE),
        issued.cert_pem.as_bytes(),
        0o644,
    )?;
    write_file(
        &args.out_dir.join(KEY_FILE),
        issued.key_pem.as_bytes(),
        0o600,
    )?;
    println!(
        "wrote {CA_FILE}, {CERT_FILE} and {KEY_FILE} to {}",
        args.out_dir.display()
    );
    Ok(())
}

fn days(n: u64) -> Duration {
    Duration::from_secs(n.saturating_mul(24 * 3600))
}

/// Writes a file through a temporary file and a rename, with `mode` on Unix.
/// The temporary file is created exclusively (O_EXCL): whatever was left at
/// its name (a file, or a symlink planted to redirect the private key) is
/// removed first and never written through.
fn write_file(path: &Path, content: &[u8], mode: u32) -> Result<(), CertError> {
    let io = |source| CertError::Io {
        path: path.to_path_buf(),
        source,
    };
    let tmp = path.with_extension("tmp");
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(mode);
    }
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(&tmp).map_err(io)?;
    // The mode given at creation is filtered by the umask; set it exactly.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        file.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io)?;
    }
    file.write_all(content).map_err(io)?;
    file.sync_all().map_err(io)?;
    drop(file);
    fs::rename(&tmp, path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn a_planted_symlink_is_never_written_through() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        fs::write(&elsewhere, b"untouched").unwrap();
        let key = dir.path().join("tls.key");
        std::os::unix::fs::symlink(&elsewhere, key.with_extension("tmp")).unwrap();
        write_file(&key, b"secret", 0o600).unwrap();
        assert_eq!(fs::read(&elsewhere).unwrap(), b"untouched");
        assert_eq!(fs::read(&key).unwrap(), b"secret");
    }
    use crate::certs::keeper::CertFiles;

    #[test]
    fn certs_command_writes_files_with_private_key_mode() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        run(CertsArgs {
            out_dir: out.clone(),
            dns_names: vec!["openflux-webhook.openflux-system.svc".into()],
            ips: vec!["127.0.0.1".parse().unwrap()],
            validity_days: 30,
            ca_validity_days: 60,
        })
        .unwrap();
        let files = CertFiles {
            cert: out.join(CERT_FILE),
            key: out.join(KEY_FILE),
            ca: None,
        };
        let material = files.load().unwrap();
        assert_eq!(material.ca_bundle, fs::read(out.join(CA_FILE)).unwrap());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = fs::metadata(out.join(KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert!(run(CertsArgs {
            out_dir: out,
            dns_names: vec![],
            ips: vec![],
            validity_days: 1,
            ca_validity_days: 1,
        })
        .is_err());
    }
}
