//! Starts real `redis-server` processes for the client tests (with or without the module), on a
//! loopback port, and shuts them down on drop.
#![allow(dead_code)]

pub mod replicas;

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

/// The module built in this workspace (`target/<profile>/libredis_rate_limiter.so`), or
/// `RL_MODULE`.
pub fn module_path() -> PathBuf {
    if let Ok(p) = std::env::var("RL_MODULE") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir");
    for dir in [deps, deps.parent().unwrap_or(deps)] {
        let candidate = dir.join("libredis_rate_limiter.so");
        if candidate.exists() {
            return candidate;
        }
    }
    panic!(
        "libredis_rate_limiter.so not found next to {} (cargo build -p redis-rate-limiter)",
        exe.display()
    );
}

/// `RL_REDIS_SERVER`: the server of the test matrix to run on (make test sets it).
pub fn server_binary() -> PathBuf {
    std::env::var_os("RL_REDIS_SERVER")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("redis-server"), PathBuf::from)
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// A free port whose cluster bus port (+10000) is free too.
pub fn cluster_port() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").expect("free port");
        let p = l.local_addr().expect("free port").port();
        if p < 55_000 && TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok() {
            return p;
        }
    }
}

#[derive(Clone, Copy, Default)]
pub struct Opts {
    pub module: bool,
    pub test_clock: bool,
    pub port: Option<u16>,
    pub cluster: bool,
}

pub struct Server {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub port: u16,
}

impl Server {
    pub fn with_module() -> Server {
        Self::start(Opts {
            module: true,
            ..Opts::default()
        })
    }

    pub fn without_module() -> Server {
        Self::start(Opts::default())
    }

    pub fn with_test_clock() -> Server {
        Self::start(Opts {
            module: true,
            test_clock: true,
            ..Opts::default()
        })
    }

    pub fn start(opts: Opts) -> Server {
        Self::start_with(opts, &[])
    }

    /// [`Server::start`] with more arguments for the server (`--replicaof host port`...).
    ///
    /// A port chosen here (a pair for a cluster node) can be taken by another process between the
    /// check and the server's bind: then it tries again on another one.
    pub fn start_with(opts: Opts, extra: &[&str]) -> Server {
        let mut attempt = 1;
        loop {
            let port = opts.port.unwrap_or_else(|| {
                if opts.cluster {
                    cluster_port()
                } else {
                    free_port()
                }
            });
            match Self::try_start(opts, port, extra) {
                Ok(s) => return s,
                Err(log)
                    if opts.port.is_none()
                        && attempt < 5
                        && log.contains("Address already in use") =>
                {
                    attempt += 1
                }
                Err(log) => panic!("redis-server did not start; log:\n{log}"),
            }
        }
    }

    /// A started server, or its log when it exited or did not answer in time.
    fn try_start(opts: Opts, port: u16, extra: &[&str]) -> Result<Server, String> {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &dir.path().display().to_string(),
            "--logfile",
            &dir.path().join("redis.log").display().to_string(),
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .map(String::from)
        .to_vec();
        if opts.module {
            args.push("--loadmodule".into());
            args.push(module_path().display().to_string());
            if opts.test_clock {
                args.push("TESTCLOCK".into());
            }
        }
        if opts.cluster {
            for a in [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                "2000",
            ] {
                args.push(a.into());
            }
        }
        args.extend(extra.iter().map(|a| a.to_string()));
        let binary = server_binary();
        let child = Command::new(&binary)
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "{} could not start ({e}); make test installs the servers",
                    binary.display()
                )
            });
        let mut s = Server {
            child: Some(child),
            dir,
            port,
        };
        s.wait_ready()?;
        Ok(s)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Waits until the server answers PING; its log when it exited or took longer than 10 s.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = self.try_connect()
                && redis::cmd("PING").query::<String>(&mut c).is_ok()
            {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!("exited with {status}\n{}", self.log()));
            }
            if Instant::now() > deadline {
                return Err(format!("no answer in 10 s\n{}", self.log()));
            }
            sleep(Duration::from_millis(20));
        }
    }

    pub fn try_connect(&self) -> redis::RedisResult<redis::Connection> {
        redis::Client::open(self.url())?.get_connection()
    }

    pub fn connect(&self) -> redis::Connection {
        self.try_connect().expect("connect to test server")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Kills the server at once (no shutdown handshake), as a crash would.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn set_clock(c: &mut redis::Connection, unix_us: i64) {
    let _: i64 = redis::cmd("RL.TESTCLOCK")
        .arg("SET")
        .arg(unix_us)
        .query(c)
        .expect("RL.TESTCLOCK SET");
}

pub fn advance_clock(c: &mut redis::Connection, us: i64) {
    let _: i64 = redis::cmd("RL.TESTCLOCK")
        .arg("ADVANCE")
        .arg(us)
        .query(c)
        .expect("RL.TESTCLOCK ADVANCE");
}
