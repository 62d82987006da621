//! The portable release that `make dist` builds (`make test-release` builds it and runs this
//! suite): the module and `ratelimit-rls` linked against glibc 2.17 by cargo-zigbuild, packed by
//! `dist/pack.sh`. Each binary's highest `GLIBC_` symbol version is read from its ELF version
//! needs (`readelf -V`) and must be 2.17 at most, so that both load on Debian 10 and 11, Ubuntu
//! 18.04 and 20.04, RHEL/CentOS 7 and 8 and Amazon Linux 2; the unpacked module is loaded, as its
//! `redis.conf` line does, into every server of the test matrix and answers; the unpacked service
//! loads its example configuration and serves `/healthcheck` against one of them.
//!
//! The tarball is `RL_DIST_TARBALL` (set by `make test-release`); a plain `cargo test` has none,
//! so the test is ignored there and run by name with `--ignored`.

mod harness;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use harness::{cmd, ints, run_ok};

/// The servers of the test matrix, as `make servers` lays them out in `RL_SERVERS_DIR`.
const MATRIX: [&str; 4] = ["redis-7.0", "redis-8.2", "valkey-8.1", "valkey-9.1"];

/// The highest glibc a release may need.
const GLIBC_FLOOR: (u32, u32) = (2, 17);

/// Every `GLIBC_x.y[.z]` version the binary needs, from its `.gnu.version_r` section.
fn glibc_versions(binary: &Path) -> Vec<(u32, u32, u32)> {
    let text = run_ok(
        "readelf",
        &["-V", "--wide", binary.to_str().unwrap()],
        Path::new("."),
    );
    let mut found: Vec<(u32, u32, u32)> = text
        .split_whitespace()
        .filter_map(|word| word.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut parts = v.split('.').map(|p| p.parse::<u32>().ok());
            Some((
                parts.next()??,
                parts.next()??,
                parts.next().flatten().unwrap_or(0),
            ))
        })
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap()
}

