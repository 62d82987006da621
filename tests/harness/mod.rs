//! Test harness: starts real `redis-server` processes with the module loaded, in a temporary
//! directory, and always shuts them down (on drop, also when a test fails). With `--features
//! containers` and `RL_REDIS_IMAGE` set, the servers are containers of that image instead
//! (`container`). `memory` and `scenarios` hold the in-memory model and the generated sequences
//! of the differential suites; `replication` the replication check every limiter runs.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use redis::{Connection, RedisError, Value};

/// The module built by this `cargo test` run (cdylib next to the test binary in `deps/`),
/// or `RL_MODULE` if set.
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
        "libredis_rate_limiter.so not found next to {}",
        exe.display()
    );
}

pub fn lua_script(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("lua-reference")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The server binary the suite runs on: `RL_REDIS_SERVER` (`make test` sets it to each server of
/// the matrix in turn, see tests/servers/fetch.sh), else `redis-server` from the PATH.
pub fn server_binary() -> PathBuf {
    std::env::var_os("RL_REDIS_SERVER")
        .filter(|p| !p.is_empty())
        .map_or_else(|| PathBuf::from("redis-server"), PathBuf::from)
}

/// What `INFO server` says this server is: (`redis` or `valkey`, its version).
pub fn server_identity(c: &mut Connection) -> (String, String) {
    let name = info_field(c, "server", "server_name");
    if name == "valkey" {
        (name, info_field(c, "server", "valkey_version"))
    } else {
        (
            "redis".to_string(),
            info_field(c, "server", "redis_version"),
        )
    }
}

/// True (after saying why on stderr) when the server under test is one a test cannot apply to.
pub fn skip_on_server(server: &Server, applies: impl Fn(&str, &str) -> bool, why: &str) -> bool {
    let (name, version) = server_identity(&mut server.connect());
    if applies(&name, &version) {
        return false;
    }
    eprintln!("skipped on {name} {version}: {why}");
    true
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

#[derive(Clone, Default)]
pub struct Options {
    /// Load the module with `TESTCLOCK` (time moves only with `RL.TESTCLOCK`).
    pub test_clock: bool,
    /// Extra `redis-server` arguments, e.g. `["--appendonly", "yes"]`.
    pub extra: Vec<String>,
    /// Do not load the module (for `MODULE LOAD` tests).
    pub without_module: bool,
    /// A fixed TCP port; without one, the harness picks a free one (for a cluster node, one whose
    /// bus port, +10000, is free too).
    pub port: Option<u16>,
    /// A cluster node (`--cluster-enabled yes`, its own `nodes.conf`, a 2 s node timeout).
    pub cluster: bool,
}

/// Where the tests connect to a server.
#[derive(Clone, Debug)]
pub enum Target {
    /// A local redis-server's unix socket.
    Unix(PathBuf),
    /// A container's port as mapped on the Docker host.
    Tcp { host: String, port: u16 },
}

enum Process {
    Local(Child),
    #[cfg(feature = "containers")]
    Container(container::Running),
}

pub struct Server {
    process: Option<Process>,
    pub dir: tempfile::TempDir,
    /// The TCP port clients use (for a container: the port mapped on the Docker host).
    pub port: u16,
    pub target: Target,
}

/// The image named by `RL_REDIS_IMAGE`, when the suite runs against containers.
pub fn container_image() -> Option<String> {
    let image = std::env::var("RL_REDIS_IMAGE")
        .ok()
        .filter(|i| !i.is_empty())?;
    // Running the local server while the caller asked for an image would pass silently.
    if cfg!(not(feature = "containers")) {
        panic!("RL_REDIS_IMAGE={image} needs `cargo test --features containers`");
    }
    Some(image)
}

/// True (after saying why on stderr) when the suite runs against containers and the calling
/// test needs the local backend: the test then returns early.
pub fn skip_in_container(why: &str) -> bool {
    let Some(image) = container_image() else {
        return false;
    };
    eprintln!("skipped with RL_REDIS_IMAGE={image}: {why}");
    true
}

/// Arguments for either backend; `dir` and `module` are paths as the server sees them.
fn common_args(dir: &Path, module: &Path, opts: &Options) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--dir".into(),
        dir.display().to_string(),
        "--logfile".into(),
        dir.join("redis.log").display().to_string(),
        "--save".into(),
        String::new(),
        "--repl-diskless-sync-delay".into(),
        "0".into(),
    ];
    if !opts.without_module {
        args.push("--loadmodule".into());
        args.push(module.display().to_string());
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
    args.extend(opts.extra.iter().cloned());
    args
}

impl Server {
    pub fn start() -> Server {
        Self::with(Options::default())
    }

    pub fn with_test_clock() -> Server {
        Self::with(Options {
            test_clock: true,
            ..Options::default()
        })
    }

    pub fn with(opts: Options) -> Server {
        let dir = tempfile::tempdir().expect("temp dir");
        Self::start_in(dir, opts)
    }

    /// Starts a server in `dir` (reusing its data files, for restart tests).
    ///
    /// A port chosen here can be taken by another process between the check and the server's
    /// bind: then it tries again on another one.
    pub fn start_in(dir: tempfile::TempDir, opts: Options) -> Server {
        if let Some(image) = container_image() {
            return Self::start_container(&image, dir, &opts);
        }
        let mut dir = dir;
        let mut attempt = 1;
        loop {
            let port = opts.port.unwrap_or_else(|| {
                if opts.cluster {
                    cluster::cluster_port()
                } else {
                    free_port()
                }
            });
            let mut server = Self::spawn_local(dir, port, &opts);
            match server.wait_ready() {
                Ok(()) => return server,
                Err(log)
                    if opts.port.is_none()
                        && attempt < 5
                        && log.contains("Address already in use") =>
                {
                    attempt += 1;
                    dir = server.stop();
                    let _ = std::fs::remove_file(dir.path().join("redis.log"));
                }
                Err(log) => panic!("redis-server did not start: {log}"),
            }
        }
    }

    fn spawn_local(dir: tempfile::TempDir, port: u16, opts: &Options) -> Server {
        let socket = dir.path().join("redis.sock");
        let mut args: Vec<String> = vec![
            "--port".into(),
            port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
            "--unixsocket".into(),
            socket.display().to_string(),
            "--unixsocketperm".into(),
            "700".into(),
            "--enable-module-command".into(),
            "local".into(),
        ];
        args.extend(common_args(dir.path(), &module_path(), opts));
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
        Server {
            process: Some(Process::Local(child)),
            dir,
            port,
            target: Target::Unix(socket),
        }
    }

    #[cfg(feature = "containers")]
    fn start_container(image: &str, dir: tempfile::TempDir, opts: &Options) -> Server {
        let (running, host, port) = container::start(image, dir.path(), opts);
        let mut server = Server {
            process: Some(Process::Container(running)),
            dir,
            port,
            target: Target::Tcp { host, port },
        };
        if let Err(log) = server.wait_ready() {
            panic!("the container did not start: {log}");
        }
        server
    }

    #[cfg(not(feature = "containers"))]
    fn start_container(_: &str, _: tempfile::TempDir, _: &Options) -> Server {
        unreachable!("container_image() refuses RL_REDIS_IMAGE without the containers feature")
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
            if !self.is_running() {
                return Err(format!("it exited; log:\n{}", self.log()));
            }
            if Instant::now() > deadline {
                return Err(format!("no answer in 10 s; log:\n{}", self.log()));
            }
            sleep(Duration::from_millis(20));
        }
    }

    fn try_connect(&self) -> redis::RedisResult<Connection> {
        let url = match &self.target {
            Target::Unix(socket) => format!("redis+unix://{}", socket.display()),
            Target::Tcp { host, port } => format!("redis://{host}:{port}/"),
        };
        redis::Client::open(url)?.get_connection()
    }

    pub fn connect(&self) -> Connection {
        self.try_connect().expect("connect to test server")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default()
    }

    pub fn is_running(&mut self) -> bool {
        match self.process.as_mut() {
            Some(Process::Local(child)) => matches!(child.try_wait(), Ok(None)),
            #[cfg(feature = "containers")]
            Some(Process::Container(c)) => c.is_running(),
            None => false,
        }
    }

    /// The module file as this server sees it (for `MODULE LOAD`).
    pub fn module_file(&self) -> String {
        #[cfg(feature = "containers")]
        if let Some(Process::Container(_)) = self.process {
            return container::MODULE_FILE.to_string();
        }
        module_path().display().to_string()
    }

    /// The address another server uses to reach this one: loopback for local servers, the
    /// container's address on the Docker bridge network for containers.
    fn address_for_replicas(&self) -> (String, u16) {
        #[cfg(feature = "containers")]
        if let Some(Process::Container(c)) = &self.process {
            return c.bridge_address();
        }
        ("127.0.0.1".to_string(), self.port)
    }

    /// Makes this server a replica of `master` and waits until the link is up and synced.
    pub fn replicate_from(&self, master: &Server) {
        let mut c = self.connect();
        let (host, port) = master.address_for_replicas();
        let _: () = redis::cmd("REPLICAOF")
            .arg(host)
            .arg(port)
            .query(&mut c)
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let info: String = redis::cmd("INFO").arg("replication").query(&mut c).unwrap();
            if info.contains("master_link_status:up") {
                return;
            }
            assert!(Instant::now() < deadline, "replica never synced:\n{info}");
            sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server, keeping its directory (for restart tests).
    pub fn stop(mut self) -> tempfile::TempDir {
        self.shutdown();
        let dir = tempfile::tempdir().expect("temp dir");
        std::mem::replace(&mut self.dir, dir)
    }

    fn shutdown(&mut self) {
        let Some(process) = self.process.take() else {
            return;
        };
        if let Ok(mut c) = self.try_connect() {
            let _ = redis::cmd("SHUTDOWN").arg("NOSAVE").query::<Value>(&mut c);
        }
        match process {
            Process::Local(child) => wait_or_kill(child),
            // Dropping the container removes it; the data directory stays on the host.
            #[cfg(feature = "containers")]
            Process::Container(c) => drop(c),
        }
    }
}

/// Waits for a local server that was told to shut down, killing it if it hangs.
fn wait_or_kill(mut child: Child) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        sleep(Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Server {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A command's reply, or the server's error text exactly as sent (`ERR ...`, `WRONGTYPE ...`).
pub type Reply = Result<Value, String>;

pub fn error_text(e: &RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => e.to_string(),
    }
}

pub fn call(c: &mut Connection, args: &[&[u8]]) -> Reply {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).expect("command name"));
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query::<Value>(c).map_err(|e| error_text(&e))
}

/// Runs a program in `dir` and returns its standard output; panics with both outputs when it
/// fails (the release tarball's tests: `tar`, `sha256sum`, `readelf`, `dist/pack.sh`).
pub fn run_ok(program: &str, args: &[&str], dir: &Path) -> String {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `call` with string arguments.
pub fn cmd(c: &mut Connection, args: &[&str]) -> Reply {
    let raw: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    call(c, &raw)
}

/// A five-integer limiter reply.
pub fn ints(reply: &Reply) -> Vec<i64> {
    match reply {
        Ok(Value::Array(items)) => items
            .iter()
            .map(|v| match v {
                Value::Int(i) => *i,
                other => panic!("not an integer: {other:?}"),
            })
            .collect(),
        other => panic!("not an array reply: {other:?}"),
    }
}

/// `HGETALL` as sorted (field, value) byte pairs.
pub fn hash_bytes(c: &mut Connection, key: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut v: Vec<(Vec<u8>, Vec<u8>)> =
        redis::cmd("HGETALL").arg(key).query(c).unwrap_or_default();
    v.sort();
    v
}

/// A key's type and its value as raw bytes (see `stored`).
pub type Stored = (String, Vec<Vec<u8>>);

/// A key's type and its value as raw bytes: a string's bytes, a hash's sorted field and value
/// pairs, a sorted set's members and scores in order; nothing for a missing key.
pub fn stored(c: &mut Connection, key: &str) -> Stored {
    let kind: String = redis::cmd("TYPE").arg(key).query(c).expect("TYPE");
    let value = match kind.as_str() {
        "string" => vec![string_bytes(c, key)],
        "hash" => hash_bytes(c, key)
            .into_iter()
            .flat_map(|(f, v)| [f, v])
            .collect(),
        "zset" => zset_bytes(c, key),
        _ => Vec::new(),
    };
    (kind, value)
}

/// `GET key` as raw bytes (empty for a missing key).
pub fn string_bytes(c: &mut Connection, key: &str) -> Vec<u8> {
    redis::cmd("GET").arg(key).query(c).unwrap_or_default()
}

pub fn pexpiretime(c: &mut Connection, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME")
        .arg(key)
        .query(c)
        .expect("PEXPIRETIME")
}

pub fn info_field(c: &mut Connection, section: &str, field: &str) -> String {
    let info: String = redis::cmd("INFO").arg(section).query(c).expect("INFO");
    info.lines()
        .find_map(|l| {
            l.strip_prefix(&format!("{field}:"))
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default()
}

/// `clients` connections each send `args` once, all released at the same moment by a barrier;
/// returns the first element of every reply (allowed, or CL.THROTTLE's limited), in no order.
pub fn first_replies_of_racing_clients(server: &Server, clients: usize, args: &[&str]) -> Vec<i64> {
    let start = std::sync::Arc::new(std::sync::Barrier::new(clients));
    let workers: Vec<_> = (0..clients)
        .map(|_| {
            let mut c = server.connect();
            let start = std::sync::Arc::clone(&start);
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            std::thread::spawn(move || {
                start.wait();
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                ints(&cmd(&mut c, &args))[0]
            })
        })
        .collect();
    workers
        .into_iter()
        .map(|w| w.join().expect("worker"))
        .collect()
}

/// `calls=` of one command in a server's `INFO commandstats` (0 when it never ran).
pub fn calls_of(c: &mut redis::Connection, command: &str) -> u64 {
    let stat = info_field(c, "commandstats", &format!("cmdstat_{command}"));
    stat.strip_prefix("calls=")
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

/// Sets the test clock (servers started `with_test_clock`).
pub fn set_clock(c: &mut Connection, unix_us: i64) {
    let _: i64 = redis::cmd("RL.TESTCLOCK")
        .arg("SET")
        .arg(unix_us)
        .query(c)
        .expect("RL.TESTCLOCK SET");
}

pub fn advance_clock(c: &mut Connection, us: i64) {
    let _: i64 = redis::cmd("RL.TESTCLOCK")
        .arg("ADVANCE")
        .arg(us)
        .query(c)
        .expect("RL.TESTCLOCK ADVANCE");
}

pub fn now_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

pub mod cases;
pub mod cluster;
#[cfg(feature = "containers")]
pub mod container;
pub mod memory;
pub mod replication;
pub mod scenarios;

/// Generated-case counts for the differential suites, multiplied by `RL_DIFF_SCALE` (`make soak`).
pub fn scaled(cases: u32) -> u32 {
    let scale: u32 = std::env::var("RL_DIFF_SCALE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    cases.saturating_mul(scale.max(1))
}

/// `ZRANGE key 0 -1 WITHSCORES` as raw bytes: member, score, member, score, ...
pub fn zset_bytes(c: &mut Connection, key: &str) -> Vec<Vec<u8>> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(c)
        .unwrap_or_default()
}

/// Each call `command key args...` gets exactly its error, and `key` keeps its bytes.
pub fn assert_errors_change_nothing(
    c: &mut Connection,
    command: &str,
    key: &str,
    cases: &[(&[&str], &str)],
) {
    let before = stored(c, key);
    for (args, expected) in cases {
        let mut full = vec![command];
        full.extend_from_slice(args);
        assert_eq!(cmd(c, &full), Err(expected.to_string()), "{args:?}");
    }
    assert_eq!(stored(c, key), before, "a refused call changed {key}");
}

/// Values of a limiter stored as `<amount> <timestamp>` that are not what the module writes, and
/// the error each gets: the first number's error, or the second's.
pub fn corrupt_amount_and_time<'a>(first: &'a str, second: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut cases: Vec<(&str, &str)> = ["", "x", "abc 1", "-1 1", "1e999 1", " 1 1"]
        .into_iter()
        .map(|v| (v, first))
        .collect();
    cases.extend(
        [
            "1",
            "1 1.5",
            "1 -5",
            "1 1 1",
            "1  1",
            "1 99999999999999999999",
        ]
        .into_iter()
        .map(|v| (v, second)),
    );
    cases
}

/// For each case a fresh string key holding that value: `command key args...` gets exactly the
/// error, and the key keeps its bytes and gets no expiry.
pub fn assert_corrupt_values_reported(
    c: &mut Connection,
    command: &str,
    args: &[&str],
    cases: &[(&str, &str)],
) {
    for (i, (value, expected)) in cases.iter().enumerate() {
        let key = format!("corrupt-value:{command}:{i}");
        cmd(c, &["SET", &key, value]).unwrap();
        let mut call = vec![command, key.as_str()];
        call.extend_from_slice(args);
        assert_eq!(cmd(c, &call), Err(expected.to_string()), "{value:?}");
        assert_eq!(string_bytes(c, &key), value.as_bytes(), "left as it was");
        assert_eq!(pexpiretime(c, &key), -1, "and given no expiry");
    }
}

/// For each case a fresh hash (the layout of release 0.1) with those fields: `command key
/// args...` gets exactly the error, and the hash keeps its bytes and gets no expiry.
pub fn assert_corrupt_hashes_reported(
    c: &mut Connection,
    command: &str,
    args: &[&str],
    cases: &[(&[&str], &str)],
) {
    for (i, (fields, expected)) in cases.iter().enumerate() {
        let key = format!("corrupt:{command}:{i}");
        let mut hset = vec!["HSET", key.as_str()];
        hset.extend_from_slice(fields);
        cmd(c, &hset).unwrap();
        let before = hash_bytes(c, &key);
        let mut call = vec![command, key.as_str()];
        call.extend_from_slice(args);
        assert_eq!(cmd(c, &call), Err(expected.to_string()), "{fields:?}");
        assert_eq!(
            hash_bytes(c, &key),
            before,
            "corrupt state is left as it was"
        );
        assert_eq!(pexpiretime(c, &key), -1, "and given no expiry");
    }
}

/// The test clock's time, in microseconds.
pub fn clock_now(c: &mut Connection) -> i64 {
    redis::cmd("RL.TESTCLOCK")
        .arg("GET")
        .query(c)
        .expect("RL.TESTCLOCK GET")
}
