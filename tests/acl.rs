//! ACL categories, for every command of the shared table (`harness::cases`): `+@ratelimit` grants
//! exactly the limiter commands, which also carry Redis's own categories (@write, and @fast or
//! @slow as their flags say); `RL.TOP` is in @admin and @dangerous. Redis 7.0 lacks the module API
//! for categories: there the module loads without them, and `RL.TOP` is denied by name. A
//! server that already has a `ratelimit` category of its own is said so in the log.

mod harness;

use harness::cases::{CASES, NOT_LIMITERS};
use harness::*;
use redis::{Connection, Value};

/// Every limiter command of the shared table, with arguments that admit; `rl:P:` in a key is
/// replaced per caller.
fn limiters() -> Vec<(&'static str, Vec<String>)> {
    CASES
        .iter()
        .map(|case| {
            let key = format!("rl:P:{}", case.command.to_ascii_lowercase());
            let argv = case.argv(&key, case.ten, None);
            (case.command, argv[1..].to_vec())
        })
        .collect()
}

const LOAD_NOTICE: &str = "ratelimit: this server has no module ACL categories";

/// True on the servers that export `RedisModule_AddACLCategory` and
/// `RedisModule_SetCommandACLCategories` (Redis 7.2+, every Valkey).
fn has_category_api(c: &mut Connection) -> bool {
    let (name, version) = server_identity(c);
    !(name == "redis" && version.starts_with("7.0."))
}

/// Calls a limiter with its keys under `rl:<prefix>:`.
fn call_limiter(c: &mut Connection, name: &str, args: &[String], prefix: &str) -> Reply {
    let keyed: Vec<String> = args
        .iter()
        .map(|a| a.replace("rl:P:", &format!("rl:{prefix}:")))
        .collect();
    let mut full = vec![name];
    full.extend(keyed.iter().map(String::as_str));
    cmd(c, &full)
}

/// Asserts a reply is an array of integers (RL.ALL: two integers, then arrays of integers) and
/// returns its first integer.
fn first_of_integer_array(name: &str, reply: &Reply) -> i64 {
    let Ok(Value::Array(items)) = reply else {
        panic!("{name}: not an array reply: {reply:?}");
    };
    assert!(!items.is_empty(), "{name}: empty reply");
    for (i, item) in items.iter().enumerate() {
        match item {
            Value::Int(_) => {}
            Value::Array(inner) if name == "RL.ALL" && i >= 2 => assert!(
                inner.iter().all(|v| matches!(v, Value::Int(_))),
                "{name}: {reply:?}"
            ),
            other => panic!("{name}: element {i} is not an integer: {other:?}"),
        }
    }
    match &items[0] {
        Value::Int(v) => *v,
        other => panic!("{name}: {other:?}"),
    }
}

fn text(v: &Value) -> String {
    match v {
        Value::SimpleString(s) => s.clone(),
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        other => panic!("not a string: {other:?}"),
    }
}

fn texts(v: &Value) -> Vec<String> {
    match v {
        Value::Array(items) | Value::Set(items) => items.iter().map(text).collect(),
        other => panic!("not an array: {other:?}"),
    }
}

