//! The release a user installs (issue 39): the GitHub Actions workflows and
//! what they run, checked here as far as this machine can run them.
//!
//! - actionlint (pinned by `testenv/tools/actionlint`), with shellcheck on
//!   their `run:` scripts, finds nothing in any workflow under
//!   `.github/workflows/`, and does find the mistakes of a broken one;
//! - the release workflow builds the Dockerfile for linux/amd64 and
//!   linux/arm64 with an SBOM and provenance, pushes to ghcr.io, signs the
//!   image and the chart by digest with cosign (keyless), publishes the chart
//!   at the tag's version, pins every action to a commit and asks each job
//!   for no more permissions than it uses;
//! - the Dockerfile's build stage cross-compiles each of those platforms
//!   (`docker/rust-target.sh` names a Rust target rustc knows);
//! - `.github/scripts/publish-chart.sh`, the chart's publishing step, packages
//!   the chart at a version, pushes it to an OCI registry (crane's, on
//!   loopback) and names it by a digest that the registry serves and helm
//!   reads back. `tests/real_install.rs` installs from that digest onto the
//!   real node.
//!
//! Not run here: the workflow itself (no GitHub runner), `docker buildx` (no
//! container engine, no base image can be pulled), cosign's keyless signing
//! (no OIDC issuer) and the arm64 build (only the x86_64 Rust standard library
//! is installed).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::{Value, json};
use testsupport::install::{self, helm, repo};
use testsupport::output_text;

fn workflows_dir() -> PathBuf {
    repo().join(".github/workflows")
}

/// Every workflow file (`*.yml`, `*.yaml`) under `.github/workflows/`.
fn workflow_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(workflows_dir())
        .expect(".github/workflows")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml" || e == "yaml"))
        .collect();
    files.sort();
    files
}

fn release_workflow() -> Value {
    let text = std::fs::read_to_string(workflows_dir().join("release.yml")).unwrap();
    testenv::parse_manifests(&text).unwrap().remove(0)
}

/// shellcheck, which actionlint runs on every `run:` script (Debian's
/// package; `.ci/run` installs it).
fn shellcheck() -> PathBuf {
    let found = Command::new("sh")
        .args(["-c", "command -v shellcheck"])
        .output()
        .unwrap();
    let path = String::from_utf8_lossy(&found.stdout).trim().to_string();
    assert!(
        found.status.success() && !path.is_empty(),
        "shellcheck is not on PATH: `apt-get install shellcheck` (.ci/run does)"
    );
    PathBuf::from(path)
}

/// actionlint on `files`, with shellcheck on their scripts, from the
/// repository's root.
fn actionlint(files: &[PathBuf]) -> Output {
    let actionlint = testenv::ensure_actionlint_built().expect("actionlint builds");
    Command::new(actionlint)
        .current_dir(repo())
        .arg("-no-color")
        .arg("-shellcheck")
        .arg(shellcheck())
        // No Python in the workflows: the check is off rather than silently
        // skipped where pyflakes happens to be missing.
        .args(["-pyflakes", ""])
        .args(files)
        .output()
        .expect("actionlint runs")
}

#[test]
fn actionlint_finds_nothing_in_any_workflow() {
    let files = workflow_files();
    assert!(
        files.iter().any(|f| f.ends_with("release.yml")),
        "no release workflow in {files:?}"
    );
    let out = actionlint(&files);
    assert!(
        out.status.success() && out.stdout.is_empty(),
        "actionlint found problems in {files:?}:\n{}",
        output_text(&out)
    );
    // The pin is what runs.
    let version = Command::new(testenv::ensure_actionlint_built().unwrap())
        .arg("-version")
        .output()
        .unwrap();
    let pinned = testenv::required_version(
        &testenv::tool_module_dir("actionlint"),
        "github.com/rhysd/actionlint",
    )
    .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).lines().next(),
        Some(pinned.as_str())
    );
}

