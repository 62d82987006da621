//! `ratelimit-rls`: the service, configured by the environment (see docs/rls.md).
//! `ratelimit-rls --check` loads the configuration directory and exits: 0 when it loads, 1 with
//! the error otherwise.

use ratelimit_rls::settings::Settings;

fn main() {
    let settings = match Settings::from_env() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ratelimit-rls: {e}");
            std::process::exit(2);
        }
    };
    if std::env::args().nth(1).as_deref() == Some("--check") {
        match ratelimit_rls::watch::load(&settings.config_dir, settings.ignore_dot_files) {
            Ok(config) => {
                for w in &config.warnings {
                    eprintln!("warning: {w}");
                }
                println!(
                    "{}: {} domain(s), valid",
                    settings.config_dir.display(),
                    config.domains()
                );
                return;
            }
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ratelimit-rls: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = runtime.block_on(ratelimit_rls::server::run(settings)) {
        eprintln!("ratelimit-rls: {e}");
        std::process::exit(1);
    }
}
