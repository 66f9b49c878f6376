//! Which etcd image the harness runs: chosen in a fixed order, pulled within a bound, or built
//! from Debian's etcd package.

use std::future::Future;
use std::time::{Duration, Instant};

use futures_util::{Stream, StreamExt as _};
use tokio::sync::Mutex;

mod build;

pub use build::etcd_binary;

use super::HarnessError;
use crate::etcd::chain;

/// The repository of the images the harness builds itself.
const REPOSITORY: &str = "leasehold-etcd";
/// The repository of the images etcd's releases publish (tags `v{version}`).
const UPSTREAM_REPOSITORY: &str = "gcr.io/etcd-development/etcd";
/// Where the etcd binary sits inside every image the harness runs.
pub(crate) const ETCD_PATH: &str = "/usr/local/bin/etcd";
/// The fetch script, embedded so that the harness works from any crate that depends on it.
const FETCH_SCRIPT: &str = include_str!("../../../deploy/fetch-etcd.sh");
/// Versions the fetch script knows how to obtain.
const KNOWN_VERSIONS: [&str; 2] = [EtcdImage::DEFAULT_VERSION, EtcdImage::COMPAT_VERSION];

/// Serializes image builds within this process (concurrent tests share one build); pulls and
/// look-ups run concurrently.
static BUILD: Mutex<()> = Mutex::const_new(());

/// The etcd image a node or cluster runs: a request that [`resolve`](EtcdImage::resolve)
/// turns into an image present in Docker.
///
/// # The order
///
/// [`EtcdImage::from_env`] (what [`EtcdNode::start`](super::EtcdNode::start) and
/// [`EtcdCluster::start`](super::EtcdCluster::start) run) takes the first of these that works:
///
/// 1. `LEASEHOLD_ETCD_IMAGE`, when set, used as is: taken from Docker, else pulled; when
///    neither works, an error, never another image. Naming `leasehold-etcd:{version}` there
///    means the harness's own image, built from Debian's package when missing.
/// 2. `leasehold-etcd:{version}`, when Docker already has it.
/// 3. The image etcd's releases publish, `gcr.io/etcd-development/etcd:v{version}`, when
///    Docker has it or can pull it. Its etcd binary is at `/usr/local/bin/etcd` and it only has
///    a `CMD`, so the harness's entrypoint and flags apply unchanged, as for every image.
///    Untested: leasehold's tests have run only where no registry was reachable, so only this
///    step's failing pull has been exercised, never etcd running from the upstream image.
/// 4. `leasehold-etcd:{version}`, built now from Debian's `etcd-server` package (3.5.16 and
///    3.4.23 only; needs apt, see `deploy/fetch-etcd.sh`).
///
/// Every pull gives up after [`EtcdImage::PULL_TIMEOUT`]. When nothing works the error is
/// [`HarnessError::NoEtcdImage`], which names the three ways to provide an image and what
/// each gave. The compatibility version (3.4.23, [`EtcdImage::release`]) follows the same
/// order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EtcdImage {
    name: String,
    tag: String,
    /// The etcd release, when known (leasehold's own images and the upstream ones).
    version: Option<String>,
    plan: Plan,
}

/// How a request becomes an image in Docker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Exactly this reference: used when Docker has it, else pulled.
    Named,
    /// A release of etcd under this reference: used when Docker has it, else (when `upstream`)
    /// etcd's upstream image, else built under this reference from Debian's package.
    Release { upstream: bool },
}

/// How the harness makes one of its own images.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ImageBuild {
    /// A `FROM scratch` Dockerfile through testcontainers' image builder.
    Builder,
    /// `docker import` of a rootfs tarball: needs no builder at all.
    Import,
}

/// The step of the selection an image came from (see [`EtcdImage`]'s order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ImageSource {
    /// The image named by `LEASEHOLD_ETCD_IMAGE` (or [`EtcdImage::custom`]): in Docker, or
    /// pulled.
    Named,
    /// leasehold's own image of the release, already in Docker.
    Local,
    /// The image etcd's releases publish, `gcr.io/etcd-development/etcd:v{version}`: in
    /// Docker, or pulled.
    Upstream,
    /// leasehold's own image of the release, built now from Debian's `etcd-server` package.
    Debian,
}

