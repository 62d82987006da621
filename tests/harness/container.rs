//! The container backend (`--features containers` with `RL_REDIS_IMAGE=redis:7.2`): the image's
//! own server with the same arguments as a local one. The module built on this machine and the
//! test's data directory are bind-mounted, the server runs as the owner of that directory (so
//! the host can read its log and files, and reuse them across restarts), and clients connect to
//! the port Docker maps on the host.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use testcontainers::core::{AccessMode, IntoContainerPort, Mount};
use testcontainers::runners::SyncRunner;
use testcontainers::{Container, GenericImage, ImageExt};

use super::{Options, common_args, module_path};

/// Where the module is mounted inside the container.
pub const MODULE_FILE: &str = "/opt/ratelimit/libredis_rate_limiter.so";
const DATA_DIR: &str = "/data";
const PORT: u16 = 6379;

pub struct Running(Box<Container<GenericImage>>);

impl Running {
    pub fn is_running(&self) -> bool {
        self.0.is_running().unwrap_or(false)
    }

    /// The server's address on the Docker bridge network, which other containers (replicas) reach.
    pub fn bridge_address(&self) -> (String, u16) {
        let ip = self.0.get_bridge_ip_address().expect("container bridge IP");
        (ip.to_string(), PORT)
    }
}

/// `redis:7.2` -> (`redis`, `7.2`); `valkey/valkey` -> (`valkey/valkey`, `latest`). A colon
/// followed by a path is a registry port, not a tag.
fn name_and_tag(image: &str) -> (&str, &str) {
    match image.rsplit_once(':') {
        Some((name, tag)) if !tag.contains('/') => (name, tag),
        _ => (image, "latest"),
    }
}

/// Starts `image` on the data directory `dir`; returns it with the host and port to connect to.
pub fn start(image: &str, dir: &Path, opts: &Options) -> (Running, String, u16) {
    let meta = dir.metadata().expect("data directory");
    // Leading flags make the official redis and valkey entrypoints run their own server.
    let mut args: Vec<String> = [
        "--port",
        &PORT.to_string(),
        "--bind",
        "0.0.0.0",
        // Clients arrive through Docker's port mapping, not from loopback.
        "--protected-mode",
        "no",
        "--enable-module-command",
        "yes",
    ]
    .map(String::from)
    .to_vec();
    args.extend(common_args(
        Path::new(DATA_DIR),
        Path::new(MODULE_FILE),
        opts,
    ));
    let (name, tag) = name_and_tag(image);
    let container = GenericImage::new(name, tag)
        .with_exposed_port(PORT.tcp())
        .with_mount(
            Mount::bind_mount(module_path().display().to_string(), MODULE_FILE)
                .with_access_mode(AccessMode::ReadOnly),
        )
        .with_mount(Mount::bind_mount(dir.display().to_string(), DATA_DIR))
        .with_user(format!("{}:{}", meta.uid(), meta.gid()))
        .with_cmd(args)
        .start()
        .unwrap_or_else(|e| {
            panic!("start a container of {image} (is a Docker engine running?): {e}")
        });
    let host = container.get_host().expect("container host").to_string();
    let port = container
        .get_host_port_ipv4(PORT.tcp())
        .expect("mapped port");
    (Running(Box::new(container)), host, port)
}