#[test]
fn actionlint_catches_a_broken_workflow_and_an_unsafe_script() {
    let dir = tempfile::tempdir().unwrap();
    let broken = dir.path().join("broken.yml");
    std::fs::write(
        &broken,
        r#"name: broken
on:
  push:
    tags: ["v*"]
jobs:
  build:
    runs-on: ubuntu-24.04
    needs: nowhere
    steps:
      - run: echo ${{ github.no_such_context }}
      - run: cp $SOURCE /tmp
"#,
    )
    .unwrap();
    let out = actionlint(std::slice::from_ref(&broken));
    let text = output_text(&out);
    assert!(!out.status.success(), "{text}");
    for rule in ["[job-needs]", "[expression]", "[shellcheck]"] {
        assert!(text.contains(rule), "no {rule} finding:\n{text}");
    }
    assert!(text.contains("SC2086"), "shellcheck's finding:\n{text}");
}

/// Every `uses:` of the workflow: (action, ref, the comment after it).
fn uses(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter_map(|l| l.trim().trim_start_matches("- ").strip_prefix("uses: "))
        .map(|rest| {
            let (reference, comment) = rest.split_once(" # ").unwrap_or((rest, ""));
            let (action, at) = reference.split_once('@').unwrap_or((reference, ""));
            (action.to_string(), at.to_string(), comment.to_string())
        })
        .collect()
}

#[test]
fn every_action_is_pinned_to_a_commit_and_each_job_asks_only_for_what_it_uses() {
    let text = std::fs::read_to_string(workflows_dir().join("release.yml")).unwrap();
    let pinned = uses(&text);
    assert!(pinned.len() >= 8, "{pinned:?}");
    for (action, at, comment) in &pinned {
        assert!(
            at.len() == 40 && at.chars().all(|c| c.is_ascii_hexdigit()),
            "{action}@{at}: not a full commit"
        );
        assert!(
            comment.starts_with('v'),
            "{action}@{at}: no `# vX.Y.Z` saying which release the commit is"
        );
    }
    // One action, one commit.
    let mut commits: BTreeMap<&str, &str> = BTreeMap::new();
    for (action, at, _) in &pinned {
        assert_eq!(*commits.entry(action).or_insert(at), at, "{action}");
    }

    let workflow = release_workflow();
    assert_eq!(workflow["on"], json!({"push": {"tags": ["v*"]}}));
    assert_eq!(workflow["permissions"], json!({}), "nothing by default");
    let jobs = workflow["jobs"].as_object().unwrap();
    let permissions = |job: &str| jobs[job]["permissions"].clone();
    assert_eq!(permissions("version"), json!({"contents": "read"}));
    let publishing = json!({"contents": "read", "packages": "write", "id-token": "write"});
    assert_eq!(permissions("image"), publishing);
    assert_eq!(permissions("chart"), publishing);
    assert_eq!(jobs.len(), 3, "{:?}", jobs.keys());
}

/// The steps of `job`.
fn steps<'a>(workflow: &'a Value, job: &str) -> &'a Vec<Value> {
    workflow["jobs"][job]["steps"].as_array().unwrap()
}

/// The step of `job` that uses `action`.
fn step_using<'a>(workflow: &'a Value, job: &str, action: &str) -> &'a Value {
    steps(workflow, job)
        .iter()
        .find(|s| {
            s["uses"]
                .as_str()
                .is_some_and(|u| u.starts_with(&format!("{action}@")))
        })
        .unwrap_or_else(|| panic!("{job} uses no {action}"))
}

/// The step of `job` whose `run:` contains `needle`.
fn step_running<'a>(workflow: &'a Value, job: &str, needle: &str) -> &'a Value {
    steps(workflow, job)
        .iter()
        .find(|s| s["run"].as_str().is_some_and(|r| r.contains(needle)))
        .unwrap_or_else(|| panic!("no step of {job} runs {needle}"))
}