/// One step of the selection that gave no image, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ImageAttempt {
    /// The step.
    pub source: ImageSource,
    /// The image it tried, `repo:tag`.
    pub image: String,
    /// What went wrong (Docker's own message included).
    pub failure: String,
    /// How long the step took.
    pub took: Duration,
}

/// The image a selection settled on.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct ImageChoice {
    /// The image to run; Docker has it.
    pub image: EtcdImage,
    /// The step that gave it.
    pub source: ImageSource,
    /// The steps tried before it, in order, with why each gave nothing.
    pub passed_over: Vec<ImageAttempt>,
}

impl EtcdImage {
    /// The etcd version the harness runs by default.
    pub const DEFAULT_VERSION: &'static str = "3.5.16";
    /// Debian 12's etcd, the compatibility target.
    pub const COMPAT_VERSION: &'static str = "3.4.23";
    /// The environment variable that selects another image (`repo:tag`).
    pub const ENV: &'static str = "LEASEHOLD_ETCD_IMAGE";
    /// How long one pull may take before the harness gives up on it: a pull that cannot
    /// succeed (no registry reachable, an unknown image) fails within this bound instead of
    /// holding a test up.
    pub const PULL_TIMEOUT: Duration = Duration::from_secs(20);

    /// [`select`](Self::select) with `LEASEHOLD_ETCD_IMAGE` and
    /// [`DEFAULT_VERSION`](Self::DEFAULT_VERSION).
    pub fn from_env() -> Self {
        Self::select(
            std::env::var(Self::ENV).ok().as_deref(),
            Self::DEFAULT_VERSION,
        )
    }

    /// The image to run for `env`, the value of `LEASEHOLD_ETCD_IMAGE` (`None` when unset),
    /// and etcd `version`: the named image when `env` is set and not blank (as
    /// [`custom`](Self::custom)), else the release (as [`release`](Self::release)). Reads no
    /// environment and asks Docker nothing; [`resolve`](Self::resolve) does the rest.
    pub fn select(env: Option<&str>, version: &str) -> Self {
        match env.map(str::trim) {
            Some(image) if !image.is_empty() => Self::custom(image),
            _ => Self::release(version),
        }
    }

    /// etcd `version` from wherever the harness can get it: leasehold's own image
    /// `leasehold-etcd:{version}` when Docker has it, else etcd's upstream image, else
    /// leasehold's own image built from Debian's package (3.5.16 and 3.4.23 can be built).
    pub fn release(version: &str) -> Self {
        Self {
            name: REPOSITORY.to_owned(),
            tag: version.to_owned(),
            version: Some(version.to_owned()),
            plan: Plan::Release { upstream: true },
        }
    }

    /// The image etcd's releases publish, `gcr.io/etcd-development/etcd:v{version}`, pulled
    /// when missing (its etcd binary is at `/usr/local/bin/etcd`). Never built.
    pub fn upstream(version: &str) -> Self {
        Self {
            name: UPSTREAM_REPOSITORY.to_owned(),
            tag: format!("v{version}"),
            version: Some(version.to_owned()),
            plan: Plan::Named,
        }
    }

    /// The same release under another `name:tag`: used when Docker has it, else as
    /// [`release`](Self::release) says, the build going under this reference.
    pub fn with_reference(mut self, name: &str, tag: &str) -> Self {
        self.name = name.to_owned();
        self.tag = tag.to_owned();
        self
    }