/// A server of the matrix started with `--loadmodule` on the unpacked module, on a unix socket;
/// stopped when dropped.
struct Running {
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Running {
    fn start(server: &Path, module: &Path) -> Running {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("redis.sock");
        let child = Command::new(server)
            .args(["--port", "0", "--unixsocket"])
            .arg(&socket)
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(dir.path())
            .arg("--loadmodule")
            .arg(module)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", server.display()));
        Running {
            child,
            socket,
            _dir: dir,
        }
    }

    fn connect(&mut self) -> redis::Connection {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let url = format!("redis+unix://{}", self.socket.display());
            if let Ok(mut c) = redis::Client::open(url.as_str()).and_then(|c| c.get_connection())
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return c;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("the server exited ({status}) with the release's module loaded");
            }
            assert!(Instant::now() < deadline, "no answer in 10 s");
            sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET /healthcheck` once: its status code, or None while nothing listens.
fn healthcheck(port: u16) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /healthcheck HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut reply = String::new();
    s.read_to_string(&mut reply).ok()?;
    reply.split_whitespace().nth(1)?.parse().ok()
}

#[test]
#[ignore = "needs the portable tarball: make test-release"]
fn the_portable_release_needs_glibc_2_17_and_loads_on_every_server() {
    let tarball = PathBuf::from(
        std::env::var("RL_DIST_TARBALL").expect("RL_DIST_TARBALL: make test-release sets it"),
    );
    let servers = PathBuf::from(
        std::env::var("RL_SERVERS_DIR").expect("RL_SERVERS_DIR: make test-release sets it"),
    );
    let unpacked = tempfile::tempdir().unwrap();
    run_ok("tar", &["-xzf", tarball.to_str().unwrap()], unpacked.path());
    let name = tarball
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_suffix(".tar.gz"))
        .unwrap()
        .to_string();
    let dir = unpacked.path().join(&name);
    let module = dir.join("libredis_rate_limiter.so");
    let service = dir.join("ratelimit-rls");

    // Both binaries checked against their checksums, then read.
    let sums = run_ok("sha256sum", &["-c", "SHA256SUMS"], &dir);
    for binary in ["libredis_rate_limiter.so", "ratelimit-rls"] {
        assert!(sums.contains(&format!("{binary}: OK")), "{sums}");
    }
    for binary in [&module, &service] {
        let versions = glibc_versions(binary);
        // A binary that needs no glibc symbol at all was not linked against it: a wrong build.
        assert!(
            versions.len() >= 2,
            "{}: GLIBC_ versions {versions:?}",
            binary.display()
        );
        let highest = *versions.last().unwrap();
        eprintln!(
            "{}: highest GLIBC_ {}.{}{}",
            binary.file_name().unwrap().to_string_lossy(),
            highest.0,
            highest.1,
            if highest.2 > 0 {
                format!(".{}", highest.2)
            } else {
                String::new()
            }
        );
        assert!(
            (highest.0, highest.1) <= GLIBC_FLOOR,
            "{} needs GLIBC_{}.{}.{} (all: {versions:?}); a release may need 2.17 at most",
            binary.display(),
            highest.0,
            highest.1,
            highest.2
        );
    }

    // The module, loaded at start-up as the tarball's redis.conf line does, on every server.
    let conf = std::fs::read_to_string(dir.join("redis.conf")).unwrap();
    assert!(conf.lines().any(|l| l.starts_with("loadmodule ")), "{conf}");
    let mut first: Option<Running> = None;
    for server_name in MATRIX {
        let server = servers.join(server_name).join("server");
        assert!(
            server.exists(),
            "{}: make servers fetches it",
            server.display()
        );
        let mut running = Running::start(&server, &module);
        let mut c = running.connect();
        let modules = format!("{:?}", cmd(&mut c, &["MODULE", "LIST"]));
        assert!(modules.contains("ratelimit"), "{server_name}: {modules}");
        // One token used of 10 refilling at 5 per second: full again in 200 ms.
        assert_eq!(
            ints(&cmd(&mut c, &["RL.TOKENBUCKET", "m", "10", "5"])),
            [1, 9, 0, 200, 10],
            "{server_name}"
        );
        assert_eq!(
            ints(&cmd(&mut c, &["RL.FIXEDWINDOW", "w", "1", "60"]))[0],
            1,
            "{server_name}"
        );
        assert_eq!(
            ints(&cmd(&mut c, &["RL.FIXEDWINDOW", "w", "1", "60"]))[0],
            0,
            "{server_name}"
        );
        if first.is_none() {
            first = Some(running);
        }
    }

    // The service: its example configuration checked, then served against the first server.
    let redis = first.unwrap();
    let env = |c: &mut Command| {
        c.env("RUNTIME_ROOT", &dir)
            .env("RUNTIME_SUBDIRECTORY", "rls")
            .env("RUNTIME_APPDIRECTORY", "config")
            .env("REDIS_SOCKET_TYPE", "unix")
            .env("REDIS_URL", &redis.socket)
            .env("USE_PROMETHEUS", "false");
    };
    let mut check = Command::new(&service);
    check.arg("--check");
    env(&mut check);
    let out = check.output().unwrap();
    assert!(
        out.status.success(),
        "ratelimit-rls --check: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let (http, grpc) = (free_port(), free_port());
    let mut serve = Command::new(&service);
    env(&mut serve);
    serve
        .env("HOST", "127.0.0.1")
        .env("PORT", http.to_string())
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", grpc.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut child = serve.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(code) = healthcheck(http) {
            break code;
        }
        if let Ok(Some(exit)) = child.try_wait() {
            panic!("ratelimit-rls exited: {exit}");
        }
        assert!(Instant::now() < deadline, "no /healthcheck in 10 s");
        sleep(Duration::from_millis(50));
    };
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status, 200);
}