#[test]
fn the_release_builds_both_platforms_with_attestations_and_signs_image_and_chart_by_digest() {
    let workflow = release_workflow();
    // The names: ghcr.io, lower case, from the tag checked against Cargo.toml.
    let names = step_running(&workflow, "version", "GITHUB_OUTPUT");
    let script = names["run"].as_str().unwrap();
    for needle in [
        "image=ghcr.io/$owner/node-holder",
        "charts=oci://ghcr.io/$owner/charts",
        "Cargo.toml",
        "${OWNER,,}",
    ] {
        assert!(script.contains(needle), "{needle} in {script}");
    }
    assert_eq!(names["env"]["TAG"], "${{ github.ref_name }}");

    // The image: the repository's Dockerfile, both platforms, SBOM and
    // provenance, pushed, then signed by the digest the build reports.
    let build = step_using(&workflow, "image", "docker/build-push-action");
    let with = &build["with"];
    assert_eq!(with["file"], "Dockerfile");
    assert_eq!(with["context"], ".");
    assert_eq!(with["platforms"], "linux/amd64,linux/arm64");
    assert_eq!(with["push"], true);
    assert_eq!(with["sbom"], true);
    assert_eq!(with["provenance"], "mode=max");
    let login = step_using(&workflow, "image", "docker/login-action");
    assert_eq!(login["with"]["registry"], "ghcr.io");
    let meta = step_using(&workflow, "image", "docker/metadata-action");
    assert_eq!(meta["with"]["images"], "${{ needs.version.outputs.image }}");
    assert_eq!(
        workflow["jobs"]["image"]["outputs"]["digest"],
        format!(
            "${{{{ steps.{}.outputs.digest }}}}",
            build["id"].as_str().unwrap()
        )
    );
    let sign = step_running(&workflow, "image", "cosign sign");
    assert_eq!(sign["run"], "cosign sign --yes \"$IMAGE@$DIGEST\"");
    assert_eq!(sign["env"]["DIGEST"], "${{ steps.build.outputs.digest }}");
    assert_eq!(sign["env"]["IMAGE"], "${{ needs.version.outputs.image }}");
    step_using(&workflow, "image", "sigstore/cosign-installer");

    // The chart: the pinned helm, the tag's version, pushed by the same
    // script the real-node test runs, signed by the digest it names.
    let helm = step_running(&workflow, "chart", "go build");
    assert_eq!(helm["working-directory"], "testenv/tools/helm");
    let publish = step_running(&workflow, "chart", "publish-chart.sh");
    assert!(
        publish["run"]
            .as_str()
            .unwrap()
            .contains(".github/scripts/publish-chart.sh \"$VERSION\" \"$CHARTS\""),
        "{publish}"
    );
    assert_eq!(
        publish["env"]["VERSION"],
        "${{ needs.version.outputs.version }}"
    );
    let sign = step_running(&workflow, "chart", "cosign sign");
    assert_eq!(sign["run"], "cosign sign --yes \"${CHART#oci://}\"");
    assert_eq!(
        sign["env"]["CHART"],
        format!(
            "${{{{ steps.{}.outputs.chart }}}}",
            publish["id"].as_str().unwrap()
        )
    );
    step_using(&workflow, "chart", "sigstore/cosign-installer");
    assert_eq!(
        workflow["jobs"]["chart"]["needs"],
        json!(["version", "image"])
    );
}

/// What `docker/rust-target.sh ARCH` exports, or its error.
fn rust_target(arch: &str) -> Result<BTreeMap<String, String>, String> {
    let script = repo().join("docker/rust-target.sh");
    let out = Command::new("sh")
        .arg("-c")
        .arg(r#"vars="$(sh "$0" "$1")" && eval "$vars" && unset vars && env"#)
        .arg(&script)
        .arg(arch)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap())
        .output()
        .unwrap();
    if !out.status.success() {
        return Err(output_text(&out));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .filter(|(k, _)| k != "PATH" && k != "PWD" && k != "SHLVL" && k != "_")
        .collect())
}