    /// Any image, as `repo:tag` (`latest` when no tag is given): used when Docker has it, else
    /// pulled, never replaced by another. leasehold's own (`leasehold-etcd:{version}`) are
    /// built from Debian's package when missing instead of pulled. It must have the etcd
    /// binary at `/usr/local/bin/etcd`.
    pub fn custom(image: &str) -> Self {
        // A colon after the last '/' separates the tag (a registry host may carry a port).
        let (name, tag) = match image.rsplit_once(':') {
            Some((name, tag)) if !tag.contains('/') => (name, tag),
            _ => (image, "latest"),
        };
        if name == REPOSITORY {
            return Self {
                plan: Plan::Release { upstream: false },
                ..Self::release(tag)
            };
        }
        let version = match tag.strip_prefix('v') {
            Some(version) if name == UPSTREAM_REPOSITORY => Some(version.to_owned()),
            _ => None,
        };
        Self {
            name: name.to_owned(),
            tag: tag.to_owned(),
            version,
            plan: Plan::Named,
        }
    }

    /// The image's repository.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The image's tag.
    pub fn tag(&self) -> &str {
        &self.tag
    }

    /// The etcd version, when known: leasehold's own images and etcd's upstream ones.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// `repo:tag`.
    pub fn reference(&self) -> String {
        format!("{}:{}", self.name, self.tag)
    }

    /// Finds or makes the image to run, trying the steps of [`EtcdImage`]'s order that apply
    /// to this request, and says which one gave it.
    pub async fn resolve(&self) -> Result<ImageChoice, HarnessError> {
        let docker = super::docker().await?;
        self.resolve_with(&docker).await
    }

    pub(crate) async fn resolve_with(
        &self,
        docker: &bollard::Docker,
    ) -> Result<ImageChoice, HarnessError> {
        choose(self, |source, image| {
            let docker = docker.clone();
            async move {
                match source {
                    ImageSource::Local => present(&docker, &image).await,
                    ImageSource::Named | ImageSource::Upstream => {
                        present_or_pull(&docker, &image, Self::PULL_TIMEOUT).await
                    }
                    ImageSource::Debian => {
                        // One build at a time; a test that waited may find the image built.
                        let _one_build_at_a_time = BUILD.lock().await;
                        if present(&docker, &image).await.is_ok() {
                            return Ok(());
                        }
                        image
                            .make(&docker, ImageBuild::Builder)
                            .await
                            .map_err(|e| format!("building it failed: {}", chain(&e)))
                    }
                }
            }
        })
        .await
    }

    /// Whether this request names one image that alone may run (`LEASEHOLD_ETCD_IMAGE`,
    /// [`custom`](Self::custom)).
    fn named(&self) -> bool {
        self.plan != Plan::Release { upstream: true }
    }

    /// The steps that apply to this request, in order, with the image each tries.
    fn steps(&self) -> Vec<(ImageSource, EtcdImage)> {
        match (self.plan, &self.version) {
            (Plan::Release { upstream }, Some(version)) => {
                let mut steps = vec![(ImageSource::Local, self.clone())];
                if upstream {
                    steps.push((ImageSource::Upstream, Self::upstream(version)));
                }
                steps.push((ImageSource::Debian, self.clone()));
                steps
            }
            _ => vec![(ImageSource::Named, self.clone())],
        }
    }

    /// Makes sure this very reference exists in Docker: leasehold's own images are built when
    /// missing (through the builder, else by import), other images are pulled (within
    /// [`PULL_TIMEOUT`](Self::PULL_TIMEOUT)). Unlike [`resolve`](Self::resolve), never
    /// settles for another image.
    pub async fn ensure(&self, docker: &bollard::Docker) -> Result<(), HarnessError> {
        if present(docker, self).await.is_ok() {
            return Ok(());
        }
        let started = Instant::now();
        match self.plan {
            Plan::Release { .. } => {
                let _one_build_at_a_time = BUILD.lock().await;
                if present(docker, self).await.is_ok() {
                    return Ok(());
                }
                self.make(docker, ImageBuild::Builder).await
            }
            Plan::Named => present_or_pull(docker, self, Self::PULL_TIMEOUT)
                .await
                .map_err(|failure| HarnessError::NoEtcdImage {
                    version: self.version.clone(),
                    named: Some(self.reference()),
                    tried: vec![ImageAttempt {
                        source: ImageSource::Named,
                        image: self.reference(),
                        failure,
                        took: started.elapsed(),
                    }],
                }),
        }
    }

