//! Both daemons' container image, built without a container engine (`.ci/image`: an OCI
//! layout written by umoci) from the binaries `cargo test --workspace` builds beside this
//! test, then unpacked as a runtime would and its entrypoint run in it, as the image's
//! user, with nothing of this machine but the kernel. The Dockerfile itself is linted in
//! `grid-operatord/tests/manifests.rs`: its base images cannot be pulled here.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use grid_programs::soak::grid::Binaries;

/// The user the image runs as: distroless's `nonroot`, as the Dockerfile says.
const NONROOT: u64 = 65532;

/// The longest any one step may take (building the layout, unpacking it, a command in
/// it): each is a few seconds; one that hangs is killed (coreutils' `timeout`) and fails.
const STEP_LIMIT_S: u32 = 120;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `program` under [`STEP_LIMIT_S`].
fn bounded(program: &str) -> Command {
    let mut c = Command::new("timeout");
    c.arg(STEP_LIMIT_S.to_string()).arg(program);
    c
}

fn run(command: &mut Command) -> Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        out.status.success(),
        "{command:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn the_image_runs_the_operator_as_its_entrypoint_and_the_gateway_as_nonroot_with_no_shell() {
    let binaries = Binaries::beside_this_program().expect("the daemons' test builds");
    let bin_dir = binaries.operatord.parent().unwrap();
    assert_eq!(Some(bin_dir), binaries.gatewayd.parent());
    let dir = tempfile::tempdir().unwrap();
    let layout = dir.path().join("layout");
    run(bounded("bash")
        .arg(workspace().join(".ci/image"))
        .arg(&layout)
        .arg(bin_dir));

    // Unpacked as a runtime unpacks it: the configuration says what runs, as whom.
    let bundle = dir.path().join("bundle");
    run(bounded("umoci")
        .arg("unpack")
        .arg("--image")
        .arg(format!("{}:grid", layout.display()))
        .arg(&bundle));
    let config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
    let process = &config["process"];
    assert_eq!(process["user"]["uid"], NONROOT, "{process}");
    assert_eq!(process["user"]["gid"], NONROOT, "{process}");
    let entrypoint: Vec<&str> = process["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(entrypoint, ["/usr/local/bin/grid-operatord"]);
    let rootfs = bundle.join("rootfs");
    assert!(!rootfs.join("bin/sh").exists(), "no shell in the image");
    assert!(rootfs.join("etc/ssl/certs/ca-certificates.crt").is_file());

    // The entrypoint runs in the image alone, as its user: every library it needs is there.
    let in_image = |args: &[&str]| {
        let mut c = bounded("chroot");
        c.arg(format!("--userspec={NONROOT}:{NONROOT}"))
            .arg(&rootfs)
            .args(args);
        String::from_utf8(run(&mut c).stdout).unwrap()
    };
    let mut crds = entrypoint.clone();
    crds.push("crds");
    let printed = in_image(&crds);
    assert!(
        printed.contains("kind: CustomResourceDefinition"),
        "{printed}"
    );
    let version = in_image(&["/usr/local/bin/grid-gatewayd", "--version"]);
    assert!(version.starts_with("grid-gatewayd "), "{version}");
}
