//! Building leasehold's own etcd image from Debian's etcd package: the binary and the
//! libraries it links, on an empty base image (`FROM scratch`).

use std::path::{Path, PathBuf};

use futures_util::StreamExt as _;
use testcontainers::runners::AsyncBuilder;
use testcontainers::{BuildableImage, GenericBuildableImage};
use tokio::io::AsyncWriteExt;

use super::{ETCD_PATH, EtcdImage, FETCH_SCRIPT, HarnessError, ImageBuild, KNOWN_VERSIONS, Plan};

impl EtcdImage {
    pub(super) async fn make(
        &self,
        docker: &bollard::Docker,
        how: ImageBuild,
    ) -> Result<(), HarnessError> {
        let version = match (self.plan, self.version.as_deref()) {
            (Plan::Release { .. }, Some(version)) => version,
            _ => {
                return Err(HarnessError::EtcdBinary {
                    version: self.version.clone().unwrap_or_else(|| "?".to_owned()),
                    detail: format!("{} is not one of leasehold's images", self.reference()),
                });
            }
        };
        if !KNOWN_VERSIONS.contains(&version) {
            return Err(HarnessError::EtcdBinary {
                version: version.to_owned(),
                detail: format!(
                    "the harness builds etcd {} only; set {} to an existing image",
                    KNOWN_VERSIONS.join(" and "),
                    Self::ENV
                ),
            });
        }
        let rootfs = Rootfs::for_version(version).await?;
        eprintln!(
            "leasehold::testing: making {} ({how:?}) from {}",
            self.reference(),
            rootfs.etcd.display()
        );
        if how == ImageBuild::Builder {
            match self.build(&rootfs).await {
                Ok(()) => return Ok(()),
                Err(cause) => eprintln!(
                    "leasehold::testing: no usable image builder ({cause}); importing a rootfs tarball"
                ),
            }
        }
        self.import(docker, &rootfs).await
    }

    /// `FROM scratch` plus the rootfs, through testcontainers' image builder.
    async fn build(&self, rootfs: &Rootfs) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let mut image = GenericBuildableImage::new(&self.name, &self.tag).with_dockerfile_string(
            format!("FROM scratch\nCOPY rootfs/ /\nENTRYPOINT [\"{ETCD_PATH}\"]\n"),
        );
        for (source, target) in rootfs.files() {
            image = image.with_file(source, format!("rootfs{target}"));
        }
        debug_assert_eq!(image.descriptor(), self.reference());
        let _built = image.build_image().await?;
        Ok(())
    }

    /// `docker import` of the rootfs as a tarball: needs no builder at all.
    async fn import(&self, docker: &bollard::Docker, rootfs: &Rootfs) -> Result<(), HarnessError> {
        let failed = |source: Box<dyn std::error::Error + Send + Sync>| HarnessError::BuildImage {
            image: self.reference(),
            source,
        };
        let tarball = rootfs.tarball().map_err(|e| failed(e.into()))?;
        let options = bollard::query_parameters::CreateImageOptions {
            from_src: Some("-".to_owned()),
            repo: Some(self.name.clone()),
            tag: Some(self.tag.clone()),
            changes: vec![format!("ENTRYPOINT [\"{ETCD_PATH}\"]")],
            ..Default::default()
        };
        let mut progress = docker.create_image(
            Some(options),
            Some(bollard::body_full(tarball.into())),
            None,
        );
        while let Some(step) = progress.next().await {
            step.map_err(|e| failed(e.into()))?;
        }
        Ok(())
    }
}

/// The files of an etcd image: the binary and the shared libraries it links, by their paths
/// inside the image.
struct Rootfs {
    etcd: PathBuf,
    libraries: Vec<PathBuf>,
}

impl Rootfs {
    async fn for_version(version: &str) -> Result<Self, HarnessError> {
        let etcd = etcd_binary(version).await?;
        let libraries =
            linked_libraries(&etcd)
                .await
                .map_err(|detail| HarnessError::EtcdBinary {
                    version: version.to_owned(),
                    detail,
                })?;
        Ok(Self { etcd, libraries })
    }

    /// (path on this machine, path in the image); links are resolved to the files they name.
    fn files(&self) -> Vec<(PathBuf, String)> {
        let mut files = vec![(self.etcd.clone(), ETCD_PATH.to_owned())];
        for library in &self.libraries {
            let source = std::fs::canonicalize(library).unwrap_or_else(|_| library.clone());
            files.push((source, library.display().to_string()));
        }
        files
    }

    fn tarball(&self) -> std::io::Result<Vec<u8>> {
        let mut tar = tar::Builder::new(Vec::new());
        tar.follow_symlinks(true);
        for (source, target) in self.files() {
            tar.append_path_with_name(&source, target.trim_start_matches('/'))?;
        }
        tar.into_inner()
    }
}

/// The cached etcd binary of `version` (3.5.16 or 3.4.23), fetched with the embedded script
/// when missing: for tests that run etcd as a process rather than a container.
pub async fn etcd_binary(version: &str) -> Result<PathBuf, HarnessError> {
    let failed = |detail: String| HarnessError::EtcdBinary {
        version: version.to_owned(),
        detail,
    };
    let mut child = tokio::process::Command::new("bash")
        .args(["-s", "--", version])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .map_err(|e| failed(format!("cannot run bash for the fetch script: {e}")))?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    stdin
        .write_all(FETCH_SCRIPT.as_bytes())
        .await
        .map_err(|e| failed(format!("cannot feed the fetch script: {e}")))?;
    drop(stdin);
    let output = child
        .wait_with_output()
        .await
        .map_err(|e| failed(format!("the fetch script did not finish: {e}")))?;
    if !output.status.success() {
        return Err(failed(format!(
            "deploy/fetch-etcd.sh {version} failed ({}); its messages are above",
            output.status
        )));
    }
    let path = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !Path::new(&path).is_file() {
        return Err(failed(format!(
            "the fetch script named {path:?}, which is no file"
        )));
    }
    Ok(PathBuf::from(path))
}

/// The shared libraries `binary` links, as `ldd` names them (the loader by its PT_INTERP path).
async fn linked_libraries(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let output = tokio::process::Command::new("ldd")
        .arg(binary)
        .output()
        .await
        .map_err(|e| format!("cannot run ldd: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "ldd {} failed: {}",
            binary.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let libraries: Vec<PathBuf> = parse_ldd(&String::from_utf8_lossy(&output.stdout));
    if libraries.is_empty() {
        return Err(format!("ldd found no libraries for {}", binary.display()));
    }
    Ok(libraries)
}

/// `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` and `/lib64/ld-linux-x86-64.so.2 (0x…)`
/// lines give a path; `linux-vdso.so.1 (0x…)` is provided by the kernel.
fn parse_ldd(output: &str) -> Vec<PathBuf> {
    output
        .lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = match line.split_once("=>") {
                Some((_, rest)) => rest.split_whitespace().next()?,
                None => line.split_whitespace().next()?,
            };
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_yields_libc_and_loader() {
        let out = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                   \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f3a)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f3b)\n";
        assert_eq!(
            parse_ldd(out),
            vec![
                PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"),
                PathBuf::from("/lib64/ld-linux-x86-64.so.2")
            ]
        );
    }
}
