//! The release tarball (`make dist`, built by `dist/pack.sh`): its contents, their checksums, and
//! a fresh server loading the module from the unpacked directory, with a twin from it answering
//! the same.

mod harness;

use std::path::Path;

use harness::{Options, Server, cmd, ints, module_path, run_ok};

#[test]
fn the_tarball_holds_a_module_that_loads_and_its_twins() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let work = tempfile::tempdir().unwrap();
    let module = module_path();
    let packed = run_ok(
        "bash",
        &[
            root.join("dist/pack.sh").to_str().unwrap(),
            module.to_str().unwrap(),
            work.path().to_str().unwrap(),
        ],
        root,
    );
    let tarball = packed.trim().lines().last().unwrap().to_string();
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        tarball.ends_with(&format!(
            "redis-rate-limiter-{version}-{}-linux.tar.gz",
            std::env::consts::ARCH
        )),
        "{tarball}"
    );

    let unpacked = tempfile::tempdir().unwrap();
    run_ok("tar", &["-xzf", &tarball], unpacked.path());
    let dir = unpacked.path().join(format!(
        "redis-rate-limiter-{version}-{}-linux",
        std::env::consts::ARCH
    ));
    let mut files: Vec<String> = run_ok("find", &[".", "-type", "f"], &dir)
        .lines()
        .map(|l| l.trim_start_matches("./").to_string())
        .collect();
    files.sort();
    let mut expected: Vec<String> = [
        "LICENSE",
        "README.md",
        "SHA256SUMS",
        "libredis_rate_limiter.so",
        "redis.conf",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for entry in std::fs::read_dir(root.join("lua-reference")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        expected.push(format!("lua/{name}"));
    }
    expected.sort();
    assert_eq!(files, expected);
    // Every packed file but the checksums themselves is checked, and each matches.
    let checked = run_ok("sha256sum", &["-c", "SHA256SUMS"], &dir);
    assert_eq!(checked.lines().count(), expected.len() - 4, "{checked}");
    assert!(checked.lines().all(|l| l.ends_with(": OK")), "{checked}");
    let conf = std::fs::read_to_string(dir.join("redis.conf")).unwrap();
    assert!(conf.lines().any(|l| l.starts_with("loadmodule ")), "{conf}");

    let server = Server::with(Options {
        without_module: true,
        ..Options::default()
    });
    let mut c = server.connect();
    let so = dir.join("libredis_rate_limiter.so");
    cmd(&mut c, &["MODULE", "LOAD", so.to_str().unwrap()]).unwrap();
    // One token used of 10 refilling at 5 per second: full again in 200 ms.
    assert_eq!(
        ints(&cmd(&mut c, &["RL.TOKENBUCKET", "m", "10", "5"])),
        [1, 9, 0, 200, 10]
    );
    let script = std::fs::read_to_string(dir.join("lua/token_bucket.lua")).unwrap();
    let twin = cmd(&mut c, &["EVAL", &script, "1", "l", "10", "5"]);
    assert_eq!(ints(&twin), [1, 9, 0, 200, 10]);
}