    /// Builds one of leasehold's own images now, as `how` says, replacing any image of the
    /// same name. With [`ImageBuild::Builder`], falls back to an import when no builder works.
    pub async fn rebuild(&self, how: ImageBuild) -> Result<(), HarnessError> {
        let docker = super::docker().await?;
        let _one_build_at_a_time = BUILD.lock().await;
        self.make(&docker, how).await
    }

    /// Removes the image from Docker (for tests of the build itself).
    pub async fn remove(&self) -> Result<(), HarnessError> {
        let docker = super::docker().await?;
        docker
            .remove_image(
                &self.reference(),
                None::<bollard::query_parameters::RemoveImageOptions>,
                None,
            )
            .await
            .map(|_| ())
            .map_err(|e| HarnessError::container(format!("remove image {}", self.reference()), e))
    }
}

/// Tries the steps of `request` in order with `attempt` and settles on the first that gives an
/// image; when none does, one error listing what each gave. Pure apart from what `attempt`
/// does.
async fn choose<F, Fut>(request: &EtcdImage, mut attempt: F) -> Result<ImageChoice, HarnessError>
where
    F: FnMut(ImageSource, EtcdImage) -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let mut passed_over = Vec::new();
    for (source, image) in request.steps() {
        let started = Instant::now();
        match attempt(source, image.clone()).await {
            Ok(()) => {
                return Ok(ImageChoice {
                    image,
                    source,
                    passed_over,
                });
            }
            Err(failure) => passed_over.push(ImageAttempt {
                source,
                image: image.reference(),
                failure,
                took: started.elapsed(),
            }),
        }
    }
    Err(HarnessError::NoEtcdImage {
        version: request.version.clone(),
        named: request.named().then(|| request.reference()),
        tried: passed_over,
    })
}

/// The message of [`HarnessError::NoEtcdImage`]: the three ways to provide an image, and what
/// each gave here.
pub(crate) fn no_image_message(
    version: Option<&str>,
    named: Option<&str>,
    tried: &[ImageAttempt],
) -> String {
    let version = version.unwrap_or(EtcdImage::DEFAULT_VERSION);
    let of = |source: ImageSource| tried.iter().filter(move |t| t.source == source);
    let not_tried = if named.is_some() {
        format!(
            "not tried: an image was named ({} or EtcdImage::custom), and only it may run \
             (without one, the harness chooses)",
            EtcdImage::ENV
        )
    } else {
        "not tried".to_owned()
    };
    let one = match (named, of(ImageSource::Named).next()) {
        (_, Some(t)) => format!("{} failed: {}", t.image, t.failure),
        (Some(image), None) => format!("{image} is leasehold's own image: see 3"),
        (None, None) => "not set".to_owned(),
    };
    let two = match of(ImageSource::Upstream).next() {
        Some(t) => format!("failed after {:.1?}: {}", t.took, t.failure),
        None => not_tried.clone(),
    };
    let own: Vec<&ImageAttempt> = of(ImageSource::Local)
        .chain(of(ImageSource::Debian))
        .collect();
    let three = match own.first() {
        Some(first) => {
            let failures: Vec<&str> = own.iter().map(|t| t.failure.as_str()).collect();
            format!("{}: {}", first.image, failures.join("; "))
        }
        None => not_tried,
    };
    format!(
        "no etcd image to run; the three ways to provide one, and what each gave here:\n\
         \x20 1. set {env} to an etcd image you have (etcd at {ETCD_PATH}): {one}\n\
         \x20 2. `docker pull {UPSTREAM_REPOSITORY}:v{version}`: {two}\n\
         \x20 3. let the harness build {REPOSITORY}:{version} from Debian's etcd-server package \
         (needs apt on a Debian-based machine; see deploy/fetch-etcd.sh): {three}",
        env = EtcdImage::ENV,
    )
}

