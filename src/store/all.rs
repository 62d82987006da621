//! Several limits of one call (`RL.ALL`, `RL.SETTLE`), each on its own key and of either shape,
//! decided at one instant and written all or none.

use crate::codec::error::ErrorReply;
use crate::core::{Operation, Reply};
use crate::store::{Limit, Store, grant};

/// The outcome of a multi-limit call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllReply {
    pub allowed: bool,
    /// 1-based position of the first limit that denied; 0 when all admitted.
    pub denied_by: usize,
    pub replies: Vec<Reply>,
}

/// Admits only if every limit admits, consuming from all or none. Limits are decided in order
/// at one instant (the first bad key's error is the reply), then written only if all admit. A
/// limit that would admit while another denies reports its unconsumed state (a peek).
///
/// With `upto` (a partial grant, `UPTO n`), every limit is granted the same units: the fewest a
/// peek of any leaves, at most `n`, tried as `store::grant` tries one limit (then one less, then
/// 1); each reply carries the units granted, 0 when the call is denied (as a cost of 1 is).
pub fn apply_all(
    limits: &mut [Box<dyn Limit>],
    stores: &mut [&mut dyn Store],
    now_us: i64,
    upto: Option<f64>,
) -> Result<AllReply, ErrorReply> {
    let mut replies = match upto {
        None => decide_each(limits, stores, now_us)?,
        Some(n) => {
            let mut decide = |op: Operation| {
                for limit in limits.iter_mut() {
                    limit.set_op(op);
                }
                let replies = decide_each(limits, stores, now_us)?;
                let first = replies.first().copied().unwrap_or(Reply {
                    allowed: false,
                    remaining: 0,
                    retry_after_ms: 0,
                    reset_after_ms: 0,
                    limit: 0,
                    granted: None,
                });
                // One reply that stands for the call: the fewest remaining, admitted when all
                // admit.
                let joint = Reply {
                    allowed: replies.iter().all(|r| r.allowed),
                    remaining: replies.iter().map(|r| r.remaining).min().unwrap_or(0),
                    ..first
                };
                Ok::<_, ErrorReply>((joint, replies))
            };
            let (joint, mut replies) = grant(n, &mut decide)?;
            let granted = joint.granted.unwrap_or(0);
            for reply in &mut replies {
                reply.granted = Some(if reply.allowed { granted } else { 0 });
            }
            replies
        }
    };
    let denied_by = replies.iter().position(|r| !r.allowed).map_or(0, |i| i + 1);
    if denied_by == 0 {
        // Whether the call may write is decided once, before the first write (memory is one
        // server's, whichever key asks): all limits are written or none.
        if limits.iter().any(|l| l.writes())
            && let Some(first) = stores.first()
        {
            first.writable()?;
        }
        for (limit, store) in limits.iter().zip(stores.iter_mut()) {
            limit.commit(&mut **store)?;
        }
    } else {
        for ((reply, limit), store) in replies.iter_mut().zip(limits.iter()).zip(stores.iter()) {
            if reply.allowed {
                let granted = reply.granted.map(|_| 0);
                *reply = Reply {
                    granted,
                    ..limit.peek(&**store, now_us)?
                };
            }
        }
    }
    Ok(AllReply {
        allowed: denied_by == 0,
        denied_by,
        replies,
    })
}

/// Every limit decided in order at one instant: the first bad key's error stops the call.
fn decide_each(
    limits: &mut [Box<dyn Limit>],
    stores: &[&mut dyn Store],
    now_us: i64,
) -> Result<Vec<Reply>, ErrorReply> {
    let mut replies: Vec<Reply> = Vec::with_capacity(limits.len());
    for (limit, store) in limits.iter_mut().zip(stores.iter()) {
        replies.push(limit.decide(&**store, now_us)?);
    }
    Ok(replies)
}