/// `COMMAND INFO name`: (flags, ACL categories).
fn flags_and_categories(c: &mut Connection, name: &str) -> (Vec<String>, Vec<String>) {
    let reply = cmd(c, &["COMMAND", "INFO", name]).expect("COMMAND INFO");
    let Value::Array(entries) = reply else {
        panic!("COMMAND INFO {name}: {reply:?}");
    };
    let [Value::Array(info)] = entries.as_slice() else {
        panic!("COMMAND INFO {name}: {entries:?}");
    };
    assert_eq!(text(&info[0]), name.to_ascii_lowercase());
    (texts(&info[2]), texts(&info[6]))
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Every command of the module but the test clock: the limiters of the table, and RL.RELEASE.
fn limiter_names_lower() -> Vec<String> {
    sorted(
        CASES
            .iter()
            .map(|case| case.command)
            .chain(NOT_LIMITERS.iter().copied())
            .map(str::to_ascii_lowercase)
            .collect(),
    )
}

fn acl_cat(c: &mut Connection, category: &str) -> Reply {
    cmd(c, &["ACL", "CAT", category])
}

/// Creates `app` with exactly `+@ratelimit` on `rl:*` keys, and a connection authenticated as it.
fn app_connection(server: &Server, admin: &mut Connection) -> Connection {
    assert_eq!(
        cmd(
            admin,
            &["ACL", "SETUSER", "app", "on", ">pw", "~rl:*", "+@ratelimit"]
        ),
        Ok(Value::Okay)
    );
    let mut app = server.connect();
    assert_eq!(cmd(&mut app, &["AUTH", "app", "pw"]), Ok(Value::Okay));
    assert_eq!(
        cmd(&mut app, &["ACL", "WHOAMI"]),
        Err("NOPERM User app has no permissions to run the 'acl|whoami' command".to_string())
    );
    app
}

/// The app user gets the same reply as the default user on an identical fresh key (the test clock
/// stands still), and it is an integer array that admits.
fn assert_app_calls_every_limiter(app: &mut Connection, admin: &mut Connection, round: &str) {
    for (name, args) in limiters() {
        let got = call_limiter(app, name, &args, &format!("app{round}"));
        let reference = call_limiter(admin, name, &args, &format!("ref{round}"));
        assert_eq!(got, reference, "{name} as app vs as default");
        // CL.THROTTLE answers `limited` (0 = admitted); the others `allowed` (1).
        let admitted = if name == "CL.THROTTLE" { 0 } else { 1 };
        assert_eq!(
            first_of_integer_array(name, &got),
            admitted,
            "{name}: {got:?}"
        );
    }
}

fn assert_limiter_categories(c: &mut Connection) {
    let mut fast = 0;
    for name in CASES
        .iter()
        .map(|case| case.command)
        .chain(NOT_LIMITERS.iter().copied())
    {
        let (flags, categories) = flags_and_categories(c, name);
        assert!(flags.contains(&"write".to_string()), "{name}: {flags:?}");
        let speed = if flags.contains(&"fast".to_string()) {
            fast += 1;
            "@fast"
        } else {
            "@slow"
        };
        assert_eq!(
            categories,
            ["@write", speed, "@ratelimit"],
            "{name} (flags {flags:?})"
        );
    }
    // Every call is O(log n): every command is flagged fast.
    assert_eq!(fast, limiter_names_lower().len(), "{fast} fast commands");
}

#[test]
fn ratelimit_category_grants_exactly_the_limiters() {
    let server = Server::with(Options {
        test_clock: true,
        ..Options::default()
    });
    let mut admin = server.connect();
    let (name, version) = server_identity(&mut admin);

    if !has_category_api(&mut admin) {
        eprintln!(
            "{name} {version}: no module ACL category API; the module loads without categories"
        );
        assert!(server.log().contains(LOAD_NOTICE), "{}", server.log());
        let categories = texts(&cmd(&mut admin, &["ACL", "CAT"]).expect("ACL CAT"));
        assert!(categories.contains(&"write".to_string()), "{categories:?}");
        assert!(
            !categories.contains(&"ratelimit".to_string()),
            "{categories:?}"
        );
        assert_eq!(
            acl_cat(&mut admin, "ratelimit"),
            Err("ERR Unknown category 'ratelimit'".to_string())
        );
        for (limiter, args) in limiters() {
            let reply = call_limiter(&mut admin, limiter, &args, "v70");
            let admitted = if limiter == "CL.THROTTLE" { 0 } else { 1 };
            assert_eq!(first_of_integer_array(limiter, &reply), admitted);
            let (flags, categories) = flags_and_categories(&mut admin, limiter);
            assert!(flags.contains(&"write".to_string()), "{limiter}: {flags:?}");
            assert_eq!(categories, Vec::<String>::new(), "{limiter}");
        }
        return;
    }

    assert!(!server.log().contains(LOAD_NOTICE), "{}", server.log());
    let mut app = app_connection(&server, &mut admin);
    assert_app_calls_every_limiter(&mut app, &mut admin, "");

    // Nothing else: not a plain command on an `rl:` key, not the test clock, not another key.
    let denied = |command: &str| {
        format!("NOPERM User app has no permissions to run the '{command}' command")
    };
    assert_eq!(cmd(&mut app, &["GET", "rl:x"]), Err(denied("get")));
    assert_eq!(cmd(&mut app, &["SET", "rl:x", "1"]), Err(denied("set")));
    assert_eq!(
        cmd(&mut app, &["RL.TESTCLOCK", "GET"]),
        Err(denied("rl.testclock"))
    );
    assert_eq!(
        cmd(&mut app, &["RL.TOKENBUCKET", "other", "10", "5"]),
        Err("NOPERM No permissions to access a key".to_string())
    );
    // The default user (+@all) still reaches the test clock.
    assert!(matches!(
        cmd(&mut admin, &["RL.TESTCLOCK", "GET"]),
        Ok(Value::Int(_))
    ));

    assert_limiter_categories(&mut admin);
    let (_, testclock_categories) = flags_and_categories(&mut admin, "RL.TESTCLOCK");
    assert_eq!(testclock_categories, Vec::<String>::new());

    let in_category = |c: &mut Connection, category: &str| -> Vec<String> {
        let all = texts(&acl_cat(c, category).expect("ACL CAT"));
        sorted(
            all.into_iter()
                .filter(|n| n.starts_with("rl.") || n.starts_with("cl."))
                .collect(),
        )
    };
    assert_eq!(
        sorted(texts(&acl_cat(&mut admin, "ratelimit").expect("ACL CAT"))),
        limiter_names_lower()
    );
    assert_eq!(in_category(&mut admin, "write"), limiter_names_lower());
    // Every call is O(log n), the sliding log's included.
    assert_eq!(in_category(&mut admin, "fast"), limiter_names_lower());
    // Of the module's commands only RL.TOP, which is not a limiter.
    assert_eq!(in_category(&mut admin, "slow"), ["rl.top"]);
    assert_eq!(in_category(&mut admin, "read"), Vec::<String>::new());
    eprintln!(
        "{name} {version}: @ratelimit holds exactly the {} commands",
        limiter_names_lower().len()
    );
}

/// Redis keeps a module's categories after MODULE UNLOAD: loading the module again finds
/// `ratelimit` already there, and must still load and put the commands back in it.
#[test]
fn module_reloads_into_its_category() {
    let server = Server::start();
    let mut admin = server.connect();
    let with_api = has_category_api(&mut admin);
    let mut app = with_api.then(|| app_connection(&server, &mut admin));

    assert_eq!(
        cmd(&mut admin, &["MODULE", "UNLOAD", "ratelimit"]),
        Ok(Value::Okay)
    );
    if let Some(app) = app.as_mut() {
        assert_eq!(
            cmd(app, &["RL.TOKENBUCKET", "rl:tb", "10", "5"]),
            Err(
                "ERR unknown command 'RL.TOKENBUCKET', with args beginning with: 'rl:tb' '10' '5' "
                    .to_string()
            )
        );
    }
    let module = server.module_file();
    assert_eq!(
        cmd(&mut admin, &["MODULE", "LOAD", &module]),
        Ok(Value::Okay)
    );

    if let Some(app) = app.as_mut() {
        assert!(
            server.log().contains(
                "ratelimit: ACL category 'ratelimit' already exists and holds no command (as an \
                 earlier load of this module leaves it"
            ),
            "{}",
            server.log()
        );
        assert!(!server.log().contains(FOREIGN_NOTICE), "{}", server.log());
        assert_eq!(
            sorted(texts(&acl_cat(&mut admin, "ratelimit").expect("ACL CAT"))),
            limiter_names_lower()
        );
        assert_limiter_categories(&mut admin);
        // The user made before the reload gets the commands back.
        for (name, args) in limiters() {
            let reply = call_limiter(app, name, &args, "reload");
            let admitted = if name == "CL.THROTTLE" { 0 } else { 1 };
            assert_eq!(first_of_integer_array(name, &reply), admitted, "{name}");
        }
    } else {
        for (name, args) in limiters() {
            let reply = call_limiter(&mut admin, name, &args, "reload");
            let admitted = if name == "CL.THROTTLE" { 0 } else { 1 };
            assert_eq!(first_of_integer_array(name, &reply), admitted, "{name}");
        }
    }
}

const FOREIGN_NOTICE: &str = "ratelimit: this server already has an ACL category 'ratelimit' \
                              holding commands that are not this module's";

/// `tests/modules/foreign_category.c` built into `dir`: a module with a `ratelimit` category of
/// its own, holding `foreign.setvalue`. Built against the redismodule.h of the redis-module crate,
/// found through `cargo metadata`.
fn foreign_category_module(dir: &std::path::Path) -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let metadata = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--offline"])
        .current_dir(root)
        .output()
        .expect("cargo metadata");
    let text = String::from_utf8(metadata.stdout).unwrap();
    let include = text
        .split("\"manifest_path\":\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .map(|manifest| std::path::Path::new(manifest).with_file_name("src/include"))
        .find(|include| {
            include.join("redismodule.h").exists()
                && include
                    .parent()
                    .and_then(|p| p.parent())
                    .is_some_and(|crate_dir| {
                        crate_dir
                            .file_name()
                            .is_some_and(|n| n.to_string_lossy().starts_with("redis-module-2"))
                    })
        })
        .expect("the redis-module crate's redismodule.h");
    let out = dir.join("foreign_category.so");
    let status = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-I"])
        .arg(&include)
        .arg(root.join("tests/modules/foreign_category.c"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("cc");
    assert!(status.success(), "building the foreign category module");
    out
}

fn on_redis_7_0(name: &str, version: &str) -> bool {
    name == "redis" && version.starts_with("7.0.")
}

/// A server that already has a `ratelimit` category holding commands that are not this
/// module's (as Redis's own category of that name does, with its native GCRA commands): the
/// module still joins it, and its log says the truth, naming the other commands, since
/// `+@ratelimit` grants them too.
#[test]
fn a_category_the_server_already_has_is_joined_and_its_other_commands_named() {
    if skip_in_container("builds and loads a second module from the host") {
        return;
    }
    let server = Server::with(Options {
        without_module: true,
        ..Options::default()
    });
    if skip_on_server(
        &server,
        |n, v| !on_redis_7_0(n, v),
        "Redis 7.0 has no module ACL categories",
    ) {
        return;
    }
    let mut admin = server.connect();
    let foreign = foreign_category_module(server.dir.path());
    let foreign = foreign.display().to_string();
    assert_eq!(
        cmd(&mut admin, &["MODULE", "LOAD", &foreign]),
        Ok(Value::Okay)
    );
    assert_eq!(
        texts(&acl_cat(&mut admin, "ratelimit").expect("ACL CAT")),
        ["foreign.setvalue"]
    );
    let module = server.module_file();
    assert_eq!(
        cmd(&mut admin, &["MODULE", "LOAD", &module, "TESTCLOCK"]),
        Ok(Value::Okay)
    );
    let log = server.log();
    assert!(
        log.contains(&format!(
            "{FOREIGN_NOTICE}: foreign.setvalue; the commands join it, so +@ratelimit grants \
             those commands too: grant this module's commands by name instead (+rl.tokenbucket ...)"
        )),
        "{log}"
    );
    assert!(!log.contains("holds no command"), "{log}");
    let mut joined = limiter_names_lower();
    joined.push("foreign.setvalue".to_string());
    assert_eq!(
        sorted(texts(&acl_cat(&mut admin, "ratelimit").expect("ACL CAT"))),
        sorted(joined)
    );
    // What the log warns of: +@ratelimit reaches the other command too.
    let mut app = app_connection(&server, &mut admin);
    assert_eq!(cmd(&mut app, &["FOREIGN.SETVALUE"]), Ok(Value::Okay));
    assert_app_calls_every_limiter(&mut app, &mut admin, "joined");
}

/// `RL.TOP` shows every tenant's keys: where the server has module ACL categories it is in
/// @admin and @dangerous (and @slow), so a user of everything but those cannot run it.
#[test]
fn rl_top_is_an_admin_command_where_the_server_has_categories() {
    let server = Server::with_test_clock();
    if skip_on_server(
        &server,
        |n, v| !on_redis_7_0(n, v),
        "Redis 7.0 has no module ACL categories (rl_top_is_denied_by_name_on_redis_7_0)",
    ) {
        return;
    }
    let mut admin = server.connect();
    let (flags, categories) = flags_and_categories(&mut admin, "RL.TOP");
    assert_eq!(sorted(flags), ["admin", "module"]);
    assert_eq!(sorted(categories), ["@admin", "@dangerous", "@slow"]);
    assert!(texts(&acl_cat(&mut admin, "admin").unwrap()).contains(&"rl.top".to_string()));
    assert!(!texts(&acl_cat(&mut admin, "ratelimit").unwrap()).contains(&"rl.top".to_string()));
    let ops = user_connection(&server, &mut admin, &["+@all", "-@admin", "-@dangerous"]);
    assert_top_refused_and_limiters_allowed(ops, &mut admin);
}

/// Redis 7.0 has no module ACL categories: `RL.TOP` is in none, so `-@admin` leaves it allowed,
/// and the recipe of docs/commands.md denies it by name: `-rl.top`.
#[test]
fn rl_top_is_denied_by_name_on_redis_7_0() {
    let server = Server::with_test_clock();
    if skip_on_server(
        &server,
        on_redis_7_0,
        "the servers with module ACL categories put RL.TOP in @admin \
         (rl_top_is_an_admin_command_where_the_server_has_categories)",
    ) {
        return;
    }
    let mut admin = server.connect();
    let (_, categories) = flags_and_categories(&mut admin, "RL.TOP");
    assert_eq!(categories, Vec::<String>::new());
    let mut without_admin =
        user_connection(&server, &mut admin, &["+@all", "-@admin", "-@dangerous"]);
    assert!(
        matches!(cmd(&mut without_admin, &["RL.TOP"]), Ok(Value::Array(_))),
        "-@admin alone does not deny it on 7.0"
    );
    let ops = user_connection(
        &server,
        &mut admin,
        &["+@all", "-@admin", "-@dangerous", "-rl.top"],
    );
    assert_top_refused_and_limiters_allowed(ops, &mut admin);
}

/// A connection of a user `ops` with these rules (replacing the ones before), on every key.
fn user_connection(server: &Server, admin: &mut Connection, rules: &[&str]) -> Connection {
    let mut argv = vec!["ACL", "SETUSER", "ops", "reset", "on", ">pw", "~*"];
    argv.extend(rules);
    assert_eq!(cmd(admin, &argv), Ok(Value::Okay));
    let mut c = server.connect();
    assert_eq!(cmd(&mut c, &["AUTH", "ops", "pw"]), Ok(Value::Okay));
    c
}

fn assert_top_refused_and_limiters_allowed(mut ops: Connection, admin: &mut Connection) {
    for argv in [&["RL.TOP"][..], &["RL.TOP", "RESET"], &["RL.TOP", "5"]] {
        let refused = cmd(&mut ops, argv).unwrap_err();
        // Servers word it differently ("User ops has" or "this user has").
        assert!(
            refused.starts_with("NOPERM ")
                && refused.ends_with("no permissions to run the 'rl.top' command"),
            "{argv:?}: {refused}"
        );
    }
    assert_app_calls_every_limiter(&mut ops, admin, "ops");
}