/// `Ok` when Docker has `image`.
async fn present(docker: &bollard::Docker, image: &EtcdImage) -> Result<(), String> {
    match docker.inspect_image(&image.reference()).await {
        Ok(_) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Err("not in Docker".to_owned()),
        Err(e) => Err(format!("cannot inspect it: {e}")),
    }
}

/// `Ok` when Docker has `image` or pulls it within `timeout`.
async fn present_or_pull(
    docker: &bollard::Docker,
    image: &EtcdImage,
    timeout: Duration,
) -> Result<(), String> {
    if present(docker, image).await.is_ok() {
        return Ok(());
    }
    let reference = image.reference();
    eprintln!("leasehold::testing: pulling {reference} (at most {timeout:?})");
    let options = bollard::query_parameters::CreateImageOptions {
        // The whole reference: the daemon takes the tag (or digest) from it.
        from_image: Some(reference.clone()),
        ..Default::default()
    };
    let pulled = drain_within(docker.create_image(Some(options), None, None), timeout).await;
    match pulled {
        Ok(()) => present(docker, image)
            .await
            .map_err(|e| format!("the pull ended but the image is missing: {e}")),
        Err(e) => Err(format!("not in Docker, and pulling it failed: {e}")),
    }
}

/// Consumes a progress stream to its end, failing at its first error or after `timeout`.
async fn drain_within<S, T, E>(stream: S, timeout: Duration) -> Result<(), String>
where
    S: Stream<Item = Result<T, E>>,
    E: std::fmt::Display,
{
    let drain = async {
        let mut stream = std::pin::pin!(stream);
        while let Some(step) = stream.next().await {
            step.map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    tokio::time::timeout(timeout, drain)
        .await
        .unwrap_or_else(|_| Err(format!("gave up after {timeout:?} without an answer")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_references_parse() {
        let own = EtcdImage::release("3.4.23");
        assert_eq!(own.reference(), "leasehold-etcd:3.4.23");
        assert_eq!(own.version(), Some("3.4.23"));
        let upstream = EtcdImage::custom("registry.local:5000/etcd:v3.5.17");
        assert_eq!(upstream.name(), "registry.local:5000/etcd");
        assert_eq!(upstream.tag(), "v3.5.17");
        assert_eq!(upstream.version(), None);
        assert_eq!(
            EtcdImage::custom("registry.local:5000/etcd").tag(),
            "latest"
        );
        let published = EtcdImage::custom("gcr.io/etcd-development/etcd:v3.5.16");
        assert_eq!(published, EtcdImage::upstream("3.5.16"));
        assert_eq!(published.version(), Some("3.5.16"));
    }

    fn steps_of(image: &EtcdImage) -> Vec<(ImageSource, String)> {
        image
            .steps()
            .into_iter()
            .map(|(source, image)| (source, image.reference()))
            .collect()
    }

    #[test]
    fn a_set_env_value_is_the_only_step() {
        let image = EtcdImage::select(Some(" my-etcd:v1 "), EtcdImage::DEFAULT_VERSION);
        assert_eq!(image, EtcdImage::custom("my-etcd:v1"));
        assert_eq!(
            steps_of(&image),
            [(ImageSource::Named, "my-etcd:v1".to_owned())]
        );
    }

    #[test]
    fn without_env_a_release_goes_local_then_upstream_then_debian() {
        for version in [EtcdImage::DEFAULT_VERSION, EtcdImage::COMPAT_VERSION] {
            for env in [None, Some(""), Some("  ")] {
                let image = EtcdImage::select(env, version);
                assert_eq!(image, EtcdImage::release(version), "{env:?}");
                assert_eq!(
                    steps_of(&image),
                    [
                        (ImageSource::Local, format!("leasehold-etcd:{version}")),
                        (
                            ImageSource::Upstream,
                            format!("gcr.io/etcd-development/etcd:v{version}")
                        ),
                        (ImageSource::Debian, format!("leasehold-etcd:{version}")),
                    ]
                );
            }
        }
    }

    #[test]
    fn another_reference_keeps_the_order_and_builds_under_its_name() {
        let image = EtcdImage::release("3.5.16").with_reference("mine", "x");
        assert_eq!(
            steps_of(&image),
            [
                (ImageSource::Local, "mine:x".to_owned()),
                (
                    ImageSource::Upstream,
                    "gcr.io/etcd-development/etcd:v3.5.16".to_owned()
                ),
                (ImageSource::Debian, "mine:x".to_owned()),
            ]
        );
    }

    #[test]
    fn naming_leaseholds_own_image_never_swaps_it_for_another() {
        let image = EtcdImage::select(Some("leasehold-etcd:3.4.23"), EtcdImage::DEFAULT_VERSION);
        assert_eq!(image.version(), Some("3.4.23"));
        assert_eq!(
            steps_of(&image),
            [
                (ImageSource::Local, "leasehold-etcd:3.4.23".to_owned()),
                (ImageSource::Debian, "leasehold-etcd:3.4.23".to_owned()),
            ]
        );
        let upstream = EtcdImage::select(Some("gcr.io/etcd-development/etcd:v3.5.16"), "3.4.23");
        assert_eq!(
            steps_of(&upstream),
            [(
                ImageSource::Named,
                "gcr.io/etcd-development/etcd:v3.5.16".to_owned()
            )]
        );
    }

    /// Runs `choose` over `image`'s steps, with the steps in `working` succeeding; returns the
    /// outcome and the steps that were tried.
    async fn choose_with(
        image: &EtcdImage,
        working: &[ImageSource],
    ) -> (Result<ImageChoice, HarnessError>, Vec<ImageSource>) {
        let tried = std::sync::Mutex::new(Vec::new());
        let outcome = choose(image, |source, image| {
            tried.lock().unwrap().push(source);
            let works = working.contains(&source);
            async move {
                if works {
                    Ok(())
                } else {
                    Err(format!("{} failed on purpose", image.reference()))
                }
            }
        })
        .await;
        (outcome, tried.into_inner().unwrap())
    }

    #[tokio::test]
    async fn the_first_step_that_works_wins_and_later_ones_are_not_tried() {
        let release = EtcdImage::release("3.5.16");
        let (choice, tried) =
            choose_with(&release, &[ImageSource::Local, ImageSource::Debian]).await;
        let choice = choice.unwrap();
        assert_eq!(choice.source, ImageSource::Local);
        assert_eq!(choice.image, release);
        assert!(choice.passed_over.is_empty());
        assert_eq!(tried, [ImageSource::Local]);

        let (choice, tried) =
            choose_with(&release, &[ImageSource::Upstream, ImageSource::Debian]).await;
        let choice = choice.unwrap();
        assert_eq!(choice.source, ImageSource::Upstream);
        assert_eq!(choice.image, EtcdImage::upstream("3.5.16"));
        assert_eq!(tried, [ImageSource::Local, ImageSource::Upstream]);
        assert_eq!(choice.passed_over.len(), 1);
        assert_eq!(choice.passed_over[0].source, ImageSource::Local);

        let (choice, tried) = choose_with(&release, &[ImageSource::Debian]).await;
        let choice = choice.unwrap();
        assert_eq!(choice.source, ImageSource::Debian);
        assert_eq!(choice.image, release);
        assert_eq!(
            tried,
            [
                ImageSource::Local,
                ImageSource::Upstream,
                ImageSource::Debian
            ]
        );
        assert_eq!(
            choice.passed_over[1].failure,
            "gcr.io/etcd-development/etcd:v3.5.16 failed on purpose"
        );
    }

    #[tokio::test]
    async fn when_nothing_works_one_error_names_the_three_ways_and_each_failure() {
        let (outcome, tried) = choose_with(&EtcdImage::release("3.4.23"), &[]).await;
        assert_eq!(
            tried,
            [
                ImageSource::Local,
                ImageSource::Upstream,
                ImageSource::Debian
            ]
        );
        let error = outcome.unwrap_err();
        let HarnessError::NoEtcdImage {
            version,
            named,
            tried,
        } = &error
        else {
            panic!("{error:?}");
        };
        assert_eq!(version.as_deref(), Some("3.4.23"));
        assert_eq!(named, &None);
        assert_eq!(tried.len(), 3);
        let message = error.to_string();
        for part in [
            "1. set LEASEHOLD_ETCD_IMAGE to an etcd image you have",
            ": not set",
            "2. `docker pull gcr.io/etcd-development/etcd:v3.4.23`: failed after",
            "gcr.io/etcd-development/etcd:v3.4.23 failed on purpose",
            "3. let the harness build leasehold-etcd:3.4.23 from Debian's etcd-server package",
            "leasehold-etcd:3.4.23: leasehold-etcd:3.4.23 failed on purpose; leasehold-etcd:3.4.23 failed on purpose",
        ] {
            assert!(message.contains(part), "{part:?} not in {message}");
        }
    }

    #[tokio::test]
    async fn a_named_image_that_fails_is_an_error_not_a_fallback() {
        let image = EtcdImage::select(Some("nowhere/etcd:gone"), EtcdImage::DEFAULT_VERSION);
        let (outcome, tried) =
            choose_with(&image, &[ImageSource::Local, ImageSource::Debian]).await;
        assert_eq!(tried, [ImageSource::Named]);
        let message = outcome.unwrap_err().to_string();
        for part in [
            "1. set LEASEHOLD_ETCD_IMAGE to an etcd image you have (etcd at /usr/local/bin/etcd): nowhere/etcd:gone failed: nowhere/etcd:gone failed on purpose",
            "2. `docker pull gcr.io/etcd-development/etcd:v3.5.16`: not tried: an image was named (LEASEHOLD_ETCD_IMAGE or EtcdImage::custom)",
            "(needs apt on a Debian-based machine; see deploy/fetch-etcd.sh): not tried: an image was named",
        ] {
            assert!(message.contains(part), "{part:?} not in {message}");
        }
    }

    #[tokio::test]
    async fn naming_leaseholds_own_image_that_cannot_be_built_says_so_in_each_way() {
        let image = EtcdImage::select(Some("leasehold-etcd:9.9.9"), EtcdImage::DEFAULT_VERSION);
        let (outcome, tried) = choose_with(&image, &[]).await;
        assert_eq!(tried, [ImageSource::Local, ImageSource::Debian]);
        let message = outcome.unwrap_err().to_string();
        for part in [
            "(etcd at /usr/local/bin/etcd): leasehold-etcd:9.9.9 is leasehold's own image: see 3",
            "`docker pull gcr.io/etcd-development/etcd:v9.9.9`: not tried: an image was named",
            "3. let the harness build leasehold-etcd:9.9.9 from Debian's etcd-server package (needs apt on a Debian-based machine; see deploy/fetch-etcd.sh): leasehold-etcd:9.9.9: leasehold-etcd:9.9.9 failed on purpose; leasehold-etcd:9.9.9 failed on purpose",
        ] {
            assert!(message.contains(part), "{part:?} not in {message}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_pull_that_never_answers_is_given_up_after_the_timeout() {
        let silent = futures_util::stream::pending::<Result<(), String>>();
        let started = tokio::time::Instant::now();
        let outcome = drain_within(silent, EtcdImage::PULL_TIMEOUT).await;
        assert_eq!(started.elapsed(), EtcdImage::PULL_TIMEOUT);
        assert!(outcome.unwrap_err().contains("gave up after 20s"));

        let refused = futures_util::stream::iter([Ok(()), Err("denied".to_owned()), Ok(())]);
        assert_eq!(
            drain_within(refused, EtcdImage::PULL_TIMEOUT).await,
            Err("denied".to_owned())
        );
        let pulled = futures_util::stream::iter([Ok::<(), String>(()), Ok(())]);
        assert_eq!(drain_within(pulled, EtcdImage::PULL_TIMEOUT).await, Ok(()));
    }
}