#[test]
fn the_dockerfile_cross_compiles_every_platform_the_release_builds() {
    let instructions = install::dockerfile_instructions();
    let lines: Vec<&str> = instructions.iter().map(String::as_str).collect();
    let dockerfile = instructions.join("\n");
    let stages: Vec<&&str> = lines.iter().filter(|l| l.starts_with("FROM ")).collect();
    // The build stage runs on the builder's platform: no emulation.
    assert!(
        stages[0].starts_with("FROM --platform=$BUILDPLATFORM "),
        "{}",
        stages[0]
    );
    assert!(lines.contains(&"ARG TARGETARCH"));
    assert!(
        lines
            .iter()
            .filter(
                |l| l.contains(r#"target_env="$(rust-target "$TARGETARCH")"; eval "$target_env";"#)
            )
            .count()
            == 2,
        "the toolchain and the build both take the target from rust-target"
    );
    assert!(dockerfile.contains(r#"--target "$RUST_TARGET""#));
    // The binary carries its crates for the SBOM scan (buildx --sbom).
    assert!(
        lines
            .iter()
            .any(|l| l.contains("cargo auditable build --release --locked")),
        "the binary is built by cargo auditable"
    );
    assert!(dockerfile.contains(r#"target/$RUST_TARGET/release/node-holder"#));
    // The runtime stage copies the binary and runs nothing: no emulator needed
    // for a platform the runner is not.
    let runtime = &lines[lines.iter().rposition(|l| l.starts_with("FROM ")).unwrap()..];
    assert!(
        !runtime.iter().any(|l| l.starts_with("RUN ")),
        "{runtime:?}"
    );

    // Every platform the workflow builds names a target rustc knows, with
    // Debian's cross tools for it.
    let known = Command::new("rustc")
        .args(["--print", "target-list"])
        .output()
        .unwrap();
    let known = String::from_utf8_lossy(&known.stdout).into_owned();
    let workflow = release_workflow();
    let platforms = step_using(&workflow, "image", "docker/build-push-action")["with"]["platforms"]
        .as_str()
        .unwrap()
        .to_string();
    for platform in platforms.split(',') {
        let arch = platform.strip_prefix("linux/").unwrap();
        let env = rust_target(arch).unwrap_or_else(|err| panic!("{platform}: {err}"));
        let target = &env["RUST_TARGET"];
        assert!(known.lines().any(|t| t == target), "{target}");
        let gnu = match arch {
            "amd64" => "x86_64-linux-gnu",
            "arm64" => "aarch64-linux-gnu",
            other => panic!("a platform this test does not know: {other}"),
        };
        assert_eq!(
            target,
            &format!("{}-unknown-linux-gnu", gnu.split('-').next().unwrap())
        );
        let upper = target.to_uppercase().replace('-', "_");
        let lower = target.replace('-', "_");
        assert_eq!(
            env,
            BTreeMap::from([
                ("RUST_TARGET".into(), target.clone()),
                (
                    "CROSS_PACKAGES".into(),
                    format!(
                        "gcc-{}-linux-gnu libc6-dev-{arch}-cross",
                        gnu.split('-').next().unwrap().replace('_', "-")
                    )
                ),
                (format!("CARGO_TARGET_{upper}_LINKER"), format!("{gnu}-gcc")),
                (format!("CC_{lower}"), format!("{gnu}-gcc")),
                (format!("AR_{lower}"), format!("{gnu}-ar")),
            ]),
            "{platform}"
        );
    }
    // On a builder of the target's own architecture the same names are the
    // native tools (Debian's gcc and binutils install them).
    if std::env::consts::ARCH == "x86_64" {
        let env = rust_target("amd64").unwrap();
        for tool in [
            &env["CC_x86_64_unknown_linux_gnu"],
            &env["AR_x86_64_unknown_linux_gnu"],
        ] {
            let found = Command::new("sh")
                .args(["-c", &format!("command -v {tool}")])
                .status()
                .unwrap();
            assert!(found.success(), "{tool} is not on this amd64 machine");
        }
    }
    let err = rust_target("riscv64").expect_err("riscv64 has no target here");
    assert!(
        err.contains("no Rust target for architecture 'riscv64'"),
        "{err}"
    );
}

/// `publish-chart.sh` with `args`: the version, the repository and the
/// flags for `helm push`, as many as given.
fn publish_chart(args: &[&str]) -> Output {
    match args {
        [version, repository, flags @ ..] => install::publish_chart(version, repository, flags),
        _ => {
            // Fewer than two: the script's own usage message.
            let mut command = Command::new(repo().join(".github/scripts/publish-chart.sh"));
            command.args(args).output().unwrap()
        }
    }
}

#[test]
fn the_chart_is_published_at_the_version_and_named_by_a_digest_the_registry_serves() {
    let registry = testenv::LocalRegistry::start().unwrap();
    let charts = format!("oci://{}/charts", registry.host());
    let out = publish_chart(&["1.2.3-rc.1", &charts, "--plain-http"]);
    assert!(out.status.success(), "{}", output_text(&out));
    let published = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let digest = published
        .strip_prefix(&format!("{charts}/node-holder@"))
        .unwrap_or_else(|| panic!("{published}"));
    // The registry serves that digest under the version's tag.
    let tagged = format!("{}/charts/node-holder:1.2.3-rc.1", registry.host());
    assert_eq!(registry.crane(&["digest", &tagged]).unwrap(), digest);
    // helm reads the chart back by digest alone: the tag's version is its
    // version and appVersion.
    let shown = helm()
        .args(["show", "chart", &published, "--plain-http"])
        .output()
        .unwrap();
    let text = output_text(&shown);
    assert!(shown.status.success(), "{text}");
    let chart = testenv::parse_manifests(&String::from_utf8_lossy(&shown.stdout))
        .unwrap()
        .remove(0);
    assert_eq!(chart["name"], "node-holder");
    assert_eq!(chart["version"], "1.2.3-rc.1");
    assert_eq!(chart["appVersion"], "1.2.3-rc.1");
    // Publishing the version again moves its tag (helm's package and
    // manifest carry their times), but not what the first digest names:
    // that is what an install by digest is pinned to.
    let again = publish_chart(&["1.2.3-rc.1", &charts, "--plain-http"]);
    assert!(again.status.success(), "{}", output_text(&again));
    let republished = String::from_utf8_lossy(&again.stdout).trim().to_string();
    let moved = republished.rsplit_once('@').unwrap().1;
    assert_eq!(registry.crane(&["digest", &tagged]).unwrap(), moved);
    let first = helm()
        .args(["show", "chart", &published, "--plain-http"])
        .output()
        .unwrap();
    assert_eq!(first.stdout, shown.stdout, "{}", output_text(&first));
}

#[test]
fn the_chart_is_not_published_with_a_bad_version_or_repository() {
    for (args, says) in [
        (
            vec!["v1.2.3", "oci://127.0.0.1:1/charts"],
            "semantic version",
        ),
        (vec!["1.2", "oci://127.0.0.1:1/charts"], "semantic version"),
        (vec!["1.2.3", "127.0.0.1:1/charts"], "oci:// reference"),
        (vec!["1.2.3"], "usage"),
    ] {
        let out = publish_chart(&args);
        let text = output_text(&out);
        assert!(!out.status.success(), "{args:?}: {text}");
        assert!(text.contains(says), "{args:?}: {text}");
        assert!(out.stdout.is_empty(), "{args:?}: {text}");
    }
    // Nothing reachable: helm push fails, and so does the script, naming no
    // chart.
    let out = publish_chart(&["1.2.3", "oci://127.0.0.1:1/charts", "--plain-http"]);
    assert!(!out.status.success(), "{}", output_text(&out));
    assert!(out.stdout.is_empty(), "{}", output_text(&out));
    assert!(output_text(&out).contains("helm push to oci://127.0.0.1:1/charts failed"));
}

/// What the workflow's comments and steps name is there.
#[test]
fn the_files_the_release_workflow_names_exist() {
    let text = std::fs::read_to_string(workflows_dir().join("release.yml")).unwrap();
    for path in [
        "Dockerfile",
        "docs/releasing.md",
        "testenv/tools/helm",
        ".github/scripts/publish-chart.sh",
    ] {
        assert!(text.contains(path), "{path} not named");
        assert!(Path::new(&repo().join(path)).exists(), "{path}");
    }
}
