//! Every command the module registers, in one list: registration, ACL, `COMMAND DOCS` and
//! `INFO` read it.

use crate::command::descriptor::Descriptor;
use crate::command::limiters::LIMITERS;
use crate::command::{Entry, all, release, settle, throttle};

/// Every command the module registers (but the test clock's and `RL.TOP`), in registration
/// order: the limiters, then the commands built on them.
pub const REGISTRY: [Entry; LIMITERS.len() + 4] = {
    let rest = [release::ENTRY, throttle::ENTRY, all::ENTRY, settle::ENTRY];
    let mut out = [rest[0]; LIMITERS.len() + 4];
    let mut i = 0;
    while i < LIMITERS.len() {
        out[i] = LIMITERS[i];
        i += 1;
    }
    while i < out.len() {
        out[i] = rest[i - LIMITERS.len()];
        i += 1;
    }
    out
};

/// The entry at `i` of the registry, for a place known when compiling (`const { entry(I) }`).
pub const fn entry(i: usize) -> Option<&'static Entry> {
    if i < REGISTRY.len() {
        Some(&REGISTRY[i])
    } else {
        None
    }
}

/// The descriptors of `REGISTRY`, in its order.
pub const DESCRIPTORS: [&Descriptor; REGISTRY.len()] = {
    let mut out = [REGISTRY[0].descriptor; REGISTRY.len()];
    let mut i = 0;
    while i < REGISTRY.len() {
        out[i] = REGISTRY[i].descriptor;
        i += 1;
    }
    out
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::descriptor::{ArgKind, Keys};

    #[test]
    fn every_descriptor_is_complete_and_consistent() {
        let mut names = Vec::new();
        for d in DESCRIPTORS {
            let name = d.name.to_str().unwrap();
            names.push(name);
            assert!(!d.summary.is_empty() && !d.complexity.is_empty(), "{name}");
            let required = 1 + d.args.iter().filter(|a| !a.optional).count() as i32;
            if d.args.iter().any(|a| a.optional || a.multiple) {
                // "At least": a repeated argument may stand for several words (RL.ALL's limit is
                // a keyword and its parameters).
                assert!(d.arity <= -required, "{name} arity {}", d.arity);
            } else {
                assert_eq!(d.arity, required, "{name} arity");
            }
            assert_eq!(
                d.arity_error.message(),
                format!(
                    "ERR wrong number of arguments for '{}' command",
                    name.to_ascii_lowercase()
                ),
                "{name}"
            );
            match d.keys {
                Keys::One(pos) => {
                    assert_eq!(d.args.first().map(|a| a.kind), Some(ArgKind::Key), "{name}");
                    assert_eq!(pos, 1, "{name}");
                }
                Keys::Counted(pos) => {
                    assert_eq!(pos, 1, "{name}");
                    assert!(d.has_flag("getkeys-api"), "{name} names its keys");
                }
                Keys::None => panic!("{name}: a limiter has keys"),
            }
            assert!(d.has_flag("write"), "{name}");
            if let Some(keyword) = d.all_keyword {
                // The command's own name, but where the name is a verb (RL.ACQUIRE's limit is a
                // CONCURRENCY limit).
                assert!(
                    format!("RL.{keyword}") == name
                        || (name == "RL.ACQUIRE" && keyword == "CONCURRENCY"),
                    "the RL.ALL keyword of {name}"
                );
                assert!(d.all_params() >= 2, "{name}");
            }
        }
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "{names:?}");
        let infos: Vec<String> = DESCRIPTORS.iter().map(|d| d.info_name()).collect();
        assert!(infos.contains(&"cl_throttle".to_string()), "{infos:?}");
    }
}
