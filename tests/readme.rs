//! The README's command table: each example is run on a fresh key, with the test clock at a whole
//! minute, and must reply exactly what the table says.

mod harness;

use harness::{Server, cmd, set_clock};
use redis::Value;

fn flatten(v: &Value, out: &mut Vec<i64>) {
    match v {
        Value::Int(i) => out.push(*i),
        Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
        other => panic!("not an integer reply: {other:?}"),
    }
}

#[test]
fn every_example_of_the_command_table_replies_as_shown() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    // Rows `| `COMMAND ...` | ... | `EXAMPLE` → `REPLY` |`.
    let examples: Vec<(String, Vec<i64>)> = readme
        .lines()
        .filter(|l| l.starts_with("| `") && l.contains(" → "))
        .map(|l| {
            let cell = l.trim_end_matches('|').rsplit('|').next().unwrap().trim();
            let (call, reply) = cell.split_once(" → ").unwrap();
            let reply: Vec<i64> = reply
                .trim_matches('`')
                .split([' ', '[', ']'])
                .filter(|w| !w.is_empty())
                .map(|w| w.parse().unwrap())
                .collect();
            (call.trim_matches('`').to_string(), reply)
        })
        .collect();
    let commands: Vec<&str> = examples
        .iter()
        .map(|(call, _)| call.split(' ').next().unwrap())
        .collect();
    let mut registered: Vec<&str> = redis_rate_limiter::command::registry::DESCRIPTORS
        .iter()
        .map(|d| d.name.to_str().unwrap())
        .collect();
    registered.sort();
    let mut shown = commands.clone();
    shown.sort();
    assert_eq!(shown, registered, "one example per command");

    let s = Server::with_test_clock();
    let mut c = s.connect();
    set_clock(&mut c, 1_800_000_000_000_000);
    for (call, expected) in &examples {
        let args: Vec<&str> = call.split(' ').collect();
        let mut got = Vec::new();
        flatten(&cmd(&mut c, &args).unwrap(), &mut got);
        assert_eq!(&got, expected, "{call}");
    }
}
