//! ACL categories, for every command of the shared table (`harness::cases`): `+@ratelimit` grants
//! exactly the limiter commands, which also carry Redis's own categories (@write, and @fast or
//! @slow as their flags say). Redis 7.0 lacks the module API for
//! categories: there the module loads without them.

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
    assert_eq!(in_category(&mut admin, "slow"), Vec::<String>::new());
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
            server
                .log()
                .contains("ratelimit: ACL category 'ratelimit' already exists"),
            "{}",
            server.log()
        );
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
